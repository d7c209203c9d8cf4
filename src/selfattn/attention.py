r"""Scaled dot-product attention, written out step by step, returning its weights.

$$\operatorname{Attention}(Q, K, V) = \operatorname{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}} + M\right) V$$

(Vaswani et al. 2017, "Attention Is All You Need", §3.2.1.) The same arguments as
``torch.nn.functional.scaled_dot_product_attention``, in the same order and with the same meaning
(``attn_mask``, ``dropout_p``, ``is_causal``, then ``scale`` and ``enable_gqa`` by keyword), so
the two can be compared call for call; ours also returns the attention weights, which PyTorch's
fused kernels never materialise.

:func:`scaled_dot_product_attention` checks its inputs and calls :func:`attend`, the computation
itself; code that has checked its inputs already (``MultiHeadAttention``) calls :func:`attend`,
whose options are keyword-only. :func:`masked_softmax` does the same with its unchecked core.
The faster variants the library also uses live in :mod:`selfattn.fastpaths`; the one that
overwrites the scores in place calls the same core (``inplace=True``), so the masks mean the
same there.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import check_attention_inputs, check_mask, check_tensor
from .heads import _repeat_kv
from .masks import causal_mask, to_additive


def masked_softmax(
    scores: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False
) -> Tensor:
    r"""Softmax over the last dimension of ``scores`` (..., L, S), after masking.

    $$A_{ij} = \frac{\exp(s_{ij} + m_{ij})}{\sum_{j'} \exp(s_{ij'} + m_{ij'})}$$

    ``attn_mask`` is bool (True = may attend) or float (added to the scores; ``-inf`` blocks a
    key); ``is_causal`` also blocks key ``j > i`` for query ``i`` (top-left aligned, as in
    PyTorch). A row whose every key is blocked gets **zero** weights (a plain softmax would give
    0/0 = NaN there, in the forward pass and in the gradient), as PyTorch's SDPA does. The
    softmax runs in float32 for float16/bfloat16 scores (float64 stays float64), so
    half-precision scores neither overflow nor lose their small weights; the result is in that
    softmax dtype.
    """
    check_tensor(scores, "scores", min_rank=2)
    if attn_mask is not None:
        check_mask(attn_mask, tuple(scores.shape))
    return _masked_softmax(scores, attn_mask, is_causal)


def _masked_softmax(scores: Tensor, attn_mask: Tensor | None, is_causal: bool, *,
                    inplace: bool = False) -> Tensor:
    """:func:`masked_softmax` without checking its inputs (for callers that have).

    ``inplace=True``: ``scores`` is a buffer the caller will not read again. The masks are then
    written into it where shapes and dtypes allow, and so are the weights when autograd does not
    record the softmax (it keeps the softmax's output for the backward pass), instead of
    allocating new ``(..., L, S)`` tensors.
    """
    L, S = scores.shape[-2:]
    dtype = torch.promote_types(scores.dtype, torch.float32)  # fp16/bf16 -> fp32, fp64 stays
    if attn_mask is None and not is_causal:
        return _softmax(scores, dtype, inplace)  # (..., L, S)
    if attn_mask is None:  # causal alone: query i keeps keys 0..i, so no row is left empty
        M = to_additive(causal_mask(L, S, device=scores.device), scores.dtype)  # (L, S): 0, -inf
        return _softmax(_add(scores, M, inplace), dtype, inplace)  # (..., L, S)
    if attn_mask.dtype == torch.bool:
        keep = attn_mask  # bool, broadcastable to scores: where a query may attend
    else:
        scores = _add(scores, attn_mask, inplace)  # (..., L, S): a bias, -inf where a key is blocked
        keep = attn_mask != float("-inf")
    if is_causal:
        keep = keep & causal_mask(L, S, device=scores.device)  # (..., L, S)
    dead = ~keep.any(dim=-1, keepdim=True)  # (..., L, 1): rows with no key left
    scores = _fill(scores, ~keep, float("-inf"), inplace)  # blocked keys get no weight
    scores = _fill(scores, dead, 0.0, inplace)  # a dead row: finite scores, zeroed below
    weights = _softmax(scores, dtype, inplace)  # (..., L, S)
    return _fill(weights, dead, 0.0, inplace and not _recorded(weights))  # zeros, not NaN


def _fits(small: Tensor, big: Tensor) -> bool:
    return torch.broadcast_shapes(small.shape, big.shape) == big.shape


def _add(scores: Tensor, bias: Tensor, inplace: bool) -> Tensor:
    if inplace and _fits(bias, scores) and torch.promote_types(scores.dtype, bias.dtype) == scores.dtype:
        return scores.add_(bias)
    return scores + bias


def _fill(scores: Tensor, where: Tensor, value: float, inplace: bool) -> Tensor:
    if inplace and _fits(where, scores):
        return scores.masked_fill_(where, value)
    return scores.masked_fill(where, value)


def _softmax(scores: Tensor, dtype: torch.dtype, inplace: bool) -> Tensor:
    if inplace and scores.dtype == dtype and not _recorded(scores):
        return torch.ops.aten._softmax.out(scores, -1, False, out=scores)  # no public out= form
    return torch.softmax(scores, dim=-1, dtype=dtype)


def _recorded(x: Tensor) -> bool:
    """Autograd records what is computed from ``x``."""
    return torch.is_grad_enabled() and x.requires_grad


def _weights_and_output(scores: Tensor, value: Tensor, *, attn_mask: Tensor | None,
                        is_causal: bool, dropout_p: float,
                        inplace: bool = False) -> tuple[Tensor, Tensor]:
    """The second half of attention, for any scores: the masked softmax, dropout,
    then the weighted sum of the values. Returns ``(weights @ value, weights)``."""
    weights = _masked_softmax(scores, attn_mask, is_causal,
                              inplace=inplace)  # (..., L, S)
    weights = weights.to(value.dtype)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    return weights @ value, weights  # (..., L, Ev), (..., L, S)


def attend(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`scaled_dot_product_attention` without checking its inputs."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    # The scale goes on q, L x E numbers (fewer than the L x S scores when there
    # are more keys than the head is wide), and half-precision inputs are multiplied
    # in float32: a float16 product of large entries can overflow.
    dtype = torch.promote_types(query.dtype, torch.float32)
    q, k = query.to(dtype) * scale, key.to(dtype)
    scores = q @ k.transpose(-2, -1)  # (..., L, S)
    return _weights_and_output(scores, value, attn_mask=attn_mask,
                               is_causal=is_causal,
                               dropout_p=dropout_p)  # (..., L, Ev), (..., L, S)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> tuple[Tensor, Tensor]:
    r"""The explicit computation of $\operatorname{softmax}(QK^\top \cdot \text{scale} + M)\,V$.

    Args:
        query: ``(..., L, E)``.
        key: ``(..., S, E)``.
        value: ``(..., S, Ev)``. The leading (batch, head) dimensions of the three must broadcast.
        attn_mask: bool (``True`` = may attend) or float (added to the scores), broadcastable to
            ``(..., L, S)``. Float masks holding only 0 and 1 are refused: they mask nothing.
        dropout_p: dropout on the weights, applied whenever it is > 0 (as in PyTorch's function;
            modules pass 0 in eval mode).
        is_causal: also mask key ``j > i`` for query ``i`` (top-left aligned, as in PyTorch).
            ANDed with ``attn_mask`` if both are given (PyTorch's fused CPU kernel does the
            same; its math backend refuses the pair).
        scale: multiplies the scores; default $1/\sqrt{E}$ (Vaswani et al. 2017, §3.2.1).
            Keyword only, as in PyTorch.
        enable_gqa: grouped-query attention (Ainslie et al. 2023): ``query`` ``(..., H, L, E)``
            has a multiple of the heads (dim -3) of ``key`` and of ``value``, and each key/value
            head serves its group of query heads, repeated as :func:`~selfattn.heads.repeat_kv`
            does. Keyword only, as in PyTorch.

    Returns:
        ``(output, weights)``: output ``(..., L, Ev)`` in the inputs' dtype, and the weights
        ``(..., L, S)`` (after dropout), rows summing to 1, or to 0 where every key is masked.
    """
    if enable_gqa:
        key, value = _repeat_for_gqa(query, key, value)
    dropout_p = check_attention_inputs(query, key, value, attn_mask, dropout_p)
    return attend(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                  is_causal=is_causal, scale=scale)


def _repeat_for_gqa(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    """``key`` and ``value`` with their heads (dim -3) repeated to ``query``'s, checked."""
    H = check_tensor(query, "query", min_rank=3).shape[-3]
    repeated = []
    for name, x in [("key", key), ("value", value)]:
        H_kv = check_tensor(x, name, min_rank=3).shape[-3]
        if H_kv < 1 or H % H_kv:
            raise ValueError(
                f"with enable_gqa, {name} needs at least one head and the heads of query (dim -3) "
                f"must be a multiple of those of {name}, got query {tuple(query.shape)} and "
                f"{name} {tuple(x.shape)}"
            )
        repeated.append(_repeat_kv(x, H // H_kv))  # (..., H, S, E)
    return repeated[0], repeated[1]
