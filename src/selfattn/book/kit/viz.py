"""Attention heatmaps and the explorer widget that every chapter's interactive view uses.

* :func:`heatmap` draws one ``(L, S)`` matrix (picked out of ``(H, L, S)`` or ``(B, H, L, S)``):
  tokens on both axes, a colorbar, numbers in the cells while they fit, masked cells hatched.
* :func:`heads` draws every head of a ``(H, L, S)`` or ``(B, H, L, S)`` tensor in a grid.
* :func:`explorer` is an ipywidgets view with controls that redraw a heatmap. In a live kernel
  (Jupyter, Colab) it recomputes on every change and takes a typed sentence. In the static book it
  precomputes every state the controls can reach and switches between them in the browser, with no
  kernel (``jsdlink`` between widgets survives in the saved widget state; Python callbacks do not).
  Input a reader can fix (:class:`InputError`) gets a short message; any other error is raised.
"""

from __future__ import annotations

import html
import io
import itertools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import seaborn as sns
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

if TYPE_CHECKING:
    import ipywidgets


ANNOTATE_UP_TO = 12  # annotate every cell only while the matrix is at most this many tokens wide


ANNOTATION_PT = 9  # the numbers in the cells


# The book's content column is 688 px wide in a 1280 px window: a notebook figure (100 dpi) up to
# PAGE_WIDTH inches wide and an explorer picture (72 dpi) up to EXPLORER_WIDTH inches are shown at
# full size, so text of 7 pt and 9 pt respectively stays at least 9 px tall on the page.
PAGE_WIDTH = 6.8


EXPLORER_WIDTH = 9.4


EXPLORER_DPI = 72


MAX_STATES = 48  # a static explorer precomputes at most this many heatmaps ...


MAX_PAGE_BYTES = 3_000_000  # ... and at most this many bytes of PNG, about 20-40 KB each


STATIC_ENV = "SELFATTN_STATIC"  # set to 1 (the Makefile's book build does) for static explorers


def heatmap(
    weights: torch.Tensor | np.ndarray,
    x_tokens: Sequence[str] | None = None,
    y_tokens: Sequence[str] | None = None,
    mask: torch.Tensor | np.ndarray | None = None,
    head: int = 0,
    batch: int = 0,
    annot: bool | None = None,
    title: str = "Attention weights",
    ax: Axes | None = None,
    cbar: bool = True,
) -> Axes:
    """Draw an attention matrix: queries down the side, keys along the top.

    Args:
        weights: ``(L, S)``, ``(H, L, S)`` or ``(B, H, L, S)``, a tensor on any device or an array;
            ``batch`` and ``head`` pick the matrix out of the larger shapes.
        x_tokens: labels of the ``S`` keys; ``y_tokens`` of the ``L`` queries (default: the keys').
        mask: bool, broadcastable to ``(L, S)``; True = may attend (the library's convention).
            Masked cells are hatched grey, so "masked" and "weight 0" look different.
        annot: write each weight in its cell; by default only while ``max(L, S) <= 12``.
        title: the axes' title. ``ax``: where to draw (a new figure by default).
    """
    w = _pick(_to_numpy(weights), batch, head)
    L, S = w.shape
    y_tokens = x_tokens if y_tokens is None else y_tokens
    for name, tokens, n in [("x_tokens", x_tokens, S), ("y_tokens", y_tokens, L)]:
        if tokens is not None and len(tokens) != n:
            raise ValueError(f"{name} has {len(tokens)} labels for {n} columns/rows of weights")
    hidden = None
    if mask is not None:
        m = _to_numpy(mask)
        if m.dtype != bool:
            raise TypeError(f"mask must be bool (True = may attend), got {m.dtype}")
        try:
            hidden = ~np.broadcast_to(m, w.shape)
        except ValueError:
            raise ValueError(f"mask of shape {m.shape} does not broadcast to {w.shape}") from None
    if annot is None:
        annot = max(L, S) <= ANNOTATE_UP_TO
    if ax is None:
        import matplotlib.pyplot as plt  # only when drawing into a new figure of pyplot's

        width = min(1.2 + 0.5 * S, PAGE_WIDTH)
        _, ax = plt.subplots(figsize=(width, 0.8 + (width - 1.2) / S * 0.9 * L))
    ax.set_facecolor("#dddddd")  # shows through the masked (hidden) cells
    sns.heatmap(
        w, ax=ax, mask=hidden, cmap="YlGnBu", vmin=0.0, vmax=1.0, square=True,
        annot=annot, fmt=".2f", annot_kws={"fontsize": ANNOTATION_PT}, linewidths=0.5 if annot else 0,
        linecolor="white", cbar=cbar, cbar_kws={"label": "weight", "shrink": 0.8},
        xticklabels=list(x_tokens) if x_tokens is not None else "auto",
        yticklabels=list(y_tokens) if y_tokens is not None else "auto",
    )
    if hidden is not None:
        for i, j in zip(*np.nonzero(hidden), strict=True):
            ax.add_patch(Rectangle((j, i), 1, 1, fill=False, hatch="///", edgecolor="#999999",
                                   linewidth=0))
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=90 if S > ANNOTATE_UP_TO else 0)
    ax.tick_params(axis="y", labelrotation=0)
    return ax


def heads(
    weights: torch.Tensor | np.ndarray,
    x_tokens: Sequence[str] | None = None,
    y_tokens: Sequence[str] | None = None,
    mask: torch.Tensor | np.ndarray | None = None,
    batch: int = 0,
    ncols: int = 4,
    title: str = "",
) -> Figure:
    """Draw every head of ``(H, L, S)`` or ``(B, H, L, S)`` weights side by side, one colour scale,
    in a grid ``ncols`` wide that fits the page (``PAGE_WIDTH``); token labels are drawn while
    they fit a panel at a legible size, and left off otherwise."""
    w = _to_numpy(weights)
    if w.ndim == 4:
        w = w[batch]
    if w.ndim != 3:
        raise ValueError(f"weights must be (H, L, S) or (B, H, L, S), got shape {w.shape}")
    H, L, S = w.shape
    ncols = min(ncols, H)
    nrows = math.ceil(H / ncols)
    import matplotlib.pyplot as plt

    panel = (PAGE_WIDTH - 0.9) / ncols  # inches per panel, after the colorbar and labels
    label_pt = min(9.0, 0.8 * 72 * panel / max(L, S))  # one token per label's height
    labels = label_pt >= 7  # 7 pt at 100 dpi is 9.7 px on the page
    def label_inches(tokens: Sequence[str] | None, n: int) -> float:  # the longest label, at label_pt
        longest = max((len(str(t)) for t in tokens), default=2) if tokens is not None else len(str(n))
        return 0.6 * longest * label_pt / 72 if labels else 0.0

    under = label_inches(x_tokens, S)  # the keys, written upwards under each panel
    beside = label_inches(y_tokens if y_tokens is not None else x_tokens, L)  # the queries
    side = panel - beside - 0.15  # a panel's heatmap
    row = side * L / S + under + 0.45  # heatmap, key labels, title and axis label
    fig, axes = plt.subplots(nrows, ncols, figsize=(PAGE_WIDTH, 0.5 + nrows * row),
                             squeeze=False, layout="constrained")
    for h, ax in enumerate(axes.flat):
        if h >= H:
            ax.axis("off")
            continue
        heatmap(w[h], x_tokens, y_tokens, mask=mask, ax=ax, annot=False, cbar=False,
                title=f"head {h}")
        ax.tick_params(labelsize=label_pt)
        ax.tick_params(axis="x", labelrotation=90)
        if not labels:
            ax.set_xticks([])
            ax.set_yticks([])
        ax.title.set_fontsize(9)
        ax.set_xlabel("key" if h >= H - ncols else "", fontsize=9)
        ax.set_ylabel("query" if h % ncols == 0 else "", fontsize=9)
    fig.colorbar(axes.flat[0].collections[0], ax=axes, shrink=0.6, label="weight")
    if title:
        fig.suptitle(title)
    return fig


@dataclass
class View:
    """What an explorer shows for one state of its controls."""

    weights: torch.Tensor | np.ndarray  # (L, S)
    x_tokens: Sequence[str]
    y_tokens: Sequence[str] | None = None
    mask: torch.Tensor | np.ndarray | None = None
    title: str = ""
    caption: str = ""  # one line under the heatmap, e.g. "row entropy 1.23 nats"


class InputError(ValueError):
    """Raised by an explorer's ``compute`` for input a reader can fix; shown as a short message."""


def png_256(fig: Figure, dpi: int) -> bytes:
    """The figure as PNG, opaque white behind, in 256 colours (a colormap has 256 anyway, a
    diagram few): about three times smaller, for pictures stored in the page (every state of a
    static explorer, every diagram)."""
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    image = Image.open(buf).convert("RGB").quantize(256, dither=Image.Dither.NONE)
    out = io.BytesIO()
    image.save(out, format="png", optimize=True)
    return out.getvalue()


def render_png(view: View | Figure, dpi: int = EXPLORER_DPI) -> bytes:
    """Draw a :class:`View` (or save a ``matplotlib.figure.Figure``, made without pyplot) into
    PNG bytes; nothing leaks into the notebook."""
    if isinstance(view, Figure):
        return png_256(view, dpi)
    L, S = _pick(_to_numpy(view.weights), 0, 0).shape
    width = min(1.6 + 0.6 * S, EXPLORER_WIDTH)  # at most the page's column at EXPLORER_DPI
    fig = Figure(figsize=(width, 1.0 + (width - 1.6) / S * 0.9 * L))
    ax = fig.add_subplot()
    heatmap(view.weights, view.x_tokens, view.y_tokens, mask=view.mask, title=view.title, ax=ax)
    fig.tight_layout()
    return png_256(fig, dpi)


def explorer(
    compute: Callable[..., View | Figure],
    controls: Mapping[str, Sequence],
    sentences: Sequence[str] | None = None,
    max_tokens: int = 16,
    static: bool | None = None,
) -> ipywidgets.VBox:
    """An interactive heatmap: controls whose every change redraws ``compute(**state)``.

    Args:
        compute: called with one keyword argument per control (and ``sentence`` if
            ``sentences`` is given); returns a :class:`View` (drawn as a heatmap) or a
            ``matplotlib.figure.Figure`` (any other plot; make it with ``Figure()``, not pyplot),
            or raises :class:`InputError` for input the reader should change, shown as a short
            message. Any other exception is a bug, not the reader's input, and is raised: in the
            static book it fails the build; in a live kernel the view also says that it failed.
        controls: name -> the values it can take, in order. Numbers get a slider, anything else
            a dropdown.
        sentences: if given, the view takes a sentence: a text box in a live kernel (first
            sentence filled in), a dropdown over these sentences in the static book.
        max_tokens: longer typed sentences get a message instead of a heatmap.
        static: precompute every state and switch in the browser (no kernel needed), or
            recompute live. Default: static when the environment variable ``SELFATTN_STATIC=1``
            (set by ``make book``), live otherwise. Live mode works on ipywidgets 7 and 8 (Colab
            renders only 7); static mode needs ipywidgets 8 (``Stack``).

    Limits of the static mode: at most ``MAX_STATES`` (48) states, the product of the number of
    values of every control (and of the sentences), and at most ``MAX_PAGE_BYTES`` (3 MB) of PNG
    in the page; beyond either, a ``ValueError`` asks for fewer values.
    """
    import ipywidgets as widgets

    if static is None:
        static = os.environ.get(STATIC_ENV) == "1"
    if sentences is not None:
        sentences = list(sentences)
        if not sentences:
            raise ValueError("sentences must hold at least one sentence")

    def show(**state: object) -> View | Figure | str:
        """``compute(**state)``, or the message for input the reader should change."""
        sentence = state.get("sentence")
        if isinstance(sentence, str):
            n = len(sentence.split())
            if n == 0:
                return "Type a sentence first."
            if n > max_tokens:
                return f"That sentence has {n} tokens; this view takes at most {max_tokens}."
        try:
            return compute(**state)
        except InputError as exc:  # only the reader's input: a library error is a bug
            return str(exc)

    build = _static_explorer if static else _live_explorer
    box = build(widgets, show, dict(controls), sentences)
    # what it was made from, so that make test's harness can build the same explorer live
    box.selfattn_explorer = {"compute": compute, "controls": controls, "sentences": sentences,
                             "max_tokens": max_tokens}
    return box


def _static_explorer(widgets: ModuleType, show: Callable[..., View | Figure | str],
                     controls: dict[str, Sequence], sentences: list[str] | None
                     ) -> ipywidgets.VBox:
    """Every state drawn now, in nested ``Stack`` widgets that the controls switch in the
    browser."""
    if not hasattr(widgets, "Stack"):  # Colab's ipywidgets 7.7.1, say
        raise RuntimeError(
            "static explorers need ipywidgets>=8 (for Stack), and this kernel has ipywidgets "
            f"{widgets.__version__}; unset {STATIC_ENV} to recompute the view live instead")
    names = list(controls)
    options = [list(controls[n]) for n in names]
    if sentences is not None:
        names.append("sentence")
        options.append(sentences)
    n_states = math.prod(len(o) for o in options)
    if n_states > MAX_STATES:
        raise ValueError(f"a static explorer precomputes every state: {n_states} states "
                         f"exceed MAX_STATES={MAX_STATES}; offer fewer values")
    pngs: dict[tuple, tuple[bytes, str] | str] = {}
    for combo in itertools.product(*options):
        view = show(**dict(zip(names, combo, strict=True)))
        pngs[combo] = view if isinstance(view, str) else (render_png(view), _caption_html(view))
    size = sum(len(p[0]) for p in pngs.values() if not isinstance(p, str))
    if size > MAX_PAGE_BYTES:
        raise ValueError(f"the precomputed heatmaps take {size / 1e6:.1f} MB, over "
                         f"MAX_PAGE_BYTES={MAX_PAGE_BYTES / 1e6:.0f} MB; offer fewer values")
    inputs = [_control(widgets, n, o) for n, o in zip(names, options, strict=True)]

    def build(level: int, prefix: tuple) -> ipywidgets.Widget:
        if level == len(names):
            return _panel(widgets, pngs[prefix])
        stack = widgets.Stack([build(level + 1, (*prefix, o)) for o in options[level]],
                              selected_index=0)
        # one-way browser-side link: the control's index picks the stack's child
        widgets.jsdlink((inputs[level], "index"), (stack, "selected_index"))
        return stack

    return _box(widgets, [*inputs, build(0, ())])


def _live_explorer(widgets: ModuleType, show: Callable[..., View | Figure | str],
                   controls: dict[str, Sequence], sentences: list[str] | None
                   ) -> ipywidgets.VBox:
    """Controls (and a text box for a sentence) whose every change recomputes the view."""
    names = list(controls)
    inputs = [_control(widgets, n, list(controls[n])) for n in names]
    if sentences is not None:
        text = widgets.Text(value=sentences[0], description="sentence", continuous_update=False,
                            style={"description_width": "7em"}, layout=widgets.Layout(width="32em"))
        inputs.append(text)
        names.append("sentence")
    message = widgets.HTML(layout=widgets.Layout(min_height="1.5em"))
    image = widgets.Image(format="png")
    caption = widgets.HTML()

    def hide(text: str) -> None:  # a message in place of the picture
        message.value = _message_html(text)
        image.layout.display = caption.layout.display = "none"

    def redraw(_change: object = None) -> None:
        try:
            view = show(**{n: w.value for n, w in zip(names, inputs, strict=True)})
        except Exception as exc:
            # a bug, not the reader's input: raise it, and say so in the view too, since a widget
            # callback's traceback goes to the kernel's log, not to the notebook
            hide(f"this view failed: {type(exc).__name__}: {exc}")
            raise
        if isinstance(view, str):
            hide(view)
            return
        message.value = ""
        image.layout.display = caption.layout.display = None
        image.value = render_png(view)
        caption.value = _caption_html(view)

    for w in inputs:
        w.observe(redraw, names="value")
    redraw()
    return _box(widgets, [*inputs, message, image, caption])


def _box(widgets: ModuleType, children: list) -> ipywidgets.VBox:
    """The explorer's outer box, marked with the CSS class ``selfattn-explorer`` (tests find it)."""
    box = widgets.VBox(children, layout=widgets.Layout(align_items="flex-start"))
    box.add_class("selfattn-explorer")
    return box


def _caption(view: View | Figure) -> str:
    return "" if isinstance(view, Figure) else view.caption


def _caption_html(view: View | Figure) -> str:
    """The line under an explorer's picture, carrying the picture's alt text in an empty span's
    ``data-selfattn-alt``: ipywidgets' Image has no alt, and its tooltip breaks the view of an
    Image in ipywidgets 8's JavaScript (it reads the ``description`` an Image lacks). The book's
    page moves it onto the image (assets/widgets-config.js)."""
    return (f'<span data-selfattn-alt="{html.escape(alt_text(view))}"></span>'
            f"{html.escape(_caption(view))}")


def alt_text(view: View | Figure) -> str:
    """What an explorer's picture shows, for a screen reader: a heatmap's title and tokens, or a
    figure's titles."""
    if isinstance(view, Figure):
        titles = [view.get_suptitle()] + [ax.get_title() for ax in view.axes]
        titles = [" ".join(t.split()) for t in titles if t.strip()]
        return "Figure: " + "; ".join(titles) if titles else "Figure"
    shown = f"Heatmap of attention weights: {' '.join(view.title.split())}" if view.title.strip() \
        else "Heatmap of attention weights"
    hatched = "; masked cells hatched" if view.mask is not None else ""
    return (f"{shown}; queries down the side, keys along the bottom: "
            f"{' '.join(map(str, view.x_tokens))}{hatched}")


def _control(widgets: ModuleType, name: str, options: list) -> ipywidgets.ValueWidget:
    if not options:
        raise ValueError(f"control {name!r} has no values")
    style = {"description_width": "7em"}
    if all(isinstance(o, (int, float)) and not isinstance(o, bool) for o in options):
        return widgets.SelectionSlider(options=[(f"{o:g}", o) for o in options], value=options[0],
                                       description=name, style=style)
    pairs = [(str(o), o) for o in options]
    return widgets.Dropdown(options=pairs, description=name, style=style,
                            layout=widgets.Layout(width="32em" if name == "sentence" else "18em"))


def _panel(widgets: ModuleType, content: tuple[bytes, str] | str) -> ipywidgets.Widget:
    if isinstance(content, str):
        return widgets.HTML(_message_html(content))
    png, caption = content
    # flex-start: a caption wider than its picture must not stretch the picture to its width
    return widgets.VBox([widgets.Image(value=png, format="png"), widgets.HTML(caption)],
                        layout=widgets.Layout(align_items="flex-start"))


def _message_html(text: str) -> str:
    return f'<span style="color:#a94442">&#9888; {html.escape(text)}</span>'


def _pick(w: np.ndarray, batch: int, head: int) -> np.ndarray:
    if w.ndim == 4:
        w = w[batch]
    if w.ndim == 3:
        w = w[head]
    if w.ndim != 2:
        raise ValueError(f"weights must be (L, S), (H, L, S) or (B, H, L, S), got shape {w.shape}")
    return w


def _to_numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return x.numpy() if x.dtype == torch.bool else x.float().numpy()
    return np.asarray(x)
