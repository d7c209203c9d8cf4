r"""Multi-head latent attention (MLA): cache one small latent per token, not every head's keys.

DeepSeek-AI 2024, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language
Model", §2.1. Each token's hidden state $h_t$ is compressed to one latent vector, shared by all
heads, and every head's key and value are read back from it (§2.1.2, low-rank key-value joint
compression):

$$c^{KV}_t = W^{DKV} h_t, \qquad k^C_{t,i} = W^{UK}_i\, c^{KV}_t, \qquad
v^C_{t,i} = W^{UV}_i\, c^{KV}_t$$

with $c^{KV}_t$ of ``kv_rank`` numbers ($d_c$ in the paper). Only $c^{KV}_t$ is cached, so a
token costs ``kv_rank`` numbers per layer where multi-head attention stores
``2 * n_heads * head_dim``.

**Absorbing the up-projections.** A score is $q_{t,i}^\top k^C_{j,i} =
q_{t,i}^\top W^{UK}_i c^{KV}_j = (W^{UK\top}_i q_{t,i})^\top c^{KV}_j$: the query can be mapped
into the latent space once, and compared with the cached latents directly. Likewise
$W^O_i \sum_j a_{tj} W^{UV}_i c^{KV}_j = (W^O_i W^{UV}_i) \sum_j a_{tj} c^{KV}_j$: the weighted
sum of the latents goes straight into an output projection with $W^{UV}$ folded in: §2.1.2
absorbs $W^{UK}$ into $W^Q$ and $W^{UV}$ into $W^O$ at inference, and no per-head key or value is
ever built.

**Decoupled RoPE** (§2.1.3). RoPE rotates a query at position $i$ by $R_i$ and a key at $j$ by
$R_j$, and $(R_i q)^\top (R_j k) = q^\top R_{j-i}\, k$. Rotating the up-projected key
$k = W^{UK} c_j$ would give $q^\top R_{j-i} W^{UK} c_j$: a matrix that changes with the
position sits between the query and $W^{UK}$, so $W^{UK}$ can no longer be absorbed into the
query (matrix products do not commute), and every cached latent would have to be up-projected
again at each step. MLA therefore keeps position in separate, small parts: a query part per
head $q^R_{t,i} = \operatorname{RoPE}(W^{QR}_i h_t)$ and one key part shared by every head
$k^R_t = \operatorname{RoPE}(W^{KR} h_t)$, each of ``rope_dim`` numbers ($d^R_h$),
concatenated to the content parts:

$$q_{t,i} = [q^C_{t,i}; q^R_{t,i}], \qquad k_{j,i} = [k^C_{j,i}; k^R_j], \qquad
o_{t,i} = \sum_j \operatorname{softmax}_j\!\left(\frac{q_{t,i}^\top k_{j,i}}
{\sqrt{d_h + d^R_h}}\right) v^C_{j,i}$$

The cache then holds $c^{KV}_t$ and $k^R_t$: ``kv_rank + rope_dim`` numbers per token and layer.
DeepSeek-V2 sets $d_c = 4 d_h$ and $d^R_h = d_h / 2$, a cache of $\tfrac{9}{2} d_h$ per token, like
grouped-query attention with 2.25 groups (§2.1.4, Table 1).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import _masked_softmax, attend
from .cache import Cache, causal_after_append
from .checks import check_positive_int, check_tensor
from .heads import _merge_heads, _split_heads
from .positional import _apply_rope


class AbsorbedWeights(NamedTuple):
    """The two matrices of the absorbed form (:meth:`MultiHeadLatentAttention.absorbed_weights`).

    ``query`` ``(n_heads * kv_rank, d_model)``: head $i$'s rows are $W^{UK\top}_i W^Q_i$, the
    query mapped into the latent space. ``output`` ``(d_model, n_heads * kv_rank)``: head $i$'s
    columns are $W^O_i W^{UV}_i$, the output projection with the value up-projection folded in.
    The biases (``None`` without ``bias``) follow the same products.
    """

    query: Tensor
    query_bias: Tensor | None
    output: Tensor
    output_bias: Tensor | None


class MultiHeadLatentAttention(nn.Module):
    r"""Multi-head latent attention (DeepSeek-V2, §2.1): self-attention whose cache holds one
    latent vector per token (and, with ``rope_dim``, one shared rotated key), not every head's
    keys and values.

    Submodules (all ``nn.Linear``): ``kv_down`` $W^{DKV}$ ``d_model -> kv_rank``; ``k_up``
    $W^{UK}$ and ``v_up`` $W^{UV}$ ``kv_rank -> n_heads * head_dim``; ``q_proj`` $W^Q$
    ``d_model -> n_heads * head_dim``; ``out_proj`` $W^O$ ``n_heads * head_dim -> d_model``; with
    ``rope_dim > 0``, ``q_rope`` $W^{QR}$ ``d_model -> n_heads * rope_dim`` and ``k_rope``
    $W^{KR}$ ``d_model -> rope_dim`` (one key head shared by all), else both are ``None``.

    Kept simple: the queries are not compressed (the paper also passes them through a low-rank
    $W^{DQ}$, §2.1.2, to save activation memory in training; it changes nothing in the cache),
    and the layer attends over its own input only (self-attention; no cross-attention, no
    ``attn_mask``, no dropout). ``bias`` applies to every projection except ``k_up``: a key bias
    $b$ adds $q^\top b$ to every score of a query's row, which the softmax ignores, so it would
    be a parameter without a gradient.
    """

    def __init__(self, d_model: int, n_heads: int, head_dim: int, kv_rank: int,
                 rope_dim: int = 0, bias: bool = False) -> None:
        super().__init__()
        for name, value in [("d_model", d_model), ("n_heads", n_heads), ("head_dim", head_dim),
                            ("kv_rank", kv_rank)]:
            check_positive_int(value, name)
        if isinstance(rope_dim, bool) or not isinstance(rope_dim, int):
            raise TypeError(f"rope_dim must be an int, got {type(rope_dim).__name__}")
        if rope_dim < 0 or rope_dim % 2:
            raise ValueError(f"rope_dim must be 0 (no RoPE) or a positive even number (RoPE "
                             f"rotates pairs of features), got {rope_dim}")
        if not isinstance(bias, bool):
            raise TypeError(f"bias must be a bool, got {type(bias).__name__}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.kv_rank, self.rope_dim = kv_rank, rope_dim
        self.kv_down = nn.Linear(d_model, kv_rank, bias=bias)
        self.k_up = nn.Linear(kv_rank, n_heads * head_dim, bias=False)
        self.v_up = nn.Linear(kv_rank, n_heads * head_dim, bias=bias)
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=bias)
        self.out_proj = nn.Linear(n_heads * head_dim, d_model, bias=bias)
        self.q_rope: nn.Linear | None = None
        self.k_rope: nn.Linear | None = None
        # absorbed_weights(), and what it was computed from: (param, data_ptr, version) each
        self._absorbed_memo: tuple[tuple, AbsorbedWeights] | None = None
        if rope_dim:
            self.q_rope = nn.Linear(d_model, n_heads * rope_dim, bias=bias)
            self.k_rope = nn.Linear(d_model, rope_dim, bias=bias)

    @property
    def scale(self) -> float:
        r"""$1/\sqrt{d_h + d^R_h}$: a query and a key have ``head_dim + rope_dim`` features."""
        return 1.0 / math.sqrt(self.head_dim + self.rope_dim)

    def cache_numbers_per_token(self) -> int:
        """Numbers cached per token (in this layer): the latent and the shared rope key,
        ``kv_rank + rope_dim``; multi-head attention caches ``2 * n_heads * head_dim``."""
        return self.kv_rank + self.rope_dim

    def forward(self, x: Tensor, *, is_causal: bool = False, kv_cache: Cache | None = None,
                absorb: bool = False) -> Tensor:
        """Self-attention over ``x`` (B, L, d_model); returns ``(B, L, d_model)``.

        ``is_causal``: token ``i`` sees tokens up to its own position. ``kv_cache``: any
        :class:`~selfattn.cache.Cache` for this layer and batch (every token, paged, a sliding
        window, attention sinks), as ``MultiHeadAttention.forward``'s. It holds the latents
        ``(B, 1, T, kv_rank)`` as its keys and the rotated shared rope keys
        ``(B, 1, T, rope_dim)`` as its values (zero wide without RoPE: a
        :class:`~selfattn.cache.BlockPool` then has ``value_dim=0``). The ``L`` new tokens sit at
        positions ``kv_cache.length .. kv_cache.length + L - 1``, are appended, and attend to the
        tokens the cache returns: under ``is_causal`` those its rule allows
        (:func:`~selfattn.cache.causal_after_append`), else all of them.

        What it costs (tests/test_costs.py): the readable attention, whose ``(B, H, L, S)``
        scores are computed whole; a causal call without a cache builds the ``(L, S)`` causal
        mask. The explicit form also up-projects every cached latent to every head's keys and
        values at each call, ``(B, H, S, head_dim)`` each; the absorbed one reads the cache as
        it is (no copy per head, none per step; in float16 or bfloat16 it multiplies in float32,
        as :func:`~selfattn.attention.attend` does, so it reads a float32 copy of the latents),
        which is why decoding uses it, with its two matrices computed once and kept until a
        weight changes (:meth:`absorbed_weights`; recomputed at every call where autograd
        records).

        ``absorb``: compute with $W^{UK}$ absorbed into the query and $W^{UV}$ into the output
        projection (the decode form, :meth:`absorbed_weights`) instead of up-projecting every
        cached latent to per-head keys and values. The two forms give the same numbers up to
        rounding and share one cache (a prompt can be read in the explicit form and the answer
        decoded in the absorbed one).
        """
        self._check_inputs(x, kv_cache, is_causal, absorb)
        L = x.shape[1]
        P = 0 if kv_cache is None else kv_cache.length  # tokens already in the cache
        positions = torch.arange(P, P + L, device=x.device)  # the new tokens' positions

        # compress: one latent per token, shared by every head
        latent = self.kv_down(x)[:, None]  # (B, 1, L, r)
        # rotate: the decoupled position parts, a query part per head and one shared key
        q_rope, k_rope = self._rope_parts(x, positions)  # (B, H, L, dr), (B, 1, L, dr)
        # cache: what a token leaves behind is its latent and its rotated rope key
        if kv_cache is not None:
            # recorded: autograd may save the latents for any weight's gradient (or the input's)
            recorded = x.requires_grad or any(p.requires_grad for p in self.parameters())
            latent, k_rope = kv_cache.append(latent, k_rope, recorded=recorded)  # (B, 1, S, r), (B, 1, S, dr)
        # mask: after P cached tokens the queries sit at P..P+L-1 (and a cache may have dropped
        # keys), so the cache's rule says which returned keys each new query sees
        attn_mask = None
        if is_causal and kv_cache is not None:
            is_causal, attn_mask = causal_after_append(kv_cache, L, device=x.device)  # (L, S) or None
        # attend, merge heads, project out
        if absorb:
            return self._absorbed(x, q_rope, latent, k_rope, attn_mask, is_causal)
        return self._explicit(x, q_rope, latent, k_rope, attn_mask, is_causal)

    def _rope_parts(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The rotated query parts ``(B, H, L, dr)`` and shared key part ``(B, 1, L, dr)``
        (zero wide when ``rope_dim`` is 0)."""
        B, L, _ = x.shape
        if self.q_rope is None or self.k_rope is None:
            return x.new_empty(B, self.n_heads, L, 0), x.new_empty(B, 1, L, 0)
        q_rope = _split_heads(self.q_rope(x), self.n_heads)  # (B, H, L, dr)
        k_rope = self.k_rope(x)[:, None]  # (B, 1, L, dr): one head for all
        return _apply_rope(q_rope, positions), _apply_rope(k_rope, positions)

    def _explicit(self, x: Tensor, q_rope: Tensor, latent: Tensor, k_rope: Tensor,
                  attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        """Up-project every latent to per-head keys and values, then ordinary attention."""
        q = _split_heads(self.q_proj(x), self.n_heads)  # (B, H, L, hd)
        q = torch.cat([q, q_rope], dim=-1)  # (B, H, L, hd + dr)
        k, v = self._keys_and_values(latent, k_rope)  # (B, H, S, hd + dr), (B, H, S, hd)
        out, _ = attend(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                        scale=self.scale)  # (B, H, L, hd)
        return self.out_proj(_merge_heads(out))  # (B, L, d_model)

    def _keys_and_values(self, latent: Tensor, k_rope: Tensor) -> tuple[Tensor, Tensor]:
        """Every head's keys ``(B, H, S, hd + dr)`` and values ``(B, H, S, hd)`` from the latents
        ``(B, 1, S, r)`` and the shared rope keys ``(B, 1, S, dr)``."""
        H = self.n_heads
        k = _split_heads(self.k_up(latent[:, 0]), H)  # (B, H, S, hd): W^UK_i c_j
        v = _split_heads(self.v_up(latent[:, 0]), H)  # (B, H, S, hd): W^UV_i c_j
        k = torch.cat([k, k_rope.expand(-1, H, -1, -1)], dim=-1)  # (B, H, S, hd + dr)
        return k, v

    def _absorbed(self, x: Tensor, q_rope: Tensor, latent: Tensor, k_rope: Tensor,
                  attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        r"""Attend in the latent space: every head's query meets the cached latents themselves.

        A score is a content part and a position part, $\tilde q_{t,i}^\top c_j +
        q^{R\top}_{t,i} k^R_j$: two products over the cache as it is (one concatenated key
        $[c_j; k^R_j]$ would copy the whole cache at every step). Every head meets the one
        latent head, as in MQA: the heads' queries are stacked into one product with it
        (broadcasting the latents over the heads would copy them once per head)."""
        w = self.absorbed_weights()
        B, L, _ = x.shape
        H, r, S = self.n_heads, self.kv_rank, latent.shape[2]
        dtype = torch.promote_types(x.dtype, torch.float32)  # half precision multiplied in fp32
        q = _split_heads(F.linear(x, w.query, w.query_bias), H)  # (B, H, L, r)
        q = q.reshape(B, 1, H * L, r).to(dtype) * self.scale  # (B, 1, H*L, r): heads stacked
        scores = q @ latent.to(dtype).transpose(-2, -1)  # (B, 1, H*L, S): the content part
        if self.rope_dim:
            q_r = q_rope.reshape(B, 1, H * L, self.rope_dim).to(dtype) * self.scale  # (B, 1, H*L, dr)
            scores = scores + q_r @ k_rope.to(dtype).transpose(-2, -1)  # ... plus the position part
        weights = _masked_softmax(scores.view(B, H, L, S), attn_mask, is_causal)  # (B, H, L, S)
        out = weights.to(latent.dtype).view(B, 1, H * L, S) @ latent  # (B, 1, H*L, r): sums of latents
        # the scale stays that of a head's full query; the output projection has W^UV folded in
        return F.linear(_merge_heads(out.view(B, H, L, r)), w.output, w.output_bias)  # (B, L, d_model)

    def absorbed_weights(self) -> AbsorbedWeights:
        r"""$W^{UK}$ absorbed into $W^Q$ and $W^{UV}$ into $W^O$ (§2.1.2), from the current
        weights.

        Per head $i$: $\tilde W^Q_i = W^{UK\top}_i W^Q_i$ ``(kv_rank, d_model)`` and
        $\tilde W^O_i = W^O_i W^{UV}_i$ ``(d_model, kv_rank)``. With biases, the query's is
        $W^{UK\top}_i b^Q_i$ and the output's $b^O + \sum_i W^O_i b^{UV}_i$: a token's weights
        sum to 1, so the value bias passes through the weighted sum unchanged.

        Computing them costs two products of the weights, ``2 * n_heads * head_dim * kv_rank *
        d_model`` multiply-adds, more than a decoding step's attention at short contexts, so
        they are computed once and kept, as a server does, and the same tensors come back until
        a weight they are made of changes: in place (an optimiser's step, ``load_state_dict``,
        each tracked by the tensor's version counter) or replaced (``.to()``, a new
        ``nn.Parameter``). Where autograd records (grad mode on and one of those weights
        requiring grad) they are recomputed at every call instead, so that gradients reach the
        weights.
        """
        params = self._absorbed_from()
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            return self._absorb()  # differentiable: the gradients flow through the products
        key = tuple((p, p.data_ptr(), p._version) for p in params)
        memo = self._absorbed_memo
        if memo is None or len(memo[0]) != len(key) or any(
                a is not b or a_ptr != b_ptr or a_version != b_version
                for (a, a_ptr, a_version), (b, b_ptr, b_version) in zip(memo[0], key, strict=True)):
            with torch.inference_mode(False), torch.no_grad():  # plain tensors, in any mode
                memo = (key, self._absorb())
            self._absorbed_memo = memo
        return memo[1]

    def _absorbed_from(self) -> list[Tensor]:
        """The weights :meth:`absorbed_weights` reads."""
        return [t for lin in (self.q_proj, self.k_up, self.v_up, self.out_proj)
                for t in (lin.weight, lin.bias) if t is not None]

    def _absorb(self) -> AbsorbedWeights:
        """:meth:`absorbed_weights`, computed now."""
        H, hd, r, d = self.n_heads, self.head_dim, self.kv_rank, self.d_model
        w_q = self.q_proj.weight.view(H, hd, d)  # (H, hd, d): W^Q_i
        w_uk = self.k_up.weight.view(H, hd, r)  # (H, hd, r): W^UK_i
        w_uv = self.v_up.weight.view(H, hd, r)  # (H, hd, r): W^UV_i
        w_o = self.out_proj.weight.view(d, H, hd).transpose(0, 1)  # (H, d, hd): W^O_i
        query = (w_uk.mT @ w_q).reshape(H * r, d)  # (H*r, d): head i's rows W^UK_i^T W^Q_i
        output = (w_o @ w_uv).transpose(0, 1).reshape(d, H * r)  # (d, H*r): head i's W^O_i W^UV_i
        query_bias = output_bias = None
        if self.q_proj.bias is not None:
            b_q = self.q_proj.bias.view(H, hd, 1)  # (H, hd, 1)
            query_bias = (w_uk.mT @ b_q).reshape(H * r)  # (H*r,)
        if self.out_proj.bias is not None and self.v_up.bias is not None:
            output_bias = self.out_proj.bias + self.out_proj.weight @ self.v_up.bias  # (d,)
        return AbsorbedWeights(query, query_bias, output, output_bias)

    def _check_inputs(self, x: Tensor, kv_cache: Cache | None, is_causal: bool,
                      absorb: bool) -> None:
        check_tensor(x, "x")
        if x.dim() != 3:
            raise ValueError(f"x must be (batch, seq, d_model), got shape {tuple(x.shape)}")
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must have d_model = {self.d_model} features (last dim), got "
                             f"shape {tuple(x.shape)}")
        if x.shape[1] == 0:
            raise ValueError(f"x must hold at least one token, got shape {tuple(x.shape)}")
        for name, flag in [("is_causal", is_causal), ("absorb", absorb)]:
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        if kv_cache is not None and not isinstance(kv_cache, Cache):
            raise TypeError("kv_cache must be a selfattn.cache.Cache (KVCache, PagedKVCache, "
                            f"SlidingWindowCache, SinkCache), got {type(kv_cache).__name__}")
