"""The built book in a real browser: headless Chromium, no kernel, no network.

For every page of the book, in a 1280 px wide window: no JavaScript errors, no request leaving
127.0.0.1, every embedded widget view rendered, every figure loaded, the Chinese terms drawn with
the book's own font (the machines that run this have no CJK font), no raw LaTeX outside the math,
no code or printed line wider than its block, no display equation wider than its column (and, in a
390 px phone window, none clipped: a wide one scrolls inside its own box), and no figure whose
smallest text is under 9 px as displayed (from the sizes tests/harness.py recorded while the
chapters ran). For the static explorers: moving a slider changes the heatmap on screen, and at
least eight of the chapters have an explorer that renders a picture. Every schematic diagram
has its alt text and is screenshotted in the dark theme too. Screenshots go to _build/screenshots/
(the run's summary names the folder). `make test` builds the book first.
"""

import functools
import http.server
import importlib.util
import json
import pathlib
import threading

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.built_book
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
_spec = importlib.util.spec_from_file_location("find_browser", ROOT / "tools" / "find_browser.py")
find_browser = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(find_browser)
# Logged by the stock Jupyter Book 1.x theme on every page, widgets or not:
# sphinx-thebe declares its URL constant twice; the theme finds no saved light/dark choice.
KNOWN_THEME_MESSAGES = {
    "Identifier 'THEBE_JS_URL' has already been declared",
    "Got invalid theme mode: . Resetting to auto.",
}


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
    page.goto(f"{server}/{name}.html", wait_until="networkidle")
    page.wait_for_timeout(500)  # let the widget manager finish rendering
    page.evaluate("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
    return page, log


# Bytes each page transfers as it loads (the server's Content-Length of every response, cached
# files counted once per page): written to _build/page-weights.txt, which make test prints.
# Chapter 10's model is fetched only when a reader asks (tests/test_live_browser.py).
WEIGHTS: dict[str, int] = {}


@pytest.mark.parametrize("name", pages())
def test_page_renders_offline_without_errors(browser, server, name):
    page, log = open_page(browser, server, name)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name.replace('/', '_')}.png"), full_page=True)
    WEIGHTS[name] = log["bytes"]
    if len(WEIGHTS) == len(pages()):  # the last page: the table, for make test's summary
        (SHOTS.parent / "page-weights.txt").write_text("".join(
            f"{n:40s} {b / 1e6:6.2f} MB\n" for n, b in WEIGHTS.items()))

    assert log["offhost"] == [], "requests left 127.0.0.1"
    errors = [e for e in log["errors"] if e not in KNOWN_THEME_MESSAGES]
    assert errors == [], "JavaScript errors in the console"
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

    check_sliders_change_the_heatmap(page, name)
    EXPLORERS[name] = working_explorers(page)
    check_diagrams(page, name)
    page.close()


CJK = r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef]"


def chinese_not_in_the_books_font(page):
    """Every visible element with Chinese text: its CJK characters are all drawn with the book's
    subset of Noto Sans SC (tools/cjk_font.py), asked of the browser's layout (DevTools protocol)."""
    count = page.evaluate("""(cjk) => {
        const re = new RegExp(cjk, "g"); let n = 0;
        const walk = document.createTreeWalker(document.querySelector("main"), NodeFilter.SHOW_TEXT);
        while (walk.nextNode()) {
            const el = walk.currentNode.parentElement;
            const found = walk.currentNode.textContent.match(re);
            if (!found || !el || el.offsetParent === null) continue;
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


@pytest.mark.parametrize("name", [n for n in pages() if n.startswith("chapters/")])
def test_no_equation_is_clipped_on_a_phone(browser, server, name):
    page, _ = open_page(browser, server, name, width=390)
    problems = equations_that_do_not_fit(page, phone=True)
    page.close()
    assert problems == [], f"{name}: " + "; ".join(problems)


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


SLIDERS_MOVED: list[str] = []
EXPLORERS: dict[str, int] = {}  # page -> explorers that render a picture
DIAGRAMS: dict[str, int] = {}  # page -> schematic diagrams, each with alt text


def working_explorers(page):
    """Explorers (the widget box marked ``selfattn-explorer``) showing a loaded picture."""
    return page.evaluate("""() => [...document.querySelectorAll(".selfattn-explorer")]
        .filter(e => [...e.querySelectorAll("img")].some(
            i => i.offsetParent !== null && i.complete && i.naturalWidth > 0)).length""")


def check_diagrams(page, name):
    """Every schematic diagram (drawn with selfattn.book.kit.draw) is shown with its alt text; the
    page is screenshotted again in the dark theme, where the diagrams keep their white card."""
    alts = page.evaluate("""() => [...document.querySelectorAll("img.selfattn-diagram")]
        .filter(i => i.offsetParent !== null).map(i => i.alt.trim())""")
    assert all(len(alt) > 20 for alt in alts), f"{name}: a diagram without alt text: {alts}"
    if not alts:
        return
    DIAGRAMS[name] = len(alts)
    page.evaluate("() => document.documentElement.setAttribute('data-theme', 'dark')")
    page.wait_for_timeout(300)
    page.screenshot(path=str(SHOTS / f"{name.replace('/', '_')}_dark.png"), full_page=True)


def check_sliders_change_the_heatmap(page, name):
    """In every static explorer with a slider: one step of the slider shows another heatmap."""
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
        SLIDERS_MOVED.append(name)


def test_some_page_has_a_static_explorer_whose_slider_works():
    # runs after the page tests above (pytest keeps file order): they moved every slider
    assert SLIDERS_MOVED, "no page has a static explorer with a slider"


def test_most_chapters_have_a_working_explorer_and_the_diagrams_are_there():
    # after the page tests above, which counted them
    chapters = sorted(n for n in EXPLORERS if n.startswith("chapters/"))
    with_explorer = [n for n in chapters if EXPLORERS[n]]
    print(f"working explorers on {len(with_explorer)} of {len(chapters)} chapters: "
          + ", ".join(n.removeprefix("chapters/")[:2] for n in with_explorer))
    print("diagrams with alt text:", DIAGRAMS)
    in_toc = [n for n in pages() if n.startswith("chapters/")]
    assert chapters == sorted(in_toc) and len(with_explorer) >= 8  # every chapter visited
    assert len(DIAGRAMS) >= 5  # chapters 2, 5, 6, 7 and 9 draw schematics
