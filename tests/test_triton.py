"""The Triton kernel (selfattn.triton_attention), run on CPU tensors under Triton's interpreter.

conftest.py sets ``TRITON_INTERPRET=1`` before anything imports triton when there is no GPU.
Each result is compared with ``F.scaled_dot_product_attention`` computed in float64: the kernel's
error must be at most twice SDPA's own error in the same dtype (plus a float32 rounding floor).
Inputs are small (the interpreter runs each program one after the other, in numpy, about 5 ms
per tile), and their lengths are not multiples of the 32 x 32 tiles. Planted bugs, written into
a copy of the module's source, must each fail a check. One test compiles the kernel for a T4
(compute capability 7.5) in a fresh process, with Triton's own ptxas and no GPU.
"""

from __future__ import annotations

import importlib.util
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
FLOOR = {torch.float32: 2e-6, torch.float16: 2e-3}


def inputs(L, S, E, dtype, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, E, generator=g).to(dtype).requires_grad_(requires_grad)
               for n in (L, S, S))
    return q, k, v


def sdpa(q, k, v, is_causal, dtype):
    """SDPA in ``dtype`` (float16 computed via float32 on this CPU, as a GPU kernel would)."""
    compute = torch.float32 if dtype == torch.float16 else dtype
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
    d_out = torch.randn(1, 2, L, E, generator=torch.Generator().manual_seed(2)).to(dtype)
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
    """Keys and values past the first block are NaN: with causal tiles skipped, the first block
    of queries never loads them, so its rows stay finite and right."""
    q, k, v = inputs(64, 64, 16, torch.float32)
    block = module.config_for(None).block_m
    k2, v2 = k.clone(), v.clone()
    k2[..., block:, :] = float("nan")
    v2[..., block:, :] = float("nan")
    out = module.triton_attention(q, k2, v2, is_causal=True)[..., :block, :]
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)[..., :block, :]
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("E", [16, 32, 64])
@pytest.mark.parametrize("L, S", [(45, 61), (61, 45)])
def test_forward_is_as_exact_as_sdpa(L, S, E, is_causal, dtype):
    check_forward(triton_attention, L, S, E, dtype, is_causal)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_gradients_are_as_exact_as_sdpas(is_causal, dtype):
    check_backward(triton_attention, 45, 61, 32, dtype, is_causal)


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the later rows do read the NaN keys
def test_causal_tiles_past_the_diagonal_are_never_loaded():
    check_causal_tiles_skipped(triton_attention)


def test_a_head_size_that_is_not_a_power_of_two_and_a_separate_value_width():
    q, k, _ = inputs(40, 50, 24, torch.float32)
    v = torch.randn(1, 2, 50, 40, generator=torch.Generator().manual_seed(5))
    out = triton_attention.triton_attention(q, k, v)
    assert out.shape == (1, 2, 40, 40)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=2e-6, rtol=1e-5)


def test_the_log_sum_exp_is_the_one_the_backward_needs():
    q, k, v = inputs(37, 70, 16, torch.float32)
    _, lse = triton_attention.triton_forward(q, k, v, False, 16**-0.5)
    want = torch.logsumexp(q @ k.transpose(-2, -1) * 16**-0.5, dim=-1, keepdim=True)
    torch.testing.assert_close(lse, want, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("call, error, message", [
    (lambda t: t(*inputs(8, 8, 16, torch.bfloat16)), TypeError, "bfloat16 is not supported under"),
    (lambda t: t(*inputs(8, 8, 16, torch.float64)), TypeError, "float16, bfloat16 or float32"),
    (lambda t: t(torch.zeros(8, 16), torch.zeros(8, 16), torch.zeros(8, 16)), ValueError, "4-D"),
    (lambda t: t(*inputs(8, 8, 16, torch.float32)[:2], torch.zeros(1, 2, 9, 16)), ValueError,
     "share B and H"),
    (lambda t: t(torch.zeros(1, 2, 8, 16), torch.zeros(1, 2, 8, 8), torch.zeros(1, 2, 8, 8)),
     ValueError, "share a head size"),
], ids=["bfloat16", "float64", "3-D", "lengths", "head size"])
def test_bad_input_is_a_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call(triton_attention.triton_attention)


def test_the_layer_reaches_the_kernel_only_when_asked(monkeypatch):
    """fastpaths.triton_kernel() puts the kernel first in the fast-path table, for a with block."""
    import selfattn
    from selfattn import fastpaths

    calls = []
    real = triton_attention.triton_attention
    monkeypatch.setattr(triton_attention, "triton_attention",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    layer = selfattn.MultiHeadAttention(32, 4).eval()
    x = torch.randn(1, 40, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want, _ = layer(x, is_causal=True)
        assert calls == []
        with fastpaths.triton_kernel():
            got, _ = layer(x, is_causal=True)
            weights = layer(x, is_causal=True, need_weights=True)[1]  # not eligible: readable
        after, _ = layer(x, is_causal=True)
    assert calls == [1] and weights is not None
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(after, want)
    assert "triton" not in fastpaths.ENABLED


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


COMPILE = r"""
import inspect, json, os, re, subprocess, sys, tempfile
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from selfattn.triton_attention import DOT_PRECISION, _forward_kernel, config_for

names = list(inspect.signature(_forward_kernel.fn).parameters)
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
out = []
for major, dtype, head in json.loads(sys.argv[1]):
    cfg = config_for((major, 5 if major == 7 else 0), head, getattr(torch, dtype))
    ptr = "*fp16" if dtype == "float16" else "*fp32"
    sig = {n: ptr if n in "QKVO" else "*fp32" if n == "LSE" else "fp32" if n == "qk_scale"
           else "constexpr" if n.startswith(("IS_", "BLOCK", "DOT")) else "i32" for n in names}
    const = {"IS_CAUSAL": True, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
             "BLOCK_E": head, "BLOCK_EV": head, "DOT": DOT_PRECISION}
    src = ASTSource(_forward_kernel, sig, constexprs={(names.index(k),): v for k, v in const.items()})
    arch = f"sm_{major}{5 if major == 7 else 0}"
    kernel = triton.compile(src, target=GPUTarget("cuda", int(arch[3:]), 32),
                            options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "k.ptx"), "w").write(kernel.asm["ptx"])
        log = subprocess.run([ptxas, f"-arch={arch}", "-v", os.path.join(d, "k.ptx"), "-o",
                              os.path.join(d, "k.cubin")], capture_output=True, text=True, check=True)
    text = log.stderr + log.stdout
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", text))
    out.append({"arch": arch, "dtype": dtype, "head": head, "shared": kernel.metadata.shared,
                "spills": spills, "mma": len(re.findall(r"\bmma\.", kernel.asm["ptx"])),
                "tf32": "tf32" in kernel.asm["ptx"]})
print(json.dumps(out))
"""
# (compute capability major, dtype, head size): a T4 in both dtypes; an A100-class GPU
# (8.0, whose smallest sibling, 8.6/8.9, allows 99 KiB of shared memory a block)
TARGETS = [(7, "float16", 64), (7, "float32", 64), (8, "float16", 64), (8, "float16", 128),
           (8, "float32", 64)]


def test_the_shipped_configurations_compile_fit_and_do_not_spill():
    """Compiled ahead of time in a fresh process (the interpreter off), with Triton's own ptxas
    and no GPU: each configuration config_for picks fits the GPU's shared memory and spills no
    registers; below compute capability 8.0 there are no tensor-core instructions (Triton has
    none there, which chapter 9 tells T4 readers), from 8.0 there are in half precision; and
    float32 is never multiplied in TF32."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(TARGETS)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    for r in json.loads(done.stdout.strip().splitlines()[-1]):
        limit = 64 * 1024 if r["arch"] == "sm_75" else 99 * 1024
        assert r["shared"] <= limit and r["spills"] == 0, r
        # tensor cores: half precision from 8.0; float32 in full precision never uses them
        assert (r["mma"] > 0) == (r["arch"] != "sm_75" and r["dtype"] == "float16"), r
        assert not r["tf32"], r


def test_cpu_tensors_without_the_interpreter_are_a_clear_error():
    code = ("import torch\nfrom selfattn.triton_attention import triton_attention\n"
            "x = torch.zeros(1, 1, 4, 16)\n"
            "try:\n    triton_attention(x, x, x)\nexcept RuntimeError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120).stdout
    assert re.search(r"runs on a CUDA GPU.*TRITON_INTERPRET=1", out, re.S), out


def test_importing_selfattn_imports_neither_the_kernel_nor_triton():
    code = ("import selfattn, sys; from selfattn import fastpaths; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton' "
            "or m == 'selfattn.triton_attention'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
