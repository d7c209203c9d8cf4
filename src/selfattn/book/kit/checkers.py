"""The steps every exercise checker is built from: call the reader's code, check the answer's
type and shape, report.

A chapter calls a topic's ``check_...(answer)`` (``selfattn.book.tagging.check_cnn_reach``); the
checker prints "✓ Correct: ..." or "✗ Not yet: ..." and returns True or False. It never raises: a
reader's half-written answer (``None``, an exception inside their function) gets a short message,
so a chapter always runs top to bottom. A check is written as ``check(answer) -> success
message`` that raises :class:`NotYet` with what is still wrong; :func:`_checker` turns it into the
function the chapter calls, which prints the verdict and returns True or False.

A checker of a count or a size is a table of cases over :func:`same_as`. A build-it checker
runs the reader's piece of attention against the library's, with the weights copied or on
identical inputs; when the answer is wrong it recomputes the typical mistakes and names the one
the answer matches (:func:`_first_match`). Every check uses its own seeded
generator, and builds the library's layers with the global random state saved and restored
(:func:`_seeded_layer`), so running a checker leaves a chapter's random numbers as they were.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from ...multihead import MultiHeadAttention


class NotYet(Exception):
    """What is still wrong with an answer; its message is shown to the reader."""


WIDTH = 84  # characters per printed line: the width of the book's code blocks


def _report(ok: bool, message: str) -> bool:
    lines = textwrap.wrap(("✓ Correct: " if ok else "✗ Not yet: ") + message, WIDTH,
                          subsequent_indent="  ", break_long_words=False)
    print("\n".join(lines))
    return ok


def _checker(check: Callable[..., str]) -> Callable[..., bool]:
    """Turn ``check(*answers) -> success message`` (raising :class:`NotYet`) into a checker that
    prints the verdict and returns True or False."""
    def run(*answers: object) -> bool:
        try:
            return _report(True, check(*answers))
        except NotYet as why:
            return _report(False, str(why))

    run.__name__, run.__qualname__, run.__doc__ = check.__name__, check.__qualname__, check.__doc__
    run.__module__ = check.__module__
    return run


def _call(fn: object, *args: object, kind: str = "function") -> object:
    """The reader's ``fn(*args)``; any exception it raises becomes a message that names ``kind``
    ("function", "class", "class's forward", ...)."""
    if not callable(fn):
        raise NotYet(f"expected a {kind}, got {type(fn).__name__}")
    try:
        return fn(*args)
    except Exception as exc:  # the reader's code: report, never crash the chapter
        shown = ", ".join(_short(a) for a in args)
        raise NotYet(f"your {kind}, given ({shown}), raised {type(exc).__name__}: {exc}") from None


def same_as(fn: object, want: Callable[..., object], cases: Iterable[tuple], explain: str, *,
            names: Sequence[str] = (), mistakes: Sequence[tuple[Callable[..., object], str]] = ()) -> None:
    """The reader's ``fn(*case)`` must equal ``want(*case)`` for every case of the table; at the
    first case where it does not, :class:`NotYet` says ``explain`` formatted with ``got``,
    ``want``, the case (``case``, as a tuple; ``args``, as ``name=value, ...`` with ``names``;
    each value by its name) and ``hint``: that of the first typical mistake ``(wrong, hint)``
    whose ``wrong(*case)`` equals the answer ("" if none). The checker of an exercise that asks
    for a count or a size is then its table of cases, this call and its success message."""
    for case in cases:
        got, right = _call(fn, *case), want(*case)
        if got != right:
            hint = next((text for wrong, text in mistakes if got == wrong(*case)), "")
            named = dict(zip(names, case, strict=True)) if names else {}
            args = ", ".join(f"{name}={value}" for name, value in named.items())
            raise NotYet(explain.format(got=got, want=right, case=case, args=args, hint=hint, **named))


def _short(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}" if isinstance(x, torch.nn.Module) else repr(x)


def _number(answer: object) -> float:
    if not isinstance(answer, (int, float)) or isinstance(answer, bool):
        raise NotYet(f"set the answer to a number, got {answer!r}")
    return answer


def _tensor(got: object, want: torch.Tensor) -> torch.Tensor:
    """``got`` must be a tensor of ``want``'s shape."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise NotYet(f"expected a tensor of shape {tuple(want.shape)}, got {shape}")
    return got


def _close(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    """``got`` equals ``want`` to within rounding, whatever dtype the reader computed in; NaN
    never equals anything."""
    try:
        return torch.allclose(got.detach().to(want.dtype), want, atol=atol, rtol=rtol)
    except (RuntimeError, TypeError):
        return False


def _seeded_layer(seed: int, *args: Any, **kwargs: Any) -> MultiHeadAttention:
    """A :class:`MultiHeadAttention` whose weights come from ``seed``, in eval mode; the global
    random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MultiHeadAttention(*args, **kwargs).eval()


def _equal(got: Tensor, want: Tensor) -> bool:
    """Exactly ``want`` (values moved, never computed), whatever dtype the reader returned."""
    try:
        return got.shape == want.shape and torch.equal(got.detach().to(want.dtype), want)
    except (RuntimeError, TypeError):
        return False


Mistakes = list[tuple[Callable[[], Tensor], str]]  # each typical mistake's result (on call), its hint


def _first_match(got: Tensor, candidates: Mistakes,
                 atol: float = 1e-3) -> str | None:
    """The hint of the first typical mistake whose result ``got`` equals, if any. Only a wrong
    answer is compared, so the tolerance can be loose: the mistakes differ from the right answer,
    and from each other, by far more."""
    for compute, hint in candidates:
        wrong = compute()
        if wrong.shape == got.shape and _close(got, wrong, atol=atol, rtol=1e-3):
            return hint
    return None
