import os
import pathlib
import sys
import time

import pytest
import torch

# Without a GPU the Triton kernel's tests run under Triton's interpreter, which must be switched
# on before anything imports triton (tests/test_triton.py)
if not torch.cuda.is_available():
    assert "triton" not in sys.modules, "triton was imported before conftest.py could set it up"
    os.environ.setdefault("TRITON_INTERPRET", "1")
from hypothesis import settings

# CI gets the same examples every run (no flaky failures from a new random draw); a developer's
# run explores new ones. Neither has a deadline: these machines are shared and noisy.
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=60)
settings.register_profile("dev", deadline=None, max_examples=60)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES, scope="session")
def device(request) -> str:
    """Where a parity test runs: "cpu", and "cuda" too on a machine with a GPU (``pytest -k cuda``
    runs only those). Session-scoped, so hypothesis tests can take it."""
    return request.param


STARTED = time.time()  # when this pytest run began


def pytest_terminal_summary(terminalreporter):
    """Say where the browser test left its screenshots, so a person can look at them, and give
    the weight of every page it loaded (tests/test_browser.py)."""
    build = pathlib.Path(__file__).resolve().parent.parent / "_build"
    shots = build / "screenshots"
    if shots.is_dir() and any(shots.iterdir()):
        terminalreporter.write_line(f"screenshots of the built book's pages: {shots}")
    bench = build / "live-benchmark.txt"
    if bench.exists() and bench.stat().st_mtime > STARTED:
        terminalreporter.write_line("chapter 10's live MiniLM, measured in the browser test:")
        terminalreporter.write_line("  " + bench.read_text().strip())
    weights = sorted(f for f in (build / "page-weights").glob("*.txt") if f.stat().st_mtime > STARTED)
    if weights:  # written by this run, a file per page (tests/test_browser.py)
        terminalreporter.write_line("what each page transfers as it loads:")
        for f in weights:
            terminalreporter.write_line("  " + f.read_text().strip())
