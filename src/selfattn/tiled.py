r"""Tiled attention with an online softmax: exact attention that never holds the ``(L, S)`` scores.

A softmax over a row of scores needs the row's maximum $m$ (to keep $e^{s - m}$ from
overflowing) and its sum $\ell = \sum_k e^{s_k - m}$ before the first weight is known. The online
softmax (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax") keeps both as
running values while it reads the row one block of columns at a time; after block $j$,

$$m^{(j)} = \max\big(m^{(j-1)},\, \max_k s^{(j)}_k\big), \qquad
\ell^{(j)} = e^{m^{(j-1)} - m^{(j)}}\, \ell^{(j-1)} + \sum_k e^{s^{(j)}_k - m^{(j)}}:$$

when the maximum grows, everything summed so far is rescaled by $e^{m^{(j-1)} - m^{(j)}}$.
Attention rescales its unnormalised output $O = \sum_k e^{s_k - m} v_k$ the same way, and
divides once, at the end:

$$O^{(j)} = e^{m^{(j-1)} - m^{(j)}}\, O^{(j-1)} + e^{s^{(j)} - m^{(j)}}\, V^{(j)}, \qquad
\operatorname{Attention}(Q, K, V) = O^{(\text{last})} / \ell^{(\text{last})}.$$

FlashAttention (Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness", §3.1, Algorithm 1) runs this over blocks of queries and, inside, blocks of keys:
one tile of scores exists at a time, so memory grows as $L + S$ instead of $L \cdot S$, and
tiles that a mask hides entirely are never computed.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .checks import check_attention_inputs, check_positive_int, check_tensor
from .masks import causal_mask


def running_max_and_sum(scores: Tensor, block_size: int) -> list[tuple[Tensor, Tensor]]:
    r"""The online softmax's running $(m, \ell)$ over the last axis of ``scores`` (..., S), after
    each block of ``block_size`` columns: ``(..., 1)`` each. The last pair is the row's maximum
    and its $\sum_k e^{s_k - m}$."""
    check_tensor(scores, "scores")
    check_positive_int(block_size, "block_size")
    m = torch.full_like(scores[..., :1], torch.finfo(scores.dtype).min)  # (..., 1): max so far
    l = torch.zeros_like(m)  # (..., 1): sum of exp(s - m) so far
    history = []
    for j in range(0, scores.shape[-1], block_size):
        s = scores[..., j : j + block_size]  # (..., b)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (..., 1)
        l = torch.exp(m - m_new) * l + torch.exp(s - m_new).sum(dim=-1, keepdim=True)  # (..., 1)
        m = m_new
        history.append((m, l))
    return history


def online_softmax(scores: Tensor, block_size: int) -> Tensor:
    """``torch.softmax(scores, dim=-1)`` in two passes: the running maximum and sum, read one
    block of columns at a time (:func:`running_max_and_sum`), then one division."""
    m, l = running_max_and_sum(scores, block_size)[-1]  # (..., 1), (..., 1)
    return torch.exp(scores - m) / l  # (..., S)


def tiled_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_size: int = 256,
) -> Tensor:
    r"""$\operatorname{softmax}(QK^\top \cdot \text{scale} + M)\,V$, one tile of scores at a time.

    Arguments as in :func:`selfattn.scaled_dot_product_attention`, without dropout: a bool
    ``attn_mask`` is True where a query may attend, a float one is added to the scores;
    ``is_causal`` masks key ``j > i`` for query ``i`` (top-left aligned), ANDed with
    ``attn_mask``. Everything after ``attn_mask`` is keyword-only: PyTorch's fifth argument is
    ``dropout_p``, which this function does not take, so ``tiled_attention(q, k, v, None, 0.1)``
    is an error, not a causal call. A tile is ``block_size`` queries by ``block_size`` keys.
    Returns the output ``(..., L, Ev)`` in the inputs' dtype (accumulated in float32 for half
    precision), zero where every key is masked. The weights are never formed.
    """
    check_attention_inputs(query, key, value, attn_mask, 0.0)
    b = check_positive_int(block_size, "block_size")
    (L, E), S, Ev = query.shape[-2:], key.shape[-2], value.shape[-1]
    batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    dtype = torch.promote_types(query.dtype, torch.float32)  # fp16/bf16 -> fp32, fp64 stays
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    q = (query.to(dtype) * scale).expand(*batch, L, E)  # (..., L, E): tiles get the whole batch
    k, v = key.to(dtype), value.to(dtype)  # (..., S, E), (..., S, Ev)
    if attn_mask is not None:
        attn_mask = attn_mask.broadcast_to(*attn_mask.shape[:-2], L, S)  # (..., L, S), a view
        attn_mask = attn_mask if attn_mask.dtype == torch.bool else attn_mask.to(dtype)
    outputs = []
    for i in range(0, L, b):  # a block of queries ...
        q_i = q[..., i : i + b, :]  # (..., Lb, E)
        # m starts at the lowest finite number, not -inf: exp(m - m_new) is then never NaN
        m = q_i.new_full((*q_i.shape[:-1], 1), torch.finfo(dtype).min)  # (..., Lb, 1)
        l = torch.zeros_like(m)  # (..., Lb, 1)
        acc = q_i.new_zeros(*q_i.shape[:-1], Ev)  # (..., Lb, Ev): O, not yet divided by l
        # causal: the key blocks right of the diagonal are masked for every query here, so the
        # loop stops at the diagonal and never computes them
        for j in range(0, min(S, i + b) if is_causal else S, b):  # ... against a block of keys
            mask = None if attn_mask is None else attn_mask[..., i : i + b, j : j + b]  # (..., Lb, Sb)
            if mask is not None and mask.dtype == torch.bool and not mask.any():
                continue  # a tile masked for every query of the block adds nothing: skip it
            s = q_i @ k[..., j : j + b, :].transpose(-2, -1)  # (..., Lb, Sb): this tile's buffer
            if mask is not None and mask.dtype == torch.bool:
                s.masked_fill_(~mask, -math.inf)
            elif mask is not None:
                s.add_(mask)
            if is_causal and j == i:  # the tile on the diagonal: mask the keys after each query
                s.masked_fill_(~causal_mask(s.shape[-2], s.shape[-1], device=s.device), -math.inf)
            # m is only a shift that cancels in acc / l: detached, autograd neither follows it nor
            # keeps s for it (s is overwritten two lines below)
            m_new = torch.maximum(m, s.detach().amax(dim=-1, keepdim=True))  # (..., Lb, 1)
            alpha = torch.exp(m - m_new)  # (..., Lb, 1): rescales what came before
            p = s.sub_(m_new).exp_()  # (..., Lb, Sb): exp(s - m_new), in s's buffer
            l = alpha * l + p.sum(dim=-1, keepdim=True)  # (..., Lb, 1)
            acc = alpha * acc + p @ v[..., j : j + b, :]  # (..., Lb, Ev)
            m = m_new
        outputs.append(acc / l.masked_fill(l == 0, 1.0))  # (..., Lb, Ev); masked rows stay 0
    return torch.cat(outputs, dim=-2).to(query.dtype)  # (..., L, Ev)
