"""Build the book's Chinese webfont: Noto Sans SC cut down to the characters the book uses.

    .venv/bin/python tools/cjk_font.py [OUT_DIR]      (make does this; default _vendor/fonts)

The book puts the articles' Chinese terms beside the English ones (查询, 多头注意力, ...), and its
Chinese edition is all Chinese (its prose from locale/zh_CN's catalogs, its scripts' words from
assets/messages.js). On a machine without a CJK font a browser draws those as empty boxes, so the
book serves its own:
the npm package noto-sans-sc (MIT-packaged Noto Sans SC, SIL OFL 1.1) ships the font as about a
hundred woff2 slices, one per unicode-range; this script takes from each slice the characters
the book's pages use, merges them into one font (fontTools; a few tens of KB for the terms, a
few hundred for a whole edition), and writes a
stylesheet that puts it first in the theme's font stacks, limited by ``unicode-range`` to exactly
those characters, so Latin text keeps the theme's fonts. tests/test_browser.py checks that the
Chinese on the pages is drawn with it.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE = ROOT / "node_modules" / "noto-sans-sc" / "noto_sans_sc_regular"
FAMILY = "Book CJK"
FONT = "book-cjk.woff2"
# CJK punctuation, CJK ideographs (extension A and the main block), full-width forms
CJK = re.compile(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef]")


def book_characters(root: pathlib.Path = ROOT) -> set[str]:
    """Every CJK character in the book's pages, in both editions: the markdown files and the
    chapters (cells and outputs), the Chinese edition's catalogs (locale/**/*.po), the words the
    page's scripts write (assets/messages.js) and the theme's own Chinese strings."""
    texts = [p.read_text(encoding="utf-8") for p in root.glob("*.md")]
    for path in sorted((root / "chapters").glob("*.ipynb")):
        texts.append(json.dumps(json.loads(path.read_text(encoding="utf-8")), ensure_ascii=False))
    texts += [p.read_text(encoding="utf-8") for p in sorted(root.glob("locale/**/*.po"))]
    messages = root / "assets" / "messages.js"
    if messages.exists():
        texts.append(messages.read_text(encoding="utf-8"))
    texts += [p.read_text(encoding="utf-8") for p in theme_catalogs()]
    return set(CJK.findall("".join(texts)))


def theme_catalogs() -> list[pathlib.Path]:
    """The Chinese catalogs of the themes the pages are drawn with (their buttons, the search
    box), as installed: pydata-sphinx-theme's and sphinx-book-theme's."""
    import importlib.util

    found = []
    for package, catalog in (
            ("pydata_sphinx_theme", "locale/zh/LC_MESSAGES/sphinx.po"),
            ("sphinx_book_theme",
             "theme/sphinx_book_theme/static/locales/zh_CN/LC_MESSAGES/booktheme.po")):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin is not None:
            path = pathlib.Path(spec.origin).parent / catalog
            if path.exists():
                found.append(path)
    return found


def _slices(css: str) -> list[tuple[str, set[int]]]:
    """(file, code points) of every @font-face slice in the package's stylesheet."""
    slices = []
    for url, ranges in re.findall(r"src: url\(([^)]+)\).*?unicode-range: ([^;]+);", css, re.S):
        points: set[int] = set()
        for part in ranges.split(","):
            first, _, last = part.strip().removeprefix("U+").removeprefix("u+").partition("-")
            points.update(range(int(first, 16), int(last or first, 16) + 1))
        slices.append((url, points))
    return slices


def _ranges(points: set[int]) -> str:
    """CSS unicode-range for a set of code points, consecutive runs merged."""
    runs, ordered = [], sorted(points)
    start = prev = ordered[0]
    for p in [*ordered[1:], None]:
        if p is not None and p == prev + 1:
            prev = p
            continue
        runs.append(f"U+{start:X}" if start == prev else f"U+{start:X}-{prev:X}")
        if p is not None:
            start = prev = p
    return ", ".join(runs)


def build(out_dir: pathlib.Path) -> set[str]:
    from fontTools import subset
    from fontTools.merge import Merger
    from fontTools.ttLib import TTFont

    chars = book_characters()
    need = {ord(c) for c in chars}
    missing = set(need)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        pieces = []
        for url, points in _slices((SOURCE / "css.css").read_text()):
            wanted = missing & points
            if not wanted:
                continue
            font = TTFont(SOURCE / url)
            subsetter = subset.Subsetter(subset.Options(layout_features=["*"], notdef_outline=True))
            subsetter.populate(unicodes=wanted)
            subsetter.subset(font)
            font.flavor = None
            pieces.append(str(pathlib.Path(tmp) / f"{len(pieces)}.ttf"))
            font.save(pieces[-1])
            missing -= wanted
        if missing:
            sys.exit(f"Noto Sans SC has no glyph for {''.join(map(chr, sorted(missing)))}")
        merged = Merger().merge(pieces)
    merged.flavor = "woff2"
    merged.save(out_dir / FONT)
    font_stacks = {"base": "base-system", "heading": "base-system",
                   "monospace": "monospace-system"}
    (out_dir / "cjk.css").write_text(
        "/* Generated by tools/cjk_font.py: the Chinese characters the book uses, from Noto Sans\n"
        "   SC (SIL Open Font License 1.1), served by the book itself. */\n"
        f'@font-face {{\n  font-family: "{FAMILY}";\n  src: url("{FONT}") format("woff2");\n'
        f"  unicode-range: {_ranges(need)};\n}}\n"
        "html {\n" + "".join(
            f'  --pst-font-family-{role}: "{FAMILY}", var(--pst-font-family-{system});\n'
            for role, system in font_stacks.items()) + "}\n")
    return chars


if __name__ == "__main__":
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "_vendor" / "fonts"
    chars = build(out)
    print(f"{out / FONT}: {len(chars)} characters, {(out / FONT).stat().st_size / 1024:.0f} KB")
