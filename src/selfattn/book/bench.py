"""``make bench``: every benchmark of chapters 7 and 9, measured side by side in one run, and the
library's costs at full size.

The benchmarks are the topics' (:mod:`.performance` for chapter 9, :mod:`.multi_head` for
chapter 7), the measuring tools :mod:`.kit.measure`'s; :func:`prefill_benchmark` and
:func:`cache_step_benchmark` are this module's own: what tests/test_costs.py asserts at small
sizes (no quadratic mask for a causal GQA/MQA prefill, no copy of a window per decoding step),
timed and measured at the sizes the book talks about. Each benchmark returns rows (dicts) that
the chapters print and plot; each ``*_targets`` function turns a benchmark's rows into the
library's speed targets (:class:`Target`: a ratio of two times measured in the same run, and its
goal). :func:`main` runs
every benchmark at full size, prints its tables and targets, and writes CSV files and a PNG.
"""

from __future__ import annotations

import csv
import dataclasses
import operator
import pathlib

import torch

from .. import fastpaths
from ..cache import BlockPool, KVCache, PagedKVCache, SinkCache, SlidingWindowCache
from ..multihead import MultiHeadAttention
from .kit.measure import compare, decode_bytes, fit_exponent, peak_memory
from .multi_head import decode_benchmark, decode_table
from .performance import (
    CAUSAL,
    FAST,
    FLOOR,
    TORCH,
    TORCH_DEFAULT,
    TORCH_WEIGHTS,
    WEIGHTS,
    attention_benchmark,
    cpu_model,
    fastpath_benchmark,
    matmul_gflops,
    scaling_benchmark,
    training_benchmark,
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


def fastpath_targets(rows: list[dict]) -> list[Target]:
    """``make bench``'s targets for :mod:`selfattn.fastpaths`: each path kept only while it pays,
    from :func:`fastpath_benchmark`'s rows."""
    return [Target(f"{r['fast path']} speed-up (time without / with)", r["speed-up"], ">=", 1.05)
            for r in rows]


def prefill_benchmark(L: int = 4096, d_model: int = 512, n_heads: int = 8,
                      kv_heads: tuple[int, ...] = (2, 1), repeats: int = 7,
                      min_sample_s: float = 0.2, seed: int = 0) -> list[dict]:
    """A causal prefill of one sequence of ``L`` tokens through a GQA and an MQA layer, no grad:
    the default call against the same call with every fast path off
    (``fastpaths.disabled(*fastpaths.ENABLED)``, the readable copy of the key/value heads), timed
    side by side; the peak bytes of tensors each holds (:func:`~.kit.measure.peak_memory`); and
    ``qkvo_mib``, the bytes of the layer's q, k, v and attention output, what the call cannot do
    without."""
    torch.manual_seed(seed)
    head_dim = d_model // n_heads
    x = torch.randn(1, L, d_model)
    rows = []
    with torch.no_grad():
        for kv in kv_heads:
            layer = MultiHeadAttention(d_model, n_heads, n_kv_heads=kv).eval()

            def default(layer=layer):
                return layer(x, is_causal=True)

            def off(layer=layer):
                with fastpaths.disabled(*fastpaths.ENABLED):
                    return layer(x, is_causal=True)

            times = compare({"default": default, "off": off}, repeats, min_sample_s=min_sample_s)
            qkvo = L * head_dim * (2 * n_heads + 2 * kv) * 4
            rows.append({"variant": "MQA" if kv == 1 else f"GQA-{kv}", "L": L, "n_kv_heads": kv,
                         "ms": 1e3 * times["default"].median, "ms_off": 1e3 * times["off"].median,
                         "peak_mib": peak_memory(default) / 2**20,
                         "peak_mib_off": peak_memory(off) / 2**20, "qkvo_mib": qkvo / 2**20})
    return rows


def prefill_targets(rows: list[dict]) -> list[Target]:
    """The issue's targets for a causal MQA prefill: peak bytes with the default paths at most
    1.5x every fast path off, and at most 3x the bytes of q, k, v and the output; time at most
    1.1x."""
    mqa = next(r for r in rows if r["n_kv_heads"] == 1)
    L = mqa["L"]
    return [Target(f"MQA causal prefill at L={L}: peak bytes / every fast path off",
                   mqa["peak_mib"] / mqa["peak_mib_off"], "<=", 1.5),
            Target(f"MQA causal prefill at L={L}: peak bytes / q, k, v and output",
                   mqa["peak_mib"] / mqa["qkvo_mib"], "<=", 3.0),
            Target(f"MQA causal prefill at L={L}: time / every fast path off",
                   mqa["ms"] / mqa["ms_off"], "<=", 1.1)]


def cache_step_benchmark(window: int = 4096, d_model: int = 1024, n_heads: int = 16,
                         n_sink: int = 4, repeats: int = 9, min_sample_s: float = 0.2,
                         seed: int = 0) -> list[dict]:
    """One decoding step (one new token, batch 1, no grad) of chapter 7's layer with each cache
    holding ``window`` tokens (the sink cache ``n_sink`` more), timed side by side: ``KVCache``,
    ``PagedKVCache`` (blocks of 16), ``SlidingWindowCache(window)``, ``SinkCache(n_sink,
    window)``. Each call decodes the token after the same ``window`` tokens: the contiguous and
    paged caches are cut back to that length before each step (``length`` reset; the paged one
    its last block released), the rolling ones stay full. Rows: ``ms`` (median), ``step_kib``
    (the peak bytes of tensors one step allocates), ``held_mib`` (what the cache holds) and
    ``token_kib`` (one token's keys, values and output)."""
    torch.manual_seed(seed)
    layer = MultiHeadAttention(d_model, n_heads).eval()
    hd = d_model // n_heads
    prompt = torch.randn(1, window + n_sink, d_model)
    token = torch.randn(1, 1, d_model)
    caches = {"KVCache": KVCache(capacity=window + n_sink + 1),
              "PagedKVCache": PagedKVCache(BlockPool(-(-(window + n_sink) // 16) + 1, 16,
                                                     n_heads, hd)),
              f"SlidingWindowCache({window})": SlidingWindowCache(window),
              f"SinkCache({n_sink}, {window})": SinkCache(n_sink, window)}
    with torch.no_grad():
        for name, cache in caches.items():
            layer(prompt if name.startswith("Sink") else prompt[:, :window], is_causal=True,
                  kv_cache=cache)

    def step(cache):
        def run():
            if isinstance(cache, KVCache):
                cache.length = window  # the same length at every step
            elif isinstance(cache, PagedKVCache):  # the blocks past the window back to the pool
                keep = -(-window // 16)
                cache.pool.free(cache.block_table[keep:])
                del cache.block_table[keep:]
                cache.length = window
            return layer(token, is_causal=True, kv_cache=cache)
        return run

    fns = {name: step(cache) for name, cache in caches.items()}
    with torch.no_grad():
        times = compare(fns, repeats, min_sample_s=min_sample_s)
        rows = []
        for name, cache in caches.items():
            rows.append({"cache": name, "ms": 1e3 * times[name].median,
                         "step_kib": peak_memory(fns[name]) / 2**10,
                         "held_mib": cache.nbytes / 2**20,
                         "token_kib": 3 * d_model * 4 / 2**10})
    return rows


def cache_step_targets(rows: list[dict]) -> list[Target]:
    """The issue's targets for one decoding step of the caches that stop growing: the peak bytes
    of the tensors a step holds at once (``step_kib``, :func:`~.kit.measure.peak_memory`) at most
    a quarter of what the cache holds and within 16 tokens' keys, values and output; time at
    most 1.5x ``KVCache``'s step at the same length."""
    kv = next(r for r in rows if r["cache"] == "KVCache")
    targets = []
    for r in rows:
        if not r["cache"].startswith(("Sliding", "Sink")):
            continue
        targets += [Target(f"{r['cache']} step: peak bytes / bytes held",
                           r["step_kib"] / 2**10 / r["held_mib"], "<=", 0.25),
                    Target(f"{r['cache']} step: peak bytes / one token's k, v, out",
                           r["step_kib"] / r["token_kib"], "<=", 16.0),
                    Target(f"{r['cache']} step: time / KVCache's step",
                           r["ms"] / kv["ms"], "<=", 1.5)]
    return targets


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
    print("  (bare: the same step as one function, multi_head.bare_decode_step: the layer's "
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


def _report_prefill() -> tuple[list[dict], list[Target]]:
    rows = prefill_benchmark()
    print("causal prefill, one sequence, no grad (d_model=512, 8 query heads of 64): the default "
          "paths against every fast path off\n(the readable copy of the key/value heads); "
          "qkvo_mib: the bytes of q, k, v and the attention output")
    _print_table(rows, ["variant", "L", "ms", "ms_off", "peak_mib", "peak_mib_off", "qkvo_mib"],
                 {"ms": ".1f", "ms_off": ".1f", "peak_mib": ".1f", "peak_mib_off": ".1f",
                  "qkvo_mib": ".1f"})
    targets = prefill_targets(rows)
    _print_targets("prefill targets", targets)
    print()
    return rows, targets


def _report_cache_steps() -> tuple[list[dict], list[Target]]:
    rows = cache_step_benchmark()
    print("one decoding step, batch 1, no grad, MultiHeadAttention(1024, 16), each cache holding "
          "4096 tokens (the sinks 4 more);\nstep_kib: peak bytes of tensors one step allocates")
    for r in rows:
        print(f"  {r['cache']:26s} {r['ms']:7.3f} ms  {r['step_kib']:9.1f} KiB a step  "
              f"{r['held_mib']:6.1f} MiB held  (one token's k, v, out: {r['token_kib']:.0f} KiB)")
    targets = cache_step_targets(rows)
    _print_targets("cache step targets", targets)
    paged = next(r for r in rows if r["cache"] == "PagedKVCache")
    print(f"  (for information, not a target: the paged cache gathers its blocks at every step, "
          f"{paged['step_kib'] / 2**10:.1f} MiB,\n   the readable stand-in for a kernel that "
          "reads them in place)\n")
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
                         ("training", _report_training), ("decode", _report_decode),
                         ("prefill", _report_prefill), ("cache_steps", _report_cache_steps)]:
        tables[name], found = report()
        targets += found
        with open(out / f"{name}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(tables[name][0]))
            writer.writeheader()
            writer.writerows(tables[name])
    _plot(tables["attention"], tables["scaling"], ceiling, out / "bench.png")
    print(f"\nwrote {out}/{', '.join(f'{name}.csv' for name in tables)} and bench.png")
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


if __name__ == "__main__":
    main()
