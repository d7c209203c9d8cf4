r"""Measuring tools: time, memory, FLOPs and bytes, and a layer's receptive field.

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

import math
import os
import pathlib
import re
import statistics
import time
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor


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
    if len(sizes) != len(times) or len(sizes) < 2:
        raise ValueError(f"need at least two (size, time) pairs, got {len(sizes)} sizes and "
                         f"{len(times)} times")
    if min(sizes) <= 0 or min(times) <= 0:
        raise ValueError("sizes and times must be positive to take logarithms")
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
        return int(re.search(rf"^{field}:\s+(\d+) kB", status.read_text(), re.M).group(1))

    before = kilobytes("VmRSS")
    result = fn()
    del result
    return 1024 * (kilobytes("VmHWM") - before)


def fresh_process_peak_memory(stmt: str, setup: str = "pass") -> int | None:
    """:func:`process_peak_memory` of ``stmt`` in a new Python process, after ``setup`` (the
    arguments of :func:`timeit.timeit`): nothing freed earlier is there to be reused, so every
    page the call touches counts, a fused kernel's own buffers included. Bytes; None where the
    operating system does not say. The statements run with ``torch`` imported and autograd off.
    """
    import subprocess
    import sys
    import textwrap

    script = "\n".join([
        "import torch",
        "from selfattn.book.measure import process_peak_memory",
        textwrap.dedent(setup),
        "torch.set_grad_enabled(False)",
        f"print(process_peak_memory(lambda: {stmt}))",
    ])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=False)
    if done.returncode:
        raise RuntimeError(f"the statement failed in a fresh process:\n{done.stderr.strip()}")
    peak = done.stdout.strip().splitlines()[-1]
    return None if peak == "None" else int(peak)


def influence(layer: Callable[[Tensor], Tensor], x: Tensor, t: int) -> Tensor:
    """Bool ``(T,)``: which input positions of ``x`` (B, T, d) change output position ``t``.

    Measured with autograd: position ``j`` counts when the gradient of output ``t`` with respect
    to input ``j`` is not zero. This is a layer's receptive field, seen from position ``t``.
    """
    x = x.detach().requires_grad_(True)
    out = layer(x)  # (B, T, d_out)
    (grad,) = torch.autograd.grad(out[:, t].sum(), x)
    return grad.abs().sum(dim=(0, 2)) > 0  # (T,)




def gradient_by_distance(layer: Callable[[Tensor], Tensor], x: Tensor, t: int) -> Tensor:
    r"""``(T,)``: how strongly output position ``t`` depends on each input position ``s`` of
    ``x`` (B, T, d): the norm $\lVert \partial y_t / \partial x_s \rVert$ of the Jacobian block
    (the ``d_out x d`` matrix of every output number at ``t`` against every input number at
    ``s``, over the batch), measured with autograd, one backward pass per output number.

    :func:`influence` says whether this is zero; this says how big it is, so it shows a
    gradient that fades with distance (a recurrent layer) or stays (attention).
    """
    x = x.detach().requires_grad_(True)
    out = layer(x)[:, t]  # (B, d_out)
    total = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)  # (T,)
    for i in range(out.shape[-1]):
        (grad,) = torch.autograd.grad(out[:, i].sum(), x, retain_graph=True)  # (B, T, d)
        total += grad.pow(2).sum(dim=(0, 2))
    return total.sqrt()


@dataclass
class CueReport:
    """What one attention tagger does with each cue of the distance-cue task, per cue ``c1..``:
    how much weight the ambiguous word gives it, how often it wins that row, how often the word
    is tagged right, and the gradient that reaches its attention score."""

    weight: Tensor  # (n_cues,): mean weight on the cue, the head that gives it the most
    wins: Tensor  # (n_cues,): share of sentences where the cue gets the row's largest weight
    accuracy: Tensor  # (n_cues,): share of sentences whose ambiguous word is tagged right
    score_grad: Tensor  # (n_cues,): mean |dL/ds| at the cue's score, the largest over heads
    loss: Tensor  # (n_cues,): mean cross-entropy on the ambiguous word (nats)
    decoy_weight: float  # mean weight on the decoys after the word (the head that gives most)


def cue_report(model: torch.nn.Module, task: object) -> CueReport:
    r"""Break one attention tagger's behaviour on a :func:`~selfattn.book.data.tagging_task`
    down by the cue of each sentence (the tagger returns its weights with ``need_weights``).

    The score gradient is measured with autograd, through a zero ``score_bias`` added to the
    scores, for the training loss summed over the test sentences. The softmax's Jacobian says
    what to expect: with $a = \mathrm{softmax}(s)$ and $g_j = \partial L / \partial a_j$,
    $\partial L / \partial s_j = a_j (g_j - \bar g)$, $\bar g = \sum_k a_k g_k$, so a key with
    $a_j \approx 0$ gets almost no gradient, whatever $g_j$ is: a cue the model ignores stays
    ignored.
    """
    import torch.nn.functional as F

    tokens, tags = task.tokens, task.tags  # type: ignore[attr-defined]
    position, cue_at = task.position, task.cue_position  # type: ignore[attr-defined]
    n_cues = task.n_cues  # type: ignore[attr-defined]
    device = next(model.parameters()).device
    model.eval()
    N, T = tokens.shape
    H = model.attn.config.n_heads  # type: ignore[union-attr]
    bias = torch.zeros(N, H, T, T, device=device, requires_grad=True)  # (N, H, T, T)
    logits, w = model(tokens.to(device), need_weights=True, score_bias=bias)
    loss = F.cross_entropy(logits.flatten(0, 1), tags.to(device).flatten(), reduction="sum")
    (ds,) = torch.autograd.grad(loss, bias)  # (N, H, T, T): dL/ds
    rows = torch.arange(N)
    a = w.detach()[rows, :, position].cpu()  # (N, H, T): the ambiguous word's rows
    on_cue = a[rows, :, cue_at]  # (N, H)
    grad_cue = ds[rows, :, position].cpu()[rows, :, cue_at].abs()  # (N, H)
    won = a.mean(1).argmax(-1) == cue_at  # (N,)
    right = logits.detach().argmax(-1).cpu()[rows, position] == tags[rows, position]  # (N,)
    cue = tokens[rows, cue_at]  # (N,): 1..n_cues
    word_loss = F.cross_entropy(logits.detach()[rows, position].cpu(), tags[rows, position],
                                reduction="none")  # (N,)
    after = torch.arange(T) > position[:, None]  # (N, T): the words after the ambiguous one
    decoys = after & (tokens >= 1) & (tokens <= n_cues)  # (N, T)
    per_head = (a * decoys[:, None]).sum(-1).sum(0) / decoys.sum().clamp(min=1)  # (H,)
    out = {k: torch.zeros(n_cues) for k in ("weight", "wins", "accuracy", "score_grad", "loss")}
    for c in range(1, n_cues + 1):
        mine = cue == c
        out["weight"][c - 1] = on_cue[mine].mean(0).max()
        out["wins"][c - 1] = won[mine].float().mean()
        out["accuracy"][c - 1] = right[mine].float().mean()
        out["score_grad"][c - 1] = grad_cue[mine].mean(0).max()
        out["loss"][c - 1] = word_loss[mine].mean()
    return CueReport(**out, decoy_weight=per_head.max().item())


@dataclass
class RowGradients:
    """What :func:`attention_gradients` measures, one entry per row (query) unless said."""

    at_scores: Tensor  # (rows,): the norm of the gradient at each row of scores
    at_q: Tensor  # (rows,): the norm of the gradient at each query
    at_W: float  # the norm of the gradient at W^q, all rows summed
    top_weight: Tensor  # (rows,): each row's largest weight


def attention_gradients(d_k: int, scaled: bool, n_keys: int = 16, L: int = 16, batch: int = 64,
                        seed: int | None = None) -> RowGradients:
    r"""The gradient of one attention layer at its scores, its queries and $W^q$, for random
    unit-variance inputs and keys of width ``d_k``, with the scale $1/\sqrt{d_k}$ or without.

    The queries are $q = x W^q$ with $W^q$ of entries $\mathcal{N}(0, 1/d_k)$ (unit-variance
    queries at every width); the loss is the output against a fixed random upstream gradient.
    ``seed`` defaults to ``1000 + d_k``, so both arms of one width see the same numbers.
    """
    g = torch.Generator().manual_seed(1000 + d_k if seed is None else seed)
    x = torch.randn(batch, L, d_k, generator=g)  # (B, L, d_k) inputs
    W_q = (torch.randn(d_k, d_k, generator=g) / math.sqrt(d_k)).requires_grad_(True)
    k = torch.randn(batch, n_keys, d_k, generator=g)  # (B, S, d_k)
    v = torch.randn(batch, n_keys, 8, generator=g)  # (B, S, 8)
    upstream = torch.randn(batch, L, 8, generator=g)  # (B, L, 8)
    scale = 1 / math.sqrt(d_k) if scaled else 1.0
    q = x @ W_q  # (B, L, d_k)
    scores = q @ k.transpose(-2, -1) * scale  # (B, L, S)
    weights = torch.softmax(scores, dim=-1)  # (B, L, S)
    out = weights @ v  # (B, L, 8)
    at_scores, at_q, at_W = torch.autograd.grad((out * upstream).sum(), [scores, q, W_q])
    return RowGradients(at_scores.norm(dim=-1).flatten(), at_q.norm(dim=-1).flatten(),
                        at_W.norm().item(), weights.max(-1).values.detach().flatten())


def top_share(norms: Tensor, fraction: float = 0.05) -> float:
    """The share of ``sum(norms**2)`` that the largest ``fraction`` of the entries carry
    (at least one entry): how concentrated a gradient is over its rows."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    squared = norms.detach().flatten().double().pow(2).sort(descending=True).values
    top = max(1, round(fraction * len(squared)))
    return (squared[:top].sum() / squared.sum()).item()


def median_top_weight(d_k: int, n_keys: int, scaled: bool = False, n_rows: int = 10_000,
                      seed: int = 0) -> float:
    r"""The median, over ``n_rows`` random rows, of a row's largest softmax weight: one
    unit-variance query of width ``d_k`` against ``n_keys`` unit-variance keys.

    For a fixed query $q$ and keys of independent $\mathcal{N}(0, 1)$ entries, the scores
    $q \cdot k_j$ are independent $\mathcal{N}(0, |q|^2)$: they are drawn that way, as $|q|$
    times standard normals, so no ``(n_rows, n_keys, d_k)`` tensor of keys is ever held.
    """
    g = torch.Generator().manual_seed(seed)
    length = torch.randn(n_rows, d_k, generator=g, dtype=torch.float64).norm(dim=-1)  # (N,)
    z = torch.randn(n_rows, n_keys, generator=g, dtype=torch.float64)  # (N, S)
    scores = length[:, None] * z  # (N, S): q . k_j for every key
    if scaled:
        scores = scores / math.sqrt(d_k)
    return torch.softmax(scores, dim=-1).max(-1).values.median().item()


@dataclass
class CueGradients:
    """What :func:`cue_gradients` measures: one entry per sentence, the row of its ambiguous
    word."""

    cue: Tensor  # (N,): which cue word decides (1 .. n_cues)
    correct: Tensor  # (N,) bool: was the ambiguous word tagged right?
    top_weight: Tensor  # (N,): the row's largest weight
    cue_weight: Tensor  # (N,): a_j, the weight the row puts on the cue
    cue_grad: Tensor  # (N,): dL/ds_j, the gradient at the cue's score (the sentence's loss)
    all_grad: float  # the sum of |dL/ds| over every score (every row, every key)
    score_weight_grad: float  # the norm of the mean loss's gradient at W^q and W^k together


def cue_gradients(model: torch.nn.Module, data) -> CueGradients:
    r"""For a one-head tagger (``models.AttentionTagger(scorer=...)``, a dot-product scorer) on
    a tagging task: the ambiguous word's weight on its cue and the gradient at that score.

    The loss of each sentence is its mean cross-entropy over its tokens, so ``cue_grad`` does
    not depend on how many sentences are measured; ``score_weight_grad`` is measured on the mean
    over sentences (the training loss). By the softmax's Jacobian,
    $\partial L / \partial s_j = a_j (g_j - \bar g)$ with $g_j = \partial L / \partial a_j$.
    """
    import torch.nn.functional as F

    attn = model.attn
    device = next(model.parameters()).device
    kept: dict[str, Tensor] = {}
    score = attn.score

    def keep(x: Tensor) -> Tensor:
        scores = score(x)  # (N, T, T)
        scores.retain_grad()
        kept["scores"] = scores
        return scores

    was_training = model.training
    model.eval()
    model.zero_grad()
    attn.score = keep  # the instance attribute shadows the method while we measure
    try:
        tokens, tags = data.tokens.to(device), data.tags.to(device)
        logits, weights = model(tokens, need_weights=True)  # (N, T, C), (N, 1, T, T)
        per_token = F.cross_entropy(logits.flatten(0, 1), tags.flatten(), reduction="none")
        per_sentence = per_token.view(tags.shape).mean(-1)  # (N,)
        per_sentence.sum().backward()
    finally:
        del attn.score
        model.train(was_training)
    n = len(data)
    rows, pos = torch.arange(n), data.position.to(device)
    cue_pos = pos - data.distance.to(device)
    row = weights[rows, 0, pos].detach()  # (N, T): what the ambiguous word attends to
    at_scores = kept["scores"].grad  # (N, T, T)
    cue_grad = at_scores[rows, pos, cue_pos]  # (N,)
    grads = [p.grad.flatten() for p in (attn.q_proj.weight, attn.k_proj.weight)]
    predicted = logits.argmax(-1)[rows, pos]
    result = CueGradients(
        cue=data.tokens[rows.cpu(), cue_pos.cpu()],
        correct=(predicted == tags[rows, pos]).cpu(),
        top_weight=row.max(-1).values.cpu(),
        cue_weight=row[rows, cue_pos].cpu(),
        cue_grad=cue_grad.detach().cpu(),
        all_grad=at_scores.abs().sum().item(),
        score_weight_grad=(torch.cat(grads).norm() / n).item(),
    )
    model.zero_grad()
    return result


def profiled_ops(fn: Callable[[], object]) -> Counter[str]:
    """Every ``aten`` operation ``torch.profiler`` records while ``fn()`` runs, by name, the ones
    inside a composite C++ operation included. :func:`op_counts` sees such an operation as one
    call (``_native_multi_head_attention``, ``nn.MultiheadAttention``'s inference fast path);
    this shows what it runs inside (its matrix products and softmax)."""
    from torch.profiler import profile

    # the profiler's C++ side logs a line to stderr when it starts and stops; a notebook would
    # show both under the cell, so stderr is pointed at /dev/null meanwhile (Python's own
    # exceptions are not written there: they still reach the caller)
    stderr, quiet = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 2)
    try:
        with profile() as prof:
            fn()
    finally:
        os.dup2(stderr, 2)
        os.close(stderr)
        os.close(quiet)
    return Counter(e.name.removeprefix("aten::") for e in prof.events()
                   if e.name.startswith("aten::"))


def seed_rows(results: dict[str, list[float]], seeds: Sequence[int], what: str = "accuracy",
              fmt: str = "{:.1%}") -> str:
    """One row per seed, one column per arm, then each arm's mean and lowest..highest: the
    per-seed values of :func:`~selfattn.book.train.seed_table`, turned so that ten or more
    seeds fit the page's width."""
    seeds = list(seeds)
    if any(len(v) != len(seeds) for v in results.values()):
        raise ValueError(f"one value per seed: {len(seeds)} seeds, arms have "
                         f"{[len(v) for v in results.values()]}")
    def show(x: float) -> str:  # a value that rounds to zero prints as zero, never "-0%"
        return fmt.format(0.0) if fmt.format(abs(x)) == fmt.format(0.0) else fmt.format(x)

    width = {arm: max(len(arm), len(fmt.format(1.0)) * 2 + 2) for arm in results}
    sw = max([4, *(len(str(s)) for s in seeds)])  # the seed column fits the widest seed
    lines = [f"{what}, over {len(seeds)} seeds:",
             f"{'seed':<{sw}s}  " + "  ".join(f"{arm:>{width[arm]}s}" for arm in results)]
    for i, seed in enumerate(seeds):
        lines.append(f"{seed:<{sw}d}  " + "  ".join(f"{show(v[i]):>{width[arm]}s}"
                                                  for arm, v in results.items()))
    means = [show(sum(v) / len(v)) for v in results.values()]
    spans = [f"{show(min(v))}..{show(max(v))}" for v in results.values()]
    for label, row in (("mean", means), ("span", spans)):
        lines.append(f"{label:<{sw}s}  " + "  ".join(f"{m:>{width[a]}s}"
                                                     for m, a in zip(row, results, strict=True)))
    return "\n".join(lines)


def cue_weights(weights: Tensor, tokens: Tensor, n_cues: int, beyond: int, first_query: int = 0
                ) -> dict[str, float]:
    """Where the attention of a ``recent_cue_task`` model goes (chapter 5): the mean, over heads
    and over queries ``first_query`` onwards, of the weight on

    * ``"latest cue"``: the most recent cue at or before the query (the one its tag names);
    * ``"old cues beyond"``: the other cues at least ``beyond`` tokens back;
    * ``"fillers beyond"``: the fillers at least ``beyond`` tokens back;

    and ``"cue / filler, per key"``: the weight one old cue that far back gets, over the weight
    one filler that far back gets. ``weights`` ``(B, H, L, L)``, ``tokens`` ``(B, L)``; tokens
    ``1..n_cues`` are the cues. Queries with no cue yet count only in the last three.
    """
    w, is_cue, latest, i = _cue_view(weights, tokens, n_cues, first_query)
    has_cue = latest >= 0  # (B, Q)
    on_latest = w.gather(2, latest.clamp(min=0)[..., None])[..., 0]  # (B, Q)
    far = (i[first_query:, None] - i[None, :]) >= beyond  # (Q, L)
    old_cue = far & is_cue[:, None, :] & (i != latest[..., None])  # (B, Q, L)
    filler = far & ~is_cue[:, None, :]  # (B, Q, L)
    n_queries = w.shape[0] * w.shape[1]
    on_old = (w * old_cue).sum().item() / n_queries
    on_filler = (w * filler).sum().item() / n_queries
    per_old = on_old / max(old_cue.sum().item() / n_queries, 1e-12)
    per_filler = on_filler / max(filler.sum().item() / n_queries, 1e-12)
    return {
        "latest cue": (on_latest * has_cue).sum().item() / max(has_cue.sum().item(), 1),
        "old cues beyond": on_old,
        "fillers beyond": on_filler,
        "cue / filler, per key": per_old / max(per_filler, 1e-12),
    }


def order_blind_by_position(tokens: Tensor, n_cues: int) -> Tensor:
    """The chance, token by token, that the best order-blind tagger of a ``recent_cue_task``
    (:func:`selfattn.book.data.order_blind_accuracy`, its mean) tags it right: 1 for a cue and
    before the first cue, else (count of the most frequent cue so far) / (cues so far).
    ``tokens`` ``(B, L)``; returns ``(B, L)``, so a chapter can take the ceiling of any span.
    """
    is_cue = (tokens >= 1) & (tokens <= n_cues)  # (B, L)
    counts = torch.stack([(tokens == c).cumsum(1) for c in range(1, n_cues + 1)])  # (C, B, L)
    seen, best = counts.sum(0), counts.max(0).values  # (B, L) each
    return torch.where(is_cue | (seen == 0), 1.0, best / seen.clamp(min=1))


def cue_masks(tokens: Tensor, n_cues: int, beyond: int) -> dict[str, Tensor]:
    """Attention masks (``True`` = may attend, causal) for a ``recent_cue_task`` batch that hide
    keys at least ``beyond`` tokens back (chapter 5): ``"band"`` hides all of them, ``"hide far
    old cues"`` only the cues among them (never the query's latest cue), ``"hide far fillers"``
    only the fillers. ``tokens`` ``(B, L)``; each mask ``(B, L, L)``, ``[b, query, key]``.
    """
    B, L = tokens.shape
    i = torch.arange(L, device=tokens.device)
    offset = i[:, None] - i[None, :]  # (L, L): query minus key
    causal, far = offset >= 0, offset >= beyond  # (L, L) each
    is_cue = (tokens >= 1) & (tokens <= n_cues)  # (B, L)
    latest = torch.where(is_cue, i, -1).cummax(1).values  # (B, L): per query
    old_cue = far & is_cue[:, None, :] & (i[None, None, :] != latest[:, :, None])  # (B, L, L)
    filler = far & ~is_cue[:, None, :]  # (B, L, L)
    return {
        "band": (causal & ~far).expand(B, L, L),
        "hide far old cues": causal & ~old_cue,
        "hide far fillers": causal & ~filler,
    }


def old_cue_ratio_by_offset(weights: Tensor, tokens: Tensor, n_cues: int, bin_width: int,
                            first_query: int = 0) -> Tensor:
    """How a ``recent_cue_task`` model weighs one old cue against the latest cue, by how far
    back the old cue is (chapter 5). For queries ``first_query`` onwards, with a cue before
    them: the head-averaged weight on each older cue over the weight on the latest cue, and
    the median of that ratio over every (query, old cue) pair whose offset falls in each bin
    ``[0, bin_width), [bin_width, 2 bin_width), ...``. Above 1: that old cue outweighs the
    latest. ``weights`` ``(B, H, L, L)``, ``tokens`` ``(B, L)``; returns ``(L // bin_width,)``,
    NaN for a bin with no pair.
    """
    w, is_cue, latest, i = _cue_view(weights, tokens, n_cues, first_query)
    on_latest = w.gather(2, latest.clamp(min=0)[..., None])  # (B, Q, 1)
    ratio = w / on_latest.clamp_min(1e-30)  # (B, Q, L)
    offset = (i[first_query:, None] - i[None, :]).expand_as(ratio)  # (B, Q, L)
    old = is_cue[:, None, :] & (i != latest[..., None]) & (offset >= 0) & (latest[..., None] >= 0)
    values, which = ratio[old], offset[old] // bin_width  # (pairs,) each: ratio and its bin
    out = []
    for b in range(len(i) // bin_width):
        in_bin = values[which == b]
        out.append(in_bin.median().item() if len(in_bin) else float("nan"))
    return torch.tensor(out)


def query_gradient_ratio(d_k: int, n_draws: int = 5) -> float:
    """The typical query's gradient with the scale over without it (the ratio of the medians of
    :func:`attention_gradients`' ``at_q``), as the median over ``n_draws`` independent draws:
    one draw's ratio near the crossover depends on the draw, the median much less. The first
    draw is :func:`attention_gradients`' default one."""
    if n_draws < 1:
        raise ValueError(f"n_draws must be at least 1, got {n_draws}")
    ratios = []
    for i in range(n_draws):
        seed = 1000 + d_k + 100_003 * i
        scaled = attention_gradients(d_k, True, seed=seed)
        unscaled = attention_gradients(d_k, False, seed=seed)
        ratios.append((scaled.at_q.median() / unscaled.at_q.median()).item())
    return float(torch.tensor(ratios).median())


def fisher_exact(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    """Two-sided Fisher exact test on two counts, ``k_a`` of ``n_a`` against ``k_b`` of
    ``n_b``: the chance, if both arms had the same rate, of a table at most as likely as this
    one given the margins (Fisher 1935). Small values: the counts differ more than chance
    explains."""
    if not (0 <= k_a <= n_a and 0 <= k_b <= n_b) or n_a + n_b == 0:
        raise ValueError(f"need 0 <= k <= n for both arms, got {k_a}/{n_a} and {k_b}/{n_b}")
    total = k_a + k_b

    def p(x: int) -> float:  # hypergeometric: x of the successes in arm a
        return math.comb(n_a, x) * math.comb(n_b, total - x) / math.comb(n_a + n_b, total)

    seen = p(k_a)
    lo, hi = max(0, total - n_b), min(total, n_a)
    return min(1.0, sum(p(x) for x in range(lo, hi + 1) if p(x) <= seen * (1 + 1e-9)))


def default_sense(model: torch.nn.Module, task: object, filler: int | None = None) -> Tensor:
    """The sense a tagger gives the ambiguous word of a
    :func:`~selfattn.book.data.tagging_task` when its cue is gone: the cue of every sentence is
    replaced by a filler word (``filler``, default the first one, ``n_cues + 1``) and the share
    of sentences in which the word gets each sense is returned, ``(n_cues,)``. A tagger that
    tells one cue by elimination ("none of the others") gives that cue's sense here; any
    classifier falls back to some default when its evidence is removed, so read it against the
    cue the tagger ignores."""
    tokens, position = task.tokens.clone(), task.position  # type: ignore[attr-defined]
    cue_at, n_cues = task.cue_position, task.n_cues  # type: ignore[attr-defined]
    rows = torch.arange(len(tokens))
    tokens[rows, cue_at] = n_cues + 1 if filler is None else filler  # (N, T): no cue left
    device = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        guess = model(tokens.to(device)).argmax(-1).cpu()[rows, position]  # (N,)
    return torch.stack([(guess == c).float().mean() for c in range(n_cues)])


def _cue_view(weights: Tensor, tokens: Tensor, n_cues: int, first_query: int
              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """What :func:`cue_weights` and :func:`old_cue_ratio_by_offset` read of a ``recent_cue_task``
    batch: the head-averaged weights of queries ``first_query`` on ``(B, Q, L)``, which tokens are
    cues ``(B, L)``, each query's latest cue at or before it ``(B, Q)`` (-1: none yet), and the
    positions ``(L,)``. Checks that ``weights`` ``(B, H, L, L)`` and ``tokens`` ``(B, L)`` match."""
    B, _, L, S = weights.shape
    if tokens.shape != (B, L) or S != L:
        raise ValueError(f"weights (B, H, L, L) and tokens (B, L) must match, got "
                         f"{tuple(weights.shape)} and {tuple(tokens.shape)}")
    w = weights.detach().float().cpu().mean(1)[:, first_query:]  # (B, Q, L): over heads
    tokens = tokens.cpu()
    i = torch.arange(L)
    is_cue = (tokens >= 1) & (tokens <= n_cues)  # (B, L)
    latest = torch.where(is_cue, i, -1).cummax(1).values[:, first_query:]  # (B, Q)
    return w, is_cue, latest, i


# --- decoding in practice: attention sinks and a sliding-window cache ------------------------

SINK_SHARE = 0.3
"""Gu et al. (2024, "When Attention Sink Emerges in Language Models: An Empirical View", their
sink metric) count a head as a sink when its mean weight on the first token exceeds this share."""


@torch.no_grad()
def cache_accuracy(model: torch.nn.Module, data, mask: Tensor, first_query: int = 0
                   ) -> dict[str, float]:
    r"""The accuracy of a causal tagger (``AttentionTagger(..., causal=True)``) on ``data`` (a
    :func:`~selfattn.book.data.sink_task` batch) when each query sees only the keys its KV cache
    still holds, over the queries ``first_query`` onwards.

    ``mask``: bool ``(T, T)``, True = the key is still in the cache, from
    :func:`selfattn.causal_mask` (``causal_mask(T)`` the full cache, ``causal_mask(T,
    window=w)`` window attention with the first tokens evicted, ``causal_mask(T, window=w,
    n_sink=s)`` StreamingLLM's cache: the first ``s`` tokens kept beside the window; Xiao et al.
    2023, "Efficient Streaming Language Models with Attention Sinks", §3.1-3.2, Figure 1). A
    key out of the cache gets score $-\infty$:

    $$\mathrm{acc} = \frac{1}{|Q|} \sum_{(b, t) \in Q} \big[\arg\max_c f(x_b;\, M)_{t, c} =
    y_{b, t}\big], \qquad a_{tj} = \operatorname{softmax}_j\big(s_{tj} + (0 \text{ if } M_{tj}
    \text{ else } -\infty)\big)$$

    With RoPE a score depends only on the distance between query and key, so masking a key out
    is evicting it from the cache, every other token keeping its position. Returns the accuracy
    over ``"all"`` those queries, the ``"trigger"`` queries and the ``"other"`` ones
    (``data.trigger``); NaN for a group with no query.
    """
    from ..masks import to_additive
    from .data import SinkData

    if not isinstance(data, SinkData):
        raise TypeError(f"data must be a SinkData (from sink_task), got {type(data).__name__}")
    T = data.tokens.shape[1]
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != (T, T):
        shown = (f"{mask.dtype} of shape {tuple(mask.shape)}" if isinstance(mask, Tensor)
                 else type(mask).__name__)
        raise ValueError(f"mask must be a bool ({T}, {T}) tensor, True = kept (from "
                         f"selfattn.causal_mask({T}, window=..., n_sink=...)), got {shown}")
    _check_first_query(first_query, T)
    model.eval()
    device = next(model.parameters()).device
    logits = model(data.tokens.to(device), score_bias=to_additive(mask.to(device)))  # (B, T, n_tags)
    right = (logits.argmax(-1).cpu() == data.tags)[:, first_query:]  # (B, Q)
    trigger = data.trigger[:, first_query:]  # (B, Q)
    return {"all": _mean(right), "trigger": _mean(right[trigger]), "other": _mean(right[~trigger])}


def _mean(right: Tensor) -> float:
    return right.float().mean().item() if right.numel() else float("nan")


def _check_first_query(first_query: int, T: int) -> None:
    if isinstance(first_query, bool) or not isinstance(first_query, int) \
            or not 0 <= first_query < T:
        raise ValueError(f"first_query must be an int in [0, {T}), got {first_query!r}")


def first_token_share(weights: Tensor, first_query: int = 0, where: Tensor | None = None) -> Tensor:
    r"""``(H,)``: the mean weight each head puts on position 0 (the attention sink), over the
    queries at ``first_query`` onwards of every sequence, only those where ``where`` (bool
    ``(B, T)``) is True if given. ``weights``: ``(B, H, T, S)``, each query's weights over the keys.

    $$\text{share}_h = \frac{1}{|Q|} \sum_{(b, t) \in Q} a^{(h)}_{b, t, 0}$$

    Gu et al. (2024, "When Attention Sink Emerges in Language Models: An Empirical View", their
    sink metric) count a head as a sink when this share exceeds :data:`SINK_SHARE`. A head that spread its
    weight evenly over the keys up to each query would put ``1 / (t + 1)`` on position 0.
    """
    if not isinstance(weights, Tensor) or weights.dim() != 4:
        shown = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
        raise ValueError(f"weights must be a (B, H, T, S) tensor, got {shown}")
    B, T = weights.shape[0], weights.shape[2]
    _check_first_query(first_query, T)
    on_first = weights[:, :, first_query:, 0]  # (B, H, Q)
    chosen = torch.ones(B, T - first_query, dtype=torch.bool, device=weights.device)  # (B, Q)
    if where is not None:
        if not isinstance(where, Tensor) or where.dtype != torch.bool or where.shape != (B, T):
            shown = (f"{where.dtype} of shape {tuple(where.shape)}" if isinstance(where, Tensor)
                     else type(where).__name__)
            raise ValueError(f"where must be a bool (B, T) = {(B, T)} tensor, got {shown}")
        chosen = where[:, first_query:].to(weights.device)  # (B, Q)
    n = chosen.sum()
    if n == 0:
        raise ValueError("no query left to average over: where is False at every query from "
                         f"first_query={first_query} on")
    return (on_first * chosen[:, None, :]).sum(dim=(0, 2)) / n  # (H,)


@dataclass(frozen=True)
class SinkEval:
    """What evicting the first tokens does to one trained model (:func:`evaluate_sink`), over
    the queries ``window`` onwards (the first whose window leaves position 0 out).

    ``full``, ``window_only``, ``sink_window``: accuracy (``"all"``, ``"trigger"``, ``"other"``, as in
    :func:`cache_accuracy`) with the full cache, with the last ``window`` tokens only, and with
    the first ``n_sink`` tokens kept beside them. ``share_other``, ``share_trigger``: each head's
    mean weight on position 0 with the full cache (:func:`first_token_share`), on the queries
    that have nothing to fetch and on the triggers. ``share_uniform``: what a head that spread
    its weight evenly would put there, ``mean_t 1 / (t + 1)``.
    """

    window: int
    n_sink: int
    full: dict[str, float]
    window_only: dict[str, float]
    sink_window: dict[str, float]
    share_other: tuple[float, ...]
    share_trigger: tuple[float, ...]
    share_uniform: float

    @property
    def drop(self) -> float:
        """How much accuracy evicting the first tokens costs: full cache minus window only."""
        return self.full["all"] - self.window_only["all"]

    @property
    def gap(self) -> float:
        """How far sink + window stays from the full cache: full minus sink + window."""
        return self.full["all"] - self.sink_window["all"]

    @property
    def top_share(self) -> float:
        """The largest share on position 0 of any head, on the queries with nothing to fetch."""
        return max(self.share_other)

    @property
    def sink_heads(self) -> int:
        """Heads whose share on position 0, on the queries with nothing to fetch, exceeds
        :data:`SINK_SHARE`."""
        return sum(s > SINK_SHARE for s in self.share_other)


@dataclass(frozen=True)
class SinkRecord(SinkEval):
    """One seed of :func:`sink_experiment`: its :class:`SinkEval`, and the ``seed``, the arm
    (``bos``), the mean training ``loss`` over its last 20 steps, the trained ``model`` and the
    ``test`` data it was measured on (to measure it again, at another window, say)."""

    seed: int
    bos: bool
    loss: float
    model: torch.nn.Module = field(repr=False, compare=False)
    test: object = field(repr=False, compare=False)


def _check_window(window: int, n_sink: int, lag: int, T: int) -> None:
    if isinstance(window, bool) or not isinstance(window, int) or not lag < window < T:
        raise ValueError(f"window must be an int with lag < window < seq_len ({lag} < window < "
                         f"{T}): it must hold the token a trigger copies, and leave some out; "
                         f"got window={window!r}")
    if isinstance(n_sink, bool) or not isinstance(n_sink, int) or n_sink < 1:
        raise ValueError(f"n_sink must be an int >= 1 (the first tokens kept beside the window), "
                         f"got {n_sink!r}")


@torch.no_grad()
def evaluate_sink(model: torch.nn.Module, test, window: int, n_sink: int = 1) -> SinkEval:
    """Measure one causal tagger trained on :func:`~selfattn.book.data.sink_task`: its accuracy
    with the full cache, with a window of the last ``window`` tokens (the first tokens
    evicted), and with the first ``n_sink`` tokens kept beside the window (Xiao et al. 2023,
    §3.2), over the queries ``window`` onwards, where the three caches differ; and each head's
    share of attention on position 0 with the full cache. See :class:`SinkEval`.

    Every token keeps its position (a RoPE score sees only the distance), the sink included.
    StreamingLLM numbers the tokens by their place in the cache instead, to stream past the
    length the model was trained on; within that length the window's distances are the same
    both ways, the sink's are not.
    """
    from ..masks import causal_mask
    from .data import SinkData

    if not isinstance(test, SinkData):
        raise TypeError(f"test must be a SinkData (from sink_task), got {type(test).__name__}")
    T = test.tokens.shape[1]
    _check_window(window, n_sink, test.lag, T)
    first = window  # the first query whose window leaves position 0 out
    caches = {"full": causal_mask(T), "window_only": causal_mask(T, window=window),
              "sink_window": causal_mask(T, window=window, n_sink=n_sink)}
    accuracy = {name: cache_accuracy(model, test, mask, first) for name, mask in caches.items()}
    device = next(model.parameters()).device
    _, weights = model(test.tokens.to(device), need_weights=True)  # (B, H, T, T)
    weights = weights.cpu()
    other = first_token_share(weights, first, ~test.trigger)  # (H,)
    trigger = first_token_share(weights, first, test.trigger)  # (H,)
    uniform = (1 / torch.arange(first + 1, T + 1, dtype=torch.float64)).mean().item()
    return SinkEval(window, n_sink, **accuracy, share_other=tuple(other.tolist()),
                    share_trigger=tuple(trigger.tolist()), share_uniform=uniform)


def sink_experiment(seeds: Sequence[int], data_seeds: tuple[int, int], *, window: int = 6,
                    n_sink: int = 1, seq_len: int = 32, vocab_size: int = 16, n_triggers: int = 6,
                    lag: int = 2, n_train: int = 2000, n_test: int = 500, d: int = 32,
                    n_heads: int = 2, steps: int = 250, batch_size: int = 16, lr: float = 1e-2,
                    progress: bool = True) -> dict[str, list[SinkRecord]]:
    """Do heads with nothing to do park on the first token, and what does evicting it do?

    Trains one one-layer causal ``AttentionTagger`` (RoPE, ``n_heads`` heads of width
    ``d // n_heads``) per seed on :func:`~selfattn.book.data.sink_task`, side by side with
    :func:`~selfattn.book.train.train_seeds`, in two arms: ``"BOS"``, every sequence opening
    with the BOS token, and ``"control"``, the same sequences with an ordinary token at
    position 0 (``bos=False``). Then measures each model with :func:`evaluate_sink`: the full
    cache, window only, and sink + window.

    The hypothesis (Xiao et al. 2023, §3.1; Guo et al. 2024, §2): a head with nothing to fetch
    (every query but a trigger) puts its weight on BOS, whose value the rest of the model has
    learned to live with (Guo et al. find it small, a "value-state drain"); evict BOS and that
    weight lands on the tokens in the window, whose values were never meant to be added there,
    and the tags change (window only drops) though every token a tag depends on is still in the
    window (``window > lag``); keep BOS beside the window and the outputs come back (sink +
    window close to full). In the control nothing marks position 0 (RoPE scores see only
    distances, and the token there is an ordinary one), so no head can park there: evicting it
    should cost little. Whether it happens is for the records to say, seed by seed.

    ``seeds``: the initial weights and batches (``train.seed_range(10)`` in a chapter);
    ``data_seeds``: ``(training data, test data)`` (``train.data_seed(0)``,
    ``train.data_seed(1)``). Both arms train on the same seeds and data seeds. With the defaults,
    both arms' ten seeds train in about ten seconds on one CPU thread, and every seed of both
    arms learns the task with the full cache (on the ranges tried when they were chosen).

    Returns ``{"BOS": [...], "control": [...]}``, one :class:`SinkRecord` per seed in the order
    of ``seeds``; :func:`sink_columns` turns an arm into columns for :func:`seed_rows`.
    """
    from ..checks import check_positive_int
    from .data import sink_task
    from .models import AttentionTagger
    from .train import train_seeds

    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    if (not isinstance(data_seeds, tuple | list) or len(data_seeds) != 2
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in data_seeds)):
        raise ValueError(f"data_seeds must be two ints, (training data, test data), got "
                         f"{data_seeds!r}")
    if data_seeds[0] == data_seeds[1]:
        raise ValueError(f"data_seeds {tuple(data_seeds)}: the test data must be another draw "
                         "than the training data")
    check_positive_int(seq_len, "seq_len")
    if isinstance(lag, bool) or not isinstance(lag, int) or not 1 <= lag < seq_len:
        raise ValueError(f"need 1 <= lag < seq_len, got lag={lag!r}, seq_len={seq_len}")
    _check_window(window, n_sink, lag, seq_len)  # before training, not after
    task = dict(seq_len=seq_len, vocab_size=vocab_size, n_triggers=n_triggers, lag=lag)
    results = {}
    for arm, bos in (("BOS", True), ("control", False)):
        train_data = sink_task(n_train, **task, bos=bos, seed=data_seeds[0])
        test = sink_task(n_test, **task, bos=bos, seed=data_seeds[1])

        def make(data=train_data) -> torch.nn.Module:
            return AttentionTagger(data.vocab_size, data.n_tags, d=d, n_heads=n_heads,
                                   causal=True, positions="rope")

        models, histories = train_seeds(make, train_data, seeds, steps=steps,
                                        batch_size=batch_size, lr=lr, progress=progress,
                                        desc=f"sink task, {arm}")
        results[arm] = [
            SinkRecord(**vars(evaluate_sink(model, test, window, n_sink)), seed=seed, bos=bos,
                       loss=statistics.fmean(history.loss[-20:]), model=model, test=test)
            for model, history, seed in zip(models, histories, seeds, strict=True)]
    return results


def sink_columns(records: Sequence[SinkEval]) -> dict[str, list[float]]:
    """One arm of :func:`sink_experiment` as columns for :func:`seed_rows` (or
    :func:`~selfattn.book.train.seed_table`): the accuracy with the full cache, window only and
    sink + window, and the top head's share on position 0 on the queries with nothing to fetch,
    beside what an even spread would give."""
    if not records:
        raise ValueError("records must hold at least one record")
    return {"full cache": [r.full["all"] for r in records],
            "window only": [r.window_only["all"] for r in records],
            "sink+window": [r.sink_window["all"] for r in records],
            "top share": [r.top_share for r in records],
            "even share": [r.share_uniform for r in records]}
