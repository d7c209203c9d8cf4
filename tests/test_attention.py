"""scaled_dot_product_attention against PyTorch's, and its behaviour at the edges."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import selfattn

F64 = torch.float64


def random_case(seed: int):
    """Random shapes (batch dims, L != S, E != Ev) and one of several mask kinds."""
    g = torch.Generator().manual_seed(seed)

    def rint(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    batch = tuple(rint(1, 3) for _ in range(rint(0, 2)))
    L, S, E, Ev = rint(1, 9), rint(1, 9), rint(1, 16), rint(1, 16)
    q = torch.randn(*batch, L, E, generator=g, dtype=F64)
    k = torch.randn(*batch, S, E, generator=g, dtype=F64)
    v = torch.randn(*batch, S, Ev, generator=g, dtype=F64)
    kind = seed % 6
    kwargs = {}
    if kind == 1:
        kwargs["is_causal"] = True
    elif kind == 2:  # bool mask, broadcast over the batch, at least one key per row
        m = torch.rand(L, S, generator=g) > 0.4
        m[:, 0] = True
        kwargs["attn_mask"] = m
    elif kind == 3:  # float mask of full shape: a bias plus some -inf
        m = torch.randn(*batch, L, S, generator=g, dtype=F64)
        m[..., 1:][torch.rand(*batch, L, S - 1, generator=g) > 0.7] = float("-inf")
        kwargs["attn_mask"] = m
    elif kind == 4:
        kwargs["scale"] = float(torch.rand(1, generator=g)) * 2
    elif kind == 5:  # bool mask together with is_causal: we AND the two (see below)
        m = torch.rand(L, S, generator=g) > 0.3
        m[:, 0] = True
        kwargs.update(attn_mask=m, is_causal=True)
    return q, k, v, kwargs


def pytorch_reference(q, k, v, attn_mask=None, is_causal=False, **kwargs):
    # PyTorch's math backend refuses attn_mask together with is_causal (its fused CPU kernel
    # ANDs them); ours always ANDs them, which is this call.
    if attn_mask is not None and is_causal:
        attn_mask, is_causal = attn_mask & selfattn.causal_mask(*attn_mask.shape[-2:]), False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                          **kwargs)


@pytest.mark.parametrize("seed", range(60))
def test_matches_pytorch_sdpa(seed):
    q, k, v, kwargs = random_case(seed)
    out, weights = selfattn.scaled_dot_product_attention(q, k, v, **kwargs)
    expected = pytorch_reference(q, k, v, **kwargs)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    assert weights.shape == (*q.shape[:-1], k.shape[-2])
    # the weights really are the ones that produced the output
    torch.testing.assert_close(weights @ v, out, rtol=1e-12, atol=1e-12)


def test_weights_are_the_textbook_formula():
    q, k, v = (torch.randn(2, 4, 8, dtype=F64) for _ in range(3))
    _, weights = selfattn.scaled_dot_product_attention(q, k, v)
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
    torch.testing.assert_close(weights, expected)


def test_is_causal_is_top_left_aligned_when_L_differs_from_S():
    q = torch.randn(3, 4, dtype=F64)
    k = v = torch.randn(5, 4, dtype=F64)
    _, weights = selfattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(weights > 0, torch.ones(3, 5, dtype=torch.bool).tril())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_rows_give_zeros_not_nan(dtype, kind):
    q = torch.randn(2, 3, 4, 8, dtype=dtype)
    k = v = torch.randn(2, 3, 6, 8, dtype=dtype)
    keep = torch.ones(4, 6, dtype=torch.bool)
    keep[2] = False  # query 2 may attend to nothing
    mask = keep if kind == "bool" else selfattn.to_additive(keep, dtype)
    out, weights = selfattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert not out.isnan().any() and not weights.isnan().any()
    assert (weights[..., 2, :] == 0).all() and (out[..., 2, :] == 0).all()
    sums = weights.float().sum(-1)
    torch.testing.assert_close(sums[..., [0, 1, 3]], torch.ones_like(sums[..., [0, 1, 3]]),
                               atol=1e-2, rtol=0)


def test_fully_masked_rows_from_causal_and_padding_together():
    q = k = v = torch.randn(1, 4, 8)
    pad = torch.tensor([False, True, True, True])  # the first key is padding
    out, weights = selfattn.scaled_dot_product_attention(q, k, v, attn_mask=pad, is_causal=True)
    assert (weights[0, 0] == 0).all() and (out[0, 0] == 0).all()  # query 0 saw only key 0
    assert not out.isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_huge_logits_stay_finite(dtype):
    # scores of magnitude 1e4: exp(1e4) overflows every float type unless the max is subtracted
    q = torch.full((1, 3, 4), 50.0, dtype=dtype)
    k = torch.tensor([[[50.0] * 4, [-50.0] * 4, [49.0] * 4]], dtype=dtype)
    v = torch.randn(1, 3, 2, dtype=dtype)
    out, weights = selfattn.scaled_dot_product_attention(q, k, v, scale=1.0)
    assert weights.isfinite().all() and out.isfinite().all()
    assert torch.equal(weights[0, :, 0], torch.ones(3, dtype=dtype))  # the 1e4 score wins


def test_dropout_zeroes_and_rescales_weights():
    q, k, v = (torch.randn(4, 16, 8) for _ in range(3))
    _, clean = selfattn.scaled_dot_product_attention(q, k, v)
    torch.manual_seed(1)
    _, dropped = selfattn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    kept = dropped != 0
    assert 0.3 < kept.float().mean() < 0.7
    torch.testing.assert_close(dropped[kept], 2 * clean[kept])


def test_gradients_match_finite_differences():
    q, k, v = (torch.randn(2, 3, 4, dtype=F64, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[True, True, False]] * 3)
    assert torch.autograd.gradcheck(
        lambda q, k, v: selfattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)[0],
        (q, k, v),
    )


def test_takes_pytorchs_arguments_in_pytorchs_order():
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 5, 8, generator=g, dtype=F64) for _ in range(3))
    mask = torch.rand(5, 5, generator=g) > 0.3
    mask[:, 0] = True
    for args in [(mask,), (None, 0.0, True), (mask, 0.0, False)]:  # attn_mask, dropout_p, is_causal
        ours, _ = selfattn.scaled_dot_product_attention(q, k, v, *args)
        torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, *args))
    torch.manual_seed(3)
    _, dropped = selfattn.scaled_dot_product_attention(q, k, v, None, 0.5)  # dropout, not causal
    assert (dropped == 0).any() and (dropped.triu(1) != 0).any()
    with pytest.raises(TypeError):  # scale is keyword-only, as in PyTorch
        selfattn.scaled_dot_product_attention(q, k, v, None, 0.0, False, 0.5)


def test_follows_input_dtype():
    q = k = v = torch.randn(2, 5, 8, dtype=torch.bfloat16)
    out, weights = selfattn.scaled_dot_product_attention(q, k, v)
    assert out.dtype == weights.dtype == torch.bfloat16


def fused_is_finite_while_ours_overflows(q):
    expected = F.scaled_dot_product_attention(q, q, q)
    out, weights = selfattn.scaled_dot_product_attention(q, q, q)
    return expected.isfinite().all() and not (out.isfinite().all() and weights.isfinite().all())


@settings(max_examples=60)
@given(magnitude=st.sampled_from([1.0, 10.0, 100.0, 300.0]),
       dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
       seed=st.integers(0, 10_000))
def test_no_overflow_where_pytorchs_fused_kernel_stays_finite(magnitude, dtype, seed):
    # scores of half-precision inputs are accumulated in float32, as the fused kernel does
    q = (magnitude * torch.randn(1, 1, 3, 4, generator=torch.Generator().manual_seed(seed))).to(dtype)
    assert not fused_is_finite_while_ours_overflows(q)
