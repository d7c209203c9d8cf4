"""The Chinese edition (_build/html/zh/, tools/i18n.py) in a browser: tests/test_browser.py's
server, browser and checks, on what the Chinese pages change.

Its pages hold the English pages' code, outputs, figures and explorers (one execution), which
tests/test_browser.py checks; what differs is the prose, the page's language and the words the
scripts write (assets/messages.js). So every Chinese page is opened once, at 1280 px: no
JavaScript error, no request off the machine, axe-core's critical and serious violations at 0
(every rule, light theme: the themes' colours are the English pages', checked there in both),
no image without alt text, every Chinese character drawn in the book's font (every fold open),
and, narrowed to 390 px, no sideways scroll. The language switch is used from the keyboard on
two pages and lands on the same page in English (tests/test_i18n.py checks every page's links
both ways without a browser). On one chapter every self-check answers right and wrong answers
typed in full-width characters, in Chinese; one live explorer says what it computed, and what
it cannot read, in Chinese.
"""

import json

import pytest
import test_browser
from test_browser import (
    HTML,
    chinese_not_in_the_books_font,
    open_folds,
    open_page,
    pages,
    reader_problems,
    tab_to,
    wider_than_the_window,
)
from test_i18n import node_eval
from test_selfcheck_browser import WITH_CHECKS, full_width, typed, wrong

pytestmark = pytest.mark.built_book
server = test_browser.server  # its fixtures: the built book served on 127.0.0.1, headless Chromium
browser = test_browser.browser
ZH = "zh"


def chinese():
    """The Chinese edition's messages for the scripts (assets/messages.js)."""
    return node_eval('selfattnMessages.MESSAGES["zh-CN"]')


def switch_to_english(page, server, name):
    """Tab to the language switch, press Enter: the same page in English."""
    tab_to(page, "a.selfattn-lang-switch", limit=80)
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert page.url.split("#")[0] == f"{server}/{name}.html", page.url
    assert page.evaluate("document.documentElement.lang") == "en"


@pytest.mark.parametrize("name", pages())
def test_every_chinese_page_renders_offline_in_its_font_and_fits(browser, server, name):
    assert (HTML / ZH / f"{name}.html").exists(), "no Chinese edition: make book builds it"
    page, log = open_page(browser, server, f"{ZH}/{name}")
    assert page.evaluate("document.documentElement.lang") == "zh-CN"
    assert log["offhost"] == [], "requests left 127.0.0.1"
    assert log["errors"] == [], "JavaScript errors in the console"
    problems = reader_problems(page, server, f"{ZH}/{name}", 1280, dark=False)
    open_folds(page)
    problems += chinese_not_in_the_books_font(page)
    page.set_viewport_size({"width": test_browser.PHONE, "height": 844})
    page.wait_for_timeout(100)
    over, sticking_out = wider_than_the_window(page)
    if over > 0:
        problems.append(f"the page scrolls sideways by {over} px at 390 px: {sticking_out}")
    assert problems == [], f"{ZH}/{name}: " + "; ".join(problems)
    if name in (pages()[0], "chapters/02_self_attention"):
        page.set_viewport_size({"width": 1280, "height": 1000})
        switch_to_english(page, server, name)
    page.close()


def test_a_chinese_self_check_reads_full_width_input_and_answers_in_chinese(browser, server):
    zh = chinese()
    right, not_yet = zh["sc.right"], zh["sc.not_yet"].split("{")[0]
    page, log = open_page(browser, server, f"{ZH}/{WITH_CHECKS[0]}")
    boxes = page.locator(".selfattn-selfcheck")
    assert boxes.count() > 0
    assert boxes.first.locator("button").inner_text() == zh["sc.check"]
    for i in range(boxes.count()):
        box = boxes.nth(i)
        kind, expected = box.get_attribute("data-kind"), json.loads(box.get_attribute("data-expected"))
        status = box.locator('[role="status"]')
        box.locator("input").fill(full_width(wrong(kind, expected)[0]))
        box.locator("button").click()
        assert status.get_attribute("data-state") == "wrong", status.inner_text()
        assert status.inner_text().startswith(not_yet), status.inner_text()
        box.locator("input").fill(full_width(typed(kind, expected)))
        box.locator("input").press("Enter")
        assert status.get_attribute("data-state") == "right", status.inner_text()
        assert status.inner_text() == right
    assert log["errors"] == []
    page.close()


def test_a_chinese_live_explorer_says_what_it_computed_and_what_it_cannot_read(browser, server):
    zh = chinese()
    page, log = open_page(browser, server, f"{ZH}/chapters/02_self_attention")
    root = page.locator("div.selfattn-live").first
    text_box = root.locator("input.selfattn-live-text")
    assert text_box.evaluate("e => e.labels[0].textContent") == zh["live.sentence"]
    text_box.fill("i saw a saw")
    caption = root.locator(".selfattn-live-caption").inner_text()
    assert caption.startswith(zh["live.entropy"].split("{")[0]), caption
    text_box.fill("i saw a zebra")
    message = root.locator(".selfattn-live-message").inner_text()
    before, after = zh["live.unknown_word"].split("{word}")
    assert message.startswith(before) and "zebra" in message, message
    assert after.split("{")[0][:6] in message, message
    assert log["errors"] == []
    page.close()
