"""A Colab reader's path: pip keeps Colab's packages, and the explorers work on its ipywidgets 7.

Colab's front end renders ipywidgets 7 only and Colab ships 7.7.1; a setup cell that upgraded it
to 8 would make the sliders, text boxes and progress bars vanish there. Two halves:

* the explorer's widgets on Colab's versions: in .venv/colab (tools/colab_env.py, ipywidgets
  7.7.1), an explorer with every kind of control a chapter gives one (a slider, a dropdown, a
  sentence) is driven as a reader's kernel would drive it (tests/harness.py's ``drive``);
* each chapter's own explorers, live: `make test` runs every chapter for the book with
  tests/harness.py in its kernel, which builds each explorer live from the chapter's own function
  and drives it; the last test here reads what it recorded. The explorers' code is the same on
  both versions of ipywidgets, so the two halves together cover a chapter's explorer on Colab.
"""

import ast
import importlib.util
import json
import pathlib
import re
import subprocess
import tomllib

import pytest
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("colab_env", ROOT / "tools" / "colab_env.py")
colab_env = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(colab_env)

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))


def requirements():
    reqs = list(PROJECT["dependencies"])
    for extra in PROJECT["optional-dependencies"].values():
        reqs += extra
    return [Requirement(r) for r in reqs]


@pytest.mark.parametrize("req", requirements(), ids=str)
def test_every_requirement_admits_the_version_colab_has(req):
    name = req.name.lower().replace("_", "-")
    assert name in colab_env.COLAB_FREEZE, f"add Colab's version of {name} to COLAB_FREEZE"
    colab = colab_env.COLAB_FREEZE[name]
    assert req.specifier.contains(colab, prereleases=True), (
        f"{req} would make pip replace Colab's {name} {colab}")


@pytest.fixture(scope="module")
def colab_python():
    """.venv/colab's python (made the first time: a pip install of three packages). Every test
    that takes it is ``slow``."""
    if not (colab_env.BASE / "bin" / "python").exists():
        pytest.skip("needs make's .venv (the Colab overlay is built over it): run make unit or make test")
    return str(colab_env.create())


@pytest.mark.slow
def test_the_colab_environment_has_colabs_widgets(colab_python):
    out = subprocess.run([colab_python, "-c", "import ipywidgets, widgetsnbextension; "
                          "print(ipywidgets.__version__, widgetsnbextension.__version__)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [colab_env.COLAB_OVERLAY["ipywidgets"], colab_env.COLAB_OVERLAY["widgetsnbextension"]]


def setup_cell_pip_flags():
    """The options every chapter's setup cell gives ``pip install`` on Colab (read from the
    cells, so this test and the chapters cannot drift apart), the same in every chapter."""
    flags = set()
    for path in CHAPTERS:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        setup = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
        call = next(n for n in ast.walk(ast.parse(setup)) if isinstance(n, ast.List)
                    and any(isinstance(e, ast.Constant) and e.value == "install" for e in n.elts))
        flags.add(tuple(e.value for e in call.elts if isinstance(e, ast.Constant)
                        and e.value.startswith("-") and e.value != "-m"))
    assert len(flags) == 1, f"the setup cells install with different options: {flags}"
    return list(flags.pop())


@pytest.mark.slow
def test_installing_the_package_adds_nothing_but_selfattn(colab_python, tmp_path):
    """The setup cell's install, as it runs on Colab (--no-deps: Colab has every dependency,
    test_every_requirement_admits_the_version_colab_has checks that), adds only this package:
    pip cannot follow a dependency to a package Colab's image leaves out (jedi, through
    ipywidgets 7 and Colab's IPython) or replace one Colab has."""
    flags = setup_cell_pip_flags()
    assert "--no-deps" in flags
    report = tmp_path / "report.json"
    subprocess.run([colab_python, "-m", "pip", "install", "--dry-run", "--disable-pip-version-check",
                    "--report", str(report), *flags, str(ROOT)], check=True, capture_output=True)
    would_install = {i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]}
    print("pip would install:", would_install)
    assert would_install == {"selfattn"}


@pytest.mark.slow
def test_a_static_explorer_on_ipywidgets_7_says_what_it_needs(colab_python):
    code = ("import selfattn.book.kit.viz as v\n"
            "try:\n"
            "    v.explorer(lambda s: v.View([[1.0]], ['a']), {'s': [1]}, static=True)\n"
            "except RuntimeError as e:\n"
            "    print(e)\n")
    out = subprocess.run([colab_python, "-c", code], capture_output=True, text=True, check=True)
    assert "ipywidgets>=8" in out.stdout and "7.7.1" in out.stdout


SYNTHETIC = """
import sys
sys.path.insert(0, {tests!r})
import json
import numpy
from harness import drive
from selfattn.book.kit import viz

def compute(sentence, temperature, mask):
    words = sentence.split()
    if "xyzzy" in words:
        raise viz.InputError("unknown word 'xyzzy'")
    n = len(words)
    weights = [[(i + j * temperature) % 3 + (mask == "causal" and j > i) for j in range(n)]
               for i in range(n)]
    title = f"{{sentence}} at {{temperature}}, {{mask}}"
    return viz.View(numpy.array(weights, dtype=float), words, title=title)

box = viz.explorer(compute, {{"temperature": [0.5, 1.0, 2.0], "mask": ["none", "causal"]}},
                   sentences=["the cat sat", "a dog ran far"], static=False)
print(json.dumps(drive(box)))
"""


@pytest.mark.slow
def test_an_explorer_works_on_colabs_ipywidgets(colab_python):
    """Every control of a live explorer changes the picture on ipywidgets 7.7.1, a bad sentence
    shows a message instead, and the widgets are ipywidgets 7's models."""
    code = SYNTHETIC.format(tests=str(ROOT / "tests"))
    out = subprocess.run([colab_python, "-c", code], capture_output=True, text=True, check=True)
    driven = json.loads(out.stdout.strip().splitlines()[-1])
    assert driven["ipywidgets"] == colab_env.COLAB_OVERLAY["ipywidgets"]
    check_driven(driven, "the synthetic explorer")
    assert all("@1.5.0:" in m or "@1.2.0:" in m for m in driven["models"]), driven["models"]
    assert [c["values"] for c in driven["controls"]] == [3, 2] and driven["bad_sentences"]


def check_driven(driven, where):
    """What a driven explorer must show: each control's every value a new picture, and a message
    for a bad sentence, with the picture back after a good one."""
    assert "error" not in driven, driven.get("error")
    assert driven["controls"], f"{where}: an explorer without controls"
    for control in driven["controls"]:
        assert control["changes"] == control["values"] - 1, (
            f"{where}: moving {control['name']!r} through its {control['values']} values "
            f"changed the picture only {control['changes']} times")
        assert control["back_to_first"]
    for bad in driven["bad_sentences"]:
        assert bad["picture_hidden"] and "&#9888;" in bad["message"], (
            f"{where}: typing {bad['typed']!r} showed no message")
    if driven["bad_sentences"]:
        assert driven["restored"], f"{where}: a good sentence did not bring the picture back"


def explorer_cells(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"
            and re.search(r"^explorer\(", "".join(c["source"]), re.M)]


REPORTS = ROOT / "_build" / "harness"  # make test's book build writes one report per chapter


def harness_report(chapter=None):
    """The records tests/harness.py wrote while the book build ran the chapters (all of them, or
    one chapter's)."""
    files = [REPORTS / f"{chapter}.jsonl"] if chapter else sorted(REPORTS.glob("*.jsonl"))
    missing = [f.name for f in files if not f.exists()]
    if not files or missing:
        pytest.fail(f"no harness report {missing or ''}: make test's book build writes them "
                    "(`make executed RECORD=_build/harness`)")
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


@pytest.mark.built_book  # runs after the book build, which writes the reports
@pytest.mark.parametrize("path", [p for p in CHAPTERS if explorer_cells(p)], ids=lambda p: p.stem)
def test_every_explorer_of_a_chapter_works_live(path):
    records = {r["cell"]: r for r in harness_report(path.stem)}
    for source in explorer_cells(path):
        assert source in records, f"{path.stem}: this explorer cell did not run in the book build"
        record = records[source]
        assert len(record["explorers"]) == 1, f"{path.stem}: the cell showed no explorer"
        check_driven(record["explorers"][0], path.stem)
