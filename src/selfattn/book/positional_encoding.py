r"""Chapter 5, positional encoding: the latest-cue task, what an order-blind model can reach,
where the attention of each scheme goes (and where ALiBi's bias alone sends it), RoPE's rotation
drawn, and the chapter's checkers."""

from __future__ import annotations

import math
from functools import partial

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Arc, Circle
from torch import Tensor

from ..attention import scaled_dot_product_attention
from ..positional import alibi_bias, alibi_slopes, apply_rope, sinusoidal_encoding
from .kit import draw
from .kit.checkers import Mistakes, NotYet, _call, _checker, _close, _equal, _first_match, _number, _tensor
from .kit.draw import DPI, GREY, INK, MONO, OUT, Diagram, Q
from .kit.train import Sequences
from .kit.viz import PAGE_WIDTH


def recent_cue_task(n: int, seq_len: int = 32, n_cues: int = 4, cue_rate: float = 0.2,
                    vocab_size: int = 16, seed: int = 0) -> Sequences:
    """Tag every token with the most recent cue at or before it: a task about order.

    Tokens ``1..n_cues`` are cues (each position is a cue with probability ``cue_rate``), the
    rest fillers. The tag of position ``t`` is ``c - 1`` for the last cue ``c`` in tokens
    ``0..t``, or ``n_cues`` ("no cue yet"). Which cue is the *latest* depends only on relative
    order, so the rule is the same at every length: chapter 5 trains at one length and tests at
    longer ones. Without positions, attention sees the set of earlier cues but not their order.
    """
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


def order_blind_by_position(tokens: Tensor, n_cues: int) -> Tensor:
    """The chance, token by token, that the best order-blind tagger of a ``recent_cue_task``
    (:func:`selfattn.book.positional_encoding.order_blind_accuracy`, its mean) tags it right: 1 for a cue and
    before the first cue, else (count of the most frequent cue so far) / (cues so far).
    ``tokens`` ``(B, L)``; returns ``(B, L)``, so a chapter can take the ceiling of any span.
    """
    is_cue = (tokens >= 1) & (tokens <= n_cues)  # (B, L)
    counts = torch.stack([(tokens == c).cumsum(1) for c in range(1, n_cues + 1)])  # (C, B, L)
    seen, best = counts.sum(0), counts.max(0).values  # (B, L) each
    return torch.where(is_cue | (seen == 0), 1.0, best / seen.clamp(min=1))


def cue_masks(tokens: Tensor, n_cues: int, beyond: int) -> dict[str, Tensor]:
    """Attention masks (``True`` = may attend, causal) for a ``recent_cue_task`` batch that hide
    keys at least ``beyond`` tokens back (chapter 5): ``"band"`` hides all of them, ``"hide far
    old cues"`` only the cues among them (never the query's latest cue), ``"hide far fillers"``
    only the fillers. ``tokens`` ``(B, L)``; each mask ``(B, L, L)``, ``[b, query, key]``.
    """
    B, L = tokens.shape
    i = torch.arange(L, device=tokens.device)
    offset = i[:, None] - i[None, :]  # (L, L): query minus key
    causal, far = offset >= 0, offset >= beyond  # (L, L) each
    is_cue = (tokens >= 1) & (tokens <= n_cues)  # (B, L)
    latest = torch.where(is_cue, i, -1).cummax(1).values  # (B, L): per query
    old_cue = far & is_cue[:, None, :] & (i[None, None, :] != latest[:, :, None])  # (B, L, L)
    filler = far & ~is_cue[:, None, :]  # (B, L, L)
    return {
        "band": (causal & ~far).expand(B, L, L),
        "hide far old cues": causal & ~old_cue,
        "hide far fillers": causal & ~filler,
    }


def old_cue_ratio_by_offset(weights: Tensor, tokens: Tensor, n_cues: int, bin_width: int,
                            first_query: int = 0) -> Tensor:
    """How a ``recent_cue_task`` model weighs one old cue against the latest cue, by how far
    back the old cue is (chapter 5). For queries ``first_query`` onwards, with a cue before
    them: the head-averaged weight on each older cue over the weight on the latest cue, and
    the median of that ratio over every (query, old cue) pair whose offset falls in each bin
    ``[0, bin_width), [bin_width, 2 bin_width), ...``. Above 1: that old cue outweighs the
    latest. ``weights`` ``(B, H, L, L)``, ``tokens`` ``(B, L)``; returns ``(L // bin_width,)``,
    NaN for a bin with no pair.
    """
    w, is_cue, latest, i = _cue_view(weights, tokens, n_cues, first_query)
    on_latest = w.gather(2, latest.clamp(min=0)[..., None])  # (B, Q, 1)
    ratio = w / on_latest.clamp_min(1e-30)  # (B, Q, L)
    offset = (i[first_query:, None] - i[None, :]).expand_as(ratio)  # (B, Q, L)
    old = is_cue[:, None, :] & (i != latest[..., None]) & (offset >= 0) & (latest[..., None] >= 0)
    values, which = ratio[old], offset[old] // bin_width  # (pairs,) each: ratio and its bin
    out = []
    for b in range(len(i) // bin_width):
        in_bin = values[which == b]
        out.append(in_bin.median().item() if len(in_bin) else float("nan"))
    return torch.tensor(out)


def beyond_share(weights: Tensor, beyond: int, first_query: int = 0) -> Tensor:
    """The share of each head's weight on keys ``beyond`` or more positions back, averaged over
    the queries ``first_query`` onwards (and over the batch, if any). ``weights`` ``(..., H, L,
    L)``; returns ``(H,)``."""
    L = weights.shape[-1]
    i = torch.arange(L, device=weights.device)
    far = (i[:, None] - i[None, :]) >= beyond  # (L, L): keys at least `beyond` back
    share = (weights * far).sum(-1)[..., first_query:]  # (..., H, Q)
    return share.reshape(-1, *share.shape[-2:]).mean((0, 2)).cpu()


def alibi_prior(n_heads: int, length: int) -> Tensor:
    r"""ALiBi's own prior: the causal weights of a layer whose scores are all equal, so that the
    bias $-m_h (i - j)$ alone decides (Press et al. 2022, §3), ``(H, L, L)``. What a trained
    ALiBi model's weights would be if it read no content."""
    zeros = torch.zeros(n_heads, length, 1)
    _, w = scaled_dot_product_attention(zeros, zeros, zeros, attn_mask=alibi_bias(n_heads, length),
                                        is_causal=True)
    return w


def _cue_view(weights: Tensor, tokens: Tensor, n_cues: int, first_query: int
              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """What :func:`old_cue_ratio_by_offset` reads of a ``recent_cue_task``
    batch: the head-averaged weights of queries ``first_query`` on ``(B, Q, L)``, which tokens are
    cues ``(B, L)``, each query's latest cue at or before it ``(B, Q)`` (-1: none yet), and the
    positions ``(L,)``."""
    L = weights.shape[-1]
    w = weights.detach().float().cpu().mean(1)[:, first_query:]  # (B, Q, L): over heads
    tokens = tokens.cpu()
    i = torch.arange(L)
    is_cue = (tokens >= 1) & (tokens <= n_cues)  # (B, L)
    latest = torch.where(is_cue, i, -1).cummax(1).values[:, first_query:]  # (B, Q)
    return w, is_cue, latest, i


def rope_rotation(position: int = 3, theta: float = 1.0, x: tuple[float, float] = (1.0, 0.0)
                  ) -> Diagram:
    r"""RoPE turns a pair of features $(x_1, x_2)$ of a query at position $m$ by the angle
    $m\theta$ (Su et al. 2021, §3.2): drawn for $m = 0 \dots$ ``position``. The points are
    :func:`~selfattn.positional.apply_rope`'s output: pair 1 of a 4-feature vector turns by
    $\text{base}^{-2/4}$ per position, so ``base = theta ** -2`` makes that $\theta$."""
    x1, x2 = map(float, x)
    r = math.hypot(x1, x2)
    m = torch.arange(position + 1)
    vec = torch.tensor([0.0, 0.0, x1, x2], dtype=torch.float64).expand(position + 1, 4)
    points = apply_rope(vec, m, base=theta ** -2)[:, 2:].tolist()  # (position + 1, 2)
    W, H = PAGE_WIDTH, 3.2
    fig = Figure(figsize=(W, H), dpi=DPI, facecolor="white")
    ax = fig.add_axes((0.01, 0.01, (H - 0.1) / W, (H - 0.1) / H), aspect="equal")
    lim = 1.45 * r
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_axis_off()
    ax.add_patch(Circle((0, 0), r, fill=False, edgecolor=GREY, lw=0.8, ls="--"))
    ax.plot([-lim, lim], [0, 0], color=GREY, lw=0.6)
    ax.plot([0, 0], [-lim, lim], color=GREY, lw=0.6)
    ax.text(lim, -0.09 * r, "$x_1$", fontsize=10, color=INK, ha="right", va="top")
    ax.text(-0.09 * r, lim, "$x_2$", fontsize=10, color=INK, ha="right", va="top")
    for k, (px, py) in enumerate(points):
        color = Q if k == position else draw.tint(Q, 0.55)
        ax.annotate("", xy=(px, py), xytext=(0, 0), arrowprops={
            "arrowstyle": "-|>,head_length=0.5,head_width=0.25", "color": color, "lw": 1.4,
            "shrinkA": 0, "shrinkB": 0, "mutation_scale": 12})
        if theta >= 0.35 or k in (0, position):  # close vectors: label the first and the last
            ax.text(1.25 * px, 1.25 * py, f"m={k}", fontsize=9, color=INK, ha="center", va="center",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
    ax.plot([p[0] for p in points], [p[1] for p in points], "o", color=Q, ms=4, gid="rotated points")
    start, turn = math.degrees(math.atan2(x2, x1)), math.degrees(position * theta)
    if position:
        ax.add_patch(Arc((0, 0), 0.6 * r, 0.6 * r, theta1=start, theta2=start + turn, color=OUT, lw=1.5))
        # between two vectors, or past the last one when they are too close for a label
        mid = math.radians(start) + (position // 2 + 0.5 if theta >= 0.35 else position + 2.5) * theta
        ax.text(0.48 * r * math.cos(mid), 0.48 * r * math.sin(mid), rf"${position}\theta$", fontsize=10,
                color=OUT, ha="center", va="center")

    def note(x: float, y: float, text: str, **kw) -> None:  # x, y in inches from the bottom left
        fig.text(x, y, text, color=INK, va="top", transform=fig.dpi_scale_trans, **kw)

    note(3.5, H - 0.2, "RoPE turns each pair of features\nby its position times θ:", fontsize=10)
    note(3.5, H - 0.85, r"$R_m x = (x_1 \cos m\theta - x_2 \sin m\theta,$" "\n"
                        r"$\qquad\ \ x_1 \sin m\theta + x_2 \cos m\theta)$", fontsize=10)
    note(3.5, H - 1.5, f"θ = {theta:g} rad per position; apply_rope\ngives, for x = ({x1:g}, {x2:g}):",
         fontsize=8.5, family=MONO)
    rows = [f"m={k}: ({round(px, 2) + 0:+.2f}, {round(py, 2) + 0:+.2f})"  # + 0: no "-0.00"
            for k, (px, py) in enumerate(points)]
    half = math.ceil(len(rows) / 2) if len(rows) > 5 else len(rows)  # two columns past 5 rows
    for col, part in enumerate([rows[:half], rows[half:]]):
        note(3.5 + 1.55 * col, H - 1.95, "\n".join(part), fontsize=8.5, family=MONO)
    return Diagram(fig, f"RoPE on one pair of features (x_1, x_2) = ({x1:g}, {x2:g}): at position m it is "
                        f"turned by m × {theta:g} radians around the origin, drawn for m = 0 to "
                        f"{position} on a circle of radius {r:.2f}; its length never changes.")


def _rope_halves(x: Tensor, positions: Tensor) -> Tensor:
    """RoPE with feature i paired with feature i + d/2 (GPT-NeoX's ``rotate_half`` layout)."""
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angles = positions.double()[:, None] * theta  # (T, d/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


@_checker
def check_rope(fn: object) -> str:
    """Chapter 5, build-it exercise: ``fn(x, positions)`` rotates each pair of features
    ``(x[..., 2i], x[..., 2i+1])`` of ``x`` (..., T, d) at position ``positions[t]`` by the angle
    ``positions[t] * 10000^(-2i/d)``, as :func:`~selfattn.positional.apply_rope` does."""
    g = torch.Generator().manual_seed(50)
    cases = [((2, 3, 5, 2), torch.arange(5)),
             ((2, 3, 6, 8), torch.arange(6)),
             ((4, 7, 16), torch.arange(7)),
             ((1, 2, 4, 16), torch.tensor([3, 4, 10, 57]))]
    for shape, positions in cases:
        x = torch.randn(*shape, generator=g)
        before = x.clone()
        want = apply_rope(x, positions)
        got = _tensor(_call(fn, x, positions), want)
        if not _equal(x, before):
            raise NotYet("your function changed x in place: the caller's queries and keys must "
                         "stay as they were; build the result in a new tensor")
        if _close(got, want, atol=1e-4):
            continue
        given = f"given x of shape {shape} and positions {positions.tolist()}"
        candidates: Mistakes = [
            (partial(apply_rope, x, -positions), "the pairs turn the other way: the even "
             "feature becomes x_2i cos - x_2i+1 sin and the odd one x_2i sin + x_2i+1 cos"),
            (partial(_rope_halves, x, positions), "your function pairs the halves "
             "(x[..., i], x[..., i + d/2]); this RoPE, like apply_rope, pairs neighbours "
             "(x[..., 2i], x[..., 2i+1])"),
            (partial(apply_rope, x, positions, base=100.0), "the angles use "
             "10000^(-i/d) for pair i; the frequency of pair i is 10000^(-2i/d)"),
            (partial(apply_rope, x, positions, base=1e8), "the angles use "
             "10000^(-4i/d) for pair i: torch.arange(0, d, 2) already holds 2i, so do not "
             "double it again"),
            (partial(apply_rope, x, positions, base=1e-4), "the frequencies grow with i: "
             "theta_i = 10000^(-2i/d), with a minus sign"),
        ]
        if not torch.equal(positions, torch.arange(len(positions))):
            candidates.append((partial(apply_rope, x), f"{given}, your function rotates as if "
                               "the tokens sat at 0, 1, 2, ...: use the positions it is given"))
        hint = _first_match(got, candidates, atol=1e-2)  # float32 angles reach 1e5 in some
        if hint:
            raise NotYet(hint)
        norms = got.detach().to(x.dtype).norm(dim=-1)
        if not torch.allclose(norms, x.norm(dim=-1), atol=1e-4, rtol=1e-4):
            raise NotYet(f"{given}, your output vectors have other lengths than the inputs: a "
                         "rotation keeps lengths (cos^2 + sin^2 = 1), so each pair "
                         "(x_2i, x_2i+1) must become (x_2i cos - x_2i+1 sin, x_2i sin + x_2i+1 cos)")
        raise NotYet(f"{given}, your output differs from apply_rope by up to "
                     f"{(got.detach().to(want.dtype) - want).abs().max():.3g}")
    return ("pair (x_2i, x_2i+1) turns by position * 10000^(-2i/d), as "
            "selfattn.positional.apply_rope does; every length is kept")


@_checker
def check_sinusoidal(fn: object) -> str:
    """Chapter 5, exercise 1: ``fn(n_positions, d_model)`` is the sinusoidal table (Vaswani §3.5)."""
    for n, d in ((1, 2), (7, 4), (50, 16)):
        want = sinusoidal_encoding(n, d)
        got = _tensor(_call(fn, n, d), want).float()
        if not torch.allclose(got, want, atol=1e-5):
            swapped = torch.empty_like(want)
            swapped[:, 0::2], swapped[:, 1::2] = want[:, 1::2], want[:, 0::2]
            if torch.allclose(got, swapped, atol=1e-5):
                raise NotYet("sines and cosines are swapped: even columns take sin")
            raise NotYet(f"for {n} positions of width {d} the table differs from the formula by up "
                         f"to {(got - want).abs().max():.3g}")
    return "PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same)"


@_checker
def check_rope_turn(answer: object) -> str:
    """Chapter 5, exercise 2: after how many positions does RoPE's slowest pair (d = 64, base
    10000) turn a full circle?"""
    answer = _number(answer)
    theta = 10000.0 ** (-62 / 64)  # the angle per position of pair i = 31
    want = 2 * math.pi / theta
    if abs(answer - want) / want >= 0.01:
        raise NotYet(f"{answer:,} is not it; pair i turns by theta_i = 10000^(-2i/d) per position, "
                     "and a full circle is 2 pi")
    return (f"2 pi / 10000^(-62/64) = {want:,.0f} positions: far longer than any training "
            "sequence, so that pair's angles are never all seen")


@_checker
def check_alibi_slopes(fn: object) -> str:
    """Chapter 5, exercise 3: ``fn(n_heads)`` gives ALiBi's slopes for a power-of-two head count."""
    for n in (1, 2, 4, 8, 16):
        got = _call(fn, n)
        try:
            got = torch.as_tensor(got, dtype=torch.float64).flatten()
        except (TypeError, ValueError, RuntimeError):
            raise NotYet(f"for {n} heads give a list of numbers, got {got!r}") from None
        want = alibi_slopes(n).double()
        if got.shape != want.shape:
            raise NotYet(f"for {n} heads give {n} slopes, got {got.numel()}")
        if not torch.allclose(got, want):
            raise NotYet(f"for {n} heads: {[round(x, 4) for x in got.tolist()]}, expected "
                         f"{[round(x, 4) for x in want.tolist()]}")
    return "a geometric sequence: start = ratio = 2^(-8/n)"
