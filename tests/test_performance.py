"""Chapter 9's topic module: the functions its page calls to fold its evidence."""

import pytest

from selfattn.book import performance


@pytest.fixture(scope="module")
def rows():
    return performance.attention_benchmark(batch=1, T=16, d_model=16, n_heads=2, repeats=3,
                                           min_sample_s=0.0)


def test_layer_tables_each_against_one_reference(rows):
    training, inference = performance.layer_tables(rows)
    core, layer = "core: F.scaled_dot_product_attention", f"layer: {performance.TORCH}"
    for reference in (core, layer):  # each level's reference is 1 in both training columns
        assert training[reference] == {"forward": 1.0, "forward+backward": 1.0}
    assert all(set(columns) == {"forward", "forward+backward"} for columns in training.values())
    floor = inference[f"layer: {performance.FLOOR}"]
    assert floor["vs floor"] == 1.0 and floor["ms"] > 0 and floor["gflops"] > 0
    assert all(name.startswith("layer: ") for name in inference)
    assert f"layer: {performance.FAST}" in inference


def test_reference_kernels_names_the_fused_and_the_unfused_path():
    runs = performance.reference_kernels(d_model=16, n_heads=2, T=8)
    training = runs["training: forward+backward"]
    assert "flash_attention" in training and "flash_attention_for_cpu_backward" in training
    inference = runs["inference: eval, no_grad, causal"]
    assert "_native_multi_head_attention" in inference and "bmm x2" in inference
    assert "flash" not in inference


def test_published_peaks_are_found_by_the_name_cuda_gives():
    assert performance.published_peak_tflops("Tesla T4", "float16") == 65.0
    assert performance.published_peak_tflops("NVIDIA A100-SXM4-40GB", "float32") == 19.5
    assert performance.published_peak_tflops("NVIDIA H100 80GB HBM3", "float16") is None
    assert performance.published_peak_tflops("NVIDIA H100 SXM5 80GB", "bfloat16") == 989.4
    assert performance.published_peak_tflops("Tesla T4", "bfloat16") is None
    assert performance.published_peak_tflops("NVIDIA GeForce RTX 4090", "float16") is None


def test_with_published_peak_divides_the_rate_where_it_can():
    rows = [{"dtype": "float16", "tflops": 13.0}, {"dtype": "float32", "error": "no backend"},
            {"dtype": "bfloat16", "tflops": 1.0}]
    got = performance.with_published_peak(rows, "Tesla T4")
    assert got[0]["of_peak"] == 13.0 / 65.0 and got[1]["of_peak"] is None
    assert got[2]["of_peak"] is None and "of_peak" not in rows[0]
