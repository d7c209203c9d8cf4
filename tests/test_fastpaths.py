"""selfattn.fastpaths: every fast path computes what the readable code computes.

The equality matrix runs MultiHeadAttention with one fast path forced (its thresholds lowered,
the thread count raised, the others off), or with all of them, and compares it with every path
off: the readable computation, ``repeat_kv`` then ``attention.attend`` (or
``F.scaled_dot_product_attention`` without weights). In the spirit of flash-attention's
``attention_ref`` tests it compares outputs, weights and gradients (of the inputs, the projection
weights and a mask that requires grad); float64 and float32 closely, float16 and bfloat16 by
flash-attention's rule against float64: the fast run and the readable one each at most twice
the error of the same layer with its attention computed by ``reference.attention_ref`` in the
low dtype (plain torch, none of the library's attention). Each row also checks that each path
ran exactly where its condition says it may, so a path that never runs cannot pass by not
running. What each call may allocate and hand to PyTorch's kernel: tests/test_costs.py.
"""

import contextlib
import copy
import itertools
import warnings
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from reference import assert_within_twice_the_reference_error, attention_ref

import selfattn
from selfattn import fastpaths

H, D = 4, 16  # query heads and d_model of every layer here
DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16}
# the call that is compared: L queries after P cached tokens, S keys (cross: keys of their own)
GEOMETRIES = {"self": (9, 0, 9), "cross": (3, 0, 11), "cross_wide": (11, 0, 3), "cache": (1, 8, 9),
              "chunk": (2, 7, 9)}  # cross_wide: more queries than keys (L > S)
DIMENSIONS = {
    "n_kv_heads": [4, 2, 1],  # MHA, GQA, MQA
    "geometry": list(GEOMETRIES),
    "batch": [1, 2],
    "need_weights": [False, True],
    "mask": ["none", "bool", "float", "float_grad"],
    "is_causal": [False, True],
    "grad": ["off", "on", "frozen"],  # frozen: grad mode on, no parameter or input requires grad
    "dropout_p": [0.0, 0.25],
    "dtype": list(DTYPES),
}
# The rows of each path: every combination of its "crossed" dimensions; for split_kv, whose
# condition is a conjunction, each of them with the point where the condition holds ("around")
# and with each argument the condition reads moved away from it alone. The other dimensions take
# every pair of values across a path's rows.
DESIGNS = {
    # is_causal by geometry: a causal call without a cache reaches PyTorch's enable_gqa, one
    # new token after a cache the stacked groups (with grouped_heads only, stacked_groups off)
    "grouped_heads": {"crossed": ["n_kv_heads", "is_causal", "geometry", "need_weights"],
                      "around": {"mask": "none"}},
    "stacked_groups": {"crossed": ["n_kv_heads", "is_causal", "geometry", "need_weights"],
                       "around": {"mask": "none"}},
    "inplace_softmax": {"crossed": ["need_weights", "mask", "is_causal", "grad"]},
    "split_kv": {"crossed": ["n_kv_heads", "geometry"],
                 "around": {"need_weights": False, "mask": "none", "is_causal": False,
                            "grad": "off", "batch": 1, "dropout_p": 0.0}},
    "all": {"crossed": ["n_kv_heads", "geometry", "need_weights"]},
}


def covering_rows(crossed: list[str], around: dict | None = None) -> list[dict]:
    """Rows over DIMENSIONS: every combination of the ``crossed`` dimensions, each with ``around``
    and with ``around`` changed in one dimension at a time, then every pair of values of any two
    dimensions (all-pairs testing); each free value is chosen greedily to cover the most pairs not
    covered yet. Deterministic: the same rows on every run."""
    names = list(DIMENSIONS)

    def pair(a, x, b, y):  # a pair of (dimension, value), in the order of DIMENSIONS
        return (a, x, b, y) if names.index(a) < names.index(b) else (b, y, a, x)

    everything = [(a, x, b, y) for a, b in itertools.combinations(names, 2)
                  for x in DIMENSIONS[a] for y in DIMENSIONS[b]]
    uncovered = set(everything)
    rows: list[dict] = []

    def add(row):
        for name in names:
            if name not in row:
                row[name] = max(DIMENSIONS[name], key=lambda v, name=name: sum(
                    pair(m, row[m], name, v) in uncovered for m in row))
        uncovered.difference_update(pair(a, row[a], b, row[b])
                                    for a, b in itertools.combinations(names, 2))
        rows.append(row)

    around = around or {}
    moved = [{**around, name: value} for name in around for value in DIMENSIONS[name]
             if value != around[name]]
    for values in itertools.product(*(DIMENSIONS[n] for n in crossed)):
        for point in [around, *moved]:
            add({**point, **dict(zip(crossed, values, strict=True))})
    for a, x, b, y in everything:
        if (a, x, b, y) in uncovered:
            add({a: x, b: y})
    return rows


def row_id(path, row):
    kind = {4: "mha", 2: "gqa", 1: "mqa"}[row["n_kv_heads"]]
    return (f"{path}-{kind}-{row['geometry']}-B{row['batch']}-"
            f"{'weights' if row['need_weights'] else 'noweights'}-mask_{row['mask']}-"
            f"{'causal' if row['is_causal'] else 'full'}-grad_{row['grad']}-p{row['dropout_p']}-"
            f"{row['dtype']}")


MATRIX = [(path, row) for path, design in DESIGNS.items() for row in covering_rows(**design)]
WITH = {"stacked_groups": {"grouped_heads"}}  # a path that is one way of another: both on


def switched_on(path: str) -> set[str]:
    """The paths a row of ``path`` runs with: all of them, or the path (and the one it is a way
    of), the others off."""
    return set(fastpaths.ENABLED) if path == "all" else {path} | WITH.get(path, set())


@pytest.fixture
def forced(monkeypatch):
    """Every size condition met by this module's small layers: a cache of 8 keys is long enough
    to split, and there are 8 threads (two or more per key/value head)."""
    monkeypatch.setattr(fastpaths, "SPLIT_KV_MIN_KEYS", 8)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)


@pytest.fixture
def runs(monkeypatch):
    """How many times each fast path's run function has been called, by name."""
    counts = dict.fromkeys(fastpaths.ENABLED, 0)

    def counted(path):
        def run(call):
            counts[path.name] += 1
            return path.run(call)
        return replace(path, run=run)

    monkeypatch.setattr(fastpaths, "GROUPED_HEADS", counted(fastpaths.GROUPED_HEADS))
    monkeypatch.setattr(fastpaths, "STACKED_GROUPS", counted(fastpaths.STACKED_GROUPS))
    monkeypatch.setattr(fastpaths, "KERNELS", [counted(path) for path in fastpaths.KERNELS])
    fused = fastpaths._fused_takes_groups  # on CUDA PyTorch's own checks decide: record them
    monkeypatch.setattr(fastpaths, "_fused_takes_groups",
                        lambda c: FUSED_SAID.append(fused(c)) or FUSED_SAID[-1])
    return counts


FUSED_SAID: list[bool] = []  # what fastpaths._fused_takes_groups answered in the compared call


def make_case(row):
    """A row's layer and inputs in float64; each run casts them to its dtype and device."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    layer = selfattn.MultiHeadAttention(D, H, n_kv_heads=row["n_kv_heads"],
                                        dropout_p=row["dropout_p"]).double()
    L, P, S = GEOMETRIES[row["geometry"]]
    B = row["batch"]
    case = {"layer": layer, "x": torch.randn(B, P + L, D, generator=g, dtype=torch.float64)}
    if row["geometry"].startswith("cross"):
        case["key"] = torch.randn(B, S, D, generator=g, dtype=torch.float64)
    if row["mask"] == "bool":
        keep = torch.rand(B, 1, L, S, generator=g) > 0.3
        keep[0, 0, -1] = False  # a query that may attend to nothing
        case["mask"] = keep
    elif row["mask"] != "none":  # a bias per head, -inf at some keys, a row of -inf
        bias = torch.randn(1, H, L, S, generator=g, dtype=torch.float64)
        bias[torch.rand(1, H, L, S, generator=g) < 0.3] = float("-inf")
        bias[0, 1, -1] = float("-inf")
        case["mask"] = bias
    case["out_weight"] = torch.randn(B, L, D, generator=g, dtype=torch.float64)  # for the loss
    case["weights_weight"] = torch.randn(B, H, L, S, generator=g, dtype=torch.float64)
    return case


def run(case, row, dtype, device, counts=None):
    """The compared call's output (and weights), and, with grad on, the gradients of the loss
    with respect to the inputs, every parameter and a mask that requires grad. ``counts`` (the
    ``runs`` fixture's) is set to zero before the compared call: a cache's prefill is a call too."""
    P = GEOMETRIES[row["geometry"]][1]
    layer = copy.deepcopy(case["layer"]).to(device=device, dtype=dtype).train(row["dropout_p"] > 0)
    x = case["x"].to(device=device, dtype=dtype)
    key = case["key"].to(device=device, dtype=dtype) if "key" in case else None
    mask = case.get("mask")
    if mask is not None:
        mask = mask.to(device=device, dtype=dtype if mask.is_floating_point() else torch.bool)
    leaves = {}
    if row["grad"] == "on":
        leaves = dict(layer.named_parameters())
        leaves["x"] = x.requires_grad_()
        if key is not None:
            leaves["key"] = key.requires_grad_()
    layer.requires_grad_(row["grad"] != "frozen")
    if row["mask"] == "float_grad":
        leaves["mask"] = mask.requires_grad_()
    torch.manual_seed(1)  # dropout draws the same masks on every path and in every dtype
    with torch.set_grad_enabled(row["grad"] != "off"):
        cache = None
        if P:
            cache = selfattn.KVCache()
            layer(x[:, :P], is_causal=row["is_causal"], kv_cache=cache)
        kwargs = {"is_causal": row["is_causal"], "need_weights": row["need_weights"],
                  "attn_mask": mask, "kv_cache": cache}
        if counts is not None:
            counts.update(dict.fromkeys(counts, 0))
            FUSED_SAID.clear()
        out, weights = layer(x[:, P:], key, **kwargs)
    results = {"output": out, "weights": weights}
    if any(t.requires_grad for t in leaves.values()) and row["grad"] != "off":
        loss = (out * case["out_weight"].to(out)).sum()
        if weights is not None:
            loss = loss + (weights * case["weights_weight"].to(weights)).sum()
        names = list(leaves)
        grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
        results |= {f"gradient of {n}": g for n, g in zip(names, grads, strict=True)}
    return results


@contextlib.contextmanager
def plain_attention():
    """The layer with its attention computed by reference.attention_ref in the inputs' dtype
    (upcast=False): the low-precision yardstick, none of the library's attention code."""
    def attend_heads(q, k, v, *, attn_mask=None, is_causal=False, dropout_p=0.0,
                     need_weights=False):
        out, weights = attention_ref(q, k, v, attn_mask, is_causal, dropout_p, upcast=False)
        return out, weights if need_weights else None

    real = fastpaths.attend_heads
    fastpaths.attend_heads = attend_heads
    try:
        yield
    finally:
        fastpaths.attend_heads = real


def expected_runs(row, enabled, device):
    """Which paths the dispatch table should pick for the compared call, from their conditions
    as the module docstring states them."""
    L, P, S = GEOMETRIES[row["geometry"]]
    mask, causal = row["mask"], row["is_causal"]
    if causal and (P > 0 or mask != "none"):  # forward folds the causal mask into attn_mask
        causal = False
        if L > 1 or P < S - 1:  # (one query after the cache sees every key: no mask at all)
            mask = "bool" if mask == "none" else mask
    # stacked: one query per head (decoding), with the weights or without a causal mask
    stacks = (row["n_kv_heads"] < H and L == 1 and (row["need_weights"] or not causal)
              and {"grouped_heads", "stacked_groups"} <= enabled)
    # PyTorch's fused kernel takes grouped heads on a CPU; on CUDA its own checks said
    fused = device == "cpu" or (FUSED_SAID[-1] if FUSED_SAID else False)
    grouped = ("grouped_heads" in enabled and row["n_kv_heads"] < H
               and (stacks or (not row["need_weights"] and fused)))
    one_head_each = row["n_kv_heads"] == H or not grouped or stacks  # then: no enable_gqa
    if stacks and causal:  # stacked query heads are no longer top-left causal
        mask, causal = "bool", False
    cpu = device == "cpu"
    recorded = row["grad"] == "on" or (row["grad"] == "frozen" and row["mask"] == "float_grad")
    return {
        "grouped_heads": grouped,
        "stacked_groups": stacks,
        "inplace_softmax": "inplace_softmax" in enabled and row["need_weights"] and cpu,
        "split_kv": ("split_kv" in enabled and not row["need_weights"] and mask == "none"
                     and not causal and row["dropout_p"] == 0.0 and not recorded and cpu
                     and one_head_each and row["batch"] == 1 and S >= fastpaths.SPLIT_KV_MIN_KEYS
                     and L * (H // row["n_kv_heads"] if stacks else 1)
                     <= fastpaths.SPLIT_KV_MAX_QUERIES),
    }


@pytest.mark.parametrize(("path", "row"), MATRIX, ids=[row_id(p, r) for p, r in MATRIX])
def test_each_fast_path_equals_the_readable_computation(path, row, device, forced, runs):
    case = make_case(row)
    dtype = DTYPES[row["dtype"]]
    enabled = switched_on(path)
    others = set(fastpaths.ENABLED) - enabled  # (disabled() with no name switches off all)
    with fastpaths.disabled(*others) if others else contextlib.nullcontext():
        fast = run(case, row, dtype, device, counts=runs)
    ran = {name: count for name, count in runs.items() if count}
    with fastpaths.disabled():
        readable = run(case, row, dtype, device)
        exact = run(case, row, torch.float64, device) if dtype.itemsize < 4 else None
    if exact is not None:
        with plain_attention():
            plain = run(case, row, dtype, device)
    assert set(fast) == set(readable)
    for what, got in fast.items():
        want = readable[what]
        if want is None or got is None:
            assert got is None and want is None, what
        elif exact is None:
            tolerance = 1e-10 if dtype == torch.float64 else 1e-5
            torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance, msg=what)
        else:
            for name, result in (("fast", got), ("readable", want)):
                assert_within_twice_the_reference_error(result, plain[what], exact[what],
                                                        f"{what} ({name})")
    expected = expected_runs(row, enabled, device)
    assert ran == {name: 1 for name, runs_here in expected.items() if runs_here}
    assert fastpaths.ENABLED == dict.fromkeys(fastpaths.ENABLED, True)  # all back on


def test_the_matrix_reaches_every_path_and_holds_every_pair_of_values(forced):
    for path in fastpaths.ENABLED:
        rows = [r for p, r in MATRIX if p == path]
        ran = [r for r in rows if expected_runs(r, switched_on(path), "cpu")[path]]
        assert ran, path
    names = list(DIMENSIONS)
    for a, b in itertools.combinations(names, 2):  # every pair, in each path's rows
        for path in DESIGNS:
            seen = {(r[a], r[b]) for p, r in MATRIX if p == path}
            assert seen == set(itertools.product(DIMENSIONS[a], DIMENSIONS[b])), (path, a, b)


def test_the_table_names_every_switch():
    assert [fastpaths.GROUPED_HEADS.name, fastpaths.STACKED_GROUPS.name,
            *(p.name for p in fastpaths.KERNELS)] == list(fastpaths.ENABLED)


def test_split_kv_keeps_the_causal_mask_of_cross_attention(monkeypatch):
    # B1: split_kv's condition forgot is_causal; with MHA heads (nothing regroups them) a causal
    # cross-attention call at batch 1 with a long key sequence reached it and came out unmasked
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)  # more threads than key/value heads
    layer = selfattn.MultiHeadAttention(8, 1).eval()
    query, key = torch.randn(1, 4, 8), torch.randn(1, 5000, 8)
    with torch.no_grad():
        out, _ = layer(query, key, is_causal=True)
        with fastpaths.disabled():
            expected, _ = layer(query, key, is_causal=True)
    torch.testing.assert_close(out, expected)


def test_split_kv_is_not_used_where_autograd_records(monkeypatch):
    # its kernel gives no gradient for each part's log-sum-exp, so the split's gradients are wrong
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    layer = selfattn.MultiHeadAttention(8, 1).double().eval()
    query = torch.randn(1, 1, 8, dtype=torch.float64, requires_grad=True)
    key = 3 * torch.randn(1, 5000, 8, dtype=torch.float64)
    key.requires_grad_()

    def gradients():
        return torch.autograd.grad(layer(query, key)[0].square().sum(), (query, key))

    got = gradients()
    with fastpaths.disabled():
        expected = gradients()
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


def test_a_frozen_layer_gives_a_learned_mask_its_gradient():
    # B2: no parameter requires grad, so the in-place softmax ran, and raised "_softmax():
    # functions with out=... arguments don't support automatic differentiation"
    layer = selfattn.MultiHeadAttention(16, 2).requires_grad_(False)
    x = torch.randn(2, 6, 16)
    bias = torch.randn(1, 2, 6, 6, requires_grad=True)  # a learned additive bias

    def gradient():
        out, weights = layer(x, attn_mask=bias, need_weights=True)
        return torch.autograd.grad(out.square().sum() + weights.square().sum(), bias)[0]

    got = gradient()
    with fastpaths.disabled():
        expected = gradient()
    torch.testing.assert_close(got, expected)


def test_attend_heads_takes_its_options_by_keyword():
    # R1: attention.attend and the dispatcher took their flags positionally, in two orders
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 1, 5, 4)
    with pytest.raises(TypeError):
        fastpaths.attend_heads(q, k, k, None, False, 0.0, True)
    out, weights = fastpaths.attend_heads(q, k, k, need_weights=True)
    assert out.shape == (1, 2, 3, 4) and weights.shape == (1, 2, 3, 5)


def test_decode_attention_is_sdpa_split_across_threads_where_that_pays(monkeypatch):
    monkeypatch.setattr(fastpaths, "SPLIT_KV_MIN_KEYS", 8)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    splits = []
    split = fastpaths._split_kv_attention
    monkeypatch.setattr(fastpaths, "_split_kv_attention",
                        lambda q, k, v, chunks: splits.append(chunks) or split(q, k, v, chunks))
    q = torch.randn(1, 1, 4, 8)  # four stacked query heads of MQA, one new token
    k, v = torch.randn(1, 1, 40, 8), torch.randn(1, 1, 40, 8)  # 3 parts of 13 keys, 1 left over
    expected = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(fastpaths.decode_attention(q, k, v), expected)
    assert splits == [3]
    with fastpaths.disabled("split_kv"):
        torch.testing.assert_close(fastpaths.decode_attention(q, k, v), expected)
    q.requires_grad_()
    fastpaths.decode_attention(q, k, v).sum().backward()  # autograd records: not split
    assert splits == [3]


def test_split_kv_splits_only_where_it_helps():
    chunks = fastpaths._split_kv_chunks
    long = torch.zeros(1, 1, fastpaths.SPLIT_KV_MIN_KEYS, 8)
    q = torch.zeros(1, 1, 16, 8)
    assert chunks(q, long, 8) == 8  # MQA decoding: a part per thread
    assert chunks(torch.zeros(1, 2, 16, 8), long.expand(1, 2, -1, -1), 8) == 4  # per KV head
    assert chunks(q, long[:, :, :100], 8) == 1  # a short cache
    assert chunks(torch.zeros(2, 1, 16, 8), long.expand(2, -1, -1, -1), 8) == 1  # a batch
    assert chunks(torch.zeros(1, 1, 512, 8), long, 8) == 1  # a prefill
    assert chunks(q, long, 1) == 1  # one thread


def test_disabling_an_unknown_path_is_an_error():
    with pytest.raises(ValueError, match="unknown fast paths"), fastpaths.disabled("warp_drive"):
        pass


def test_a_pytorch_whose_sdpa_checks_cannot_be_asked_gets_the_copy_with_a_warning(monkeypatch):
    """On CUDA the grouped heads' path asks PyTorch's own checks whether a fused kernel takes
    grouped heads. Where they cannot be asked (an older PyTorch: another SDPAParams signature),
    the layer copies the key/value heads, and says so once (before: silently, on any
    exception, a wrong answer included)."""
    import types

    import torch.backends.cuda

    def old_signature(*args):
        raise TypeError(f"SDPAParams takes 6 arguments, {len(args)} given")

    monkeypatch.setattr(torch.backends.cuda, "SDPAParams", old_signature)
    fastpaths._warn_copying.cache_clear()
    q = types.SimpleNamespace(device=torch.device("cuda"))  # the check reads only the device
    call = fastpaths.Call(q, q, q, None, True, 0.0, False, False, 1)
    with pytest.warns(RuntimeWarning, match="grouped key/value heads are copied on CUDA"):
        assert fastpaths._fused_takes_groups(call) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: a second call is silent
        assert fastpaths._fused_takes_groups(call) is False
    fastpaths._warn_copying.cache_clear()
