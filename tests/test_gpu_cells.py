"""Chapter 9's GPU cells call performance.gpu_kernels and performance.sdpa_fallbacks; the book's build has no
GPU and skips those cells, so their code runs here, on a CPU at toy sizes (the Triton kernel under
the interpreter), so that it cannot rot."""

import importlib.util

import torch

from selfattn.book import performance

HAS_TRITON = importlib.util.find_spec("triton") is not None


def test_gpu_kernels_times_every_variant_or_says_why_not():
    rows = performance.gpu_kernels("cpu", lengths=(40,), dtypes=(torch.float32,), n_heads=2,
                             head_dim=16, repeats=1, warmup=0)
    names = [r["variant"] for r in rows]
    assert "SDPA, math" in names and "SDPA, its own choice" in names and "tiled (selfattn)" in names
    assert ("triton (selfattn)" in names) == HAS_TRITON
    for r in rows:
        assert ("error" in r) != ("ms" in r), r
        if "ms" in r:
            assert r["ms"] > 0 and r["tflops"] > 0 and r["peak_mib"] >= 0
    chosen = next(r for r in rows if r["variant"] == "SDPA, its own choice")
    assert "flash_attention_for_cpu" in chosen["kernel"]  # the kernel that ran, named
    math = next(r for r in rows if r["variant"] == "SDPA, math")
    assert "math" in math["kernel"]


def test_sdpa_fallbacks_names_a_kernel_for_every_call():
    rows = performance.sdpa_fallbacks("cpu", T=32, n_heads=4, head_dim=16)
    assert [r["call"] for r in rows] == ["float32, is_causal=True", "the same causal mask as a tensor",
                                          "1 key/value heads, enable_gqa=True"]
    assert all("scaled_dot_product" in r["kernel"] for r in rows)


def test_a_cpu_call_is_profiled_on_the_cpu_even_where_cuda_exists(monkeypatch):
    """make gpu runs these tests on a machine with a GPU: the kernels of a CPU call must still be
    read from the CPU's operations, not from a CUDA profile (which would find none, or fail)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    q = torch.randn(1, 2, 16, 8)
    kernels = performance._kernels_that_ran(
        lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True), "cpu")
    assert any("flash_attention_for_cpu" in k for k in kernels), kernels
