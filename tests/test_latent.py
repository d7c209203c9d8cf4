"""Multi-head latent attention (DeepSeek-V2, §2.1): the explicit and the absorbed forms compute
the same numbers, equal a reference written out by hand, decode from a cache of
``kv_rank + rope_dim`` numbers per token, and say what is wrong with bad input."""

import math

import pytest
import torch
from torch.testing import assert_close

from selfattn import MultiHeadAttention
from selfattn.cache import KVCache, SlidingWindowCache
from selfattn.latent import MultiHeadLatentAttention
from selfattn.masks import causal_mask
from selfattn.positional import apply_rope

D, H, HD, R = 24, 4, 6, 10  # d_model, n_heads, head_dim, kv_rank: kv_rank != head_dim on purpose


def layer(rope_dim=4, bias=False, cls=MultiHeadLatentAttention, device="cpu"):
    torch.manual_seed(1)
    m = cls(D, H, HD, R, rope_dim=rope_dim, bias=bias).to(device=device, dtype=torch.float64)
    if bias:  # nn.Linear's biases start small; make them count
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() == 1:
                    p.normal_()
    return m


def tokens(B=3, T=7, device="cpu"):
    return torch.randn(B, T, D, dtype=torch.float64, device=device)


def run(m, x, *, is_causal, absorb, chunks=None, cache=None):
    """The layer over ``x`` in one call (``chunks=None``) or chunk by chunk through a cache."""
    if chunks is None:
        return m(x, is_causal=is_causal, absorb=absorb)
    cache = KVCache(capacity=2) if cache is None else cache  # small: the buffers grow on the way
    outs, start = [], 0
    for n in chunks:
        outs.append(m(x[:, start:start + n], is_causal=is_causal, kv_cache=cache, absorb=absorb))
        start += n
    assert start == x.shape[1]
    return torch.cat(outs, dim=1)


def reference(m, x, mask=None):
    """MLA written out by hand, head by head: the latent, each head's keys and values from it
    with plain matmuls, the rope parts, scores over sqrt(head_dim + rope_dim), softmax.
    ``mask``: bool (T, T), True = may attend."""
    def linear(lin, inp, rows=slice(None)):
        out = inp @ lin.weight[rows].T
        return out if lin.bias is None else out + lin.bias[rows]

    T = x.shape[1]
    hd, dr = m.head_dim, m.rope_dim
    positions = torch.arange(T, device=x.device)
    c = linear(m.kv_down, x)  # (B, T, r): the latent
    heads = []
    for h in range(m.n_heads):
        rows = slice(h * hd, (h + 1) * hd)
        q = linear(m.q_proj, x, rows)  # (B, T, hd)
        k = c @ m.k_up.weight[rows].T  # (B, T, hd)
        v = linear(m.v_up, c, rows)  # (B, T, hd)
        scores = q @ k.mT  # (B, T, T)
        if dr:
            q_r = apply_rope(linear(m.q_rope, x, slice(h * dr, (h + 1) * dr)), positions)
            k_r = apply_rope(linear(m.k_rope, x), positions)  # one key head for all
            scores = scores + q_r @ k_r.mT
        scores = scores / math.sqrt(hd + dr)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v)
    return linear(m.out_proj, torch.cat(heads, dim=-1))  # (B, T, d_model)


CACHE_MODES = {"no cache": None, "token by token": [1] * 7, "chunks": [3, 1, 2, 1]}


@pytest.mark.parametrize("mode", list(CACHE_MODES))
@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rope_dim", [0, 4])
def test_the_absorbed_form_equals_the_explicit_one(rope_dim, bias, is_causal, B, mode, device):
    m, x = layer(rope_dim, bias, device=device), tokens(B, device=device)
    chunks = CACHE_MODES[mode]
    explicit = run(m, x, is_causal=is_causal, absorb=False, chunks=chunks)
    absorbed = run(m, x, is_causal=is_causal, absorb=True, chunks=chunks)
    assert explicit.shape == (B, 7, D)
    assert_close(absorbed, explicit)  # float64's default tolerances: rounding only


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("chunks", [[1] * 7, [3, 1, 2, 1], [4, 3], [7]])
@pytest.mark.parametrize("rope_dim", [0, 4])
def test_cached_decoding_equals_the_full_causal_pass(rope_dim, chunks, absorb):
    m, x = layer(rope_dim, bias=True), tokens()
    full = m(x, is_causal=True)
    assert_close(run(m, x, is_causal=True, absorb=absorb, chunks=chunks), full)


def test_a_prompt_read_explicitly_can_be_decoded_absorbed_from_the_same_cache():
    m, x = layer(), tokens()
    cache = KVCache()
    prompt = m(x[:, :4], is_causal=True, kv_cache=cache)  # explicit
    steps = [m(x[:, t:t + 1], is_causal=True, kv_cache=cache, absorb=True) for t in range(4, 7)]
    assert_close(torch.cat([prompt, *steps], dim=1), m(x, is_causal=True))


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rope_dim", [0, 4])
def test_each_form_equals_the_hand_written_reference(rope_dim, bias, is_causal, absorb):
    m, x = layer(rope_dim, bias), tokens()
    mask = causal_mask(7) if is_causal else None
    assert_close(m(x, is_causal=is_causal, absorb=absorb), reference(m, x, mask))


@pytest.mark.parametrize("absorb", [False, True])
def test_without_is_causal_a_cached_chunk_sees_every_token_so_far(absorb):
    m, x = layer(), tokens()
    chunks = [3, 1, 3]
    ends = torch.tensor([3, 3, 3, 4, 7, 7, 7])  # each token's chunk ends there
    mask = torch.arange(7)[None, :] < ends[:, None]  # (T, T): the chunk and everything before
    assert_close(run(m, x, is_causal=False, absorb=absorb, chunks=chunks), reference(m, x, mask))


@pytest.mark.parametrize("absorb", [False, True])
def test_a_sliding_window_cache_gives_sliding_window_attention(absorb):
    m, x = layer(), tokens()
    out = run(m, x, is_causal=True, absorb=absorb, chunks=[1] * 7, cache=SlidingWindowCache(3))
    assert_close(out, reference(m, x, causal_mask(7, window=3)))


@pytest.mark.parametrize("rope_dim", [0, 4, 8])
def test_the_cache_holds_kv_rank_plus_rope_dim_numbers_per_token(rope_dim):
    m, x = layer(rope_dim), tokens(B=3, T=5)
    cache = KVCache()
    m(x, is_causal=True, kv_cache=cache, absorb=True)
    assert m.cache_numbers_per_token() == R + rope_dim
    assert cache.length == 5
    assert cache.nbytes == 3 * 5 * (R + rope_dim) * 8  # batch, tokens, numbers, float64 bytes
    latent, rope_key = cache.append(x.new_empty(3, 1, 0, R), x.new_empty(3, 1, 0, rope_dim))
    assert latent.shape == (3, 1, 5, R) and rope_key.shape == (3, 1, 5, rope_dim)
    assert_close(latent, m.kv_down(x)[:, None])  # the latent itself, nothing per head
    # multi-head attention of the same heads caches 2 * n_heads * head_dim numbers per token
    mha = MultiHeadAttention(D, H, head_dim=HD).double()
    mha_cache = KVCache()
    mha(x, is_causal=True, kv_cache=mha_cache)
    assert mha_cache.nbytes == 3 * 5 * (2 * H * HD) * 8


class RopeOnContentKey(MultiHeadLatentAttention):
    """Planted bug: RoPE applied to the up-projected key instead of the decoupled one only (the
    coupling §2.1.3 avoids): the absorbed form cannot express it."""

    def _keys_and_values(self, latent, k_rope):
        k, v = super()._keys_and_values(latent, k_rope)  # (B, H, S, hd + dr), (B, H, S, hd)
        content = apply_rope(k[..., :self.head_dim], torch.arange(k.shape[2]))
        return torch.cat([content, k[..., self.head_dim:]], dim=-1), v


class ScaleByHeadDim(MultiHeadLatentAttention):
    """Planted bug: the scores divided by sqrt(head_dim), forgetting the rope features."""

    @property
    def scale(self):
        return 1 / math.sqrt(self.head_dim)


class ValueBiasDropped(MultiHeadLatentAttention):
    """Planted bug: the absorbed output projection without the folded value bias."""

    def absorbed_weights(self):
        return super().absorbed_weights()._replace(output_bias=self.out_proj.bias)


@pytest.mark.parametrize("bug, wrong, forms_differ", [
    (RopeOnContentKey, {"explicit"}, True),  # the two forms' equality catches it
    (ValueBiasDropped, {"absorbed"}, True),
    (ScaleByHeadDim, {"explicit", "absorbed"}, False),  # both wrong alike: only the reference sees it
])
def test_the_checks_catch_a_planted_bug(bug, wrong, forms_differ):
    m, x = layer(rope_dim=4, bias=True, cls=bug), tokens()
    out = {"explicit": m(x, is_causal=True), "absorbed": m(x, is_causal=True, absorb=True)}
    right = reference(m, x, causal_mask(7))
    for form, y in out.items():
        if form in wrong:
            assert (y - right).abs().max() > 1e-3, form  # far beyond rounding
        else:
            assert_close(y, right)
    assert ((out["explicit"] - out["absorbed"]).abs().max() > 1e-3) == forms_differ


def test_the_absorbed_weights_follow_the_module_weights():
    m, x = layer(bias=True), tokens()
    before = m(x, is_causal=True, absorb=True)
    with torch.no_grad():
        for lin in (m.q_proj, m.k_up, m.v_up, m.out_proj):
            lin.weight.add_(0.1 * torch.randn_like(lin.weight))
        m.v_up.bias.add_(1.0)
    after = m(x, is_causal=True, absorb=True)
    assert (after - before).abs().max() > 1e-2
    assert_close(after, m(x, is_causal=True))
    assert_close(after, reference(m, x, causal_mask(7)))


def test_the_absorbed_weights_are_the_products_of_the_papers_matrices():
    m = layer(bias=True)
    w = m.absorbed_weights()
    assert w.query.shape == (H * R, D) and w.output.shape == (D, H * R)
    for h in range(H):
        rows, cols = slice(h * HD, (h + 1) * HD), slice(h * R, (h + 1) * R)
        W_q, W_uk = m.q_proj.weight[rows], m.k_up.weight[rows]  # (hd, d), (hd, r)
        W_uv, W_o = m.v_up.weight[rows], m.out_proj.weight[:, rows]  # (hd, r), (d, hd)
        assert_close(w.query[cols], W_uk.T @ W_q)
        assert_close(w.query_bias[cols], W_uk.T @ m.q_proj.bias[rows])
        assert_close(w.output[:, cols], W_o @ W_uv)
    assert_close(w.output_bias, m.out_proj.bias + m.out_proj.weight @ m.v_up.bias)


def test_gradients_reach_every_parameter_and_agree_between_the_forms():
    grads = {}
    for form in (False, True):
        m, x = layer(rope_dim=4, bias=True), tokens()
        x.requires_grad_(True)
        cache = KVCache()
        out = torch.cat([m(x[:, :4], is_causal=True, kv_cache=cache, absorb=form),
                         m(x[:, 4:], is_causal=True, kv_cache=cache, absorb=form)], dim=1)
        out.square().sum().backward()
        grads[form] = {name: p.grad for name, p in m.named_parameters()} | {"x": x.grad}
    names = {name for name, _ in layer(rope_dim=4, bias=True).named_parameters()}
    assert names == {"kv_down.weight", "kv_down.bias", "k_up.weight", "v_up.weight", "v_up.bias",
                     "q_proj.weight", "q_proj.bias", "out_proj.weight", "out_proj.bias",
                     "q_rope.weight", "q_rope.bias", "k_rope.weight", "k_rope.bias"}
    assert set(grads[False]) == set(grads[True]) == names | {"x"}
    for form in (False, True):
        for name, g in grads[form].items():
            assert g is not None and torch.isfinite(g).all() and g.abs().max() > 0, (form, name)
    for name, g in grads[True].items():
        assert_close(g, grads[False][name], msg=name)


def test_k_up_has_no_bias_because_the_softmax_would_ignore_it():
    m, x = layer(rope_dim=0, bias=True), tokens()
    assert m.k_up.bias is None and m.v_up.bias is not None
    # the reason: a key bias b adds q . b to every score of a row, and the softmax drops it
    out = m(x, is_causal=True)
    m.k_up.bias = torch.nn.Parameter(torch.randn(H * HD, dtype=torch.float64))
    assert_close(m(x, is_causal=True), out)


def test_without_rope_there_are_no_rope_projections():
    m = layer(rope_dim=0)
    assert m.q_rope is None and m.k_rope is None
    assert m.scale == 1 / math.sqrt(HD)
    assert layer(rope_dim=4).scale == 1 / math.sqrt(HD + 4)


@pytest.mark.parametrize("args, kwargs, exc, words", [
    ((0, H, HD, R), {}, ValueError, ["d_model must be positive, got 0"]),
    ((D, 4.0, HD, R), {}, TypeError, ["n_heads must be an int, got float"]),
    ((D, H, HD, 0), {}, ValueError, ["kv_rank must be positive, got 0"]),
    ((D, H, HD, R), {"rope_dim": 3}, ValueError, ["rope_dim", "even", "got 3"]),
    ((D, H, HD, R), {"rope_dim": -2}, ValueError, ["rope_dim", "got -2"]),
    ((D, H, HD, R), {"rope_dim": True}, TypeError, ["rope_dim must be an int, got bool"]),
    ((D, H, HD, R), {"bias": 1}, TypeError, ["bias must be a bool, got int"]),
])
def test_bad_sizes_say_what_is_wrong(args, kwargs, exc, words):
    with pytest.raises(exc) as info:
        MultiHeadLatentAttention(*args, **kwargs)
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("call, exc, words", [
    (lambda m: m(torch.randn(7, D, dtype=torch.float64)), ValueError,
     ["x must be (batch, seq, d_model)", "(7, 24)"]),
    (lambda m: m(torch.randn(2, 7, D + 1, dtype=torch.float64)), ValueError,
     ["d_model = 24", "(2, 7, 25)"]),
    (lambda m: m(torch.randn(2, 0, D, dtype=torch.float64)), ValueError,
     ["at least one token", "(2, 0, 24)"]),
    (lambda m: m(torch.ones(2, 7, D, dtype=torch.long)), TypeError, ["x must be a floating-point"]),
    (lambda m: m([[0.0] * D]), TypeError, ["x must be a torch.Tensor, got list"]),
    (lambda m: m(tokens(), kv_cache={}), TypeError, ["kv_cache must be a selfattn.cache.Cache", "dict"]),
    (lambda m: m(tokens(), is_causal=1), TypeError, ["is_causal must be a bool, got int"]),
    (lambda m: m(tokens(), absorb="yes"), TypeError, ["absorb must be a bool, got str"]),
])
def test_bad_input_says_what_is_wrong(call, exc, words):
    m = layer()
    with pytest.raises(exc) as info:
        call(m)
    for word in words:
        assert word in str(info.value)


def test_a_cache_of_another_layer_or_batch_is_refused():
    m, cache = layer(), KVCache()
    m(tokens(B=3), kv_cache=cache)
    with pytest.raises(ValueError, match=r"holds k of \(batch, n_kv_heads, width\) \(3, 1, 10\)"):
        m(tokens(B=2), kv_cache=cache)  # another batch
    other = MultiHeadLatentAttention(D, H, HD, R + 2, rope_dim=4).double()
    with pytest.raises(ValueError, match="Use a new KVCache"):
        other(tokens(B=3), kv_cache=cache)  # another layer's latent width
    mha_cache = KVCache()
    MultiHeadAttention(D, H, head_dim=HD).double()(tokens(B=3), kv_cache=mha_cache)
    with pytest.raises(ValueError, match=r"holds k of \(batch, n_kv_heads, width\) \(3, 4, 6\)"):
        m(tokens(B=3), kv_cache=mha_cache)  # an MHA layer's cache


@pytest.mark.parametrize("absorb", [False, True])
def test_training_through_a_cache_whose_latents_require_no_grad(absorb):
    """The compression frozen (kv_down, k_rope) and the input requiring nothing: the cached
    latents require no grad, yet autograd saves them for the other weights' gradients. The
    layer tells the cache (``recorded``). Before: the cache wrote the next token into the saved
    latents' storage, and backward raised "modified by an inplace operation"."""
    m, x = layer(rope_dim=4, bias=True), tokens()
    m.kv_down.requires_grad_(False)
    m.k_rope.requires_grad_(False)
    full = m(x, is_causal=True)
    want = torch.autograd.grad(full.square().sum(), m.q_proj.weight)
    out = run(m, x, is_causal=True, absorb=absorb, chunks=[3] + [1] * 4, cache=KVCache(16))
    got = torch.autograd.grad(out.square().sum(), m.q_proj.weight)
    assert_close(out, full)
    assert_close(got, want)


def test_the_absorbed_weights_are_computed_once_until_a_weight_changes():
    """Decoding reuses the absorbed matrices (before: recomputed at every step, most of a step's
    time at short contexts); an optimiser's step, load_state_dict or a new parameter makes the
    next step recompute them, and with autograd recording they are recomputed (differentiable)."""
    m, x = layer(bias=True), tokens()
    with torch.no_grad():
        first = m.absorbed_weights()
        assert m.absorbed_weights() is first  # a second step: the same tensors, nothing computed
        m.q_proj.weight.add_(0.1)  # in place, as an optimiser's step
        second = m.absorbed_weights()
        assert second is not first and not torch.equal(second.query, first.query)
        assert_close(m(x, is_causal=True, absorb=True), m(x, is_causal=True))
        m.load_state_dict(layer(bias=True).state_dict())  # copied in place
        third = m.absorbed_weights()
        assert_close(third.query, first.query)  # the first weights, back
        m.v_up.bias = torch.nn.Parameter(m.v_up.bias + 1.0)  # replaced
        assert not torch.equal(m.absorbed_weights().output_bias, third.output_bias)
        assert_close(m(x, is_causal=True, absorb=True), reference(m, x, causal_mask(7)))
    recorded = m.absorbed_weights()  # grad mode on, the weights require grad: a fresh product
    assert recorded.query.requires_grad and recorded is not m.absorbed_weights()


def test_a_decoding_step_does_not_recompute_the_absorbed_weights():
    m = MultiHeadLatentAttention(64, 8, 16, kv_rank=32, rope_dim=8).eval()
    cache = KVCache(capacity=64)
    with torch.no_grad():
        m(torch.randn(1, 8, 64), is_causal=True, kv_cache=cache, absorb=True)
        products = _matmuls(lambda: m(torch.randn(1, 1, 64), is_causal=True, kv_cache=cache,
                                      absorb=True))
    # the token's latent and rope parts (three), its absorbed query, the content and position
    # scores, the weighted sum, the absorbed output: no product of two weight matrices (before:
    # two more, W^UK^T W^Q and W^O W^UV, at every step)
    assert products == 8, products


def _matmuls(fn) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in ("mm", "bmm", "addmm", "matmul"):
                Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n
