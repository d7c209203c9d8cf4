r"""Multi-head attention with any number of key/value heads: MHA, GQA and MQA.

$$\operatorname{MultiHead}(Q, K, V) = \operatorname{Concat}(\text{head}_1, \dots, \text{head}_h)\,W^O,
\qquad \text{head}_i = \operatorname{Attention}(QW_i^Q, KW_{g(i)}^K, VW_{g(i)}^V)$$

* MHA (Vaswani et al. 2017, §3.2.2): every query head has its own key/value head, $g(i) = i$.
* MQA (Shazeer 2019, "Fast Transformer Decoding: One Write-Head is All You Need"): one key/value
  head shared by all query heads, $g(i) = 1$.
* GQA (Ainslie et al. 2023, §2): ``n_kv_heads`` groups; query head $i$ uses key/value head
  $g(i) = \lfloor i / (h / h_{kv}) \rfloor$ (the ``repeat_interleave`` order).

``forward`` reads as the computation: project, split heads, rotate (RoPE), cache, mask, attend,
merge heads. Its cache step takes any :class:`~selfattn.cache.Cache` (every token, paged, a
sliding window, attention sinks), which says which keys the new queries see. Its attend step is
:func:`selfattn.fastpaths.attend_heads`: where the library computes it faster (no copies of
grouped key/value heads, an in-place softmax, a split cache), a fast path does it, tested equal
to the plain way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from . import fastpaths
from .cache import Cache, causal_after_append
from .checks import check_dropout, check_mask, check_positive_int, check_tensor
from .heads import _merge_heads, _split_heads, repeat_kv
from .masks import causal_mask
from .positional import _apply_rope


@dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    """The sizes of a :class:`MultiHeadAttention`, every one resolved; checks itself when created.

    Build one with :meth:`build`, which fills in the defaults: ``n_kv_heads`` = ``n_heads``
    (MHA), ``head_dim`` = ``d_model // n_heads``, ``kdim``/``vdim`` (the key and value inputs'
    sizes) and ``out_dim`` = ``d_model``. ``rope``: rotate queries and keys by their positions
    (RoPE, Su et al. 2021); needs an even ``head_dim``.
    """

    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    kdim: int
    vdim: int
    out_dim: int
    bias: bool = True
    dropout_p: float = 0.0
    rope: bool = False

    @classmethod
    def build(cls, *, d_model: int, n_heads: int, n_kv_heads: int | None = None,
              head_dim: int | None = None, kdim: int | None = None, vdim: int | None = None,
              out_dim: int | None = None, bias: bool = True, dropout_p: float = 0.0,
              rope: bool = False) -> AttentionConfig:
        """The config with every size left out filled in from ``d_model`` and ``n_heads``."""
        check_positive_int(d_model, "d_model")
        check_positive_int(n_heads, "n_heads")
        if head_dim is None:
            if d_model % n_heads != 0:
                raise ValueError(
                    f"d_model ({d_model}) must be divisible by n_heads ({n_heads}), "
                    "or give head_dim explicitly"
                )
            head_dim = d_model // n_heads
        return cls(d_model=d_model, n_heads=n_heads,
                   n_kv_heads=n_heads if n_kv_heads is None else n_kv_heads, head_dim=head_dim,
                   kdim=d_model if kdim is None else kdim, vdim=d_model if vdim is None else vdim,
                   out_dim=d_model if out_dim is None else out_dim, bias=bias,
                   dropout_p=dropout_p, rope=rope)

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_kv_heads", "head_dim", "kdim", "vdim", "out_dim"):
            check_positive_int(getattr(self, name), name)
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads}): "
                "each key/value head serves a whole group of query heads"
            )
        if self.rope and self.head_dim % 2:
            raise ValueError(f"rope rotates pairs of features: head_dim must be even, got {self.head_dim}")
        object.__setattr__(self, "dropout_p", check_dropout(self.dropout_p))

    @property
    def group_size(self) -> int:
        """How many query heads share one key/value head: ``n_heads // n_kv_heads``."""
        return self.n_heads // self.n_kv_heads


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
        cfg = AttentionConfig.build(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
                                    head_dim=head_dim, kdim=kdim, vdim=vdim, out_dim=out_dim,
                                    bias=bias, dropout_p=dropout_p, rope=rope)
        self.config = cfg
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.kdim, cfg.n_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.vdim, cfg.n_kv_heads * cfg.head_dim, bias=bias)
        self.out_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.out_dim, bias=bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        kv_cache: Cache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` (B, L, d_model) to ``key`` (B, S, kdim) / ``value`` (B, S, vdim).

        ``key`` defaults to ``query`` and ``value`` to ``key`` (self-attention). ``attn_mask``:
        bool (True = may attend) or float (added; of any float dtype: one that is neither the
        layer's nor float32 is cast to the softmax's dtype), broadcastable to
        ``(B, n_heads, L, S)``, its columns the keys in order of position; a float mask of
        only 0 and 1 (a bool mask in disguise) is refused where reading it costs no wait for
        the device, on a CPU (:func:`~selfattn.checks.check_mask`).
        ``is_causal``: query ``i`` sees keys up to its own position; with a ``kv_cache`` after
        ``P`` tokens, the new queries sit at positions ``P..P+L-1``. ``kv_cache``: any
        :class:`~selfattn.cache.Cache`, for self-attention only (``key`` and ``value`` left out,
        or ``query`` itself; anything else is a ``ValueError``: a cache would append a
        cross-attention memory again at every step); the new keys and values are appended to it
        and attention covers the keys it returns, ``S = kv_cache.size_after(L)`` of them
        (``attn_mask`` is over those, by position: the sinks and the window of a rolling cache,
        oldest first), each new query seeing those the cache's rule allows under ``is_causal``
        (:func:`~selfattn.cache.causal_after_append`), and every one without it. A rolling cache
        hands one new token's keys back in the order of its slots, without a copy; the layer
        then moves the mask's columns to that order (:meth:`~selfattn.cache.Cache.order`: a
        mask-sized gather, never one of the keys).

        ``need_weights``: also return the weights ``(B, n_heads, L, S)``, over the keys in order
        of position, whatever the cache and the grad mode (after a rolling cache's step, which
        holds its keys in the order of its slots, a gather of the weights: one more tensor of
        their size, never one of the keys). They come from the readable softmax,
        which computes the scores in float32 for float16 and bfloat16 layers (a half-precision
        product of large entries can overflow): it reads a float32 copy of the keys, twice the
        bytes of the keys it attends to, at every call, a decoding step included (the values
        and the output stay in the layer's dtype).

        What reaches the kernel (tests/test_costs.py): a plain causal call (no mask, no cache,
        or a prompt into an empty cache that keeps it) gets ``is_causal=True`` and no mask
        tensor, with every head layout (MHA, GQA, MQA); a mask is built only when ``attn_mask``
        is given (the causal rule folded into it, in its shape broadcast with ``(L, S)``) or
        for several new tokens after a cache (the cache's ``(L, S)`` booleans), and with the
        weights the readable softmax applies ``is_causal`` as one ``(L, S)`` tensor; never one
        per head or per query head of a group (GQA and MQA with the weights copy their
        key/value heads for several queries, small beside the ``(H, L, S)`` weights, and stack
        a group's heads for one query, the mask regrouped as a view). A causal call without
        weights, mask or cache holds no ``(L, S)`` tensor of its own; PyTorch's CPU kernel does,
        in its math backend, for dropout or a mask that requires grad.
        """
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value, attn_mask, is_causal, kv_cache)
        cfg = self.config
        L = query.shape[1]
        P = 0 if kv_cache is None else kv_cache.length  # tokens appended before: the first new position

        # project: (B, L, H*hd) queries, (B, S_new, H_kv*hd) keys and values
        q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(value)
        # split heads
        q = _split_heads(q, cfg.n_heads)  # (B, H, L, hd)
        k, v = _split_heads(k, cfg.n_kv_heads), _split_heads(v, cfg.n_kv_heads)  # (B, H_kv, S_new, hd)
        # rotate: the new tokens sit at positions P, P + 1, ...
        if cfg.rope:
            q = _apply_rope(q, torch.arange(P, P + L, device=q.device))
            k = _apply_rope(k, torch.arange(P, P + k.shape[2], device=k.device))
        # cache: the keys and values the new queries attend to (the keys are stored rotated),
        # and, where the cache keeps them in another order, how to put them by position
        order = None
        if kv_cache is not None:
            # recorded: autograd may save the keys for the queries' or the mask's gradients
            recorded = q.requires_grad or (attn_mask is not None and attn_mask.requires_grad)
            k, v = kv_cache.append(k, v, recorded=recorded)  # (B, H_kv, S, hd)
            if attn_mask is not None or need_weights:
                order = kv_cache.order(L, device=q.device)  # (S,) or None: by position
        # mask: PyTorch's is_causal is top-left aligned, right only for queries 0..L-1 over keys
        # 0..S-1; after a cache the queries sit at P..P+L-1 and the cache may have dropped keys,
        # so the cache says which returned keys each new query sees (None: all of them)
        S = k.shape[2]
        if attn_mask is not None:  # every kernel takes it as 4-D: (b, h, l, s), broadcasting
            attn_mask = attn_mask[(None,) * (4 - attn_mask.dim())]  # to (B, H, L, S)
            if attn_mask.is_floating_point() and attn_mask.dtype not in (q.dtype, torch.float32):
                # PyTorch's kernel takes a float mask in the queries' dtype or float32: another
                # is cast to the softmax's dtype (float32; float64 for float64 queries)
                attn_mask = attn_mask.to(torch.promote_types(q.dtype, torch.float32))
            if order is not None and attn_mask.shape[-1] > 1:  # given by position: its columns
                attn_mask = attn_mask[..., order.argsort()]  # (b, h, l, S) in the cache's order
        if is_causal and kv_cache is not None:
            is_causal, keep = causal_after_append(kv_cache, L, device=q.device)
            attn_mask = _and(attn_mask, keep)  # keep None: no mask needed
        if is_causal and attn_mask is not None:  # SDPA takes one or the other: fold causal in
            is_causal = False
            attn_mask = _and(attn_mask, causal_mask(L, S, device=q.device))
        # attend: (B, H, L, hd), and the weights (B, H, L, S) if asked for
        dropout_p = cfg.dropout_p if self.training else 0.0
        out, weights = fastpaths.attend_heads(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                              dropout_p=dropout_p, need_weights=need_weights)
        if order is not None and weights is not None:
            weights = weights[..., order]  # (B, H, L, S): back in order of position
        # merge heads
        return self.out_proj(_merge_heads(out)), weights  # (B, L, out_dim)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None,
                      is_causal: bool, kv_cache: Cache | None) -> None:
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
        if kv_cache is not None and not isinstance(kv_cache, Cache):
            raise TypeError(
                "kv_cache must be a selfattn.cache.Cache (KVCache, PagedKVCache, SlidingWindowCache, "
                f"SinkCache), got {type(kv_cache).__name__}"
            )
        if kv_cache is not None and (key is not query or value is not query):
            raise ValueError(
                "a kv_cache holds the layer's own tokens (self-attention): call the layer with "
                "query alone (key and value default to it) or with key and value the same tensor "
                f"as query; got key of shape {tuple(key.shape)} and value of shape "
                f"{tuple(value.shape)} for query of shape {tuple(query.shape)}. For "
                "cross-attention, pass the memory as key and value without a cache: its keys and "
                "values do not grow, and a cache would append them again at every step"
            )
        if attn_mask is not None:
            S = key.shape[1] if kv_cache is None else kv_cache.size_after(key.shape[1])
            # a mask's values are read on a CPU only: elsewhere the read would wait for the device
            on_cpu = not isinstance(attn_mask, Tensor) or attn_mask.device.type == "cpu"
            check_mask(attn_mask, (query.shape[0], cfg.n_heads, query.shape[1], S),
                       read_values=on_cpu)

    def load_projections(self, q: nn.Linear, k: nn.Linear, v: nn.Linear,
                         out: nn.Linear) -> MultiHeadAttention:
        """Copy four ``nn.Linear`` layers into ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``
        (for example another implementation's ``fc_q``, ``fc_k``, ``fc_v``, ``fc_o``); returns
        ``self``. Shapes must match: ``load_state_dict`` names any that do not."""
        with torch.no_grad():
            for mine, theirs in zip((self.q_proj, self.k_proj, self.v_proj, self.out_proj),
                                    (q, k, v, out), strict=True):
                mine.load_state_dict(theirs.state_dict())
        return self

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """The layer that computes what ``module`` computes, on batch-first inputs, with its
        weights copied (``nn.MultiheadAttention`` packs q, k and v into ``in_proj_weight`` when
        the three have one width). Its masks keep their own polarity: True = ignore there,
        True = may attend here."""
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"module must be an nn.MultiheadAttention, got {type(module).__name__}")
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn have no counterpart here")
        E = module.embed_dim
        ref = module.in_proj_weight if module.in_proj_weight is not None else module.q_proj_weight
        ours = cls(E, module.num_heads, kdim=module.kdim, vdim=module.vdim,
                   bias=module.in_proj_bias is not None, dropout_p=module.dropout)
        ours = ours.to(dtype=ref.dtype, device=ref.device)
        if module.in_proj_weight is not None:  # q, k and v of one width, packed
            weights = module.in_proj_weight.split(E)
        else:
            weights = (module.q_proj_weight, module.k_proj_weight, module.v_proj_weight)
        biases = module.in_proj_bias.split(E) if module.in_proj_bias is not None else (None,) * 3
        with torch.no_grad():
            for linear, w, b in [(ours.q_proj, weights[0], biases[0]),
                                 (ours.k_proj, weights[1], biases[1]),
                                 (ours.v_proj, weights[2], biases[2]),
                                 (ours.out_proj, module.out_proj.weight, module.out_proj.bias)]:
                linear.weight.copy_(w)
                if b is not None:
                    linear.bias.copy_(b)
        return ours

    def to_torch(self) -> nn.MultiheadAttention:
        """An ``nn.MultiheadAttention(batch_first=True)`` with these weights (MHA only: PyTorch's
        layer has no grouped heads, no RoPE, and its heads split ``d_model``)."""
        cfg = self.config
        if cfg.n_kv_heads != cfg.n_heads or cfg.rope or cfg.n_heads * cfg.head_dim != cfg.d_model \
                or cfg.out_dim != cfg.d_model:
            raise ValueError("only plain MHA whose heads split d_model (no GQA/MQA, no RoPE, "
                             f"out_dim = d_model) has an nn.MultiheadAttention twin; got {cfg}")
        w = self.q_proj.weight
        theirs = nn.MultiheadAttention(cfg.d_model, cfg.n_heads, dropout=cfg.dropout_p,
                                       bias=cfg.bias, kdim=cfg.kdim, vdim=cfg.vdim,
                                       batch_first=True, device=w.device, dtype=w.dtype)
        projections = (self.q_proj, self.k_proj, self.v_proj)
        with torch.no_grad():
            if theirs.in_proj_weight is not None:  # q, k and v of one width, packed
                theirs.in_proj_weight.copy_(torch.cat([p.weight for p in projections]))
            else:
                for name, p in zip("qkv", projections, strict=True):
                    getattr(theirs, f"{name}_proj_weight").copy_(p.weight)
            if cfg.bias:
                theirs.in_proj_bias.copy_(torch.cat([p.bias for p in projections]))
                theirs.out_proj.bias.copy_(self.out_proj.bias)
            theirs.out_proj.weight.copy_(self.out_proj.weight)
        return theirs.train(self.training)


def expand_kv_heads(module: MultiHeadAttention) -> MultiHeadAttention:
    """The MHA layer whose key/value heads repeat ``module``'s, each for its group of query heads
    (:func:`~selfattn.heads.repeat_kv` applied to the projections' weights). It computes exactly
    what the GQA or MQA ``module`` computes, with ``n_heads / n_kv_heads`` times the K/V weights."""
    cfg = module.config
    mha = MultiHeadAttention(cfg.d_model, cfg.n_heads, head_dim=cfg.head_dim, kdim=cfg.kdim,
                             vdim=cfg.vdim, out_dim=cfg.out_dim, bias=cfg.bias,
                             dropout_p=cfg.dropout_p, rope=cfg.rope)
    mha = mha.to(dtype=module.q_proj.weight.dtype, device=module.q_proj.weight.device)
    hd, g = cfg.head_dim, cfg.group_size
    with torch.no_grad():
        mha.q_proj.load_state_dict(module.q_proj.state_dict())
        mha.out_proj.load_state_dict(module.out_proj.state_dict())
        for src, dst in [(module.k_proj, mha.k_proj), (module.v_proj, mha.v_proj)]:
            w = src.weight.view(1, cfg.n_kv_heads, hd, -1)  # (1, H_kv, hd, d): a head per row
            dst.weight.copy_(repeat_kv(w, g).reshape(cfg.n_heads * hd, -1))  # (H*hd, d)
            if cfg.bias:
                b = src.bias.view(1, cfg.n_kv_heads, hd, 1)
                dst.bias.copy_(repeat_kv(b, g).flatten())
    return mha.train(module.training)


def _and(mask: Tensor | None, keep: Tensor | None) -> Tensor | None:
    """``mask`` (bool or additive, or None) with the bool ``keep`` (None: keep all) on top."""
    if keep is None or mask is None:
        return keep if mask is None else mask
    if mask.dtype == torch.bool:
        return mask & keep
    return mask.masked_fill(~keep, float("-inf"))

