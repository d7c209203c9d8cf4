"""Chapter 11, decoding in practice: a tiny causal language model, caches against recomputing,
the block step, attention sinks beside a sliding window, the caches' diagrams (paged block
tables, rolling buffers, latent attention), and the chapter's checkers.

* :func:`latent_attention`: MLA's latent, up-projections and decoupled RoPE key.
* :func:`paged_block_table`: PagedAttention's block tables, each request's logical blocks onto
  one shared pool, drawn from a real :class:`~selfattn.cache.BlockPool` and one
  :class:`~selfattn.cache.PagedKVCache` per request.
* :func:`rolling_sink_buffer`: which position each slot of a :class:`~selfattn.cache.SinkCache`
  (and a :class:`~selfattn.cache.SlidingWindowCache`) holds after ``t`` tokens, read from its buffer.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, cast

import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch
from torch import Tensor, nn

from ..attention import scaled_dot_product_attention
from ..cache import BlockPool, Cache, KVCache, PagedKVCache, SinkCache, SlidingWindowCache
from ..heads import merge_heads, repeat_kv, split_heads
from ..latent import MultiHeadLatentAttention
from ..masks import causal_mask
from ..multihead import MultiHeadAttention
from ..positional import apply_rope
from .kit import draw
from .kit.checkers import NotYet, _call, _checker, _close, _equal, _number, _seeded_layer, _tensor
from .kit.draw import GREY, INK, MONO, OUT, Diagram, K, Q, V
from .kit.measure import decode_bytes, synchronize
from .kit.train import Sequences, train
from .kit.viz import PAGE_WIDTH
from .tagging import AttentionTagger, ambiguous_correct, tagging_task

BOS = 0


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


class DecoderBlock(nn.Module):
    r"""One pre-norm decoder block (GPT-2's order; Xiong et al. 2020, "On Layer Normalization in
    the Transformer Architecture", §3): attention and a feed-forward layer, each on a normalised
    copy of the stream, each added back to it:

    $$h = x + \operatorname{Attn}(\operatorname{LN}(x)), \qquad
    y = h + W_2\,\operatorname{GELU}(W_1 \operatorname{LN}(h))$$

    The attention is causal :class:`~selfattn.MultiHeadAttention` with RoPE and ``n_kv_heads``
    key/value heads (MHA, GQA or MQA); the feed-forward layer is ``ffn_hidden`` wide.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None,
                 ffn_hidden: int | None = None) -> None:
        super().__init__()
        ffn_hidden = 4 * d_model if ffn_hidden is None else ffn_hidden
        self.attn_norm = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads, rope=True)
        self.ffn_norm = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, ffn_hidden), nn.GELU(),
                                 nn.Linear(ffn_hidden, d_model))

    def forward(self, x: Tensor, cache: Cache | None = None) -> Tensor:
        """``x`` (B, T, d_model) -> (B, T, d_model); with ``cache``, the T tokens follow the
        ``cache.length`` tokens it holds, their keys and values are appended to it, and each
        attends causally to everything cached (the layer rotates them at their own positions)."""
        a, _ = self.attn(self.attn_norm(x), is_causal=True, kv_cache=cache)  # (B, T, d_model)
        h = x + a
        return h + self.ffn(self.ffn_norm(h))  # (B, T, d_model)


class TinyDecoder(nn.Module):
    r"""A small causal language model for chapter 11's decoding: token embedding, ``n_layers``
    pre-norm :class:`DecoderBlock`\ s (causal attention with RoPE, ``n_kv_heads`` key/value
    heads, a feed-forward layer ``ffn_hidden`` wide, default ``4 * d_model``), a final
    LayerNorm and a linear head to ``vocab_size`` logits (the decoder of Vaswani et al. 2017,
    §3.1, without the cross-attention, in GPT-2's pre-norm order; Radford et al. 2019, §2.3).

    Positions come only from RoPE, so the model has no maximum length, and a token's logits
    depend only on the tokens at and before it: decoding with a cache
    (:meth:`forward` with ``caches``) gives the logits of the full pass, token by token.
    """

    def __init__(self, vocab_size: int, d_model: int = 64, n_heads: int = 4, n_layers: int = 2,
                 n_kv_heads: int | None = None, ffn_hidden: int | None = None) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(DecoderBlock(d_model, n_heads, n_kv_heads, ffn_hidden)
                                    for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    def new_caches(self, make: type[Cache] | None = None, **kwargs: object) -> list[Cache]:
        """One empty cache per block, ``make(**kwargs)`` each (default :class:`~selfattn.cache.KVCache`,
        every token kept). A :class:`~selfattn.cache.PagedKVCache` takes the pool:
        ``new_caches(PagedKVCache, pool=pool)``; the blocks' caches may share one pool."""
        make = KVCache if make is None else make
        return [make(**kwargs) for _ in self.blocks]

    def forward(self, tokens: Tensor, caches: list[Cache] | None = None) -> Tensor:
        """Logits ``(B, T, vocab_size)`` for token ids ``tokens`` (B, T).

        ``caches``: one :class:`~selfattn.cache.Cache` per block (:meth:`new_caches`). The
        ``T`` tokens then follow the tokens the caches hold: each block appends their keys and
        values to its cache and they attend causally to everything cached, at positions
        ``cache.length, ...``. Without caches the tokens are a whole sequence from position 0.
        """
        x = self.embed(tokens)  # (B, T, d_model)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i])  # (B, T, d_model)
        return self.lm_head(self.norm(x))  # (B, T, vocab_size)


SINK_SHARE = 0.3


@torch.no_grad()
def cache_accuracy(model: torch.nn.Module, data, mask: Tensor, first_query: int = 0
                   ) -> dict[str, float]:
    r"""The accuracy of a causal tagger (``AttentionTagger(..., causal=True)``) on ``data`` (a
    :func:`~selfattn.book.decoding.sink_task` batch) when each query sees only the keys its KV cache
    still holds, over the queries ``first_query`` onwards.

    ``mask``: bool ``(T, T)``, True = the key is still in the cache, from
    :func:`selfattn.causal_mask` (``causal_mask(T)`` the full cache, ``causal_mask(T,
    window=w)`` window attention with the first tokens evicted, ``causal_mask(T, window=w,
    n_sink=s)`` StreamingLLM's cache: the first ``s`` tokens kept beside the window; Xiao et al.
    2023, "Efficient Streaming Language Models with Attention Sinks", §3.1-3.2, Figure 1). A
    key out of the cache gets score $-\infty$:

    $$\mathrm{acc} = \frac{1}{|Q|} \sum_{(b, t) \in Q} \big[\arg\max_c f(x_b;\, M)_{t, c} =
    y_{b, t}\big], \qquad a_{tj} = \operatorname{softmax}_j\big(s_{tj} + (0 \text{ if } M_{tj}
    \text{ else } -\infty)\big)$$

    With RoPE a score depends only on the distance between query and key, so masking a key out
    is evicting it from the cache, every other token keeping its position. Returns the accuracy
    over ``"all"`` those queries, the ``"trigger"`` queries and the ``"other"`` ones
    (``data.trigger``); NaN for a group with no query.
    """
    from ..masks import to_additive

    model.eval()
    device = next(model.parameters()).device
    logits = model(data.tokens.to(device), score_bias=to_additive(mask.to(device)))  # (B, T, n_tags)
    right = (logits.argmax(-1).cpu() == data.tags)[:, first_query:]  # (B, Q)
    trigger = data.trigger[:, first_query:]  # (B, Q)
    return {"all": _mean(right), "trigger": _mean(right[trigger]), "other": _mean(right[~trigger])}


def _mean(right: Tensor) -> float:
    return right.float().mean().item() if right.numel() else float("nan")


def first_token_share(weights: Tensor, first_query: int = 0, where: Tensor | None = None) -> Tensor:
    r"""``(H,)``: the mean weight each head puts on position 0 (the attention sink), over the
    queries at ``first_query`` onwards of every sequence, only those where ``where`` (bool
    ``(B, T)``) is True if given. ``weights``: ``(B, H, T, S)``, each query's weights over the keys.

    $$\text{share}_h = \frac{1}{|Q|} \sum_{(b, t) \in Q} a^{(h)}_{b, t, 0}$$

    Gu et al. (2024, "When Attention Sink Emerges in Language Models: An Empirical View", their
    sink metric) count a head as a sink when this share exceeds :data:`SINK_SHARE`. A head that spread its
    weight evenly over the keys up to each query would put ``1 / (t + 1)`` on position 0.
    """
    B, T = weights.shape[0], weights.shape[2]
    on_first = weights[:, :, first_query:, 0]  # (B, H, Q)
    chosen = torch.ones(B, T - first_query, dtype=torch.bool, device=weights.device)  # (B, Q)
    if where is not None:
        chosen = where[:, first_query:].to(weights.device)  # (B, Q)
    return (on_first * chosen[:, None, :]).sum(dim=(0, 2)) / chosen.sum()  # (H,)


@dataclass(frozen=True)
class SinkEval:
    """What evicting the first tokens does to one trained model (:func:`evaluate_sink`), over
    the queries ``window`` onwards (the first whose window leaves position 0 out).

    ``full``, ``window_only``, ``sink_window``: accuracy (``"all"``, ``"trigger"``, ``"other"``, as in
    :func:`cache_accuracy`) with the full cache, with the last ``window`` tokens only, and with
    the first ``n_sink`` tokens kept beside them. ``share_other``, ``share_trigger``: each head's
    mean weight on position 0 with the full cache (:func:`first_token_share`), on the queries
    that have nothing to fetch and on the triggers. ``share_uniform``: what a head that spread
    its weight evenly would put there, ``mean_t 1 / (t + 1)``.
    """

    window: int
    n_sink: int
    full: dict[str, float]
    window_only: dict[str, float]
    sink_window: dict[str, float]
    share_other: tuple[float, ...]
    share_trigger: tuple[float, ...]
    share_uniform: float

    @property
    def drop(self) -> float:
        """How much accuracy evicting the first tokens costs: full cache minus window only."""
        return self.full["all"] - self.window_only["all"]

    @property
    def gap(self) -> float:
        """How far sink + window stays from the full cache: full minus sink + window."""
        return self.full["all"] - self.sink_window["all"]

    @property
    def top_share(self) -> float:
        """The largest share on position 0 of any head, on the queries with nothing to fetch."""
        return max(self.share_other)

    @property
    def sink_heads(self) -> int:
        """Heads whose share on position 0, on the queries with nothing to fetch, exceeds
        :data:`SINK_SHARE`."""
        return sum(s > SINK_SHARE for s in self.share_other)


@dataclass(frozen=True)
class SinkRecord(SinkEval):
    """One seed of :func:`sink_experiment`: its :class:`SinkEval`, and the ``seed``, the arm
    (``bos``), the mean training ``loss`` over its last 20 steps, the trained ``model`` and the
    ``test`` data it was measured on (to measure it again, at another window, say)."""

    seed: int
    bos: bool
    loss: float
    model: torch.nn.Module = field(repr=False, compare=False)
    test: object = field(repr=False, compare=False)


@torch.no_grad()
def evaluate_sink(model: torch.nn.Module, test, window: int, n_sink: int = 1) -> SinkEval:
    """Measure one causal tagger trained on :func:`~selfattn.book.decoding.sink_task`: its accuracy
    with the full cache, with a window of the last ``window`` tokens (the first tokens
    evicted), and with the first ``n_sink`` tokens kept beside the window (Xiao et al. 2023,
    §3.2), over the queries ``window`` onwards, where the three caches differ; and each head's
    share of attention on position 0 with the full cache. See :class:`SinkEval`.

    Every token keeps its position (a RoPE score sees only the distance), the sink included.
    StreamingLLM numbers the tokens by their place in the cache instead, to stream past the
    length the model was trained on; within that length the window's distances are the same
    both ways, the sink's are not.
    """
    from ..masks import causal_mask

    T = test.tokens.shape[1]
    first = window  # the first query whose window leaves position 0 out
    caches = {"full": causal_mask(T), "window_only": causal_mask(T, window=window),
              "sink_window": causal_mask(T, window=window, n_sink=n_sink)}
    accuracy = {name: cache_accuracy(model, test, mask, first) for name, mask in caches.items()}
    device = next(model.parameters()).device
    _, weights = model(test.tokens.to(device), need_weights=True)  # (B, H, T, T)
    weights = weights.cpu()
    other = first_token_share(weights, first, ~test.trigger)  # (H,)
    trigger = first_token_share(weights, first, test.trigger)  # (H,)
    uniform = (1 / torch.arange(first + 1, T + 1, dtype=torch.float64)).mean().item()
    return SinkEval(window, n_sink, **accuracy, share_other=tuple(other.tolist()),
                    share_trigger=tuple(trigger.tolist()), share_uniform=uniform)


def sink_experiment(seeds: Sequence[int], data_seeds: tuple[int, int], *, window: int = 6,
                    n_sink: int = 1, seq_len: int = 32, vocab_size: int = 16, n_triggers: int = 6,
                    lag: int = 2, n_train: int = 2000, n_test: int = 500, d: int = 32,
                    n_heads: int = 2, steps: int = 250, batch_size: int = 16, lr: float = 1e-2,
                    progress: bool = True) -> dict[str, list[SinkRecord]]:
    """Do heads with nothing to do park on the first token, and what does evicting it do?

    Trains one one-layer causal ``AttentionTagger`` (RoPE, ``n_heads`` heads of width
    ``d // n_heads``) per seed on :func:`~selfattn.book.decoding.sink_task`, side by side with
    :func:`~selfattn.book.kit.train.train_seeds`, in two arms: ``"BOS"``, every sequence opening
    with the BOS token, and ``"control"``, the same sequences with an ordinary token at
    position 0 (``bos=False``). Then measures each model with :func:`evaluate_sink`: the full
    cache, window only, and sink + window.

    The hypothesis (Xiao et al. 2023, §3.1; Guo et al. 2024, §2): a head with nothing to fetch
    (every query but a trigger) puts its weight on BOS, whose value the rest of the model has
    learned to live with (Guo et al. find it small, a "value-state drain"); evict BOS and that
    weight lands on the tokens in the window, whose values were never meant to be added there,
    and the tags change (window only drops) though every token a tag depends on is still in the
    window (``window > lag``); keep BOS beside the window and the outputs come back (sink +
    window close to full). In the control nothing marks position 0 (RoPE scores see only
    distances, and the token there is an ordinary one), so no head can park there: evicting it
    should cost little. Whether it happens is for the records to say, seed by seed.

    ``seeds``: the initial weights and batches (``train.seed_range(10)`` in a chapter);
    ``data_seeds``: ``(training data, test data)`` (``train.data_seed(0)``,
    ``train.data_seed(1)``). Both arms train on the same seeds and data seeds. With the defaults,
    both arms' ten seeds train in about ten seconds on one CPU thread, and every seed of both
    arms learns the task with the full cache (on the ranges tried when they were chosen).

    Returns ``{"BOS": [...], "control": [...]}``, one :class:`SinkRecord` per seed in the order
    of ``seeds``; :func:`sink_columns` turns an arm into columns for :func:`seed_rows`.
    """
    from .kit.train import train_seeds
    from .tagging import AttentionTagger

    seeds = list(seeds)
    task = dict(seq_len=seq_len, vocab_size=vocab_size, n_triggers=n_triggers, lag=lag)
    results = {}
    for arm, bos in (("BOS", True), ("control", False)):
        train_data = sink_task(n_train, **task, bos=bos, seed=data_seeds[0])
        test = sink_task(n_test, **task, bos=bos, seed=data_seeds[1])

        def make(data=train_data) -> torch.nn.Module:
            return AttentionTagger(data.vocab_size, data.n_tags, d=d, n_heads=n_heads,
                                   causal=True, positions="rope")

        models, histories = train_seeds(make, train_data, seeds, steps=steps,
                                        batch_size=batch_size, lr=lr, progress=progress,
                                        desc=f"sink task, {arm}")
        results[arm] = [
            SinkRecord(**vars(evaluate_sink(model, test, window, n_sink)), seed=seed, bos=bos,
                       loss=statistics.fmean(history.loss[-20:]), model=model, test=test)
            for model, history, seed in zip(models, histories, seeds, strict=True)]
    return results


def sink_columns(records: Sequence[SinkEval]) -> dict[str, list[float]]:
    """One arm of :func:`sink_experiment` as columns for :func:`seed_rows` (or
    :func:`~selfattn.book.kit.train.seed_table`): the accuracy with the full cache, window only and
    sink + window, and the top head's share on position 0 on the queries with nothing to fetch,
    beside what an even spread would give."""
    return {"full cache": [r.full["all"] for r in records],
            "window only": [r.window_only["all"] for r in records],
            "sink+window": [r.sink_window["all"] for r in records],
            "top share": [r.top_share for r in records],
            "even share": [r.share_uniform for r in records]}


@dataclasses.dataclass(frozen=True)
class CacheRace:
    """What :func:`cache_vs_recompute` measured: greedy decoding of ``n_new`` tokens after a
    prompt of ``prompt_len``, by recomputing the whole prefix at every step and with KV caches.

    Step ``i`` computes new token ``i`` from the ``context[i] = prompt_len + i`` tokens known
    so far. Step 0 is the same pass over the prompt both ways (with caches, the prefill); from
    step 1 on, the recompute pass runs ``context[i]`` tokens through the model and the cached one
    a single token. Per step: the median wall time over the repeats (``*_ms``), the tokens run
    through the model (``*_tokens_run``), the (query, key) pairs each head of each layer scores
    (``*_pairs``) and the FLOPs (``*_flops``: twice the multiply-adds of the matrix products; the
    norms, softmax and GELU are not counted). ``recompute_generated`` and ``cached_generated``
    are the generated token ids, ``(B, n_new)``: the same, or caching changed the model's output.
    """

    prompt_len: int
    context: list[int]
    recompute_ms: list[float]
    cached_ms: list[float]
    recompute_generated: Tensor
    cached_generated: Tensor
    recompute_tokens_run: list[int]
    cached_tokens_run: list[int]
    recompute_pairs: list[int]
    cached_pairs: list[int]
    recompute_flops: list[int]
    cached_flops: list[int]
    repeats: int

    @property
    def same_tokens(self) -> bool:
        """Whether both ways generated the same tokens."""
        return torch.equal(self.recompute_generated, self.cached_generated)

    def growth(self, way: str) -> float:
        """How much slower a step of ``way`` (``"recompute"`` or ``"cached"``) is at the end than
        at the start: the median ms of the last quarter of steps over that of the first quarter
        (step 0, the prompt pass, left out)."""
        ms = self._ms(way)[1:]
        quarter = max(1, len(ms) // 4)
        return statistics.median(ms[-quarter:]) / statistics.median(ms[:quarter])

    def slope(self, way: str) -> float:
        """Milliseconds that one more token of context adds to a step of ``way``: the
        least-squares slope of ms against context (step 0 left out)."""
        x, y = self.context[1:], self._ms(way)[1:]
        mx, my = statistics.fmean(x), statistics.fmean(y)
        return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sum((a - mx) ** 2 for a in x)

    def totals(self) -> dict[str, dict[str, float]]:
        """Each way's sums over every step: ``ms``, ``tokens_run``, ``pairs``, ``flops``."""
        return {way: {"ms": sum(self._ms(way)),
                      "tokens_run": sum(getattr(self, f"{way}_tokens_run")),
                      "pairs": sum(getattr(self, f"{way}_pairs")),
                      "flops": sum(getattr(self, f"{way}_flops"))}
                for way in ("recompute", "cached")}

    def _ms(self, way: str) -> list[float]:
        return {"recompute": self.recompute_ms, "cached": self.cached_ms}[way]


def _decoder_flops(model: TinyDecoder, new: int, keys: int, batch: int) -> int:
    """FLOPs of one pass of ``new`` tokens per sequence through ``model``, the ``j``-th new
    token attending to ``keys - new + j + 1`` keys: every linear layer's weights once per token,
    and ``q.k`` and ``weights.v`` for each (query, key) pair of each head (2 FLOPs a product)."""
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    pairs = new * keys - new * (new - 1) // 2  # causal pairs of the new queries
    attn = cast(DecoderBlock, model.blocks[0]).attn.config
    return batch * (2 * linear * new + len(model.blocks) * 4 * attn.n_heads * attn.head_dim * pairs)


def cache_vs_recompute(model: TinyDecoder, prompt: Tensor, n_new: int, repeats: int = 3,
                       make_cache: type[Cache] | None = None, **cache_kwargs: object) -> CacheRace:
    """Greedy decoding of ``n_new`` tokens after ``prompt`` (B, P), two ways, timed step by step
    side by side:

    * recompute: every step runs the whole sequence so far through ``model`` and keeps the last
      position's logits (no cache: step ``i`` costs ``O(P + i)`` tokens, ``O((P + i)^2)``
      attention pairs, so the whole decode grows as ``n^2`` tokens);
    * cached: the prompt goes through once, filling one KV cache per block
      (:meth:`~selfattn.book.decoding.TinyDecoder.new_caches`, ``make_cache(**cache_kwargs)``,
      default :class:`~selfattn.cache.KVCache`), then each step runs only the newest token,
      whose query attends to the cached keys (``O(1)`` tokens and ``O(P + i)`` pairs a step).

    Each of ``repeats`` rounds decodes every step of one way, then every step of the other
    (which goes first alternates from round to round); each step's time is the median over the
    rounds, so a slow moment of a shared machine in one round does not decide it. The model
    runs in eval mode without autograd. Chapter 11 uses
    ``TinyDecoder(256, d_model=128, n_heads=4, n_layers=2)``, a prompt of 16 and ``n_new=200``
    (a few seconds on one thread).
    """
    B, P = prompt.shape
    was_training = model.training
    model.eval()

    def recompute(state: dict) -> Tensor:
        logits = model(state["seq"])  # (B, n, vocab): every position, again
        nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        state["seq"] = torch.cat([state["seq"], nxt], dim=1)  # (B, n + 1)
        return nxt

    def cached(state: dict) -> Tensor:
        logits = model(state["new"], state["caches"])  # (B, 1 or P, vocab): only the new tokens
        nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        state["new"] = nxt  # the next step runs only this token
        return nxt

    samples: dict[str, list[list[float]]] = {"recompute": [], "cached": []}
    generated: dict[str, Tensor] = {}
    with torch.no_grad():
        for r in range(repeats + 1):  # round 0 warms up, untimed
            states: dict[str, dict[str, Any]] = {"recompute": {"seq": prompt},
                      "cached": {"new": prompt,
                                 "caches": model.new_caches(make_cache, **cache_kwargs)}}
            steps = {"recompute": recompute, "cached": cached}
            order = ["recompute", "cached"] if r % 2 else ["cached", "recompute"]
            times: dict[str, list[float]] = {way: [] for way in order}
            tokens: dict[str, list[Tensor]] = {way: [] for way in order}
            for way in order:
                for _ in range(n_new if r else min(n_new, 16)):
                    start = time.perf_counter()
                    tokens[way].append(steps[way](states[way]))
                    times[way].append(time.perf_counter() - start)
            if r:
                for way in order:
                    samples[way].append(times[way])
                    generated[way] = torch.cat(tokens[way], dim=1)  # (B, n_new)
    model.train(was_training)
    context = [P + i for i in range(n_new)]
    pairs = [n * (n + 1) // 2 for n in context]  # causal pairs of a whole sequence of n tokens
    return CacheRace(
        prompt_len=P, context=context,
        recompute_ms=[1e3 * statistics.median(s) for s in zip(*samples["recompute"], strict=True)],
        cached_ms=[1e3 * statistics.median(s) for s in zip(*samples["cached"], strict=True)],
        recompute_generated=generated["recompute"], cached_generated=generated["cached"],
        recompute_tokens_run=context, cached_tokens_run=[P, *[1] * (n_new - 1)],
        recompute_pairs=pairs, cached_pairs=[pairs[0], *context[1:]],
        recompute_flops=[_decoder_flops(model, n, n, B) for n in context],
        cached_flops=[_decoder_flops(model, P, P, B)] + [_decoder_flops(model, 1, n, B)
                                                          for n in context[1:]],
        repeats=repeats)


def block_step_benchmark(contexts: tuple[int, ...] = (1024, 8192), batches: tuple[int, ...] = (1, 8),
                         d_model: int = 512, n_heads: int = 8, kv_heads: tuple[int, ...] = (8, 2, 1),
                         ffn_hidden: int | None = None, repeats: int = 9, warmup: int = 2,
                         seed: int = 0) -> list[dict]:
    """One decoding step of one :class:`~selfattn.book.decoding.DecoderBlock` (attention with RoPE,
    then the feed-forward layer, ``ffn_hidden`` wide, default ``4 * d_model``), one new token for
    each of ``batch`` sequences whose KV caches hold ``context`` tokens, for MHA, GQA and MQA
    (``kv_heads``), beside the bytes the step must read
    (:func:`~selfattn.book.kit.measure.decode_bytes`: the weights once, every sequence's cache).

    :func:`decode_benchmark` times the attention layer alone at batch 1; this adds the
    feed-forward weights every step reads too, and the batch, whose caches grow with it while the
    weights are read once. Variants are interleaved in a rotated order in each repeat; the first
    ``warmup`` repeats are dropped. Each row: ``context``, ``batch``, ``variant``, ``n_kv_heads``,
    ``ms`` (median per step), ``mb`` (bytes read, MiB), ``gb_per_s`` (bytes / time),
    ``gflop_per_s`` (the step's FLOPs over its time: two per weight, and ``4 * n_heads * hd``
    per cached key for the scores and the weighted sum, per sequence), ``bytes_vs_mha`` (MHA's
    bytes over this variant's: the speed-up if the step were bound by memory alone) and
    ``speedup_vs_mha`` (measured). The caches hold random keys and values
    (their numbers do not change the time).
    """
    ffn = 4 * d_model if ffn_hidden is None else ffn_hidden
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        blocks = {kv: DecoderBlock(d_model, n_heads, kv, ffn).eval() for kv in kv_heads}
    names = {kv: "MHA" if kv == n_heads else "MQA" if kv == 1 else f"GQA-{kv}" for kv in kv_heads}
    hd = d_model // n_heads
    rows = []
    g = torch.Generator().manual_seed(seed)
    for context in contexts:
        for batch in batches:
            states = {}
            for kv in kv_heads:
                cache = KVCache(capacity=context + warmup + repeats + 1)
                k = torch.randn(batch, kv, context, hd, generator=g)  # (B, H_kv, context, hd)
                cache.append(k, torch.randn(batch, kv, context, hd, generator=g))
                states[kv] = (cache, torch.randn(batch, 1, d_model, generator=g))  # (B, 1, d)
            samples: dict[int, list[float]] = {kv: [] for kv in kv_heads}
            order = list(kv_heads)
            with torch.no_grad():
                for r in range(warmup + repeats):
                    for kv in order[r % len(order):] + order[: r % len(order)]:
                        cache, x = states[kv]
                        synchronize()
                        start = time.perf_counter()
                        blocks[kv](x, cache)
                        synchronize()
                        if r >= warmup:
                            samples[kv].append(time.perf_counter() - start)
            read = {kv: decode_bytes(d_model, n_heads, kv, context, hd, 4, ffn, batch)["total"]
                    for kv in kv_heads}
            ms = {kv: 1e3 * statistics.median(samples[kv]) for kv in kv_heads}
            base = kv_heads[0]
            for kv in kv_heads:
                weights = decode_bytes(d_model, n_heads, kv, context, hd, 4, ffn)["weights"] // 4
                flops = batch * (2 * weights + 4 * n_heads * hd * (context + 1))
                rows.append({"context": context, "batch": batch, "variant": names[kv],
                             "n_kv_heads": kv, "ms": ms[kv], "mb": read[kv] / 2**20,
                             "gb_per_s": read[kv] / (ms[kv] / 1e3) / 1e9,
                             "gflop_per_s": flops / (ms[kv] / 1e3) / 1e9,
                             "bytes_vs_mha": read[base] / read[kv],
                             "speedup_vs_mha": ms[base] / ms[kv]})
    return rows


def block_step_table(rows: list[dict], cache: int | None = None) -> str:
    """:func:`block_step_benchmark`'s rows as text: per context and batch, each variant's ms per
    step, the MiB it reads (``DRAM`` where that is more than ``cache`` bytes, the cache a thread
    was measured to see, :func:`effective_cache_bytes`), its GB/s and GFLOP/s, the speed-up over
    the first variant (MHA) beside the bytes bound."""
    lines = [f"{'context':>7s} {'batch':>5s} {'variant':>7s} {'ms':>7s} {'MiB read':>13s} "
             f"{'GB/s':>5s} {'GFLOP/s':>7s} {'speed-up':>8s} {'bytes bound':>11s}"]
    for r in rows:
        past = " DRAM" if cache is not None and r["mb"] * 2**20 > cache else "     "
        lines.append(f"{r['context']:7d} {r['batch']:5d} {r['variant']:>7s} {r['ms']:7.2f} "
                     f"{r['mb']:8.1f}{past} {r['gb_per_s']:5.1f} {r['gflop_per_s']:7.1f} "
                     f"{r['speedup_vs_mha']:7.2f}x {r['bytes_vs_mha']:10.2f}x")
    return "\n".join(lines)


def tokens_per_pass(block: nn.Module, sizes: Sequence[int] = (1, 4, 16, 64, 256, 1024),
                    repeats: int = 5, seed: int = 0) -> dict[int, dict[str, float]]:
    """One pass of ``block`` over ``n`` tokens at once (no cache), for each ``n`` in ``sizes``,
    timed side by side (:func:`~selfattn.book.kit.measure.compare`: interleaved, contended
    samples dropped). Per ``n``: ``ms_per_token``, ``gflop_per_s`` (two FLOPs per weight of the
    block's matrices and token) and ``weights_gb_per_s`` (the matrices' bytes, read once per
    pass, over its time)."""
    from .kit.measure import compare

    matrices = [p for p in block.parameters() if p.dim() == 2]
    weight_bytes = sum(p.numel() * p.element_size() for p in matrices)
    weights = sum(p.numel() for p in matrices)
    g = torch.Generator().manual_seed(seed)
    d_model = matrices[0].shape[1]
    xs = {n: torch.randn(1, n, d_model, generator=g) for n in sizes}

    def run(x: Tensor) -> Tensor:
        with torch.no_grad():
            return block(x)

    fns: dict[str, Callable[[], object]] = {str(n): functools.partial(run, x)
                                            for n, x in xs.items()}
    timed = compare(fns, repeats=repeats, warmup=1, min_sample_s=0.05)
    out = {}
    for n in sizes:
        seconds = timed[str(n)].median
        out[n] = {"ms_per_token": 1e3 * seconds / n,
                  "gflop_per_s": 2 * n * weights / seconds / 1e9,
                  "weights_gb_per_s": weight_bytes / seconds / 1e9}
    return out


def copy_bandwidth(sizes_mib: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128), repeats: int = 5
                   ) -> dict[int, float]:
    """GB/s of copying a float32 buffer of each size (MiB) into another, the bytes read plus the
    bytes written over the time, the sizes timed side by side
    (:func:`~selfattn.book.kit.measure.compare`). A copy whose two buffers stay in a cache runs
    faster than one that streams from main memory (DRAM); where the speed falls is the cache one
    thread really sees, whatever the operating system reports (:func:`cpu_cache_bytes`)."""
    from .kit.measure import compare

    fns: dict[str, Callable[[], object]] = {}
    for mib in sizes_mib:
        a = torch.ones(mib * 2**20 // 4)
        b = torch.empty_like(a)
        fns[str(mib)] = functools.partial(b.copy_, a)
    timed = compare(fns, repeats=repeats, warmup=1, min_sample_s=0.05)
    return {mib: 2 * mib * 2**20 / timed[str(mib)].median / 1e9 for mib in sizes_mib}


def effective_cache_bytes(bandwidth: dict[int, float], margin: float = 1.25) -> int:
    """The cache one thread sees, from :func:`copy_bandwidth`: the working set (both buffers, in
    bytes) of the largest copy still more than ``margin`` times as fast as the largest copy,
    which streams from main memory; 0 when none is. A working set up to this size gets some help
    from the caches; a larger one runs at main memory's speed. (The margin sits well below the
    speed-up of a copy that fits, so that a copy half in the cache counts as helped, and one
    timing's noise does not move the answer.)"""
    dram = bandwidth[max(bandwidth)]
    fast = [mib for mib, gbs in bandwidth.items() if gbs > margin * dram]
    return 2 * max(fast) * 2**20 if fast else 0


@dataclass(frozen=True)
class HeadBoxes:
    """One head's key and value boxes in :func:`latent_attention`'s explicit form: the left edge
    and the widths (inches) of its own key part, of the shared rope part beside it (0 without
    RoPE) and of its value, with their labels ("" where a box is too narrow for one)."""

    left: float
    key: float
    rope: float
    value: float
    key_label: str
    value_label: str


@dataclass(frozen=True)
class LatentLayout:
    """What :func:`latent_attention` draws, computed without matplotlib from a
    :class:`~selfattn.latent.MultiHeadLatentAttention` built on the meta device: its sizes, the
    ``cached`` numbers per token (the layer's own count), each head's own key width (before the
    rope part) and each head's boxes."""

    d_model: int
    n_heads: int
    head_dim: int
    kv_rank: int
    rope_dim: int
    cached: int
    key_width: int
    heads: list[HeadBoxes]

    @property
    def mha(self) -> int:
        """What multi-head attention caches per token: a key and a value per head."""
        return 2 * self.n_heads * self.head_dim

    @property
    def numbers(self) -> str:
        return "number" if self.cached == 1 else "numbers"

    @property
    def cache_label(self) -> str:
        r, dr = self.kv_rank, self.rope_dim
        return f"{r} + {dr} = {self.cached} {self.numbers}" if dr else f"{r} {self.numbers}"

    @property
    def cost_label(self) -> str:
        return (f"cache per token and layer: {self.cached} {self.numbers}; MHA's: 2 × {self.n_heads} × "
                f"{self.head_dim} = {self.mha}; {Fraction(self.cached, self.mha)} of it")

    @property
    def per_head_label(self) -> str:
        dr = self.rope_dim
        key = f"key {self.key_width} + {dr} (k^R, shared)" if dr else f"key {self.key_width}"
        return (f"per head: {key},\n          value {self.head_dim}, query {self.head_dim + dr};\n"
                "built from every cached latent")

    @property
    def alt(self) -> str:
        h, hd, r, dr = self.n_heads, self.head_dim, self.kv_rank, self.rope_dim
        rope = (f" and one rotated rope key of {dr} numbers shared by every head" if dr else
                " (no rope key: rope_dim is 0)")
        return (f"Multi-head latent attention with {h} heads of {hd} features: a token's hidden state "
                f"of {self.d_model} numbers gives one latent c of {r} numbers{rope}; the KV cache holds "
                f"these {self.cached} numbers per token, where multi-head attention holds 2 × {h} × "
                f"{hd} = {self.mha}. The explicit form up-projects every cached latent with W^UK and "
                f"W^UV into each head's key and value; the absorbed form, for decoding, folds W^UK "
                f"into the query and W^UV into the output projection, so each head scores and sums "
                f"the latents themselves.")


_HEADS_FROM, _HEADS_TO = 4.25, PAGE_WIDTH - 0.1  # inches: the explicit form's heads, left to right


def latent_layout(n_heads: int = 4, head_dim: int = 64, kv_rank: int = 256, rope_dim: int = 32,
                  d_model: int | None = None) -> LatentLayout:
    """:func:`latent_attention`'s layout: the sizes and the cache count of the layer these
    arguments build, and each head's key and value boxes."""
    d_model = n_heads * head_dim if d_model is None else d_model
    with torch.device("meta"):  # the sizes and names only: no weights are allocated
        layer = MultiHeadLatentAttention(d_model, n_heads, head_dim, kv_rank, rope_dim=rope_dim)
    h, hd, dr = layer.n_heads, layer.head_dim, layer.rope_dim
    k_width = layer.k_up.out_features // h  # per head, before the rope part is appended
    pitch = (_HEADS_TO - _HEADS_FROM) / h
    bw = min(0.85 * pitch, 0.6)
    key = bw * k_width / (k_width + dr)  # a key box: its own part, then the shared rope part
    value = bw * hd / (k_width + dr)

    def label(name: str, width: float) -> str:
        return name if width >= 0.05 * len(name) + 0.04 else ""

    heads = [HeadBoxes(_HEADS_FROM + pitch * i + (pitch - bw) / 2, key, bw - key if dr else 0.0, value,
                       label(f"k{i}", key), label(f"v{i}", value)) for i in range(h)]
    return LatentLayout(layer.d_model, h, hd, layer.kv_rank, dr, layer.cache_numbers_per_token(),
                        k_width, heads)


def latent_attention(n_heads: int = 4, head_dim: int = 64, kv_rank: int = 256, rope_dim: int = 32,
                     d_model: int | None = None) -> Diagram:
    r"""Multi-head latent attention (DeepSeek-V2, §2.1): what a token leaves in the cache and the
    two ways the heads read it back. The hidden state $h_t$ gives one latent $c_t$
    (``kv_down``, ``kv_rank`` numbers, shared by every head) and, with ``rope_dim``, one
    rotated rope key $k^R_t$ shared by every head: the cache holds ``kv_rank + rope_dim``
    numbers per token. Explicit form: ``k_up`` ($W^{UK}$) and ``v_up`` ($W^{UV}$) build every
    head's key and value from each cached latent. Absorbed form (decoding): $W^{UK}$ goes into
    the query and $W^{UV}$ into the output projection, and the heads attend to the latents
    themselves (§2.1.2). Sizes, names and the cache count come from a
    :class:`~selfattn.latent.MultiHeadLatentAttention` built with these arguments
    (``d_model`` defaults to ``n_heads * head_dim``; :func:`latent_layout`)."""
    layout = latent_layout(n_heads, head_dim, kv_rank, rope_dim, d_model)
    fig, ax = draw.canvas(PAGE_WIDTH, _LATENT_H)
    _draw_latent_cache(ax, layout)
    _draw_explicit(ax, layout)
    _draw_absorbed(ax, layout)
    draw.text(ax, 0.1, 0.17, layout.cost_label, size=8, family=MONO)
    return Diagram(fig, layout.alt)


_ROPE, _CACHE = draw.TAB[5], draw.TAB[3]
_LATENT_H = 4.9  # the figure's height, inches
_LATENT_X, _LATENT_W, _LATENT_Y, _ROPE_Y = 2.22, 1.45, 3.15, 1.95  # the cache column, inches
_MONO8: dict[str, Any] = {"family": MONO, "size": 8}


def _draw_latent_cache(ax: Axes, layout: LatentLayout) -> None:
    """The token's hidden state, and the cache: the latent and the shared rope key, all a token
    leaves behind."""
    x_c, cw, y_c, y_r = _LATENT_X, _LATENT_W, _LATENT_Y, _ROPE_Y
    r, dr = layout.kv_rank, layout.rope_dim
    draw.text(ax, 0.1, _LATENT_H - 0.3, "multi-head latent attention\n(DeepSeek-V2, §2.1)", size=8.5)
    x_h, y_h = 0.55, 2.55
    draw.text(ax, x_h, y_h + 0.5, "token t", ha="center", size=8.5, weight="bold")
    draw.box(ax, x_h, y_h, 0.9, 0.55, f"h_t\n({layout.d_model},)", GREY, size=8.5, family=MONO)
    ax.add_patch(FancyBboxPatch((x_c - cw / 2 - 0.08, y_r - 0.4), cw + 0.16, y_c - y_r + 0.82,
                                boxstyle="round,pad=0,rounding_size=0.08", facecolor=draw.tint(_CACHE, 0.08),
                                edgecolor=_CACHE, linewidth=1.0, linestyle="--", gid="cache"))
    draw.text(ax, x_c, y_c + 0.56, "KV cache, per token", ha="center", size=8.5, weight="bold")
    draw.box(ax, x_c, y_c, cw, 0.55, f"kv_down → c_t\n({r},)", _CACHE, size=8, family=MONO, gid="latent")
    ax.patches[-1].set_linewidth(2.0)  # the latent: the one thing every head shares
    if dr:
        draw.box(ax, x_c, y_r, cw, 0.5, f"k_rope, RoPE → k^R_t\n({dr},)", _ROPE, size=8, family=MONO,
                 gid="rope key")
    else:
        draw.text(ax, x_c, y_r, "no rope key\n(rope_dim = 0)", ha="center", size=8, color=GREY)
    draw.text(ax, x_c, y_r - 0.55, layout.cache_label, ha="center", **_MONO8)
    draw.arrow(ax, (x_h + 0.45, y_h + 0.12), (x_c - cw / 2 - 0.1, y_c - 0.05))
    if dr:
        draw.arrow(ax, (x_h + 0.45, y_h - 0.12), (x_c - cw / 2 - 0.1, y_r + 0.05))


def _draw_explicit(ax: Axes, layout: LatentLayout) -> None:
    """The explicit form: every cached latent up-projected to every head's key and value."""
    x0 = 3.2  # the right half starts here
    draw.text(ax, x0, _LATENT_H - 0.2, "explicit: up-project every cached latent", size=8.5, weight="bold")
    y_k, y_v, x_lab = 4.15, 3.6, x0 + 0.05
    for y, name, color, label in [(y_k, "k_up", K, r"$W^{UK}$"), (y_v, "v_up", V, r"$W^{UV}$")]:
        draw.text(ax, x_lab, y, name, **_MONO8)
        draw.text(ax, x_lab + 0.4, y, label, size=10)
        draw.arrow(ax, (_LATENT_X + _LATENT_W / 2 + 0.02, _LATENT_Y + 0.1), (x_lab - 0.04, y), _CACHE)
        for i, head in enumerate(layout.heads):
            width, text = (head.key, head.key_label) if name == "k_up" else (head.value, head.value_label)
            draw.box(ax, head.left + width / 2, y, width, 0.28, text, color, size=8, family=MONO,
                     gid=f"{name[0]}{i}")
            if name == "k_up" and head.rope:
                draw.box(ax, head.left + head.key + head.rope / 2, y, head.rope, 0.28, "", _ROPE,
                         gid=f"rope{i}")
    draw.text(ax, x_lab, y_v - 0.3, layout.per_head_label, va="top", linespacing=1.3, **_MONO8)


def _draw_absorbed(ax: Axes, layout: LatentLayout) -> None:
    """The absorbed form (decoding): the heads attend to the latents themselves."""
    draw.text(ax, 3.2, 2.45, "absorbed (decoding): no per-head key or value", size=8.5, weight="bold")
    y_s, y_o = 1.85, 0.95
    xb, xa, bw = 4.05, 5.9, 1.55
    x_c = _LATENT_X + _LATENT_W / 2 + 0.02  # the cache's right edge
    rope_score = r" + q_i^{R\top} k^R_j" if layout.rope_dim else ""
    draw.box(ax, xb, y_s, bw, 0.62, f"scores, per head\n$\\tilde q_i^\\top c_j{rope_score}$", GREY,
             size=10, gid="scores")
    draw.box(ax, xa, y_s, bw, 0.62, "query, per head\n" r"$\tilde q_i = W_i^{UK\top} W^Q_i h_t$",
             Q, size=10, gid="query")
    draw.box(ax, xb, y_o, bw, 0.62, "weights × latents\n" r"$z_i = \Sigma_j\, a_{ij}\, c_j$", _CACHE,
             size=10, gid="weighted latents")
    draw.box(ax, xa, y_o, bw, 0.62, "out_proj, absorbed\n" r"$\Sigma_i\, W^O_i W_i^{UV} z_i$", OUT,
             size=10, gid="output")
    draw.arrow(ax, (xa - bw / 2 - 0.02, y_s), (xb + bw / 2 + 0.02, y_s), Q)
    draw.arrow(ax, (xb, y_s - 0.31), (xb, y_o + 0.31))
    draw.arrow(ax, (xb + bw / 2 + 0.02, y_o), (xa - bw / 2 - 0.02, y_o), OUT)
    draw.arrow(ax, (x_c, _LATENT_Y - 0.15), (xb - bw / 2 - 0.02, y_s + 0.15), _CACHE)
    draw.arrow(ax, (x_c, _LATENT_Y - 0.25), (xb - bw / 2 - 0.02, y_o + 0.1), _CACHE)
    if layout.rope_dim:
        draw.arrow(ax, (x_c, _ROPE_Y), (xb - bw / 2 - 0.02, y_s - 0.1), _ROPE)
    draw.text(ax, xa, y_o - 0.45, f"z_i: ({layout.kv_rank},) per head", ha="center", **_MONO8)


def _paged_run(lengths: Sequence[int], block_size: int, n_blocks: int
               ) -> tuple[BlockPool, list[PagedKVCache]]:
    """A :class:`~selfattn.cache.BlockPool` and one :class:`~selfattn.cache.PagedKVCache` per
    request, decoded side by side: every step, each unfinished request appends one token, whose key
    holds its position and whose value its request's index (one head of width 1). The pool starts
    as NaN, so a slot no token was written to reads as empty."""
    pool = BlockPool(n_blocks, block_size, 1, 1, dtype=torch.float64)
    pool.k.fill_(math.nan)
    pool.v.fill_(math.nan)
    caches = [PagedKVCache(pool) for _ in lengths]
    for step in range(max(lengths)):
        for r, (cache, n) in enumerate(zip(caches, lengths, strict=True)):
            if step < n:
                cache.append(torch.full((1, 1, 1, 1), float(step), dtype=torch.float64),
                             torch.full((1, 1, 1, 1), float(r), dtype=torch.float64))
    return pool, caches


@dataclass(frozen=True)
class Block:
    """One block of :func:`paged_block_table`: its left edge (inches), the request it belongs to
    (an index into the names, None for a free block) and the position each slot holds (None:
    allocated, no token yet)."""

    x: float
    request: int | None
    slots: tuple[int | None, ...]


@dataclass(frozen=True)
class PagedLayout:
    """What :func:`paged_block_table` draws, computed from a real pool without matplotlib: each
    request's ``block_tables`` and ``logical`` blocks (their headers centred at ``header_x``),
    the pool's ``physical`` blocks by number, the ``free`` list, each request's ``unused`` slots,
    a block's ``width`` (inches) and whether each slot is wide enough to hold its number."""

    lengths: list[int]
    block_size: int
    names: str
    block_tables: list[list[int]]
    logical: list[list[Block]]
    header_x: list[float]
    physical: list[Block]
    free: list[int]
    unused: list[int]
    width: float
    labelled: bool

    @property
    def headers(self) -> list[tuple[str, str]]:
        """Each request's name and token count, and its block table, as printed above it."""
        return [(f"{name}: {n} token{'s' if n > 1 else ''}", f"block_table {table}")
                for name, n, table in zip(self.names, self.lengths, self.block_tables, strict=True)]

    @property
    def alt(self) -> str:
        maps = "; ".join(f"request {name} ({n} tokens) has block table {table}"
                         for name, n, table in zip(self.names, self.lengths, self.block_tables,
                                                   strict=True))
        n, total = len(self.lengths), sum(map(len, self.block_tables)) * self.block_size
        return (f"PagedAttention: {n} request{'s' if n > 1 else ''} decoded side by side store their "
                f"keys and values in blocks of {self.block_size} tokens taken from one shared pool "
                f"of {len(self.physical)} physical blocks; {maps}. Each request's logical blocks map "
                f"onto physical blocks that need not be adjacent; only each request's last block is "
                f"partly filled ({sum(self.unused)} unused slots of {total}), and blocks "
                f"{self.free} are free.")


_PAGE_MARGIN, _BLOCK_GAP, _REQUEST_GAP = 0.1, 0.06, 0.3  # inches: the sides, between blocks, requests


def paged_layout(lengths: Sequence[int] = (10, 6, 7), block_size: int = 4,
                 n_blocks: int | None = None) -> PagedLayout:
    """:func:`paged_block_table`'s layout: the requests decoded through a real pool
    (:func:`_paged_run`), the tables and every slot read back from it, and where each block goes
    on a page ``PAGE_WIDTH`` wide."""
    lengths = list(lengths)
    needed = sum(math.ceil(n / block_size) for n in lengths)
    n_blocks = needed + 2 if n_blocks is None else n_blocks
    pool, caches = _paged_run(lengths, block_size, n_blocks)
    tables = [list(c.block_table) for c in caches]
    names = "ABCD"[:len(lengths)]
    headers = [(f"{name}: {n} token{'s' if n > 1 else ''}", f"block_table {table}")
               for name, n, table in zip(names, lengths, tables, strict=True)]
    bw, groups = _block_width(tables, headers, n_blocks)
    physical = _physical_blocks(pool, tables, bw)
    # each request's logical blocks under its header, the requests side by side, centred
    margin, gap_b, gap_r = _PAGE_MARGIN, _BLOCK_GAP, _REQUEST_GAP
    x = margin + (PAGE_WIDTH - 2 * margin - sum(groups) - gap_r * (len(groups) - 1)) / 2
    logical, header_x = [], []
    for r, (table, n, group) in enumerate(zip(tables, lengths, groups, strict=True)):
        mid = x + group / 2
        left = mid - (len(table) * bw + (len(table) - 1) * gap_b) / 2
        positions = [range(j * block_size, (j + 1) * block_size) for j in range(len(table))]
        logical.append([Block(left + j * (bw + gap_b), r, tuple(p if p < n else None for p in span))
                        for j, span in enumerate(positions)])
        header_x.append(mid)
        x += group + gap_r
    slot_bytes = pool.bytes_per_block // block_size
    return PagedLayout(lengths, block_size, names, tables, logical, header_x, physical,
                       list(pool.free_blocks),
                       [(c.allocated_bytes - c.nbytes) // slot_bytes for c in caches], bw,
                       labelled=bw / block_size >= 0.16)  # room for a two-digit position in a slot


def _block_width(tables: list[list[int]], headers: list[tuple[str, str]], n_blocks: int
                 ) -> tuple[float, list[float]]:
    """A block's width (inches) and the width of each request's group (its blocks, or its header
    where that is wider): as wide as the pool's blocks allow, narrower until the requests fit
    side by side."""
    W, margin, gap_b, gap_r = PAGE_WIDTH, _PAGE_MARGIN, _BLOCK_GAP, _REQUEST_GAP
    widths = [max(0.075 * len(top), 0.067 * len(table)) + 0.1 for top, table in headers]
    bw = min(0.9, (W - 2 * margin - (n_blocks - 1) * gap_b) / n_blocks)
    while True:
        groups = [max(len(t) * bw + (len(t) - 1) * gap_b, w) for t, w in zip(tables, widths, strict=True)]
        if sum(groups) + gap_r * (len(groups) - 1) <= W - 2 * margin or bw < 0.2:
            return bw, groups
        bw -= 0.02


def _physical_blocks(pool: BlockPool, tables: list[list[int]], bw: float) -> list[Block]:
    """The pool's blocks, left to right by number and centred, each slot read back from the
    pool: the position its key holds, the request its value names."""
    W, margin, n_blocks = PAGE_WIDTH, _PAGE_MARGIN, pool.n_blocks
    stored_pos = pool.k[:, 0, :, 0].tolist()  # (n_blocks, block_size): the position in each slot
    stored_req = pool.v[:, 0, :, 0].tolist()  # ... and the request it belongs to
    owner = {b: r for r, table in enumerate(tables) for b in table}
    pitch = min((W - 2 * margin - bw) / max(n_blocks - 1, 1), bw + 0.3)
    shift = (W - (margin + (n_blocks - 1) * pitch + bw) - margin) / 2
    blocks = []
    for b in range(n_blocks):
        r = owner.get(b)
        assert r is None or all(math.isnan(q) or int(q) == r for q in stored_req[b])
        blocks.append(Block(margin + b * pitch + shift, r,
                            tuple(None if math.isnan(p) else int(p) for p in stored_pos[b])))
    return blocks


def paged_block_table(lengths: Sequence[int] = (10, 6, 7), block_size: int = 4,
                      n_blocks: int | None = None) -> Diagram:
    r"""PagedAttention's memory (Kwon et al. 2023, §4.1–4.2): each request is a sequence of logical
    blocks of ``block_size`` tokens, and its ``block_table`` maps them onto physical blocks of one
    shared :class:`~selfattn.cache.BlockPool`, anywhere in it: token $p$ lives in block
    ``block_table[p // block_size]`` at slot ``p % block_size``. Only each request's last block is
    partly filled, the only memory wasted; the rest of the pool is on the free list.

    Drawn from a real pool: the requests (1 to 4, of ``lengths`` tokens) decode side by side, one
    token each per step, through :class:`~selfattn.cache.PagedKVCache`, so their blocks interleave
    in the pool. The tables, the token in every physical slot (read back from the pool's ``k``),
    the free list and the unused slots (``allocated_bytes - nbytes``) are the caches' own
    (:func:`paged_layout`). ``n_blocks`` defaults to the blocks the requests need plus two free
    ones."""
    layout = paged_layout(lengths, block_size, n_blocks)
    return Diagram(_draw_paged(layout), layout.alt)


_REQUEST_COLORS, _SLOT_HEIGHT = (Q, K, V, OUT), 0.3


def _draw_block(ax: Axes, block: Block, y: float, width: float, labelled: bool, gid: str,
                text_gid: str) -> None:
    """A block of slots, left edge at ``block.x``: a filled slot tinted and numbered (where
    ``labelled``), an empty one hatched (room allocated, not used) or, in a free block, blank."""
    h, cw = _SLOT_HEIGHT, width / len(block.slots)
    color = GREY if block.request is None else _REQUEST_COLORS[block.request]
    ax.add_patch(FancyBboxPatch((block.x, y - h / 2), width, h, boxstyle="round,pad=0,rounding_size=0.04",
                                facecolor="white", edgecolor=color, linewidth=1.2, gid=gid, zorder=2))
    for s, p in enumerate(block.slots):
        full = p is not None
        slot = FancyBboxPatch((block.x + s * cw + 0.015, y - h / 2 + 0.03), cw - 0.03, h - 0.06,
                              boxstyle="square,pad=0", facecolor=draw.tint(color, 0.3) if full else "white",
                              edgecolor="none", hatch=None if full or block.request is None else "////",
                              zorder=2)
        ax.add_patch(slot)
        if block.request is not None and not full:
            slot.set_edgecolor(draw.tint(color, 0.5))
            slot.set_linewidth(0)
        if full and labelled:
            draw.text(ax, block.x + (s + 0.5) * cw, y, str(p), size=7.5, ha="center", zorder=3,
                      gid=f"{text_gid}.{s}")


def _draw_paged(layout: PagedLayout) -> Figure:
    W, H, margin = PAGE_WIDTH, 4.1, _PAGE_MARGIN
    bw, ch, names = layout.width, _SLOT_HEIGHT, layout.names
    fig, ax = draw.canvas(W, H)
    mono: dict[str, Any] = {"family": MONO, "size": 8}
    bold: dict[str, Any] = {"size": 8.5, "weight": "bold"}
    y_title, y_head, y_log, y_phys = H - 0.2, H - 0.88, H - 1.5, 1.3
    draw.text(ax, margin, y_title, "PagedAttention: block tables map each request's logical blocks onto "
              "one shared pool", **bold)
    draw.text(ax, margin, y_title - 0.24, "(Kwon et al. 2023, §4.1–4.2); the requests decode side by side, "
              "one token each per step, so their blocks interleave", size=8)
    for b, block in enumerate(layout.physical):
        holder = "free" if block.request is None else names[block.request]
        _draw_block(ax, block, y_phys, bw, layout.labelled, f"physical {b}: {holder}", f"physical {b}")
        draw.text(ax, block.x + bw / 2, y_phys - ch / 2 - 0.14, str(b), size=8.5, ha="center",
                  weight="bold")
        draw.text(ax, block.x + bw / 2, y_phys - ch / 2 - 0.33, holder, size=8, ha="center",
                  color=GREY if block.request is None else INK)
    draw.text(ax, margin, y_phys - ch / 2 - 0.62, f"physical blocks: BlockPool(n_blocks="
              f"{len(layout.physical)}, block_size={layout.block_size}), shared; under each, its number "
              "and the request holding it", size=8)
    for r, (blocks, table, mid) in enumerate(zip(layout.logical, layout.block_tables, layout.header_x,
                                                 strict=True)):
        top, table_text = layout.headers[r]
        draw.text(ax, mid, y_head + 0.12, top, ha="center", **bold)
        draw.text(ax, mid, y_head - 0.1, table_text, ha="center", gid=f"table {names[r]}", **mono)
        for j, (block, b) in enumerate(zip(blocks, table, strict=True)):
            _draw_block(ax, block, y_log, bw, layout.labelled, f"logical {names[r]}{j} -> {b}",
                        f"logical {names[r]}{j}")
            draw.arrow(ax, (block.x + bw / 2, y_log - ch / 2 - 0.02),
                       (layout.physical[b].x + bw / 2, y_phys + ch / 2 + 0.03), _REQUEST_COLORS[r], lw=0.9)
    total = sum(map(len, layout.block_tables)) * layout.block_size
    draw.text(ax, margin, 0.38, "unused slots (hatched, only in each last block): "
              f"{' + '.join(map(str, layout.unused))} = {sum(layout.unused)} of {total} allocated", size=8)
    free = layout.free
    draw.text(ax, margin, 0.16, f"free list: {free}" if free else "free list: empty (the pool is full)",
              size=8, family=MONO)
    return fig


def _rolling_run(cache: SinkCache | SlidingWindowCache, t: int) -> tuple[list[int], int]:
    """Feed ``cache`` (a fresh :class:`~selfattn.cache.SinkCache` or
    :class:`~selfattn.cache.SlidingWindowCache`) ``t`` tokens one at a time, each key holding its
    own position; return the position each buffer slot holds now, read back from the cache's
    buffer, and the slot the next token (position ``t``) will be written to."""
    for p in range(t):
        x = torch.full((1, 1, 1, 1), float(p), dtype=torch.float64)
        cache.append(x, x)
    assert cache._k is not None  # t > 0 tokens appended
    held = [int(p) for p in cache._k[0, 0, :, 0].tolist()]  # (n_sink + window,): its buffer, read back
    nxt = int(cache._slots(torch.tensor([t]))[0])  # where append writes position t
    return held, nxt


@dataclass(frozen=True)
class RollingPanel:
    """One cache of :func:`rolling_sink_buffer` after ``t`` tokens: its ``tag`` and ``title``,
    its ``n_sink`` sinks, the position each buffer slot holds (``held``, read back from the
    cache) and the slot position ``t`` goes to next."""

    tag: str
    title: str
    n_sink: int
    held: list[int]
    next_slot: int

    def kind(self, p: int, t: int) -> str:
        """What position ``p`` is after ``t`` tokens: ``"next"`` (``p == t``), ``"sink"``,
        ``"kept"`` (in the window) or ``"evicted"``."""
        return ("next" if p == t else "sink" if p < self.n_sink else "kept" if p in self.held
                else "evicted")

    def summary(self, t: int) -> str:
        """The panel in one sentence, for the alt text."""
        size, sinks = len(self.held), self.n_sink
        sinks_in = f"sinks in {draw.slot_range(0, sinks)}, " if sinks else ""
        return (f"{self.title} ({sinks_in}the last {size - sinks} rolling in "
                f"{draw.slot_range(sinks, size)}) keeps positions {draw.runs(sorted(set(self.held)))} "
                f"({t - len(set(self.held))} evicted); position {t} goes to slot {self.next_slot}, "
                f"overwriting position {self.held[self.next_slot]}")


@dataclass(frozen=True)
class RollingLayout:
    """What :func:`rolling_sink_buffer` draws, computed from real caches without matplotlib: the
    ``panels`` after ``t`` tokens, and the width (inches) of a position and of a buffer slot."""

    t: int
    panels: list[RollingPanel]
    position_width: float
    slot_width: float

    @property
    def tokens(self) -> str:
        return f"{self.t} token{'s' * (self.t > 1)}"

    @property
    def alt(self) -> str:
        sinks_stay = "The sinks stay in their slots; the" if self.panels[0].n_sink else "The"
        return (f"Rolling key/value buffers after {self.tokens}. "
                + ". ".join(panel.summary(self.t) for panel in self.panels)
                + f". {sinks_stay} window's slots are overwritten in rolling order, each new token "
                "replacing the one a window's length before it.")


_ROLLING_X0, _ROLLING_MARGIN = 0.95, 0.1  # inches: where the rows start (after their captions), sides


def rolling_layout(n_sink: int = 4, window: int = 8, t: int = 19, sliding: bool = True
                   ) -> RollingLayout:
    """:func:`rolling_sink_buffer`'s layout: a :class:`~selfattn.cache.SinkCache` (and, with
    ``sliding``, a :class:`~selfattn.cache.SlidingWindowCache` of as many slots) fed ``t``
    tokens, each slot read back (:func:`_rolling_run`)."""
    size = n_sink + window
    caches: list[tuple[str, str, SinkCache | SlidingWindowCache, int]] = [
        ("sink", f"SinkCache(n_sink={n_sink}, window={window})", SinkCache(n_sink, window), n_sink)]
    if sliding:
        caches.append(("sliding", f"SlidingWindowCache(window={size})", SlidingWindowCache(size), 0))
    panels = [RollingPanel(tag, title, sinks, *_rolling_run(cache, t)) for tag, title, cache, sinks in caches]
    room = PAGE_WIDTH - _ROLLING_X0 - _ROLLING_MARGIN
    return RollingLayout(t, panels, position_width=min(0.3, room / (t + 1)),  # and the next one
                         slot_width=min(0.42, room / size))


def rolling_sink_buffer(n_sink: int = 4, window: int = 8, t: int = 19, sliding: bool = True) -> Diagram:
    r"""A :class:`~selfattn.cache.SinkCache` after ``t`` tokens (StreamingLLM, Xiao et al. 2023,
    §3.2): the positions $0 \dots t-1$ on a line, the evicted ones grey, and the cache's
    ``n_sink + window`` buffer slots, each joined to the position it holds now. The sinks stay in
    slots $0 \dots n_\text{sink}-1$ forever; position $p \ge n_\text{sink}$ goes to slot
    $n_\text{sink} + (p - n_\text{sink}) \bmod W$, overwriting the token $W$ positions before it,
    so the window's slots are rewritten in rolling order; the next write (position $t$) is
    dashed. With ``sliding``, below it a :class:`~selfattn.cache.SlidingWindowCache` of as many
    slots, which keeps no sinks (Jiang et al. 2023, §2: slot $p \bmod W$).

    The slot contents are read back from the caches' buffers after ``t`` real appends (each key
    holds its position), and the next slot from the cache's own slot rule, so the picture cannot
    disagree with the code (:func:`rolling_layout`). ``t`` is at least ``n_sink + window`` (the
    buffer full)."""
    layout = rolling_layout(n_sink, window, t, sliding)
    return Diagram(_draw_rolling(layout), layout.alt)


_ROLLING_COLORS = {"sink": OUT, "kept": Q, "evicted": GREY, "next": K}
_ROLLING_FILLS = {"next": "white", "evicted": "#eeeeee"}
_POSITION_H, _SLOT_H, _LINK_H = 0.26, 0.34, 0.62  # a position's height, a slot's, the lines between


def _draw_rolling(layout: RollingLayout) -> Figure:
    t, pw, sw = layout.t, layout.position_width, layout.slot_width
    x0, margin = _ROLLING_X0, _ROLLING_MARGIN
    ph, sh, link = _POSITION_H, _SLOT_H, _LINK_H
    panel_h = 0.3 + ph + link + sh + 0.32
    W, H = PAGE_WIDTH, 0.55 + len(layout.panels) * panel_h + 0.3
    fig, ax = draw.canvas(W, H)
    draw.text(ax, margin, H - 0.2, f"Rolling KV buffers after t = {layout.tokens}: which position each "
              "slot holds", size=8.5, weight="bold")
    draw.text(ax, margin, H - 0.42, "(StreamingLLM, Xiao et al. 2023, §3.2; Mistral 7B's rolling buffer, "
              "Jiang et al. 2023, §2)", size=8)
    for k, panel in enumerate(layout.panels):
        top = H - 0.55 - k * panel_h
        y_p, y_s = top - 0.3 - ph / 2, top - 0.3 - ph - link - sh / 2
        tag, sinks, size = panel.tag, panel.n_sink, len(panel.held)
        draw.text(ax, margin, top - 0.12, panel.title, size=8, family=MONO, weight="bold")
        rolling = f"{draw.slot_range(sinks, size)} roll" + "s" * (size - sinks == 1)
        kept_sinks = f"{draw.slot_range(0, sinks)}: sinks, kept; " if sinks else "no sinks; "
        draw.text(ax, W - margin, top - 0.12, kept_sinks + rolling, size=8, ha="right")
        draw.text(ax, margin, y_p, "positions", size=8)
        draw.text(ax, margin, y_s, "buffer slots", size=8)
        for p in range(t + 1):
            x, kind = x0 + (p + 0.5) * pw, panel.kind(p, t)
            color = _ROLLING_COLORS[kind]
            ax.add_patch(FancyBboxPatch((x - pw / 2 + 0.01, y_p - ph / 2), pw - 0.02, ph,
                                        boxstyle="round,pad=0,rounding_size=0.03",
                                        facecolor=_ROLLING_FILLS.get(kind, draw.tint(color, 0.3)),
                                        edgecolor=color, linewidth=0.9, linestyle="--" if p == t else "-",
                                        gid=f"{tag} position {p} {kind}"))
            draw.text(ax, x, y_p, str(p), size=7.5 if pw >= 0.2 else 7, ha="center",
                      color=GREY if kind == "evicted" else INK)
        for s, p in enumerate(panel.held):
            xs, xp = x0 + (s + 0.5) * sw, x0 + (p + 0.5) * pw
            color = _ROLLING_COLORS["sink" if s < sinks else "kept"]
            draw.box(ax, xs, y_s, sw - 0.04, sh, str(p), color, size=8.5, gid=f"{tag} slot {s} holds {p}")
            ax.texts[-1].set_gid(f"{tag} slot {s}")
            ax.plot([xs, xp], [y_s + sh / 2, y_p - ph / 2], color=color, lw=0.8, zorder=1)
            draw.text(ax, xs, y_s - sh / 2 - 0.15, str(s), size=7, ha="center", color=GREY)
        # the next write: position t into its slot, over the oldest token of the window
        xs, nxt = x0 + (panel.next_slot + 0.5) * sw, _ROLLING_COLORS["next"]
        ax.add_patch(FancyBboxPatch((xs - sw / 2 + 0.005, y_s - sh / 2 - 0.035), sw - 0.01, sh + 0.07,
                                    boxstyle="round,pad=0,rounding_size=0.05", facecolor="none",
                                    edgecolor=nxt, linewidth=1.6, linestyle="--",
                                    gid=f"{tag} next {panel.next_slot}"))
        ax.plot([xs, x0 + (t + 0.5) * pw], [y_s + sh / 2 + 0.035, y_p - ph / 2], color=nxt, lw=1.2,
                ls="--", zorder=1)
    kinds = [("sink", "sink")] if layout.panels[0].n_sink else []
    kinds += [("kept", "in the window"), ("evicted", "evicted"), ("next", f"next write (position {t})")]
    x = margin
    for kind, label in kinds:
        color, style = _ROLLING_COLORS[kind], "--" if kind == "next" else "-"
        ax.add_patch(FancyBboxPatch((x, 0.1), 0.22, 0.16, boxstyle="round,pad=0,rounding_size=0.03",
                                    facecolor=_ROLLING_FILLS.get(kind, draw.tint(color, 0.3)),
                                    edgecolor=color, linewidth=1.0, linestyle=style))
        draw.text(ax, x + 0.28, 0.18, label, size=8)
        x += 0.28 + 0.068 * len(label) + 0.3
    return fig


@dataclass(frozen=True)
class Allocation:
    """What :func:`allocation_shares` measured: the ``requests`` (prompt, answer lengths), the
    tokens they hold (``used``), and per way of allocating its ``allocated`` token slots; per
    paged block size, the ``pool`` it reserved up front, in blocks."""

    requests: list[tuple[int, int]]
    used: int
    allocated: dict[str, int]
    pool: dict[int, int]

    def share(self, name: str) -> float:
        """The share of ``name``'s allocated slots that hold a token."""
        return self.used / self.allocated[name]


def allocation_shares(data_seed: int, n_requests: int = 100, longest: int = 4096,
                      shortest_part: int = 16, longest_part: int = 2048,
                      block_sizes: tuple[int, ...] = (64, 16, 4)) -> Allocation:
    r"""A seeded mix of ``n_requests`` requests, each a prompt and an answer whose lengths are drawn
    log-uniformly from ``shortest_part`` to ``longest_part`` (the prompt appended at once, the
    answer a token at a time), held three ways: a buffer of ``longest`` slots reserved per
    request, a doubling :class:`~selfattn.cache.KVCache` per request, and
    :class:`~selfattn.cache.PagedKVCache`\ s over one :class:`~selfattn.cache.BlockPool` per block
    size. Memory is counted in token slots (one number per token: the shares do not depend on the
    width of a token).

    The pool is reserved up front, as a server reserves its memory at start: here
    ``ceil(used / block_size) + n_requests`` blocks, enough for every request's tokens and one
    partly filled last block each. ``allocated`` counts the blocks the requests' tables hold,
    which is what a server can hand to other requests when these finish (Kwon et al. 2023, §4)."""
    g = torch.Generator().manual_seed(data_seed)
    low, high = math.log(shortest_part), math.log(longest_part)
    prompts = torch.empty(n_requests).uniform_(low, high, generator=g).exp()
    answers = torch.empty(n_requests).uniform_(low, high, generator=g).exp()
    requests = list(zip(prompts.long().tolist(), answers.long().tolist(), strict=True))
    one = torch.zeros(1, 1, 1, 1)  # one token of one number

    def grown(cache: Cache, prompt: int, answer: int) -> Cache:
        cache.append(torch.zeros(1, 1, prompt, 1), torch.zeros(1, 1, prompt, 1))
        for _ in range(answer):
            cache.append(one, one)
        return cache

    used = sum(p + a for p, a in requests)
    per_slot = 2 * 4  # a key and a value of one float32 number
    allocated = {f"reserve {longest:,} per request": n_requests * longest}
    caches = [grown(KVCache(), p, a) for p, a in requests]
    allocated["doubling (KVCache)"] = sum(c.allocated_bytes for c in caches) // per_slot
    pools = {}
    for block_size in block_sizes:
        pools[block_size] = math.ceil(used / block_size) + n_requests
        pool = BlockPool(pools[block_size], block_size, n_kv_heads=1, head_dim=1)
        caches = [grown(PagedKVCache(pool), p, a) for p, a in requests]
        allocated[f"paged, blocks of {block_size}"] = (
            sum(c.allocated_bytes for c in caches) // per_slot)
    return Allocation(requests, used, allocated, pools)


def cpu_cache_bytes(level: int) -> int | None:
    """The size of this CPU's level-``level`` cache (2: a core's L2, 3: the shared L3), in bytes,
    as Linux describes it (``/sys/devices/system/cpu/cpu0/cache``); ``None`` elsewhere. A virtual
    machine may report its host's whole L3, shared by every core."""
    import pathlib

    for index in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if int((index / "level").read_text()) != level:
                continue
            if (index / "type").read_text().strip() == "Instruction":
                continue
            size = (index / "size").read_text().strip()  # e.g. "2048K"
        except (OSError, ValueError):
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        if size[-1:] in units and size[:-1].isdigit():
            return int(size[:-1]) * units[size[-1]]
    return None


_COPIES = ("cat", "index", "index_put_", "gather", "clone", "contiguous", "copy_")


def window_step_costs(d_model: int = 1024, n_heads: int = 16, kept: int = 4096, n_sink: int = 4,
                      seed: int = 0) -> list[dict]:
    """One decoding step of ``MultiHeadAttention(d_model, n_heads)`` (eval, no autograd) with each
    cache holding ``kept`` tokens: a :class:`~selfattn.cache.KVCache`, a
    :class:`~selfattn.cache.SlidingWindowCache` of ``kept`` and a :class:`~selfattn.cache.SinkCache`
    of ``n_sink`` sinks beside a window of ``kept - n_sink``, each filled past its window so that
    the rolling buffers have wrapped.

    Each row: ``cache`` (its class), ``held`` (bytes the cache holds, :attr:`~Cache.nbytes`),
    ``tokens`` (how many tokens those bytes are: the contiguous cache holds all ``kept + kept // 4``
    appended, the rolling ones ``kept``),
    ``step_peak`` (the most bytes of new tensors alive at once during the step,
    :func:`~selfattn.book.kit.measure.peak_memory`: the new token's projections, scores and output,
    and any copy of the cache) and ``copies`` (the step's operations that copy a tensor, by name,
    :func:`~selfattn.book.kit.measure.op_counts`). A rolling cache that gathered its window in
    order at every step would allocate as much as it holds; one query's softmax does not depend
    on the order of its keys, so the library's caches hand the buffers over as they are."""
    from .kit.measure import op_counts, peak_memory

    g = torch.Generator().manual_seed(seed)
    layer = MultiHeadAttention(d_model, n_heads).eval()
    hd = d_model // n_heads
    filled = kept + kept // 4  # past the window: the rolling buffers have wrapped
    makes: list[tuple[str, Callable[[], Cache]]] = [
        ("KVCache", lambda: KVCache(capacity=filled + 8)),
        (f"SlidingWindowCache({kept})", lambda: SlidingWindowCache(kept)),
        (f"SinkCache({n_sink}, {kept - n_sink})", lambda: SinkCache(n_sink, kept - n_sink))]
    rows = []
    with torch.no_grad():
        for name, make in makes:
            cache = make()
            kv = torch.randn(1, n_heads, filled, hd, generator=g)  # (1, H, filled, hd)
            cache.append(kv, kv)
            x = torch.randn(1, 1, d_model, generator=g)  # (1, 1, d_model): the new token
            held = cache.nbytes

            def step(x: Tensor = x, cache: Cache = cache) -> object:
                return layer(x, x, x, is_causal=True, kv_cache=cache)

            peak, ops = peak_memory(step), op_counts(step)
            tokens = held // (2 * n_heads * hd * kv.element_size())
            rows.append({"cache": name, "held": held, "tokens": tokens, "step_peak": peak,
                         "copies": {op: n for op, n in sorted(ops.items()) if op in _COPIES}})
    return rows


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    r"""Spearman's rank correlation of two equally long sequences: Pearson's correlation of their
    ranks (ties share the mean of their ranks). 1: ``y`` rises whenever ``x`` does; 0: no
    monotone relation.

    $$\rho = \frac{\operatorname{cov}(r_x, r_y)}{\sigma_{r_x} \sigma_{r_y}}$$"""
    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx and sy else float("nan")


@torch.no_grad()
def bos_value_zeroed(record: SinkRecord) -> float:
    """The accuracy of one :func:`sink_experiment` model under its sink + window cache with the
    first token's *value* set to zero (a forward hook on the attention's value projection):
    its key stays, so a head can still park its weight there, but what it adds is gone.

    Set beside the record's ``window_only`` and ``sink_window`` accuracy, this splits what
    evicting BOS costs in two: the weight that lands on the window's tokens instead (which this
    keeps from happening) and the value BOS adds (which this removes)."""

    def zero_first(module: nn.Module, inputs: object, out: Tensor) -> Tensor:
        out = out.clone()
        out[:, 0] = 0  # (B, T, d): position 0's value, every head
        return out

    model = record.model
    T = cast(SinkData, record.test).tokens.shape[1]
    hook = cast(AttentionTagger, model).attn.v_proj.register_forward_hook(zero_first)
    try:
        mask = causal_mask(T, window=record.window, n_sink=record.n_sink)
        return cache_accuracy(model, record.test, mask, record.window)["all"]
    finally:
        hook.remove()


def latent_flops(n_heads: int, head_dim: int, kv_rank: int, rope_dim: int, queries: int,
                 keys: int, absorb: bool, causal: bool = False) -> dict[str, int]:
    r"""FLOPs of one MLA layer's attention (two per multiply-add), for ``queries`` new tokens
    against ``keys`` cached latents, by part (DeepSeek-AI 2024, §2.1): the projections into
    and out of the latent space are left out where both forms share them.

    Explicit: up-project every cached latent into each head's key and value
    ($2 \cdot S \cdot d_c \cdot 2 n_h d_h$), score over $d_h + d^R_h$ numbers, weighted sum over
    $d_h$. Absorbed: map each query into the latent space and each output back
    ($2 \cdot L \cdot n_h d_h d_c$ each), score over $d_c + d^R_h$, weighted sum over $d_c$. For
    one query the explicit form's up-projection of all $S$ latents dominates; for a prefill of
    $L = S$ queries the absorbed form's wider scores and sums cost more.

    ``causal``: the queries are the last ``queries`` of the keys, each scoring only those up to
    it (a prefill when ``queries == keys``)."""
    pairs = queries * keys - (queries * (queries - 1) // 2 if causal else 0)  # (query, key) pairs
    if absorb:
        parts = {"up-projections": 2 * 2 * queries * n_heads * head_dim * kv_rank,
                 "scores": 2 * n_heads * pairs * (kv_rank + rope_dim),
                 "weighted sum": 2 * n_heads * pairs * kv_rank}
    else:
        parts = {"up-projections": 2 * keys * kv_rank * 2 * n_heads * head_dim,
                 "scores": 2 * n_heads * pairs * (head_dim + rope_dim),
                 "weighted sum": 2 * n_heads * pairs * head_dim}
    return {**parts, "total": sum(parts.values())}


def cached_step_profile(model: TinyDecoder, context: int, repeats: int = 20, seed: int = 0
                        ) -> dict[str, float]:
    """One cached decoding step of ``model`` (one token of one sequence after ``context`` cached
    ones): ``ops``, the ``aten`` operations it calls (:func:`~selfattn.book.kit.measure.op_counts`);
    ``ms``, its median time; ``flops`` (as :func:`cache_vs_recompute` counts them) and
    ``gflop_per_s``; ``us_per_op``, the time per operation. A small model's step is a long chain
    of tiny operations, each paying PyTorch's fixed cost per call."""
    from .kit.measure import median_time, op_counts

    g = torch.Generator().manual_seed(seed)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        caches = model.new_caches(KVCache, capacity=context + repeats + 8)
        model(torch.randint(0, model.vocab_size, (1, context), generator=g), caches)
        token = torch.randint(0, model.vocab_size, (1, 1), generator=g)
        ops = sum(op_counts(lambda: model(token, caches)).values())
        seconds = median_time(lambda: model(token, caches), repeats=repeats, warmup=2)
    model.train(was_training)
    flops = _decoder_flops(model, 1, context + 1, 1)
    return {"ops": ops, "ms": 1e3 * seconds, "flops": flops,
            "gflop_per_s": flops / seconds / 1e9, "us_per_op": 1e6 * seconds / ops}


def tokens_per_second(race: CacheRace) -> dict[str, float]:
    """Each way's generated tokens per second over a :func:`cache_vs_recompute` run."""
    n = len(race.context)
    return {way: n / (t["ms"] / 1e3) for way, t in race.totals().items()}


def model_cache_bytes(layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Chapter 11, exercise 1: a model's KV cache per token: every layer caches a key and a value
    for each key/value head."""
    return layers * 2 * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


@_checker
def check_model_cache_bytes(answer: object) -> str:
    """Chapter 11, exercise 1: Llama 3 70B's KV cache per token, in 16-bit numbers (80 layers,
    8 key/value heads of width 128; Grattafiori et al. 2024, Table 3)."""
    answer = _number(answer)
    layers, kv_heads, head_dim, itemsize = 80, 8, 128, torch.empty(0, dtype=torch.float16).element_size()
    want = model_cache_bytes(layers, kv_heads, head_dim, torch.float16)
    if answer == want // 2:
        raise NotYet(f"{answer:,} counts the keys or the values: a token caches both")
    if answer == layers * 2 * 64 * head_dim * itemsize:
        raise NotYet(f"{answer:,} counts the 64 query heads: only the 8 key/value heads are cached")
    if answer == want // layers:
        raise NotYet(f"{answer:,} is one layer's: every one of the 80 layers has its own cache")
    if answer == want * 2:
        raise NotYet(f"{answer:,} counts 4 bytes a number: 16-bit numbers take 2")
    if answer != want:
        raise NotYet(f"{answer:,} is not it: layers x (key and value) x KV heads x width x bytes")
    return f"{want:,} bytes = {want // 2**10:,} KiB per token, {want * 8192 / 2**30:.1f} GiB at 8,192 tokens"


def _pooled(w: Tensor, n_kv: int, g: int, how: str) -> Tensor:
    """The rows of a key or value projection's weight ``(H * hd, d)`` (or bias ``(H * hd,)``)
    pooled into ``n_kv`` heads of ``g``, the right way (``"mean"``, adjacent heads) or a typical
    wrong one."""
    rows = w.shape[0] // (n_kv * g)  # hd
    adjacent = w.reshape(n_kv, g, rows, *w.shape[1:])  # (H_kv, g, hd, ...): a group's heads together
    strided = w.reshape(g, n_kv, rows, *w.shape[1:]).transpose(0, 1)  # (H_kv, g, hd, ...): every H_kv-th
    pooled = {"mean": adjacent.mean(1), "sum": adjacent.sum(1), "first": adjacent[:, 0],
              "last": adjacent[:, -1], "strided": strided.mean(1), "strided_sum": strided.sum(1)}[how]
    return pooled.reshape(n_kv * rows, *w.shape[1:])  # (H_kv * hd, ...)


_POOLING_MISTAKES = {
    "strided": "your key/value head j averages query heads j, j + n_kv_heads, j + 2 n_kv_heads, "
               "... (every n_kv_heads-th head). The layer gives query head i the key/value head "
               "i // g (g = n_heads // n_kv_heads, repeat_kv's repeat_interleave order), so group j "
               "is the adjacent heads j*g .. (j+1)*g - 1: view the weight as (n_kv_heads, g, "
               "head_dim, d_model) and average over dim 1",
    "sum": "your key/value heads are the sum of their group's heads, g times too large: "
           "mean-pool them (divide by g = n_heads // n_kv_heads)",
    "strided_sum": "your key/value heads sum every n_kv_heads-th head: average (divide by g) "
                   "the adjacent heads j*g .. (j+1)*g - 1 that share key/value head j",
    "first": "your key/value heads keep the first head of each group: uptraining mean-pools every "
             "head of the group (Ainslie et al. found the mean better than keeping one head)",
    "last": "your key/value heads keep the last head of each group: uptraining mean-pools every "
            "head of the group",
}


def _uptraining_case(fn: object, d_model: int, n_heads: int, n_kv: int, rope: bool, seed: int) -> None:
    mha = _seeded_layer(seed, d_model, n_heads, rope=rope)
    cfg, g = mha.config, n_heads // n_kv
    before = {name: t.clone() for name, t in mha.state_dict().items()}
    given = f"given an MHA layer of {n_heads} heads (rope={rope}) and n_kv_heads={n_kv}"
    with torch.random.fork_rng(devices=[]):
        try:
            gqa = _call(fn, mha, n_kv)
        except NotYet as why:
            if "leaf Variable" not in str(why):
                raise
            raise NotYet(f"{why}. Copy weights into a layer's parameters under torch.no_grad(), "
                         "or with load_state_dict") from None
    if not all(torch.equal(t, before[name]) for name, t in mha.state_dict().items()):
        raise NotYet(f"{given}, your function changed the MHA layer's weights: build the GQA layer "
                     "as a new MultiHeadAttention and copy into it, leaving the checkpoint as it was")
    if not isinstance(gqa, MultiHeadAttention):
        raise NotYet(f"{given}, return a selfattn.MultiHeadAttention (the GQA layer), got "
                     f"{type(gqa).__name__}")
    got = gqa.config
    if got.n_heads != n_heads:
        raise NotYet(f"{given}, your layer has {got.n_heads} query heads: "
                     + ("you pooled the queries too. " if got.n_heads == n_kv else "")
                     + f"GQA keeps all {n_heads} query heads; only the key and value heads are "
                     "pooled, each group of query heads sharing one")
    if got.n_kv_heads != n_kv:
        raise NotYet(f"{given}, your layer has n_kv_heads={got.n_kv_heads}; build it with "
                     f"MultiHeadAttention(..., n_kv_heads={n_kv})")
    for name in ("d_model", "head_dim", "kdim", "vdim", "out_dim", "bias", "rope"):
        if getattr(got, name) != getattr(cfg, name):
            raise NotYet(f"{given}, your layer has {name}={getattr(got, name)}, the MHA layer "
                         f"{name}={getattr(cfg, name)}: keep every setting but n_kv_heads "
                         "(head_dim, bias and rope included)")
    ours = dict(mha.named_parameters())
    for name, p in gqa.named_parameters():
        if any(p.data_ptr() == q.data_ptr() for q in ours.values()):
            raise NotYet(f"{given}, your layer's {name} shares its storage with the MHA layer's: "
                         "uptraining it would change the checkpoint too. Copy the weights "
                         "(load_state_dict, or .copy_ under torch.no_grad())")
    for proj in ("q_proj", "out_proj"):
        for part in ("weight", "bias"):
            if not _equal(getattr(getattr(gqa, proj), part), getattr(getattr(mha, proj), part)):
                raise NotYet(f"{given}, your {proj}.{part} is not the MHA layer's: uptraining keeps "
                             "the query and output projections as they are; copy them")
    for proj in ("k_proj", "v_proj"):
        theirs, mine = getattr(gqa, proj), getattr(mha, proj)
        want = _pooled(mine.weight, n_kv, g, "mean")  # (H_kv * hd, d)
        got_w = _tensor(theirs.weight, want)
        role = "key" if proj == "k_proj" else "value"
        if not _close(got_w, want, atol=1e-6, rtol=1e-5):
            hint = next((h for how, h in _POOLING_MISTAKES.items()
                         if _close(got_w, _pooled(mine.weight, n_kv, g, how), atol=1e-6, rtol=1e-5)), None)
            raise NotYet(f"{given}, {proj}.weight: " + (hint or f"your {role} heads are not the "
                         f"mean of each group's {g} adjacent {role} heads (query heads j*g .. "
                         f"(j+1)*g - 1 share key/value head j); they differ by up to "
                         f"{(got_w.detach() - want).abs().max():.3g}"))
        want_b = _pooled(mine.bias, n_kv, g, "mean")  # (H_kv * hd,)
        if not _close(_tensor(theirs.bias, want_b), want_b, atol=1e-6, rtol=1e-5):
            raise NotYet(f"{given}, {proj}.weight is pooled right but {proj}.bias is not: a head's "
                         f"{role}s are W x + b, so pool the bias the same way, each group's mean")


def _swapped(model: AttentionTagger, attn: MultiHeadAttention) -> AttentionTagger:
    """A copy of ``model`` whose attention layer is ``attn``."""
    out = copy.deepcopy(model)
    out.attn = attn
    return out


def uptraining_recovery(fn: Callable[[MultiHeadAttention, int], MultiHeadAttention],
                        seeds: list[int] | range | None = None, n_kv_heads: int = 2,
                        steps: int = 300, uptrain_steps: int | None = None,
                        progress: bool = False) -> dict[str, list[float]]:
    """GQA uptraining (Ainslie et al. 2023, §2.1) on chapter 1's distance-cue tagging task
    (16 tokens, the cue up to 15 back), one run per seed: an :class:`~selfattn.book.tagging.AttentionTagger`
    with 4 heads of 8 (MHA) trained ``steps``; its layer converted by ``fn(layer, n_kv_heads)``
    (mean-pooled key and value heads); the converted model trained ``uptrain_steps`` more
    (default 5% of ``steps``, the paper's proportion). The control: the same model with the
    GQA layer's query and output projections copied and its key and value projections drawn at
    random, trained for the same budget. Returns the accuracy on the ambiguous word of a test
    set (chance: 1 / 4), per seed, for ``"MHA"``, ``"pooled"`` (right after the conversion),
    ``"random K/V"``, ``"pooled, uptrained"`` and ``"random K/V, uptrained"``. ``seeds``
    default to :func:`~selfattn.book.kit.train.seed_range`, the data to
    :func:`~selfattn.book.kit.train.data_seed`; the global random state is left as it was."""
    from .kit.train import data_seed, seed_range

    seeds = list(seed_range() if seeds is None else seeds)
    uptrain = max(1, steps // 20) if uptrain_steps is None else uptrain_steps
    data = tagging_task(4096, seq_len=16, seed=data_seed(0))
    test = tagging_task(1024, seq_len=16, seed=data_seed(1))
    arms: dict[str, list[float]] = {arm: [] for arm in ("MHA", "pooled", "random K/V",
                                                        "pooled, uptrained", "random K/V, uptrained")}

    def accuracy(model: nn.Module) -> float:
        return ambiguous_correct(model, test).float().mean().item()

    with torch.random.fork_rng(devices=[]):
        for seed in seeds:
            torch.manual_seed(seed)
            mha = AttentionTagger(data.vocab_size, data.n_tags, d=32, n_heads=4)
            train(mha, data, steps=steps, seed=seed, progress=progress, desc=f"MHA, seed {seed}")
            layer = mha.attn
            assert isinstance(layer, MultiHeadAttention)  # the tagger's own layer, not a scorer's
            converted = _call(fn, layer, n_kv_heads)
            if not isinstance(converted, MultiHeadAttention):
                raise NotYet(f"return a selfattn.MultiHeadAttention, got {type(converted).__name__}")
            pooled = _swapped(mha, converted)
            with torch.no_grad():
                cfg = layer.config
                fresh = MultiHeadAttention(cfg.d_model, cfg.n_heads, n_kv_heads=n_kv_heads,
                                           head_dim=cfg.head_dim, rope=cfg.rope)  # random K/V
                fresh.q_proj.load_state_dict(layer.q_proj.state_dict())
                fresh.out_proj.load_state_dict(layer.out_proj.state_dict())
                control = _swapped(mha, fresh)
            arms["MHA"].append(accuracy(mha))
            arms["pooled"].append(accuracy(pooled))
            arms["random K/V"].append(accuracy(control))
            for name, model in (("pooled, uptrained", pooled), ("random K/V, uptrained", control)):
                train(model, data, steps=uptrain, seed=seed + 1, progress=progress, desc=name)
                arms[name].append(accuracy(model))
    return arms


@_checker
def check_uptraining(fn: object) -> str:
    """Chapter 11, build-it exercise: ``fn(mha_layer, n_kv_heads)`` converts a trained MHA
    :class:`~selfattn.MultiHeadAttention` into a GQA one with ``n_kv_heads`` key/value heads, as
    Ainslie et al. (2023, §2.1) uptrain a checkpoint: the query and output projections copied,
    each group's key and value heads (the adjacent query heads ``j*g .. (j+1)*g - 1`` that share
    key/value head ``j``, ``g = n_heads // n_kv_heads``) mean-pooled, weights and biases, every
    other setting kept. Checked exactly on seeded layers (with and without RoPE, GQA and MQA);
    then, for one seed, a small trained tagger is converted and uptrained for 5% of its steps,
    beside the control whose key and value heads start at random (the numbers are printed, not
    judged: one seed is an example; :func:`uptraining_recovery` runs ten)."""
    for d_model, n_heads, n_kv, rope, seed in [(16, 8, 2, True, 111), (12, 6, 3, False, 112),
                                                (16, 4, 1, True, 113), (16, 8, 8, False, 114)]:
        _uptraining_case(fn, d_model, n_heads, n_kv, rope, seed)
    convert = cast(Callable[[MultiHeadAttention, int], MultiHeadAttention], fn)  # as checked just above
    acc = {arm: values[0] for arm, values in uptraining_recovery(convert, seeds=[0]).items()}
    return (f"each group's key and value heads are mean-pooled, the queries and output kept. On the "
            f"tagging task (one seed: the numbers vary from seed to seed; chance 25%), the MHA "
            f"tagger gets {acc['MHA']:.0%} of the "
            f"ambiguous words; pooled to 2 key/value heads {acc['pooled']:.0%}, and "
            f"{acc['pooled, uptrained']:.0%} after 5% more steps; with random key/value heads "
            f"{acc['random K/V']:.0%}, and {acc['random K/V, uptrained']:.0%} after the same steps")


def buggy_decode(layer: MultiHeadAttention, x: Tensor, chunks: list[int]) -> Tensor:
    """Chapter 11's cache bug: decode ``x`` (B, T, d_model) through ``layer``
    (self-attention, causal, any number of key/value heads, RoPE or not) a chunk of
    tokens at a time, ``chunks`` their lengths (a prompt, then one token at a time, now
    and then a few at once, as when a draft's tokens are checked), keeping every key and
    value in a cache. Returns the layer's outputs for every token, (B, T, out_dim),
    which should equal ``layer(x, is_causal=True)[0]``. One line is wrong."""
    cfg = layer.config
    g = cfg.n_heads // cfg.n_kv_heads  # query heads per key/value head
    keys = values = None  # the cache: (B, H_kv, tokens so far, hd)
    outputs, start = [], 0
    for n in chunks:
        chunk = x[:, start : start + n]  # (B, n, d_model): the new tokens
        q = split_heads(layer.q_proj(chunk), cfg.n_heads)  # (B, H, n, hd)
        k = split_heads(layer.k_proj(chunk), cfg.n_kv_heads)  # (B, H_kv, n, hd)
        v = split_heads(layer.v_proj(chunk), cfg.n_kv_heads)  # (B, H_kv, n, hd)
        if cfg.rope:  # the new tokens sit at positions start .. start + n - 1
            positions = torch.arange(start, start + n, device=x.device)
            q, k = apply_rope(q, positions), apply_rope(k, positions)
        # the cache, (B, H_kv, start + n, hd) each
        keys = k if keys is None else torch.cat([keys, k], dim=2)
        values = v if values is None else torch.cat([values, v], dim=2)
        kv = repeat_kv(keys, g), repeat_kv(values, g)  # (B, H, start + n, hd) each
        out, _ = scaled_dot_product_attention(q, *kv, is_causal=True)  # (B, H, n, hd)
        outputs.append(layer.out_proj(merge_heads(out)))  # (B, n, out_dim)
        start += n
    return torch.cat(outputs, dim=1)  # (B, T, out_dim)


def _decode_variant(layer: MultiHeadAttention, x: Tensor, chunks: list[int], mask: str,
                    rope_from_zero: bool = False) -> Tensor:
    """:func:`buggy_decode` with the new queries' mask chosen by ``mask``: ``"bottom_right"``
    (right: query ``i`` of a chunk after ``P`` cached tokens sees keys ``0 .. P + i``),
    ``"top_left"`` (the bug: ``is_causal=True``), ``"none"``, ``"first_only"`` (causal for the
    first chunk, nothing after: right for single tokens, wrong for a later chunk of several),
    ``"top_left_chunks"`` (``is_causal=n > 1``: the same, with the bug in later chunks)
    or ``"cached_only"`` (the new tokens do not see one another, nor themselves); with
    ``rope_from_zero``, each chunk rotated as if it started at position 0."""
    cfg = layer.config
    g = cfg.n_heads // cfg.n_kv_heads
    keys = values = None
    outputs, start = [], 0
    for n in chunks:
        chunk = x[:, start : start + n]  # (B, n, d_model)
        q = split_heads(layer.q_proj(chunk), cfg.n_heads)  # (B, H, n, hd)
        k = split_heads(layer.k_proj(chunk), cfg.n_kv_heads)  # (B, H_kv, n, hd)
        v = split_heads(layer.v_proj(chunk), cfg.n_kv_heads)  # (B, H_kv, n, hd)
        if cfg.rope:
            positions = torch.arange(n) if rope_from_zero else torch.arange(start, start + n)
            q, k = apply_rope(q, positions), apply_rope(k, positions)
        keys = k if keys is None else torch.cat([keys, k], dim=2)  # (B, H_kv, start + n, hd)
        values = v if values is None else torch.cat([values, v], dim=2)
        S = start + n
        attn_mask = {"bottom_right": causal_mask(n, S, offset=start),
                     "top_left": causal_mask(n, S),
                     "none": None,
                     "first_only": causal_mask(n, S) if start == 0 else None,
                     "top_left_chunks": causal_mask(n, S) if n > 1 else None,
                     "cached_only": causal_mask(n, S, offset=start - 1) if start else causal_mask(n)}[mask]
        out, _ = scaled_dot_product_attention(q, repeat_kv(keys, g), repeat_kv(values, g),
                                              attn_mask=attn_mask)  # (B, H, n, hd)
        outputs.append(layer.out_proj(merge_heads(out)))  # (B, n, out_dim)
        start += n
    return torch.cat(outputs, dim=1)  # (B, T, out_dim)


class _TokensSeen:
    """Counts the tokens each call of a layer's ``k_proj`` projects (forward hooks), to tell
    decoding with a cache (each token projected once, chunk by chunk) from recomputing."""

    def __init__(self, layer: MultiHeadAttention) -> None:
        self.calls: list[int] = []
        self._hook = layer.k_proj.register_forward_hook(
            lambda module, args, out: self.calls.append(args[0].shape[-2] if args[0].dim() > 1 else 1))

    def remove(self) -> None:
        self._hook.remove()


def _cache_bug_case(fn: object, layer: MultiHeadAttention, x: Tensor, chunks: list[int]) -> None:
    given = f"decoding chunks of {chunks} tokens"
    with torch.no_grad():
        want, _ = layer(x, is_causal=True)  # (B, T, d_model): the full causal pass
    seen = _TokensSeen(layer)
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            got = _tensor(_call(fn, layer, x.clone(), list(chunks)), want)
    finally:
        seen.remove()
    if not _close(got, want):
        with torch.no_grad():
            if _close(got, buggy_decode(layer, x, chunks)):
                raise NotYet(f"{given}, your function gives what buggy_decode gives: the first "
                             "chunk (into an empty cache) is right, every later one wrong. "
                             "Where do the new queries sit when the cache already holds tokens, "
                             "and what does is_causal=True assume about them?")
            variants = [
                ("none", f"{given}, the tokens of a chunk see the later tokens of their own chunk: "
                 "a chunk of several tokens still needs a causal mask among themselves"),
                ("first_only", f"{given}, right for the prompt and for one token at a time, wrong "
                 "for a later chunk of several: each of its queries sees every cached key and the "
                 "new keys up to its own, a causal mask aligned bottom-right, "
                 "causal_mask(n, S, offset=S - n)"),
                ("cached_only", f"{given}, each new token sees the cached tokens but not itself: "
                 "append the new keys and values before attending"),
            ]
            variants.insert(2, ("top_left_chunks", variants[1][1]))
            for mask, hint in variants:
                if _close(got, _decode_variant(layer, x, chunks, mask)):
                    raise NotYet(hint)
            if layer.config.rope and _close(got, _decode_variant(layer, x, chunks, "bottom_right",
                                                                rope_from_zero=True)):
                raise NotYet(f"{given}, the mask is right now, but each chunk is rotated as if it "
                             "started at position 0: RoPE must turn the new tokens by their own "
                             "positions, start .. start + n - 1")
        raise NotYet(f"{given}, your outputs differ from the layer's causal pass over the whole "
                     f"sequence by up to {(got.detach().to(want.dtype) - want).abs().max():.3g}")
    if sum(seen.calls) > x.shape[1]:
        raise NotYet(f"{given}, the outputs are right, but k_proj projected {sum(seen.calls)} "
                     f"tokens for a sequence of {x.shape[1]}: your function recomputes the keys of "
                     "earlier tokens. Keep them in the cache and project only the new ones")
    if seen.calls and len(chunks) > 1 and seen.calls == [x.shape[1]]:
        raise NotYet(f"{given}, the outputs are right, but your function projected the keys of "
                     "the whole sequence in one call: decoding sees one chunk at a time, so "
                     "project and cache each chunk's keys and values as it comes, as buggy_decode does")


@_checker
def check_cache_bug(fn: object) -> str:
    """Chapter 11, build-it exercise: ``fn(layer, x, chunks)`` is :func:`buggy_decode` with its
    one bug fixed: decoding ``x`` (B, T, d_model) through a :class:`~selfattn.MultiHeadAttention`
    ``layer`` chunk by chunk (``chunks``: their lengths), with a cache of keys and values, gives
    the layer's causal pass over the whole sequence, ``layer(x, is_causal=True)[0]``. Checked on
    seeded layers (GQA with RoPE, MHA without) fed a prompt then single tokens, and chunks of
    several tokens after the prompt; an answer that recomputes the earlier tokens' keys, or runs
    the whole sequence at once, is named as such."""
    g = torch.Generator().manual_seed(115)
    cases = [(_seeded_layer(116, 16, 4, n_kv_heads=2, rope=True), [4, 1, 1, 1, 1]),
             (_seeded_layer(116, 16, 4, n_kv_heads=2, rope=True), [3, 1, 2, 1, 3, 1]),
             (_seeded_layer(117, 12, 3), [1, 1, 1, 2, 1])]
    for layer, chunks in cases:
        x = torch.randn(2, sum(chunks), layer.config.d_model, generator=g)  # (B, T, d_model)
        _cache_bug_case(fn, layer, x, chunks)
    return ("a prompt, single tokens and later chunks of several tokens decoded with the cache "
            "give the full causal pass: the new queries sit after the cached keys, so their "
            "causal mask is aligned bottom-right, causal_mask(n, S, offset=S - n), or no mask "
            "for a single token")
