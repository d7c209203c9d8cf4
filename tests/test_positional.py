"""Positional encodings: learned, RoPE and ALiBi (sinusoidal is tested in test_tagging.py)."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import selfattn
from selfattn.positional import LearnedPositionalEmbedding, alibi_bias, alibi_slopes, apply_rope

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
