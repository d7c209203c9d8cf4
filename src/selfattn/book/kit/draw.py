r"""What the book's figures are drawn with: the schematic diagrams' primitives, and the one
palette of the book's models and arms.

Each topic's diagram functions return a :class:`Diagram`: a ``matplotlib.figure.Figure`` (made
without pyplot) and an ``alt`` text for screen readers. Jupyter, Colab and the built book show it
as a PNG with its alt text; it fits the page (``viz.PAGE_WIDTH`` inches at 100 dpi, text at least
7 pt). Every label is computed from the code, so a change in the code cannot leave a stale picture.
The diagrams colour roles (:data:`Q`, :data:`K`, :data:`V`, :data:`OUT`).

A chapter's plot colours a model or an arm of an experiment with :func:`color`: one colour per
name in every chapter (the MQA curve of chapter 7 is the MQA of chapter 11), from
:data:`PALETTE`, Okabe and Ito's colour-blind-safe hues.
"""

from __future__ import annotations

import base64
import html
from typing import Any

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch
from matplotlib.typing import ColorType

from .viz import png_256

DPI = 100  # the book shows a notebook's PNG at 100 dpi, full size up to PAGE_WIDTH inches


PT = 9  # body text; nothing is under 7 pt (9.7 px at 100 dpi), mathtext is 10 pt (scripts at 7)


INK = "#222222"


TAB = [to_rgb(colormaps["tab10"](i)) for i in range(10)]  # matplotlib's ten default colours


Q, K, V, OUT, GREY = TAB[0], TAB[1], TAB[2], TAB[4], TAB[7]  # the diagrams' roles


# Okabe and Ito's (2008) colour-blind-safe hues, without yellow and black (too faint on white,
# lost on the dark theme); orange and sky blue darker than theirs, so that every colour keeps a
# contrast of 3:1 on the figures' white and on the dark theme's page (tests/test_diagrams.py)
BLUE, ORANGE, SKY, GREEN = "#0072B2", "#C98600", "#3A9AD3", "#009E73"
VERMILLION, PURPLE, CONTROL = "#D55E00", "#CC79A7", "#7F7F7F"
MAGENTA = "#D81B60"  # beyond Okabe and Ito's: chapter 1 draws seven taggers side by side


PALETTE: dict[str, str] = {
    # chapter 1's taggers, and the layers it compares; attention is blue everywhere
    "self-attention": BLUE, "window": ORANGE, "CNN": SKY, "GRU": GREEN, "causal average": PURPLE,
    "mean-pool": CONTROL, "fixed decay": MAGENTA,
    # data
    "train": BLUE, "test": ORANGE,
    # chapter 3's scorers
    "scaled dot": BLUE, "dot": VERMILLION, "additive": GREEN,
    # chapter 5's position schemes
    "RoPE": BLUE, "sinusoidal": ORANGE, "learned": SKY, "ALiBi": PURPLE, "none": CONTROL,
    # chapters 7 and 11: key/value heads
    "MHA": BLUE, "GQA": GREEN, "MQA": VERMILLION,
    # chapter 9's attention paths
    "explicit": BLUE, "tiled": GREEN, "SDPA": ORANGE,
    # chapter 11's decoding and its attention sinks
    "cached": BLUE, "recompute": VERMILLION, "BOS": BLUE, "control": CONTROL,
}


FAMILIES: dict[str, tuple[str, ...]] = {  # the names a figure draws side by side
    "taggers": ("self-attention", "window", "CNN", "GRU", "causal average", "mean-pool",
                "fixed decay"),
    "data": ("train", "test"),
    "scorers": ("scaled dot", "dot", "additive"),
    "positions": ("RoPE", "sinusoidal", "learned", "ALiBi", "none", "fixed decay"),
    "key/value heads": ("MHA", "GQA", "MQA"),
    "attention paths": ("explicit", "tiled", "SDPA"),
    "decoding": ("cached", "recompute"),
    "sinks": ("BOS", "control"),
}


_BY_KEY = {name.casefold(): name for name in PALETTE}


def color(name: str) -> str:
    """The colour of a model or an arm, the same in every chapter: ``color("MQA")``. The names
    are :data:`PALETTE`'s keys, case and underscores aside (``"rope"``, ``"scaled_dot"``: the
    names the code gives them); a KeyError for any other."""
    return PALETTE[_BY_KEY[name.casefold().replace("_", " ")]]


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


def canvas(width: float, height: float) -> tuple[Figure, Axes]:
    """A white figure ``width`` by ``height`` inches, its one axes in inches, without axis lines."""
    fig = Figure(figsize=(width, height), dpi=DPI, facecolor="white")
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_axis_off()
    return fig, ax


def tint(color: ColorType, amount: float = 0.18) -> tuple[float, float, float]:
    """``color`` faded towards white: ``amount`` of it, the rest white."""
    r, g, b = to_rgb(color)
    return 1 - amount * (1 - r), 1 - amount * (1 - g), 1 - amount * (1 - b)


def box(ax: Axes, x: float, y: float, w: float, h: float, text: str = "", color: ColorType = GREY, *,
        size: float = PT, family: str | None = None, fill: ColorType | None = None,
        gid: str | None = None) -> None:
    """A rounded box centred at ``(x, y)``, ``w`` by ``h`` inches, with ``text`` in the middle."""
    r = min(0.06, w / 4, h / 4)
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle=f"round,pad=0,rounding_size={r}",
                                facecolor=tint(color) if fill is None else fill, edgecolor=color,
                                linewidth=1.1, gid=gid))
    if text:
        ax.text(x, y, text, ha="center", va="center", fontsize=size, color=INK, family=family)


def arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], color: ColorType = INK,
          lw: float = 1.0) -> None:
    ax.annotate("", xy=end, xytext=start, arrowprops={
        "arrowstyle": "-|>,head_length=0.45,head_width=0.2", "color": color, "lw": lw,
        "shrinkA": 0, "shrinkB": 0, "mutation_scale": 12})


def text(ax: Axes, x: float, y: float, s: str, size: float = PT, **kw: Any) -> None:
    kw.setdefault("color", INK)
    kw.setdefault("va", "center")
    ax.text(x, y, s, fontsize=size, **kw)


def shape(*dims: int) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ")"


def runs(numbers: list[int]) -> str:
    """``0–3, 11–18``: sorted whole numbers as runs of consecutive ones."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs)


def slot_range(start: int, stop: int) -> str:
    """``slot 3`` or ``slots 4–11``: the slots ``start`` to ``stop - 1``."""
    return f"slot {start}" if stop - start == 1 else f"slots {start}–{stop - 1}"
