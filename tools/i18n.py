"""The Chinese edition: its catalogs and its build. `make book` calls `build-zh`.

    .venv/bin/python tools/i18n.py update     # after any prose change: refresh the catalogs
    .venv/bin/python tools/i18n.py status     # per page: translated, fuzzy, untranslated
    .venv/bin/python tools/i18n.py extract D  # the .pot templates only, into D
    .venv/bin/python tools/i18n.py build-zh   # the Chinese pages, into _build/html/zh/

The prose of every page (each markdown paragraph, heading, list item and table cell of the
chapters, the intro, the glossary and the references) is one gettext message. Sphinx's gettext
builder extracts them, with the notebooks not executed, one .pot per page; `update` merges each
into `locale/zh_CN/LC_MESSAGES/<page>.po` the way msgmerge does: a translation is kept while its
English is unchanged, carried over marked fuzzy when the English changed a little (a translator
checks it and removes the flag), and kept as obsolete (`#~`) when its paragraph is gone. Code
cells and their outputs are not messages: both editions run the same code.

`build-zh` renders the book again with `language: zh_CN` (`_config.yml` with `_config_zh.yml`'s
settings on top) and puts it under `_build/html/zh/`, beside the English pages, so one site holds
both editions and each page links to itself in the other (`_ext/selfattn_page.py`). It reads the
notebooks' outputs from the English build's execution cache (`_build/.jupyter_cache`, filled by
tools/execute_book.py); the code cells are identical, so no chapter runs a second time: a
chapter missing from that cache stops the build, saying to run `make executed` first.
"""

from __future__ import annotations

import argparse
import copy
import io
import pathlib
import shutil
import sys
import tempfile
from typing import Any

import yaml
from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po

ROOT = pathlib.Path(__file__).resolve().parent.parent
LOCALE = ROOT / "locale"
LANG = "zh_CN"
CATALOGS = LOCALE / LANG / "LC_MESSAGES"
BUILD = ROOT / "_build"
CACHE = BUILD / ".jupyter_cache"  # tools/execute_book.py fills it; both editions read it
HTML = BUILD / "html"
ZH_OUT = HTML / "zh"
ZH_WORK = BUILD / "zh"  # the Chinese build's doctrees and html, before it joins the site


def book_config(zh: bool) -> dict[str, Any]:
    """_config.yml, with _config_zh.yml's settings merged on top for the Chinese edition."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    if zh:
        merge(config, yaml.safe_load((ROOT / "_config_zh.yml").read_text()))
    extensions = config["sphinx"]["local_extensions"]  # relative to the config file: made
    for name, path in extensions.items():  # absolute, as the merged file is written elsewhere
        extensions[name] = str(ROOT / path)
    return config


def merge(base: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def sphinx_build(config: dict[str, Any], builder: str, out: pathlib.Path,
                 doctrees: pathlib.Path, overrides: dict[str, Any] | None = None,
                 jobs: int = 1, strict: bool = False,
                 config_dir: pathlib.Path = BUILD) -> int:
    """Build the book with jupyter-book's own Sphinx set-up (what `jupyter-book build` runs),
    from ``config`` (written to a file in ``config_dir`` for the build)."""
    from jupyter_book.sphinx import build_sphinx

    config_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".yml", dir=config_dir, delete=False) as f:
        # in the config's own order: the widget scripts load in it (require.js first; sorted,
        # embed-amd.js came first and found no `define`, and no widget rendered)
        yaml.safe_dump(config, f, allow_unicode=True, sort_keys=False)
        path_config = pathlib.Path(f.name)
    try:
        result = build_sphinx(
            ROOT, out, noconfig=True, path_config=str(path_config), doctreedir=doctrees,
            confoverrides={"external_toc_path": str(ROOT / "_toc.yml"),
                           "latex_individualpages": False, **(overrides or {})},
            builder=builder, warningiserror=strict, keep_going=strict, jobs=jobs, quiet=True)
    finally:
        path_config.unlink()
    return result if isinstance(result, int) else 1


def extract(out: pathlib.Path) -> dict[str, pathlib.Path]:
    """Write one .pot per page into ``out``; return them by page name (``chapters/01_...``)."""
    config = book_config(zh=False)
    config["execute"]["execute_notebooks"] = "off"  # the prose only: nothing runs
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as doctrees:
        status = sphinx_build(config, "gettext", out, pathlib.Path(doctrees),
                              {"gettext_compact": False, "gettext_location": False,
                               "gettext_uuid": False}, config_dir=out)
    if status:
        sys.exit(f"the gettext build failed ({status})")
    pots = {str(p.relative_to(out).with_suffix("")): p for p in sorted(out.rglob("*.pot"))}
    pots.pop("sphinx", None)  # the theme's template strings: the theme translates its own
    return pots


def read(path: pathlib.Path) -> Catalog:
    with path.open("rb") as f:
        return read_po(f, locale=LANG if path.suffix == ".po" else None)


HEADER = """\
# The Chinese edition of the page {page}: one message per
# paragraph, heading, list item or table cell, in the page's order.
# Translate each msgstr. A message marked fuzzy kept its old
# translation after its English changed: check it, remove the flag.
# After changing any page's prose, run
#     .venv/bin/python tools/i18n.py update
#"""


def write(catalog: Catalog, path: pathlib.Path) -> None:
    """Write a catalog; left as it is when only its creation date would change."""
    page = str(path.relative_to(CATALOGS).with_suffix(""))
    catalog.project, catalog.version = "selfattn-book", "1"
    catalog.copyright_holder = "The selfattn authors"
    catalog.msgid_bugs_address = ""
    catalog.last_translator = "The selfattn authors"
    catalog.header_comment = HEADER.format(page=page)
    buffer = io.BytesIO()
    write_po(buffer, catalog, width=79, no_location=True, omit_header=False,
             sort_output=False, include_previous=True)
    text = buffer.getvalue()
    if path.exists() and undated(path.read_bytes()) == undated(text):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text)


def undated(po: bytes) -> bytes:
    return b"\n".join(line for line in po.split(b"\n")
                      if not line.startswith((b'"POT-Creation-Date', b'"PO-Revision-Date')))


def merged(template: Catalog, old: Catalog | None) -> Catalog:
    """msgmerge: the template's messages with the old translations (fuzzy where inexact)."""
    if old is None:
        old = Catalog(locale=LANG, project=template.project, version=template.version,
                      charset="utf-8")
    old.update(template, no_fuzzy_matching=False, update_header_comment=False)
    old.fuzzy = False  # the header is never fuzzy: a fuzzy header would hide every message
    return old


def update() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pots = extract(pathlib.Path(tmp))
        for page, pot in pots.items():
            path = CATALOGS / f"{page}.po"
            write(merged(read(pot), read(path) if path.exists() else None), path)
    for path in sorted(CATALOGS.rglob("*.po")):
        page = str(path.relative_to(CATALOGS).with_suffix(""))
        if page not in pots:
            path.unlink()
            print(f"removed {path.relative_to(ROOT)}: the page is gone")
    status()


def translated() -> list[str]:
    """The pages the Chinese edition has translated in full (locale/zh_CN/translated.txt):
    tests/test_i18n.py fails when one of them has an untranslated or a fuzzy message."""
    lines = (LOCALE / LANG / "translated.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def active(catalog: Catalog) -> set[str]:
    """The msgids of a catalog's current messages (not its header, not the obsolete ones)."""
    return {m.id for m in catalog if m.id and isinstance(m.id, str)}


def counts(path: pathlib.Path) -> tuple[int, int, int]:
    """(messages, translated and not fuzzy, fuzzy) of one catalog."""
    messages = [m for m in read(path) if m.id]
    done = sum(1 for m in messages if m.string and not m.fuzzy)
    return len(messages), done, sum(1 for m in messages if m.fuzzy)


def status() -> None:
    total = [0, 0, 0]
    for path in sorted(CATALOGS.rglob("*.po")):
        n, done, fuzzy = counts(path)
        total = [total[0] + n, total[1] + done, total[2] + fuzzy]
        print(f"{path.relative_to(ROOT)!s:60s} {n:5d} messages, {done:5d} translated,"
              f" {fuzzy:4d} fuzzy")
    print(f"{'all pages':60s} {total[0]:5d} messages, {total[1]:5d} translated,"
          f" {total[2]:4d} fuzzy")


def not_cached() -> list[str]:
    """The chapters whose code cells the execution cache does not hold."""
    import nbformat
    from jupyter_cache import get_cache

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [ROOT / f"{c['file']}.ipynb" for part in toc["parts"] for c in part["chapters"]]
    cache = get_cache(str(CACHE))
    missing = []
    for path in pages:
        if not path.exists():
            continue
        try:
            cache.match_cache_notebook(nbformat.read(path, as_version=4))
        except KeyError:
            missing.append(path.name)
    return missing


def translated_toc() -> pathlib.Path:
    """_toc.yml with its part captions ("Chapters") translated from the root page's catalog:
    sphinx-external-toc adds the captions after Sphinx has translated the page."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    catalog = read(CATALOGS / f"{toc['root']}.po")
    for part in toc.get("parts", []):
        message = catalog.get(part.get("caption", ""))
        if message is not None and message.string and not message.fuzzy:
            part["caption"] = message.string
    path = ZH_WORK / "_toc.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(toc, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def build_zh(jobs: int) -> int:
    """The Chinese edition, from the English build's execution cache, into _build/html/zh/."""
    missing = not_cached()
    if missing:
        print(f"not in the execution cache {CACHE}: {', '.join(missing)}; run `make executed`"
              " first (the Chinese edition renders the English build's execution)")
        return 1
    config = book_config(zh=True)
    config["execute"]["cache"] = str(CACHE)
    out = ZH_WORK / "html"
    # Sphinx compiles each .po into a .mo beside it: a copy in the build, not in the sources
    shutil.copytree(LOCALE, ZH_WORK / "locale", dirs_exist_ok=True)
    status = sphinx_build(config, "html", out, ZH_WORK / ".doctrees",
                          {"locale_dirs": [str(ZH_WORK / "locale")], "gettext_compact": False,
                           "external_toc_path": str(translated_toc())},
                          jobs=jobs, strict=True)
    if status:
        return status
    shutil.rmtree(ZH_OUT, ignore_errors=True)
    HTML.mkdir(parents=True, exist_ok=True)
    out.rename(ZH_OUT)  # moved, not copied: the next build writes its pages again
    print(f"The Chinese edition is at file://{ZH_OUT}/index.html")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("update", help="extract the prose and merge it into the catalogs")
    sub.add_parser("status", help="how much of each page is translated")
    p = sub.add_parser("extract", help="write the .pot templates into a folder")
    p.add_argument("out", type=pathlib.Path)
    p = sub.add_parser("build-zh", help="build the Chinese edition into _build/html/zh")
    p.add_argument("--jobs", type=int, default=1, help="Sphinx's parallel jobs")
    args = parser.parse_args(argv)
    if args.command == "update":
        update()
    elif args.command == "status":
        status()
    elif args.command == "extract":
        extract(args.out.resolve())
    else:
        return build_zh(args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
