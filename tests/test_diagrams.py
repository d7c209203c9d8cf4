"""The book's schematic diagrams: they fit the page, say what they show, and are drawn from the code."""

import base64
import io
import itertools
import math
import re

import numpy as np
import pytest
import torch
from matplotlib._pylab_helpers import Gcf
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch, Patch
from matplotlib.spines import Spine
from matplotlib.text import Annotation, Text
from PIL import Image

import selfattn
from selfattn.book import decoding, multi_head, performance, positional_encoding, single_head
from selfattn.book.kit import draw
from selfattn.book.kit.viz import PAGE_WIDTH
from selfattn.masks import causal_mask
from selfattn.positional import apply_rope


def chapter_6_demo(n_kv_heads: int) -> selfattn.MultiHeadAttention:
    """Chapter 6's demo layer: 2 queries attend to 4 keys of another width."""
    return selfattn.MultiHeadAttention(128, 8, n_kv_heads=n_kv_heads, head_dim=16, kdim=128, vdim=64,
                                       out_dim=8)


# (what to call, a word the alt text must hold); the variants stress the layout at its limits
CASES = {
    "one_output": (lambda: single_head.one_output(), "b^1"),
    "one_output, 1 token": (lambda: single_head.one_output(["attention"]), "b^1"),
    "one_output, 4 tokens": (lambda: single_head.one_output("the cat sat down".split()), "b^1"),
    "matrix_form": (lambda: single_head.matrix_form(), "matrix form"),
    "matrix_form, small": (lambda: single_head.matrix_form(1, 1, 1, 1), "matrix form"),
    "matrix_form, large": (lambda: single_head.matrix_form(9999, 9999, 9999, 9999), "matrix form"),
    "multi_head": (lambda: multi_head.split_attend_merge(selfattn.MultiHeadAttention(32, 4)), "split_heads"),
    "multi_head, chapter 6": (lambda: multi_head.split_attend_merge(selfattn.MultiHeadAttention(
        128, 8, head_dim=16, kdim=128, vdim=64, out_dim=8), 10, 4), "merge_heads"),
    "multi_head, GQA and RoPE": (lambda: multi_head.split_attend_merge(selfattn.AttentionConfig.build(
        d_model=64, n_heads=16, n_kv_heads=4, rope=True), 32, 128), "out_proj"),
    "kv_heads": (lambda: multi_head.kv_heads(), "KV cache"),
    "kv_heads, 32 heads": (lambda: multi_head.kv_heads(32, (32, 8, 4, 1), 128), "KV cache"),
    "kv_heads, 1 head": (lambda: multi_head.kv_heads(1, head_dim=8), "KV cache"),
    "rope_rotation": (lambda: positional_encoding.rope_rotation(), "RoPE"),
    "rope_rotation, slow": (lambda: positional_encoding.rope_rotation(8, 0.1, (0.3, -2.0)), "RoPE"),
    "rope_rotation, fast": (lambda: positional_encoding.rope_rotation(3, math.pi / 2), "RoPE"),
    "online_softmax_tiles": (lambda: performance.online_softmax_tiles(), "never stored"),
    "online_softmax_tiles, long": (lambda: performance.online_softmax_tiles(4096, 4096, 256), "never stored"),
    "online_softmax_tiles, wide": (lambda: performance.online_softmax_tiles(3, 40, 3, query_block=0),
                                   "never stored"),
    "online_softmax_tiles, tall": (lambda: performance.online_softmax_tiles(64, 5, 4, causal=False),
                                   "never stored"),
    "multi_head, chapter 6's demo, MHA": (lambda: multi_head.split_attend_merge(
        chapter_6_demo(8), B=10, T=2, S=4), "merge_heads"),
    "multi_head, chapter 6's demo, GQA": (lambda: multi_head.split_attend_merge(
        chapter_6_demo(2), B=10, T=2, S=4), "merge_heads"),
    "grouped_rows": (lambda: multi_head.grouped_rows(), "key/value head"),
    "grouped_rows, MQA of 16": (lambda: multi_head.grouped_rows(16, 1), "key/value head"),
    "grouped_rows, pairs": (lambda: multi_head.grouped_rows(16, 8), "key/value head"),
    "latent_attention": (lambda: decoding.latent_attention(), "latent"),
    "latent_attention, DeepSeek-V2's head": (lambda: decoding.latent_attention(8, 128, 512, 64, 5120),
                                              "latent"),
    "latent_attention, no RoPE, one head": (lambda: decoding.latent_attention(1, 1, 1, 0), "latent"),
    "latent_attention, large": (lambda: decoding.latent_attention(8, 9999, 9999, 9998, 99999), "latent"),
    "paged_block_table": (lambda: decoding.paged_block_table(), "block table"),
    "paged_block_table, one request of one token": (lambda: decoding.paged_block_table((1,), 1),
                                                   "block table"),
    "paged_block_table, four requests": (lambda: decoding.paged_block_table((3, 9, 2, 5), 3), "block table"),
    "paged_block_table, full pool of 12": (lambda: decoding.paged_block_table((40, 30, 20), 8, 12),
                                           "block table"),
    "paged_block_table, two-digit tables": (lambda: decoding.paged_block_table((12, 11), 2, 12),
                                            "block table"),
    "rolling_sink_buffer": (lambda: decoding.rolling_sink_buffer(), "overwriting"),
    "rolling_sink_buffer, long": (lambda: decoding.rolling_sink_buffer(1, 3, 32), "overwriting"),
    "rolling_sink_buffer, 16 slots, no evictions": (lambda: decoding.rolling_sink_buffer(8, 8, 16, False),
                                                    "overwriting"),
    "rolling_sink_buffer, one slot": (lambda: decoding.rolling_sink_buffer(0, 1, 1), "overwriting"),
}


def texts(diagram: draw.Diagram) -> list[Text]:
    return [t for t in diagram.figure.findobj(Text) if t.get_visible() and t.get_text().strip()]


def strings(diagram: draw.Diagram) -> str:
    return "\n".join(t.get_text() for t in texts(diagram))


def drawn_extents(diagram: draw.Diagram):
    """Each visible text's box on the PNG, in pixels."""
    fig = diagram.figure
    canvas = FigureCanvasAgg(fig)
    fig.set_dpi(draw.DPI)
    renderer = canvas.get_renderer()
    fig.draw(renderer)
    return [(t.get_text(), t.get_window_extent(renderer)) for t in texts(diagram)]


@pytest.fixture(params=list(CASES), scope="module")
def case(request):
    make, word = CASES[request.param]
    return make(), word


def test_returns_a_diagram_that_fits_the_page(case):
    diagram, _ = case
    assert isinstance(diagram, draw.Diagram)
    assert isinstance(diagram.figure, Figure)
    width, height = diagram.figure.get_size_inches()
    assert width <= PAGE_WIDTH + 1e-9
    assert height <= 6
    sizes = [t.get_fontsize() for t in texts(diagram)]
    assert sizes, "a diagram without labels"
    assert min(sizes) >= 7, f"text of {min(sizes)} pt is under 9.7 px on the page"
    math = [t.get_fontsize() for t in texts(diagram) if "$" in t.get_text()]
    assert min(math, default=10) >= 10, "mathtext draws scripts at 70%: 10 pt keeps them at 7 pt"


def test_nothing_is_cut_off_and_no_text_is_drawn_over_another(case):
    diagram, _ = case
    boxes = drawn_extents(diagram)
    fig = diagram.figure
    width, height = (s * draw.DPI for s in fig.get_size_inches())
    backgrounds = {fig.patch, *(ax.patch for ax in fig.axes)}
    shapes = [(repr(p), p.get_window_extent()) for p in fig.findobj(Patch)  # boxes, arrows, circles
              if p not in backgrounds and not isinstance(p, Spine)]  # (the axes are off)
    arrows = [(repr(a), a.arrow_patch.get_window_extent()) for a in fig.findobj(Annotation)]
    assert len(shapes) + len(arrows) >= 3
    for what, box in boxes + shapes + arrows:
        assert box.x0 >= -1 and box.y0 >= -1 and box.x1 <= width + 1 and box.y1 <= height + 1, \
            f"{what!r} at {box} leaves the {width:.0f} x {height:.0f} px figure"
    for i, (text_a, a) in enumerate(boxes):
        for text_b, b in boxes[i + 1:]:
            overlap_x = min(a.x1, b.x1) - max(a.x0, b.x0)
            overlap_y = min(a.y1, b.y1) - max(a.y0, b.y0)
            assert min(overlap_x, overlap_y) <= 1, f"{text_a!r} and {text_b!r} overlap"


def test_shows_as_a_png_with_its_alt_text(case):
    diagram, word = case
    assert word in diagram.alt and len(diagram.alt) > 40
    html = diagram._repr_html_()
    assert html.startswith('<img class="selfattn-diagram" ')
    alt = re.search(r'alt="([^"]*)"', html).group(1)
    assert alt == diagram.alt.replace("&", "&amp;").replace("'", "&#x27;")
    data = base64.b64decode(re.search(r'src="data:image/png;base64,([^"]+)"', html).group(1))
    assert data == diagram.png() and not hasattr(diagram, "_repr_png_")
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    assert int(re.search(r'width="(\d+)"', html).group(1)) == image.width
    assert image.width == round(diagram.figure.get_size_inches()[0] * 100) <= 680
    assert len(data) < 60_000, f"{len(data)} bytes: keep diagrams small"
    rgb = np.asarray(image.convert("RGBA"))
    assert (rgb[..., 3] == 255).all(), "the background must be opaque"
    assert (rgb[0, 0, :3] == 255).all(), "the background must be white"


def test_html_gives_the_png_width_and_escapes_the_alt_text():
    fig = Figure(figsize=(2.5, 1))
    fig.text(0.1, 0.5, "x", fontsize=9)
    d = draw.Diagram(fig, 'the "q" & <k> heads')
    html = d._repr_html_()
    assert 'width="250"' in html
    assert 'alt="the &quot;q&quot; &amp; &lt;k&gt; heads"' in html
    assert Image.open(io.BytesIO(d.png())).size == (250, 100)


@pytest.mark.slow
def test_diagrams_leave_pyplot_alone():
    before = Gcf.get_num_fig_managers()
    for make, _ in CASES.values():
        make()
    assert Gcf.get_num_fig_managers() == before


def test_png_is_the_same_on_every_run():
    assert multi_head.kv_heads(4).png() == multi_head.kv_heads(4).png()


def test_one_output_labels_the_given_tokens():
    d = single_head.one_output(["we", "like", "tea"])
    s = strings(d)
    assert [t.get_text() for t in texts(d) if t.get_text() in {"we", "like", "tea"}] == ["we", "like", "tea"]
    for i in (1, 2, 3):
        assert f"$a^{{{i}}}$" in s and f"$k^{{{i}}}$" in s and f"$v^{{{i}}}$" in s
        assert rf"$\alpha'_{{1,{i}}}$" in s
    assert "$a^{4}$" not in s
    assert "we like tea" in d.alt


def test_matrix_form_writes_the_shapes_it_was_given():
    s = strings(single_head.matrix_form(5, 12, 3, 7))
    for shape in ["(5, 12)", "(5, 3)", "(5, 7)", "(5, 5)", "(12, 3)", "(12, 7)"]:
        assert shape in s, shape
    assert "(6, 16)" not in s


def numbers_in(diagram) -> set[str]:
    return set(re.findall(r"\(\d+(?:, \d+)+\)", strings(diagram)))


def test_multi_head_takes_its_shapes_from_the_layer():
    small = multi_head.split_attend_merge(selfattn.MultiHeadAttention(32, 4), B=2, T=5)
    s = strings(small)
    for name in ["q_proj", "k_proj", "v_proj", "split_heads", "merge_heads", "out_proj"]:
        assert name in s
    assert {"(2, 5, 32)", "(2, 4, 5, 8)"} <= numbers_in(small)
    other = multi_head.split_attend_merge(selfattn.MultiHeadAttention(48, 6, out_dim=10).config, B=3, T=7)
    assert {"(3, 7, 48)", "(3, 6, 7, 8)", "(3, 7, 10)"} <= numbers_in(other)
    assert not numbers_in(small) & numbers_in(other)
    assert "apply_rope" not in s
    with_rope = selfattn.AttentionConfig.build(d_model=32, n_heads=4, rope=True)
    assert "apply_rope" in strings(multi_head.split_attend_merge(with_rope))


def test_multi_head_gives_each_query_head_its_key_value_head():
    config = selfattn.AttentionConfig.build(d_model=64, n_heads=8, n_kv_heads=2)
    q, k, v = multi_head.HeadsLayout(config, B=2, T=5, S=5).lanes
    assert (q.projection, k.projection, v.projection) == ("q_proj\n(2, 5, 64)", "k_proj\n(2, 5, 16)",
                                                          "v_proj\n(2, 5, 16)")
    assert (q.split, k.split, v.split) == ("(2, 8, 5, 8)", "(2, 2, 5, 8)", "(2, 2, 5, 8)")
    assert q.heads == [f"q{i}" for i in range(8)]
    assert k.heads == [f"k{i // 4}" for i in range(8)] and v.heads == [f"v{i // 4}" for i in range(8)]
    d = multi_head.split_attend_merge(config)

    def row(letter):  # the labels of one letter's boxes, left to right
        found = [t for t in texts(d) if re.fullmatch(letter + r"\d+", t.get_text())]
        return [t.get_text() for t in sorted(found, key=lambda t: t.get_position()[0])]

    assert (row("q"), row("k"), row("v")) == (q.heads, k.heads, v.heads)


def boxes(diagram, prefix):
    return {p.get_gid(): p for p in diagram.figure.findobj(FancyBboxPatch)
            if p.get_gid() and p.get_gid().startswith(prefix)}


@pytest.mark.parametrize("n_heads, counts", [(8, None), (6, (6, 3, 2, 1)), (4, (2,))])
def test_kv_heads_connects_each_query_head_to_its_key_value_head(n_heads, counts):
    d = multi_head.kv_heads(n_heads, counts, head_dim=16)
    counts = counts or (8, 2, 1)
    lines = [ln for ln in d.figure.findobj(Line2D) if (ln.get_gid() or "").startswith("link")]
    assert len(lines) == n_heads * len(counts)
    for p, n_kv in enumerate(counts):
        q, kv = boxes(d, f"q{p}-"), boxes(d, f"kv{p}-")
        assert len(q) == n_heads and len(kv) == n_kv
        links = [ln for ln in lines if ln.get_gid().startswith(f"link{p}-")]
        assert len(links) == n_heads

        def under(x, patches):  # the index of the box whose span holds x
            hits = [int(g.split("-")[1]) for g, b in patches.items()
                    if b.get_x() <= x <= b.get_x() + b.get_width()]
            assert len(hits) == 1
            return hits[0]

        for link in links:
            (x_q, _), (x_kv, _) = link.get_xydata()
            i = under(x_q, q)
            assert under(x_kv, kv) == i // (n_heads // n_kv)
        cache = 2 * n_kv * 16
        assert f"2 × {n_kv} × 16\n= {cache} numbers" in strings(d)
    assert "1/4 of MHA's" in strings(multi_head.kv_heads(8, (8, 2)))


@pytest.mark.parametrize("position, theta, x", [(3, 1.0, (1.0, 0.0)), (6, 0.5, (0.6, 0.8)),
                                                (2, 0.25, (-2.0, 1.5))])
def test_rope_rotation_draws_what_apply_rope_computes(position, theta, x):
    d = positional_encoding.rope_rotation(position, theta, x)
    (dots,) = [ln for ln in d.figure.findobj(Line2D) if ln.get_gid() == "rotated points"]
    drawn = dots.get_xydata()
    assert drawn.shape == (position + 1, 2)
    m = torch.arange(position + 1)
    pair = torch.tensor([[0.0, 0.0, *x]], dtype=torch.float64).expand(position + 1, 4)
    expected = apply_rope(pair, m, base=theta ** -2)[:, 2:]  # pair 1 turns by base^(-2/4) = theta
    np.testing.assert_allclose(drawn, expected.numpy(), atol=1e-12)
    angle = m.numpy() * theta + math.atan2(x[1], x[0])  # by hand: turned by m * theta, same length
    np.testing.assert_allclose(drawn, math.hypot(*x) * np.stack([np.cos(angle), np.sin(angle)], 1),
                               atol=1e-12)
    assert f"m={position}: ({drawn[-1, 0]:+.2f}, {drawn[-1, 1]:+.2f})" in strings(d)


@pytest.mark.parametrize("L, S, block, causal", [(16, 16, 4, True), (16, 16, 4, False), (10, 20, 4, True),
                                                 (1024, 1024, 128, True), (7, 5, 3, True)])
def test_online_softmax_tiles_skips_exactly_the_hidden_tiles(L, S, block, causal):
    layout = performance.tiles_layout(L, S, block, causal)
    nq, nk = math.ceil(L / block), math.ceil(S / block)
    assert [(t.a, t.b) for t in layout.tiles] == [(a, b) for a in range(nq) for b in range(nk)]
    keep = causal_mask(L, S) if causal else torch.ones(L, S, dtype=torch.bool)
    for t in layout.tiles:
        part = keep[t.a * block:(t.a + 1) * block, t.b * block:(t.b + 1) * block]
        assert t.visible == bool(part.any()) and t.partial == (t.visible and not part.all())
        assert list(t.first_hidden) == part.sum(1).tolist()  # causal: each row keeps a prefix
    assert layout.skipped == sum(not t.visible for t in layout.tiles)
    notes = "\n".join(text for text, _ in layout.notes)
    assert f"({L} × {S} = {L * S:,} scores)" in notes
    assert "m_new = max(m, rowmax(s))" in notes and "l = alpha · l + rowsum(exp(s − m_new))" in notes
    assert "acc = alpha · acc + exp(s − m_new) @ V_j" in notes and "at the end: acc / l" in notes
    assert ("tiles skipped" in notes) == causal
    # the drawing: one box per tile, named as skipped or not
    d = performance.online_softmax_tiles(L, S, block, causal)
    assert set(boxes(d, "tile")) == {f"tile{t.a}-{t.b}" + ("" if t.visible else " skipped")
                                     for t in layout.tiles}
    assert all(text in strings(d) for text, _ in layout.notes)


def test_one_output_writes_vectors_as_rows_like_the_code():
    # the chapter's code computes a @ W_q with W_q of shape (d_model, d_k): a row vector times
    # W, so W^q a^1 (column vectors) would not even be defined for those shapes
    s = strings(single_head.one_output())
    for label in ["$q^1 = a^1 W^q$", "$k^i = a^i W^k$", "$v^i = a^i W^v$"]:
        assert label in s, label
    assert "W^q a" not in s and "W^k a" not in s and "W^v a" not in s


@pytest.mark.parametrize(("n_heads", "n_kv"), [(8, 2), (16, 1), (4, 2), (6, 3)])
def test_grouped_rows_stacks_each_groups_query_rows_as_the_library_does(n_heads, n_kv):
    L = 1  # the library stacks the rows of one new token (decoding)
    d = multi_head.grouped_rows(n_heads, n_kv)
    g = n_heads // n_kv
    labels = {p.get_gid(): p for p in d.figure.findobj(Patch) if p.get_gid()}
    drawn = [gid for gid in labels if gid.startswith("row")]
    # group j holds the query heads j*g .. (j+1)*g - 1, every token of each: repeat_kv's order
    expected = [f"row{h // g}-{h * L + t}" for h in range(n_heads) for t in range(L)]
    assert sorted(drawn) == sorted(expected)
    assert sum(gid.startswith("k") for gid in labels) == n_kv
    assert f"(B, {n_kv}, {g * L}, hd)" in strings(d) and "a view, no copy" in strings(d)
    # the rows match what attention computes: query head h meets key/value head h // g
    q = torch.randn(1, n_heads, L, 4)
    k, v = torch.randn(1, n_kv, 5, 4), torch.randn(1, n_kv, 5, 4)
    out, _ = selfattn.fastpaths.attend_heads(q, k, v)
    for h in range(n_heads):
        j = h // g
        torch.testing.assert_close(out[:, h], torch.softmax(
            q[:, h] @ k[:, j].mT / 2, -1) @ v[:, j])


@pytest.mark.parametrize("n_kv_heads", [8, 2])
def test_multi_head_draws_the_query_and_key_lengths_apart(n_kv_heads):
    # chapter 6's demo: 2 queries attend to 4 keys; every shape on a key or value path has S
    layer = chapter_6_demo(n_kv_heads)
    d = multi_head.split_attend_merge(layer, B=10, T=2, S=4)
    kv = 16 * n_kv_heads
    assert {"(10, 2, 128)", "(10, 4, 128)", "(10, 4, 64)", f"(10, 4, {kv})",
            "(10, 8, 2, 16)", f"(10, {n_kv_heads}, 4, 16)", "(10, 2, 8)"} <= numbers_in(d)
    assert "(10, 8, 2, 4)" in d.alt and "S=4" in strings(d)
    assert "(10, 4, 8)" not in numbers_in(d)  # the output follows the queries, not the keys
    same = multi_head.split_attend_merge(layer, B=10, T=4)  # S defaults to T: self-attention
    assert numbers_in(same) == numbers_in(multi_head.split_attend_merge(layer, B=10, T=4, S=4))
    assert "S=" not in strings(same)


def test_one_output_values_cross_the_softmax_band_through_a_gap():
    """Each value line v^i passes over the softmax band through a white gap, so it does not
    read as going through the softmax."""
    d = single_head.one_output(["we", "like", "tea"])
    ax = d.figure.axes[0]
    band = next(p for p in ax.patches if p.get_gid() == "softmax band")
    gaps = [ln for ln in ax.get_lines() if ln.get_gid() == "gap"]
    assert len(gaps) == 3
    x0, y0 = band.get_x(), band.get_y()
    x1, y1 = x0 + band.get_width(), y0 + band.get_height()
    for gap in gaps:
        xs, ys = gap.get_xdata(), gap.get_ydata()
        assert gap.get_color() == "white" and gap.get_zorder() > band.get_zorder()
        assert x0 <= xs[0] <= x1 and min(ys) < y0 and max(ys) > y1  # across the whole band


@pytest.mark.parametrize("n_kv_heads", [8, 2])
def test_multi_head_draws_the_scores_shape_and_names_kv_heads_only_when_fewer(n_kv_heads):
    d = multi_head.split_attend_merge(chapter_6_demo(n_kv_heads), B=10, T=2, S=4)
    assert "(10, 8, 2, 4)" in numbers_in(d)  # the demo's scores, drawn, not only in the alt text
    assert ("n_kv_heads" in strings(d)) == (n_kv_heads != 8)


@pytest.mark.parametrize("n_heads, head_dim, kv_rank, rope_dim", [(4, 64, 256, 32), (8, 16, 24, 0),
                                                                  (2, 6, 10, 4)])
def test_latent_attention_draws_what_the_layer_caches(n_heads, head_dim, kv_rank, rope_dim):
    from fractions import Fraction

    from selfattn.cache import KVCache
    from selfattn.latent import MultiHeadLatentAttention

    layout = decoding.latent_layout(n_heads, head_dim, kv_rank, rope_dim)
    # what the layer really caches per token, measured: the number drawn
    layer = MultiHeadLatentAttention(n_heads * head_dim, n_heads, head_dim, kv_rank, rope_dim=rope_dim)
    cache = KVCache()
    layer(torch.randn(1, 3, n_heads * head_dim), is_causal=True, kv_cache=cache, absorb=True)
    per_token = cache.nbytes // (3 * 4)
    assert layout.cached == per_token == kv_rank + rope_dim
    cached = f"{kv_rank} + {rope_dim} = {per_token} numbers" if rope_dim else f"{kv_rank} numbers"
    mha = 2 * n_heads * head_dim
    assert layout.cache_label == cached
    assert f"MHA's: 2 × {n_heads} × {head_dim} = {mha}; {Fraction(per_token, mha)} of it" in layout.cost_label
    assert f"{per_token} numbers per token" in layout.alt
    # a key and a value box per head, side by side; the shared rope part beside each key only with RoPE
    assert len(layout.heads) == n_heads and all((h.rope > 0) == bool(rope_dim) for h in layout.heads)
    assert all(a.left + a.key + a.rope <= b.left for a, b in itertools.pairwise(layout.heads))
    # the drawing
    d = decoding.latent_attention(n_heads, head_dim, kv_rank, rope_dim)
    s, drawn = strings(d), boxes(d, "")
    assert cached in s and f"({kv_rank},)" in s and layout.cost_label in s and d.alt == layout.alt
    for letter in "kv":
        assert {f"{letter}{i}" for i in range(n_heads)} <= set(drawn)
        assert f"{letter}{n_heads}" not in drawn
    assert sum(g.startswith("rope") and g != "rope key" for g in drawn) == (n_heads if rope_dim else 0)
    assert ("rope key" in drawn) == bool(rope_dim) and "latent" in drawn
    assert ("k^R_j" in s) == bool(rope_dim)  # the scores' rope term
    assert all(name in s for name in ("kv_down", "k_up", "v_up", "out_proj, absorbed"))


def gids(diagram, kind=Patch) -> dict:
    return {a.get_gid(): a for a in diagram.figure.findobj(kind) if a.get_gid()}


def decoded_side_by_side(lengths, block_size, n_blocks):
    """The requests decoded by the library here, one token each per step."""
    from selfattn.cache import BlockPool, PagedKVCache

    pool = BlockPool(n_blocks, block_size, 1, 1)
    caches = [PagedKVCache(pool) for _ in lengths]
    for step in range(max(lengths)):
        for cache, n in zip(caches, lengths, strict=True):
            if step < n:
                cache.append(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))
    return pool, caches


@pytest.mark.parametrize("lengths, block_size, n_blocks", [((10, 6, 7), 4, None), ((5, 3), 2, 7),
                                                           ((3, 9, 2, 5), 3, 12), ((40, 30, 20), 8, 12),
                                                           ((4, 8), 4, None)])
def test_paged_layout_holds_the_caches_block_tables(lengths, block_size, n_blocks):
    layout = decoding.paged_layout(lengths, block_size, n_blocks)
    needed = [math.ceil(n / block_size) for n in lengths]
    n_blocks = n_blocks or sum(needed) + 2
    pool, caches = decoded_side_by_side(lengths, block_size, n_blocks)
    assert layout.block_tables == [c.block_table for c in caches]
    assert layout.free == pool.free_blocks and len(layout.physical) == n_blocks
    for r, (table, n) in enumerate(zip(layout.block_tables, lengths, strict=True)):
        assert len(table) == needed[r]  # whole blocks, the last one partly filled at most
        for p in range(n):  # token p in block block_table[p // block_size], slot p % block_size
            block = layout.physical[table[p // block_size]]
            assert block.request == r and block.slots[p % block_size] == p
        last = layout.physical[table[-1]].slots
        assert last[n - (len(table) - 1) * block_size:] == (None,) * (-n % block_size)  # its room
        assert [b.slots for b in layout.logical[r]] == [
            tuple(p if p < n else None for p in range(j * block_size, (j + 1) * block_size))
            for j in range(len(table))]
    assert all(layout.physical[b].request is None and set(layout.physical[b].slots) == {None}
               for b in layout.free)
    assert layout.unused == [-n % block_size for n in lengths]
    assert f"({sum(layout.unused)} unused slots of {sum(needed) * block_size})" in layout.alt


@pytest.mark.parametrize("lengths, block_size, n_blocks", [((10, 6, 7), 4, None), ((40, 30, 20), 8, 12)])
def test_paged_block_table_draws_its_layout(lengths, block_size, n_blocks):
    layout = decoding.paged_layout(lengths, block_size, n_blocks)
    d = decoding.paged_block_table(lengths, block_size, n_blocks)
    s, patches, labels = strings(d), gids(d), gids(d, Text)
    for r, (name, table) in enumerate(zip(layout.names, layout.block_tables, strict=True)):
        assert all(header in s for header in layout.headers[r])
        logical = sorted(g for g in patches if g.startswith(f"logical {name}"))
        assert logical == sorted(f"logical {name}{j} -> {b}" for j, b in enumerate(table))
        assert all(f"physical {b}: {name}" in patches for b in table)
    assert {g for g in patches if g.endswith(": free")} == {f"physical {b}: free" for b in layout.free}
    assert len(d.figure.findobj(Annotation)) == sum(map(len, layout.block_tables))  # an arrow a block
    numbered = {f"physical {b}.{s}": str(p) for b, block in enumerate(layout.physical)
                for s, p in enumerate(block.slots) if p is not None}
    drawn = {g: t.get_text() for g, t in labels.items() if g.startswith("physical ")}
    assert drawn == (numbered if layout.labelled else {})  # every token's position, where it fits
    assert f"{' + '.join(map(str, layout.unused))} = {sum(layout.unused)} of" in s
    assert f"free list: {layout.free}" in s or not layout.free


def test_paged_block_table_interleaves_the_requests_blocks():
    layout = decoding.paged_layout((10, 6, 7), 4)
    assert layout.block_tables == [[0, 3, 6], [1, 4], [2, 5]] and layout.free == [7, 8]


def expected_slots(n_sink, window, t):
    """By the rule of StreamingLLM's cache: the sinks in slots 0 .. n_sink - 1, position p past
    them in slot n_sink + (p - n_sink) % window, the latest written there kept."""
    held = list(range(n_sink)) + [None] * window
    for p in range(n_sink, t):
        held[n_sink + (p - n_sink) % window] = p
    return held, n_sink + (t - n_sink) % window


@pytest.mark.parametrize("n_sink, window, t", [(4, 8, 19), (1, 3, 32), (8, 8, 16), (0, 5, 13),
                                                (2, 6, 8), (3, 1, 10)])
@pytest.mark.parametrize("sliding", [True, False])
def test_rolling_layout_holds_what_each_slot_holds(n_sink, window, t, sliding):
    from selfattn.cache import SinkCache, SlidingWindowCache

    layout = decoding.rolling_layout(n_sink, window, t, sliding)
    size = n_sink + window
    caches = [("sink", n_sink, window, SinkCache(n_sink, window))]
    if sliding:
        caches.append(("sliding", 0, size, SlidingWindowCache(size)))
    for panel, (tag, sinks, win, cache) in zip(layout.panels, caches, strict=True):
        assert panel.tag == tag
        held, nxt = expected_slots(sinks, win, t)
        for p in range(t):  # the cache itself stores them there
            x = torch.full((1, 1, 1, 1), float(p))
            cache.append(x, x)
        assert panel.held == cache._k[0, 0, :, 0].long().tolist() == held
        assert panel.next_slot == nxt and panel.n_sink == sinks
        for p in range(t):
            kind = "sink" if p < sinks else "kept" if p in held else "evicted"
            assert panel.kind(p, t) == kind
        assert panel.kind(t, t) == "next"
        assert f"position {t} goes to slot {nxt}, overwriting position {held[nxt]}" in layout.alt
    assert layout.panels[0].title == f"SinkCache(n_sink={n_sink}, window={window})"
    assert (f"SlidingWindowCache(window={size})" in layout.alt) == sliding


@pytest.mark.parametrize("n_sink, window, t, sliding", [(4, 8, 19, True), (0, 5, 13, False)])
def test_rolling_sink_buffer_draws_its_layout(n_sink, window, t, sliding):
    layout = decoding.rolling_layout(n_sink, window, t, sliding)
    d = decoding.rolling_sink_buffer(n_sink, window, t, sliding)
    patches, labels = gids(d), gids(d, Text)
    for panel in layout.panels:
        tag = panel.tag
        slots = sorted(g for g in patches if g.startswith(f"{tag} slot "))
        assert slots == sorted(f"{tag} slot {s} holds {p}" for s, p in enumerate(panel.held))
        assert [labels[f"{tag} slot {s}"].get_text() for s in range(len(panel.held))] == \
            [str(p) for p in panel.held]
        assert f"{tag} next {panel.next_slot}" in patches
        positions = sorted(g for g in patches if g.startswith(f"{tag} position "))
        assert positions == sorted(f"{tag} position {p} {panel.kind(p, t)}" for p in range(t + 1))
        assert panel.title in strings(d)
    assert d.alt == layout.alt


# --- the palette of models and arms ---------------------------------------------------------

# Machado, Oliveira and Fernandes (2009), severity 1: dichromat vision, in linear RGB
DICHROMAT = {
    "protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
                   [-0.003882, -0.048116, 1.051998]],
    "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                     [-0.011820, 0.042940, 0.968881]],
    "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602],
                   [0.004733, 0.691367, 0.303900]],
    "typical vision": np.eye(3).tolist(),
}


def linear_rgb(color: str) -> np.ndarray:
    from matplotlib.colors import to_rgb

    c = np.array(to_rgb(color))
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def contrast(a: str, b: str) -> float:
    """WCAG 2's contrast ratio of two colours."""
    la, lb = (float(linear_rgb(c) @ [0.2126, 0.7152, 0.0722]) for c in (a, b))
    return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)


def lab(rgb: np.ndarray) -> np.ndarray:
    """CIELAB (D65) of a linear RGB colour."""
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722],
                    [0.0193, 0.1192, 0.9505]]) @ rgb / [0.95047, 1.0, 1.08883]
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def seen_by(color: str, vision: str) -> np.ndarray:
    return lab(np.clip(np.array(DICHROMAT[vision]) @ linear_rgb(color), 0, 1))


def test_every_model_and_arm_has_one_colour_legible_on_both_themes():
    assert draw.color("MQA") == draw.PALETTE["MQA"] and draw.color("self-attention") == draw.BLUE
    assert draw.color("rope") == draw.color("RoPE") and draw.color("scaled_dot") == draw.color("scaled dot")
    assert {name for names in draw.FAMILIES.values() for name in names} == set(draw.PALETTE)
    page = {"the figures' white": "#ffffff", "the dark theme's page": "#121212"}
    for name, color in draw.PALETTE.items():
        for where, background in page.items():  # WCAG 2.1's 3:1 for graphics
            assert contrast(color, background) >= 3, f"{name} ({color}) on {where}"
    with pytest.raises(KeyError):
        draw.color("a name no chapter uses")


@pytest.mark.parametrize("vision", list(DICHROMAT))
def test_the_arms_a_figure_draws_together_stay_apart_in_colour_blind_vision(vision):
    for family, names in draw.FAMILIES.items():
        for a, b in itertools.combinations(names, 2):
            distance = np.linalg.norm(seen_by(draw.color(a), vision) - seen_by(draw.color(b), vision))
            assert distance > 9, f"{family}: {a} and {b} are {distance:.1f} apart in {vision}"
