"""Chapter 9, performance: the attention benchmarks, the GPU kernels, the online softmax's tiles.

:func:`einsum_attention` is the second article's core, :func:`matmul_attention` the same written
with ``@``; the benchmarks return rows (dicts) that the chapter prints and plots, and ``make bench``
runs them at full size (:mod:`.bench`). The diagram of the tiles FlashAttention's online softmax
walks, and the checkers of the chapter's exercises.
"""

from __future__ import annotations

import math
import pathlib
import platform
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import ModuleType

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Polygon
from torch import Tensor, nn

from .. import fastpaths
from ..attention import scaled_dot_product_attention
from ..masks import causal_mask
from ..multihead import MultiHeadAttention
from ..tiled import tiled_attention
from .kit import draw
from .kit.checkers import NotYet, _call, _checker, _close, _equal, _first_match, _number, _tensor, same_as
from .kit.draw import GREY, MONO, OUT, Diagram, Q
from .kit.measure import (
    attention_flops,
    compare,
    fresh_process_peak_memory,
    mha_flops,
    peak_memory,
    saved_tensor_bytes,
)
from .kit.viz import PAGE_WIDTH
from .multi_head import _decode_inputs
from .pitfalls import EinopsSelfAttention


def einsum_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Attention in einsum notation: ``(B, H, T, hd)`` in and out, no mask."""
    scores = torch.einsum("bhld,bhsd->bhls", q * q.shape[-1] ** -0.5, k)  # (B, H, L, S)
    return torch.einsum("bhls,bhsd->bhld", torch.softmax(scores, dim=-1), v)  # (B, H, L, hd)


def matmul_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """:func:`einsum_attention` with ``@``: ``softmax(q k^T / sqrt(hd)) v``, nothing else."""
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, H, L, S)
    return torch.softmax(scores, dim=-1) @ v  # (B, H, L, hd)


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


def layer_tables(rows: list[dict]) -> tuple[dict[str, dict[str, float]],
                                             dict[str, dict[str, float]]]:
    """:func:`attention_benchmark`'s rows as two tables, each against one reference kernel.

    Training (autograd on; columns forward and forward+backward): each time over its level's
    reference, ``F.scaled_dot_product_attention`` for the core rows and
    ``nn.MultiheadAttention(need_weights=False)`` for the layers, both SDPA's fused kernel in
    both columns (:func:`reference_kernels`). Inference (eval mode, no autograd, causal): each
    layer's time over :data:`FLOOR`'s, the four projections and SDPA's fused causal kernel;
    ``nn.MultiheadAttention`` there takes its own unfused C++ path, so it is a row, not the
    reference. Each table maps a row name to its columns (``gflops`` too, FLOPs / time)."""
    training: dict[str, dict[str, float]] = {}
    inference: dict[str, dict[str, float]] = {}
    floor = next(r["ms"] for r in rows
                 if r["variant"] == FLOOR and r["mode"] == "inference, causal")
    for r in rows:
        name = f"{r['level']}: {r['variant']}"
        if r["mode"] == "inference, causal":
            if r["level"] == "layer":
                inference[name] = {"ms": r["ms"], "vs floor": r["ms"] / floor,
                                   "gflops": r["gflops"]}
        else:
            training.setdefault(name, {})[r["mode"]] = r["vs_reference"]
    return training, inference


def reference_kernels(d_model: int = 256, n_heads: int = 4, T: int = 256,
                      seed: int = 11) -> dict[str, str]:
    """What ``nn.MultiheadAttention(need_weights=False)`` runs in each of
    :func:`layer_tables`' settings, by the profiler (which sees inside the composite C++
    operation that ``op_counts`` sees as one call): its attention, softmax and ``bmm``
    operations, each with its count, by setting."""
    from .kit.measure import profiled_ops

    theirs = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(2, T, d_model, generator=g, requires_grad=True)
    blocked = torch.ones(T, T, dtype=torch.bool).triu(1)  # True = masked, its polarity

    def training() -> None:
        theirs(xs, xs, xs, need_weights=False)[0].sum().backward()

    def inference() -> None:
        with torch.no_grad():
            theirs(xs, xs, xs, attn_mask=blocked, need_weights=False, is_causal=True)

    runs = {}
    for setting, call in [("training: forward+backward", training),
                          ("inference: eval, no_grad, causal", inference)]:
        theirs.train(setting.startswith("training"))
        ops = profiled_ops(call)
        runs[setting] = ", ".join(
            name + (f" x{n}" if n > 1 else "") for name, n in ops.items()
            if any(a in name for a in ("attention", "softmax", "bmm")))
    return runs


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
    def tiled(q: Tensor) -> Tensor:
        if block_size is None:
            return tiled_attention(q, q, q)
        return tiled_attention(q, q, q, block_size=block_size)

    variants: dict[str, Callable[[Tensor], Tensor]] = {
        "explicit (selfattn)": lambda q: scaled_dot_product_attention(q, q, q)[0],
        "tiled (selfattn)": tiled,
        "F.scaled_dot_product_attention": lambda q: F.scaled_dot_product_attention(q, q, q)}
    rows = []
    with torch.no_grad():
        for T in lengths:
            q = torch.randn(1, n_heads, T, head_dim, generator=torch.Generator().manual_seed(T))
            calls: dict[str, Callable[[], object]] = {
                n: partial(f, q) for n, f in variants.items()}
            times = compare(calls, repeats, warmup=1, min_sample_s=min_sample_s)
            for name, call in calls.items():
                rows.append({"T": T, "variant": name, "ms": 1e3 * times[name].median,
                             "peak_mb": peak_memory(call) / 2**20,
                             "discarded": times[name].discarded})
    return rows


# the variants of training_benchmark: each a function of x, and the same function by its import
# path, for the fresh process that measures its peak memory (kit.peak)
TRAINING_VARIANTS: dict[str, tuple[Callable[[Tensor], Tensor], str]] = {
    "explicit (selfattn)": (lambda x: scaled_dot_product_attention(x, x, x)[0],
                            "selfattn.scaled_dot_product_attention"),
    "tiled (selfattn)": (lambda x: tiled_attention(x, x, x), "selfattn.tiled_attention"),
    "F.scaled_dot_product_attention": (lambda x: F.scaled_dot_product_attention(x, x, x),
                                       "torch.nn.functional.scaled_dot_product_attention"),
}


def training_benchmark(lengths: tuple[int, ...] = (1024, 2048, 4096), n_heads: int = 8,
                       head_dim: int = 64, repeats: int = 3, min_sample_s: float = 0.1,
                       process_lengths: tuple[int, ...] | None = None) -> list[dict]:
    """Forward and backward against sequence length, batch 1: for the explicit path, tiled
    attention and PyTorch's SDPA (:data:`TRAINING_VARIANTS`), the bytes autograd saves for
    backward (:func:`~selfattn.book.kit.measure.saved_tensor_bytes`, each storage once), the peak
    memory of one forward+backward in a fresh process (at ``process_lengths``, every length by
    default; None elsewhere), and its time, the three timed side by side at each length."""
    fresh = lengths if process_lengths is None else process_lengths
    rows = []
    for T in lengths:
        x = torch.randn(1, n_heads, T, head_dim, generator=torch.Generator().manual_seed(T),
                        requires_grad=True)

        def step(f: Callable[[Tensor], Tensor], x: Tensor = x) -> None:
            f(x).sum().backward()
            x.grad = None

        steps: dict[str, Callable[[], object]] = {
            name: partial(step, f) for name, (f, _) in TRAINING_VARIANTS.items()}
        times = compare(steps, repeats, warmup=1, min_sample_s=min_sample_s)
        for name, (f, call) in TRAINING_VARIANTS.items():
            peak = _fresh_training_peak(call, T, n_heads, head_dim) if T in fresh else None
            rows.append({"T": T, "variant": name,
                         "saved_mb": saved_tensor_bytes(partial(f, x)) / 2**20,
                         "process_peak_mb": None if peak is None else peak / 2**20,
                         "fwd_bwd_ms": 1e3 * times[name].median,
                         "discarded": times[name].discarded})
    return rows


def _fresh_training_peak(function: str, T: int, n_heads: int, head_dim: int) -> int | None:
    """Peak bytes of one forward+backward of ``function`` on ``x``, ``(1, n_heads, T, head_dim)``,
    in a fresh process with this process's threads, after one call on a short input (what a
    process allocates once is not counted); the input itself is not counted, its gradient is."""
    return fresh_process_peak_memory(function, T, n_heads, head_dim, backward=True,
                                     threads=torch.get_num_threads())


def fastpath_benchmark(repeats: int = 9, min_sample_s: float = 0.2, seed: int = 0,
                       batch: int = 8, T: int = 512, d_model: int = 512,
                       contexts: tuple[int, int] = (8192, 16384)) -> list[dict]:
    """Each of :mod:`selfattn.fastpaths`' paths, timed with it and without it, side by side, on
    the call it exists for (no grad): a layer's forward with the weights over ``batch x T``
    tokens (in-place softmax), and one decoding step of GQA-4 and of MQA after ``contexts``
    cached tokens (grouped heads against the copy of the keys; the stacked groups against
    PyTorch's ``enable_gqa``, which ``stacked_groups`` switched off leaves; the split cache).
    Rows give both times and the speed-up the path brings."""
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
        "stacked_groups": (f"GQA-4 decoding after {contexts[0]:,} tokens, vs enable_gqa",
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


def cpu_model() -> str:
    """This machine's CPU, as Linux names it (``/proc/cpuinfo``), or as Python's platform does."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "an unknown CPU"


GPU_REPORT = pathlib.Path(__file__).with_name("gpu_report.json")
"""Where ``make gpu`` (tools/gpu_report.py) writes its report, to be committed; the package
ships it, so a chapter finds it on Colab too."""
_REPORT_KEYS = {"format": int, "rehearsal": bool, "date": str, "versions": dict, "device": dict,
                "steps": list, "kernels": list, "gpu_kernels": list, "cells": list}


def parse_gpu_report(text: str) -> dict:
    """A ``make gpu`` report read from its JSON text, checked against its format (format 1:
    the keys of :data:`_REPORT_KEYS`, the device's name, each step's name and result, each
    cell's chapter and output); a ``ValueError`` saying what is missing otherwise."""
    import json

    report = json.loads(text)
    for key, kind in _REPORT_KEYS.items():
        if not isinstance(report.get(key), kind):
            raise ValueError(f"a make gpu report needs {key!r} ({kind.__name__}), got "
                             f"{type(report.get(key)).__name__}")
    if report["format"] != 1:
        raise ValueError(f"a make gpu report of format {report['format']}; this code reads 1")
    if "name" not in report["device"] or not all({"name", "result"} <= set(s)
                                                 for s in report["steps"]):
        raise ValueError("a make gpu report names its device and each step's result")
    if not all({"chapter", "output"} <= set(c) for c in report["cells"]):
        raise ValueError("a make gpu report gives each GPU cell's chapter and output")
    return report


def gpu_report() -> dict | None:
    """The committed report of ``make gpu`` run on a CUDA GPU (:data:`GPU_REPORT`), or ``None``:
    then no GPU has run the book's GPU cells, and a chapter's sentence about what a GPU does is a
    prediction, which the chapter can say by computing ``performance.gpu_report() is None``. A
    rehearsal's report (``make gpu-rehearsal``, on a CPU) never counts. A report whose steps did
    not all pass still counts (its ``steps`` say which failed, and its ``cells`` hold what the
    GPU cells printed): a chapter quoting it can check the step it rests on."""
    if not GPU_REPORT.exists():
        return None
    report = parse_gpu_report(GPU_REPORT.read_text(encoding="utf-8"))
    return None if report["rehearsal"] else report


def _kernels_that_ran(fn, device: torch.device | str) -> list[str]:
    """The compute kernels one call of ``fn`` on ``device`` launched: CUDA kernel names for a
    CUDA device (from ``torch.profiler``), the attention operations PyTorch dispatched to for any
    other. The device of the call decides, not whether this machine has a GPU: a CPU call on a
    GPU machine is profiled on the CPU."""
    from torch.profiler import ProfilerActivity

    from .kit.measure import profiled_ops, quiet_profiler

    if torch.device(device).type != "cuda":
        return [name for name in profiled_ops(fn) if "attention" in name or "softmax" in name]
    with quiet_profiler(activities=[ProfilerActivity.CUDA]) as prof:
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

    from .kit.measure import median_time

    device = torch.device(device)
    triton: ModuleType | None
    try:
        from .. import triton_attention as triton
    except ImportError:  # no triton on this platform
        triton = None
    backends = [b for b in ("MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION")
                if hasattr(SDPBackend, b)]
    rows = []
    for dtype in dtypes:
        for T in lengths:
            g = torch.Generator(device=device).manual_seed(T)
            q = torch.randn(1, n_heads, T, head_dim, generator=g, device=device, dtype=dtype)
            variants = _gpu_variants(q, [getattr(SDPBackend, b) for b in backends],
                                     sdpa_kernel, triton)
            flops = attention_flops(T, T, head_dim, n_heads, 1) * (T + 1) / (2 * T)
            for name, fn in variants.items():
                row: dict = {"variant": name, "dtype": str(dtype).removeprefix("torch."), "T": T}
                try:
                    with torch.no_grad():
                        seconds = median_time(fn, repeats=repeats, warmup=warmup)
                        row |= {"ms": 1e3 * seconds, "tflops": flops / seconds / 1e12,
                                "peak_mib": _peak_bytes(fn, device) / 2**20,
                                "kernel": ", ".join(_kernels_that_ran(fn, device))[:90]}
                except Exception as exc:  # no such backend here, out of memory, a kernel
                    # that does not fit this GPU (Triton's OutOfResources): a row that says so
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    row["error"] = str(exc).strip().splitlines()[0][:90]
                rows.append(row)
    return rows


PUBLISHED_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # dense (no sparsity) peaks from NVIDIA's data sheets: half precision on the tensor cores,
    # float32 on the ordinary cores (not TF32: the kernels here multiply float32 in full)
    "T4": {"float16": 65.0, "float32": 8.1},
    "A100": {"float16": 312.0, "bfloat16": 312.0, "float32": 19.5},
    "H100 SXM": {"float16": 989.4, "bfloat16": 989.4, "float32": 67.0},
}
"""A few GPUs' published peak TFLOP/s by dtype, to hold :func:`gpu_kernels`' rates against."""


def published_peak_tflops(gpu_name: str, dtype: str) -> float | None:
    """The published peak of the GPU ``torch.cuda.get_device_name`` calls ``gpu_name``, for
    ``dtype`` (``"float16"``, ...), from :data:`PUBLISHED_PEAK_TFLOPS`; ``None`` for a GPU or a
    dtype the table does not hold (an H100 counts as the SXM part only when its name says so)."""
    for gpu, peaks in PUBLISHED_PEAK_TFLOPS.items():
        if all(word in gpu_name for word in gpu.split()):
            return peaks.get(dtype)
    return None


def with_published_peak(rows: list[dict], gpu_name: str) -> list[dict]:
    """:func:`gpu_kernels`' rows, each with ``of_peak``: its useful TFLOP/s over the GPU's
    published peak for its dtype (:func:`published_peak_tflops`), or ``None`` where the row
    has no rate or the book has no peak for this GPU."""
    out = []
    for row in rows:
        peak = published_peak_tflops(gpu_name, row["dtype"])
        rate = row.get("tflops")
        out.append(row | {"of_peak": rate / peak if rate is not None and peak else None})
    return out


def _gpu_variants(q: Tensor, backends: list, sdpa_kernel, triton_attention) -> dict:
    """:func:`gpu_kernels`' calls on ``q``: causal self-attention, each its own way."""
    def forced(backend) -> Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, q, q, is_causal=True)

    variants: dict[str, Callable[[], Tensor]] = {
        f"SDPA, {b.name.lower()}": partial(forced, b) for b in backends}
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
        return [{"call": name, "kernel": ", ".join(_kernels_that_ran(fn, device))[:90]}
                for name, fn in calls.items()]


@dataclass(frozen=True)
class Tile:
    """One tile of :func:`online_softmax_tiles`, block row ``a`` by block column ``b``: for each
    of its query rows, the first of its key columns the mask hides (its width when none is; the
    mask, causal or none, keeps a prefix of every row)."""

    a: int
    b: int
    first_hidden: tuple[int, ...]
    width: int  # key columns (the last block column may be narrower than block_size)

    @property
    def visible(self) -> bool:
        """Whether the mask keeps any score of the tile: a hidden tile is skipped."""
        return any(self.first_hidden)

    @property
    def partial(self) -> bool:
        """Whether the mask hides some of the tile's scores, not all (a diagonal tile)."""
        return self.visible and min(self.first_hidden) < self.width


@dataclass(frozen=True)
class TilesLayout:
    """What :func:`online_softmax_tiles` draws, computed without matplotlib: the tiles of the
    ``(L, S)`` scores under the mask (:func:`~selfattn.masks.causal_mask` or none), the query
    block that walks its key blocks up to ``last``, and a tile's height and width (inches)."""

    L: int
    S: int
    block_size: int
    causal: bool
    query_block: int
    tiles: list[Tile]
    last: int
    tile_h: float
    tile_w: float

    @property
    def n_rows(self) -> int:
        return math.ceil(self.L / self.block_size)

    @property
    def n_cols(self) -> int:
        return math.ceil(self.S / self.block_size)

    @property
    def skipped(self) -> int:
        return sum(not tile.visible for tile in self.tiles)

    @property
    def notes(self) -> list[tuple[str, dict]]:
        """The text column beside the grid, each with its style."""
        qb, bs, L, S = self.query_block, self.block_size, self.L, self.S
        lines: list[tuple[str, dict]] = [(f"block_size = {bs}: {self.n_rows} × {self.n_cols} tiles", {})]
        if self.causal:
            lines.append((f"grey: hidden by the causal mask;\n{self.skipped} of {len(self.tiles)} tiles "
                          "skipped", {}))
        rows = f"{qb * bs}–{min((qb + 1) * bs, L) - 1}"
        return [*lines, (f"query block {qb} (rows {rows}) walks its key\nblocks left to right, keeping "
                         "per row:", {"color": OUT}),
                (_ONLINE_SOFTMAX, {"family": MONO, "size": 8.5}),
                (f"never stored: the full L × S matrix\n({L} × {S} = {L * S:,} scores)", {})]

    @property
    def alt(self) -> str:
        mask = (f"; the causal mask hides {self.skipped} of them entirely, and they are skipped"
                if self.causal else "")
        return (f"The {self.L} × {self.S} score matrix cut into {self.n_rows} × {self.n_cols} tiles of "
                f"{self.block_size}{mask}. Query block {self.query_block} walks its key blocks left to "
                f"right, updating a running maximum m and sum l per row and an output acc that is "
                f"divided by l at the end, so the full matrix is never stored.")


_ONLINE_SOFTMAX = ("m_new = max(m, rowmax(s))\n"
                   "alpha = exp(m − m_new)\n"
                   "l = alpha · l + rowsum(exp(s − m_new))\n"
                   "acc = alpha · acc + exp(s − m_new) @ V_j\n"
                   "m = m_new\n"
                   "at the end: acc / l")


def tiles_layout(L: int = 16, S: int = 16, block_size: int = 4, causal: bool = True,
                 query_block: int | None = None) -> TilesLayout:
    """:func:`online_softmax_tiles`' layout: every tile read from the mask, the query block's
    last visible key block, and tiles sized to fit the page (square unless the matrix is very
    long or wide)."""
    nq, nk = math.ceil(L / block_size), math.ceil(S / block_size)
    qb = nq // 2 if query_block is None else query_block
    keep = causal_mask(L, S) if causal else torch.ones(L, S, dtype=torch.bool)
    tiles = []
    for a in range(nq):
        for b in range(nk):
            part = keep[a * block_size:(a + 1) * block_size, b * block_size:(b + 1) * block_size]
            first = [int(row.int().argmin()) if not row.all() else part.shape[1] for row in part]
            tiles.append(Tile(a, b, tuple(first), part.shape[1]))
    last = max(t.b for t in tiles if t.a == qb and t.visible)
    t_h, t_w = min(2.6 / nq, 0.6), min(3.0 / nk, 0.6)  # a tile's height and width, in inches
    if max(t_h, t_w) < 2 * min(t_h, t_w):
        t_h = t_w = min(t_h, t_w)
    return TilesLayout(L, S, block_size, causal, qb, tiles, last, t_h, t_w)


def online_softmax_tiles(L: int = 16, S: int = 16, block_size: int = 4, causal: bool = True,
                         query_block: int | None = None) -> Diagram:
    r"""The ``(L, S)`` score matrix as FlashAttention-2 computes it (Dao 2023, §3.1): in tiles
    of ``block_size`` queries by ``block_size`` keys, skipping the tiles a causal mask
    (:func:`~selfattn.masks.causal_mask`, top-left aligned) hides entirely. One query block walks
    its key blocks keeping, per row, a running maximum $m$ and sum $l$ (the online softmax) and
    the unnormalised output ``acc``, divided by $l$ once at the end (the names of
    :func:`selfattn.tiled.tiled_forward`), so the full matrix is never
    stored. ``query_block`` defaults to the middle one (:func:`tiles_layout`)."""
    layout = tiles_layout(L, S, block_size, causal, query_block)
    return Diagram(_draw_tiles(layout), layout.alt)


def _draw_tiles(layout: TilesLayout) -> Figure:
    bs, t_h, t_w, qb = layout.block_size, layout.tile_h, layout.tile_w, layout.query_block
    grid_h = layout.L / bs * t_h
    W, H = PAGE_WIDTH, max(grid_h + 0.75, 3.7)  # room for the text column beside the grid
    fig, ax = draw.canvas(W, H)
    x0, y_top = 0.45, min(H - 0.45, H - 0.8 + grid_h / 2)  # room for the rotated label beside it
    for tile in layout.tiles:
        n_r, n_c = len(tile.first_hidden), tile.width
        th, tw = t_h * n_r / bs, t_w * n_c / bs
        x, y = x0 + tile.b * t_w, y_top - tile.a * t_h
        color = (draw.tint(Q, 0.3) if tile.a == qb and tile.visible else "white" if tile.visible
                 else "#d9d9d9")
        ax.add_patch(FancyBboxPatch((x + 0.015, y - th + 0.015), tw - 0.03, th - 0.03, facecolor=color,
                                    boxstyle="round,pad=0,rounding_size=0.03", edgecolor=GREY, lw=0.8,
                                    gid=f"tile{tile.a}-{tile.b}" + ("" if tile.visible else " skipped")))
        if tile.partial:  # grey over the masked corner: a staircase down the first hidden columns
            pts = [(x + tw, y)]
            for i, c in enumerate(tile.first_hidden):
                pts += [(x + tw * c / n_c, y - th * i / n_r), (x + tw * c / n_c, y - th * (i + 1) / n_r)]
            ax.add_patch(Polygon([*pts, (x + tw, y - th)], facecolor="#d9d9d9", edgecolor="none"))
    draw.text(ax, x0 + layout.S / bs * t_w / 2, y_top + 0.18, f"keys (S = {layout.S})", ha="center")
    draw.text(ax, x0 - 0.17, y_top - grid_h / 2, f"queries (L = {layout.L})", ha="center", rotation=90)
    y_row, last = y_top - (qb + 0.5) * t_h, layout.last
    draw.arrow(ax, (x0 + 0.05, y_row), (x0 + min((last + 1) * t_w, layout.S / bs * t_w) - 0.05, y_row),
               OUT, lw=1.8)
    if t_h >= 0.3 and (last + 1) * t_w >= 0.45:  # room for a label over the arrow
        draw.text(ax, x0 + 0.08, y_row + 0.04, "m, l, acc", size=8.5, color=OUT, va="bottom")
    x_t, y = x0 + layout.n_cols * t_w + 0.35, H - 0.3
    for text, style in layout.notes:
        mono = style.get("family") == MONO
        draw.text(ax, x_t + 0.15 if mono else x_t, y, text, va="top", linespacing=1.4, **style)
        y -= (0.165 if mono else 0.21) * (text.count("\n") + 1) + 0.17  # inches per line of 8.5 or 9 pt
    return fig


def scores_bytes(n_heads: int, T: int, dtype: torch.dtype = torch.float32) -> int:
    """Chapter 9, exercise 2: the bytes of one ``(n_heads, T, T)`` matrix of scores."""
    return torch.empty(0, dtype=dtype).element_size() * n_heads * T * T


@_checker
def check_attention_flops(fn: object) -> str:
    """Chapter 9, exercise 1: ``fn(L, S, d, n_heads, batch)`` is attention's dense forward FLOPs."""
    same_as(fn, attention_flops, [(1, 1, 1, 1, 1), (3, 5, 4, 2, 1), (512, 512, 64, 8, 8), (7, 100, 16, 3, 2)],
            "for (L, S, d, n_heads, batch) = {case}: you say {got!r}, expected {want:,}{hint}",
            mistakes=[(lambda *case: attention_flops(*case) // 2,
                       " (that counts each product once: a multiply-add is 2 FLOPs)")])
    return "4 * L * S * d per head and per sequence: QK^T and AV, 2LSd each"


@_checker
def check_scores_bytes(answer: object) -> str:
    """Chapter 9, exercise 2: bytes of a (32, 8192, 8192) float32 score matrix."""
    answer = _number(answer)
    want = scores_bytes(32, 8192, torch.float32)
    if answer != want:
        raise NotYet(f"{answer:,} is not it: heads x T x T numbers of 4 bytes each")
    return f"{want:,} bytes = {want / 2**30:.0f} GiB for one layer's scores"


def _softmax_unrescaled(scores: Tensor, block_size: int) -> Tensor:
    """The online softmax that forgets to rescale its running sum when the maximum grows."""
    m = torch.full((*scores.shape[:-1], 1), float("-inf"), dtype=scores.dtype)
    total = torch.zeros_like(m)
    for start in range(0, scores.shape[-1], block_size):
        block = scores[..., start : start + block_size]
        m = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        total = total + torch.exp(block - m).sum(dim=-1, keepdim=True)
    return torch.exp(scores - m) / total


def _softmax_per_block(scores: Tensor, block_size: int) -> Tensor:
    """Each block normalised on its own."""
    return torch.cat([torch.softmax(b, dim=-1) for b in scores.split(block_size, dim=-1)], dim=-1)


def _online_softmax_case(fn: object, scores: Tensor, block_size: int, what: str,
                         later_max: bool = False) -> None:
    """``fn(scores, block_size)`` against torch.softmax. ``later_max``: the maximum is not in the
    first block, and the cases where it is have passed already."""
    before = scores.clone()
    want = torch.softmax(scores, dim=-1)
    got = _tensor(_call(fn, scores, block_size), want)
    given = f"with block_size={block_size} and {scores.shape[-1]} columns ({what})"
    if not _equal(scores, before):
        raise NotYet("your function changed the scores in place; compute the weights in new tensors")
    if _close(got, want):
        return
    if not torch.isfinite(got).all():
        raise NotYet(f"{given}, your weights hold inf or NaN: exp overflows above about 88 in "
                     "float32. Subtract the running maximum before exp, and multiply the running "
                     "sum by exp(old max - new max) when the maximum grows")
    hint = _first_match(got, [
        (lambda: _softmax_per_block(scores, block_size), f"{given}, each block of weights sums to 1 "
         "on its own: the normaliser is the sum over all the columns, so carry a running sum "
         "from block to block"),
        (lambda: _softmax_unrescaled(scores, block_size), f"{given}, the weights are wrong when a "
         "later block holds a larger maximum: when the running maximum grows from m to m', the "
         "running sum must be multiplied by exp(m - m')"),
    ])
    if hint:
        raise NotYet(hint)
    if later_max:
        raise NotYet(f"{given}, your weights are wrong, though right when the first block holds the "
                     "maximum: when the running maximum grows from m to m', the running sum "
                     "must be multiplied by exp(m - m')")
    raise NotYet(f"{given}, your weights differ from torch.softmax by up to "
                 f"{(got.detach().to(want.dtype) - want).abs().max():.3g}")


_SOFTMAX_OPS = {"_softmax", "softmax", "_log_softmax", "log_softmax", "logsumexp",
                "logcumsumexp", "_safe_softmax", "special_softmax"}


_REDUCTIONS = {"amax", "amin", "aminmax", "max", "min", "sum", "nansum", "mean", "nanmean", "prod",
               "cumsum", "cumprod", "cummax", "cummin", "var", "std", "var_mean", "std_mean",
               "norm", "linalg_vector_norm", "median", "nanmedian", "kthvalue", "mode", "sort",
               "topk", "argmax", "argmin", "all", "any", "count_nonzero"}


_PRODUCTS = {"mm", "bmm", "mv", "dot", "vdot", "matmul", "addmm", "addmv", "baddbmm", "einsum",
             "tensordot", "inner"}


def _reduced_columns(name: str, args: tuple, kwargs: dict) -> int:
    """How many numbers one output of the reduction ``name(*args, **kwargs)`` is computed from:
    the sizes of the dims it reduces (every element when no dim is given)."""
    x = args[0]
    dim = kwargs.get("dim", args[1] if len(args) > 1 and not isinstance(args[1], bool) else None)
    if name in ("kthvalue",):  # kthvalue(x, k, dim)
        dim = kwargs.get("dim", args[2] if len(args) > 2 else -1)
    if isinstance(dim, Tensor) or (name in ("norm",) and not isinstance(dim, (int, list, tuple))):
        dim = kwargs.get("dim")
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return x.numel()
    dims = [dim] if isinstance(dim, int) else list(dim)
    return math.prod(x.shape[d] for d in dims) if x.dim() else 1


def _whole_row_reads(fn: object, scores: Tensor, block_size: int) -> None:
    """The online softmax must read the row ``block_size`` columns at a time: reject a softmax
    op, any reduction that combines more than ``block_size`` numbers into one (a maximum or a
    sum of the whole row at once is the two-pass softmax, correct but not the algorithm), and a
    matrix product that sums over more than ``block_size`` (a sum written as ``e @ ones``).
    Seen at the level of PyTorch's basic operations, so it does not matter how the code is
    written, or along which dim it puts the columns."""
    from torch.utils._python_dispatch import TorchDispatchMode  # private API: loaded on use

    seen: list[str] = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            first = args[0] if args else None
            if name in _SOFTMAX_OPS:
                seen.append(f"torch.{name.lstrip('_')}")
            elif name in _REDUCTIONS and isinstance(first, Tensor) and first.dim() > 0:
                n = _reduced_columns(name, args, kwargs)
                if n > block_size:
                    seen.append(f"{name}, over {n} numbers at once")
            elif name in _PRODUCTS and isinstance(first, Tensor) and first.dim() > 0:
                if first.shape[-1] > block_size:
                    seen.append(f"a matrix product ({name}) summing {first.shape[-1]} numbers")
            return func(*args, **kwargs)

    with Watch():
        _call(fn, scores, block_size)
    if seen:
        raise NotYet(f"with block_size={block_size} and {scores.shape[-1]} columns your function "
                     f"calls {seen[0]}: read the scores block_size columns at a time, keeping a "
                     f"running maximum and sum, as in step 1")


@_checker
def check_online_softmax(fn: object) -> str:
    """Chapter 9, build-it exercise: ``fn(scores, block_size)`` is ``torch.softmax(scores,
    dim=-1)`` for ``scores`` (..., S), computed by visiting ``block_size`` columns at a time with a
    running maximum and a running sum. Checked with the maximum in the first block, then in a
    later one, and with scores around 1000, where a plain exp overflows; then that it never
    calls a softmax nor reduces more than ``block_size`` columns at once."""
    g = torch.Generator().manual_seed(90)
    first = torch.randn(4, 10, generator=g) * 2
    first[:, 0] = first.amax(dim=-1) + 1  # the maximum in the first block: it never changes
    for block_size in (3, 1, 10, 16):
        _online_softmax_case(fn, first, block_size, "the maximum in the first column")
    last = torch.randn(2, 3, 10, generator=g) * 2
    last[..., -1] = last.amax(dim=-1) + 2  # the maximum in the last block
    for block_size in (3, 1, 4):
        _online_softmax_case(fn, last, block_size, "the maximum in the last column", later_max=True)
    rising = torch.arange(7.0).expand(3, 7) + torch.randn(3, 7, generator=g) * 0.1
    _online_softmax_case(fn, rising, 2, "a maximum that grows in every block", later_max=True)
    large = 1000 + torch.randn(2, 3, 11, generator=g) * 3
    for block_size in (3, 11, 1, 32):
        _online_softmax_case(fn, large, block_size, "scores around 1000")
    _whole_row_reads(fn, rising, 2)  # right numbers; now, block by block?
    return ("one pass for the running maximum m and sum l (l rescaled by exp(m - m') whenever the "
            "maximum grows), then exp(s - m) / l: torch.softmax, without overflow, block by block")
