"""The benchmarks of make bench, run tiny: their rows and ratios (times are make bench's job)."""

import pytest
import torch

import selfattn
from selfattn import fastpaths
from selfattn.book import baselines, bench, measure


def test_attention_benchmark_rows_and_their_ratios():
    rows = bench.attention_benchmark(batch=1, T=16, d_model=16, n_heads=2, repeats=3,
                                     min_sample_s=0.001)
    assert {r["mode"] for r in rows} == {"forward", "forward+backward", "inference, causal"}
    for r in rows:
        reference = ("F.scaled_dot_product_attention" if r["level"] == "core"
                     else "nn.MultiheadAttention(need_weights=False)")
        if r["variant"] == reference:
            assert r["vs_reference"] == 1.0
        if r["variant"] == "F.scaled_dot_product_attention":
            assert r["vs_sdpa"] == 1.0
        assert r["ms"] > 0 and r["gflops"] > 0
    assert "plain matmul attention" in {r["variant"] for r in rows}
    assert {r["mode"] for r in rows if r["variant"] == bench.FLOOR} == {
        "forward", "forward+backward", "inference, causal"}
    # causal inference counts only the products the mask keeps: 16 * 17 / 2 of the 16^2 scores
    sdpa = next(r for r in rows if r["mode"] == "inference, causal" and r["level"] == "core")
    flops = sdpa["gflops"] * 1e9 * sdpa["ms"] / 1e3
    assert abs(flops - measure.attention_flops(16, 16, 8, 2, 1) * 17 / 32) < 1e-3 * flops


def test_decode_bytes_and_a_tiny_decode_benchmark():
    mha = measure.decode_bytes(1024, 16, 16, context=16384)
    mqa = measure.decode_bytes(1024, 16, 1, context=16384)
    assert mha["cache"] == 2 * 16 * 16384 * 64 * 4 and mha["cache"] == 16 * mqa["cache"]
    assert mha["weights"] == 4 * 1024 * 1024 * 4
    rows = bench.decode_benchmark([8, 16], d_model=32, n_heads=4, kv_heads=(4, 2, 1),
                                  bare=True, repeats=2, warmup=1)
    assert {r["variant"] for r in rows} == {"MHA", "GQA-2", "MQA", "GQA-2 naive", "MQA naive",
                                            "MHA bare", "MQA bare"}
    assert all(r["ms_per_token"] > 0 for r in rows)
    assert "MQA naive" in bench.decode_table(rows)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("context", [9, 4100])  # F.sdpa, then the split cache for GQA-2 and MQA
def test_the_bare_decode_step_computes_what_the_layer_computes(monkeypatch, n_kv_heads, context):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)  # split the cache as on 4 cores
    torch.manual_seed(0)
    m = selfattn.MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads).eval()
    cache_a, x = bench._decode_inputs(m, context)
    cache_b, _ = bench._decode_inputs(m, context)
    with torch.no_grad():
        for _ in range(2):  # an odd cache length, then an even one
            x = torch.randn(1, 1, 32)
            torch.testing.assert_close(baselines.bare_decode_step(m, x, cache_a),
                                       m(x, is_causal=True, kv_cache=cache_b)[0])
    assert cache_a.length == cache_b.length == context + 2


def test_the_bare_decode_step_refuses_what_it_does_not_compute():
    cache, x = bench._decode_inputs(selfattn.MultiHeadAttention(32, 4).eval(), 3)
    for layer, token in [(selfattn.MultiHeadAttention(32, 4, rope=True).eval(), x),
                         (selfattn.MultiHeadAttention(32, 4), x),
                         (selfattn.MultiHeadAttention(32, 4).eval(), x.expand(1, 2, 32))]:
        with pytest.raises(ValueError, match="one token"):
            baselines.bare_decode_step(layer, token, cache)


def test_the_naive_decode_step_copies_the_cache_and_computes_the_same():
    m = selfattn.MultiHeadAttention(32, 4, n_kv_heads=2).eval()
    cache_a, x = bench._decode_inputs(m, 9)
    cache_b, _ = bench._decode_inputs(m, 9)
    with torch.no_grad():
        grouped = m(x, is_causal=True, kv_cache=cache_b)[0]
        with fastpaths.disabled("grouped_heads"):
            naive = m(x, is_causal=True, kv_cache=cache_a)[0]
            copy_bytes = measure.peak_memory(lambda: m(x, is_causal=True, kv_cache=cache_a))
        no_copy = measure.peak_memory(lambda: m(x, is_causal=True, kv_cache=cache_b))
    torch.testing.assert_close(naive, grouped)
    assert copy_bytes >= no_copy + 2 * 4 * 10 * 8 * 4  # keys and values of 10 tokens, 4 heads


def test_a_tiny_fastpath_benchmark_has_a_row_per_path():
    rows = bench.fastpath_benchmark(repeats=2, min_sample_s=0.001, batch=2, T=8, d_model=16,
                                    contexts=(16, 16))
    assert sorted(r["fast path"] for r in rows) == sorted(fastpaths.ENABLED)
    assert all(r["ms with"] > 0 and r["ms without"] > 0 and r["speed-up"] > 0 for r in rows)
    assert all(fastpaths.ENABLED.values())  # switched back on


def test_a_tiny_scaling_benchmark_has_every_variant_at_every_length_and_the_tiled_targets():
    rows = bench.scaling_benchmark(lengths=(16, 32), n_heads=2, head_dim=8, block_size=8,
                                   repeats=2, min_sample_s=0.001)
    assert sorted((r["T"], r["variant"]) for r in rows) == sorted(
        (T, v) for T in (16, 32) for v in ("tiled (selfattn)", "explicit (selfattn)",
                                           "F.scaled_dot_product_attention"))
    assert all(r["ms"] > 0 and r["peak_mb"] > 0 for r in rows)
    at = {r["variant"]: r for r in rows if r["T"] == 32}
    targets = bench.tiled_targets(rows)
    assert [label for label, *_ in targets] == ["explicit / tiled peak memory at T=32",
                                                "tiled / explicit time at T=32",
                                                "tiled / F.sdpa time at T=32"]
    memory = targets[0][1]
    assert memory == at["explicit (selfattn)"]["peak_mb"] / at["tiled (selfattn)"]["peak_mb"] > 1
    assert targets[2][1] == at["tiled (selfattn)"]["ms"] / at["F.scaled_dot_product_attention"]["ms"]
    assert all(met == (ratio >= goal if op == ">=" else ratio < goal if op == "<" else ratio <= goal)
               for _, ratio, op, goal, met in targets)
