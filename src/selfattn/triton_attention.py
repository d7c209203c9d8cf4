r"""Tiled attention as a GPU kernel, written in Triton: :func:`triton_attention`.

:func:`selfattn.tiled_attention` is the algorithm as a loop of PyTorch operations, each tile a
few separate passes over memory. This is the same algorithm as one fused kernel, in the form of
FlashAttention-2 (Dao 2023, §3.1, Algorithm 1) and Triton's fused-attention tutorial: each
*program* (one instance of the kernel, run in parallel with the others) takes one block of
``BLOCK_M`` queries of one (batch, head) and walks the key blocks with an online softmax, the
running maximum $m$, sum $\ell$ and unnormalised output kept on chip, dividing once at the end:

$$m^{(j)} = \max(m^{(j-1)}, \operatorname{rowmax} S^{(j)}), \quad
\ell^{(j)} = e^{m^{(j-1)} - m^{(j)}} \ell^{(j-1)} + \operatorname{rowsum} e^{S^{(j)} - m^{(j)}}, \quad
O^{(j)} = e^{m^{(j-1)} - m^{(j)}} O^{(j-1)} + e^{S^{(j)} - m^{(j)}} V^{(j)}.$$

It computes $e^x$ as $2^{x \log_2 e}$ (``exp2``, one instruction on a GPU). With ``is_causal``
the key loop stops at the diagonal, so the tiles above it are never loaded. Loads are masked, so
the lengths and the head size need not be multiples of a block (the head size is padded to a
power of two, at least 16, the smallest ``tl.dot`` takes). It writes each row's log-sum-exp,
and the backward pass recomputes every tile from it in PyTorch
(:func:`selfattn.tiled.tiled_backward`, FlashAttention-2's Algorithm 2), so training keeps
$O(L + S)$ memory as well.

Block sizes are fixed per GPU, not autotuned (every configuration tried costs a compile):
on compute capability below 8.0 (a T4 is 7.5) ``tl.dot`` has no tensor cores in Triton 3.2 and
later and large tiles spill registers, so the tiles are 32 x 16; from 8.0 on, 128 x 64 in half
precision (:func:`config_for`). Float32 is multiplied in full float32, not TF32.

Needs a CUDA GPU, or Triton's interpreter on CPU tensors: set ``TRITON_INTERPRET=1`` before
anything imports ``triton`` (``tests/test_triton.py`` does; the interpreter runs each program one
after the other, in numpy, for checking, not for speed). ``import selfattn`` does not import this
module, and no layer routes to it: it is called as a function (chapter 9 and
``selfattn.book.performance.gpu_kernels`` do).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from .tiled import tiled_backward

ASKED_TO_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

LOG2_E = 1.4426950408889634  # e^x = 2^(x log2 e)
DOT_PRECISION = "ieee"
"""How ``tl.dot`` multiplies float32: in full float32. From compute capability 8.0 Triton's
default is TF32 (10-bit mantissas), which SDPA's float32 kernels do not use."""


@triton.jit
def _forward_kernel(Q, K, V, O, LSE,
                    sqb, sqh, sqm, sqe, skb, skh, skn, ske,  # strides of Q and K
                    svb, svh, svn, sve, sob, soh, som, soe,  # ... of V and O
                    H, L, S, E, EV, qk_scale, IS_CAUSAL: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_E: tl.constexpr, BLOCK_EV: tl.constexpr, DOT: tl.constexpr):
    start = tl.program_id(0) * BLOCK_M  # this program's block of queries ...
    b, h = tl.program_id(1) // H, tl.program_id(1) % H  # ... of one (batch, head)
    rows = start + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    cols = tl.arange(0, BLOCK_N)  # (BLOCK_N,): shifted to each key block below
    e, ev = tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_EV)
    Q += b * sqb + h * sqh
    K += b * skb + h * skh
    V += b * svb + h * svh
    q = tl.load(Q + rows[:, None] * sqm + e[None, :] * sqe,  # (BM, BE)
                mask=(rows[:, None] < L) & (e[None, :] < E), other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max, in log2 units
    l = tl.zeros([BLOCK_M], tl.float32)  # running sum of 2^(s - m)
    acc = tl.zeros([BLOCK_M, BLOCK_EV], tl.float32)  # the output, not divided by l
    end = tl.minimum(start + BLOCK_M, S) if IS_CAUSAL else S  # causal: to diagonal
    for j in range(0, end, BLOCK_N):
        keys = j + cols
        kt = tl.load(K + keys[None, :] * skn + e[:, None] * ske,  # (BE, BN): Kᵀ
                     mask=(keys[None, :] < S) & (e[:, None] < E), other=0.0)
        s = tl.dot(q, kt, input_precision=DOT) * qk_scale  # (BM, BN): scale*log2(e)
        keep = keys[None, :] < S  # padded keys do not count
        if IS_CAUSAL:
            keep = keep & (keys[None, :] <= rows[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))  # (BM,)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: no NaN
        alpha = tl.exp2(m - m_ref)  # (BM,): rescales what came before
        p = tl.exp2(s - m_ref[:, None])  # (BM, BN)
        l = alpha * l + tl.sum(p, 1)
        v = tl.load(V + keys[:, None] * svn + ev[None, :] * sve,  # (BN, BEV)
                    mask=(keys[:, None] < S) & (ev[None, :] < EV), other=0.0)
        acc = alpha[:, None] * acc + tl.dot(p.to(v.dtype), v, input_precision=DOT)
        m = m_new
    dead = l == 0.0  # every key masked: output 0, log-sum-exp +inf
    out = acc / tl.where(dead, 1.0, l)[:, None]
    lse = (m + tl.log2(tl.where(dead, 1.0, l))) / 1.4426950408889634  # natural log
    tl.store(O + b * sob + h * soh + rows[:, None] * som + ev[None, :] * soe,
             out.to(O.dtype.element_ty),
             mask=(rows[:, None] < L) & (ev[None, :] < EV))
    tl.store(LSE + tl.program_id(1) * L + rows, tl.where(dead, float("inf"), lse),
             mask=rows < L)


INTERPRETED = type(_forward_kernel).__name__ == "InterpretedFunction"
"""Whether Triton's interpreter runs the kernel. Triton decides when ``triton`` is first
imported, so ``TRITON_INTERPRET=1`` set later (after ``torch.utils.flop_counter``, which imports
triton) has no effect until the process restarts."""


@dataclass(frozen=True)
class Config:
    """One kernel launch's fixed sizes: a tile of ``block_m`` queries by ``block_n`` keys, and
    the GPU's ``num_warps`` (groups of 32 threads per program) and ``num_stages`` (loads in
    flight)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def config_for(capability: tuple[int, int] | None, head_dim: int = 64,
               dtype: torch.dtype = torch.float16) -> Config:
    """The sizes for a CUDA GPU of this compute ``capability`` (``None``: the interpreter),
    head size and dtype. Below 8.0 (a T4 is 7.5): 32 x 16 tiles, four warps, one stage (no
    asynchronous copies there): at head sizes 64 and 128, in float16, bfloat16 and float32, they
    compile without spilling registers with Triton 3.6 (what Colab pairs with torch 2.11) and
    3.7 alike, where 32 x 32 spills at head size 128 (and with 3.6 at 64 in half precision).
    From 8.0: 128 x 64 tiles, eight warps and three stages for half precision up to head size 64
    (four warps spill a few bytes with Triton 3.6); 64 x 32, eight warps and two stages for
    float32 or larger heads, whose tiles take twice the bytes. ``tests/test_triton.py`` compiles
    each for a T4 and for compute capability 8.0 and checks the shared memory and the spills;
    ``make gpu-rehearsal`` does it again with Triton 3.6 (tools/triton_aot.py). The
    interpreter: 32 x 32, so that small test inputs still span several tiles."""
    if capability is None:
        return Config(32, 32, 4, 1)
    if capability[0] < 8:
        return Config(32, 16, 4, 1)
    if dtype == torch.float32 or head_dim > 64:
        return Config(64, 32, 8, 2)
    return Config(128, 64, 8, 3)


def _config(q: Tensor) -> Config:
    capability = torch.cuda.get_device_capability(q.device) if q.device.type == "cuda" else None
    return config_for(capability, q.shape[-1], q.dtype)


def _check(query: Tensor, key: Tensor, value: Tensor) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, T, E), got shape {tuple(t.shape)}")
    if query.dtype not in (torch.float16, torch.float32, torch.bfloat16) or not (
            query.dtype == key.dtype == value.dtype):
        raise TypeError(f"query, key and value must share one dtype of float16, bfloat16 or "
                        f"float32, got {query.dtype}, {key.dtype}, {value.dtype}")
    if query.dtype == torch.bfloat16 and INTERPRETED:
        raise TypeError("bfloat16 is not supported under Triton's interpreter (its tl.dot "
                        "multiplies the raw bits): use float16 or float32, or a GPU")
    if key.shape[:2] != query.shape[:2] or value.shape[:3] != key.shape[:3]:
        raise ValueError(f"query (B, H, L, E), key (B, H, S, E) and value (B, H, S, Ev) must "
                         f"share B and H, and key and value S: got {tuple(query.shape)}, "
                         f"{tuple(key.shape)}, {tuple(value.shape)}")
    if key.shape[-1] != query.shape[-1]:
        raise ValueError(f"query and key must share a head size, got {query.shape[-1]} and "
                         f"{key.shape[-1]}")
    if not query.device == key.device == value.device:
        raise ValueError("query, key and value must be on one device")
    if query.device.type == "cpu" and not INTERPRETED:
        late = (" TRITON_INTERPRET=1 is set, but triton was imported before it was (torch's "
                "FLOP counter imports it): restart the kernel and set it first."
                if ASKED_TO_INTERPRET else "")
        raise RuntimeError("the Triton kernel runs on a CUDA GPU; on CPU tensors only under "
                           "Triton's interpreter (set TRITON_INTERPRET=1 before importing "
                           "triton). selfattn.tiled_attention is the same algorithm in PyTorch."
                           + late)


def triton_forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool,
                   scale: float) -> tuple[Tensor, Tensor]:
    """One launch of the kernel: the output ``(B, H, L, Ev)`` and each row's log-sum-exp of the
    scaled scores, ``(B, H, L, 1)`` in float32 (``+inf`` where every key is masked)."""
    B, H, L, E = q.shape
    S, Ev = k.shape[2], v.shape[3]
    out = torch.empty(B, H, L, Ev, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, H, L, dtype=torch.float32, device=q.device)
    cfg = _config(q)
    grid = (triton.cdiv(L, cfg.block_m), B * H)  # one program per block of queries and head
    _forward_kernel[grid](
        q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        H, L, S, E, Ev, scale * LOG2_E,
        IS_CAUSAL=is_causal, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_E=max(16, triton.next_power_of_2(E)), BLOCK_EV=max(16, triton.next_power_of_2(Ev)),
        DOT=DOT_PRECISION, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out, lse.unsqueeze(-1)


class _TritonAttention(torch.autograd.Function):
    """Saves the inputs, the output and the log-sum-exp; the backward recomputes each tile."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool, scale: float) -> Tensor:
        out, lse = triton_forward(q, k, v, is_causal, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = is_causal, scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        is_causal, scale = ctx.options
        g, q32, k32, v32, o = (t.float() for t in (grad_out, q, k, v, out))  # float32 sums
        dq, dk, dv, _ = tiled_backward(g, q32, k32, v32, None, o, lse, is_causal, scale,
                                       _config(q).block_m)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def triton_attention(query: Tensor, key: Tensor, value: Tensor, *, is_causal: bool = False,
                     scale: float | None = None) -> Tensor:
    r"""$\operatorname{softmax}(QK^\top \cdot \text{scale})\,V$ in one Triton kernel: ``query``
    ``(B, H, L, E)``, ``key`` ``(B, H, S, E)``, ``value`` ``(B, H, S, Ev)``, float16, bfloat16
    (on a GPU) or float32, on a CUDA GPU or under the interpreter; ``is_causal`` as in
    ``F.scaled_dot_product_attention`` (top-left). No mask tensor and no dropout: for those use
    :func:`selfattn.tiled_attention`. Returns ``(B, H, L, Ev)`` in the inputs' dtype;
    differentiable, with a backward pass that recomputes the tiles."""
    _check(query, key, value)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    out: Tensor = _TritonAttention.apply(query, key, value, bool(is_causal), scale)
    return out
