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

    The chapter's own call is trusted, as every helper only chapters call is; what the page
    relies on is asserted: a known kind and unit, a finite value, whole numbers JavaScript holds
    exactly, hint factors that "close" cannot reach.
    """
    question = " ".join(question.split())
    assert question and kind in KINDS, (question, kind)
    assert unit is None or (unit in UNITS and kind != "shape"), unit
    if isinstance(expected, tuple):
        assert kind == "shape" and rtol is None and expected, "a shape: equal, one dimension or more"
        expected = tuple(_whole(n, minimum=0) for n in expected)
    elif kind == "count":
        assert rtol is None, "a count is right only when equal"
        expected = _whole(expected)
    else:
        rtol = DEFAULT_RTOL if rtol is None else float(rtol)
        assert kind == "number" and 0 <= rtol < 1 and math.isfinite(expected), (rtol, expected)
        expected = float(expected)
    return SelfCheck(question, expected, kind, rtol, unit, _hints(hints or {}, kind))


def _hints(hints: Mapping[float, str], kind: str) -> tuple[tuple[float, str], ...]:
    assert not hints or kind != "shape", "hints are for a number or a count"
    out = []
    for factor, hint in hints.items():
        factor = float(factor)
        near_one = (1 - CLOSE) * factor <= 1 + CLOSE and (1 + CLOSE) * factor >= 1 - CLOSE
        assert 0 < factor < math.inf and not near_one, f"the page's 'close' reaches {factor}"
        out.append((factor, " ".join(hint.split())))
    return tuple(out)


def _whole(n: float, minimum: int = -MAX_EXACT) -> int:
    """``n``, a whole number the page's JavaScript holds exactly (``Number.MAX_SAFE_INTEGER``)."""
    assert isinstance(n, numbers.Integral) and not isinstance(n, bool), n
    assert minimum <= n <= MAX_EXACT, n
    return int(n)


def _data(check: SelfCheck) -> str:
    """The expected value as the page's script reads it (JSON)."""
    value = list(check.expected) if isinstance(check.expected, tuple) else check.expected
    return json.dumps(value)


def _inline(text: str) -> str:
    """Escaped text, with spans in backticks as code."""
    parts = re.split(r"`([^`]+)`", text)
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p)
                   for i, p in enumerate(parts))
