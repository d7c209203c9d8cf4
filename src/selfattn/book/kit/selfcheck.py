"""Self-checks on the page: a question whose answer is a number, a count or a shape, checked in the
reader's browser with no kernel.

A chapter's exercise asks the reader to write an answer and call a checker from
its topic's module; in the static book there is no kernel to run it. So an exercise
whose answer is a value also gets a self-check: a ``remove-input`` cell right after the exercise's
text that calls :func:`self_check` with the question, at concrete sizes, and the expected value,
computed by the build from the checker's own reference (the function of the topic's module that
its checker uses), never typed in. What the cell displays depends on where it runs:

* in the book build (``SELFATTN_STATIC=1``, :data:`selfattn.book.kit.viz.STATIC_ENV`): HTML with the
  question, a text box, a Check button and a verdict line (``role="status"``); the expected value
  and the kind sit in ``data-`` attributes, which the book's ``assets/selfcheck.js`` reads;
* in a live kernel (Jupyter, Colab), where that script is not loaded: one line of plain text that
  names the question and points to the checker cell below it, without the answer.

The kinds, and what the page accepts (``assets/selfcheck.js``):

* ``"number"``: a real number, right within a relative tolerance ``rtol`` (default
  :data:`DEFAULT_RTOL`); the reader may type ``0.25``, ``1,024``, ``1_024``, ``1e6``, ``2**20``,
  ``2^20`` or a product such as ``4 * 2**30``;
* ``"count"``: a whole number, right only when equal, typed in any of the forms above;
* ``"shape"``: a tuple of whole numbers, right only when equal: ``(2, 8, 16)``, ``2, 8, 16``,
  ``[2, 8, 16]``, ``torch.Size([2, 8, 16])`` or ``2 x 8 x 16``.

Each is read after NFKC normalization, so the full-width digits and punctuation a Chinese input
method types (``１０２４``, ``（12，5，7）``) are read as their ASCII forms.

A number or a count that is a size in bytes says so with ``unit="bytes"``: only then does the page
accept a unit after it, ``3 MiB`` (KiB, MiB, GiB, TiB: powers of 2), ``3 MB`` (kB, MB, GB, TB:
powers of 10) or ``bytes``; any other question refuses a unit, so that ``256 GiB`` is not a count
of FLOPs.

A wrong answer gets "not yet" and what is off, never the answer:

* a number or a count within 1 % of the answer (:data:`CLOSE`) but not right, a rounded answer,
  is "close": the reader is asked for the exact count or for more digits;
* one that is the answer times a factor named in ``hints``, exactly or within the same 1 %,
  gets that hint (a FLOP count that is half the answer, ``1.37e11`` for half of ``2**38``: "a
  multiply-add counts as two FLOPs");
* for bytes, a bare number that is the answer in KiB, MiB, GiB or TiB is asked for its unit, and
  a decimal unit that would be right as the binary one (GB for GiB) says which is which;
* otherwise "too high" or "too low"; for a shape, whether the number of dimensions or which
  dimension differs. The answer is in the exercise's folded solution, the page's one reveal.

The exercise's text above the box states the problem; the box does not repeat it. Its question is
what the box asks for: the exercise's own question in a few words where it asks for a value, or
the value at concrete sizes where it asks for a function ("How many parameters does
`MultiHeadAttention(512, 8)` have?"), or the sub-question that checks a fix.
"""

from __future__ import annotations

import hashlib
import html
import json
import math
import numbers
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .viz import STATIC_ENV

KINDS = ("number", "count", "shape")


UNITS = ("bytes",)  # the units a number or a count may take (self_check's ``unit``)


DEFAULT_RTOL = 1e-6  # a number is right within this relative tolerance, unless rtol says otherwise


CLOSE = 0.01  # a wrong number or count within this relative distance is "close" (selfcheck.js)


MAX_EXACT = 2**53 - 1  # the largest whole number JavaScript holds exactly (Number.MAX_SAFE_INTEGER)


_PLACEHOLDER = {"number": "a number, e.g. 0.5, 1e6 or 2**20",
                "count": "a whole number, e.g. 1,024 or 2**10",
                "shape": "a shape, e.g. (2, 8, 16)",
                "bytes": "bytes, e.g. 1,536, 2**20 or 3 MiB"}


@dataclass(frozen=True, repr=False)
class SelfCheck:
    """A question and its expected value, displayed by Jupyter (see :func:`self_check`)."""

    question: str
    expected: float | int | tuple[int, ...]
    kind: str
    rtol: float | None  # for kind "number" only
    unit: str | None = None  # "bytes", or None: a plain number
    hints: tuple[tuple[float, str], ...] = ()  # (factor, hint) for an answer = factor x expected

    def __repr__(self) -> str:  # never the answer: a printed object must not give it away
        return f"SelfCheck({self.kind}: {self.question!r})"

    def note(self) -> str:
        """The one line shown in a live kernel: the question, and where to check it here."""
        return (f"Self-check: {self.question} The book's web page checks an answer to this on "
                "the page; here, run the checker cell below.")

    def html(self) -> str:
        """The widget of the static book: question, text box, Check button, verdict."""
        ident = "selfattn-selfcheck-" + hashlib.sha1(
            f"{self.kind}|{self.unit}|{self.question}|{_data(self)}".encode()).hexdigest()[:12]
        attributes = f'data-kind="{self.kind}" data-expected="{html.escape(_data(self))}"'
        if self.rtol is not None:
            attributes += f' data-rtol="{self.rtol!r}"'
        if self.unit is not None:
            attributes += f' data-unit="{self.unit}"'
        if self.hints:
            attributes += f' data-hints="{html.escape(json.dumps([list(h) for h in self.hints]))}"'
        return (
            f'<div class="selfattn-selfcheck" {attributes}>'
            f'<label class="selfattn-selfcheck-question" for="{ident}">'
            f'<span class="selfattn-selfcheck-label">Your answer.</span> '
            f"{_inline(self.question)}</label>"
            '<div class="selfattn-selfcheck-row">'
            f'<input id="{ident}" type="text" autocomplete="off" spellcheck="false" '
            f'autocapitalize="off" aria-describedby="{ident}-verdict" '
            f'placeholder="{_PLACEHOLDER[self.unit or self.kind]}">'
            '<button type="button" disabled>Check</button></div>'
            f'<p id="{ident}-verdict" class="selfattn-selfcheck-verdict" role="status" '
            'aria-live="polite"></p>'
            "</div>")

    def _repr_mimebundle_(self, include: object = None, exclude: object = None) -> dict[str, str]:
        """What Jupyter shows: the widget in the static book, the plain note in a live kernel."""
        if os.environ.get(STATIC_ENV) == "1":
            return {"text/html": self.html(), "text/plain": self.note()}
        return {"text/plain": self.note()}


def self_check(question: str, expected: float | tuple[int, ...], *, kind: str = "number",
               rtol: float | None = None, unit: str | None = None,
               hints: Mapping[float, str] | None = None) -> SelfCheck:
    """A self-check for the page: ``question``, answered by ``expected``.

    Args:
        question: what the box asks, after "Your answer." and below the exercise's text, which
            it does not repeat: the exercise's question in a few words, or a formula's value at
            the concrete sizes it gives; text in backticks is shown as code.
        expected: the answer, computed by the chapter, never typed: a real number for ``kind=
            "number"``, an int for ``"count"``, a tuple (or ``torch.Size``) of ints for ``"shape"``.
        kind: ``"number"`` (right within ``rtol``), ``"count"`` or ``"shape"`` (right when equal).
        rtol: relative tolerance of a ``"number"`` (default :data:`DEFAULT_RTOL`); not taken by the
            exact kinds.
        unit: ``"bytes"`` for a number or a count that is a size in bytes: the page then accepts
            ``3 MiB``, ``3 MB`` or ``3 bytes``, and asks a bare number that is the answer in KiB,
            MiB, GiB or TiB for its unit. ``None`` (the default): the answer is a plain number, and
            the page refuses a unit after it.
        hints: for a number or a count, ``{factor: hint}``: an answer equal to ``factor`` times
            the expected value, or within 1 % of it (:data:`CLOSE`), gets ``hint`` (``{0.5: "a
            multiply-add counts as two FLOPs."}``). A hint names the slip, never the answer; its
            factor is further from 1 than "close" reaches.

    Returns the :class:`SelfCheck` that Jupyter displays: the widget when ``SELFATTN_STATIC=1``
    (the book build), a one-line note without the answer otherwise (a live kernel).

    Raises ``TypeError`` for an argument of the wrong type and ``ValueError`` for a wrong value: an
    empty question, an unknown kind, an expected value that is not finite, a count or a dimension
    below zero or beyond what the page's JavaScript holds exactly, ``rtol`` outside [0, 1) or
    given for an exact kind, an unknown unit, a unit or hints given for a shape, a hint's factor
    that is not a positive finite number further from 1 than "close" reaches, or an empty hint.
    """
    if not isinstance(question, str):
        raise TypeError(f"question must be a str, got {type(question).__name__}")
    question = " ".join(question.split())
    if not question:
        raise ValueError("question is empty: ask something, with the sizes it is about")
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str, one of {KINDS}, got {type(kind).__name__}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind == "number":
        if rtol is None:
            rtol = DEFAULT_RTOL
        if not isinstance(rtol, numbers.Real) or isinstance(rtol, bool):
            raise TypeError(f"rtol must be a number, got {type(rtol).__name__}")
        if not 0 <= rtol < 1:
            raise ValueError(f"rtol must be in [0, 1), got {rtol!r}")
        rtol = float(rtol)
        if not isinstance(expected, numbers.Real) or isinstance(expected, bool):
            raise TypeError(f"a number's expected value must be a real number, got {expected!r}")
        if not math.isfinite(expected):
            raise ValueError(f"a number's expected value must be finite, got {expected!r}")
        expected = float(expected)
    else:
        if rtol is not None:
            raise ValueError(f"rtol is for kind='number'; a {kind} is right only when equal")
        if kind == "count":
            expected = _whole(expected, "a count's expected value")
        else:
            if not isinstance(expected, (tuple, list)):
                raise TypeError(f"a shape's expected value must be a tuple of ints, got {expected!r}")
            if not expected:
                raise ValueError("a shape's expected value needs at least one dimension")
            expected = tuple(_whole(n, f"dimension {i} of the shape", minimum=0)
                             for i, n in enumerate(expected))
    if unit is not None:
        if not isinstance(unit, str):
            raise TypeError(f"unit must be a str, one of {UNITS}, got {type(unit).__name__}")
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS} or None, got {unit!r}")
        if kind == "shape":
            raise ValueError("unit is for a number or a count, not a shape")
    return SelfCheck(question, expected, kind, rtol, unit, _hints(hints, kind))


def _hints(hints: object, kind: str) -> tuple[tuple[float, str], ...]:
    if hints is None:
        return ()
    if not isinstance(hints, Mapping):
        raise TypeError(f"hints must be a dict {{factor: hint}}, got {type(hints).__name__}")
    if hints and kind == "shape":
        raise ValueError("hints are for a number or a count, not a shape")
    out = []
    for factor, hint in hints.items():
        if not isinstance(factor, numbers.Real) or isinstance(factor, bool):
            raise TypeError(f"a hint's factor must be a number, got {factor!r}")
        factor = float(factor)
        if not math.isfinite(factor) or factor <= 0 or factor == 1:
            raise ValueError(f"a hint's factor must be a positive finite number other than 1, "
                             f"got {factor!r}")
        if (1 - CLOSE) * factor <= 1 + CLOSE and (1 + CLOSE) * factor >= 1 - CLOSE:
            raise ValueError(f"a hint's factor must be further from 1 than the page's 'close' "
                             f"(within {CLOSE:.0%}) reaches, got {factor!r}")
        if not isinstance(hint, str):
            raise TypeError(f"a hint must be a str, got {type(hint).__name__}")
        hint = " ".join(hint.split())
        if not hint:
            raise ValueError(f"the hint for factor {factor!r} is empty")
        out.append((factor, hint))
    return tuple(out)


def _whole(n: object, what: str, minimum: int | None = None) -> int:
    if not isinstance(n, numbers.Integral) or isinstance(n, bool):
        raise TypeError(f"{what} must be an int, got {n!r}")
    n = int(n)
    if abs(n) > MAX_EXACT or (minimum is not None and n < minimum):
        low = "0" if minimum is not None else f"-{MAX_EXACT:,}"
        raise ValueError(f"{what} must be between {low} and {MAX_EXACT:,}, got {n:,}")
    return n


def _data(check: SelfCheck) -> str:
    """The expected value as the page's script reads it (JSON)."""
    value = list(check.expected) if isinstance(check.expected, tuple) else check.expected
    return json.dumps(value)


def _inline(text: str) -> str:
    """Escaped text, with spans in backticks as code."""
    parts = re.split(r"`([^`]+)`", text)
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p)
                   for i, p in enumerate(parts))
