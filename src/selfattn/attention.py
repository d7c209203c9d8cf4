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
overwrites the scores in place reads the masks through the same :func:`_mask_terms`, so they mean
the same there.
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


def _masked_softmax(scores: Tensor, attn_mask: Tensor | None, is_causal: bool) -> Tensor:
    """:func:`masked_softmax` without checking its inputs (for callers that have)."""
    L, S = scores.shape[-2:]
    bias, keep = _mask_terms(attn_mask, is_causal, L, S, dtype=scores.dtype, device=scores.device)
    dtype = torch.promote_types(scores.dtype, torch.float32)  # fp16/bf16 -> fp32, fp64 stays
    if bias is not None:
        scores = scores + bias  # (..., L, S): a float mask is added
    if keep is None:  # nothing blocked beyond the bias, and no row left empty
        return torch.softmax(scores, dim=-1, dtype=dtype)  # (..., L, S)
    scores = scores.masked_fill(~keep, float("-inf"))  # (..., L, S): blocked keys get no weight
    dead = ~keep.any(dim=-1, keepdim=True)  # (..., L, 1): rows with no key left
    weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1, dtype=dtype)  # (..., L, S)
    return weights.masked_fill(dead, 0.0)  # a dead row gets zeros, not 0/0 = NaN


def _mask_terms(attn_mask: Tensor | None, is_causal: bool, L: int, S: int, *, dtype: torch.dtype,
                device: torch.device) -> tuple[Tensor | None, Tensor | None]:
    """What the masks do to ``(L, S)`` scores of ``dtype``, as two terms: ``bias``, added (a
    float mask; the causal mask alone, as 0 and ``-inf``: adding an ``(L, S)`` tensor across
    the batch and the heads is several times faster than filling through a bool one), and
    ``keep``, bool, broadcastable to the scores: where a query may attend, ``None`` when the
    bias says it all and no row can be left empty (query ``i`` keeps key 0 under a causal mask
    alone). The one place the mask conventions are read: the readable softmax and the in-place
    one of :mod:`selfattn.fastpaths` both apply these terms."""
    if attn_mask is None:
        causal = to_additive(causal_mask(L, S, device=device), dtype) if is_causal else None
        return causal, None  # (L, S): 0 where query i keeps key j <= i, -inf after
    if attn_mask.dtype == torch.bool:
        bias, keep = None, attn_mask
    else:
        bias, keep = attn_mask, attn_mask != float("-inf")
    if is_causal:
        keep = keep & causal_mask(L, S, device=device)  # (..., L, S)
    return bias, keep


def _weights_and_output(scores: Tensor, value: Tensor, *, attn_mask: Tensor | None,
                        is_causal: bool, dropout_p: float) -> tuple[Tensor, Tensor]:
    """The second half of attention, for any scores: the masked softmax, dropout,
    then the weighted sum of the values. Returns ``(weights @ value, weights)``."""
    weights = _masked_softmax(scores, attn_mask, is_causal)  # (..., L, S)
    return _weighted_sum(weights, value, dropout_p)  # (..., L, Ev), (..., L, S)


def _weighted_sum(weights: Tensor, value: Tensor, dropout_p: float) -> tuple[Tensor, Tensor]:
    """Dropout on the weights, then their sum of the values: ``(weights @ value, weights)``."""
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
    # The scale goes on q, L x E numbers (fewer than the L x S scores
    # when there are more keys than the head is wide), and half-precision
    # inputs are multiplied in float32: a float16 product of large
    # entries can overflow.
    dtype = torch.promote_types(query.dtype, torch.float32)
    q, k = query.to(dtype) * scale, key.to(dtype)
    scores = q @ k.transpose(-2, -1)  # (..., L, S)
    # (..., L, Ev), (..., L, S)
    return _weights_and_output(scores, value, attn_mask=attn_mask,
                               is_causal=is_causal, dropout_p=dropout_p)


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
