"""The Triton kernel (selfattn.triton_attention), on a CUDA GPU or under Triton's interpreter.

Every input is made on :data:`DEVICE`: CUDA where PyTorch sees a GPU (``make gpu`` runs this file
there, the kernel compiled for that GPU), else the CPU, where conftest.py has set
``TRITON_INTERPRET=1`` before anything imported triton. Block sizes come from the kernel's own
configuration for that device (``triton_attention._config``), never from the interpreter's.
Each result is compared with ``F.scaled_dot_product_attention`` computed in float64: the kernel's
error must be at most twice SDPA's own error in the same dtype (plus a float32 rounding floor).
Inputs are small (the interpreter runs each program one after the other, in numpy, about 5 ms
per tile), and their lengths are not multiples of the tiles. Planted bugs, written into a copy
of the module's source, must each fail a check. One test compiles the kernel for a T4 (compute
capability 7.5) and an A100 (8.0) in a fresh process, with Triton's own ptxas and no GPU
(tools/triton_aot.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.triton
triton_attention = pytest.importorskip("selfattn.triton_attention", reason="needs triton (Linux)")

SOURCE = pathlib.Path(triton_attention.__file__)
ROOT = pathlib.Path(__file__).resolve().parent.parent
FLOOR = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: under the interpreter
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def inputs(L, S, E, dtype, seed=0, requires_grad=False):
    """``q``, ``k``, ``v`` of batch 1 and 2 heads on :data:`DEVICE` (drawn on the CPU, so every
    device gets the same numbers)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, E, generator=g).to(DEVICE, dtype).requires_grad_(requires_grad)
               for n in (L, S, S))
    return q, k, v


def block_m(module, dtype=torch.float32, E=16):
    """The query block the kernel launches with on :data:`DEVICE` for this dtype and head size."""
    return module._config(torch.empty(1, 1, 1, E, device=DEVICE, dtype=dtype)).block_m


def sdpa(q, k, v, is_causal, dtype):
    """SDPA in ``dtype`` (float16 computed via float32 on this CPU, as a GPU kernel would)."""
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    return F.scaled_dot_product_attention(q.to(compute), k.to(compute), v.to(compute),
                                          is_causal=is_causal).to(dtype)


def check_forward(module, L, S, E, dtype, is_causal):
    q, k, v = inputs(L, S, E, dtype)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=is_causal)
    theirs = (sdpa(q, k, v, is_causal, dtype).double() - want).abs().max().item()
    ours = (module.triton_attention(q, k, v, is_causal=is_causal).double() - want).abs().max().item()
    assert ours <= 2 * theirs + FLOOR[torch.float32], (ours, theirs)


def check_backward(module, L, S, E, dtype, is_causal):
    q, k, v = inputs(L, S, E, dtype, seed=1, requires_grad=True)
    d_out = torch.randn(1, 2, L, E, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(F.scaled_dot_product_attention(*leaves, is_causal=is_causal),
                               leaves, d_out.double())
    same = [t.detach().requires_grad_() for t in (q, k, v)]
    theirs = torch.autograd.grad(sdpa(*same, is_causal, dtype), same, d_out)
    ours = torch.autograd.grad(module.triton_attention(q, k, v, is_causal=is_causal), (q, k, v), d_out)
    for name, o, t, w in zip("qkv", ours, theirs, want, strict=True):
        err, ref = (o.double() - w).abs().max().item(), (t.double() - w).abs().max().item()
        assert err <= 2 * ref + FLOOR[dtype], (name, err, ref)


def check_causal_tiles_skipped(module):
    """Keys and values past the first block of queries are NaN: with causal tiles skipped, that
    block never loads them, so its rows stay finite and right. The block is the one the kernel
    launches with here (32 under the interpreter, up to 128 on a GPU)."""
    block = block_m(module)
    q, k, v = inputs(2 * block, 2 * block, 16, torch.float32)
    k2, v2 = k.clone(), v.clone()
    k2[..., block:, :] = float("nan")
    v2[..., block:, :] = float("nan")
    out = module.triton_attention(q, k2, v2, is_causal=True)[..., :block, :]
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)[..., :block, :]
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("E", [16, 32, 64])
@pytest.mark.parametrize("L, S", [(45, 61), (61, 45)])
def test_forward_is_as_exact_as_sdpa(L, S, E, is_causal, dtype):
    check_forward(triton_attention, L, S, E, dtype, is_causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_gradients_are_as_exact_as_sdpas(is_causal, dtype):
    check_backward(triton_attention, 45, 61, 32, dtype, is_causal)


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the later rows do read the NaN keys
def test_causal_tiles_past_the_diagonal_are_never_loaded():
    check_causal_tiles_skipped(triton_attention)


def test_a_head_size_that_is_not_a_power_of_two_and_a_separate_value_width():
    q, k, _ = inputs(40, 50, 24, torch.float32)
    v = torch.randn(1, 2, 50, 40, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    out = triton_attention.triton_attention(q, k, v)
    assert out.shape == (1, 2, 40, 40)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=2e-6, rtol=1e-5)


def test_the_log_sum_exp_is_the_one_the_backward_needs():
    q, k, v = inputs(37, 70, 16, torch.float32)
    _, lse = triton_attention.triton_forward(q, k, v, False, 16**-0.5)
    want = torch.logsumexp(q @ k.transpose(-2, -1) * 16**-0.5, dim=-1, keepdim=True)
    torch.testing.assert_close(lse, want, atol=1e-5, rtol=1e-6)


def _zeros(*shape):
    return torch.zeros(*shape, device=DEVICE)


BAD = [
    ("float64", lambda t: t(*inputs(8, 8, 16, torch.float64)), TypeError, "float16, bfloat16 or float32"),
    ("3-D", lambda t: t(_zeros(8, 16), _zeros(8, 16), _zeros(8, 16)), ValueError, "4-D"),
    ("lengths", lambda t: t(*inputs(8, 8, 16, torch.float32)[:2], _zeros(1, 2, 9, 16)), ValueError,
     "share B and H"),
    ("head size", lambda t: t(_zeros(1, 2, 8, 16), _zeros(1, 2, 8, 8), _zeros(1, 2, 8, 8)),
     ValueError, "share a head size"),
] + ([("bfloat16", lambda t: t(*inputs(8, 8, 16, torch.bfloat16)), TypeError,
       "bfloat16 is not supported under")] if DEVICE == "cpu" else [])  # a GPU runs bfloat16


@pytest.mark.parametrize("call, error, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_a_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call(triton_attention.triton_attention)


def test_the_kernel_runs_where_the_tests_put_their_inputs():
    """The device logic of make gpu: CUDA tensors and the compiled kernel where there is a GPU,
    CPU tensors under the interpreter where there is none; never CPU tensors for a compiled
    kernel (it refuses them, test_cpu_tensors_without_the_interpreter_are_a_clear_error)."""
    q, _, _ = inputs(4, 4, 16, torch.float32)
    assert q.device.type == DEVICE
    assert triton_attention.INTERPRETED == (DEVICE == "cpu")
    expected = triton_attention.config_for(
        None if DEVICE == "cpu" else torch.cuda.get_device_capability(), 16, torch.float32)
    assert triton_attention._config(q) == expected


MUTANTS = {
    "no rescale of the output": ("acc = alpha[:, None] * acc + ", "acc = acc + "),
    "padded keys counted": ("keep = keys[None, :] < S", "keep = keys[None, :] >= 0"),
    "causal tiles not skipped": ("end = tl.minimum(start + BLOCK_M, S) if IS_CAUSAL else S", "end = S"),
    "diagonal tile dropped": ("tl.minimum(start + BLOCK_M, S) if IS_CAUSAL",
                              "tl.minimum(start, S) if IS_CAUSAL"),
    "no division at the end": ("out = acc / tl.where(dead, 1.0, l)[:, None]", "out = acc"),
    "log-sum-exp in base 2": (") / 1.4426950408889634  # natural log", ")"),
}


@pytest.mark.parametrize("name", MUTANTS)
def test_every_planted_bug_fails_a_check(name, tmp_path):
    old, new = MUTANTS[name]
    source = SOURCE.read_text()
    assert source.count(old) == 1, f"the mutation {name!r} no longer applies: update it"
    path = tmp_path / f"mutant_{len(name)}.py"
    path.write_text(source.replace(old, new).replace("from .tiled import", "from selfattn.tiled import"))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mutant = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mutant  # a dataclass looks its module up there
    try:
        spec.loader.exec_module(mutant)
    finally:
        del sys.modules[path.stem]
    checks = [lambda: check_forward(mutant, 45, 61, 16, torch.float32, False),
              lambda: check_forward(mutant, 61, 45, 16, torch.float32, True),
              lambda: check_backward(mutant, 45, 61, 16, torch.float32, True),
              lambda: check_causal_tiles_skipped(mutant)]
    failed = 0
    for check in checks:
        try:
            check()
        except AssertionError:
            failed += 1
    assert failed > 0, f"no check caught the planted bug {name!r}"


AOT = importlib.util.spec_from_file_location("triton_aot", ROOT / "tools" / "triton_aot.py")
triton_aot = importlib.util.module_from_spec(AOT)
AOT.loader.exec_module(triton_aot)


@pytest.mark.slow
def test_the_shipped_configurations_compile_fit_and_do_not_spill():
    """Compiled ahead of time in a fresh process (the interpreter off), with the pinned Triton
    and its own ptxas, no GPU needed (tools/triton_aot.py): each configuration config_for picks
    for a T4 (head sizes 64 and 128 in float16 and float32, bfloat16 at 64) and an A100 fits the
    GPU's shared memory and spills no registers; below compute capability 8.0 there are no
    tensor-core instructions (Triton has none there, which chapter 9 tells T4 readers), from 8.0
    there are in half precision; float32 is never multiplied in TF32 (triton_aot.problems).
    ``make gpu-rehearsal`` runs the same check with Triton 3.6, the version Colab pairs with
    torch 2.11."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "triton_aot.py")],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert triton_aot.problems(results) == []


def test_the_compile_check_names_what_is_wrong():
    """triton_aot.problems on results as the T4 configuration of 32 x 32 tiles gave them at head
    size 128 (384 bytes spilled with Triton 3.7, 1,328 with 3.6), and on a missing target."""
    good = {"arch": "sm_75", "dtype": "float16", "head": 64, "config": [32, 16, 4, 1],
            "triton": "3.7.1", "shared": 12288, "spills": 0, "mma": 0, "tf32": False}
    results = [dict(good, arch=f"sm_{m}{5 if m == 7 else 0}", dtype=d, head=h,
                    mma=64 if m == 8 and d != "float32" else 0)
               for m, d, h in triton_aot.TARGETS]
    assert triton_aot.problems(results) == []
    results[2] = dict(results[2], spills=384, config=[32, 32, 4, 1])
    assert triton_aot.problems(results) == [
        "sm_75 float16 head 128 [32, 32, 4, 1] (triton 3.7.1): 384 bytes of registers spilled"]
    assert "not" in triton_aot.problems(results[1:])[0]


@pytest.mark.slow
def test_cpu_tensors_without_the_interpreter_are_a_clear_error():
    code = ("import torch\nfrom selfattn.triton_attention import triton_attention\n"
            "x = torch.zeros(1, 1, 4, 16)\n"
            "try:\n    triton_attention(x, x, x)\nexcept RuntimeError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120).stdout
    assert re.search(r"runs on a CUDA GPU.*TRITON_INTERPRET=1", out, re.S), out


@pytest.mark.slow
def test_importing_selfattn_imports_neither_the_kernel_nor_triton():
    code = ("import selfattn, sys; from selfattn import fastpaths; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton' "
            "or m == 'selfattn.triton_attention'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
