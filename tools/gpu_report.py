"""`make gpu`: everything that needs a CUDA GPU, in one command, with a dated report.

    .venv/bin/python tools/gpu_report.py           (make gpu)
    .venv/bin/python tools/gpu_report.py --plan    (print the steps; any machine)

On a machine with a CUDA GPU it runs, each step timed:

1. the CUDA half of the parity tests (the ``device`` fixture's ``cuda`` rows) and the Triton
   kernel's tests, compiled for this GPU (no interpreter: conftest.py sets it only without CUDA);
2. every chapter, executed on the GPU under nbval-lax, GPU-only cells included: a copy of each
   notebook without its ``skip-execution``/``nbval-skip`` tags, so chapter 9's GPU cells run.

It writes ``_build/gpu/report.md`` (GPU, driver, torch, triton, each step's result and time) and
each executed chapter (``_build/gpu/NN_name.ipynb``), whose GPU cells' outputs can then be copied
into the committed chapter. Without a GPU it says so and exits with status 2.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "_build" / "gpu"
SKIP_TAGS = {"skip-execution", "nbval-skip"}


def steps() -> list[tuple[str, list[str]]]:
    """(name, command) for every step, chapters last."""
    py = sys.executable
    plan = [("parity tests on cuda", [py, "-m", "pytest", "-q", "-k", "cuda", "tests"]),
            ("Triton kernel, compiled", [py, "-m", "pytest", "-q", "tests/test_triton.py"])]
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        plan.append((f"chapter {path.stem}", [py, "-m", "pytest", "-q", "--nbval-lax",
                                              str(OUT / path.name)]))
    return plan


def with_gpu_cells(path: pathlib.Path) -> pathlib.Path:
    """A copy of the chapter in OUT whose GPU-only cells run (their skip tags removed)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if tags:
            cell["metadata"]["tags"] = [t for t in tags if t not in SKIP_TAGS]
    copy = OUT / path.name
    copy.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return copy


def versions() -> dict[str, str]:
    import torch

    out = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
           "torch": torch.__version__, "CUDA (torch)": str(torch.version.cuda)}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = "not installed"
    props = torch.cuda.get_device_properties(0)
    out["GPU"] = f"{props.name}, compute capability {props.major}.{props.minor}, " \
                 f"{props.total_memory / 2**30:.0f} GiB"
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)
    out["driver"] = smi.stdout.strip() or "unknown (no nvidia-smi)"
    return out


def main(argv: list[str]) -> int:
    if "--plan" in argv:
        for name, command in steps():
            print(f"{name}: {' '.join(command)}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("make gpu needs a CUDA GPU, and torch sees none here "
              f"(torch {torch.__version__}, CUDA build: {torch.version.cuda})")
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        with_gpu_cells(path)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TQDM_DISABLE", "1")
    results = []
    for name, command in steps():
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        last = (done.stdout.strip().splitlines() or [""])[-1]
        results.append((name, "passed" if done.returncode == 0 else "FAILED", seconds, last))
        print(f"{name:45s} {results[-1][1]:7s} {seconds:7.1f} s  {last}", flush=True)
    facts = versions()
    lines = ["# make gpu", ""] + [f"- {k}: {v}" for k, v in facts.items()]
    lines += ["", "| step | result | seconds | pytest's summary |", "|---|---|---|---|"]
    lines += [f"| {n} | {r} | {s:.1f} | {last} |" for n, r, s, last in results]
    (OUT / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"report: {OUT / 'report.md'}")
    return 0 if all(r == "passed" for _, r, _, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
