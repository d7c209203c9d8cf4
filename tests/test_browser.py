"""The built book in a real browser: headless Chromium, no kernel, no network.

For every page of the book, in a 1280 px wide window: no JavaScript error (none allowed as noise),
no request leaving 127.0.0.1, every embedded widget view rendered, every figure loaded, the Chinese
terms drawn with the book's own font (the machines that run this have no CJK font), no raw LaTeX
outside the math, no code or printed line wider than its block, no display equation wider than its
column (and, in a 390 px phone window, none clipped: a wide one scrolls inside its own box), and no
figure whose smallest text is under 9 px as displayed (from the sizes tests/harness.py
recorded while the chapters ran). For the static explorers: moving a slider changes the heatmap on
screen, and at least eight of the chapters have an explorer that renders a picture. Every schematic
diagram has its alt text and is screenshotted in the dark theme too. Screenshots go to
_build/screenshots/ (the run's summary names the folder). `make test` builds the book first.

Then every page as a reader meets it, at 1280 px and in a 390 px phone window (touch), in the light
and the dark theme: axe-core (from npm, served by the book itself: _static/axe/) finds no critical
or serious violation; the page is no wider than the window; every image has alt text that is not a
file path; every figure links to its full-size file and, on the phone, is shown at the size it was
drawn (its box scrolls); no exercise shows a verdict before the reader answers; no JavaScript
error. Each is screenshotted whole at the phone width into _build/screenshots/pages/, and axe's
counts by impact go to _build/axe.txt. Last, one live explorer used with the keyboard alone: Tab
reaches its box, typing redraws it and a polite live region says the result, a word it does not
know marks the box invalid, a menu and an example button work from the keyboard.
"""

import functools
import http.server
import importlib.util
import json
import os
import pathlib
import threading

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.built_book
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
# Full-page screenshots of every page (at 1280 px in the light theme, the pages with diagrams in
# the dark one too, and at the phone width in both themes), for a person to look at: on request
# (SELFATTN_SHOTS=1 make test), since the tall captures cost the test about a minute of CPU.
# The explorers', live explorers' and self-checks' own screenshots are small and always taken.
PAGE_SHOTS = os.environ.get("SELFATTN_SHOTS") == "1"
_spec = importlib.util.spec_from_file_location("find_browser", ROOT / "tools" / "find_browser.py")
find_browser = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(find_browser)


def pages():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    names = [toc["root"]]
    for part in toc["parts"]:
        names += [c["file"] for c in part["chapters"]]
    return names


@pytest.fixture(scope="module")
def server():
    if not (HTML / "index.html").exists():
        pytest.fail("no built book: run `make book` (make test does) first")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                            functools.partial(Quiet, directory=str(HTML)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    chromium = find_browser.find()
    assert chromium, find_browser.HOW_TO  # make test finds or installs one before any test
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()


def open_page(browser, server, name, width=1280):
    """Load a page with every off-host request blocked and recorded; return page and logs."""
    page = browser.new_page(viewport={"width": width, "height": 1000})
    log = {"errors": [], "offhost": [], "bytes": 0}
    page.on("console", lambda m: m.type == "error" and log["errors"].append(m.text))
    page.on("pageerror", lambda e: log["errors"].append(str(e)))

    def route(r):
        url = r.request.url
        if url.startswith(server) or url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            log["offhost"].append(url)
            r.abort()

    page.route("**/*", route)
    # bytes as the server sent them (its Content-Length: reading a large body back, such as
    # chapter 10's model, fails once the browser evicts it)
    page.on("response", lambda r: log.__setitem__(
        "bytes", log["bytes"] + int(r.headers.get("content-length") or 0))
        if r.url.startswith(server) and r.status < 300 else None)
    settle(page, f"{server}/{name}.html")
    return page, log


# A page is ready for the checks once it has loaded (its images included), the widget manager
# has rendered every embedded widget view, MathJax has typeset and the fonts its text asked for
# have arrived: waited for as events, not as fixed pauses (a network-idle wait and a pause cost
# every page a second of idling).
PAGE_READY = """() => {
    const views = document.querySelectorAll(
        'script[type="application/vnd.jupyter.widget-view+json"]').length;
    const shown = document.querySelectorAll(".cell_output .widget-subarea > .jupyter-widgets");
    return shown.length >= views;
}"""
PAGE_TYPESET = """async () => {
    if (window.MathJax && MathJax.startup) await MathJax.startup.promise;
    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
    await document.fonts.ready;
}"""


def settle(page, url):
    """Open ``url`` and wait until the page is ready for the checks (PAGE_READY)."""
    page.goto(url, wait_until="load")
    page.wait_for_function(PAGE_READY, timeout=30_000)
    page.evaluate(PAGE_TYPESET)


# Bytes each page transfers as it loads (the server's Content-Length of every response, cached
# files counted once per page): one line per page in _build/page-weights/, which make test's
# summary prints (tests/conftest.py). Chapter 10's model is fetched only when a reader asks
# (tests/test_live_browser.py). Each test here keeps its findings to itself (no state passed
# between tests), so make test runs them on both cores.
WEIGHTS = ROOT / "_build" / "page-weights"


def in_notebook(name, marker):
    """How many times ``marker`` occurs in the page's notebook (its outputs and widget state
    included): what the page must show, counted without a browser."""
    path = ROOT / f"{name}.ipynb"
    return path.read_text().count(marker) if path.exists() else 0


@pytest.mark.parametrize("name", pages())
def test_page_renders_offline_without_errors(browser, server, name):
    page, log = open_page(browser, server, name)
    SHOTS.mkdir(parents=True, exist_ok=True)
    if PAGE_SHOTS:
        page.screenshot(path=str(SHOTS / f"{name.replace('/', '_')}.png"), full_page=True)
    WEIGHTS.mkdir(parents=True, exist_ok=True)
    (WEIGHTS / f"{name.replace('/', '_')}.txt").write_text(f"{name:40s} {log['bytes'] / 1e6:6.2f} MB\n")

    assert log["offhost"] == [], "requests left 127.0.0.1"
    assert log["errors"] == [], "JavaScript errors in the console"
    problems = reader_problems(page, server, name, 1280)  # axe, alt text, width, both themes
    assert problems == [], f"{name} at 1280 px: " + "; ".join(problems)
    open_folds(page)
    problems = (chinese_not_in_the_books_font(page) + raw_latex(page) + lines_too_wide(page)
                + equations_that_do_not_fit(page, phone=False) + figures_too_small(page, name))
    assert problems == [], f"{name}: " + "; ".join(problems)

    n_views = page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
    rendered = page.locator(".cell_output .widget-subarea > .jupyter-widgets").count()
    assert rendered == n_views, f"{n_views} widget views embedded, {rendered} rendered"

    broken = page.evaluate("""() => [...document.querySelectorAll('img')]
        .filter(i => i.offsetParent !== null && !(i.complete && i.naturalWidth > 0))
        .map(i => i.src.slice(0, 80))""")
    assert broken == [], "images that did not load"
    if name.startswith("chapters/"):
        nb = json.loads((ROOT / f"{name}.ipynb").read_text())
        figures = sum("image/png" in o.get("data", {}) for c in nb["cells"]
                      if c["cell_type"] == "code" for o in c["outputs"])
        shown = page.locator(".cell_output img").count()
        assert shown >= figures > 0, f"{figures} figures in the notebook, {shown} on the page"
        print(f"{name}: {n_views} widget views, {shown} images, {log['bytes'] / 1e6:.2f} MB")

    moved = check_sliders_change_the_heatmap(page, name)
    assert moved >= min(1, in_notebook(name, "SliderModel")), f"{name}: no slider was moved"
    assert working_explorers(page) == in_notebook(name, "selfattn-explorer"), (
        f"{name}: an explorer in the notebook shows no picture on the page")
    assert check_diagrams(page, name) == in_notebook(name, "selfattn-diagram")
    page.close()


def open_folds(page):
    """Open every folded part of the page (hidden cells, <details>, dropdowns): a reader may unfold any of
    them, so what the checks below measure includes the evidence the main path folds away."""
    opened = page.evaluate("""() => {
        const closed = [...document.querySelectorAll("main details:not([open])")];
        closed.forEach(d => { d.open = true; });
        // sphinx-togglebutton's dropdown admonitions hide their body with a class instead
        const hidden = [...document.querySelectorAll("main .toggle-hidden")];
        hidden.forEach(e => e.classList.remove("toggle-hidden"));
        return closed.length + hidden.length;
    }""")
    if opened:
        page.wait_for_timeout(200)
    return opened


CJK = r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef]"


def chinese_not_in_the_books_font(page):
    """Every visible element with Chinese text (drawn: wider and taller than a pixel): its CJK
    characters are all drawn with the book's subset of Noto Sans SC (tools/cjk_font.py), asked
    of the browser's layout (DevTools protocol)."""
    count = page.evaluate("""(cjk) => {
        const re = new RegExp(cjk, "g"); let n = 0;
        const walk = document.createTreeWalker(document.querySelector("main"), NodeFilter.SHOW_TEXT);
        while (walk.nextNode()) {
            const el = walk.currentNode.parentElement;
            const found = walk.currentNode.textContent.match(re);
            if (!found || !el || el.offsetParent === null) continue;
            const box = el.getBoundingClientRect();  // not drawn: an SVG <title>, a text for
            if (box.width <= 1 || box.height <= 1) continue;  // screen readers only (1 px)
            if (!el.hasAttribute("data-cjk")) { el.setAttribute("data-cjk", 0); n++; }
            el.setAttribute("data-cjk", +el.getAttribute("data-cjk") + found.length);
        }
        return n;
    }""", CJK)
    if not count:
        return []
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    problems = []
    for node in cdp.send("DOM.querySelectorAll", {"nodeId": root, "selector": "[data-cjk]"})["nodeIds"]:
        attributes = cdp.send("DOM.getAttributes", {"nodeId": node})["attributes"]
        chars = int(dict(zip(attributes[::2], attributes[1::2], strict=True))["data-cjk"])
        fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
        ours = sum(f["glyphCount"] for f in fonts
                   if f["isCustomFont"] and f["familyName"].startswith("Noto Sans SC"))
        if ours < chars:
            problems.append(f"{chars} Chinese characters, {ours} drawn with the book's font "
                            f"({[f['familyName'] for f in fonts]})")
    cdp.detach()
    return problems


def raw_latex(page):
    """LaTeX that reached the page as text (a title with math inside a {doc} link, say)."""
    found = page.evaluate(r"""() => {
        const skip = "pre, code, script, style, .math, mjx-container, .MathJax";
        const walk = document.createTreeWalker(document.querySelector("main"), NodeFilter.SHOW_TEXT);
        const out = [];
        while (walk.nextNode()) {
            const el = walk.currentNode.parentElement;
            if (!el || el.closest(skip) || el.offsetParent === null) continue;
            const m = walk.currentNode.textContent.match(/\\[a-zA-Z]{2,}/);
            if (m) out.push(walk.currentNode.textContent.trim().slice(0, 60));
        }
        return out;
    }""")
    return [f"raw LaTeX on the page: {t!r}" for t in found]


def lines_too_wide(page):
    """Code blocks and printed output whose longest line runs past the block's right edge."""
    wide = page.evaluate(r"""() => [...document.querySelectorAll("main pre")]
        .filter(p => p.offsetParent !== null && p.scrollWidth > p.clientWidth + 1)
        .map(p => [p.scrollWidth - p.clientWidth,
                   p.textContent.split("\n").reduce((a, b) => b.length > a.length ? b : a, "")])""")
    return [f"a line {over} px wider than its block: {line.strip()[:70]!r}" for over, line in wide]


def equations_that_do_not_fit(page, phone):
    """Display equations wider than the box they sit in. In a desktop window none may be (a
    reader should not have to scroll an equation); in a phone window a wide one may scroll, if
    it does so inside its own box (an ancestor with overflow-x auto or scroll, the MathJax
    container itself included) rather than being clipped or widening the page."""
    found = page.evaluate(r"""(phone) => {
        const out = [];
        for (const eq of document.querySelectorAll('main mjx-container[display="true"]')) {
            if (eq.offsetParent === null) continue;
            const math = eq.querySelector("mjx-math");
            const box = eq.parentElement;
            const need = math ? math.getBoundingClientRect().width : eq.scrollWidth;
            const room = box.clientWidth;
            if (need <= room + 1) continue;
            let scrolls = false;
            for (let el = eq; el && el !== document.body; el = el.parentElement) {
                const o = getComputedStyle(el).overflowX;
                if ((o === "auto" || o === "scroll") && el.clientWidth <= room + 1) { scrolls = true; break; }
            }
            if (!phone || !scrolls)
                out.push([Math.round(need - room), scrolls, eq.textContent.slice(0, 50)]);
        }
        return out;
    }""", phone)
    where = "in a 390 px window, clipped" if phone else "wider than its column"
    return [f"a display equation {over} px {where} ({'it scrolls' if scrolls else 'clipped'}): "
            f"{text!r}" for over, scrolls, text in found]


MIN_TEXT_PX = 9.0


def figures_too_small(page, name):
    """Figures whose smallest text, as displayed here, is under MIN_TEXT_PX. A PNG wider than the
    output column is scaled down to it (checked on the page's images); the text sizes and widths
    of every figure a chapter draws were recorded by tests/harness.py in make test's book
    build, explorer pictures included."""
    if not name.startswith("chapters/"):
        return []
    column, images = page.evaluate("""() => {
        const out = [...document.querySelectorAll(".cell_output")].find(e => e.offsetParent !== null);
        const imgs = [...document.querySelectorAll(".cell_output img")]
            .filter(i => i.offsetParent !== null).map(i => [i.naturalWidth, i.clientWidth]);
        return [out ? out.clientWidth : 0, imgs];
    }""")
    problems = [f"an image {natural} px wide is shown {shown} px wide, not {min(natural, column)}"
                for natural, shown in images if abs(shown - min(natural, column)) > 2]
    sources = {"".join(c["source"]) for c in json.loads((ROOT / f"{name}.ipynb").read_text())["cells"]
               if c["cell_type"] == "code"}
    for record in harness_records(name.removeprefix("chapters/")):
        if record["cell"] not in sources:
            continue
        for figure in record["figures"]:
            if figure["min_text_px"] is None:
                continue
            shown = figure["min_text_px"] * min(1.0, column / figure["width"])
            if shown < MIN_TEXT_PX - 0.05:
                first_line = record["cell"].strip().splitlines()[0][:50]
                problems.append(f"a figure {figure['width']} px wide has text of {shown:.1f} px "
                                f"({figure['text']!r}), in the cell starting {first_line!r}")
    return problems


@functools.cache
def harness_records(chapter):
    from test_colab import harness_report

    return harness_report(chapter)


def working_explorers(page):
    """Explorers (the widget box marked ``selfattn-explorer``) showing a loaded picture."""
    return page.evaluate("""() => [...document.querySelectorAll(".selfattn-explorer")]
        .filter(e => [...e.querySelectorAll("img")].some(
            i => i.offsetParent !== null && i.complete && i.naturalWidth > 0)).length""")


def check_diagrams(page, name):
    """Every schematic diagram (drawn with selfattn.book.kit.draw) is shown with its alt text;
    with SELFATTN_SHOTS=1 the page is screenshotted again in the dark theme, where the diagrams
    keep their white card. Returns how many there are."""
    alts = page.evaluate("""() => [...document.querySelectorAll("img.selfattn-diagram")]
        .filter(i => i.offsetParent !== null).map(i => i.alt.trim())""")
    assert all(len(alt) > 20 for alt in alts), f"{name}: a diagram without alt text: {alts}"
    if not alts or not PAGE_SHOTS:
        return len(alts)
    page.evaluate("() => document.documentElement.setAttribute('data-theme', 'dark')")
    page.wait_for_timeout(300)
    page.screenshot(path=str(SHOTS / f"{name.replace('/', '_')}_dark.png"), full_page=True)
    return len(alts)


def check_sliders_change_the_heatmap(page, name):
    """In every static explorer with a slider: one step of the slider shows another heatmap.
    Returns how many sliders were moved."""
    moved = 0
    for i in range(page.locator(".widget-subarea").count()):
        view = page.locator(".widget-subarea").nth(i)
        if view.locator(".noUi-handle").count() == 0:
            continue
        view.scroll_into_view_if_needed()
        shown = view.locator("img:visible").first
        before, src_before = shown.screenshot(), shown.get_attribute("src")
        view.locator(".noUi-handle").first.focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_timeout(300)
        shown = view.locator("img:visible").first
        after, src_after = shown.screenshot(), shown.get_attribute("src")
        assert src_after != src_before and after != before, (
            f"{name}: the slider moved but the heatmap did not change")
        view.screenshot(path=str(SHOTS / f"{name.replace('/', '_')}_explorer{i}.png"))
        moved += 1
    return moved


def test_most_chapters_have_an_explorer_some_with_a_slider_and_five_draw_diagrams():
    # what the page tests above hold each page to: every explorer, slider and diagram its
    # notebook has works on the page
    chapters = [n for n in pages() if n.startswith("chapters/")]
    with_explorer = [n for n in chapters if in_notebook(n, "selfattn-explorer")]
    print(f"explorers on {len(with_explorer)} of {len(chapters)} chapters: "
          + ", ".join(n.removeprefix("chapters/")[:2] for n in with_explorer))
    assert len(with_explorer) >= 8
    assert any(in_notebook(n, "SliderModel") for n in chapters), "no static explorer with a slider"
    assert sum(bool(in_notebook(n, "selfattn-diagram")) for n in chapters) >= 5


# ---- every page at both widths and in both themes: axe, width, alt text --------------------------

PHONE = 390
AXE_FAILS = ("critical", "serious")  # axe-core's impacts that fail the test ...
AXE_RULES_THAT_FAIL = ("empty-table-header",)  # ... and a minor rule the book once broke
AXE_COUNTS = ROOT / "_build" / "axe"  # a line per page, width and theme: violations by impact


def open_as_reader(browser, server, name, width):
    """The page in a fresh browser context of ``width``: at the phone width a touch screen, as a
    phone has; no theme stored, as on a first visit (the theme's own default applies)."""
    phone = width <= PHONE
    context = browser.new_context(viewport={"width": width, "height": 900 if not phone else 844},
                                  is_mobile=phone, has_touch=phone)
    page = context.new_page()
    errors = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(server)
               or r.request.url.startswith(("data:", "blob:")) else r.abort())
    settle(page, f"{server}/{name}.html")
    return page, errors


def axe_violations(page, server, rules=None):
    """axe-core's violations on the page as it stands: [(rule, impact, nodes, first targets)];
    every rule, or only ``rules``."""
    if not page.evaluate("() => !!window.axe"):
        page.add_script_tag(url=f"{server}/_static/axe/axe.min.js")
    return page.evaluate("""async (rules) => (await axe.run(document, Object.assign(
            {resultTypes: ["violations"]}, rules ? {runOnly: {type: "rule", values: rules}} : {})))
        .violations.map(v => [v.id, v.impact, v.nodes.length,
                              v.nodes.slice(0, 3).map(n => n.target.join(" "))])""",
        list(rules) if rules else None)


def images_without_alt(page):
    """Images whose alt text is missing, empty or a file path (what a screen reader would read)."""
    return page.evaluate(r"""() => [...document.querySelectorAll("img")]
        .filter(i => i.getAttribute("role") !== "presentation" && i.getAttribute("aria-hidden") !== "true")
        .filter(i => { const alt = (i.getAttribute("alt") || "").trim();
                       return !alt || /\.(png|jpe?g|gif|svg|webp)$/i.test(alt) || alt.includes("_images/"); })
        .map(i => (i.getAttribute("src") || "").slice(0, 60))""")


def figures_not_at_full_size_or_not_linked(page, phone):
    """A chapter's figures (kit: _ext/selfattn_page.py): each links to its own full-size file, and
    on a phone each is shown at the size it was drawn (its box scrolls), so its text is as large
    as on a desktop page, where tests above hold it to 9 px."""
    return page.evaluate("""(phone) => {
        const file = (url) => url.split("/").pop();
        return [...document.querySelectorAll("div.cell_output img:not(.widget-image):not(.selfattn-diagram)")]
            .filter(i => { const link = i.closest("a");
                           return !link || file(link.getAttribute("href")) !== file(i.getAttribute("src"))
                                  || (phone && i.clientWidth < i.naturalWidth - 1); })
            .map(i => `${file(i.getAttribute("src")).slice(0, 16)}: ${i.clientWidth}/${i.naturalWidth}`);
    }""", phone)


def wider_than_the_window(page):
    """How far the page scrolls sideways, and the widest elements that stick out of the window."""
    return page.evaluate("""() => {
        const width = document.documentElement.clientWidth;
        const over = document.documentElement.scrollWidth - width;
        const out = over <= 0 ? [] : [...document.querySelectorAll("main *")]
            .filter(e => e.getBoundingClientRect().right > width + 1 && e.offsetParent !== null)
            .slice(0, 3).map(e => e.tagName + "." + e.className + ": " + (e.textContent || "").slice(0, 40));
        return [over, out];
    }""")


# The rules of axe-core that read colours. A change of theme swaps the page's colours and
# leaves its elements as they are (the live explorers redraw through the same code), so the
# second theme's pass runs these alone; the first runs every rule.
AXE_COLOUR_RULES = ("color-contrast", "link-in-text-block")


def reader_problems(page, server, name, width, dark=True):
    """What a reader at ``width`` would meet on the page as it stands: sideways scrolling,
    images without alt text, figures not linked to their files (or shrunk on a phone), clipped
    equations on a phone, a verdict nobody asked for, and axe-core's critical and serious
    violations in the light theme (every rule) and, at the desktop width, the dark one (its
    colour rules: a theme's colours are the same at every width, and the desktop page shows
    everything the phone page does; ``dark=False`` leaves it out). Leaves the page in the theme
    it found."""
    problems = []
    over, sticking_out = wider_than_the_window(page)
    if over > 0:
        problems.append(f"the page scrolls sideways by {over} px at {width} px: {sticking_out}")
    problems += [f"an image without alt text (or a path for one): {src}"
                 for src in images_without_alt(page)]
    problems += [f"a figure not linked to its file, or shrunk on a phone: {f}"
                 for f in figures_not_at_full_size_or_not_linked(page, width <= PHONE)]
    if width <= PHONE:  # a wide equation scrolls in its own box, never clipped
        problems += equations_that_do_not_fit(page, phone=True)
    if "Not yet" in page.locator("main").inner_text():
        problems.append("a verdict (Not yet ...) on the page before any answer")
    before = page.evaluate("() => [document.documentElement.dataset.theme || '',"
                           " document.documentElement.dataset.mode || '']")
    set_theme = ("([t, m]) => { const html = document.documentElement;"
                 " html.dataset.theme = t; html.dataset.mode = m; }")
    phone_shots = width == PHONE and PAGE_SHOTS  # (the desktop test screenshots each page)
    for theme in ("light", "dark") if (width > PHONE and dark) or phone_shots else ("light",):
        if page.evaluate("() => document.documentElement.dataset.theme") != theme:
            page.evaluate(set_theme, [theme, theme])
            page.wait_for_timeout(300)  # the live explorers redraw in the theme's colours
        if phone_shots:
            (SHOTS / "pages").mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "pages" / f"{name.replace('/', '_')}_{theme}.png"),
                            full_page=True)
        if width <= PHONE and theme == "dark":
            continue
        found = axe_violations(page, server, None if theme == "light" else AXE_COLOUR_RULES)
        counts = {impact: sum(n for _, i, n, _ in found if i == impact)
                  for impact in ("critical", "serious", "moderate", "minor")}
        which = "" if theme == "light" else " (colour rules)"
        AXE_COUNTS.mkdir(parents=True, exist_ok=True)
        (AXE_COUNTS / f"{name.replace('/', '_')}-{width}-{theme}.txt").write_text(
            f"{name} {width} {theme}{which}: "
            + " ".join(f"{k} {v}" for k, v in counts.items()) + "\n")
        problems += [f"axe {theme}: {rule} ({impact}, {n} nodes: {targets})"
                     for rule, impact, n, targets in found
                     if impact in AXE_FAILS or rule in AXE_RULES_THAT_FAIL]
    if page.evaluate("() => [document.documentElement.dataset.theme || '',"
                     " document.documentElement.dataset.mode || '']") != before:
        page.evaluate(set_theme, before)
        page.wait_for_timeout(300)
    return problems


@pytest.mark.parametrize("name", pages())
def test_every_page_on_a_phone_passes_axe_fits_and_names_its_images(browser, server, name):
    """The phone half of the reader's checks (the desktop half runs in the first test above,
    on the page it has already opened)."""
    page, errors = open_as_reader(browser, server, name, PHONE)
    problems = reader_problems(page, server, name, PHONE)
    page.context.close()
    assert errors == [], "JavaScript errors in the console"
    assert problems == [], f"{name} at {PHONE} px: " + "; ".join(problems)


def tab_to(page, selector, limit=600):
    """Press Tab until the element matching ``selector`` has the focus, as a keyboard user would
    get there; fails after ``limit`` presses."""
    for _ in range(limit):
        if page.evaluate("(s) => document.activeElement && document.activeElement.matches(s)", selector):
            return
        page.keyboard.press("Tab")
    raise AssertionError(f"{limit} presses of Tab never reached {selector}")


def test_a_live_explorer_works_from_the_keyboard_alone(browser, server):
    page, errors = open_as_reader(browser, server, "chapters/02_self_attention", 1280)
    root = page.locator("div.selfattn-live").first
    text_box = root.locator("input.selfattn-live-text")
    tab_to(page, "div.selfattn-live input.selfattn-live-text")
    assert text_box.evaluate("e => e.labels[0].textContent") == "sentence"
    page.keyboard.press("Control+A")
    page.keyboard.type("I saw a saw.")  # the full stop is left out, and the caption says so
    caption = root.locator(".selfattn-live-caption")
    assert caption.inner_text().startswith("mean row entropy") and "“.”" in caption.inner_text()
    assert text_box.get_attribute("aria-invalid") == "false"
    status = root.locator('[role="status"][aria-live="polite"]')
    page.wait_for_function("([s, c]) => s.textContent === c.textContent",  # said after a pause
                           arg=[status.element_handle(), caption.element_handle()], timeout=5000)
    canvas = root.locator("canvas")
    assert canvas.get_attribute("aria-label").endswith("i saw a saw")

    page.keyboard.type(" zebra")
    message = root.locator(".selfattn-live-message")
    assert "“zebra”" in message.inner_text() and text_box.get_attribute("aria-invalid") == "true"
    described = text_box.get_attribute("aria-describedby").split()
    assert message.get_attribute("id") in described and not canvas.is_visible()

    before = canvas.evaluate("c => c.getAttribute('aria-label')")
    page.keyboard.press("Tab")  # the temperature menu: the arrow keys pick another value
    assert page.evaluate("document.activeElement.tagName") == "SELECT"
    page.keyboard.press("ArrowDown")
    while page.evaluate("document.activeElement.tagName") != "BUTTON":
        page.keyboard.press("Tab")  # on to the first example sentence
    example = page.evaluate("document.activeElement.textContent")
    page.keyboard.press("Enter")
    assert text_box.input_value() == example and canvas.is_visible()
    assert canvas.get_attribute("aria-label") != before
    root.screenshot(path=str(SHOTS / "live-keyboard.png"))
    page.context.close()
    assert errors == []
