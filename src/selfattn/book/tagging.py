"""Chapter 1, sequence labeling: the tagging tasks, the taggers, and what each can see.

The tagging task makes "context at a distance" measurable. Every sequence holds one
ambiguous word (think of the two "saw"s of "I saw a saw") whose tag is fixed by a single cue word
``distance`` positions to its left: after cue ``c`` the ambiguous word takes sense ``c`` (after a
determiner "saw" is a noun, after a pronoun a verb; the task has ``n_cues`` such senses). Every
other word's tag is fixed by the word alone. A tagger that cannot see ``distance`` tokens back can
do no better than chance, ``1 / n_cues``, on the ambiguous word.

Token ids: ``0`` is the ambiguous word, ``1..n_cues`` the cues, the rest fillers.
Tag ids: ``0..n_cues-1`` the ambiguous word's senses, ``n_cues..2*n_cues-1`` the cues' own tags,
then ``n_filler_tags`` tags for the fillers (filler ``w`` gets ``2*n_cues + w % n_filler_tags``).

The taggers map token ids (B, T) to tag logits (B, T, n_tags): a windowed fully-connected layer,
a stack of 1-D convolutions, a bidirectional GRU, an average over the whole sequence (attention
with equal weights, the control) or over the tokens up to each one (a fixed causal average, the
second control), and one layer of self-attention with positional encoding (:class:`AttentionTagger`,
which chapters 3 to 7 train too). Then what each can see (:func:`influence`,
:func:`gradient_by_distance`, :func:`cue_report`), and the chapter's exercise checkers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..multihead import MultiHeadAttention
from ..positional import LearnedPositionalEmbedding, alibi_bias, alibi_slopes, sinusoidal_encoding
from ..scoring import ScoredSelfAttention
from .kit.checkers import _checker, same_as
from .kit.measure import count_parameters
from .kit.train import Sequences, data_seed, k_of_n, seed_range, seed_rows, train_seeds

AMBIGUOUS = 0


@dataclass(frozen=True)
class TaggingData(Sequences):
    """A batch of the distance-cue tagging task."""

    position: Tensor  # (N,) where the ambiguous word is
    distance: Tensor  # (N,) how far to its left the cue is
    n_cues: int

    @property
    def cue_position(self) -> Tensor:
        """(N,) where the cue is."""
        return self.position - self.distance

    def words(self, i: int) -> list[str]:
        """Sequence ``i`` as readable words: ``saw`` (ambiguous), ``c1``.. (cues), ``w5``.. (fillers)."""
        return ["saw" if t == AMBIGUOUS else f"c{t}" if t <= self.n_cues else f"w{t}"
                for t in self.tokens[i].tolist()]


def tagging_task(
    n: int,
    seq_len: int = 32,
    min_distance: int = 1,
    max_distance: int | None = None,
    n_cues: int = 4,
    vocab_size: int = 32,
    n_filler_tags: int = 4,
    decoys: int = 0,
    seed: int = 0,
) -> TaggingData:
    """Generate ``n`` sequences of the distance-cue tagging task.

    The cue sits ``distance`` tokens left of the ambiguous word, ``distance`` uniform in
    ``[min_distance, max_distance]`` (default: as far as the sequence allows); the ambiguous
    word's position is uniform among those that leave room for the cue (and the decoys).
    ``decoys``: that many other cue words, each a different cue from the deciding one, placed
    *after* the ambiguous word; only the cue before it decides. A model that sees every word but
    not where it is (a bag of words) cannot tell which cue decides. The same seed always gives the
    same data.
    """
    longest = seq_len - 1 - decoys  # leave room for the decoys after the ambiguous word
    max_distance = longest if max_distance is None else max_distance
    assert 1 <= min_distance <= max_distance <= longest, "the cue must fit before the word"
    first_filler = n_cues + 1
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(first_filler, vocab_size, (n, seq_len), generator=g)  # (N, T)
    tags = 2 * n_cues + tokens % n_filler_tags  # (N, T)
    distance = torch.randint(min_distance, max_distance + 1, (n,), generator=g)  # (N,)
    # the ambiguous word sits at distance + u, u uniform in [0, seq_len - 1 - decoys - distance]
    position = distance + (torch.rand(n, generator=g) * (seq_len - decoys - distance)).long()  # (N,)
    cue = torch.randint(1, n_cues + 1, (n,), generator=g)  # (N,) which cue word
    rows = torch.arange(n)
    tokens[rows, position - distance] = cue
    tags[rows, position - distance] = n_cues + cue - 1
    tokens[rows, position] = AMBIGUOUS
    tags[rows, position] = cue - 1
    if decoys:
        at = torch.arange(seq_len)  # a random order of the positions after the word:
        allowed = at > position[:, None]  # (N, T)
        order = torch.rand(n, seq_len, generator=g).masked_fill(~allowed, -1.0)
        spots = order.topk(decoys, dim=1).indices  # (N, decoys)
        shift = torch.randint(1, n_cues, (n, decoys), generator=g)  # never the deciding cue
        decoy = (cue[:, None] - 1 + shift) % n_cues + 1  # (N, decoys)
        tokens.scatter_(1, spots, decoy)
        tags.scatter_(1, spots, n_cues + decoy - 1)
    return TaggingData(tokens, tags, vocab_size, 2 * n_cues + n_filler_tags, position, distance,
                       n_cues)



@dataclass(frozen=True)
class RecallData(Sequences):
    """A batch of the recall task: ``n_pairs`` pair tokens, then three questions.

    Columns: ``0..n_pairs-1`` the pairs (key ``k``, value ``v``: token ``k * n_values + v``,
    tagged ``v``); then ``LAST`` ("which value came last?", tagged the last pair's value); then
    the question on key 0, the key every sentence holds ("which value did key 0 get?"); then
    ``n_named`` questions on the other keys present ("which value did key k get?"). A question
    on key ``k`` is token ``n_keys * n_values + k``; ``LAST`` is the token after them.
    """

    n_pairs: int
    n_keys: int
    n_values: int

    QUESTIONS: ClassVar[tuple[str, ...]] = ("last", "key 0", "named")

    def columns(self, question: str) -> slice:
        """The columns of one kind of question (one of :data:`QUESTIONS`)."""
        P = self.n_pairs
        return {"last": slice(P, P + 1), "key 0": slice(P + 1, P + 2),
                "named": slice(P + 2, self.tokens.shape[1])}[question]

    def words(self, i: int) -> list[str]:
        """Sequence ``i`` as readable words: ``C=5`` (key C, value 5), ``C?``, ``last?``."""
        names = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
        Q = self.n_keys * self.n_values
        return [f"{names[t // self.n_values]}={t % self.n_values}" if t < Q
                else f"{names[t - Q]}?" if t < Q + self.n_keys else "last?"
                for t in self.tokens[i].tolist()]


def recall_task(n: int, n_pairs: int = 8, n_keys: int = 16, n_values: int = 8, n_named: int = 2,
                seed: int = 0) -> RecallData:
    """Associative recall as a tagging task (Zoology, Arora et al. 2023, §3; the induction heads
    of Olsson et al. 2022): ``n_pairs`` pairs with distinct keys (key 0 among them, at a random
    place), then three kinds of question, each tagged with its answer:

    * ``last?``: the value of the last pair. Its answer is always one place back: it needs
      positions only, which a window, a convolution or a recency decay has;
    * ``A?`` (key 0): the value of the one key every sentence holds. Its answer is in the bag of
      pairs under a fixed key: an average over the sentence holds it, in any order;
    * ``K?`` for the other keys: the value of the key the question names. Where it is depends on
      the question's own word, so no fixed weighting of the positions points at it. (The layer
      after an average can still learn the lookup from the bag of pairs, given a width that
      grows with the number of pairs, Arora et al. 2023: the experiment's claim is one of
      budget.)

    Every pair is tagged with its own value, so the model must also read a pair token.
    """
    g = torch.Generator().manual_seed(seed)
    others = torch.stack([1 + torch.randperm(n_keys - 1, generator=g)[:n_pairs - 1]
                          for _ in range(n)])  # (n, P - 1) distinct keys other than 0
    keys = torch.cat([torch.zeros(n, 1, dtype=torch.long), others], dim=1)  # (n, P)
    order = torch.stack([torch.randperm(n_pairs, generator=g) for _ in range(n)])  # (n, P)
    keys = keys.gather(1, order)  # key 0 at a random place
    values = torch.randint(0, n_values, (n, n_pairs), generator=g)  # (n, P)
    question = n_keys * n_values  # the question on key k is question + k
    last = question + n_keys
    slots = torch.stack([torch.randperm(n_pairs, generator=g) for _ in range(n)])  # (n, P)
    named = slots[keys.gather(1, slots) != 0].view(n, n_pairs - 1)[:, :n_named]  # not key 0
    key0 = (keys == 0).long().argmax(dim=1, keepdim=True)  # (n, 1) where key 0 is
    tokens = torch.cat([keys * n_values + values, torch.full((n, 1), last),
                        torch.full((n, 1), question), question + keys.gather(1, named)], dim=1)
    tags = torch.cat([values, values[:, -1:], values.gather(1, key0), values.gather(1, named)],
                     dim=1)  # (n, P + 2 + n_named)
    return RecallData(tokens, tags, last + 1, n_values, n_pairs, n_keys, n_values)


@torch.no_grad()
def recall_accuracy(model: nn.Module, data: RecallData) -> dict[str, float]:
    """The share of each kind of question (``RecallData.QUESTIONS``) the model answers right."""
    device = next(model.parameters(), data.tokens).device
    right = model(data.tokens.to(device)).argmax(dim=-1).cpu() == data.tags  # (N, T)
    return {q: right[:, data.columns(q)].float().mean().item() for q in data.QUESTIONS}

class WindowTagger(nn.Module):
    """A fully-connected layer over each token and its ``window`` neighbours on either side.

    With ``window=0`` this is the per-token FC layer that gives both "saw"s the same tag. The
    first layer has ``(2 * window + 1) * d`` inputs: parameters grow linearly with the window.
    Sliding that layer along the sequence is a convolution of width ``2 * window + 1``, which is
    how the forward pass computes it (the same numbers as concatenating each window, faster).
    """

    def __init__(self, vocab_size: int, n_tags: int, d: int = 16, window: int = 2,
                 hidden: int = 64) -> None:
        super().__init__()
        self.window = window
        self.embed = nn.Embedding(vocab_size, d)
        self.mlp = nn.Sequential(nn.Linear((2 * window + 1) * d, hidden), nn.ReLU(),
                                 nn.Linear(hidden, n_tags))

    def forward(self, tokens: Tensor) -> Tensor:
        w = self.window
        first, rest = cast(nn.Linear, self.mlp[0]), self.mlp[1:]
        x = self.embed(tokens).transpose(1, 2)  # (B, d, T): channels first for conv1d
        # the first layer's weight (hidden, (2w + 1) * d), read as one kernel per window slot
        kernel = first.weight.view(first.out_features, 2 * w + 1, -1).transpose(1, 2)
        h = F.conv1d(x, kernel, first.bias, padding=w)  # (B, hidden, T): zeros beyond the ends
        return rest(h.transpose(1, 2))  # (B, T, n_tags)


class CNNTagger(nn.Module):
    """``n_layers`` 1-D convolutions of width ``kernel``: each token sees ``n_layers * (kernel // 2)``
    neighbours on either side (the receptive field), and no further."""

    def __init__(self, vocab_size: int, n_tags: int, d: int = 32, kernel: int = 5,
                 n_layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d)
        self.convs = nn.ModuleList(nn.Conv1d(d, d, kernel, padding=kernel // 2)
                                   for _ in range(n_layers))
        self.out = nn.Linear(d, n_tags)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens).transpose(1, 2)  # (B, d, T): channels first for Conv1d
        for conv in self.convs:
            x = F.relu(conv(x))  # (B, d, T)
        return self.out(x.transpose(1, 2))  # (B, T, n_tags)


class RNNTagger(nn.Module):
    """A bidirectional GRU: information travels one step at a time, in both directions."""

    def __init__(self, vocab_size: int, n_tags: int, d: int = 32, hidden: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d)
        self.rnn = nn.GRU(d, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, n_tags)

    def forward(self, tokens: Tensor) -> Tensor:
        h, _ = self.rnn(self.embed(tokens))  # (B, T, 2 * hidden)
        return self.out(h)  # (B, T, n_tags)


class MeanPoolTagger(nn.Module):
    """The control for attention: the same layer shape, with every attention weight equal.

    Each token adds the **average** of every token's value vector (uniform weights ``1 / T``, a
    bag of words that sees the whole sequence but neither order nor which token matters), then
    the same residual and MLP as :class:`AttentionTagger`. What attention adds over this is
    weights that depend on the content and the positions.
    """

    def __init__(self, vocab_size: int, n_tags: int, d: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, n_tags))

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)  # (B, T, d)
        pooled = self.out_proj(self.v_proj(x).mean(dim=1, keepdim=True))  # (B, 1, d): uniform
        return self.mlp(x + pooled)  # (B, T, n_tags)


class CausalMeanTagger(MeanPoolTagger):
    """The second control: :class:`MeanPoolTagger` with the average taken over the tokens at or
    before each token only (weights ``1 / (t + 1)`` on tokens ``0..t``, zero after).

    The same parameters as the mean-pool tagger, and no weight depends on the content: a fixed
    rule, "average the left". Where only the words before a token decide its tag, this rule is
    enough, so beating mean-pool there shows that a model uses *positions*, not that its weights
    depend on the words.
    """

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)  # (B, T, d)
        v = self.v_proj(x)  # (B, T, d)
        count = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)  # (T,)
        pooled = self.out_proj(v.cumsum(dim=1) / count[:, None])  # (B, T, d): left average
        return self.mlp(x + pooled)  # (B, T, n_tags)



class DecayTagger(MeanPoolTagger):
    r"""The content-blind control for attention: every head averages the values with weights
    that depend on the distance only, a fixed recency decay with ALiBi's slopes (Press et al.
    2022, §3) and no $q \cdot k$ at all:

    $$w_{ij} = \operatorname{softmax}_j(-m_h\,|i - j|), \qquad m_h = 2^{-8h/H}$$

    (over ``j <= i`` when ``causal``). The same embedding, value and output projections, residual
    and MLP as :class:`MeanPoolTagger`: what attention adds over it is only that its weights
    read the content.
    """

    def __init__(self, vocab_size: int, n_tags: int, d: int = 32, n_heads: int = 8,
                 causal: bool = True) -> None:
        super().__init__(vocab_size, n_tags, d)
        self.n_heads, self.causal = n_heads, causal
        self.slopes: Tensor
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def weights(self, T: int) -> Tensor:
        """The fixed weights ``(H, T, T)``."""
        i = torch.arange(T, device=self.slopes.device)
        distance = (i[:, None] - i[None, :]).abs()  # (T, T)
        scores = -self.slopes[:, None, None] * distance  # (H, T, T)
        if self.causal:
            scores = scores.masked_fill(i[None, :] > i[:, None], float("-inf"))
        return scores.softmax(dim=-1)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens)  # (B, T, d)
        B, T, d = x.shape
        v = self.v_proj(x).view(B, T, self.n_heads, -1).transpose(1, 2)  # (B, H, T, hd)
        pooled = (self.weights(T) @ v).transpose(1, 2).reshape(B, T, d)  # (B, T, d)
        return self.mlp(x + self.out_proj(pooled))  # (B, T, n_tags)

POSITIONS = ("none", "sinusoidal", "learned", "rope", "alibi")


class AttentionTagger(nn.Module):
    """Embedding + positions, one self-attention layer with a residual, then an MLP.

    By default the layer is :class:`~selfattn.MultiHeadAttention` with ``n_heads`` query heads
    and ``n_kv_heads`` key/value heads (MHA by default, GQA or MQA if given); with
    ``scorer`` (``"dot"``, ``"scaled_dot"`` or ``"additive"``) it is one head scored that way
    (:class:`~selfattn.scoring.ScoredSelfAttention`), so chapters can compare scorers.

    ``positions`` says how the model knows where a token is (chapter 5): ``"sinusoidal"`` or
    ``"learned"`` vectors added to the embeddings (up to ``max_len`` positions), ``"rope"``
    (queries and keys rotated), ``"alibi"`` (a distance penalty added to the scores), or
    ``"none"``. ``causal``: each token attends only to itself and the tokens before it.
    ``head_dim``: each head's width (default ``d // n_heads``; chapter 6 varies it).
    """

    def __init__(self, vocab_size: int, n_tags: int, d: int = 32, n_heads: int = 2,
                 max_len: int = 512, scorer: str | None = None,
                 n_kv_heads: int | None = None, positions: str = "sinusoidal",
                 causal: bool = False, head_dim: int | None = None) -> None:
        super().__init__()
        assert positions in POSITIONS, f"positions: one of {POSITIONS}"
        assert scorer is None or positions not in ("rope", "alibi"), "RoPE and ALiBi need the MHA layer"
        self.positions, self.causal, self.max_len = positions, causal, max_len
        self.n_heads = n_heads if scorer is None else 1  # a scorer's layer has one head
        self.attn: MultiHeadAttention | ScoredSelfAttention
        self.pe: Tensor  # the sinusoidal table, a buffer
        self.embed = nn.Embedding(vocab_size, d)
        if positions == "sinusoidal":
            self.register_buffer("pe", sinusoidal_encoding(max_len, d), persistent=False)
        elif positions == "learned":
            self.learned = LearnedPositionalEmbedding(max_len, d)
        if scorer is None:
            self.attn = MultiHeadAttention(d, n_heads, n_kv_heads=n_kv_heads,
                                           rope=positions == "rope", head_dim=head_dim)
        else:
            self.attn = ScoredSelfAttention(d, scorer)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, n_tags))

    def forward(self, tokens: Tensor, need_weights: bool = False,
                score_bias: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        r"""Logits ``(B, T, n_tags)``; with ``need_weights``, also the weights ``(B, H, T, T)``.

        ``score_bias``: a float tensor broadcastable to ``(B, H, T, T)`` added to the attention
        scores before the softmax. A zero bias that requires grad measures $\partial L / \partial s$,
        the gradient that reaches each score (:func:`selfattn.book.tagging.cue_report`).
        """
        T = tokens.shape[1]
        x = self.embed(tokens)  # (B, T, d)
        if self.positions == "sinusoidal":
            x = x + self.pe[:T]
        elif self.positions == "learned":
            x = x + self.learned(T)  # raises beyond max_len
        bias = None
        if self.positions == "alibi":
            bias = alibi_bias(self.n_heads, T, device=tokens.device)  # (H, T, T)
        if score_bias is not None:
            bias = score_bias if bias is None else bias + score_bias  # (B, H, T, T)
        a, weights = self.attn(x, attn_mask=bias, is_causal=self.causal,
                               need_weights=need_weights)  # (B, T, d), (B, H, T, T)
        logits = self.mlp(x + a)  # (B, T, n_tags)
        return (logits, weights) if need_weights else logits


RECALL_ARMS = ("window", "CNN", "mean-pool", "causal average", "fixed decay", "self-attention")
ANSWERED = 0.8  # a kind of question is answered when this share of it is right
FAILED = 0.5  # ... and failed below this
AVERAGES = ("mean-pool", "causal average", "fixed decay")  # the arms that average the words


def recall_taggers(vocab_size: int, n_tags: int) -> dict[str, Callable[[], nn.Module]]:
    """The arms of :func:`recall_experiment`, sized to about the same parameter count: five
    fixed weightings (a window, a CNN, the mean-pool and causal average controls, and the
    content-blind recency decay) and one self-attention layer, whose weights read the content.

    The window and the CNN reach the whole sentence of :func:`recall_task` (12 tokens) from
    every position: the window has 11 neighbours on each side, the CNN's two layers of width 13
    a receptive field of 12. So neither fails a question for want of reach
    (:func:`pairs_seen` measures it)."""
    V, C = vocab_size, n_tags
    return {
        "window": lambda: WindowTagger(V, C, d=12, window=11, hidden=27),
        "CNN": lambda: CNNTagger(V, C, d=16, kernel=13, n_layers=2),
        "mean-pool": lambda: MeanPoolTagger(V, C, d=32),
        "causal average": lambda: CausalMeanTagger(V, C, d=32),
        "fixed decay": lambda: DecayTagger(V, C, d=32),
        "self-attention": lambda: AttentionTagger(V, C, d=28, n_heads=2),
    }


@torch.no_grad()
def pairs_seen(model: nn.Module, data: RecallData) -> int:
    """How many of the pairs every question's output depends on (its reach over the pairs).

    Pair ``j`` counts for a question when replacing its token by another pair token (the next
    value of the same key) changes that question's scores in some sentence of ``data``. Returns
    the least count over the question columns: ``data.n_pairs`` when every question sees every
    pair.
    """
    device = next(model.parameters()).device
    tokens = data.tokens.to(device)
    asked = slice(data.n_pairs, tokens.shape[1])
    before = model(tokens)[:, asked]  # (N, Q, C)
    seen = torch.zeros(tokens.shape[1] - data.n_pairs, dtype=torch.long)  # (Q,)
    for j in range(data.n_pairs):
        changed = tokens.clone()
        key, value = changed[:, j] // data.n_values, changed[:, j] % data.n_values
        changed[:, j] = key * data.n_values + (value + 1) % data.n_values
        moved = (model(changed)[:, asked] != before).any(dim=-1).any(dim=0)  # (Q,)
        seen += moved.long().cpu()
    return int(seen.min())


@dataclass
class RecallResult:
    """What :func:`recall_experiment` measured: each arm's accuracy on each kind of question
    (``RecallData.QUESTIONS``), one value per seed."""

    seeds: list[int]
    parameters: dict[str, int]  # arm -> parameter count
    accuracy: dict[str, dict[str, list[float]]]  # arm -> question -> one value per seed
    chance: float  # 1 / n_values: a guess among the values
    example: list[str]  # a test sentence the best self-attention run answers right, one
    # of its heads looking hardest at the pair of every key a question names
    answers: list[str]  # its tags, as words ("-" on no question)
    budget: dict[str, Any]  # steps, batch size, learning rate: the same for every arm
    weights: Tensor | None = None  # (H, questions, T): the example's question rows
    weights_seed: int | None = None  # the seed of the self-attention run they come from
    found: float | None = None  # share of test sentences where, for every named key, one of
    # that run's heads gives the key's pair its question's largest weight
    seen: dict[str, int] | None = None  # arm -> pairs every question sees (:func:`pairs_seen`)
    n_pairs: int = 8  # pairs per sentence

    @property
    def fixed(self) -> list[str]:
        """The arms whose weights do not read the content."""
        return [arm for arm in self.accuracy if arm != "self-attention"]

    def answered(self, arm: str, question: str) -> list[bool]:
        """Per seed: did the arm answer this kind of question (at least :data:`ANSWERED`)?"""
        return [a >= ANSWERED for a in self.accuracy[arm][question]]

    def failed(self, arm: str, question: str) -> list[bool]:
        """Per seed: did the arm fail this kind of question (below :data:`FAILED`)?"""
        return [a < FAILED for a in self.accuracy[arm][question]]

    def above_guess(self, arm: str, question: str = "named") -> list[bool]:
        """Per seed: did the arm score clearly above a guess (half as much again)?"""
        return [a > 1.5 * self.chance for a in self.accuracy[arm][question]]

    def headline(self) -> str:
        """The chapter's measured sentence."""
        att = k_of_n(self.answered("self-attention", "named"), self.seeds)
        any_fixed = sum(any(self.answered(arm, "named")) for arm in self.fixed)
        best = max(max(self.accuracy[arm]["named"]) for arm in self.fixed)
        fixed = ("at the same budget, no fixed weighting does in any" if any_fixed == 0 else
                 f"{any_fixed} of {len(self.fixed)} fixed weightings do in some seeds")
        return (f"self-attention answers the named key in {att};\n"
                f"{fixed} (their best run: {best:.0%}; a guess: {self.chance:.0%})")

    def controls(self) -> list[str]:
        """Per fixed arm: the question it answers, counted, and the named key, failed."""
        lines = []
        for arm in self.fixed:
            good = max(("last", "key 0"), key=lambda q: sum(self.answered(arm, q)))
            lines.append(f"{arm:15s} answers '{good}' in {k_of_n(self.answered(arm, good), self.seeds)}")
            lines.append(f"{'':15s} fails 'named' in {k_of_n(self.failed(arm, 'named'), self.seeds)}")
            if arm in AVERAGES:  # their MLP starts the lookup from the bag
                above = k_of_n(self.above_guess(arm), self.seeds)
                lines.append(f"{'':15s} beats a guess by half on 'named' in {above}")
        return lines

    def reach(self) -> list[str]:
        """Per arm: how many pairs every question sees, before training (:func:`pairs_seen`)."""
        seen = self.seen or {}
        return [f"{arm:15s} every question sees {n} of {self.n_pairs} pairs"
                for arm, n in seen.items()]

    def table(self, question: str) -> str:
        """Every arm's accuracy on one kind of question, seed by seed."""
        rows = {arm: acc[question] for arm, acc in self.accuracy.items()}
        return seed_rows(rows, self.seeds, f"accuracy on '{question}'", fmt="{:.0%}")

    def check(self) -> None:
        """The experiment's conclusions, with a margin a fresh seed range also passes."""
        n = len(self.seeds)
        assert sum(self.answered("self-attention", "named")) >= n - 2
        for arm in self.fixed:  # at this budget, no fixed weighting answers the named key
            assert all(self.failed(arm, "named")), arm
        for arm in ("window", "CNN"):  # the positive controls: positions only
            assert sum(self.answered(arm, "last")) >= n - 1, arm
        for arm in AVERAGES:  # a fixed key: a bag
            assert sum(self.answered(arm, "key 0")) >= n - 1, arm
            # and their MLP starts the lookup from the bag: above a guess on the named key
            assert sum(self.above_guess(arm)) >= n - 1, arm
        for arm, pairs in (self.seen or {}).items():  # no arm fails for want of reach
            assert pairs == self.n_pairs, (arm, pairs)
        spread = max(self.parameters.values()) / min(self.parameters.values())
        assert spread < 1.1, self.parameters  # the same budget, within a tenth


def recall_experiment(device: torch.device | str = "cpu", steps: int = 400,
                      batch_size: int = 32, lr: float = 5e-3,
                      progress: bool = True) -> RecallResult:
    """Chapter 1's thesis: the arms of :func:`recall_taggers`, each trained from the seeds of
    :func:`~selfattn.book.kit.train.seed_range` on the same data of :func:`recall_task`, with
    the same steps, batch size and learning rate, and tested on new sentences.

    Only an arm whose weights read the content can answer ``named`` (which value did the key the
    question names get?); each fixed weighting answers one of the two controls, ``last``
    (positions only: a window or a CNN) or ``key 0`` (a fixed key: an average), so its failure
    on ``named`` is the task's, not its training's.
    """
    seeds = list(seed_range())
    data = recall_task(4000, seed=data_seed(4))
    test = recall_task(1000, seed=data_seed(5))
    accuracy: dict[str, dict[str, list[float]]] = {}
    parameters = {}
    seen = {}
    attention: list[nn.Module] = []
    for arm, build in recall_taggers(data.vocab_size, data.n_tags).items():
        def make(b: Callable[[], nn.Module] = build) -> nn.Module:
            return b().to(device)

        models, _ = train_seeds(make, data, seeds=seeds,
                                steps=steps, batch_size=batch_size, lr=lr,
                                progress=progress, desc=arm)
        parameters[arm] = count_parameters(models[0])
        torch.manual_seed(seeds[0])
        few = replace(test, tokens=test.tokens[:100], tags=test.tags[:100])
        seen[arm] = pairs_seen(make(), few)  # untrained: what its shape lets it see
        runs = [recall_accuracy(m, test) for m in models]
        accuracy[arm] = {q: [r[q] for r in runs] for q in test.QUESTIONS}
        attention = models if arm == "self-attention" else attention
    best = max(range(len(seeds)), key=lambda i: accuracy["self-attention"]["named"][i])
    with torch.no_grad():  # the example: the first test sentence the best run answers right
        logits, w = attention[best](test.tokens.to(device), need_weights=True)  # (N, H, T, T)
    right = (logits.argmax(-1).cpu() == test.tags)[:, test.n_pairs:].all(dim=1)  # (N,)
    asked = test.columns("named")
    keys = test.tokens[:, :test.n_pairs] // test.n_values  # (N, P)
    named = test.tokens[:, asked] - test.n_keys * test.n_values  # (N, Q): the keys asked
    at = (keys[:, None, :] == named[:, :, None]).long().argmax(-1)  # (N, Q): their pairs
    top = w[:, :, asked].argmax(-1).cpu()  # (N, H, Q): where each head looks most
    found = (top == at[:, None]).any(dim=1).all(dim=1)  # (N,): a head finds every pair
    i = int((right & found).long().argmax())
    words = test.words(i)
    answers = ["-"] * test.n_pairs + [str(v) for v in test.tags[i, test.n_pairs:].tolist()]
    result = RecallResult(seeds, parameters, accuracy, 1 / test.n_values, words, answers,
                          {"steps": steps, "batch_size": batch_size, "lr": lr})
    result.weights, result.weights_seed = w[i, :, test.n_pairs:].cpu(), seeds[best]
    result.found = found.float().mean().item()
    result.seen, result.n_pairs = seen, test.n_pairs
    return result


def plot_recall(result: RecallResult) -> Any:
    """One bar per arm and kind of question: the mean over the seeds, and a line from the
    lowest seed to the highest; a dotted line at a guess. Returns the figure."""
    import matplotlib.pyplot as plt

    from .kit.draw import color

    labels = {"last": "last?\n(positions)", "key 0": "A?\n(a fixed key)",
              "named": "K?\n(the key named)"}
    arms = list(result.accuracy)
    fig, ax = plt.subplots(figsize=(6.8, 3.4), layout="constrained")
    width = 0.8 / len(arms)
    for j, arm in enumerate(arms):
        for i, q in enumerate(labels):
            runs = result.accuracy[arm][q]
            mean = sum(runs) / len(runs)
            x = i + (j - (len(arms) - 1) / 2) * width
            ax.bar(x, mean, width, color=color(arm), label=arm if i == 0 else None)
            ax.plot([x, x], [min(runs), max(runs)], color="black", lw=1)
    ax.axhline(result.chance, color="grey", ls=":", lw=1, label="a guess")
    ax.set_xticks(range(len(labels)), list(labels.values()))
    ax.set(ylabel="accuracy (new sentences)", ylim=(0, 1.05),
           title=f"Which value? Mean of {len(result.seeds)} seeds; line: lowest..highest")
    fig.legend(fontsize=8, loc="outside right center")
    return fig


@torch.no_grad()
def ambiguous_correct(model: nn.Module, data: TaggingData, batch_size: int = 512) -> Tensor:
    """Bool ``(N,)``: was the ambiguous word of each sequence tagged right?"""
    device = next(model.parameters()).device
    model.eval()
    out = []
    for start in range(0, len(data), batch_size):
        tokens = data.tokens[start : start + batch_size].to(device)
        pred = model(tokens).argmax(-1).cpu()  # (b, T)
        rows = torch.arange(pred.shape[0])
        pos = data.position[start : start + batch_size]
        out.append(pred[rows, pos] == data.tags[start : start + batch_size][rows, pos])
    return torch.cat(out)


def accuracy_by_distance(model: nn.Module, data: TaggingData) -> dict[int, float]:
    """Accuracy on the ambiguous word, for each cue distance present in ``data``."""
    correct = ambiguous_correct(model, data).float()
    return {int(k): correct[data.distance == k].mean().item() for k in data.distance.unique()}


def influence(layer: Callable[[Tensor], Tensor], x: Tensor, t: int) -> Tensor:
    """Bool ``(T,)``: which input positions of ``x`` (B, T, d) change output position ``t``.

    Measured with autograd: position ``j`` counts when the gradient of output ``t`` with respect
    to input ``j`` is not zero. This is a layer's receptive field, seen from position ``t``.
    """
    x = x.detach().requires_grad_(True)
    out = layer(x)  # (B, T, d_out)
    (grad,) = torch.autograd.grad(out[:, t].sum(), x)
    return grad.abs().sum(dim=(0, 2)) > 0  # (T,)


def gradient_by_distance(layer: Callable[[Tensor], Tensor], x: Tensor, t: int) -> Tensor:
    r"""``(T,)``: how strongly output position ``t`` depends on each input position ``s`` of
    ``x`` (B, T, d): the norm $\lVert \partial y_t / \partial x_s \rVert$ of the Jacobian block
    (the ``d_out x d`` matrix of every output number at ``t`` against every input number at
    ``s``, over the batch), measured with autograd, one backward pass per output number.

    :func:`influence` says whether this is zero; this says how big it is, so it shows a
    gradient that fades with distance (a recurrent layer) or stays (attention).
    """
    x = x.detach().requires_grad_(True)
    out = layer(x)[:, t]  # (B, d_out)
    total = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)  # (T,)
    for i in range(out.shape[-1]):
        (grad,) = torch.autograd.grad(out[:, i].sum(), x, retain_graph=True)  # (B, T, d)
        total += grad.pow(2).sum(dim=(0, 2))
    return total.sqrt()


@dataclass
class CueReport:
    """What one attention tagger does with each cue of the distance-cue task, per cue ``c1..``:
    how much weight the ambiguous word gives it, how often it wins that row, how often the word
    is tagged right, and the gradient that reaches its attention score."""

    weight: Tensor  # (n_cues,): mean weight on the cue, the head that gives it the most
    wins: Tensor  # (n_cues,): share of sentences where the cue gets the row's largest weight
    accuracy: Tensor  # (n_cues,): share of sentences whose ambiguous word is tagged right
    score_grad: Tensor  # (n_cues,): mean |dL/ds| at the cue's score, the largest over heads
    loss: Tensor  # (n_cues,): mean cross-entropy on the ambiguous word (nats)
    decoy_weight: float  # mean weight on the decoys after the word (the head that gives most)


def cue_report(model: AttentionTagger, task: TaggingData) -> CueReport:
    r"""Break one attention tagger's behaviour on a :func:`~selfattn.book.tagging.tagging_task`
    down by the cue of each sentence (the tagger returns its weights with ``need_weights``).

    The score gradient is measured with autograd, through a zero ``score_bias`` added to the
    scores, for the training loss summed over the test sentences. The softmax's Jacobian says
    what to expect: with $a = \mathrm{softmax}(s)$ and $g_j = \partial L / \partial a_j$,
    $\partial L / \partial s_j = a_j (g_j - \bar g)$, $\bar g = \sum_k a_k g_k$, so a key with
    $a_j \approx 0$ gets almost no gradient, whatever $g_j$ is: a cue the model ignores stays
    ignored.
    """
    import torch.nn.functional as F

    tokens, tags = task.tokens, task.tags
    position, cue_at, n_cues = task.position, task.cue_position, task.n_cues
    device = next(model.parameters()).device
    model.eval()
    N, T = tokens.shape
    H = model.n_heads
    bias = torch.zeros(N, H, T, T, device=device, requires_grad=True)  # (N, H, T, T)
    logits, w = model(tokens.to(device), need_weights=True, score_bias=bias)
    loss = F.cross_entropy(logits.flatten(0, 1), tags.to(device).flatten(), reduction="sum")
    (ds,) = torch.autograd.grad(loss, bias)  # (N, H, T, T): dL/ds
    rows = torch.arange(N)
    a = w.detach()[rows, :, position].cpu()  # (N, H, T): the ambiguous word's rows
    on_cue = a[rows, :, cue_at]  # (N, H)
    grad_cue = ds[rows, :, position].cpu()[rows, :, cue_at].abs()  # (N, H)
    won = a.mean(1).argmax(-1) == cue_at  # (N,)
    right = logits.detach().argmax(-1).cpu()[rows, position] == tags[rows, position]  # (N,)
    cue = tokens[rows, cue_at]  # (N,): 1..n_cues
    word_loss = F.cross_entropy(logits.detach()[rows, position].cpu(), tags[rows, position],
                                reduction="none")  # (N,)
    after = torch.arange(T) > position[:, None]  # (N, T): the words after the ambiguous one
    decoys = after & (tokens >= 1) & (tokens <= n_cues)  # (N, T)
    per_head = (a * decoys[:, None]).sum(-1).sum(0) / decoys.sum().clamp(min=1)  # (H,)
    out = {k: torch.zeros(n_cues) for k in ("weight", "wins", "accuracy", "score_grad", "loss")}
    for c in range(1, n_cues + 1):
        mine = cue == c
        out["weight"][c - 1] = on_cue[mine].mean(0).max()
        out["wins"][c - 1] = won[mine].float().mean()
        out["accuracy"][c - 1] = right[mine].float().mean()
        out["score_grad"][c - 1] = grad_cue[mine].mean(0).max()
        out["loss"][c - 1] = word_loss[mine].mean()
    return CueReport(**out, decoy_weight=per_head.max().item())


def default_sense(model: nn.Module, task: TaggingData, filler: int | None = None) -> Tensor:
    """The sense a tagger gives the ambiguous word of a
    :func:`~selfattn.book.tagging.tagging_task` when its cue is gone: the cue of every sentence is
    replaced by a filler word (``filler``, default the first one, ``n_cues + 1``) and the share
    of sentences in which the word gets each sense is returned, ``(n_cues,)``. A tagger that
    tells one cue by elimination ("none of the others") gives that cue's sense here; any
    classifier falls back to some default when its evidence is removed, so read it against the
    cue the tagger ignores."""
    tokens, position = task.tokens.clone(), task.position
    cue_at, n_cues = task.cue_position, task.n_cues
    rows = torch.arange(len(tokens))
    tokens[rows, cue_at] = n_cues + 1 if filler is None else filler  # (N, T): no cue left
    device = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        guess = model(tokens.to(device)).argmax(-1).cpu()[rows, position]  # (N,)
    return torch.stack([(guess == c).float().mean() for c in range(n_cues)])


def window_parameters(window: int, d: int, hidden: int, n_tags: int, vocab_size: int) -> int:
    """Chapter 1, exercise 1: the parameters of a :class:`WindowTagger`, counted on the module."""
    return count_parameters(WindowTagger(vocab_size, n_tags, d=d, window=window, hidden=hidden))


def measured_reach(n_layers: int, kernel: int) -> int:
    """Chapter 1, exercise 2: how many positions to each side a :class:`CNNTagger`'s convolutions
    see, measured (:func:`influence`) at the middle of 61 tokens; the global random state is left
    as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = CNNTagger(10, 3, d=4, kernel=kernel, n_layers=n_layers)
        x = model.embed(torch.randint(0, 10, (1, 61)))  # (1, T, d)

    def layers(h: Tensor) -> Tensor:  # the convolutions alone: a ReLU never widens the reach
        h = h.transpose(1, 2)  # (B, d, T)
        for conv in model.convs:
            h = conv(h)
        return h.transpose(1, 2)

    return int(influence(layers, x, t=30).sum().item() - 1) // 2


@_checker
def check_window_parameters(fn: object) -> str:
    """Chapter 1, exercise 1: ``fn(window, d, hidden, n_tags, vocab_size)`` counts the parameters
    of a :class:`~selfattn.book.tagging.WindowTagger`."""
    same_as(fn, window_parameters, [(0, 8, 16, 5, 20), (3, 16, 64, 12, 32), (10, 4, 7, 3, 9)],
            "for {args}: you say {got!r}, the model has {want}",
            names=("window", "d", "hidden", "n_tags", "vocab_size"))
    return "embedding + first layer ((2w+1)*d*hidden + hidden) + output layer"


@_checker
def check_cnn_reach(fn: object) -> str:
    """Chapter 1, exercise 2: ``fn(n_layers, kernel)`` is how many positions to each side a
    :class:`~selfattn.book.tagging.CNNTagger` sees, checked against the measured receptive field."""
    same_as(fn, measured_reach, [(1, 3), (2, 5), (3, 3), (4, 7)],
            "{n_layers} layers of width {kernel}: you say {got!r}, the measured reach is {want} on "
            "each side", names=("n_layers", "kernel"))
    return "each layer adds kernel // 2 positions on each side"
