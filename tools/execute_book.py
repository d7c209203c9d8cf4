"""Execute the book's chapters two at a time into the build's notebook cache; `make book` calls it.

    .venv/bin/python tools/execute_book.py [--jobs N] [--record DIR]

`_config.yml` has jupyter-book execute every chapter through jupyter-cache (`execute_notebooks:
cache`), one notebook after the other. This runs the chapters that cache does not hold yet side
by side first (N processes, default 2, the longest first), exactly as jupyter-book would (same
cache, same working folder, same timeout), so the build that follows only renders. A failing
chapter stops here with its traceback, as it would stop the build.

With ``--record DIR`` (``make test``), every chapter's kernel runs ``tests/harness.py`` first,
which writes ``DIR/<chapter>.jsonl``: the size of the smallest text of every figure, and every
explorer driven live (tests/test_colab.py and tests/test_browser.py read them).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import nbformat
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
CACHE = ROOT / "_build" / ".jupyter_cache"  # jupyter-book 1's default execution cache
HARNESS = ROOT / "tests" / "harness.py"


def chapters() -> list[pathlib.Path]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    return [ROOT / f"{f}.ipynb" for f in files if (ROOT / f"{f}.ipynb").exists()]


def cost(path: pathlib.Path) -> int:
    """A rough order, longest first: the chapters that train, then by size."""
    text = path.read_text()
    return ("train_seeds" in text) * 10**9 + len(text)


def harness_home(record: pathlib.Path) -> pathlib.Path:
    """An IPYTHONDIR whose startup file is the harness. Made once, before the workers start:
    two workers replacing the same link at once raced (FileExistsError)."""
    home = record / "ipython"
    startup = home / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    link = startup / "00_selfattn_harness.py"
    link.unlink(missing_ok=True)
    link.symlink_to(HARNESS)
    return home


def execute(path: pathlib.Path, timeout: int, record: pathlib.Path | None
            ) -> tuple[str, dict, float, str | None]:
    import os

    from jupyter_cache.executors.utils import single_nb_execution

    if record is not None:  # this process runs one chapter at a time: its kernel inherits these
        report = record / f"{path.stem}.jsonl"
        report.unlink(missing_ok=True)
        os.environ.update(IPYTHONDIR=str(record / "ipython"), SELFATTN_HARNESS_REPORT=str(report))
    nb = nbformat.read(path, as_version=4)
    result = single_nb_execution(nb, cwd=str(path.parent), timeout=timeout, allow_errors=False)
    return str(path), json.loads(nbformat.writes(nb)), result.time, result.exc_string


def main(argv: list[str]) -> int:
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--record", type=pathlib.Path, default=None,
                        help="record every chapter's figures and explorers here (tests/harness.py)")
    args = parser.parse_args(argv)
    if args.record is not None:
        args.record = args.record.resolve()
        args.record.mkdir(parents=True, exist_ok=True)
        harness_home(args.record)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["execute"]
    cache = get_cache(str(CACHE))
    todo = []
    for path in chapters():
        try:
            cache.match_cache_notebook(nbformat.read(path, as_version=4))
        except KeyError:
            todo.append(path)
            continue
        if args.record is not None and not (args.record / f"{path.stem}.jsonl").exists():
            todo.append(path)  # executed before without the harness: run it again to record it
    todo.sort(key=cost, reverse=True)
    print(f"executing {len(todo)} chapters, {args.jobs} at a time", flush=True)
    failed = []
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        jobs = [pool.submit(execute, p, config["timeout"], args.record) for p in todo]
        for job in as_completed(jobs):
            path, nb, seconds, error = job.result()
            name = pathlib.Path(path).name
            if error:
                failed.append(name)
                print(f"{name} failed after {seconds:.1f} s:\n{error}", flush=True)
                continue
            cache.add_nb_to_project(path)
            cache.cache_notebook_bundle(
                CacheBundleIn(nbformat.from_dict(nb), path, data={"execution_seconds": seconds}),
                check_validity=False, overwrite=True)
            print(f"{name:40s} {seconds:6.1f} s", flush=True)
    print(f"executed in {time.perf_counter() - start:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
