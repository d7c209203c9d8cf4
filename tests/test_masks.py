import pytest
import torch

import selfattn


@pytest.mark.parametrize(("L", "S", "offset"), [(4, 4, 0), (3, 5, 0), (5, 3, 0), (2, 6, 4)])
def test_causal_mask_against_a_loop(L, S, offset):
    mask = selfattn.causal_mask(L, S, offset=offset)
    expected = torch.tensor([[j <= i + offset for j in range(S)] for i in range(L)])
    assert torch.equal(mask, expected)


@pytest.mark.parametrize(("L", "S", "offset"), [(6, 6, 0), (3, 8, 5), (1, 7, 6), (9, 9, 0)])
@pytest.mark.parametrize(("window", "n_sink"), [(1, 0), (3, 0), (3, 2), (2, 4), (20, 1)])
def test_window_and_sink_masks_against_a_loop(L, S, offset, window, n_sink):
    mask = selfattn.causal_mask(L, S, offset=offset, window=window, n_sink=n_sink)
    expected = torch.tensor([[j <= i + offset and (j < n_sink or i + offset - j < window)
                              for j in range(S)] for i in range(L)])
    assert torch.equal(mask, expected)
    if window >= L + offset:  # a window wider than every distance is plain causal
        assert torch.equal(mask, selfattn.causal_mask(L, S, offset=offset))


@pytest.mark.parametrize(("kwargs", "exc", "words"), [
    ({"window": 0}, ValueError, "window must be positive, got 0"),
    ({"window": 2.0}, TypeError, "window must be an int"),
    ({"window": 3, "n_sink": -1}, ValueError, "n_sink must be at least 0, got -1"),
    ({"window": 3, "n_sink": True}, TypeError, "n_sink must be an int, got bool"),
    ({"n_sink": 2}, ValueError, "n_sink=2.*give window too"),
])
def test_window_and_sink_arguments_are_checked(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        selfattn.causal_mask(4, **kwargs)


def test_causal_mask_matches_pytorch_is_causal():
    q = torch.randn(3, 5, 4)
    k = v = torch.randn(3, 7, 4)
    a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    b = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=selfattn.causal_mask(5, 7)
    )
    torch.testing.assert_close(a, b)


def test_padding_mask():
    mask = selfattn.padding_mask(torch.tensor([3, 1, 0]), max_len=4)
    assert torch.equal(mask, torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]).bool())
    assert selfattn.padding_mask(torch.tensor([2, 5])).shape == (2, 5)


def test_bool_and_additive_masks_round_trip_and_mean_the_same():
    keep = torch.rand(4, 6) > 0.5
    additive = selfattn.to_additive(keep)
    assert set(additive.unique().tolist()) <= {0.0, float("-inf")}
    assert torch.equal(selfattn.to_bool(additive), keep)
    keep[:, 0] = True
    q, k, v = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6, 3)
    a, _ = selfattn.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    b, _ = selfattn.scaled_dot_product_attention(q, k, v, attn_mask=selfattn.to_additive(keep))
    torch.testing.assert_close(a, b)


def test_to_bool_keeps_finite_biases():
    assert torch.equal(selfattn.to_bool(torch.tensor([0.0, -1e9, float("-inf"), 2.0])),
                       torch.tensor([True, True, False, True]))
