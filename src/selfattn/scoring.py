r"""Scoring functions: how relevant is key $k$ to query $q$?

* dot product: $s(q, k) = q \cdot k$;
* scaled dot product (Vaswani et al. 2017, §3.2.1): $s(q, k) = q \cdot k / \sqrt{d_k}$;
* additive (Bahdanau et al. 2015, §3.1 and appendix A.1.2): $s(q, k) = w^\top \tanh(W_q q + W_k k)$;
* general (Luong et al. 2015, §3.1): $s(q, k) = q^\top W k$.

A scorer maps ``query (..., L, Eq)`` and ``key (..., S, Ek)`` to scores ``(..., L, S)``;
:func:`attention` turns any scorer's scores into weights with the library's masked softmax.
The dot products need ``Eq == Ek``; the additive and general scorers hold learned matrices that
bridge the two widths, so they do not.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from .attention import _weights_and_output
from .checks import check_dropout, check_mask, check_positive_int, check_same_dtype_device, check_tensor

Scorer = Callable[[Tensor, Tensor], Tensor]


def _check_pair(query: object, key: object, same_width: bool) -> None:
    q = check_tensor(query, "query", min_rank=2)
    k = check_tensor(key, "key", min_rank=2)
    check_same_dtype_device(query=q, key=k)
    if same_width and q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"a dot product needs query and key of the same width, got query "
            f"{tuple(q.shape)} and key {tuple(k.shape)}; project one of them first, or "
            "use the additive scorer"
        )


def dot_scores(query: Tensor, key: Tensor) -> Tensor:
    r"""$q \cdot k$ for every query and key: ``(..., L, E), (..., S, E) -> (..., L, S)``.

    Half-precision inputs are multiplied in float32 (the scores come back in float32): a float16
    product of large entries overflows to infinity.
    """
    _check_pair(query, key, same_width=True)
    dtype = torch.promote_types(query.dtype, torch.float32)
    return query.to(dtype) @ key.to(dtype).transpose(-2, -1)  # (..., L, S)


def scaled_dot_scores(query: Tensor, key: Tensor, scale: float | None = None) -> Tensor:
    r"""$q \cdot k \cdot \text{scale}$, by default $\text{scale} = 1/\sqrt{d_k}$; half-precision
    inputs are multiplied in float32, as in :func:`dot_scores`."""
    _check_pair(query, key, same_width=True)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    dtype = torch.promote_types(query.dtype, torch.float32)
    return (query.to(dtype) * scale) @ key.to(dtype).transpose(-2, -1)  # (..., L, S)


class AdditiveScorer(nn.Module):
    r"""Bahdanau et al.'s additive score $w^\top \tanh(W_q q + W_k k)$, with its parameters.

    ``query_dim`` and ``key_dim`` may differ. The sum $W_q q + W_k k$ is formed for every pair,
    a ``(..., L, S, hidden)`` tensor: memory and time grow with ``L * S * hidden``, not
    ``L * S`` as for a dot product.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden: int) -> None:
        super().__init__()
        self.w_q = nn.Linear(check_positive_int(query_dim, "query_dim"), hidden, bias=False)
        self.w_k = nn.Linear(check_positive_int(key_dim, "key_dim"), hidden, bias=True)
        self.w = nn.Linear(check_positive_int(hidden, "hidden"), 1, bias=False)

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        _check_pair(query, key, same_width=False)
        for name, x, width in [("query", query, self.w_q.in_features),
                               ("key", key, self.w_k.in_features)]:
            if x.shape[-1] != width:
                raise ValueError(f"{name} must have {width} features, got shape {tuple(x.shape)}")
        if query.dtype != self.w_q.weight.dtype:
            raise TypeError(f"query and key have dtype {query.dtype}, the scorer's parameters "
                            f"{self.w_q.weight.dtype}; convert one (scorer.to(dtype))")
        hq = self.w_q(query).unsqueeze(-2)  # (..., L, 1, h)
        hk = self.w_k(key).unsqueeze(-3)  # (..., 1, S, h)
        return self.w(torch.tanh(hq + hk)).squeeze(-1)  # (..., L, S, h) -> (..., L, S)


class GeneralScorer(nn.Module):
    r"""Luong et al.'s "general" score $s(q, k) = q^\top W k$ (Luong et al. 2015, §3.1): a dot
    product through a learned matrix ``weight`` of shape ``(query_dim, key_dim)``, so queries and
    keys may have different widths. ``(..., L, Eq), (..., S, Ek) -> (..., L, S)``; nothing is built
    per pair. Half-precision inputs are multiplied in float32, as in :func:`dot_scores`.
    """

    def __init__(self, query_dim: int, key_dim: int) -> None:
        super().__init__()
        q_dim = check_positive_int(query_dim, "query_dim")
        k_dim = check_positive_int(key_dim, "key_dim")
        self.weight = nn.Parameter(torch.randn(q_dim, k_dim) / math.sqrt(q_dim))

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        _check_pair(query, key, same_width=False)
        for name, x, width in [("query", query, self.weight.shape[0]),
                               ("key", key, self.weight.shape[1])]:
            if x.shape[-1] != width:
                raise ValueError(f"{name} must have {width} features, got shape {tuple(x.shape)}")
        # half precision is multiplied in float32, as in dot_scores; float64 stays float64
        dtype = torch.promote_types(torch.promote_types(query.dtype, torch.float32),
                                    self.weight.dtype)
        q, w, k = query.to(dtype), self.weight.to(dtype), key.to(dtype)
        return (q @ w) @ k.transpose(-2, -1)  # (..., L, Ek) -> (..., L, S)


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    scorer: Scorer = scaled_dot_scores,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> tuple[Tensor, Tensor]:
    r"""$\operatorname{softmax}(s(Q, K) + M)\,V$ for any scorer $s$; returns ``(output, weights)``.

    Masks mean what they mean in :func:`selfattn.scaled_dot_product_attention`: bool True = may
    attend, float = added to the scores; fully masked rows get zero weights.
    """
    check_tensor(value, "value", min_rank=2)
    scores = scorer(query, key)  # (..., L, S)
    if value.shape[-2] != key.shape[-2]:
        raise ValueError(
            f"key and value must have the same length S, got key {tuple(key.shape)} and value "
            f"{tuple(value.shape)}"
        )
    return _attend_to_scores(scores, value, attn_mask=attn_mask, dropout_p=dropout_p,
                             is_causal=is_causal)  # (..., L, Ev), (..., L, S)


def _attend_to_scores(scores: Tensor, value: Tensor, *, attn_mask: Tensor | None,
                      dropout_p: float, is_causal: bool) -> tuple[Tensor, Tensor]:
    """Weights from ``scores`` (..., L, S), then their sum of ``value`` (..., S, Ev), as in
    :func:`selfattn.scaled_dot_product_attention`; checks the mask against the scores."""
    if attn_mask is not None:
        check_mask(attn_mask, tuple(scores.shape))
    return _weights_and_output(scores, value, attn_mask=attn_mask, is_causal=is_causal,
                               dropout_p=check_dropout(dropout_p))  # (..., L, Ev), (..., L, S)


class ScoredSelfAttention(nn.Module):
    """One head of self-attention whose scorer is chosen by name: ``"dot"`` (no scale),
    ``"scaled_dot"`` or ``"additive"``. Called like :class:`~selfattn.MultiHeadAttention` on
    ``x`` (B, T, d): returns ``(output, weights)``, the weights ``(B, 1, T, T)`` (one head) when
    ``need_weights``, else None.

    The dot-product heads hold $W^q$, $W^k$ (with biases) and score the projections; the additive
    head scores ``x`` itself, its own $W_q$, $W_k$ being the projections, so that no two linear
    maps are stacked. With ``hidden = d_model`` (the default) the two kinds have exactly as many
    parameters: $2(d^2 + d)$ for the scores, and $W^v$ for the values.
    """

    SCORERS = ("dot", "scaled_dot", "additive")

    def __init__(self, d_model: int, scorer: str = "scaled_dot", hidden: int | None = None) -> None:
        super().__init__()
        if scorer not in self.SCORERS:
            raise ValueError(f"scorer must be one of {self.SCORERS}, got {scorer!r}")
        self.scorer_name = scorer
        if scorer == "additive":
            self.additive = AdditiveScorer(d_model, d_model, hidden or d_model)
        else:
            self.q_proj = nn.Linear(d_model, d_model)
            self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)

    def score(self, x: Tensor) -> Tensor:
        """The ``(B, T, T)`` scores of ``x`` (B, T, d) against itself."""
        if self.scorer_name == "additive":
            return self.additive(x, x)  # w^T tanh(W_q x_i + W_k x_j)
        q, k = self.q_proj(x), self.k_proj(x)  # (B, T, d) each
        return dot_scores(q, k) if self.scorer_name == "dot" else scaled_dot_scores(q, k)

    def forward(self, x: Tensor, *, attn_mask: Tensor | None = None, is_causal: bool = False,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        out, weights = _attend_to_scores(self.score(x), self.v_proj(x), attn_mask=attn_mask,
                                         dropout_p=0.0, is_causal=is_causal)  # (B, T, d), (B, T, T)
        return out, weights.unsqueeze(1) if need_weights else None  # (B, 1, T, T): one head
