"""Tiled attention with an online softmax: the same numbers as attention, tile by tile."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from reference import counted_flops, pytorch_reference

import selfattn
from selfattn import tiled
from selfattn.book.kit.measure import peak_memory, saved_tensor_bytes
from selfattn.tiled import online_softmax, running_max_and_sum, tiled_attention

F64 = torch.float64


@st.composite
def attention_cases(draw, dtype=torch.float32):
    """Random batch shapes (broadcast between q, k, v and the mask), L != S, block sizes that do
    not divide them, and every kind of mask, fully masked rows included."""
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    L, S, E, Ev = (draw(st.integers(1, n)) for n in (12, 12, 8, 8))
    block_size = draw(st.integers(1, max(L, S) + 1))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    def some_of(shape):  # a shape that broadcasts to `shape`: some dims 1, some leading ones gone
        kept = [n if draw(st.booleans()) else 1 for n in shape]
        return kept[draw(st.integers(0, len(kept))) :]

    q = torch.randn(*some_of(batch), L, E, generator=g, dtype=dtype)
    k = torch.randn(*some_of(batch), S, E, generator=g, dtype=dtype)
    v = torch.randn(*some_of(batch), S, Ev, generator=g, dtype=dtype)
    kind = draw(st.sampled_from(["none", "bool", "float", "causal", "causal and bool"]))
    kwargs = {"is_causal": kind.startswith("causal")}
    full = [*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]), L, S]
    mask_shape = some_of(full) if draw(st.booleans()) else full
    if kind in ("bool", "causal and bool"):
        kwargs["attn_mask"] = torch.rand(mask_shape, generator=g) > draw(st.floats(0.0, 0.9))
    elif kind == "float":  # a bias, and -inf at some keys (whole rows sometimes)
        bias = torch.randn(mask_shape, generator=g, dtype=dtype)
        hidden = torch.rand(mask_shape, generator=g) < draw(st.floats(0.0, 0.9))
        kwargs["attn_mask"] = bias.masked_fill(hidden, -math.inf)
    if draw(st.booleans()):
        kwargs["scale"] = draw(st.floats(0.05, 2.0))
    return q, k, v, kwargs, block_size


def on(device, q, k, v, kwargs):
    """The case's tensors on ``device``."""
    kwargs = {n: a.to(device) if isinstance(a, torch.Tensor) else a for n, a in kwargs.items()}
    return q.to(device), k.to(device), v.to(device), kwargs


@given(case=attention_cases())
def test_matches_pytorch_sdpa_in_float32(case, device):
    q, k, v, kwargs = on(device, *case[:4])
    block_size = case[4]
    out = tiled_attention(q, k, v, block_size=block_size, **kwargs)
    torch.testing.assert_close(out, pytorch_reference(q, k, v, **kwargs), atol=1e-5, rtol=1e-5)


@given(case=attention_cases(dtype=F64))
def test_matches_the_explicit_path_in_float64(case, device):
    q, k, v, kwargs = on(device, *case[:4])
    block_size = case[4]
    out = tiled_attention(q, k, v, block_size=block_size, **kwargs)
    expected, _ = selfattn.scaled_dot_product_attention(q, k, v, **kwargs)
    assert out.dtype == F64 and out.shape == expected.shape
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("kind", ["bool", "float", "causal and padding"])
@pytest.mark.parametrize("block_size", [1, 2, 3, 8])
def test_fully_masked_rows_give_zeros_and_zero_gradients(kind, block_size, device):
    q, k, v = (torch.randn(2, 6, 4, dtype=F64, device=device, requires_grad=True) for _ in range(3))
    keep = torch.ones(6, 6, dtype=torch.bool, device=device)
    keep[[1, 4]] = False  # queries 1 and 4 may attend to nothing
    kwargs = {"attn_mask": keep if kind == "bool" else selfattn.to_additive(keep, F64)}
    if kind == "causal and padding":  # query 0 sees only key 0, which is padding
        padding = torch.tensor([False, True, True, True, True, True], device=device)
        kwargs = {"attn_mask": padding, "is_causal": True}
    out = tiled_attention(q, k, v, block_size=block_size, **kwargs)
    dead = [1, 4] if kind != "causal and padding" else [0]
    live = [i for i in range(6) if i not in dead]
    assert (out[:, dead] == 0).all()
    expected, _ = selfattn.scaled_dot_product_attention(q, k, v, **kwargs)
    torch.testing.assert_close(out[:, live], expected[:, live])
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad.isfinite().all()
    assert (q.grad[:, dead] == 0).all()


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"scale": 0.3}, "bool", "float",
                                    "key bias", "query bias", "masked rows"],
                         ids=["plain", "causal", "scale", "bool mask", "float mask", "key bias",
                              "query bias", "masked rows"])
def test_gradients_match_finite_differences(kwargs):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 1, 7, 3, generator=g, dtype=F64, requires_grad=True)  # heads broadcast
    k = torch.randn(2, 5, 3, generator=g, dtype=F64, requires_grad=True)  # L != S
    v = torch.randn(2, 5, 4, generator=g, dtype=F64, requires_grad=True)
    inputs = (q, k, v)
    if kwargs == "bool":
        kwargs = {"attn_mask": torch.rand(7, 5, generator=g) > 0.4, "is_causal": True}
    elif kwargs == "float":  # the bias gets a gradient too
        inputs = (q, k, v, torch.randn(1, 7, 5, generator=g, dtype=F64, requires_grad=True))
        kwargs = {}
    elif kwargs in ("key bias", "query bias"):  # broadcast over the queries, or the keys
        shape = (2, 1, 1, 5) if kwargs == "key bias" else (7, 1)
        inputs = (q, k, v, torch.randn(shape, generator=g, dtype=F64, requires_grad=True))
        kwargs = {"is_causal": True}
    elif kwargs == "masked rows":  # queries 2 and 5 see no key; the rest, causal
        keep = torch.ones(7, 5, dtype=torch.bool)
        keep[[2, 5]] = False
        kwargs = {"attn_mask": keep, "is_causal": True}

    def f(*inputs):
        return tiled_attention(*inputs, block_size=2, **kwargs)

    assert torch.autograd.gradcheck(f, inputs)


# name: (L, S, block_size, mask): block sizes that do not divide L or S, L != S both ways
GRADIENT_CASES = {
    "plain": (9, 9, 4, None),
    "causal": (10, 10, 3, "causal"),
    "causal, L < S": (6, 11, 4, "causal"),
    "causal, L > S": (11, 6, 4, "causal"),
    "bool mask, L > S": (11, 7, 3, "bool"),
    "causal and bool": (10, 10, 4, "causal and bool"),
    "float mask with a gradient, broadcast over the batch": (7, 12, 5, "float"),
    "fully masked rows": (9, 7, 4, "masked rows"),
}


def gradient_case(name, dtype, device):
    """q (2, 3, L, E) against k, v broadcast over the heads (2, 1, S, .), a mask, and the
    gradient of the output to push back: the inputs (all requiring grad) and the keywords."""
    L, S, block_size, mask = GRADIENT_CASES[name]
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, L, 5, generator=g, dtype=dtype)
    k = torch.randn(2, 1, S, 5, generator=g, dtype=dtype)
    v = torch.randn(2, 1, S, 4, generator=g, dtype=dtype)
    grad_out = torch.randn(2, 3, L, 4, generator=g, dtype=dtype).to(device)
    inputs, kwargs = [q, k, v], {"is_causal": mask is not None and mask.startswith("causal")}
    if mask in ("bool", "causal and bool"):
        kwargs["attn_mask"] = (torch.rand(L, S, generator=g) > 0.4).to(device)
    elif mask == "masked rows":  # queries 1 and 6 see no key
        keep = torch.rand(3, L, S, generator=g) > 0.3
        keep[:, [1, 6]] = False
        kwargs["attn_mask"] = keep.to(device)
    elif mask == "float":  # (3, L, S): summed over the batch; -inf at some keys
        bias = torch.randn(3, L, S, generator=g, dtype=dtype)
        inputs.append(bias.masked_fill(torch.rand(3, L, S, generator=g) < 0.3, -math.inf))
    inputs = [t.to(device).requires_grad_() for t in inputs]
    return inputs, kwargs, grad_out, block_size


def gradients(attention, inputs, kwargs, grad_out):
    """d(out · grad_out) with respect to every input."""
    return torch.autograd.grad(attention(*inputs, **kwargs), inputs, grad_out)


def assert_gradients_match(name, dtype, device, against="explicit"):
    """The tiled path's gradients against the explicit path's, or SDPA's; float64 to 1e-10,
    float32 to 1e-5."""
    inputs, kwargs, grad_out, block_size = gradient_case(name, dtype, device)
    got = gradients(lambda *a, **kw: tiled_attention(*a, block_size=block_size, **kw),
                    inputs, kwargs, grad_out)
    reference = (pytorch_reference if against == "sdpa"
                 else lambda *a, **kw: selfattn.scaled_dot_product_attention(*a, **kw)[0])
    want = gradients(reference, inputs, kwargs, grad_out)
    tolerance = 1e-10 if dtype == F64 else 1e-5
    for what, a, b in zip("qkvm"[: len(inputs)], got, want, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=tolerance, rtol=tolerance, msg=lambda m, w=what:
                                   f"d{w} of {name!r}: {m}")


@pytest.mark.parametrize("name", GRADIENT_CASES)
def test_gradients_match_the_explicit_path_in_float64(name, device):
    assert_gradients_match(name, F64, device)


@pytest.mark.parametrize("name", [n for n in GRADIENT_CASES if n != "fully masked rows"])
def test_gradients_match_pytorch_sdpa_in_float32(name, device):
    # SDPA gives NaN for a fully masked row; the explicit path gives zeros, like ours
    assert_gradients_match(name, torch.float32, device, against="sdpa")


def test_gradients_of_fully_masked_rows_match_the_explicit_path_in_float32(device):
    assert_gradients_match("fully masked rows", torch.float32, device)


def plant(monkeypatch, bug):
    """Make the backward pass wrong in one way, as a mistake would, leaving the forward right."""
    backward, key_blocks = tiled.tiled_backward, tiled._key_blocks

    def wrong_backward(grad_out, q, k, v, attn_mask, out, lse, *options, **kwargs):
        if bug == "forgets D":  # D = rowsum(dO * O) is then 0: dS = P * dP
            out = torch.zeros_like(out)
        elif bug == "forgets the causal skip":  # reads the key blocks past the diagonal too
            monkeypatch.setattr(tiled, "_key_blocks", lambda i, b, S, is_causal: key_blocks(i, b, S, False))
        elif bug == "forgets the mask":  # recomputes the weights of masked keys
            attn_mask = None
        return backward(grad_out, q, k, v, attn_mask, out, lse, *options, **kwargs)

    monkeypatch.setattr(tiled, "tiled_backward", wrong_backward)


@pytest.mark.parametrize(("bug", "case"), [("forgets D", "plain"),
                                           ("forgets the causal skip", "causal, L > S"),
                                           ("forgets the causal skip", "causal, L < S"),
                                           ("forgets the mask", "bool mask, L > S")])
def test_the_gradient_checks_catch_a_wrong_backward(monkeypatch, bug, case):
    assert_gradients_match(case, F64, "cpu")  # right, then with the bug planted: caught
    plant(monkeypatch, bug)
    with pytest.raises(AssertionError, match=f"of {case!r}"):
        assert_gradients_match(case, F64, "cpu")


def test_autograd_keeps_only_the_inputs_the_output_and_the_log_sum_exp():
    T = 256
    x = torch.randn(1, 8, T, 64, requires_grad=True)  # query, key and value: one storage
    kept = saved_tensor_bytes(lambda: tiled_attention(x, x, x, block_size=64))
    assert kept == 4 * (x.numel() + x.numel() + 8 * T)  # x, the output (same shape), lse (8, T)
    explicit = saved_tensor_bytes(lambda: selfattn.scaled_dot_product_attention(x, x, x)[0])
    assert explicit > 8 * T * T * 4  # it keeps (8, T, T) weights at least


def test_gradients_match_the_explicit_path_with_minus_infinity_in_a_float_mask(device):
    q, k, v = (torch.randn(3, 9, 5, dtype=F64, device=device, requires_grad=True) for _ in range(3))
    mask = torch.randn(9, 9, dtype=F64).masked_fill(torch.rand(9, 9) < 0.5, -math.inf).to(device)
    grads = torch.autograd.grad(tiled_attention(q, k, v, mask, block_size=4).square().sum(), (q, k, v))
    expected = torch.autograd.grad(
        selfattn.scaled_dot_product_attention(q, k, v, mask)[0].square().sum(), (q, k, v))
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want)


def test_causal_attention_never_computes_the_tiles_above_the_diagonal():
    b, E, Ev = 4, 8, 6
    q, k, v = (torch.randn(2, 4 * b, n) for n in (E, E, Ev))
    per_tile = 2 * 2 * b * b * (E + Ev)  # 2 heads, (b x E) @ (E x b) and (b x b) @ (b x Ev)
    assert counted_flops(lambda: tiled_attention(q, k, v, block_size=b)) == 16 * per_tile
    assert counted_flops(lambda: tiled_attention(q, k, v, is_causal=True, block_size=b)) == 10 * per_tile


def test_tiles_a_bool_mask_hides_entirely_are_skipped():
    b = 4
    q, k, v = (torch.randn(4 * b, 8) for _ in range(3))
    keep = torch.zeros(4 * b, 4 * b, dtype=torch.bool)
    keep[: 2 * b, : 2 * b] = True  # the first two blocks of queries see the first two of keys
    keep[-1, -1] = True  # one key for one query in the last tile
    per_tile = 2 * b * b * (8 + 8)
    assert counted_flops(lambda: tiled_attention(q, k, v, keep, block_size=b)) == 5 * per_tile
    torch.testing.assert_close(tiled_attention(q, k, v, keep, block_size=b),
                               selfattn.scaled_dot_product_attention(q, k, v, keep)[0])


def test_peak_memory_is_far_below_the_explicit_paths_and_grows_linearly():
    def peak(fn, T):
        q = torch.randn(1, 8, T, 64)
        with torch.no_grad():
            return peak_memory(lambda: fn(q))

    def explicit(q):
        return selfattn.scaled_dot_product_attention(q, q, q)[0]

    def tiled(q):
        return tiled_attention(q, q, q)

    assert peak(explicit, 1024) >= 8 * 1024 * 1024 * 4  # it holds the (8, 1024, 1024) scores
    assert peak(tiled, 1024) * 6 < peak(explicit, 1024)
    assert peak(tiled, 2048) < 2.5 * peak(tiled, 1024)  # the explicit path's grows 4x


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_returns_its_dtype_finite_and_accurate(dtype, device):
    g = torch.Generator().manual_seed(2)
    q, k, v = ((30 * torch.randn(2, 37, 16, generator=g)).to(device, dtype) for _ in range(3))  # ~1e4
    out = tiled_attention(q, k, v, is_causal=True, block_size=8)
    assert out.dtype == dtype and out.isfinite().all()
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    tolerance = 2 * 30 * torch.finfo(dtype).eps  # rounding the output, |v| up to ~100
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=0)


def test_block_size_is_checked():
    q = k = v = torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match="block_size must be positive, got 0"):
        tiled_attention(q, k, v, block_size=0)
    with pytest.raises(TypeError, match="block_size must be an int, got float"):
        tiled_attention(q, k, v, block_size=2.0)
    with pytest.raises(TypeError, match="block_size must be an int, got bool"):
        online_softmax(q, True)


def test_bad_inputs_are_refused_clearly():
    q = k = v = torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(3, 5\) does not broadcast"):
        tiled_attention(q, k, v, torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="attn_mask must be bool"):
        tiled_attention(q, k, v, torch.ones(5, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="same last dimension E"):
        tiled_attention(q, torch.randn(2, 5, 3), v)
    with pytest.raises(TypeError, match="positional"):  # is_causal, scale and block_size too
        tiled_attention(q, k, v, None, False, 0.5)


def test_the_fifth_argument_is_not_is_causal():
    # R2: PyTorch's fifth argument is dropout_p; tiled_attention(q, k, v, None, 0.1) was causal
    q = k = v = torch.randn(2, 5, 4)
    with pytest.raises(TypeError, match="positional"):
        tiled_attention(q, k, v, None, 0.1)
    torch.testing.assert_close(tiled_attention(q, k, v, None, is_causal=True),
                               selfattn.scaled_dot_product_attention(q, k, v, is_causal=True)[0])


@given(shape=st.lists(st.integers(1, 4), max_size=2), S=st.integers(1, 20), data=st.data())
def test_online_softmax_is_softmax(shape, S, data):
    block_size = data.draw(st.integers(1, S + 1))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    scores = 20 * torch.randn(*shape, S, generator=g, dtype=F64)
    scores[..., : S // 2][torch.rand(*shape, S // 2, generator=g) < 0.5] = -math.inf  # not a whole row
    torch.testing.assert_close(online_softmax(scores, block_size), torch.softmax(scores, dim=-1))
    history = running_max_and_sum(scores, block_size)
    assert len(history) == math.ceil(S / block_size)
    maxima = torch.cat([m for m, _ in history], dim=-1)  # (..., blocks)
    assert (maxima.diff(dim=-1) >= 0).all()  # the running maximum never falls
    m, l = history[-1]
    torch.testing.assert_close(m, scores.amax(dim=-1, keepdim=True))
    torch.testing.assert_close(l, torch.exp(scores - m).sum(dim=-1, keepdim=True))
