"""Heatmaps and the explorer, without a browser (tests/test_browser.py has the browser)."""

import html
import re

import ipywidgets as widgets
import matplotlib
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

import selfattn
from selfattn.book.kit import train, viz

widget_registry = widgets.widgets.widget._instances  # every live widget, by model id

matplotlib.use("Agg")


def teardown_function():
    import matplotlib.pyplot as plt

    plt.close("all")


@pytest.mark.parametrize("shape", [(4, 5), (3, 4, 5), (2, 3, 4, 5)])
def test_heatmap_takes_every_layout_and_picks_the_index(shape):
    w = torch.rand(shape)
    ax = viz.heatmap(w, list("abcde"), list("pqrs"), head=1 if len(shape) > 2 else 0,
                     batch=1 if len(shape) > 3 else 0)
    drawn = ax.collections[0].get_array().reshape(4, 5)
    expected = w[(1,) * (len(shape) - 2)] if len(shape) > 2 else w
    np.testing.assert_allclose(drawn, expected.numpy(), rtol=1e-6)
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abcde")
    assert [t.get_text() for t in ax.get_yticklabels()] == list("pqrs")


def test_heatmap_annotates_short_sequences_only():
    short = viz.heatmap(torch.rand(3, 3), list("abc"))
    assert len(short.texts) == 9
    long_ = viz.heatmap(torch.rand(20, 20), [str(i) for i in range(20)])
    assert len(long_.texts) == 0


def test_heatmap_hatches_masked_cells():
    keep = selfattn.causal_mask(4)
    _, w = selfattn.scaled_dot_product_attention(*(torch.randn(4, 8) for _ in range(3)),
                                                 attn_mask=keep)
    ax = viz.heatmap(w, list("abcd"), mask=keep)
    assert len([p for p in ax.patches if p.get_hatch()]) == int((~keep).sum())
    assert len(ax.texts) == int(keep.sum())  # masked cells carry no number


def test_heatmap_bad_input():
    with pytest.raises(ValueError, match="x_tokens has 2 labels for 3"):
        viz.heatmap(torch.rand(3, 3), ["a", "b"])
    with pytest.raises(ValueError, match=r"\(2, 2, 2, 2, 2\)"):
        viz.heatmap(torch.rand(2, 2, 2, 2, 2))
    with pytest.raises(TypeError, match="bool"):
        viz.heatmap(torch.rand(3, 3), mask=torch.ones(3, 3))


def test_heads_draws_one_panel_per_head():
    fig = viz.heads(torch.rand(2, 6, 4, 4), list("abcd"), batch=1, ncols=4)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == [f"head {h}" for h in range(6)]


def toy_view(scale, mask, sentence="a b c"):
    words = sentence.split()
    if "zz" in words:
        raise viz.InputError("unknown word 'zz'")
    g = torch.Generator().manual_seed(len(words))
    x = torch.randn(len(words), 4, generator=g)
    m = selfattn.causal_mask(len(words)) if mask == "causal" else None
    _, w = selfattn.scaled_dot_product_attention(x, x, x, attn_mask=m, scale=scale)
    return viz.View(w, words, mask=m, title=f"scale {scale}", caption=f"max {w.max():.3f}")


def leaves(widget):
    """The panels at the bottom of a static explorer's nested stacks."""
    if isinstance(widget, widgets.Stack):
        return [leaf for child in widget.children for leaf in leaves(child)]
    return [widget]


def shown_text(caption_html):
    return html.unescape(re.sub(r"<[^>]*>", "", caption_html))


def alt_of(caption_html):
    """The alt text a caption carries for its picture (kit.viz._caption_html)."""
    found = re.search(r'data-selfattn-alt="([^"]*)"', caption_html)
    return html.unescape(found.group(1)) if found else None


def test_static_explorer_precomputes_every_state_and_links_controls_in_the_browser():
    before = set(widget_registry)
    e = viz.explorer(toy_view, {"scale": [0.0, 1.0, 2.0], "mask": ["none", "causal"]},
                     sentences=["a b c", "d e f g"], static=True)
    *controls, body = e.children
    assert [c.description for c in controls] == ["scale", "mask", "sentence"]
    panels = leaves(body)
    assert len(panels) == 3 * 2 * 2
    pngs = {p.children[0].value for p in panels}
    assert len(pngs) == 12  # every state drew a different picture
    links = [w for k, w in widget_registry.items()
             if k not in before and isinstance(w, widgets.widget_link.DirectionalLink)]
    assert {link.source[0] for link in links} == set(controls)
    assert all(link.source[1] == "index" and link.target[1] == "selected_index" for link in links)
    assert len(links) == 1 + 3 + 3 * 2  # one link per stack in the tree
    # each picture says what it shows (the page's alt text: assets/widgets-config.js)
    alts = {alt_of(p.children[1].value) for p in panels}
    assert len(alts) == 12 and all(a.startswith("Heatmap of attention weights: scale ") for a in alts)
    assert "keys along the bottom: d e f g" in alt_of(panels[-1].children[1].value)


def test_static_explorer_refuses_too_many_states():
    with pytest.raises(ValueError, match="MAX_STATES"):
        viz.explorer(toy_view, {"scale": list(range(10)), "mask": ["none", "causal"]},
                     sentences=["a", "b", "c"], static=True)


def test_static_explorer_shows_a_message_for_a_bad_prepared_sentence():
    e = viz.explorer(toy_view, {"scale": [1.0], "mask": ["none"]},
                     sentences=["a b", "zz top"], static=True)
    bad = leaves(e.children[-1])[1]
    assert isinstance(bad, widgets.HTML) and "unknown word" in bad.value


def chapter_bug(scale, mask):
    q = torch.randn(4, 8)
    k = torch.randn(4, 7) if scale == 2.0 else q  # a bug in the chapter: E differs at scale 2
    _, w = selfattn.scaled_dot_product_attention(q, k, k)
    return viz.View(w, list("abcd"))


def test_static_explorer_raises_a_library_error_instead_of_showing_it():
    with pytest.raises(ValueError, match="same last dimension E") as info:
        viz.explorer(chapter_bug, {"scale": [1.0, 2.0], "mask": ["none"]}, static=True)
    assert not isinstance(info.value, viz.InputError)  # the build fails: a bug, not the reader


def test_live_explorer_raises_a_library_error_and_says_so():
    with pytest.raises(ValueError, match="same last dimension E"):  # the first picture
        viz.explorer(chapter_bug, {"scale": [2.0, 1.0], "mask": ["none"]}, static=False)
    e = viz.explorer(chapter_bug, {"scale": [1.0, 2.0], "mask": ["none"]}, static=False)
    scale, _mask, msg, image, _caption = e.children
    with pytest.raises(ValueError, match="same last dimension E"):  # a later one
        scale.value = 2.0
    assert "this view failed: ValueError" in msg.value and image.layout.display == "none"


@pytest.mark.parametrize(("text", "message"), [
    ("", "Type a sentence"),
    ("a zz c", "unknown word"),
    (" ".join("x" * 20), "at most 16"),
])
def test_live_explorer_answers_bad_input_with_a_message(text, message):
    e = viz.explorer(toy_view, {"scale": [1.0, 2.0], "mask": ["none", "causal"]},
                     sentences=["a b c"], static=False)
    *_, sentence, msg, image, _caption = e.children
    first = image.value
    assert first and msg.value == ""
    sentence.value = text  # must not raise
    assert message in msg.value and "Traceback" not in msg.value
    assert image.layout.display == "none"
    sentence.value = "a b c d"
    assert msg.value == "" and image.value != first and image.layout.display is None


def test_live_explorer_redraws_on_every_control():
    e = viz.explorer(toy_view, {"scale": [1.0, 2.0], "mask": ["none", "causal"]}, static=False)
    scale, mask, _msg, image, caption = e.children
    seen = {image.value}
    scale.value = 2.0
    seen.add(image.value)
    mask.value = "causal"
    seen.add(image.value)
    assert len(seen) == 3 and shown_text(caption.value).startswith("max")


def test_explorer_mode_follows_the_environment(monkeypatch):
    monkeypatch.setenv(viz.STATIC_ENV, "1")
    e = viz.explorer(toy_view, {"scale": [1.0], "mask": ["none"]})
    assert isinstance(e.children[-1], widgets.Stack)
    monkeypatch.delenv(viz.STATIC_ENV)
    e = viz.explorer(toy_view, {"scale": [1.0], "mask": ["none"]})
    assert isinstance(e.children[-2], widgets.Image)


def curve(slope):
    fig = Figure(figsize=(3, 2))
    fig.add_subplot().plot([0, 1], [0, slope])
    fig.suptitle(f"slope {slope}")
    return fig


@pytest.mark.parametrize("static", [True, False])
def test_explorer_draws_any_figure_too(static):
    e = viz.explorer(curve, {"slope": [1, 2]}, static=static)
    if static:
        pngs = [p.children[0].value for p in leaves(e.children[-1])]
    else:
        slope, _msg, image, caption = e.children
        pngs = [image.value]
        slope.value = 2
        pngs.append(image.value)
        assert shown_text(caption.value) == ""
    assert len(pngs) == 2 and pngs[0] != pngs[1] and all(bytes(p[:4]) == b"\x89PNG" for p in pngs)
    captions = [p.children[1].value for p in leaves(e.children[-1])] if static else [caption.value]
    assert all(alt_of(c).startswith("Figure: slope") for c in captions), captions


def test_alt_text_names_a_figures_titles_or_a_heatmaps_title_and_tokens():
    view = viz.View(torch.eye(2), ["the", "cat"], title="temperature\n 2")
    assert viz.alt_text(view) == ("Heatmap of attention weights: temperature 2; queries down the "
                                  "side, keys along the bottom: the cat")
    fig = Figure()
    fig.suptitle("Two panels")
    fig.add_subplot(1, 2, 1).set_title("left")
    fig.add_subplot(1, 2, 2)
    assert viz.alt_text(fig) == "Figure: Two panels; left"


def test_seed_frame_has_a_row_per_seed_then_the_mean_and_range():
    frame = train.seed_frame({"a": [0.5, 0.25], "b": [0.1, 0.3]}, seeds=range(7, 9))
    assert list(frame.index) == ["seed 7", "seed 8", "mean", "range"]
    assert list(frame.columns) == ["a", "b"]
    assert frame.loc["mean", "a"] == "37.5%" and frame.loc["range", "b"] == "10.0%..30.0%"
    plain = train.seed_frame({"a": [0.5, 0.25]}, seeds=[0, 1], percent=False, digits=2)
    assert plain.loc["seed 1", "a"] == "0.25" and plain.loc["mean", "a"] == "0.38"
