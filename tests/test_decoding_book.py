"""The attention-sink experiment of the chapter "Decoding in practice": the sink task
(``selfattn.book.decoding.sink_task``) and its measures in ``selfattn.book.decoding`` (accuracy under
a cache that keeps only some keys, each head's share on position 0, the experiment itself on a
configuration small enough to train in a second)."""

import math

import pytest
import torch

import selfattn
from selfattn.book import decoding
from selfattn.book.kit import train
from selfattn.book.tagging import AttentionTagger

# --- the sink task ----------------------------------------------------------------------------


def test_sink_task_shapes_and_tags():
    task = decoding.sink_task(200, seq_len=20, vocab_size=12, n_triggers=4, lag=3, n_filler_tags=5,
                          seed=7)
    assert task.tokens.shape == task.tags.shape == task.trigger.shape == (200, 20)
    assert task.trigger.dtype == torch.bool
    assert (task.vocab_size, task.n_tags, task.lag, task.n_triggers, task.bos) == \
        (12, 17, 3, 4, True)
    assert (task.tokens[:, 0] == decoding.BOS).all()
    assert ((task.tokens[:, 1:] >= 1) & (task.tokens[:, 1:] < 12)).all()
    assert int(task.tags.max()) < task.n_tags and int(task.tags.min()) >= 0
    for n in range(200):  # every tag, by the rule the docstring states
        for t in range(20):
            token = int(task.tokens[n, t])
            is_trigger = 1 <= token <= 4 and t >= 3
            assert bool(task.trigger[n, t]) == is_trigger
            expected = int(task.tokens[n, t - 3]) if is_trigger else 12 + token % 5
            assert int(task.tags[n, t]) == expected
    assert task.trigger.any(), "no trigger drawn: the task would teach nothing to copy"
    assert (task.tags[task.trigger] == 0).any(), "a trigger lag after BOS copies BOS"


def test_sink_task_is_deterministic():
    a, b = decoding.sink_task(50, seed=3), decoding.sink_task(50, seed=3)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.tags, b.tags)
    assert torch.equal(a.trigger, b.trigger)
    assert not torch.equal(a.tokens, decoding.sink_task(50, seed=4).tokens)


def test_the_control_changes_position_0_only():
    with_bos = decoding.sink_task(300, seq_len=16, lag=2, seed=11)
    control = decoding.sink_task(300, seq_len=16, lag=2, bos=False, seed=11)
    assert not control.bos
    assert (control.tokens[:, 0] != decoding.BOS).all()  # an ordinary token there
    assert len(control.tokens[:, 0].unique()) > 5
    assert torch.equal(control.tokens[:, 1:], with_bos.tokens[:, 1:])
    assert torch.equal(control.trigger, with_bos.trigger)  # never a trigger before lag
    # the tags differ only at position 0 (its own tag) and at position lag, when a trigger there
    # copies position 0
    differ = (control.tags != with_bos.tags).any(0)  # (T,)
    assert differ.nonzero().flatten().tolist() == [0, 2]
    copies_0 = with_bos.trigger[:, 2]
    assert torch.equal(control.tags[copies_0, 2], control.tokens[copies_0, 0])


# --- accuracy under a cache -------------------------------------------------------------------


def _tiny_model(task, seed=0):
    """An untrained tagger with its weights scaled up, so that its answers depend on which keys
    it sees (at the default scale they hardly depend on anything but each token's bias)."""
    torch.manual_seed(seed)
    model = AttentionTagger(task.vocab_size, task.n_tags, d=16, n_heads=2, causal=True,
                            positions="rope").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4)
    return model


def _with_tags(task, tags):
    return decoding.SinkData(task.tokens, tags, task.vocab_size, task.n_tags, task.trigger, task.lag,
                         task.n_triggers, task.bos)


def _count(pred, task, first):
    """Accuracy over the queries first.. by counting, one query at a time."""
    right = {"all": [0, 0], "trigger": [0, 0], "other": [0, 0]}
    for n in range(task.tokens.shape[0]):
        for t in range(first, task.tokens.shape[1]):
            ok = int(pred[n, t] == task.tags[n, t])
            group = "trigger" if task.trigger[n, t] else "other"
            for key in ("all", group):
                right[key][0] += ok
                right[key][1] += 1
    return {k: (r / n if n else math.nan) for k, (r, n) in right.items()}


def _some_wrong(pred, n_tags):
    """``pred`` with every third answer changed: tags that a model gets partly right."""
    tags = pred.clone()
    flip = torch.arange(tags.numel()).reshape(tags.shape) % 3 == 0  # (B, T)
    tags[flip] = (tags[flip] + 1) % n_tags
    return tags


def test_cache_accuracy_with_the_full_cache_counts_the_plain_models_answers():
    task = decoding.sink_task(12, seq_len=10, seed=1)
    model = _tiny_model(task)
    with torch.no_grad():
        pred = model(task.tokens).argmax(-1)  # (B, T): the plain causal run, no mask passed
    task = _with_tags(task, _some_wrong(pred, task.n_tags))
    got = decoding.cache_accuracy(model, task, selfattn.causal_mask(10), first_query=3)
    assert got == pytest.approx(_count(pred, task, 3))
    assert got["all"] == pytest.approx(2 / 3, abs=0.05)
    assert got["trigger"] != got["other"]


def test_window_only_is_running_each_window_on_its_own():
    """Evicting every key older than the window gives the answers of a model that only ever saw
    the window's tokens: RoPE scores depend on distances, which eviction keeps."""
    T, window = 12, 4
    task = decoding.sink_task(16, seq_len=T, seed=2)
    model = _tiny_model(task, seed=1)
    pred = torch.empty_like(task.tokens)
    with torch.no_grad():
        for t in range(T):
            alone = task.tokens[:, max(0, t - window + 1): t + 1]  # (B, <= window)
            pred[:, t] = model(alone)[:, -1].argmax(-1)
    task = _with_tags(task, pred)  # the answers of the windows run alone
    got = decoding.cache_accuracy(model, task, selfattn.causal_mask(T, window=window), 4)
    assert got == {"all": 1.0, "trigger": 1.0, "other": 1.0}
    full = decoding.cache_accuracy(model, task, selfattn.causal_mask(T), 4)
    assert full["all"] < 0.95, "the full cache gives other answers: the test sees the window"
    sink = decoding.cache_accuracy(model, task, selfattn.causal_mask(T, window=window, n_sink=1), 4)
    assert sink["all"] < 0.95, "keeping position 0 changes answers too"


def test_cache_accuracy_gives_nan_for_a_group_with_no_query():
    task = decoding.sink_task(3, seq_len=6, n_triggers=1, seed=0)
    task = decoding.SinkData(task.tokens, task.tags, task.vocab_size, task.n_tags,
                         torch.zeros_like(task.trigger), task.lag, task.n_triggers, task.bos)  # no trigger
    got = decoding.cache_accuracy(_tiny_model(task), task, selfattn.causal_mask(6))
    assert math.isnan(got["trigger"]) and got["all"] == got["other"]


# --- the share on position 0 ------------------------------------------------------------------


def test_first_token_share_by_hand():
    w = torch.zeros(2, 2, 3, 3)  # (B, H, T, S)
    w[:, :, 0, 0] = 1.0
    w[0, 0, 1, :2], w[0, 0, 2] = torch.tensor([0.5, 0.5]), torch.tensor([0.2, 0.3, 0.5])
    w[1, 0, 1, :2], w[1, 0, 2] = torch.tensor([0.9, 0.1]), torch.tensor([0.6, 0.2, 0.2])
    w[:, 1, 1, 1], w[:, 1, 2, 2] = 1.0, 1.0  # head 1 attends to itself: nothing on position 0
    share = decoding.first_token_share(w, first_query=1)
    assert share.shape == (2,)
    assert share.tolist() == pytest.approx([(0.5 + 0.2 + 0.9 + 0.6) / 4, 0.0])
    assert decoding.first_token_share(w).tolist() == pytest.approx([(2 + 2.2) / 6, 2 / 6])
    where = torch.tensor([[False, True, False], [True, False, True]])
    assert decoding.first_token_share(w, 1, where).tolist() == pytest.approx([(0.5 + 0.6) / 2, 0])


# --- the experiment ---------------------------------------------------------------------------

TINY = dict(seq_len=12, n_train=64, n_test=24, d=8, n_heads=2, steps=4, batch_size=4, window=4,
            progress=False)


@pytest.fixture(scope="module")
def tiny_results():
    return decoding.sink_experiment([3, 5], (0, 1), **TINY)


def test_the_experiment_returns_one_record_per_seed_and_arm(tiny_results):
    assert list(tiny_results) == ["BOS", "control"]
    for arm, bos in (("BOS", True), ("control", False)):
        records = tiny_results[arm]
        assert [r.seed for r in records] == [3, 5] and all(r.bos is bos for r in records)
        for r in records:
            assert (r.window, r.n_sink) == (4, 1)
            assert r.test.bos is bos and r.test.tokens.shape == (24, 12)
            assert (r.test.tokens[:, 0] == decoding.BOS).all() == bos
            for acc in (r.full, r.window_only, r.sink_window):
                assert set(acc) == {"all", "trigger", "other"}
                assert all(0 <= v <= 1 for v in acc.values())
            assert len(r.share_other) == len(r.share_trigger) == 2
            assert all(0 <= s <= 1 for s in r.share_other + r.share_trigger)
            assert r.share_uniform == pytest.approx(sum(1 / (t + 1) for t in range(4, 12)) / 8)
            assert r.drop == pytest.approx(r.full["all"] - r.window_only["all"])
            assert r.gap == pytest.approx(r.full["all"] - r.sink_window["all"])
            assert r.top_share == max(r.share_other)
            assert r.sink_heads == sum(s > decoding.SINK_SHARE for s in r.share_other)
            assert math.isfinite(r.loss) and r.loss > 0
    # the records are what evaluate_sink says of the returned models
    r = tiny_results["BOS"][1]
    again = decoding.evaluate_sink(r.model, r.test, 4)
    assert again.full == r.full and again.window_only == r.window_only
    assert again.share_other == r.share_other


def test_bos_value_zeroed_keeps_the_key_and_removes_the_value(tiny_results):
    for r in tiny_results["BOS"] + tiny_results["control"]:
        zeroed = decoding.bos_value_zeroed(r)
        assert 0 <= zeroed <= 1
        assert decoding.bos_value_zeroed(r) == zeroed  # the hook is gone afterwards
        assert decoding.cache_accuracy(r.model, r.test, selfattn.causal_mask(12), 4)["all"] == \
            r.full["all"]
    r = tiny_results["BOS"][0]
    calls = []
    hook = r.model.attn.v_proj.register_forward_hook(lambda m, i, o: calls.append(o.clone()))
    decoding.bos_value_zeroed(r)
    hook.remove()
    assert calls and calls[0].shape[1] == 12  # the value projection ran on the whole sequence


def test_the_experiment_is_deterministic_and_seeds_matter(tiny_results):
    again = decoding.sink_experiment([3, 5], (0, 1), **TINY)
    for arm in tiny_results:
        for a, b in zip(tiny_results[arm], again[arm], strict=True):
            assert (a.full, a.window_only, a.share_other, a.loss) == \
                (b.full, b.window_only, b.share_other, b.loss)
    a, b = tiny_results["BOS"]
    assert a.share_other != b.share_other


def test_sink_columns(tiny_results):
    records = tiny_results["BOS"]
    columns = decoding.sink_columns(records)
    assert columns["full cache"] == [r.full["all"] for r in records]
    assert columns["window only"] == [r.window_only["all"] for r in records]
    assert columns["sink+window"] == [r.sink_window["all"] for r in records]
    assert columns["top share"] == [r.top_share for r in records]
    assert "window only" in train.seed_rows(columns, [3, 5])


