r"""Multi-head attention with any number of key/value heads: MHA, GQA and MQA, plus a KV cache.

$$\operatorname{MultiHead}(Q, K, V) = \operatorname{Concat}(\text{head}_1, \dots, \text{head}_h)\,W^O,
\qquad \text{head}_i = \operatorname{Attention}(QW_i^Q, KW_{g(i)}^K, VW_{g(i)}^V)$$

* MHA (Vaswani et al. 2017, §3.2.2): every query head has its own key/value head, $g(i) = i$.
* MQA (Shazeer 2019, "Fast Transformer Decoding: One Write-Head is All You Need"): one key/value
  head shared by all query heads, $g(i) = 1$.
* GQA (Ainslie et al. 2023, §2): ``n_kv_heads`` groups; query head $i$ uses key/value head
  $g(i) = \lfloor i / (h / h_{kv}) \rfloor$ (the ``repeat_interleave`` order).

The query heads that share a key/value head are stacked along the sequence axis, so each group
attends to its keys in one matmul and the keys are never copied ``h / h_kv`` times. During decoding
that copy would cost as much memory traffic as MHA's whole cache, and MQA would lose its point.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import scaled_dot_product_attention
from .checks import check_dropout, check_mask, check_positive_int, check_tensor
from .masks import causal_mask
from .positional import apply_rope


@dataclass(frozen=True)
class AttentionConfig:
    """The sizes of a :class:`MultiHeadAttention`; checks itself when created.

    ``n_kv_heads`` defaults to ``n_heads`` (MHA), ``head_dim`` to ``d_model // n_heads``,
    ``kdim``/``vdim`` (the key and value inputs' sizes) and ``out_dim`` to ``d_model``.
    ``rope``: rotate queries and keys by their positions (RoPE, Su et al. 2021); needs an even
    ``head_dim``.
    """

    d_model: int
    n_heads: int
    n_kv_heads: int | None = None
    head_dim: int | None = None
    kdim: int | None = None
    vdim: int | None = None
    out_dim: int | None = None
    bias: bool = True
    dropout_p: float = 0.0
    rope: bool = False

    def __post_init__(self) -> None:
        check_positive_int(self.d_model, "d_model")
        check_positive_int(self.n_heads, "n_heads")
        n_kv = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
        check_positive_int(n_kv, "n_kv_heads")
        if self.n_heads % n_kv != 0:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({n_kv}): "
                "each key/value head serves a whole group of query heads"
            )
        if self.head_dim is None:
            if self.d_model % self.n_heads != 0:
                raise ValueError(
                    f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}), "
                    "or give head_dim explicitly"
                )
            head_dim = self.d_model // self.n_heads
        else:
            head_dim = check_positive_int(self.head_dim, "head_dim")
        if self.rope and head_dim % 2:
            raise ValueError(f"rope rotates pairs of features: head_dim must be even, got {head_dim}")
        kdim = self.d_model if self.kdim is None else check_positive_int(self.kdim, "kdim")
        vdim = self.d_model if self.vdim is None else check_positive_int(self.vdim, "vdim")
        out = self.d_model if self.out_dim is None else check_positive_int(self.out_dim, "out_dim")
        for name, value in [("n_kv_heads", n_kv), ("head_dim", head_dim), ("kdim", kdim),
                            ("vdim", vdim), ("out_dim", out),
                            ("dropout_p", check_dropout(self.dropout_p))]:
            object.__setattr__(self, name, value)

    @property
    def group_size(self) -> int:
        """How many query heads share one key/value head: ``n_heads // n_kv_heads``."""
        return self.n_heads // self.n_kv_heads


class KVCache:
    """Keys and values of the tokens seen so far, for token-by-token decoding.

    Stores ``(B, n_kv_heads, capacity, head_dim)`` buffers, allocated at the first append and
    doubled when full, so appending a token copies only that token (amortised O(1)), never the
    whole cache as ``torch.cat`` would. MQA's cache is ``n_heads`` times smaller than MHA's.
    """

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = check_positive_int(capacity, "capacity")
        self.length = 0
        self._k: Tensor | None = None
        self._v: Tensor | None = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add ``k``, ``v`` of shape ``(B, n_kv_heads, T, head_dim)``; return all keys and values."""
        B, n_kv, T, _ = k.shape
        end = self.length + T
        if self._k is None:
            cap = max(self.capacity, end)
            self._k = k.new_empty(B, n_kv, cap, k.shape[-1])  # (B, n_kv, cap, hd)
            self._v = v.new_empty(B, n_kv, cap, v.shape[-1])  # (B, n_kv, cap, hd_v)
        elif self._k.shape[:2] != (B, n_kv):
            raise ValueError(
                f"kv_cache holds keys of shape {tuple(self._k.shape[:2])} for (batch, n_kv_heads), "
                f"got {(B, n_kv)}; use a new KVCache for a new batch"
            )
        elif end > self._k.shape[2]:
            cap = max(2 * self._k.shape[2], end)
            for name in ("_k", "_v"):
                old = getattr(self, name)
                new = old.new_empty(*old.shape[:2], cap, old.shape[3])
                new[:, :, : self.length] = old[:, :, : self.length]
                setattr(self, name, new)
        self._k[:, :, self.length : end] = k
        self._v[:, :, self.length : end] = v
        self.length = end
        return self._k[:, :, :end], self._v[:, :, :end]  # (B, n_kv, S, hd), views

    @property
    def nbytes(self) -> int:
        """Bytes held by the keys and values stored so far (not counting spare capacity)."""
        if self._k is None:
            return 0
        per_token = (self._k[:, :, :1].nelement() + self._v[:, :, :1].nelement())
        return per_token * self.length * self._k.element_size()


def _group_mask(mask: Tensor, n_heads: int, n_kv_heads: int, L: int) -> Tensor:
    """Reshape a mask broadcastable to (B, n_heads, L, S) to (B, n_kv_heads, g*L, S)."""
    g = n_heads // n_kv_heads
    m = mask[(None,) * (4 - mask.dim())]  # (b, h, l, s), h in {1, H}, l in {1, L}
    b, h, l, s = m.shape
    if h == 1 and l == 1:
        return m  # broadcasts as it is
    if h == 1:
        return m[:, :, None].expand(b, 1, g, L, s).reshape(b, 1, g * L, s)  # (b, 1, g*L, s)
    return m.expand(b, n_heads, L, s).reshape(b, n_kv_heads, g * L, s)  # (b, n_kv, g*L, s)


SPLIT_KV_MIN_KEYS = 4096  # split a cache across threads from this many keys (see below)


def _decode_chunks(q: Tensor, k: Tensor) -> int:
    """How many parts to split the keys into for :func:`_split_kv_attention`; 1 = do not split.

    PyTorch's CPU attention kernel spreads its work over (batch, key/value head) pairs. Decoding
    one sequence with MQA has a single pair, so it runs on one core while the others wait;
    splitting the keys gives every thread a part. Worth it only for a few queries (decoding)
    against a long cache, on a CPU, with more threads than pairs.
    """
    B, H_kv, n_queries, _ = q.shape
    if (q.device.type != "cpu" or B != 1 or n_queries > 64 or k.shape[2] < SPLIT_KV_MIN_KEYS
            or not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")):
        return 1
    return torch.get_num_threads() // H_kv


def _split_kv_attention(q: Tensor, k: Tensor, v: Tensor, chunks: int) -> Tensor:
    r"""Attention of ``q`` (1, H_kv, n, hd) over ``k``, ``v`` (1, H_kv, S, hd), the keys split
    into ``chunks`` parts computed side by side and merged ("flash-decoding", Dao et al. 2023).

    Each part $c$ returns its output $o_c$ and the log-sum-exp $\ell_c$ of its scores; the exact
    result is $\sum_c e^{\ell_c - \ell}\, o_c$ with $\ell = \log \sum_c e^{\ell_c}$.
    """
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    _, H_kv, n, hd = q.shape
    S = k.shape[2]
    m = S // chunks

    def parts(t: Tensor) -> Tensor:  # (chunks, H_kv, m, hd): a view of the first chunks*m keys
        return t.as_strided((chunks, H_kv, m, t.shape[3]),
                            (m * t.stride(2), t.stride(1), t.stride(2), t.stride(3)),
                            t.storage_offset())

    out, lse = flash(q.expand(chunks, H_kv, n, hd), parts(k), parts(v))[:2]  # (c, H_kv, n, hd)
    if chunks * m < S:  # the few keys left over
        tail_out, tail_lse = flash(q, k[:, :, chunks * m :], v[:, :, chunks * m :])[:2]
        out, lse = torch.cat([out, tail_out]), torch.cat([lse, tail_lse])
    share = torch.softmax(lse, dim=0).to(out.dtype)  # (c, H_kv, n): each part's weight
    return (out * share[..., None]).sum(0, keepdim=True)  # (1, H_kv, n, hd)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (MHA), grouped-query (GQA) or multi-query (MQA) by ``n_kv_heads``.

    Submodules ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` are ``nn.Linear``. Inputs are
    batch first, ``(B, T, d)``. ``forward`` returns ``(output, weights)``; the weights
    ``(B, n_heads, L, S)`` are computed (by the explicit path) only when ``need_weights=True``,
    otherwise the fused ``torch.nn.functional.scaled_dot_product_attention`` runs and weights is
    ``None``. With ``rope=True`` the projected queries and keys are rotated by their positions
    (:func:`~selfattn.positional.apply_rope`); cached tokens keep the positions they had, and new
    ones continue after them.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        out_dim: int | None = None,
        bias: bool = True,
        dropout_p: float = 0.0,
        rope: bool = False,
    ) -> None:
        super().__init__()
        cfg = AttentionConfig(d_model, n_heads, n_kv_heads, head_dim, kdim, vdim, out_dim, bias,
                              dropout_p, rope)
        self.config = cfg
        self.q_proj = nn.Linear(d_model, cfg.n_heads * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.kdim, cfg.n_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.vdim, cfg.n_kv_heads * cfg.head_dim, bias=bias)
        self.out_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.out_dim, bias=bias)

    def _packed_projections(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``q_proj(x), k_proj(x), v_proj(x)`` as one matrix product with the three weights
        stacked: one larger product runs closer to the machine's peak than three small ones."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        weight = torch.cat([p.weight for p in projections])  # (H*hd + 2*H_kv*hd, d_model)
        bias = None if self.q_proj.bias is None else torch.cat([p.bias for p in projections])
        sizes = [p.out_features for p in projections]
        return F.linear(x, weight, bias).split(sizes, dim=-1)  # (B, T, out) each

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        cfg = self.config
        for name, x, width in [("query", query, cfg.d_model), ("key", key, cfg.kdim),
                               ("value", value, cfg.vdim)]:
            check_tensor(x, name)
            if x.dim() != 3:
                raise ValueError(f"{name} must be (batch, seq, features), got shape {tuple(x.shape)}")
            if x.shape[-1] != width:
                raise ValueError(
                    f"{name} must have {width} features (last dim), got shape {tuple(x.shape)}"
                )
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(
                f"query, key and value must have the same batch size, got {tuple(query.shape)}, "
                f"{tuple(key.shape)} and {tuple(value.shape)}"
            )
        if key.shape[1] != value.shape[1]:
            raise ValueError(
                f"key and value must have the same length, got {tuple(key.shape)} and "
                f"{tuple(value.shape)}"
            )

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        kv_cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` (B, L, d_model) to ``key`` (B, S, kdim) / ``value`` (B, S, vdim).

        ``key`` defaults to ``query`` and ``value`` to ``key`` (self-attention). ``attn_mask``:
        bool (True = may attend) or float (added), broadcastable to ``(B, n_heads, L, S)``.
        ``is_causal``: query ``i`` sees keys up to its own position; with a ``kv_cache`` holding
        ``P`` tokens, the new queries sit at positions ``P..P+L-1``. ``kv_cache``: the new keys
        and values are appended to it and attention covers all of them.
        """
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value)
        if kv_cache is not None and not isinstance(kv_cache, KVCache):
            raise TypeError(f"kv_cache must be a KVCache, got {type(kv_cache).__name__}")
        cfg = self.config
        H, H_kv, hd, g = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.group_size
        B, L, _ = query.shape

        # self-attention over many rows: one matmul for q, k and v (stacking the weights copies
        # them, which only pays when there are rows enough; decoding one token does not stack)
        if key is query and value is query and B * L >= 64:
            q, k, v = self._packed_projections(query)
        else:
            q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        q = q.view(B, L, H, hd).transpose(1, 2)  # (B, H, L, hd)
        k = k.view(B, -1, H_kv, hd).transpose(1, 2)  # (B, H_kv, S_new, hd)
        v = v.view(B, -1, H_kv, hd).transpose(1, 2)  # (B, H_kv, S_new, hd)
        offset = 0 if kv_cache is None else kv_cache.length
        if cfg.rope:  # the new tokens sit at positions offset, offset + 1, ...
            q = apply_rope(q, torch.arange(offset, offset + L, device=q.device))
            k = apply_rope(k, torch.arange(offset, offset + k.shape[2], device=k.device))
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)  # (B, H_kv, S, hd): the keys are stored rotated
        S = k.shape[2]
        if attn_mask is not None:
            check_mask(attn_mask, (B, H, L, S))

        # PyTorch's is_causal is top-left aligned on (L, S): right when nothing is cached, the
        # heads are not regrouped and no other mask is given (its math backend refuses both).
        # Otherwise we build the causal mask ourselves, with the cache offset.
        plain = g == 1 and offset == 0 and attn_mask is None
        mask = attn_mask
        # one new query after the cache may see every key: the causal mask would be all True
        if is_causal and not plain and not (kv_cache is not None and L == 1):
            tri = causal_mask(L, S, offset=offset, device=query.device)  # (L, S)
            if mask is None:
                mask = tri
            elif mask.dtype == torch.bool:
                mask = mask & tri
            else:
                mask = mask.masked_fill(~tri, float("-inf"))
        if g > 1:
            q = q.reshape(B, H_kv, g * L, hd)  # (B, H_kv, g*L, hd): a group's heads share k, v
            mask = None if mask is None else _group_mask(mask, H, H_kv, L)
        dropout_p = cfg.dropout_p if self.training else 0.0

        if need_weights:
            out, weights = scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal and plain, dropout_p=dropout_p
            )  # (B, H_kv, g*L, hd), (B, H_kv, g*L, S)
            weights = weights.reshape(B, H, L, S)  # (B, H, L, S)
        elif mask is None and dropout_p == 0.0 and (chunks := _decode_chunks(q, k)) > 1:
            out = _split_kv_attention(q, k, v, chunks)  # (1, H_kv, g*L, hd)
            weights = None
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal and plain, dropout_p=dropout_p
            )  # (B, H_kv, g*L, hd)
            weights = None
        out = out.reshape(B, H, L, hd).transpose(1, 2).reshape(B, L, H * hd)  # (B, L, H*hd)
        return self.out_proj(out), weights
