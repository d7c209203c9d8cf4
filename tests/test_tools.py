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
    assert font.stat().st_size < 100_000  # a subset, not the whole font


gpu_report = load("gpu_report")


def test_make_gpu_plans_the_cuda_tests_the_triton_kernel_and_every_chapter():
    names = [name for name, _ in gpu_report.steps()]
    chapters = sorted(p.stem for p in (ROOT / "chapters").glob("*.ipynb"))
    assert names[:2] == ["parity tests on cuda", "Triton kernel, compiled"]
    assert names[2:] == [f"chapter {c}" for c in chapters]


def test_make_gpu_runs_the_gpu_only_cells(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_report, "OUT", tmp_path)
    import json

    copy = gpu_report.with_gpu_cells(ROOT / "chapters" / "09_performance.ipynb")
    original = json.loads((ROOT / "chapters" / "09_performance.ipynb").read_text())
    tags = [c.get("metadata", {}).get("tags", []) for c in original["cells"]]
    assert any("skip-execution" in t for t in tags)  # chapter 9 has GPU-only cells ...
    cells = json.loads(copy.read_text())["cells"]
    assert not any(set(c.get("metadata", {}).get("tags", [])) & gpu_report.SKIP_TAGS for c in cells)
    assert [c["source"] for c in cells] == [c["source"] for c in original["cells"]]  # ... run as they are


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the no-GPU path")
def test_make_gpu_without_a_gpu_says_so():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_report.py")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stdout
