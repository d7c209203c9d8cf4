"""Chapters 6 and 7, heads: several heads (the neighbour task, the multi-head diagram), shared
key/value heads (which key/value head each query head reads, the grouped rows), the KV cache's
decoding benchmark, and the checkers of both chapters' exercises."""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch
from torch import Tensor

from .. import fastpaths
from ..attention import scaled_dot_product_attention
from ..cache import KVCache
from ..heads import merge_heads, repeat_kv, split_heads
from ..masks import causal_mask
from ..multihead import AttentionConfig, MultiHeadAttention
from .kit import draw
from .kit.checkers import (
    Mistakes,
    NotYet,
    _call,
    _checker,
    _close,
    _equal,
    _first_match,
    _seeded_layer,
    _tensor,
    same_as,
)
from .kit.draw import GREY, INK, MONO, OUT, Diagram, K, Q, V
from .kit.measure import count_parameters, synchronize
from .kit.train import Sequences
from .kit.viz import PAGE_WIDTH


def neighbour_task(n: int, seq_len: int = 16, vocab_size: int = 6, seed: int = 0) -> Sequences:
    """Tag every token with the pair (left neighbour, right neighbour).

    The tag of position ``t`` is ``left * (vocab_size + 1) + right``, where ``left`` is the token
    at ``t - 1`` and ``right`` the token at ``t + 1`` (``vocab_size`` stands for "no neighbour"
    at either end). One attention head can look left and another right: chapter 6 trains
    models with one, two and four heads on it and watches the heads specialise.
    """
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (n, seq_len), generator=g)  # (N, T)
    edge = torch.full((n, 1), vocab_size)
    left = torch.cat([edge, tokens[:, :-1]], dim=1)  # (N, T): the token before, or the edge
    right = torch.cat([tokens[:, 1:], edge], dim=1)  # (N, T): the token after, or the edge
    tags = left * (vocab_size + 1) + right
    return Sequences(tokens, tags, vocab_size, (vocab_size + 1) ** 2)


@dataclass(frozen=True)
class Lane:
    """One lane of :func:`split_attend_merge` (``q``, ``k`` or ``v``): its x (inches), colour,
    the input's label, the projection's, the split heads' shape, and each head's box label (query
    head ``i`` reads key/value head ``i // g``)."""

    name: str
    x: float
    color: tuple[float, float, float]
    input: str
    projection: str
    split: str
    heads: list[str]


@dataclass(frozen=True)
class HeadsLayout:
    """What :func:`split_attend_merge` draws, computed without matplotlib from an
    :class:`~selfattn.AttentionConfig` and the sizes ``B``, ``T`` (queries) and ``S`` (keys)."""

    config: AttentionConfig
    B: int
    T: int
    S: int

    @property
    def head_x(self) -> list[float]:
        """The centre of each head's column, inches."""
        pitch = _HEADS_SPAN / self.config.n_heads
        return [_HEADS_LEFT + pitch * (i + 0.5) for i in range(self.config.n_heads)]

    @property
    def lanes(self) -> list[Lane]:
        cfg, B, T, S = self.config, self.B, self.T, self.S
        h, hd, c = cfg.n_heads, cfg.head_dim, _HEADS_LEFT + _HEADS_SPAN / 2
        lanes = []
        h_kv = cfg.n_kv_heads
        for name, x, color, label, width, n, length in [("q", c - 1.2, Q, "query", cfg.d_model, h, T),
                                                        ("k", c, K, "key", cfg.kdim, h_kv, S),
                                                        ("v", c + 1.2, V, "value", cfg.vdim, h_kv, S)]:
            heads = [f"{name}{i if name == 'q' else i // cfg.group_size}" for i in range(h)]
            lanes.append(Lane(name, x, color, f"{label}\n{draw.shape(B, length, width)}",
                              f"{name}_proj\n{draw.shape(B, length, n * hd)}",
                              draw.shape(B, n, length, hd), heads))
        return lanes

    @property
    def notes(self) -> list[tuple[str, str]]:
        """Beside each step: its name in the code, then its output's shape in the code's names."""
        cfg = self.config
        kv = "n_kv_heads" if cfg.n_kv_heads != cfg.n_heads else "n_heads"  # chapter 7's, where it differs
        return [("inputs", "query (B, T, d_model)\nkey (B, S, kdim), value (B, S, vdim)"),
                ("q_proj, k_proj, v_proj", f"q: (B, T, n_heads·head_dim)\nk, v: (B, S, {kv}·head_dim)"),
                ("split_heads" + (", apply_rope" if cfg.rope else ""),
                 f"q: (B, n_heads, T, head_dim)\nk, v: (B, {kv}, S, head_dim)"),
                ("attend, per head", rf"softmax$(q k^\top / \sqrt{{{cfg.head_dim}}})\, v$"),
                ("merge_heads (concatenate)", "(B, T, n_heads·head_dim)"),
                ("out_proj", "(B, T, out_dim)")]

    @property
    def sizes(self) -> str:
        cfg, B, T, S = self.config, self.B, self.T, self.S
        h, h_kv = cfg.n_heads, cfg.n_kv_heads
        return (f"B={B}, T={T}, " + (f"S={S}, " if S != T else "") + f"d_model={cfg.d_model}, "
                f"n_heads={h}, " + (f"n_kv_heads={h_kv}, " if h_kv != h else "") +
                f"head_dim={cfg.head_dim}, kdim={cfg.kdim}, vdim={cfg.vdim}, out_dim={cfg.out_dim}")

    @property
    def alt(self) -> str:
        cfg, B, T, S = self.config, self.B, self.T, self.S
        h, hd = cfg.n_heads, cfg.head_dim
        kind = "" if cfg.n_kv_heads == h else f", {cfg.n_kv_heads} key/value heads"
        return (f"Multi-head attention with {h} heads of {hd} features{kind}: q_proj maps the query "
                f"{draw.shape(B, T, cfg.d_model)} to {draw.shape(B, T, h * hd)}, split_heads makes it "
                f"{draw.shape(B, h, T, hd)}, each head attends on its own (scores "
                f"{draw.shape(B, h, T, S)} from {S} keys), merge_heads concatenates the heads back to "
                f"{draw.shape(B, T, h * hd)} and out_proj (W^O) gives {draw.shape(B, T, cfg.out_dim)}.")


_HEADS_LEFT, _HEADS_SPAN = 0.15, 3.6  # inches: the heads' row, under the three lanes


def split_attend_merge(layer: MultiHeadAttention | AttentionConfig, B: int = 2, T: int = 5,
                       S: int | None = None) -> Diagram:
    r"""``MultiHeadAttention.forward`` as a picture, every shape from ``layer``'s config: project
    (``q_proj``, ``k_proj``, ``v_proj``), ``split_heads``, attend per head, ``merge_heads``
    (concatenate), ``out_proj`` ($W^O$) (Vaswani et al. 2017, §3.2.2). With fewer key/value heads
    than query heads (GQA, MQA), query head $i$ reads key/value head $i // (h / h_{kv})$.

    ``T`` queries attend to ``S`` keys and values (``S`` defaults to ``T``: self-attention); each
    head's scores are ``(T, S)``; every label comes from :class:`HeadsLayout`."""
    cfg = layer.config if isinstance(layer, MultiHeadAttention) else layer
    layout = HeadsLayout(cfg, B, T, T if S is None else S)
    return Diagram(_draw_heads(layout), layout.alt)


def _draw_heads(layout: HeadsLayout) -> Figure:
    cfg, B, T = layout.config, layout.B, layout.T
    h, hd = cfg.n_heads, cfg.head_dim
    W, H, bh, lw = PAGE_WIDTH, 4.7, 0.4, 1.1  # lw: a lane's box width
    y0, y1 = H - 0.3, H - 1.05  # inputs, projections (and a line of sizes at the bottom)
    y2 = y1 - 1.25  # the heads: q, k, v pieces stacked, 0.22 apart
    y3, y4 = y2 - 0.22 - 0.8, y2 - 0.22 - 1.55  # merged heads, out_proj
    left, span = _HEADS_LEFT, _HEADS_SPAN
    c, pitch, xh = left + span / 2, span / h, layout.head_x
    hw, size = min(0.4, 0.85 * pitch), 8 if h <= 8 else 7
    fig, ax = draw.canvas(W, H)
    ax.add_patch(FancyBboxPatch((left, y2 - 0.38), span, 0.76, boxstyle="round,pad=0,rounding_size=0.06",
                                facecolor="#f3f3f3", edgecolor="none"))
    for lane, row in zip(layout.lanes, (0.22, 0.0, -0.22), strict=True):
        x, color = lane.x, lane.color
        draw.box(ax, x, y0, lw, bh, lane.input, GREY, size=8.5, family=MONO)
        draw.arrow(ax, (x, y0 - bh / 2), (x, y1 + bh / 2))
        draw.box(ax, x, y1, lw, bh, lane.projection, color, size=8.5, family=MONO)
        draw.arrow(ax, (x, y1 - bh / 2), (x, y2 + 0.38), color)
        draw.text(ax, x, y2 + 0.62, lane.split, size=8.5, family=MONO, ha="center",
                  bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})  # on the arrow
        for x_i, label in zip(xh, lane.heads, strict=True):
            draw.box(ax, x_i, y2 + row, hw, 0.19, label, color, size=size, family=MONO)
    for x_i in xh:
        draw.arrow(ax, (x_i, y2 - 0.38), (x_i, y3 + bh / 2), OUT)
    draw.box(ax, c, y3, span, bh, "", OUT)  # the heads' outputs side by side
    for i in range(1, h):
        ax.plot([left + pitch * i] * 2, [y3 - bh / 2, y3 + bh / 2], color=OUT, lw=0.8)
    draw.text(ax, c, y3, f"merge_heads {draw.shape(B, T, h * hd)}", size=8.5, family=MONO, ha="center",
              bbox={"facecolor": draw.tint(OUT), "edgecolor": "none", "pad": 2})
    draw.arrow(ax, (c, y3 - bh / 2), (c, y4 + bh / 2), OUT)
    draw.box(ax, c, y4, lw, bh, f"out_proj\n{draw.shape(B, T, cfg.out_dim)}", OUT, size=8.5, family=MONO)
    mono: dict[str, Any] = {"size": 8, "family": MONO}
    for y, (step, shapes) in zip((y0, y1, y2 + 0.6, y2 - 0.05, y3, y4), layout.notes, strict=True):
        draw.text(ax, 4.25, y + 0.03, step, size=8.5, family=MONO, weight="bold", va="bottom")
        math = "$" in shapes  # the attention's formula, in mathtext at 10 pt
        draw.text(ax, 4.25, y + 0.01, shapes, va="top", **({"size": 10} if math else mono))
    draw.text(ax, 4.25, y4 - 0.17, "the paper's $W^O$", va="top", size=10)
    draw.text(ax, 4.25, y2 - 0.28, f"scores: (B, n_heads, T, S)\n      = {draw.shape(B, h, T, layout.S)}",
              va="top", **mono)
    if cfg.group_size > 1:
        draw.text(ax, 4.25, y2 - 0.6, f"head i reads k, v head i // {cfg.group_size}", va="top", **mono)
    sizes = layout.sizes
    draw.text(ax, 0.15, 0.15, sizes, size=8 if len(sizes) <= 98 else 7, color=GREY, family=MONO)  # fits W
    return fig


def article_attention_shape(batch: int, n_heads: int, n_queries: int, n_keys: int) -> tuple[int, ...]:
    """Chapter 6, exercise 1: the shape of the article's ``attention``: heads and batch merged into
    one leading dimension, ``(n_heads * batch, n_queries, n_keys)``."""
    return (n_heads * batch, n_queries, n_keys)


def mha_parameters(d_model: int, n_heads: int) -> int:
    """Chapter 6, exercise 2: the parameters of ``MultiHeadAttention(d_model, n_heads)``, counted
    on the module."""
    return count_parameters(MultiHeadAttention(d_model, n_heads))


@_checker
def check_article_attention_shape(answer: object) -> str:
    """Chapter 6, exercise 1: the shape of the article's ``attention`` for batch 3, 4 heads,
    5 queries and 7 keys."""
    if not isinstance(answer, tuple) or not all(isinstance(a, int) for a in answer):
        raise NotYet(f"give a tuple of ints, like (1, 2, 3); got {answer!r}")
    if answer == (3, 4, 5, 7):
        raise NotYet("that is the library's layout (B, H, L, S); the article merges two of those "
                     "dimensions")
    want = article_attention_shape(batch=3, n_heads=4, n_queries=5, n_keys=7)
    if answer != want:
        raise NotYet(f"{answer} is not the shape; follow the view/permute of q and k")
    return ("heads and batch are merged into one leading dimension: (heads x batch, queries, keys) "
            f"= {want}")


@_checker
def check_mha_parameters(fn: object) -> str:
    """Chapter 6, exercise 2: ``fn(d_model, n_heads)`` counts MultiHeadAttention's parameters."""
    same_as(fn, mha_parameters, [(8, 1), (64, 8), (96, 3)], "{args}: you say {got!r}, the module has {want}",
            names=("d_model", "n_heads"))
    return "4 d^2 + 4 d, whatever the number of heads: heads split d, they do not add parameters"


@_checker
def check_split_heads(fn: object) -> str:
    """Chapter 6, build-it exercise: ``fn(x, n_heads)`` turns ``(B, T, n_heads * hd)`` into
    ``(B, n_heads, T, hd)``, head ``h`` holding features ``h * hd .. (h + 1) * hd - 1`` of every
    token, as :func:`~selfattn.split_heads` does."""
    for B, T, H, hd in [(2, 3, 4, 5), (1, 6, 1, 4), (2, 5, 3, 2)]:
        x = torch.arange(B * T * H * hd, dtype=torch.float32).reshape(B, T, H * hd)
        want = split_heads(x, H)  # (B, H, T, hd)
        got = _call(fn, x, H)
        if isinstance(got, Tensor) and got.shape != want.shape \
                and sorted(got.shape) == sorted(want.shape):
            raise NotYet(f"given x of shape {(B, T, H * hd)} and n_heads={H}, your function "
                         f"returns shape {tuple(got.shape)}: the right sizes in the wrong order. "
                         f"Expected (B, n_heads, T, hd) = {tuple(want.shape)}: after "
                         "view(B, T, n_heads, hd), swap the token and head axes, transpose(1, 2)")
        got = _tensor(got, want)
        if _equal(got, want):
            continue
        if _equal(got, x.reshape(B, H, T, hd)):
            raise NotYet("the right shape, but the heads hold the wrong numbers: a view or reshape "
                         "straight to (B, n_heads, T, hd) cuts the memory in order, so head 0 gets "
                         "whole tokens. View as (B, T, n_heads, hd), then transpose(1, 2)")
        if _equal(got, x.view(B, T, hd, H).permute(0, 3, 1, 2)):
            raise NotYet("the heads are interleaved: head h takes every n_heads-th feature. Head "
                         "h must be features h*hd .. (h+1)*hd - 1: view(B, T, n_heads, hd), then "
                         "transpose(1, 2)")
        raise NotYet(f"given x of shape {(B, T, H * hd)} and n_heads={H}, the values are not where "
                     "they belong: head h, token t should be x[:, t, h*hd : (h+1)*hd]")
    return "head h is features h*hd .. (h+1)*hd - 1 of every token, moved next to the batch"


def _mha_variant(layer: MultiHeadAttention, x: Tensor, *, split_ok: bool = True,
                 merge_ok: bool = True, out_proj: bool = True, model_scale: bool = False,
                 one_head: bool = False, causal: bool = False) -> Tensor:
    """The layer's forward (MHA, no mask) computed by hand, with one or more typical mistakes."""
    cfg = layer.config
    B, T, _ = x.shape
    H, hd = (1, cfg.n_heads * cfg.head_dim) if one_head else (cfg.n_heads, cfg.head_dim)

    def split(t: Tensor) -> Tensor:
        return split_heads(t, H) if split_ok else t.reshape(B, H, T, hd)

    q, k, v = split(layer.q_proj(x)), split(layer.k_proj(x)), split(layer.v_proj(x))
    scale = 1 / math.sqrt(cfg.d_model if model_scale else cfg.head_dim)
    out, _ = scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)  # (B, H, T, hd)
    out = merge_heads(out) if merge_ok else out.reshape(B, T, H * hd)
    return layer.out_proj(out) if out_proj else out


_MHA_MISTAKES = {
    "split_ok": "split the heads by a plain reshape to (B, H, T, hd), which puts whole tokens in "
                "one head (view as (B, T, H, hd), then transpose(1, 2))",
    "merge_ok": "merge the heads by a plain reshape of (B, H, T, hd), which mixes tokens "
                "(transpose(1, 2) back to (B, T, H, hd) first)",
    "out_proj": "leave out the layer's out_proj after merging the heads",
    "model_scale": "scale the scores by 1/sqrt(d_model) (the scale is 1/sqrt(head_dim), the width "
                   "of one head)",
    "one_head": "attend with one head of full width (split into layer.config.n_heads heads)",
    "causal": "apply a causal mask (this layer attends to every token)",
}


def _mha_candidates(layer: MultiHeadAttention, x: Tensor) -> Mistakes:
    """Every typical mistake of :func:`_mha_variant`, alone and in pairs, with its hint."""
    flips = [("split_ok", False), ("merge_ok", False), ("out_proj", False), ("one_head", True),
             ("model_scale", True), ("causal", True)]
    candidates: Mistakes = []
    for n in (1, 2):
        for chosen in map(dict, itertools.combinations(flips, n)):
            if "one_head" in chosen and ("split_ok" in chosen or "merge_ok" in chosen):
                continue  # one head: nothing to split in the wrong order
            hint = "your output is what you get when you " + ", and ".join(_MHA_MISTAKES[k] for k in chosen)
            candidates.append((partial(_mha_variant, layer, x, **chosen), hint))
    return candidates


@_checker
def check_multi_head_forward(fn: object) -> str:
    """Chapter 6, build-it exercise: ``fn(layer, x)`` computes what a
    :class:`~selfattn.MultiHeadAttention` ``layer`` (MHA, no mask) outputs for ``x`` (B, T, d_model),
    from its ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` and ``layer.config.n_heads``: project,
    split the heads, attend in every head, merge the heads, project out."""
    g = torch.Generator().manual_seed(60)
    for seed, d_model, n_heads, head_dim in [(61, 12, 3, None), (62, 8, 2, 6)]:
        layer = _seeded_layer(seed, d_model, n_heads, head_dim=head_dim)
        x = torch.randn(2, 5, d_model, generator=g)  # (B, T, d_model)
        with torch.no_grad():
            want, _ = layer(x)
            got = _tensor(_call(fn, layer, x), want)
            if _close(got, want):
                continue
            hint = _first_match(got, _mha_candidates(layer, x))
        raise NotYet(hint or f"with n_heads={n_heads}, head_dim={layer.config.head_dim}, your output "
                     f"differs from the layer's by up to "
                     f"{(got.detach().to(want.dtype) - want).abs().max():.3g}")
    return ("project, split into heads, attend in each, merge, project out: the layer's forward, "
            "with GQA, RoPE, the cache and the masks left aside")


def kv_heads(n_heads: int = 8, n_kv_heads_list: Sequence[int] | None = None, head_dim: int = 64
             ) -> Diagram:
    r"""MHA, GQA and MQA side by side: which key/value head each query head reads, and what the KV
    cache holds per token and layer, $2 \cdot n_{kv} \cdot d_{head}$ numbers. Query head $i$ reads
    key/value head $i // (n_{heads} / n_{kv})$, as :func:`~selfattn.heads.repeat_kv` orders them
    (Ainslie et al. 2023, §2). ``n_kv_heads_list`` defaults to ``n_heads``, ``n_heads // 4`` (or
    ``// 2``) and 1."""
    if n_kv_heads_list is None:
        middle = n_heads // 4 if n_heads >= 8 else n_heads // 2
        n_kv_heads_list = sorted({n_heads, max(middle, 1), 1}, reverse=True)
    counts = list(n_kv_heads_list)
    W, H, left = PAGE_WIDTH, 3.0, 0.85
    pw = (W - left) / len(counts)
    y_t, y_q, y_k, y_v, y_c = H - 0.25, 1.95, 1.07, 0.85, 0.38
    fig, ax = draw.canvas(W, H)
    for y, label in [(y_q, "query\nheads"), (y_k, "key heads"), (y_v, "value heads"),
                     (y_c, "KV cache per\ntoken and\nlayer")]:
        draw.text(ax, 0.05, y, label, size=8.5)
    mha = 2 * n_heads * head_dim
    for p, n_kv in enumerate(counts):
        g, x_left = n_heads // n_kv, left + p * pw
        name = "MHA" if n_kv == n_heads else "MQA" if n_kv == 1 else "GQA"
        draw.text(ax, x_left + pw / 2, y_t, name, size=10, weight="bold", ha="center")
        draw.text(ax, x_left + pw / 2, y_t - 0.25, f"n_kv_heads={n_kv}", size=8, family=MONO, ha="center")
        pitch = (pw - 0.2) / n_heads
        qw = min(0.26, 0.8 * pitch)
        xq = [x_left + 0.1 + pitch * (i + 0.5) for i in range(n_heads)]
        xkv = [sum(xq[j * g:(j + 1) * g]) / g for j in range(n_kv)]
        kw = min(0.8 * pitch * g, 0.5)
        for i, x in enumerate(xq):
            draw.box(ax, x, y_q, qw, 0.24, str(i) if qw >= 0.07 * len(str(i)) + 0.06 else "", Q, size=8,
                     gid=f"q{p}-{i}")
            j = i // g  # the key/value head query head i reads (repeat_kv's order)
            ax.plot([x, xkv[j]], [y_q - 0.12, y_k + 0.09], color=INK, lw=0.8, gid=f"link{p}-{i}")
        for j, x in enumerate(xkv):
            label = str(j) if kw >= 0.07 * len(str(j)) + 0.06 else ""
            draw.box(ax, x, y_k, kw, 0.18, label, K, size=7.5, gid=f"kv{p}-{j}")
            draw.box(ax, x, y_v, kw, 0.18, label, V, size=7.5)
        per_token, ratio = 2 * n_kv * head_dim, Fraction(2 * n_kv * head_dim, mha)
        share = "= MHA's" if ratio == 1 else f"{ratio} of MHA's"
        draw.text(ax, x_left + pw / 2, y_c, f"2 × {n_kv} × {head_dim}\n= {per_token} numbers\n{share}",
                  ha="center", size=8.5)
    sizes = ", ".join(f"{2 * n * head_dim} ({Fraction(n, n_heads)} of MHA's)" for n in counts)
    return Diagram(fig, f"{n_heads} query heads reading {', '.join(map(str, counts))} key/value heads "
                        f"(MHA, GQA, MQA): query head i reads key/value head i // (n_heads / "
                        f"n_kv_heads); the KV cache holds 2 × n_kv_heads × head_dim numbers per token: "
                        f"{sizes}.")


def grouped_rows(n_heads: int = 8, n_kv_heads: int = 2) -> Diagram:
    r"""How the library decodes one new token with shared key/value heads without copying them:
    the query heads of a group are stacked as rows, ``(B, H, 1, hd) -> (B, H_kv, g, hd)``, and
    each group meets its one key/value head in a single product of $g$ rows against $S$ keys.
    The rows are read from :func:`~selfattn.fastpaths.attend_heads`' own regrouping (each query
    row labelled by its head), so the picture follows the code. FlashAttention 2 decodes GQA the same way
    (its ``seqlenq_ngroups_swapped``). The layer stacks the rows of one new token (decoding); a
    prefill of several goes to PyTorch's ``enable_gqa`` instead, where a causal mask would have
    to be stacked too."""
    from ..fastpaths import Call, _stack_groups

    g = n_heads // n_kv_heads
    L = 1  # one new token per head: the only case the library stacks
    # each query row holds its own number, its head; the library regroups it
    q = torch.arange(n_heads, dtype=torch.float32).reshape(1, n_heads, L, 1)  # (1, H, 1, 1)
    kv = torch.zeros(1, n_kv_heads, 1, 1)  # (1, H_kv, S, 1)
    stacked = _stack_groups(Call.of(q, kv, kv)).q  # (1, H_kv, g, 1)
    is_view = stacked.data_ptr() == q.data_ptr()
    rows = stacked[0, :, :, 0].long().tolist()  # rows[j]: the query rows of group j

    def name(r: int) -> str:
        return f"q head {r}"

    n_rows = n_heads * L
    pitch, gap = (0.25 if n_rows <= 8 else 0.2), 0.14
    W, H = PAGE_WIDTH, n_rows * pitch + gap * (n_kv_heads - 1) + 1.55
    top = H - 0.75
    bh = 0.8 * pitch
    colors = [draw.TAB[i] for i in (0, 3, 2, 1, 4, 5, 6, 8, 9)]
    fig, ax = draw.canvas(W, H)
    x_q, x_s, x_k, x_v, qw, kvw = 0.72, 3.3, 4.85, 6.0, 1.3, 0.95
    y_h = H - 0.35
    draw.text(ax, x_q, y_h, f"q: (B, H, L, hd)\nH = {n_heads}, L = {L}", ha="center",
              family=MONO, size=8)
    draw.text(ax, (x_q + x_s) / 2, top - 0.1, f"reshape, g = {g}\n"
              f"{'a view, no copy' if is_view else 'a copy'}", ha="center", va="bottom", size=8)
    draw.text(ax, x_s, y_h, f"(B, H_kv, g·L, hd)\n= (B, {n_kv_heads}, {g * L}, hd)", ha="center",
              family=MONO, size=8)
    draw.text(ax, (x_k + x_v) / 2, y_h, "keys and values\n(B, H_kv, S, hd)", ha="center", size=8)
    y_left = {r: top - pitch * (r + 0.5) for r in range(n_rows)}
    for j, group in enumerate(rows):
        color = colors[j % len(colors)]
        y0 = top - j * (g * L * pitch + gap)
        ys = [y0 - pitch * (i + 0.5) for i in range(len(group))]
        for r, y in zip(group, ys, strict=True):
            draw.box(ax, x_q, y_left[r], qw, bh, name(r), color, size=8)
            draw.box(ax, x_s, y, qw, bh, name(r), color, size=8, gid=f"row{j}-{r}")
            ax.plot([x_q + qw / 2, x_s - qw / 2], [y_left[r], y], color=color, lw=0.8)
        mid, span = (ys[0] + ys[-1]) / 2, ys[0] - ys[-1] + bh
        draw.box(ax, x_k, mid, kvw, span, f"key\nhead {j}", color, size=8, gid=f"k{j}")
        draw.box(ax, x_v, mid, kvw, span, f"value\nhead {j}", color, size=8)
        draw.arrow(ax, (x_s + qw / 2 + 0.04, mid), (x_k - kvw / 2 - 0.04, mid), color)
    groups = f"{n_kv_heads} group{'s' if n_kv_heads > 1 else ''}"
    draw.text(ax, W / 2, 0.38, f"{n_kv_heads} product{'s' if n_kv_heads > 1 else ''} of "
              f"({g * L} × hd)·(hd × S), one per key/value head: the {g * L} query rows of a group\n"
              f"meet their keys and values in one matrix-matrix product, where head by head it "
              f"takes {g} matrix-vector products.", ha="center", size=8)
    return Diagram(fig, f"The {n_heads} query heads ({L} token{'s' if L > 1 else ''} each) are "
                        f"regrouped into {groups} of {g * L} rows, "
                        f"from (B, H, L, hd) to (B, {n_kv_heads}, {g * L}, hd), "
                        f"{'a view without a copy' if is_view else 'a copy'}; each group's rows "
                        f"attend to its one key/value head in a single matrix-matrix product, "
                        f"where head by head it would take {g} matrix-vector products.")


def kv_cache_bytes(batch: int, n_kv_heads: int, context: int, head_dim: int, dtype: torch.dtype) -> int:
    """Chapter 7, exercise 1: the bytes a :class:`~selfattn.KVCache` holds for ``context`` tokens,
    measured on a real one."""
    cache = KVCache()
    k = torch.zeros(batch, n_kv_heads, context, head_dim, dtype=dtype)
    cache.append(k, k)
    return cache.nbytes


def repeat_kv_shape(shape: tuple[int, ...], g: int) -> tuple[int, ...]:
    """Chapter 7, exercise 2: the shape of ``repeat_kv(k, g)`` for ``k`` of shape ``(B, H_kv, S,
    hd)``, from :func:`selfattn.repeat_kv` on the meta device."""
    return tuple(repeat_kv(torch.empty(shape, device="meta"), g).shape)


@_checker
def check_cache_bytes(fn: object) -> str:
    """Chapter 7, exercise 1: ``fn(batch, n_kv_heads, context, head_dim, itemsize)`` is the size
    of a KV cache in bytes, checked against a real :class:`~selfattn.KVCache`."""
    dtypes = {4: torch.float32, 2: torch.bfloat16}  # a dtype of each itemsize

    def cache_bytes(batch: int, n_kv: int, context: int, hd: int, itemsize: int) -> int:
        return kv_cache_bytes(batch, n_kv, context, hd, dtypes[itemsize])

    same_as(fn, cache_bytes, [(1, 16, 100, 64, 4), (2, 1, 37, 8, 2), (3, 4, 10, 16, 2)],
            "{args}: you say {got!r}, the cache holds {want}",
            names=("batch", "n_kv_heads", "context", "head_dim", "itemsize"))
    return "keys and values: 2 * batch * n_kv_heads * context * head_dim * itemsize"


@_checker
def check_repeat_kv(fn: object) -> str:
    """Chapter 7, exercise 2: ``fn(k, g)`` repeats each key head ``g`` times, as
    ``k.repeat_interleave(g, dim=1)`` does, for ``k`` of shape (B, H_kv, S, hd)."""
    k = torch.arange(2 * 3 * 4 * 2, dtype=torch.float32).reshape(2, 3, 4, 2)
    want = repeat_kv(k, 4)  # (2, 12, 4, 2)
    got = _tensor(_call(fn, k, 4), want)
    if torch.equal(got, k.repeat(1, 4, 1, 1)):
        raise NotYet("that is k.repeat: heads 0, 1, 2, 0, 1, 2, ...; GQA wants 0, 0, 0, 0, 1, 1, ...")
    if not torch.equal(got, want):
        raise NotYet("the values differ from selfattn.repeat_kv (k.repeat_interleave(g, dim=1))")
    return "head h of the result is key head h // g (Hugging Face calls this repeat_kv)"


def _decode(cls: object, layer: MultiHeadAttention, x: Tensor,
            chunks: list[tuple[int, int]], run: str) -> Tensor:
    """Decode ``x`` chunk by chunk with a new cache of the reader's class; the layer's output."""
    cfg = layer.config
    with torch.random.fork_rng(devices=[]):
        cache = _call(cls, kind="class")
    append = getattr(cache, "append", None)
    if not callable(append):
        raise NotYet("your class has no method append(k, v)")
    given, outs = [], []  # the keys and values appended (and a copy of each), the outputs
    for start, end in chunks:
        chunk = x[:, start:end]  # (B, T_new, d)
        q = split_heads(layer.q_proj(chunk), cfg.n_heads)  # (B, H, T_new, hd)
        k = split_heads(layer.k_proj(chunk), cfg.n_kv_heads)  # (B, H_kv, T_new, hd)
        v = split_heads(layer.v_proj(chunk), cfg.n_kv_heads)
        given.append((k, v, k.clone(), v.clone()))
        try:
            pair = _call(append, k, v, kind="append")
        except NotYet as why:
            if "must match except in dimension" in str(why):
                raise NotYet(f"{why}. The tokens are dim 2 of (B, H_kv, T, hd): concatenate along "
                             "dim=2") from None
            raise
        step = f"{run}, after {end} token{'s' if end > 1 else ''}"
        for i, (k_in, v_in, k_copy, v_copy) in enumerate(given):
            if not (_equal(k_in, k_copy) and _equal(v_in, v_copy)):
                raise NotYet(f"{step}, the keys or values given to append call {i + 1} have changed: "
                             "append must not modify the tensors it is given; store them, and build "
                             "new tensors (torch.cat returns a new one)")
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise NotYet(f"append should return (keys, values), got {type(pair).__name__}")
        all_k = torch.cat([c[2] for c in given], dim=2)  # (B, H_kv, end, hd)
        all_v = torch.cat([c[3] for c in given], dim=2)
        for name, got, want, new in [("keys", pair[0], all_k, k), ("values", pair[1], all_v, v)]:
            if not isinstance(got, Tensor):
                raise NotYet(f"append should return (keys, values) tensors; the {name} are "
                             f"{type(got).__name__}")
            if _equal(got, want):
                continue
            if start > 0 and _equal(got, new):
                raise NotYet(f"{step}, append returned only the new {name} ({end - start} of {end}): "
                             f"it must return all {name} so far, shape {tuple(want.shape)}")
            if name == "keys" and _equal(got, all_v):
                raise NotYet(f"{step}, append returned the values first: return (keys, values)")
            if got.shape != want.shape and got.numel() == want.numel() and got.dim() == 4:
                grown = [d for d in range(4) if got.shape[d] > want.shape[d]]
                raise NotYet(f"{step}, the {name} have shape {tuple(got.shape)}, grown along dim "
                             f"{grown[0] if grown else '?'}: the tokens are dim 2 of "
                             f"(B, H_kv, T, hd), expected {tuple(want.shape)}")
            if got.dim() == 4 and got.shape[2] > want.shape[2] and start == 0:
                raise NotYet(f"{step}, a new cache returns {got.shape[2]} {name}: it already held "
                             "those of another cache. Create the storage in __init__ (self.keys = "
                             "None), not as a class attribute that every cache shares")
            if got.shape != want.shape:
                raise NotYet(f"{step}, the {name} have shape {tuple(got.shape)}, expected "
                             f"{tuple(want.shape)} (B, H_kv, tokens so far, hd)")
            raise NotYet(f"{step}, the {name} returned are not the ones appended, in order")
        g = cfg.n_heads // cfg.n_kv_heads
        mask = causal_mask(end - start, end, offset=start)  # new queries sit at start..end-1
        out, _ = scaled_dot_product_attention(q, repeat_kv(pair[0], g), repeat_kv(pair[1], g),
                                              attn_mask=mask)
        outs.append(out)  # (B, H, T_new, hd)
    return layer.out_proj(merge_heads(torch.cat(outs, dim=2)))  # (B, T, d)


@_checker
def check_kv_cache(cls: object) -> str:
    """Chapter 7, build-it exercise: ``cache = cls()`` starts empty, and ``keys, values =
    cache.append(k, v)``, for ``k`` and ``v`` of shape ``(B, H_kv, T_new, hd)``, returns every key
    and value appended so far, ``(B, H_kv, T_so_far, hd)``. Checked by decoding with a
    :class:`~selfattn.MultiHeadAttention` layer's projections and the reader's cache, against the
    layer's causal forward over the whole sequence."""
    layer = _seeded_layer(70, 12, n_heads=4, n_kv_heads=2)
    x = torch.randn(2, 6, 12, generator=torch.Generator().manual_seed(71))  # (B, T, d)
    runs = [("decoding one token at a time", [(t, t + 1) for t in range(6)]),
            ("decoding a prompt of 3 tokens, then one at a time", [(0, 3), (3, 4), (4, 5), (5, 6)])]
    with torch.no_grad():
        want, _ = layer(x, is_causal=True)
        for run, chunks in runs:
            got = _decode(cls, layer, x, chunks, run)
            if not _close(got, want):
                raise NotYet(f"{run}, the output differs from the layer's causal forward by up to "
                             f"{(got - want).abs().max():.3g}")
    return ("decoding one token at a time, and after a prompt of 3 tokens, with your cache gives "
            "the layer's causal forward (4 query heads sharing 2 key/value heads)")


def _decode_inputs(model, context: int, seed: int = 0):
    """A KV cache already holding ``context`` random tokens, and one new token to decode."""
    cfg = model.config
    p = next(model.parameters())
    g = torch.Generator().manual_seed(seed)
    cache = KVCache(capacity=context + 8192)  # room for every timed step
    k = torch.randn(1, cfg.n_kv_heads, context, cfg.head_dim, generator=g).to(p)
    cache.append(k, k.clone())
    x = torch.randn(1, 1, cfg.d_model, generator=g).to(p)
    return cache, x


def decode_benchmark(
    contexts: list[int],
    d_model: int = 1024,
    n_heads: int = 16,
    kv_heads: tuple[int, ...] = (16, 4, 1),
    naive: bool = True,
    bare: bool = False,
    repeats: int = 15,
    warmup: int = 3,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> list[dict]:
    """Time one decoding step (one new token, batch 1) for MHA, GQA and MQA at each context.

    Every variant holds a KV cache of ``context`` tokens; ``naive`` adds the GQA/MQA variants that
    copy their cache for every query head (:func:`~selfattn.heads.repeat_kv`, with
    ``fastpaths.disabled("grouped_heads")``); ``bare`` adds MHA and MQA computed by
    :func:`~selfattn.book.multi_head.bare_decode_step`, the layer's kernels without its Python.
    Variants are interleaved in a rotated order in each repeat, so a slow moment of a shared
    machine hits all of them; the first ``warmup`` repeats are dropped; each row gives the
    median time per token in ms, and ``split_kv``: whether a step ran the split of the keys
    across threads (recorded from one step before the clock starts). Each sample is one call, not
    :func:`~selfattn.book.kit.measure.compare`'s loop of calls: every call appends a token to the cache.
    ``device``: where the layers and their caches live (default the CPU); on CUDA every sample is
    synchronised before and after, so it times the kernels, not their launch. The weights are
    drawn on the CPU and moved, so every device times the same layers.
    """
    torch.manual_seed(seed)
    device = torch.device("cpu" if device is None else device)
    models = {kv: MultiHeadAttention(d_model, n_heads, n_kv_heads=kv, bias=False).to(device).eval()
              for kv in kv_heads}
    names = {kv: "MHA" if kv == n_heads else "MQA" if kv == 1 else f"GQA-{kv}" for kv in kv_heads}
    variants = [(names[kv], kv, "layer") for kv in kv_heads]
    if naive:
        variants += [(f"{names[kv]} naive", kv, "naive") for kv in kv_heads if kv != n_heads]
    if bare:
        variants += [(f"{names[kv]} bare", kv, "bare") for kv in kv_heads if kv in (1, n_heads)]

    def step(kv: int, how: str, cache: KVCache, x: Tensor) -> None:
        if how == "bare":
            bare_decode_step(models[kv], x, cache)
        elif how == "naive":
            with fastpaths.disabled("grouped_heads"):
                models[kv](x, is_causal=True, kv_cache=cache)
        else:
            models[kv](x, is_causal=True, kv_cache=cache)

    def split_ran(kv: int, how: str, cache: KVCache, x: Tensor) -> bool:
        """Whether one step of this variant runs the split of the keys (``split_kv``): the step
        runs once, with the split's function wrapped to count its calls."""
        calls, split = [], fastpaths._split_kv_attention

        def counted(q: Tensor, k: Tensor, v: Tensor, chunks: int) -> Tensor:
            calls.append(1)
            return split(q, k, v, chunks)

        fastpaths._split_kv_attention = counted
        try:
            step(kv, how, cache, x)
        finally:
            fastpaths._split_kv_attention = split
        return bool(calls)

    rows = []
    for context in contexts:
        states = {name: _decode_inputs(models[kv], context, seed) for name, kv, _ in variants}
        samples: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        with torch.no_grad():
            ran = {name: split_ran(kv, how, *states[name]) for name, kv, how in variants}
            for r in range(warmup + repeats):
                for name, kv, how in variants[r % len(variants):] + variants[: r % len(variants)]:
                    synchronize()
                    start = time.perf_counter()
                    step(kv, how, *states[name])
                    synchronize()
                    if r >= warmup:
                        samples[name].append(time.perf_counter() - start)
        for name, kv, how in variants:
            rows.append({"context": context, "variant": name, "n_kv_heads": kv,
                         "naive": how == "naive", "bare": how == "bare", "split_kv": ran[name],
                         "ms_per_token": 1e3 * statistics.median(samples[name])})
    return rows


def decode_table(rows: list[dict]) -> str:
    """The decode benchmark as text: ms per token, and each variant's speed-up over MHA."""
    contexts = sorted({r["context"] for r in rows})
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    ms = {(r["context"], r["variant"]): r["ms_per_token"] for r in rows}
    lines = [f"{'context':>7s}" + "".join(f"{v:>13s}" for v in variants),
             f"{'':7s}" + "".join(f"{'ms  vs MHA':>13s}" for _ in variants)]
    for c in contexts:
        mha = ms[(c, variants[0])]
        lines.append(f"{c:7d}" + "".join(f"{ms[(c, v)]:8.2f} {mha / ms[(c, v)]:3.1f}x"
                                         for v in variants))
    return "\n".join(lines)


def bare_decode_step(layer: MultiHeadAttention, x: Tensor, cache: KVCache) -> Tensor:
    """What ``layer(x, is_causal=True, kv_cache=cache)[0]`` computes for one new token ``x``
    ``(1, 1, d_model)`` (batch 1, inference, no RoPE), as one function: the same products, the
    same cache and the same attention kernels, without the layer's input checks, submodule
    calls, head helpers and dispatch (it still calls ``cache.append`` and
    :func:`~selfattn.fastpaths.decode_attention`, which splits the cache across threads where
    the layer would). The one new query sees every cached key, so no mask is needed."""
    cfg = layer.config
    if cfg.rope or layer.training or tuple(x.shape) != (1, 1, cfg.d_model):
        raise ValueError(f"bare_decode_step takes one token (1, 1, {cfg.d_model}) for a layer in "
                         f"eval mode without RoPE; got x {tuple(x.shape)}, rope={cfg.rope}, "
                         f"training={layer.training}")
    H, H_kv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q = F.linear(x, layer.q_proj.weight, layer.q_proj.bias)  # (1, 1, H*hd)
    k = F.linear(x, layer.k_proj.weight, layer.k_proj.bias)  # (1, 1, H_kv*hd)
    v = F.linear(x, layer.v_proj.weight, layer.v_proj.bias)  # (1, 1, H_kv*hd)
    q = q.view(1, H_kv, H // H_kv, hd)  # (1, H_kv, g, hd): each group's query heads stacked
    k, v = cache.append(k.view(1, H_kv, 1, hd), v.view(1, H_kv, 1, hd))  # (1, H_kv, S, hd)
    out = fastpaths.decode_attention(q, k, v)  # (1, H_kv, g, hd): split_kv where it pays
    return F.linear(out.reshape(1, 1, H * hd), layer.out_proj.weight, layer.out_proj.bias)


# chapter 6: what heads buy on the neighbour task

#: the arms of chapter 6's experiment: name -> (heads, head width; None: 32 // heads)
HEAD_ARMS: dict[Any, tuple[int, int | None]] = {
    1: (1, None), 2: (2, None), 4: (4, None), "1x64": (1, 64), "4x4": (4, 4)}
ARM_NAMES: dict[Any, str] = {1: "1 head", 2: "2 heads", 4: "4 heads",
                             "1x64": "1 head of 64", "4x4": "4 heads of 4"}


@dataclass
class HeadsRun:
    """Chapter 6's neighbour experiment, per arm (a key of :data:`HEAD_ARMS`) and per seed:
    the trained taggers, their error rates on the test set, each head's mean weight on the
    (left, right) neighbour, and the share of the errors that swap the two neighbours."""

    seeds: list[int]
    test: Sequences
    taggers: dict[Any, list[Any]]
    errors: dict[Any, list[float]]
    leans: dict[Any, list[tuple[Tensor, Tensor]]]
    swaps: dict[Any, list[float]]
    params: dict[Any, int]

    def near(self, arm: Any, threshold: float = 0.01) -> list[bool]:
        """Per seed: under ``threshold`` of the tags wrong ("nearly perfect")."""
        return [e < threshold for e in self.errors[arm]]

    def under_half(self, arm: Any) -> list[bool]:
        """Per seed: under half the errors of one head trained on the same batches."""
        return [e < e1 / 2 for e, e1 in zip(self.errors[arm], self.errors[1], strict=True)]

    def pooled(self, arm: Any, of: Any = 1) -> float:
        """Every seed's errors of ``arm`` over those of ``of``, pooled."""
        return sum(self.errors[arm]) / max(sum(self.errors[of]), 1e-9)

    def splits(self, arm: Any, by: float = 2.0) -> list[bool]:
        """Per seed: a left-looking and a different right-looking head, each putting at least
        ``by`` times as much weight on its side as on the other."""
        out = []
        for left, right in self.leans[arm]:
            i, j = int(left.argmax()), int(right.argmax())
            out.append(i != j and bool(left[i] >= by * right[i])
                       and bool(right[j] >= by * left[j]))
        return out

    def unequal(self, by: float = 1.5) -> list[bool]:
        """Per seed: one head puts at least ``by`` times the weight on one neighbour."""
        return [bool(max(lf[0], r[0]) >= by * min(lf[0], r[0])) for lf, r in self.leans[1]]


def _evaluate_heads(tagger: Any, test: Sequences, device: torch.device
                    ) -> tuple[float, tuple[Tensor, Tensor], float]:
    V = math.isqrt(test.n_tags)  # a tag is left * V + right
    with torch.no_grad():
        logits, w = tagger(test.tokens.to(device), need_weights=True)  # (N, h, T, T)
    pred, tags = logits.argmax(-1).cpu(), test.tags  # (N, T)
    wrong = pred != tags
    swap = wrong & (pred // V == tags % V) & (pred % V == tags // V)  # (right, left)
    w = w.mean(0).cpu()  # (h, T, T): each head's weights, mean over the test set
    left = w.diagonal(-1, dim1=-2, dim2=-1).mean(-1)  # (h,)
    right = w.diagonal(1, dim1=-2, dim2=-1).mean(-1)  # (h,)
    share = swap.sum().item() / max(wrong.sum().item(), 1)
    return wrong.float().mean().item(), (left, right), share


def _heads_tagger(vocab_size: int, n_tags: int, d: int, h: int, hd: int | None,
                  device: torch.device) -> Any:
    from .tagging import AttentionTagger

    return AttentionTagger(vocab_size, n_tags, d=d, n_heads=h, head_dim=hd).to(device)


def heads_experiment(task: Sequences, test: Sequences, seeds: Sequence[int],
                     device: torch.device | str = "cpu", steps: int = 400,
                     arms: Sequence[Any] = tuple(HEAD_ARMS), d: int = 32) -> HeadsRun:
    """Chapter 6: train the attention tagger on ``task`` with each arm's heads (same
    ``seeds``, side by side, :func:`~selfattn.book.kit.train.train_seeds`) and measure every
    model on ``test`` (:class:`HeadsRun`)."""
    from .kit import train

    device = torch.device(device)
    run = HeadsRun(list(seeds), test, {}, {}, {}, {}, {})
    for arm in arms:
        h, hd = HEAD_ARMS[arm]
        make = partial(_heads_tagger, task.vocab_size, task.n_tags, d, h, hd, device)
        run.taggers[arm], _ = train.train_seeds(
            make, task, seeds=seeds, steps=steps, batch_size=32, lr=1e-2,
            desc=f"{h} heads of {hd or d // h}")
        measured = [_evaluate_heads(t, test, device) for t in run.taggers[arm]]
        run.errors[arm] = [m[0] for m in measured]
        run.leans[arm] = [m[1] for m in measured]
        run.swaps[arm] = [m[2] for m in measured]
        run.params[arm] = count_parameters(run.taggers[arm][0])
    return run


def lean_table(run: HeadsRun, arms: Sequence[Any] = (1, 2, 4)) -> str:
    """Each seed's heads: mean weight on the left / right neighbour, one column per arm."""
    lines = ["weight on the left / right neighbour, each head (mean over the test set):",
             f"{'seed':>5s}  {'1 head':7s}  {'2 heads':16s}  4 heads"]
    for s, seed in enumerate(run.seeds):
        cols = ["  ".join(f"{lf:>3.0%}/{r:<3.0%}"
                          for lf, r in zip(*run.leans[a][s], strict=True)) for a in arms]
        lines.append(f"{seed:5d}  {cols[0]:7s}  {cols[1]:16s}  {cols[2]}".rstrip())
    return "\n".join(lines)


# chapter 7: does sharing keys and values cost accuracy?

#: chapter 7's arms: name -> (key/value heads of four query heads, start as MQA's heads repeated)
SHARING_ARMS: dict[str, tuple[int, bool]] = {
    "MHA": (4, False), "MQA": (1, False), "MHA from MQA": (1, True)}


@dataclass
class SharingRun:
    """Chapter 7's experiment, per arm (a key of :data:`SHARING_ARMS`) and per seed: the accuracy
    on the ambiguous word at every snapshot of training (``steps``), the last one, and their
    mean, the area under the learning curve; the trained taggers and their parameter counts."""

    seeds: list[int]
    steps: list[int]
    curves: dict[str, list[list[float]]]
    taggers: dict[str, list[Any]]
    params: dict[str, int]

    @property
    def final(self) -> dict[str, list[float]]:
        return {arm: [c[-1] for c in curves] for arm, curves in self.curves.items()}

    @property
    def area(self) -> dict[str, list[float]]:
        return {arm: [sum(c) / len(c) for c in curves] for arm, curves in self.curves.items()}

    def lower(self, arm: str, than: str) -> list[bool]:
        """Per seed: ``arm``'s area is below ``than``'s, trained on the same seed."""
        area = self.area
        return [a < b for a, b in zip(area[arm], area[than], strict=True)]


def _sharing_tagger(vocab_size: int, n_tags: int, n_kv: int, from_mqa: bool,
                    device: torch.device | str = "cpu") -> Any:
    from ..multihead import expand_kv_heads
    from .tagging import AttentionTagger

    tagger = AttentionTagger(vocab_size, n_tags, d=32, n_heads=4, n_kv_heads=n_kv)
    if from_mqa:  # MHA's layer, starting as exactly MQA's function: its K/V heads repeated
        assert isinstance(tagger.attn, MultiHeadAttention)
        tagger.attn = expand_kv_heads(tagger.attn)
    return tagger.to(device)


def sharing_experiment(task: Any, test: Any, seeds: Sequence[int],
                       device: torch.device | str = "cpu", steps: int = 200, every: int = 50,
                       arms: Sequence[str] = tuple(SHARING_ARMS)) -> SharingRun:
    """Chapter 7: the attention tagger with four query heads, trained on the distance-cue
    ``task`` with each arm's key/value heads (same ``seeds``, side by side), its accuracy on
    ``test``'s ambiguous word measured at every ``every`` steps (:class:`SharingRun`)."""
    from .kit import train
    from .tagging import ambiguous_correct

    device = torch.device(device)
    run = SharingRun(list(seeds), [], {}, {}, {})
    for arm in arms:
        n_kv, from_mqa = SHARING_ARMS[arm]
        make = partial(_sharing_tagger, task.vocab_size, task.n_tags, n_kv, from_mqa, device)
        run.taggers[arm], histories = train.train_seeds(
            make, task, seeds=seeds, steps=steps, batch_size=32, desc=arm, snapshot_every=every)
        run.curves[arm] = []
        for tagger, history in zip(run.taggers[arm], histories, strict=True):
            curve = []
            for _, state in history.snapshots:  # the last one is the trained model
                tagger.load_state_dict(state)
                curve.append(ambiguous_correct(tagger, test).float().mean().item())
            run.curves[arm].append(curve)
        run.steps = [step for step, _ in histories[0].snapshots]
        run.params[arm] = count_parameters(run.taggers[arm][0])
    return run
