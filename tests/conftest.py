import os
import pathlib

import pytest
import torch
from hypothesis import settings

# CI gets the same examples every run (no flaky failures from a new random draw); a developer's
# run explores new ones. Neither has a deadline: these machines are shared and noisy.
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=60)
settings.register_profile("dev", deadline=None, max_examples=60)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_terminal_summary(terminalreporter):
    """Say where the browser test left its screenshots, so a person can look at them."""
    shots = pathlib.Path(__file__).resolve().parent.parent / "_build" / "screenshots"
    if shots.is_dir() and any(shots.iterdir()):
        terminalreporter.write_line(f"screenshots of the built book's pages: {shots}")
