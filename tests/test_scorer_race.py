"""Chapter 3's race (``selfattn.book.single_head``): its arms, its controls and its checks."""

import dataclasses

import pytest
import torch

from selfattn.book import single_head, tagging
from selfattn.book.kit import train
from selfattn.book.kit.measure import count_parameters


def test_every_arm_has_the_same_parameters():
    sizes = {arm: count_parameters(single_head.race_tagger(arm, 12, 4))
             for arm in single_head.RACE_ARMS + single_head.CONTROLS}
    assert len(set(sizes.values())) == 1, sizes


def test_the_key_only_score_ignores_the_query():
    torch.manual_seed(0)
    scorer = single_head.KeyOnlyScorer(8, 8, 8)
    q, k = torch.randn(2, 5, 8), torch.randn(2, 7, 8)
    s = scorer(q, k)  # (2, 5, 7)
    assert s.shape == (2, 5, 7)
    torch.testing.assert_close(s, scorer(torch.randn(2, 5, 8), k))
    torch.testing.assert_close(s[:, 0], s[:, 4])


def test_rescale_scores_swaps_the_start_of_scaled_and_unscaled_heads():
    d = 16
    torch.manual_seed(3)
    gentle = single_head.rescale_scores(tagging.AttentionTagger(12, 4, d=d, scorer="dot"),
                                        d ** -0.25)
    torch.manual_seed(3)
    scaled = tagging.AttentionTagger(12, 4, d=d, scorer="scaled_dot")
    torch.manual_seed(3)
    sharp = single_head.rescale_scores(
        tagging.AttentionTagger(12, 4, d=d, scorer="scaled_dot"), d ** 0.25)
    torch.manual_seed(3)
    dot = tagging.AttentionTagger(12, 4, d=d, scorer="dot")
    tokens = torch.randint(0, 12, (3, 7))
    with torch.no_grad():
        torch.testing.assert_close(gentle(tokens), scaled(tokens))
        torch.testing.assert_close(sharp(tokens), dot(tokens))
    torch.testing.assert_close(gentle.attn.v_proj.weight, dot.attn.v_proj.weight)


def test_the_race_reports_every_seed_and_cue():
    task = tagging.tagging_task(64, seq_len=12, seed=train.data_seed(0))
    test = tagging.tagging_task(32, seq_len=12, seed=train.data_seed(1))
    seeds = train.seed_range()
    race = single_head.scorer_race(task, test, seeds, arms=("scaled_dot", "key_only"),
                                   steps=2, batch_size=8, d=8, n_cues_test=32)
    for arm in race.values():
        assert len(arm.accuracy) == len(arm.learned) == len(arm.attended) == len(seeds)
        assert all(len(w) == test.n_cues for w in arm.cue_weight)
        assert 0 < arm.start_top <= 1 and arm.seconds >= 0


def _arm(learned, attended, start_top=0.1, n_params=10):
    return single_head.RaceArm(taggers=[], accuracy=[float(x) for x in learned],
                               learned=learned, n_params=n_params, seconds=1.0, losses=[],
                               start_top=start_top, attended=attended, cue_weight=[],
                               cue_accuracy=[])


def test_assert_race_fails_where_its_sentences_would():
    good = {
        "dot": _arm([True] * 5 + [False] * 5, [4] * 5 + [2] * 5, start_top=0.5),
        "scaled_dot": _arm([True] * 7 + [False] * 3, [3] * 7 + [1] * 3),
        "additive": _arm([True] * 10, [4] * 10, start_top=0.06),
        "key_only": _arm([True] * 10, [4] * 10),
    }
    single_head.assert_race(good, n_cues=4)
    bad = [
        {"additive": _arm([True] * 7 + [False] * 3, [4] * 7 + [2] * 3, start_top=0.06)},
        {"key_only": _arm([True] * 5 + [False] * 5, [4] * 5 + [2] * 5)},
        {"scaled_dot": _arm([True] * 7 + [False] * 3, [3] * 7 + [3] * 3)},  # missed, 1 ignored
        {"dot": dataclasses.replace(good["dot"], n_params=11)},
    ]
    for change in bad:
        with pytest.raises(AssertionError):
            single_head.assert_race({**good, **change}, n_cues=4)
