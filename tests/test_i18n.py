"""The Chinese edition (tools/i18n.py): its catalogs, its scripts' words and its built pages.

* The catalogs (locale/zh_CN/LC_MESSAGES/<page>.po) hold exactly the prose the pages hold now:
  a prose change without `tools/i18n.py update` fails here, naming the command.
* The pages listed in locale/zh_CN/translated.txt are translated in full: no message of theirs
  is untranslated or fuzzy; and no translation types a number its English does not have.
* The words the page's scripts write (assets/messages.js) have a Chinese message for every
  English one, with the same {placeholders}, and every key the scripts use exists.
* Built (``built_book``): every page has its Chinese twin under _build/html/zh/, with
  ``lang="zh-CN"`` and the Chinese title, each linking to the other, and the page's font draws
  every Chinese character the Chinese pages hold.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from urllib.parse import urljoin, urlparse

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("i18n", ROOT / "tools" / "i18n.py")
assert _spec is not None and _spec.loader is not None
i18n = importlib.util.module_from_spec(_spec)
sys.modules["i18n"] = i18n
_spec.loader.exec_module(i18n)

UPDATE = ".venv/bin/python tools/i18n.py update"
MESSAGES_JS = ROOT / "assets" / "messages.js"
SCRIPTS = [ROOT / "assets" / "selfcheck.js", ROOT / "assets" / "live" / "live.js"]
HTML = ROOT / "_build" / "html"
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


def pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"], *(c["file"] for part in toc["parts"] for c in part["chapters"])]


def test_the_catalogs_hold_the_pages_prose_as_it_is_now(tmp_path):
    pots = i18n.extract(tmp_path)
    catalogs = {str(p.relative_to(i18n.CATALOGS).with_suffix("")): p
                for p in i18n.CATALOGS.rglob("*.po")}
    assert set(pots) == set(pages()), "every page of _toc.yml has its messages"
    assert set(catalogs) == set(pots), (
        f"the catalogs are not the pages' ({sorted(set(catalogs) ^ set(pots))}): run {UPDATE}")
    stale = {}
    for page, pot in pots.items():
        new, old = i18n.active(i18n.read(pot)), i18n.active(i18n.read(catalogs[page]))
        if new != old:
            stale[page] = sorted(new - old)[:2] + sorted(old - new)[:2]
    assert not stale, (f"the prose of {sorted(stale)} changed since its catalog was updated: run "
                       f"{UPDATE}, then translate what it marks (first changes: {stale})")


def test_the_translated_pages_have_every_message_translated_and_none_fuzzy():
    listed = i18n.translated()
    assert len(listed) == len(set(listed))
    for page in listed:
        path = i18n.CATALOGS / f"{page}.po"
        assert path.exists(), f"translated.txt lists {page}, which has no catalog"
        todo = [m.id for m in i18n.read(path) if m.id and (not m.string or m.fuzzy)]
        assert not todo, (f"{page} is listed as translated, and {len(todo)} of its messages are "
                          f"untranslated or fuzzy, the first: {todo[0]!r}")


def test_a_translation_types_no_number_its_english_does_not_have():
    """The prose rule (tests/test_prose.py) carried into the Chinese edition: the English passes
    it, so a translation whose numbers all stand in its English passes too. A number the English
    writes as a word (twenty) is written as a word (二十)."""
    added = {}
    for path in sorted(i18n.CATALOGS.rglob("*.po")):
        for m in i18n.read(path):
            if m.id and m.string:
                extra = set(re.findall(r"\d+", m.string)) - set(re.findall(r"\d+", m.id))
                if extra:
                    added[f"{path.stem}: {m.id[:60]}"] = sorted(extra)
    assert not added, f"numbers in a translation and not in its English: {added}"


def test_an_update_keeps_translations_and_marks_a_changed_message_fuzzy():
    from babel.messages.catalog import Catalog

    old = Catalog(locale="zh_CN")
    old.add("The query and the key.", "查询和键。")
    old.add("A paragraph that is gone.", "一个已删去的段落。")
    old.add("Scaled dot-product attention divides by the square root of d.", "缩放点积注意力……")
    template = Catalog()
    template.add("The query and the key.")
    template.add("Scaled dot-product attention divides by the square root of d_k.")
    template.add("A new paragraph.")
    merged = i18n.merged(template, old)
    assert merged["The query and the key."].string == "查询和键。"
    assert not merged["The query and the key."].fuzzy
    changed = merged["Scaled dot-product attention divides by the square root of d_k."]
    assert changed.fuzzy and changed.string == "缩放点积注意力……"
    assert not merged["A new paragraph."].string
    assert "A paragraph that is gone." in merged.obsolete
    assert not merged.fuzzy  # the header: a fuzzy header would hide every translation


def node_eval(expression: str):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH: the page scripts' messages are not checked")
    script = (f'const vm = require("vm"), fs = require("fs"); const c = vm.createContext({{}});'
              f'vm.runInContext(fs.readFileSync({json.dumps(str(MESSAGES_JS))}, "utf8"), c);'
              f"process.stdout.write(JSON.stringify(vm.runInContext({json.dumps(expression)}, c)));")
    done = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_message_the_scripts_write_has_a_chinese_version_with_the_same_placeholders():
    tables = node_eval("selfattnMessages.MESSAGES")
    english, chinese = tables["en"], tables["zh-CN"]
    assert set(chinese) == set(english), (
        f"messages without a Chinese version: {sorted(set(english) - set(chinese))}; "
        f"Chinese without English: {sorted(set(chinese) - set(english))}")
    for key, text in english.items():
        names = set(re.findall(r"\{(\w+)\}", text))
        assert set(re.findall(r"\{(\w+)\}", chinese[key])) == names, key
        assert chinese[key] != text, f"{key}: the Chinese message is the English one"
    used = set()
    for script in SCRIPTS:
        used |= set(re.findall(r"\b(?:t|msg)\(\s*\"([\w.]*\w)\"", script.read_text()))
    dynamic = {f"sc.read.{k}" for k in ("number", "count", "shape", "bytes")}
    dynamic |= {f"sc.placeholder.{k}" for k in ("number", "count", "shape", "bytes")}
    assert len(used) > 40
    assert used | dynamic <= set(english), f"keys with no message: {sorted(used - set(english))}"


def test_the_page_language_picks_the_table_and_english_is_the_default():
    got = node_eval("""[selfattnMessages.t("sc.not_yet", {what: "x"}), selfattnMessages.lang(),
        (globalThis.document = {documentElement: {lang: "zh-CN"}},
         selfattnMessages.t("sc.not_yet", {what: "x"})),
        (globalThis.document = {documentElement: {lang: "fr"}}, selfattnMessages.lang())]""")
    assert got == ["\u2717 Not yet: x", "en", "\u2717 还不对：x", "en"]


# ---- the built book ----------------------------------------------------------------------------


class Links(HTMLParser):
    """The language switch's link, the html element's lang and the page's visible text."""

    def __init__(self) -> None:
        super().__init__()
        self.lang, self.switch, self.text, self.title = None, [], [], ""
        self._skip = 0
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "html":
            self.lang = a.get("lang")
        if tag == "a" and "selfattn-lang-switch" in (a.get("class") or ""):
            self.switch.append(a)
        if tag in ("script", "style"):
            self._skip += 1
        self._in_title = tag == "title"

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1
        self._in_title = False

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        if not self._skip:
            self.text.append(data)


def parse(path: pathlib.Path) -> Links:
    links = Links()
    links.feed(path.read_text(encoding="utf-8"))
    return links


def target(page: pathlib.Path, href: str) -> pathlib.Path:
    return pathlib.Path(urlparse(urljoin(page.as_uri(), href)).path)


@pytest.mark.built_book
def test_every_page_has_its_chinese_twin_and_each_links_to_the_other():
    if not (HTML / "zh" / "index.html").exists():
        pytest.fail("no Chinese edition: `make book` builds it into _build/html/zh/")
    zh_title = yaml.safe_load((ROOT / "_config_zh.yml").read_text())["title"]
    for page in [*pages(), "genindex", "search"]:
        english, chinese = HTML / f"{page}.html", HTML / "zh" / f"{page}.html"
        assert chinese.exists(), f"{page} has no Chinese page"
        en, zh = parse(english), parse(chinese)
        assert en.lang == "en" and zh.lang == "zh-CN", page
        assert zh_title in zh.title, f"{page}: the Chinese page's title is {zh.title!r}"
        assert len(en.switch) == 1 and len(zh.switch) == 1, f"{page}: one switch link a page"
        assert target(english, en.switch[0]["href"]) == chinese, page
        assert target(chinese, zh.switch[0]["href"]) == english, page
        assert en.switch[0]["hreflang"] == "zh-CN" and zh.switch[0]["hreflang"] == "en"


@pytest.mark.built_book
def test_the_page_font_draws_every_chinese_character_of_the_chinese_pages():
    from fontTools.ttLib import TTFont

    font = HTML / "zh" / "_static" / "fonts" / "book-cjk.woff2"
    if not font.exists():
        pytest.fail("no Chinese edition with its font: `make book` builds both")
    covered = {chr(c) for c in TTFont(font).getBestCmap()}
    missing: dict[str, str] = {}
    for page in pages():
        text = "".join(parse(HTML / "zh" / f"{page}.html").text)
        lacking = set(CJK.findall(text)) - covered
        if lacking:
            missing[page] = "".join(sorted(lacking))
    assert not missing, f"characters the page font lacks (tools/cjk_font.py reads them?): {missing}"
