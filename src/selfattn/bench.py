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


def decode_benchmark(
    contexts: list[int],
    d_model: int = 1024,
    n_heads: int = 16,
    kv_heads: tuple[int, ...] = (16, 4, 1),
    naive: bool = True,
    repeats: int = 15,
    warmup: int = 3,
    seed: int = 0,
) -> list[dict]:
    """Time one decoding step (one new token, batch 1) for MHA, GQA and MQA at each context.

    Every variant holds a KV cache of ``context`` tokens; ``naive`` adds the GQA/MQA variants that
    ``repeat_interleave`` their cache (:func:`naive_decode_step`). Variants are interleaved in a
    rotated order in each repeat, so a slow moment of a shared machine hits all of them; the
    first ``warmup`` repeats are dropped; each row gives the median time per token in ms.
    """
    from .multihead import MultiHeadAttention

    torch.manual_seed(seed)
    models = {kv: MultiHeadAttention(d_model, n_heads, n_kv_heads=kv, bias=False).eval()
              for kv in kv_heads}
    names = {kv: "MHA" if kv == n_heads else "MQA" if kv == 1 else f"GQA-{kv}" for kv in kv_heads}
    rows = []
    for context in contexts:
        variants = [(names[kv], kv, False) for kv in kv_heads]
        if naive:
            variants += [(f"{names[kv]} naive", kv, True) for kv in kv_heads if kv != n_heads]
        states = {name: _decode_inputs(models[kv], context, seed) for name, kv, _ in variants}
        samples: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        with torch.no_grad():
            for r in range(warmup + repeats):
                order = variants[r % len(variants):] + variants[: r % len(variants)]
                for name, kv, is_naive in order:
                    cache, x = states[name]
                    start = time.perf_counter()
                    if is_naive:
                        naive_decode_step(models[kv], x, cache)
                    else:
                        models[kv](x, is_causal=True, kv_cache=cache)
                    if r >= warmup:
                        samples[name].append(time.perf_counter() - start)
        for name, kv, is_naive in variants:
            rows.append({"context": context, "variant": name, "n_kv_heads": kv, "naive": is_naive,
                         "ms_per_token": 1e3 * statistics.median(samples[name])})
    return rows


def decode_table(rows: list[dict]) -> str:
    """The decode benchmark as text: ms per token, and each variant's speed-up over MHA."""
    contexts = sorted({r["context"] for r in rows})
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    ms = {(r["context"], r["variant"]): r["ms_per_token"] for r in rows}
    lines = [f"{'context':>7s}" + "".join(f"{v:>13s}" for v in variants),
             f"{'':7s}" + "".join(f"{'ms  vs MHA':>13s}" for _ in variants)]
    for c in contexts:
        mha = ms[(c, variants[0])]
        lines.append(f"{c:7d}" + "".join(f"{ms[(c, v)]:8.2f} {mha / ms[(c, v)]:3.1f}x"
                                         for v in variants))
    return "\n".join(lines)


def decode_bytes(d_model: int, n_heads: int, n_kv_heads: int, context: int,
                 head_dim: int | None = None, itemsize: int = 4) -> dict[str, int]:
    """Bytes one decoding step must read: the projections' weights and the KV cache."""
    hd = head_dim or d_model // n_heads
    weights = (d_model * n_heads * hd * 2 + d_model * n_kv_heads * hd * 2) * itemsize
    cache = 2 * n_kv_heads * context * hd * itemsize
    return {"weights": weights, "cache": cache, "total": weights + cache}


if __name__ == "__main__":  # `make bench`
    print(f"decode: one new token, batch 1, d_model=1024, 16 query heads of 64, float32, "
          f"{torch.get_num_threads()} threads; median ms per token, speed-up over MHA")
    table = decode_benchmark([256, 1024, 4096, 8192, 16384])
    print(decode_table(table))
