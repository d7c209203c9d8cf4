"""Attention heatmaps: the seaborn heatmap of the second article, with labels, masks and a colorbar."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch
from matplotlib.axes import Axes

ANNOTATE_UP_TO = 12  # annotate every cell only while the matrix is at most this many tokens wide


def heatmap(
    weights: torch.Tensor | np.ndarray,
    x_tokens: Sequence[str] | None = None,
    y_tokens: Sequence[str] | None = None,
    mask: torch.Tensor | np.ndarray | None = None,
    annot: bool | None = None,
    title: str = "Attention weights",
    ax: Axes | None = None,
    cbar: bool = True,
) -> Axes:
    """Draw an ``(L, S)`` attention matrix: queries down the side, keys along the top.

    Args:
        weights: ``(L, S)`` tensor (any device, any float dtype) or array.
        x_tokens: labels of the ``S`` keys; ``y_tokens`` of the ``L`` queries (default: the keys').
        mask: bool ``(L, S)``, True = may attend (the library's convention). Masked cells are
            drawn hatched grey instead of a colour, so "masked" and "weight 0" look different.
        annot: write each weight in its cell; by default only while ``max(L, S) <= 12``.
        title: the axes' title. ``ax``: where to draw (a new figure by default).
    """
    w = _to_numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"weights must be 2-D (L, S), got shape {w.shape}")
    L, S = w.shape
    y_tokens = x_tokens if y_tokens is None else y_tokens
    for name, tokens, n in [("x_tokens", x_tokens, S), ("y_tokens", y_tokens, L)]:
        if tokens is not None and len(tokens) != n:
            raise ValueError(f"{name} has {len(tokens)} labels for {n} columns/rows of weights")
    hidden = None
    if mask is not None:
        m = _to_numpy(mask)
        if m.dtype != bool or m.shape != w.shape:
            raise ValueError(f"mask must be bool of shape {w.shape}, got {m.dtype} {m.shape}")
        hidden = ~m
    if annot is None:
        annot = max(L, S) <= ANNOTATE_UP_TO
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.55 * S, 0.8 + 0.5 * L))
    ax.set_facecolor("#dddddd")  # shows through the masked (hidden) cells
    sns.heatmap(
        w, ax=ax, mask=hidden, cmap="YlGnBu", vmin=0.0, vmax=1.0, square=True,
        annot=annot, fmt=".2f", annot_kws={"fontsize": 8}, linewidths=0.5, linecolor="white",
        cbar=cbar, cbar_kws={"label": "weight", "shrink": 0.8},
        xticklabels=list(x_tokens) if x_tokens is not None else "auto",
        yticklabels=list(y_tokens) if y_tokens is not None else "auto",
    )
    if hidden is not None and hidden.any():
        for i, j in zip(*np.nonzero(hidden), strict=True):
            ax.add_patch(plt.Rectangle((j, i), 1, 1, fill=False, hatch="///", edgecolor="#999999",
                                       linewidth=0))
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=0)
    ax.tick_params(axis="y", labelrotation=0)
    return ax


def _to_numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return x.numpy() if x.dtype == torch.bool else x.float().numpy()
    return np.asarray(x)
