"""Chapter 4's statistics in `selfattn.book.single_head`: the paired sign test."""

import math

import pytest

from selfattn.book import single_head


def test_sign_test_matches_the_binomial_tail():
    # 9 against 1: 2 * (C(10,0) + C(10,1)) / 2**10
    assert single_head.sign_test(9, 1) == pytest.approx(2 * 11 / 1024)
    assert single_head.sign_test(1, 9) == single_head.sign_test(9, 1)
    assert single_head.sign_test(2, 0) == pytest.approx(0.5)


def test_sign_test_without_discordant_pairs_or_balanced_is_one():
    assert single_head.sign_test(0, 0) == 1.0
    assert single_head.sign_test(3, 3) == 1.0


def test_sign_test_small_when_one_side_wins_every_pair():
    assert single_head.sign_test(10, 0) == pytest.approx(2 / 2**10)
    assert single_head.sign_test(10, 0) < 0.01 < single_head.sign_test(5, 1)
    assert math.isclose(single_head.sign_test(5, 1), 2 * 7 / 64)
