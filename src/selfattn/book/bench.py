r"""``make bench``: every benchmark of chapters 7 and 9, measured side by side in one run.

The measuring tools are in :mod:`selfattn.book.measure`, the article-style baselines in
:mod:`selfattn.book.baselines`. Each benchmark returns rows (dicts) that the chapters print and plot;
:func:`main` prints them all at full size with the library's targets checked as ratios of times
measured in the same run, and writes CSV files and a PNG.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import fastpaths
from ..attention import scaled_dot_product_attention
from ..multihead import KVCache, MultiHeadAttention
from ..tiled import tiled_attention
from .baselines import EinopsSelfAttention, bare_decode_step, einsum_attention, matmul_attention
from .measure import attention_flops, compare, decode_bytes, fit_exponent, mha_flops, peak_memory, synchronize


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
) -> list[dict]:
    """Time one decoding step (one new token, batch 1) for MHA, GQA and MQA at each context.

    Every variant holds a KV cache of ``context`` tokens; ``naive`` adds the GQA/MQA variants that
    copy their cache for every query head (:func:`~selfattn.heads.repeat_kv`, with
    ``fastpaths.disabled("grouped_heads")``); ``bare`` adds MHA and MQA computed by
    :func:`~selfattn.book.baselines.bare_decode_step`, the layer's kernels without its Python.
    Variants are interleaved in a rotated order in each repeat, so a slow moment of a shared
    machine hits all of them; the first ``warmup`` repeats are dropped; each row gives the
    median time per token in ms. Each sample is one call, not
    :func:`~selfattn.book.measure.compare`'s loop of calls: every call appends a token to the cache.
    """
    torch.manual_seed(seed)
    models = {kv: MultiHeadAttention(d_model, n_heads, n_kv_heads=kv, bias=False).eval()
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

    rows = []
    for context in contexts:
        states = {name: _decode_inputs(models[kv], context, seed) for name, kv, _ in variants}
        samples: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        with torch.no_grad():
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
                         "naive": how == "naive", "bare": how == "bare",
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


FLOOR = "floor: 4 projections + F.sdpa"  # the layer row of attention_benchmark that is a bound


def attention_benchmark(batch: int = 8, T: int = 512, d_model: int = 512, n_heads: int = 8,
                        repeats: int = 9, min_sample_s: float = 0.2, seed: int = 0) -> list[dict]:
    """Forward, forward+backward and causal inference times of every variant, side by side.

    Rows: ``variant``, ``level`` (``core``: attention given q, k, v; ``layer``: projections
    too), ``mode``, ``ms``, ``gflops`` (FLOPs / time; the causal inference rows count only the
    products the mask keeps, $T(T+1)/2$ of the $T^2$ scores, whatever a variant computes),
    ``discarded`` (contended samples), ``vs_sdpa`` (time / F.sdpa's time in the same mode) and
    ``vs_reference`` (core rows vs F.sdpa, layer rows vs
    ``nn.MultiheadAttention(need_weights=False)``).

    The layer row ``FLOOR`` runs only the kernels no layer can avoid: its four projections and
    ``F.scaled_dot_product_attention``, each on inputs of the layer's shapes. A layer's time over
    the floor's is what its own code adds (splitting heads, copies, checks).
    """
    torch.manual_seed(seed)
    hd = d_model // n_heads
    q, k, v = (torch.randn(batch, n_heads, T, hd, requires_grad=True) for _ in range(3))
    x = torch.randn(batch, T, d_model, requires_grad=True)
    ours = MultiHeadAttention(d_model, n_heads)
    theirs = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
    einops_layer = EinopsSelfAttention(d_model, n_heads)
    projections = [ours.q_proj, ours.k_proj, ours.v_proj, ours.out_proj]

    def floor(**sdpa) -> list[Tensor]:  # the four projections and the attention, nothing else
        return [p(x) for p in projections] + [F.scaled_dot_product_attention(q, k, v, **sdpa)]

    core = {
        "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v),
        "selfattn.scaled_dot_product_attention": lambda: scaled_dot_product_attention(q, k, v)[0],
        "einsum attention": lambda: einsum_attention(q, k, v),
        "plain matmul attention": lambda: matmul_attention(q, k, v),
    }
    layer = {
        "MultiHeadAttention, fast path": lambda: ours(x)[0],
        "MultiHeadAttention, weights": lambda: ours(x, need_weights=True)[0],
        "einops + einsum layer": lambda: einops_layer(x, x, x),
        "nn.MultiheadAttention(need_weights=False)": lambda: theirs(x, x, x, need_weights=False)[0],
        "nn.MultiheadAttention(need_weights=True)":
            lambda: theirs(x, x, x, need_weights=True, average_attn_weights=False)[0],
        FLOOR: floor,
    }
    level = {**dict.fromkeys(core, "core"), **dict.fromkeys(layer, "layer")}
    fns = {**core, **layer}

    def backward(fn):
        if fn is floor:  # several outputs: a gradient of ones for each, as .sum() would give
            return lambda: torch.autograd.backward(
                outs := fn(), [torch.ones(()).expand_as(o) for o in outs])
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
        FLOOR: lambda: floor(is_causal=True),
    }
    kept = (T + 1) / (2 * T)  # the share of the scores a causal mask keeps
    attention = attention_flops(T, T, hd, n_heads, batch)
    useful = {"core": attention * kept, "layer": flops["layer"] - attention * (1 - kept)}
    with torch.no_grad():
        for name, t in compare(inference, repeats, min_sample_s=min_sample_s).items():
            kind = "core" if name.startswith("F.") else "layer"
            rows.append({"variant": name, "level": kind, "mode": "inference, causal",
                         "ms": 1e3 * t.median, "gflops": useful[kind] / t.median / 1e9,
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


def tiled_targets(rows: list[dict]) -> list[tuple[str, float, str, float, bool]]:
    """``make bench``'s targets for tiled attention, at the longest length of
    :func:`scaling_benchmark`'s rows: (label, ratio, comparison, goal, met)."""
    T = max(r["T"] for r in rows)
    at = {r["variant"]: r for r in rows if r["T"] == T}
    tiled, explicit = at["tiled (selfattn)"], at["explicit (selfattn)"]
    sdpa = at["F.scaled_dot_product_attention"]
    memory = explicit["peak_mb"] / tiled["peak_mb"]
    return [(f"explicit / tiled peak memory at T={T}", memory, ">=", 8.0, memory >= 8.0),
            (f"tiled / explicit time at T={T}", tiled["ms"] / explicit["ms"], "<", 1.0,
             tiled["ms"] < explicit["ms"]),
            (f"tiled / F.sdpa time at T={T}", tiled["ms"] / sdpa["ms"], "<=", 2.5,
             tiled["ms"] <= 2.5 * sdpa["ms"])]


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
        print(f"  {label:52s} {ratio:6.3f}  target <= {goal:.2f}  {'met' if ratio <= goal else 'MISSED'}")
    for mode, short in [("forward", "forward"), ("forward+backward", "fwd+bwd")]:
        ratio = ms[(mode, FLOOR)] / ms[(mode, fast)]
        print(f"  {'floor / fast path, ' + short:52s} {ratio:6.3f}  target >= 0.85  "
              f"{'met' if ratio >= 0.85 else 'MISSED'}")
    forward = {r["variant"]: r["gflops"] for r in rows if r["mode"] == "forward"}
    best = max(g for name, g in forward.items() if name != FLOOR)
    print(f"  (for information, not a target: the best forward variant runs at {best / ceiling:.2f}"
          f" of the matmul ceiling, the floor at {forward[FLOOR] / ceiling:.2f})\n")

    print("fast paths (selfattn.fastpaths): the same call with the path and without it, no grad")
    fast = fastpath_benchmark()
    for r in fast:
        print(f"  {r['fast path']:16s} {r['measured on']:40s} {r['ms with']:8.2f} ms with, "
              f"{r['ms without']:8.2f} ms without: {r['speed-up']:4.2f}x  target >= 1.05  "
              f"{'met' if r['speed-up'] >= 1.05 else 'MISSED'}")
    print()

    scaling = scaling_benchmark()
    print("against sequence length: the explicit path, tiled attention with an online softmax "
          "(selfattn.tiled) and SDPA (batch 1, 8 heads of 64, no grad)")
    _print_table(scaling, ["variant", "T", "ms", "peak_mb", "discarded"],
                 {"ms": ".2f", "peak_mb": ".1f"})
    for name in dict.fromkeys(r["variant"] for r in scaling):
        long = [r for r in scaling if r["variant"] == name and r["T"] >= 1024]
        sizes = [r["T"] for r in long]
        print(f"  {name}: time grows as T^{fit_exponent(sizes, [r['ms'] for r in long]):.2f}, "
              f"memory as T^{fit_exponent(sizes, [r['peak_mb'] for r in long]):.2f} (T >= 1024)")
    print("tiled attention targets (chapter 9; ratios measured side by side in this run)")
    for label, ratio, op, goal, met in tiled_targets(scaling):
        print(f"  {label:52s} {ratio:6.3f}  target {op:2s} {goal:.2f}  {'met' if met else 'MISSED'}")
    print()
    print("decode: one new token, batch 1, d_model=1024, 16 query heads of 64; ms per token, "
          "speed-up over MHA")
    # 45 samples per variant and context, three times the chapter's 15: a shared machine's
    # timings of one step spread by 10-20%, and the targets below compare medians
    decode = decode_benchmark([256, 1024, 4096, 8192, 16384], repeats=45, bare=True)
    print(decode_table(decode))
    print("  (bare: the same step as one function, baselines.bare_decode_step: the layer's "
          "kernels without its checks,\n   submodule calls and helpers)")
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
        print(f"  {label:52s} {ratio:6.3f}  target >= {goal:.2f}  {'met' if ratio >= goal else 'MISSED'}")
    read = {kv: decode_bytes(1024, 16, kv, 16384)["total"] for kv in (16, 1)}
    print(f"  (for information, not a target: at 16384 an MHA step reads {read[16] / read[1]:.1f}x the "
          "bytes of an MQA step,\n   the speed-up if both were bound by memory alone; both do the "
          "same attention FLOPs)")
    print(f"  (for information, not a target: at 16384 the same steps without the layer's Python "
          f"take MHA {step[(16384, 'MHA bare')]:.2f} ms\n   and MQA {step[(16384, 'MQA bare')]:.2f} ms, "
          f"a {step[(16384, 'MHA bare')] / step[(16384, 'MQA bare')]:.2f}x speed-up)")

    for name, table in [("attention", rows), ("fastpaths", fast), ("scaling", scaling),
                        ("decode", decode)]:
        with open(out / f"{name}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)
    _plot(rows, scaling, ceiling, out / "bench.png")
    print(f"\nwrote {out}/attention.csv, fastpaths.csv, scaling.csv, decode.csv and bench.png")


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
