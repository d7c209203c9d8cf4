"""selfattn.fastpaths: every fast path computes what the readable code computes."""

import pytest
import torch

import selfattn
from selfattn import fastpaths

F64 = torch.float64


def run(layer, x, **kwargs):
    out, weights = layer(x, **kwargs)
    return out, weights


@pytest.mark.parametrize("path", sorted(fastpaths.ENABLED))
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "bool", "float"])
def test_each_fast_path_equals_the_readable_computation(path, n_kv_heads, need_weights, mask_kind):
    torch.manual_seed(0)
    layer = selfattn.MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads).eval()
    x = torch.randn(4, 20, 32)
    keep = torch.rand(4, 1, 20, 20) > 0.4
    keep[0, 0, 3] = False  # a query with no key
    kwargs = {"need_weights": need_weights, "is_causal": mask_kind == "causal",
              "attn_mask": {"bool": keep, "float": selfattn.to_additive(keep)}.get(mask_kind)}
    with torch.no_grad():
        fast = run(layer, x, **kwargs)
        with fastpaths.disabled():
            plain = run(layer, x, **kwargs)
        with fastpaths.disabled(path):
            without_one = run(layer, x, **kwargs)
    for got in (fast, without_one):
        torch.testing.assert_close(got[0], plain[0], atol=1e-5, rtol=1e-5)
        if need_weights:
            torch.testing.assert_close(got[1], plain[1], atol=1e-6, rtol=1e-5)
    assert fastpaths.ENABLED[path]  # switched back on after the block


def test_the_in_place_softmax_keeps_gradients_and_is_used_only_without_them():
    torch.manual_seed(1)
    layer = selfattn.MultiHeadAttention(16, 2)
    x = torch.randn(2, 6, 16, requires_grad=True)
    out, w = layer(x, is_causal=True, need_weights=True)  # autograd on: the readable path
    out.sum().backward()
    assert x.grad is not None and not x.grad.isnan().any()
    with torch.no_grad():
        out_ng, w_ng = layer(x, is_causal=True, need_weights=True)  # in place
    torch.testing.assert_close(out_ng, out.detach())
    torch.testing.assert_close(w_ng, w.detach())


@pytest.mark.parametrize(("n_kv_heads", "chunks", "context"), [(1, 2, 40), (1, 3, 37), (2, 4, 64)])
def test_split_cache_decoding_equals_the_plain_kernel(monkeypatch, n_kv_heads, chunks, context):
    # flash-decoding: the keys split into parts merged by log-sum-exp, forced on a short cache
    torch.manual_seed(0)
    m = selfattn.MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads).eval()
    x = torch.randn(1, context + 1, 32)
    with torch.no_grad():
        full, _ = m(x, is_causal=True)
        monkeypatch.setattr(fastpaths, "_decode_chunks", lambda q, k: chunks)
        calls = []
        original = fastpaths._split_kv_attention
        monkeypatch.setattr(fastpaths, "_split_kv_attention",
                            lambda *a: calls.append(a[3]) or original(*a))
        cache = selfattn.KVCache()
        m(x[:, :context], is_causal=True, kv_cache=cache)
        step, _ = m(x[:, context:], is_causal=True, kv_cache=cache)
    assert calls == [chunks]  # the decoding step (the prefill has a causal mask: plain kernel)
    torch.testing.assert_close(step[:, 0], full[:, -1], atol=1e-5, rtol=1e-5)


def test_split_cache_decoding_is_chosen_only_where_it_helps():
    long = torch.zeros(1, 1, fastpaths.SPLIT_KV_MIN_KEYS, 8)
    threads = torch.get_num_threads()
    assert fastpaths._decode_chunks(torch.zeros(1, 1, 16, 8), long) == threads  # MQA decode
    assert fastpaths._decode_chunks(torch.zeros(1, 1, 16, 8), long[:, :, :100]) == 1  # short
    assert fastpaths._decode_chunks(torch.zeros(2, 1, 16, 8), long.expand(2, -1, -1, -1)) == 1
    assert fastpaths._decode_chunks(torch.zeros(1, 1, 512, 8), long) == 1  # a prefill
    with fastpaths.disabled("split_kv"):
        assert fastpaths._decode_chunks(torch.zeros(1, 1, 16, 8), long) == 1


def test_disabling_an_unknown_path_is_an_error():
    with pytest.raises(ValueError, match="unknown fast paths"), fastpaths.disabled("warp_drive"):
        pass
