"""The book's own rules: chapters set themselves up on Colab, are committed executed, have
exercise solutions that pass their checks, and the built book has every page and figure.

The build itself is `make book` (run by `make test` before pytest, with warnings as errors).
"""

import json
import pathlib
import re
import subprocess
import sys

import pytest
import torch
import yaml

import selfattn

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
BUILD = ROOT / "_build" / "html"


def cells(path, kind=None):
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [c for c in nb["cells"] if kind is None or c["cell_type"] == kind]


def source(cell):
    return "".join(cell["source"])


def toc_files(entries):
    for entry in entries:
        if "file" in entry:
            yield entry["file"]
        yield from toc_files(entry.get("chapters", []) + entry.get("parts", []))


def test_every_chapter_is_in_the_toc_and_every_toc_entry_exists():
    listed = set(toc_files(TOC["parts"]))
    assert {f"chapters/{p.stem}" for p in CHAPTERS} <= listed
    for name in listed | {TOC["root"]}:
        assert (ROOT / f"{name}.ipynb").exists() or (ROOT / f"{name}.md").exists(), name


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_first_code_cell_installs_on_colab_only_and_picks_the_device(path):
    setup = source(cells(path, "code")[0])
    assert '"google.colab" in sys.modules' in setup
    assert f"git+{CONFIG['repository']['url']}" in setup  # the one URL, from _config.yml
    install = [line for line in setup.splitlines() if "pip" in line or "git+" in line]
    assert install and not any("torch" in line for line in install)  # never reinstalls torch
    assert '"--no-deps"' in setup  # Colab has every dependency: pip must add nothing else
    assert "selfattn.pick_device()" in setup


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_failed_install_on_colab_says_what_to_do(path, monkeypatch):
    import subprocess
    import sys
    import types

    setup = source(cells(path, "code")[0])
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: ran.append(cmd) or
                        subprocess.CompletedProcess(cmd, returncode=1))
    with pytest.raises(SystemExit) as stop:
        exec(compile(setup, str(path), "exec"), {})
    assert ran and ran[0][1:4] == ["-m", "pip", "install"]
    message = str(stop.value)
    assert "pip could not install" in message and "!pip install --no-deps" in message


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_is_committed_executed_in_order_and_small(path):
    code = [c for c in cells(path, "code") if "skip-execution" not in c["metadata"].get("tags", [])]
    counts = [c["execution_count"] for c in code]
    assert counts == list(range(1, len(code) + 1)), "run the notebook top to bottom, then commit"
    for c in code:
        for out in c["outputs"]:
            assert out["output_type"] != "error", source(c)[:80]
    assert path.stat().st_size < 1_000_000, "keep stored outputs small"
    for c in code:
        assert "sys.path" not in source(c), "import the installed package, never edit sys.path"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_readers_see_no_test_plumbing_in_the_code(path):
    for c in cells(path, "code"):
        assert not re.search(r"^\s*#\s*(NBVAL|PYTEST_VALIDATE)_", source(c), re.M), (
            f"{path.stem}: use a cell tag (nbval-check-output, ...) instead of a comment")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_a_chapter_with_a_gpu_cell_opens_a_gpu_runtime_on_colab(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    gpu_cells = [c for c in cells(path, "code") if "skip-execution" in c["metadata"].get("tags", [])
                 and 'device.type != "cuda"' in source(c)]
    if gpu_cells:
        assert nb["metadata"].get("accelerator") == "GPU"
        assert nb["metadata"].get("colab", {}).get("gpuType") == "T4"


CHECK_CALL = re.compile(r"selfattn\.book\.\w+\.check_")


def is_self_check(cell):
    return cell["cell_type"] == "code" and re.search(r"^self_check\(", source(cell), re.M)


def exercises(path):
    """(answer cell, check cell, solution code) for every exercise of a chapter: its checker
    call, the answer cell before it (before its self-check, where the code a find-the-bug
    exercise shows comes first) and the folded solution right after it."""
    all_cells = cells(path)
    found = []
    for i, c in enumerate(all_cells):
        text = source(c)
        if c["cell_type"] == "code" and CHECK_CALL.search(text):
            solution = source(all_cells[i + 1])
            code = re.search(r"<details>.*?```python\n(.*?)```.*?</details>", solution, re.S)
            assert code, f"the check {text!r} needs a folded solution right after it"
            answer = all_cells[i - 2] if is_self_check(all_cells[i - 1]) else all_cells[i - 1]
            assert answer["cell_type"] == "code" and not is_self_check(answer), text
            found.append((source(answer), text.rstrip().rstrip(";"), code.group(1)))
    return found


def tags(cell):
    return cell["metadata"].get("tags", [])


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_the_page_shows_no_verdict_nobody_asked_for(path):
    """An exercise's checker runs in the notebook (and under nbval) and says "Not yet" to the
    blank answer; the page shows no output of it: the checker is tagged remove-output, or
    remove-cell where the exercise's self-check is the page's place to answer."""
    all_cells = cells(path)
    for i, c in enumerate(all_cells):
        if c["cell_type"] == "code" and CHECK_CALL.search(source(c)):
            with_self_check = any(is_self_check(x) for x in all_cells[i - 2:i])
            wanted = "remove-cell" if with_self_check else "remove-output"
            assert wanted in tags(c), f"{source(c).strip()}: tag it {wanted}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_figure_has_alt_text_that_says_what_it_shows(path):
    """A cell that draws a figure gives it alt text in its metadata (mystnb: image: alt:, which
    myst-nb puts on the page's img): a sentence from the figure's title and what it shows,
    never the file's path, which is what a screen reader reads without it."""
    for c in cells(path, "code"):
        if any("image/png" in o.get("data", {}) for o in c["outputs"]):
            alt = c["metadata"].get("mystnb", {}).get("image", {}).get("alt", "")
            first = source(c).strip().splitlines()[0][:60]
            assert len(alt.split()) >= 6, f"the figure of the cell starting {first!r} needs alt text"
            assert not re.search(r"\.(png|svg|jpe?g)\b|_images/", alt), alt


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_the_colab_set_up_cell_is_folded_on_the_page(path):
    assert "hide-input" in tags(cells(path, "code")[0])


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_exercises_have_solutions_that_pass_and_placeholders_that_do_not(path, capsys):
    found = exercises(path)
    assert 2 <= len(found) <= 4
    for answer, check, solution in found:
        ns = {"torch": torch, "selfattn": selfattn}
        exec(answer, ns)
        assert eval(check, ns) is False, f"the unanswered exercise passes: {check}"
        exec(solution, ns)
        assert eval(check, ns) is True, f"the shown solution fails: {check}"
    assert "Not yet" in capsys.readouterr().out


@pytest.mark.built_book
def test_book_was_built_from_the_current_sources():
    assert (BUILD / "index.html").exists(), "run `make book` (make test does) before pytest"
    current = subprocess.run([sys.executable, str(ROOT / "tools" / "srchash.py")],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert (ROOT / "_build" / ".src-hash").read_text().strip() == current


@pytest.mark.built_book
@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_built_chapter_page_has_its_figures_and_no_errors(path):
    page = BUILD / "chapters" / f"{path.stem}.html"
    html = page.read_text(encoding="utf-8")
    images = re.findall(r'<img [^>]*src="([^"]+\.png)"', html)
    n_figures = sum("image/png" in o.get("data", {}) for c in cells(path, "code") for o in c["outputs"])
    assert len(images) >= n_figures > 0
    for src in images:
        assert (page.parent / src).resolve().stat().st_size > 1000, src
    assert "Traceback" not in html
    assert "colab.research.google.com" in html  # the launch button
