"""The self-checks in the built book, in a browser with no kernel (tests/test_browser.py's
server, browser and page loading).

On every page, every self-check (src/selfattn/book/kit/selfcheck.py, wired by assets/selfcheck.js):
the script has wired it; a wrong answer gets "not yet" and what is off, without the answer; a
unit is refused unless the question is about bytes (data-unit), where the answer typed with
"bytes" is right; an answer at a hint's factor (data-hints) gets that hint; the expected value,
read from its data attribute and typed as a reader would (Enter checks too), and typed in
full-width characters as a Chinese input method types them, gets "right"; no JavaScript error.
One self-check is used with the keyboard alone. Each chapter page has as many self-checks as its notebook has
self-check cells, and the book at least ten. One self-check per page is read in the light and the
dark theme: its text keeps a readable contrast against its background in both, and its colours
follow the theme. One is screenshotted in each theme into _build/screenshots/.
"""

import json
import re

import pytest
import test_browser
from test_browser import HTML, ROOT, SHOTS, open_page, pages

pytestmark = pytest.mark.built_book
server = test_browser.server  # its fixtures: the built book served on 127.0.0.1, headless Chromium
browser = test_browser.browser
FOUND: dict[str, int] = {}  # page -> self-checks on it
SHOT: list[str] = []  # the page whose self-check was screenshotted
MIN_CONTRAST = 4.5  # WCAG AA for body text


FULL_WIDTH = str.maketrans({chr(c): chr(c + 0xFEE0) for c in range(0x21, 0x7F)})


def full_width(text):
    """``text`` as a Chinese input method types it: every ASCII character in its full-width
    form (１，０２４, （１２， ５， ７）), the space an ideographic space."""
    return text.translate(FULL_WIDTH).replace(" ", "\u3000")


def typed(kind, expected):
    """The expected value, typed as a reader would."""
    if kind == "shape":
        return "(" + ", ".join(str(n) for n in expected) + ")"
    if kind == "count":
        return f"{expected:,}"
    return repr(expected)


def wrong(kind, expected):
    """A wrong answer, and what the verdict should say about it."""
    if kind == "shape":
        return "(" + ", ".join(str(n + (i == 0)) for i, n in enumerate(expected)) + ")", "shape[0]"
    if kind == "count":  # far from the answer: near it (within 1 %) the verdict says "close"
        return str(expected * 2 + 1), "too high"
    return repr(expected * 2 + 1 if expected >= 0 else expected * 2 - 1), (
        "too high" if expected >= 0 else "too low")


def verdict(box, text):
    """Type ``text`` into the self-check and click Check: its state and message."""
    box.locator("input").fill(text)
    box.locator("button").click()
    status = box.locator('[role="status"]')
    return status.get_attribute("data-state"), status.inner_text()


# The contrast of each part's text against the colour behind it (the first ancestor with an
# opaque background), by the WCAG formula; and the box's own background and text colours.
CONTRAST = r"""(box) => {
    function rgba(text) {
        const srgb = text.startsWith("color(srgb");
        const v = (text.match(/[\d.]+/g) || []).map(Number);
        const rgb = v.slice(0, 3).map(x => srgb ? x * 255 : x);
        return rgb.concat([v.length > 3 ? v[3] : 1]);
    }
    function behind(el) {
        for (; el; el = el.parentElement) {
            const c = rgba(getComputedStyle(el).backgroundColor);
            if (c[3] > 0.5) return c;
        }
        return [255, 255, 255, 1];
    }
    function luminance(c) {
        const f = x => { x /= 255; return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4); };
        return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
    }
    function contrast(el) {
        const a = luminance(rgba(getComputedStyle(el).color)), b = luminance(behind(el));
        return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    }
    const parts = {
        question: box.querySelector(".selfattn-selfcheck-question"),
        input: box.querySelector("input"),
        button: box.querySelector("button"),
        verdict: box.querySelector('[role="status"]'),
    };
    const out = {background: getComputedStyle(box).backgroundColor, color: getComputedStyle(box).color};
    for (const [name, el] of Object.entries(parts)) out[name] = contrast(el);
    return out;
}"""


def legibility(box, theme):
    box.page.evaluate("(t) => { document.documentElement.dataset.theme = t; }", theme)
    box.page.wait_for_timeout(300)
    seen = box.evaluate(CONTRAST)
    low = {part: round(c, 2) for part, c in seen.items()
           if part not in ("background", "color") and c < MIN_CONTRAST}
    assert low == {}, f"{theme} theme: contrast under {MIN_CONTRAST}"
    return seen


def self_check_cells(name):
    """How many self-check cells the page's notebook holds (0 for a Markdown page)."""
    path = ROOT / f"{name}.ipynb"
    if not path.exists():
        return 0
    nb = json.loads(path.read_text(encoding="utf-8"))
    return sum(c["cell_type"] == "code" and bool(re.search(r"^self_check\(", "".join(c["source"]), re.M))
               for c in nb["cells"])


WITH_CHECKS = [n for n in pages() if self_check_cells(n)]  # only these pages are opened


@pytest.mark.parametrize("name", WITH_CHECKS)
def test_every_self_check_gives_its_verdict_in_the_page(browser, server, name):
    page, log = open_page(browser, server, name)
    boxes = page.locator(".selfattn-selfcheck")
    FOUND[name] = boxes.count()
    cells = self_check_cells(name)
    assert FOUND[name] == cells, f"{cells} self-check cells in the notebook, {FOUND[name]} on the page"
    for i in range(FOUND[name]):
        box = boxes.nth(i)
        box.scroll_into_view_if_needed()
        assert box.get_attribute("data-ready") == "true", "selfcheck.js did not wire this self-check"
        kind, expected = box.get_attribute("data-kind"), json.loads(box.get_attribute("data-expected"))
        field, button, status = box.locator("input"), box.locator("button"), box.locator('[role="status"]')
        assert button.is_enabled()

        answer, hint = wrong(kind, expected)
        field.fill(answer)
        button.click()
        message = status.inner_text()
        assert status.get_attribute("data-state") == "wrong", f"{answer!r}: {message!r}"
        assert "Not yet" in message and hint in message, f"{answer!r}: {message!r}"
        assert typed(kind, expected) not in message and str(expected) not in message, message

        unit = box.get_attribute("data-unit")
        if kind != "shape":
            state, message = verdict(box, "3 KiB")
            if unit == "bytes":
                assert state in ("right", "wrong"), f"3 KiB for a question about bytes: {message!r}"
                assert verdict(box, f"{typed(kind, expected)} bytes")[0] == "right"
            else:
                assert unit is None
                assert state == "unreadable" and "not bytes" in message, f"3 KiB: {message!r}"
        for factor, hint in json.loads(box.get_attribute("data-hints") or "[]"):
            at = factor * expected
            state, message = verdict(box, f"{int(at)}" if kind == "count" else repr(at))
            assert state == "wrong" and hint in message, f"{factor} x the answer: {message!r}"

        state, message = verdict(box, full_width(typed(kind, expected)))
        assert state == "right", f"{full_width(typed(kind, expected))!r}: {message!r}"

        field.fill(typed(kind, expected))
        field.press("Enter")
        message = status.inner_text()
        assert status.get_attribute("data-state") == "right", f"{typed(kind, expected)!r}: {message!r}"
        assert "Right" in message

    if FOUND[name]:
        box = boxes.first
        light = legibility(box, "light")
        if not SHOT:
            SHOTS.mkdir(parents=True, exist_ok=True)
            box.screenshot(path=str(SHOTS / "selfcheck_light.png"))
        dark = legibility(box, "dark")
        assert (dark["background"], dark["color"]) != (light["background"], light["color"]), (
            "the self-check keeps its light colours in the dark theme")
        if not SHOT:
            box.screenshot(path=str(SHOTS / "selfcheck_dark.png"))
            SHOT.append(name)

    assert log["errors"] == [], "JavaScript errors in the console"
    page.close()


def test_a_self_check_works_from_the_keyboard_alone(browser, server):
    """Tab reaches the first self-check's box; typing and Enter give a verdict, which the box is
    described by; Tab moves to Check, and Space on it checks again."""
    from test_browser import open_as_reader, tab_to

    page, errors = open_as_reader(browser, server, WITH_CHECKS[0], 1280)
    box = page.locator(".selfattn-selfcheck").first
    tab_to(page, ".selfattn-selfcheck input")
    kind, expected = box.get_attribute("data-kind"), json.loads(box.get_attribute("data-expected"))
    answer, hint = wrong(kind, expected)
    page.keyboard.type(answer)
    page.keyboard.press("Enter")
    status = box.locator('[role="status"]')
    assert status.get_attribute("data-state") == "wrong" and hint in status.inner_text()
    field = box.locator("input")
    assert field.get_attribute("aria-invalid") == "true"
    assert field.get_attribute("aria-describedby") == status.get_attribute("id")
    page.keyboard.press("Control+A")
    page.keyboard.type(full_width(typed(kind, expected)))
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Check"
    page.keyboard.press("Space")
    assert status.get_attribute("data-state") == "right", status.inner_text()
    box.screenshot(path=str(SHOTS / "selfcheck-keyboard.png"))
    page.context.close()
    assert errors == []


def test_the_book_has_at_least_ten_self_checks_and_each_page_as_many_as_its_notebook():
    """Read from the built pages and the notebooks, whichever tests ran before."""
    in_pages = {n: (HTML / f"{n}.html").read_text(encoding="utf-8").count('class="selfattn-selfcheck"')
                for n in pages()}
    assert in_pages == {n: self_check_cells(n) for n in pages()}
    print("self-checks per page:", {n: k for n, k in in_pages.items() if k})
    assert sum(in_pages.values()) >= 10
