r"""The fast paths of :class:`~selfattn.MultiHeadAttention`: the same numbers, computed faster.

:func:`attend_heads` is the attention of every head of the layer. Its readable computation is
:func:`~selfattn.heads.repeat_kv` for grouped heads, then :func:`selfattn.attention.attend` when
the weights are asked for, or PyTorch's fused ``F.scaled_dot_product_attention`` when they are
not (:func:`_default`: without weights the default *is* PyTorch's kernel). A fast path computes
the same result another way, and runs only where its condition, which sees the whole call
(:class:`Call`), holds:

====================  ==========================================================================
path                  runs when ``ENABLED[path]`` and
====================  ==========================================================================
``grouped_heads``     there are more query heads than key/value heads (GQA, MQA), and
                      ``stacked_groups`` runs, or no weights are asked for and PyTorch's fused
                      kernel takes the grouped heads as they are (a CPU; on CUDA, as PyTorch's
                      own checks say)
``stacked_groups``    ``grouped_heads`` runs; one new query (decoding), with the weights asked
                      for or without a causal mask
``inplace_softmax``   the weights are asked for; on a CPU
``split_kv``          no weights; no mask, not causal, no dropout; nothing to differentiate (the
                      kernel gives no gradient for the log-sum-exp that merges the parts); on
                      a CPU; one query head per key/value head (after ``grouped_heads``); batch
                      1; at most ``SPLIT_KV_MAX_QUERIES`` queries (a group's stacked); at least
                      ``SPLIT_KV_MIN_KEYS`` keys; at least two threads per key/value head;
                      PyTorch's CPU flash kernel, with its log-sum-exp, exists
(default)             otherwise
====================  ==========================================================================

``grouped_heads`` is a step on the call, taken first: it decides how the query heads meet their
key/value head (the readable way copies the keys, :func:`~selfattn.heads.repeat_kv`), and
``stacked_groups`` is one of its two ways. Then the first kernel of :data:`KERNELS` whose
condition holds runs, else the default one:

* ``grouped_heads``: GQA and MQA without copying the keys (during decoding the copy would move
  as many bytes as MHA's whole cache). Without weights, PyTorch's kernel gets the key/value
  heads as they are, ``enable_gqa=True``, with ``is_causal`` passed on, so a causal prefill or
  training step reaches the kernel with no mask tensor and never holds an ``(L, S)`` one.
  Where the fused kernel would fall back to its math backend on grouped heads (CUDA, by
  PyTorch's version, GPU and dtype), the path does not run and the readable copy does: cheaper
  than the ``(L, S)`` scores that backend holds. With the weights and several queries, the copy
  runs too: the readable softmax then holds ``(H, L, S)`` weights, beside which the copied keys
  are small, and it measured faster than stacking the queries.
* ``stacked_groups``: one new query (decoding): the group's query heads are stacked along the
  sequence axis, ``(B, H_kv, g, hd)``, a reshape that copies nothing, and attend to their
  key/value head in one matrix product, where PyTorch's CPU kernel does one matrix-vector
  product per query head (FlashAttention-2's ``seqlenq_ngroups_swapped``). A mask is regrouped
  like the queries, a view: a padding mask is the same for every head of a group. With the
  weights, it is the only way without a copy of the keys. ``make bench`` times it against
  ``enable_gqa`` on the same step (``stacked_groups`` switched off).
* ``inplace_softmax``: the masks overwrite the scores' own buffer instead of allocating new
  ``(L, S)`` ones, and so does the softmax where there is nothing to differentiate (grad mode
  off, or no input and no mask requiring grad; autograd keeps the softmax's output for the
  backward pass). The masks are read by :func:`selfattn.attention._mask_terms`, as on the
  readable path, so they mean the same.
* ``split_kv``: decoding on a CPU with fewer (batch, key/value head) pairs than threads splits the
  cache into parts computed side by side, merged by their log-sum-exp ("flash-decoding",
  Dao et al. 2023), so MQA uses every core (:func:`decode_attention`).

Each can be switched off (:func:`disabled`), is tested equal to the readable computation with
every argument its condition reads (tests/test_fastpaths.py), and is kept only because
``make bench`` times the layer with it and without it, side by side, and the difference is worth
having (:func:`selfattn.book.performance.fastpath_benchmark`); what each call may allocate, and
what reaches PyTorch's kernel, is asserted in tests/test_costs.py. The Triton kernel
(:mod:`selfattn.triton_attention`) is not a path of this table: it is called as a function.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import _mask_terms, _weighted_sum
from .attention import attend as readable_attend
from .heads import _repeat_kv
from .masks import causal_mask

ENABLED = {"grouped_heads": True, "stacked_groups": True, "inplace_softmax": True,
           "split_kv": True}
SPLIT_KV_MIN_KEYS = 4096  # split a cache across threads from this many keys
SPLIT_KV_MAX_QUERIES = 64  # ... for at most this many queries (decoding, not a prefill)


@contextlib.contextmanager
def disabled(*names: str) -> Iterator[None]:
    """Switch fast paths off inside a ``with`` block (all of them if no name is given)."""
    unknown = set(names) - set(ENABLED)
    if unknown:
        raise ValueError(f"unknown fast paths {sorted(unknown)}; they are {sorted(ENABLED)}")
    saved = dict(ENABLED)
    ENABLED.update(dict.fromkeys(names or ENABLED, False))
    try:
        yield
    finally:
        ENABLED.update(saved)


@dataclass(frozen=True, slots=True)
class Call:
    """One call of :func:`attend_heads`: everything a path's condition may read. ``q`` is
    ``(B, H, L, hd)`` (``(B, H_kv, g, hd)`` once ``stacked_groups`` has stacked one query per
    head), ``k`` and ``v`` ``(B, H_kv, S, hd)``; the options as given; grad mode and the thread
    count as they were when the call was made."""

    q: Tensor
    k: Tensor
    v: Tensor
    attn_mask: Tensor | None
    is_causal: bool
    dropout_p: float
    need_weights: bool
    grad_enabled: bool
    threads: int

    @classmethod
    def of(cls, q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
           is_causal: bool = False, dropout_p: float = 0.0, need_weights: bool = False) -> Call:
        return cls(q, k, v, attn_mask, is_causal, dropout_p, need_weights,
                   grad_enabled=torch.is_grad_enabled(), threads=torch.get_num_threads())

    @property
    def mask(self) -> str:
        """The mask's kind: ``"none"``, ``"bool"`` or ``"float"``."""
        if self.attn_mask is None:
            return "none"
        return "bool" if self.attn_mask.dtype == torch.bool else "float"

    @property
    def differentiable(self) -> bool:
        """Autograd records this call: grad mode is on and an input or the mask requires grad."""
        tensors = [self.q, self.k, self.v] + ([] if self.attn_mask is None else [self.attn_mask])
        return self.grad_enabled and any(t.requires_grad for t in tensors)

    @property
    def on_cpu(self) -> bool:
        return self.q.device.type == "cpu"

    @property
    def group_size(self) -> int:
        """How many query heads share each key/value head."""
        return self.q.shape[1] // self.k.shape[1]


@dataclass(frozen=True, slots=True)
class FastPath:
    """A fast path: its name in :data:`ENABLED`, the condition under which it computes what the
    readable path computes, and what it runs: for ``grouped_heads`` and ``stacked_groups`` the
    :class:`Call` that the call becomes, for a kernel ``(output, weights or None)``."""

    name: str
    eligible: Callable[[Call], bool]
    run: Callable[[Call], Any]


def attend_heads(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Tensor | None = None,
                 is_causal: bool = False, dropout_p: float = 0.0,
                 need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
    """Attention of every head: ``q`` (B, H, L, hd), ``k`` and ``v`` (B, H_kv, S, hd) ->
    ``(B, H, L, hd)`` and, if ``need_weights``, the weights ``(B, H, L, S)``.

    ``attn_mask`` broadcasts to (B, H, L, S); ``is_causal`` is PyTorch's top-left causal mask,
    never given together with ``attn_mask`` (the caller combines them). Nothing is checked here.
    Which path computes it: the table in this module's docstring.
    """
    B, H, L, _ = q.shape
    S = k.shape[2]
    call = Call.of(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p,
                   need_weights=need_weights)
    # heads: every query head, or every group of them stacked, meets one key/value head
    call = GROUPED_HEADS.run(call) if _chosen(GROUPED_HEADS, call) else _copy_kv_heads(call)
    # kernel: the first fast path whose condition holds, else the default computation
    kernel = next((path.run for path in KERNELS if _chosen(path, call)), _default)
    out, weights = kernel(call)  # (B, H or H_kv, L or g, hd), the weights likewise over S
    return out.reshape(B, H, L, -1), None if weights is None else weights.reshape(B, H, L, S)


def _chosen(path: FastPath, call: Call) -> bool:
    return ENABLED[path.name] and path.eligible(call)


def _default(c: Call) -> tuple[Tensor, Tensor | None]:
    """The computation when no fast path runs: the readable :func:`~selfattn.attention.attend`
    when the weights are asked for (one key/value head per query head by then), else PyTorch's
    fused kernel, which takes grouped key/value heads as they are (``enable_gqa``)."""
    if c.need_weights:
        return readable_attend(c.q, c.k, c.v, attn_mask=c.attn_mask, dropout_p=c.dropout_p,
                               is_causal=c.is_causal)
    out = F.scaled_dot_product_attention(c.q, c.k, c.v, attn_mask=c.attn_mask,
                                         dropout_p=c.dropout_p, is_causal=c.is_causal,
                                         enable_gqa=c.group_size > 1)
    return out, None


def _copy_kv_heads(c: Call) -> Call:
    """The readable way to share key/value heads: a copy of each for every query head it serves."""
    g = c.group_size
    if g == 1:
        return c
    return replace(c, k=_repeat_kv(c.k, g), v=_repeat_kv(c.v, g))  # (B, H, S, hd) each


def _grouped_eligible(c: Call) -> bool:
    return c.group_size > 1 and (_chosen(STACKED_GROUPS, c)
                                 or (not c.need_weights and _fused_takes_groups(c)))


def _stacks(c: Call) -> bool:
    """``stacked_groups``' condition: grouped heads, one new query (decoding), and the weights
    asked for (stacking is then the only way without a copy) or no causal mask (decoding needs
    none). Several queries with the weights measured faster copied (the readable way)."""
    return c.group_size > 1 and c.q.shape[2] == 1 and (c.need_weights or not c.is_causal)


def _fused_takes_groups(c: Call) -> bool:
    """Whether PyTorch's fused attention takes this call's grouped key/value heads as they are
    (``enable_gqa=True``) without falling back to its math backend, which would hold the
    ``(L, S)`` scores. On a CPU its flash kernel does. On CUDA it depends on the version, the
    GPU and the dtype (FlashAttention needs ``sm_80`` and half precision; the memory-efficient
    kernel takes grouped heads only in recent versions), so PyTorch's own checks are asked; where
    neither fused kernel would run, copying the keys (the readable way) costs far less.
    Elsewhere (MPS), the copy too. A PyTorch whose checks cannot be asked (an older version,
    without them or with another signature) gets the copy, with a warning, once."""
    if c.q.device.type == "cpu":
        return True
    if c.q.device.type != "cuda":
        return False
    try:
        from torch.backends.cuda import (
            SDPAParams,
            can_use_efficient_attention,
            can_use_flash_attention,
        )

        params = SDPAParams(c.q, c.k, c.v, c.attn_mask, c.dropout_p, c.is_causal, True)
    except (ImportError, TypeError) as error:  # not this PyTorch's API: copy, never wrong
        _warn_copying(f"{type(error).__name__}: {error}")
        return False
    return bool(can_use_flash_attention(params) or can_use_efficient_attention(params))


@functools.cache
def _warn_copying(error: str) -> None:
    """Say once that grouped heads are copied on CUDA because PyTorch's checks could not be
    asked (``functools.cache``: once per distinct error)."""
    import warnings

    warnings.warn(
        "selfattn.fastpaths: PyTorch's SDPA checks (torch.backends.cuda.SDPAParams, "
        f"can_use_flash_attention) could not be asked ({error}); "
        "grouped key/value heads are copied on CUDA (repeat_kv) instead of passed with "
        "enable_gqa. The results are the same; the copy costs memory and time",
        RuntimeWarning, stacklevel=4)


def _share_kv_heads(c: Call) -> Call:
    """``grouped_heads``' step: the call with each group's query heads stacked where
    ``stacked_groups`` runs; otherwise the call as it is, for PyTorch's ``enable_gqa``."""
    return STACKED_GROUPS.run(c) if _chosen(STACKED_GROUPS, c) else c


def _stack_groups(c: Call) -> Call:
    """One new query per head: each group's query heads stacked as the rows of one query matrix,
    ``(B, H_kv, g, hd)`` (a reshape, no copy), and the mask regrouped to match (a view); the
    group attends to its key/value head in one product."""
    B, H, _, hd = c.q.shape  # one query per head
    g = c.group_size
    mask = causal_mask(1, c.k.shape[2], device=c.q.device) if c.is_causal else c.attn_mask
    q = c.q.reshape(B, H // g, g, hd)  # (B, H_kv, g, hd)
    if mask is not None:
        mask = mask[(None,) * (4 - mask.dim())]  # (b, h, 1, s), h in {1, H}
        if mask.shape[1] == H:  # one row per head: the group's rows, like the queries
            mask = mask.reshape(mask.shape[0], H // g, g, mask.shape[3])  # (b, H_kv, g, s)
    return replace(c, q=q, attn_mask=mask, is_causal=False)


def _inplace_softmax(c: Call) -> tuple[Tensor, Tensor]:
    """:func:`selfattn.attention.attend`, with one ``(..., L, S)`` buffer for the scores, then the
    masked scores, then (where autograd records nothing) the weights."""
    dtype = torch.promote_types(c.q.dtype, torch.float32)  # the readable path's softmax dtype
    scale = 1.0 / math.sqrt(c.q.shape[-1])
    scores = (c.q.to(dtype) * scale) @ c.k.to(dtype).transpose(-2, -1)  # (..., L, S): ours alone
    L, S = scores.shape[-2:]
    bias, keep = _mask_terms(c.attn_mask, c.is_causal, L, S, dtype=dtype, device=scores.device)
    if bias is not None:  # in place unless the mask's dtype would widen the scores
        same = torch.promote_types(scores.dtype, bias.dtype) == scores.dtype
        scores = scores.add_(bias) if same else scores + bias  # (..., L, S)
    dead = None
    if keep is not None:
        scores.masked_fill_(~keep, float("-inf"))  # blocked keys get no weight
        dead = ~keep.any(dim=-1, keepdim=True)  # (..., L, 1): rows with no key left
        scores.masked_fill_(dead, 0.0)
    recorded = torch.is_grad_enabled() and scores.requires_grad  # autograd keeps the softmax out
    if recorded or scores.dtype != dtype:
        weights = torch.softmax(scores, dim=-1, dtype=dtype)  # (..., L, S)
    else:  # no public out= form of softmax
        weights = torch.ops.aten._softmax.out(scores, -1, False, out=scores)  # (..., L, S)
    if dead is not None:  # zeros, not 0/0 = NaN
        weights = weights.masked_fill(dead, 0.0) if recorded else weights.masked_fill_(dead, 0.0)
    return _weighted_sum(weights, c.v, c.dropout_p)  # (..., L, hd), (..., L, S)


def decode_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    r"""What ``F.scaled_dot_product_attention(q, k, v)`` computes for a few new queries ``q``
    ``(B, H_kv, n, hd)`` (each group's query heads stacked) over a long cache ``k``, ``v``
    ``(B, H_kv, S, hd)``, no mask: ``(B, H_kv, n, hd)``. Where ``split_kv``'s condition holds,
    the keys are split into parts computed side by side (:func:`_split_kv_attention`); nothing
    is checked."""
    call = Call.of(q, k, v)
    if not _chosen(SPLIT_KV, call):
        return F.scaled_dot_product_attention(q, k, v)  # (B, H_kv, n, hd)
    return SPLIT_KV.run(call)[0]  # (B, H_kv, n, hd)


def _split_kv(c: Call) -> tuple[Tensor, None]:
    return _split_kv_attention(c.q, c.k, c.v, _split_kv_chunks(c.q, c.k, c.threads)), None


def _split_kv_eligible(c: Call) -> bool:
    return (not c.need_weights and c.mask == "none" and not c.is_causal and c.dropout_p == 0.0
            and not c.differentiable and c.group_size == 1
            and _split_kv_chunks(c.q, c.k, c.threads) > 1)


def _split_kv_chunks(q: Tensor, k: Tensor, threads: int) -> int:
    """How many parts to split the keys into for :func:`_split_kv_attention`; 1 = do not split.

    PyTorch's CPU attention kernel spreads its work over (batch, key/value head) pairs and
    blocks of queries. Decoding one sequence with MQA, the grouped heads make a single pair with
    one small block of queries, so it would run on one core while the others wait; splitting the
    keys gives every thread a part. Worth it only for a few queries (decoding) against a long
    cache, on a CPU, with more threads than pairs.
    """
    B, H_kv, n_queries, _ = q.shape
    if (q.device.type != "cpu" or B != 1 or n_queries > SPLIT_KV_MAX_QUERIES
            or k.shape[2] < SPLIT_KV_MIN_KEYS or _flash_with_lse() is None):
        return 1
    return max(1, threads // H_kv)


@functools.cache
def _flash_with_lse() -> Any:
    """PyTorch's CPU flash-attention kernel, which also returns the log-sum-exp of each row of
    scores; ``None`` where this build of PyTorch lacks it (a private op, looked up on first use)."""
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _split_kv_attention(q: Tensor, k: Tensor, v: Tensor, chunks: int) -> Tensor:
    r"""Attention of ``q`` (1, H_kv, n, hd) over ``k``, ``v`` (1, H_kv, S, hd), the keys split
    into ``chunks`` parts computed side by side and merged.

    Each part $c$ returns its output $o_c$ and the log-sum-exp $\ell_c$ of its scores; the exact
    result is $\sum_c e^{\ell_c - \ell}\, o_c$ with $\ell = \log \sum_c e^{\ell_c}$. The kernel
    gives no gradient for $\ell_c$, so autograd must have nothing to differentiate here.
    """
    flash = _flash_with_lse()  # returns (out, lse, ...)
    _, H_kv, n, hd = q.shape
    S = k.shape[2]
    m = S // chunks

    def parts(t: Tensor) -> Tensor:  # (chunks, H_kv, m, hd): a view of the first chunks*m keys
        return t.as_strided((chunks, H_kv, m, t.shape[3]),
                            (m * t.stride(2), t.stride(1), t.stride(2), t.stride(3)),
                            t.storage_offset())

    out, lse = flash(q.expand(chunks, H_kv, n, hd), parts(k), parts(v))[:2]  # (c, H_kv, n, hd)
    if chunks * m < S:  # the few keys left over
        tail_out, tail_lse = flash(q, k[:, :, chunks * m :], v[:, :, chunks * m :])[:2]
        out, lse = torch.cat([out, tail_out]), torch.cat([lse, tail_lse])
    share = torch.softmax(lse, dim=0).to(out.dtype)  # (c, H_kv, n): each part's weight
    return (out * share[..., None]).sum(0, keepdim=True)  # (1, H_kv, n, hd)


# The table: each path's condition and what it runs (the module docstring says them in words).
GROUPED_HEADS = FastPath("grouped_heads", _grouped_eligible, _share_kv_heads)
STACKED_GROUPS = FastPath("stacked_groups", _stacks, _stack_groups)
SPLIT_KV = FastPath("split_kv", _split_kv_eligible, _split_kv)
KERNELS = [
    FastPath("inplace_softmax", lambda c: c.need_weights and c.on_cpu, _inplace_softmax),
    SPLIT_KV,
]
