r"""Scaled dot-product attention, written out step by step, returning its weights.

$$\operatorname{Attention}(Q, K, V) = \operatorname{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}} + M\right) V$$

(Vaswani et al. 2017, "Attention Is All You Need", §3.2.1.) Same arguments and semantics as
``torch.nn.functional.scaled_dot_product_attention``, so the two can be compared directly; ours
also returns the attention weights, which PyTorch's fused kernels never materialise.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import check_dropout, check_mask, check_same_dtype_device, check_tensor
from .masks import causal_mask


def masked_softmax(
    scores: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False
) -> Tensor:
    r"""Softmax over the last dimension of ``scores`` (..., L, S), at least in float32, after masking.

    $$A_{ij} = \frac{\exp(s_{ij} + m_{ij})}{\sum_{j'} \exp(s_{ij'} + m_{ij'})}$$

    ``attn_mask`` is bool (True = may attend) or float (added to the scores); ``is_causal`` adds
    the top-left aligned lower-triangular mask. A row whose every key is masked gets **zero**
    weights (a plain softmax would give 0/0 = NaN there), as PyTorch's SDPA does. The softmax runs
    in float32 for fp16/bf16 scores (float64 stays float64), so half-precision scores neither
    overflow nor lose the small weights; the result is in that softmax dtype.
    """
    return _masked_softmax(scores, attn_mask, is_causal, owned=False)


def _masked_softmax(scores: Tensor, attn_mask: Tensor | None, is_causal: bool, owned: bool
                    ) -> Tensor:
    """:func:`masked_softmax`; ``owned``: ``scores`` is a temporary the caller will not read
    again, so the mask is applied in place (one pass and one (L, S) allocation fewer)."""
    L, S = scores.shape[-2:]
    keep = None  # bool, broadcastable to scores: where a query may attend
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            keep = attn_mask
        else:  # additive: its -inf entries become a bool mask, so no NaN reaches the gradient
            blocked = attn_mask == float("-inf")
            bias = attn_mask
            if bool(blocked.any()):
                keep, bias = ~blocked, attn_mask.masked_fill(blocked, 0.0)
            if (owned and bias.dtype == scores.dtype
                    and torch.broadcast_shapes(bias.shape, scores.shape) == scores.shape):
                scores = scores.add_(bias)
            else:
                scores = scores + bias
    if is_causal:
        tri = causal_mask(L, S, device=scores.device)  # (L, S)
        keep = tri if keep is None else keep & tri
    if keep is not None:
        if owned and torch.broadcast_shapes(keep.shape, scores.shape) == scores.shape:
            scores = scores.masked_fill_(~keep, float("-inf"))
        else:
            scores = scores.masked_fill(~keep, float("-inf"))
    dtype = torch.promote_types(scores.dtype, torch.float32)  # fp16/bf16 -> fp32, fp64 stays
    inplace = (owned and scores.dtype == dtype and scores.device.type == "cpu"
               and not (torch.is_grad_enabled() and scores.requires_grad))
    if inplace:
        # inference: overwrite the scores with their softmax. A fresh (L, S) buffer costs more
        # than the softmax itself on a CPU (page faults): 48 vs 15 ms for (64, 512, 512) here
        weights = torch.ops.aten._softmax.out(scores, -1, False, out=scores)  # (..., L, S)
    else:
        weights = torch.softmax(scores, dim=-1, dtype=dtype)  # (..., L, S)

    # Rows with no key left: softmax gave NaN there; the answer we want is "attend to nothing".
    if keep is not None:
        dead = ~keep.any(dim=-1, keepdim=True)  # (..., L, 1), the mask's own (small) shape
        if bool(dead.any()):
            weights = weights.masked_fill_(dead, 0.0) if inplace else weights.masked_fill(dead, 0.0)
    return weights


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    r"""The explicit computation of $\operatorname{softmax}(QK^\top \cdot \text{scale} + M)\,V$.

    Args:
        query: ``(..., L, E)``.
        key: ``(..., S, E)``.
        value: ``(..., S, Ev)``. The leading (batch, head) dimensions of the three must broadcast.
        attn_mask: bool (``True`` = may attend) or float (added to the scores), broadcastable to
            ``(..., L, S)``. Float masks holding only 0 and 1 are refused: they mask nothing.
        is_causal: also mask key ``j > i`` for query ``i`` (top-left aligned, as in PyTorch).
            ANDed with ``attn_mask`` if both are given (PyTorch's fused CPU kernel does the
            same; its math backend refuses the pair).
        scale: multiplies the scores; default $1/\sqrt{E}$ (Vaswani et al. 2017, §3.2.1).
        dropout_p: dropout on the weights, applied whenever it is > 0 (as in PyTorch's function;
            modules pass 0 in eval mode).

    Returns:
        ``(output, weights)``: output ``(..., L, Ev)`` in the inputs' dtype, and the weights
        ``(..., L, S)`` (after dropout), rows summing to 1, or to 0 where every key is masked.
    """
    check_tensor(query, "query", min_rank=2)
    check_tensor(key, "key", min_rank=2)
    check_tensor(value, "value", min_rank=2)
    check_same_dtype_device(query=query, key=key, value=value)
    L, E = query.shape[-2:]
    S, E_k = key.shape[-2:]
    if E_k != E:
        raise ValueError(
            f"query and key must have the same last dimension E, got query {tuple(query.shape)} "
            f"and key {tuple(key.shape)}"
        )
    if value.shape[-2] != S:
        raise ValueError(
            f"key and value must have the same sequence length S (dim -2), got key "
            f"{tuple(key.shape)} and value {tuple(value.shape)}"
        )
    try:
        batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the leading (batch, head) dimensions of query {tuple(query.shape)}, key "
            f"{tuple(key.shape)} and value {tuple(value.shape)} do not broadcast"
        ) from None
    if attn_mask is not None:
        check_mask(attn_mask, (*batch, L, S))
    dropout_p = check_dropout(dropout_p)
    if scale is None:
        scale = 1.0 / math.sqrt(E)

    # Scaling q (L x E numbers) is cheaper than scaling the scores (L x S numbers).
    scores = (query * scale) @ key.transpose(-2, -1)  # (..., L, S)
    weights = _masked_softmax(scores, attn_mask, is_causal, owned=True)  # (..., L, S), fp32/fp64
    weights = weights.to(value.dtype)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    output = weights @ value  # (..., L, Ev)
    return output, weights
