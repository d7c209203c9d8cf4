"""The live explorers in the built book, in a browser with no kernel (tests/test_browser.py's
server, browser and page loading).

For every live explorer on every page (selfattn.book.kit.live, run by assets/live/live.js): the page's
test entry, ``selfattnLive.explorers[name].attention(text, options)``, gives the weights (and a
tagger's logits) that PyTorch computes from the spec's weights, on sentences this test makes up
(seeded, of several lengths, longer than the examples too) and for every model, temperature
and mask the explorer offers; typing a sentence redraws the heatmap; a word outside the
vocabulary gets a message naming it and no heatmap; the dark theme redraws the labels in the
theme's text colour; no JavaScript error and no request off the machine. It also opens one page
from file://, where the explorer must work as well (its weights are in the page). Light and dark
screenshots of each explorer go to _build/screenshots/.
"""

import json
import random
import time

import pytest
import test_browser
import torch
from test_browser import HTML, ROOT, SHOTS, open_page, pages

from selfattn.book.kit import live

pytestmark = pytest.mark.built_book
server = test_browser.server  # its fixtures: the built book on 127.0.0.1, headless Chromium
browser = test_browser.browser
LIVE_CHAPTERS = {"chapters/01_sequence_labeling", "chapters/02_self_attention",
                 "chapters/05_positional_encoding"}  # at least these have a live explorer
TOLERANCE = 1e-5  # float32 rounding: JavaScript sums in float64 and stores float32


def sentences(spec, n=6, seed=0):
    """Sentences of the spec's own words, of lengths from 1 to its limit."""
    rng = random.Random(seed)
    words = [w for w in spec["words"] if w is not None]
    lengths = [1, 2, 5, 11, spec["max_tokens"] // 2, spec["max_tokens"]][:n]
    return [" ".join(rng.choice(words) for _ in range(k)) for k in lengths]


def option_sets(spec):
    if spec["kind"] == "attention":
        return [{"temperature": t, "mask": m} for t in spec["temperatures"] for m in spec["masks"]]
    return [{"model": name} for name in spec["models"]]


def background_brightness(page, name):
    """How bright the page is behind the explorer: the first opaque background up its parents."""
    return page.evaluate("""(name) => {
        let e = document.querySelector(`div.selfattn-live[data-live="${name}"]`);
        for (; e; e = e.parentElement) {
            const v = (getComputedStyle(e).backgroundColor.match(/[\\d.]+/g) || []).map(Number);
            if (v.length === 3 || v[3] > 0.5) return (v[0] + v[1] + v[2]) / 3;
        }
        return 255;
    }""", name)


def label_brightness(page, name):
    """How bright the heatmap's title is drawn (0 black .. 255 white): the mean of the opaque
    pixels in the canvas's top rows, where only the title is."""
    return page.evaluate("""(name) => {
        const c = document.querySelector(`div.selfattn-live[data-live="${name}"] canvas`);
        const ctx = c.getContext("2d");
        const data = ctx.getImageData(0, 0, c.width, Math.round(20 * devicePixelRatio)).data;
        let sum = 0, n = 0;
        for (let i = 0; i < data.length; i += 4)
            if (data[i + 3] > 200) { sum += (data[i] + data[i + 1] + data[i + 2]) / 3; n++; }
        return n > 20 ? sum / n : null;
    }""", name)


def has_live_cell(name):
    """Whether the page's notebook shows a small model's live explorer (not chapter 10's)."""
    path = ROOT / f"{name}.ipynb"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return "live.tagger_spec(" in text or "live.attention_spec(" in text


@pytest.mark.parametrize("name", [n for n in pages() if has_live_cell(n)])
def test_live_explorers_compute_what_pytorch_computes(browser, server, name):
    page, log = open_page(browser, server, name)
    specs = [json.loads(t) for t in page.locator("script.selfattn-live-spec").all_text_contents()]
    in_file = (HTML / f"{name}.html").read_text().count('class="selfattn-live-spec"')
    assert len(specs) == in_file, f"{in_file} live explorers in the page, {len(specs)} found"
    specs = [s for s in specs if s["kind"] != "minilm"]  # chapter 10's: its own test below
    SHOTS.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        root = page.locator(f'div.selfattn-live[data-live="{spec["name"]}"]')
        assert root.locator("canvas").count() == 1, f"{spec['name']}: live.js did not mount it"
        worst = 0.0
        for options in option_sets(spec):
            for text in [*spec["sentences"], *sentences(spec)]:
                got = page.evaluate("([n, t, o]) => selfattnLive.explorers[n].attention(t, o)",
                                    [spec["name"], text, options])
                want = live.forward(spec, text, **options)
                assert got["tokens"] == text.lower().split()
                w = torch.tensor(got["weights"][0], dtype=torch.float32)  # (H, T, T)
                worst = max(worst, (w - want["weights"]).abs().max().item())
                torch.testing.assert_close(w, want["weights"], rtol=0, atol=TOLERANCE,
                                           msg=f"{spec['name']} {options}: {text}")
                if "logits" in want:
                    torch.testing.assert_close(torch.tensor(got["logits"], dtype=torch.float32),
                                               want["logits"], rtol=1e-5, atol=1e-4)
        print(f"{name}: {spec['name']}, largest difference from PyTorch {worst:.1e}")

        # the reader's side: type, mistype, switch the theme
        text_box = root.locator("input.selfattn-live-text")
        text_box.fill(spec["sentences"][-1])
        assert root.locator("canvas").is_visible()
        root.screenshot(path=str(SHOTS / f"live-{spec['name']}-light.png"))
        light = label_brightness(page, spec["name"])
        page.evaluate("document.documentElement.dataset.theme = 'dark'")
        page.wait_for_timeout(200)
        root.screenshot(path=str(SHOTS / f"live-{spec['name']}-dark.png"))
        dark = label_brightness(page, spec["name"])
        behind = background_brightness(page, spec["name"])
        assert light is not None and light < 100, light  # dark text on the light page ...
        assert dark is not None and dark > 150, dark  # ... and light text on the dark one,
        assert behind < 100, behind  # on the dark page, not on a light card
        for part in ("label", ".selfattn-live-caption"):  # the words around it, light too
            colour = root.locator(part).first.evaluate("e => getComputedStyle(e).color")
            assert sum(map(float, colour[4:-1].split(",")[:3])) / 3 > 150, (part, colour)
        page.evaluate("document.documentElement.dataset.theme = 'light'")
        known = spec["sentences"][0].split()
        text_box.fill(" ".join([known[0], "zebra", *known[1:]]))
        message = root.locator(".selfattn-live-message").inner_text()
        assert "“zebra”" in message and "vocabulary" in message, message
        assert not root.locator("canvas").is_visible()
        text_box.fill(" ".join([known[0]] * (spec["max_tokens"] + 1)))
        assert f"at most {spec['max_tokens']}" in root.locator(".selfattn-live-message").inner_text()
        text_box.fill(spec["sentences"][0])
        assert root.locator("canvas").is_visible()
        assert root.locator(".selfattn-live-message").inner_text() == ""
    assert log["offhost"] == []
    assert log["errors"] == []
    page.close()


def test_the_chapters_with_small_models_have_a_live_explorer():
    have = {name for name in pages()
            if '"kind":"tagger"' in (html := (HTML / f"{name}.html").read_text())
            or '"kind":"attention"' in html}
    assert have == {name for name in pages() if has_live_cell(name)}
    assert LIVE_CHAPTERS <= have, f"no live explorer on {sorted(LIVE_CHAPTERS - have)}"


def test_a_live_explorer_works_from_a_file_url(browser):
    """The built book opened from disk, as the Makefile prints it: no server, no fetch."""
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((HTML / "chapters" / "02_self_attention.html").as_uri())
    page.wait_for_timeout(500)
    root = page.locator("div.selfattn-live").first
    assert root.locator("canvas").is_visible()
    root.locator("input.selfattn-live-text").fill("i saw a cat")
    assert root.locator(".selfattn-live-caption").inner_text().startswith("mean row entropy")
    assert errors == []
    page.close()


MINILM_PAGE = "chapters/10_pretrained_model"
MINILM_TOLERANCE = 2e-3  # float16 weights (tools/export_minilm.py); measured about 1e-3
MINILM_SENTENCES = [  # the test's own: punctuation, an accent, a made-up word, a longer one
    "Don't panic: the café's zxqvw is closed!",
    "A head that attends to the previous token sees the word before it.",
    "Bank, bank, river bank; she banked on the bank's rates rising in 2027.",
]
TYPED = "the quick brown fox jumps over the lazy dog, then sleeps all day"  # 16 word pieces


def thumbs_visible(root):
    return root.locator("button.selfattn-live-thumb").first.is_visible()


def test_minilm_runs_live_behind_a_button_and_equals_pytorch(browser, server):
    from selfattn.book import pretrained

    page, log = open_page(browser, server, MINILM_PAGE)
    spec = json.loads(page.locator('div.selfattn-live[data-live="ch10-minilm"] '
                                   "script.selfattn-live-spec").text_content())
    fetched = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
    assert not [u for u in fetched if "/minilm/" in u or "/ort/" in u], "fetched before asked"
    root = page.locator('div.selfattn-live[data-live="ch10-minilm"]')
    button = root.locator("button.selfattn-live-load")
    total = sum(spec["bytes"].values())
    assert f"downloads {total / 1e6:.1f} MB" in button.inner_text()
    before = log["bytes"]
    from test_browser import tab_to

    tab_to(page, "button.selfattn-live-load")  # the keyboard alone: Tab to it, Enter
    start = time.perf_counter()
    page.keyboard.press("Enter")
    page.wait_for_function("selfattnLive.explorers['ch10-minilm'].loaded", timeout=180_000)
    loaded_in = time.perf_counter() - start
    # the button is gone: the focus goes on to the sentence box, not back to the top of the page
    assert page.evaluate("document.activeElement.matches('div.selfattn-live input.selfattn-live-text')")
    downloaded = log["bytes"] - before
    assert downloaded >= spec["bytes"]["model"], "the model came from this host"

    model = pretrained.load()
    worst = 0.0
    for sentence in MINILM_SENTENCES:
        got = page.evaluate("t => selfattnLive.explorers['ch10-minilm'].attention(t)", sentence)
        enc = model.encode(sentence)
        assert got["tokens"] == enc.tokens[0], sentence  # the JavaScript tokenizer agrees
        want = enc.attentions[:, 0]  # (L, H, T, T)
        diff = (torch.tensor(got["weights"]) - want).abs().max().item()
        worst = max(worst, diff)
        assert diff <= MINILM_TOLERANCE, f"{sentence}: {diff:.2e}"

    # typing: one key at a time, never blocking the page; the per-keystroke time is a figure
    text_box = root.locator("input.selfattn-live-text")
    text_box.fill("")
    page.evaluate("selfattnLive.explorers['ch10-minilm'].timings.length = 0")
    text_box.press_sequentially(TYPED, delay=60)
    page.wait_for_function("document.querySelector('div.selfattn-live[data-live=\"ch10-minilm\"] "
                           ".selfattn-live-caption').textContent.startsWith('16 word pieces')",
                           timeout=30_000)
    timings = page.evaluate("selfattnLive.explorers['ch10-minilm'].timings")
    at16 = [t for t in timings if t["pieces"] == 16]
    assert timings and at16, timings
    median = sorted(t["inference_ms"] for t in at16)[len(at16) // 2]
    total_median = sorted(t["total_ms"] for t in at16)[len(at16) // 2]
    report = (f"{MINILM_PAGE}: page {before / 1e6:.2f} MB before the button; button fetched "
          f"{downloaded / 1e6:.1f} MB, ready in {loaded_in:.1f} s (localhost); largest difference "
          f"from PyTorch {worst:.1e} on {len(MINILM_SENTENCES)} sentences; {len(timings)} runs "
          f"for {len(TYPED)} keys; at 16 word pieces (benchmark, not asserted): inference "
          f"median {median:.1f} ms, keystroke to drawn median {total_median:.1f} ms")
    (HTML.parent / "live-benchmark.txt").write_text(report + "\n")  # make test prints it

    # an empty or too long box shows a message, not the view of an earlier text
    canvas = root.locator("canvas.selfattn-live-canvas")
    for text, says in [("", "Type a sentence"), ("word " * 60, "at most 48")]:
        text_box.fill(text)
        page.wait_for_timeout(300)
        assert says in root.locator(".selfattn-live-message").inner_text(), text
        assert not canvas.is_visible() and not thumbs_visible(root)
    text_box.fill(TYPED)
    page.wait_for_function("document.querySelector('div.selfattn-live[data-live=\"ch10-minilm\"] "
                           "canvas.selfattn-live-canvas').offsetParent !== null", timeout=30_000)

    # [UNK], a piece the vocabulary lacks, is explained where it appears
    text_box.fill("他用锯锯木头 I saw a saw")
    caption = root.locator(".selfattn-live-caption").first
    page.wait_for_function("(e) => e.textContent.includes('[UNK]')", arg=caption.element_handle(),
                           timeout=30_000)
    assert "vocabulary does not have" in caption.inner_text()
    text_box.fill(TYPED)
    page.wait_for_function("(e) => !e.textContent.includes('[UNK]')", arg=caption.element_handle(),
                           timeout=30_000)

    # the 72 heads: named buttons, one tab stop, the arrow keys move between heads and layers
    thumbs = root.locator("button.selfattn-live-thumb")
    assert thumbs.count() == spec["layers"] * spec["heads"]
    assert thumbs.nth(2 * spec["heads"] + 5).get_attribute("aria-label") == "layer 2, head 5"
    thumbs.nth(2 * spec["heads"] + 5).click()  # layer 2, head 5
    assert root.locator("select").nth(0).input_value() == "2"
    assert root.locator("select").nth(1).input_value() == "5"
    assert [thumbs.nth(i).get_attribute("tabindex") for i in range(thumbs.count())].count("0") == 1
    thumbs.nth(2 * spec["heads"] + 5).focus()
    for key in ("ArrowRight", "ArrowDown"):
        page.keyboard.press(key)
    assert [root.locator("select").nth(i).input_value() for i in (0, 1)] == ["3", "6"]
    assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "layer 3, head 6"
    assert thumbs.nth(3 * spec["heads"] + 6).get_attribute("aria-checked") == "true"
    page.set_viewport_size({"width": 1280, "height": 2400})  # the whole explorer in view
    page.evaluate("window.scrollTo(0, 0)")
    root.screenshot(path=str(SHOTS / "live-ch10-minilm-light.png"))
    page.evaluate("document.documentElement.dataset.theme = 'dark'")
    page.wait_for_timeout(200)
    root.screenshot(path=str(SHOTS / "live-ch10-minilm-dark.png"))
    assert label_brightness(page, "ch10-minilm") > 150
    assert log["offhost"] == []
    assert log["errors"] == []
    page.close()


def test_the_runtime_and_the_model_are_served_with_their_licences():
    static = HTML / "_static"
    for folder, needs in [("ort", "MIT License"), ("minilm", "Apache License")]:
        assert needs in (static / folder / "LICENSE").read_text(), folder
    assert "Apache License, Version 2.0" in (static / "minilm" / "NOTICE").read_text()


def test_minilm_says_how_to_serve_the_book_from_a_file_url(browser):
    page = browser.new_page()
    page.goto((HTML / f"{MINILM_PAGE}.html").as_uri())
    page.wait_for_timeout(300)
    root = page.locator('div.selfattn-live[data-live="ch10-minilm"]')
    assert "http.server" in root.inner_text()
    assert root.locator("button.selfattn-live-load").count() == 0
    page.close()
