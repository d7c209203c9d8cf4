"""Pick the fastest device the machine has: CUDA, then Apple's MPS, then the CPU."""

from __future__ import annotations

import torch


def pick_device() -> torch.device:
    """Return ``cuda`` if a GPU is visible, else ``mps`` on Apple silicon, else ``cpu``."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
