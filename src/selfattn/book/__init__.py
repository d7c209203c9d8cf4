"""The book's apparatus around the attention library, laid out like the table of contents.

One module per topic holds that topic's tasks, experiments, figures, diagrams and exercise
checkers, so a chapter's code is in one file:

=================  =====================================================================
module             chapters
=================  =====================================================================
:mod:`.tagging`    1 sequence labeling (its tasks and taggers serve chapters 3 to 7 too)
:mod:`.single_head` 2 self-attention, 3 scoring functions, 4 the scale
:mod:`.positional_encoding` 5 positional encoding
:mod:`.multi_head` 6 multi-head attention, 7 multi-query attention and the KV cache
:mod:`.pitfalls`   8 pitfalls
:mod:`.performance` 9 performance
:mod:`.pretrained` 10 a real pretrained model
:mod:`.decoding`   11 decoding in practice
=================  =====================================================================

:mod:`.kit` is what every topic shares (measurement, training and the seed rule, drawing,
checker scaffolding, the page's self-checks and live explorers); :mod:`.bench` is ``make bench``.
Each submodule loads on first use (``selfattn.book.tagging``), so ``import selfattn.book`` stays
cheap.
"""

import importlib

_SUBMODULES = ("bench", "decoding", "kit", "multi_head", "performance", "pitfalls", "positional_encoding",
               "pretrained", "single_head", "tagging")

__all__ = list(_SUBMODULES)


def __getattr__(name: str) -> object:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
