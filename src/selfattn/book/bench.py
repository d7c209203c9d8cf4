r"""``make bench``: every benchmark of chapters 7 and 9, measured side by side in one run.

The measuring tools are in :mod:`selfattn.book.measure`, the article-style baselines in
:mod:`selfattn.book.baselines`. Each benchmark returns rows (dicts) that the chapters print and plot;
each ``*_targets`` function turns a benchmark's rows into the library's speed targets
(:class:`Target`: a ratio of two times measured in the same run, and its goal). :func:`main` runs
every benchmark at full size, prints its tables and targets, and writes CSV files and a PNG.
"""

from __future__ import annotations

import csv
import dataclasses
import operator
import pathlib
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import fastpaths
from ..attention import scaled_dot_product_attention
from ..cache import KVCache
from ..multihead import MultiHeadAttention
from ..tiled import tiled_attention
from .baselines import EinopsSelfAttention, bare_decode_step, einsum_attention, matmul_attention
from .measure import (
    attention_flops,
    compare,
    decode_bytes,
    fit_exponent,
    fresh_process_peak_memory,
    mha_flops,
    peak_memory,
    saved_tensor_bytes,
    synchronize,
)

_COMPARISONS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt}


@dataclasses.dataclass(frozen=True)
class Target:
    """A speed target of ``make bench``: ``ratio`` (of two times, or two sizes, measured in the
    same run) compared by ``op`` (``"<="``, ``">="`` or ``"<"``) with ``goal``; ``note`` is
    printed beside it, for information."""

    label: str
    ratio: float
    op: str
    goal: float
    note: str = ""

    def __post_init__(self) -> None:
        if self.op not in _COMPARISONS:
            raise ValueError(f"op must be one of {sorted(_COMPARISONS)}, got {self.op!r}")

    @property
    def met(self) -> bool:
        return bool(_COMPARISONS[self.op](self.ratio, self.goal))


def format_target(target: Target) -> str:
    """One line: the label, the ratio (three decimals), the goal and whether it was met."""
    line = (f"  {target.label:54s} {target.ratio:6.3f}  target {target.op:2s} {target.goal:.2f}  "
            f"{'met' if target.met else 'MISSED'}")
    return f"{line}  ({target.note})" if target.note else line


def _print_targets(title: str, targets: list[Target]) -> None:
    print(f"{title} (ratios measured side by side in this run)")
    for target in targets:
        print(format_target(target))


def _decode_inputs(model, context: int, seed: int = 0):
    """A KV cache already holding ``context`` random tokens, and one new token to decode."""
    cfg = model.config
    p = next(model.parameters())
    g = torch.Generator().manual_seed(seed)
    cache = KVCache(capacity=context + 8192)  # room for every timed step
    k = torch.randn(1, cfg.n_kv_heads, context, cfg.head_dim, generator=g).to(p)
    cache.append(k, k.clone())
    x = torch.randn(1, 1, cfg.d_model, generator=g).to(p)
    return cache, x


def decode_benchmark(
    contexts: list[int],
    d_model: int = 1024,
    n_heads: int = 16,
    kv_heads: tuple[int, ...] = (16, 4, 1),
    naive: bool = True,
    bare: bool = False,
    repeats: int = 15,
    warmup: int = 3,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> list[dict]:
    """Time one decoding step (one new token, batch 1) for MHA, GQA and MQA at each context.

    Every variant holds a KV cache of ``context`` tokens; ``naive`` adds the GQA/MQA variants that
    copy their cache for every query head (:func:`~selfattn.heads.repeat_kv`, with
    ``fastpaths.disabled("grouped_heads")``); ``bare`` adds MHA and MQA computed by
    :func:`~selfattn.book.baselines.bare_decode_step`, the layer's kernels without its Python.
    Variants are interleaved in a rotated order in each repeat, so a slow moment of a shared
    machine hits all of them; the first ``warmup`` repeats are dropped; each row gives the
    median time per token in ms, and ``split_kv``: whether a step ran the split of the keys
    across threads (recorded from one step before the clock starts). Each sample is one call, not
    :func:`~selfattn.book.measure.compare`'s loop of calls: every call appends a token to the cache.
    ``device``: where the layers and their caches live (default the CPU); on CUDA every sample is
    synchronised before and after, so it times the kernels, not their launch. The weights are
    drawn on the CPU and moved, so every device times the same layers.
    """
    torch.manual_seed(seed)
    device = torch.device("cpu" if device is None else device)
    models = {kv: MultiHeadAttention(d_model, n_heads, n_kv_heads=kv, bias=False).to(device).eval()
              for kv in kv_heads}
    names = {kv: "MHA" if kv == n_heads else "MQA" if kv == 1 else f"GQA-{kv}" for kv in kv_heads}
    variants = [(names[kv], kv, "layer") for kv in kv_heads]
    if naive:
        variants += [(f"{names[kv]} naive", kv, "naive") for kv in kv_heads if kv != n_heads]
    if bare:
        variants += [(f"{names[kv]} bare", kv, "bare") for kv in kv_heads if kv in (1, n_heads)]

    def step(kv: int, how: str, cache: KVCache, x: Tensor) -> None:
        if how == "bare":
            bare_decode_step(models[kv], x, cache)
        elif how == "naive":
            with fastpaths.disabled("grouped_heads"):
                models[kv](x, is_causal=True, kv_cache=cache)
        else:
            models[kv](x, is_causal=True, kv_cache=cache)

    def split_ran(kv: int, how: str, cache: KVCache, x: Tensor) -> bool:
        """Whether one step of this variant runs the split of the keys (``split_kv``): the step
        runs once, with the split's function wrapped to count its calls."""
        calls, split = [], fastpaths._split_kv_attention

        def counted(*args: Tensor) -> Tensor:
            calls.append(1)
            return split(*args)

        fastpaths._split_kv_attention = counted
        try:
            step(kv, how, cache, x)
        finally:
            fastpaths._split_kv_attention = split
        return bool(calls)

    rows = []
    for context in contexts:
        states = {name: _decode_inputs(models[kv], context, seed) for name, kv, _ in variants}
        samples: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        with torch.no_grad():
            ran = {name: split_ran(kv, how, *states[name]) for name, kv, how in variants}
            for r in range(warmup + repeats):
                for name, kv, how in variants[r % len(variants):] + variants[: r % len(variants)]:
                    synchronize()
                    start = time.perf_counter()
                    step(kv, how, *states[name])
                    synchronize()
                    if r >= warmup:
                        samples[name].append(time.perf_counter() - start)
        for name, kv, how in variants:
            rows.append({"context": context, "variant": name, "n_kv_heads": kv,
                         "naive": how == "naive", "bare": how == "bare", "split_kv": ran[name],
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


def decode_targets(rows: list[dict], d_model: int = 1024, n_heads: int = 16) -> list[Target]:
    """``make bench``'s targets for decoding, at the longest context of
    :func:`decode_benchmark`'s rows (a layer of ``d_model`` and ``n_heads`` query heads, with MHA,
    GQA-4 and MQA variants and their naive copies): MQA's and GQA-4's speed-ups over MHA, each
    beside its share of the bound that the bytes a step reads set, and the naive copies'
    slow-downs. At shorter contexts the naive copy's cost swings too much from run to run to judge.
    """
    context = max(r["context"] for r in rows)
    ms = {r["variant"]: r["ms_per_token"] for r in rows if r["context"] == context}
    kv = {r["variant"]: r["n_kv_heads"] for r in rows}
    targets = []
    for variant, goal in [("MQA", 3.5), ("GQA-4", 2.0)]:
        speedup = ms["MHA"] / ms[variant]
        bound = (decode_bytes(d_model, n_heads, n_heads, context)["total"]
                 / decode_bytes(d_model, n_heads, kv[variant], context)["total"])
        targets.append(Target(f"{variant} speed-up over MHA at {context}", speedup, ">=", goal,
                              note=f"{speedup / bound:.2f} of the bytes bound, {bound:.1f}x"))
    for variant in ("GQA-4", "MQA"):
        targets.append(Target(f"{variant} naive slow-down at {context}",
                              ms[f"{variant} naive"] / ms[variant], ">=", 4.0))
    return targets


FLOOR = "floor: 4 projections + F.sdpa"  # the layer row of attention_benchmark that is a bound
FAST, WEIGHTS = "MultiHeadAttention, fast path", "MultiHeadAttention, weights"
TORCH, TORCH_WEIGHTS = ("nn.MultiheadAttention(need_weights=False)",
                        "nn.MultiheadAttention(need_weights=True)")
TORCH_DEFAULT = "nn.MultiheadAttention, default call"
CAUSAL = ", causal"  # ends the names of the causal rows timed with autograd


def attention_benchmark(batch: int = 8, T: int = 512, d_model: int = 512, n_heads: int = 8,
                        repeats: int = 9, min_sample_s: float = 0.2, seed: int = 0) -> list[dict]:
    """Forward, forward+backward and causal inference times of every variant, side by side.

    Rows: ``variant``, ``level`` (``core``: attention given q, k, v; ``layer``: projections
    too), ``mode``, ``causal``, ``ms``, ``gflops`` (FLOPs / time; causal rows count only the
    products the mask keeps, $T(T+1)/2$ of the $T^2$ scores, whatever a variant computes),
    ``discarded`` (contended samples), ``vs_sdpa`` (time / F.sdpa's time in the same mode) and
    ``vs_reference`` (core rows vs F.sdpa, layer rows vs
    ``nn.MultiheadAttention(need_weights=False)``).

    Every inference row is causal. Forward and forward+backward also time the two layers that
    return weights under a causal mask (``WEIGHTS + CAUSAL``: ``is_causal=True``;
    ``TORCH_WEIGHTS + CAUSAL``: the same mask as ``attn_mask``, True = masked, as
    ``nn.MultiheadAttention`` takes it). The layer row ``FLOOR`` runs only the kernels no layer
    can avoid: its four projections and ``F.scaled_dot_product_attention``, each on inputs of the
    layer's shapes. A layer's time over the floor's is what its own code adds (splitting heads,
    copies, checks).
    """
    torch.manual_seed(seed)
    hd = d_model // n_heads
    q, k, v = (torch.randn(batch, n_heads, T, hd, requires_grad=True) for _ in range(3))
    x = torch.randn(batch, T, d_model, requires_grad=True)
    ours = MultiHeadAttention(d_model, n_heads)
    theirs = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
    einops_layer = EinopsSelfAttention(d_model, n_heads)
    projections = [ours.q_proj, ours.k_proj, ours.v_proj, ours.out_proj]
    blocked = torch.ones(T, T, dtype=torch.bool).triu(1)  # nn.MultiheadAttention: True = masked

    def floor(**sdpa) -> list[Tensor]:  # the four projections and the attention, nothing else
        return [p(x) for p in projections] + [F.scaled_dot_product_attention(q, k, v, **sdpa)]

    core = {
        "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v),
        "selfattn.scaled_dot_product_attention": lambda: scaled_dot_product_attention(q, k, v)[0],
        "einsum attention": lambda: einsum_attention(q, k, v),
        "plain matmul attention": lambda: matmul_attention(q, k, v),
    }
    layer = {
        FAST: lambda: ours(x)[0],
        WEIGHTS: lambda: ours(x, need_weights=True)[0],
        WEIGHTS + CAUSAL: lambda: ours(x, is_causal=True, need_weights=True)[0],
        "einops + einsum layer": lambda: einops_layer(x, x, x),
        TORCH: lambda: theirs(x, x, x, need_weights=False)[0],
        TORCH_WEIGHTS: lambda: theirs(x, x, x, need_weights=True, average_attn_weights=False)[0],
        TORCH_WEIGHTS + CAUSAL: lambda: theirs(x, x, x, attn_mask=blocked, need_weights=True,
                                               average_attn_weights=False)[0],
        FLOOR: floor,
    }
    level = {**dict.fromkeys(core, "core"), **dict.fromkeys(layer, "layer")}
    fns = {**core, **layer}

    def backward(fn):
        if fn is floor:  # several outputs: a gradient of ones for each, as .sum() would give
            return lambda: torch.autograd.backward(
                outs := fn(), [torch.ones(()).expand_as(o) for o in outs])
        return lambda: fn().sum().backward()

    attention = attention_flops(T, T, hd, n_heads, batch)
    masked = attention * (T - 1) / (2 * T)  # the products of the scores a causal mask drops
    flops: dict[tuple[str, bool], float] = {("core", False): attention,
                                           ("layer", False): mha_flops(batch, T, d_model)}
    flops |= {(kind, True): count - masked for (kind, _), count in flops.items()}

    def row(name: str, kind: str, mode: str, causal: bool, t, factor: int = 1) -> dict:
        return {"variant": name, "level": kind, "mode": mode, "causal": causal,
                "ms": 1e3 * t.median, "gflops": factor * flops[(kind, causal)] / t.median / 1e9,
                "discarded": t.discarded}

    rows = []
    for mode, timed, factor in [("forward", fns, 1),
                                ("forward+backward", {n: backward(f) for n, f in fns.items()}, 3)]:
        for name, t in compare(timed, repeats, min_sample_s=min_sample_s).items():
            rows.append(row(name, level[name], mode, name.endswith(CAUSAL), t, factor))
    # inference: eval mode, no autograd, a causal mask (PyTorch's C++ fast path is eligible)
    ours.eval()
    theirs.eval()
    xi = x.detach()
    qi, ki, vi = q.detach(), k.detach(), v.detach()
    inference = {
        "F.scaled_dot_product_attention":
            lambda: F.scaled_dot_product_attention(qi, ki, vi, is_causal=True),
        FAST: lambda: ours(xi, is_causal=True)[0],
        WEIGHTS + CAUSAL: lambda: ours(xi, is_causal=True, need_weights=True)[0],
        TORCH_DEFAULT: lambda: theirs(xi, xi, xi, attn_mask=blocked)[0],
        TORCH: lambda: theirs(xi, xi, xi, attn_mask=blocked, need_weights=False, is_causal=True)[0],
        TORCH_WEIGHTS + CAUSAL: lambda: theirs(
            xi, xi, xi, attn_mask=blocked, need_weights=True, average_attn_weights=False)[0],
        FLOOR: lambda: floor(is_causal=True),
    }
    with torch.no_grad():
        for name, t in compare(inference, repeats, min_sample_s=min_sample_s).items():
            kind = "core" if name.startswith("F.") else "layer"
            rows.append(row(name, kind, "inference, causal", True, t))
    reference = {(r["mode"], r["level"]): r["ms"] for r in rows
                 if r["variant"] in ("F.scaled_dot_product_attention", TORCH)}
    for r in rows:
        r["vs_sdpa"] = r["ms"] / reference[(r["mode"], "core")]
        r["vs_reference"] = r["ms"] / reference[(r["mode"], r["level"])]
    return rows


def attention_targets(rows: list[dict]) -> list[Target]:
    """``make bench``'s targets for the layer, from :func:`attention_benchmark`'s rows: its fast
    path against ``nn.MultiheadAttention``'s, its path with weights against theirs (without a
    mask, and causal), and the floor against the fast path (how little the layer adds)."""
    ms = {(r["mode"], r["variant"]): r["ms"] for r in rows}
    modes = [("forward", "forward"), ("forward+backward", "fwd+bwd")]
    inference = "inference, causal"

    def target(label: str, mode: str, a: str, b: str, op: str, goal: float) -> Target:
        return Target(label, ms[(mode, a)] / ms[(mode, b)], op, goal)

    return [
        *(target(f"fast path / nn.MHA(need_weights=False), {short}", mode, FAST, TORCH, "<=", 1.0)
          for mode, short in modes),
        target("fast path / nn.MHA default call, inference", inference, FAST, TORCH_DEFAULT,
               "<=", 0.6),
        *(target(f"weights / nn.MHA(need_weights=True), {short}", mode, WEIGHTS, TORCH_WEIGHTS,
                 "<=", 1.10) for mode, short in modes),
        *(target(f"causal weights / nn.MHA(need_weights=True), {short}", mode, WEIGHTS + CAUSAL,
                 TORCH_WEIGHTS + CAUSAL, "<=", 1.10) for mode, short in modes),
        target("causal weights / nn.MHA(need_weights=True), inference", inference,
               WEIGHTS + CAUSAL, TORCH_WEIGHTS + CAUSAL, "<=", 0.9),
        *(target(f"floor / fast path, {short}", mode, FLOOR, FAST, ">=", 0.85)
          for mode, short in modes),
    ]


def matmul_gflops(n: int = 2048, repeats: int = 9) -> float:
    """GFLOP/s of one ``n x n`` float32 matmul on this machine: the practical ceiling."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / compare({"matmul": lambda: a @ b}, repeats)["matmul"].median / 1e9


def scaling_benchmark(lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096), n_heads: int = 8,
                      head_dim: int = 64, block_size: int | None = None, repeats: int = 5,
                      min_sample_s: float = 0.1) -> list[dict]:
    """Forward time (no grad) and peak tensor memory against sequence length, batch 1: the
    explicit path, tiled attention (:mod:`selfattn.tiled`) and PyTorch's SDPA, timed side by side
    at each length. ``block_size=None`` uses :func:`~selfattn.tiled.tiled_attention`'s default."""
    tile = {} if block_size is None else {"block_size": block_size}
    variants = {"explicit (selfattn)": lambda q: scaled_dot_product_attention(q, q, q)[0],
                "tiled (selfattn)": lambda q: tiled_attention(q, q, q, **tile),
                "F.scaled_dot_product_attention": lambda q: F.scaled_dot_product_attention(q, q, q)}
    rows = []
    with torch.no_grad():
        for T in lengths:
            q = torch.randn(1, n_heads, T, head_dim, generator=torch.Generator().manual_seed(T))
            calls = {n: (lambda f=f, q=q: f(q)) for n, f in variants.items()}
            times = compare(calls, repeats, warmup=1, min_sample_s=min_sample_s)
            for name, call in calls.items():
                rows.append({"T": T, "variant": name, "ms": 1e3 * times[name].median,
                             "peak_mb": peak_memory(call) / 2**20,
                             "discarded": times[name].discarded})
    return rows


def tiled_targets(rows: list[dict]) -> list[Target]:
    """``make bench``'s targets for tiled attention, at the longest length of
    :func:`scaling_benchmark`'s rows."""
    T = max(r["T"] for r in rows)
    at = {r["variant"]: r for r in rows if r["T"] == T}
    tiled, explicit = at["tiled (selfattn)"], at["explicit (selfattn)"]
    sdpa = at["F.scaled_dot_product_attention"]
    return [Target(f"explicit / tiled peak memory at T={T}",
                   explicit["peak_mb"] / tiled["peak_mb"], ">=", 8.0),
            Target(f"tiled / explicit time at T={T}", tiled["ms"] / explicit["ms"], "<", 1.0),
            Target(f"tiled / F.sdpa time at T={T}", tiled["ms"] / sdpa["ms"], "<=", 2.5)]


# the variants of training_benchmark: each a function of x, and the same call as a statement on
# x, for the fresh process that measures its peak memory
TRAINING_VARIANTS = {
    "explicit (selfattn)": (lambda x: scaled_dot_product_attention(x, x, x)[0],
                            "scaled_dot_product_attention(x, x, x)[0]"),
    "tiled (selfattn)": (lambda x: tiled_attention(x, x, x), "tiled_attention(x, x, x)"),
    "F.scaled_dot_product_attention": (lambda x: F.scaled_dot_product_attention(x, x, x),
                                       "F.scaled_dot_product_attention(x, x, x)"),
}


def training_benchmark(lengths: tuple[int, ...] = (1024, 2048, 4096), n_heads: int = 8,
                       head_dim: int = 64, repeats: int = 3, min_sample_s: float = 0.1,
                       process_lengths: tuple[int, ...] | None = None) -> list[dict]:
    """Forward and backward against sequence length, batch 1: for the explicit path, tiled
    attention and PyTorch's SDPA (:data:`TRAINING_VARIANTS`), the bytes autograd saves for
    backward (:func:`~selfattn.book.measure.saved_tensor_bytes`, each storage once), the peak
    memory of one forward+backward in a fresh process (at ``process_lengths``, every length by
    default; None elsewhere), and its time, the three timed side by side at each length."""
    fresh = lengths if process_lengths is None else process_lengths
    rows = []
    for T in lengths:
        x = torch.randn(1, n_heads, T, head_dim, generator=torch.Generator().manual_seed(T),
                        requires_grad=True)

        def step(f, x=x):
            f(x).sum().backward()
            x.grad = None

        times = compare({name: (lambda f=f: step(f)) for name, (f, _) in TRAINING_VARIANTS.items()},
                        repeats, warmup=1, min_sample_s=min_sample_s)
        for name, (f, call) in TRAINING_VARIANTS.items():
            peak = _fresh_training_peak(call, T, n_heads, head_dim) if T in fresh else None
            rows.append({"T": T, "variant": name,
                         "saved_mb": saved_tensor_bytes(lambda f=f, x=x: f(x)) / 2**20,
                         "process_peak_mb": None if peak is None else peak / 2**20,
                         "fwd_bwd_ms": 1e3 * times[name].median,
                         "discarded": times[name].discarded})
    return rows


def _fresh_training_peak(call: str, T: int, n_heads: int, head_dim: int) -> int | None:
    """Peak bytes of one forward+backward of ``call`` (on ``x``, ``(1, n_heads, T, head_dim)``) in
    a fresh process, after one call on a short input (what a process allocates once is not
    counted); the input itself is not counted, its gradient is."""
    setup = f"""
import torch
import torch.nn.functional as F
from selfattn import scaled_dot_product_attention, tiled_attention
torch.set_num_threads({torch.get_num_threads()})

def step():
    with torch.enable_grad():
        ({call}).sum().backward()

x = torch.randn(1, {n_heads}, 16, {head_dim}, requires_grad=True)
step()
x = torch.randn(1, {n_heads}, {T}, {head_dim}, requires_grad=True)
"""
    return fresh_process_peak_memory("step()", setup)


def training_targets(rows: list[dict], saved_at: int = 2048) -> list[Target]:
    """``make bench``'s targets for training through tiled attention, from
    :func:`training_benchmark`'s rows: the bytes saved for backward at ``saved_at`` against the
    explicit path's, and the forward+backward time at the longest length."""
    T = max(r["T"] for r in rows)
    saved = {r["variant"]: r["saved_mb"] for r in rows if r["T"] == saved_at}
    ms = {r["variant"]: r["fwd_bwd_ms"] for r in rows if r["T"] == T}
    return [Target(f"tiled / explicit bytes saved for backward at T={saved_at}",
                   saved["tiled (selfattn)"] / saved["explicit (selfattn)"], "<=", 1 / 8),
            Target(f"tiled / explicit forward+backward time at T={T}",
                   ms["tiled (selfattn)"] / ms["explicit (selfattn)"], "<", 1.0)]


def fastpath_benchmark(repeats: int = 9, min_sample_s: float = 0.2, seed: int = 0,
                       batch: int = 8, T: int = 512, d_model: int = 512,
                       contexts: tuple[int, int] = (8192, 16384)) -> list[dict]:
    """Each of :mod:`selfattn.fastpaths`' paths, timed with it and without it, side by side, on
    the call it exists for (no grad): a layer's forward with the weights over ``batch x T``
    tokens (in-place softmax), and one decoding step of GQA-4 and of MQA
    after ``contexts`` cached tokens (grouped heads, split cache). Rows give both times and the
    speed-up the path brings."""
    torch.manual_seed(seed)
    layer = MultiHeadAttention(d_model, 8).eval()
    x = torch.randn(batch, T, d_model)
    gqa = MultiHeadAttention(1024, 16, n_kv_heads=4, bias=False).eval()
    mqa = MultiHeadAttention(1024, 16, n_kv_heads=1, bias=False).eval()
    gqa_cache, gqa_x = _decode_inputs(gqa, contexts[0], seed)
    mqa_cache, mqa_x = _decode_inputs(mqa, contexts[1], seed)
    cases = {
        "inplace_softmax": (f"layer forward with weights, {batch} x {T} tokens",
                            lambda: layer(x, need_weights=True)),
        "grouped_heads": (f"GQA-4 decoding after {contexts[0]:,} tokens",
                          lambda: gqa(gqa_x, is_causal=True, kv_cache=gqa_cache)),
        "split_kv": (f"MQA decoding after {contexts[1]:,} tokens",
                     lambda: mqa(mqa_x, is_causal=True, kv_cache=mqa_cache)),
    }
    rows = []
    with torch.no_grad():
        for path, (call, fn) in cases.items():
            def without(fn=fn, path=path):
                with fastpaths.disabled(path):
                    return fn()

            times = compare({"with": fn, "without": without}, repeats, min_sample_s=min_sample_s)
            rows.append({"fast path": path, "measured on": call,
                         "ms with": 1e3 * times["with"].median,
                         "ms without": 1e3 * times["without"].median,
                         "speed-up": times["without"].median / times["with"].median})
    return rows


def fastpath_targets(rows: list[dict]) -> list[Target]:
    """``make bench``'s targets for :mod:`selfattn.fastpaths`: each path kept only while it pays,
    from :func:`fastpath_benchmark`'s rows."""
    return [Target(f"{r['fast path']} speed-up (time without / with)", r["speed-up"], ">=", 1.05)
            for r in rows]


def _print_table(rows: list[dict], columns: list[str], formats: dict[str, str]) -> None:
    print("  ".join(f"{c:>{max(len(c), 10)}s}" if c != "variant" else f"{c:48s}" for c in columns))
    for r in rows:
        cells = []
        for c in columns:
            value = r[c]
            width = max(len(c), 10)
            if c == "variant":
                cells.append(f"{value:48s}")
            elif value is None:  # not measured
                cells.append(f"{'-':>{width}}")
            else:
                cells.append(f"{value:>{width}{formats.get(c, '')}}")
        print("  ".join(cells))


def cpu_model() -> str:
    """This machine's CPU, as Linux names it (``/proc/cpuinfo``), or as Python's platform does."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "an unknown CPU"


def _report_attention(ceiling: float) -> tuple[list[dict], list[Target]]:
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
    targets = attention_targets(rows)
    _print_targets("targets", targets)
    forward = {r["variant"]: r["gflops"] for r in rows if r["mode"] == "forward" and not r["causal"]}
    best = max(g for name, g in forward.items() if name != FLOOR)
    print(f"  (for information, not a target: the best forward variant runs at {best / ceiling:.2f}"
          f" of the matmul ceiling, the floor at {forward[FLOOR] / ceiling:.2f})\n")
    return rows, targets


def _report_fastpaths() -> tuple[list[dict], list[Target]]:
    print("fast paths (selfattn.fastpaths): the same call with the path and without it, no grad")
    rows = fastpath_benchmark()
    for r in rows:
        print(f"  {r['fast path']:16s} {r['measured on']:40s} {r['ms with']:8.2f} ms with, "
              f"{r['ms without']:8.2f} ms without: {r['speed-up']:4.2f}x")
    targets = fastpath_targets(rows)
    _print_targets("fast path targets", targets)
    print()
    return rows, targets


def _report_scaling() -> tuple[list[dict], list[Target]]:
    rows = scaling_benchmark()
    print("against sequence length: the explicit path, tiled attention with an online softmax "
          "(selfattn.tiled) and SDPA (batch 1, 8 heads of 64, no grad)")
    _print_table(rows, ["variant", "T", "ms", "peak_mb", "discarded"], {"ms": ".2f", "peak_mb": ".1f"})
    shortest = max(r["T"] for r in rows) // 4  # fit the longest lengths: 1024 to 4096
    for name in dict.fromkeys(r["variant"] for r in rows):
        long = [r for r in rows if r["variant"] == name and r["T"] >= shortest]
        sizes = [r["T"] for r in long]
        print(f"  {name}: time grows as T^{fit_exponent(sizes, [r['ms'] for r in long]):.2f}, "
              f"memory as T^{fit_exponent(sizes, [r['peak_mb'] for r in long]):.2f} "
              f"(T >= {shortest})")
    targets = tiled_targets(rows)
    _print_targets("tiled attention targets, chapter 9", targets)
    print()
    return rows, targets


def _report_training() -> tuple[list[dict], list[Target]]:
    rows = training_benchmark()
    print("training against sequence length: the explicit path, tiled attention and SDPA, "
          "forward+backward\n(batch 1, 8 heads of 64; saved_mb: what autograd keeps for "
          "backward, each storage once; process_peak_mb: one step in a fresh process)")
    _print_table(rows, ["variant", "T", "saved_mb", "process_peak_mb", "fwd_bwd_ms", "discarded"],
                 {"saved_mb": ".1f", "process_peak_mb": ".1f", "fwd_bwd_ms": ".1f"})
    targets = training_targets(rows)
    _print_targets("tiled attention training targets, chapter 9", targets)
    T = max(r["T"] for r in rows)
    ms = {r["variant"]: r["fwd_bwd_ms"] for r in rows if r["T"] == T}
    print(f"  (for information, not a target: tiled / F.sdpa forward+backward time at T={T} is "
          f"{ms['tiled (selfattn)'] / ms['F.scaled_dot_product_attention']:.2f})\n")
    return rows, targets


def _report_decode() -> tuple[list[dict], list[Target]]:
    d_model, n_heads = 1024, 16
    print(f"decode: one new token, batch 1, d_model={d_model}, {n_heads} query heads of "
          f"{d_model // n_heads}; ms per token, speed-up over MHA")
    # 45 samples per variant and context, three times the chapter's 15: a shared machine's
    # timings of one step spread by 10-20%, and the targets below compare medians
    rows = decode_benchmark([256, 1024, 4096, 8192, 16384], d_model=d_model, n_heads=n_heads,
                            repeats=45, bare=True)
    print(decode_table(rows))
    print("  (bare: the same step as one function, baselines.bare_decode_step: the layer's "
          "kernels without its checks,\n   submodule calls and helpers)")
    targets = decode_targets(rows, d_model, n_heads)
    _print_targets("decode targets, chapter 7", targets)
    *_, shorter, longest = sorted({r["context"] for r in rows})
    ms = {(r["context"], r["variant"]): r["ms_per_token"] for r in rows}
    at, before = {v: ms[(longest, v)] for _, v in ms}, {v: ms[(shorter, v)] for _, v in ms}
    read = {kv: decode_bytes(d_model, n_heads, kv, longest)["total"] for kv in (n_heads, 1)}
    print(f"  (for information, not a target: at {longest} an MHA step reads "
          f"{read[n_heads] / read[1]:.1f}x the bytes of an MQA step,\n   the speed-up if both were "
          "bound by memory alone; both do the same attention FLOPs)")
    mqa = at["MHA"] / at["MQA"]
    print(f"  (for information, not a target: the MQA speed-up, {mqa:.3f}, is "
          f"{'at or above' if mqa >= 4.0 else 'below'} 4.0x, the former goal)")
    print(f"  (for information, not a target: at {shorter} the naive copies slow GQA-4 down "
          f"{before['GQA-4 naive'] / before['GQA-4']:.2f}x and MQA "
          f"{before['MQA naive'] / before['MQA']:.2f}x;\n   a copy's own cost swings too much "
          "from run to run at this context to judge)")
    print(f"  (for information, not a target: at {longest} the same steps without the layer's "
          f"Python take MHA {at['MHA bare']:.2f} ms\n   and MQA {at['MQA bare']:.2f} ms, "
          f"a {at['MHA bare'] / at['MQA bare']:.2f}x speed-up)")
    return rows, targets


def main(out_dir: str = "_build/bench") -> None:
    """``make bench``: every table of chapters 7 and 9 at full size with the library's speed
    targets, a CSV of each benchmark and a PNG."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__} on {cpu_model()}, {torch.get_num_threads()} threads, "
          "float32; medians of interleaved samples, contended samples discarded\n")
    ceiling = matmul_gflops()
    print(f"ceiling: a 2048 x 2048 matmul runs at {ceiling:.0f} GFLOP/s\n")
    tables, targets = {}, []
    for name, report in [("attention", lambda: _report_attention(ceiling)),
                         ("fastpaths", _report_fastpaths), ("scaling", _report_scaling),
                         ("training", _report_training), ("decode", _report_decode)]:
        tables[name], found = report()
        targets += found
        with open(out / f"{name}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(tables[name][0]))
            writer.writeheader()
            writer.writerows(tables[name])
    _plot(tables["attention"], tables["scaling"], ceiling, out / "bench.png")
    print(f"\nwrote {out}/attention.csv, fastpaths.csv, scaling.csv, training.csv, decode.csv and "
          "bench.png")
    missed = [t.label for t in targets if not t.met]
    print(f"{len(targets) - len(missed)} of {len(targets)} targets met"
          + (f"; MISSED: {'; '.join(missed)}" if missed else ""))


def _plot(rows: list[dict], scaling: list[dict], ceiling: float, path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.5), layout="constrained")
    left, middle, right = fig.subplots(1, 3, width_ratios=[1.2, 1, 1])
    forward = [r for r in rows if r["mode"] == "forward" and not r["causal"]]
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


# chapter 9, §7: on a GPU

def _kernels_that_ran(fn) -> list[str]:
    """The compute kernels one call of ``fn`` launched: CUDA kernel names on a GPU (from
    ``torch.profiler``), the attention operations PyTorch dispatched to on a CPU."""
    from torch.profiler import ProfilerActivity, profile

    from .measure import profiled_ops

    if not torch.cuda.is_available():
        return [name for name in profiled_ops(fn) if "attention" in name or "softmax" in name]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return list(dict.fromkeys(n for n in names if not n.startswith(("Memcpy", "Memset"))))


def _peak_bytes(fn, device: torch.device) -> int:
    if device.type != "cuda":
        return peak_memory(fn)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def gpu_kernels(device: torch.device | str, lengths: tuple[int, ...] = (1024, 2048, 4096),
                dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.float32),
                n_heads: int = 16, head_dim: int = 64, repeats: int = 10,
                warmup: int = 3) -> list[dict]:
    """Causal attention, batch 1, on ``device``: SDPA with each of its backends forced, SDPA as
    it chooses, the Triton kernel (:mod:`selfattn.triton_attention`, where triton imports) and
    the tiled loop, at each length and dtype. Each row: ``variant``, ``dtype``, ``T``, ``ms``
    (median, synchronized), ``tflops`` (useful: the causal half of the products), ``peak_mib``
    (allocated during one call, beyond its inputs), ``kernel`` (what ran), or ``error`` (a
    backend this device or dtype does not have, or out of memory). Chapter 9 runs it on a GPU;
    tests run it on a CPU at toy sizes, so the code cannot rot."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .measure import median_time

    device = torch.device(device)
    try:
        from .. import triton_attention
    except ImportError:  # no triton on this platform
        triton_attention = None
    backends = [b for b in ("MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION")
                if hasattr(SDPBackend, b)]
    rows = []
    for dtype in dtypes:
        for T in lengths:
            g = torch.Generator(device=device).manual_seed(T)
            q = torch.randn(1, n_heads, T, head_dim, generator=g, device=device, dtype=dtype)
            variants = _gpu_variants(q, [getattr(SDPBackend, b) for b in backends],
                                     sdpa_kernel, triton_attention)
            flops = attention_flops(T, T, head_dim, n_heads, 1) * (T + 1) / (2 * T)
            for name, fn in variants.items():
                row: dict = {"variant": name, "dtype": str(dtype).removeprefix("torch."), "T": T}
                try:
                    with torch.no_grad():
                        seconds = median_time(fn, repeats=repeats, warmup=warmup)
                        row |= {"ms": 1e3 * seconds, "tflops": flops / seconds / 1e12,
                                "peak_mib": _peak_bytes(fn, device) / 2**20,
                                "kernel": ", ".join(_kernels_that_ran(fn))[:90]}
                except Exception as exc:  # no such backend here, out of memory, a kernel
                    # that does not fit this GPU (Triton's OutOfResources): a row that says so
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    row["error"] = str(exc).strip().splitlines()[0][:90]
                rows.append(row)
    return rows


def _gpu_variants(q: Tensor, backends: list, sdpa_kernel, triton_attention) -> dict:
    """:func:`gpu_kernels`' calls on ``q``: causal self-attention, each its own way."""
    def forced(backend) -> Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, q, q, is_causal=True)

    variants = {f"SDPA, {b.name.lower()}": (lambda b=b: forced(b)) for b in backends}
    variants["SDPA, its own choice"] = lambda: F.scaled_dot_product_attention(
        q, q, q, is_causal=True)
    if triton_attention is not None:
        variants["triton (selfattn)"] = lambda: triton_attention.triton_attention(
            q, q, q, is_causal=True)
    variants["tiled (selfattn)"] = lambda: tiled_attention(q, q, q, is_causal=True)
    return variants


def sdpa_fallbacks(device: torch.device | str, T: int = 1024, n_heads: int = 16,
                   head_dim: int = 64) -> list[dict]:
    """Which kernel SDPA picks as the call changes, on ``device``: float16 and causal (what the
    fast kernels want), then one change at a time, each a known silent fallback on CUDA: a mask
    tensor instead of ``is_causal``, float32, grouped key/value heads (``enable_gqa``). Each
    row: ``call`` and ``kernel`` (the names that ran)."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(0)
    half = torch.float16 if device.type == "cuda" else torch.float32

    def x(heads: int = n_heads, dtype: torch.dtype = half) -> Tensor:
        return torch.randn(1, heads, T, head_dim, generator=g, device=device, dtype=dtype)

    q, q32, kv = x(), x(dtype=torch.float32), x(heads=n_heads // 4)
    mask = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    calls = {
        f"{str(half).removeprefix('torch.')}, is_causal=True":
            lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
        "the same causal mask as a tensor":
            lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=mask),
        **({} if half == torch.float32 else {"float32, is_causal=True":  # a CPU: float32 above
            lambda: F.scaled_dot_product_attention(q32, q32, q32, is_causal=True)}),
        f"{n_heads // 4} key/value heads, enable_gqa=True":
            lambda: F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True),
    }
    with torch.no_grad():
        return [{"call": name, "kernel": ", ".join(_kernels_that_ran(fn))[:90]}
                for name, fn in calls.items()]


# --- chapter 11: decoding in practice --------------------------------------------------------

from ..cache import Cache  # noqa: E402
from .models import DecoderBlock, TinyDecoder  # noqa: E402


@dataclasses.dataclass(frozen=True)
class CacheRace:
    """What :func:`cache_vs_recompute` measured: greedy decoding of ``n_new`` tokens after a
    prompt of ``prompt_len``, by recomputing the whole prefix at every step and with KV caches.

    Step ``i`` computes new token ``i`` from the ``context[i] = prompt_len + i`` tokens known
    so far. Step 0 is the same pass over the prompt both ways (with caches, the prefill); from
    step 1 on, the recompute pass runs ``context[i]`` tokens through the model and the cached one
    a single token. Per step: the median wall time over the repeats (``*_ms``), the tokens run
    through the model (``*_tokens_run``), the (query, key) pairs each head of each layer scores
    (``*_pairs``) and the FLOPs (``*_flops``: twice the multiply-adds of the matrix products; the
    norms, softmax and GELU are not counted). ``recompute_generated`` and ``cached_generated``
    are the generated token ids, ``(B, n_new)``: the same, or caching changed the model's output.
    """

    prompt_len: int
    context: list[int]
    recompute_ms: list[float]
    cached_ms: list[float]
    recompute_generated: Tensor
    cached_generated: Tensor
    recompute_tokens_run: list[int]
    cached_tokens_run: list[int]
    recompute_pairs: list[int]
    cached_pairs: list[int]
    recompute_flops: list[int]
    cached_flops: list[int]
    repeats: int

    @property
    def same_tokens(self) -> bool:
        """Whether both ways generated the same tokens."""
        return torch.equal(self.recompute_generated, self.cached_generated)

    def growth(self, way: str) -> float:
        """How much slower a step of ``way`` (``"recompute"`` or ``"cached"``) is at the end than
        at the start: the median ms of the last quarter of steps over that of the first quarter
        (step 0, the prompt pass, left out)."""
        ms = self._ms(way)[1:]
        quarter = max(1, len(ms) // 4)
        return statistics.median(ms[-quarter:]) / statistics.median(ms[:quarter])

    def slope(self, way: str) -> float:
        """Milliseconds that one more token of context adds to a step of ``way``: the
        least-squares slope of ms against context (step 0 left out)."""
        x, y = self.context[1:], self._ms(way)[1:]
        mx, my = statistics.fmean(x), statistics.fmean(y)
        return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sum((a - mx) ** 2 for a in x)

    def totals(self) -> dict[str, dict[str, float]]:
        """Each way's sums over every step: ``ms``, ``tokens_run``, ``pairs``, ``flops``."""
        return {way: {"ms": sum(self._ms(way)),
                      "tokens_run": sum(getattr(self, f"{way}_tokens_run")),
                      "pairs": sum(getattr(self, f"{way}_pairs")),
                      "flops": sum(getattr(self, f"{way}_flops"))}
                for way in ("recompute", "cached")}

    def _ms(self, way: str) -> list[float]:
        if way not in ("recompute", "cached"):
            raise ValueError(f"way must be 'recompute' or 'cached', got {way!r}")
        return self.recompute_ms if way == "recompute" else self.cached_ms


def _decoder_flops(model: TinyDecoder, new: int, keys: int, batch: int) -> int:
    """FLOPs of one pass of ``new`` tokens per sequence through ``model``, the ``j``-th new
    token attending to ``keys - new + j + 1`` keys: every linear layer's weights once per token,
    and ``q.k`` and ``weights.v`` for each (query, key) pair of each head (2 FLOPs a product)."""
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    pairs = new * keys - new * (new - 1) // 2  # causal pairs of the new queries
    attn = model.blocks[0].attn.config
    return batch * (2 * linear * new + len(model.blocks) * 4 * attn.n_heads * attn.head_dim * pairs)


def cache_vs_recompute(model: TinyDecoder, prompt: Tensor, n_new: int, repeats: int = 3,
                       make_cache: type[Cache] | None = None, **cache_kwargs: object) -> CacheRace:
    """Greedy decoding of ``n_new`` tokens after ``prompt`` (B, P), two ways, timed step by step
    side by side:

    * recompute: every step runs the whole sequence so far through ``model`` and keeps the last
      position's logits (no cache: step ``i`` costs ``O(P + i)`` tokens, ``O((P + i)^2)``
      attention pairs, so the whole decode grows as ``n^2`` tokens);
    * cached: the prompt goes through once, filling one KV cache per block
      (:meth:`~selfattn.book.models.TinyDecoder.new_caches`, ``make_cache(**cache_kwargs)``,
      default :class:`~selfattn.cache.KVCache`), then each step runs only the newest token,
      whose query attends to the cached keys (``O(1)`` tokens and ``O(P + i)`` pairs a step).

    In each of ``repeats`` rounds both decode in lockstep, one step of each in turn (which goes
    first alternates), so a slow moment of a shared machine hits both; each step's time is the
    median over the rounds. The model runs in eval mode without autograd. Chapter 11 uses
    ``TinyDecoder(256, d_model=128, n_heads=4, n_layers=2)``, a prompt of 16 and ``n_new=200``
    (a few seconds on one thread).
    """
    if not isinstance(model, TinyDecoder):
        raise TypeError(f"model must be a TinyDecoder, got {type(model).__name__}")
    if not isinstance(prompt, Tensor) or prompt.dim() != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt must be (batch, seq) token ids, at least one token; got "
                         f"{tuple(prompt.shape) if isinstance(prompt, Tensor) else type(prompt).__name__}")
    if isinstance(n_new, bool) or not isinstance(n_new, int) or n_new < 2:
        raise ValueError(f"n_new must be an int >= 2 (the prompt pass, then steps), got {n_new!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive int, got {repeats!r}")
    B, P = prompt.shape
    was_training = model.training
    model.eval()

    def recompute(state: dict) -> Tensor:
        logits = model(state["seq"])  # (B, n, vocab): every position, again
        nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        state["seq"] = torch.cat([state["seq"], nxt], dim=1)  # (B, n + 1)
        return nxt

    def cached(state: dict) -> Tensor:
        logits = model(state["new"], state["caches"])  # (B, 1 or P, vocab): only the new tokens
        nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        state["new"] = nxt  # the next step runs only this token
        return nxt

    samples: dict[str, list[list[float]]] = {"recompute": [], "cached": []}
    generated: dict[str, Tensor] = {}
    with torch.no_grad():
        for r in range(repeats + 1):  # round 0 warms up, untimed
            states = {"recompute": {"seq": prompt},
                      "cached": {"new": prompt,
                                 "caches": model.new_caches(make_cache, **cache_kwargs)}}
            steps = {"recompute": recompute, "cached": cached}
            order = ["recompute", "cached"] if r % 2 else ["cached", "recompute"]
            times: dict[str, list[float]] = {way: [] for way in order}
            tokens: dict[str, list[Tensor]] = {way: [] for way in order}
            for way in order:
                for _ in range(n_new if r else min(n_new, 16)):
                    start = time.perf_counter()
                    tokens[way].append(steps[way](states[way]))
                    times[way].append(time.perf_counter() - start)
            if r:
                for way in order:
                    samples[way].append(times[way])
                    generated[way] = torch.cat(tokens[way], dim=1)  # (B, n_new)
    model.train(was_training)
    context = [P + i for i in range(n_new)]
    pairs = [n * (n + 1) // 2 for n in context]  # causal pairs of a whole sequence of n tokens
    return CacheRace(
        prompt_len=P, context=context,
        recompute_ms=[1e3 * statistics.median(s) for s in zip(*samples["recompute"], strict=True)],
        cached_ms=[1e3 * statistics.median(s) for s in zip(*samples["cached"], strict=True)],
        recompute_generated=generated["recompute"], cached_generated=generated["cached"],
        recompute_tokens_run=context, cached_tokens_run=[P, *[1] * (n_new - 1)],
        recompute_pairs=pairs, cached_pairs=[pairs[0], *context[1:]],
        recompute_flops=[_decoder_flops(model, n, n, B) for n in context],
        cached_flops=[_decoder_flops(model, P, P, B)] + [_decoder_flops(model, 1, n, B)
                                                          for n in context[1:]],
        repeats=repeats)


def block_step_benchmark(contexts: tuple[int, ...] = (1024, 8192), batches: tuple[int, ...] = (1, 8),
                         d_model: int = 512, n_heads: int = 8, kv_heads: tuple[int, ...] = (8, 2, 1),
                         ffn_hidden: int | None = None, repeats: int = 9, warmup: int = 2,
                         seed: int = 0) -> list[dict]:
    """One decoding step of one :class:`~selfattn.book.models.DecoderBlock` (attention with RoPE,
    then the feed-forward layer, ``ffn_hidden`` wide, default ``4 * d_model``), one new token for
    each of ``batch`` sequences whose KV caches hold ``context`` tokens, for MHA, GQA and MQA
    (``kv_heads``), beside the bytes the step must read
    (:func:`~selfattn.book.measure.decode_bytes`: the weights once, every sequence's cache).

    :func:`decode_benchmark` times the attention layer alone at batch 1; this adds the
    feed-forward weights every step reads too, and the batch, whose caches grow with it while the
    weights are read once. Variants are interleaved in a rotated order in each repeat; the first
    ``warmup`` repeats are dropped. Each row: ``context``, ``batch``, ``variant``, ``n_kv_heads``,
    ``ms`` (median per step), ``mb`` (bytes read, MiB), ``gb_per_s`` (bytes / time),
    ``bytes_vs_mha`` (MHA's bytes over this variant's: the speed-up if the step were bound by
    memory alone) and ``speedup_vs_mha`` (measured). The caches hold random keys and values
    (their numbers do not change the time).
    """
    ffn = 4 * d_model if ffn_hidden is None else ffn_hidden
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        blocks = {kv: DecoderBlock(d_model, n_heads, kv, ffn).eval() for kv in kv_heads}
    names = {kv: "MHA" if kv == n_heads else "MQA" if kv == 1 else f"GQA-{kv}" for kv in kv_heads}
    hd = d_model // n_heads
    rows = []
    g = torch.Generator().manual_seed(seed)
    for context in contexts:
        for batch in batches:
            states = {}
            for kv in kv_heads:
                cache = KVCache(capacity=context + warmup + repeats + 1)
                k = torch.randn(batch, kv, context, hd, generator=g)  # (B, H_kv, context, hd)
                cache.append(k, torch.randn(batch, kv, context, hd, generator=g))
                states[kv] = (cache, torch.randn(batch, 1, d_model, generator=g))  # (B, 1, d)
            samples: dict[int, list[float]] = {kv: [] for kv in kv_heads}
            order = list(kv_heads)
            with torch.no_grad():
                for r in range(warmup + repeats):
                    for kv in order[r % len(order):] + order[: r % len(order)]:
                        cache, x = states[kv]
                        synchronize()
                        start = time.perf_counter()
                        blocks[kv](x, cache)
                        synchronize()
                        if r >= warmup:
                            samples[kv].append(time.perf_counter() - start)
            read = {kv: decode_bytes(d_model, n_heads, kv, context, hd, 4, ffn, batch)["total"]
                    for kv in kv_heads}
            ms = {kv: 1e3 * statistics.median(samples[kv]) for kv in kv_heads}
            base = kv_heads[0]
            for kv in kv_heads:
                rows.append({"context": context, "batch": batch, "variant": names[kv],
                             "n_kv_heads": kv, "ms": ms[kv], "mb": read[kv] / 2**20,
                             "gb_per_s": read[kv] / (ms[kv] / 1e3) / 1e9,
                             "bytes_vs_mha": read[base] / read[kv],
                             "speedup_vs_mha": ms[base] / ms[kv]})
    return rows


def block_step_table(rows: list[dict]) -> str:
    """:func:`block_step_benchmark`'s rows as text: per context and batch, each variant's ms per
    step, the MiB it reads, the speed-up over the first variant (MHA) beside the bytes bound."""
    lines = [f"{'context':>7s} {'batch':>5s} {'variant':>8s} {'ms':>8s} {'MiB read':>9s} "
             f"{'GB/s':>6s} {'speed-up':>9s} {'bytes bound':>12s}"]
    for r in rows:
        lines.append(f"{r['context']:7d} {r['batch']:5d} {r['variant']:>8s} {r['ms']:8.2f} "
                     f"{r['mb']:9.1f} {r['gb_per_s']:6.1f} {r['speedup_vs_mha']:8.2f}x "
                     f"{r['bytes_vs_mha']:11.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":  # `make bench`
    main()
