r"""Positional encodings: how attention learns where a token is.

Sinusoidal encoding (Vaswani et al. 2017, §3.5):

$$PE_{(pos, 2i)} = \sin(pos / 10000^{2i/d}), \qquad PE_{(pos, 2i+1)} = \cos(pos / 10000^{2i/d})$$
"""

from __future__ import annotations

import torch
from torch import Tensor

from .checks import check_positive_int


def sinusoidal_encoding(
    n_positions: int, d_model: int, base: float = 10000.0, device: torch.device | str | None = None
) -> Tensor:
    """The ``(n_positions, d_model)`` table of sines and cosines, added to the token embeddings."""
    check_positive_int(n_positions, "n_positions")
    check_positive_int(d_model, "d_model")
    if d_model % 2:
        raise ValueError(f"d_model must be even to pair sines with cosines, got {d_model}")
    pos = torch.arange(n_positions, dtype=torch.float32, device=device)[:, None]  # (P, 1)
    freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float32, device=device) / d_model)
    angles = pos * freq  # (P, d/2)
    pe = torch.empty(n_positions, d_model, device=device)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe
