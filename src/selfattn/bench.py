"""Measuring tools: wall time, and which inputs a layer's output depends on."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor


def median_time(fn: Callable[[], object], repeats: int = 7, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in seconds, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def influence(layer: Callable[[Tensor], Tensor], x: Tensor, t: int) -> Tensor:
    """Bool ``(T,)``: which input positions of ``x`` (B, T, d) change output position ``t``.

    Measured with autograd: position ``j`` counts when the gradient of output ``t`` with respect
    to input ``j`` is not zero. This is a layer's receptive field, seen from position ``t``.
    """
    x = x.detach().requires_grad_(True)
    out = layer(x)  # (B, T, d_out)
    (grad,) = torch.autograd.grad(out[:, t].sum(), x)
    return grad.abs().sum(dim=(0, 2)) > 0  # (T,)
