"""scaled_dot_product_attention against PyTorch's, and its behaviour at the edges."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import pytorch_reference

import selfattn
from selfattn import attention

F64 = torch.float64


def random_case(seed: int, device: str = "cpu"):
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
    if "attn_mask" in kwargs:
        kwargs["attn_mask"] = kwargs["attn_mask"].to(device)
    return q.to(device), k.to(device), v.to(device), kwargs


@pytest.mark.parametrize("seed", range(60))
def test_matches_pytorch_sdpa(seed, device):
    q, k, v, kwargs = random_case(seed, device)
    out, weights = selfattn.scaled_dot_product_attention(q, k, v, **kwargs)
    expected = pytorch_reference(q, k, v, **kwargs)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    assert weights.shape == (*q.shape[:-1], k.shape[-2])
    # the weights really are the ones that produced the output
    torch.testing.assert_close(weights @ v, out, rtol=1e-12, atol=1e-12)


def test_weights_are_the_textbook_formula(device):
    q, k, v = (torch.randn(2, 4, 8, dtype=F64, device=device) for _ in range(3))
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
def test_fully_masked_rows_give_zeros_not_nan(dtype, kind, device):
    q = torch.randn(2, 3, 4, 8, dtype=dtype, device=device)
    k = v = torch.randn(2, 3, 6, 8, dtype=dtype, device=device)
    keep = torch.ones(4, 6, dtype=torch.bool, device=device)
    keep[2] = False  # query 2 may attend to nothing
    mask = keep if kind == "bool" else selfattn.to_additive(keep, dtype)
    out, weights = selfattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert not out.isnan().any() and not weights.isnan().any()
    assert (weights[..., 2, :] == 0).all() and (out[..., 2, :] == 0).all()
    sums = weights.float().sum(-1)
    torch.testing.assert_close(sums[..., [0, 1, 3]], torch.ones_like(sums[..., [0, 1, 3]]),
                               atol=1e-2, rtol=0)


def test_fully_masked_rows_from_causal_and_padding_together(device):
    q = k = v = torch.randn(1, 4, 8, device=device)
    pad = torch.tensor([False, True, True, True], device=device)  # the first key is padding
    out, weights = selfattn.scaled_dot_product_attention(q, k, v, attn_mask=pad, is_causal=True)
    assert (weights[0, 0] == 0).all() and (out[0, 0] == 0).all()  # query 0 saw only key 0
    assert not out.isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_huge_logits_stay_finite(dtype, device):
    # scores of magnitude 1e4: exp(1e4) overflows every float type unless the max is subtracted
    q = torch.full((1, 3, 4), 50.0, dtype=dtype, device=device)
    k = torch.tensor([[[50.0] * 4, [-50.0] * 4, [49.0] * 4]], dtype=dtype, device=device)
    v = torch.randn(1, 3, 2, dtype=dtype, device=device)
    out, weights = selfattn.scaled_dot_product_attention(q, k, v, scale=1.0)
    assert weights.isfinite().all() and out.isfinite().all()
    assert torch.equal(weights[0, :, 0], torch.ones(3, dtype=dtype, device=device))  # 1e4 wins


def test_dropout_zeroes_and_rescales_weights():
    q, k, v = (torch.randn(4, 16, 8) for _ in range(3))
    _, clean = selfattn.scaled_dot_product_attention(q, k, v)
    torch.manual_seed(1)
    _, dropped = selfattn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    kept = dropped != 0
    assert 0.3 < kept.float().mean() < 0.7
    torch.testing.assert_close(dropped[kept], 2 * clean[kept])


def test_gradients_match_finite_differences(device):
    q, k, v = (torch.randn(2, 3, 4, dtype=F64, device=device, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[True, True, False]] * 3, device=device)
    assert torch.autograd.gradcheck(
        lambda q, k, v: selfattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)[0],
        (q, k, v),
    )


def test_takes_pytorchs_arguments_in_pytorchs_order(device):
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 5, 8, generator=g, dtype=F64).to(device) for _ in range(3))
    mask = torch.rand(5, 5, generator=g).to(device) > 0.3
    mask[:, 0] = True
    for args in [(mask,), (None, 0.0, True), (mask, 0.0, False)]:  # attn_mask, dropout_p, is_causal
        ours, _ = selfattn.scaled_dot_product_attention(q, k, v, *args)
        torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, *args))
    torch.manual_seed(3)
    _, dropped = selfattn.scaled_dot_product_attention(q, k, v, None, 0.5)  # dropout, not causal
    assert (dropped == 0).any() and (dropped.triu(1) != 0).any()
    with pytest.raises(TypeError):  # scale and enable_gqa are keyword-only, as in PyTorch
        selfattn.scaled_dot_product_attention(q, k, v, None, 0.0, False, 0.5)
    with pytest.raises(TypeError):
        selfattn.scaled_dot_product_attention(q, k, v, None, 0.0, False, None, True)


def test_the_unchecked_core_takes_its_options_by_keyword():
    # R1: attention.attend(q, k, v, attn_mask, dropout_p, is_causal) and the dispatcher's
    # (q, k, v, attn_mask, is_causal, dropout_p) were both called positionally
    q = k = v = torch.randn(2, 5, 8)
    with pytest.raises(TypeError):
        attention.attend(q, k, v, None, 0.0, True)
    out, weights = attention.attend(q, k, v, is_causal=True)
    assert (weights.triu(1) == 0).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize(("H", "H_k", "H_v"), [(6, 3, 3), (6, 1, 1), (4, 4, 4), (6, 3, 2)])
@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, "bool", "float"])
def test_enable_gqa_matches_pytorchs(H, H_k, H_v, kwargs, device):
    # each key/value head serves its group of query heads, as in PyTorch >= 2.5
    g = torch.Generator().manual_seed(H * 100 + H_k * 10 + H_v)
    q = torch.randn(2, H, 4, 8, generator=g, dtype=F64).to(device)
    k = torch.randn(2, H_k, 5, 8, generator=g, dtype=F64).to(device)
    v = torch.randn(2, H_v, 5, 3, generator=g, dtype=F64).to(device)
    if kwargs == "bool":
        kwargs = {"attn_mask": (torch.rand(2, 1, 4, 5, generator=g) > 0.3).to(device)}
    elif kwargs == "float":
        kwargs = {"attn_mask": torch.randn(1, H, 4, 5, generator=g, dtype=F64).to(device)}
    out, weights = selfattn.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    assert weights.shape == (2, H, 4, 5)
    repeated = [selfattn.repeat_kv(t, H // t.shape[1]) for t in (k, v)]
    torch.testing.assert_close(out, selfattn.scaled_dot_product_attention(q, *repeated, **kwargs)[0])


def test_enable_gqa_checks_the_heads():
    q, k = torch.randn(2, 6, 4, 8), torch.randn(2, 4, 5, 8)
    with pytest.raises(ValueError, match=r"multiple of those of key.*\(2, 6, 4, 8\).*\(2, 4, 5, 8\)"):
        selfattn.scaled_dot_product_attention(q, k, k, enable_gqa=True)
    with pytest.raises(ValueError, match=r"multiple of those of value"):
        selfattn.scaled_dot_product_attention(q, k[:, :3], k[:, :4], enable_gqa=True)
    with pytest.raises(ValueError, match=r"key needs at least one head"):
        selfattn.scaled_dot_product_attention(q, k[:, :0], k[:, :0], enable_gqa=True)
    with pytest.raises(ValueError, match="query must have at least 3 dimensions"):
        selfattn.scaled_dot_product_attention(q[0, 0], k[0, 0], k[0, 0], enable_gqa=True)
    with pytest.raises(TypeError, match=r"key must be a torch\.Tensor"):
        selfattn.scaled_dot_product_attention(q, [1.0], k, enable_gqa=True)
    with pytest.raises(ValueError, match="batch"):  # without enable_gqa, 6 and 3 heads clash
        selfattn.scaled_dot_product_attention(q, k[:, :3], k[:, :3])


def test_follows_input_dtype(device):
    q = k = v = torch.randn(2, 5, 8, dtype=torch.bfloat16, device=device)
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
