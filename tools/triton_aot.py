"""Compile the Triton kernel ahead of time for a GPU that is not here, and say what it costs.

    .venv/bin/python tools/triton_aot.py '[[7, "float16", 128], [8, "bfloat16", 64]]'
    .venv/bin/python tools/triton_aot.py --configs '[[7, "float16", 128, 32, 16, 4, 1]]'

Each target is (compute capability major, dtype, head size); the configuration is the one
``selfattn.triton_attention.config_for`` ships, or, with ``--configs``, the block sizes, warps and
stages given after the head size (to try others). For each it compiles the causal kernel with
``triton.compile`` for ``sm_75`` (major 7, a T4) or ``sm_80`` (major 8, an A100) and assembles the
PTX with Triton's own ``ptxas -v``: no GPU and no CUDA driver are needed. It prints one JSON list:
per target the shared memory, the registers, the bytes spilled, how many tensor-core (``mma``)
instructions and whether float32 went through TF32, with Triton's version.

It must run with the interpreter off (``TRITON_INTERPRET`` unset) in a fresh process.
tests/test_triton.py runs it with the pinned Triton; ``make gpu-rehearsal`` (tools/gpu_report.py)
runs it again with Triton 3.6.0, the version Colab's GPU image pairs with torch 2.11, from a copy
installed with ``pip install --target`` and put first on ``PYTHONPATH``.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import tempfile

# (compute capability major, dtype, head size): a T4 at head sizes 64 and 128 in float16 and
# float32, and bfloat16 at 64 (which it runs without tensor cores); an A100-class GPU (8.0, whose
# smallest sibling, 8.6/8.9, allows 99 KiB of shared memory a block)
TARGETS = [(7, "float16", 64), (7, "float32", 64), (7, "float16", 128), (7, "float32", 128),
           (7, "bfloat16", 64), (8, "float16", 64), (8, "float16", 128), (8, "float32", 64)]


def problems(results: list[dict]) -> list[str]:
    """What is wrong with compiled :data:`TARGETS`: a target missing, shared memory beyond the
    GPU's, a register spilled, tensor-core instructions where Triton has none (below 8.0, where
    chapter 9 tells T4 readers so) or none where it does (half precision from 8.0), TF32."""
    found = [(int(r["arch"][3]), r["dtype"], r["head"]) for r in results]
    out = [] if found == [tuple(t) for t in TARGETS] else [f"compiled {found}, not {TARGETS}"]
    for r in results:
        what = f"{r['arch']} {r['dtype']} head {r['head']} {r['config']} (triton {r['triton']})"
        limit = 64 * 1024 if r["arch"] == "sm_75" else 99 * 1024
        half = r["dtype"] in ("float16", "bfloat16")
        if r["shared"] > limit:
            out.append(f"{what}: {r['shared']} bytes of shared memory, more than {limit}")
        if r["spills"]:
            out.append(f"{what}: {r['spills']} bytes of registers spilled")
        if (r["mma"] > 0) != (r["arch"] != "sm_75" and half):
            out.append(f"{what}: {r['mma']} tensor-core instructions")
        if r["tf32"]:
            out.append(f"{what}: float32 multiplied in TF32")
    return out


def compile_target(major: int, dtype: str, head: int, config: list[int] | None = None) -> dict:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from selfattn.triton_attention import DOT_PRECISION, Config, _forward_kernel, config_for

    arch = f"sm_{major}{5 if major == 7 else 0}"
    capability = (major, 5 if major == 7 else 0)
    cfg = Config(*config) if config else config_for(capability, head, getattr(torch, dtype))
    names = list(inspect.signature(_forward_kernel.fn).parameters)
    ptr = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32"}[dtype]
    sig = {n: ptr if n in "QKVO" else "*fp32" if n == "LSE" else "fp32" if n == "qk_scale"
           else "constexpr" if n.startswith(("IS_", "BLOCK", "DOT")) else "i32" for n in names}
    const = {"IS_CAUSAL": True, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
             "BLOCK_E": head, "BLOCK_EV": head, "DOT": DOT_PRECISION}
    src = ASTSource(_forward_kernel, sig,
                    constexprs={(names.index(k),): v for k, v in const.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", int(arch[3:]), 32),
                            options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "k.ptx"), "w") as f:
            f.write(kernel.asm["ptx"])
        log = subprocess.run([ptxas, f"-arch={arch}", "-v", os.path.join(d, "k.ptx"), "-o",
                              os.path.join(d, "k.cubin")], capture_output=True, text=True,
                             check=True)
    text = log.stderr + log.stdout
    registers = re.findall(r"Used (\d+) registers", text)
    return {"arch": arch, "dtype": dtype, "head": head, "triton": triton.__version__,
            "config": [cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages],
            "shared": kernel.metadata.shared,
            "registers": int(registers[-1]) if registers else None,
            "spills": sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", text)),
            "mma": len(re.findall(r"\bmma\.", kernel.asm["ptx"])),
            "tf32": "tf32" in kernel.asm["ptx"]}


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("tools/triton_aot.py compiles for a GPU: unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()  # compile every time, never a cached one
    explicit = argv[:1] == ["--configs"]
    targets = json.loads(argv[-1]) if argv else TARGETS
    out = [compile_target(t[0], t[1], t[2], t[3:] if explicit else None) for t in targets]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
