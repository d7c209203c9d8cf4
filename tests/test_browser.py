"""The built book in a real browser: headless Chromium, no kernel, no network.

For every page of the book: no JavaScript errors, no request leaving 127.0.0.1, every embedded
widget view rendered, every figure loaded. For the static explorers: moving a slider changes the
heatmap on screen. Screenshots go to _build/screenshots/ (the run's summary names the folder).
`make test` builds the book first.
"""

import functools
import http.server
import json
import os
import pathlib
import shutil
import threading

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.built_book
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
# Debian's chromium; elsewhere (a GitHub runner's Chrome, say) set CHROMIUM to the browser's path
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# Logged by the stock Jupyter Book 1.x theme on every page, widgets or not (see DESIGN.md):
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

    assert pathlib.Path(CHROMIUM).exists(), "install Debian's chromium (.ci/run does)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()


def open_page(browser, server, name):
    """Load a page with every off-host request blocked and recorded; return page and logs."""
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
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
    page.on("response", lambda r: log.__setitem__("bytes", log["bytes"] + len(r.body() or b""))
            if r.url.startswith(server) and r.status < 300 else None)
    page.goto(f"{server}/{name}.html", wait_until="networkidle")
    page.wait_for_timeout(500)  # let the widget manager finish rendering
    return page, log


@pytest.mark.parametrize("name", pages())
def test_page_renders_offline_without_errors(browser, server, name):
    page, log = open_page(browser, server, name)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name.replace('/', '_')}.png"), full_page=True)

    assert log["offhost"] == [], "requests left 127.0.0.1"
    errors = [e for e in log["errors"] if e not in KNOWN_THEME_MESSAGES]
    assert errors == [], "JavaScript errors in the console"

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
    page.close()


SLIDERS_MOVED: list[str] = []


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
