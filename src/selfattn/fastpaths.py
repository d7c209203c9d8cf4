r"""The fast paths of :class:`~selfattn.MultiHeadAttention`: the same numbers, computed faster.

The readable computation is :func:`~selfattn.heads.repeat_kv` for grouped heads, then
:func:`selfattn.attention.attend` when the weights are asked for, or PyTorch's fused
``F.scaled_dot_product_attention`` when they are not. Each path below computes the same result
another way. Each can be switched off (:func:`disabled`), is tested equal to the readable
computation (tests/test_fastpaths.py), and is kept only because ``make bench`` times the layer
with it and without it, side by side, and the difference is worth having
(:func:`selfattn.book.bench.fastpath_benchmark`):

* ``grouped_heads``: GQA and MQA without copying the keys: the query heads that share a
  key/value head are stacked along the sequence axis and attend to it in one product. During
  decoding the copy would move as many bytes as MHA's whole cache.
* ``inplace_softmax``: with the weights asked for and nothing to differentiate, the mask and the
  softmax overwrite the scores' own buffer instead of allocating new ``(L, S)`` ones.
* ``split_kv``: decoding on a CPU with fewer (batch, key/value head) pairs than threads splits the
  cache into parts computed side by side, merged by their log-sum-exp ("flash-decoding",
  Dao et al. 2023), so MQA uses every core.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import attend as readable_attend
from .heads import _repeat_kv
from .masks import causal_mask

ENABLED = {"grouped_heads": True, "inplace_softmax": True, "split_kv": True}
SPLIT_KV_MIN_KEYS = 4096  # split a cache across threads from this many keys


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


def attend(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool,
           dropout_p: float, need_weights: bool) -> tuple[Tensor, Tensor | None]:
    """Attention of every head: ``q`` (B, H, L, hd), ``k`` and ``v`` (B, H_kv, S, hd) ->
    ``(B, H, L, hd)`` and, if ``need_weights``, the weights ``(B, H, L, S)``.

    ``attn_mask`` broadcasts to (B, H, L, S); ``is_causal`` is PyTorch's top-left causal mask,
    never given together with ``attn_mask`` (the caller combines them). Nothing is checked here.
    """
    B, H, L, hd = q.shape
    S, g = k.shape[2], H // k.shape[1]
    if g > 1 and not ENABLED["grouped_heads"]:
        k, v, g = _repeat_kv(k, g), _repeat_kv(v, g), 1  # (B, H, S, hd): a copy per query head
    if g > 1:  # a group's query heads, stacked along the sequence, attend to its key head at once
        if is_causal:
            attn_mask, is_causal = causal_mask(L, S, device=q.device), False  # (L, S)
        q = q.reshape(B, H // g, g * L, hd)  # (B, H_kv, g*L, hd)
        attn_mask = None if attn_mask is None else _group_mask(attn_mask, H, g, L)
    if need_weights:
        explicit = (_inplace_attend if ENABLED["inplace_softmax"] and q.device.type == "cpu"
                    and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
                    else readable_attend)
        out, weights = explicit(q, k, v, attn_mask, dropout_p, is_causal)
        return out.reshape(B, H, L, hd), weights.reshape(B, H, L, S)
    if attn_mask is None and dropout_p == 0.0 and (chunks := _decode_chunks(q, k)) > 1:
        return _split_kv_attention(q, k, v, chunks).reshape(B, H, L, hd), None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                         is_causal=is_causal)  # (B, H_kv, g*L, hd)
    return out.reshape(B, H, L, hd), None


def _group_mask(mask: Tensor, H: int, g: int, L: int) -> Tensor:
    """A mask broadcastable to (B, H, L, S), reshaped to (B, H / g, g*L, S) like the queries."""
    m = mask[(None,) * (4 - mask.dim())]  # (b, h, l, s), h in {1, H}, l in {1, L}
    b, h, l, s = m.shape
    if h == 1 and l == 1:
        return m  # broadcasts as it is
    if h == 1:
        return m[:, :, None].expand(b, 1, g, L, s).reshape(b, 1, g * L, s)  # (b, 1, g*L, s)
    return m.expand(b, H, L, s).reshape(b, H // g, g * L, s)  # (b, H_kv, g*L, s)


def _inplace_attend(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float,
                    is_causal: bool) -> tuple[Tensor, Tensor]:
    """:func:`selfattn.attention.attend` for inference: one ``(..., L, S)`` buffer holds the
    scores, then the masked scores, then the weights."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    scores = (q.to(dtype) / math.sqrt(q.shape[-1])) @ k.to(dtype).transpose(-2, -1)  # (..., L, S)
    keep = None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        keep = attn_mask
    elif attn_mask is not None:
        scores = _add(scores, attn_mask)  # a bias, and -inf where a key is blocked
        keep = attn_mask != float("-inf")
    if is_causal:
        causal = causal_mask(*scores.shape[-2:], device=scores.device)  # (L, S)
        keep = causal if keep is None else keep & causal
    if keep is not None:
        dead = ~keep.any(dim=-1, keepdim=True)  # (..., L, 1): rows with no key left
        scores = _fill(_fill(scores, ~keep, float("-inf")), dead, 0.0)
    weights = torch.ops.aten._softmax.out(scores, -1, False, out=scores)  # (..., L, S), in place
    if keep is not None:
        weights = _fill(weights, dead, 0.0)
    weights = weights.to(v.dtype)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    return weights @ v, weights  # (..., L, hd), (..., L, S)


def _fits(small: Tensor, big: Tensor) -> bool:
    return torch.broadcast_shapes(small.shape, big.shape) == big.shape


def _add(scores: Tensor, bias: Tensor) -> Tensor:
    return scores.add_(bias) if _fits(bias, scores) and bias.dtype == scores.dtype else scores + bias


def _fill(scores: Tensor, where: Tensor, value: float) -> Tensor:
    return scores.masked_fill_(where, value) if _fits(where, scores) else scores.masked_fill(where, value)


def _decode_chunks(q: Tensor, k: Tensor) -> int:
    """How many parts to split the keys into for :func:`_split_kv_attention`; 1 = do not split.

    PyTorch's CPU attention kernel spreads its work over (batch, key/value head) pairs and
    blocks of queries. Decoding one sequence with MQA, the grouped heads make a single pair with
    one small block of queries, so it would run on one core while the others wait; splitting the
    keys gives every thread a part. Worth it only for a few queries (decoding) against a long
    cache, on a CPU, with more threads than pairs.
    """
    B, H_kv, n_queries, _ = q.shape
    if (not ENABLED["split_kv"] or q.device.type != "cpu" or B != 1 or n_queries > 64
            or k.shape[2] < SPLIT_KV_MIN_KEYS or _flash_with_lse() is None):
        return 1
    return torch.get_num_threads() // H_kv


@functools.cache
def _flash_with_lse():
    """PyTorch's CPU flash-attention kernel, which also returns the log-sum-exp of each row of
    scores; ``None`` where this build of PyTorch lacks it (a private op, looked up on first use)."""
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _split_kv_attention(q: Tensor, k: Tensor, v: Tensor, chunks: int) -> Tensor:
    r"""Attention of ``q`` (1, H_kv, n, hd) over ``k``, ``v`` (1, H_kv, S, hd), the keys split
    into ``chunks`` parts computed side by side and merged.

    Each part $c$ returns its output $o_c$ and the log-sum-exp $\ell_c$ of its scores; the exact
    result is $\sum_c e^{\ell_c - \ell}\, o_c$ with $\ell = \log \sum_c e^{\ell_c}$.
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
