"""Guards against the pitfalls of chapter 8 that no other test file covers.

Covered elsewhere: float 0/1 masks refused and the missing batch axis (test_bad_input.py);
fully masked rows give zeros in fp32/fp16/bf16 (test_attention.py); rows of weights sum to 1 and
causal attention never looks ahead (test_properties.py); dropout only in training
(test_multihead.py); the scale and head layout match PyTorch (parity tests).
"""

import pytest
import torch

import selfattn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_finfo_min_mask_plus_the_causal_mask_does_not_overflow_to_nan(dtype):
    # pitfall 6: adding a causal mask to a finfo.min bias would give finfo.min + finfo.min =
    # -inf and NaN rows; the library combines them with masked_fill instead, as PyTorch does
    torch.manual_seed(0)
    m = selfattn.MultiHeadAttention(16, 2).to(dtype)
    x = torch.randn(1, 4, 16, dtype=dtype)
    bias = torch.zeros(4, 4, dtype=dtype)
    bias[:, 0] = torch.finfo(dtype).min  # a huge but finite penalty on key 0
    out, w = m(x, attn_mask=bias, is_causal=True, need_weights=True)
    fast, _ = m(x, attn_mask=bias, is_causal=True)
    assert not out.isnan().any() and not w.isnan().any() and not fast.isnan().any()
    # query 0 has only key 0 left: a finite bias is still a bias, so it takes all the weight
    assert (w[0, :, 0, 0] == 1).all() and (w[0, :, 1:, 0] == 0).all()
    torch.testing.assert_close(fast, out, atol=2e-2 if dtype == torch.bfloat16 else 1e-5,
                               rtol=2e-2 if dtype == torch.bfloat16 else 1e-5)


def test_heads_are_merged_next_to_their_own_token():
    # pitfall 8: with identity projections and a causal mask, head h of token t must hold the
    # mean of the values' slice h over tokens 0..t, at features [h*hd, (h+1)*hd)
    d, H, T = 8, 2, 5
    m = selfattn.MultiHeadAttention(d, H, bias=False)
    with torch.no_grad():
        m.q_proj.weight.zero_()  # equal scores: uniform weights over the visible keys
        m.k_proj.weight.zero_()
        m.v_proj.weight.copy_(torch.eye(d))
        m.out_proj.weight.copy_(torch.eye(d))
    x = torch.randn(1, T, d)
    for need_weights in (True, False):
        out, _ = m(x, is_causal=True, need_weights=need_weights)
        expected = x.cumsum(1) / torch.arange(1, T + 1)[None, :, None]  # running mean
        torch.testing.assert_close(out, expected)
