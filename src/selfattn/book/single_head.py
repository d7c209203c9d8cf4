r"""Chapters 2 to 4, one head of attention: step by step, its scoring functions, its scale.

* chapter 2: the diagrams of one output and of the matrix form (:func:`one_output`,
  :func:`matrix_form`), and the checkers of its exercises (a scale, a causal mask, attention, a
  self-attention layer);
* chapter 3: the race of scorers with its key-only control (:func:`race_tagger`,
  :func:`scorer_race`, :func:`assert_race`), the additive scorer's sizes, and the checkers of
  masked additive attention and Luong's general score;
* chapter 4: why $1/\sqrt{d_k}$: the gradients that reach the scores at a width and a scale
  (:func:`attention_gradients`, :func:`top_share`, :func:`cue_gradients`,
  :func:`query_gradient_ratio`), the start-matched control (:func:`rescale_scores`), an
  unpaired test (:func:`fisher_exact`), the paired one on the
  seeds where only one arm learned (:func:`sign_test`), and the checkers of its exercises.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
from matplotlib.axes import Axes
from matplotlib.patches import Circle
from torch import Tensor, nn

from ..attention import scaled_dot_product_attention
from ..masks import causal_mask, padding_mask
from ..multihead import MultiHeadAttention
from ..scoring import AdditiveScorer, ScoredSelfAttention
from .kit import draw
from .kit.checkers import Mistakes, NotYet, _call, _checker, _close, _first_match, _number, _tensor, same_as
from .kit.draw import GREY, INK, OUT, Diagram, K, Q, V
from .kit.measure import count_parameters
from .kit.viz import PAGE_WIDTH
from .tagging import AttentionTagger, TaggingData, ambiguous_correct


def one_output(tokens: Sequence[str] = ("the", "cat", "sat", "on", "the", "mat")) -> Diagram:
    r"""How self-attention computes the first output $b^1$ from the inputs $a^1 \dots a^n$
    (one input per token, at most 6), vectors as rows as in the code (``a @ W``):
    $q^1 = a^1 W^q$; $k^i = a^i W^k$, $v^i = a^i W^v$;
    $\alpha_{1,i} = q^1 \cdot k^i / \sqrt{d_k}$; $\alpha'_{1,i} = \operatorname{softmax}_i$;
    $b^1 = \sum_i \alpha'_{1,i} v^i$ (Vaswani et al. 2017, §3.2.1)."""
    tokens = list(tokens)
    n = len(tokens)
    W, H, left = PAGE_WIDTH, 4.2, 1.55  # captions on the left, q^1 then one column per token
    x_q, x0 = left + 0.25, left + 0.6
    cw = min((W - x0 - 0.05) / n, 1.1)  # a column per token
    y_tok, y_a, y_kv, y_bus, y_s, y_soft, y_w, y_b = 0.2, 0.55, 1.35, 1.8, 2.2, 2.7, 3.2, 3.85
    bh, bw, vw = 0.3, min(0.45, 0.45 * cw), min(0.4, 0.33 * cw)  # widths: key and scores, value
    fig, ax = draw.canvas(W, H)
    for y, caption in [(y_a, "inputs $a^i$"), (y_kv, "$q^1 = a^1 W^q$\n$k^i = a^i W^k$, $v^i = a^i W^v$"),
                       (y_s, r"scores $\alpha_{1,i}$" "\n" r"$= q^1\cdot k^i / \sqrt{d_k}$"),
                       (y_soft, "softmax over $i$"), (y_w, r"weights $\alpha'_{1,i}$, times $v^i$"),
                       (y_b, "output")]:
        draw.text(ax, 0.05, y, caption, size=10, linespacing=1.5)
    xc = [x0 + cw * (i + 0.5) for i in range(n)]
    xk = [x - 0.24 * cw for x in xc]  # the key, score and weight of token i
    xv = [x + 0.28 * cw for x in xc]  # its value, going up to the product
    x_b = max(x0 + n * cw / 2, x0 + 0.95)  # the output, over the middle of the tokens
    top = bh / 2
    # the softmax couples every score: one band across all of them (the values pass over it,
    # through a gap at each value, so they do not read as going through the softmax)
    draw.box(ax, (xk[0] - bw / 2 + xv[-1]) / 2, y_soft, xv[-1] - xk[0] + bw / 2 + 0.1, 0.2, color=GREY,
             fill="#eeeeee", gid="softmax band")
    draw.box(ax, x_q, y_kv, vw, bh, "$q^1$", Q, size=10)
    draw.arrow(ax, (xc[0] - 0.1, y_a + top), (x_q + 0.05, y_kv - top), Q)
    ax.plot([x_q, x_q, xk[-1] - 0.08], [y_kv + top, y_bus, y_bus], color=Q, lw=1.2)
    for i, (word, a, k, v) in enumerate(zip(tokens, xc, xk, xv, strict=True), start=1):
        draw.text(ax, a, y_tok, word.replace("$", r"\$"), ha="center", style="italic")
        draw.box(ax, a, y_a, min(0.55, 0.8 * cw), bh, f"$a^{{{i}}}$", GREY, size=10)
        for x, w, name, color in [(k, bw, "k", K), (v, vw, "v", V)]:
            draw.box(ax, x, y_kv, w, bh, f"${name}^{{{i}}}$", color, size=10)
            draw.arrow(ax, (a + (x - a) * 0.4, y_a + top), (x, y_kv - top), color)
        draw.arrow(ax, (k - 0.08, y_bus), (k - 0.08, y_s - top), Q)  # q^1 reaches every score
        draw.arrow(ax, (k + 0.08, y_kv + top), (k + 0.08, y_s - top), K)
        draw.box(ax, k, y_s, bw, bh, rf"$\alpha_{{1,{i}}}$", INK, size=10, fill="white")
        draw.arrow(ax, (k, y_s + top), (k, y_soft - 0.1), INK)
        draw.arrow(ax, (k, y_soft + 0.1), (k, y_w - top), INK)
        draw.box(ax, k, y_w, bw, bh, rf"$\alpha'_{{1,{i}}}$", INK, size=10, fill="white")
        ax.plot([v, v], [y_soft - 0.13, y_soft + 0.13], color="white", lw=6, zorder=2.9,
                gid="gap")  # the gap in the softmax band where v^i crosses it
        ax.plot([v, v], [y_kv + top, y_w - 0.09], color=V, lw=1.2, zorder=3)  # v^i up to the product
        ax.add_patch(Circle((v, y_w), 0.09, facecolor="white", edgecolor=INK, lw=1, zorder=3))
        draw.text(ax, v, y_w, "×", ha="center", zorder=4)
        draw.arrow(ax, (k + bw / 2, y_w), (v - 0.09, y_w), INK)
        draw.arrow(ax, (v, y_w + 0.09), (x_b + (v - x_b) * 0.3, y_b - 0.2), OUT)
    draw.box(ax, x_b, y_b, 1.9, 0.4, r"$b^1 = \sum_i \alpha'_{1,i}\, v^i$", OUT, size=11)
    words = " ".join(tokens)
    return Diagram(fig, f"How self-attention computes the first output b^1 for the {n} tokens "
                        f"'{words}': the query q^1 of the first token is scored against the key k^i of "
                        f"every token, the softmax of the scores weights the values v^i, and b^1 "
                        f"is their weighted sum.")


def _matrix(ax: Axes, x: float, y: float, rows: int, cols: int, name: str, color, *,
            above: str | None = None) -> tuple[float, float]:
    """A matrix as a box sized by its shape (log scale), name above, shape below; returns (w, h)."""
    w, h = _side(cols), _side(rows)
    draw.box(ax, x, y, w, h, name, color, size=10)
    if rows <= 16:  # one faint line per row: one row per token
        for r in range(1, rows):
            ax.plot([x - w / 2 + 0.03, x + w / 2 - 0.03], [y - h / 2 + r * h / rows] * 2,
                    color=color, lw=0.4, alpha=0.5)
    draw.text(ax, x, y - h / 2 - 0.14, draw.shape(rows, cols), size=8.5, ha="center")
    if above:
        draw.text(ax, x, y + h / 2 + 0.16, above, ha="center", size=10)
    return w, h


def _side(n: int) -> float:
    return min(0.6, 0.2 + 0.1 * math.log2(n))


def matrix_form(n: int = 6, d_model: int = 16, d_k: int = 8, d_v: int = 8) -> Diagram:
    r"""Self-attention for all ``n`` tokens at once, each matrix drawn with its shape:
    $Q = AW^q$, $K = AW^k$, $V = AW^v$; $A' = \operatorname{softmax}(QK^\top/\sqrt{d_k})$ by rows;
    $B = A'V$ (Vaswani et al. 2017, eq. 1). Boxes grow with the log of each dimension."""
    hn = _side(n)
    W, H = PAGE_WIDTH, 3 * hn + 2 * 0.62 + 0.8
    fig, ax = draw.canvas(W, H)
    rows = [H - 0.45 - hn / 2 - i * (hn + 0.62) for i in range(3)]  # Q, K, V
    y_a, y_s = rows[1], (rows[0] + rows[1]) / 2
    x = max(0.1 + _side(d_model) / 2, 0.45)
    _matrix(ax, x, y_a, n, d_model, "$A$", GREY, above="inputs")
    gap = max(0.9, 0.2 + 0.065 * len(draw.shape(d_model, max(d_k, d_v))))  # room for "(d_model, d_k)"
    x_qkv = x + _side(d_model) / 2 + 0.2 + gap + max(_side(d_k), _side(d_v)) / 2
    x_bus = x + _side(d_model) / 2 + 0.2  # A goes to a bus, the bus to Q, K and V
    ax.plot([x + _side(d_model) / 2, x_bus], [y_a] * 2, color=INK, lw=1)
    ax.plot([x_bus] * 2, [rows[0], rows[2]], color=INK, lw=1)
    for y, name, w_name, d, color in [(rows[0], "Q", "q", d_k, Q), (rows[1], "K", "k", d_k, K),
                                      (rows[2], "V", "v", d_v, V)]:
        _matrix(ax, x_qkv, y, n, d, f"${name}$", color)
        draw.arrow(ax, (x_bus, y), (x_qkv - _side(d) / 2 - 0.03, y), color)
        x_w = (x_bus + x_qkv - _side(d) / 2) / 2  # the weight: its name above the arrow, its shape below
        draw.text(ax, x_w, y + 0.15, f"$\\times W^{w_name}$", size=10, ha="center")
        draw.text(ax, x_w, y - 0.13, draw.shape(d_model, d), size=8.5, ha="center")
    x_s = x_qkv + max(_side(d_k), _side(d_v)) / 2 + 0.7 + hn / 2
    _matrix(ax, x_s, y_s, n, n, r"$S$", INK)  # its name starts at its left edge, clear of the arrows
    draw.text(ax, x_s - hn / 2 - 0.05, y_s + hn / 2 + 0.16, r"$S = QK^\top/\sqrt{d_k}$", size=10)
    for y, color in [(rows[0], Q), (rows[1], K)]:
        draw.arrow(ax, (x_qkv + _side(d_k) / 2 + 0.05, y), (x_s - hn / 2 - 0.05, y_s), color)
    x_p = x_s + max(hn + 0.8, 1.45)
    _matrix(ax, x_p, y_s, n, n, "$A'$", INK, above="$A' = $ softmax($S$)")
    draw.arrow(ax, (x_s + hn / 2 + 0.05, y_s), (x_p - hn / 2 - 0.05, y_s))
    draw.text(ax, (x_s + x_p) / 2, y_s - 0.15, "by rows", size=8.5, ha="center")
    x_b = x_p + max(hn / 2 + 0.55 + _side(d_v) / 2, 1.0)
    _matrix(ax, x_b, y_s, n, d_v, "$B$", OUT, above="$B = A'V$")
    draw.arrow(ax, (x_p + hn / 2 + 0.05, y_s), (x_b - _side(d_v) / 2 - 0.05, y_s))
    ax.plot([x_qkv + _side(d_v) / 2 + 0.05, x_b], [rows[2]] * 2, color=V, lw=1)
    draw.arrow(ax, (x_b, rows[2]), (x_b, y_s - hn / 2 - 0.3), V)
    return Diagram(fig, f"Self-attention in matrix form: the inputs A ({n}, {d_model}) times W^q, W^k "
                        f"and W^v give Q ({n}, {d_k}), K ({n}, {d_k}) and V ({n}, {d_v}); the scores "
                        f"S = QK^T / sqrt(d_k) are ({n}, {n}), softmax by rows gives A' ({n}, {n}), "
                        f"and B = A'V is ({n}, {d_v}).")


# Chapter 3's race: the same one-head tagger with each scorer, and two controls.

RACE_ARMS = ("dot", "scaled_dot", "additive")
CONTROLS = ("key_only",)


class KeyOnlyScorer(AdditiveScorer):
    r"""The additive scorer with the query left out: $s(q, k) = w^\top \tanh(W_k k)$, the same
    parameters as :class:`~selfattn.scoring.AdditiveScorer` ($W_q$ kept, unused). Every query
    gets the same row of scores: a score of the key alone, a *key detector*."""

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        s = self.w(torch.tanh(self.w_k(key))).squeeze(-1)  # (..., S)
        return s.unsqueeze(-2).expand(*query.shape[:-1], key.shape[-2])  # (..., L, S)


def race_tagger(arm: str, vocab_size: int, n_tags: int, d: int = 32) -> AttentionTagger:
    """One arm of chapter 3's race: a one-head :class:`~selfattn.book.tagging.AttentionTagger`
    scored by ``arm``: ``"dot"``, ``"scaled_dot"``, ``"additive"``, or the control
    ``"key_only"`` (the additive head with :class:`KeyOnlyScorer`). Every arm has the same
    parameters. (Whether a flatter start explains a winner is chapter 4's start-matched
    control, :func:`rescale_scores`.)"""
    scorer = {"key_only": "additive"}.get(arm, arm)
    model = AttentionTagger(vocab_size, n_tags, d=d, scorer=scorer)
    attn = model.attn
    assert isinstance(attn, ScoredSelfAttention)
    if arm == "key_only":
        key_only = KeyOnlyScorer(d, d, attn.additive.w.in_features)
        key_only.load_state_dict(attn.additive.state_dict())
        attn.additive = key_only
    return model


@dataclass
class RaceArm:
    """One arm of the race, over its seeds: accuracy on the ambiguous word, whether each run
    learned the tag, its parameters, the process time it took, the loss curves, the step-0 top
    weight in the ambiguous word's row, and the number of cues each run attends to."""

    taggers: list[AttentionTagger]
    accuracy: list[float]
    learned: list[bool]
    n_params: int
    seconds: float
    losses: list[list[float]]
    start_top: float
    attended: list[int]
    cue_weight: list[list[float]]  # per run, per cue: the weight from the word to its cue
    cue_accuracy: list[list[float]]  # per run, per cue: accuracy on the word


def _cue_rows(model: AttentionTagger, test: TaggingData, n: int) -> tuple[list[float], list[float]]:
    """Per cue word, the mean weight from the ambiguous word to its cue, and the accuracy."""
    device = next(model.parameters()).device
    rows = torch.arange(n)
    tokens = test.tokens[:n].to(device)
    saw, cue = test.position[:n], test.cue_position[:n]  # (n,) each
    sense = test.tags[rows, saw]  # (n,)
    with torch.no_grad():
        logits, w = model(tokens, need_weights=True)  # (n, T, tags), (n, 1, T, T)
    on_cue = w[:, 0].cpu()[rows, saw, cue]  # (n,)
    right = logits.cpu()[rows, saw].argmax(-1) == sense  # (n,)
    word = test.tokens[rows, cue]  # (n,): the cue word, 1..n_cues
    weight = [on_cue[word == c].mean().item() for c in range(1, test.n_cues + 1)]
    acc = [right[word == c].float().mean().item() for c in range(1, test.n_cues + 1)]
    return weight, acc


def _race_model(arm: str, vocab_size: int, n_tags: int, d: int,
                device: torch.device | str) -> nn.Module:
    return race_tagger(arm, vocab_size, n_tags, d).to(device)


def scorer_race(task: TaggingData, test: TaggingData, seeds: Sequence[int],
                arms: Sequence[str] = RACE_ARMS + CONTROLS, learned: float = 0.95,
                steps: int = 600, batch_size: int = 32, d: int = 32, n_cues_test: int = 500,
                device: torch.device | str = "cpu") -> dict[str, RaceArm]:
    """Chapter 3's race: each arm of :func:`race_tagger` trained from every seed side by side
    (:func:`~selfattn.book.kit.train.train_seeds`), the same steps, batch and learning rate for
    all. A run has *learned* the tag when its accuracy on the ambiguous word passes ``learned``.
    A cue counts as attended when the word puts more than half its weight on it, on average
    over the first ``n_cues_test`` test sentences that have that cue."""
    import time

    from .kit import train

    out = {}
    for arm in arms:
        start = time.process_time()
        models, histories = train.train_seeds(
            partial(_race_model, arm, task.vocab_size, task.n_tags, d, device),
            task, seeds=seeds, steps=steps, batch_size=batch_size, progress=False)
        taggers = [m for m in models if isinstance(m, AttentionTagger)]
        seconds = time.process_time() - start
        accuracy = [ambiguous_correct(t, test).float().mean().item() for t in taggers]
        tops = []
        for seed in seeds:  # the same models before training, as train_seeds built them
            torch.manual_seed(seed)
            fresh = race_tagger(arm, task.vocab_size, task.n_tags, d).to(device)
            with torch.no_grad():
                _, w = fresh(test.tokens[:n_cues_test].to(device), need_weights=True)
            rows = torch.arange(w.shape[0])
            saw = w[:, 0].cpu()[rows, test.position[:n_cues_test]]  # (n, T)
            tops.append(saw.max(-1).values.mean().item())
        cues = [_cue_rows(t, test, n_cues_test) for t in taggers]
        out[arm] = RaceArm(
            taggers=taggers, accuracy=accuracy, learned=[a > learned for a in accuracy],
            n_params=count_parameters(taggers[0]), seconds=seconds,
            losses=[h.loss for h in histories], start_top=sum(tops) / len(tops),
            attended=[sum(w > 0.5 for w in weight) for weight, _ in cues],
            cue_weight=[weight for weight, _ in cues], cue_accuracy=[acc for _, acc in cues])
    return out


def assert_race(race: dict[str, RaceArm], n_cues: int) -> None:
    """The asserts behind chapter 3's race, each with a margin a fresh range of seeds passes:
    equal parameters; the additive head learns the tag from nearly every seed, more than either
    dot product; some dot-product runs get stuck; the unscaled head starts peaked; a run that
    learned attends to all cues or all but one, a run that missed ignores two or more; the
    key-only score learns as reliably as the additive one."""
    count = {arm: sum(r.learned) for arm, r in race.items()}
    assert len({r.n_params for r in race.values()}) == 1, {a: r.n_params for a, r in race.items()}
    assert count["additive"] >= 8, count
    assert count["additive"] > max(count["dot"], count["scaled_dot"]), count
    assert count["dot"] + count["scaled_dot"] <= 18, count  # some dot runs get stuck
    assert race["dot"].start_top > 2 * race["scaled_dot"].start_top  # unscaled: peaked
    for arm, r in race.items():  # learning is cue by cue: the last cue comes free
        for k, ok in zip(r.attended, r.learned, strict=True):
            assert k >= n_cues - 1 if ok else k <= n_cues - 2, (arm, r.attended)
    if "key_only" in race:
        assert count["key_only"] >= 8, count  # the query is not needed


@_checker
def check_uniform_scale(scale: object) -> str:
    """Chapter 2, exercise 1: a ``scale`` that makes every query attend equally to every key."""
    scale = _number(scale)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(5, 8, generator=g, dtype=torch.float64) for _ in range(3))
    _, w = scaled_dot_product_attention(q, k, v, scale=float(scale))
    if scale != 0 or not torch.equal(w, torch.full_like(w, 1 / 5)):
        raise NotYet(f"with scale={scale} the weights still follow the scores: here they spread "
                     f"over {w.max() - w.min():.1e} (uniform would be 0.2 everywhere), and larger "
                     "q and k would spread them more; which scale makes every score equal?")
    return f"with scale={scale} every score is 0, so softmax gives 1/S to each key"


@_checker
def check_causal_mask(fn: object) -> str:
    """Chapter 2, exercise 2: ``fn(L)`` returns the (L, L) bool causal mask, True = may attend."""
    for L in (1, 2, 5, 8):
        want = causal_mask(L)
        got = _tensor(_call(fn, L), want)
        if got.dtype != torch.bool:
            raise NotYet(f"for L={L} the mask has dtype {got.dtype}; a mask that says where to "
                         "attend should be bool")
        if torch.equal(got, want):
            continue
        if L > 1 and torch.equal(got, ~want):
            raise NotYet("the polarity is reversed: True must mean 'may attend'")
        if not got.diagonal().all():
            raise NotYet(f"for L={L} the mask hides the diagonal: every token must be able to "
                         "attend to itself (token 0 would see nothing)")
        raise NotYet(f"for L={L} the mask differs from the causal mask at "
                     f"{int((got != want).sum())} positions")
    return "query i may attend to keys 0..i, for every length tried"


@_checker
def check_attention(fn: object) -> str:
    """Chapters 2 and 8: ``fn(q, k, v, mask)`` computes masked attention's output, ``mask`` bool
    broadcastable to (B, H, L, S), True = may attend."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 4, 8, generator=g, dtype=torch.float64)  # (B, H, L, E)
    k = torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64)  # (B, H, S, E)
    v = torch.randn(2, 3, 6, 5, generator=g, dtype=torch.float64)  # (B, H, S, Ev)
    everything = torch.ones(1, 1, 1, 6, dtype=torch.bool)  # no key masked
    unmasked, _ = scaled_dot_product_attention(q, k, v)
    plain = _tensor(_call(fn, q, k, v, everything), unmasked)
    if plain.isnan().any():
        raise NotYet("with a mask that keeps every key (all True) the output holds NaN: True means "
                     "'may attend', so fill the scores where the mask is False")
    if not torch.allclose(plain, unmasked):
        over_queries = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-2) @ v
        if torch.allclose(plain, over_queries):
            raise NotYet("even with no key masked the output differs: the softmax normalises over "
                         "the queries (dim=-2); each query's weights must sum to 1 over the keys")
        raise NotYet("even with no key masked the output differs from softmax(q k^T / sqrt(E)) v, "
                     f"by up to {(plain - unmasked).abs().max():.3g}")
    mask = padding_mask(torch.tensor([6, 2]))[:, None, None, :]  # (B, 1, 1, S)
    want, _ = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = _tensor(_call(fn, q, k, v, mask), want)
    if torch.allclose(got, want):
        return "matches selfattn.scaled_dot_product_attention on a padded batch"
    if got.isnan().any():
        raise NotYet("the output holds NaN: some row has every key filled with -inf; check which "
                     "entries your mask fills")
    if torch.allclose(got, unmasked):
        raise NotYet("the output ignores the mask: padded keys must get weight 0")
    raise NotYet(f"largest difference from the reference: {(got - want).abs().max():.3g}")


_PROJECTIONS = {"W_q": "d_k", "W_k": "d_k", "W_v": "d_v"}


_ROLES = {"W_q": "queries", "W_k": "keys", "W_v": "values"}


def _linears(layer: object, sizes: dict[str, int]) -> dict[str, nn.Linear]:
    """The reader's ``W_q``, ``W_k``, ``W_v``: each an ``nn.Linear(d_model, d_k or d_v, bias=False)``."""
    if not isinstance(layer, nn.Module):
        raise NotYet(f"your class should be an nn.Module (class ...(nn.Module)), got an instance "
                     f"of {type(layer).__name__}")
    found: dict[str, nn.Linear] = {}
    given = ", ".join(f"{k}={v}" for k, v in sizes.items())
    for name, out_name in _PROJECTIONS.items():
        linear = getattr(layer, name, None)
        if linear is None:
            raise NotYet(f"your class has no attribute {name}: in __init__, set "
                         f"self.{name} = nn.Linear(d_model, {out_name}, bias=False)")
        if not isinstance(linear, nn.Linear):
            raise NotYet(f"{name} should be an nn.Linear, got {type(linear).__name__}")
        want = (sizes["d_model"], sizes[out_name])
        if (linear.in_features, linear.out_features) != want:
            raise NotYet(f"given {given}, {name} maps {linear.in_features} features to "
                         f"{linear.out_features}; it should map d_model={want[0]} to "
                         f"{out_name}={want[1]}: nn.Linear(d_model, {out_name}, bias=False)")
        if linear.bias is not None:
            raise NotYet(f"{name} has a bias: build it with nn.Linear(..., bias=False)")
        found[name] = linear
    return found


def _attention_layer_case(cls: object, d_model: int, d_k: int, d_v: int, seed: int) -> None:
    sizes = {"d_model": d_model, "d_k": d_k, "d_v": d_v}
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        try:
            layer = _call(cls, d_model, d_k, d_v, kind="class")
        except NotYet as why:
            if "before Module.__init__() call" in str(why):
                raise NotYet(f"{why}. Call super().__init__() first in your __init__") from None
            raise
    linears = _linears(layer, sizes)
    assert isinstance(layer, nn.Module)  # _linears said so
    # weights scaled so that the scores q.k / sqrt(d_k) have unit variance: no softmax saturates
    weights = {name: torch.randn(lin.out_features, d_model, generator=g) / math.sqrt(d_model)
               for name, lin in linears.items()}
    with torch.no_grad():
        for name, linear in linears.items():
            linear.weight.copy_(weights[name])
    layer.eval()
    x = torch.randn(2, 5, d_model, generator=g)  # (B, T, d_model)
    proj = {name: x @ w.T for name, w in weights.items()}  # (B, T, d_k or d_v)
    q, k, v = proj["W_q"], proj["W_k"], proj["W_v"]
    with torch.no_grad():
        if d_k == d_v:  # the library's layer, one head, weights copied, out_proj the identity
            with torch.random.fork_rng(devices=[]):
                mha = MultiHeadAttention(d_model, 1, head_dim=d_k, out_dim=d_v, bias=False).eval()
            for ours, name in [(mha.q_proj, "W_q"), (mha.k_proj, "W_k"), (mha.v_proj, "W_v")]:
                ours.weight.copy_(weights[name])
            mha.out_proj.weight.copy_(torch.eye(d_v))
            want, _ = mha(x)
        else:
            want, _ = scaled_dot_product_attention(q, k, v)
        got = _call(layer, x, kind="class's forward")
    if isinstance(got, tuple):
        raise NotYet(f"your forward returned a tuple of {len(got)}; return only the output "
                     f"(B, T, d_v)")
    got = _tensor(got, want)
    if _close(got, want):
        return

    def attend(q: Tensor, k: Tensor, v: Tensor, scale: float = 1 / math.sqrt(d_k), dim: int = -1,
               softmax: bool = True) -> Tensor:
        scores = q @ k.transpose(-2, -1) * scale  # (B, T, T)
        return (torch.softmax(scores, dim=dim) if softmax else scores) @ v

    candidates: Mistakes = [
        (lambda: attend(q, k, v, scale=1.0), "forgot the scale: divide the scores by sqrt(d_k) "
         "before the softmax (with the weights copied, your output is softmax(Q K^T) V)"),
        (lambda: attend(q, k, v, scale=1 / math.sqrt(d_model)), "the scores are divided by "
         "sqrt(d_model); the scale is 1 / sqrt(d_k), the width of the queries and keys"),
        (lambda: attend(q, k, v, scale=1 / math.sqrt(d_v)), "the scores are divided by sqrt(d_v); "
         "the scale is 1 / sqrt(d_k), the width of the queries and keys"),
        (lambda: attend(q, k, v, scale=1 / d_k), "the scores are divided by d_k; the scale is "
         "1 / sqrt(d_k), the square root"),
        (lambda: attend(q, k, v, dim=-2), "the softmax runs over the queries (dim=1, or -2): "
         "each query's weights must sum to 1 over the keys, softmax(..., dim=-1)"),
        (lambda: attend(q, k, v, dim=0), "the softmax runs over the batch (dim=0): each query's "
         "weights must sum to 1 over the keys, softmax(..., dim=-1)"),
        (lambda: attend(q, k, v, softmax=False), "there is no softmax: the scaled scores must "
         "become weights that sum to 1 over the keys, softmax(..., dim=-1)"),
    ]
    for names in itertools.product(_PROJECTIONS, repeat=3):  # a projection used for another role
        wrong = [f"your {_ROLES[right]} come from {used}"
                 for used, right in zip(names, _PROJECTIONS, strict=True) if used != right]
        if wrong:
            candidates.append((partial(attend, proj[names[0]], proj[names[1]], proj[names[2]]),
                               " and ".join(wrong) + ": queries, keys and values each have their "
                               "own projection, W_q, W_k and W_v"))
    hint = _first_match(got, candidates)
    raise NotYet(hint or f"given d_model={d_model}, d_k={d_k}, d_v={d_v}, with the weights copied, "
                 f"your output differs from softmax(Q K^T / sqrt(d_k)) V by up to "
                 f"{(got.detach().to(want.dtype) - want).abs().max():.3g}")


@_checker
def check_attention_layer(cls: object) -> str:
    """Chapter 2, build-it exercise: ``cls(d_model, d_k, d_v)`` is a one-head self-attention
    ``nn.Module`` with ``nn.Linear`` projections ``W_q``, ``W_k`` (d_model -> d_k) and ``W_v``
    (d_model -> d_v), all ``bias=False``, whose ``forward(x)`` maps ``(B, T, d_model)`` to
    ``softmax(Q K^T / sqrt(d_k)) V`` of shape ``(B, T, d_v)``. Checked with the weights copied
    into a one-head :class:`~selfattn.MultiHeadAttention` whose output projection is the
    identity, and with d_v != d_k against :func:`~selfattn.scaled_dot_product_attention`."""
    _attention_layer_case(cls, d_model=8, d_k=4, d_v=4, seed=20)
    _attention_layer_case(cls, d_model=12, d_k=4, d_v=6, seed=21)
    return ("with the weights copied, your layer computes what a one-head "
            "selfattn.MultiHeadAttention computes (its out_proj the identity), and keeps "
            "d_k and d_v apart")


def additive_parameters(query_dim: int, key_dim: int, hidden: int) -> int:
    """Chapter 3, exercise 1: the numbers an ``AdditiveScorer(query_dim, key_dim, hidden)`` learns,
    counted on the module."""
    return count_parameters(AdditiveScorer(query_dim, key_dim, hidden))


def additive_pair_bytes(L: int, S: int, hidden: int) -> int:
    """Chapter 3, exercise 2: the bytes of the ``(L, S, hidden)`` float32 tensor the additive scorer
    builds for ``L`` queries and ``S`` keys, as the scorer builds it, on PyTorch's meta device
    (shapes and dtypes, no memory), so that gigabytes cost nothing."""
    with torch.device("meta"):
        scorer = AdditiveScorer(2, 2, hidden)
        pairs = scorer.w_q(torch.zeros(L, 2)).unsqueeze(-2) + scorer.w_k(torch.zeros(S, 2)).unsqueeze(-3)
    return pairs.nbytes


@_checker
def check_additive_parameters(fn: object) -> str:
    """Chapter 3, exercise 1: ``fn(query_dim, key_dim, hidden)`` counts an AdditiveScorer's numbers."""
    same_as(fn, additive_parameters, [(8, 8, 4), (10, 3, 16), (1, 1, 1)],
            "{args}: you say {got!r}, the scorer has {want}", names=("query_dim", "key_dim", "hidden"))
    return "W_q (hidden x query_dim) + W_k and its bias (hidden x key_dim + hidden) + w (hidden)"


@_checker
def check_additive_bytes(fn: object) -> str:
    """Chapter 3, exercise 2: ``fn(L, S, hidden)`` is the size in bytes of the float32
    ``(L, S, hidden)`` tensor the additive scorer builds, checked against the real tensor."""
    same_as(fn, additive_pair_bytes, [(4, 6, 8), (128, 128, 32), (1, 1000, 3)],
            "{args}: you say {got!r}, the tensor takes {want} bytes", names=("L", "S", "hidden"))
    return "L * S * hidden numbers of 4 bytes each"


class _LayersOnly(nn.Module):
    """An :class:`~selfattn.scoring.AdditiveScorer`'s layers ``w_q``, ``w_k`` and ``w``, without
    its forward: the reader builds the scores from the layers."""

    def __init__(self, scorer: nn.Module) -> None:
        super().__init__()
        self.w_q, self.w_k, self.w = scorer.w_q, scorer.w_k, scorer.w

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        raise RuntimeError("build the scores from scorer.w_q, scorer.w_k and scorer.w; calling "
                           "scorer(query, key) is the part this exercise asks you to write")


def _masked_additive_case(fn: object, L: int, S: int, q_dim: int, k_dim: int, mask: Tensor,
                          what: str, seed: int) -> None:
    from ..scoring import AdditiveScorer, attention

    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        scorer = AdditiveScorer(q_dim, k_dim, hidden=8).eval()
    q = torch.randn(2, L, q_dim, generator=g)  # (B, L, Eq)
    k = torch.randn(2, S, k_dim, generator=g)  # (B, S, Ek)
    v = torch.randn(2, S, 3, generator=g)  # (B, S, Ev), Ev != S: (weights, output) cannot pass
    with torch.no_grad():
        want_out, want_w = attention(q, k, v, scorer=scorer, attn_mask=mask)
        got = _call(fn, q, k, v, mask, _LayersOnly(scorer))
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise NotYet(f"return (output, weights), as scoring.attention does; got "
                     f"{type(got).__name__}")
    given = f"with {what}"
    if isinstance(got[0], Tensor) and got[0].shape == want_w.shape and _close(got[0], want_w):
        raise NotYet(f"{given}, your first result holds the weights: return (output, weights), "
                     "in that order, as scoring.attention does")
    got_w = _tensor(got[1], want_w)
    if not _close(got_w, want_w):
        hq = q @ scorer.w_q.weight.T  # (B, L, h)
        hk = k @ scorer.w_k.weight.T  # (B, S, h)
        w = scorer.w.weight[0]  # (h,)

        def weights(scores: Tensor, keep: Tensor | None = mask, dim: int = -1) -> Tensor:
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))
            return torch.softmax(scores, dim=dim)  # (B, L, S)

        with torch.no_grad():
            s = scorer(q, k)  # (B, L, S)
            candidates: Mistakes = [
                (lambda: weights(s, None), f"{given}, the mask is not applied: before the "
                 "softmax, fill the scores where the mask is False with -inf"),
                (lambda: weights(s, dim=-2), f"{given}, the softmax runs over the queries (dim=-2): "
                 "each query's weights must sum to 1 over the keys, softmax(..., dim=-1)"),
                (lambda: torch.softmax(s, dim=-1) * mask, f"{given}, the weights are zeroed after "
                 "the softmax, so a row no longer sums to 1: mask the scores before the softmax"),
                (lambda: torch.softmax(s.masked_fill(mask, -1e9), dim=-1), f"{given}, the mask's "
                 "polarity is reversed: True means 'may attend', so fill the scores where the "
                 "mask is False, masked_fill(~mask, ...)"),
                (lambda: torch.softmax(s.masked_fill(~mask, 0.0), dim=-1), f"{given}, the masked "
                 "scores are set to 0, an ordinary score that still gets weight: fill them with "
                 "-inf, masked_fill(~mask, float('-inf')), so their weight is 0"),
                (lambda: weights(((hq.unsqueeze(-2) + hk.unsqueeze(-3) + scorer.w_k.bias) * w)
                                 .sum(-1)), f"{given}, there is no tanh: the score is "
                 "w^T tanh(W_q q + W_k k), the tanh between the sum and w"),
                (lambda: weights(torch.tanh(hq.unsqueeze(-2) + hk.unsqueeze(-3)) @ w),
                 f"{given}, the bias of W_k is missing: scorer.w_k(key) adds it, "
                 "scorer.w_k.weight alone does not"),
                (lambda: weights(s / math.sqrt(w.numel())), f"{given}, the scores are divided "
                 "by sqrt(hidden): the additive score is not scaled"),
            ]
            if L == S:
                candidates.append((lambda: weights(s.transpose(-2, -1)), f"{given}, the scores "
                                   "are transposed: row i must hold s(q_i, k_j) for every key j, "
                                   "W_q q unsqueezed to (..., L, 1, h) and W_k k to (..., 1, S, h)"))
            hint = _first_match(got_w, candidates)
            reversed_mask = weights(s, ~mask)  # a row whose keys are all kept turns all NaN
            if torch.equal(got_w.detach().isnan(), reversed_mask.isnan()) and _close(
                    got_w.nan_to_num(), reversed_mask.nan_to_num()):
                hint = (f"{given}, the mask's polarity is reversed: True means 'may attend', so "
                        "fill the scores where the mask is False, masked_fill(~mask, ...)")
        raise NotYet(hint or f"{given}, your weights differ from scoring.attention's by up to "
                     f"{(got_w.detach().to(want_w.dtype) - want_w).abs().max():.3g}")
    got_out = _tensor(got[0], want_out)
    if not _close(got_out, want_out):
        raise NotYet(f"{given}, the weights are right but the output is not: the output is the "
                     "weights times the values, weights @ value, (B, L, S) @ (B, S, Ev)")


@_checker
def check_masked_additive_attention(fn: object) -> str:
    """Chapter 3, build-it exercise: ``fn(query, key, value, mask, scorer)`` returns ``(output,
    weights)`` of masked additive attention, ``softmax(w^T tanh(W_q q + W_k k))`` over the keys
    that ``mask`` (bool, True = may attend) keeps, times ``value``; the scores are built from the
    layers ``scorer.w_q``, ``scorer.w_k`` and ``scorer.w`` of a
    :class:`~selfattn.scoring.AdditiveScorer`. Checked against :func:`~selfattn.scoring.attention`
    with that scorer, on self-attention with a causal mask and on queries and keys of different
    widths with padded keys."""
    causal = torch.ones(5, 5, dtype=torch.bool).tril()  # (L, S): key j <= query i
    _masked_additive_case(fn, 5, 5, 6, 6, causal, "a causal mask over 5 tokens", seed=30)
    padded = (torch.arange(7) < torch.tensor([7, 4])[:, None])[:, None, :]  # (B, 1, S)
    _masked_additive_case(fn, 3, 7, 6, 4, padded,
                          "3 queries of width 6, 7 keys of width 4, the second sequence's last "
                          "3 keys padding", seed=31)
    return ("your masked additive attention gives scoring.attention's weights and output, with a "
            "causal mask and with padded keys of another width")


def _general_case(fn: object, q_shape: tuple[int, ...], k_shape: tuple[int, ...], what: str,
                  g: torch.Generator) -> None:
    from ..scoring import GeneralScorer, attention

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(33)
        scorer = GeneralScorer(q_shape[-1], k_shape[-1])
    W = torch.randn(q_shape[-1], k_shape[-1], generator=g)  # (Eq, Ek)
    with torch.no_grad():
        scorer.weight.copy_(W)
    q, k = torch.randn(*q_shape, generator=g), torch.randn(*k_shape, generator=g)
    v = torch.randn(*k_shape[:-1], 2, generator=g)  # (..., S, 2)
    given = f"with {what}"
    with torch.no_grad():
        want = scorer(q, k)  # (..., L, S)
        try:
            got = _call(fn, q, k, W.clone())
        except NotYet as why:
            try:  # the hint only when the reader's error is the one that .T gives
                q @ W @ k.T
                transposed = None
            except RuntimeError as exc:
                transposed = str(exc)
            if len(q_shape) > 2 and transposed and transposed in str(why):
                raise NotYet(f"{why}. With a batch axis, transpose only the last two axes of the "
                             "keys, key.transpose(-2, -1): .T reverses every axis") from None
            raise
        flipped = (*want.shape[:-2], want.shape[-1], want.shape[-2])  # (..., S, L)
        if isinstance(got, Tensor) and got.shape != want.shape and tuple(got.shape) == flipped:
            raise NotYet(f"{given}, your scores have shape {tuple(got.shape)}, (S, L): row i "
                         f"must hold query i's scores, shape {tuple(want.shape)}")
        got = _tensor(got, want)
        if _close(got, want):
            def scores(a: Tensor, b: Tensor) -> Tensor:  # the reader's, shown right just above
                return _tensor(_call(fn, a, b, W), want)

            out, _ = attention(q, k, v, scorer=scores)
            want_out, _ = attention(q, k, v, scorer=scorer)
            if not _close(out, want_out):
                raise NotYet(f"{given}, your scores are right, but as a scorer in "
                             "scoring.attention they give another output")
            return
        kt = k.transpose(-2, -1)  # (..., Ek, S)
        candidates: Mistakes = [
            (lambda: q @ W.T @ kt, f"{given}, W is used transposed: q^T W k is "
             "query @ W @ key^T, W of shape (query_dim, key_dim)"),
            (lambda: (q @ W.T @ kt).transpose(-2, -1), f"{given}, the scores are transposed: "
             "row i must hold query i's scores, query @ W @ key^T"),
            (lambda: (q @ W @ kt).transpose(-2, -1), f"{given}, the scores are transposed: "
             "row i must hold query i's scores, query @ W @ key^T"),
            (lambda: want / math.sqrt(q_shape[-1]), f"{given}, the scores are divided by "
             "sqrt(query_dim): Luong's general score is not scaled"),
            (lambda: want / math.sqrt(k_shape[-1]), f"{given}, the scores are divided by "
             "sqrt(key_dim): Luong's general score is not scaled"),
        ]
        if q_shape[-1] == k_shape[-1]:  # one width: say so, not which of the two
            candidates[3:] = [(lambda: want / math.sqrt(q_shape[-1]), f"{given}, the scores "
                               "are divided by the square root of the width: Luong's general "
                               "score is not scaled")]
        if q_shape[-1] != k_shape[-1] or q_shape[-2] != k_shape[-2]:
            candidates = candidates[3:]  # the transposes do not even have the scores' shape
        hint = _first_match(got, candidates)
    raise NotYet(hint or f"{given}, your scores differ from q^T W k by up to "
                 f"{(got.detach().to(want.dtype) - want).abs().max():.3g}")


@_checker
def check_general_score(fn: object) -> str:
    """Chapter 3, build-it exercise: ``fn(query, key, W)`` returns Luong et al.'s "general"
    scores ``q^T W k`` for every query and key, ``(..., L, Eq), (..., S, Ek), W (Eq, Ek) ->
    (..., L, S)``. Checked against :class:`~selfattn.scoring.GeneralScorer` with ``W`` copied,
    and as a scorer through :func:`~selfattn.scoring.attention`."""
    g = torch.Generator().manual_seed(32)
    _general_case(fn, (5, 6), (5, 6), "5 queries and 5 keys of width 6", g)
    _general_case(fn, (4, 10), (6, 3), "4 queries of width 10 and 6 keys of width 3", g)
    _general_case(fn, (2, 5, 6), (2, 7, 4), "a batch of 2, 5 queries of width 6, 7 keys of "
                  "width 4", g)
    return ("your scores are q^T W k for every pair, with queries and keys of different widths and "
            "a batch axis, and they work as a scorer in scoring.attention")


@dataclass
class RowGradients:
    """What :func:`attention_gradients` measures, one entry per row (query) unless said."""

    at_scores: Tensor  # (rows,): the norm of the gradient at each row of scores
    at_q: Tensor  # (rows,): the norm of the gradient at each query
    at_W: float  # the norm of the gradient at W^q, all rows summed
    top_weight: Tensor  # (rows,): each row's largest weight


def attention_gradients(d_k: int, scaled: bool, n_keys: int = 16, L: int = 16, batch: int = 64,
                        seed: int | None = None) -> RowGradients:
    r"""The gradient of one attention layer at its scores, its queries and $W^q$, for random
    unit-variance inputs and keys of width ``d_k``, with the scale $1/\sqrt{d_k}$ or without.

    The queries are $q = x W^q$ with $W^q$ of entries $\mathcal{N}(0, 1/d_k)$ (unit-variance
    queries at every width); the loss is the output against a fixed random upstream gradient.
    ``seed`` defaults to ``1000 + d_k``, so both arms of one width see the same numbers.
    """
    g = torch.Generator().manual_seed(1000 + d_k if seed is None else seed)
    x = torch.randn(batch, L, d_k, generator=g)  # (B, L, d_k) inputs
    W_q = (torch.randn(d_k, d_k, generator=g) / math.sqrt(d_k)).requires_grad_(True)
    k = torch.randn(batch, n_keys, d_k, generator=g)  # (B, S, d_k)
    v = torch.randn(batch, n_keys, 8, generator=g)  # (B, S, 8)
    upstream = torch.randn(batch, L, 8, generator=g)  # (B, L, 8)
    scale = 1 / math.sqrt(d_k) if scaled else 1.0
    q = x @ W_q  # (B, L, d_k)
    scores = q @ k.transpose(-2, -1) * scale  # (B, L, S)
    weights = torch.softmax(scores, dim=-1)  # (B, L, S)
    out = weights @ v  # (B, L, 8)
    at_scores, at_q, at_W = torch.autograd.grad((out * upstream).sum(), [scores, q, W_q])
    return RowGradients(at_scores.norm(dim=-1).flatten(), at_q.norm(dim=-1).flatten(),
                        at_W.norm().item(), weights.max(-1).values.detach().flatten())


def top_share(norms: Tensor, fraction: float = 0.05) -> float:
    """The share of ``sum(norms**2)`` that the largest ``fraction`` of the entries carry
    (at least one entry): how concentrated a gradient is over its rows."""
    squared = norms.detach().flatten().double().pow(2).sort(descending=True).values
    top = max(1, round(fraction * len(squared)))
    return (squared[:top].sum() / squared.sum()).item()


def median_top_weight(d_k: int, n_keys: int, scaled: bool = False, n_rows: int = 10_000,
                      seed: int = 0) -> float:
    r"""The median, over ``n_rows`` random rows, of a row's largest softmax weight: one
    unit-variance query of width ``d_k`` against ``n_keys`` unit-variance keys.

    For a fixed query $q$ and keys of independent $\mathcal{N}(0, 1)$ entries, the scores
    $q \cdot k_j$ are independent $\mathcal{N}(0, |q|^2)$: they are drawn that way, as $|q|$
    times standard normals, so no ``(n_rows, n_keys, d_k)`` tensor of keys is ever held.
    """
    g = torch.Generator().manual_seed(seed)
    length = torch.randn(n_rows, d_k, generator=g, dtype=torch.float64).norm(dim=-1)  # (N,)
    z = torch.randn(n_rows, n_keys, generator=g, dtype=torch.float64)  # (N, S)
    scores = length[:, None] * z  # (N, S): q . k_j for every key
    if scaled:
        scores = scores / math.sqrt(d_k)
    return torch.softmax(scores, dim=-1).max(-1).values.median().item()


def rescale_scores(model: AttentionTagger, factor: float) -> AttentionTagger:
    r"""Chapter 4's start-matched control: multiply a dot-product tagger's $W^q$, $W^k$ and their
    biases by ``factor``, in place, and return it. Its scores are multiplied by
    ``factor**2``: with ``factor = d**-0.25`` the unscaled head computes, at its start, exactly
    the function of the scaled head built from the same seed ($c^2 = 1/\sqrt{d}$), and with
    ``factor = d**0.25`` the scaled head computes the unscaled one's. Training then keeps each
    head's own scale, so only the start is swapped."""
    attn = model.attn
    assert isinstance(attn, ScoredSelfAttention)
    with torch.no_grad():
        for proj in (attn.q_proj, attn.k_proj):
            proj.weight.mul_(factor)
            proj.bias.mul_(factor)
    return model


START_MATCHED = {"dot_gentle": ("dot", -0.25), "scaled_sharp": ("scaled_dot", 0.25)}
"""Chapter 4's two start-matched arms: the scorer trained, and the power of ``d`` that
:func:`rescale_scores` multiplies $W^q$ and $W^k$ by (the other arm's start)."""

START_MATCHED_FILE = "start_matched.json"  # beside this module; made by `python -m ... start-matched`


def start_matched(task: TaggingData, test: TaggingData, seeds: Sequence[int], d: int = 32,
                  steps: int = 600, batch_size: int = 32, arms: Sequence[str] = tuple(START_MATCHED),
                  device: torch.device | str = "cpu") -> dict[str, list[float]]:
    """Chapter 4's start-matched control, trained: each of ``arms`` (of :data:`START_MATCHED`)
    from every seed side by side (:func:`~selfattn.book.kit.train.train_seeds`, the chapter's
    steps and batch), and its accuracy on the ambiguous word of ``test``, one per seed."""
    from .kit import train

    out = {}
    for arm in arms:
        scorer, power = START_MATCHED[arm]
        def make(scorer: str = scorer, power: float = power) -> nn.Module:
            model = AttentionTagger(task.vocab_size, task.n_tags, d=d, scorer=scorer)
            return rescale_scores(model, d**power).to(device)

        models, _ = train.train_seeds(make, task, seeds=seeds, steps=steps,
                                      batch_size=batch_size, progress=False)
        out[arm] = [ambiguous_correct(m, test).float().mean().item() for m in models]
    return out


def _start_matched_data() -> tuple[TaggingData, TaggingData]:
    """Chapter 4's training and test sentences, drawn as the chapter draws them."""
    from .kit import train
    from .tagging import tagging_task

    return (tagging_task(4000, seq_len=24, seed=train.data_seed(0)),
            tagging_task(500, seq_len=24, seed=train.data_seed(1)))


def stored_start_matched(seeds: Sequence[int]) -> dict[str, list[float]] | None:
    """The accuracies :func:`start_matched` gave on chapter 4's data and ``seeds``, as stored in
    :data:`START_MATCHED_FILE` (two arms of thirty seeds take longer to train than the chapter's
    time budget allows), or None when the file holds other seeds or data (a fresh range of
    seeds: train them). The chapter re-trains a few stored seeds and asserts that they
    reproduce, so stale data fails the page. Made by
    ``python -m selfattn.book.single_head start-matched``."""
    import json
    from pathlib import Path

    from .kit import train

    path = Path(__file__).with_name(START_MATCHED_FILE)
    if not path.exists():
        return None
    stored = json.loads(path.read_text())
    if stored["seeds"] != list(seeds) or stored["data_seeds"] != [train.data_seed(0),
                                                                  train.data_seed(1)]:
        return None
    return {arm: stored["accuracy"][arm] for arm in START_MATCHED}


def _write_start_matched(n_seeds: int = 30) -> None:
    """Train chapter 4's start-matched arms on its seeds and data, and store their accuracies."""
    import json
    from pathlib import Path

    from .kit import train

    task, test = _start_matched_data()
    seeds = train.seed_range(n_seeds)
    accuracy = start_matched(task, test, seeds)
    path = Path(__file__).with_name(START_MATCHED_FILE)
    stored = {"seeds": list(seeds), "data_seeds": [train.data_seed(0), train.data_seed(1)],
              "accuracy": {arm: [round(a, 4) for a in acc] for arm, acc in accuracy.items()}}
    path.write_text(json.dumps(stored, indent=1) + "\n")
    print(f"wrote {path}: " + ", ".join(f"{arm} learned {sum(a > 0.95 for a in acc)} of "
                                         f"{len(acc)}" for arm, acc in accuracy.items()))


@dataclass
class CueGradients:
    """What :func:`cue_gradients` measures: one entry per sentence, the row of its ambiguous
    word."""

    cue: Tensor  # (N,): which cue word decides (1 .. n_cues)
    correct: Tensor  # (N,) bool: was the ambiguous word tagged right?
    top_weight: Tensor  # (N,): the row's largest weight
    cue_weight: Tensor  # (N,): a_j, the weight the row puts on the cue
    cue_grad: Tensor  # (N,): dL/ds_j, the gradient at the cue's score (the sentence's loss)
    all_grad: float  # the sum of |dL/ds| over every score (every row, every key)
    score_weight_grad: float  # the norm of the mean loss's gradient at W^q and W^k together


def cue_gradients(model: AttentionTagger, data: TaggingData) -> CueGradients:
    r"""For a one-head tagger (:class:`~selfattn.book.tagging.AttentionTagger` with ``scorer=...``,
    a dot-product scorer) on a tagging task: the ambiguous word's weight on its cue and the
    gradient at that score.

    The loss of each sentence is its mean cross-entropy over its tokens, so ``cue_grad`` does
    not depend on how many sentences are measured; ``score_weight_grad`` is measured on the mean
    over sentences (the training loss). By the softmax's Jacobian,
    $\partial L / \partial s_j = a_j (g_j - \bar g)$ with $g_j = \partial L / \partial a_j$.
    """
    import torch.nn.functional as F

    attn = model.attn
    assert isinstance(attn, ScoredSelfAttention)  # one head of a chosen scorer
    device = next(model.parameters()).device
    kept: dict[str, Tensor] = {}
    score = attn.score

    def keep(x: Tensor) -> Tensor:
        scores = score(x)  # (N, T, T)
        scores.retain_grad()
        kept["scores"] = scores
        return scores

    was_training = model.training
    model.eval()
    model.zero_grad()
    attn.score = keep  # type: ignore[method-assign]  # the instance's shadows the method, meanwhile
    try:
        tokens, tags = data.tokens.to(device), data.tags.to(device)
        logits, weights = model(tokens, need_weights=True)  # (N, T, C), (N, 1, T, T)
        per_token = F.cross_entropy(logits.flatten(0, 1), tags.flatten(), reduction="none")
        per_sentence = per_token.view(tags.shape).mean(-1)  # (N,)
        per_sentence.sum().backward()
    finally:
        del attn.score
        model.train(was_training)
    n = len(data)
    rows, pos = torch.arange(n), data.position.to(device)
    cue_pos = pos - data.distance.to(device)
    row = weights[rows, 0, pos].detach()  # (N, T): what the ambiguous word attends to
    at_scores = kept["scores"].grad  # (N, T, T)
    assert at_scores is not None  # backward reached the scores
    cue_grad = at_scores[rows, pos, cue_pos]  # (N,)
    grads = [p.grad.flatten() for p in (attn.q_proj.weight, attn.k_proj.weight) if p.grad is not None]
    predicted = logits.argmax(-1)[rows, pos]
    result = CueGradients(
        cue=data.tokens[rows.cpu(), cue_pos.cpu()],
        correct=(predicted == tags[rows, pos]).cpu(),
        top_weight=row.max(-1).values.cpu(),
        cue_weight=row[rows, cue_pos].cpu(),
        cue_grad=cue_grad.detach().cpu(),
        all_grad=at_scores.abs().sum().item(),
        score_weight_grad=(torch.cat(grads).norm() / n).item(),
    )
    model.zero_grad()
    return result


def query_gradient_ratio(d_k: int, n_draws: int = 5) -> float:
    """The typical query's gradient with the scale over without it (the ratio of the medians of
    :func:`attention_gradients`' ``at_q``), as the median over ``n_draws`` independent draws:
    one draw's ratio near the crossover depends on the draw, the median much less. The first
    draw is :func:`attention_gradients`' default one."""
    ratios = []
    for i in range(n_draws):
        seed = 1000 + d_k + 100_003 * i
        scaled = attention_gradients(d_k, True, seed=seed)
        unscaled = attention_gradients(d_k, False, seed=seed)
        ratios.append((scaled.at_q.median() / unscaled.at_q.median()).item())
    return float(torch.tensor(ratios).median())


def fisher_exact(k_a: int, n_a: int, k_b: int, n_b: int) -> float:
    """Two-sided Fisher exact test on two counts, ``k_a`` of ``n_a`` against ``k_b`` of
    ``n_b``: the chance, if both arms had the same rate, of a table at most as likely as this
    one given the margins (Fisher 1935). Small values: the counts differ more than chance
    explains."""
    total = k_a + k_b

    def p(x: int) -> float:  # hypergeometric: x of the successes in arm a
        return math.comb(n_a, x) * math.comb(n_b, total - x) / math.comb(n_a + n_b, total)

    seen = p(k_a)
    lo, hi = max(0, total - n_b), min(total, n_a)
    return min(1.0, sum(p(x) for x in range(lo, hi + 1) if p(x) <= seen * (1 + 1e-9)))


def sign_test(wins: int, losses: int) -> float:
    """Two-sided sign test on the discordant pairs of a paired design (Dixon and Mood 1946):
    two arms run from the same seed, ``wins`` seeds where only the first arm succeeded and
    ``losses`` where only the second did. Under the null hypothesis each discordant seed goes
    either way with chance one half, so the p-value is twice the binomial tail of the smaller
    count, capped at one. With no discordant seed it is one: nothing to tell the arms apart."""
    n, k = wins + losses, min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def dot_variance(d: int, variance: float) -> float:
    """Chapter 4, exercise 1: Var(q . k) for ``d`` independent entries of ``q`` and ``k``, each of
    variance ``variance``: ``d`` products of variance ``variance**2``."""
    return d * variance * variance


def saturation_width(n_keys: int = 64, threshold: float = 0.9) -> int:
    """Chapter 4, exercise 2: the smallest power of two ``d_k`` at which the median unscaled row of
    ``n_keys`` keys puts more than ``threshold`` of its weight on its top key."""
    return next(d for d in (2**i for i in range(1, 13)) if median_top_weight(d, n_keys) > threshold)


def gradient_crossover() -> int:
    """Chapter 4, exercise 3: the smallest power of two ``d_k`` at which the typical query gets
    more gradient with the scale than without it (:func:`query_gradient_ratio`)."""
    return next(d for d in (2**i for i in range(1, 11)) if query_gradient_ratio(d) > 1)


@_checker
def check_dot_variance(answer: object) -> str:
    """Chapter 4, exercise 1: the variance of q . k for d = 100 entries of variance 0.5 each."""
    answer = _number(answer)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(40_000, 100, generator=g, dtype=torch.float64) * 0.5**0.5
    k = torch.randn(40_000, 100, generator=g, dtype=torch.float64) * 0.5**0.5
    measured = (q * k).sum(-1).var().item()
    if abs(answer - measured) / measured >= 0.06:
        raise NotYet(f"{answer} is far from the measured variance; each term q_i k_i has variance "
                     "Var(q_i) * Var(k_i)")
    return (f"each product has variance 0.5 * 0.5 = 0.25; 100 of them give "
            f"{dot_variance(100, 0.5):g} (measured over 40,000 samples: {measured:.2f})")


def _power_of_two(answer: object) -> int:
    answer = _number(answer)
    if answer != int(answer) or int(answer) < 2 or int(answer) & (int(answer) - 1):
        raise NotYet(f"the answer is a power of two (2, 4, 8, ...), got {answer!r}")
    if answer > 4096:
        raise NotYet(f"{int(answer)} is far wider than any head here: look below 4096")
    return int(answer)


@_checker
def check_saturation_width(answer: object) -> str:
    """Chapter 4, exercise 2: the smallest power of two ``d_k`` at which the median unscaled row,
    one query against 64 keys, puts more than 0.9 of its weight on its top key."""

    d = _power_of_two(answer)
    at, below = median_top_weight(d, 64), median_top_weight(d // 2, 64)
    if at <= 0.9:
        raise NotYet(f"at d_k={d} the median top weight is {at:.3f}, not above 0.9 yet: go wider")
    if below > 0.9:
        raise NotYet(f"already at d_k={d // 2} the median top weight is {below:.3f}: the first "
                     "width above 0.9 is smaller")
    return (f"median top weight {below:.3f} at d_k={d // 2}, {at:.3f} at d_k={d} (measured over "
            "10,000 rows)")


@_checker
def check_gradient_crossover(answer: object) -> str:
    """Chapter 4, exercise 3: the smallest power of two ``d_k`` at which the typical query (the
    median row) gets more gradient with the scale than without it, as the median over several
    random draws (:func:`query_gradient_ratio`)."""
    ratio = query_gradient_ratio  # the median over several draws

    d = _power_of_two(answer)
    at, below = ratio(d), ratio(d // 2) if d > 2 else 0.0
    if at <= 1:
        raise NotYet(f"at d_k={d} the typical query gets {at:.3f} times the gradient with the "
                     "scale: still less, go wider")
    if below > 1:
        raise NotYet(f"already at d_k={d // 2} the ratio is {below:.3f}: look at smaller widths")
    return (f"the ratio scaled / unscaled at the typical query is {below:.3f} at d_k={d // 2} "
            f"and {at:.3f} at d_k={d}")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["start-matched"]:
        raise SystemExit("usage: python -m selfattn.book.single_head start-matched")
    _write_start_matched()
