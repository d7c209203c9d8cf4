"""Chapter 8, pitfalls: the second article's layer with its bugs fixed, and the chapter's checkers.

The article splits and merges heads with einops' ``rearrange`` and computes the products with
``torch.einsum``; its class has eight bugs, which chapter 8 finds and fixes one by one.
:class:`EinopsSelfAttention` is that class with every fix applied (the chapter shows this code).
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import Tensor, nn

from ..attention import masked_softmax
from ..heads import merge_heads
from ..masks import causal_mask
from .kit.checkers import NotYet, _call, _checker, _tensor


class EinopsSelfAttention(nn.Module):
    """The second article's ``SelfAttention``, fixed: same arguments ``(values, keys,
    query, mask)``, same parameter names as :class:`~selfattn.MultiHeadAttention`."""

    def __init__(self, embed_size: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = embed_size // heads
        # fix 3: full-width projections, one per role, applied in forward
        self.q_proj = nn.Linear(embed_size, embed_size)
        self.k_proj = nn.Linear(embed_size, embed_size)
        self.v_proj = nn.Linear(embed_size, embed_size)
        self.out_proj = nn.Linear(embed_size, embed_size)

    def forward(self, values: Tensor, keys: Tensor, query: Tensor,
                mask: Tensor | None = None) -> Tensor:
        """mask: bool (B, S), True = may attend (fix 5: one stated convention)."""
        # fix 2: a batch axis b in every pattern
        q = rearrange(self.q_proj(query), "b n (h d) -> b h n d", h=self.heads)
        k = rearrange(self.k_proj(keys), "b n (h d) -> b h n d", h=self.heads)
        v = rearrange(self.v_proj(values), "b n (h d) -> b h n d", h=self.heads)
        # fix 4: divide by sqrt(head_dim)
        energy = torch.einsum("bhqd,bhkd->bhqk", q, k) / self.head_dim**0.5
        allowed = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, S)
        # fix 6 and 7: -inf, fp32, dead rows to zero, softmax over the last axis
        attention = masked_softmax(energy, allowed).to(v.dtype)  # (B, H, L, S)
        out = torch.einsum("bhqk,bhkd->bhqd", attention, v)
        # fix 8: merge heads with the head axis next to the features
        out = rearrange(out, "b h n d -> b n (h d)")
        return self.out_proj(out)


def merge_heads_entry(shape: tuple[int, int, int, int], token: int, feature: int) -> int:
    """Chapter 8, exercise 1: for ``x = torch.arange(B * H * T * hd).reshape(shape)``, the number
    at ``[0, token, feature]`` of :func:`selfattn.merge_heads` ``(x)``."""
    x = torch.arange(math.prod(shape)).reshape(shape)
    return int(merge_heads(x)[0, token, feature])


def causal_pairs(L: int) -> int:
    """Chapter 8, exercise 3: how many (query, key) pairs the ``(L, L)`` causal mask lets attend."""
    return int(causal_mask(L).sum())


@_checker
def check_merge_heads(fn: object) -> str:
    """Chapter 8, exercise 1: ``fn(x)`` turns heads ``(B, H, T, hd)`` into ``(B, T, H * hd)``."""
    x = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(8))  # (B, H, T, hd)
    want = x.transpose(1, 2).reshape(2, 4, 15)  # (B, T, H * hd)
    got = _tensor(_call(fn, x), want)
    if torch.equal(got, x.reshape(2, 4, 15)):
        raise NotYet("the right shape, but in memory order: token 0 holds tokens 0 and 1 of head 0; "
                     "move the head axis first")
    if not torch.equal(got, want):
        raise NotYet("the values are not where they belong: token t, head h should sit at "
                     "[:, t, h * hd : (h + 1) * hd]")
    return "token t gets head 0's features, then head 1's, ..."
