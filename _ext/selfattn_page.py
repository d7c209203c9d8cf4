"""The book's own Sphinx extension: what its pages need that the theme and myst-nb do not give.

_config.yml loads it (``sphinx.local_extensions``). For every page:

* **Figures.** A figure a notebook cell drew carries its alt text from the cell's metadata
  (``mystnb: image: alt:``, which myst-nb reads); a figure without one is a build warning (an
  error under ``make book``'s ``-W``), never a file path read aloud by a screen reader. Each
  figure gets its drawn width, so Sphinx links it to its full-size file (a tap opens it), and a
  box, ``div.selfattn-figure``, that scrolls sideways on a phone rather than shrinking the
  figure's text out of reach (assets/book.css).
* **Tables.** The empty corner cells pandas writes as ``<th></th>`` become ``<td></td>``: a
  header with no text is announced as nothing by a screen reader (axe's empty-table-header).
* **Folded code.** A cell tagged ``hide-input`` folds under a summary named by the text it
  shows ("Show code cell source"); myst-nb's ``aria-label`` ("Toggle hidden content") did not
  contain it (axe: label-content-name-mismatch).
* **Two editions.** The English book is at the site's root and the Chinese one under ``zh/``
  (tools/i18n.py builds it with ``language: zh_CN``); every page's header links to the same page
  in the other edition (``selfattn_switch`` in the template context, drawn by
  ``_ext/templates/theme-switcher.html``), by a relative path, so it works from ``file://``.
* **Theme.** The colour mode defaults to ``auto`` (the reader's system setting), which the
  theme's script expects; left empty, it logged an error on a first visit.

The theme's own templates that this book overrides are in ``_ext/templates`` (``templates_path``).
"""

from __future__ import annotations

import re
from html import escape
from pathlib import Path

from docutils import nodes
from myst_nb.sphinx_ import HideCodeCellNode, depart_HideCellInput
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.images import get_image_size

logger = logging.getLogger(__name__)

EMPTY_HEADER = re.compile(r"<th>(\s*)</th>")


def _in_cell_output(node: nodes.Node) -> bool:
    """Whether ``node`` sits in a notebook cell's output (myst-nb's ``div.cell_output``)."""
    parent = node.parent
    while parent is not None:
        if "cell_output" in parent.get("classes", []):
            return True
        parent = parent.parent
    return False


def figures_and_tables(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    for image in list(doctree.findall(nodes.image)):
        if not _in_cell_output(image):
            continue
        alt = image.get("alt", "").strip()
        if not alt or re.search(r"\.(png|jpe?g|gif|svg)$", alt, re.I):
            logger.warning(f"a figure of {docname} has no alt text: give its cell the metadata "
                           "mystnb: image: alt: (what the figure shows, from its title)",
                           location=image)
        size = get_image_size(str(Path(app.srcdir) / image["uri"]))
        if size and "width" not in image:
            image["width"] = f"{size[0]}px"  # Sphinx links a sized image to its full file
        box = nodes.container(classes=["selfattn-figure"])
        image.replace_self(box)
        box.append(image)
    for raw in doctree.findall(nodes.raw):
        if "html" in raw.get("format", "").split() and _in_cell_output(raw) and "<th>" in raw.astext():
            text = EMPTY_HEADER.sub(r"<td>\1</td>", raw.astext())
            raw[0] = nodes.Text(text)


def visit_hidden_input(self: object, node: HideCodeCellNode) -> None:
    """myst-nb's ``visit_HideCellInput``, its summary named by its own text."""
    self.body.append(f'<details class="admonition hide {" ".join(node["classes"])}">\n<summary>\n')
    for state, prompt in (("collapsed", node["prompt_show"]), ("expanded", node["prompt_hide"])):
        self.body.append(f'<p class="{state} admonition-title">{escape(prompt)}</p>\n')
    self.body.append("</summary>\n")


ZH_DIR = "zh"  # the Chinese edition's folder in the site (tools/i18n.py)


def language_switch(app: Sphinx, pagename: str, templatename: str, context: dict,
                    doctree: object) -> None:
    """The link to this page in the other edition, for the header's template."""
    up = "../" * pagename.count("/")
    if is_chinese(app):
        context["selfattn_switch"] = {
            "href": f"{up}../{pagename}.html", "lang": "en", "text": "English",
            "name": "（本页的英文版）"}
    else:
        context["selfattn_switch"] = {
            "href": f"{up}{ZH_DIR}/{pagename}.html", "lang": "zh-CN", "text": "中文",
            "name": " (this page in Chinese)"}


def is_chinese(app: Sphinx) -> bool:
    return str(app.config.language or "en").startswith("zh")


def default_mode(app: Sphinx, config: object) -> None:
    config.html_context.setdefault("default_mode", "auto")  # the theme reads it from the context


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", default_mode)
    app.add_node(HideCodeCellNode, override=True, html=(visit_hidden_input, depart_HideCellInput))
    app.connect("doctree-resolved", figures_and_tables)
    app.connect("html-page-context", language_switch)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
