"""Chapter 5's helpers in `selfattn.book.positional_encoding`: ALiBi's own prior and the share
of weight a head puts far back."""

import torch

from selfattn.book import positional_encoding
from selfattn.positional import alibi_slopes


def test_alibi_prior_is_causal_normalised_and_a_straight_line_in_log():
    w = positional_encoding.alibi_prior(4, 20)  # (H, L, L)
    assert w.shape == (4, 20, 20)
    torch.testing.assert_close(w.sum(-1), torch.ones(4, 20))
    assert (w.triu(1) == 0).all()  # no weight on the future
    last = w[:, -1].flip(-1).double()  # (H, L): by offset
    steps = last.log().diff(dim=-1)
    expected = -alibi_slopes(4)[:, None].double().expand_as(steps)
    torch.testing.assert_close(steps, expected, atol=1e-4, rtol=0)


def test_beyond_share_counts_the_keys_far_enough_back():
    L = 8
    uniform = torch.tril(torch.ones(L, L))
    uniform = (uniform / uniform.sum(-1, keepdim=True))[None]  # (1, L, L): one head
    # query i sees i + 1 keys; those at least 3 back are max(0, i - 2) of them
    expected = torch.tensor([max(0, i - 2) / (i + 1) for i in range(L)])
    share = positional_encoding.beyond_share(uniform, beyond=3)
    torch.testing.assert_close(share, expected.mean()[None].float())
    late = positional_encoding.beyond_share(uniform, beyond=3, first_query=4)
    torch.testing.assert_close(late, expected[4:].mean()[None].float())
    batched = uniform[None].expand(2, 1, L, L)  # (B, H, L, L)
    torch.testing.assert_close(positional_encoding.beyond_share(batched, 3), share)


def test_the_steepest_alibi_head_keeps_to_recent_keys():
    share = positional_encoding.beyond_share(
        positional_encoding.alibi_prior(4, 128), beyond=32, first_query=64)
    assert share[0] < 1e-3 < share[-1] and (share.diff() > 0).all()
