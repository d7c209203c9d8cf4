"""Self-checks for the chapters' exercises: each says "correct" or what is still wrong.

A checker never raises: a reader's half-written answer (``None``, an exception inside their
function) gets a short message, so a chapter always runs top to bottom.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .attention import scaled_dot_product_attention
from .bench import influence
from .masks import causal_mask, padding_mask
from .models import CNNTagger, WindowTagger, count_parameters
from .multihead import KVCache, MultiHeadAttention
from .positional import alibi_slopes, sinusoidal_encoding
from .scoring import AdditiveScorer


def _report(ok: bool, message: str) -> bool:
    print(("✓ Correct: " if ok else "✗ Not yet: ") + message)
    return ok


def check_uniform_scale(scale: object) -> bool:
    """Chapter 2, exercise 1: a ``scale`` that makes every query attend equally to every key."""
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        return _report(False, f"set the answer to a number, got {scale!r}")
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(5, 8, generator=g, dtype=torch.float64) for _ in range(3))
    _, w = scaled_dot_product_attention(q, k, v, scale=float(scale))
    if torch.allclose(w, torch.full_like(w, 1 / 5)):
        return _report(True, f"with scale={scale} every score is 0, so softmax gives 1/S to each key")
    return _report(False, f"with scale={scale} the weights range from {w.min():.3f} to "
                          f"{w.max():.3f}; uniform would be 0.2 everywhere")


def check_causal_mask(fn: Callable[[int], torch.Tensor]) -> bool:
    """Chapter 2, exercise 2: ``fn(L)`` returns the (L, L) bool causal mask, True = may attend."""
    for L in (1, 2, 5, 8):
        try:
            got = fn(L)
        except Exception as exc:  # the reader's code: report, never crash the chapter
            return _report(False, f"fn({L}) raised {type(exc).__name__}: {exc}")
        want = causal_mask(L)
        if not isinstance(got, torch.Tensor):
            return _report(False, f"fn({L}) should return a tensor, got {type(got).__name__}")
        if got.dtype != torch.bool:
            return _report(False, f"fn({L}) has dtype {got.dtype}; a mask that says where to "
                                  "attend should be bool")
        if got.shape != want.shape:
            return _report(False, f"fn({L}) has shape {tuple(got.shape)}, expected {(L, L)}")
        if not torch.equal(got, want):
            if L > 1 and torch.equal(got, ~want):
                return _report(False, "the polarity is reversed: True must mean 'may attend'")
            if not got.diagonal().all():
                return _report(False, f"fn({L}) hides the diagonal: every token must be able to "
                                      "attend to itself (token 0 would see nothing)")
            return _report(False, f"fn({L}) differs from the causal mask at "
                                  f"{int((got != want).sum())} positions")
    return _report(True, "query i may attend to keys 0..i, for every length tried")


def check_attention(fn: Callable[..., torch.Tensor]) -> bool:
    """Chapter 2, exercise 3: ``fn(q, k, v, mask)`` computes masked attention's output."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 4, 8, generator=g, dtype=torch.float64)  # (B, H, L, E)
    k = torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64)  # (B, H, S, E)
    v = torch.randn(2, 3, 6, 5, generator=g, dtype=torch.float64)  # (B, H, S, Ev)
    mask = padding_mask(torch.tensor([6, 2]))[:, None, None, :]  # (B, 1, 1, S)
    try:
        got = fn(q, k, v, mask)
    except Exception as exc:
        return _report(False, f"your function raised {type(exc).__name__}: {exc}")
    want, _ = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        return _report(False, f"expected a tensor of shape {tuple(want.shape)}, got {shape}")
    if torch.allclose(got, want):
        return _report(True, "matches selfattn.scaled_dot_product_attention on a padded batch")
    if got.isnan().any():
        return _report(False, "the output holds NaN: some row has every key filled with -inf; "
                              "check which entries your mask fills")
    unmasked, _ = scaled_dot_product_attention(q, k, v)
    if torch.allclose(got, unmasked):
        return _report(False, "the output ignores the mask: padded keys must get weight 0")
    return _report(False, f"largest difference from the reference: {(got - want).abs().max():.3g}")


def check_window_parameters(fn: Callable[..., int]) -> bool:
    """Chapter 1, exercise 1: ``fn(window, d, hidden, n_tags, vocab_size)`` counts the parameters
    of a :class:`~selfattn.models.WindowTagger`."""
    for window, d, hidden, n_tags, vocab in [(0, 8, 16, 5, 20), (3, 16, 64, 12, 32), (10, 4, 7, 3, 9)]:
        try:
            got = fn(window, d, hidden, n_tags, vocab)
        except Exception as exc:
            return _report(False, f"your function raised {type(exc).__name__}: {exc}")
        want = count_parameters(WindowTagger(vocab, n_tags, d=d, window=window, hidden=hidden))
        if got != want:
            return _report(False, f"for window={window}, d={d}, hidden={hidden}, n_tags={n_tags}, "
                                  f"vocab_size={vocab}: you say {got}, the model has {want}")
    return _report(True, "embedding + first layer ((2w+1)*d*hidden + hidden) + output layer")


def check_cnn_reach(fn: Callable[[int, int], int]) -> bool:
    """Chapter 1, exercise 2: ``fn(n_layers, kernel)`` is how many positions to each side a
    :class:`~selfattn.models.CNNTagger` sees, checked against the measured receptive field."""
    torch.manual_seed(0)
    for n_layers, kernel in [(1, 3), (2, 5), (3, 3), (4, 7)]:
        try:
            got = fn(n_layers, kernel)
        except Exception as exc:
            return _report(False, f"your function raised {type(exc).__name__}: {exc}")
        model = CNNTagger(10, 3, d=4, kernel=kernel, n_layers=n_layers)
        x = model.embed(torch.randint(0, 10, (1, 61)))  # (1, T, d)

        def layers(h, model=model):  # the convolutions alone: a ReLU never widens the reach
            h = h.transpose(1, 2)  # (B, d, T)
            for conv in model.convs:
                h = conv(h)
            return h.transpose(1, 2)

        seen = influence(layers, x, t=30)
        want = int(seen.sum().item() - 1) // 2
        if got != want:
            return _report(False, f"{n_layers} layers of width {kernel}: you say {got}, "
                                  f"the measured reach is {want} on each side")
    return _report(True, "each layer adds kernel // 2 positions on each side")


def check_dot_variance(answer: object) -> bool:
    """Chapter 4, exercise 1: the variance of q . k for d = 100 entries of variance 0.5 each."""
    if not isinstance(answer, (int, float)) or isinstance(answer, bool):
        return _report(False, f"set the answer to a number, got {answer!r}")
    g = torch.Generator().manual_seed(4)
    q = torch.randn(40_000, 100, generator=g, dtype=torch.float64) * 0.5**0.5
    k = torch.randn(40_000, 100, generator=g, dtype=torch.float64) * 0.5**0.5
    measured = (q * k).sum(-1).var().item()
    if abs(answer - measured) / measured < 0.06:
        return _report(True, f"each product has variance 0.5 * 0.5 = 0.25; 100 of them give 25 "
                             f"(measured over 40,000 samples: {measured:.2f})")
    return _report(False, f"{answer} is far from the measured variance; each term q_i k_i has "
                          "variance Var(q_i) * Var(k_i)")


def check_unit_variance_scale(fn: Callable[[int], float]) -> bool:
    """Chapter 4, exercise 2: ``fn(d)`` is the scale that gives q . k unit variance."""
    g = torch.Generator().manual_seed(5)
    for d in (4, 64, 512):
        try:
            scale = fn(d)
        except Exception as exc:
            return _report(False, f"your function raised {type(exc).__name__}: {exc}")
        if not isinstance(scale, (int, float)) or isinstance(scale, bool):
            return _report(False, f"my_scale({d}) should return a number, got {scale!r}")
        q = torch.randn(50_000, d, generator=g, dtype=torch.float64)
        k = torch.randn(50_000, d, generator=g, dtype=torch.float64)
        var = ((q * k).sum(-1) * scale).var().item()
        if not 0.9 < var < 1.1:
            return _report(False, f"with d={d} your scale {scale:.4g} gives variance {var:.3g}, not 1")
    return _report(True, "scale = 1/sqrt(d): the variance d times scale^2 is 1")


def check_additive_parameters(fn: Callable[[int, int, int], int]) -> bool:
    """Chapter 3, exercise 1: ``fn(query_dim, key_dim, hidden)`` counts an AdditiveScorer's numbers."""
    for q_dim, k_dim, hidden in [(8, 8, 4), (10, 3, 16), (1, 1, 1)]:
        try:
            got = fn(q_dim, k_dim, hidden)
        except Exception as exc:
            return _report(False, f"your function raised {type(exc).__name__}: {exc}")
        want = count_parameters(AdditiveScorer(q_dim, k_dim, hidden))
        if got != want:
            return _report(False, f"query_dim={q_dim}, key_dim={k_dim}, hidden={hidden}: you say "
                                  f"{got!r}, the scorer has {want}")
    return _report(True, "W_q (hidden x query_dim) + W_k and its bias (hidden x key_dim + hidden) "
                         "+ w (hidden)")


def check_additive_bytes(fn: Callable[[int, int, int], int]) -> bool:
    """Chapter 3, exercise 2: ``fn(L, S, hidden)`` is the size in bytes of the float32
    ``(L, S, hidden)`` tensor the additive scorer builds, checked against the real tensor."""
    for L, S, hidden in [(4, 6, 8), (128, 128, 32), (1, 1000, 3)]:
        try:
            got = fn(L, S, hidden)
        except Exception as exc:
            return _report(False, f"your function raised {type(exc).__name__}: {exc}")
        scorer = AdditiveScorer(2, 2, hidden)
        pairs = scorer.w_q(torch.zeros(L, 2)).unsqueeze(-2) + scorer.w_k(torch.zeros(S, 2)).unsqueeze(-3)
        if got != pairs.nbytes:
            return _report(False, f"L={L}, S={S}, hidden={hidden}: you say {got!r}, the tensor "
                                  f"takes {pairs.nbytes} bytes")
    return _report(True, "L * S * hidden numbers of 4 bytes each")


def check_article_attention_shape(answer: object) -> bool:
    """Chapter 6, exercise 1: the shape of the article's ``attention`` for batch 3, 4 heads,
    n_q = 5 and n_k = 7."""
    want = (3 * 4, 5, 7)
    if not isinstance(answer, tuple) or not all(isinstance(a, int) for a in answer):
        return _report(False, f"give a tuple of ints, like (1, 2, 3); got {answer!r}")
    if tuple(answer) == want:
        return _report(True, "heads and batch are merged into one leading dimension: "
                             "(num_head * batch, n_q, n_k)")
    if tuple(answer) == (3, 4, 5, 7):
        return _report(False, "that is the library's layout (B, H, L, S); the article merges two "
                              "of those dimensions")
    return _report(False, f"{answer} is not the shape; follow the view/permute of q and k")


def check_mha_parameters(fn: Callable[[int, int], int]) -> bool:
    """Chapter 6, exercise 2: ``fn(d_model, n_heads)`` counts MultiHeadAttention's parameters."""
    for d_model, n_heads in [(8, 1), (64, 8), (96, 3)]:
        try:
            got = fn(d_model, n_heads)
        except Exception as exc:
            return _report(False, f"your function raised {type(exc).__name__}: {exc}")
        want = count_parameters(MultiHeadAttention(d_model, n_heads))
        if got != want:
            return _report(False, f"d_model={d_model}, n_heads={n_heads}: you say {got!r}, "
                                  f"the module has {want}")
    return _report(True, "4 d^2 + 4 d, whatever the number of heads: heads split d, they do "
                         "not add parameters")


def check_cache_bytes(fn: Callable[..., int]) -> bool:
    """Chapter 7, exercise 1: ``fn(batch, n_kv_heads, context, head_dim, itemsize)`` is the size
    of a KV cache in bytes, checked against a real :class:`~selfattn.KVCache`."""
    for batch, n_kv, context, hd, dtype in [(1, 16, 100, 64, torch.float32), (2, 1, 37, 8, torch.float16),
                                             (3, 4, 10, 16, torch.bfloat16)]:
        itemsize = torch.empty(0, dtype=dtype).element_size()
        try:
            got = fn(batch, n_kv, context, hd, itemsize)
        except Exception as exc:
            return _report(False, f"your function raised {type(exc).__name__}: {exc}")
        cache = KVCache()
        k = torch.zeros(batch, n_kv, context, hd, dtype=dtype)
        cache.append(k, k)
        if got != cache.nbytes:
            return _report(False, f"batch={batch}, n_kv_heads={n_kv}, context={context}, "
                                  f"head_dim={hd}, itemsize={itemsize}: you say {got!r}, the cache "
                                  f"holds {cache.nbytes}")
    return _report(True, "keys and values: 2 * batch * n_kv_heads * context * head_dim * itemsize")


def check_repeat_kv(fn: Callable[[torch.Tensor, int], torch.Tensor]) -> bool:
    """Chapter 7, exercise 2: ``fn(k, g)`` repeats each key head ``g`` times, as
    ``k.repeat_interleave(g, dim=1)`` does, for ``k`` of shape (B, H_kv, S, hd)."""
    k = torch.arange(2 * 3 * 4 * 2, dtype=torch.float32).reshape(2, 3, 4, 2)
    try:
        got = fn(k, 4)
    except Exception as exc:
        return _report(False, f"your function raised {type(exc).__name__}: {exc}")
    want = k.repeat_interleave(4, dim=1)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        return _report(False, f"expected shape {tuple(want.shape)}, got {shape}")
    if torch.equal(got, want):
        return _report(True, "head h of the result is key head h // g")
    if torch.equal(got, k.repeat(1, 4, 1, 1)):
        return _report(False, "that is k.repeat: heads 0, 1, 2, 0, 1, 2, ...; GQA wants "
                              "0, 0, 0, 0, 1, 1, ...")
    return _report(False, "the values differ from repeat_interleave")


def check_sinusoidal(fn: Callable[[int, int], torch.Tensor]) -> bool:
    """Chapter 5, exercise 1: ``fn(n_positions, d_model)`` is the sinusoidal table (Vaswani §3.5)."""
    for n, d in ((1, 2), (7, 4), (50, 16)):
        try:
            got = fn(n, d)
        except Exception as exc:
            return _report(False, f"fn({n}, {d}) raised {type(exc).__name__}: {exc}")
        want = sinusoidal_encoding(n, d)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return _report(False, f"fn({n}, {d}) should have shape {(n, d)}, got {shape}")
        got = got.float()
        if not torch.allclose(got, want, atol=1e-5):
            swapped = torch.empty_like(want)
            swapped[:, 0::2], swapped[:, 1::2] = want[:, 1::2], want[:, 0::2]
            if torch.allclose(got, swapped, atol=1e-5):
                return _report(False, "sines and cosines are swapped: even columns take sin")
            return _report(False, f"fn({n}, {d}) differs from the formula by up to "
                                  f"{(got - want).abs().max():.3g}")
    return _report(True, "PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same)")


def check_rope_turn(answer: object) -> bool:
    """Chapter 5, exercise 2: after how many positions does RoPE's slowest pair (d = 64, base
    10000) turn a full circle?"""
    if not isinstance(answer, (int, float)) or isinstance(answer, bool):
        return _report(False, f"set the answer to a number, got {answer!r}")
    theta = 10000.0 ** (-62 / 64)  # the angle per position of pair i = 31
    want = 2 * math.pi / theta
    if abs(answer - want) / want < 0.01:
        return _report(True, f"2 pi / 10000^(-62/64) = {want:,.0f} positions: far longer than "
                             "any training sequence, so that pair's angles are never all seen")
    return _report(False, f"{answer:,} is not it; pair i turns by theta_i = 10000^(-2i/d) per "
                          "position, and a full circle is 2 pi")


def check_alibi_slopes(fn: Callable[[int], list]) -> bool:
    """Chapter 5, exercise 3: ``fn(n_heads)`` gives ALiBi's slopes for a power-of-two head count."""
    for n in (1, 2, 4, 8, 16):
        try:
            got = torch.as_tensor(fn(n), dtype=torch.float64).flatten()
        except Exception as exc:
            return _report(False, f"fn({n}) raised or gave no numbers: {type(exc).__name__}: {exc}")
        want = alibi_slopes(n).double()
        if got.shape != want.shape:
            return _report(False, f"fn({n}) should give {n} slopes, got {got.numel()}")
        if not torch.allclose(got, want):
            return _report(False, f"fn({n}) = {[round(x, 4) for x in got.tolist()]}, expected "
                                  f"{[round(x, 4) for x in want.tolist()]}")
    return _report(True, "a geometric sequence: start = ratio = 2^(-8/n)")


def check_merge_heads(fn: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Chapter 8, exercise 1: ``fn(x)`` turns heads ``(B, H, T, hd)`` into ``(B, T, H * hd)``."""
    x = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(8))  # (B, H, T, hd)
    try:
        got = fn(x)
    except Exception as exc:
        return _report(False, f"your function raised {type(exc).__name__}: {exc}")
    want = x.transpose(1, 2).reshape(2, 4, 15)  # (B, T, H * hd)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        return _report(False, f"expected shape {tuple(want.shape)}, got {shape}")
    if torch.equal(got, want):
        return _report(True, "token t gets head 0's features, then head 1's, ...")
    if torch.equal(got, x.reshape(2, 4, 15)):
        return _report(False, "the right shape, but in memory order: token 0 holds tokens 0 "
                              "and 1 of head 0; move the head axis first")
    return _report(False, "the values are not where they belong: token t, head h should sit "
                          "at [:, t, h * hd : (h + 1) * hd]")


def check_attention_flops(fn: Callable[..., int]) -> bool:
    """Chapter 9, exercise 1: ``fn(L, S, d, n_heads, batch)`` is attention's dense forward FLOPs."""
    from .bench import attention_flops

    for args in ((1, 1, 1, 1, 1), (3, 5, 4, 2, 1), (512, 512, 64, 8, 8), (7, 100, 16, 3, 2)):
        try:
            got = fn(*args)
        except Exception as exc:
            return _report(False, f"my_flops{args} raised {type(exc).__name__}: {exc}")
        want = attention_flops(*args)
        if got != want:
            hint = (" (that counts each product once: a multiply-add is 2 FLOPs)"
                    if got == want // 2 else "")
            return _report(False, f"my_flops{args} = {got!r}, expected {want:,}{hint}")
    return _report(True, "4 * L * S * d per head and per sequence: QK^T and AV, 2LSd each")


def check_scores_bytes(answer: object) -> bool:
    """Chapter 9, exercise 2: bytes of a (32, 8192, 8192) float32 score matrix."""
    if not isinstance(answer, (int, float)) or isinstance(answer, bool):
        return _report(False, f"set the answer to a number, got {answer!r}")
    want = torch.empty(0).element_size() * 32 * 8192 * 8192
    if answer == want:
        return _report(True, f"{want:,} bytes = {want / 2**30:.0f} GiB for one layer's scores")
    return _report(False, f"{answer:,} is not it: heads x T x T numbers of 4 bytes each")


def check_bert_layer_parameters(fn: Callable[[int, int], int]) -> bool:
    """Chapter 10, exercise 1: ``fn(d, d_ff)`` counts the parameters of one BertLayer."""
    from .pretrained import BertConfig, BertLayer

    for d, d_ff, heads in ((384, 1536, 12), (8, 32, 2), (768, 3072, 12)):
        try:
            got = fn(d, d_ff)
        except Exception as exc:
            return _report(False, f"my_layer_parameters({d}, {d_ff}) raised {type(exc).__name__}: "
                                  f"{exc}")
        want = count_parameters(BertLayer(BertConfig(10, d, 1, heads, d_ff, 8, 2, 1e-12)))
        if got != want:
            return _report(False, f"my_layer_parameters({d}, {d_ff}) = {got!r}, the layer has "
                                  f"{want:,}")
    return _report(True, "4(d^2 + d) + (d d_ff + d_ff) + (d_ff d + d) + 4d, as counted")


def check_previous_share(fn: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Chapter 10, exercise 2: ``fn(w)`` is each head's mean weight on the previous token."""
    from .pretrained import offset_share

    g = torch.Generator().manual_seed(10)
    w = torch.softmax(torch.randn(3, 7, 7, generator=g), dim=-1)  # (H, T, T)
    try:
        got = fn(w)
    except Exception as exc:
        return _report(False, f"your function raised {type(exc).__name__}: {exc}")
    want = offset_share(w[None, None], torch.ones(1, 7, dtype=torch.bool), -1)[0]  # (H,)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        return _report(False, f"expected a tensor of shape {tuple(want.shape)}, got {shape}")
    if torch.allclose(got, want):
        return _report(True, "the mean of w[h, q, q - 1] over q = 1..T-1, per head")
    if torch.allclose(got, offset_share(w[None, None], torch.ones(1, 7, dtype=torch.bool), 1)[0]):
        return _report(False, "that is the next token (q + 1); the previous one is q - 1")
    return _report(False, f"expected {[round(x, 3) for x in want.tolist()]}, got "
                          f"{[round(x, 3) for x in got.tolist()]}")
