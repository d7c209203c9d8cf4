"""The repository's tools: finding a browser for the browser test, and the Chinese webfont."""

import importlib.util
import os
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


find_browser = load("find_browser")
cjk_font = load("cjk_font")


def run_finder(tmp_path, path_dirs, *args, **env):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    environment = {"PATH": os.pathsep.join(map(str, path_dirs)), "HOME": str(home), **env}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "find_browser.py"), *args],
                          env=environment, capture_output=True, text=True)
    return done, time.perf_counter() - start


def fake_executable(folder, name):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_machine_without_a_browser_stops_at_once_with_one_line_saying_what_to_install(tmp_path):
    # no browser, no apt-get, no npx on PATH: nothing to find and nothing to install with
    done, seconds = run_finder(tmp_path, [tmp_path / "empty"], "--install")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "apt-get install chromium" in done.stderr
    assert seconds < 5


def test_the_browser_is_found_on_path_in_the_environment_and_in_playwrights_cache(tmp_path):
    on_path = fake_executable(tmp_path / "bin", "chromium")
    done, _ = run_finder(tmp_path, [tmp_path / "bin"])
    assert done.returncode == 0 and done.stdout.strip() == str(on_path)

    given = fake_executable(tmp_path / "elsewhere", "my-chrome")
    done, _ = run_finder(tmp_path, [tmp_path / "bin"], CHROMIUM=str(given))
    assert done.stdout.strip() == str(given)  # CHROMIUM wins over PATH
    done, _ = run_finder(tmp_path, [tmp_path / "bin"], CHROMIUM=str(tmp_path / "missing"))
    assert done.returncode == 1 and "not an executable" in done.stderr

    cache = tmp_path / "ms-playwright"
    downloaded = fake_executable(cache / "chromium-1200" / "chrome-linux", "chrome")
    done, _ = run_finder(tmp_path, [tmp_path / "empty"], PLAYWRIGHT_BROWSERS_PATH=str(cache))
    assert done.stdout.strip() == str(downloaded)


@pytest.mark.built_book  # the font is built by make (book or test), not by a fresh checkout
def test_the_webfont_covers_every_chinese_character_of_the_book():
    from fontTools.ttLib import TTFont

    font = ROOT / "_vendor" / "fonts" / cjk_font.FONT
    if not font.exists():
        pytest.fail("no webfont: `make book` (or make test) builds _vendor/fonts first")
    chars = cjk_font.book_characters()
    assert "查" in chars and "询" in chars  # the intro's example term
    covered = {chr(c) for c in TTFont(font).getBestCmap()}
    assert chars <= covered, f"rebuild the font (make): missing {''.join(sorted(chars - covered))}"
    # a subset, not the whole font: with the whole Chinese edition translated it comes
    # to about 130 KB
    assert font.stat().st_size < 250_000


gpu_report = load("gpu_report")


def test_make_gpu_plans_the_cuda_tests_the_triton_kernel_the_kernels_and_the_chapters():
    gpu = gpu_report.steps(gpu_report.Device("cuda", False))
    rehearsal = gpu_report.steps(gpu_report.Device("cpu", True))
    assert [name for name, _ in gpu] == [
        "parity tests on cuda", "Triton kernel", "Triton 3.6.0 (Colab's) compiles without spills",
        "kernels that ran", "chapters with their GPU cells"]
    assert [name for name, _ in rehearsal][1:] == [name for name, _ in gpu][1:]
    commands = {name: " ".join(command) for name, command in gpu}
    assert commands["parity tests on cuda"].endswith("-k cuda tests")
    assert commands["Triton kernel"].endswith("pytest -q tests/test_triton.py")  # every test
    assert "--toy" not in commands["kernels that ran"] and "--rehearse" not in " ".join(commands.values())
    # the rehearsal's parity step collects the cpu twins of the cuda rows, in the files that
    # take the device fixture
    parity = " ".join(rehearsal[0][1])
    assert "--collect-only -k cpu" in parity
    for path in gpu_report.PARITY_FILES:
        assert "device" in (ROOT / path).read_text() and path in parity


def test_the_device_logic_of_make_gpu_and_its_rehearsal(monkeypatch):
    """On a GPU the steps run with Triton's interpreter off; the rehearsal runs them on the CPU,
    the interpreter on and CUDA hidden (so a GPU machine rehearses the CPU logic too)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gpu, cpu = gpu_report.Device("cuda", False).env, gpu_report.Device("cpu", True).env
    assert "TRITON_INTERPRET" not in gpu and "CUDA_VISIBLE_DEVICES" not in gpu
    assert cpu["TRITON_INTERPRET"] == "1" and cpu["CUDA_VISIBLE_DEVICES"] == ""
    assert gpu_report.device_logic(rehearse=True) == gpu_report.Device("cpu", True)


def test_make_gpu_runs_the_gpu_only_cells(tmp_path):
    import json

    copy = gpu_report.with_gpu_cells(ROOT / "chapters" / "09_performance.ipynb", tmp_path)
    original = json.loads((ROOT / "chapters" / "09_performance.ipynb").read_text())
    tags = [c.get("metadata", {}).get("tags", []) for c in original["cells"]]
    assert any("skip-execution" in t for t in tags)  # chapter 9 has GPU-only cells ...
    cells = json.loads(copy.read_text())["cells"]
    assert not any(set(c.get("metadata", {}).get("tags", [])) & gpu_report.SKIP_TAGS for c in cells)
    assert [c["source"] for c in cells] == [c["source"] for c in original["cells"]]  # ... run as they are
    found = {p.stem: gpu_report.gpu_cells(p) for p in (ROOT / "chapters").glob("*.ipynb")}
    assert all(found[c] for c in ("07_multi_query_attention", "08_pitfalls", "09_performance"))


def test_the_report_keeps_each_gpu_cells_output_in_its_fixed_format(tmp_path, monkeypatch):
    """An executed GPU cell's text goes into the report; the report renders as Markdown and
    reads back with the chapters' parser; a rehearsal's report never counts as a GPU run."""
    import json

    import nbformat

    from selfattn.book import performance

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_code_cell("print('on the GPU')",
                                          metadata={"tags": ["skip-execution", "nbval-skip"]})]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n"),
                           nbformat.v4.new_output("execute_result", {"text/plain": "42"},
                                                  execution_count=2)]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    cells = gpu_report.collect("99_x", path, nb)
    assert cells == [{"chapter": "99_x", "index": 1, "id": nb.cells[1].id,
                      "first_line": "print('on the GPU')", "output": "ran\n42"}]
    report = {"format": gpu_report.FORMAT, "rehearsal": False, "date": "today",
              "versions": {"torch": "2"}, "device": {"name": "A GPU", "capability": "8.0",
                                                      "memory_gib": 80},
              "steps": [{"name": "s", "command": "c", "result": "passed", "seconds": 1.0,
                         "summary": "ok"}],
              "kernels": [{"call": "c", "kernel": "k"}], "gpu_kernels": [], "cells": cells}
    text = json.dumps(report)
    assert performance.parse_gpu_report(text) == report
    assert "ran\n42" in gpu_report.markdown(report) and "A GPU" in gpu_report.markdown(report)
    with pytest.raises(ValueError, match="cells"):
        performance.parse_gpu_report(json.dumps({**report, "cells": None}))
    committed = tmp_path / "gpu_report.json"
    monkeypatch.setattr(performance, "GPU_REPORT", committed)
    assert performance.gpu_report() is None  # nothing committed
    committed.write_text(text)
    assert performance.gpu_report() == report
    committed.write_text(json.dumps({**report, "rehearsal": True}))
    assert performance.gpu_report() is None
    failed = {**report, "steps": [{**report["steps"][0], "result": "FAILED"}]}
    committed.write_text(json.dumps(failed))
    assert performance.gpu_report() == failed  # a GPU ran it: its steps say what failed


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the no-GPU path")
@pytest.mark.slow
def test_make_gpu_without_a_gpu_says_so():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_report.py")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stdout
