"""Chapters 6 and 7's experiments in ``selfattn.book.multi_head``: what they measure and count."""

import torch

from selfattn.book import multi_head


def _run(errors: dict, leans: dict) -> multi_head.HeadsRun:
    seeds = list(range(len(errors[1])))
    return multi_head.HeadsRun(seeds, None, {}, errors, leans, {}, {})  # type: ignore[arg-type]


def test_the_heads_experiment_trains_every_arm_and_measures_every_seed():
    task = multi_head.neighbour_task(64, seq_len=6, vocab_size=4, seed=0)
    test = multi_head.neighbour_task(16, seq_len=6, vocab_size=4, seed=1)
    run = multi_head.heads_experiment(task, test, [0, 1], steps=3, arms=(1, 2, "4x4"))
    assert set(run.errors) == {1, 2, "4x4"} and all(len(e) == 2 for e in run.errors.values())
    assert all(0 <= e <= 1 for e in run.errors[2])
    left, right = run.leans["4x4"][0]
    assert left.shape == right.shape == (4,)  # one weight per head
    assert run.params[1] == run.params[2] > run.params["4x4"]  # same width; narrower heads
    assert len(multi_head.lean_table(run, arms=(1, 2, "4x4")).splitlines()) == 2 + 2


def test_the_counts_compare_seed_by_seed_with_one_head():
    run = _run({1: [0.1, 0.1, 0.02], 4: [0.004, 0.06, 0.009]}, {})
    assert run.near(4) == [True, False, True]
    assert run.under_half(4) == [True, False, True]  # 0.009 is not under half of 0.02
    assert abs(run.pooled(4) - 0.073 / 0.22) < 1e-12


def test_a_clean_split_needs_two_different_heads_each_leaning_its_way():
    t = torch.tensor
    leans = {
        1: [(t([0.5]), t([0.2])), (t([0.3]), t([0.25]))],
        2: [(t([0.6, 0.1]), t([0.1, 0.5])),  # head 0 left, head 1 right: clean
            (t([0.4, 0.3]), t([0.3, 0.35]))],  # leaning apart, not twice
    }
    run = _run({1: [0.1, 0.1], 2: [0.1, 0.1]}, leans)
    assert run.splits(2) == [True, False]
    assert run.splits(2, by=1.0) == [True, True]
    assert run.unequal(by=1.5) == [True, False]


def test_the_sharing_experiment_starts_its_third_arm_as_mqa_with_mhas_parameters():
    from selfattn.book import tagging

    task = tagging.tagging_task(64, seq_len=8, seed=0)
    test = tagging.tagging_task(16, seq_len=8, seed=1)
    torch.manual_seed(0)
    mqa = multi_head._sharing_tagger(task.vocab_size, task.n_tags, 1, False)
    torch.manual_seed(0)
    start = multi_head._sharing_tagger(task.vocab_size, task.n_tags, 1, True)
    assert start.attn.config.n_kv_heads == 4  # an MHA layer ...
    with torch.no_grad():  # ... that computes what MQA's computes, at step 0
        torch.testing.assert_close(start(test.tokens), mqa(test.tokens))
    run = multi_head.sharing_experiment(task, test, [0, 1], steps=4, every=2)
    assert run.steps == [0, 2, 4] and all(len(c) == 3 for c in run.curves["MQA"])
    assert run.params["MHA"] == run.params["MHA from MQA"] > run.params["MQA"]
    assert run.final["MQA"] == [c[-1] for c in run.curves["MQA"]]
    assert len(run.lower("MQA", than="MHA")) == 2
