"""Guards against the pitfalls of chapter 8 that no other test file covers.

Covered elsewhere: float 0/1 masks refused and the missing batch axis (test_bad_input.py);
fully masked rows give zeros in fp32/fp16/bf16 (test_attention.py for the function, pitfall 6;
test_multihead.py for the layer in every dtype and mode, pitfall 15); rows of
weights sum to 1 and causal attention never looks ahead (test_properties.py); dropout only in
training, chunks after a cache with the bottom-right causal mask, GQA equal to the expanded MHA
(test_multihead.py, pitfalls 9, 13, 14); the scale and head layout match PyTorch (parity tests).
"""

import pytest
import torch

import selfattn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_finfo_min_mask_plus_the_causal_mask_does_not_overflow_to_nan(dtype):
    # pitfall 6: adding a causal mask to a finfo.min bias would give finfo.min + finfo.min =
    # -inf and NaN rows; the library combines them with masked_fill instead, as PyTorch does
    torch.manual_seed(0)
    m = selfattn.MultiHeadAttention(16, 2).to(dtype)
    x = torch.randn(1, 4, 16, dtype=dtype)
    bias = torch.zeros(4, 4, dtype=dtype)
    bias[:, 0] = torch.finfo(dtype).min  # a huge but finite penalty on key 0
    out, w = m(x, attn_mask=bias, is_causal=True, need_weights=True)
    fast, _ = m(x, attn_mask=bias, is_causal=True)
    assert not out.isnan().any() and not w.isnan().any() and not fast.isnan().any()
    # query 0 has only key 0 left: a finite bias is still a bias, so it takes all the weight
    assert (w[0, :, 0, 0] == 1).all() and (w[0, :, 1:, 0] == 0).all()
    torch.testing.assert_close(fast, out, atol=2e-2 if dtype == torch.bfloat16 else 1e-5,
                               rtol=2e-2 if dtype == torch.bfloat16 else 1e-5)


def test_heads_are_merged_next_to_their_own_token():
    # pitfall 8: with identity projections and a causal mask, head h of token t must hold the
    # mean of the values' slice h over tokens 0..t, at features [h*hd, (h+1)*hd)
    d, H, T = 8, 2, 5
    m = selfattn.MultiHeadAttention(d, H, bias=False)
    with torch.no_grad():
        m.q_proj.weight.zero_()  # equal scores: uniform weights over the visible keys
        m.k_proj.weight.zero_()
        m.v_proj.weight.copy_(torch.eye(d))
        m.out_proj.weight.copy_(torch.eye(d))
    x = torch.randn(1, T, d)
    for need_weights in (True, False):
        out, _ = m(x, is_causal=True, need_weights=need_weights)
        expected = x.cumsum(1) / torch.arange(1, T + 1)[None, :, None]  # running mean
        torch.testing.assert_close(out, expected)


def test_one_sentence_of_a_batch_never_moves_another():
    # pitfall 11: read as sequence-first, a batch would attend across its sentences
    torch.manual_seed(0)
    m = selfattn.MultiHeadAttention(8, 2).eval()
    x = torch.randn(3, 5, 8)
    y = x.clone()
    y[1] += 1.0
    for need_weights in (False, True):
        assert torch.equal(m(x, need_weights=need_weights)[0][0], m(y, need_weights=need_weights)[0][0])


def test_a_padding_mask_per_sentence_hides_each_sentences_padding():
    # pitfall 12: (B, S) must become (B, 1, 1, S); a (B, S) mask that fits is read as (L, S)
    B = L = 4
    q = k = v = torch.randn(B, 2, L, 8)
    keep = selfattn.padding_mask(torch.tensor([4, 3, 2, 1]), L)  # (B, S)
    _, w = selfattn.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
    assert (w.masked_select(~keep[:, None, None, :].expand_as(w)) == 0).all()
    _, w_wrong = selfattn.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert (w_wrong[3, :, 0, 1:] > 0).all()  # the silent version gives padding weight
    with pytest.raises(ValueError, match=r"\(3, 4\) does not broadcast"):
        selfattn.scaled_dot_product_attention(q[:3], k[:3], v[:3], attn_mask=keep[:3])


def test_grouped_heads_are_paired_by_repeat_interleave_not_repeat():
    # pitfall 14: query head i reads key/value head i // g
    k = torch.arange(2.0).view(1, 2, 1, 1)
    assert selfattn.repeat_kv(k, 4).flatten().tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert not torch.equal(selfattn.repeat_kv(k, 4), k.repeat(1, 4, 1, 1))


def test_float16_scores_of_large_entries_do_not_overflow():
    # pitfall 16: in float16, q @ k^T of entries of +-40 over 64 features is 102,400 on the
    # diagonal, past float16's largest number; scaled afterwards it stays inf and the softmax
    # gives NaN. The library scales q first and forms the scores in float32.
    g = torch.Generator().manual_seed(0)
    q = (40 * torch.randn(2, 2, 5, 64, generator=g).sign()).half()
    k = (40 * torch.randn(2, 2, 5, 64, generator=g).sign()).half()
    k[..., :2, :] = q[..., :2, :]  # keys 0 and 1 equal to their queries: q . k = 102,400
    v = torch.randn(2, 2, 5, 64, generator=g).half()
    assert (q @ k.transpose(-2, -1)).isinf().any()  # the premise: float16 overflows
    exact = torch.softmax((q.double() @ k.double().transpose(-2, -1)) / 8, -1) @ v.double()
    out, w = selfattn.scaled_dot_product_attention(q, k, v)
    assert out.dtype == torch.float16 and out.isfinite().all() and w.isfinite().all()
    torch.testing.assert_close(out.double(), exact, atol=2e-3, rtol=2e-3)
    m = selfattn.MultiHeadAttention(64, 1, bias=False).half()
    with torch.no_grad():
        for proj in (m.q_proj, m.k_proj, m.v_proj, m.out_proj):
            proj.weight.copy_(torch.eye(64))
    for size in (40, 100):
        x = (size * torch.randn(1, 5, 64, generator=g).sign()).half()
        for need_weights in (True, False):
            assert m(x, need_weights=need_weights)[0].isfinite().all()
    # scaling q first is not enough on its own: with entries of +-100, q . q / 8 = 80,000 is
    # past float16's largest number too, so the scores must be formed in float32
    big = (100 * torch.randn(2, 2, 5, 64, generator=g).sign()).half()
    assert ((big / 8) @ big.transpose(-2, -1)).isinf().any()  # the premise
    exact = torch.softmax((big.double() @ big.double().transpose(-2, -1)) / 8, -1) @ v.double()
    out, w = selfattn.scaled_dot_product_attention(big, big, v)
    assert out.isfinite().all() and w.isfinite().all()
    torch.testing.assert_close(out.double(), exact, atol=2e-3, rtol=2e-3)


def test_no_mask_is_handed_to_sdpa_when_none_is_needed(monkeypatch):
    # pitfall 17: on CUDA an attn_mask rules out the Flash backend; a causal prompt must reach
    # SDPA as is_causal=True, and one new token after a cache (it sees every key) with no mask
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        calls.append((kwargs.get("attn_mask"), kwargs.get("is_causal", False)))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    torch.manual_seed(0)
    m = selfattn.MultiHeadAttention(16, 4, rope=True).eval()
    x = torch.randn(2, 6, 16)
    cache = selfattn.KVCache()
    with torch.no_grad():
        m(x, is_causal=True, kv_cache=cache)  # the prompt
        assert calls and all(mask is None and causal for mask, causal in calls)
        calls.clear()
        m(torch.randn(2, 1, 16), is_causal=True, kv_cache=cache)  # one decoding step
    # no mask, and not is_causal either: PyTorch aligns is_causal to the top left, so one
    # query against the cache's keys would see key 0 alone
    assert calls and all(mask is None and not causal for mask, causal in calls)


def test_left_padded_generation_gives_each_sentence_its_own_outputs():
    # pitfall 18: with left padding, RoPE by column (pads included) is the sentence's own
    # positions shifted by a constant, in the prompt and after the cache; mixing two rules
    # (prompt from the first real token, the new token at the cache length) is not
    torch.manual_seed(0)
    m = selfattn.MultiHeadAttention(16, 4, rope=True).eval()
    short, long = torch.randn(1, 3, 16), torch.randn(1, 5, 16)
    steps = torch.randn(2, 2, 16)  # two new tokens per sentence
    n_pad = 2
    batch = torch.cat([torch.cat([torch.zeros(1, n_pad, 16), short], 1), long])  # (2, 5, 16)
    keep = torch.ones(2, 5, dtype=torch.bool)
    keep[0, :n_pad] = False
    with torch.no_grad():
        cache = selfattn.KVCache()
        out, _ = m(batch, attn_mask=keep[:, None, None, :], is_causal=True, kv_cache=cache)
        assert not out.isnan().any()
        alone_cache = selfattn.KVCache()
        alone, _ = m(short, is_causal=True, kv_cache=alone_cache)
        torch.testing.assert_close(out[0, n_pad:], alone[0])
        torch.testing.assert_close(out[1], m(long, is_causal=True)[0][0])
        decoded = []
        for t in range(steps.shape[1]):
            keep = torch.cat([keep, torch.ones(2, 1, dtype=torch.bool)], 1)
            step, _ = m(steps[:, t : t + 1], attn_mask=keep[:, None, None, :], kv_cache=cache)
            alone_step, _ = m(steps[:1, t : t + 1], kv_cache=alone_cache)
            torch.testing.assert_close(step[0], alone_step[0])
            decoded.append(step)
        # and against one causal pass over each whole sentence, with no cache and no padding:
        # a position rule the cache got wrong in both runs above would show here
        decoded = torch.cat(decoded, 1)  # (2, steps, 16)
        for i, sentence in enumerate((short, long)):
            whole = torch.cat([sentence, steps[i : i + 1]], 1)  # (1, T + steps, 16)
            once, _ = m(whole, is_causal=True)
            torch.testing.assert_close(decoded[i], once[0, sentence.shape[1] :])

    # the two rules at once, with apply_rope directly: the new token two positions too far
    from selfattn.positional import apply_rope

    x = torch.randn(4, 8)  # three prompt tokens and the new one
    def scores(positions):
        r = apply_rope(x, positions)
        return r @ r.T
    torch.testing.assert_close(scores(torch.arange(4)), scores(torch.arange(4) + n_pad))
    assert not torch.allclose(scores(torch.arange(4)), scores(torch.tensor([0, 1, 2, 3 + n_pad])))


# --- selfattn.book.pitfalls: the chapter's quotations and experiments --------------------------

from selfattn.book import pitfalls  # noqa: E402


def test_the_articles_class_as_printed_fails_at_the_swallowed_line_and_runs_once_fixed():
    with pytest.raises(IndentationError) as err:
        compile(pitfalls.ARTICLE, "article.py", "exec")
    assert "masked_fill" in err.value.text
    assert pitfalls.SWALLOWED in pitfalls.lines_around(pitfalls.ARTICLE, "# 缩放得分", 0, 4)
    fixed = pitfalls.ARTICLE.replace(pitfalls.SWALLOWED,
                                     "# 应用 mask（如处理 padding）\n        if mask is not None:")
    namespace: dict = {}
    exec(fixed, namespace)
    assert namespace["SelfAttention"](16, 4)(*(torch.randn(6, 16),) * 3, None).shape == (6, 16)


def test_the_article_wrapped_fits_the_page_and_loses_no_word():
    wrapped = pitfalls.wrap_code(pitfalls.ARTICLE)
    assert max(len(line) for line in wrapped.splitlines()) <= 79
    assert wrapped.split() != pitfalls.ARTICLE.split()  # a line was broken
    assert [w for w in wrapped.split() if w != "↩"] == pitfalls.ARTICLE.split()
    short = "x = 1\n    y = 2"
    assert pitfalls.wrap_code(short) == short


def test_the_articles_heatmap_as_printed_needs_an_attention_matrix(monkeypatch):
    import matplotlib.pyplot as plt

    namespace: dict = {}
    with pytest.raises(NameError, match="attention_matrix"):
        exec(pitfalls.ARTICLE_HEATMAP, namespace)
    shown = []
    monkeypatch.setattr(plt, "show", lambda: shown.append(plt.gcf()))
    layer = pitfalls.EinopsSelfAttention(16, 4)
    x = torch.randn(1, 6, 16)
    _, weights = layer(x, x, x, need_weights=True)
    namespace["plot_attention"](weights[0], namespace["sentence"])  # (n_heads, L, S), as it says
    assert len(shown) == 1 and shown[0].axes[0].get_title() == "Attention Weights"
    plt.close("all")


def test_the_fixed_class_returns_the_layers_output_and_weights():
    torch.manual_seed(0)
    reference = selfattn.MultiHeadAttention(32, 4)
    fixed = pitfalls.EinopsSelfAttention(32, 4)
    fixed.load_state_dict(reference.state_dict())
    x = torch.randn(3, 7, 32)
    keep = selfattn.padding_mask(torch.tensor([7, 5, 2]))
    out, weights = fixed(x, x, x, mask=keep, need_weights=True)
    want, want_weights = reference(x, attn_mask=keep[:, None, None, :], need_weights=True)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(weights, want_weights)
    assert torch.equal(fixed(x, x, x, mask=keep), out)  # without need_weights: the output alone
    with pytest.raises(ValueError, match="divisible"):
        pitfalls.EinopsSelfAttention(30, 4)


def test_the_fill_table_shows_each_fill_failing_on_a_fully_masked_row():
    table = pitfalls.fill_table()
    assert table.loc["-inf", "float32"] == "0.50 0.50 0.00 | NaN"
    assert table.loc["-1e20", "float32"] == "0.50 0.50 0.00 | 0.33 0.33 0.33"  # uniform
    assert table.loc["-1e6", "float16"] == "RuntimeError: overflow"
    assert table.loc["finfo(dtype).min", "float16"].endswith("0.33 0.33 0.33")
    assert table.loc["2 x finfo(dtype).min", "bfloat16"].endswith("NaN")
    assert table.loc["finfo(float32).min, cast", "bfloat16"].endswith("NaN")


def test_the_leak_check_tells_the_three_diagonals_apart():
    assert not pitfalls.leaks(pitfalls.causal_from_triu(6, 1))
    assert pitfalls.leaks(pitfalls.causal_from_triu(6, 2))
    assert not pitfalls.leaks(pitfalls.causal_from_triu(6, 0))  # too strict: no leak, a NaN row
    torch.testing.assert_close(pitfalls.causal_from_triu(5), selfattn.to_additive(selfattn.causal_mask(5)))


def test_the_articles_scale_flattens_attention_from_two_heads_on():
    entropy = pitfalls.scale_entropy(d_model=64, length=16, heads=(1, 2, 4), n_rows=64)
    right, article = entropy["sqrt(head_dim)"], entropy["sqrt(embed_size)"]
    assert right[0] == article[0] and all(a > r for r, a in zip(right[1:], article[1:], strict=True))


def test_the_masked_query_is_finite_exactly_where_sdpa_ran():
    paths = pitfalls.masked_query_paths(heads=(2, 3))
    assert len(paths) == 12 and paths["others finite"].all()
    sdpa = paths["path"] == "slow path, SDPA"
    assert (paths.loc[sdpa, "masked query"] == "zeros").all()
    assert (sdpa == ~paths["need_weights"] & (paths["path"] != "fast path")).all()
    fast = paths["path"] == "fast path"
    assert (paths.loc[fast, "heads"] == 2).all() and (paths.loc[fast, "mode"] == "eval, no_grad()").all()


def test_a_nan_pad_row_spreads_to_its_sentence_only_on_the_fast_path():
    spread = pitfalls.encoder_nan_spread()
    training, served = spread["training"], spread["eval, no_grad()"]
    assert not training["fast path"] and not training["whole"].any()
    assert served["fast path"] and not served["whole"][1].any()


def test_what_reaches_sdpa_is_a_mask_only_where_one_is_needed():
    # fails on the library before the fix that keeps is_causal with enable_gqa (74f673c): GQA
    # and MQA stacked a group's queries as rows and turned is_causal into a (g*L, S) mask
    received = pitfalls.what_reaches_sdpa()
    assert list(received.columns) == list(pitfalls.LAYOUTS)
    grouped = received[["GQA", "MQA"]]
    for case in ("causal prompt", "a prompt into an empty KV cache"):
        assert received.loc[case, "MHA"] == "is_causal=True, no mask"
        assert (grouped.loc[case] == "is_causal=True, no mask; enable_gqa").all()
    assert received.loc["one token after a KV cache", "MHA"] == "no mask"
    assert received.loc["one token after a KV cache", "GQA"] == "no mask; 2 queries stacked per key head"
    assert received.loc["one token after a KV cache", "MQA"] == "no mask; 4 queries stacked per key head"
    assert received.loc["causal prompt, padded"].str.startswith("mask (2, 1, 8, 8) bool").all()
    assert received.loc["a chunk after a KV cache"].str.startswith("mask (3, 11) bool").all()
    assert (received.loc["causal prompt, need_weights=True"] == "not called").all()


def test_sdpa_calls_records_and_restores():
    real = torch.nn.functional.scaled_dot_product_attention
    q = torch.randn(1, 2, 4, 8)
    calls = pitfalls.sdpa_calls(lambda: torch.nn.functional.scaled_dot_product_attention(
        q, q, q, attn_mask=selfattn.causal_mask(4)))
    assert calls == [{"q": (1, 2, 4, 8), "mask": ((4, 4), torch.bool), "is_causal": False,
                      "enable_gqa": False}]
    assert torch.nn.functional.scaled_dot_product_attention is real


def test_the_gpu_cells_code_runs_on_a_cpu():
    # chapter 8's GPU cell calls flash_with_mask on CUDA only; the book's build has no GPU, so its
    # code runs here, at a toy size, so that it cannot rot (on a CPU both calls run on Flash)
    lines = pitfalls.flash_with_mask("cpu", T=32, n_heads=2, head_dim=8)
    assert any("attn_mask=causal_mask(T): SDPA ran" in line and "flash" in line for line in lines)
    assert "Flash only, is_causal=True: runs" in lines


def test_the_gpu_sentence_is_a_prediction_until_a_report_is_committed():
    assert "prediction" in pitfalls.gpu_sentence(None)
    report = {"device": {"name": "NVIDIA T4"}, "date": "today",
              "cells": [{"chapter": "08_pitfalls", "output": "Flash only, is_causal=True: runs\n"},
                        {"chapter": "09_performance", "output": "other"}]}
    sentence = pitfalls.gpu_sentence(report)
    assert "NVIDIA T4" in sentence and "runs" in sentence and "other" not in sentence
    assert "no GPU cell" in pitfalls.gpu_sentence({**report, "cells": []})


def test_left_padded_positions_are_wrong_only_under_two_rules():
    gaps = pitfalls.padded_position_gaps().set_index(["encoding", "rule"])
    tokens = ["token 0", "token 1", "token 2", "new token"]
    mixed = ("RoPE", "two rules")
    assert gaps.loc[("absolute", "from the first pad"), tokens].max() > 1e-4
    assert gaps.loc[("RoPE", "from the first pad"), tokens].max() < 1e-5
    assert gaps.loc[mixed, tokens[:3]].max() < 1e-6 and gaps.loc[mixed, "new token"] > 1e-4


def test_the_gpu_prediction_names_its_sources_and_fits_the_page():
    lines = pitfalls.gpu_sentence(None).splitlines()
    assert all(len(line) <= 79 for line in lines)
    text = " ".join(lines)
    for claim in ("prediction", "check_for_attn_mask", "A100", "L4", "T4", "cuDNN"):
        assert claim in text


def test_a_bool_causal_mask_costs_the_cpu_kernel_a_float_mask_of_its_own():
    cost = pitfalls.mask_cost(length=128, head_dim=8, repeats=3)
    causal, masked = cost["is_causal=True"], cost["bool attn_mask"]
    assert causal["kernel"] == masked["kernel"]  # the same fused kernel ...
    assert masked["peak bytes"] - causal["peak bytes"] >= cost["mask bytes"]  # ... a float mask more
    assert cost["mask bytes"] == 4 * 128 * 128 and causal["seconds"] > 0
    floats = cost["float attn_mask"]
    assert floats["kernel"] == cost["no mask"]["kernel"] == causal["kernel"]
    # a float mask built once is read, not made: no mask-sized tensor per call
    assert floats["peak bytes"] < cost["mask bytes"] <= masked["peak bytes"]


def test_the_fixed_class_forms_its_scores_in_float32():
    half = pitfalls.half_precision_scores()
    assert half["largest float16 score"] == float("inf")
    assert not half["finite, scores in float16"]
    assert half["finite, scores in float32"] and half["relative gap"] < 1e-2
    torch.manual_seed(0)
    fixed = pitfalls.EinopsSelfAttention(embed_size=16, heads=2).half()
    x = (300 * torch.randn(1, 4, 16)).half()
    out = fixed(x, x, x)
    assert out.dtype == torch.float16 and out.isfinite().all()
