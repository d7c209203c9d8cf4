"""Tiny taggers built from the library's parts: each maps token ids (B, T) to tag logits (B, T, n_tags).

Chapter 1 trains one of each on the distance-cue task (:func:`selfattn.book.data.tagging_task`) to
measure how far each can look: a windowed fully-connected layer, a stack of 1-D convolutions, a
bidirectional GRU, an average over the whole sequence (attention with equal weights, the
control) or over the tokens up to each one (a fixed causal average, the second control),
and one layer of self-attention with positional encoding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import check_positive_int
from ..multihead import MultiHeadAttention
from ..positional import LearnedPositionalEmbedding, alibi_bias, sinusoidal_encoding
from ..scoring import ScoredSelfAttention


def count_parameters(model: nn.Module) -> int:
    """The number of trainable numbers in ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class WindowTagger(nn.Module):
    """A fully-connected layer over each token and its ``window`` neighbours on either side.

    With ``window=0`` this is the per-token FC layer that gives both "saw"s the same tag. The
    first layer has ``(2 * window + 1) * d`` inputs: parameters grow linearly with the window.
    """

    def __init__(self, vocab_size: int, n_tags: int, d: int = 16, window: int = 2,
                 hidden: int = 64) -> None:
        super().__init__()
        if window < 0:
            raise ValueError(f"window must be >= 0, got {window}")
        self.window = window
        self.embed = nn.Embedding(vocab_size, d)
        self.mlp = nn.Sequential(nn.Linear((2 * window + 1) * d, hidden), nn.ReLU(),
                                 nn.Linear(hidden, n_tags))

    def forward(self, tokens: Tensor) -> Tensor:
        B, T = tokens.shape
        w = self.window
        x = F.pad(self.embed(tokens), (0, 0, w, w))  # (B, T + 2w, d), zeros beyond the ends
        windows = x.unfold(1, 2 * w + 1, 1)  # (B, T, d, 2w + 1)
        windows = windows.transpose(2, 3).reshape(B, T, -1)  # (B, T, (2w + 1) * d)
        return self.mlp(windows)  # (B, T, n_tags)


class CNNTagger(nn.Module):
    """``n_layers`` 1-D convolutions of width ``kernel``: each token sees ``n_layers * (kernel // 2)``
    neighbours on either side (the receptive field), and no further."""

    def __init__(self, vocab_size: int, n_tags: int, d: int = 32, kernel: int = 5,
                 n_layers: int = 2) -> None:
        super().__init__()
        if kernel % 2 == 0:
            raise ValueError(f"kernel must be odd to keep the length, got {kernel}")
        self.embed = nn.Embedding(vocab_size, d)
        self.convs = nn.ModuleList(nn.Conv1d(d, d, kernel, padding=kernel // 2)
                                   for _ in range(check_positive_int(n_layers, "n_layers")))
        self.out = nn.Linear(d, n_tags)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens).transpose(1, 2)  # (B, d, T): channels first for Conv1d
        for conv in self.convs:
            x = F.relu(conv(x))  # (B, d, T)
        return self.out(x.transpose(1, 2))  # (B, T, n_tags)


class RNNTagger(nn.Module):
    """A bidirectional GRU: information travels one step at a time, in both directions."""

    def __init__(self, vocab_size: int, n_tags: int, d: int = 32, hidden: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d)
        self.rnn = nn.GRU(d, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, n_tags)

    def forward(self, tokens: Tensor) -> Tensor:
        h, _ = self.rnn(self.embed(tokens))  # (B, T, 2 * hidden)
        return self.out(h)  # (B, T, n_tags)


class MeanPoolTagger(nn.Module):
    """The control for attention: the same layer shape, with every attention weight equal.

    Each token adds the **average** of every token's value vector (uniform weights ``1 / T``, a
    bag of words that sees the whole sequence but neither order nor which token matters), then
    the same residual and MLP as :class:`AttentionTagger`. What attention adds over this is
    weights that depend on the content and the positions.
    """

    def __init__(self, vocab_size: int, n_tags: int, d: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, n_tags))

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)  # (B, T, d)
        pooled = self.out_proj(self.v_proj(x).mean(dim=1, keepdim=True))  # (B, 1, d): uniform
        return self.mlp(x + pooled)  # (B, T, n_tags)


class CausalMeanTagger(MeanPoolTagger):
    """The second control: :class:`MeanPoolTagger` with the average taken over the tokens at or
    before each token only (weights ``1 / (t + 1)`` on tokens ``0..t``, zero after).

    The same parameters as the mean-pool tagger, and no weight depends on the content: a fixed
    rule, "average the left". Where only the words before a token decide its tag, this rule is
    enough, so beating mean-pool there shows that a model uses *positions*, not that its weights
    depend on the words.
    """

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)  # (B, T, d)
        v = self.v_proj(x)  # (B, T, d)
        count = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)  # (T,)
        pooled = self.out_proj(v.cumsum(dim=1) / count[:, None])  # (B, T, d): left average
        return self.mlp(x + pooled)  # (B, T, n_tags)


POSITIONS = ("none", "sinusoidal", "learned", "rope", "alibi")


class AttentionTagger(nn.Module):
    """Embedding + positions, one self-attention layer with a residual, then an MLP.

    By default the layer is :class:`~selfattn.MultiHeadAttention` with ``n_heads`` query heads
    and ``n_kv_heads`` key/value heads (MHA by default, GQA or MQA if given); with
    ``scorer`` (``"dot"``, ``"scaled_dot"`` or ``"additive"``) it is one head scored that way
    (:class:`~selfattn.scoring.ScoredSelfAttention`), so chapters can compare scorers.

    ``positions`` says how the model knows where a token is (chapter 5): ``"sinusoidal"`` or
    ``"learned"`` vectors added to the embeddings (up to ``max_len`` positions), ``"rope"``
    (queries and keys rotated), ``"alibi"`` (a distance penalty added to the scores), or
    ``"none"``. ``causal``: each token attends only to itself and the tokens before it.
    ``head_dim``: each head's width (default ``d // n_heads``; chapter 6 varies it).
    """

    def __init__(self, vocab_size: int, n_tags: int, d: int = 32, n_heads: int = 2,
                 max_len: int = 512, scorer: str | None = None,
                 n_kv_heads: int | None = None, positions: str = "sinusoidal",
                 causal: bool = False, head_dim: int | None = None) -> None:
        super().__init__()
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
        if scorer is not None and positions in ("rope", "alibi"):
            raise ValueError(f"positions={positions!r} needs the multi-head layer; "
                             f"a scorer ({scorer!r}) takes 'none', 'sinusoidal' or 'learned'")
        self.positions, self.causal, self.max_len = positions, causal, max_len
        self.embed = nn.Embedding(vocab_size, d)
        if positions == "sinusoidal":
            self.register_buffer("pe", sinusoidal_encoding(max_len, d), persistent=False)
        elif positions == "learned":
            self.learned = LearnedPositionalEmbedding(max_len, d)
        if scorer is None:
            self.attn = MultiHeadAttention(d, n_heads, n_kv_heads=n_kv_heads,
                                           rope=positions == "rope", head_dim=head_dim)
        else:
            self.attn = ScoredSelfAttention(d, scorer)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, n_tags))

    def forward(self, tokens: Tensor, need_weights: bool = False,
                score_bias: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        r"""Logits ``(B, T, n_tags)``; with ``need_weights``, also the weights ``(B, H, T, T)``.

        ``score_bias``: a float tensor broadcastable to ``(B, H, T, T)`` added to the attention
        scores before the softmax. A zero bias that requires grad measures $\partial L / \partial s$,
        the gradient that reaches each score (:func:`selfattn.book.measure.cue_report`).
        """
        T = tokens.shape[1]
        x = self.embed(tokens)  # (B, T, d)
        if self.positions == "sinusoidal":
            if T > self.max_len:
                raise ValueError(f"sequence of {T} tokens is longer than max_len={self.max_len}")
            x = x + self.pe[:T]
        elif self.positions == "learned":
            x = x + self.learned(T)  # raises beyond max_len
        bias = None
        if self.positions == "alibi":
            bias = alibi_bias(self.attn.config.n_heads, T, device=tokens.device)  # (H, T, T)
        if score_bias is not None:
            bias = score_bias if bias is None else bias + score_bias  # (B, H, T, T)
        a, weights = self.attn(x, attn_mask=bias, is_causal=self.causal,
                               need_weights=need_weights)  # (B, T, d), (B, H, T, T)
        logits = self.mlp(x + a)  # (B, T, n_tags)
        return (logits, weights) if need_weights else logits


# --- chapter 11: a tiny causal language model, for decoding ------------------------------------

from ..cache import Cache, KVCache  # noqa: E402


class DecoderBlock(nn.Module):
    r"""One pre-norm decoder block (GPT-2's order; Xiong et al. 2020, "On Layer Normalization in
    the Transformer Architecture", §3): attention and a feed-forward layer, each on a normalised
    copy of the stream, each added back to it:

    $$h = x + \operatorname{Attn}(\operatorname{LN}(x)), \qquad
    y = h + W_2\,\operatorname{GELU}(W_1 \operatorname{LN}(h))$$

    The attention is causal :class:`~selfattn.MultiHeadAttention` with RoPE and ``n_kv_heads``
    key/value heads (MHA, GQA or MQA); the feed-forward layer is ``ffn_hidden`` wide.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None,
                 ffn_hidden: int | None = None) -> None:
        super().__init__()
        ffn_hidden = 4 * d_model if ffn_hidden is None else check_positive_int(ffn_hidden, "ffn_hidden")
        self.attn_norm = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads, rope=True)
        self.ffn_norm = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, ffn_hidden), nn.GELU(),
                                 nn.Linear(ffn_hidden, d_model))

    def forward(self, x: Tensor, cache: Cache | None = None) -> Tensor:
        """``x`` (B, T, d_model) -> (B, T, d_model); with ``cache``, the T tokens follow the
        ``cache.length`` tokens it holds, their keys and values are appended to it, and each
        attends causally to everything cached (the layer rotates them at their own positions)."""
        a, _ = self.attn(self.attn_norm(x), is_causal=True, kv_cache=cache)  # (B, T, d_model)
        h = x + a
        return h + self.ffn(self.ffn_norm(h))  # (B, T, d_model)


class TinyDecoder(nn.Module):
    r"""A small causal language model for chapter 11's decoding: token embedding, ``n_layers``
    pre-norm :class:`DecoderBlock`\ s (causal attention with RoPE, ``n_kv_heads`` key/value
    heads, a feed-forward layer ``ffn_hidden`` wide, default ``4 * d_model``), a final
    LayerNorm and a linear head to ``vocab_size`` logits (the decoder of Vaswani et al. 2017,
    §3.1, without the cross-attention, in GPT-2's pre-norm order; Radford et al. 2019, §2.3).

    Positions come only from RoPE, so the model has no maximum length, and a token's logits
    depend only on the tokens at and before it: decoding with a cache
    (:meth:`forward` with ``caches``) gives the logits of the full pass, token by token.
    """

    def __init__(self, vocab_size: int, d_model: int = 64, n_heads: int = 4, n_layers: int = 2,
                 n_kv_heads: int | None = None, ffn_hidden: int | None = None) -> None:
        super().__init__()
        self.vocab_size = check_positive_int(vocab_size, "vocab_size")
        check_positive_int(n_layers, "n_layers")
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(DecoderBlock(d_model, n_heads, n_kv_heads, ffn_hidden)
                                    for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    def new_caches(self, make: type[Cache] | None = None, **kwargs: object) -> list[Cache]:
        """One empty cache per block, ``make(**kwargs)`` each (default :class:`~selfattn.cache.KVCache`,
        every token kept). A :class:`~selfattn.cache.PagedKVCache` takes the pool:
        ``new_caches(PagedKVCache, pool=pool)``; the blocks' caches may share one pool."""
        make = KVCache if make is None else make
        return [make(**kwargs) for _ in self.blocks]

    def forward(self, tokens: Tensor, caches: list[Cache] | None = None) -> Tensor:
        """Logits ``(B, T, vocab_size)`` for token ids ``tokens`` (B, T).

        ``caches``: one :class:`~selfattn.cache.Cache` per block (:meth:`new_caches`). The
        ``T`` tokens then follow the tokens the caches hold: each block appends their keys and
        values to its cache and they attend causally to everything cached, at positions
        ``cache.length, ...``. Without caches the tokens are a whole sequence from position 0.
        """
        self._check(tokens, caches)
        x = self.embed(tokens)  # (B, T, d_model)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i])  # (B, T, d_model)
        return self.lm_head(self.norm(x))  # (B, T, vocab_size)

    def _check(self, tokens: object, caches: object) -> None:
        if not isinstance(tokens, Tensor):
            raise TypeError(f"tokens must be a torch.Tensor of token ids, got {type(tokens).__name__}")
        if tokens.dtype not in (torch.int64, torch.int32) or tokens.dim() != 2 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must be (batch, seq) integer token ids, at least one token; got "
                             f"shape {tuple(tokens.shape)}, {tokens.dtype}")
        if tokens.numel() and not 0 <= int(tokens.min()) <= int(tokens.max()) < self.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got ids from "
                             f"{int(tokens.min())} to {int(tokens.max())}")
        if caches is None:
            return
        if not isinstance(caches, (list, tuple)) or len(caches) != len(self.blocks) \
                or not all(isinstance(c, Cache) for c in caches):
            got = (f"{len(caches)} items" if isinstance(caches, (list, tuple))
                   else type(caches).__name__)
            raise TypeError(f"caches must be a list of {len(self.blocks)} selfattn.cache.Cache "
                            f"(one per block: model.new_caches()), got {got}")
        if len({id(c) for c in caches}) != len(caches):
            raise ValueError("caches holds one cache object more than once: each block needs its "
                             "own cache (model.new_caches())")
        if len({c.length for c in caches}) != 1:
            raise ValueError(f"the blocks' caches hold different numbers of tokens "
                             f"{[c.length for c in caches]}: they must be fed together")
