"""Positional encodings: sinusoidal, learned, RoPE and ALiBi."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import selfattn
from selfattn.positional import (
    LearnedPositionalEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    sinusoidal_encoding,
)

F64 = torch.float64


def test_learned_positions_and_the_end_of_the_table():
    pe = LearnedPositionalEmbedding(max_len=8, d_model=4)
    assert pe(5).shape == (5, 4) and torch.equal(pe(8)[:5], pe(5))
    with pytest.raises(ValueError, match=r"position 8 is beyond the learned table of 8"):
        pe(9)


def test_rope_keeps_lengths():
    x = torch.randn(2, 3, 10, 16, dtype=F64)
    torch.testing.assert_close(apply_rope(x).norm(dim=-1), x.norm(dim=-1))


@given(m=st.integers(0, 200), n=st.integers(0, 200), shift=st.integers(-50, 300),
       seed=st.integers(0, 2**31 - 1))
def test_rope_scores_depend_only_on_the_offset(m, n, shift, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 8, generator=g, dtype=F64), torch.randn(1, 8, generator=g, dtype=F64)
    shift = max(shift, -min(m, n))  # keep positions >= 0

    def score(a, b):
        return (apply_rope(q, torch.tensor([a])) @ apply_rope(k, torch.tensor([b])).T).item()

    assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-9)


def test_rope_at_position_zero_is_the_identity_and_odd_width_is_refused():
    x = torch.randn(1, 6)
    torch.testing.assert_close(apply_rope(x), x)
    with pytest.raises(ValueError, match="even"):
        apply_rope(torch.randn(3, 7))


def test_rope_at_an_offset_is_the_longer_sequence_cut():
    # decoding with a cache: tokens P.. get positions P..; as if rotated with the whole sequence
    x = torch.randn(2, 9, 8, dtype=F64)
    torch.testing.assert_close(apply_rope(x[:, 6:], torch.arange(6, 9)), apply_rope(x)[:, 6:])


def test_alibi_slopes_as_in_the_paper():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # 12 heads: the 8-head slopes, then every other slope of the 16-head sequence
    sixteen = [2 ** (-0.5 * (i + 1)) for i in range(16)]
    expected = [2.0 ** -(i + 1) for i in range(8)] + sixteen[0::2][:4]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected))
    assert alibi_slopes(1).item() == pytest.approx(2 ** -8)


def test_alibi_bias_works_as_an_attention_mask():
    bias = alibi_bias(4, 5)  # (H, L, S)
    assert bias.shape == (4, 5, 5) and (bias.diagonal(dim1=1, dim2=2) == 0).all()
    assert bias[0, 4, 0].item() == pytest.approx(-0.25 * 4)  # slope 1/4 for head 0 of 4
    q = k = v = torch.randn(2, 4, 5, 8)
    out, w = selfattn.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=True)
    ref = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(8) + bias).masked_fill(
        ~selfattn.causal_mask(5), float("-inf")), dim=-1)
    torch.testing.assert_close(w, ref)
    m = selfattn.MultiHeadAttention(32, 4)
    out, _ = m(torch.randn(2, 5, 32), attn_mask=bias, is_causal=True)
    assert out.shape == (2, 5, 32)


@pytest.mark.parametrize("n_kv_heads", [4, 1])
def test_rope_in_multihead_attention_is_the_rotated_queries_and_keys(n_kv_heads):
    torch.manual_seed(0)
    m = selfattn.MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads, rope=True).double()
    x = torch.randn(2, 7, 32, dtype=F64)
    out, w = m(x, is_causal=True, need_weights=True)
    q = m.q_proj(x).view(2, 7, 4, 8).transpose(1, 2)  # (B, H, T, hd)
    k = m.k_proj(x).view(2, 7, n_kv_heads, 8).transpose(1, 2)  # (B, H_kv, T, hd)
    k = selfattn.repeat_kv(k, 4 // n_kv_heads)  # (B, H, T, hd)
    scores = apply_rope(q) @ apply_rope(k).transpose(-2, -1) / math.sqrt(8)  # (B, H, T, T)
    ref = torch.softmax(scores.masked_fill(~selfattn.causal_mask(7), float("-inf")), dim=-1)
    torch.testing.assert_close(w, ref)
    fast, _ = m(x, is_causal=True)
    torch.testing.assert_close(fast, out)


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_rope_decoding_with_a_cache_continues_the_positions(n_kv_heads):
    torch.manual_seed(1)
    m = selfattn.MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads, rope=True).double()
    x = torch.randn(2, 9, 32, dtype=F64)
    full, _ = m(x, is_causal=True)
    cache = selfattn.KVCache(capacity=2)
    steps = [m(x[:, :3], is_causal=True, kv_cache=cache)[0]]
    steps += [m(x[:, t : t + 1], is_causal=True, kv_cache=cache)[0] for t in range(3, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_rope_makes_self_attention_shift_invariant_but_not_order_blind():
    torch.manual_seed(2)
    m = selfattn.MultiHeadAttention(16, 2, rope=True).double()
    x = torch.randn(1, 6, 16, dtype=F64)
    _, w = m(x, need_weights=True)
    # the same tokens after 5 others: the weights among them are unchanged (scores are relative)
    padded = torch.cat([torch.randn(1, 5, 16, dtype=F64), x], dim=1)
    keep = torch.zeros(11, 11, dtype=torch.bool)
    keep[5:, 5:] = True
    _, w_shifted = m(padded, attn_mask=keep, need_weights=True)
    torch.testing.assert_close(w_shifted[..., 5:, 5:], w)
    # reversing the tokens does not simply reverse the weights, as it would without positions
    _, w_rev = m(x.flip(1), need_weights=True)
    assert not torch.allclose(w_rev, w.flip(-1).flip(-2), atol=1e-3)


def test_sinusoidal_encoding_matches_the_formula():
    pe = sinusoidal_encoding(50, 16)
    for pos in (0, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert pe[pos, 2 * i].item() == pytest.approx(torch.sin(torch.tensor(angle)).item(), abs=1e-5)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(torch.cos(torch.tensor(angle)).item(), abs=1e-5)
    with pytest.raises(ValueError, match="even"):
        sinusoidal_encoding(4, 7)


def test_rope_halves_layout_is_the_neighbours_layout_on_reordered_features():
    torch.manual_seed(3)
    x = torch.randn(2, 7, 12, dtype=F64)  # (B, T, d)
    positions = torch.arange(5, 12)
    halves = apply_rope(x, positions, layout="halves")
    # by hand: feature i pairs with i + d/2, turned by positions * theta_i
    theta = 10000.0 ** (-torch.arange(0, 12, 2, dtype=F64) / 12)  # (6,)
    angle = positions[:, None].to(F64) * theta  # (T, 6)
    x1, x2 = x[..., :6], x[..., 6:]
    want = torch.cat([x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()], -1)
    torch.testing.assert_close(halves, want)
    order = torch.arange(12).view(2, 6).T.flatten()  # 0, 6, 1, 7, ...
    torch.testing.assert_close(halves[..., order], apply_rope(x[..., order], positions))
    assert not torch.allclose(halves, apply_rope(x, positions), atol=1e-3)  # not the same layout
    # scores stay relative, and the default is the neighbours layout
    q, k = apply_rope(x, layout="halves"), apply_rope(x.flip(0), layout="halves")
    q2 = apply_rope(x, torch.arange(3, 10), layout="halves")
    k2 = apply_rope(x.flip(0), torch.arange(3, 10), layout="halves")
    torch.testing.assert_close(q @ k.transpose(-1, -2), q2 @ k2.transpose(-1, -2))
    torch.testing.assert_close(apply_rope(x), apply_rope(x, layout="neighbours"))
    with pytest.raises(ValueError, match="layout"):
        apply_rope(x, layout="interleaved")
    with pytest.raises(ValueError, match="even"):
        apply_rope(torch.randn(2, 3, 5), layout="halves")


def test_interpolate_positions_divides_rope_positions():
    from selfattn.positional import interpolate_positions

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 12, 8, generator=g, dtype=torch.float64)
    plain = apply_rope(x)
    with interpolate_positions(4):
        squeezed = apply_rope(x)
        layer = selfattn.MultiHeadAttention(d_model=16, n_heads=2, rope=True)
    # every 4th position now has the angle of position 0, 1, 2: rotate x by p / 4 by hand
    assert torch.allclose(squeezed[:, ::4], apply_rope(x[:, ::4]))
    assert not torch.allclose(squeezed, plain)
    assert torch.equal(apply_rope(x), plain)  # restored after the block
    # MultiHeadAttention's rotation follows the setting too
    h = torch.randn(1, 8, 16, generator=g)
    out, _ = layer(h)
    with interpolate_positions(4):
        inside, _ = layer(h)
    assert not torch.allclose(out, inside)
    with interpolate_positions(1):
        same, _ = layer(h)
    assert torch.equal(out, same)
    with pytest.raises(ValueError, match="positive"):
        with interpolate_positions(0):
            pass


def test_cue_masks_hide_what_they_name():
    from selfattn.book.positional_encoding import cue_masks

    tokens = torch.tensor([[1, 9, 2, 9, 9, 3, 9, 9]])  # cues at 0, 2, 5
    m = cue_masks(tokens, n_cues=4, beyond=5)
    assert set(m) == {"band", "hide far old cues", "hide far fillers"}
    for mask in m.values():
        assert mask.shape == (1, 8, 8) and not mask[0].triu(1).any()  # causal
    # query 7: keys 0..2 are 5 or more back: cue 1 (0), a filler (1), cue 2 (2); latest is 5
    assert m["band"][0, 7].tolist() == [False] * 3 + [True] * 5
    assert m["hide far old cues"][0, 7].tolist() == [False, True, False] + [True] * 5
    assert m["hide far fillers"][0, 7].tolist() == [True, False, True] + [True] * 5
    # query 4: its latest cue (2) is never hidden; key 0 is 4 back, not far
    assert m["hide far old cues"][0, 4, :5].all()
    # query 6, latest cue 5: key 0 (cue 1, 6 back) is hidden, key 1 (filler) is not
    assert m["hide far old cues"][0, 6, :2].tolist() == [False, True]


def test_old_cue_ratio_by_offset():
    from selfattn.book.positional_encoding import old_cue_ratio_by_offset

    tokens = torch.tensor([[1, 9, 2, 9, 9, 3, 9, 9]])  # cues at 0, 2, 5
    w = torch.zeros(1, 2, 8, 8)
    for q in range(8):
        w[0, :, q, : q + 1] = torch.arange(1, q + 2, dtype=torch.float) / 100  # grows to q
    out = old_cue_ratio_by_offset(w, tokens, n_cues=4, bin_width=4, first_query=6)
    # queries 6, 7 (latest cue 5, weight 6/100): old cues 2 and 0 at offsets 4, 6 and 5, 7
    assert out.shape == (2,) and out[0].isnan()  # no old cue fewer than 4 back
    ratios = torch.tensor([3 / 6, 1 / 6, 3 / 6, 1 / 6])
    assert out[1].item() == pytest.approx(ratios.median().item())


def test_order_blind_by_position_averages_to_the_ceiling():
    from selfattn.book import positional_encoding
    from selfattn.book.positional_encoding import order_blind_by_position

    task = positional_encoding.recent_cue_task(50, seq_len=40, seed=0)
    p = order_blind_by_position(task.tokens, task.n_tags - 1)
    assert p.shape == task.tokens.shape
    assert p.mean().item() == pytest.approx(positional_encoding.order_blind_accuracy(task))
    assert torch.equal(order_blind_by_position(torch.tensor([[9, 1, 9, 2, 9]]), 4),
                       torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.5]]))
