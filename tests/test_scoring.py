"""Scorers: dot, scaled dot and additive, and attention built on any of them."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import selfattn
from selfattn import scoring

F64 = torch.float64


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True},
                                    {"attn_mask": torch.tensor([[True, False, True, True]] * 3)}])
def test_scaled_dot_through_the_scorer_equals_sdpa(kwargs):
    q = torch.randn(2, 3, 8, dtype=F64)
    k, v = torch.randn(2, 4, 8, dtype=F64), torch.randn(2, 4, 5, dtype=F64)
    out, w = scoring.attention(q, k, v, scorer=scoring.scaled_dot_scores, **kwargs)
    ref_out, ref_w = selfattn.scaled_dot_product_attention(q, k, v, **kwargs)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)


def test_dot_is_scaled_dot_with_scale_one():
    q, k = torch.randn(3, 6, dtype=F64), torch.randn(5, 6, dtype=F64)
    torch.testing.assert_close(scoring.dot_scores(q, k), scoring.scaled_dot_scores(q, k, scale=1.0))
    torch.testing.assert_close(scoring.scaled_dot_scores(q, k), q @ k.T / math.sqrt(6))


def test_additive_scores_match_a_double_loop():
    scorer = scoring.AdditiveScorer(query_dim=6, key_dim=3, hidden=5).double()
    q, k = torch.randn(2, 4, 6, dtype=F64), torch.randn(2, 7, 3, dtype=F64)
    got = scorer(q, k)
    assert got.shape == (2, 4, 7)
    for b in range(2):
        for i in range(4):
            for j in range(7):
                want = scorer.w.weight[0] @ torch.tanh(
                    scorer.w_q.weight @ q[b, i] + scorer.w_k.weight @ k[b, j] + scorer.w_k.bias)
                torch.testing.assert_close(got[b, i, j], want)


def test_additive_attention_takes_queries_and_keys_of_different_sizes_dot_does_not():
    q, k, v = torch.randn(4, 10), torch.randn(6, 3), torch.randn(6, 2)
    out, w = scoring.attention(q, k, v, scorer=scoring.AdditiveScorer(10, 3, 8))
    assert out.shape == (4, 2) and torch.allclose(w.sum(-1), torch.ones(4))
    with pytest.raises(ValueError, match=r"same width.*\(4, 10\).*\(6, 3\)"):
        scoring.attention(q, k, v, scorer=scoring.dot_scores)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masks_behave_as_everywhere_else(dtype):
    scorer = scoring.AdditiveScorer(8, 8, 4).to(dtype)
    q = k = v = torch.randn(1, 3, 8, dtype=dtype)
    keep = torch.tensor([[True, True, False], [False, False, False], [True, False, False]])
    out, w = scoring.attention(q, k, v, scorer=scorer, attn_mask=keep)
    assert (w[0, 1] == 0).all() and (out[0, 1] == 0).all() and not out.isnan().any()
    assert (w[0][~keep] == 0).all()
    _, wc = scoring.attention(q, k, v, scorer=scorer, is_causal=True)
    assert (wc[0].triu(1) == 0).all()


def test_bad_input():
    scorer = scoring.AdditiveScorer(4, 4, 2)
    q = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"key must have 4 features, got shape \(3, 5\)"):
        scorer(q, torch.randn(3, 5))
    with pytest.raises(ValueError, match="attn_mask"):
        scoring.attention(q, q, q, scorer=scorer, attn_mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="same length S"):
        scoring.attention(q, q, torch.randn(2, 4), scorer=scorer)
    with pytest.raises(TypeError, match="0 and 1"):
        scoring.attention(q, q, q, attn_mask=torch.ones(3, 3).tril())
    with pytest.raises(ValueError, match="scorer must be one of"):
        scoring.ScoredSelfAttention(8, "cosine")


@pytest.mark.parametrize("name", scoring.ScoredSelfAttention.SCORERS)
def test_scored_self_attention_module(name):
    m = scoring.ScoredSelfAttention(8, name)
    out, w = m(torch.randn(2, 5, 8), need_weights=True)
    assert out.shape == (2, 5, 8) and w.shape == (2, 1, 5, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 1, 5))
    assert m(torch.randn(2, 5, 8))[1] is None


@pytest.mark.parametrize("name", scoring.ScoredSelfAttention.SCORERS)
@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, "padding"])
def test_scored_self_attention_is_attention_with_its_scorer(name, kwargs):
    m = scoring.ScoredSelfAttention(8, name).double()
    x = torch.randn(2, 5, 8, dtype=F64)
    if kwargs == "padding":
        kwargs = {"attn_mask": selfattn.padding_mask(torch.tensor([5, 3]), 5)[:, None, :]}
    if name == "additive":
        scorer = m.additive
    else:
        scores = scoring.dot_scores if name == "dot" else scoring.scaled_dot_scores
        scorer = lambda q, k: scores(m.q_proj(q), m.k_proj(k))  # noqa: E731
    out, w = m(x, need_weights=True, **kwargs)
    expected, expected_w = scoring.attention(x, x, m.v_proj(x), scorer=scorer, **kwargs)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(w, expected_w[:, None])
    with pytest.raises(ValueError, match=r"attn_mask of shape \(3, 3\)"):
        m(x, attn_mask=torch.ones(3, 3, dtype=torch.bool))


@settings(max_examples=60)
@given(magnitude=st.sampled_from([1.0, 10.0, 100.0, 300.0]),
       dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
       scorer=st.sampled_from(["dot", "scaled_dot"]),
       seed=st.integers(0, 10_000))
def test_no_overflow_where_pytorchs_fused_kernel_stays_finite(magnitude, dtype, scorer, seed):
    # the dot-product scorers multiply half-precision inputs in float32, as the fused kernel does
    q = (magnitude * torch.randn(1, 1, 3, 4, generator=torch.Generator().manual_seed(seed))).to(dtype)
    scale = 1.0 if scorer == "dot" else None
    expected = F.scaled_dot_product_attention(q, q, q, scale=scale)
    out, weights = scoring.attention(q, q, q, scorer=getattr(scoring, f"{scorer}_scores"))
    assert out.dtype == weights.dtype == dtype
    if expected.isfinite().all():
        assert out.isfinite().all() and weights.isfinite().all()
        torch.testing.assert_close(out, expected, atol=0.05 * magnitude, rtol=0.05)


def test_general_score_is_q_w_k_for_every_pair_and_bridges_two_widths():
    scorer = scoring.GeneralScorer(query_dim=6, key_dim=3).double()
    assert scorer.weight.shape == (6, 3)
    q, k = torch.randn(2, 4, 6, dtype=F64), torch.randn(2, 7, 3, dtype=F64)
    v = torch.randn(2, 7, 5, dtype=F64)
    got = scorer(q, k)
    assert got.shape == (2, 4, 7)
    for b in range(2):
        for i in range(4):
            for j in range(7):
                torch.testing.assert_close(got[b, i, j], q[b, i] @ scorer.weight @ k[b, j])
    out, w = scoring.attention(q, k, v, scorer=scorer, is_causal=True)
    assert out.shape == (2, 4, 5) and (w.triu(1) == 0).all()
    with pytest.raises(ValueError, match=r"key must have 3 features, got shape \(2, 7, 4\)"):
        scorer(q, torch.randn(2, 7, 4, dtype=F64))


def test_general_score_with_the_identity_is_the_dot_product():
    scorer = scoring.GeneralScorer(5, 5).double()
    with torch.no_grad():
        scorer.weight.copy_(torch.eye(5))
    q, k = torch.randn(3, 5, dtype=F64), torch.randn(4, 5, dtype=F64)
    torch.testing.assert_close(scorer(q, k), scoring.dot_scores(q, k))


def test_general_score_multiplies_half_precision_in_float32():
    scorer = scoring.GeneralScorer(4, 3)  # float32 weight
    q = torch.randn(2, 4).half()
    k = torch.randn(5, 3).half()
    got = scorer(q, k)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, q.float() @ scorer.weight @ k.float().T)


def test_additive_scorer_names_a_dtype_mismatch():
    scorer = scoring.AdditiveScorer(4, 4, hidden=3)  # float32 parameters
    x = torch.randn(5, 4, dtype=F64)
    with pytest.raises(TypeError, match=r"query and key have dtype torch.float64"):
        scorer(x, x)
