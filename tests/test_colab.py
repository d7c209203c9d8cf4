"""A Colab reader's path: pip keeps Colab's packages, and the explorers work on its ipywidgets 7.

Colab's front end renders ipywidgets 7 only and Colab ships 7.7.1; a setup cell that upgraded it
to 8 would make the sliders, text boxes and progress bars vanish there. `make test` runs every
chapter under nbval in .venv/colab (tools/colab_env.py), where ipywidgets is Colab's 7.7.1, with
tests/colab_harness.py driving each live explorer; the last test here reads what it recorded.
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
    if not (colab_env.BASE / "bin" / "python").exists():
        pytest.skip("needs make's .venv (the Colab overlay is built over it): run make unit or make test")
    return str(colab_env.create())


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


def test_a_static_explorer_on_ipywidgets_7_says_what_it_needs(colab_python):
    code = ("import selfattn.book.kit.viz as v\n"
            "try:\n"
            "    v.explorer(lambda s: v.View([[1.0]], ['a']), {'s': [1]}, static=True)\n"
            "except RuntimeError as e:\n"
            "    print(e)\n")
    out = subprocess.run([colab_python, "-c", code], capture_output=True, text=True, check=True)
    assert "ipywidgets>=8" in out.stdout and "7.7.1" in out.stdout


def explorer_cells(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"
            and re.search(r"^explorer\(", "".join(c["source"]), re.M)]


def harness_report():
    if not colab_env.REPORT.exists():
        pytest.fail("no harness report: make test runs the chapters in .venv/colab first "
                    "(`.venv/bin/python tools/colab_env.py pytest --nbval-lax chapters`)")
    return [json.loads(line) for line in colab_env.REPORT.read_text().splitlines()]


@pytest.mark.built_book  # runs after the chapters' nbval pass, which writes the report
@pytest.mark.parametrize("path", [p for p in CHAPTERS if explorer_cells(p)], ids=lambda p: p.stem)
def test_every_live_explorer_works_on_colabs_ipywidgets(path):
    records = {r["cell"]: r for r in harness_report()}
    for source in explorer_cells(path):
        assert source in records, f"{path.stem}: this explorer cell did not run on Colab's widgets"
        record = records[source]
        assert record["ipywidgets"] == colab_env.COLAB_OVERLAY["ipywidgets"]
        assert len(record["explorers"]) == 1, f"{path.stem}: the cell showed no explorer"
        driven = record["explorers"][0]
        assert "error" not in driven, driven.get("error")
        # models at ipywidgets 7's versions only: controls 1.5.0, base 1.2.0
        assert all("@1.5.0:" in m or "@1.2.0:" in m for m in driven["models"]), driven["models"]
        assert driven["controls"], f"{path.stem}: an explorer without controls"
        for control in driven["controls"]:
            assert control["changes"] == control["values"] - 1, (
                f"{path.stem}: moving {control['name']!r} through its {control['values']} values "
                f"changed the picture only {control['changes']} times")
            assert control["back_to_first"]
        for bad in driven["bad_sentences"]:
            assert bad["picture_hidden"] and "&#9888;" in bad["message"], (
                f"{path.stem}: typing {bad['typed']!r} showed no message")
        if driven["bad_sentences"]:
            assert driven["restored"], f"{path.stem}: a good sentence did not bring the picture back"
