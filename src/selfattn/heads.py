r"""Heads: from one wide vector per token to one narrow vector per head, and back.

Multi-head attention (Vaswani et al. 2017, §3.2.2) projects each token to ``n_heads * head_dim``
numbers and reads them as ``n_heads`` vectors of ``head_dim``: a reshape, then a transpose that
puts the heads next to the batch, so that every head attends on its own:

``(B, T, H * hd)  --split_heads-->  (B, H, T, hd)  --attend-->  (B, H, T, hd)  --merge_heads-->
(B, T, H * hd)``

Grouped-query attention (Ainslie et al. 2023) has fewer key/value heads than query heads;
:func:`repeat_kv` gives each of them to its group of query heads, as Hugging Face's ``repeat_kv``
does (``torch.repeat_interleave`` along the heads).
"""

from __future__ import annotations

from torch import Tensor

from .checks import check_positive_int


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """``(B, T, n_heads * hd)`` -> ``(B, n_heads, T, hd)``: head ``h`` is features
    ``h * hd .. (h + 1) * hd - 1`` of every token."""
    width = _shape(x, "(batch, seq, n_heads * head_dim)")[-1]
    if width % check_positive_int(n_heads, "n_heads"):
        raise ValueError(f"{width} features do not split into {n_heads} heads of equal width")
    return _split_heads(x, n_heads)


def merge_heads(x: Tensor) -> Tensor:
    """``(B, n_heads, T, hd)`` -> ``(B, T, n_heads * hd)``: each token's heads side by side."""
    _shape(x, "(batch, n_heads, seq, head_dim)")
    return _merge_heads(x)


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """``(B, H_kv, S, hd)`` -> ``(B, H_kv * n_rep, S, hd)``: key/value head ``j`` serves query
    heads ``j * n_rep .. (j + 1) * n_rep - 1``. This copies the keys ``n_rep`` times;
    :mod:`selfattn.fastpaths` gets the same result without."""
    _shape(x, "(batch, n_kv_heads, seq, head_dim)")
    return _repeat_kv(x, check_positive_int(n_rep, "n_rep"))


# The unchecked cores: MultiHeadAttention and the fast paths, which have checked their inputs
# already, call these (validate once, at the public boundary).


def _split_heads(x: Tensor, n_heads: int) -> Tensor:
    B, T, width = x.shape
    return x.view(B, T, n_heads, width // n_heads).transpose(1, 2)  # (B, H, T, hd)


def _merge_heads(x: Tensor) -> Tensor:
    B, H, T, hd = x.shape
    return x.transpose(1, 2).reshape(B, T, H * hd)  # (B, T, H*hd)


def _repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    return x.repeat_interleave(n_rep, dim=-3)  # (..., H_kv * n_rep, S, hd): the heads are dim -3


def _shape(x: Tensor, layout: str) -> tuple[int, ...]:
    """``x``'s shape, checked to have as many dimensions as ``layout`` names."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    rank = layout.count(",") + 1
    if x.dim() != rank:
        raise ValueError(f"x must be {layout}, {rank} dimensions; got shape {tuple(x.shape)}")
    return tuple(x.shape)
