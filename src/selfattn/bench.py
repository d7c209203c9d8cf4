r"""Measuring tools and the benchmarks behind chapters 7 and 9 (``make bench``).

How we time, on machines that other people share: every variant is warmed up first; then in each
round every variant runs once, in an order rotated by one each round, so a slow moment hits all of
them; a sample during which other processes used the CPU (read from ``/proc/stat`` before and
after) is discarded; the median of the rest is reported. Ratios are only ever taken between
variants measured side by side in the same run.

FLOPs are dense counts: attention does $4 L S d$ per head forward ($QK^\top$ and $AV$, each
$2LSd$), and backward twice that.
"""

from __future__ import annotations

import math
import os
import statistics
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode


def synchronize() -> None:
    """Wait for the GPU's queued work, if CUDA is in use: a GPU runs asynchronously, so a clock
    read right after a call would time only the launch of its kernels."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def median_time(fn: Callable[[], object], repeats: int = 7, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in seconds, after ``warmup`` untimed calls (CUDA synchronized)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _cpu_busy_seconds() -> float | None:
    """CPU seconds every process on the machine has spent busy since boot (``/proc/stat``)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None  # not Linux: no contention check
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class Timing:
    """The samples of one variant: seconds per call, and how many were discarded."""

    samples: list[float] = field(default_factory=list)
    discarded: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def compare(fns: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 2,
            min_sample_s: float = 0.1, max_others: float = 0.25) -> dict[str, Timing]:
    """Time several variants side by side; seconds per call of each.

    Each sample repeats the call enough times to last ``min_sample_s`` (the kernel counts CPU time
    in 10 ms ticks). A sample is discarded when other processes used more than ``max_others``
    of its wall time in CPU time (plus two ticks of slack); if fewer than three samples of a
    variant survive, all of them are kept (``discarded`` then says how many were contended).
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    inner = {}
    for name in names:  # calls per sample, from one timed call
        synchronize()
        start = time.perf_counter()
        fns[name]()
        synchronize()
        inner[name] = max(1, math.ceil(min_sample_s / max(time.perf_counter() - start, 1e-9)))
    tick = 2 / os.sysconf("SC_CLK_TCK")
    kept: dict[str, Timing] = {name: Timing() for name in names}
    contended: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn, n = fns[name], inner[name]
            synchronize()
            busy0, own0, start = _cpu_busy_seconds(), time.process_time(), time.perf_counter()
            for _ in range(n):
                fn()
            synchronize()
            wall = time.perf_counter() - start
            busy1, own1 = _cpu_busy_seconds(), time.process_time()
            others = 0.0 if busy0 is None else (busy1 - busy0) - (own1 - own0)
            (contended[name] if others > max_others * wall + tick else kept[name].samples
             ).append(wall / n)
    for name in names:
        kept[name].discarded = len(contended[name])
        if len(kept[name].samples) < 3:
            kept[name].samples += contended[name]
    return kept


def attention_flops(L: int, S: int, head_dim: int, n_heads: int = 1, batch: int = 1,
                    backward: bool = False) -> int:
    r"""Dense multiply-add FLOPs of attention: $QK^\top$ and $AV$ are $2LSd$ each per head;
    backward computes four products of the same size (dQ, dK, dV and the scores' gradient)."""
    forward = 4 * batch * n_heads * L * S * head_dim
    return 3 * forward if backward else forward


def mha_flops(batch: int, T: int, d_model: int, backward: bool = False) -> int:
    r"""Dense FLOPs of a multi-head self-attention layer: four ``d_model x d_model`` projections
    ($8 B T d^2$) plus attention over all heads ($4 B T^2 d$); backward doubles each."""
    forward = 8 * batch * T * d_model * d_model + attention_flops(T, T, d_model, 1, batch)
    return 3 * forward if backward else forward


def fit_exponent(sizes: list[float], times: list[float]) -> float:
    r"""The slope $p$ of the least-squares line through $(\log n, \log t)$: $t \propto n^p$."""
    if len(sizes) != len(times) or len(sizes) < 2:
        raise ValueError(f"need at least two (size, time) pairs, got {len(sizes)} sizes and "
                         f"{len(times)} times")
    if min(sizes) <= 0 or min(times) <= 0:
        raise ValueError("sizes and times must be positive to take logarithms")
    x = [math.log(n) for n in sizes]
    y = [math.log(t) for t in times]
    mx, my = statistics.fmean(x), statistics.fmean(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sum((a - mx) ** 2 for a in x)


class _LiveBytes(TorchDispatchMode):
    """Counts the bytes of every storage that torch operations create while the mode is on,
    freeing them when the last tensor using a storage is gone; keeps the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.users: dict[int, list] = {}  # storage pointer -> [tensors alive, bytes]

    def _release(self, key: int) -> None:
        entry = self.users[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.users[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, Tensor) and t.device.type != "meta":
                key = t.untyped_storage().data_ptr()
                if key not in self.users:
                    self.users[key] = [0, t.untyped_storage().nbytes()]
                    self.live += self.users[key][1]
                    self.peak = max(self.peak, self.live)
                self.users[key][0] += 1
                weakref.finalize(t, self._release, key)
        return out


def peak_memory(fn: Callable[[], object]) -> int:
    """Peak bytes of tensor storage that ``fn()`` holds at once, beyond what existed before.

    Every tensor created through torch's dispatcher is counted while alive (a
    ``TorchDispatchMode``); buffers a fused kernel allocates and frees internally are not, which
    is the point of fusing. Run it under ``torch.no_grad()``: autograd's saved tensors outlive
    the Python objects this counts.
    """
    mode = _LiveBytes()
    with mode:
        result = fn()
    del result
    return mode.peak


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
                    synchronize()
                    start = time.perf_counter()
                    if is_naive:
                        naive_decode_step(models[kv], x, cache)
                    else:
                        models[kv](x, is_causal=True, kv_cache=cache)
                    synchronize()
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


def _einsum_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Attention in einsum notation, the second article's style: ``(B, H, T, hd)`` in and out."""
    scores = torch.einsum("bhld,bhsd->bhls", q * q.shape[-1] ** -0.5, k)  # (B, H, L, S)
    return torch.einsum("bhls,bhsd->bhld", torch.softmax(scores, dim=-1), v)  # (B, H, L, hd)


class EinopsSelfAttention(torch.nn.Module):
    """The second article's class with its bugs fixed (chapter 8): einops ``rearrange`` to split
    and merge heads, einsum for the products, full-width projections."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            torch.nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        from einops import rearrange

        q, k, v = (rearrange(p(x), "b n (h d) -> b h n d", h=self.n_heads)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # (B, H, T, hd) each
        return self.out_proj(rearrange(_einsum_attention(q, k, v), "b h n d -> b n (h d)"))


def attention_benchmark(batch: int = 8, T: int = 512, d_model: int = 512, n_heads: int = 8,
                        repeats: int = 9, min_sample_s: float = 0.2, seed: int = 0) -> list[dict]:
    """Forward, forward+backward and causal inference times of every variant, side by side.

    Rows: ``variant``, ``level`` (``core``: attention given q, k, v; ``layer``: projections
    too), ``mode``, ``ms``, ``gflops`` (dense count / time), ``discarded`` (contended samples),
    ``vs_sdpa`` (time / F.sdpa's time in the same mode) and ``vs_reference`` (core rows vs
    F.sdpa, layer rows vs ``nn.MultiheadAttention(need_weights=False)``).
    """
    import torch.nn.functional as F
    from torch import nn

    from .attention import scaled_dot_product_attention
    from .multihead import MultiHeadAttention

    torch.manual_seed(seed)
    hd = d_model // n_heads
    q, k, v = (torch.randn(batch, n_heads, T, hd, requires_grad=True) for _ in range(3))
    x = torch.randn(batch, T, d_model, requires_grad=True)
    ours = MultiHeadAttention(d_model, n_heads)
    theirs = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
    einops_layer = EinopsSelfAttention(d_model, n_heads)
    core = {
        "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v),
        "selfattn.scaled_dot_product_attention": lambda: scaled_dot_product_attention(q, k, v)[0],
        "einsum attention": lambda: _einsum_attention(q, k, v),
    }
    layer = {
        "MultiHeadAttention, fast path": lambda: ours(x)[0],
        "MultiHeadAttention, weights": lambda: ours(x, need_weights=True)[0],
        "einops + einsum layer": lambda: einops_layer(x),
        "nn.MultiheadAttention(need_weights=False)": lambda: theirs(x, x, x, need_weights=False)[0],
        "nn.MultiheadAttention(need_weights=True)":
            lambda: theirs(x, x, x, need_weights=True, average_attn_weights=False)[0],
    }
    level = {**dict.fromkeys(core, "core"), **dict.fromkeys(layer, "layer")}
    fns = {**core, **layer}

    def backward(fn):
        return lambda: fn().sum().backward()

    flops = {"core": attention_flops(T, T, hd, n_heads, batch),
             "layer": mha_flops(batch, T, d_model)}
    rows = []
    for mode, timed, factor in [("forward", fns, 1),
                                ("forward+backward", {n: backward(f) for n, f in fns.items()}, 3)]:
        for name, t in compare(timed, repeats, min_sample_s=min_sample_s).items():
            rows.append({"variant": name, "level": level[name], "mode": mode, "ms": 1e3 * t.median,
                         "gflops": factor * flops[level[name]] / t.median / 1e9,
                         "discarded": t.discarded})
    # inference: eval mode, no autograd, a causal mask (PyTorch's C++ fast path is eligible)
    ours.eval()
    theirs.eval()
    blocked = torch.ones(T, T, dtype=torch.bool).triu(1)  # nn.MultiheadAttention: True = masked
    xi = x.detach()
    qi, ki, vi = q.detach(), k.detach(), v.detach()
    inference = {
        "F.scaled_dot_product_attention":
            lambda: F.scaled_dot_product_attention(qi, ki, vi, is_causal=True),
        "MultiHeadAttention, fast path": lambda: ours(xi, is_causal=True)[0],
        "MultiHeadAttention, weights": lambda: ours(xi, is_causal=True, need_weights=True)[0],
        "nn.MultiheadAttention, default call": lambda: theirs(xi, xi, xi, attn_mask=blocked)[0],
        "nn.MultiheadAttention(need_weights=False)":
            lambda: theirs(xi, xi, xi, attn_mask=blocked, need_weights=False, is_causal=True)[0],
        "nn.MultiheadAttention(need_weights=True)": lambda: theirs(
            xi, xi, xi, attn_mask=blocked, need_weights=True, average_attn_weights=False)[0],
    }
    with torch.no_grad():
        for name, t in compare(inference, repeats, min_sample_s=min_sample_s).items():
            kind = "core" if name.startswith("F.") else "layer"
            rows.append({"variant": name, "level": kind, "mode": "inference, causal",
                         "ms": 1e3 * t.median, "gflops": flops[kind] / t.median / 1e9,
                         "discarded": t.discarded})
    reference = {(r["mode"], r["level"]): r["ms"] for r in rows if r["variant"] in (
        "F.scaled_dot_product_attention", "nn.MultiheadAttention(need_weights=False)")}
    for r in rows:
        r["vs_sdpa"] = r["ms"] / reference[(r["mode"], "core")]
        r["vs_reference"] = r["ms"] / reference[(r["mode"], r["level"])]
    return rows


def matmul_gflops(n: int = 2048, repeats: int = 9) -> float:
    """GFLOP/s of one ``n x n`` float32 matmul on this machine: the practical ceiling."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / compare({"matmul": lambda: a @ b}, repeats)["matmul"].median / 1e9


def scaling_benchmark(lengths: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096),
                      n_heads: int = 8, head_dim: int = 64, repeats: int = 5,
                      min_sample_s: float = 0.1) -> list[dict]:
    """Forward time (no grad) and peak memory of the explicit path and of PyTorch's SDPA against
    sequence length, batch 1."""
    import torch.nn.functional as F

    from .attention import scaled_dot_product_attention

    variants = {"explicit (selfattn)": lambda q: scaled_dot_product_attention(q, q, q)[0],
                "F.scaled_dot_product_attention": lambda q: F.scaled_dot_product_attention(q, q, q)}
    rows = []
    with torch.no_grad():
        for T in lengths:
            q = torch.randn(1, n_heads, T, head_dim, generator=torch.Generator().manual_seed(T))
            calls = {n: (lambda f=f, q=q: f(q)) for n, f in variants.items()}
            times = compare(calls, repeats, warmup=1, min_sample_s=min_sample_s)
            for name, call in calls.items():
                rows.append({"T": T, "variant": name, "ms": 1e3 * times[name].median,
                             "peak_mb": peak_memory(call) / 2**20})
    return rows


def _print_table(rows: list[dict], columns: list[str], formats: dict[str, str]) -> None:
    print("  ".join(f"{c:>{max(len(c), 10)}s}" if c != "variant" else f"{c:44s}" for c in columns))
    for r in rows:
        cells = []
        for c in columns:
            value = r[c]
            width = max(len(c), 10)
            cells.append(f"{value:44s}" if c == "variant"
                         else f"{value:>{width}{formats.get(c, '')}}")
        print("  ".join(cells))


def main(out_dir: str = "_build/bench") -> None:
    """``make bench``: every table of chapter 9 at full size, plus a CSV and a PNG."""
    import csv
    import pathlib

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32; medians of "
          "interleaved samples, contended samples discarded\n")
    ceiling = matmul_gflops()
    print(f"ceiling: a 2048 x 2048 matmul runs at {ceiling:.0f} GFLOP/s\n")
    rows = attention_benchmark()
    for mode in ("forward", "forward+backward", "inference, causal"):
        sub = [r for r in rows if r["mode"] == mode]
        for r in sub:
            r["of_ceiling"] = r["gflops"] / ceiling
        print(f"{mode} (B=8, T=512, d_model=512, 8 heads; vs_sdpa: time / F.sdpa's time; "
              "vs_reference: core vs F.sdpa, layer vs nn.MultiheadAttention(need_weights=False))")
        _print_table(sub, ["variant", "level", "ms", "vs_sdpa", "vs_reference", "gflops",
                           "of_ceiling", "discarded"],
                     {"ms": ".1f", "vs_sdpa": ".2f", "vs_reference": ".2f", "gflops": ".0f",
                      "of_ceiling": ".2f"})
        print()
    ms = {(r["mode"], r["variant"]): r["ms"] for r in rows}
    fast, weights = "MultiHeadAttention, fast path", "MultiHeadAttention, weights"
    nw_false, nw_true = ("nn.MultiheadAttention(need_weights=False)",
                         "nn.MultiheadAttention(need_weights=True)")
    targets = [
        ("fast path / nn.MHA(need_weights=False), forward", "forward", fast, nw_false, 1.0),
        ("fast path / nn.MHA(need_weights=False), fwd+bwd", "forward+backward", fast, nw_false,
         1.0),
        ("fast path / nn.MHA default call, inference", "inference, causal", fast,
         "nn.MultiheadAttention, default call", 0.6),
        ("weights / nn.MHA(need_weights=True), forward", "forward", weights, nw_true, 1.10),
        ("weights / nn.MHA(need_weights=True), fwd+bwd", "forward+backward", weights, nw_true,
         1.10),
        ("weights / nn.MHA(need_weights=True), inference", "inference, causal", weights, nw_true,
         0.9),
    ]
    print("targets (ratio of times, measured side by side in this run)")
    for label, mode, a, b, goal in targets:
        ratio = ms[(mode, a)] / ms[(mode, b)]
        print(f"  {label:52s} {ratio:5.2f}  target <= {goal:.2f}  {'met' if ratio <= goal else 'MISSED'}")
    best = max(r["gflops"] for r in rows if r["mode"] == "forward")
    print(f"  {'best forward GFLOP/s / matmul ceiling':52s} {best / ceiling:5.2f}  target >= 0.85  "
          f"{'met' if best / ceiling >= 0.85 else 'MISSED'}\n")

    scaling = scaling_benchmark()
    print("explicit path vs SDPA against sequence length (batch 1, 8 heads of 64, no grad)")
    _print_table(scaling, ["variant", "T", "ms", "peak_mb"], {"ms": ".2f", "peak_mb": ".1f"})
    for name in dict.fromkeys(r["variant"] for r in scaling):
        long = [r for r in scaling if r["variant"] == name and r["T"] >= 1024]
        sizes = [r["T"] for r in long]
        print(f"  {name}: time grows as T^{fit_exponent(sizes, [r['ms'] for r in long]):.2f}, "
              f"memory as T^{fit_exponent(sizes, [r['peak_mb'] for r in long]):.2f} (T >= 1024)")
    print()
    print("decode: one new token, batch 1, d_model=1024, 16 query heads of 64; ms per token, "
          "speed-up over MHA")
    decode = decode_benchmark([256, 1024, 4096, 8192, 16384])
    print(decode_table(decode))
    step = {(r["context"], r["variant"]): r["ms_per_token"] for r in decode}
    print("decode targets (chapter 7)")
    for label, a, b, context, goal in [
        ("MQA speed-up over MHA at 16384", "MHA", "MQA", 16384, 4.0),
        ("GQA-4 speed-up over MHA at 16384", "MHA", "GQA-4", 16384, 2.0),
        ("GQA-4 naive slow-down at 8192", "GQA-4 naive", "GQA-4", 8192, 4.0),
        ("GQA-4 naive slow-down at 16384", "GQA-4 naive", "GQA-4", 16384, 4.0),
        ("MQA naive slow-down at 8192", "MQA naive", "MQA", 8192, 4.0),
        ("MQA naive slow-down at 16384", "MQA naive", "MQA", 16384, 4.0),
    ]:
        ratio = step[(context, a)] / step[(context, b)]
        print(f"  {label:52s} {ratio:5.2f}  target >= {goal:.2f}  {'met' if ratio >= goal else 'MISSED'}")

    for name, table in [("attention", rows), ("scaling", scaling), ("decode", decode)]:
        with open(out / f"{name}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)
    _plot(rows, scaling, ceiling, out / "bench.png")
    print(f"\nwrote {out}/attention.csv, scaling.csv, decode.csv and bench.png")


def _plot(rows: list[dict], scaling: list[dict], ceiling: float, path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.5), layout="constrained")
    left, middle, right = fig.subplots(1, 3, width_ratios=[1.2, 1, 1])
    forward = [r for r in rows if r["mode"] == "forward"]
    left.barh([r["variant"] for r in forward], [r["gflops"] for r in forward], color="C0")
    left.axvline(ceiling, color="C3", ls="--", label=f"matmul ceiling {ceiling:.0f}")
    left.set(xlabel="GFLOP/s (forward, dense count)", title="Throughput at T = 512")
    left.legend(loc="lower right", fontsize=8)
    left.tick_params(axis="y", labelsize=7)
    for name in dict.fromkeys(r["variant"] for r in scaling):
        sub = [r for r in scaling if r["variant"] == name]
        middle.loglog([r["T"] for r in sub], [r["ms"] for r in sub], "o-", label=name)
        right.loglog([r["T"] for r in sub], [r["peak_mb"] for r in sub], "o-", label=name)
    lengths = sorted({r["T"] for r in scaling})
    for ax in (middle, right):
        ax.set_xticks(lengths, [str(t) for t in lengths])
        ax.minorticks_off()
    middle.set(xlabel="sequence length T", ylabel="ms (forward, batch 1, 8 heads)",
               title="Time against length")
    right.set(xlabel="sequence length T", ylabel="peak MiB of tensors",
              title="Memory against length")
    middle.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.savefig(path, dpi=90)


if __name__ == "__main__":  # `make bench`
    main()
