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
