"""Chapter 11's decoding apparatus: TinyDecoder decoded through each cache equals its full
causal pass (float64 to rounding, float32 to 1e-5), and refuses bad input; cache_vs_recompute
generates the same tokens both ways and counts the work each does; block_step_benchmark's rows;
the two checkers (GQA uptraining, the cache bug) accept the right answer and reject each planted
mistake with its hint, and leave the global random state alone."""

import inspect
import math
import textwrap

import pytest
import torch
from torch import nn

import selfattn
from selfattn import BlockPool, KVCache, MultiHeadAttention, PagedKVCache
from selfattn.book import decoding
from selfattn.book.decoding import DecoderBlock, TinyDecoder
from selfattn.book.kit.checkers import WIDTH
from selfattn.book.kit.measure import decode_bytes

V, D, H, LAYERS = 40, 32, 4, 2
T = 13
SCHEDULES = {"tokens": [1] * T, "prompt": [5] + [1] * 8, "chunks": [3, 2, 4, 1, 3]}


def make_model(n_kv_heads=2, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return TinyDecoder(V, D, H, LAYERS, n_kv_heads=n_kv_heads).to(dtype).eval()


def tokens(batch=2, n=T, seed=1):
    return torch.randint(0, V, (batch, n), generator=torch.Generator().manual_seed(seed))


def decoded(model, x, caches, sizes):
    """The logits of ``x`` fed to ``model`` in calls of ``sizes`` tokens, through ``caches``."""
    outs, start = [], 0
    for size in sizes:
        outs.append(model(x[:, start : start + size], caches))
        start += size
    assert start == x.shape[1] and all(c.length == start for c in caches)
    return torch.cat(outs, dim=1)  # (B, T, V)


# --- TinyDecoder ------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_decoding_with_kv_caches_equals_the_full_pass(schedule, n_kv_heads, dtype, atol):
    model, x = make_model(n_kv_heads, dtype), tokens()
    with torch.no_grad():
        full = model(x)  # (B, T, V)
        got = decoded(model, x, model.new_caches(), SCHEDULES[schedule])
    assert full.shape == (2, T, V) and full.dtype == dtype
    torch.testing.assert_close(got, full, atol=atol, rtol=0)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_decoding_with_paged_caches_sharing_one_pool_equals_the_full_pass(schedule, dtype, atol):
    model, x = make_model(2, dtype), tokens(batch=1)
    pool = BlockPool(12, 3, 2, D // H, dtype=dtype)  # both blocks' caches take blocks from it
    caches = model.new_caches(PagedKVCache, pool=pool)
    with torch.no_grad():
        got = decoded(model, x, caches, SCHEDULES[schedule])
        full = model(x)
    torch.testing.assert_close(got, full, atol=atol, rtol=0)
    assert pool.n_free == 12 - LAYERS * -(-T // 3)  # each block's cache holds ceil(T / 3) blocks
    for cache in caches:
        cache.release()
    assert pool.n_free == 12


def test_a_cached_step_sits_at_the_cache_length_not_at_position_0():
    model, x = make_model(), tokens(batch=1)
    with torch.no_grad():
        caches = model.new_caches()
        model(x[:, :6], caches)
        step = model(x[:, 6:7], caches)[:, 0]  # token 6, after 6 cached
        alone = model(x[:, 6:7])[:, 0]  # the same token at position 0, nothing before it
        full = model(x[:, :7])[:, 6]
    torch.testing.assert_close(step, full, atol=1e-12, rtol=0)
    assert not torch.allclose(step, alone, atol=1e-3)


def test_the_model_is_causal_and_has_the_sizes_asked_for():
    model, x = make_model(), tokens()
    y = x.clone()
    y[:, 8:] = (y[:, 8:] + 1) % V  # change only the later tokens
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, :8], model(y)[:, :8], atol=1e-12, rtol=0)
    block = model.blocks[0]
    assert isinstance(block, DecoderBlock) and len(model.blocks) == LAYERS
    cfg = block.attn.config
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.rope) == (H, 2, True)
    assert block.ffn[0].out_features == 4 * D
    assert TinyDecoder(V, D, H, 1, ffn_hidden=48).blocks[0].ffn[0].out_features == 48
    assert [type(c) for c in model.new_caches()] == [KVCache] * LAYERS
    assert model.new_caches(KVCache, capacity=3)[0].capacity == 3


def test_int32_tokens_and_training_mode_work():
    model, x = make_model(), tokens()
    torch.testing.assert_close(model(x.int()), model(x), atol=0, rtol=0)
    model.train()
    model(x).sum().backward()
    assert model.embed.weight.grad is not None


# --- cache_vs_recompute -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def race():
    torch.manual_seed(0)
    model = TinyDecoder(V, D, H, LAYERS)  # float32, as the chapter runs it
    return model, decoding.cache_vs_recompute(model, tokens(batch=2, n=5), 12, repeats=2)


def test_both_ways_generate_the_same_tokens(race):
    model, r = race
    assert r.same_tokens and r.recompute_generated.shape == (2, 12)
    assert model.training  # left in the mode it came in (a new module trains)
    seq = tokens(batch=2, n=5)
    with torch.no_grad():  # greedy decoding by hand, the slow way
        for _ in range(12):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(seq[:, 5:], r.cached_generated)


def test_the_work_counted(race):
    model, r = race
    P, n = 5, 12
    assert r.prompt_len == P and r.context == list(range(P, P + n))
    assert len(r.recompute_ms) == len(r.cached_ms) == n and min(r.recompute_ms + r.cached_ms) > 0
    assert r.recompute_tokens_run == r.context  # the whole sequence again, every step
    assert r.cached_tokens_run == [P] + [1] * (n - 1)  # the prompt once, then one token a step
    assert r.recompute_pairs == [c * (c + 1) // 2 for c in r.context]
    assert r.cached_pairs == [P * (P + 1) // 2, *r.context[1:]]  # one query, every cached key
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    attention = LAYERS * 4 * H * (D // H)  # q.k and weights.v: 2 FLOPs each, per pair and head
    assert r.recompute_flops == [2 * (2 * linear * c + attention * p)
                                 for c, p in zip(r.context, r.recompute_pairs, strict=True)]
    assert r.cached_flops[1:] == [2 * (2 * linear + attention * c) for c in r.context[1:]]
    totals = r.totals()
    assert totals["recompute"]["tokens_run"] == sum(range(P, P + n))
    assert totals["cached"]["tokens_run"] == P + n - 1
    assert totals["cached"]["pairs"] < totals["recompute"]["pairs"]
    assert r.growth("recompute") > 0 and r.growth("cached") > 0
    assert isinstance(r.slope("cached"), float)


def test_the_race_with_paged_caches_gives_the_same_tokens():
    torch.manual_seed(3)
    model = TinyDecoder(V, D, H, LAYERS, n_kv_heads=1)
    pool = BlockPool(64, 4, 1, D // H)
    r = decoding.cache_vs_recompute(model, tokens(batch=1, n=4), 6, repeats=1,
                                 make_cache=PagedKVCache, pool=pool)
    assert r.same_tokens and r.cached_generated.shape == (1, 6)


def test_the_race_leaves_the_models_mode():
    torch.manual_seed(0)
    model = TinyDecoder(V, D, H, 1).train()
    decoding.cache_vs_recompute(model, tokens(batch=1, n=3), 2, repeats=1)
    assert model.training


# --- block_step_benchmark ---------------------------------------------------------------------

def test_block_step_benchmark_rows():
    state = torch.random.get_rng_state()
    rows = decoding.block_step_benchmark(contexts=(8, 32), batches=(1, 3), d_model=16, n_heads=4,
                                      kv_heads=(4, 2, 1), repeats=2, warmup=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert [(r["context"], r["batch"], r["variant"]) for r in rows] == [
        (c, b, v) for c in (8, 32) for b in (1, 3) for v in ("MHA", "GQA-2", "MQA")]
    for r in rows:
        read = decode_bytes(16, 4, r["n_kv_heads"], r["context"], 4, 4, 64, r["batch"])["total"]
        mha = decode_bytes(16, 4, 4, r["context"], 4, 4, 64, r["batch"])["total"]
        assert r["mb"] == read / 2**20 and r["bytes_vs_mha"] == mha / read
        assert r["ms"] > 0 and r["speedup_vs_mha"] > 0
    assert "bytes bound" in decoding.block_step_table(rows)
    for r in rows:  # two FLOPs per weight, 4 * H * hd per cached key and the new one
        weights = decode_bytes(16, 4, r["n_kv_heads"], r["context"], 4, 4, 64)["weights"] // 4
        flops = r["batch"] * (2 * weights + 4 * 4 * 4 * (r["context"] + 1))
        assert r["gflop_per_s"] == pytest.approx(flops / (r["ms"] / 1e3) / 1e9)
    table = decoding.block_step_table(rows, cache=1)
    assert table.count("DRAM") == len(rows)
    assert "DRAM" not in decoding.block_step_table(rows, cache=2**40)
    assert max(len(line) for line in table.splitlines()) <= 88


# --- chapter 11's measurements of what a step costs -------------------------------------------

def test_the_rolling_caches_step_allocates_a_token_not_their_window():
    rows = decoding.window_step_costs(d_model=64, n_heads=4, kept=256, n_sink=4)
    assert [r["cache"] for r in rows] == ["KVCache", "SlidingWindowCache(256)", "SinkCache(4, 252)"]
    hd = 16
    assert rows[1]["held"] == rows[2]["held"] == 2 * 4 * 256 * hd * 4
    assert rows[0]["held"] == 2 * 4 * (256 + 64) * hd * 4  # every token: filled past the window
    assert [r["tokens"] for r in rows] == [256 + 64, 256, 256]
    for r in rows:
        assert r["step_peak"] < r["held"] / 16  # the new token's tensors, no copy of the window
        assert set(r["copies"]) <= {"copy_"}  # the new token written into its slot, no gather


def test_spearman():
    assert decoding.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1)
    assert decoding.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1)
    assert decoding.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert decoding.spearman([1, 1, 2], [3, 3, 5]) == pytest.approx(1)  # ties share a rank
    assert math.isnan(decoding.spearman([1, 1], [2, 3]))


def test_latent_flops_deepseek_ratios():
    shapes = dict(n_heads=128, head_dim=128, kv_rank=512, rope_dim=64)
    for queries, keys, causal in [(1, 4096, False), (4096, 4096, True)]:
        e = decoding.latent_flops(**shapes, queries=queries, keys=keys, absorb=False, causal=causal)
        a = decoding.latent_flops(**shapes, queries=queries, keys=keys, absorb=True, causal=causal)
        assert a["scores"] == 3 * e["scores"] and a["weighted sum"] == 4 * e["weighted sum"]
        assert e["total"] == e["up-projections"] + e["scores"] + e["weighted sum"]
    decode = [decoding.latent_flops(**shapes, queries=1, keys=4096, absorb=b) for b in (0, 1)]
    prefill = [decoding.latent_flops(**shapes, queries=4096, keys=4096, absorb=b, causal=True)
               for b in (0, 1)]
    assert decode[1]["total"] < decode[0]["total"] / 10  # absorbed: right for decoding
    assert prefill[1]["total"] > 2 * prefill[0]["total"]  # explicit: right for prefill
    pairs = decoding.latent_flops(1, 1, 1, 0, queries=3, keys=3, absorb=False, causal=True)
    assert pairs["scores"] == 2 * 6  # causal: 3 + 2 + 1 pairs


def test_allocation_shares_count_slots_and_size_the_pool():
    a = decoding.allocation_shares(7, n_requests=12, longest=512, longest_part=256,
                                   block_sizes=(16, 4))
    assert a == decoding.allocation_shares(7, n_requests=12, longest=512, longest_part=256,
                                           block_sizes=(16, 4))
    assert a.used == sum(p + q for p, q in a.requests) and len(a.requests) == 12
    assert a.allocated["reserve 512 per request"] == 12 * 512
    for b in (16, 4):
        assert a.pool[b] == math.ceil(a.used / b) + 12
        waste = a.allocated[f"paged, blocks of {b}"] - a.used
        assert 0 <= waste < 12 * b
    assert a.share("paged, blocks of 4") > a.share("doubling (KVCache)")


def test_cached_step_profile_and_tokens_per_second(race):
    model = TinyDecoder(V, D, H, LAYERS)
    p = decoding.cached_step_profile(model, 10, repeats=3)
    assert p["ops"] > 10 and p["ms"] > 0
    assert p["flops"] == decoding._decoder_flops(model, 1, 11, 1)
    assert p["gflop_per_s"] == pytest.approx(p["flops"] / (p["ms"] / 1e3) / 1e9)
    assert p["us_per_op"] == pytest.approx(1e3 * p["ms"] / p["ops"])
    _, result = race
    rates = decoding.tokens_per_second(result)
    n = len(result.context)
    assert rates == {way: n / (t["ms"] / 1e3) for way, t in result.totals().items()}


def test_cpu_cache_bytes_is_a_size_or_none():
    for level in (2, 3):
        size = decoding.cpu_cache_bytes(level)
        assert size is None or size >= 2**10


# --- the checkers -----------------------------------------------------------------------------

def run(code):
    """The ``answer`` that ``code`` defines, in a namespace holding only torch and selfattn (as
    tests/test_book.py runs a chapter's folded solution)."""
    ns = {"torch": torch, "selfattn": selfattn}
    exec(textwrap.dedent(code), ns)
    return ns["answer"]


def verdict(capsys, checker, answer):
    capsys.readouterr()
    ok = checker(answer)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines and lines[0].startswith(("✓ Correct: ", "✗ Not yet: ")), out
    assert all(len(line) <= WIDTH for line in lines), out
    return ok, " ".join(line.strip() for line in lines)


UPTRAINING = '''
def uptrain(mha, n_kv_heads):
    cfg = mha.config
    g = cfg.n_heads // n_kv_heads  # query heads per key/value head
    gqa = selfattn.MultiHeadAttention(cfg.d_model, cfg.n_heads, n_kv_heads=n_kv_heads,
                                      head_dim=cfg.head_dim, bias=cfg.bias, rope=cfg.rope)
    with torch.no_grad():
        gqa.q_proj.load_state_dict(mha.q_proj.state_dict())
        gqa.out_proj.load_state_dict(mha.out_proj.state_dict())
        for theirs, ours in [(mha.k_proj, gqa.k_proj), (mha.v_proj, gqa.v_proj)]:
            w = theirs.weight.view(n_kv_heads, g, cfg.head_dim, cfg.d_model)  # a group's heads together
            ours.weight.copy_(w.mean(dim=1).reshape(n_kv_heads * cfg.head_dim, cfg.d_model))
            b = theirs.bias.view(n_kv_heads, g, cfg.head_dim)
            ours.bias.copy_(b.mean(dim=1).flatten())
    return gqa

answer = uptrain
'''

UPTRAINING_MISTAKES = [
    ([("view(n_kv_heads, g, cfg.head_dim, cfg.d_model)", "view(g, n_kv_heads, cfg.head_dim, cfg.d_model)"),
      ("w.mean(dim=1)", "w.mean(dim=0)"),
      ("view(n_kv_heads, g, cfg.head_dim)\n", "view(g, n_kv_heads, cfg.head_dim)\n"),
      ("b.mean(dim=1)", "b.mean(dim=0)")], "every n_kv_heads-th head"),
    ([("w.mean(dim=1)", "w.sum(dim=1)"), ("b.mean(dim=1)", "b.sum(dim=1)")], "g times too large"),
    ([("w.mean(dim=1)", "w[:, 0]"), ("b.mean(dim=1)", "b[:, 0]")], "first head of each group"),
    ([("            b = theirs.bias.view(n_kv_heads, g, cfg.head_dim)\n"
       "            ours.bias.copy_(b.mean(dim=1).flatten())\n", "")], "pool the bias"),
    ([("n_kv_heads=n_kv_heads,\n", "n_kv_heads=n_kv_heads, rope=False,\n"), (", rope=cfg.rope)", ")")],
     "rope=False, the MHA layer rope=True"),
    ([("        gqa.q_proj.load_state_dict(mha.q_proj.state_dict())\n", "")], "q_proj.weight is not"),
    ([("        gqa.q_proj.load_state_dict(mha.q_proj.state_dict())\n", "        gqa.q_proj = mha.q_proj\n")],
     "shares its storage"),
    ([("    with torch.no_grad():\n", "    if True:\n")], "under torch.no_grad()"),
    ([("    return gqa\n", "    mha.k_proj.weight.data.zero_()\n    return gqa\n")], "changed the MHA layer"),
    ([("    return gqa\n", "    return gqa, mha\n")], "return a selfattn.MultiHeadAttention"),
]

UPTRAINING_WRITTEN = [('''
def uptrain(mha, n_kv_heads):  # the queries pooled too: a smaller MHA layer
    cfg = mha.config
    g = cfg.n_heads // n_kv_heads
    small = selfattn.MultiHeadAttention(cfg.d_model, n_kv_heads, head_dim=cfg.head_dim, rope=cfg.rope)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            w = getattr(mha, name).weight.view(n_kv_heads, g, cfg.head_dim, cfg.d_model).mean(1)
            getattr(small, name).weight.copy_(w.reshape(-1, cfg.d_model))
    return small

answer = uptrain
''', "pooled the queries too")]


def edited(code, edits):
    for old, new in edits:
        assert old in code, old
        code = code.replace(old, new)
    return code


def test_uptraining_the_right_answer_passes_and_prints_its_numbers(capsys):
    state = torch.random.get_rng_state()
    ok, out = verdict(capsys, decoding.check_uptraining, run(UPTRAINING))
    assert ok is True, out
    assert "MHA tagger gets" in out and "after 5% more steps" in out
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize(("edits", "hint"), UPTRAINING_MISTAKES, ids=[m[1][:30] for m in UPTRAINING_MISTAKES])
def test_uptraining_mistakes_get_their_hint(edits, hint, capsys):
    ok, out = verdict(capsys, decoding.check_uptraining, run(edited(UPTRAINING, edits)))
    assert ok is False and hint in out, out


@pytest.mark.parametrize(("code", "hint"), UPTRAINING_WRITTEN)
def test_uptraining_written_mistakes_get_their_hint(code, hint, capsys):
    ok, out = verdict(capsys, decoding.check_uptraining, run(code))
    assert ok is False and hint in out, out


def test_uptraining_pools_the_heads_that_repeat_kv_groups():
    """The grouping the checker asks for is the layer's own: the GQA layer whose key/value heads
    are each group's mean computes what the MHA layer computes with every head of a group set
    to that mean (expand_kv_heads repeats them as repeat_kv does)."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 8, rope=True).double().eval()
    gqa = run(UPTRAINING)(mha, 2).double().eval()
    same = selfattn.expand_kv_heads(gqa)  # MHA again, heads j*4 .. j*4+3 all holding the mean
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(gqa(x, is_causal=True)[0], same(x, is_causal=True)[0])
    w = mha.k_proj.weight.view(2, 4, 2, 16)  # (H_kv, g, hd, d)
    torch.testing.assert_close(same.k_proj.weight.view(8, 2, 16)[:4], w.mean(1)[0].expand(4, 2, 16))


@pytest.mark.parametrize("blank", [None, "def answer(*args):\n    return None\n",
                                   "def answer(*args):\n    raise NotImplementedError('your code here')\n"])
@pytest.mark.parametrize("checker", ["check_uptraining", "check_cache_bug"])
def test_blank_answers_fail_without_raising(checker, blank, capsys):
    ok, out = verdict(capsys, getattr(decoding, checker), None if blank is None else run(blank))
    assert ok is False and out.startswith("✗ Not yet: ")


FIXED = textwrap.dedent(inspect.getsource(decoding.buggy_decode)).replace(
    "def buggy_decode", "def decode").replace(
    "is_causal=True)  # (B, H, n, hd)", "attn_mask=causal_mask(n, start + n, offset=start))")
IMPORTS = ("from torch import Tensor\nfrom selfattn import MultiHeadAttention, causal_mask, "
           "merge_heads, repeat_kv, scaled_dot_product_attention, split_heads\n"
           "from selfattn.positional import apply_rope\n")
CACHE_FIX = IMPORTS + FIXED + "\nanswer = decode\n"

CACHE_MISTAKES = [
    ([("attn_mask=causal_mask(n, start + n, offset=start))", "is_causal=True)")], "what buggy_decode gives"),
    ([("attn_mask=causal_mask(n, start + n, offset=start))", "attn_mask=None)")], "see the later tokens"),
    ([("attn_mask=causal_mask(n, start + n, offset=start))", "is_causal=n > 1)")], "wrong for a later chunk"),
    ([("attn_mask=causal_mask(n, start + n, offset=start))",
       "attn_mask=causal_mask(n, start + n) if start == 0 else None)")], "wrong for a later chunk"),
    ([("attn_mask=causal_mask(n, start + n, offset=start))",
       "attn_mask=causal_mask(n, start + n, offset=start - 1) if start else causal_mask(n))")],
     "not itself"),
    ([("torch.arange(start, start + n, device=x.device)", "torch.arange(n, device=x.device)")],
     "as if it started at position 0"),
    ([("attn_mask=causal_mask(n, start + n, offset=start))",
       "attn_mask=causal_mask(n, start + n, offset=start), scale=1.0)")], "differ from the layer's causal"),
]

CACHE_WRITTEN = [('''
def decode(layer, x, chunks):  # right numbers, no cache: the whole prefix again every time
    outs, start = [], 0
    for n in chunks:
        out, _ = layer(x[:, : start + n], is_causal=True)
        outs.append(out[:, start:])
        start += n
    return torch.cat(outs, dim=1)

answer = decode
''', "recomputes the keys of earlier tokens"), ('''
def decode(layer, x, chunks):  # right numbers, no decoding at all
    return layer(x, is_causal=True)[0]

answer = decode
''', "the whole sequence in one call")]


def test_the_buggy_decode_is_right_for_the_first_chunk_only():
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 4, n_kv_heads=2, rope=True).eval()
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        want, _ = layer(x, is_causal=True)
        got = decoding.buggy_decode(layer, x, [4, 1, 2])
    torch.testing.assert_close(got[:, :4], want[:, :4])
    assert not torch.allclose(got[:, 4:], want[:, 4:], atol=1e-3)
    assert decoding.buggy_decode is decoding.buggy_decode


def test_cache_bug_the_fix_and_the_librarys_own_cache_pass(capsys):
    state = torch.random.get_rng_state()
    ok, out = verdict(capsys, decoding.check_cache_bug, run(CACHE_FIX))
    assert ok is True, out
    assert torch.equal(torch.random.get_rng_state(), state)
    library = '''
def decode(layer, x, chunks):
    cache, outs, start = selfattn.KVCache(), [], 0
    for n in chunks:
        outs.append(layer(x[:, start : start + n], is_causal=True, kv_cache=cache)[0])
        start += n
    return torch.cat(outs, dim=1)

answer = decode
'''
    ok, out = verdict(capsys, decoding.check_cache_bug, run(library))
    assert ok is True, out


@pytest.mark.parametrize(("edits", "hint"), CACHE_MISTAKES, ids=[m[1][:30] for m in CACHE_MISTAKES])
def test_cache_bug_mistakes_get_their_hint(edits, hint, capsys):
    ok, out = verdict(capsys, decoding.check_cache_bug, run(edited(CACHE_FIX, edits)))
    assert ok is False and hint in out, out


@pytest.mark.parametrize(("code", "hint"), CACHE_WRITTEN, ids=[m[1][:30] for m in CACHE_WRITTEN])
def test_cache_bug_written_mistakes_get_their_hint(code, hint, capsys):
    ok, out = verdict(capsys, decoding.check_cache_bug, run(code))
    assert ok is False and hint in out, out


def test_the_checkers_are_exported_and_documented():
    for name in ("check_uptraining", "check_cache_bug"):
        assert getattr(decoding, name).__doc__.startswith("Chapter 11, build-it exercise")


def test_uptraining_recovery_runs_on_a_tiny_budget():
    arms = decoding.uptraining_recovery(run(UPTRAINING), seeds=[0, 1], steps=20, uptrain_steps=2)
    assert list(arms) == ["MHA", "pooled", "random K/V", "pooled, uptrained", "random K/V, uptrained"]
    assert all(len(v) == 2 and all(0 <= a <= 1 for a in v) for v in arms.values())
    again = decoding.uptraining_recovery(run(UPTRAINING), seeds=[0, 1], steps=20, uptrain_steps=2)
    assert again == arms  # seeded


def test_effective_cache_is_the_largest_fast_working_set():
    bandwidth = {1: 56.0, 4: 27.0, 16: 25.0, 32: 19.0, 48: 14.0, 128: 13.0}
    assert decoding.effective_cache_bytes(bandwidth) == 2 * 32 * 2**20
    assert decoding.effective_cache_bytes(bandwidth, margin=1.5) == 2 * 16 * 2**20
    assert decoding.effective_cache_bytes({1: 10.0, 2: 10.0}) == 0


def test_copy_bandwidth_and_tokens_per_pass_measure_every_size():
    bandwidth = decoding.copy_bandwidth((1, 2), repeats=3)
    assert list(bandwidth) == [1, 2] and all(v > 0 for v in bandwidth.values())
    torch.manual_seed(0)
    block = DecoderBlock(32, 4).eval()
    passes = decoding.tokens_per_pass(block, (1, 8), repeats=3)
    assert list(passes) == [1, 8]
    for row in passes.values():
        assert set(row) == {"ms_per_token", "gflop_per_s", "weights_gb_per_s"}
        assert all(v > 0 for v in row.values())
