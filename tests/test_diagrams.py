"""The book's schematic diagrams: they fit the page, say what they show, and are drawn from the code."""

import base64
import io
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
    d = multi_head.split_attend_merge(selfattn.AttentionConfig.build(d_model=64, n_heads=8, n_kv_heads=2))
    assert {"(2, 5, 16)", "(2, 2, 5, 8)", "(2, 8, 5, 8)"} <= numbers_in(d)

    def row(letter):  # the labels of one letter's boxes, left to right
        found = [t for t in texts(d) if re.fullmatch(letter + r"\d+", t.get_text())]
        return [int(t.get_text()[1:]) for t in sorted(found, key=lambda t: t.get_position()[0])]

    assert row("q") == list(range(8))
    assert row("k") == row("v") == [i // 4 for i in range(8)]


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
    d = performance.online_softmax_tiles(L, S, block, causal)
    tiles = boxes(d, "tile")
    nq, nk = math.ceil(L / block), math.ceil(S / block)
    assert len(tiles) == nq * nk
    keep = causal_mask(L, S) if causal else torch.ones(L, S, dtype=torch.bool)
    for a in range(nq):
        for b in range(nk):
            hidden = not keep[a * block:(a + 1) * block, b * block:(b + 1) * block].any()
            assert (f"tile{a}-{b} skipped" in tiles) == hidden
            assert (f"tile{a}-{b}" in tiles) != hidden
    s = strings(d)
    assert f"({L} × {S} = {L * S:,} scores)" in s
    assert "m_new = max(m, rowmax(s))" in s and "l = alpha · l + rowsum(exp(s − m_new))" in s
    assert "acc = alpha · acc + exp(s − m_new) @ V_j" in s and "at the end: acc / l" in s
    assert ("tiles skipped" in s) == causal


@pytest.mark.parametrize("call, message", [
    (lambda: single_head.one_output([]), "tokens must hold 1 to 6 words to fit the page, got 0"),
    (lambda: single_head.one_output("the cat"), "sequence of words"),
    (lambda: single_head.one_output("a b c d e f g".split()), "1 to 6 words to fit the page, got 7"),
    (lambda: single_head.one_output(["the", "incomprehensibilities"]), "at most .* characters"),
    (lambda: single_head.one_output(["the", ""]), "non-empty str"),
    (lambda: single_head.matrix_form(0, 16, 8, 8), "n must be positive, got 0"),
    (lambda: single_head.matrix_form(10_000, 16, 8, 8), "n must be at most 9999, got 10000"),
    (lambda: multi_head.split_attend_merge(selfattn.MultiHeadAttention(32, 4), B=0), "B must be positive"),
    (lambda: multi_head.split_attend_merge(selfattn.MultiHeadAttention(64, 32)),
     "n_heads must be at most 16, got 32"),
    (lambda: multi_head.kv_heads(8, (3,)), r"n_heads \(8\) must be a multiple of each n_kv_heads, got 3"),
    (lambda: multi_head.kv_heads(4, (8,)), r"n_heads \(4\) must be a multiple"),
    (lambda: multi_head.kv_heads(8, (0,)), "each n_kv_heads must be positive, got 0"),
    (lambda: multi_head.kv_heads(8, ()), "1 to 4 head counts"),
    (lambda: multi_head.kv_heads(8, head_dim=0), "head_dim must be positive"),
    (lambda: positional_encoding.rope_rotation(-1), "position must be an int from 0 to 8"),
    (lambda: positional_encoding.rope_rotation(2, theta=0), "theta must be a number of radians from 0.01"),
    (lambda: positional_encoding.rope_rotation(2, theta=2.0), "theta must be a number of radians from 0.01"),
    (lambda: positional_encoding.rope_rotation(2, x=(1, 2, 3)), r"x must be a pair of numbers \(x_1, x_2\)"),
    (lambda: positional_encoding.rope_rotation(8, theta=1.0), "goes round the circle more than once"),
    (lambda: positional_encoding.rope_rotation(2, x=(0, 0)), "non-zero, finite pair"),
    (lambda: performance.online_softmax_tiles(16, 16, 0), "block_size must be positive, got 0"),
    (lambda: performance.online_softmax_tiles(0, 16, 4), "L must be positive"),
    (lambda: performance.online_softmax_tiles(4096, 4096, 128),
     "too many to draw.*block_size of at least 256"),
    (lambda: performance.online_softmax_tiles(16, 16, 4, query_block=4),
     "query_block must be an int from 0 to 3"),
])
def test_bad_arguments_say_what_is_wrong(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("call, message", [
    (lambda: single_head.matrix_form(4, 16, 8.0, 8), "d_k must be an int, got float"),
    (lambda: multi_head.kv_heads(8, ("2",)), "each n_kv_heads must be an int, got str"),
    (lambda: performance.online_softmax_tiles(16, 16, True), "block_size must be an int, got bool"),
])
def test_a_size_of_the_wrong_type_is_a_type_error(call, message):
    with pytest.raises(TypeError, match=message):
        call()


def test_multi_head_rejects_what_is_not_a_layer():
    with pytest.raises(TypeError, match="MultiHeadAttention or an AttentionConfig"):
        multi_head.split_attend_merge(torch.nn.MultiheadAttention(32, 4))


def test_one_output_writes_vectors_as_rows_like_the_code():
    # the chapter's code computes a @ W_q with W_q of shape (d_model, d_k): a row vector times
    # W, so W^q a^1 (column vectors) would not even be defined for those shapes
    s = strings(single_head.one_output())
    for label in ["$q^1 = a^1 W^q$", "$k^i = a^i W^k$", "$v^i = a^i W^v$"]:
        assert label in s, label
    assert "W^q a" not in s and "W^k a" not in s and "W^v a" not in s


GROUPED_CASES = {
    "grouped_rows": (lambda: multi_head.grouped_rows(), "key/value head"),
    "grouped_rows, MQA of 16": (lambda: multi_head.grouped_rows(16, 1), "key/value head"),
    "grouped_rows, chunk": (lambda: multi_head.grouped_rows(4, 2, L=4), "key/value head"),
    "grouped_rows, pairs": (lambda: multi_head.grouped_rows(16, 8), "key/value head"),
}


@pytest.mark.parametrize("name", list(GROUPED_CASES))
def test_grouped_rows_fits_is_legible_and_has_its_alt_text(name):
    make, word = GROUPED_CASES[name]
    test_returns_a_diagram_that_fits_the_page((make(), word))
    test_nothing_is_cut_off_and_no_text_is_drawn_over_another((make(), word))
    test_shows_as_a_png_with_its_alt_text((make(), word))


@pytest.mark.parametrize(("n_heads", "n_kv", "L"), [(8, 2, 1), (16, 1, 1), (4, 2, 4), (6, 3, 2)])
def test_grouped_rows_stacks_each_groups_query_rows_as_the_library_does(n_heads, n_kv, L):
    d = multi_head.grouped_rows(n_heads, n_kv, L)
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


@pytest.mark.parametrize(("call", "message"), [
    (lambda: multi_head.grouped_rows(8, 3), r"multiple of n_kv_heads \(3\)"),
    (lambda: multi_head.grouped_rows(4, 4), "two query heads or more"),
    (lambda: multi_head.grouped_rows(8, 2, L=4), "at most 16 rows"),
    (lambda: multi_head.grouped_rows(0, 1), "n_heads must be positive"),
])
def test_grouped_rows_says_what_is_wrong(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("n_kv_heads", [8, 2])
def test_multi_head_draws_the_query_and_key_lengths_apart(n_kv_heads):
    # chapter 6's demo: 2 queries attend to 4 keys; every shape on a key or value path has S
    layer = selfattn.MultiHeadAttention(128, 8, n_kv_heads=n_kv_heads, head_dim=16, kdim=128,
                                        vdim=64, out_dim=8)
    d = multi_head.split_attend_merge(layer, B=10, T=2, S=4)
    kv = 16 * n_kv_heads
    assert {"(10, 2, 128)", "(10, 4, 128)", "(10, 4, 64)", f"(10, 4, {kv})",
            "(10, 8, 2, 16)", f"(10, {n_kv_heads}, 4, 16)", "(10, 2, 8)"} <= numbers_in(d)
    assert "(10, 8, 2, 4)" in d.alt and "S=4" in strings(d)
    assert "(10, 4, 8)" not in numbers_in(d)  # the output follows the queries, not the keys
    same = multi_head.split_attend_merge(layer, B=10, T=4)  # S defaults to T: self-attention
    assert numbers_in(same) == numbers_in(multi_head.split_attend_merge(layer, B=10, T=4, S=4))
    assert "S=" not in strings(same)
    test_returns_a_diagram_that_fits_the_page((d, "merge_heads"))
    test_nothing_is_cut_off_and_no_text_is_drawn_over_another((d, "merge_heads"))
    test_shows_as_a_png_with_its_alt_text((d, "merge_heads"))


def test_multi_head_checks_the_key_length():
    with pytest.raises(ValueError, match="S"):
        multi_head.split_attend_merge(selfattn.MultiHeadAttention(32, 4), S=0)


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
    layer = selfattn.MultiHeadAttention(128, 8, n_kv_heads=n_kv_heads, head_dim=16, kdim=128,
                                        vdim=64, out_dim=8)
    d = multi_head.split_attend_merge(layer, B=10, T=2, S=4)
    assert "(10, 8, 2, 4)" in numbers_in(d)  # the demo's scores, drawn, not only in the alt text
    assert ("n_kv_heads" in strings(d)) == (n_kv_heads != 8)
    test_nothing_is_cut_off_and_no_text_is_drawn_over_another((d, "merge_heads"))


LATENT_CASES = {
    "latent_attention": (lambda: decoding.latent_attention(), "latent"),
    "latent_attention, DeepSeek-V2's head": (lambda: decoding.latent_attention(8, 128, 512, 64, 5120),
                                              "latent"),
    "latent_attention, no RoPE, one head": (lambda: decoding.latent_attention(1, 1, 1, 0), "latent"),
    "latent_attention, large": (lambda: decoding.latent_attention(8, 9999, 9999, 9998, 99999), "latent"),
}


@pytest.mark.parametrize("name", list(LATENT_CASES))
def test_latent_attention_fits_is_legible_and_has_its_alt_text(name):
    make, word = LATENT_CASES[name]
    test_returns_a_diagram_that_fits_the_page((make(), word))
    test_nothing_is_cut_off_and_no_text_is_drawn_over_another((make(), word))
    test_shows_as_a_png_with_its_alt_text((make(), word))


@pytest.mark.parametrize("n_heads, head_dim, kv_rank, rope_dim", [(4, 64, 256, 32), (8, 16, 24, 0),
                                                                  (2, 6, 10, 4)])
def test_latent_attention_draws_what_the_layer_caches(n_heads, head_dim, kv_rank, rope_dim):
    from fractions import Fraction

    from selfattn.cache import KVCache
    from selfattn.latent import MultiHeadLatentAttention

    d = decoding.latent_attention(n_heads, head_dim, kv_rank, rope_dim)
    s = strings(d)
    # what the layer really caches per token, measured: the number drawn
    layer = MultiHeadLatentAttention(n_heads * head_dim, n_heads, head_dim, kv_rank, rope_dim=rope_dim)
    cache = KVCache()
    layer(torch.randn(1, 3, n_heads * head_dim), is_causal=True, kv_cache=cache, absorb=True)
    per_token = cache.nbytes // (3 * 4)
    assert per_token == kv_rank + rope_dim
    cached = f"{kv_rank} + {rope_dim} = {per_token} numbers" if rope_dim else f"{kv_rank} numbers"
    mha = 2 * n_heads * head_dim
    assert cached in s and f"({kv_rank},)" in s
    assert f"MHA's: 2 × {n_heads} × {head_dim} = {mha}; {Fraction(per_token, mha)} of it" in s
    assert f"{per_token} numbers per token" in d.alt
    # a key and a value box per head; the shared rope part beside each key only with RoPE
    drawn = boxes(d, "")
    for letter in "kv":
        assert {f"{letter}{i}" for i in range(n_heads)} <= set(drawn)
        assert f"{letter}{n_heads}" not in drawn
    assert sum(g.startswith("rope") and g != "rope key" for g in drawn) == (n_heads if rope_dim else 0)
    assert ("rope key" in drawn) == bool(rope_dim) and "latent" in drawn
    assert ("k^R_j" in s) == bool(rope_dim)  # the scores' rope term
    assert all(name in s for name in ("kv_down", "k_up", "v_up", "out_proj, absorbed"))


@pytest.mark.parametrize("call, exc, message", [
    (lambda: decoding.latent_attention(9), ValueError, "n_heads must be at most 8, got 9"),
    (lambda: decoding.latent_attention(4, 64, 0), ValueError, "kv_rank must be positive, got 0"),
    (lambda: decoding.latent_attention(4, 64, 256, 3), ValueError, "rope_dim must be 0 .* even"),
    (lambda: decoding.latent_attention(4, 64, 256, -2), ValueError, "rope_dim must be from 0 to 9998"),
    (lambda: decoding.latent_attention(4, 64, 256, 2.0), TypeError, "rope_dim must be an int, got float"),
    (lambda: decoding.latent_attention(4, 64, 256, 32, d_model=0), ValueError, "d_model must be positive"),
])
def test_latent_attention_says_what_is_wrong(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


CACHE_CASES = {
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


@pytest.mark.parametrize("name", list(CACHE_CASES))
def test_cache_diagrams_fit_are_legible_and_have_their_alt_text(name):
    make, word = CACHE_CASES[name]
    test_returns_a_diagram_that_fits_the_page((make(), word))
    test_nothing_is_cut_off_and_no_text_is_drawn_over_another((make(), word))
    test_shows_as_a_png_with_its_alt_text((make(), word))


def gids(diagram, kind=Patch) -> dict:
    return {a.get_gid(): a for a in diagram.figure.findobj(kind) if a.get_gid()}


@pytest.mark.parametrize("lengths, block_size, n_blocks", [((10, 6, 7), 4, None), ((5, 3), 2, 7),
                                                           ((3, 9, 2, 5), 3, 12), ((40, 30, 20), 8, 12),
                                                           ((4, 8), 4, None)])
def test_paged_block_table_draws_the_caches_block_tables(lengths, block_size, n_blocks):
    from selfattn.cache import BlockPool, PagedKVCache

    d = decoding.paged_block_table(lengths, block_size, n_blocks)
    needed = [math.ceil(n / block_size) for n in lengths]
    n_blocks = n_blocks or sum(needed) + 2
    # the same requests decoded side by side, one token each per step, by the library here
    pool = BlockPool(n_blocks, block_size, 1, 1)
    caches = [PagedKVCache(pool) for _ in lengths]
    for step in range(max(lengths)):
        for cache, n in zip(caches, lengths, strict=True):
            if step < n:
                cache.append(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))
    s, patches, labels = strings(d), gids(d), gids(d, Text)
    names = "ABCD"
    for r, (cache, n) in enumerate(zip(caches, lengths, strict=True)):
        table = cache.block_table
        assert len(table) == needed[r]  # whole blocks, the last one partly filled at most
        assert f"block_table {table}" in s and f"{names[r]}: {n} token" in s
        logical = sorted(g for g in patches if g.startswith(f"logical {names[r]}"))
        assert logical == sorted(f"logical {names[r]}{j} -> {b}" for j, b in enumerate(table))
        for b in table:
            assert f"physical {b}: {names[r]}" in patches
        for p in range(n):  # token p in block block_table[p // block_size], slot p % block_size
            label = labels.get(f"physical {table[p // block_size]}.{p % block_size}")
            assert label is None or label.get_text() == str(p)  # None: slots too narrow to number
        last = table[-1]
        for slot in range(n - (len(table) - 1) * block_size, block_size):  # the last block's room
            assert f"physical {last}.{slot}" not in labels
    assert {g for g in patches if g.endswith(": free")} == {f"physical {b}: free" for b in
                                                            pool.free_blocks}
    assert sum(g.startswith("physical ") for g in patches) == n_blocks
    assert len(d.figure.findobj(Annotation)) == sum(needed)  # one arrow per logical block
    unused = [-n % block_size for n in lengths]
    assert f"{' + '.join(map(str, unused))} = {sum(unused)} of {sum(needed) * block_size} allocated" in s
    assert f"free list: {pool.free_blocks}" in s or not pool.free_blocks
    if block_size <= 4 and n_blocks <= 9:  # wide enough slots: every token's position is drawn
        assert sum(g.startswith("physical ") for g in labels) == sum(lengths)


def test_paged_block_table_interleaves_the_requests_blocks():
    d = decoding.paged_block_table((10, 6, 7), 4)
    s = strings(d)
    assert "block_table [0, 3, 6]" in s and "block_table [1, 4]" in s and "block_table [2, 5]" in s
    assert "free list: [7, 8]" in s


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
def test_rolling_sink_buffer_draws_what_each_slot_holds(n_sink, window, t, sliding):
    from selfattn.cache import SinkCache, SlidingWindowCache

    d = decoding.rolling_sink_buffer(n_sink, window, t, sliding)
    patches, labels = gids(d), gids(d, Text)
    size = n_sink + window
    panels = [("sink", n_sink, window, SinkCache(n_sink, window))]
    if sliding:
        panels.append(("sliding", 0, size, SlidingWindowCache(size)))
    assert not any(g.startswith("sliding") for g in patches) or sliding
    for tag, sinks, win, cache in panels:
        held, nxt = expected_slots(sinks, win, t)
        for p in range(t):  # the cache itself stores them there
            x = torch.full((1, 1, 1, 1), float(p))
            cache.append(x, x)
        assert cache._k[0, 0, :, 0].long().tolist() == held
        slots = sorted(g for g in patches if g.startswith(f"{tag} slot "))
        assert slots == sorted(f"{tag} slot {s} holds {p}" for s, p in enumerate(held))
        assert [labels[f"{tag} slot {s}"].get_text() for s in range(size)] == [str(p) for p in held]
        assert f"{tag} next {nxt}" in patches
        positions = [g for g in patches if g.startswith(f"{tag} position ")]
        assert len(positions) == t + 1  # 0 .. t - 1, and the next one
        for p in range(t):
            kind = "sink" if p < sinks else "kept" if p in held else "evicted"
            assert f"{tag} position {p} {kind}" in patches
        assert f"{tag} position {t} next" in patches
        assert f"position {t} goes to slot {nxt}, overwriting position {held[nxt]}" in d.alt
    assert f"SinkCache(n_sink={n_sink}, window={window})" in strings(d)
    assert (f"SlidingWindowCache(window={size})" in strings(d)) == sliding


@pytest.mark.parametrize("call, exc, message", [
    (lambda: decoding.paged_block_table(()), ValueError, "1 to 4 token counts"),
    (lambda: decoding.paged_block_table((1, 2, 3, 4, 5)), ValueError, "1 to 4 token counts"),
    (lambda: decoding.paged_block_table("abc"), ValueError, "sequence of 1 to 4 token counts"),
    (lambda: decoding.paged_block_table((3, 0)), ValueError, "each length must be positive, got 0"),
    (lambda: decoding.paged_block_table((3,), 0), ValueError, "block_size must be positive"),
    (lambda: decoding.paged_block_table((3,), 9), ValueError, "block_size must be at most 8"),
    (lambda: decoding.paged_block_table((10, 6, 7), 4, 6), ValueError,
     "n_blocks must be from the 7 blocks the requests need to 12"),
    (lambda: decoding.paged_block_table((99,), 8), ValueError, "the 13 blocks the requests need"),
    (lambda: decoding.paged_block_table((3,), 4, 13), ValueError, "to 12"),
    (lambda: decoding.paged_block_table((3.0,)), TypeError, "each length must be an int, got float"),
    (lambda: decoding.rolling_sink_buffer(-1), ValueError, "n_sink must be from 0 to 8, got -1"),
    (lambda: decoding.rolling_sink_buffer(4, 0), ValueError, "window must be positive"),
    (lambda: decoding.rolling_sink_buffer(8, 9, 20), ValueError, "at most 16 slots"),
    (lambda: decoding.rolling_sink_buffer(4, 8, 11), ValueError,
     r"t must be from n_sink \+ window = 12 \(the buffer full\) to 32, got 11"),
    (lambda: decoding.rolling_sink_buffer(4, 8, 33), ValueError, "to 32, got 33"),
    (lambda: decoding.rolling_sink_buffer(4, 8, 19.0), TypeError, "t must be an int, got float"),
    (lambda: decoding.rolling_sink_buffer(True), TypeError, "n_sink must be an int, got bool"),
])
def test_cache_diagrams_say_what_is_wrong(call, exc, message):
    with pytest.raises(exc, match=message):
        call()
