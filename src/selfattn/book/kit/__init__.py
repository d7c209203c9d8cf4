"""The book's shared kit: instruments every topic uses, and no chapter's logic.

* :mod:`.measure`: time side by side, peak memory, FLOPs and bytes, operator counts;
  :mod:`.peak`: one attention call's peak memory in a fresh process (``python -m``);
* :mod:`.train`: the seed rule, the training loop, training over seeds, seed tables;
* :mod:`.viz`: heatmaps and the explorer widget; :mod:`.draw`: the schematic diagrams' primitives;
* :mod:`.checkers`: what every exercise checker is built from;
* :mod:`.selfcheck`: the page's self-checks; :mod:`.live`: the page's live explorers.
"""
