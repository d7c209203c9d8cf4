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


def test_the_stored_start_matched_arms_are_chapter_4s_seeds_only(monkeypatch):
    from selfattn.book.kit import train

    monkeypatch.delenv("SELFATTN_SEEDS_FROM", raising=False)
    stored = single_head.stored_start_matched(train.seed_range(30))
    assert stored is not None and set(stored) == set(single_head.START_MATCHED)
    assert all(len(acc) == 30 for acc in stored.values())
    assert single_head.stored_start_matched(train.seed_range(10)) is None
    monkeypatch.setenv("SELFATTN_SEEDS_FROM", "100")
    assert single_head.stored_start_matched(train.seed_range(30)) is None


def test_start_matched_trains_each_arm_from_every_seed():
    from selfattn.book import tagging
    from selfattn.book.kit import train

    task = tagging.tagging_task(64, seq_len=12, seed=train.data_seed(0))
    test = tagging.tagging_task(32, seq_len=12, seed=train.data_seed(1))
    out = single_head.start_matched(task, test, train.seed_range(), d=8, steps=2,
                                    batch_size=8)
    assert set(out) == set(single_head.START_MATCHED)
    assert all(len(acc) == 10 and all(0 <= a <= 1 for a in acc) for acc in out.values())
