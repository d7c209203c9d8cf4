"""The synthetic tasks, the taggers and the training loops (one model, or several seeds)."""

import itertools

import pytest
import torch

from selfattn.book import multi_head, positional_encoding, tagging
from selfattn.book.kit import measure, train
from selfattn.positional import alibi_slopes


def test_labels_match_an_independent_rule():
    d = tagging.tagging_task(300, seq_len=20, n_cues=3, seed=5)
    for i in range(len(d)):
        words = d.tokens[i].tolist()
        tags = d.tags[i].tolist()
        # rule: exactly one ambiguous word and one cue; the word's tag is the nearest cue to its
        # left, minus one; every other word's tag depends on the word alone
        assert words.count(0) == 1
        cues = [j for j, w in enumerate(words) if 1 <= w <= 3]
        assert len(cues) == 1
        amb = words.index(0)
        assert cues[0] < amb and amb - cues[0] == d.distance[i] and amb == d.position[i]
        assert tags[amb] == words[cues[0]] - 1
        assert tags[cues[0]] == 3 + words[cues[0]] - 1
        for j, w in enumerate(words):
            if w > 3:
                assert tags[j] == 6 + w % 4


def test_distances_cover_the_requested_range_and_seed_is_deterministic():
    d = tagging.tagging_task(2000, seq_len=16, min_distance=3, max_distance=9, seed=1)
    assert set(d.distance.tolist()) == set(range(3, 10))
    again = tagging.tagging_task(2000, seq_len=16, min_distance=3, max_distance=9, seed=1)
    assert torch.equal(d.tokens, again.tokens) and torch.equal(d.tags, again.tags)
    assert not torch.equal(d.tokens, tagging.tagging_task(2000, seq_len=16, min_distance=3,
                                                       max_distance=9, seed=2).tokens)
    assert d.words(0)[d.position[0]] == "saw"


TAGGERS = {
    "window": lambda v, c: tagging.WindowTagger(v, c, window=3),
    "cnn": lambda v, c: tagging.CNNTagger(v, c),
    "rnn": lambda v, c: tagging.RNNTagger(v, c),
    "attention": lambda v, c: tagging.AttentionTagger(v, c),
}


@pytest.mark.parametrize("name", TAGGERS)
@pytest.mark.parametrize(("B", "T"), [(1, 1), (3, 7), (2, 40)])
def test_taggers_run_on_any_batch_and_length(name, B, T):
    model = TAGGERS[name](20, 6)
    out = model(torch.randint(0, 20, (B, T)))
    assert out.shape == (B, T, 6)


@pytest.mark.parametrize("name", TAGGERS)
def test_one_training_step_lowers_the_loss(name):
    torch.manual_seed(0)
    d = tagging.tagging_task(64, seq_len=12, seed=0)
    model = TAGGERS[name](d.vocab_size, d.n_tags)
    h = train.train(model, d, steps=2, batch_size=64, lr=1e-2, progress=False)
    assert h.loss[1] < h.loss[0]


def test_training_is_deterministic_with_a_seed():
    d = tagging.tagging_task(200, seq_len=12, seed=0)
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        model = tagging.AttentionTagger(d.vocab_size, d.n_tags)
        runs.append((train.train(model, d, steps=5, progress=False).loss,
                     model.mlp[0].weight.clone()))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])


def test_receptive_fields_of_window_and_cnn():
    # changing a token farther than the reach never changes the prediction at position 10
    for model, reach in [(tagging.WindowTagger(20, 6, window=2), 2),
                         (tagging.CNNTagger(20, 6, kernel=5, n_layers=2), 4)]:
        x = torch.randint(3, 20, (1, 21))
        base = model(x)[0, 10]
        for j in range(21):
            y = x.clone()
            y[0, j] = (x[0, j] + 1) % 20
            changed = not torch.allclose(model(y)[0, 10], base)
            assert changed == (abs(j - 10) <= reach), (j, reach)


def test_window_parameters_grow_linearly_with_the_window():
    counts = [measure.count_parameters(tagging.WindowTagger(30, 5, d=8, window=w, hidden=10))
              for w in range(4)]
    steps = {b - a for a, b in itertools.pairwise(counts)}
    assert steps == {2 * 8 * 10}  # two more d-wide inputs into a hidden layer of 10


def test_accuracy_by_distance():
    d = tagging.tagging_task(50, seq_len=10, seed=0)
    model = tagging.AttentionTagger(d.vocab_size, d.n_tags, max_len=16)
    acc = tagging.accuracy_by_distance(model, d)
    assert set(acc) == set(d.distance.tolist()) and all(0 <= a <= 1 for a in acc.values())


def test_neighbour_task_tags_are_the_two_neighbours():
    d = multi_head.neighbour_task(50, seq_len=7, vocab_size=4, seed=0)
    assert d.n_tags == 25 and d.tokens.shape == d.tags.shape == (50, 7)
    for i in range(50):
        x = d.tokens[i].tolist()
        for t in range(7):
            left = x[t - 1] if t > 0 else 4
            right = x[t + 1] if t < 6 else 4
            assert d.tags[i, t] == left * 5 + right


def test_recent_cue_tags_follow_an_independent_rule():
    task = positional_encoding.recent_cue_task(50, seq_len=20, n_cues=3, vocab_size=10, seed=4)
    for tokens, tags in zip(task.tokens.tolist(), task.tags.tolist(), strict=True):
        last = None
        for token, tag in zip(tokens, tags, strict=True):
            if 1 <= token <= 3:
                last = token
            assert tag == (3 if last is None else last - 1)
    again = positional_encoding.recent_cue_task(50, 20, 3, seed=4, vocab_size=10)
    assert task.n_tags == 4 and torch.equal(task.tokens, again.tokens)


@pytest.mark.parametrize("positions", ["none", "sinusoidal", "learned", "rope", "alibi"])
def test_every_position_scheme_trains_causally(positions):
    torch.manual_seed(0)
    model = tagging.AttentionTagger(16, 5, d=16, n_heads=2, max_len=24, positions=positions, causal=True)
    tokens = positional_encoding.recent_cue_task(4, seq_len=12).tokens
    logits, w = model(tokens, need_weights=True)
    assert logits.shape == (4, 12, 5) and w.shape == (4, 2, 12, 12)
    assert (w.triu(1) == 0).all(), "a causal model attends to no later token"
    # causality: changing the last token changes no earlier prediction
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 16
    torch.testing.assert_close(model(changed)[:, :-1], logits[:, :-1])


def test_learned_positions_beyond_training_get_no_gradient():
    torch.manual_seed(0)
    model = tagging.AttentionTagger(16, 5, d=16, max_len=32, positions="learned", causal=True)
    before = model.learned.table.weight.detach().clone()
    task = positional_encoding.recent_cue_task(64, seq_len=8)
    train.train(model, task, steps=3, batch_size=8, progress=False)
    after = model.learned.table.weight.detach()
    assert not torch.equal(after[:8], before[:8]) and torch.equal(after[8:], before[8:])


@pytest.mark.parametrize("name", ["window", "attention"])
def test_train_seeds_gives_the_models_that_separate_trainings_give(name):
    task = tagging.tagging_task(300, seq_len=12, seed=3)

    def make():
        return TAGGERS[name](task.vocab_size, task.n_tags)

    batched, histories = train.train_seeds(make, task, seeds=[4, 7], steps=5, batch_size=8,
                                           lr=1e-2, progress=False)
    for seed, model, history in zip([4, 7], batched, histories, strict=True):
        torch.manual_seed(seed)
        alone = make()
        expected = train.train(alone, task, steps=5, batch_size=8, lr=1e-2, seed=seed,
                               progress=False)
        for (n, a), b in zip(alone.named_parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=n)  # float rounding
        torch.testing.assert_close(torch.tensor(history.loss), torch.tensor(expected.loss))
        assert not model.training
    # the seeds really differ
    assert not torch.equal(next(batched[0].parameters()), next(batched[1].parameters()))


class NormedTagger(torch.nn.Module):
    """A tagger with buffers that training changes: a BatchNorm's running statistics."""

    def __init__(self, vocab_size, n_tags, d=8):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab_size, d)
        self.norm = torch.nn.BatchNorm1d(d)
        self.out = torch.nn.Linear(d, n_tags)

    def forward(self, tokens):
        x = self.embed(tokens).transpose(1, 2)  # (B, d, T): BatchNorm1d normalises dim 1
        return self.out(self.norm(x).transpose(1, 2))  # (B, T, n_tags)


def test_train_seeds_gives_back_the_buffers_training_changed():
    task = tagging.tagging_task(100, seq_len=12, seed=3)

    def make():
        return NormedTagger(task.vocab_size, task.n_tags)

    batched, _ = train.train_seeds(make, task, seeds=[4, 7], steps=3, batch_size=8,
                                   progress=False)
    untrained = make().norm.running_mean
    for seed, model in zip([4, 7], batched, strict=True):
        torch.manual_seed(seed)
        alone = make()
        train.train(alone, task, steps=3, batch_size=8, seed=seed, progress=False)
        assert not torch.equal(alone.norm.running_mean, untrained)  # training changed it
        for name, value in alone.state_dict().items():  # running mean, variance and count too
            torch.testing.assert_close(model.state_dict()[name], value, rtol=1e-4, atol=1e-4,
                                       msg=name)


def test_decoy_cues_sit_after_the_word_and_never_decide():
    d = tagging.tagging_task(300, seq_len=12, n_cues=3, decoys=2, seed=6)
    for i in range(len(d)):
        words = d.tokens[i].tolist()
        amb = words.index(0)
        cues = [j for j, w in enumerate(words) if 1 <= w <= 3]
        before = [j for j in cues if j < amb]
        assert len(before) == 1 and len(cues) == 3  # one deciding cue, two decoys after the word
        assert d.tags[i, amb] == words[before[0]] - 1
        assert all(words[j] != words[before[0]] for j in cues if j > amb)  # decoys differ
        assert all(d.tags[i, j] == 3 + words[j] - 1 for j in cues)  # cues keep their own tags


def test_the_mean_pool_tagger_sees_every_word_but_not_where_it_is():
    torch.manual_seed(0)
    model = tagging.MeanPoolTagger(20, 6, d=8)
    tokens = torch.randint(0, 20, (3, 9))
    perm = torch.randperm(9)
    torch.testing.assert_close(model(tokens[:, perm]), model(tokens)[:, perm])  # order-blind
    far = tokens.clone()
    far[:, 0] = (far[:, 0] + 1) % 20  # a change at one end reaches the other end
    assert not torch.allclose(model(far)[:, -1], model(tokens)[:, -1])


def test_snapshots_hold_the_weights_along_the_way_in_both_trainers():
    task = tagging.tagging_task(100, seq_len=12, seed=3)

    def make():
        return TAGGERS["attention"](task.vocab_size, task.n_tags)

    batched, histories = train.train_seeds(make, task, seeds=[1, 2], steps=6, batch_size=8,
                                           progress=False, snapshot_every=4)
    torch.manual_seed(1)
    alone = make()
    initial = {k: v.clone() for k, v in alone.state_dict().items()}
    history = train.train(alone, task, steps=6, batch_size=8, seed=1, progress=False,
                          snapshot_every=4)
    for h in (histories[0], history):
        assert [step for step, _ in h.snapshots] == [0, 4, 6]
    for name, value in initial.items():  # step 0 is the initial model, the last the trained one
        torch.testing.assert_close(history.snapshots[0][1][name], value)
        torch.testing.assert_close(histories[0].snapshots[0][1][name], value)
    for name, value in alone.state_dict().items():
        torch.testing.assert_close(history.snapshots[-1][1][name], value)
        torch.testing.assert_close(histories[0].snapshots[-1][1][name], value, rtol=1e-4, atol=1e-4)
    restored = make()
    restored.load_state_dict(histories[1].snapshots[-1][1])
    for a, b in zip(restored.parameters(), batched[1].parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_seed_table_shows_mean_spread_and_every_seed():
    table = train.seed_table({"a": [0.5, 1.0], "longer name": [0.25, 0.25, 0.25]})
    lines = table.splitlines()
    assert lines[0] == "accuracy, over 3 seeds:"
    assert "75.0% (50.0%..100.0%)  50.0% 100.0%" in lines[2]
    assert lines[3].startswith("longer name") and "25.0% (25.0%..25.0%)" in lines[3]


def test_the_order_blind_ceiling_by_hand_and_against_a_brute_force_guess():
    # tokens: filler 9, cue 1, filler, cue 2, cue 1, filler -> positions and what a bag can know
    task = train.Sequences(torch.tensor([[9, 1, 9, 2, 1, 9]]), torch.zeros(1, 6, dtype=torch.long), 10, 5)
    # 9: none yet (1); 1: itself (1); 9: only c1 seen (1); 2: itself; 1: itself; 9: {c1: 2, c2: 1} -> 2/3
    assert positional_encoding.order_blind_accuracy(task) == pytest.approx((5 + 2 / 3) / 6)
    # on real data, it is an upper bound for a guess that ignores order: most frequent earlier cue
    real = positional_encoding.recent_cue_task(300, seq_len=24, seed=2)
    guess_right = 0
    for tokens, tags in zip(real.tokens.tolist(), real.tags.tolist(), strict=True):
        counts = [0] * 5
        for token, tag in zip(tokens, tags, strict=True):
            if 1 <= token <= 4:
                counts[token] += 1
                guess = token - 1
            elif sum(counts):
                guess = max(range(1, 5), key=lambda c: counts[c]) - 1
            else:
                guess = 4
            guess_right += guess == tag
    assert guess_right / real.tokens.numel() <= positional_encoding.order_blind_accuracy(real) + 0.01


def test_the_order_blind_ceiling_reads_the_cues_from_the_task():
    # six cues (seven tags): cue 5, filler, cue 6, cue 5, filler -> the last filler has seen
    # {c5: 2, c6: 1}, so 2/3; every other token is always right
    task = train.Sequences(torch.tensor([[5, 9, 6, 5, 9]]), torch.zeros(1, 5, dtype=torch.long), 10, 7)
    assert positional_encoding.order_blind_accuracy(task) == pytest.approx((4 + 2 / 3) / 5)
    six = positional_encoding.recent_cue_task(200, n_cues=6, seed=1)
    assert six.n_tags == 7 and positional_encoding.order_blind_accuracy(six) < 0.75


def test_the_causal_average_sees_only_the_words_up_to_each_one():
    torch.manual_seed(0)
    causal, mean = tagging.CausalMeanTagger(20, 6), tagging.MeanPoolTagger(20, 6)
    assert measure.count_parameters(causal) == measure.count_parameters(mean)
    causal.load_state_dict(mean.state_dict())  # the same weights: only the average differs
    tokens = torch.randint(0, 20, (2, 9))
    later = tokens.clone()
    later[:, 5] = (later[:, 5] + 1) % 20  # change one word in the middle
    a, b = causal(tokens), causal(later)
    assert torch.equal(a[:, :5], b[:, :5])  # the words before it cannot see the change
    assert not torch.allclose(a[:, 5:], b[:, 5:])  # the word itself and those after it do
    # at the last position the causal average is the whole sentence's average
    assert torch.allclose(causal(tokens)[:, -1], mean(tokens)[:, -1], atol=1e-6)


def test_gradient_by_distance_is_the_norm_of_each_jacobian_block():
    from selfattn.book import tagging

    torch.manual_seed(0)
    T, d = 7, 3
    mix = torch.randn(T, T)  # y_t = sum_s mix[t, s] * x_s @ W: block (t, s) is mix[t, s] * W^T
    W = torch.randn(d, 5)

    def layer(x):
        return torch.einsum("ts,bsd->btd", mix, x) @ W  # (B, T, 5)

    got = tagging.gradient_by_distance(layer, torch.randn(1, T, d), t=4)
    assert torch.allclose(got, mix[4].abs() * W.norm(), rtol=1e-5)
    # a GRU at its default initialisation: the gradient from far back is far smaller
    gru = torch.nn.GRU(d, d, batch_first=True)
    far = tagging.gradient_by_distance(lambda x: gru(x)[0], torch.randn(1, 40, d), t=39)
    assert far[0] < 1e-3 * far[38]


def test_cue_report_measures_the_gradient_at_the_scores():
    from selfattn.book import tagging

    torch.manual_seed(0)
    task = tagging.tagging_task(200, seq_len=12, seed=0)
    model = tagging.AttentionTagger(task.vocab_size, task.n_tags, d=16, n_heads=2)
    tokens = task.tokens[:8]
    bias = torch.zeros(8, 2, 12, 12, requires_grad=True)
    with_bias, w = model(tokens, need_weights=True, score_bias=bias)
    assert torch.allclose(with_bias, model(tokens), atol=1e-6)  # a zero bias changes nothing
    loss = torch.nn.functional.cross_entropy(with_bias.flatten(0, 1), task.tags[:8].flatten())
    (ds,) = torch.autograd.grad(loss, bias)
    # before the softmax: moving every score of a row together changes nothing, so each row of
    # dL/ds sums to 0 (a bias added after the softmax would not)
    assert ds.abs().max() > 0 and torch.allclose(ds.sum(-1), torch.zeros(8, 2, 12), atol=1e-7)
    a = w.detach()
    r = tagging.cue_report(model, task)
    right = tagging.ambiguous_correct(model, task)
    cue = task.tokens[torch.arange(len(task)), task.cue_position]
    for c in range(1, task.n_cues + 1):
        assert r.accuracy[c - 1] == pytest.approx(right[cue == c].float().mean().item())
    assert ((r.weight >= 0) & (r.weight <= 1)).all() and (r.score_grad >= 0).all()
    assert (r.loss > 0).all() and r.decoy_weight == 0.0  # this task has no decoys
    assert a.shape == (8, 2, 12, 12)


def test_seed_rows_fit_the_page_for_ten_seeds():
    from selfattn.book.kit import train

    arms = {"window (w=3)": [0.2] * 10, "CNN (2 x width 5)": [0.25] * 10,
            "mean-pool": [1.0] * 10, "self-attention": [1.0] * 9 + [0.5]}
    table = train.seed_rows(arms, range(100, 110))
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 86
    assert lines[2].startswith("100") and lines[-2].split()[-1] == "95.0%"
    assert lines[-1].split()[-1] == "50.0%..100.0%"


def test_seed_table_puts_ten_seeds_under_their_arm_to_fit_the_page():
    table = train.seed_table({"attention, two heads": [1.0] * 9 + [0.5], "short": [0.5, 0.75]})
    lines = table.splitlines()
    assert all(len(line) <= 86 for line in lines), table
    at = lines.index(next(line for line in lines if line.startswith("attention, two heads")))
    assert "95.0% (50.0%..100.0%)" in lines[at]
    assert lines[at + 1].split() == ["100.0%"] * 9 + ["50.0%"]  # every seed, on the next line
    assert lines[-1].startswith("short") and lines[-1].endswith("50.0% 75.0%")  # fits: one line


def test_seed_rows_never_print_minus_zero_and_fit_wide_seeds():
    from selfattn.book.kit import train

    table = train.seed_rows({"gap": [-0.004] * 9 + [0.5]}, range(99995, 100005), fmt="{:.0%}")
    lines = table.splitlines()
    assert "-0%" not in table and lines[2].split() == ["99995", "0%"]
    assert len({line.index("%") for line in lines[2:-1]}) == 1  # one column, aligned
    assert lines[-1].split() == ["span", "0%..50%"]


def test_default_sense_removes_the_cue_and_reads_the_fallback():
    from selfattn.book import tagging

    task = tagging.tagging_task(64, seq_len=12, seed=0)

    class Eliminator(torch.nn.Module):
        """Tags 'saw' with the sense of any cue it sees, else sense 2: elimination of cue 3."""

        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            logits = torch.zeros(*tokens.shape, task.n_tags)  # (N, T, C)
            seen = [(tokens == c).any(1) for c in range(1, task.n_cues + 1)]  # each (N,)
            sense = torch.full((len(tokens),), 2)
            for c, s in enumerate(seen):
                sense = torch.where(s & (c != 2), c, sense)
            logits[torch.arange(len(tokens)), :, sense] = 1.0
            return logits

    share = tagging.default_sense(Eliminator(), task)
    assert share.shape == (task.n_cues,) and share.tolist() == [0.0, 0.0, 1.0, 0.0]
    assert (task.tokens[torch.arange(64), task.cue_position] >= 1).all()  # task left as it was


def test_recall_task_tags_each_question_with_its_answer():
    task = tagging.recall_task(200, n_pairs=6, n_keys=10, n_values=5, n_named=3, seed=7)
    assert task.tokens.shape == task.tags.shape == (200, 6 + 2 + 3)
    Q = task.n_keys * task.n_values
    for tokens, tags in zip(task.tokens.tolist(), task.tags.tolist(), strict=True):
        pairs = {t // task.n_values: t % task.n_values for t in tokens[:6]}
        assert len(pairs) == 6 and 0 in pairs  # distinct keys, key 0 always among them
        assert tags[:6] == [t % task.n_values for t in tokens[:6]]  # a pair: its own value
        assert tokens[6] == Q + task.n_keys and tags[6] == tokens[5] % task.n_values  # last?
        assert tokens[7] == Q and tags[7] == pairs[0]  # A?: key 0
        for t, tag in zip(tokens[8:], tags[8:], strict=True):  # the named keys: present, not 0
            assert t - Q in pairs and t != Q and tag == pairs[t - Q]
    assert task.words(0)[6:8] == ["last?", "A?"]
    assert [task.columns(q) for q in task.QUESTIONS] == [slice(6, 7), slice(7, 8), slice(8, 11)]


def test_recall_task_puts_key_0_anywhere_and_names_every_other_key():
    task = tagging.recall_task(2000, seed=3)
    key0 = (task.tokens[:, :8] // task.n_values == 0).float().argmax(dim=1)
    assert set(key0.tolist()) == set(range(8))  # not always in the same place
    asked = task.tokens[:, 10:] - task.n_keys * task.n_values
    assert set(asked.flatten().tolist()) == set(range(1, 16))


def test_decay_tagger_weights_read_the_distance_only():
    model = tagging.DecayTagger(20, 4, d=16, n_heads=8, causal=True)
    w = model.weights(6)  # (H, T, T)
    slopes = alibi_slopes(8)
    i = torch.arange(6)
    expected = (-slopes[:, None, None] * (i[:, None] - i[None, :]).abs()).masked_fill(
        i[None, :] > i[:, None], float("-inf")).softmax(-1)
    torch.testing.assert_close(w, expected)
    assert model(torch.randint(0, 20, (3, 6))).shape == (3, 6, 4)
    assert (tagging.DecayTagger(20, 4, d=16, causal=False).weights(5) > 0).all()
    same = measure.count_parameters(tagging.MeanPoolTagger(20, 4, d=16))
    assert measure.count_parameters(model) == same  # only the weights differ from mean-pool


def test_recall_accuracy_counts_each_kind_of_question():
    task = tagging.recall_task(50, seed=1)

    class Oracle(torch.nn.Module):  # right on the pairs and on last?, wrong on every question on a key
        def forward(self, tokens):
            guess = task.tags.clone()
            guess[:, task.columns("key 0")] = (guess[:, task.columns("key 0")] + 1) % task.n_values
            guess[:, task.columns("named")] = (guess[:, task.columns("named")] + 1) % task.n_values
            return torch.nn.functional.one_hot(guess, task.n_tags).float()

    assert tagging.recall_accuracy(Oracle(), task) == {"last": 1.0, "key 0": 0.0, "named": 0.0}


def test_recall_arms_share_one_parameter_budget():
    task = tagging.recall_task(10, seed=0)
    counts = {arm: measure.count_parameters(build())
              for arm, build in tagging.recall_taggers(task.vocab_size, task.n_tags).items()}
    assert set(counts) == set(tagging.RECALL_ARMS)
    assert max(counts.values()) / min(counts.values()) < 1.1, counts


def _recall_result(named_fixed=0.3):
    seeds = list(range(10))
    acc = {}
    for arm in tagging.RECALL_ARMS:
        local = arm in ("window", "CNN")
        acc[arm] = {"last": [1.0 if local or arm == "self-attention" else 0.3] * 10,
                    "key 0": [0.4 if local else 0.95] * 10,
                    "named": [0.95 if arm == "self-attention" else named_fixed] * 10}
    return tagging.RecallResult(seeds, dict.fromkeys(tagging.RECALL_ARMS, 9400), acc, 1 / 8,
                                ["A=1"], ["1"], {"steps": 1})


def test_recall_result_counts_and_checks_the_thesis():
    result = _recall_result()
    result.check()
    assert result.fixed == [arm for arm in tagging.RECALL_ARMS if arm != "self-attention"]
    assert result.headline().startswith("self-attention answers the named key in 10 of 10")
    assert "no fixed weighting does in any" in result.headline()
    assert "window          answers 'last' in 10 of 10" in "\n".join(result.controls())
    assert "mean-pool" in result.table("named")
    with pytest.raises(AssertionError):
        _recall_result(named_fixed=0.9).check()  # a fixed weighting that answers: no thesis


def test_recall_experiment_trains_every_arm_from_every_seed():
    result = tagging.recall_experiment(steps=2, progress=False)
    assert list(result.accuracy) == list(tagging.RECALL_ARMS)
    assert result.seeds == list(train.seed_range())
    for runs in result.accuracy.values():
        assert set(runs) == {"last", "key 0", "named"}
        assert all(len(v) == len(result.seeds) for v in runs.values())
    assert len(result.example) == len(result.answers)
    assert result.chance == 1 / 8


def test_plot_recall_draws_every_arm_on_every_question_in_its_colour():
    import matplotlib

    matplotlib.use("Agg")
    from selfattn.book.kit import draw

    fig = tagging.plot_recall(_recall_result())
    bars = fig.axes[0].patches
    assert len(bars) == len(tagging.RECALL_ARMS) * 3
    colours = {matplotlib.colors.to_hex(bar.get_facecolor()) for bar in bars}
    assert colours == {draw.color(arm).lower() for arm in tagging.RECALL_ARMS}


def test_window_tagger_is_its_fc_layer_on_each_concatenated_window():
    model = tagging.WindowTagger(20, 4, d=6, window=3, hidden=10)
    tokens = torch.randint(0, 20, (5, 9))
    x = torch.nn.functional.pad(model.embed(tokens), (0, 0, 3, 3))  # (B, T + 2w, d)
    windows = torch.cat([x[:, j : j + 9] for j in range(7)], dim=-1)  # (B, T, 7 d)
    torch.testing.assert_close(model(tokens), model.mlp(windows))


def test_pairs_seen_counts_the_reach_of_every_question():
    task = tagging.recall_task(200, seed=0)
    V, C = task.vocab_size, task.n_tags
    torch.manual_seed(0)
    assert tagging.pairs_seen(tagging.WindowTagger(V, C, window=3), task) == 0  # last? sees 3
    assert tagging.pairs_seen(tagging.CNNTagger(V, C, kernel=5, n_layers=2), task) == 1
    for arm, build in tagging.recall_taggers(V, C).items():  # every arm reaches every pair
        assert tagging.pairs_seen(build(), task) == task.n_pairs, arm


def test_recall_check_refuses_an_arm_short_of_reach_or_an_average_at_a_guess():
    result = _recall_result()
    result.seen = dict.fromkeys(tagging.RECALL_ARMS, 8)
    result.check()
    assert "window          every question sees 8 of 8 pairs" in result.reach()
    result.seen["window"] = 3
    with pytest.raises(AssertionError):
        result.check()
    with pytest.raises(AssertionError):
        _recall_result(named_fixed=0.15).check()  # the averages no better than a guess
