"""The benchmarks of make bench, run tiny: their rows and ratios (times are make bench's job)."""

import copy
import re

import pytest
import torch

import selfattn
from selfattn import fastpaths
from selfattn.book import bench, multi_head, performance
from selfattn.book.kit import measure


def test_attention_benchmark_rows_and_their_ratios():
    rows = performance.attention_benchmark(batch=1, T=16, d_model=16, n_heads=2, repeats=3,
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
    assert {r["mode"] for r in rows if r["variant"] == performance.FLOOR} == {
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
    rows = multi_head.decode_benchmark([8, 16], d_model=32, n_heads=4, kv_heads=(4, 2, 1),
                                  bare=True, repeats=2, warmup=1)
    assert {r["variant"] for r in rows} == {"MHA", "GQA-2", "MQA", "GQA-2 naive", "MQA naive",
                                            "MHA bare", "MQA bare"}
    assert all(r["ms_per_token"] > 0 for r in rows)
    assert "MQA naive" in multi_head.decode_table(rows)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("context", [9, 4100])  # F.sdpa, then the split cache for GQA-2 and MQA
def test_the_bare_decode_step_computes_what_the_layer_computes(monkeypatch, n_kv_heads, context):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)  # split the cache as on 4 cores
    torch.manual_seed(0)
    m = selfattn.MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads).eval()
    cache_a, x = multi_head._decode_inputs(m, context)
    cache_b, _ = multi_head._decode_inputs(m, context)
    with torch.no_grad():
        for _ in range(2):  # an odd cache length, then an even one
            x = torch.randn(1, 1, 32)
            torch.testing.assert_close(multi_head.bare_decode_step(m, x, cache_a),
                                       m(x, is_causal=True, kv_cache=cache_b)[0])
    assert cache_a.length == cache_b.length == context + 2


def test_the_bare_decode_step_refuses_what_it_does_not_compute():
    cache, x = multi_head._decode_inputs(selfattn.MultiHeadAttention(32, 4).eval(), 3)
    for layer, token in [(selfattn.MultiHeadAttention(32, 4, rope=True).eval(), x),
                         (selfattn.MultiHeadAttention(32, 4), x),
                         (selfattn.MultiHeadAttention(32, 4).eval(), x.expand(1, 2, 32))]:
        with pytest.raises(ValueError, match="one token"):
            multi_head.bare_decode_step(layer, token, cache)


def test_the_naive_decode_step_copies_the_cache_and_computes_the_same():
    m = selfattn.MultiHeadAttention(32, 4, n_kv_heads=2).eval()
    cache_a, x = multi_head._decode_inputs(m, 9)
    cache_b, _ = multi_head._decode_inputs(m, 9)
    with torch.no_grad():
        grouped = m(x, is_causal=True, kv_cache=cache_b)[0]
        with fastpaths.disabled("grouped_heads"):
            naive = m(x, is_causal=True, kv_cache=cache_a)[0]
            copy_bytes = measure.peak_memory(lambda: m(x, is_causal=True, kv_cache=cache_a))
        no_copy = measure.peak_memory(lambda: m(x, is_causal=True, kv_cache=cache_b))
    torch.testing.assert_close(naive, grouped)
    assert copy_bytes >= no_copy + 2 * 4 * 10 * 8 * 4  # keys and values of 10 tokens, 4 heads


def test_a_tiny_fastpath_benchmark_has_a_row_per_path():
    rows = performance.fastpath_benchmark(repeats=2, min_sample_s=0.001, batch=2, T=8, d_model=16,
                                    contexts=(16, 16))
    assert sorted(r["fast path"] for r in rows) == sorted(fastpaths.ENABLED)
    assert all(r["ms with"] > 0 and r["ms without"] > 0 and r["speed-up"] > 0 for r in rows)
    assert all(fastpaths.ENABLED.values())  # switched back on


def test_a_tiny_scaling_benchmark_has_every_variant_at_every_length_and_the_tiled_targets():
    rows = performance.scaling_benchmark(lengths=(16, 32), n_heads=2, head_dim=8, block_size=8,
                                   repeats=2, min_sample_s=0.001)
    assert sorted((r["T"], r["variant"]) for r in rows) == sorted(
        (T, v) for T in (16, 32) for v in ("tiled (selfattn)", "explicit (selfattn)",
                                           "F.scaled_dot_product_attention"))
    assert all(r["ms"] > 0 and r["peak_mb"] > 0 for r in rows)
    at = {r["variant"]: r for r in rows if r["T"] == 32}
    memory, time, sdpa = bench.tiled_targets(rows)
    assert [t.label for t in (memory, time, sdpa)] == ["explicit / tiled peak memory at T=32",
                                                       "tiled / explicit time at T=32",
                                                       "tiled / F.sdpa time at T=32"]
    assert memory.ratio == at["explicit (selfattn)"]["peak_mb"] / at["tiled (selfattn)"]["peak_mb"] > 1
    assert sdpa.ratio == at["tiled (selfattn)"]["ms"] / at["F.scaled_dot_product_attention"]["ms"]
    assert [(t.op, t.goal) for t in (memory, time, sdpa)] == [(">=", 8.0), ("<", 1.0), ("<=", 2.5)]


@pytest.mark.slow
def test_a_tiny_training_benchmark_has_every_variant_at_every_length_and_its_targets(tiny):
    rows = tiny["training"]
    assert sorted((r["T"], r["variant"]) for r in rows) == sorted(
        (T, v) for T in (16, 32) for v in performance.TRAINING_VARIANTS)
    assert all(r["fwd_bwd_ms"] > 0 and r["saved_mb"] > 0 for r in rows)
    # the fresh process measures only the lengths asked for
    assert [r["process_peak_mb"] is None for r in rows] == [T == 16 for T in (16,) * 3 + (32,) * 3]
    at = {r["variant"]: r for r in rows if r["T"] == 32}
    assert at["tiled (selfattn)"]["saved_mb"] < at["explicit (selfattn)"]["saved_mb"]
    saved, time = bench.training_targets(rows, saved_at=16)
    assert [(t.label, t.op, t.goal) for t in (saved, time)] == [
        ("tiled / explicit bytes saved for backward at T=16", "<=", 1 / 8),
        ("tiled / explicit forward+backward time at T=32", "<", 1.0)]
    at16 = {r["variant"]: r for r in rows if r["T"] == 16}
    assert saved.ratio == at16["tiled (selfattn)"]["saved_mb"] / at16["explicit (selfattn)"]["saved_mb"]
    assert time.ratio == at["tiled (selfattn)"]["fwd_bwd_ms"] / at["explicit (selfattn)"]["fwd_bwd_ms"]


def test_the_printer_says_met_or_missed_with_three_decimals(capsys):
    met = bench.Target("a ratio under its goal", 0.99949, "<=", 1.0)
    missed = bench.Target("a speed-up just short of its goal", 3.4994, ">=", 3.5,
                          note="0.28 of the bytes bound, 12.4x")
    assert met.met and not missed.met
    bench._print_targets("targets", [met, missed])
    title, first, second = capsys.readouterr().out.splitlines()
    assert title.startswith("targets")
    assert re.fullmatch(r"  a ratio under its goal +0\.999  target <= 1\.00  met", first)
    assert re.fullmatch(r"  a speed-up just short of its goal +3\.499  target >= 3\.50  MISSED"
                        r"  \(0\.28 of the bytes bound, 12\.4x\)", second)
    assert first.index("0.999") == second.index("3.499")  # one column for every ratio
    assert not bench.Target("strictly below", 1.0, "<", 1.0).met
    with pytest.raises(ValueError, match="op must be one of"):
        bench.Target("no such comparison", 1.0, "=>", 1.0)


@pytest.fixture(scope="module")
def tiny() -> dict[str, list[dict]]:
    """Every benchmark of make bench, run tiny (decode with 16 query heads: MHA, GQA-4, MQA)."""
    return {
        "attention": performance.attention_benchmark(batch=1, T=16, d_model=16, n_heads=2, repeats=3,
                                               min_sample_s=0.001),
        "fastpaths": performance.fastpath_benchmark(repeats=2, min_sample_s=0.001, batch=2, T=8,
                                              d_model=16, contexts=(16, 16)),
        "scaling": performance.scaling_benchmark(lengths=(16, 32), n_heads=2, head_dim=8, block_size=8,
                                           repeats=2, min_sample_s=0.001),
        "decode": multi_head.decode_benchmark([8, 16], d_model=64, n_heads=16, kv_heads=(16, 4, 1),
                                         bare=True, repeats=2, warmup=1),
        "training": performance.training_benchmark(lengths=(16, 32), n_heads=2, head_dim=8, repeats=2,
                                             min_sample_s=0.001, process_lengths=(32,)),
        "prefill": bench.prefill_benchmark(L=64, d_model=32, n_heads=4, repeats=2,
                                           min_sample_s=0.001),
        "cache_steps": bench.cache_step_benchmark(window=32, d_model=32, n_heads=4, n_sink=2,
                                                  repeats=2, min_sample_s=0.001),
    }


def _all_targets(tiny: dict[str, list[dict]]) -> list[bench.Target]:
    return [*bench.attention_targets(tiny["attention"]), *bench.fastpath_targets(tiny["fastpaths"]),
            *bench.tiled_targets(tiny["scaling"]), *bench.training_targets(tiny["training"], 32),
            *bench.decode_targets(tiny["decode"], d_model=64, n_heads=16),
            *bench.prefill_targets(tiny["prefill"]), *bench.cache_step_targets(tiny["cache_steps"])]


@pytest.mark.slow
def test_every_target_has_a_goal(tiny):
    targets = _all_targets(tiny)
    assert len(targets) == 10 + len(fastpaths.ENABLED) + 3 + 2 + 4 + 3 + 6
    assert len({t.label for t in targets}) == len(targets)
    for t in targets:
        assert t.op in ("<=", ">=", "<") and isinstance(t.goal, float) and t.goal > 0, t
        assert t.ratio > 0 and isinstance(t.met, bool), t


@pytest.mark.slow
def test_the_causal_weights_rows_and_their_targets(tiny):
    rows = tiny["attention"]
    causal = {(r["mode"], r["variant"]) for r in rows if r["causal"]}
    for mode in ("forward", "forward+backward"):
        weights = performance.WEIGHTS + performance.CAUSAL
        torch_weights = performance.TORCH_WEIGHTS + performance.CAUSAL
        assert {(mode, weights), (mode, torch_weights)} == {
            key for key in causal if key[0] == mode}
    assert all(r["causal"] for r in rows if r["mode"] == "inference, causal")
    ms = {(r["mode"], r["variant"]): r["ms"] for r in rows}
    targets = {t.label: t for t in bench.attention_targets(rows)}
    for mode, short, goal in [("forward", "forward", 1.10), ("forward+backward", "fwd+bwd", 1.10)]:
        t = targets[f"causal weights / nn.MHA(need_weights=True), {short}"]
        assert (t.op, t.goal) == ("<=", goal)
        assert t.ratio == ms[(mode, weights)] / ms[(mode, performance.TORCH_WEIGHTS
                                                                               + performance.CAUSAL)]
    t = targets["causal weights / nn.MHA(need_weights=True), inference"]
    assert (t.op, t.goal) == ("<=", 0.9)
    assert t.ratio == (ms[("inference, causal", performance.WEIGHTS + performance.CAUSAL)]
                       / ms[("inference, causal", performance.TORCH_WEIGHTS + performance.CAUSAL)])
    # every inference call is causal: the weights' times sit in the ", causal" rows
    assert ("inference, causal", performance.WEIGHTS) not in ms
    # a causal row counts only the products the mask keeps, as the inference rows do
    causal_weights = performance.WEIGHTS + performance.CAUSAL
    row = next(r for r in rows if r["mode"] == "forward" and r["variant"] == causal_weights)
    dropped = measure.attention_flops(16, 16, 8, 2, 1) * 15 / 32
    assert abs(row["gflops"] * row["ms"] * 1e6 - (measure.mha_flops(1, 16, 16) - dropped)) < 1e-3 * 1e6


@pytest.mark.slow
def test_the_decode_targets_judge_the_longest_context_against_the_bytes_bound(tiny):
    rows = tiny["decode"]
    ms = {r["variant"]: r["ms_per_token"] for r in rows if r["context"] == 16}
    targets = bench.decode_targets(rows, d_model=64, n_heads=16)
    assert [(t.label, t.op, t.goal) for t in targets] == [
        ("MQA speed-up over MHA at 16", ">=", 3.5), ("GQA-4 speed-up over MHA at 16", ">=", 2.0),
        ("GQA-4 naive slow-down at 16", ">=", 4.0), ("MQA naive slow-down at 16", ">=", 4.0)]
    mqa = targets[0]
    assert mqa.ratio == ms["MHA"] / ms["MQA"]
    bound = (measure.decode_bytes(64, 16, 16, 16)["total"]
             / measure.decode_bytes(64, 16, 1, 16)["total"])
    assert mqa.note == f"{mqa.ratio / bound:.2f} of the bytes bound, {bound:.1f}x"
    assert targets[3].ratio == ms["MQA naive"] / ms["MQA"]


@pytest.mark.slow
def test_main_prints_every_target_and_a_summary_and_writes_every_table(tiny, monkeypatch, tmp_path,
                                                                       capsys):
    for name, key in [("attention_benchmark", "attention"), ("fastpath_benchmark", "fastpaths"),
                      ("scaling_benchmark", "scaling"), ("decode_benchmark", "decode"),
                      ("training_benchmark", "training"), ("prefill_benchmark", "prefill"),
                      ("cache_step_benchmark", "cache_steps")]:
        monkeypatch.setattr(bench, name, lambda *a, rows=tiny[key], **k: copy.deepcopy(rows))
    monkeypatch.setattr(bench, "matmul_gflops", lambda: 1.0)
    monkeypatch.setattr(bench, "decode_targets",  # the tiny decode layer's sizes, for the bound
                        lambda rows, d_model, n_heads, f=bench.decode_targets: f(rows, 64, 16))
    monkeypatch.setattr(bench, "training_targets",  # the bytes saved at the tiny lengths
                        lambda rows, saved_at=32, f=bench.training_targets: f(rows, saved_at))
    bench.main(str(tmp_path))
    out = capsys.readouterr().out.splitlines()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "attention.csv", "bench.png", "cache_steps.csv", "decode.csv", "fastpaths.csv",
        "prefill.csv", "scaling.csv", "training.csv"]
    assert performance.cpu_model() in out[0] and f"{torch.get_num_threads()} threads" in out[0]
    expected = [bench.format_target(t) for t in _all_targets(tiny)]
    assert [line for line in out if "  target " in line] == expected
    met = sum(" met" in line.split("  target ")[1] for line in expected)
    assert re.fullmatch(rf"{met} of {len(expected)} targets met(; MISSED: .+)?", out[-1])
    assert any("not a target" in line and "4.0x" in line for line in out)


def test_decode_benchmark_builds_its_layers_and_caches_on_the_device_it_is_given(device,
                                                                                 monkeypatch):
    seen, original = [], multi_head._decode_inputs

    def spy(model, context, seed=0):
        cache, x = original(model, context, seed)
        k, _ = cache.append(x.new_zeros(1, model.config.n_kv_heads, 0, model.config.head_dim),
                            x.new_zeros(1, model.config.n_kv_heads, 0, model.config.head_dim))
        seen.append({next(model.parameters()).device.type, x.device.type, k.device.type})
        return cache, x

    monkeypatch.setattr(multi_head, "_decode_inputs", spy)
    rows = multi_head.decode_benchmark([8], d_model=32, n_heads=4, kv_heads=(4, 1), repeats=1,
                                  warmup=0, device=device)
    assert len(seen) == 3 and all(s == {torch.device(device).type} for s in seen)
    assert [r["variant"] for r in rows] == ["MHA", "MQA", "MQA naive"]
    assert all(r["ms_per_token"] > 0 for r in rows)


@pytest.mark.parametrize("threads", [1, 4])
def test_decode_benchmark_records_whether_the_split_of_the_keys_ran(monkeypatch, threads):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)  # split as on `threads` cores
    monkeypatch.setattr(fastpaths, "SPLIT_KV_MIN_KEYS", 16)  # a tiny cache is "long"
    rows = multi_head.decode_benchmark([8, 32], d_model=32, n_heads=4, kv_heads=(4, 1), repeats=1,
                                  warmup=0)
    ran = {(r["context"], r["variant"]): r["split_kv"] for r in rows}
    # MQA's one key/value head splits from 16 keys on 4 threads; MHA's 4 heads give 1 per thread
    assert ran == {(c, v): threads == 4 and c == 32 and v == "MQA"
                   for c in (8, 32) for v in ("MHA", "MQA", "MQA naive")}
    assert fastpaths._split_kv_attention.__name__ == "_split_kv_attention"  # put back


def test_a_tiny_prefill_benchmark_has_both_layouts_and_the_mqa_targets():
    rows = bench.prefill_benchmark(L=64, d_model=32, n_heads=4, kv_heads=(2, 1), repeats=2,
                                   min_sample_s=0.001)
    assert [r["variant"] for r in rows] == ["GQA-2", "MQA"]
    assert all(r["ms"] > 0 and r["ms_off"] > 0 and r["peak_mib"] > 0 for r in rows)
    mqa = rows[1]
    assert mqa["qkvo_mib"] == 64 * 8 * (2 * 4 + 2) * 4 / 2**20  # q, k, v and output, float32
    assert mqa["peak_mib"] < mqa["peak_mib_off"]  # the readable copy of the key/value heads
    memory, qkvo, time = bench.prefill_targets(rows)
    assert memory.ratio == mqa["peak_mib"] / mqa["peak_mib_off"] and memory.goal == 1.5
    assert qkvo.ratio == mqa["peak_mib"] / mqa["qkvo_mib"] and qkvo.goal == 3.0
    assert time.ratio == mqa["ms"] / mqa["ms_off"] and time.goal == 1.1
    assert all(fastpaths.ENABLED.values())  # switched back on


def test_a_tiny_cache_step_benchmark_measures_every_cache_at_the_same_length():
    rows = bench.cache_step_benchmark(window=32, d_model=32, n_heads=4, n_sink=2, repeats=2,
                                      min_sample_s=0.001)
    assert [r["cache"] for r in rows] == ["KVCache", "PagedKVCache", "SlidingWindowCache(32)",
                                          "SinkCache(2, 32)"]
    held = {r["cache"]: r["held_mib"] * 2**20 for r in rows}
    token = 2 * 32 * 4  # one token's keys and values, float32
    assert held == {"KVCache": 33 * token, "PagedKVCache": 33 * token,  # reset to 32, then one
                    "SlidingWindowCache(32)": 32 * token, "SinkCache(2, 32)": 34 * token}
    step = {r["cache"]: r["step_kib"] * 2**10 for r in rows}
    assert step["PagedKVCache"] >= 33 * token  # its gather, documented
    assert step["SlidingWindowCache(32)"] < 8 * token and step["SinkCache(2, 32)"] < 8 * token
    targets = bench.cache_step_targets(rows)
    assert len(targets) == 6 and all(t.label.startswith(("SlidingWindowCache", "SinkCache"))
                                     for t in targets)
