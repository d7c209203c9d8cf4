"""Checkers for the chapters' recall exercises: a number, a count, a short function that the
library already computes. Each says "correct" or what is still wrong (see :mod:`.scaffold`).

The value an exercise's answer should have is a function here too (``additive_parameters``,
``kv_cache_bytes``, ``saturation_width``, ...), the one its checker uses or accepts: the book's
on-page self-checks (:mod:`selfattn.book.selfcheck`) ask for it at concrete sizes, so the page and
the checker cannot disagree (``tests/test_selfcheck.py`` checks every pair).
"""

from __future__ import annotations

import math

import torch

from ...attention import scaled_dot_product_attention
from ...cache import KVCache
from ...heads import merge_heads, repeat_kv
from ...masks import causal_mask, padding_mask
from ...multihead import MultiHeadAttention
from ...positional import alibi_slopes, sinusoidal_encoding
from ...scoring import AdditiveScorer
from ..measure import attention_flops, influence
from ..models import CNNTagger, WindowTagger, count_parameters
from .scaffold import NotYet, _call, _checker, _number, _tensor

# The values the answers should have, at any sizes: each is what its checker computes or accepts.


def dot_variance(d: int, variance: float) -> float:
    """Chapter 4, exercise 1: Var(q . k) for ``d`` independent entries of ``q`` and ``k``, each of
    variance ``variance``: ``d`` products of variance ``variance**2``."""
    return d * variance * variance


def saturation_width(n_keys: int = 64, threshold: float = 0.9) -> int:
    """Chapter 4, exercise 2: the smallest power of two ``d_k`` at which the median unscaled row of
    ``n_keys`` keys puts more than ``threshold`` of its weight on its top key."""
    from ..measure import median_top_weight

    for d in (2**i for i in range(1, 13)):
        if median_top_weight(d, n_keys) > threshold:
            return d
    raise ValueError(f"no width up to 4096 puts more than {threshold} on the top of {n_keys} keys")


def gradient_crossover() -> int:
    """Chapter 4, exercise 3: the smallest power of two ``d_k`` at which the typical query gets
    more gradient with the scale than without it (``measure.query_gradient_ratio``)."""
    from ..measure import query_gradient_ratio

    for d in (2**i for i in range(1, 11)):
        if query_gradient_ratio(d) > 1:
            return d
    raise ValueError("the scale gives the typical query less gradient at every width up to 1024")


def additive_parameters(query_dim: int, key_dim: int, hidden: int) -> int:
    """Chapter 3, exercise 1: the numbers an ``AdditiveScorer(query_dim, key_dim, hidden)`` learns,
    counted on the module."""
    return count_parameters(AdditiveScorer(query_dim, key_dim, hidden))


def additive_pair_bytes(L: int, S: int, hidden: int) -> int:
    """Chapter 3, exercise 2: the bytes of the ``(L, S, hidden)`` float32 tensor the additive scorer
    builds for ``L`` queries and ``S`` keys, as the scorer builds it, on PyTorch's meta device
    (shapes and dtypes, no memory), so that gigabytes cost nothing."""
    with torch.device("meta"):
        scorer = AdditiveScorer(2, 2, hidden)
        pairs = scorer.w_q(torch.zeros(L, 2)).unsqueeze(-2) + scorer.w_k(torch.zeros(S, 2)).unsqueeze(-3)
    return pairs.nbytes


def article_attention_shape(batch: int, n_heads: int, n_queries: int, n_keys: int) -> tuple[int, ...]:
    """Chapter 6, exercise 1: the shape of the article's ``attention``: heads and batch merged into
    one leading dimension, ``(n_heads * batch, n_queries, n_keys)``."""
    return (n_heads * batch, n_queries, n_keys)


def mha_parameters(d_model: int, n_heads: int) -> int:
    """Chapter 6, exercise 2: the parameters of ``MultiHeadAttention(d_model, n_heads)``, counted
    on the module."""
    return count_parameters(MultiHeadAttention(d_model, n_heads))


def kv_cache_bytes(batch: int, n_kv_heads: int, context: int, head_dim: int, dtype: torch.dtype) -> int:
    """Chapter 7, exercise 1: the bytes a :class:`~selfattn.KVCache` holds for ``context`` tokens,
    measured on a real one."""
    cache = KVCache()
    k = torch.zeros(batch, n_kv_heads, context, head_dim, dtype=dtype)
    cache.append(k, k)
    return cache.nbytes


def repeat_kv_shape(shape: tuple[int, ...], g: int) -> tuple[int, ...]:
    """Chapter 7, exercise 2: the shape of ``repeat_kv(k, g)`` for ``k`` of shape ``(B, H_kv, S,
    hd)``, from :func:`selfattn.repeat_kv` on the meta device."""
    return tuple(repeat_kv(torch.empty(shape, device="meta"), g).shape)


def merge_heads_entry(shape: tuple[int, int, int, int], token: int, feature: int) -> int:
    """Chapter 8, exercise 1: for ``x = torch.arange(B * H * T * hd).reshape(shape)``, the number
    at ``[0, token, feature]`` of :func:`selfattn.merge_heads` ``(x)``."""
    x = torch.arange(math.prod(shape)).reshape(shape)
    return int(merge_heads(x)[0, token, feature])


def causal_pairs(L: int) -> int:
    """Chapter 8, exercise 3: how many (query, key) pairs the ``(L, L)`` causal mask lets attend."""
    return int(causal_mask(L).sum())


def scores_bytes(n_heads: int, T: int, dtype: torch.dtype = torch.float32) -> int:
    """Chapter 9, exercise 2: the bytes of one ``(n_heads, T, T)`` matrix of scores."""
    return torch.empty(0, dtype=dtype).element_size() * n_heads * T * T


def model_cache_bytes(layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Chapter 11, exercise 1: a model's KV cache per token: every layer caches a key and a value
    for each key/value head."""
    return layers * 2 * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()



@_checker
def check_uniform_scale(scale: object) -> str:
    """Chapter 2, exercise 1: a ``scale`` that makes every query attend equally to every key."""
    scale = _number(scale)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(5, 8, generator=g, dtype=torch.float64) for _ in range(3))
    _, w = scaled_dot_product_attention(q, k, v, scale=float(scale))
    if scale != 0 or not torch.equal(w, torch.full_like(w, 1 / 5)):
        raise NotYet(f"with scale={scale} the weights still follow the scores: here they spread "
                     f"over {w.max() - w.min():.1e} (uniform would be 0.2 everywhere), and larger "
                     "q and k would spread them more; which scale makes every score equal?")
    return f"with scale={scale} every score is 0, so softmax gives 1/S to each key"


@_checker
def check_causal_mask(fn: object) -> str:
    """Chapter 2, exercise 2: ``fn(L)`` returns the (L, L) bool causal mask, True = may attend."""
    for L in (1, 2, 5, 8):
        want = causal_mask(L)
        got = _tensor(_call(fn, L), want)
        if got.dtype != torch.bool:
            raise NotYet(f"for L={L} the mask has dtype {got.dtype}; a mask that says where to "
                         "attend should be bool")
        if torch.equal(got, want):
            continue
        if L > 1 and torch.equal(got, ~want):
            raise NotYet("the polarity is reversed: True must mean 'may attend'")
        if not got.diagonal().all():
            raise NotYet(f"for L={L} the mask hides the diagonal: every token must be able to "
                         "attend to itself (token 0 would see nothing)")
        raise NotYet(f"for L={L} the mask differs from the causal mask at "
                     f"{int((got != want).sum())} positions")
    return "query i may attend to keys 0..i, for every length tried"


@_checker
def check_attention(fn: object) -> str:
    """Chapters 2 and 8: ``fn(q, k, v, mask)`` computes masked attention's output, ``mask`` bool
    broadcastable to (B, H, L, S), True = may attend."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 4, 8, generator=g, dtype=torch.float64)  # (B, H, L, E)
    k = torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64)  # (B, H, S, E)
    v = torch.randn(2, 3, 6, 5, generator=g, dtype=torch.float64)  # (B, H, S, Ev)
    everything = torch.ones(1, 1, 1, 6, dtype=torch.bool)  # no key masked
    unmasked, _ = scaled_dot_product_attention(q, k, v)
    plain = _tensor(_call(fn, q, k, v, everything), unmasked)
    if plain.isnan().any():
        raise NotYet("with a mask that keeps every key (all True) the output holds NaN: True means "
                     "'may attend', so fill the scores where the mask is False")
    if not torch.allclose(plain, unmasked):
        over_queries = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-2) @ v
        if torch.allclose(plain, over_queries):
            raise NotYet("even with no key masked the output differs: the softmax normalises over "
                         "the queries (dim=-2); each query's weights must sum to 1 over the keys")
        raise NotYet("even with no key masked the output differs from softmax(q k^T / sqrt(E)) v, "
                     f"by up to {(plain - unmasked).abs().max():.3g}")
    mask = padding_mask(torch.tensor([6, 2]))[:, None, None, :]  # (B, 1, 1, S)
    want, _ = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = _tensor(_call(fn, q, k, v, mask), want)
    if torch.allclose(got, want):
        return "matches selfattn.scaled_dot_product_attention on a padded batch"
    if got.isnan().any():
        raise NotYet("the output holds NaN: some row has every key filled with -inf; check which "
                     "entries your mask fills")
    if torch.allclose(got, unmasked):
        raise NotYet("the output ignores the mask: padded keys must get weight 0")
    raise NotYet(f"largest difference from the reference: {(got - want).abs().max():.3g}")


@_checker
def check_window_parameters(fn: object) -> str:
    """Chapter 1, exercise 1: ``fn(window, d, hidden, n_tags, vocab_size)`` counts the parameters
    of a :class:`~selfattn.book.models.WindowTagger`."""
    for window, d, hidden, n_tags, vocab in [(0, 8, 16, 5, 20), (3, 16, 64, 12, 32), (10, 4, 7, 3, 9)]:
        got = _call(fn, window, d, hidden, n_tags, vocab)
        want = count_parameters(WindowTagger(vocab, n_tags, d=d, window=window, hidden=hidden))
        if got != want:
            raise NotYet(f"for window={window}, d={d}, hidden={hidden}, n_tags={n_tags}, "
                         f"vocab_size={vocab}: you say {got!r}, the model has {want}")
    return "embedding + first layer ((2w+1)*d*hidden + hidden) + output layer"


@_checker
def check_cnn_reach(fn: object) -> str:
    """Chapter 1, exercise 2: ``fn(n_layers, kernel)`` is how many positions to each side a
    :class:`~selfattn.book.models.CNNTagger` sees, checked against the measured receptive field."""
    torch.manual_seed(0)
    for n_layers, kernel in [(1, 3), (2, 5), (3, 3), (4, 7)]:
        got = _call(fn, n_layers, kernel)
        model = CNNTagger(10, 3, d=4, kernel=kernel, n_layers=n_layers)
        x = model.embed(torch.randint(0, 10, (1, 61)))  # (1, T, d)

        def layers(h, model=model):  # the convolutions alone: a ReLU never widens the reach
            h = h.transpose(1, 2)  # (B, d, T)
            for conv in model.convs:
                h = conv(h)
            return h.transpose(1, 2)

        want = int(influence(layers, x, t=30).sum().item() - 1) // 2
        if got != want:
            raise NotYet(f"{n_layers} layers of width {kernel}: you say {got!r}, the measured "
                         f"reach is {want} on each side")
    return "each layer adds kernel // 2 positions on each side"


@_checker
def check_dot_variance(answer: object) -> str:
    """Chapter 4, exercise 1: the variance of q . k for d = 100 entries of variance 0.5 each."""
    answer = _number(answer)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(40_000, 100, generator=g, dtype=torch.float64) * 0.5**0.5
    k = torch.randn(40_000, 100, generator=g, dtype=torch.float64) * 0.5**0.5
    measured = (q * k).sum(-1).var().item()
    if abs(answer - measured) / measured >= 0.06:
        raise NotYet(f"{answer} is far from the measured variance; each term q_i k_i has variance "
                     "Var(q_i) * Var(k_i)")
    return (f"each product has variance 0.5 * 0.5 = 0.25; 100 of them give "
            f"{dot_variance(100, 0.5):g} (measured over 40,000 samples: {measured:.2f})")


@_checker
def check_unit_variance_scale(fn: object) -> str:
    """Chapter 4, exercise 2: ``fn(d)`` is the scale that gives q . k unit variance."""
    g = torch.Generator().manual_seed(5)
    for d in (4, 64, 512):
        scale = _call(fn, d)
        if not isinstance(scale, (int, float)) or isinstance(scale, bool):
            raise NotYet(f"for d={d} your function should return a number, got {scale!r}")
        q = torch.randn(50_000, d, generator=g, dtype=torch.float64)
        k = torch.randn(50_000, d, generator=g, dtype=torch.float64)
        var = ((q * k).sum(-1) * scale).var().item()
        if not 0.9 < var < 1.1:
            raise NotYet(f"with d={d} your scale {scale:.4g} gives variance {var:.3g}, not 1")
    return "scale = 1/sqrt(d): the variance d times scale^2 is 1"


@_checker
def check_additive_parameters(fn: object) -> str:
    """Chapter 3, exercise 1: ``fn(query_dim, key_dim, hidden)`` counts an AdditiveScorer's numbers."""
    for q_dim, k_dim, hidden in [(8, 8, 4), (10, 3, 16), (1, 1, 1)]:
        got = _call(fn, q_dim, k_dim, hidden)
        want = additive_parameters(q_dim, k_dim, hidden)
        if got != want:
            raise NotYet(f"query_dim={q_dim}, key_dim={k_dim}, hidden={hidden}: you say {got!r}, "
                         f"the scorer has {want}")
    return "W_q (hidden x query_dim) + W_k and its bias (hidden x key_dim + hidden) + w (hidden)"


@_checker
def check_additive_bytes(fn: object) -> str:
    """Chapter 3, exercise 2: ``fn(L, S, hidden)`` is the size in bytes of the float32
    ``(L, S, hidden)`` tensor the additive scorer builds, checked against the real tensor."""
    for L, S, hidden in [(4, 6, 8), (128, 128, 32), (1, 1000, 3)]:
        got = _call(fn, L, S, hidden)
        want = additive_pair_bytes(L, S, hidden)
        if got != want:
            raise NotYet(f"L={L}, S={S}, hidden={hidden}: you say {got!r}, the tensor takes "
                         f"{want} bytes")
    return "L * S * hidden numbers of 4 bytes each"


@_checker
def check_article_attention_shape(answer: object) -> str:
    """Chapter 6, exercise 1: the shape of the article's ``attention`` for batch 3, 4 heads,
    5 queries and 7 keys."""
    if not isinstance(answer, tuple) or not all(isinstance(a, int) for a in answer):
        raise NotYet(f"give a tuple of ints, like (1, 2, 3); got {answer!r}")
    if answer == (3, 4, 5, 7):
        raise NotYet("that is the library's layout (B, H, L, S); the article merges two of those "
                     "dimensions")
    want = article_attention_shape(batch=3, n_heads=4, n_queries=5, n_keys=7)
    if answer != want:
        raise NotYet(f"{answer} is not the shape; follow the view/permute of q and k")
    return ("heads and batch are merged into one leading dimension: (heads x batch, queries, keys) "
            f"= {want}")


@_checker
def check_mha_parameters(fn: object) -> str:
    """Chapter 6, exercise 2: ``fn(d_model, n_heads)`` counts MultiHeadAttention's parameters."""
    for d_model, n_heads in [(8, 1), (64, 8), (96, 3)]:
        got = _call(fn, d_model, n_heads)
        want = mha_parameters(d_model, n_heads)
        if got != want:
            raise NotYet(f"d_model={d_model}, n_heads={n_heads}: you say {got!r}, the module has "
                         f"{want}")
    return "4 d^2 + 4 d, whatever the number of heads: heads split d, they do not add parameters"


@_checker
def check_cache_bytes(fn: object) -> str:
    """Chapter 7, exercise 1: ``fn(batch, n_kv_heads, context, head_dim, itemsize)`` is the size
    of a KV cache in bytes, checked against a real :class:`~selfattn.KVCache`."""
    for batch, n_kv, context, hd, dtype in [(1, 16, 100, 64, torch.float32),
                                             (2, 1, 37, 8, torch.float16),
                                             (3, 4, 10, 16, torch.bfloat16)]:
        itemsize = torch.empty(0, dtype=dtype).element_size()
        got = _call(fn, batch, n_kv, context, hd, itemsize)
        want = kv_cache_bytes(batch, n_kv, context, hd, dtype)
        if got != want:
            raise NotYet(f"batch={batch}, n_kv_heads={n_kv}, context={context}, head_dim={hd}, "
                         f"itemsize={itemsize}: you say {got!r}, the cache holds {want}")
    return "keys and values: 2 * batch * n_kv_heads * context * head_dim * itemsize"


@_checker
def check_repeat_kv(fn: object) -> str:
    """Chapter 7, exercise 2: ``fn(k, g)`` repeats each key head ``g`` times, as
    ``k.repeat_interleave(g, dim=1)`` does, for ``k`` of shape (B, H_kv, S, hd)."""
    k = torch.arange(2 * 3 * 4 * 2, dtype=torch.float32).reshape(2, 3, 4, 2)
    want = repeat_kv(k, 4)  # (2, 12, 4, 2)
    got = _tensor(_call(fn, k, 4), want)
    if torch.equal(got, k.repeat(1, 4, 1, 1)):
        raise NotYet("that is k.repeat: heads 0, 1, 2, 0, 1, 2, ...; GQA wants 0, 0, 0, 0, 1, 1, ...")
    if not torch.equal(got, want):
        raise NotYet("the values differ from selfattn.repeat_kv (k.repeat_interleave(g, dim=1))")
    return "head h of the result is key head h // g (Hugging Face calls this repeat_kv)"


@_checker
def check_sinusoidal(fn: object) -> str:
    """Chapter 5, exercise 1: ``fn(n_positions, d_model)`` is the sinusoidal table (Vaswani §3.5)."""
    for n, d in ((1, 2), (7, 4), (50, 16)):
        want = sinusoidal_encoding(n, d)
        got = _tensor(_call(fn, n, d), want).float()
        if not torch.allclose(got, want, atol=1e-5):
            swapped = torch.empty_like(want)
            swapped[:, 0::2], swapped[:, 1::2] = want[:, 1::2], want[:, 0::2]
            if torch.allclose(got, swapped, atol=1e-5):
                raise NotYet("sines and cosines are swapped: even columns take sin")
            raise NotYet(f"for {n} positions of width {d} the table differs from the formula by up "
                         f"to {(got - want).abs().max():.3g}")
    return "PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same)"


@_checker
def check_rope_turn(answer: object) -> str:
    """Chapter 5, exercise 2: after how many positions does RoPE's slowest pair (d = 64, base
    10000) turn a full circle?"""
    answer = _number(answer)
    theta = 10000.0 ** (-62 / 64)  # the angle per position of pair i = 31
    want = 2 * math.pi / theta
    if abs(answer - want) / want >= 0.01:
        raise NotYet(f"{answer:,} is not it; pair i turns by theta_i = 10000^(-2i/d) per position, "
                     "and a full circle is 2 pi")
    return (f"2 pi / 10000^(-62/64) = {want:,.0f} positions: far longer than any training "
            "sequence, so that pair's angles are never all seen")


@_checker
def check_alibi_slopes(fn: object) -> str:
    """Chapter 5, exercise 3: ``fn(n_heads)`` gives ALiBi's slopes for a power-of-two head count."""
    for n in (1, 2, 4, 8, 16):
        got = _call(fn, n)
        try:
            got = torch.as_tensor(got, dtype=torch.float64).flatten()
        except (TypeError, ValueError, RuntimeError):
            raise NotYet(f"for {n} heads give a list of numbers, got {got!r}") from None
        want = alibi_slopes(n).double()
        if got.shape != want.shape:
            raise NotYet(f"for {n} heads give {n} slopes, got {got.numel()}")
        if not torch.allclose(got, want):
            raise NotYet(f"for {n} heads: {[round(x, 4) for x in got.tolist()]}, expected "
                         f"{[round(x, 4) for x in want.tolist()]}")
    return "a geometric sequence: start = ratio = 2^(-8/n)"


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


@_checker
def check_attention_flops(fn: object) -> str:
    """Chapter 9, exercise 1: ``fn(L, S, d, n_heads, batch)`` is attention's dense forward FLOPs."""
    for args in ((1, 1, 1, 1, 1), (3, 5, 4, 2, 1), (512, 512, 64, 8, 8), (7, 100, 16, 3, 2)):
        got = _call(fn, *args)
        want = attention_flops(*args)
        if got != want:
            hint = " (that counts each product once: a multiply-add is 2 FLOPs)" if got == want // 2 else ""
            raise NotYet(f"for (L, S, d, n_heads, batch) = {args}: you say {got!r}, expected "
                         f"{want:,}{hint}")
    return "4 * L * S * d per head and per sequence: QK^T and AV, 2LSd each"


@_checker
def check_scores_bytes(answer: object) -> str:
    """Chapter 9, exercise 2: bytes of a (32, 8192, 8192) float32 score matrix."""
    answer = _number(answer)
    want = scores_bytes(32, 8192, torch.float32)
    if answer != want:
        raise NotYet(f"{answer:,} is not it: heads x T x T numbers of 4 bytes each")
    return f"{want:,} bytes = {want / 2**30:.0f} GiB for one layer's scores"


@_checker
def check_model_cache_bytes(answer: object) -> str:
    """Chapter 11, exercise 1: Llama 3 70B's KV cache per token, in 16-bit numbers (80 layers,
    8 key/value heads of width 128; Grattafiori et al. 2024, Table 3)."""
    answer = _number(answer)
    layers, kv_heads, head_dim, itemsize = 80, 8, 128, torch.empty(0, dtype=torch.float16).element_size()
    want = model_cache_bytes(layers, kv_heads, head_dim, torch.float16)
    if answer == want // 2:
        raise NotYet(f"{answer:,} counts the keys or the values: a token caches both")
    if answer == layers * 2 * 64 * head_dim * itemsize:
        raise NotYet(f"{answer:,} counts the 64 query heads: only the 8 key/value heads are cached")
    if answer == want // layers:
        raise NotYet(f"{answer:,} is one layer's: every one of the 80 layers has its own cache")
    if answer == want * 2:
        raise NotYet(f"{answer:,} counts 4 bytes a number: 16-bit numbers take 2")
    if answer != want:
        raise NotYet(f"{answer:,} is not it: layers x (key and value) x KV heads x width x bytes")
    return f"{want:,} bytes = {want // 2**10:,} KiB per token, {want * 8192 / 2**30:.1f} GiB at 8,192 tokens"


@_checker
def check_bert_layer_parameters(fn: object) -> str:
    """Chapter 10, exercise 1: ``fn(d, d_ff)`` counts the parameters of one BertLayer."""
    from ..pretrained import BertConfig, BertLayer

    for d, d_ff, heads in ((384, 1536, 12), (8, 32, 2), (768, 3072, 12)):
        got = _call(fn, d, d_ff)
        cfg = BertConfig(vocab_size=10, hidden_size=d, num_hidden_layers=1,
                         num_attention_heads=heads, intermediate_size=d_ff,
                         max_position_embeddings=8, type_vocab_size=2, layer_norm_eps=1e-12)
        want = count_parameters(BertLayer(cfg))
        if got != want:
            raise NotYet(f"for d={d}, d_ff={d_ff}: you say {got!r}, the layer has {want:,}")
    return "4(d^2 + d) + (d d_ff + d_ff) + (d_ff d + d) + 4d, as counted"


@_checker
def check_previous_share(fn: object) -> str:
    """Chapter 10, exercise 2: ``fn(w)`` is each head's mean weight on the previous token."""
    from ..pretrained import offset_share

    g = torch.Generator().manual_seed(10)
    w = torch.softmax(torch.randn(3, 7, 7, generator=g), dim=-1)  # (H, T, T)
    real = torch.ones(1, 7, dtype=torch.bool)
    want = offset_share(w[None, None], real, -1)[0]  # (H,)
    got = _tensor(_call(fn, w), want)
    if torch.allclose(got, offset_share(w[None, None], real, 1)[0]):
        raise NotYet("that is the next token (q + 1); the previous one is q - 1")
    if not torch.allclose(got, want):
        raise NotYet(f"expected {[round(x, 3) for x in want.tolist()]}, got "
                     f"{[round(x, 3) for x in got.tolist()]}")
    return "the mean of w[h, q, q - 1] over q = 1..T-1, per head"


def _power_of_two(answer: object) -> int:
    answer = _number(answer)
    if answer != int(answer) or int(answer) < 2 or int(answer) & (int(answer) - 1):
        raise NotYet(f"the answer is a power of two (2, 4, 8, ...), got {answer!r}")
    if answer > 4096:
        raise NotYet(f"{int(answer)} is far wider than any head here: look below 4096")
    return int(answer)


@_checker
def check_saturation_width(answer: object) -> str:
    """Chapter 4, exercise 2: the smallest power of two ``d_k`` at which the median unscaled row,
    one query against 64 keys, puts more than 0.9 of its weight on its top key."""
    from ..measure import median_top_weight

    d = _power_of_two(answer)
    at, below = median_top_weight(d, 64), median_top_weight(d // 2, 64)
    if at <= 0.9:
        raise NotYet(f"at d_k={d} the median top weight is {at:.3f}, not above 0.9 yet: go wider")
    if below > 0.9:
        raise NotYet(f"already at d_k={d // 2} the median top weight is {below:.3f}: the first "
                     "width above 0.9 is smaller")
    return (f"median top weight {below:.3f} at d_k={d // 2}, {at:.3f} at d_k={d} (measured over "
            "10,000 rows)")


@_checker
def check_gradient_crossover(answer: object) -> str:
    """Chapter 4, exercise 3: the smallest power of two ``d_k`` at which the typical query (the
    median row) gets more gradient with the scale than without it, as the median over several
    random draws (``measure.query_gradient_ratio``)."""
    from ..measure import query_gradient_ratio as ratio  # the median over several draws

    d = _power_of_two(answer)
    at, below = ratio(d), ratio(d // 2) if d > 2 else 0.0
    if at <= 1:
        raise NotYet(f"at d_k={d} the typical query gets {at:.3f} times the gradient with the "
                     "scale: still less, go wider")
    if below > 1:
        raise NotYet(f"already at d_k={d // 2} the ratio is {below:.3f}: look at smaller widths")
    return (f"the ratio scaled / unscaled at the typical query is {below:.3f} at d_k={d // 2} "
            f"and {at:.3f} at d_k={d}")
