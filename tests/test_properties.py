"""Properties of attention that hold for every input (hypothesis draws the inputs)."""

import torch
from hypothesis import given
from hypothesis import strategies as st

import selfattn

F64 = torch.float64
sizes = st.integers(1, 8)
seeds = st.integers(0, 2**31 - 1)


@given(L=sizes, S=sizes, E=sizes, seed=seeds, causal=st.booleans())
def test_weight_rows_sum_to_one(L, S, E, seed, causal):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, L, E, generator=g, dtype=F64) * 10  # large scores too
    k = torch.randn(2, S, E, generator=g, dtype=F64) * 10
    v = torch.randn(2, S, 3, generator=g, dtype=F64)
    _, w = selfattn.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, L, dtype=F64))


@given(T=st.integers(2, 10), t=st.integers(0, 8), seed=seeds, n_kv=st.sampled_from([1, 2, 4]),
       need_weights=st.booleans())
def test_causal_attention_never_looks_ahead(T, t, seed, n_kv, need_weights):
    t = t % (T - 1)  # change tokens t+1.. ; outputs 0..t must not move
    torch.manual_seed(seed)
    m = selfattn.MultiHeadAttention(16, 4, n_kv_heads=n_kv).double()
    x = torch.randn(1, T, 16, dtype=F64)
    y = x.clone()
    y[:, t + 1 :] = torch.randn(1, T - t - 1, 16, dtype=F64) * 5
    a, _ = m(x, is_causal=True, need_weights=need_weights)
    b, _ = m(y, is_causal=True, need_weights=need_weights)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


@given(T=st.integers(2, 10), seed=seeds, need_weights=st.booleans())
def test_self_attention_without_positions_is_permutation_equivariant(T, seed, need_weights):
    torch.manual_seed(seed)
    m = selfattn.MultiHeadAttention(16, 4).double()
    x = torch.randn(2, T, 16, dtype=F64)
    perm = torch.randperm(T)
    out, w = m(x, need_weights=need_weights)
    out_p, w_p = m(x[:, perm], need_weights=need_weights)
    torch.testing.assert_close(out_p, out[:, perm])  # shuffle in, same shuffle out
    if need_weights:
        torch.testing.assert_close(w_p, w[:, :, perm][:, :, :, perm])


@given(L=sizes, S=sizes, seed=seeds)
def test_masked_keys_get_exactly_zero_weight(L, S, seed):
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(L, S, generator=g) > 0.5
    q, k, v = (torch.randn(n, 4, generator=g) for n in (L, S, S))
    _, w = selfattn.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert (w[~keep] == 0).all()
    live = keep.any(-1)
    torch.testing.assert_close(w[live].sum(-1), torch.ones(int(live.sum())))
