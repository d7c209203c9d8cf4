"""The book's apparatus around the attention library: what the chapters need, not what they teach.

* :mod:`.data`, :mod:`.models`, :mod:`.train`: the synthetic tagging tasks, the small taggers and
  their training over seeds;
* :mod:`.viz`, :mod:`.diagrams`: heatmaps and explorers, and the schematic figures;
* :mod:`.live`: live explorers for the static page (a model's forward pass in JavaScript);
* :mod:`.measure`, :mod:`.baselines`, :mod:`.bench`: timing, memory and FLOPs, what the library is
  measured against, and ``make bench``;
* :mod:`.pretrained`: all-MiniLM-L6-v2 rebuilt from the library (chapter 10);
* :mod:`.exercises`: the chapters' checkers; :mod:`.selfcheck`: the page's self-checks.

Each submodule loads on first use (``selfattn.book.viz``), so ``import selfattn.book`` stays cheap.
"""

import importlib

_SUBMODULES = ("baselines", "bench", "data", "diagrams", "exercises", "live", "measure", "models",
               "pretrained", "selfcheck", "train", "viz")

__all__ = list(_SUBMODULES)


def __getattr__(name: str) -> object:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
