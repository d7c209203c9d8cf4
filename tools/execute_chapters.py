"""Execute chapters top to bottom, in place, the way they are committed; print each one's time.

    .venv/bin/python tools/execute_chapters.py chapters/07_multi_query_attention.ipynb ...
    .venv/bin/python tools/execute_chapters.py            (every chapter)

Runs on one thread (the budget: every chapter within 60 s on one thread of a 2-core machine),
with progress bars off, so the committed notebook holds no frozen bar, and live explorers, so it
holds one picture per explorer rather than every precomputed state (the book build precomputes
them itself). Stops at the first failing cell, leaving the notebook unchanged.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def execute(path: pathlib.Path) -> float:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    nbformat.write(nb, path)
    return seconds


def main(argv: list[str]) -> int:
    os.environ.update(OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    os.environ.pop("SELFATTN_STATIC", None)
    paths = [pathlib.Path(a) for a in argv] or sorted((ROOT / "chapters").glob("*.ipynb"))
    for path in paths:
        print(f"{path.name:40s} {execute(path):6.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
