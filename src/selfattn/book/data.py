"""Synthetic tasks, generated from a seed: small enough to train on a CPU in seconds.

The tagging task of chapter 1 makes "context at a distance" measurable. Every sequence holds one
ambiguous word (think of the two "saw"s of "I saw a saw") whose tag is fixed by a single cue word
``distance`` positions to its left: after cue ``c`` the ambiguous word takes sense ``c`` (after a
determiner "saw" is a noun, after a pronoun a verb; the task has ``n_cues`` such senses). Every
other word's tag is fixed by the word alone. A tagger that cannot see ``distance`` tokens back can
do no better than chance, ``1 / n_cues``, on the ambiguous word.

Token ids: ``0`` is the ambiguous word, ``1..n_cues`` the cues, the rest fillers.
Tag ids: ``0..n_cues-1`` the ambiguous word's senses, ``n_cues..2*n_cues-1`` the cues' own tags,
then ``n_filler_tags`` tags for the fillers (filler ``w`` gets ``2*n_cues + w % n_filler_tags``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..checks import check_positive_int

AMBIGUOUS = 0


@dataclass(frozen=True)
class Sequences:
    """Token ids and one tag per token: what the taggers train on."""

    tokens: Tensor  # (N, T) token ids
    tags: Tensor  # (N, T) tag ids
    vocab_size: int
    n_tags: int

    def __len__(self) -> int:
        return self.tokens.shape[0]


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
    check_positive_int(n, "n")
    check_positive_int(seq_len, "seq_len")
    check_positive_int(n_cues, "n_cues")
    check_positive_int(n_filler_tags, "n_filler_tags")
    if isinstance(decoys, bool) or not isinstance(decoys, int) or decoys < 0:
        raise ValueError(f"decoys must be a non-negative int, got {decoys!r}")
    if decoys and n_cues < 2:
        raise ValueError("decoys need at least two cue words (a decoy differs from the cue)")
    longest = seq_len - 1 - decoys  # leave room for the decoys after the ambiguous word
    max_distance = longest if max_distance is None else max_distance
    if not 1 <= min_distance <= max_distance <= longest:
        raise ValueError(
            f"need 1 <= min_distance <= max_distance <= seq_len - 1 - decoys = {longest}, got "
            f"min_distance={min_distance}, max_distance={max_distance}, seq_len={seq_len}, "
            f"decoys={decoys}"
        )
    first_filler = n_cues + 1
    if vocab_size <= first_filler:
        raise ValueError(f"vocab_size must exceed 1 + n_cues = {first_filler}, got {vocab_size}")
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


def neighbour_task(n: int, seq_len: int = 16, vocab_size: int = 6, seed: int = 0) -> Sequences:
    """Tag every token with the pair (left neighbour, right neighbour).

    The tag of position ``t`` is ``left * (vocab_size + 1) + right``, where ``left`` is the token
    at ``t - 1`` and ``right`` the token at ``t + 1`` (``vocab_size`` stands for "no neighbour"
    at either end). One attention head can look left and another right: chapter 6 trains
    models with one, two and four heads on it and watches the heads specialise.
    """
    check_positive_int(n, "n")
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2, got {seq_len}")
    check_positive_int(vocab_size, "vocab_size")
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (n, seq_len), generator=g)  # (N, T)
    edge = torch.full((n, 1), vocab_size)
    left = torch.cat([edge, tokens[:, :-1]], dim=1)  # (N, T): the token before, or the edge
    right = torch.cat([tokens[:, 1:], edge], dim=1)  # (N, T): the token after, or the edge
    tags = left * (vocab_size + 1) + right
    return Sequences(tokens, tags, vocab_size, (vocab_size + 1) ** 2)


def recent_cue_task(n: int, seq_len: int = 32, n_cues: int = 4, cue_rate: float = 0.2,
                    vocab_size: int = 16, seed: int = 0) -> Sequences:
    """Tag every token with the most recent cue at or before it: a task about order.

    Tokens ``1..n_cues`` are cues (each position is a cue with probability ``cue_rate``), the
    rest fillers. The tag of position ``t`` is ``c - 1`` for the last cue ``c`` in tokens
    ``0..t``, or ``n_cues`` ("no cue yet"). Which cue is the *latest* depends only on relative
    order, so the rule is the same at every length: chapter 5 trains at one length and tests at
    longer ones. Without positions, attention sees the set of earlier cues but not their order.
    """
    check_positive_int(n, "n")
    check_positive_int(seq_len, "seq_len")
    check_positive_int(n_cues, "n_cues")
    if not 0.0 < cue_rate < 1.0:
        raise ValueError(f"cue_rate must be in (0, 1), got {cue_rate}")
    if vocab_size <= n_cues + 1:
        raise ValueError(f"vocab_size must exceed 1 + n_cues = {n_cues + 1}, got {vocab_size}")
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(n_cues + 1, vocab_size, (n, seq_len), generator=g)  # (N, T) fillers
    is_cue = torch.rand(n, seq_len, generator=g) < cue_rate  # (N, T)
    cues = torch.randint(1, n_cues + 1, (n, seq_len), generator=g)  # (N, T)
    tokens = torch.where(is_cue, cues, tokens)
    # index of the latest cue at or before t (-1 if none): a running max over cue positions
    where = torch.where(is_cue, torch.arange(seq_len), -1)  # (N, T)
    latest = where.cummax(dim=1).values  # (N, T)
    last_cue = tokens.gather(1, latest.clamp(min=0))  # (N, T)
    tags = torch.where(latest >= 0, last_cue - 1, n_cues)  # (N, T)
    return Sequences(tokens, tags, vocab_size, n_cues + 1)


def order_blind_accuracy(task: Sequences) -> float:
    """The best accuracy on ``task``, made by :func:`recent_cue_task`, of a tagger that knows
    which cues came before each token, and how often, but not in what order (the ceiling for a
    model without positions). The task's cues are read from it: ``n_cues = task.n_tags - 1``.

    A cue tags itself and a token before the first cue is tagged "none", both always right;
    otherwise the most recent cue is any earlier cue with a chance proportional to how often it
    occurred, so the best guess is the most frequent one, right with probability
    (its count) / (cues so far). Returns the expected accuracy over every token of ``task``.
    """
    tokens, n_cues = task.tokens, task.n_tags - 1  # tags: one per cue, then "no cue yet"
    is_cue = (tokens >= 1) & (tokens <= n_cues)  # (N, T)
    counts = torch.stack([((tokens == c) & is_cue).cumsum(1) for c in range(1, n_cues + 1)])
    seen = counts.sum(0)  # (N, T): cues at or before t
    best = counts.max(0).values  # (N, T): the most frequent one's count
    p_right = torch.where(is_cue | (seen == 0), 1.0, best / seen.clamp(min=1))
    return p_right.mean().item()


BOS = 0
"""The token that opens every sequence of :func:`sink_task` (with ``bos=True``)."""


@dataclass(frozen=True)
class SinkData(Sequences):
    """A batch of the sink task (:func:`sink_task`)."""

    trigger: Tensor  # (N, T) bool: a trigger at t >= lag, tagged with the token lag back
    lag: int
    n_triggers: int
    bos: bool  # does position 0 hold BOS (True), or an ordinary random token (False)?


def sink_task(n: int, seq_len: int = 32, vocab_size: int = 16, n_triggers: int = 6, lag: int = 2,
              n_filler_tags: int = 4, bos: bool = True, seed: int = 0) -> SinkData:
    """A task where a causal head has, most of the time, nothing useful to attend to.

    Position 0 holds :data:`BOS`; every other token is drawn uniformly from ``1..vocab_size-1``.
    Tokens ``1..n_triggers`` are *triggers*: a trigger at ``t >= lag`` is tagged with the token
    ``lag`` positions back (tag ``c`` for token ``c``, a copy). Every other token is tagged by
    itself alone, ``vocab_size + token % n_filler_tags``. So a head must look back ``lag``
    tokens from a trigger, and has nothing to fetch from any other token. This is a tagging
    version of the Bigram-Backcopy task of Guo et al. (2024, "Active-Dormant Attention Heads",
    §2), where a one-layer model's head parks on BOS whenever it has nothing to do (there the
    trigger copies the previous token and the other tokens follow a bigram model; here the
    copy is ``lag`` back and the tokens are uniform). Everything a tag depends on lies within
    ``lag + 1`` tokens: a window of recent tokens holds all the information.

    ``bos=False``: position 0 holds an ordinary random token instead, and every other token is
    what the same ``seed`` gives with BOS (the control that separates "the first position" from
    "the BOS token"). ``trigger`` marks the triggers at ``t >= lag``. The same seed always gives
    the same data.
    """
    check_positive_int(n, "n")
    check_positive_int(seq_len, "seq_len")
    check_positive_int(vocab_size, "vocab_size")
    check_positive_int(n_filler_tags, "n_filler_tags")
    if isinstance(lag, bool) or not isinstance(lag, int) or not 1 <= lag < seq_len:
        raise ValueError(f"need 1 <= lag < seq_len, got lag={lag!r}, seq_len={seq_len!r}")
    if isinstance(n_triggers, bool) or not isinstance(n_triggers, int) \
            or not 1 <= n_triggers <= vocab_size - 2:
        raise ValueError(f"need 1 <= n_triggers <= vocab_size - 2 = {vocab_size - 2} (BOS, the "
                         f"triggers and at least one ordinary token), got n_triggers={n_triggers!r}")
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab_size, (n, seq_len), generator=g)  # (N, T)
    if bos:
        tokens[:, 0] = BOS
    trigger = (tokens >= 1) & (tokens <= n_triggers)  # (N, T): BOS is never a trigger
    trigger[:, :lag] = False  # nothing lag back to copy
    back = torch.roll(tokens, lag, dims=1)  # (N, T): the token lag back (wrapped where t < lag)
    tags = torch.where(trigger, back, vocab_size + tokens % n_filler_tags)  # (N, T)
    return SinkData(tokens, tags, vocab_size, vocab_size + n_filler_tags, trigger, lag, n_triggers,
                    bos)
