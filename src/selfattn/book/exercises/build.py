"""Checkers for the chapters' build-it exercises: the reader writes a real piece of attention (a
layer, RoPE, splitting heads, a KV cache, an online softmax) and the checker runs it against the
library, with the weights copied or on identical inputs.

When the answer is wrong, the checker recomputes the typical mistakes (no scale, the softmax over
the wrong axis, heads cut in the wrong order, ...) and names the one the answer matches; otherwise
it says where the answer differs. Every check uses its own seeded generator, and builds the
library's layers with the global random state saved and restored, so running a checker leaves a
chapter's random numbers as they were.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ...attention import scaled_dot_product_attention
from ...heads import merge_heads, repeat_kv, split_heads
from ...masks import causal_mask
from ...multihead import MultiHeadAttention
from ...positional import apply_rope
from .scaffold import NotYet, _call, _checker, _close, _tensor


def _seeded_layer(seed: int, *args: object, **kwargs: object) -> MultiHeadAttention:
    """A :class:`MultiHeadAttention` whose weights come from ``seed``, in eval mode; the global
    random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MultiHeadAttention(*args, **kwargs).eval()


def _equal(got: Tensor, want: Tensor) -> bool:
    """Exactly ``want`` (values moved, never computed), whatever dtype the reader returned."""
    try:
        return got.shape == want.shape and torch.equal(got.detach().to(want.dtype), want)
    except (RuntimeError, TypeError):
        return False


def _first_match(got: Tensor, candidates: list[tuple[Callable[[], Tensor], str]],
                 atol: float = 1e-3) -> str | None:
    """The hint of the first typical mistake whose result ``got`` equals, if any. Only a wrong
    answer is compared, so the tolerance can be loose: the mistakes differ from the right answer,
    and from each other, by far more."""
    for compute, hint in candidates:
        wrong = compute()
        if wrong.shape == got.shape and _close(got, wrong, atol=atol, rtol=1e-3):
            return hint
    return None


# --- chapter 2: a self-attention layer --------------------------------------------------------

_PROJECTIONS = {"W_q": "d_k", "W_k": "d_k", "W_v": "d_v"}
_ROLES = {"W_q": "queries", "W_k": "keys", "W_v": "values"}


def _linears(layer: object, sizes: dict[str, int]) -> dict[str, nn.Linear]:
    """The reader's ``W_q``, ``W_k``, ``W_v``: each an ``nn.Linear(d_model, d_k or d_v, bias=False)``."""
    if not isinstance(layer, nn.Module):
        raise NotYet(f"your class should be an nn.Module (class ...(nn.Module)), got an instance "
                     f"of {type(layer).__name__}")
    found = {}
    given = ", ".join(f"{k}={v}" for k, v in sizes.items())
    for name, out_name in _PROJECTIONS.items():
        linear = getattr(layer, name, None)
        if linear is None:
            raise NotYet(f"your class has no attribute {name}: in __init__, set "
                         f"self.{name} = nn.Linear(d_model, {out_name}, bias=False)")
        if not isinstance(linear, nn.Linear):
            raise NotYet(f"{name} should be an nn.Linear, got {type(linear).__name__}")
        want = (sizes["d_model"], sizes[out_name])
        if (linear.in_features, linear.out_features) != want:
            raise NotYet(f"given {given}, {name} maps {linear.in_features} features to "
                         f"{linear.out_features}; it should map d_model={want[0]} to "
                         f"{out_name}={want[1]}: nn.Linear(d_model, {out_name}, bias=False)")
        if linear.bias is not None:
            raise NotYet(f"{name} has a bias: build it with nn.Linear(..., bias=False)")
        found[name] = linear
    return found


def _attention_layer_case(cls: object, d_model: int, d_k: int, d_v: int, seed: int) -> None:
    sizes = {"d_model": d_model, "d_k": d_k, "d_v": d_v}
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        try:
            layer = _call(cls, d_model, d_k, d_v, kind="class")
        except NotYet as why:
            if "before Module.__init__() call" in str(why):
                raise NotYet(f"{why}. Call super().__init__() first in your __init__") from None
            raise
    linears = _linears(layer, sizes)
    # weights scaled so that the scores q.k / sqrt(d_k) have unit variance: no softmax saturates
    weights = {name: torch.randn(lin.out_features, d_model, generator=g) / math.sqrt(d_model)
               for name, lin in linears.items()}
    with torch.no_grad():
        for name, linear in linears.items():
            linear.weight.copy_(weights[name])
    layer.eval()
    x = torch.randn(2, 5, d_model, generator=g)  # (B, T, d_model)
    proj = {name: x @ w.T for name, w in weights.items()}  # (B, T, d_k or d_v)
    q, k, v = proj["W_q"], proj["W_k"], proj["W_v"]
    with torch.no_grad():
        if d_k == d_v:  # the library's layer, one head, weights copied, out_proj the identity
            with torch.random.fork_rng(devices=[]):
                mha = MultiHeadAttention(d_model, 1, head_dim=d_k, out_dim=d_v, bias=False).eval()
            for ours, name in [(mha.q_proj, "W_q"), (mha.k_proj, "W_k"), (mha.v_proj, "W_v")]:
                ours.weight.copy_(weights[name])
            mha.out_proj.weight.copy_(torch.eye(d_v))
            want, _ = mha(x)
        else:
            want, _ = scaled_dot_product_attention(q, k, v)
        got = _call(layer, x, kind="class's forward")
    if isinstance(got, tuple):
        raise NotYet(f"your forward returned a tuple of {len(got)}; return only the output "
                     f"(B, T, d_v)")
    got = _tensor(got, want)
    if _close(got, want):
        return

    def attend(q: Tensor, k: Tensor, v: Tensor, scale: float = 1 / math.sqrt(d_k), dim: int = -1,
               softmax: bool = True) -> Tensor:
        scores = q @ k.transpose(-2, -1) * scale  # (B, T, T)
        return (torch.softmax(scores, dim=dim) if softmax else scores) @ v

    candidates = [
        (lambda: attend(q, k, v, scale=1.0), "forgot the scale: divide the scores by sqrt(d_k) "
         "before the softmax (with the weights copied, your output is softmax(Q K^T) V)"),
        (lambda: attend(q, k, v, scale=1 / math.sqrt(d_model)), "the scores are divided by "
         "sqrt(d_model); the scale is 1 / sqrt(d_k), the width of the queries and keys"),
        (lambda: attend(q, k, v, scale=1 / math.sqrt(d_v)), "the scores are divided by sqrt(d_v); "
         "the scale is 1 / sqrt(d_k), the width of the queries and keys"),
        (lambda: attend(q, k, v, scale=1 / d_k), "the scores are divided by d_k; the scale is "
         "1 / sqrt(d_k), the square root"),
        (lambda: attend(q, k, v, dim=-2), "the softmax runs over the queries (dim=1, or -2): "
         "each query's weights must sum to 1 over the keys, softmax(..., dim=-1)"),
        (lambda: attend(q, k, v, dim=0), "the softmax runs over the batch (dim=0): each query's "
         "weights must sum to 1 over the keys, softmax(..., dim=-1)"),
        (lambda: attend(q, k, v, softmax=False), "there is no softmax: the scaled scores must "
         "become weights that sum to 1 over the keys, softmax(..., dim=-1)"),
    ]
    for names in itertools.product(_PROJECTIONS, repeat=3):  # a projection used for another role
        wrong = [f"your {_ROLES[right]} come from {used}"
                 for used, right in zip(names, _PROJECTIONS, strict=True) if used != right]
        if wrong:
            candidates.append((lambda names=names: attend(*(proj[n] for n in names)),
                               " and ".join(wrong) + ": queries, keys and values each have their "
                               "own projection, W_q, W_k and W_v"))
    hint = _first_match(got, candidates)
    raise NotYet(hint or f"given d_model={d_model}, d_k={d_k}, d_v={d_v}, with the weights copied, "
                 f"your output differs from softmax(Q K^T / sqrt(d_k)) V by up to "
                 f"{(got.detach().to(want.dtype) - want).abs().max():.3g}")


@_checker
def check_attention_layer(cls: object) -> str:
    """Chapter 2, build-it exercise: ``cls(d_model, d_k, d_v)`` is a one-head self-attention
    ``nn.Module`` with ``nn.Linear`` projections ``W_q``, ``W_k`` (d_model -> d_k) and ``W_v``
    (d_model -> d_v), all ``bias=False``, whose ``forward(x)`` maps ``(B, T, d_model)`` to
    ``softmax(Q K^T / sqrt(d_k)) V`` of shape ``(B, T, d_v)``. Checked with the weights copied
    into a one-head :class:`~selfattn.MultiHeadAttention` whose output projection is the
    identity, and with d_v != d_k against :func:`~selfattn.scaled_dot_product_attention`."""
    _attention_layer_case(cls, d_model=8, d_k=4, d_v=4, seed=20)
    _attention_layer_case(cls, d_model=12, d_k=4, d_v=6, seed=21)
    return ("with the weights copied, your layer computes what a one-head "
            "selfattn.MultiHeadAttention computes (its out_proj the identity), and keeps "
            "d_k and d_v apart")


# --- chapter 5: RoPE --------------------------------------------------------------------------

def _rope_halves(x: Tensor, positions: Tensor) -> Tensor:
    """RoPE with feature i paired with feature i + d/2 (GPT-NeoX's ``rotate_half`` layout)."""
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    angles = positions.double()[:, None] * theta  # (T, d/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


@_checker
def check_rope(fn: object) -> str:
    """Chapter 5, build-it exercise: ``fn(x, positions)`` rotates each pair of features
    ``(x[..., 2i], x[..., 2i+1])`` of ``x`` (..., T, d) at position ``positions[t]`` by the angle
    ``positions[t] * 10000^(-2i/d)``, as :func:`~selfattn.positional.apply_rope` does."""
    g = torch.Generator().manual_seed(50)
    cases = [((2, 3, 5, 2), torch.arange(5)),
             ((2, 3, 6, 8), torch.arange(6)),
             ((4, 7, 16), torch.arange(7)),
             ((1, 2, 4, 16), torch.tensor([3, 4, 10, 57]))]
    for shape, positions in cases:
        x = torch.randn(*shape, generator=g)
        before = x.clone()
        want = apply_rope(x, positions)
        got = _tensor(_call(fn, x, positions), want)
        if not _equal(x, before):
            raise NotYet("your function changed x in place: the caller's queries and keys must "
                         "stay as they were; build the result in a new tensor")
        if _close(got, want, atol=1e-4):
            continue
        given = f"given x of shape {shape} and positions {positions.tolist()}"
        candidates = [
            (lambda x=x, p=positions: apply_rope(x, -p), "the pairs turn the other way: the even "
             "feature becomes x_2i cos - x_2i+1 sin and the odd one x_2i sin + x_2i+1 cos"),
            (lambda x=x, p=positions: _rope_halves(x, p), "your function pairs the halves "
             "(x[..., i], x[..., i + d/2]); this RoPE, like apply_rope, pairs neighbours "
             "(x[..., 2i], x[..., 2i+1])"),
            (lambda x=x, p=positions: apply_rope(x, p, base=100.0), "the angles use "
             "10000^(-i/d) for pair i; the frequency of pair i is 10000^(-2i/d)"),
            (lambda x=x, p=positions: apply_rope(x, p, base=1e8), "the angles use "
             "10000^(-4i/d) for pair i: torch.arange(0, d, 2) already holds 2i, so do not "
             "double it again"),
            (lambda x=x, p=positions: apply_rope(x, p, base=1e-4), "the frequencies grow with i: "
             "theta_i = 10000^(-2i/d), with a minus sign"),
        ]
        if not torch.equal(positions, torch.arange(len(positions))):
            candidates.append((lambda x=x: apply_rope(x), f"{given}, your function rotates as if "
                               "the tokens sat at 0, 1, 2, ...: use the positions it is given"))
        hint = _first_match(got, candidates, atol=1e-2)  # float32 angles reach 1e5 in some
        if hint:
            raise NotYet(hint)
        norms = got.detach().to(x.dtype).norm(dim=-1)
        if not torch.allclose(norms, x.norm(dim=-1), atol=1e-4, rtol=1e-4):
            raise NotYet(f"{given}, your output vectors have other lengths than the inputs: a "
                         "rotation keeps lengths (cos^2 + sin^2 = 1), so each pair "
                         "(x_2i, x_2i+1) must become (x_2i cos - x_2i+1 sin, x_2i sin + x_2i+1 cos)")
        raise NotYet(f"{given}, your output differs from apply_rope by up to "
                     f"{(got.detach().to(want.dtype) - want).abs().max():.3g}")
    return ("pair (x_2i, x_2i+1) turns by position * 10000^(-2i/d), as "
            "selfattn.positional.apply_rope does; every length is kept")


# --- chapter 6: heads ------------------------------------------------------------------------

@_checker
def check_split_heads(fn: object) -> str:
    """Chapter 6, build-it exercise: ``fn(x, n_heads)`` turns ``(B, T, n_heads * hd)`` into
    ``(B, n_heads, T, hd)``, head ``h`` holding features ``h * hd .. (h + 1) * hd - 1`` of every
    token, as :func:`~selfattn.split_heads` does."""
    for B, T, H, hd in [(2, 3, 4, 5), (1, 6, 1, 4), (2, 5, 3, 2)]:
        x = torch.arange(B * T * H * hd, dtype=torch.float32).reshape(B, T, H * hd)
        want = split_heads(x, H)  # (B, H, T, hd)
        got = _call(fn, x, H)
        if isinstance(got, Tensor) and got.shape != want.shape \
                and sorted(got.shape) == sorted(want.shape):
            raise NotYet(f"given x of shape {(B, T, H * hd)} and n_heads={H}, your function "
                         f"returns shape {tuple(got.shape)}: the right sizes in the wrong order. "
                         f"Expected (B, n_heads, T, hd) = {tuple(want.shape)}: after "
                         "view(B, T, n_heads, hd), swap the token and head axes, transpose(1, 2)")
        got = _tensor(got, want)
        if _equal(got, want):
            continue
        if _equal(got, x.reshape(B, H, T, hd)):
            raise NotYet("the right shape, but the heads hold the wrong numbers: a view or reshape "
                         "straight to (B, n_heads, T, hd) cuts the memory in order, so head 0 gets "
                         "whole tokens. View as (B, T, n_heads, hd), then transpose(1, 2)")
        if _equal(got, x.view(B, T, hd, H).permute(0, 3, 1, 2)):
            raise NotYet("the heads are interleaved: head h takes every n_heads-th feature. Head "
                         "h must be features h*hd .. (h+1)*hd - 1: view(B, T, n_heads, hd), then "
                         "transpose(1, 2)")
        raise NotYet(f"given x of shape {(B, T, H * hd)} and n_heads={H}, the values are not where "
                     "they belong: head h, token t should be x[:, t, h*hd : (h+1)*hd]")
    return "head h is features h*hd .. (h+1)*hd - 1 of every token, moved next to the batch"


def _mha_variant(layer: MultiHeadAttention, x: Tensor, *, split_ok: bool = True,
                 merge_ok: bool = True, out_proj: bool = True, model_scale: bool = False,
                 one_head: bool = False, causal: bool = False) -> Tensor:
    """The layer's forward (MHA, no mask) computed by hand, with one or more typical mistakes."""
    cfg = layer.config
    B, T, _ = x.shape
    H, hd = (1, cfg.n_heads * cfg.head_dim) if one_head else (cfg.n_heads, cfg.head_dim)

    def split(t: Tensor) -> Tensor:
        return split_heads(t, H) if split_ok else t.reshape(B, H, T, hd)

    q, k, v = split(layer.q_proj(x)), split(layer.k_proj(x)), split(layer.v_proj(x))
    scale = 1 / math.sqrt(cfg.d_model if model_scale else cfg.head_dim)
    out, _ = scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)  # (B, H, T, hd)
    out = merge_heads(out) if merge_ok else out.reshape(B, T, H * hd)
    return layer.out_proj(out) if out_proj else out


_MHA_MISTAKES = {
    "split_ok": "split the heads by a plain reshape to (B, H, T, hd), which puts whole tokens in "
                "one head (view as (B, T, H, hd), then transpose(1, 2))",
    "merge_ok": "merge the heads by a plain reshape of (B, H, T, hd), which mixes tokens "
                "(transpose(1, 2) back to (B, T, H, hd) first)",
    "out_proj": "leave out the layer's out_proj after merging the heads",
    "model_scale": "scale the scores by 1/sqrt(d_model) (the scale is 1/sqrt(head_dim), the width "
                   "of one head)",
    "one_head": "attend with one head of full width (split into layer.config.n_heads heads)",
    "causal": "apply a causal mask (this layer attends to every token)",
}


def _mha_candidates(layer: MultiHeadAttention, x: Tensor) -> list[tuple[Callable[[], Tensor], str]]:
    """Every typical mistake of :func:`_mha_variant`, alone and in pairs, with its hint."""
    flips = [("split_ok", False), ("merge_ok", False), ("out_proj", False), ("one_head", True),
             ("model_scale", True), ("causal", True)]
    candidates = []
    for n in (1, 2):
        for chosen in map(dict, itertools.combinations(flips, n)):
            if "one_head" in chosen and ("split_ok" in chosen or "merge_ok" in chosen):
                continue  # one head: nothing to split in the wrong order
            hint = "your output is what you get when you " + ", and ".join(map(_MHA_MISTAKES.get, chosen))
            candidates.append((lambda c=chosen: _mha_variant(layer, x, **c), hint))
    return candidates


@_checker
def check_multi_head_forward(fn: object) -> str:
    """Chapter 6, build-it exercise: ``fn(layer, x)`` computes what a
    :class:`~selfattn.MultiHeadAttention` ``layer`` (MHA, no mask) outputs for ``x`` (B, T, d_model),
    from its ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` and ``layer.config.n_heads``: project,
    split the heads, attend in every head, merge the heads, project out."""
    g = torch.Generator().manual_seed(60)
    for seed, d_model, n_heads, head_dim in [(61, 12, 3, None), (62, 8, 2, 6)]:
        layer = _seeded_layer(seed, d_model, n_heads, head_dim=head_dim)
        x = torch.randn(2, 5, d_model, generator=g)  # (B, T, d_model)
        with torch.no_grad():
            want, _ = layer(x)
            got = _tensor(_call(fn, layer, x), want)
            if _close(got, want):
                continue
            hint = _first_match(got, _mha_candidates(layer, x))
        raise NotYet(hint or f"with n_heads={n_heads}, head_dim={layer.config.head_dim}, your output "
                     f"differs from the layer's by up to "
                     f"{(got.detach().to(want.dtype) - want).abs().max():.3g}")
    return ("project, split into heads, attend in each, merge, project out: the layer's forward, "
            "with GQA, RoPE, the cache and the masks left aside")


# --- chapter 7: a KV cache --------------------------------------------------------------------

def _decode(cls: object, layer: MultiHeadAttention, x: Tensor,
            chunks: list[tuple[int, int]], run: str) -> Tensor:
    """Decode ``x`` chunk by chunk with a new cache of the reader's class; the layer's output."""
    cfg = layer.config
    with torch.random.fork_rng(devices=[]):
        cache = _call(cls, kind="class")
    append = getattr(cache, "append", None)
    if not callable(append):
        raise NotYet("your class has no method append(k, v)")
    given, outs = [], []  # the keys and values appended (and a copy of each), the outputs
    for start, end in chunks:
        chunk = x[:, start:end]  # (B, T_new, d)
        q = split_heads(layer.q_proj(chunk), cfg.n_heads)  # (B, H, T_new, hd)
        k = split_heads(layer.k_proj(chunk), cfg.n_kv_heads)  # (B, H_kv, T_new, hd)
        v = split_heads(layer.v_proj(chunk), cfg.n_kv_heads)
        given.append((k, v, k.clone(), v.clone()))
        try:
            pair = _call(append, k, v, kind="append")
        except NotYet as why:
            if "must match except in dimension" in str(why):
                raise NotYet(f"{why}. The tokens are dim 2 of (B, H_kv, T, hd): concatenate along "
                             "dim=2") from None
            raise
        step = f"{run}, after {end} token{'s' if end > 1 else ''}"
        for i, (k_in, v_in, k_copy, v_copy) in enumerate(given):
            if not (_equal(k_in, k_copy) and _equal(v_in, v_copy)):
                raise NotYet(f"{step}, the keys or values given to append call {i + 1} have changed: "
                             "append must not modify the tensors it is given; store them, and build "
                             "new tensors (torch.cat returns a new one)")
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise NotYet(f"append should return (keys, values), got {type(pair).__name__}")
        all_k = torch.cat([c[2] for c in given], dim=2)  # (B, H_kv, end, hd)
        all_v = torch.cat([c[3] for c in given], dim=2)
        for name, got, want, new in [("keys", pair[0], all_k, k), ("values", pair[1], all_v, v)]:
            if not isinstance(got, Tensor):
                raise NotYet(f"append should return (keys, values) tensors; the {name} are "
                             f"{type(got).__name__}")
            if _equal(got, want):
                continue
            if start > 0 and _equal(got, new):
                raise NotYet(f"{step}, append returned only the new {name} ({end - start} of {end}): "
                             f"it must return all {name} so far, shape {tuple(want.shape)}")
            if name == "keys" and _equal(got, all_v):
                raise NotYet(f"{step}, append returned the values first: return (keys, values)")
            if got.shape != want.shape and got.numel() == want.numel() and got.dim() == 4:
                grown = [d for d in range(4) if got.shape[d] > want.shape[d]]
                raise NotYet(f"{step}, the {name} have shape {tuple(got.shape)}, grown along dim "
                             f"{grown[0] if grown else '?'}: the tokens are dim 2 of "
                             f"(B, H_kv, T, hd), expected {tuple(want.shape)}")
            if got.dim() == 4 and got.shape[2] > want.shape[2] and start == 0:
                raise NotYet(f"{step}, a new cache returns {got.shape[2]} {name}: it already held "
                             "those of another cache. Create the storage in __init__ (self.keys = "
                             "None), not as a class attribute that every cache shares")
            if got.shape != want.shape:
                raise NotYet(f"{step}, the {name} have shape {tuple(got.shape)}, expected "
                             f"{tuple(want.shape)} (B, H_kv, tokens so far, hd)")
            raise NotYet(f"{step}, the {name} returned are not the ones appended, in order")
        g = cfg.n_heads // cfg.n_kv_heads
        mask = causal_mask(end - start, end, offset=start)  # new queries sit at start..end-1
        out, _ = scaled_dot_product_attention(q, repeat_kv(pair[0], g), repeat_kv(pair[1], g),
                                              attn_mask=mask)
        outs.append(out)  # (B, H, T_new, hd)
    return layer.out_proj(merge_heads(torch.cat(outs, dim=2)))  # (B, T, d)


@_checker
def check_kv_cache(cls: object) -> str:
    """Chapter 7, build-it exercise: ``cache = cls()`` starts empty, and ``keys, values =
    cache.append(k, v)``, for ``k`` and ``v`` of shape ``(B, H_kv, T_new, hd)``, returns every key
    and value appended so far, ``(B, H_kv, T_so_far, hd)``. Checked by decoding with a
    :class:`~selfattn.MultiHeadAttention` layer's projections and the reader's cache, against the
    layer's causal forward over the whole sequence."""
    layer = _seeded_layer(70, 12, n_heads=4, n_kv_heads=2)
    x = torch.randn(2, 6, 12, generator=torch.Generator().manual_seed(71))  # (B, T, d)
    runs = [("decoding one token at a time", [(t, t + 1) for t in range(6)]),
            ("decoding a prompt of 3 tokens, then one at a time", [(0, 3), (3, 4), (4, 5), (5, 6)])]
    with torch.no_grad():
        want, _ = layer(x, is_causal=True)
        for run, chunks in runs:
            got = _decode(cls, layer, x, chunks, run)
            if not _close(got, want):
                raise NotYet(f"{run}, the output differs from the layer's causal forward by up to "
                             f"{(got - want).abs().max():.3g}")
    return ("decoding one token at a time, and after a prompt of 3 tokens, with your cache gives "
            "the layer's causal forward (4 query heads sharing 2 key/value heads)")


# --- chapter 9: the online softmax ------------------------------------------------------------

def _softmax_unrescaled(scores: Tensor, block_size: int) -> Tensor:
    """The online softmax that forgets to rescale its running sum when the maximum grows."""
    m = torch.full((*scores.shape[:-1], 1), float("-inf"), dtype=scores.dtype)
    total = torch.zeros_like(m)
    for start in range(0, scores.shape[-1], block_size):
        block = scores[..., start : start + block_size]
        m = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        total = total + torch.exp(block - m).sum(dim=-1, keepdim=True)
    return torch.exp(scores - m) / total


def _softmax_per_block(scores: Tensor, block_size: int) -> Tensor:
    """Each block normalised on its own."""
    return torch.cat([torch.softmax(b, dim=-1) for b in scores.split(block_size, dim=-1)], dim=-1)


def _online_softmax_case(fn: object, scores: Tensor, block_size: int, what: str,
                         later_max: bool = False) -> None:
    """``fn(scores, block_size)`` against torch.softmax. ``later_max``: the maximum is not in the
    first block, and the cases where it is have passed already."""
    before = scores.clone()
    want = torch.softmax(scores, dim=-1)
    got = _tensor(_call(fn, scores, block_size), want)
    given = f"with block_size={block_size} and {scores.shape[-1]} columns ({what})"
    if not _equal(scores, before):
        raise NotYet("your function changed the scores in place; compute the weights in new tensors")
    if _close(got, want):
        return
    if not torch.isfinite(got).all():
        raise NotYet(f"{given}, your weights hold inf or NaN: exp overflows above about 88 in "
                     "float32. Subtract the running maximum before exp, and multiply the running "
                     "sum by exp(old max - new max) when the maximum grows")
    hint = _first_match(got, [
        (lambda: _softmax_per_block(scores, block_size), f"{given}, each block of weights sums to 1 "
         "on its own: the normaliser is the sum over all the columns, so carry a running sum "
         "from block to block"),
        (lambda: _softmax_unrescaled(scores, block_size), f"{given}, the weights are wrong when a "
         "later block holds a larger maximum: when the running maximum grows from m to m', the "
         "running sum must be multiplied by exp(m - m')"),
    ])
    if hint:
        raise NotYet(hint)
    if later_max:
        raise NotYet(f"{given}, your weights are wrong, though right when the first block holds the "
                     "maximum: when the running maximum grows from m to m', the running sum "
                     "must be multiplied by exp(m - m')")
    raise NotYet(f"{given}, your weights differ from torch.softmax by up to "
                 f"{(got.detach().to(want.dtype) - want).abs().max():.3g}")


_SOFTMAX_OPS = {"_softmax", "softmax", "_log_softmax", "log_softmax", "logsumexp",
                "logcumsumexp", "_safe_softmax", "special_softmax"}
_REDUCTIONS = {"amax", "amin", "aminmax", "max", "min", "sum", "nansum", "mean", "nanmean", "prod",
               "cumsum", "cumprod", "cummax", "cummin", "var", "std", "var_mean", "std_mean",
               "norm", "linalg_vector_norm", "median", "nanmedian", "kthvalue", "mode", "sort",
               "topk", "argmax", "argmin", "all", "any", "count_nonzero"}
_PRODUCTS = {"mm", "bmm", "mv", "dot", "vdot", "matmul", "addmm", "addmv", "baddbmm", "einsum",
             "tensordot", "inner"}


def _reduced_columns(name: str, args: tuple, kwargs: dict) -> int:
    """How many numbers one output of the reduction ``name(*args, **kwargs)`` is computed from:
    the sizes of the dims it reduces (every element when no dim is given)."""
    x = args[0]
    dim = kwargs.get("dim", args[1] if len(args) > 1 and not isinstance(args[1], bool) else None)
    if name in ("kthvalue",):  # kthvalue(x, k, dim)
        dim = kwargs.get("dim", args[2] if len(args) > 2 else -1)
    if isinstance(dim, Tensor) or (name in ("norm",) and not isinstance(dim, (int, list, tuple))):
        dim = kwargs.get("dim")
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return x.numel()
    dims = [dim] if isinstance(dim, int) else list(dim)
    return math.prod(x.shape[d] for d in dims) if x.dim() else 1


def _whole_row_reads(fn: object, scores: Tensor, block_size: int) -> None:
    """The online softmax must read the row ``block_size`` columns at a time: reject a softmax
    op, any reduction that combines more than ``block_size`` numbers into one (a maximum or a
    sum of the whole row at once is the two-pass softmax, correct but not the algorithm), and a
    matrix product that sums over more than ``block_size`` (a sum written as ``e @ ones``).
    Seen at the level of PyTorch's basic operations, so it does not matter how the code is
    written, or along which dim it puts the columns."""
    from torch.utils._python_dispatch import TorchDispatchMode  # private API: loaded on use

    seen: list[str] = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            first = args[0] if args else None
            if name in _SOFTMAX_OPS:
                seen.append(f"torch.{name.lstrip('_')}")
            elif name in _REDUCTIONS and isinstance(first, Tensor) and first.dim() > 0:
                n = _reduced_columns(name, args, kwargs)
                if n > block_size:
                    seen.append(f"{name}, over {n} numbers at once")
            elif name in _PRODUCTS and isinstance(first, Tensor) and first.dim() > 0:
                if first.shape[-1] > block_size:
                    seen.append(f"a matrix product ({name}) summing {first.shape[-1]} numbers")
            return func(*args, **kwargs)

    with Watch():
        _call(fn, scores, block_size)
    if seen:
        raise NotYet(f"with block_size={block_size} and {scores.shape[-1]} columns your function "
                     f"calls {seen[0]}: read the scores block_size columns at a time, keeping a "
                     f"running maximum and sum, as in step 1")


@_checker
def check_online_softmax(fn: object) -> str:
    """Chapter 9, build-it exercise: ``fn(scores, block_size)`` is ``torch.softmax(scores,
    dim=-1)`` for ``scores`` (..., S), computed by visiting ``block_size`` columns at a time with a
    running maximum and a running sum. Checked with the maximum in the first block, then in a
    later one, and with scores around 1000, where a plain exp overflows; then that it never
    calls a softmax nor reduces more than ``block_size`` columns at once."""
    g = torch.Generator().manual_seed(90)
    first = torch.randn(4, 10, generator=g) * 2
    first[:, 0] = first.amax(dim=-1) + 1  # the maximum in the first block: it never changes
    for block_size in (3, 1, 10, 16):
        _online_softmax_case(fn, first, block_size, "the maximum in the first column")
    last = torch.randn(2, 3, 10, generator=g) * 2
    last[..., -1] = last.amax(dim=-1) + 2  # the maximum in the last block
    for block_size in (3, 1, 4):
        _online_softmax_case(fn, last, block_size, "the maximum in the last column", later_max=True)
    rising = torch.arange(7.0).expand(3, 7) + torch.randn(3, 7, generator=g) * 0.1
    _online_softmax_case(fn, rising, 2, "a maximum that grows in every block", later_max=True)
    large = 1000 + torch.randn(2, 3, 11, generator=g) * 3
    for block_size in (3, 11, 1, 32):
        _online_softmax_case(fn, large, block_size, "scores around 1000")
    _whole_row_reads(fn, rising, 2)  # right numbers; now, block by block?
    return ("one pass for the running maximum m and sum l (l rescaled by exp(m - m') whenever the "
            "maximum grows), then exp(s - m) / l: torch.softmax, without overflow, block by block")


# --- chapter 3: masked additive attention, Luong's general score ------------------------------

class _LayersOnly(nn.Module):
    """An :class:`~selfattn.scoring.AdditiveScorer`'s layers ``w_q``, ``w_k`` and ``w``, without
    its forward: the reader builds the scores from the layers."""

    def __init__(self, scorer: nn.Module) -> None:
        super().__init__()
        self.w_q, self.w_k, self.w = scorer.w_q, scorer.w_k, scorer.w

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        raise RuntimeError("build the scores from scorer.w_q, scorer.w_k and scorer.w; calling "
                           "scorer(query, key) is the part this exercise asks you to write")


def _masked_additive_case(fn: object, L: int, S: int, q_dim: int, k_dim: int, mask: Tensor,
                          what: str, seed: int) -> None:
    from ...scoring import AdditiveScorer, attention

    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        scorer = AdditiveScorer(q_dim, k_dim, hidden=8).eval()
    q = torch.randn(2, L, q_dim, generator=g)  # (B, L, Eq)
    k = torch.randn(2, S, k_dim, generator=g)  # (B, S, Ek)
    v = torch.randn(2, S, 3, generator=g)  # (B, S, Ev), Ev != S: (weights, output) cannot pass
    with torch.no_grad():
        want_out, want_w = attention(q, k, v, scorer=scorer, attn_mask=mask)
        got = _call(fn, q, k, v, mask, _LayersOnly(scorer))
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise NotYet(f"return (output, weights), as scoring.attention does; got "
                     f"{type(got).__name__}")
    given = f"with {what}"
    if isinstance(got[0], Tensor) and got[0].shape == want_w.shape and _close(got[0], want_w):
        raise NotYet(f"{given}, your first result holds the weights: return (output, weights), "
                     "in that order, as scoring.attention does")
    got_w = _tensor(got[1], want_w)
    if not _close(got_w, want_w):
        hq = q @ scorer.w_q.weight.T  # (B, L, h)
        hk = k @ scorer.w_k.weight.T  # (B, S, h)
        w = scorer.w.weight[0]  # (h,)

        def weights(scores: Tensor, keep: Tensor | None = mask, dim: int = -1) -> Tensor:
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))
            return torch.softmax(scores, dim=dim)  # (B, L, S)

        with torch.no_grad():
            s = scorer(q, k)  # (B, L, S)
            candidates = [
                (lambda: weights(s, None), f"{given}, the mask is not applied: before the "
                 "softmax, fill the scores where the mask is False with -inf"),
                (lambda: weights(s, dim=-2), f"{given}, the softmax runs over the queries (dim=-2): "
                 "each query's weights must sum to 1 over the keys, softmax(..., dim=-1)"),
                (lambda: torch.softmax(s, dim=-1) * mask, f"{given}, the weights are zeroed after "
                 "the softmax, so a row no longer sums to 1: mask the scores before the softmax"),
                (lambda: torch.softmax(s.masked_fill(mask, -1e9), dim=-1), f"{given}, the mask's "
                 "polarity is reversed: True means 'may attend', so fill the scores where the "
                 "mask is False, masked_fill(~mask, ...)"),
                (lambda: torch.softmax(s.masked_fill(~mask, 0.0), dim=-1), f"{given}, the masked "
                 "scores are set to 0, an ordinary score that still gets weight: fill them with "
                 "-inf, masked_fill(~mask, float('-inf')), so their weight is 0"),
                (lambda: weights(((hq.unsqueeze(-2) + hk.unsqueeze(-3) + scorer.w_k.bias) * w)
                                 .sum(-1)), f"{given}, there is no tanh: the score is "
                 "w^T tanh(W_q q + W_k k), the tanh between the sum and w"),
                (lambda: weights(torch.tanh(hq.unsqueeze(-2) + hk.unsqueeze(-3)) @ w),
                 f"{given}, the bias of W_k is missing: scorer.w_k(key) adds it, "
                 "scorer.w_k.weight alone does not"),
                (lambda: weights(s / math.sqrt(w.numel())), f"{given}, the scores are divided "
                 "by sqrt(hidden): the additive score is not scaled"),
            ]
            if L == S:
                candidates.append((lambda: weights(s.transpose(-2, -1)), f"{given}, the scores "
                                   "are transposed: row i must hold s(q_i, k_j) for every key j, "
                                   "W_q q unsqueezed to (..., L, 1, h) and W_k k to (..., 1, S, h)"))
            hint = _first_match(got_w, candidates)
            reversed_mask = weights(s, ~mask)  # a row whose keys are all kept turns all NaN
            if torch.equal(got_w.detach().isnan(), reversed_mask.isnan()) and _close(
                    got_w.nan_to_num(), reversed_mask.nan_to_num()):
                hint = (f"{given}, the mask's polarity is reversed: True means 'may attend', so "
                        "fill the scores where the mask is False, masked_fill(~mask, ...)")
        raise NotYet(hint or f"{given}, your weights differ from scoring.attention's by up to "
                     f"{(got_w.detach().to(want_w.dtype) - want_w).abs().max():.3g}")
    got_out = _tensor(got[0], want_out)
    if not _close(got_out, want_out):
        raise NotYet(f"{given}, the weights are right but the output is not: the output is the "
                     "weights times the values, weights @ value, (B, L, S) @ (B, S, Ev)")


@_checker
def check_masked_additive_attention(fn: object) -> str:
    """Chapter 3, build-it exercise: ``fn(query, key, value, mask, scorer)`` returns ``(output,
    weights)`` of masked additive attention, ``softmax(w^T tanh(W_q q + W_k k))`` over the keys
    that ``mask`` (bool, True = may attend) keeps, times ``value``; the scores are built from the
    layers ``scorer.w_q``, ``scorer.w_k`` and ``scorer.w`` of a
    :class:`~selfattn.scoring.AdditiveScorer`. Checked against :func:`~selfattn.scoring.attention`
    with that scorer, on self-attention with a causal mask and on queries and keys of different
    widths with padded keys."""
    causal = torch.ones(5, 5, dtype=torch.bool).tril()  # (L, S): key j <= query i
    _masked_additive_case(fn, 5, 5, 6, 6, causal, "a causal mask over 5 tokens", seed=30)
    padded = (torch.arange(7) < torch.tensor([7, 4])[:, None])[:, None, :]  # (B, 1, S)
    _masked_additive_case(fn, 3, 7, 6, 4, padded,
                          "3 queries of width 6, 7 keys of width 4, the second sequence's last "
                          "3 keys padding", seed=31)
    return ("your masked additive attention gives scoring.attention's weights and output, with a "
            "causal mask and with padded keys of another width")


def _general_case(fn: object, q_shape: tuple[int, ...], k_shape: tuple[int, ...], what: str,
                  g: torch.Generator) -> None:
    from ...scoring import GeneralScorer, attention

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(33)
        scorer = GeneralScorer(q_shape[-1], k_shape[-1])
    W = torch.randn(q_shape[-1], k_shape[-1], generator=g)  # (Eq, Ek)
    with torch.no_grad():
        scorer.weight.copy_(W)
    q, k = torch.randn(*q_shape, generator=g), torch.randn(*k_shape, generator=g)
    v = torch.randn(*k_shape[:-1], 2, generator=g)  # (..., S, 2)
    given = f"with {what}"
    with torch.no_grad():
        want = scorer(q, k)  # (..., L, S)
        try:
            got = _call(fn, q, k, W.clone())
        except NotYet as why:
            try:  # the hint only when the reader's error is the one that .T gives
                q @ W @ k.T
                transposed = None
            except RuntimeError as exc:
                transposed = str(exc)
            if len(q_shape) > 2 and transposed and transposed in str(why):
                raise NotYet(f"{why}. With a batch axis, transpose only the last two axes of the "
                             "keys, key.transpose(-2, -1): .T reverses every axis") from None
            raise
        flipped = (*want.shape[:-2], want.shape[-1], want.shape[-2])  # (..., S, L)
        if isinstance(got, Tensor) and got.shape != want.shape and tuple(got.shape) == flipped:
            raise NotYet(f"{given}, your scores have shape {tuple(got.shape)}, (S, L): row i "
                         f"must hold query i's scores, shape {tuple(want.shape)}")
        got = _tensor(got, want)
        if _close(got, want):
            out, _ = attention(q, k, v, scorer=lambda a, b: _call(fn, a, b, W))  # type: ignore[arg-type]
            want_out, _ = attention(q, k, v, scorer=scorer)
            if not _close(out, want_out):
                raise NotYet(f"{given}, your scores are right, but as a scorer in "
                             "scoring.attention they give another output")
            return
        kt = k.transpose(-2, -1)  # (..., Ek, S)
        candidates = [
            (lambda: q @ W.T @ kt, f"{given}, W is used transposed: q^T W k is "
             "query @ W @ key^T, W of shape (query_dim, key_dim)"),
            (lambda: (q @ W.T @ kt).transpose(-2, -1), f"{given}, the scores are transposed: "
             "row i must hold query i's scores, query @ W @ key^T"),
            (lambda: (q @ W @ kt).transpose(-2, -1), f"{given}, the scores are transposed: "
             "row i must hold query i's scores, query @ W @ key^T"),
            (lambda: want / math.sqrt(q_shape[-1]), f"{given}, the scores are divided by "
             "sqrt(query_dim): Luong's general score is not scaled"),
            (lambda: want / math.sqrt(k_shape[-1]), f"{given}, the scores are divided by "
             "sqrt(key_dim): Luong's general score is not scaled"),
        ]
        if q_shape[-1] == k_shape[-1]:  # one width: say so, not which of the two
            candidates[3:] = [(lambda: want / math.sqrt(q_shape[-1]), f"{given}, the scores "
                               "are divided by the square root of the width: Luong's general "
                               "score is not scaled")]
        if q_shape[-1] != k_shape[-1] or q_shape[-2] != k_shape[-2]:
            candidates = candidates[3:]  # the transposes do not even have the scores' shape
        hint = _first_match(got, candidates)
    raise NotYet(hint or f"{given}, your scores differ from q^T W k by up to "
                 f"{(got.detach().to(want.dtype) - want).abs().max():.3g}")


@_checker
def check_general_score(fn: object) -> str:
    """Chapter 3, build-it exercise: ``fn(query, key, W)`` returns Luong et al.'s "general"
    scores ``q^T W k`` for every query and key, ``(..., L, Eq), (..., S, Ek), W (Eq, Ek) ->
    (..., L, S)``. Checked against :class:`~selfattn.scoring.GeneralScorer` with ``W`` copied,
    and as a scorer through :func:`~selfattn.scoring.attention`."""
    g = torch.Generator().manual_seed(32)
    _general_case(fn, (5, 6), (5, 6), "5 queries and 5 keys of width 6", g)
    _general_case(fn, (4, 10), (6, 3), "4 queries of width 10 and 6 keys of width 3", g)
    _general_case(fn, (2, 5, 6), (2, 7, 4), "a batch of 2, 5 queries of width 6, 7 keys of "
                  "width 4", g)
    return ("your scores are q^T W k for every pair, with queries and keys of different widths and "
            "a batch axis, and they work as a scorer in scoring.attention")


# --- chapter 11: decoding in practice ---------------------------------------------------------

import copy  # noqa: E402

from ..data import tagging_task  # noqa: E402
from ..models import AttentionTagger  # noqa: E402
from ..train import ambiguous_correct, train  # noqa: E402

# GQA uptraining (Ainslie et al. 2023, §2.1): a trained MHA layer becomes a GQA layer, each group's
# key and value heads mean-pooled into one, then training continues for a few % of the steps.


def _pooled(w: Tensor, n_kv: int, g: int, how: str) -> Tensor:
    """The rows of a key or value projection's weight ``(H * hd, d)`` (or bias ``(H * hd,)``)
    pooled into ``n_kv`` heads of ``g``, the right way (``"mean"``, adjacent heads) or a typical
    wrong one."""
    rows = w.shape[0] // (n_kv * g)  # hd
    adjacent = w.reshape(n_kv, g, rows, *w.shape[1:])  # (H_kv, g, hd, ...): a group's heads together
    strided = w.reshape(g, n_kv, rows, *w.shape[1:]).transpose(0, 1)  # (H_kv, g, hd, ...): every H_kv-th
    pooled = {"mean": adjacent.mean(1), "sum": adjacent.sum(1), "first": adjacent[:, 0],
              "last": adjacent[:, -1], "strided": strided.mean(1), "strided_sum": strided.sum(1)}[how]
    return pooled.reshape(n_kv * rows, *w.shape[1:])  # (H_kv * hd, ...)


_POOLING_MISTAKES = {
    "strided": "your key/value head j averages query heads j, j + n_kv_heads, j + 2 n_kv_heads, "
               "... (every n_kv_heads-th head). The layer gives query head i the key/value head "
               "i // g (g = n_heads // n_kv_heads, repeat_kv's repeat_interleave order), so group j "
               "is the adjacent heads j*g .. (j+1)*g - 1: view the weight as (n_kv_heads, g, "
               "head_dim, d_model) and average over dim 1",
    "sum": "your key/value heads are the sum of their group's heads, g times too large: "
           "mean-pool them (divide by g = n_heads // n_kv_heads)",
    "strided_sum": "your key/value heads sum every n_kv_heads-th head: average (divide by g) "
                   "the adjacent heads j*g .. (j+1)*g - 1 that share key/value head j",
    "first": "your key/value heads keep the first head of each group: uptraining mean-pools every "
             "head of the group (Ainslie et al. found the mean better than keeping one head)",
    "last": "your key/value heads keep the last head of each group: uptraining mean-pools every "
            "head of the group",
}


def _uptraining_case(fn: object, d_model: int, n_heads: int, n_kv: int, rope: bool, seed: int) -> None:
    mha = _seeded_layer(seed, d_model, n_heads, rope=rope)
    cfg, g = mha.config, n_heads // n_kv
    before = {name: t.clone() for name, t in mha.state_dict().items()}
    given = f"given an MHA layer of {n_heads} heads (rope={rope}) and n_kv_heads={n_kv}"
    with torch.random.fork_rng(devices=[]):
        try:
            gqa = _call(fn, mha, n_kv)
        except NotYet as why:
            if "leaf Variable" not in str(why):
                raise
            raise NotYet(f"{why}. Copy weights into a layer's parameters under torch.no_grad(), "
                         "or with load_state_dict") from None
    if not all(torch.equal(t, before[name]) for name, t in mha.state_dict().items()):
        raise NotYet(f"{given}, your function changed the MHA layer's weights: build the GQA layer "
                     "as a new MultiHeadAttention and copy into it, leaving the checkpoint as it was")
    if not isinstance(gqa, MultiHeadAttention):
        raise NotYet(f"{given}, return a selfattn.MultiHeadAttention (the GQA layer), got "
                     f"{type(gqa).__name__}")
    got = gqa.config
    if got.n_heads != n_heads:
        raise NotYet(f"{given}, your layer has {got.n_heads} query heads: "
                     + ("you pooled the queries too. " if got.n_heads == n_kv else "")
                     + f"GQA keeps all {n_heads} query heads; only the key and value heads are "
                     "pooled, each group of query heads sharing one")
    if got.n_kv_heads != n_kv:
        raise NotYet(f"{given}, your layer has n_kv_heads={got.n_kv_heads}; build it with "
                     f"MultiHeadAttention(..., n_kv_heads={n_kv})")
    for name in ("d_model", "head_dim", "kdim", "vdim", "out_dim", "bias", "rope"):
        if getattr(got, name) != getattr(cfg, name):
            raise NotYet(f"{given}, your layer has {name}={getattr(got, name)}, the MHA layer "
                         f"{name}={getattr(cfg, name)}: keep every setting but n_kv_heads "
                         "(head_dim, bias and rope included)")
    ours = dict(mha.named_parameters())
    for name, p in gqa.named_parameters():
        if any(p.data_ptr() == q.data_ptr() for q in ours.values()):
            raise NotYet(f"{given}, your layer's {name} shares its storage with the MHA layer's: "
                         "uptraining it would change the checkpoint too. Copy the weights "
                         "(load_state_dict, or .copy_ under torch.no_grad())")
    for proj in ("q_proj", "out_proj"):
        for part in ("weight", "bias"):
            if not _equal(getattr(getattr(gqa, proj), part), getattr(getattr(mha, proj), part)):
                raise NotYet(f"{given}, your {proj}.{part} is not the MHA layer's: uptraining keeps "
                             "the query and output projections as they are; copy them")
    for proj in ("k_proj", "v_proj"):
        theirs, mine = getattr(gqa, proj), getattr(mha, proj)
        want = _pooled(mine.weight, n_kv, g, "mean")  # (H_kv * hd, d)
        got_w = _tensor(theirs.weight, want)
        role = "key" if proj == "k_proj" else "value"
        if not _close(got_w, want, atol=1e-6, rtol=1e-5):
            hint = next((h for how, h in _POOLING_MISTAKES.items()
                         if _close(got_w, _pooled(mine.weight, n_kv, g, how), atol=1e-6, rtol=1e-5)), None)
            raise NotYet(f"{given}, {proj}.weight: " + (hint or f"your {role} heads are not the "
                         f"mean of each group's {g} adjacent {role} heads (query heads j*g .. "
                         f"(j+1)*g - 1 share key/value head j); they differ by up to "
                         f"{(got_w.detach() - want).abs().max():.3g}"))
        want_b = _pooled(mine.bias, n_kv, g, "mean")  # (H_kv * hd,)
        if not _close(_tensor(theirs.bias, want_b), want_b, atol=1e-6, rtol=1e-5):
            raise NotYet(f"{given}, {proj}.weight is pooled right but {proj}.bias is not: a head's "
                         f"{role}s are W x + b, so pool the bias the same way, each group's mean")


def _swapped(model: AttentionTagger, attn: MultiHeadAttention) -> AttentionTagger:
    """A copy of ``model`` whose attention layer is ``attn``."""
    out = copy.deepcopy(model)
    out.attn = attn
    return out


def uptraining_recovery(fn: Callable[[MultiHeadAttention, int], MultiHeadAttention],
                        seeds: list[int] | range | None = None, n_kv_heads: int = 2,
                        steps: int = 300, uptrain_steps: int | None = None,
                        progress: bool = False) -> dict[str, list[float]]:
    """GQA uptraining (Ainslie et al. 2023, §2.1) on chapter 1's distance-cue tagging task
    (16 tokens, the cue up to 15 back), one run per seed: an :class:`~selfattn.book.models.AttentionTagger`
    with 4 heads of 8 (MHA) trained ``steps``; its layer converted by ``fn(layer, n_kv_heads)``
    (mean-pooled key and value heads); the converted model trained ``uptrain_steps`` more
    (default 5% of ``steps``, the paper's proportion). The control: the same model with the
    GQA layer's query and output projections copied and its key and value projections drawn at
    random, trained for the same budget. Returns the accuracy on the ambiguous word of a test
    set (chance: 1 / 4), per seed, for ``"MHA"``, ``"pooled"`` (right after the conversion),
    ``"random K/V"``, ``"pooled, uptrained"`` and ``"random K/V, uptrained"``. ``seeds``
    default to :func:`~selfattn.book.train.seed_range`, the data to
    :func:`~selfattn.book.train.data_seed`; the global random state is left as it was."""
    from ..train import data_seed, seed_range

    seeds = list(seed_range() if seeds is None else seeds)
    uptrain = max(1, steps // 20) if uptrain_steps is None else uptrain_steps
    data = tagging_task(4096, seq_len=16, seed=data_seed(0))
    test = tagging_task(1024, seq_len=16, seed=data_seed(1))
    arms: dict[str, list[float]] = {arm: [] for arm in ("MHA", "pooled", "random K/V",
                                                        "pooled, uptrained", "random K/V, uptrained")}

    def accuracy(model: nn.Module) -> float:
        return ambiguous_correct(model, test).float().mean().item()

    with torch.random.fork_rng(devices=[]):
        for seed in seeds:
            torch.manual_seed(seed)
            mha = AttentionTagger(data.vocab_size, data.n_tags, d=32, n_heads=4)
            train(mha, data, steps=steps, seed=seed, progress=progress, desc=f"MHA, seed {seed}")
            pooled = _swapped(mha, _call(fn, mha.attn, n_kv_heads))  # type: ignore[arg-type]
            with torch.no_grad():
                cfg = mha.attn.config
                fresh = MultiHeadAttention(cfg.d_model, cfg.n_heads, n_kv_heads=n_kv_heads,
                                           head_dim=cfg.head_dim, rope=cfg.rope)  # random K/V
                fresh.q_proj.load_state_dict(mha.attn.q_proj.state_dict())
                fresh.out_proj.load_state_dict(mha.attn.out_proj.state_dict())
                control = _swapped(mha, fresh)
            arms["MHA"].append(accuracy(mha))
            arms["pooled"].append(accuracy(pooled))
            arms["random K/V"].append(accuracy(control))
            for name, model in (("pooled, uptrained", pooled), ("random K/V, uptrained", control)):
                train(model, data, steps=uptrain, seed=seed + 1, progress=progress, desc=name)
                arms[name].append(accuracy(model))
    return arms


@_checker
def check_uptraining(fn: object) -> str:
    """Chapter 11, build-it exercise: ``fn(mha_layer, n_kv_heads)`` converts a trained MHA
    :class:`~selfattn.MultiHeadAttention` into a GQA one with ``n_kv_heads`` key/value heads, as
    Ainslie et al. (2023, §2.1) uptrain a checkpoint: the query and output projections copied,
    each group's key and value heads (the adjacent query heads ``j*g .. (j+1)*g - 1`` that share
    key/value head ``j``, ``g = n_heads // n_kv_heads``) mean-pooled, weights and biases, every
    other setting kept. Checked exactly on seeded layers (with and without RoPE, GQA and MQA);
    then, for one seed, a small trained tagger is converted and uptrained for 5% of its steps,
    beside the control whose key and value heads start at random (the numbers are printed, not
    judged: one seed is an example; :func:`uptraining_recovery` runs ten)."""
    for d_model, n_heads, n_kv, rope, seed in [(16, 8, 2, True, 111), (12, 6, 3, False, 112),
                                                (16, 4, 1, True, 113), (16, 8, 8, False, 114)]:
        _uptraining_case(fn, d_model, n_heads, n_kv, rope, seed)
    acc = {arm: values[0] for arm, values in uptraining_recovery(fn, seeds=[0]).items()}
    return (f"each group's key and value heads are mean-pooled, the queries and output kept. On the "
            f"tagging task (one seed: the numbers vary from seed to seed; chance 25%), the MHA "
            f"tagger gets {acc['MHA']:.0%} of the "
            f"ambiguous words; pooled to 2 key/value heads {acc['pooled']:.0%}, and "
            f"{acc['pooled, uptrained']:.0%} after 5% more steps; with random key/value heads "
            f"{acc['random K/V']:.0%}, and {acc['random K/V, uptrained']:.0%} after the same steps")


# One cache bug to find: a decoding loop written by hand, with one wrong line.


def buggy_decode(layer: MultiHeadAttention, x: Tensor, chunks: list[int]) -> Tensor:
    """Chapter 11's cache bug: decode ``x`` (B, T, d_model) through ``layer``
    (self-attention, causal, any number of key/value heads, RoPE or not) a chunk of
    tokens at a time, ``chunks`` their lengths (a prompt, then one token at a time, now
    and then a few at once, as when a draft's tokens are checked), keeping every key and
    value in a cache. Returns the layer's outputs for every token, (B, T, out_dim),
    which should equal ``layer(x, is_causal=True)[0]``. One line is wrong."""
    cfg = layer.config
    g = cfg.n_heads // cfg.n_kv_heads  # query heads per key/value head
    keys = values = None  # the cache: (B, H_kv, tokens so far, hd)
    outputs, start = [], 0
    for n in chunks:
        chunk = x[:, start : start + n]  # (B, n, d_model): the new tokens
        q = split_heads(layer.q_proj(chunk), cfg.n_heads)  # (B, H, n, hd)
        k = split_heads(layer.k_proj(chunk), cfg.n_kv_heads)  # (B, H_kv, n, hd)
        v = split_heads(layer.v_proj(chunk), cfg.n_kv_heads)  # (B, H_kv, n, hd)
        if cfg.rope:  # the new tokens sit at positions start .. start + n - 1
            positions = torch.arange(start, start + n, device=x.device)
            q, k = apply_rope(q, positions), apply_rope(k, positions)
        # the cache, (B, H_kv, start + n, hd) each
        keys = k if keys is None else torch.cat([keys, k], dim=2)
        values = v if values is None else torch.cat([values, v], dim=2)
        kv = repeat_kv(keys, g), repeat_kv(values, g)  # (B, H, start + n, hd) each
        out, _ = scaled_dot_product_attention(q, *kv, is_causal=True)  # (B, H, n, hd)
        outputs.append(layer.out_proj(merge_heads(out)))  # (B, n, out_dim)
        start += n
    return torch.cat(outputs, dim=1)  # (B, T, out_dim)


def _decode_variant(layer: MultiHeadAttention, x: Tensor, chunks: list[int], mask: str,
                    rope_from_zero: bool = False) -> Tensor:
    """:func:`buggy_decode` with the new queries' mask chosen by ``mask``: ``"bottom_right"``
    (right: query ``i`` of a chunk after ``P`` cached tokens sees keys ``0 .. P + i``),
    ``"top_left"`` (the bug: ``is_causal=True``), ``"none"``, ``"first_only"`` (causal for the
    first chunk, nothing after: right for single tokens, wrong for a later chunk of several),
    ``"top_left_chunks"`` (``is_causal=n > 1``: the same, with the bug in later chunks)
    or ``"cached_only"`` (the new tokens do not see one another, nor themselves); with
    ``rope_from_zero``, each chunk rotated as if it started at position 0."""
    cfg = layer.config
    g = cfg.n_heads // cfg.n_kv_heads
    keys = values = None
    outputs, start = [], 0
    for n in chunks:
        chunk = x[:, start : start + n]  # (B, n, d_model)
        q = split_heads(layer.q_proj(chunk), cfg.n_heads)  # (B, H, n, hd)
        k = split_heads(layer.k_proj(chunk), cfg.n_kv_heads)  # (B, H_kv, n, hd)
        v = split_heads(layer.v_proj(chunk), cfg.n_kv_heads)  # (B, H_kv, n, hd)
        if cfg.rope:
            positions = torch.arange(n) if rope_from_zero else torch.arange(start, start + n)
            q, k = apply_rope(q, positions), apply_rope(k, positions)
        keys = k if keys is None else torch.cat([keys, k], dim=2)  # (B, H_kv, start + n, hd)
        values = v if values is None else torch.cat([values, v], dim=2)
        S = start + n
        attn_mask = {"bottom_right": causal_mask(n, S, offset=start),
                     "top_left": causal_mask(n, S),
                     "none": None,
                     "first_only": causal_mask(n, S) if start == 0 else None,
                     "top_left_chunks": causal_mask(n, S) if n > 1 else None,
                     "cached_only": causal_mask(n, S, offset=start - 1) if start else causal_mask(n)}[mask]
        out, _ = scaled_dot_product_attention(q, repeat_kv(keys, g), repeat_kv(values, g),
                                              attn_mask=attn_mask)  # (B, H, n, hd)
        outputs.append(layer.out_proj(merge_heads(out)))  # (B, n, out_dim)
        start += n
    return torch.cat(outputs, dim=1)  # (B, T, out_dim)


class _TokensSeen:
    """Counts the tokens each call of a layer's ``k_proj`` projects (forward hooks), to tell
    decoding with a cache (each token projected once, chunk by chunk) from recomputing."""

    def __init__(self, layer: MultiHeadAttention) -> None:
        self.calls: list[int] = []
        self._hook = layer.k_proj.register_forward_hook(
            lambda module, args, out: self.calls.append(args[0].shape[-2] if args[0].dim() > 1 else 1))

    def remove(self) -> None:
        self._hook.remove()


def _cache_bug_case(fn: object, layer: MultiHeadAttention, x: Tensor, chunks: list[int]) -> None:
    given = f"decoding chunks of {chunks} tokens"
    with torch.no_grad():
        want, _ = layer(x, is_causal=True)  # (B, T, d_model): the full causal pass
    seen = _TokensSeen(layer)
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            got = _tensor(_call(fn, layer, x.clone(), list(chunks)), want)
    finally:
        seen.remove()
    if not _close(got, want):
        with torch.no_grad():
            if _close(got, buggy_decode(layer, x, chunks)):
                raise NotYet(f"{given}, your function gives what buggy_decode gives: the first "
                             "chunk (into an empty cache) is right, every later one wrong. "
                             "Where do the new queries sit when the cache already holds tokens, "
                             "and what does is_causal=True assume about them?")
            variants = [
                ("none", f"{given}, the tokens of a chunk see the later tokens of their own chunk: "
                 "a chunk of several tokens still needs a causal mask among themselves"),
                ("first_only", f"{given}, right for the prompt and for one token at a time, wrong "
                 "for a later chunk of several: each of its queries sees every cached key and the "
                 "new keys up to its own, a causal mask aligned bottom-right, "
                 "causal_mask(n, S, offset=S - n)"),
                ("cached_only", f"{given}, each new token sees the cached tokens but not itself: "
                 "append the new keys and values before attending"),
            ]
            variants.insert(2, ("top_left_chunks", variants[1][1]))
            for mask, hint in variants:
                if _close(got, _decode_variant(layer, x, chunks, mask)):
                    raise NotYet(hint)
            if layer.config.rope and _close(got, _decode_variant(layer, x, chunks, "bottom_right",
                                                                rope_from_zero=True)):
                raise NotYet(f"{given}, the mask is right now, but each chunk is rotated as if it "
                             "started at position 0: RoPE must turn the new tokens by their own "
                             "positions, start .. start + n - 1")
        raise NotYet(f"{given}, your outputs differ from the layer's causal pass over the whole "
                     f"sequence by up to {(got.detach().to(want.dtype) - want).abs().max():.3g}")
    if sum(seen.calls) > x.shape[1]:
        raise NotYet(f"{given}, the outputs are right, but k_proj projected {sum(seen.calls)} "
                     f"tokens for a sequence of {x.shape[1]}: your function recomputes the keys of "
                     "earlier tokens. Keep them in the cache and project only the new ones")
    if seen.calls and len(chunks) > 1 and seen.calls == [x.shape[1]]:
        raise NotYet(f"{given}, the outputs are right, but your function projected the keys of "
                     "the whole sequence in one call: decoding sees one chunk at a time, so "
                     "project and cache each chunk's keys and values as it comes, as buggy_decode does")


@_checker
def check_cache_bug(fn: object) -> str:
    """Chapter 11, build-it exercise: ``fn(layer, x, chunks)`` is :func:`buggy_decode` with its
    one bug fixed: decoding ``x`` (B, T, d_model) through a :class:`~selfattn.MultiHeadAttention`
    ``layer`` chunk by chunk (``chunks``: their lengths), with a cache of keys and values, gives
    the layer's causal pass over the whole sequence, ``layer(x, is_causal=True)[0]``. Checked on
    seeded layers (GQA with RoPE, MHA without) fed a prompt then single tokens, and chunks of
    several tokens after the prompt; an answer that recomputes the earlier tokens' keys, or runs
    the whole sequence at once, is named as such."""
    g = torch.Generator().manual_seed(115)
    cases = [(_seeded_layer(116, 16, 4, n_kv_heads=2, rope=True), [4, 1, 1, 1, 1]),
             (_seeded_layer(116, 16, 4, n_kv_heads=2, rope=True), [3, 1, 2, 1, 3, 1]),
             (_seeded_layer(117, 12, 3), [1, 1, 1, 2, 1])]
    for layer, chunks in cases:
        x = torch.randn(2, sum(chunks), layer.config.d_model, generator=g)  # (B, T, d_model)
        _cache_bug_case(fn, layer, x, chunks)
    return ("a prompt, single tokens and later chunks of several tokens decoded with the cache "
            "give the full causal pass: the new queries sit after the cached keys, so their "
            "causal mask is aligned bottom-right, causal_mask(n, S, offset=S - n), or no mask "
            "for a single token")
