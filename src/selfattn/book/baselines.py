"""Baselines to measure the library against: attention as the second source article writes it.

The article splits and merges heads with einops' ``rearrange`` and computes the products with
``torch.einsum``; its class has eight bugs, which chapter 8 finds and fixes one by one.
:class:`EinopsSelfAttention` is that class with every fix applied (the chapter shows this code),
and :func:`einsum_attention` its core; :func:`matmul_attention` is the same core written with
``@``, the control that shows what einsum costs. ``make bench`` times them beside the library.

:func:`bare_decode_step` is one decoding step of a :class:`~selfattn.MultiHeadAttention` with
the same kernels and none of the layer's Python around them; ``make bench`` times it beside the
layer to show what that Python costs per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .. import fastpaths
from ..attention import masked_softmax
from ..cache import KVCache
from ..multihead import MultiHeadAttention


def einsum_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Attention in einsum notation: ``(B, H, T, hd)`` in and out, no mask."""
    scores = torch.einsum("bhld,bhsd->bhls", q * q.shape[-1] ** -0.5, k)  # (B, H, L, S)
    return torch.einsum("bhls,bhsd->bhld", torch.softmax(scores, dim=-1), v)  # (B, H, L, hd)


def matmul_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """:func:`einsum_attention` with ``@``: ``softmax(q k^T / sqrt(hd)) v``, nothing else."""
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, H, L, S)
    return torch.softmax(scores, dim=-1) @ v  # (B, H, L, hd)


class EinopsSelfAttention(nn.Module):
    """The second article's ``SelfAttention``, fixed: same arguments ``(values, keys,
    query, mask)``, same parameter names as :class:`~selfattn.MultiHeadAttention`."""

    def __init__(self, embed_size: int, heads: int) -> None:
        super().__init__()
        if embed_size % heads:
            raise ValueError(
                f"embed_size ({embed_size}) must be divisible by heads ({heads})"
            )
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


def bare_decode_step(layer: MultiHeadAttention, x: Tensor, cache: KVCache) -> Tensor:
    """What ``layer(x, is_causal=True, kv_cache=cache)[0]`` computes for one new token ``x``
    ``(1, 1, d_model)`` (batch 1, inference, no RoPE), as one function: the same products, the
    same cache and the same attention kernels, without the layer's input checks, submodule
    calls, head helpers and dispatch (it still calls ``cache.append`` and
    :func:`~selfattn.fastpaths.decode_attention`, which splits the cache across threads where
    the layer would). The one new query sees every cached key, so no mask is needed."""
    cfg = layer.config
    if cfg.rope or layer.training or tuple(x.shape) != (1, 1, cfg.d_model):
        raise ValueError(f"bare_decode_step takes one token (1, 1, {cfg.d_model}) for a layer in "
                         f"eval mode without RoPE; got x {tuple(x.shape)}, rope={cfg.rope}, "
                         f"training={layer.training}")
    H, H_kv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q = F.linear(x, layer.q_proj.weight, layer.q_proj.bias)  # (1, 1, H*hd)
    k = F.linear(x, layer.k_proj.weight, layer.k_proj.bias)  # (1, 1, H_kv*hd)
    v = F.linear(x, layer.v_proj.weight, layer.v_proj.bias)  # (1, 1, H_kv*hd)
    q = q.view(1, H_kv, H // H_kv, hd)  # (1, H_kv, g, hd): each group's query heads stacked
    k, v = cache.append(k.view(1, H_kv, 1, hd), v.view(1, H_kv, 1, hd))  # (1, H_kv, S, hd)
    out = fastpaths.decode_attention(q, k, v)  # (1, H_kv, g, hd): split_kv where it pays
    return F.linear(out.reshape(1, 1, H * hd), layer.out_proj.weight, layer.out_proj.bias)
