"""`make gpu`: everything that needs a CUDA GPU, in one command, with a report to commit; and
`make gpu-rehearsal`: the same steps on this CPU, so that `make gpu` works the first time it meets
a GPU.

    .venv/bin/python tools/gpu_report.py             (make gpu: on a machine with a CUDA GPU)
    .venv/bin/python tools/gpu_report.py --plan      (print the steps; any machine)
    .venv/bin/python tools/gpu_report.py --rehearse  (make gpu-rehearsal: the steps on this CPU)

The steps, each timed, with one device logic (:func:`device_logic`): CUDA and the compiled
Triton kernel on a GPU (``TRITON_INTERPRET`` removed), the CPU and Triton's interpreter in the
rehearsal (``TRITON_INTERPRET=1``):

1. parity tests: the ``cuda`` rows of the tests that take the ``device`` fixture
   (``pytest -k cuda tests``); rehearsed by collecting their ``cpu`` twins and counting them;
2. the Triton kernel: tests/test_triton.py, its inputs on the device (compiled for this GPU, or
   under the interpreter); the rehearsal leaves out the ahead-of-time compile with the pinned
   Triton, which ``make test`` runs;
3. the kernel with Colab's Triton: the ahead-of-time compile of every shipped configuration with
   Triton 3.6.0, the version Colab's GPU image pairs with torch 2.11 (tools/triton_aot.py,
   installed once with ``pip install --target`` into ``_vendor/triton-3.6.0``), no register
   spilled, as tests/test_triton.py checks the pinned one;
4. kernels: which kernel SDPA picks for each call of chapter 9's table
   (``performance.sdpa_fallbacks``) and the timed kernels of its GPU cell
   (``performance.gpu_kernels``); toy sizes in the rehearsal;
5. chapters: every chapter executed on the device with its GPU-only cells (a copy without their
   ``skip-execution``/``nbval-skip`` tags), the GPU cells' outputs collected; the rehearsal makes
   every copy and finds every GPU cell, and executes one small notebook of the same shape (a cell,
   then a GPU-only cell) through the same code.

`make gpu` writes the report, in the format :data:`FORMAT` fixes (versions, the device, each
step, the kernels that ran, each GPU cell's output), to ``src/selfattn/book/gpu_report.json``
and a readable ``gpu_report.md`` beside it: commit both (the package ships them, so
``selfattn.book.performance.gpu_report()`` finds the report on Colab too, and a chapter's GPU
sentence stops being a prediction). The rehearsal writes the same format to
``_build/gpu-rehearsal/`` and reads it back with that helper's parser. Without a GPU, ``make gpu``
says so and exits with status 2.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
from typing import NamedTuple

ROOT = pathlib.Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "src" / "selfattn" / "book" / "gpu_report.json"
OUT = ROOT / "_build" / "gpu"  # executed chapter copies; the rehearsal's report goes beside
REHEARSAL = ROOT / "_build" / "gpu-rehearsal"
TRITON_COLAB = "3.6.0"
TRITON_COLAB_DIR = ROOT / "_vendor" / f"triton-{TRITON_COLAB}"
SKIP_TAGS = {"skip-execution", "nbval-skip"}
FORMAT = 1
"""The report's format: a JSON object with ``format``, ``rehearsal`` (bool), ``date``,
``versions`` (python, torch, CUDA, triton, driver, commit), ``device`` (name, capability,
memory_gib), ``steps`` (name, command, result, seconds, summary), ``kernels`` (call, kernel:
SDPA's pick for each call), ``gpu_kernels`` (variant, dtype, T, ms, tflops, peak_mib, kernel or
error) and ``cells`` (chapter, index, id, first_line, output: each GPU-only cell's text output).
``selfattn.book.performance.parse_gpu_report`` checks it."""


class Device(NamedTuple):
    """Where make gpu's steps run: ``"cuda"`` (make gpu) or ``"cpu"`` (the rehearsal), and the
    environment every step gets (the interpreter off on CUDA, on for CPU tensors)."""

    name: str
    rehearsal: bool

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.setdefault("TQDM_DISABLE", "1")
        if self.name == "cpu":  # the interpreter, and no GPU even on a machine that has one
            env["TRITON_INTERPRET"] = "1"
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env


def device_logic(rehearse: bool) -> Device:
    """CUDA when PyTorch sees a GPU and this is not a rehearsal; the CPU in the rehearsal."""
    if rehearse:
        return Device("cpu", True)
    import torch

    return Device("cuda" if torch.cuda.is_available() else "none", False)


def steps(device: Device) -> list[tuple[str, list[str]]]:
    """(name, command) of every step on ``device``; the chapters are one step (:func:`chapters`)."""
    py = sys.executable
    if device.rehearsal:
        parity = [py, "-m", "pytest", "-q", "--collect-only", "-k", "cpu", "-p", "no:cacheprovider",
                  *PARITY_FILES]
        triton_tests = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not compile",
                        "tests/test_triton.py"]
    else:
        parity = [py, "-m", "pytest", "-q", "-k", "cuda", "tests"]
        triton_tests = [py, "-m", "pytest", "-q", "tests/test_triton.py"]
    return [
        (f"parity tests on {device.name}", parity),
        ("Triton kernel", triton_tests),
        (f"Triton {TRITON_COLAB} (Colab's) compiles without spills",
         [py, __file__, "--colab-triton"]),
        ("kernels that ran", [py, __file__, "--kernels", device.name,
                              str(_report_dir(device) / "kernels.json")]
         + (["--toy"] if device.rehearsal else [])),
        ("chapters with their GPU cells", [py, __file__, "--chapters", device.name,
                                           str(_report_dir(device) / "cells.json")]
         + (["--rehearse"] if device.rehearsal else [])),
    ]


# the tests with a `device` fixture: on a GPU, `-k cuda` selects their cuda rows
PARITY_FILES = ["tests/test_attention.py", "tests/test_multihead.py", "tests/test_fastpaths.py",
                "tests/test_tiled.py", "tests/test_cache.py", "tests/test_latent.py",
                "tests/test_costs.py"]


def _report_dir(device: Device) -> pathlib.Path:
    return REHEARSAL if device.rehearsal else OUT


# ---------------------------------------------------------------------------------------------
# step 3: Triton 3.6.0's ahead-of-time compile


def colab_triton() -> int:
    """Install Triton 3.6.0 once (``pip install --no-deps --target``), then compile every
    configuration tests/test_triton.py checks, with it first on the path; fail on a spill."""
    if not (TRITON_COLAB_DIR / "triton" / "__init__.py").exists():
        print(f"installing triton {TRITON_COLAB} into {TRITON_COLAB_DIR} (once)", flush=True)
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                               "--target", str(TRITON_COLAB_DIR), f"triton=={TRITON_COLAB}"])
        if done.returncode:
            return done.returncode
    sys.path.insert(0, str(ROOT / "tools"))
    import triton_aot

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TRITON_COLAB_DIR),
                                                      env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "triton_aot.py"),
                           json.dumps(triton_aot.TARGETS)], capture_output=True, text=True, env=env)
    if done.returncode:
        print(done.stderr[-2000:])
        return done.returncode
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for r in results:
        print(f"  triton {r['triton']} {r['arch']} {r['dtype']:8s} head {r['head']:3d} "
              f"config {r['config']}: {r['spills']} bytes spilled, {r['shared']} B shared")
    problems = triton_aot.problems(results)
    for p in problems:
        print("  PROBLEM:", p)
    versions = {r["triton"] for r in results}
    if versions != {TRITON_COLAB}:
        print(f"  PROBLEM: compiled with triton {versions}, not {TRITON_COLAB}")
        return 1
    print(f"{len(results)} configurations compiled with triton {TRITON_COLAB}, "
          f"{len(problems)} problems")
    return 1 if problems else 0


# ---------------------------------------------------------------------------------------------
# step 4: the kernels


def kernels(device_name: str, path: pathlib.Path, toy: bool) -> int:
    """Chapter 9's kernel calls on the device: SDPA's pick for each (``sdpa_fallbacks``) and the
    timed kernels (``gpu_kernels``), into ``path`` as JSON."""
    import torch

    from selfattn.book import performance

    if toy:
        calls = performance.sdpa_fallbacks(device_name, T=32, n_heads=4, head_dim=16)
        timed = performance.gpu_kernels(device_name, lengths=(40,), dtypes=(torch.float32,),
                                        n_heads=2, head_dim=16, repeats=1, warmup=0)
    else:
        calls = performance.sdpa_fallbacks(device_name)
        timed = performance.gpu_kernels(device_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kernels": calls, "gpu_kernels": timed}, indent=1))
    for row in calls:
        print(f"  {row['call']:38s} {row['kernel']}")
    for row in timed:
        print(f"  {row['variant']:24s} {row['dtype']:8s} T={row['T']:5d} "
              + (f"{row['ms']:8.3f} ms  {row['kernel']}" if "ms" in row else row["error"]))
    ran = [r for r in timed if "ms" in r]
    print(f"{len(calls)} calls named their kernel, {len(ran)} of {len(timed)} variants timed")
    return 0 if calls and ran else 1


# ---------------------------------------------------------------------------------------------
# step 5: the chapters


def with_gpu_cells(path: pathlib.Path, out: pathlib.Path = OUT) -> pathlib.Path:
    """A copy of the chapter in ``out`` whose GPU-only cells run (their skip tags removed)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if tags:
            cell["metadata"]["tags"] = [t for t in tags if t not in SKIP_TAGS]
    out.mkdir(parents=True, exist_ok=True)
    copy = out / path.name
    copy.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return copy


def gpu_cells(path: pathlib.Path) -> list[int]:
    """The indices of the chapter's GPU-only cells: code cells tagged ``skip-execution``."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
            and SKIP_TAGS & set(c.get("metadata", {}).get("tags", []))]


def execute(copy: pathlib.Path, cwd: pathlib.Path, timeout: int = 3600):
    """Execute a notebook in place with nbclient (stops at the first error); returns it."""
    import nbclient
    import nbformat

    nb = nbformat.read(copy, as_version=4)
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}}).execute()
    nbformat.write(nb, copy)
    return nb


def cell_text(cell: dict) -> str:
    """A code cell's outputs as text: streams, the plain text of results, and errors."""
    parts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            parts.append("".join(output["text"]) if isinstance(output["text"], list) else output["text"])
        elif output.get("output_type") in ("execute_result", "display_data"):
            text = output.get("data", {}).get("text/plain", "[no text]")
            parts.append("".join(text) if isinstance(text, list) else text)
        elif output.get("output_type") == "error":
            parts.append(f"{output['ename']}: {output['evalue']}")
    return "\n".join(p.rstrip("\n") for p in parts)


def collect(chapter: str, original: pathlib.Path, executed) -> list[dict]:
    """The report's ``cells`` rows for one executed chapter: each GPU-only cell and its text."""
    rows = []
    for i in gpu_cells(original):
        cell = executed.cells[i]
        source = "".join(cell.source) if isinstance(cell.source, list) else cell.source
        rows.append({"chapter": chapter, "index": i, "id": cell.get("id", ""),
                     "first_line": source.strip().splitlines()[0][:80],
                     "output": cell_text(cell)})
    return rows


def rehearsal_notebook(out: pathlib.Path) -> pathlib.Path:
    """A two-cell notebook shaped like a chapter with a GPU cell: a cell that picks the device as
    the chapters do, then a GPU-only cell (tagged like chapter 9's) that prints."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import selfattn\ndevice = selfattn.pick_device()"),
        nbformat.v4.new_code_cell(
            'print(f"GPU cell ran on {device.type}")',
            metadata={"tags": ["skip-execution", "nbval-skip"]}),
    ]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "00_rehearsal.ipynb"
    nbformat.write(nb, path)
    return path


def chapters(device_name: str, path: pathlib.Path, rehearse: bool) -> int:
    """Every chapter's copy with its GPU cells; executed on a GPU (each chapter's GPU cells'
    outputs into ``path``); in the rehearsal, the copies made and checked, and the rehearsal
    notebook executed through the same code."""
    out = path.parent
    rows, failed = [], []
    for original in sorted((ROOT / "chapters").glob("*.ipynb")):
        copy = with_gpu_cells(original, out)
        found = gpu_cells(original)
        left = [i for i in found if SKIP_TAGS & set(
            json.loads(copy.read_text())["cells"][i].get("metadata", {}).get("tags", []))]
        if left:
            failed.append(f"{original.stem}: cells {left} still skipped")
        if rehearse:
            if found:
                print(f"  {original.stem}: on a GPU, executed with its GPU cells {found}")
            continue
        start = time.perf_counter()
        try:
            executed = execute(copy, ROOT / "chapters")
        except Exception as exc:  # a failing cell: the report says which
            failed.append(f"{original.stem}: {type(exc).__name__}: {str(exc).strip()[-300:]}")
            print(f"  {original.stem}: FAILED", flush=True)
            continue
        rows += collect(original.stem, original, executed)
        print(f"  {original.stem}: {time.perf_counter() - start:.0f} s, GPU cells {found}",
              flush=True)
    if rehearse:
        notebook = rehearsal_notebook(out)
        original = json.loads(notebook.read_text())
        copy = with_gpu_cells(notebook, out / "copy")
        executed = execute(copy, ROOT)
        rows += collect("00_rehearsal", notebook, executed)
        assert original["cells"][1]["metadata"]["tags"], "the rehearsal's GPU cell lost its tags"
        print(f"  rehearsal notebook: its GPU cell printed {rows[-1]['output']!r}")
    path.write_text(json.dumps({"cells": rows, "failed": failed}, indent=1))
    for f in failed:
        print("  FAILED:", f)
    print(f"{len(rows)} GPU cells' outputs collected, {len(failed)} chapters failed")
    return 1 if failed or not rows else 0


# ---------------------------------------------------------------------------------------------
# the report


def versions(device: Device) -> tuple[dict[str, str], dict]:
    """The versions the report records, and the device."""
    import torch

    out = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
           "python": platform.python_version(), "torch": torch.__version__,
           "CUDA (torch)": str(torch.version.cuda)}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = "not installed"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    out["commit"] = commit or "unknown"
    if device.name == "cuda":
        props = torch.cuda.get_device_properties(0)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True)
        out["driver"] = smi.stdout.strip() or "unknown (no nvidia-smi)"
        gpu = {"name": props.name, "capability": f"{props.major}.{props.minor}",
               "memory_gib": round(props.total_memory / 2**30, 1)}
    else:
        from selfattn.book.performance import cpu_model

        out["driver"] = "none (rehearsal on the CPU)"
        gpu = {"name": f"{cpu_model()} (rehearsal: no GPU)", "capability": None, "memory_gib": None}
    return out, gpu


def markdown(report: dict) -> str:
    """The report for people: the versions and the device, each step, the kernels, each cell."""
    title = "make gpu-rehearsal (on the CPU: no GPU numbers)" if report["rehearsal"] else "make gpu"
    lines = [f"# {title}", ""] + [f"- {k}: {v}" for k, v in report["versions"].items()]
    device = report["device"]
    lines += [f"- device: {device['name']}, compute capability {device['capability']}, "
              f"{device['memory_gib']} GiB", ""]
    lines += ["| step | result | seconds | summary |", "|---|---|---|---|"]
    lines += [f"| {s['name']} | {s['result']} | {s['seconds']:.1f} | {s['summary']} |"
              for s in report["steps"]]
    lines += ["", "## Which kernel SDPA picks", "", "| call | kernel |", "|---|---|"]
    lines += [f"| {k['call']} | {k['kernel']} |" for k in report["kernels"]]
    lines += ["", "## Chapter 9's kernels, timed", "",
              "| variant | dtype | T | ms | TFLOP/s | peak MiB | kernel or error |",
              "|---|---|---|---|---|---|---|"]
    for r in report["gpu_kernels"]:
        if "ms" in r:
            lines.append(f"| {r['variant']} | {r['dtype']} | {r['T']} | {r['ms']:.3f} | "
                         f"{r['tflops']:.2f} | {r['peak_mib']:.1f} | {r['kernel']} |")
        else:
            lines.append(f"| {r['variant']} | {r['dtype']} | {r['T']} | | | | {r['error']} |")
    lines += ["", "## The GPU-only cells' outputs", ""]
    for c in report["cells"]:
        lines += [f"### {c['chapter']}, cell {c['index']} (`{c['first_line']}`)", "", "```",
                  c["output"], "```", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--colab-triton"]:
        return colab_triton()
    if argv[:1] == ["--kernels"]:
        return kernels(argv[1], pathlib.Path(argv[2]), "--toy" in argv)
    if argv[:1] == ["--chapters"]:
        return chapters(argv[1], pathlib.Path(argv[2]), "--rehearse" in argv)
    rehearse = "--rehearse" in argv
    if "--plan" in argv:
        for name, command in steps(Device("cuda", False)):
            print(f"{name}: {' '.join(command)}")
        return 0
    device = device_logic(rehearse)
    if device.name == "none":
        import torch

        print("make gpu needs a CUDA GPU, and torch sees none here "
              f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}); "
              "make gpu-rehearsal runs its steps on the CPU")
        return 2
    out = _report_dir(device)
    out.mkdir(parents=True, exist_ok=True)
    if rehearse:
        print("make gpu-rehearsal: every step of make gpu, on this CPU (Triton's interpreter); "
              "on a GPU, make gpu runs:")
        for name, command in steps(Device("cuda", False)):
            print(f"  {name}: {' '.join(command)}")
        print()
    results = []
    for name, command in steps(device):
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=device.env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        text = (done.stdout + done.stderr).strip().splitlines()
        said = done.stdout.strip().splitlines() or text  # the step's own last line, not a warning
        summary = next((line.strip() for line in reversed(said) if line.strip()), "")
        results.append({"name": name, "command": " ".join(command),
                        "result": "passed" if done.returncode == 0 else "FAILED",
                        "seconds": seconds, "summary": summary[:200].replace("|", "/")})
        print(f"{name:45s} {results[-1]['result']:7s} {seconds:6.1f} s  {summary[:100]}", flush=True)
        if done.returncode:
            print("\n".join(text[-40:]))
    facts, gpu = versions(device)
    found = {"kernels": [], "gpu_kernels": [], "cells": []}
    for part in ("kernels.json", "cells.json"):
        if (out / part).exists():
            found.update({k: v for k, v in json.loads((out / part).read_text()).items()
                          if k in found})
    report = {"format": FORMAT, "rehearsal": rehearse, "date": facts.pop("date"),
              "versions": facts, "device": gpu, "steps": results, **found}
    target = out / "report.json" if rehearse else COMMITTED
    target.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    target.with_suffix(".md").write_text(markdown(report), encoding="utf-8")
    from selfattn.book.performance import parse_gpu_report

    parse_gpu_report(target.read_text(encoding="utf-8"))  # the format the chapters read
    print(f"report: {target} and {target.with_suffix('.md').name}"
          + ("" if rehearse else ": commit both"))
    return 0 if all(r["result"] == "passed" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
