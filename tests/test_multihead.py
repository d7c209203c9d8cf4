"""MultiHeadAttention against torch.nn.MultiheadAttention, GQA/MQA identities, and the KV cache."""

import pytest
import torch
from torch import nn

import selfattn

F64 = torch.float64


@pytest.mark.parametrize(("kdim", "vdim"), [(None, None), (12, 20)])
@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
def test_matches_torch_multihead_attention(kdim, vdim, padding, need_weights, device):
    d, h, B, L, S = 16, 4, 3, 5, 7
    ref = nn.MultiheadAttention(d, h, batch_first=True, kdim=kdim, vdim=vdim).to(device, F64).eval()
    ours = selfattn.MultiHeadAttention.from_torch(ref).eval()
    assert ours.q_proj.weight.dtype == F64 and ours.q_proj.weight.device.type == device
    q = torch.randn(B, L, d, dtype=F64, device=device)
    k = torch.randn(B, S, kdim or d, dtype=F64, device=device)
    v = torch.randn(B, S, vdim or d, dtype=F64, device=device)
    kpm = None  # torch's key_padding_mask: True = ignore (the opposite of ours)
    mask = None
    if padding:
        lengths = torch.tensor([7, 4, 1], device=device)
        kpm = ~selfattn.padding_mask(lengths, S)
        mask = selfattn.padding_mask(lengths, S)[:, None, None, :]  # (B, 1, 1, S)
    expected, expected_w = ref(q, k, v, key_padding_mask=kpm, need_weights=True,
                               average_attn_weights=False)
    out, weights = ours(q, k, v, attn_mask=mask, need_weights=need_weights)
    torch.testing.assert_close(out, expected)
    if need_weights:
        torch.testing.assert_close(weights, expected_w)
    else:
        assert weights is None


def test_self_attention_defaults_and_causal_match_torch(device):
    d, h = 24, 3
    ref = nn.MultiheadAttention(d, h, batch_first=True).to(device, F64)
    ours = selfattn.MultiHeadAttention.from_torch(ref)
    x = torch.randn(2, 6, d, dtype=F64, device=device)
    causal_ignore = ~selfattn.causal_mask(6, device=device)  # torch's bool attn_mask: True = ignore
    expected, _ = ref(x, x, x, attn_mask=causal_ignore)
    torch.testing.assert_close(ours(x, is_causal=True)[0], expected)
    torch.testing.assert_close(ours(x, is_causal=True, need_weights=True)[0], expected)


@pytest.mark.parametrize(("kdim", "vdim", "bias"), [(None, None, True), (12, 20, False)])
def test_from_torch_and_to_torch_round_trip(kdim, vdim, bias):
    ref = nn.MultiheadAttention(16, 4, batch_first=True, kdim=kdim, vdim=vdim, bias=bias).double()
    ours = selfattn.MultiHeadAttention.from_torch(ref)
    back = ours.to_torch()
    q = torch.randn(2, 5, 16, dtype=F64)
    k = torch.randn(2, 3, kdim or 16, dtype=F64)
    v = torch.randn(2, 3, vdim or 16, dtype=F64)
    torch.testing.assert_close(back(q, k, v)[0], ref(q, k, v)[0])
    torch.testing.assert_close(ours(q, k, v)[0], ref(q, k, v)[0])
    with torch.no_grad():
        ref.out_proj.weight[0, 0] += 1.0  # a copy, not shared weights
    assert not torch.allclose(ours(q, k, v)[0], ref(q, k, v)[0])


def test_to_torch_refuses_what_pytorch_cannot_express():
    for layer in [selfattn.MultiHeadAttention(16, 4, n_kv_heads=2),
                  selfattn.MultiHeadAttention(16, 4, rope=True),
                  selfattn.MultiHeadAttention(16, 4, out_dim=8)]:
        with pytest.raises(ValueError, match=r"nn\.MultiheadAttention twin"):
            layer.to_torch()
    with pytest.raises(TypeError, match=r"nn\.MultiheadAttention"):
        selfattn.MultiHeadAttention.from_torch(nn.Linear(4, 4))


def test_load_projections_copies_four_linear_layers():
    torch.manual_seed(0)
    fc = [nn.Linear(12, 12), nn.Linear(10, 12), nn.Linear(6, 12), nn.Linear(12, 5)]
    ours = selfattn.MultiHeadAttention(12, 4, kdim=10, vdim=6, out_dim=5)
    assert ours.load_projections(*fc) is ours
    for mine, theirs in zip([ours.q_proj, ours.k_proj, ours.v_proj, ours.out_proj], fc, strict=True):
        assert torch.equal(mine.weight, theirs.weight) and torch.equal(mine.bias, theirs.bias)
    with pytest.raises(RuntimeError, match="size mismatch"):
        ours.load_projections(fc[1], fc[1], fc[2], fc[3])


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4, 8])
@pytest.mark.parametrize("need_weights", [False, True])
def test_grouped_query_attention_is_mha_with_shared_kv_heads(n_kv_heads, need_weights, device):
    grouped = selfattn.MultiHeadAttention(32, 8, n_kv_heads=n_kv_heads).to(device, F64)
    mha = selfattn.expand_kv_heads(grouped)
    assert mha.config.n_kv_heads == 8
    x = torch.randn(2, 7, 32, dtype=F64, device=device)
    mask = torch.rand(2, 8, 7, 7, device=device) > 0.3  # per-head mask: the mask regrouped
    mask[..., 0] = True
    for kwargs in [{}, {"is_causal": True}, {"attn_mask": mask}, {"attn_mask": mask[:, :1]}]:
        out, w = grouped(x, need_weights=need_weights, **kwargs)
        expected, expected_w = mha(x, need_weights=need_weights, **kwargs)
        torch.testing.assert_close(out, expected)
        if need_weights:
            torch.testing.assert_close(w, expected_w)


def test_gqa_with_n_heads_kv_heads_is_mha_and_with_one_is_mqa():
    x = torch.randn(2, 5, 32, dtype=F64)
    mha = selfattn.MultiHeadAttention(32, 8).double()
    gqa_full = selfattn.MultiHeadAttention(32, 8, n_kv_heads=8).double()
    gqa_full.load_state_dict(mha.state_dict())
    torch.testing.assert_close(gqa_full(x)[0], mha(x)[0])
    mqa = selfattn.MultiHeadAttention(32, 8, n_kv_heads=1).double()
    gqa_one = selfattn.MultiHeadAttention(32, 8, n_kv_heads=2).double()
    with torch.no_grad():  # GQA whose two KV heads are equal is MQA
        gqa_one.load_state_dict(mqa.state_dict() | {
            f"{p}_proj.{t}": torch.cat([mqa.state_dict()[f"{p}_proj.{t}"]] * 2)
            for p in "kv" for t in ("weight", "bias")})
    torch.testing.assert_close(gqa_one(x)[0], mqa(x)[0])
    assert mqa.k_proj.weight.numel() * 8 == mha.k_proj.weight.numel()


@pytest.mark.parametrize("n_kv_heads", [8, 2, 1])
@pytest.mark.parametrize("prefill", [1, 4])
@pytest.mark.parametrize("need_weights", [False, True])
def test_kv_cache_decoding_equals_causal_forward(n_kv_heads, prefill, need_weights, device):
    m = selfattn.MultiHeadAttention(32, 8, n_kv_heads=n_kv_heads).to(device, F64).eval()
    x = torch.randn(2, 11, 32, dtype=F64, device=device)
    full, full_w = m(x, is_causal=True, need_weights=True)
    cache = selfattn.KVCache(capacity=2)  # small, so the cache has to grow on the way
    out, w = m(x[:, :prefill], is_causal=True, kv_cache=cache, need_weights=need_weights)
    outs = [out]
    for t in range(prefill, 11):
        out, w = m(x[:, t : t + 1], is_causal=True, kv_cache=cache, need_weights=need_weights)
        outs.append(out)
        if need_weights:  # the last token's weights over all keys seen so far
            torch.testing.assert_close(w[:, :, 0], full_w[:, :, t, : t + 1])
    torch.testing.assert_close(torch.cat(outs, dim=1), full)
    assert cache.length == 11
    assert cache.nbytes == 2 * 2 * n_kv_heads * 11 * 4 * 8  # k and v, B, heads, T, hd, fp64


def test_kv_cache_appends_in_place_and_grows_geometrically():
    cache = selfattn.KVCache(capacity=4)
    k = torch.randn(1, 2, 1, 8)
    cache.append(k, k)
    first = cache._k.data_ptr()
    for _ in range(3):
        cache.append(k, k)
    assert cache._k.data_ptr() == first  # no copy while there is room
    pointers = {cache._k.data_ptr()}
    for _ in range(1000):
        cache.append(k, k)
        pointers.add(cache._k.data_ptr())
    assert len(pointers) <= 10  # 4 -> 8 -> ... -> 1024: a handful of reallocations, not 1000
    keys, _ = cache.append(k, k)
    assert keys.shape == (1, 2, 1005, 8)


def test_fully_masked_query_gives_zero_attention_output(device):
    m = selfattn.MultiHeadAttention(16, 4).to(device).eval()
    x = torch.randn(1, 3, 16, device=device)
    mask = torch.ones(3, 3, dtype=torch.bool, device=device)
    mask[1] = False
    for need_weights in (True, False):
        out, w = m(x, attn_mask=mask, need_weights=need_weights)
        assert not out.isnan().any()
        torch.testing.assert_close(out[0, 1], m.out_proj.bias)  # attention output was zero
        if need_weights:
            assert (w[0, :, 1] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_runs_without_nan(dtype, device):
    m = selfattn.MultiHeadAttention(16, 4, n_kv_heads=2).to(device, dtype)
    x = torch.randn(2, 5, 16, dtype=dtype, device=device)
    for need_weights in (True, False):
        out, _ = m(x, is_causal=True, need_weights=need_weights)
        assert out.dtype == dtype and out.isfinite().all()


def test_dropout_only_in_training():
    m = selfattn.MultiHeadAttention(16, 4, dropout_p=0.5)
    x = torch.randn(2, 6, 16)
    m.eval()
    a, b = m(x, need_weights=True)[0], m(x, need_weights=True)[0]
    torch.testing.assert_close(a, b)
    m.train()
    assert not torch.allclose(m(x, need_weights=True)[0], a)


def test_head_dim_out_dim_and_config():
    m = selfattn.MultiHeadAttention(10, 4, head_dim=6, out_dim=3)
    assert m.q_proj.out_features == 24 and m.out_proj.out_features == 3
    assert m(torch.randn(2, 5, 10))[0].shape == (2, 5, 3)
    assert m.config.n_kv_heads == 4 and m.config.group_size == 1
    with pytest.raises(AttributeError):
        m.config.n_heads = 2  # frozen


@pytest.mark.parametrize("n_kv_heads", [8, 2, 1])
@pytest.mark.parametrize("need_weights", [False, True])
def test_chunks_after_a_cache_get_the_bottom_right_causal_mask(n_kv_heads, need_weights, device):
    m = selfattn.MultiHeadAttention(32, 8, n_kv_heads=n_kv_heads).to(device, F64).eval()
    x = torch.randn(2, 11, 32, dtype=F64, device=device)
    full, _ = m(x, is_causal=True)
    cache, outs, start = selfattn.KVCache(capacity=2), [], 0
    for size in [3, 4, 1, 3]:  # a prompt fed in chunks, each after the cached tokens
        out, _ = m(x[:, start : start + size], is_causal=True, kv_cache=cache,
                   need_weights=need_weights)
        outs.append(out)
        start += size
    torch.testing.assert_close(torch.cat(outs, dim=1), full)


@pytest.mark.parametrize("need_weights", [False, True])
def test_forward_checks_its_inputs_once_then_calls_the_unchecked_cores(monkeypatch, need_weights):
    # Validate once: forward checks query, key, value and the mask itself; the head helpers it
    # calls (split, merge, and repeat when grouped heads are copied) must be the unchecked cores,
    # not the public functions that check again.
    import selfattn.heads

    def checked_again(*args, **kwargs):
        raise AssertionError("forward called a public helper that checks its inputs again")

    monkeypatch.setattr(selfattn.heads, "_shape", checked_again)
    torch.manual_seed(0)
    layer = selfattn.MultiHeadAttention(16, 4, n_kv_heads=2, rope=True).eval()
    cache = selfattn.KVCache()
    x = torch.randn(2, 5, 16)
    with torch.no_grad(), selfattn.fastpaths.disabled("grouped_heads"):
        out, _ = layer(x, is_causal=True, need_weights=need_weights, kv_cache=cache)
        layer(x[:, :1], is_causal=True, need_weights=need_weights, kv_cache=cache)
    assert out.shape == (2, 5, 16)
    with pytest.raises(AssertionError, match="checks its inputs again"):
        selfattn.heads.split_heads(x, 4)  # the patch is live: the public helper would trip it


def test_the_config_stores_every_size_resolved():
    cfg = selfattn.AttentionConfig.build(d_model=32, n_heads=4, n_kv_heads=2)
    sizes = {name: getattr(cfg, name) for name in
             ("d_model", "n_heads", "n_kv_heads", "head_dim", "kdim", "vdim", "out_dim")}
    assert sizes == {"d_model": 32, "n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "kdim": 32,
                     "vdim": 32, "out_dim": 32}
    assert selfattn.MultiHeadAttention(32, 4, n_kv_heads=2).config == cfg
    with pytest.raises(TypeError):  # the constructor takes every size; build() fills defaults in
        selfattn.AttentionConfig(d_model=32, n_heads=4)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        selfattn.AttentionConfig.build(d_model=32, n_heads=4, n_kv_heads=3)


@pytest.mark.parametrize("n_kv_heads", [4, 1])
@pytest.mark.parametrize("need_weights", [False, True])
def test_a_mask_of_any_rank_means_the_same_on_every_path(n_kv_heads, need_weights):
    # a (S,) mask passed the checks, then the no-weights path raised IndexError (not MQA's)
    from selfattn import fastpaths

    layer = selfattn.MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads).eval()
    x = torch.randn(2, 5, 16)
    keep = torch.tensor([True, True, True, False, True])
    full, _ = layer(x, attn_mask=keep[None, None, None], need_weights=True)
    for switch in (fastpaths.disabled, lambda: fastpaths.disabled("split_kv")):
        with switch():
            out, _ = layer(x, attn_mask=keep, need_weights=need_weights)
        torch.testing.assert_close(out, full)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_the_layer_is_h_single_head_attentions_on_slices_of_its_projections(n_kv_heads, device):
    # Concat(head_1, ..., head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V), where
    # W_i is the i-th block of head_dim rows of a projection (key/value block i // group for GQA)
    torch.manual_seed(0)
    layer = selfattn.MultiHeadAttention(24, 4, n_kv_heads=n_kv_heads, kdim=12, vdim=20,
                                        out_dim=7).to(device).eval()
    hd, group = layer.config.head_dim, layer.config.group_size
    q = torch.randn(3, 2, 24, device=device)
    k, v = torch.randn(3, 5, 12, device=device), torch.randn(3, 5, 20, device=device)
    keep = torch.rand(3, 1, 2, 5, device=device) > 0.3  # (B, 1, L, S), some keys masked
    keep[..., 0] = True

    def block(proj, x, i):  # (B, T, hd): the i-th slice of the projection's output features
        rows = slice(i * hd, (i + 1) * hd)
        return x @ proj.weight[rows].T + proj.bias[rows]

    outs = []
    for i in range(layer.config.n_heads):
        qi = block(layer.q_proj, q, i)
        ki, vi = block(layer.k_proj, k, i // group), block(layer.v_proj, v, i // group)
        outs.append(selfattn.scaled_dot_product_attention(qi, ki, vi, attn_mask=keep[:, 0])[0])
    by_heads = layer.out_proj(torch.cat(outs, dim=-1))  # (B, L, out_dim)
    out, _ = layer(q, k, v, attn_mask=keep)
    torch.testing.assert_close(by_heads, out)
    wrong = layer.out_proj(torch.cat(outs[::-1], dim=-1))  # the heads concatenated out of order
    assert not torch.allclose(wrong, out, atol=1e-4)


def test_each_heads_scores_have_rank_at_most_head_dim():
    # q_i k_i^T is (n, hd) @ (hd, n): rank <= hd, whatever n (Bhojanapalli et al. 2020)
    torch.manual_seed(0)
    n, d = 40, 32
    x = torch.randn(1, n, d, dtype=torch.float64)
    for h in [1, 2, 4, 8, 16]:
        layer = selfattn.MultiHeadAttention(d, h).double()
        q = selfattn.split_heads(layer.q_proj(x), h)  # (1, h, n, hd)
        k = selfattn.split_heads(layer.k_proj(x), h)  # (1, h, n, hd)
        ranks = torch.linalg.matrix_rank(q @ k.transpose(-1, -2))  # (1, h)
        assert ranks.tolist() == [[min(n, d // h)] * h]


def test_allocated_bytes_counts_the_spare_room_a_growing_cache_keeps():
    cache = selfattn.KVCache(capacity=4)
    assert cache.allocated_bytes == 0 == cache.nbytes
    token = torch.zeros(1, 2, 1, 8)  # one token, 2 key/value heads of 8
    per_token = 2 * 2 * 8 * 4  # keys and values, float32
    for n in range(1, 18):
        cache.append(token, token)
        capacity = next(c for c in (4, 8, 16, 32) if c >= n)  # doubled when full
        assert cache.nbytes == n * per_token
        assert cache.allocated_bytes == capacity * per_token
    assert cache.allocated_bytes / cache.nbytes == 32 / 17  # just after a doubling: near 2x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("grad", [True, False])
def test_fully_masked_query_gives_zero_in_every_dtype_and_mode(dtype, training, grad):
    # chapter 8, pitfall 15: nn.MultiheadAttention's answer for a query that may attend to
    # nothing depends on the path it takes (mode, autograd, need_weights); the layer's must not
    torch.manual_seed(0)
    m = selfattn.MultiHeadAttention(16, 4).to(dtype).train(training)
    x = torch.randn(1, 3, 16, dtype=dtype)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False  # query 1 may attend to nothing
    with torch.set_grad_enabled(grad):
        for need_weights in (True, False):
            out, w = m(x, attn_mask=mask, need_weights=need_weights)
            assert out.dtype == dtype and out.isfinite().all()
            assert torch.equal(out[0, 1], m.out_proj.bias.detach())  # attention output zero
            if need_weights:
                assert (w[0, :, 1] == 0).all() and w.isfinite().all()
            if grad and need_weights:  # and no NaN flows back from the masked row
                out.float().sum().backward()
                assert all(p.grad.isfinite().all() for p in m.parameters())
                m.zero_grad()


@pytest.mark.parametrize("n_heads, head_dim", [(1, 64), (4, 4), (4, None)])
def test_attention_tagger_takes_a_head_width(n_heads, head_dim):
    # chapter 6 separates the number of heads from their width with this argument
    from selfattn.book import tagging

    torch.manual_seed(0)
    m = tagging.AttentionTagger(10, 121, d=32, n_heads=n_heads, head_dim=head_dim)
    hd = 32 // n_heads if head_dim is None else head_dim
    assert (m.attn.config.n_heads, m.attn.config.head_dim) == (n_heads, hd)
    assert m.attn.q_proj.weight.shape == (n_heads * hd, 32)
    assert m.attn.out_proj.weight.shape == (32, n_heads * hd)  # back to the model's width
    logits, w = m(torch.randint(0, 10, (3, 7)), need_weights=True)
    assert logits.shape == (3, 7, 121) and w.shape == (3, n_heads, 7, 7)


FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("n_kv_heads", [4, 1])
@pytest.mark.parametrize("mask_dtype", FLOATS)
@pytest.mark.parametrize("dtype", FLOATS)
def test_a_float_mask_of_any_dtype_is_taken(dtype, mask_dtype, n_kv_heads, need_weights):
    """A float mask whose dtype is neither the layer's nor float32 is cast to the softmax's
    dtype (before: PyTorch's kernel raised "Expected attn_mask dtype to be bool or float or to
    match query dtype" from deep inside SDPA). The mask here holds 0, -inf and quarters, exact
    in every dtype, so every mask dtype gives the layer's own result."""
    torch.manual_seed(0)
    m = selfattn.MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads).to(dtype).eval()
    x = torch.randn(2, 5, 16, dtype=dtype)
    bias = torch.randint(-4, 1, (2, 1, 5, 5)) / 4  # quarters in [-1, 0]
    bias[1, ..., -1] = float("-inf")
    with torch.no_grad():
        for is_causal in (False, True):
            out, weights = m(x, attn_mask=bias.to(mask_dtype), is_causal=is_causal,
                             need_weights=need_weights)
            want, want_weights = m(x, attn_mask=bias.to(dtype), is_causal=is_causal,
                                   need_weights=need_weights)
            torch.testing.assert_close(out, want)
            if need_weights:
                torch.testing.assert_close(weights, want_weights)
