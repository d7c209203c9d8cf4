r"""The book's schematic diagrams: data-flow pictures drawn with matplotlib, labelled by the code.

Every label is computed from the arguments (a layer's config, the head counts, the output of
:func:`~selfattn.positional.apply_rope`), so a change in the code cannot leave a stale picture.
Each function returns a :class:`Diagram`: a ``matplotlib.figure.Figure`` (made without pyplot)
and an ``alt`` text for screen readers. Jupyter, Colab and the built book show it as a PNG with
its alt text; it fits the page (``viz.PAGE_WIDTH`` inches at 100 dpi, text at least 7 pt).

* :func:`one_output`: how self-attention computes one output $b^1$ (chapter 2).
* :func:`matrix_form`: the same for every token at once, with the matrices' shapes (chapter 2).
* :func:`multi_head`: split heads, attend per head, merge heads, ``out_proj`` (chapter 6).
* :func:`kv_heads`: which key/value head each query head reads in MHA, GQA and MQA (chapter 7).
* :func:`rope_rotation`: RoPE turning one pair of features by position (chapter 5).
* :func:`online_softmax_tiles`: the tiles FlashAttention's online softmax walks (chapter 9).
* :func:`paged_block_table`: PagedAttention's block tables, each request's logical blocks onto
  one shared pool, drawn from a real :class:`~selfattn.cache.BlockPool` and one
  :class:`~selfattn.cache.PagedKVCache` per request.
* :func:`rolling_sink_buffer`: which position each slot of a :class:`~selfattn.cache.SinkCache`
  (and a :class:`~selfattn.cache.SlidingWindowCache`) holds after ``t`` tokens, read from its buffer.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from fractions import Fraction

import torch
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Arc, Circle, FancyBboxPatch, Polygon

from ..checks import check_positive_int
from ..masks import causal_mask
from ..multihead import AttentionConfig, MultiHeadAttention
from ..positional import apply_rope
from .viz import PAGE_WIDTH, png_256

DPI = 100  # the book shows a notebook's PNG at 100 dpi, full size up to PAGE_WIDTH inches
PT = 9  # body text; nothing is under 7 pt (9.7 px at 100 dpi), mathtext is 10 pt (scripts at 7)
INK = "#222222"
_TAB = colormaps["tab10"].colors
Q, K, V, OUT, GREY = _TAB[0], _TAB[1], _TAB[2], _TAB[4], _TAB[7]
MONO = "DejaVu Sans Mono"  # the code's names (q_proj, split_heads) in the code's font


class Diagram:
    """A schematic figure and its alt text; shown by Jupyter, Colab and the book as one
    ``<img alt=...>`` (HTML only: a PNG output beside it would store the picture twice)."""

    def __init__(self, figure: Figure, alt: str) -> None:
        self.figure = figure
        self.alt = alt
        self._png: bytes | None = None

    def png(self) -> bytes:
        """The figure as PNG bytes at 100 dpi, opaque white behind, in 256 colours (a diagram has
        few; this makes the file three times smaller, and the same bytes on every run)."""
        if self._png is None:
            self._png = png_256(self.figure, DPI)
        return self._png

    def _repr_html_(self) -> str:
        png = self.png()
        width = int.from_bytes(png[16:20], "big")  # the IHDR chunk: width, then height
        data = base64.b64encode(png).decode("ascii")
        return (f'<img class="selfattn-diagram" src="data:image/png;base64,{data}" '
                f'alt="{html.escape(self.alt)}" width="{width}">')

    def __repr__(self) -> str:
        return f"Diagram(alt={self.alt!r})"


# ---------------------------------------------------------------------------------------------
# drawing helpers: one axes over the whole figure, in inches from its bottom-left corner


def _canvas(width: float, height: float) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(width, height), dpi=DPI, facecolor="white")
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_axis_off()
    return fig, ax


def _tint(color, amount: float = 0.18) -> tuple[float, float, float]:
    return tuple(1 - amount * (1 - c) for c in to_rgb(color))


def _box(ax: Axes, x: float, y: float, w: float, h: float, text: str = "", color=GREY, *,
         size: float = PT, family: str | None = None, fill=None, gid: str | None = None):
    """A rounded box centred at ``(x, y)``, ``w`` by ``h`` inches, with ``text`` in the middle."""
    r = min(0.06, w / 4, h / 4)
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle=f"round,pad=0,rounding_size={r}",
                                facecolor=_tint(color) if fill is None else fill, edgecolor=color,
                                linewidth=1.1, gid=gid))
    if text:
        ax.text(x, y, text, ha="center", va="center", fontsize=size, color=INK, family=family)


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], color=INK,
           lw: float = 1.0) -> None:
    ax.annotate("", xy=end, xytext=start, arrowprops={
        "arrowstyle": "-|>,head_length=0.45,head_width=0.2", "color": color, "lw": lw,
        "shrinkA": 0, "shrinkB": 0, "mutation_scale": 12})


def _text(ax: Axes, x: float, y: float, s: str, size: float = PT, **kw) -> None:
    kw.setdefault("color", INK)
    kw.setdefault("va", "center")
    ax.text(x, y, s, fontsize=size, **kw)


def _shape(*dims: int) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ")"


# ---------------------------------------------------------------------------------------------
# chapter 2


def one_output(tokens: Sequence[str] = ("the", "cat", "sat", "on", "the", "mat")) -> Diagram:
    r"""How self-attention computes the first output $b^1$ from the inputs $a^1 \dots a^n$
    (one input per token, at most 6), vectors as rows as in the code (``a @ W``):
    $q^1 = a^1 W^q$; $k^i = a^i W^k$, $v^i = a^i W^v$;
    $\alpha_{1,i} = q^1 \cdot k^i / \sqrt{d_k}$; $\alpha'_{1,i} = \operatorname{softmax}_i$;
    $b^1 = \sum_i \alpha'_{1,i} v^i$ (Vaswani et al. 2017, §3.2.1)."""
    if isinstance(tokens, str):
        raise ValueError("tokens must be a sequence of words, e.g. 'the cat sat'.split(), not one str")
    tokens = list(tokens)
    n = len(tokens)
    if not 1 <= n <= 6:
        raise ValueError(f"tokens must hold 1 to 6 words to fit the page, got {n}")
    W, H, left = PAGE_WIDTH, 4.2, 1.55  # captions on the left, q^1 then one column per token
    x_q, x0 = left + 0.25, left + 0.6
    cw = min((W - x0 - 0.05) / n, 1.1)  # a column per token
    longest = max(int(cw / 0.07), 3)
    for t in tokens:
        if not isinstance(t, str) or not t.strip() or len(t) > longest:
            raise ValueError(f"each token must be a non-empty str of at most {longest} characters "
                             f"(for {n} tokens), got {t!r}")
    y_tok, y_a, y_kv, y_bus, y_s, y_soft, y_w, y_b = 0.2, 0.55, 1.35, 1.8, 2.2, 2.7, 3.2, 3.85
    bh, bw, vw = 0.3, min(0.45, 0.45 * cw), min(0.4, 0.33 * cw)  # widths: key and scores, value
    fig, ax = _canvas(W, H)
    for y, caption in [(y_a, "inputs $a^i$"), (y_kv, "$q^1 = a^1 W^q$\n$k^i = a^i W^k$, $v^i = a^i W^v$"),
                       (y_s, r"scores $\alpha_{1,i}$" "\n" r"$= q^1\cdot k^i / \sqrt{d_k}$"),
                       (y_soft, "softmax over $i$"), (y_w, r"weights $\alpha'_{1,i}$, times $v^i$"),
                       (y_b, "output")]:
        _text(ax, 0.05, y, caption, size=10, linespacing=1.5)
    xc = [x0 + cw * (i + 0.5) for i in range(n)]
    xk = [x - 0.24 * cw for x in xc]  # the key, score and weight of token i
    xv = [x + 0.28 * cw for x in xc]  # its value, going up to the product
    x_b = max(x0 + n * cw / 2, x0 + 0.95)  # the output, over the middle of the tokens
    top = bh / 2
    # the softmax couples every score: one band across all of them (the values pass over it,
    # through a gap at each value, so they do not read as going through the softmax)
    _box(ax, (xk[0] - bw / 2 + xv[-1]) / 2, y_soft, xv[-1] - xk[0] + bw / 2 + 0.1, 0.2, color=GREY,
         fill="#eeeeee", gid="softmax band")
    _box(ax, x_q, y_kv, vw, bh, "$q^1$", Q, size=10)
    _arrow(ax, (xc[0] - 0.1, y_a + top), (x_q + 0.05, y_kv - top), Q)
    ax.plot([x_q, x_q, xk[-1] - 0.08], [y_kv + top, y_bus, y_bus], color=Q, lw=1.2)
    for i, (word, a, k, v) in enumerate(zip(tokens, xc, xk, xv, strict=True), start=1):
        _text(ax, a, y_tok, word.replace("$", r"\$"), ha="center", style="italic")
        _box(ax, a, y_a, min(0.55, 0.8 * cw), bh, f"$a^{{{i}}}$", GREY, size=10)
        for x, w, name, color in [(k, bw, "k", K), (v, vw, "v", V)]:
            _box(ax, x, y_kv, w, bh, f"${name}^{{{i}}}$", color, size=10)
            _arrow(ax, (a + (x - a) * 0.4, y_a + top), (x, y_kv - top), color)
        _arrow(ax, (k - 0.08, y_bus), (k - 0.08, y_s - top), Q)  # q^1 reaches every score
        _arrow(ax, (k + 0.08, y_kv + top), (k + 0.08, y_s - top), K)
        _box(ax, k, y_s, bw, bh, rf"$\alpha_{{1,{i}}}$", INK, size=10, fill="white")
        _arrow(ax, (k, y_s + top), (k, y_soft - 0.1), INK)
        _arrow(ax, (k, y_soft + 0.1), (k, y_w - top), INK)
        _box(ax, k, y_w, bw, bh, rf"$\alpha'_{{1,{i}}}$", INK, size=10, fill="white")
        ax.plot([v, v], [y_soft - 0.13, y_soft + 0.13], color="white", lw=6, zorder=2.9,
                gid="gap")  # the gap in the softmax band where v^i crosses it
        ax.plot([v, v], [y_kv + top, y_w - 0.09], color=V, lw=1.2, zorder=3)  # v^i up to the product
        ax.add_patch(Circle((v, y_w), 0.09, facecolor="white", edgecolor=INK, lw=1, zorder=3))
        _text(ax, v, y_w, "×", ha="center", zorder=4)
        _arrow(ax, (k + bw / 2, y_w), (v - 0.09, y_w), INK)
        _arrow(ax, (v, y_w + 0.09), (x_b + (v - x_b) * 0.3, y_b - 0.2), OUT)
    _box(ax, x_b, y_b, 1.9, 0.4, r"$b^1 = \sum_i \alpha'_{1,i}\, v^i$", OUT, size=11)
    words = " ".join(tokens)
    return Diagram(fig, f"How self-attention computes the first output b^1 for the {n} tokens "
                        f"'{words}': the query q^1 of the first token is scored against the key k^i of "
                        f"every token, the softmax of the scores weights the values v^i, and b^1 "
                        f"is their weighted sum.")


def _matrix(ax: Axes, x: float, y: float, rows: int, cols: int, name: str, color, *,
            above: str | None = None) -> tuple[float, float]:
    """A matrix as a box sized by its shape (log scale), name above, shape below; returns (w, h)."""
    w, h = _side(cols), _side(rows)
    _box(ax, x, y, w, h, name, color, size=10)
    if rows <= 16:  # one faint line per row: one row per token
        for r in range(1, rows):
            ax.plot([x - w / 2 + 0.03, x + w / 2 - 0.03], [y - h / 2 + r * h / rows] * 2,
                    color=color, lw=0.4, alpha=0.5)
    _text(ax, x, y - h / 2 - 0.14, _shape(rows, cols), size=8.5, ha="center")
    if above:
        _text(ax, x, y + h / 2 + 0.16, above, ha="center", size=10)
    return w, h


def _side(n: int) -> float:
    return min(0.6, 0.2 + 0.1 * math.log2(n))


def matrix_form(n: int = 6, d_model: int = 16, d_k: int = 8, d_v: int = 8) -> Diagram:
    r"""Self-attention for all ``n`` tokens at once, each matrix drawn with its shape:
    $Q = AW^q$, $K = AW^k$, $V = AW^v$; $A' = \operatorname{softmax}(QK^\top/\sqrt{d_k})$ by rows;
    $B = A'V$ (Vaswani et al. 2017, eq. 1). Boxes grow with the log of each dimension."""
    for value, name in [(n, "n"), (d_model, "d_model"), (d_k, "d_k"), (d_v, "d_v")]:
        check_positive_int(value, name, most=9999)
    hn = _side(n)
    W, H = PAGE_WIDTH, 3 * hn + 2 * 0.62 + 0.8
    fig, ax = _canvas(W, H)
    rows = [H - 0.45 - hn / 2 - i * (hn + 0.62) for i in range(3)]  # Q, K, V
    y_a, y_s = rows[1], (rows[0] + rows[1]) / 2
    x = max(0.1 + _side(d_model) / 2, 0.45)
    _matrix(ax, x, y_a, n, d_model, "$A$", GREY, above="inputs")
    gap = max(0.9, 0.2 + 0.065 * len(_shape(d_model, max(d_k, d_v))))  # room for "(d_model, d_k)"
    x_qkv = x + _side(d_model) / 2 + 0.2 + gap + max(_side(d_k), _side(d_v)) / 2
    x_bus = x + _side(d_model) / 2 + 0.2  # A goes to a bus, the bus to Q, K and V
    ax.plot([x + _side(d_model) / 2, x_bus], [y_a] * 2, color=INK, lw=1)
    ax.plot([x_bus] * 2, [rows[0], rows[2]], color=INK, lw=1)
    for y, name, w_name, d, color in [(rows[0], "Q", "q", d_k, Q), (rows[1], "K", "k", d_k, K),
                                      (rows[2], "V", "v", d_v, V)]:
        _matrix(ax, x_qkv, y, n, d, f"${name}$", color)
        _arrow(ax, (x_bus, y), (x_qkv - _side(d) / 2 - 0.03, y), color)
        x_w = (x_bus + x_qkv - _side(d) / 2) / 2  # the weight: its name above the arrow, its shape below
        _text(ax, x_w, y + 0.15, f"$\\times W^{w_name}$", size=10, ha="center")
        _text(ax, x_w, y - 0.13, _shape(d_model, d), size=8.5, ha="center")
    x_s = x_qkv + max(_side(d_k), _side(d_v)) / 2 + 0.7 + hn / 2
    _matrix(ax, x_s, y_s, n, n, r"$S$", INK)  # its name starts at its left edge, clear of the arrows
    _text(ax, x_s - hn / 2 - 0.05, y_s + hn / 2 + 0.16, r"$S = QK^\top/\sqrt{d_k}$", size=10)
    for y, color in [(rows[0], Q), (rows[1], K)]:
        _arrow(ax, (x_qkv + _side(d_k) / 2 + 0.05, y), (x_s - hn / 2 - 0.05, y_s), color)
    x_p = x_s + max(hn + 0.8, 1.45)
    _matrix(ax, x_p, y_s, n, n, "$A'$", INK, above="$A' = $ softmax($S$)")
    _arrow(ax, (x_s + hn / 2 + 0.05, y_s), (x_p - hn / 2 - 0.05, y_s))
    _text(ax, (x_s + x_p) / 2, y_s - 0.15, "by rows", size=8.5, ha="center")
    x_b = x_p + max(hn / 2 + 0.55 + _side(d_v) / 2, 1.0)
    _matrix(ax, x_b, y_s, n, d_v, "$B$", OUT, above="$B = A'V$")
    _arrow(ax, (x_p + hn / 2 + 0.05, y_s), (x_b - _side(d_v) / 2 - 0.05, y_s))
    ax.plot([x_qkv + _side(d_v) / 2 + 0.05, x_b], [rows[2]] * 2, color=V, lw=1)
    _arrow(ax, (x_b, rows[2]), (x_b, y_s - hn / 2 - 0.3), V)
    return Diagram(fig, f"Self-attention in matrix form: the inputs A ({n}, {d_model}) times W^q, W^k "
                        f"and W^v give Q ({n}, {d_k}), K ({n}, {d_k}) and V ({n}, {d_v}); the scores "
                        f"S = QK^T / sqrt(d_k) are ({n}, {n}), softmax by rows gives A' ({n}, {n}), "
                        f"and B = A'V is ({n}, {d_v}).")


# ---------------------------------------------------------------------------------------------
# chapter 6


def multi_head(layer: MultiHeadAttention | AttentionConfig, B: int = 2, T: int = 5,
               S: int | None = None) -> Diagram:
    r"""``MultiHeadAttention.forward`` as a picture, every shape from ``layer``'s config: project
    (``q_proj``, ``k_proj``, ``v_proj``), ``split_heads``, attend per head, ``merge_heads``
    (concatenate), ``out_proj`` ($W^O$) (Vaswani et al. 2017, §3.2.2). With fewer key/value heads
    than query heads (GQA, MQA), query head $i$ reads key/value head $i // (h / h_{kv})$.

    ``T`` queries attend to ``S`` keys and values (``S`` defaults to ``T``: self-attention); each
    head's scores are ``(T, S)``."""
    cfg = layer.config if isinstance(layer, MultiHeadAttention) else layer
    if not isinstance(cfg, AttentionConfig):
        raise TypeError(f"layer must be a MultiHeadAttention or an AttentionConfig, got "
                        f"{type(layer).__name__}")
    check_positive_int(B, "B", most=10**6)
    check_positive_int(T, "T", most=10**6)
    S = T if S is None else S
    check_positive_int(S, "S", most=10**6)
    h, h_kv, hd, g = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.group_size
    check_positive_int(h, "n_heads", most=16)
    W, H, bh, lw = PAGE_WIDTH, 4.7, 0.4, 1.1  # lw: a lane's box width
    y0, y1 = H - 0.3, H - 1.05  # inputs, projections (and a line of sizes at the bottom)
    y2 = y1 - 1.25  # the heads: q, k, v pieces stacked, 0.22 apart
    y3, y4 = y2 - 0.22 - 0.8, y2 - 0.22 - 1.55  # merged heads, out_proj
    left, span = 0.15, 3.6  # the heads' row, under the three lanes
    c = left + span / 2
    lanes = {"q": (c - 1.2, Q, "query", cfg.d_model, h, T), "k": (c, K, "key", cfg.kdim, h_kv, S),
             "v": (c + 1.2, V, "value", cfg.vdim, h_kv, S)}  # name: x, colour, input, width, heads, length
    fig, ax = _canvas(W, H)
    pitch = span / h
    xh = [left + pitch * (i + 0.5) for i in range(h)]
    hw, size = min(0.4, 0.85 * pitch), 8 if h <= 8 else 7
    ax.add_patch(FancyBboxPatch((left, y2 - 0.38), span, 0.76, boxstyle="round,pad=0,rounding_size=0.06",
                                facecolor="#f3f3f3", edgecolor="none"))
    for name, (x, color, label, width, n, length) in lanes.items():
        _box(ax, x, y0, lw, bh, f"{label}\n{_shape(B, length, width)}", GREY, size=8.5, family=MONO)
        _arrow(ax, (x, y0 - bh / 2), (x, y1 + bh / 2))
        _box(ax, x, y1, lw, bh, f"{name}_proj\n{_shape(B, length, n * hd)}", color, size=8.5,
             family=MONO)
        _arrow(ax, (x, y1 - bh / 2), (x, y2 + 0.38), color)
        _text(ax, x, y2 + 0.62, _shape(B, n, length, hd), size=8.5, family=MONO, ha="center",
              bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})  # on the arrow
        row = {"q": 0.22, "k": 0.0, "v": -0.22}[name]
        for i, x_i in enumerate(xh):  # head i gets query head i and key/value head i // g
            _box(ax, x_i, y2 + row, hw, 0.19, f"{name}{i if name == 'q' else i // g}", color, size=size,
                 family=MONO)
    for x_i in xh:
        _arrow(ax, (x_i, y2 - 0.38), (x_i, y3 + bh / 2), OUT)
    _box(ax, c, y3, span, bh, "", OUT)  # the heads' outputs side by side
    for i in range(1, h):
        ax.plot([left + pitch * i] * 2, [y3 - bh / 2, y3 + bh / 2], color=OUT, lw=0.8)
    _text(ax, c, y3, f"merge_heads {_shape(B, T, h * hd)}", size=8.5, family=MONO, ha="center",
          bbox={"facecolor": _tint(OUT), "edgecolor": "none", "pad": 2})
    _arrow(ax, (c, y3 - bh / 2), (c, y4 + bh / 2), OUT)
    _box(ax, c, y4, lw, bh, f"out_proj\n{_shape(B, T, cfg.out_dim)}", OUT, size=8.5, family=MONO)
    mono = {"size": 8, "family": MONO}
    kv = "n_kv_heads" if h_kv != h else "n_heads"  # chapter 7's name only where it differs
    notes = [  # beside each step: its name in the code, then its output's shape in the code's names
        (y0, "inputs", "query (B, T, d_model)\nkey (B, S, kdim), value (B, S, vdim)", mono),
        (y1, "q_proj, k_proj, v_proj",
         f"q: (B, T, n_heads·head_dim)\nk, v: (B, S, {kv}·head_dim)", mono),
        (y2 + 0.6, "split_heads" + (", apply_rope" if cfg.rope else ""),
         f"q: (B, n_heads, T, head_dim)\nk, v: (B, {kv}, S, head_dim)", mono),
        (y2 - 0.05, "attend, per head", rf"softmax$(q k^\top / \sqrt{{{hd}}})\, v$", {"size": 10}),
        (y3, "merge_heads (concatenate)", "(B, T, n_heads·head_dim)", mono),
        (y4, "out_proj", "(B, T, out_dim)", mono),
    ]
    for y, step, shapes, style in notes:
        _text(ax, 4.25, y + 0.03, step, size=8.5, family=MONO, weight="bold", va="bottom")
        _text(ax, 4.25, y + 0.01, shapes, va="top", **style)
    _text(ax, 4.25, y4 - 0.17, "the paper's $W^O$", va="top", size=10)
    _text(ax, 4.25, y2 - 0.28, f"scores: (B, n_heads, T, S)\n      = {_shape(B, h, T, S)}",
          va="top", **mono)
    if g > 1:
        _text(ax, 4.25, y2 - 0.6, f"head i reads k, v head i // {g}", va="top", **mono)
    sizes = (f"B={B}, T={T}, " + (f"S={S}, " if S != T else "") + f"d_model={cfg.d_model}, "
             f"n_heads={h}, " + (f"n_kv_heads={h_kv}, " if h_kv != h else "") +
             f"head_dim={hd}, kdim={cfg.kdim}, vdim={cfg.vdim}, out_dim={cfg.out_dim}")
    _text(ax, 0.15, 0.15, sizes, size=8 if len(sizes) <= 98 else 7, color=GREY, family=MONO)  # fits W
    kind = "" if h_kv == h else f", {h_kv} key/value heads"
    return Diagram(fig, f"Multi-head attention with {h} heads of {hd} features{kind}: q_proj maps the "
                        f"query {_shape(B, T, cfg.d_model)} to {_shape(B, T, h * hd)}, split_heads "
                        f"makes it {_shape(B, h, T, hd)}, each head attends on its own (scores "
                        f"{_shape(B, h, T, S)} from {S} keys), merge_heads "
                        f"concatenates the heads back to {_shape(B, T, h * hd)} and out_proj (W^O) "
                        f"gives {_shape(B, T, cfg.out_dim)}.")


# ---------------------------------------------------------------------------------------------
# chapter 7


def kv_heads(n_heads: int = 8, n_kv_heads_list: Sequence[int] | None = None, head_dim: int = 64
             ) -> Diagram:
    r"""MHA, GQA and MQA side by side: which key/value head each query head reads, and what the KV
    cache holds per token and layer, $2 \cdot n_{kv} \cdot d_{head}$ numbers. Query head $i$ reads
    key/value head $i // (n_{heads} / n_{kv})$, as :func:`~selfattn.heads.repeat_kv` orders them
    (Ainslie et al. 2023, §2). ``n_kv_heads_list`` defaults to ``n_heads``, ``n_heads // 4`` (or
    ``// 2``) and 1."""
    check_positive_int(n_heads, "n_heads", most=32)
    check_positive_int(head_dim, "head_dim", most=10**6)
    if n_kv_heads_list is None:
        middle = n_heads // 4 if n_heads >= 8 else n_heads // 2
        n_kv_heads_list = sorted({n_heads, max(middle, 1), 1}, reverse=True)
    counts = list(n_kv_heads_list)
    if not 1 <= len(counts) <= 4:
        raise ValueError(f"n_kv_heads_list must hold 1 to 4 head counts, got {counts}")
    for n_kv in counts:
        check_positive_int(n_kv, "each n_kv_heads")
        if n_heads % n_kv:
            raise ValueError(f"n_heads ({n_heads}) must be a multiple of each n_kv_heads, got "
                             f"{n_kv}: each key/value head serves a whole group of query heads")
    W, H, left = PAGE_WIDTH, 3.0, 0.85
    pw = (W - left) / len(counts)
    y_t, y_q, y_k, y_v, y_c = H - 0.25, 1.95, 1.07, 0.85, 0.38
    fig, ax = _canvas(W, H)
    for y, label in [(y_q, "query\nheads"), (y_k, "key heads"), (y_v, "value heads"),
                     (y_c, "KV cache per\ntoken and\nlayer")]:
        _text(ax, 0.05, y, label, size=8.5)
    mha = 2 * n_heads * head_dim
    for p, n_kv in enumerate(counts):
        g, x_left = n_heads // n_kv, left + p * pw
        name = "MHA" if n_kv == n_heads else "MQA" if n_kv == 1 else "GQA"
        _text(ax, x_left + pw / 2, y_t, name, size=10, weight="bold", ha="center")
        _text(ax, x_left + pw / 2, y_t - 0.25, f"n_kv_heads={n_kv}", size=8, family=MONO, ha="center")
        pitch = (pw - 0.2) / n_heads
        qw = min(0.26, 0.8 * pitch)
        xq = [x_left + 0.1 + pitch * (i + 0.5) for i in range(n_heads)]
        xkv = [sum(xq[j * g:(j + 1) * g]) / g for j in range(n_kv)]
        kw = min(0.8 * pitch * g, 0.5)
        for i, x in enumerate(xq):
            _box(ax, x, y_q, qw, 0.24, str(i) if qw >= 0.07 * len(str(i)) + 0.06 else "", Q, size=8,
                 gid=f"q{p}-{i}")
            j = i // g  # the key/value head query head i reads (repeat_kv's order)
            ax.plot([x, xkv[j]], [y_q - 0.12, y_k + 0.09], color=INK, lw=0.8, gid=f"link{p}-{i}")
        for j, x in enumerate(xkv):
            label = str(j) if kw >= 0.07 * len(str(j)) + 0.06 else ""
            _box(ax, x, y_k, kw, 0.18, label, K, size=7.5, gid=f"kv{p}-{j}")
            _box(ax, x, y_v, kw, 0.18, label, V, size=7.5)
        per_token, ratio = 2 * n_kv * head_dim, Fraction(2 * n_kv * head_dim, mha)
        share = "= MHA's" if ratio == 1 else f"{ratio} of MHA's"
        _text(ax, x_left + pw / 2, y_c, f"2 × {n_kv} × {head_dim}\n= {per_token} numbers\n{share}",
              ha="center", size=8.5)
    sizes = ", ".join(f"{2 * n * head_dim} ({Fraction(n, n_heads)} of MHA's)" for n in counts)
    return Diagram(fig, f"{n_heads} query heads reading {', '.join(map(str, counts))} key/value heads "
                        f"(MHA, GQA, MQA): query head i reads key/value head i // (n_heads / "
                        f"n_kv_heads); the KV cache holds 2 × n_kv_heads × head_dim numbers per token: "
                        f"{sizes}.")


# ---------------------------------------------------------------------------------------------
# chapter 5


def rope_rotation(position: int = 3, theta: float = 1.0, x: tuple[float, float] = (1.0, 0.0)
                  ) -> Diagram:
    r"""RoPE turns a pair of features $(x_1, x_2)$ of a query at position $m$ by the angle
    $m\theta$ (Su et al. 2021, §3.2): drawn for $m = 0 \dots$ ``position``. The points are
    :func:`~selfattn.positional.apply_rope`'s output: pair 1 of a 4-feature vector turns by
    $\text{base}^{-2/4}$ per position, so ``base = theta ** -2`` makes that $\theta$."""
    if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position <= 8:
        raise ValueError(f"position must be an int from 0 to 8, got {position!r}")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0.01 <= theta <= math.pi / 2:
        raise ValueError(f"theta must be a number of radians from 0.01 to pi/2, got {theta!r}")
    if position * theta > 2 * math.pi - 0.3:
        raise ValueError(f"position * theta = {position * theta:.2f} rad goes round the circle more than "
                         f"once; take a smaller position or theta")
    try:
        x1, x2 = (float(c) for c in x)
    except (TypeError, ValueError):
        raise ValueError(f"x must be a pair of numbers (x_1, x_2), got {x!r}") from None
    r = math.hypot(x1, x2)
    if not 0 < r < math.inf:
        raise ValueError(f"x must be a non-zero, finite pair of numbers, got {x!r}")
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
        color = Q if k == position else _tint(Q, 0.55)
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


# ---------------------------------------------------------------------------------------------
# chapter 9


def online_softmax_tiles(L: int = 16, S: int = 16, block_size: int = 4, causal: bool = True,
                         query_block: int | None = None) -> Diagram:
    r"""The ``(L, S)`` score matrix as FlashAttention-2 computes it (Dao 2023, §3.1): in tiles
    of ``block_size`` queries by ``block_size`` keys, skipping the tiles a causal mask
    (:func:`~selfattn.masks.causal_mask`, top-left aligned) hides entirely. One query block walks
    its key blocks keeping, per row, a running maximum $m$ and sum $l$ (the online softmax) and
    the unnormalised output ``acc``, divided by $l$ once at the end (the names of
    :func:`selfattn.tiled.tiled_forward`), so the full matrix is never
    stored. ``query_block`` defaults to the middle one."""
    check_positive_int(L, "L", most=10**7)
    check_positive_int(S, "S", most=10**7)
    check_positive_int(block_size, "block_size")
    nq, nk = math.ceil(L / block_size), math.ceil(S / block_size)
    if max(nq, nk) > 16:
        raise ValueError(f"{nq} x {nk} tiles are too many to draw; at most 16 per side: pass a "
                         f"block_size of at least {math.ceil(max(L, S) / 16)}")
    qb = nq // 2 if query_block is None else query_block
    if isinstance(qb, bool) or not isinstance(qb, int) or not 0 <= qb < nq:
        raise ValueError(f"query_block must be an int from 0 to {nq - 1}, got {query_block!r}")
    keep = causal_mask(L, S) if causal else torch.ones(L, S, dtype=torch.bool)
    t_h, t_w = min(2.6 / nq, 0.6), min(3.0 / nk, 0.6)  # a tile's height and width, in inches
    if max(t_h, t_w) < 2 * min(t_h, t_w):  # square tiles, unless the matrix is very long or wide
        t_h = t_w = min(t_h, t_w)
    grid_h = L / block_size * t_h
    W, H = PAGE_WIDTH, max(grid_h + 0.75, 3.7)  # room for the text column beside the grid
    fig, ax = _canvas(W, H)
    x0, y_top = 0.45, min(H - 0.45, H - 0.8 + grid_h / 2)  # room for the rotated label beside it
    skipped = 0
    for a in range(nq):
        for b in range(nk):
            part = keep[a * block_size:(a + 1) * block_size, b * block_size:(b + 1) * block_size]
            th, tw = t_h * part.shape[0] / block_size, t_w * part.shape[1] / block_size
            x, y = x0 + b * t_w, y_top - a * t_h
            visible = bool(part.any())
            skipped += not visible
            color = _tint(Q, 0.3) if a == qb and visible else "white" if visible else "#d9d9d9"
            ax.add_patch(FancyBboxPatch((x + 0.015, y - th + 0.015), tw - 0.03, th - 0.03, facecolor=color,
                                        boxstyle="round,pad=0,rounding_size=0.03", edgecolor=GREY,
                                        lw=0.8, gid=f"tile{a}-{b}" + ("" if visible else " skipped")))
            if visible and not bool(part.all()):  # grey over the masked corner of a diagonal tile
                n_r, n_c = part.shape
                first = [int(row.int().argmin()) if not row.all() else n_c for row in part]
                pts = [(x + tw, y)]
                for i, c in enumerate(first):  # a staircase down the first masked column of each row
                    pts += [(x + tw * c / n_c, y - th * i / n_r), (x + tw * c / n_c, y - th * (i + 1) / n_r)]
                ax.add_patch(Polygon([*pts, (x + tw, y - th)], facecolor="#d9d9d9", edgecolor="none"))
    _text(ax, x0 + S / block_size * t_w / 2, y_top + 0.18, f"keys (S = {S})", ha="center")
    _text(ax, x0 - 0.17, y_top - grid_h / 2, f"queries (L = {L})", ha="center", rotation=90)
    y_row = y_top - (qb + 0.5) * t_h
    last = max(b for b in range(nk) if keep[qb * block_size:(qb + 1) * block_size,
                                            b * block_size:(b + 1) * block_size].any())
    _arrow(ax, (x0 + 0.05, y_row), (x0 + min((last + 1) * t_w, S / block_size * t_w) - 0.05, y_row),
           OUT, lw=1.8)
    if t_h >= 0.3 and (last + 1) * t_w >= 0.45:  # room for a label over the arrow
        _text(ax, x0 + 0.08, y_row + 0.04, "m, l, acc", size=8.5, color=OUT, va="bottom")
    x_t = x0 + nk * t_w + 0.35
    rows = f"{qb * block_size}–{min((qb + 1) * block_size, L) - 1}"
    lines = [(f"block_size = {block_size}: {nq} × {nk} tiles", {})]
    if causal:
        lines.append((f"grey: hidden by the causal mask;\n{skipped} of {nq * nk} tiles skipped", {}))
    lines += [(f"query block {qb} (rows {rows}) walks its key\nblocks left to right, keeping per row:",
               {"color": OUT}),
              ("m_new = max(m, rowmax(s))\n"
               "alpha = exp(m − m_new)\n"
               "l = alpha · l + rowsum(exp(s − m_new))\n"
               "acc = alpha · acc + exp(s − m_new) @ V_j\n"
               "m = m_new\n"
               "at the end: acc / l",
               {"family": MONO, "size": 8.5, "x": x_t + 0.15}),
              (f"never stored: the full L × S matrix\n({L} × {S} = {L * S:,} scores)", {})]
    y = H - 0.3
    for text, kw in lines:
        line_h = 0.165 if kw.get("family") == MONO else 0.21  # inches per line of 8.5 or 9 pt
        _text(ax, kw.pop("x", x_t), y, text, va="top", linespacing=1.4, **kw)
        y -= line_h * (text.count("\n") + 1) + 0.17
    mask = f"; the causal mask hides {skipped} of them entirely, and they are skipped" if causal else ""
    return Diagram(fig, f"The {L} × {S} score matrix cut into {nq} × {nk} tiles of {block_size}{mask}. "
                        f"Query block {qb} walks its key blocks left to right, updating a running maximum "
                        f"m and sum l per row and an output acc that is divided by l at the end, so the "
                        f"full matrix is never stored.")


# ---------------------------------------------------------------------------------------------
# chapter 7, continued


def grouped_rows(n_heads: int = 8, n_kv_heads: int = 2, L: int = 1) -> Diagram:
    r"""How the library attends with shared key/value heads without copying them: the query heads
    of a group are stacked as rows, ``(B, H, L, hd) -> (B, H_kv, g·L, hd)``, and each group meets
    its one key/value head in a single product of $g L$ rows against $S$ keys. The rows are read
    from :func:`~selfattn.fastpaths.attend_heads`' own regrouping (each query row labelled by its
    head and token), so the picture follows the code. FlashAttention 2 decodes GQA the same way
    (its ``seqlenq_ngroups_swapped``)."""
    from ..fastpaths import GROUPED_HEADS, Call

    check_positive_int(n_heads, "n_heads", most=16)
    check_positive_int(n_kv_heads, "n_kv_heads", most=16)
    check_positive_int(L, "L", most=16)
    if n_heads % n_kv_heads or n_heads == n_kv_heads:
        raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads}), "
                         f"and larger: a group holds two query heads or more")
    if n_heads * L > 16:
        raise ValueError(f"n_heads * L must be at most 16 rows to draw, got {n_heads} * {L}")
    g = n_heads // n_kv_heads
    # each query row holds its own number, head * L + token; the library regroups it
    q = torch.arange(n_heads * L, dtype=torch.float32).reshape(1, n_heads, L, 1)  # (1, H, L, 1)
    kv = torch.zeros(1, n_kv_heads, 1, 1)  # (1, H_kv, S, 1)
    stacked = GROUPED_HEADS.run(Call.of(q, kv, kv)).q  # (1, H_kv, g*L, 1)
    is_view = stacked.data_ptr() == q.data_ptr()
    rows = stacked[0, :, :, 0].long().tolist()  # rows[j]: the query rows of group j

    def name(r: int) -> str:
        return f"q head {r // L}" + (f", token {r % L}" if L > 1 else "")

    n_rows = n_heads * L
    pitch, gap = (0.25 if n_rows <= 8 else 0.2), 0.14
    W, H = PAGE_WIDTH, n_rows * pitch + gap * (n_kv_heads - 1) + 1.55
    top = H - 0.75
    bh = 0.8 * pitch
    colors = [_TAB[i] for i in (0, 3, 2, 1, 4, 5, 6, 8, 9)]
    fig, ax = _canvas(W, H)
    x_q, x_s, x_k, x_v, qw, kvw = 0.72, 3.3, 4.85, 6.0, 1.3, 0.95
    y_h = H - 0.35
    _text(ax, x_q, y_h, f"q: (B, H, L, hd)\nH = {n_heads}, L = {L}", ha="center",
          family=MONO, size=8)
    _text(ax, (x_q + x_s) / 2, top - 0.1, f"reshape, g = {g}\n"
          f"{'a view, no copy' if is_view else 'a copy'}", ha="center", va="bottom", size=8)
    _text(ax, x_s, y_h, f"(B, H_kv, g·L, hd)\n= (B, {n_kv_heads}, {g * L}, hd)", ha="center",
          family=MONO, size=8)
    _text(ax, (x_k + x_v) / 2, y_h, "keys and values\n(B, H_kv, S, hd)", ha="center", size=8)
    y_left = {r: top - pitch * (r + 0.5) for r in range(n_rows)}
    for j, group in enumerate(rows):
        color = colors[j % len(colors)]
        y0 = top - j * (g * L * pitch + gap)
        ys = [y0 - pitch * (i + 0.5) for i in range(len(group))]
        for r, y in zip(group, ys, strict=True):
            _box(ax, x_q, y_left[r], qw, bh, name(r), color, size=8)
            _box(ax, x_s, y, qw, bh, name(r), color, size=8, gid=f"row{j}-{r}")
            ax.plot([x_q + qw / 2, x_s - qw / 2], [y_left[r], y], color=color, lw=0.8)
        mid, span = (ys[0] + ys[-1]) / 2, ys[0] - ys[-1] + bh
        _box(ax, x_k, mid, kvw, span, f"key\nhead {j}", color, size=8, gid=f"k{j}")
        _box(ax, x_v, mid, kvw, span, f"value\nhead {j}", color, size=8)
        _arrow(ax, (x_s + qw / 2 + 0.04, mid), (x_k - kvw / 2 - 0.04, mid), color)
    groups = f"{n_kv_heads} group{'s' if n_kv_heads > 1 else ''}"
    _text(ax, W / 2, 0.38, f"{n_kv_heads} product{'s' if n_kv_heads > 1 else ''} of "
          f"({g * L} × hd)·(hd × S), one per key/value head: the {g * L} query rows of a group\n"
          f"meet their keys and values in one matrix-matrix product, where head by head it "
          f"takes {g} matrix-vector products.", ha="center", size=8)
    return Diagram(fig, f"The {n_heads} query heads ({L} token{'s' if L > 1 else ''} each) are "
                        f"regrouped into {groups} of {g * L} rows, "
                        f"from (B, H, L, hd) to (B, {n_kv_heads}, {g * L}, hd), "
                        f"{'a view without a copy' if is_view else 'a copy'}; each group's rows "
                        f"attend to its one key/value head in a single matrix-matrix product, "
                        f"where head by head it would take {g} matrix-vector products.")


# ---------------------------------------------------------------------------------------------
# multi-head latent attention


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
    (``d_model`` defaults to ``n_heads * head_dim``)."""
    from ..latent import MultiHeadLatentAttention

    check_positive_int(n_heads, "n_heads", most=8)
    for value, name in [(head_dim, "head_dim"), (kv_rank, "kv_rank")]:
        check_positive_int(value, name, most=9999)
    d_model = n_heads * head_dim if d_model is None else check_positive_int(d_model, "d_model",
                                                                            most=99999)
    if isinstance(rope_dim, bool) or not isinstance(rope_dim, int):
        raise TypeError(f"rope_dim must be an int, got {type(rope_dim).__name__}")
    if not 0 <= rope_dim <= 9998:  # the layer checks that it is even
        raise ValueError(f"rope_dim must be from 0 to 9998, got {rope_dim}")
    with torch.device("meta"):  # the sizes and names only: no weights are allocated
        layer = MultiHeadLatentAttention(d_model, n_heads, head_dim, kv_rank, rope_dim=rope_dim)
    h, hd, r, dr = layer.n_heads, layer.head_dim, layer.kv_rank, layer.rope_dim
    cached, mha = layer.cache_numbers_per_token(), 2 * h * hd
    k_width = layer.k_up.out_features // h  # per head, before the rope part is appended
    W, H = PAGE_WIDTH, 4.9
    ROPE, CACHE = _TAB[5], _TAB[3]
    fig, ax = _canvas(W, H)
    mono = {"family": MONO, "size": 8}
    _text(ax, 0.1, H - 0.3, "multi-head latent attention\n(DeepSeek-V2, §2.1)", size=8.5)
    # the token: its hidden state
    x_h, y_h = 0.55, 2.55
    _text(ax, x_h, y_h + 0.5, "token t", ha="center", size=8.5, weight="bold")
    _box(ax, x_h, y_h, 0.9, 0.55, f"h_t\n({layer.d_model},)", GREY, size=8.5, family=MONO)
    # the cache: the latent and the shared rope key, all a token leaves behind
    x_c, cw, y_c, y_r = 2.22, 1.45, 3.15, 1.95
    ax.add_patch(FancyBboxPatch((x_c - cw / 2 - 0.08, y_r - 0.4), cw + 0.16, y_c - y_r + 0.82,
                                boxstyle="round,pad=0,rounding_size=0.08", facecolor=_tint(CACHE, 0.08),
                                edgecolor=CACHE, linewidth=1.0, linestyle="--", gid="cache"))
    _text(ax, x_c, y_c + 0.56, "KV cache, per token", ha="center", size=8.5, weight="bold")
    _box(ax, x_c, y_c, cw, 0.55, f"kv_down → c_t\n({r},)", CACHE, size=8, family=MONO, gid="latent")
    ax.patches[-1].set_linewidth(2.0)  # the latent: the one thing every head shares
    if dr:
        _box(ax, x_c, y_r, cw, 0.5, f"k_rope, RoPE → k^R_t\n({dr},)", ROPE, size=8, family=MONO,
             gid="rope key")
    else:
        _text(ax, x_c, y_r, "no rope key\n(rope_dim = 0)", ha="center", size=8, color=GREY)
    numbers = "number" if cached == 1 else "numbers"
    _text(ax, x_c, y_r - 0.55, f"{r} + {dr} = {cached} {numbers}" if dr else f"{r} {numbers}",
          ha="center", **mono)
    _arrow(ax, (x_h + 0.45, y_h + 0.12), (x_c - cw / 2 - 0.1, y_c - 0.05))
    if dr:
        _arrow(ax, (x_h + 0.45, y_h - 0.12), (x_c - cw / 2 - 0.1, y_r + 0.05))
    # explicit: every cached latent up-projected to every head's key and value
    x0 = 3.2  # the right half starts here
    _text(ax, x0, H - 0.2, "explicit: up-project every cached latent", size=8.5, weight="bold")
    y_k, y_v = 4.15, 3.6
    x_lab, x1, x2 = x0 + 0.05, 4.25, W - 0.1  # the labels, then the heads from x1 to x2
    pitch = (x2 - x1) / h
    bw = min(0.85 * pitch, 0.6)
    content = bw * k_width / (k_width + dr)  # a key box: its own part, then the shared rope part
    for y, name, color, label in [(y_k, "k_up", K, r"$W^{UK}$"), (y_v, "v_up", V, r"$W^{UV}$")]:
        _text(ax, x_lab, y, name, **mono)
        _text(ax, x_lab + 0.4, y, label, size=10)
        _arrow(ax, (x_c + cw / 2 + 0.02, y_c + 0.1), (x_lab - 0.04, y), CACHE)
        for i in range(h):
            left = x1 + pitch * i + (pitch - bw) / 2
            width = content if name == "k_up" else bw * hd / (k_width + dr)
            label = f"{name[0]}{i}" if width >= 0.05 * len(f"{name[0]}{i}") + 0.04 else ""
            _box(ax, left + width / 2, y, width, 0.28, label, color, size=8, family=MONO,
                 gid=f"{name[0]}{i}")
            if name == "k_up" and dr:
                _box(ax, left + content + (bw - content) / 2, y, bw - content, 0.28, "", ROPE,
                     gid=f"rope{i}")
    key = f"key {k_width} + {dr} (k^R, shared)" if dr else f"key {k_width}"
    _text(ax, x_lab, y_v - 0.3, f"per head: {key},\n          value {hd}, query {hd + dr};\n"
          "built from every cached latent", va="top", linespacing=1.3, **mono)
    # absorbed: the heads attend to the latents themselves
    _text(ax, x0, 2.45, "absorbed (decoding): no per-head key or value", size=8.5, weight="bold")
    y_s, y_o = 1.85, 0.95
    xb, xa, bw2 = 4.05, 5.9, 1.55
    rope_score = r" + q_i^{R\top} k^R_j" if dr else ""
    _box(ax, xb, y_s, bw2, 0.62, f"scores, per head\n$\\tilde q_i^\\top c_j{rope_score}$", GREY,
         size=10, gid="scores")
    _box(ax, xa, y_s, bw2, 0.62, "query, per head\n" r"$\tilde q_i = W_i^{UK\top} W^Q_i h_t$",
         Q, size=10, gid="query")
    _box(ax, xb, y_o, bw2, 0.62, "weights × latents\n" r"$z_i = \Sigma_j\, a_{ij}\, c_j$", CACHE, size=10,
         gid="weighted latents")
    _box(ax, xa, y_o, bw2, 0.62, "out_proj, absorbed\n" r"$\Sigma_i\, W^O_i W_i^{UV} z_i$", OUT, size=10,
         gid="output")
    _arrow(ax, (xa - bw2 / 2 - 0.02, y_s), (xb + bw2 / 2 + 0.02, y_s), Q)
    _arrow(ax, (xb, y_s - 0.31), (xb, y_o + 0.31))
    _arrow(ax, (xb + bw2 / 2 + 0.02, y_o), (xa - bw2 / 2 - 0.02, y_o), OUT)
    _arrow(ax, (x_c + cw / 2 + 0.02, y_c - 0.15), (xb - bw2 / 2 - 0.02, y_s + 0.15), CACHE)
    _arrow(ax, (x_c + cw / 2 + 0.02, y_c - 0.25), (xb - bw2 / 2 - 0.02, y_o + 0.1), CACHE)
    if dr:
        _arrow(ax, (x_c + cw / 2 + 0.02, y_r), (xb - bw2 / 2 - 0.02, y_s - 0.1), ROPE)
    _text(ax, xa, y_o - 0.45, f"z_i: ({r},) per head", ha="center", **mono)
    # what the cache costs, against multi-head attention
    share = Fraction(cached, mha)
    _text(ax, 0.1, 0.17, f"cache per token and layer: {cached} {numbers}; MHA's: 2 × {h} × {hd} = "
          f"{mha}; {share} of it", size=8, family=MONO)
    alt_rope = (f" and one rotated rope key of {dr} numbers shared by every head" if dr else
                " (no rope key: rope_dim is 0)")
    return Diagram(fig, f"Multi-head latent attention with {h} heads of {hd} features: a token's hidden "
                        f"state of {layer.d_model} numbers gives one latent c of {r} numbers{alt_rope}; "
                        f"the KV cache holds these {cached} numbers per token, where multi-head "
                        f"attention holds 2 × {h} × {hd} = {mha}. The explicit form up-projects every "
                        f"cached latent with W^UK and W^UV into each head's key and value; the absorbed "
                        f"form, for decoding, folds W^UK into the query and W^UV into the output "
                        f"projection, so each head scores and sums the latents themselves.")


# ---------------------------------------------------------------------------------------------
# caches: paged blocks, rolling buffers


def _paged_run(lengths: Sequence[int], block_size: int, n_blocks: int) -> tuple[object, list]:
    """A :class:`~selfattn.cache.BlockPool` and one :class:`~selfattn.cache.PagedKVCache` per
    request, decoded side by side: every step, each unfinished request appends one token, whose key
    holds its position and whose value its request's index (one head of width 1). The pool starts
    as NaN, so a slot no token was written to reads as empty."""
    from ..cache import BlockPool, PagedKVCache

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
    the free list and the unused slots (``allocated_bytes - nbytes``) are the caches' own.
    ``n_blocks`` defaults to the blocks the requests need plus two free ones."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence):
        raise ValueError(f"lengths must be a sequence of 1 to 4 token counts, got {lengths!r}")
    lengths = list(lengths)
    if not 1 <= len(lengths) <= 4:
        raise ValueError(f"lengths must hold 1 to 4 token counts (one per request), got {len(lengths)}")
    for n in lengths:
        check_positive_int(n, "each length", most=99)
    check_positive_int(block_size, "block_size", most=8)
    needed = sum(math.ceil(n / block_size) for n in lengths)
    n_blocks = needed + 2 if n_blocks is None else check_positive_int(n_blocks, "n_blocks")
    if not needed <= n_blocks <= 12:
        raise ValueError(f"n_blocks must be from the {needed} blocks the requests need to 12 (to fit "
                         f"the page), got {n_blocks}")
    pool, caches = _paged_run(lengths, block_size, n_blocks)
    tables = [list(c.block_table) for c in caches]
    names = "ABCD"[:len(lengths)]
    colors = [Q, K, V, OUT]
    stored_pos = pool.k[:, 0, :, 0].tolist()  # (n_blocks, block_size): the position in each slot
    stored_req = pool.v[:, 0, :, 0].tolist()  # ... and the request it belongs to
    owner = {b: r for r, table in enumerate(tables) for b in table}
    slot_bytes = pool.bytes_per_block // block_size
    unused = [(c.allocated_bytes - c.nbytes) // slot_bytes for c in caches]
    W, H = PAGE_WIDTH, 4.1
    fig, ax = _canvas(W, H)
    mono = {"family": MONO, "size": 8}
    bold = {"size": 8.5, "weight": "bold"}
    headers = [(f"{name}: {n} token{'s' if n > 1 else ''}", f"block_table {table}")
               for name, n, table in zip(names, lengths, tables, strict=True)]
    gap_b, gap_r, margin = 0.06, 0.3, 0.1  # between blocks, between requests, at the sides

    def header_width(r: int) -> float:
        return max(0.075 * len(headers[r][0]), 0.067 * len(headers[r][1])) + 0.1

    bw = min(0.9, (W - 2 * margin - (n_blocks - 1) * gap_b) / n_blocks)  # a block's width
    while True:  # narrower blocks until the requests, each under its header, fit side by side
        groups = [max(len(t) * bw + (len(t) - 1) * gap_b, header_width(r)) for r, t in enumerate(tables)]
        if sum(groups) + gap_r * (len(groups) - 1) <= W - 2 * margin or bw < 0.2:
            break
        bw -= 0.02
    cw = bw / block_size  # a slot's width
    labelled = cw >= 0.16  # room for a two-digit position in each slot
    ch = 0.3
    y_title, y_head, y_log, y_phys = H - 0.2, H - 0.88, H - 1.5, 1.3
    _text(ax, margin, y_title, "PagedAttention: block tables map each request's logical blocks onto "
          "one shared pool", **bold)
    _text(ax, margin, y_title - 0.24, "(Kwon et al. 2023, §4.1–4.2); the requests decode side by side, "
          "one token each per step, so their blocks interleave", size=8)

    def block(x: float, y: float, r: int | None, cells: list[tuple[str, bool]], gid: str,
              text_gid: str) -> None:
        """A block of ``block_size`` slots, left edge at ``x``: each slot's label and whether a
        token fills it (an empty slot is hatched: room allocated, not used)."""
        color = GREY if r is None else colors[r]
        ax.add_patch(FancyBboxPatch((x, y - ch / 2), bw, ch, boxstyle="round,pad=0,rounding_size=0.04",
                                    facecolor="white", edgecolor=color, linewidth=1.2, gid=gid, zorder=2))
        for s, (label, full) in enumerate(cells):
            fill = _tint(color, 0.3) if full else "white"
            ax.add_patch(FancyBboxPatch((x + s * cw + 0.015, y - ch / 2 + 0.03), cw - 0.03, ch - 0.06,
                                        boxstyle="square,pad=0", facecolor=fill, edgecolor="none",
                                        hatch=None if full or r is None else "////", zorder=2))
            if r is not None and not full:
                ax.patches[-1].set_edgecolor(_tint(color, 0.5))
                ax.patches[-1].set_linewidth(0)
            if label and labelled:
                _text(ax, x + (s + 0.5) * cw, y, label, size=7.5, ha="center", zorder=3,
                      gid=f"{text_gid}.{s}")

    # the pool's physical blocks, left to right by number
    pitch_p = (W - 2 * margin - bw) / max(n_blocks - 1, 1)
    x_phys = [margin + b * min(pitch_p, bw + 0.3) for b in range(n_blocks)]
    shift = (W - (x_phys[-1] + bw) - margin) / 2
    x_phys = [x + shift for x in x_phys]
    for b in range(n_blocks):
        r = owner.get(b)
        cells = [("" if math.isnan(p) else str(int(p)), not math.isnan(p)) for p in stored_pos[b]]
        assert r is None or all(math.isnan(q) or int(q) == r for q in stored_req[b])
        block(x_phys[b], y_phys, r, cells, f"physical {b}: " + ("free" if r is None else names[r]),
              f"physical {b}")
        _text(ax, x_phys[b] + bw / 2, y_phys - ch / 2 - 0.14, str(b), size=8.5, ha="center", weight="bold")
        _text(ax, x_phys[b] + bw / 2, y_phys - ch / 2 - 0.33, "free" if r is None else names[r], size=8,
              ha="center", color=GREY if r is None else INK)
    _text(ax, margin, y_phys - ch / 2 - 0.62, f"physical blocks: BlockPool(n_blocks={n_blocks}, "
          f"block_size={block_size}), shared; under each, its number and the request holding it",
          size=8)
    # each request's logical blocks, and an arrow from each to the physical block it maps to
    x = margin + (W - 2 * margin - sum(groups) - gap_r * (len(groups) - 1)) / 2
    for r, (table, n, group) in enumerate(zip(tables, lengths, groups, strict=True)):
        mid = x + group / 2
        _text(ax, mid, y_head + 0.12, headers[r][0], ha="center", **bold)
        _text(ax, mid, y_head - 0.1, headers[r][1], ha="center", gid=f"table {names[r]}", **mono)
        left = mid - (len(table) * bw + (len(table) - 1) * gap_b) / 2
        for j, b in enumerate(table):
            xj = left + j * (bw + gap_b)
            cells = [(str(p), True) if p < n else ("", False)
                     for p in range(j * block_size, (j + 1) * block_size)]
            block(xj, y_log, r, cells, f"logical {names[r]}{j} -> {b}", f"logical {names[r]}{j}")
            _arrow(ax, (xj + bw / 2, y_log - ch / 2 - 0.02), (x_phys[b] + bw / 2, y_phys + ch / 2 + 0.03),
                   colors[r], lw=0.9)
        x += group + gap_r
    waste = " + ".join(str(u) for u in unused)
    total = sum(len(t) for t in tables) * block_size
    free = pool.free_blocks
    _text(ax, margin, 0.38, f"unused slots (hatched, only in each last block): {waste} = {sum(unused)} "
          f"of {total} allocated", size=8)
    _text(ax, margin, 0.16, f"free list: {free}" if free else "free list: empty (the pool is full)", size=8,
          family=MONO)
    maps = "; ".join(f"request {name} ({n} tokens) has block table {table}"
                     for name, n, table in zip(names, lengths, tables, strict=True))
    return Diagram(fig, f"PagedAttention: {len(lengths)} request{'s' if len(lengths) > 1 else ''} decoded "
                        f"side by side store their keys and values in blocks of {block_size} tokens "
                        f"taken from one shared pool of {n_blocks} physical blocks; {maps}. Each "
                        f"request's logical blocks map onto physical blocks that need not be adjacent; "
                        f"only each request's last block is partly filled ({sum(unused)} unused slots "
                        f"of {total}), and blocks {free} are free.")


def _rolling_run(cache, t: int) -> tuple[list[int], int]:
    """Feed ``cache`` (a fresh :class:`~selfattn.cache.SinkCache` or
    :class:`~selfattn.cache.SlidingWindowCache`) ``t`` tokens one at a time, each key holding its
    own position; return the position each buffer slot holds now, read back from the cache's
    buffer, and the slot the next token (position ``t``) will be written to."""
    for p in range(t):
        x = torch.full((1, 1, 1, 1), float(p), dtype=torch.float64)
        cache.append(x, x)
    held = [int(p) for p in cache._k[0, 0, :, 0].tolist()]  # (n_sink + window,): its buffer, read back
    nxt = int(cache._slots(torch.tensor([t]))[0])  # where append writes position t
    return held, nxt


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
    disagree with the code. ``t`` is at least ``n_sink + window`` (the buffer full)."""
    from ..cache import SinkCache, SlidingWindowCache

    if isinstance(n_sink, bool) or not isinstance(n_sink, int):
        raise TypeError(f"n_sink must be an int, got {type(n_sink).__name__}")
    if not 0 <= n_sink <= 8:
        raise ValueError(f"n_sink must be from 0 to 8, got {n_sink}")
    check_positive_int(window, "window", most=16)
    size = n_sink + window
    if size > 16:
        raise ValueError(f"n_sink + window must be at most 16 slots to draw, got {n_sink} + {window}")
    if isinstance(t, bool) or not isinstance(t, int):
        raise TypeError(f"t must be an int, got {type(t).__name__}")
    if not size <= t <= 32:
        raise ValueError(f"t must be from n_sink + window = {size} (the buffer full) to 32, got {t}")
    panels = [("sink", f"SinkCache(n_sink={n_sink}, window={window})", SinkCache(n_sink, window), n_sink)]
    if sliding:
        panels.append(("sliding", f"SlidingWindowCache(window={size})", SlidingWindowCache(size), 0))
    SINK, KEPT, EVICTED, NEXT = OUT, Q, "#eeeeee", K
    ph, sh, link = 0.26, 0.34, 0.62  # a position's height, a slot's height, the lines between
    panel_h = 0.3 + ph + link + sh + 0.32
    W, H = PAGE_WIDTH, 0.55 + len(panels) * panel_h + 0.3
    fig, ax = _canvas(W, H)
    x0, margin = 0.95, 0.1  # the rows start after their captions
    pw = min(0.3, (W - x0 - margin) / (t + 1))  # t positions and the next one
    sw = min(0.42, (W - x0 - margin) / size)
    tokens = f"{t} token{'s' * (t > 1)}"
    _text(ax, margin, H - 0.2, f"Rolling KV buffers after t = {tokens}: which position each slot holds",
          size=8.5, weight="bold")
    _text(ax, margin, H - 0.42, "(StreamingLLM, Xiao et al. 2023, §3.2; Mistral 7B's rolling buffer, "
          "Jiang et al. 2023, §2)", size=8)
    summary = []
    for k, (tag, title, cache, sinks) in enumerate(panels):
        held, nxt = _rolling_run(cache, t)
        top = H - 0.55 - k * panel_h
        y_p, y_s = top - 0.3 - ph / 2, top - 0.3 - ph - link - sh / 2
        win = size - sinks
        _text(ax, margin, top - 0.12, title, size=8, family=MONO, weight="bold")
        rolling = f"{_slot_range(sinks, size)} roll" + "s" * (win == 1)
        kept_sinks = f"{_slot_range(0, sinks)}: sinks, kept; " if sinks else "no sinks; "
        _text(ax, W - margin, top - 0.12, kept_sinks + rolling, size=8, ha="right")
        _text(ax, margin, y_p, "positions", size=8)
        _text(ax, margin, y_s, "buffer slots", size=8)
        kept = set(held)
        for p in range(t + 1):
            x = x0 + (p + 0.5) * pw
            kind = "next" if p == t else "sink" if p < sinks else "kept" if p in kept else "evicted"
            color = {"next": NEXT, "sink": SINK, "kept": KEPT, "evicted": GREY}[kind]
            fill = {"next": "white", "evicted": EVICTED}.get(kind, _tint(color, 0.3))
            ax.add_patch(FancyBboxPatch((x - pw / 2 + 0.01, y_p - ph / 2), pw - 0.02, ph,
                                        boxstyle="round,pad=0,rounding_size=0.03", facecolor=fill,
                                        edgecolor=color, linewidth=0.9, linestyle="--" if p == t else "-",
                                        gid=f"{tag} position {p} {kind}"))
            _text(ax, x, y_p, str(p), size=7.5 if pw >= 0.2 else 7, ha="center",
                  color=GREY if kind == "evicted" else INK)
        for s, p in enumerate(held):
            xs, xp = x0 + (s + 0.5) * sw, x0 + (p + 0.5) * pw
            color = SINK if s < sinks else KEPT
            _box(ax, xs, y_s, sw - 0.04, sh, str(p), color, size=8.5, gid=f"{tag} slot {s} holds {p}")
            ax.texts[-1].set_gid(f"{tag} slot {s}")
            ax.plot([xs, xp], [y_s + sh / 2, y_p - ph / 2], color=color, lw=0.8, zorder=1)
            _text(ax, xs, y_s - sh / 2 - 0.15, str(s), size=7, ha="center", color=GREY)
        # the next write: position t into slot nxt, over the oldest token of the window
        xs = x0 + (nxt + 0.5) * sw
        ax.add_patch(FancyBboxPatch((xs - sw / 2 + 0.005, y_s - sh / 2 - 0.035), sw - 0.01, sh + 0.07,
                                    boxstyle="round,pad=0,rounding_size=0.05", facecolor="none",
                                    edgecolor=NEXT, linewidth=1.6, linestyle="--", gid=f"{tag} next {nxt}"))
        ax.plot([xs, x0 + (t + 0.5) * pw], [y_s + sh / 2 + 0.035, y_p - ph / 2], color=NEXT, lw=1.2,
                ls="--", zorder=1)
        evicted = t - len(kept)
        sinks_in = f"sinks in {_slot_range(0, sinks)}, " if sinks else ""
        summary.append(f"{title} ({sinks_in}the last {win} rolling in {_slot_range(sinks, size)}) keeps "
                       f"positions {_runs(sorted(kept))} ({evicted} evicted); position {t} goes to slot "
                       f"{nxt}, overwriting position {held[nxt]}")
    legend = [(SINK, _tint(SINK, 0.3), "sink", "-")] if n_sink else []
    legend += [(KEPT, _tint(KEPT, 0.3), "in the window", "-"), (GREY, EVICTED, "evicted", "-"),
               (NEXT, "white", f"next write (position {t})", "--")]
    x = margin
    for edge, fill, label, style in legend:
        ax.add_patch(FancyBboxPatch((x, 0.1), 0.22, 0.16, boxstyle="round,pad=0,rounding_size=0.03",
                                    facecolor=fill, edgecolor=edge, linewidth=1.0, linestyle=style))
        _text(ax, x + 0.28, 0.18, label, size=8)
        x += 0.28 + 0.068 * len(label) + 0.3
    sinks_stay = "The sinks stay in their slots; the" if n_sink else "The"
    return Diagram(fig, f"Rolling key/value buffers after {tokens}. " + ". ".join(summary)
                        + f". {sinks_stay} window's slots are overwritten in rolling order, each "
                        "new token replacing the one a window's length before it.")


def _runs(numbers: list[int]) -> str:
    """``0–3, 11–18``: sorted whole numbers as runs of consecutive ones."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs)


def _slot_range(start: int, stop: int) -> str:
    """``slot 3`` or ``slots 4–11``: the slots ``start`` to ``stop - 1``."""
    return f"slot {start}" if stop - start == 1 else f"slots {start}–{stop - 1}"
