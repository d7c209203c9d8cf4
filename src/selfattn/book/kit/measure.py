r"""Measuring tools: time, memory, FLOPs and bytes, and what ran.

How we time, on machines that other people share: every variant is warmed up first; then in each
round every variant runs once, in an order rotated by one each round, so a slow moment hits all of
them; a sample during which other processes used the CPU (read from ``/proc/stat`` before and
after) is discarded; the median of the rest is reported. Ratios are only ever taken between
variants measured side by side in the same run. On a GPU, every clock read waits for the queued
kernels first (:func:`synchronize`).

FLOPs are dense counts: attention does $4 L S d$ per head forward ($QK^\top$ and $AV$, each
$2LSd$), and backward twice that.
"""

from __future__ import annotations

import contextlib
import math
import os
import pathlib
import re
import statistics
import time
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn


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

    @property
    def spread(self) -> float:
        """Half the range of the samples, relative to the median: how far apart two runs of
        the same code can land."""
        return (max(self.samples) - min(self.samples)) / (2 * self.median)


def verdict(name: str, time: Timing, other_name: str, other: Timing) -> str:
    """One line comparing two variants timed side by side: their ratio, and whether it is
    larger than the spread of their own samples (:attr:`Timing.spread`); when it is not, this
    run cannot tell them apart."""
    ratio, noise = time.median / other.median, time.spread + other.spread
    if abs(ratio - 1) <= noise:
        outcome = f"within the samples' spread (±{noise:.0%}), no difference shown"
    else:
        outcome = f"{'faster' if ratio < 1 else 'slower'}, beyond the samples' spread (±{noise:.0%})"
    return f"{name} / {other_name}: {ratio:.2f}, {outcome}"


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
            others = 0.0 if busy0 is None or busy1 is None else (busy1 - busy0) - (own1 - own0)
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
    backward computes four products of the same size ($dV = A^\top dO$, the weights' gradient
    $dA = dO\,V^\top$, $dQ$ and $dK$; the softmax's own backward is elementwise)."""
    forward = 4 * batch * n_heads * L * S * head_dim
    return 3 * forward if backward else forward


def mha_flops(batch: int, T: int, d_model: int, backward: bool = False) -> int:
    r"""Dense FLOPs of a multi-head self-attention layer: four ``d_model x d_model`` projections
    ($8 B T d^2$) plus attention over all heads ($4 B T^2 d$); backward doubles each."""
    forward = 8 * batch * T * d_model * d_model + attention_flops(T, T, d_model, 1, batch)
    return 3 * forward if backward else forward


def fit_exponent(sizes: list[float], times: list[float]) -> float:
    r"""The slope $p$ of the least-squares line through $(\log n, \log t)$: $t \propto n^p$."""
    x = [math.log(n) for n in sizes]
    y = [math.log(t) for t in times]
    mx, my = statistics.fmean(x), statistics.fmean(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sum((a - mx) ** 2 for a in x)


def decode_bytes(d_model: int, n_heads: int, n_kv_heads: int, context: int,
                 head_dim: int | None = None, itemsize: int = 4, ffn_hidden: int = 0,
                 batch: int = 1) -> dict[str, int]:
    """Bytes one decoding step of one layer must read: its weights, once for the whole batch,
    and the KV cache of every sequence in the batch.

    ``ffn_hidden``: the width of the feed-forward layer beside the attention (0: attention
    alone; a block of the usual shape has ``4 * d_model``), whose two matrices are read at every
    step too. ``batch``: sequences decoded together, each with its own cache of ``context``
    tokens, sharing one read of the weights (Shazeer 2019 and Ainslie et al. 2023 count both).
    """
    hd = head_dim or d_model // n_heads
    attention = (d_model * n_heads * hd * 2 + d_model * n_kv_heads * hd * 2) * itemsize
    weights = attention + 2 * d_model * ffn_hidden * itemsize
    cache = 2 * n_kv_heads * context * hd * itemsize * batch
    return {"weights": weights, "cache": cache, "total": weights + cache}


def peak_memory(fn: Callable[[], object]) -> int:
    """Peak bytes of tensor storage that ``fn()`` holds at once, beyond what existed before.

    Every tensor created through torch's dispatcher is counted while it is alive (a
    ``TorchDispatchMode``). What this cannot see: buffers that a fused kernel allocates and frees
    inside itself (PyTorch's flash attention keeps a few blocks per thread) and the memory of the
    process itself; :func:`process_peak_memory` measures that. Run it under ``torch.no_grad()``:
    autograd's saved tensors outlive the Python objects this counts.
    """
    from torch.utils._python_dispatch import TorchDispatchMode  # private API: loaded on use
    from torch.utils._pytree import tree_leaves

    class LiveBytes(TorchDispatchMode):
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
            inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                      if isinstance(t, Tensor) and t.device.type != "meta"}
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, Tensor) and t.device.type != "meta":
                    key = t.untyped_storage().data_ptr()
                    if key not in self.users and key in inputs:
                        continue  # a view of a tensor that existed before: no new memory
                    if key not in self.users:
                        self.users[key] = [0, t.untyped_storage().nbytes()]
                        self.live += self.users[key][1]
                        self.peak = max(self.peak, self.live)
                    self.users[key][0] += 1
                    weakref.finalize(t, self._release, key)
            return out

    mode = LiveBytes()
    with mode:
        result = fn()
    del result
    return mode.peak


def saved_tensor_bytes(fn: Callable[[], object]) -> int:
    """Bytes that autograd keeps for the backward pass of ``fn()``: the storages of every tensor
    a node of the graph saves (``torch.autograd.graph.saved_tensors_hooks``), each distinct
    storage counted once and whole, so a view of an input, or the input saved by several nodes,
    adds nothing after the first. Run it with grad enabled on inputs that require grad.

    This is what training pays per layer between forward and backward, beyond the inputs'
    and output's own tensors, which it counts too when the graph saves them.
    """
    saved: dict[tuple[torch.device, int], tuple[Tensor, int]] = {}  # storage -> (a user, bytes)

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        # the tensor is held until the end, so no other storage can take its address meanwhile
        saved.setdefault((t.device, storage.data_ptr()), (t, storage.nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    del result
    return sum(nbytes for _, nbytes in saved.values())


def op_counts(fn: Callable[[], object]) -> Counter[str]:
    """How many times ``fn()`` calls each of PyTorch's basic operations (``aten`` operators, the
    level where ``einsum``, ``@`` and ``F.scaled_dot_product_attention`` end up), by name: what a
    function *does*, independent of how it is written. Each call is one pass over its tensors in
    memory, so fewer, larger operations mean fewer trips to memory."""
    from torch.utils._python_dispatch import TorchDispatchMode  # private API: loaded on use

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.counts: Counter[str] = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.counts[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    mode = Count()
    with mode:
        fn()
    return mode.counts


@contextlib.contextmanager
def quiet_profiler(**kwargs: object) -> Iterator[torch.profiler.profile]:
    """``torch.profiler.profile(**kwargs)``, silent while it starts and stops: its C++ side logs
    to stderr (pointed at /dev/null meanwhile), and torch 2.11 warns on a profiler's first use
    that it "clears events at the end of each cycle" (a ``UserWarning`` from ``prepare_trace``,
    a bug torch 2.13 fixed), which a notebook shows under the cell. Only that warning is
    filtered; Python's own exceptions are not written to stderr: they still reach the caller."""
    from torch.profiler import profile

    stderr, quiet = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 2)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Profiler clears events",
                                    category=UserWarning)
            with profile(**kwargs) as prof:  # type: ignore[arg-type]
                yield prof
    finally:
        os.dup2(stderr, 2)
        os.close(stderr)
        os.close(quiet)


def profiled_ops(fn: Callable[[], object]) -> Counter[str]:
    """Every ``aten`` operation ``torch.profiler`` records while ``fn()`` runs, by name, the ones
    inside a composite C++ operation included. :func:`op_counts` sees such an operation as one
    call (``_native_multi_head_attention``, ``nn.MultiheadAttention``'s inference fast path);
    this shows what it runs inside (its matrix products and softmax)."""
    with quiet_profiler() as prof:
        fn()
    return Counter(e.name.removeprefix("aten::") for e in prof.events()
                   if e.name.startswith("aten::"))


def process_peak_memory(fn: Callable[[], object]) -> int | None:
    """Peak resident memory of this process while ``fn()`` runs, above what it held before, in
    bytes; None where the operating system does not say (Linux does, in ``/proc/self``).

    Unlike :func:`peak_memory` this sees everything, a fused kernel's own buffers included, at
    the grain of memory pages; memory the allocator kept from earlier calls is reused without
    counting again, so measure a fresh size, or the larger of two variants first.
    """
    status = pathlib.Path("/proc/self/status")
    try:
        pathlib.Path("/proc/self/clear_refs").write_text("5")  # reset the peak to the current size
    except OSError:
        return None

    def kilobytes(field: str) -> int:
        found = re.search(rf"^{field}:\s+(\d+) kB", status.read_text(), re.M)
        assert found, f"{status} has no {field}"  # Linux writes both fields read here
        return int(found.group(1))

    before = kilobytes("VmRSS")
    result = fn()
    del result
    return 1024 * (kilobytes("VmHWM") - before)


def fresh_process_peak_memory(function: str, length: int, n_heads: int, head_dim: int, *,
                              backward: bool = False, threads: int = 1) -> int | None:
    """:func:`process_peak_memory` of one self-attention call, ``function(x, x, x)`` on ``x`` of
    shape ``(1, n_heads, length, head_dim)``, in a new Python process (:mod:`.peak`, which says
    what is counted): nothing freed earlier is there to be reused, so every page the call
    touches counts, a fused kernel's own buffers included. ``function`` is the import path of a
    self-attention function (``selfattn.tiled_attention``); ``backward``: one forward and backward
    pass instead of a forward pass without autograd; ``threads``: torch's threads in that
    process. Bytes; None where the operating system does not say."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "selfattn.book.kit.peak", function, "--length", str(length),
               "--heads", str(n_heads), "--head-dim", str(head_dim), "--threads", str(threads)]
    done = subprocess.run(command + ["--backward"] * backward, capture_output=True, text=True,
                          check=False)
    if done.returncode:
        raise RuntimeError(f"the call failed in a fresh process:\n{done.stderr.strip()}")
    peak = done.stdout.strip().splitlines()[-1]
    return None if peak == "None" else int(peak)


def count_parameters(model: nn.Module) -> int:
    """The number of trainable numbers in ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
