r"""Scaled dot-product attention, written out step by step, returning its weights.

$$\operatorname{Attention}(Q, K, V) = \operatorname{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}} + M\right) V$$

(Vaswani et al. 2017, "Attention Is All You Need", §3.2.1.) The same arguments, in the same
order and with the same meaning, as ``torch.nn.functional.scaled_dot_product_attention``, so the
two can be compared call for call; ours also returns the attention weights, which PyTorch's fused
kernels never materialise.

:func:`scaled_dot_product_attention` checks its inputs and calls :func:`attend`, the computation
itself; code that has checked its inputs already (``MultiHeadAttention``) calls :func:`attend`.
:func:`masked_softmax` does the same with its unchecked core.
The faster variants the library also uses live in :mod:`selfattn.fastpaths`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import check_attention_inputs, check_mask, check_tensor
from .masks import causal_mask


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


def _masked_softmax(scores: Tensor, attn_mask: Tensor | None, is_causal: bool) -> Tensor:
    """:func:`masked_softmax` without checking its inputs (for callers that have)."""
    keep = None  # bool, broadcastable to scores: where a query may attend
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        keep = attn_mask
    elif attn_mask is not None:
        scores = scores + attn_mask  # (..., L, S): a bias, and -inf where a key is blocked
        keep = attn_mask != float("-inf")
    if is_causal:
        causal = causal_mask(*scores.shape[-2:], device=scores.device)  # (L, S)
        keep = causal if keep is None else keep & causal
    dtype = torch.promote_types(scores.dtype, torch.float32)  # fp16/bf16 -> fp32, fp64 stays
    if keep is None:
        return torch.softmax(scores, dim=-1, dtype=dtype)  # (..., L, S)
    dead = ~keep.any(dim=-1, keepdim=True)  # (..., L, 1): rows with no key left
    scores = scores.masked_fill(~keep, float("-inf")).masked_fill(dead, 0.0)
    weights = torch.softmax(scores, dim=-1, dtype=dtype)  # (..., L, S)
    return weights.masked_fill(dead, 0.0)  # "attend to nothing": zeros, not NaN


def attend(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """The computation of :func:`scaled_dot_product_attention`, without checking its inputs."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    # The scale goes on q (L x E numbers, fewer than the L x S scores), and half-precision
    # inputs are multiplied in float32: a float16 product of large entries can overflow.
    dtype = torch.promote_types(query.dtype, torch.float32)
    scores = (query.to(dtype) * scale) @ key.to(dtype).transpose(-2, -1)  # (..., L, S)
    weights = _masked_softmax(scores, attn_mask, is_causal).to(value.dtype)  # (..., L, S)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    return weights @ value, weights  # (..., L, Ev), (..., L, S)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
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

    Returns:
        ``(output, weights)``: output ``(..., L, Ev)`` in the inputs' dtype, and the weights
        ``(..., L, S)`` (after dropout), rows summing to 1, or to 0 where every key is masked.
    """
    dropout_p = check_attention_inputs(query, key, value, attn_mask, dropout_p)
    return attend(query, key, value, attn_mask, dropout_p, is_causal, scale)
