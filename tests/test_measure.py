"""The measuring tools of selfattn.book.kit.measure: FLOP counts, the exponent fit, contention, memory.

No timing assertions: these machines are shared; make bench reports times, tests check the tools.
"""

import itertools
import math
import pathlib

import pytest
import torch
import torch.nn.functional as F
from reference import counted_flops

import selfattn
from selfattn.book import single_head
from selfattn.book.kit import measure


@pytest.mark.parametrize(("L", "S", "E", "H", "B"), [(3, 5, 4, 1, 1), (16, 16, 8, 4, 2)])
def test_attention_flops_match_pytorchs_counter(L, S, E, H, B):
    q = torch.randn(B, H, L, E, requires_grad=True)
    k = torch.randn(B, H, S, E, requires_grad=True)
    v = torch.randn(B, H, S, E, requires_grad=True)
    assert measure.attention_flops(L, S, E, H, B) == 2 * 2 * B * H * L * S * E
    assert counted_flops(lambda: selfattn.scaled_dot_product_attention(q, k, v)) == \
        measure.attention_flops(L, S, E, H, B)

    def forward_backward():
        out, _ = selfattn.scaled_dot_product_attention(q, k, v)
        out.sum().backward()

    assert counted_flops(forward_backward) == measure.attention_flops(L, S, E, H, B, backward=True)


def test_mha_flops_match_pytorchs_counter():
    B, T, d = 2, 12, 16
    m = selfattn.MultiHeadAttention(d, 4)
    x = torch.randn(B, T, d, requires_grad=True)
    assert counted_flops(lambda: m(x, need_weights=True)) == measure.mha_flops(B, T, d)

    def forward_backward():
        out, _ = m(x, need_weights=True)
        out.sum().backward()

    assert counted_flops(forward_backward) == measure.mha_flops(B, T, d, backward=True)


@pytest.mark.parametrize("p", [1.0, 2.0, 1.5])
def test_fit_exponent_recovers_a_power_law(p):
    sizes = [128, 256, 512, 1024, 2048]
    assert measure.fit_exponent(sizes, [3e-6 * n**p for n in sizes]) == pytest.approx(p)
    noisy = [3e-6 * n**p * (1.1 if i % 2 else 0.9) for i, n in enumerate(sizes)]
    assert measure.fit_exponent(sizes, noisy) == pytest.approx(p, abs=0.1)


def test_peak_memory_counts_what_a_function_holds_at_once():
    def two_buffers():
        a = torch.ones(1000)  # 4,000 bytes
        b = torch.ones(2000)  # 8,000 bytes, while a is alive
        del a
        c = torch.ones(500)  # a is gone: the peak stays 12,000
        return b.sum() + c.sum()

    assert 12_000 <= measure.peak_memory(two_buffers) < 12_000 + 64


def test_peak_memory_of_explicit_attention_grows_with_t_squared_and_sdpa_does_not():
    def peaks(T):
        q = torch.randn(1, 4, T, 32)
        with torch.no_grad():
            explicit = measure.peak_memory(lambda: selfattn.scaled_dot_product_attention(q, q, q))
            fused = measure.peak_memory(lambda: F.scaled_dot_product_attention(q, q, q))
        return explicit, fused

    (e1, f1), (e2, f2) = peaks(256), peaks(512)
    assert e1 >= 4 * 256 * 256 * 4  # the (4, 256, 256) fp32 scores, softmaxed in place
    assert 3.5 < e2 / e1 < 4.5  # the (T, T) matrices dominate: x4 when T doubles
    assert f2 / f1 < 2.5  # no T x T matrix: about x2 (output and row statistics)


def test_compare_discards_samples_taken_while_others_used_the_cpu(monkeypatch):
    calls = {"a": 0, "b": 0}

    def make(name):
        def fn():
            calls[name] += 1
        return fn

    # quiet machine: /proc/stat says nothing else ran
    monkeypatch.setattr(measure, "_cpu_busy_seconds", lambda: 0.0)
    quiet = measure.compare({"a": make("a"), "b": make("b")}, repeats=5, warmup=1,
                          min_sample_s=0.001)
    assert set(quiet) == {"a", "b"} and all(t.discarded == 0 for t in quiet.values())
    assert all(len(t.samples) == 5 and t.median > 0 for t in quiet.values())
    # busy machine: every reading is 10 CPU seconds later than the last
    clock = itertools.count(0.0, 10.0)
    monkeypatch.setattr(measure, "_cpu_busy_seconds", lambda: next(clock))
    busy = measure.compare({"a": make("a")}, repeats=5, warmup=1, min_sample_s=0.001)
    assert busy["a"].discarded == 5 and len(busy["a"].samples) == 5  # all kept, all flagged


def test_compare_rotates_the_order_of_variants(monkeypatch):
    monkeypatch.setattr(measure, "_cpu_busy_seconds", lambda: 0.0)
    order = []
    fns = {name: (lambda n=name: order.append(n)) for name in "abc"}
    measure.compare(fns, repeats=3, warmup=0, min_sample_s=0.0)
    timed = order[3:]  # after one calibration call each
    assert timed == list("abc") + list("bca") + list("cab")
    assert math.isfinite(measure.compare(fns, repeats=1, warmup=0)["a"].median)


def test_timing_waits_for_the_gpu_before_reading_the_clock(monkeypatch):
    """On CUDA a call returns once its kernels are queued: every clock read must follow a sync.
    This machine has no GPU, so CUDA is faked: each 'kernel' only finishes at the next sync."""
    events = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(measure, "_cpu_busy_seconds", lambda: 0.0)

    def launch():
        events.append("launch")

    measure.median_time(launch, repeats=2, warmup=0)
    measure.compare({"a": launch}, repeats=2, warmup=0, min_sample_s=0.0)
    # between a launch and the next clock read there is always a sync
    timed = "".join("L" if e == "launch" else "s" for e in events)
    assert "LL" not in timed and timed.startswith("sL") and timed.endswith("Ls")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # CUDA never used: no sync
    events.clear()
    measure.median_time(launch, repeats=2, warmup=0)
    assert events == ["launch", "launch"]


LINUX = pathlib.Path("/proc/self/clear_refs").exists()  # where a process's peak can be reset
on_linux = pytest.mark.skipif(not LINUX, reason="only Linux reports a process's peak memory")


@on_linux
def test_process_peak_memory_sees_what_the_process_holds():
    held = measure.process_peak_memory(lambda: torch.ones(64 * 2**20 // 4).add_(1))  # 64 MiB
    assert 60 * 2**20 < held < 200 * 2**20


def test_saved_tensor_bytes_counts_each_storage_autograd_keeps_once():
    x = torch.randn(1000, requires_grad=True)
    y = torch.randn(1000, requires_grad=True)
    assert measure.saved_tensor_bytes(lambda: x * y) == 2 * 4000  # mul keeps both factors
    assert measure.saved_tensor_bytes(lambda: x * x) == 4000  # one storage, saved twice
    assert measure.saved_tensor_bytes(lambda: x[:10] * y[:10]) == 2 * 4000  # views keep it all
    assert measure.saved_tensor_bytes(lambda: torch.exp(x).exp()) == 2 * 4000  # two outputs
    assert measure.saved_tensor_bytes(lambda: x + y) == 0  # addition's backward needs nothing
    with torch.no_grad():
        assert measure.saved_tensor_bytes(lambda: x * y) == 0


def test_op_counts_sees_that_einsum_and_matmul_run_the_same_products():
    from selfattn.book.performance import einsum_attention, matmul_attention

    q, k, v = torch.randn(3, 2, 4, 16, 8).unbind(0)
    einsum, matmul = (measure.op_counts(lambda f=f: f(q, k, v))
                      for f in (einsum_attention, matmul_attention))
    assert einsum["bmm"] == matmul["bmm"] == 2  # QK^T and AV, whichever way they are written
    assert einsum["_softmax"] == matmul["_softmax"] == 1
    torch.testing.assert_close(einsum_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    torch.testing.assert_close(matmul_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    fused = measure.op_counts(lambda: F.scaled_dot_product_attention(q, k, v))
    assert "bmm" not in fused and "_softmax" not in fused  # one fused kernel instead
    assert sum(fused.values()) < sum(matmul.values())


@on_linux
@pytest.mark.slow
def test_fresh_process_peak_memory_counts_the_call_not_its_input():
    # the explicit path holds the scores and the weights at once: 8 heads of 1024 x 1024 floats each
    scores = 8 * 1024 * 1024 * 4  # 32 MiB
    explicit = measure.fresh_process_peak_memory("selfattn.scaled_dot_product_attention", 1024, 8, 64)
    assert 2 * scores <= explicit < 3 * scores  # x (2 MiB) made before the call: not counted
    fused = measure.fresh_process_peak_memory("torch.nn.functional.scaled_dot_product_attention",
                                              1024, 8, 64)
    assert fused < scores / 4  # a fused kernel never holds the scores
    trained = measure.fresh_process_peak_memory("selfattn.scaled_dot_product_attention", 1024, 8, 64,
                                                backward=True)
    assert trained > explicit  # backward holds gradients beside what forward saved
    with pytest.raises(RuntimeError, match="AttributeError"):
        measure.fresh_process_peak_memory("selfattn.no_such_attention", 16, 1, 4)


def test_the_fresh_process_runs_the_call_it_is_given(capsys):
    from selfattn.book.kit import peak

    x = torch.randn(1, 2, 5, 4, requires_grad=True)
    out = peak.attention("selfattn.scaled_dot_product_attention")(x)  # its output, not the weights
    torch.testing.assert_close(out, selfattn.scaled_dot_product_attention(x, x, x)[0])
    assert peak.step(peak.attention("selfattn.tiled_attention"), x, backward=True) is None
    assert x.grad is not None and x.grad.shape == x.shape
    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()
    try:  # main sets the threads, and turns autograd off for a forward pass
        peak.main(["torch.nn.functional.scaled_dot_product_attention", "--length", "8", "--heads", "2",
                   "--head-dim", "4"])
    finally:
        torch.set_num_threads(threads)
        torch.set_grad_enabled(grad)
    printed = capsys.readouterr().out.strip()
    assert printed == "None" or int(printed) >= 0


def test_verdict_tells_a_difference_from_the_spread_of_the_samples():
    a = measure.Timing([1.0, 1.1, 0.9])  # spread ±10%
    assert a.spread == pytest.approx(0.1)
    close = measure.Timing([1.05, 1.06, 1.04])
    assert "no difference shown" in measure.verdict("a", a, "b", close)
    slow = measure.Timing([2.0, 2.02, 1.98])
    assert measure.verdict("slow", slow, "a", a).startswith("slow / a: 2.00, slower")
    assert measure.verdict("a", a, "slow", slow).startswith("a / slow: 0.50, faster")


def test_profiled_ops_sees_inside_multihead_attentions_inference_fast_path():
    """op_counts sees one composite operation; the profiler sees the unfused products inside."""
    torch.manual_seed(0)
    layer = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        outer = measure.op_counts(lambda: layer(x, x, x, need_weights=False))
        inner = measure.profiled_ops(lambda: layer(x, x, x, need_weights=False))
    assert "_native_multi_head_attention" in outer and "bmm" not in outer
    assert inner["_native_multi_head_attention"] == 1 and inner["bmm"] == 2
    assert not any("flash" in name for name in inner)


def test_top_share_measures_how_concentrated_a_gradient_is():
    assert single_head.top_share(torch.ones(100)) == pytest.approx(0.05)  # spread evenly
    one_row = torch.zeros(100)
    one_row[7] = 3.0
    assert single_head.top_share(one_row) == pytest.approx(1.0)  # all in one row
    assert single_head.top_share(torch.tensor([3.0, 4.0]), 0.5) == pytest.approx(16 / 25)  # squares


def test_attention_gradients_obey_the_chain_rule_of_the_scale():
    # at q the scaled model's gradient carries the factor 1/sqrt(d_k) on top of the scores'
    for d_k in (4, 64):
        s, u = single_head.attention_gradients(d_k, True), single_head.attention_gradients(d_k, False)
        assert s.at_q.shape == s.at_scores.shape == s.top_weight.shape == (64 * 16,)
        ratio = (s.at_q.norm() / u.at_q.norm()) / (s.at_scores.norm() / u.at_scores.norm())
        assert ratio.item() == pytest.approx(1 / math.sqrt(d_k), rel=0.1)
    wide = single_head.attention_gradients(1024, False)
    assert wide.top_weight.median() > 0.99  # unscaled and wide: saturated rows
    assert single_head.top_share(wide.at_q) > 0.5  # ... and a concentrated gradient


def test_median_top_weight_grows_with_the_width_only_without_the_scale():
    raw = [single_head.median_top_weight(d, 16, n_rows=4000) for d in (4, 64, 1024)]
    scaled = [single_head.median_top_weight(d, 16, scaled=True, n_rows=4000) for d in (4, 64, 1024)]
    assert raw[0] < raw[1] < raw[2] and raw[2] > 0.99
    assert max(scaled) - min(scaled) < 0.05 and max(scaled) < 0.5
    assert single_head.median_top_weight(8, 1) == 1.0  # one key takes all the weight


def test_cue_gradients_match_autograd_and_a_finite_difference():
    from selfattn.book import tagging

    task = tagging.tagging_task(40, seq_len=12, seed=3)
    torch.manual_seed(0)
    model = tagging.AttentionTagger(task.vocab_size, task.n_tags, d=16, scorer="dot").double()
    c = single_head.cue_gradients(model, task)
    assert c.cue_weight.shape == c.cue_grad.shape == c.correct.shape == (40,)
    assert torch.equal(c.cue, task.tokens[torch.arange(40), task.position - task.distance])
    assert (c.cue_weight <= c.top_weight).all() and (c.top_weight <= 1).all()
    assert c.all_grad >= c.cue_grad.abs().sum().item() > 0
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())  # left clean
    # the gradient at W^q, W^k: plain autograd on the mean training loss
    F.cross_entropy(model(task.tokens).flatten(0, 1), task.tags.flatten()).backward()
    want = torch.cat([model.attn.q_proj.weight.grad.flatten(),
                      model.attn.k_proj.weight.grad.flatten()]).norm().item()
    assert c.score_weight_grad == pytest.approx(want, rel=1e-6)
    # dL/ds_cue of one sentence (its mean loss over its tokens), by a central difference
    i = 5
    pos, cue = task.position[i].item(), (task.position[i] - task.distance[i]).item()
    score = model.attn.score

    def loss(eps):
        def shifted(x):
            s = score(x).clone()  # (1, T, T)
            s[0, pos, cue] += eps
            return s

        model.attn.score = shifted
        try:
            logits = model(task.tokens[i:i + 1])  # (1, T, C)
        finally:
            del model.attn.score
        return F.cross_entropy(logits[0], task.tags[i]).item()

    with torch.no_grad():
        numeric = (loss(1e-5) - loss(-1e-5)) / 2e-5
    assert c.cue_grad[i].item() == pytest.approx(numeric, rel=1e-4, abs=1e-10)


def test_fisher_exact_matches_known_tables():
    from selfattn.book import single_head

    # Fisher's tea-tasting table: 3 of 4 against 1 of 4, two-sided p = 34/70
    assert single_head.fisher_exact(3, 4, 1, 4) == pytest.approx(34 / 70)
    assert single_head.fisher_exact(5, 10, 5, 10) == pytest.approx(1.0)
    assert single_head.fisher_exact(10, 10, 0, 10) == pytest.approx(2 / math.comb(20, 10))


def test_quiet_profiler_hides_the_first_use_warning_of_torch_2_11_and_only_it(monkeypatch):
    import warnings

    from torch.profiler import profile

    enter = profile.__enter__

    def noisy_enter(self):  # what torch 2.11 does on the first profile
        warnings.warn("Warning: Profiler clears events at the end of each cycle.", UserWarning,
                      stacklevel=2)
        warnings.warn("another warning", UserWarning, stacklevel=2)
        return enter(self)

    monkeypatch.setattr(profile, "__enter__", noisy_enter)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with measure.quiet_profiler() as prof:
            torch.ones(3).sum()
    assert [str(w.message) for w in seen] == ["another warning"]
    assert any(e.name == "aten::sum" for e in prof.events())
    with pytest.raises(ValueError), measure.quiet_profiler():
        raise ValueError("an exception still reaches the caller")
