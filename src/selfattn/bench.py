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


def _decode_inputs(model, context: int, seed: int = 0):
    """A KV cache already holding ``context`` random tokens, and one new token to decode."""
    from .multihead import KVCache  # bench depends on the math, never the reverse

    cfg = model.config
    p = next(model.parameters())
    g = torch.Generator().manual_seed(seed)
    cache = KVCache(capacity=context + 64)
    k = torch.randn(1, cfg.n_kv_heads, context, cfg.head_dim, generator=g).to(p)
    cache.append(k, k.clone())
    x = torch.randn(1, 1, cfg.d_model, generator=g).to(p)
    return cache, x


def naive_decode_step(model, x: Tensor, cache) -> Tensor:
    """One decoding step that copies each key/value head ``n_heads / n_kv_heads`` times
    (``repeat_interleave``), as most first implementations of GQA/MQA do."""
    import torch.nn.functional as F

    cfg = model.config
    B, L, _ = x.shape
    q = model.q_proj(x).view(B, L, cfg.n_heads, cfg.head_dim).transpose(1, 2)  # (B, H, 1, hd)
    k = model.k_proj(x).view(B, L, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)  # (B, Hkv, 1, hd)
    v = model.v_proj(x).view(B, L, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
    k, v = cache.append(k, v)  # (B, Hkv, S, hd)
    k = k.repeat_interleave(cfg.group_size, dim=1)  # (B, H, S, hd): a full copy per step
    v = v.repeat_interleave(cfg.group_size, dim=1)
    out = F.scaled_dot_product_attention(q, k, v)  # (B, H, 1, hd)
    return model.out_proj(out.transpose(1, 2).reshape(B, L, -1))  # (B, 1, d_model)
