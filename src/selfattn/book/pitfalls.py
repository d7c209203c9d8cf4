"""Chapter 8, pitfalls: the second article's layer quoted and fixed, the chapter's experiments,
and its exercises' checkers.

The second article splits and merges heads with einops' ``rearrange`` and computes the products
with ``torch.einsum``; its class (:data:`ARTICLE`, as printed) has most of the chapter's bugs,
and :class:`EinopsSelfAttention` is that class with every fix applied. The other functions are
the chapter's experiments, one per pitfall that needs more than a few lines: each returns what
the chapter prints, and the chapter asserts on it.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, overload

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..attention import masked_softmax, scaled_dot_product_attention
from ..cache import KVCache
from ..heads import merge_heads
from ..masks import causal_mask, padding_mask
from ..multihead import MultiHeadAttention
from ..positional import apply_rope, sinusoidal_encoding
from .kit.checkers import NotYet, _call, _checker, _tensor
from .kit.measure import op_counts

if TYPE_CHECKING:
    import pandas as pd

# ---------------------------------------------------------------------------------------------
# the second article's code, as printed (its Chinese comments and its lost line break included)

ARTICLE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

class SelfAttention(nn.Module):
    def __init__(self, embed_size, heads):
        super(SelfAttention, self).__init__()
        self.embed_size = embed_size
        self.heads = heads
        self.head_dim = embed_size // heads

        assert (self.head_dim * heads == embed_size), "Embedding size needs to be divisible by heads"

        # 定义 Q /K/ V 的线性变换层
        self.values = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.keys = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.queries = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.fc_out = nn.Linear(heads * self.head_dim, embed_size)

    def forward(self, values, keys, query, mask):
        # 获取 batch size
        N = query.shape[0]

        # 分割嵌入维度到多个头
        values = rearrange(values, "n (h d) -> h n d", h=self.heads)
        keys = rearrange(keys, "n (h d) -> h n d", h=self.heads)
        queries = rearrange(query, "n (h d) -> h n d", h=self.heads)

        # 计算注意力得分
        energy = torch.einsum("hqd,hkd->hqk", [queries, keys])

        # 缩放得分
        energy = energy / (self.embed_size ** (1/2))

        # 应用 mask（如处理 padding）if mask is not None:
            energy = energy.masked_fill(mask == 0, float("-1e20"))

        # 计算注意力权重
        attention = torch.softmax(energy, dim=2)

        # 应用注意力权重到 values
        out = torch.einsum("hql,hld->hqd", [attention, values])

        # 合并多头输出
        out = rearrange(out, "h n d -> n (h d)")
        out = self.fc_out(out)

        return out
'''
"""The second article's ``SelfAttention`` class, character for character as printed."""

ARTICLE_HEATMAP = (
    "import matplotlib.pyplot as plt\n"
    "import seaborn as sns\n"
    "\n"
    "# 假设我们有一个注意力矩阵 attention [n_heads, seq_len, seq_len]\n"
    "def plot_attention(attention, sentence):\n"
    "    plt.figure(figsize=(10, 8))\n"
    "    ax = sns.heatmap(attention[0].cpu().detach().numpy(), \n"  # the trailing space is printed
    "                    xticklabels=sentence.split(),\n"
    "                    yticklabels=sentence.split(),\n"
    '                    cmap="YlGnBu",\n'
    "                    annot=True)\n"
    '    ax.set_title("Attention Weights")\n'
    "    plt.show()\n"
    "\n"
    "# 示例用法\n"
    'sentence = "the cat sat on the mat"\n'
    "plot_attention(attention_matrix, sentence)\n"
)
"""The second article's heatmap code (注意力热力图), as printed: its example calls
``plot_attention`` on an ``attention_matrix`` that nothing defines."""

SWALLOWED = "# 应用 mask（如处理 padding）if mask is not None:"
"""The line of :data:`ARTICLE` where a line break was lost: the ``if`` sits inside the comment."""


def lines_around(text: str, marker: str, before: int = 1, after: int = 2) -> str:
    """The lines of ``text`` around the first line holding ``marker``: a short quotation."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if marker in line)
    return "\n".join(lines[max(at - before, 0) : at + after + 1])


def wrap_code(text: str, width: int = 79, mark: str = " ↩") -> str:
    """``text`` with every line longer than ``width`` broken at spaces to fit the page's code
    block, ``mark`` ending each broken part, the rest indented 4 more than the line: a quotation
    to read, not to run (run the text itself)."""
    out = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        parts = textwrap.wrap(line, width - len(mark), subsequent_indent=indent,
                              break_long_words=False, break_on_hyphens=False,
                              drop_whitespace=True)
        out += [part + mark for part in parts[:-1]] + parts[-1:]
    return "\n".join(out)


class EinopsSelfAttention(nn.Module):
    """The second article's ``SelfAttention``, fixed: same arguments ``(values, keys, query,
    mask)``, same parameter names as :class:`~selfattn.MultiHeadAttention`.

    ``forward`` returns the output ``(B, L, embed_size)``, as the article's class does; with
    ``need_weights=True``, the pair ``(output, weights)`` in PyTorch's order, the weights
    ``(B, heads, L, S)`` that the article's heatmap needs and its class never returned. Its
    scores are formed in float32 whatever the inputs' dtype, as :func:`selfattn.attention.attend`
    forms them: in float16 they overflow on large inputs (:func:`half_precision_scores`)."""

    def __init__(self, embed_size: int, heads: int) -> None:
        super().__init__()
        if embed_size % heads:
            raise ValueError(f"embed_size ({embed_size}) must be divisible by heads ({heads})")
        self.heads = heads
        self.head_dim = embed_size // heads
        # fix 3: full-width projections, one per role, applied in forward
        self.q_proj = nn.Linear(embed_size, embed_size)
        self.k_proj = nn.Linear(embed_size, embed_size)
        self.v_proj = nn.Linear(embed_size, embed_size)
        self.out_proj = nn.Linear(embed_size, embed_size)

    @overload
    def forward(self, values: Tensor, keys: Tensor, query: Tensor, mask: Tensor | None = None,
                *, need_weights: Literal[False] = False) -> Tensor: ...

    @overload
    def forward(self, values: Tensor, keys: Tensor, query: Tensor, mask: Tensor | None = None,
                *, need_weights: Literal[True]) -> tuple[Tensor, Tensor]: ...

    def forward(
        self, values: Tensor, keys: Tensor, query: Tensor,
        mask: Tensor | None = None, *, need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """mask: bool (B, S), True = may attend (fix 5: one convention)."""
        h = self.heads
        # fix 2: a batch axis b in every pattern
        q = rearrange(self.q_proj(query), "b n (h d) -> b h n d", h=h)
        k = rearrange(self.k_proj(keys), "b n (h d) -> b h n d", h=h)
        v = rearrange(self.v_proj(values), "b n (h d) -> b h n d", h=h)
        # fix 4: divide by sqrt(head_dim), on q; and scores in float32
        # (float16 overflows past 65,504: inf, then NaN)
        q = q.float() / self.head_dim**0.5
        energy = torch.einsum("bhqd,bhkd->bhqk", q, k.float())
        # (B, 1, 1, S): one mask per sentence, over the keys
        allowed = None if mask is None else mask[:, None, None, :]
        # fix 6 and 7: -inf, fp32, dead rows to zero, softmax over the keys
        attention = masked_softmax(energy, allowed).to(v.dtype)  # (B, H, L, S)
        out = torch.einsum("bhqk,bhkd->bhqd", attention, v)
        # fix 8: merge heads with the head axis next to the features
        out = self.out_proj(rearrange(out, "b h n d -> b n (h d)"))
        return (out, attention) if need_weights else out


def half_precision_scores(embed_size: int = 32, heads: int = 4, scale: float = 300.0,
                          seed: int = 0) -> dict[str, Any]:
    """The fixed class in float16 on inputs of ``scale`` times a unit normal, beside
    :class:`~selfattn.MultiHeadAttention` with the same weights: the largest score formed in
    float16 (``inf`` once it passes float16's largest number), whether the class's output is finite
    with its scores in float32, whether it would be with float16 scores, and its largest gap
    from the float32 layer's output relative to that output's size."""
    torch.manual_seed(seed)
    reference = MultiHeadAttention(d_model=embed_size, n_heads=heads)
    fixed = EinopsSelfAttention(embed_size=embed_size, heads=heads)
    fixed.load_state_dict(reference.state_dict())
    x = scale * torch.randn(2, 5, embed_size)  # (B, T, d)
    with torch.no_grad():
        want, _ = reference(x)  # float32
        half = fixed.half()
        xh = x.half()
        q = rearrange(half.q_proj(xh), "b n (h d) -> b h n d", h=heads)
        k = rearrange(half.k_proj(xh), "b n (h d) -> b h n d", h=heads)
        v = rearrange(half.v_proj(xh), "b n (h d) -> b h n d", h=heads)
        scores16 = torch.einsum("bhqd,bhkd->bhqk", q, k) / half.head_dim**0.5
        w16 = masked_softmax(scores16, None).to(v.dtype)
        out16 = half.out_proj(rearrange(torch.einsum("bhqk,bhkd->bhqd", w16, v),
                                        "b h n d -> b n (h d)"))
        out = half(xh, xh, xh)
    return {"scale": scale, "largest float16 score": float(scores16.float().abs().max()),
            "finite, scores in float16": bool(out16.isfinite().all()),
            "finite, scores in float32": bool(out.isfinite().all()),
            "relative gap": float((out.float() - want).abs().max() / want.abs().max()),
            "torch": torch.__version__}


def mask_cost(length: int = 4096, head_dim: int = 64, repeats: int = 5) -> dict[str, Any]:
    """What a causal mask costs SDPA on a CPU, on one ``(1, 1, length, head_dim)`` float32 input:
    the call with ``is_causal=True``, with no mask at all, with a float causal mask (``0`` and
    ``-inf``, built once, outside the call) and with the bool ``causal_mask(length)``, which the
    kernel turns into a float one on every call. For each: the
    attention kernel PyTorch ran, the peak bytes of tensor storage the call held
    (:func:`~selfattn.book.kit.measure.peak_memory`, the input excluded) and the median seconds
    per call (:func:`~selfattn.book.kit.measure.compare`, side by side). ``mask bytes``: one
    float32 number per (query, key) pair, the additive mask the bool one becomes."""
    from .kit.measure import compare, peak_memory

    q = torch.randn(1, 1, length, head_dim)
    calls: dict[str, dict[str, Any]] = {
        "is_causal=True": {"is_causal": True},
        "no mask": {},
        "float attn_mask": {"attn_mask": torch.zeros(length, length).masked_fill(
            ~causal_mask(length), float("-inf"))},
        "bool attn_mask": {"attn_mask": causal_mask(length)}}
    fns: dict[str, Callable[[], object]] = {
        name: partial(F.scaled_dot_product_attention, q, q, q, **kwargs)
        for name, kwargs in calls.items()}
    result: dict[str, Any] = {"length": length, "mask bytes": 4 * length * length}
    with torch.no_grad():
        times = compare(fns, repeats=repeats, warmup=1, min_sample_s=0.05)
        for name, fn in fns.items():
            ops = op_counts(fn)
            result[name] = {"kernel": sorted(op for op in ops if "attention" in op),
                            "peak bytes": peak_memory(fn), "seconds": times[name].median}
    return result


# ---------------------------------------------------------------------------------------------
# pitfall 4: the scale


def scale_entropy(d_model: int = 512, length: int = 32, heads: Iterable[int] = (1, 2, 4, 8, 16, 32),
                  n_rows: int = 256, seed: int = 0) -> dict[str, list[float]]:
    r"""Pitfall 4: the mean entropy (nats) of the rows of
    :math:`\mathrm{softmax}(q k^\top / \sqrt{s})`, for unit-variance ``q`` and ``k`` of
    ``d_model / h`` features each, at every number of heads ``h``: with the paper's
    ``s = head_dim`` (Vaswani et al. 2017, §3.2.1) and with the article's ``s = embed_size``.
    At ``h = 1`` the two are the same division. Uniform attention has entropy ``log(length)``."""
    g = torch.Generator().manual_seed(seed)
    entropy: dict[str, list[float]] = {"sqrt(head_dim)": [], "sqrt(embed_size)": []}
    for h in heads:
        hd = d_model // h
        q = torch.randn(n_rows, length, hd, generator=g)
        k = torch.randn(n_rows, length, hd, generator=g)
        scores = q @ k.transpose(-2, -1)  # (n_rows, length, length)
        for name, s in (("sqrt(head_dim)", hd), ("sqrt(embed_size)", d_model)):
            w = torch.softmax(scores / math.sqrt(s), dim=-1)
            entropy[name].append(float(-(w * w.clamp_min(1e-30).log()).sum(-1).mean()))
    return entropy


# ---------------------------------------------------------------------------------------------
# pitfalls 5 and 6: the mask conventions and the fill values

FILLS: dict[str, Callable[[torch.dtype], float | Tensor]] = {
    "-inf": lambda dt: float("-inf"),
    "-1e20": lambda dt: -1e20,
    "-9e15": lambda dt: -9e15,
    "-1e9": lambda dt: -1e9,
    "-1e6": lambda dt: -1e6,
    "finfo(dtype).min": lambda dt: torch.finfo(dt).min,
    "2 x finfo(dtype).min": lambda dt: torch.tensor(torch.finfo(dt).min, dtype=dt) * 2,
    "finfo(float32).min, cast": lambda dt: torch.tensor(torch.finfo(torch.float32).min).to(dt),
}
"""The fill values in circulation (who uses which: chapter 8's table of mask conventions), each as
a function of the scores' dtype."""

FILL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def softmax_with_fill(fill: float | Tensor, dtype: torch.dtype) -> str:
    """The softmax of two rows of three zero scores in ``dtype``, masked by ``masked_fill`` with
    ``fill``: row 0 with its last key masked, row 1 with every key masked. Each row described as
    its weights, ``NaN`` or ``zeros``, or the error ``masked_fill`` raised."""
    scores = torch.zeros(2, 3, dtype=dtype)
    masked = torch.tensor([[False, False, True], [True, True, True]])
    try:
        w = torch.softmax(scores.masked_fill(masked, fill), dim=-1)
    except RuntimeError as exc:  # "value cannot be converted to type ... without overflow"
        return "RuntimeError: overflow" if "overflow" in str(exc) else f"RuntimeError: {exc}"
    rows = []
    for row in w.float():
        if row.isnan().any():
            rows.append("NaN")
        elif (row == 0).all():
            rows.append("zeros")
        else:
            rows.append(" ".join(f"{v:.2f}" for v in row.tolist()))
    return " | ".join(rows)


def fill_table(fills: Mapping[str, Callable[[torch.dtype], float | Tensor]] = FILLS,
               dtypes: Iterable[torch.dtype] = FILL_DTYPES) -> pd.DataFrame:
    """Pitfall 6: :func:`softmax_with_fill` for every fill value (rows) in every dtype (columns)."""
    import pandas as pd

    table = pd.DataFrame({str(dt).removeprefix("torch."): {name: softmax_with_fill(f(dt), dt)
                                                           for name, f in fills.items()}
                          for dt in dtypes})
    table.index.name = "fill  (row: one key masked | every key masked)"
    return table


# ---------------------------------------------------------------------------------------------
# pitfall 10: the causal mask, off by one


def causal_from_triu(L: int, diagonal: int = 1) -> Tensor:
    """The first article's additive causal mask: ``-inf`` strictly above diagonal ``diagonal - 1``,
    0 elsewhere, ``torch.triu(torch.full((L, L), -inf), diagonal)``; ``diagonal=1`` is right."""
    return torch.triu(torch.full((L, L), float("-inf")), diagonal=diagonal)


def leaks(mask: Tensor, T: int = 6, seed: int = 0) -> bool:
    """Whether attention under the additive ``mask`` (T, T) lets an output see the future: does
    changing token ``t + 1`` move any output at positions ``<= t``? A test that needs no knowledge
    of the mask. NaN counts as equal to NaN: a row that is NaN before and after has not leaked."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, T, 8, generator=g)

    def attend(x: Tensor) -> Tensor:
        return torch.softmax(x @ x.transpose(-2, -1) + mask, dim=-1) @ x  # (1, T, 8)

    base = attend(x)
    for t in range(T - 1):
        y = x.clone()
        y[0, t + 1] += 1.0
        if not torch.allclose(attend(y)[0, : t + 1], base[0, : t + 1], equal_nan=True):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# pitfall 15: rows with nothing to attend to, in PyTorch's own layers

MODES = {"training": (True, True), "eval, autograd on": (False, True), "eval, no_grad()": (False, False)}
"""The three ways a layer is called: (training, autograd on). Training; a validation loop without
``torch.no_grad()``; a model served."""


def which_path(ops: Iterable[str]) -> str:
    """The branch of ``nn.MultiheadAttention.forward`` that called these ``aten`` operators."""
    ops = list(ops)
    if "_native_multi_head_attention" in ops:
        return "fast path"
    if any("scaled_dot_product" in op for op in ops):
        return "slow path, SDPA"
    return "slow path, its own softmax"


def _describe_row(row: Tensor) -> str:
    if row.isnan().all():
        return "NaN"
    return "zeros" if (row == 0).all() else "other"


def masked_query_paths(heads: Iterable[int] = (2, 3), d_model: int = 12,
                       seed: int = 0) -> pd.DataFrame:
    """Pitfall 15: ``nn.MultiheadAttention`` on three tokens whose query 1 may attend to nothing,
    for each number of heads, each of :data:`MODES` and ``need_weights`` on and off. Columns: the
    branch of ``forward`` that ran (:func:`which_path`, from the operators it called), the masked
    query's output (``out_proj.bias`` is zero, PyTorch's initial value, so zero attention gives
    ``zeros``), and whether the other queries' outputs are finite."""
    import pandas as pd

    torch.manual_seed(seed)
    x = torch.randn(1, 3, d_model)
    blocked = torch.zeros(3, 3, dtype=torch.bool)
    blocked[1] = True  # nn.MultiheadAttention's polarity: True = may not attend
    rows = []
    for h in heads:
        mha = nn.MultiheadAttention(d_model, h, batch_first=True)
        assert (mha.out_proj.bias == 0).all()
        for mode, (training, grad) in MODES.items():
            mha.train(training)
            for need_weights in (True, False):

                def call(mha: nn.Module = mha, need_weights: bool = need_weights) -> Tensor:
                    return mha(x, x, x, attn_mask=blocked, need_weights=need_weights)[0][0]  # (T, E)

                with torch.set_grad_enabled(grad):
                    path, out = which_path(op_counts(call)), call()
                rows.append({"heads": h, "mode": mode, "need_weights": need_weights, "path": path,
                             "masked query": _describe_row(out[1].detach()),
                             "others finite": bool(out[[0, 2]].isfinite().all())})
    return pd.DataFrame(rows)


def encoder_nan_spread(seed: int = 0) -> dict[str, dict[str, Any]]:
    """Pitfall 15, one NaN row spreading: a two-layer ``nn.TransformerEncoder`` on two sentences of
    three tokens, the first with one pad on the left, under a causal mask (the pad's query sees
    only itself, a pad: nothing). For training and for eval under ``no_grad()``: whether the
    layers took PyTorch's fast path, which tokens are NaN after each layer (``(B, T)`` bool), and
    after the whole stack."""
    torch.manual_seed(seed)
    block = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(block, 2, enable_nested_tensor=False)
    x = torch.randn(2, 3, 8)  # (B, T, E)
    pad = torch.tensor([[True, False, False], [False, False, False]])  # True = pad
    future = torch.ones(3, 3, dtype=torch.bool).triu(1)  # True = may not attend
    spread = {}
    for mode in ("training", "eval, no_grad()"):
        encoder.train(mode == "training")
        with torch.set_grad_enabled(mode == "training"):
            h, nan, fast = x, [], []
            for layer in encoder.layers:

                def call(layer: nn.Module = layer, h: Tensor = h) -> Tensor:
                    return layer(h, src_mask=future, src_key_padding_mask=pad)

                fast.append("_transformer_encoder_layer_fwd" in op_counts(call))
                h = call()  # (B, T, E)
                nan.append(h.isnan().any(-1))  # (B, T): NaN per token
            whole = encoder(x, mask=future, src_key_padding_mask=pad).isnan().any(-1)
        spread[mode] = {"fast path": all(fast), "layers": nan, "whole": whole}
    return spread


# ---------------------------------------------------------------------------------------------
# pitfall 17: what reaches PyTorch's kernel


def sdpa_calls(fn: Callable[[], object]) -> list[dict[str, Any]]:
    """What ``fn()`` handed ``F.scaled_dot_product_attention``, call by call: the queries' shape,
    the mask (``None``, or its shape and dtype), ``is_causal`` and ``enable_gqa``."""
    calls: list[dict[str, Any]] = []
    real = F.scaled_dot_product_attention

    def spy(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
            dropout_p: float = 0.0, is_causal: bool = False, *, scale: float | None = None,
            enable_gqa: bool = False) -> Tensor:
        mask = None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.dtype)
        calls.append({"q": tuple(query.shape), "mask": mask, "is_causal": is_causal,
                      "enable_gqa": enable_gqa})
        return real(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                    is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    setattr(F, "scaled_dot_product_attention", spy)  # noqa: B010 (mypy: a module's function)
    try:
        fn()
    finally:
        setattr(F, "scaled_dot_product_attention", real)  # noqa: B010
    return calls


LAYOUTS = {"MHA": 4, "GQA": 2, "MQA": 1}
"""Key/value heads of :func:`what_reaches_sdpa`'s layers, of four query heads each."""


def _sdpa_call_text(calls: list[dict[str, Any]], n_heads: int) -> str:
    """One entry of :func:`what_reaches_sdpa`: the last call's mask (or ``is_causal``), with how
    the grouped heads reached the kernel: ``enable_gqa``, or a group's query heads stacked as
    rows over one key/value head (fewer heads than ``n_heads`` in the queries' shape)."""
    if not calls:
        return "not called"
    call = calls[-1]
    if call["mask"] is not None:
        shape, dtype = call["mask"]
        text = f"mask {shape} {str(dtype).removeprefix('torch.')}"
    else:
        text = "is_causal=True, no mask" if call["is_causal"] else "no mask"
    if call["enable_gqa"]:
        text += "; enable_gqa"
    elif call["q"][1] < n_heads:  # (B, H_kv, g * L, hd): a group's queries as rows
        text += f"; {n_heads // call['q'][1]} queries stacked per key head"
    return text


def what_reaches_sdpa(d_model: int = 32, prompt: int = 8, seed: int = 0) -> pd.DataFrame:
    """Pitfall 17: what :class:`~selfattn.MultiHeadAttention` (eval, no grad) hands PyTorch's
    kernel in six calls (rows), for MHA, GQA and MQA of four query heads (columns, of
    :data:`LAYOUTS`): a causal prompt; the same with a padding mask; a prompt into an empty KV
    cache; a chunk of several tokens after it; one token after it; a causal prompt with
    ``need_weights=True``. Each entry is the last call's mask, or ``is_causal=True, no mask``,
    or ``no mask`` (:func:`_sdpa_call_text`), or ``not called``."""
    import pandas as pd

    n_heads = 4
    torch.manual_seed(seed)
    x = torch.randn(2, prompt, d_model)
    keep = padding_mask(torch.tensor([prompt, prompt - 3]), prompt)  # (B, S): sentence 1 padded
    table: dict[str, dict[str, str]] = {}
    for layout, n_kv in LAYOUTS.items():
        layer = MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv).eval()

        def call(tokens: int, cached: bool, mask: Tensor | None = None, weights: bool = False,
                 layer: MultiHeadAttention = layer) -> Callable[[], object]:
            cache = KVCache() if cached else None
            if cache is not None and tokens < prompt:
                layer(x, is_causal=True, kv_cache=cache)  # the prompt, before the call recorded
            return lambda: layer(x[:, :tokens], attn_mask=mask, is_causal=True, kv_cache=cache,
                                 need_weights=weights)

        with torch.no_grad():
            calls = {
                "causal prompt": call(prompt, cached=False),
                "causal prompt, padded": call(prompt, cached=False, mask=keep[:, None, None, :]),
                "a prompt into an empty KV cache": call(prompt, cached=True),
                "a chunk after a KV cache": call(3, cached=True),
                "one token after a KV cache": call(1, cached=True),
                "causal prompt, need_weights=True": call(prompt, cached=False, weights=True),
            }
            table[layout] = {case: _sdpa_call_text(sdpa_calls(fn), n_heads)
                             for case, fn in calls.items()}
    return pd.DataFrame(table)


def flash_with_mask(device: torch.device | str, T: int = 1024, n_heads: int = 8,
                    head_dim: int = 64) -> list[str]:
    """Pitfall 17's GPU cell: the kernels SDPA runs for a causal call given as ``is_causal=True``
    and as a mask tensor, at length ``T`` (float16 on CUDA, float32 elsewhere); then, where the
    device has a Flash kernel (CUDA from compute capability 8.0; a CPU's flash kernel always),
    each call with Flash alone allowed: it runs, or SDPA raises and its warnings say why. Lines
    to print. On a CPU it runs too (the test keeps it from rotting), and both calls run there."""
    import textwrap
    import warnings

    from torch.nn.attention import SDPBackend, sdpa_kernel

    device = torch.device(device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    q = torch.randn(1, n_heads, T, head_dim, device=device, dtype=dtype)
    calls: dict[str, dict[str, Any]] = {
        "is_causal=True": {"is_causal": True},
        "attn_mask=causal_mask(T)": {"attn_mask": causal_mask(T, device=device)},
    }
    lines = []
    has_flash = True
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        lines.append(f"{torch.cuda.get_device_name(device)}, compute capability {capability}")
        has_flash = capability >= (8, 0)
    for name, kwargs in calls.items():
        ops = op_counts(partial(F.scaled_dot_product_attention, q, q, q, **kwargs))
        kernels = sorted(op for op in ops if "attention" in op or "softmax" in op)
        lines.append(f"  {name}: SDPA ran {kernels}")
    if not has_flash:
        lines += ["Flash needs compute capability (8, 0), Ampere, or later: none here.",
                  "What a mask costs on this GPU is the kernel reading it from memory."]
        return lines
    for name, kwargs in calls.items():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                F.scaled_dot_product_attention(q, q, q, **kwargs)
                lines.append(f"Flash only, {name}: runs")
                continue
            except RuntimeError:
                pass
        why = []  # SDPA checks every backend: keep what concerns Flash
        for w in caught:
            text = str(w.message).split("(Triggered internally")[0].strip()
            if ("attn_mask" in text or "lash" in text) and not text.endswith(":") and text not in why:
                why.append(text)
        lines.append(f"Flash only, {name}: no kernel" + (", because:" if why else ""))
        lines += [textwrap.fill(text, 84, initial_indent="- ", subsequent_indent="  ") for text in why]
    return lines


GPU_PREDICTION = (
    "No make gpu report is committed (performance.gpu_report() is None), so",
    "what follows is a prediction, read from PyTorch's source, not a measurement:",
    "- Flash refuses any attn_mask; it takes only is_causal=True",
    "  (check_for_attn_mask, in sdp_utils_cpp.h).",
    "- Flash wants float16 or bfloat16 on compute capability 8.0 or later",
    "  (check_flash_attention_hardware_support, in cuda/sdp_utils.cpp): an A100",
    "  or an L4 has it; a T4 (7.5, Colab's free GPU) has no Flash kernel at all.",
    "- On Hopper (9.0, an H100), recent PyTorch tries cuDNN's kernel before",
    "  Flash (check_prefer_cudnn_attention, in cuda/sdp_utils.cpp).",
    "So on an A100 or an L4 a mask, even a causal one, should move SDPA from",
    "Flash to a kernel that reads the mask from memory.",
)
"""What chapter 8 says of SDPA's kernels on CUDA GPUs while no GPU has run it: each claim with the
function of PyTorch's source it is read from; lines of at most 79 characters."""


def gpu_sentence(report: Mapping[str, Any] | None, chapter: str = "08_pitfalls") -> str:
    """What the chapter may say of its GPU cell: a prediction while no ``make gpu`` report is
    committed (``report`` is :func:`selfattn.book.performance.gpu_report`'s answer, ``None``), else
    the GPU and what the cell printed there."""
    if report is None:
        return "\n".join(GPU_PREDICTION)
    printed = [cell["output"].rstrip() for cell in report["cells"] if cell["chapter"] == chapter]
    head = f"make gpu ran this chapter on {report['device']['name']} ({report['date']})"
    return f"{head}; the GPU cell printed:\n" + "\n".join(printed) if printed else f"{head}, no GPU cell."


# ---------------------------------------------------------------------------------------------
# pitfall 18: left padding and positions


def _attend_positions(x: Tensor, positions: Tensor, keep: Tensor, rope: bool) -> Tensor:
    """Causal self-attention of ``x`` (T, d) on itself, no projections, with the positions
    rotated in (RoPE) or added (sinusoidal), keys masked where ``keep`` is False; (T, d)."""
    if rope:
        q = k = apply_rope(x, positions)  # rotated, (T, d)
    else:
        q = k = x + sinusoidal_encoding(16, x.shape[-1])[positions]  # absolute, added
    allowed = causal_mask(len(x)) & keep  # (T, T): causal and padding
    return scaled_dot_product_attention(q, k, x, attn_mask=allowed)[0]  # pads' rows: zero


def padded_position_gaps(d: int = 8, n_pad: int = 2, seed: int = 0) -> pd.DataFrame:
    """Pitfall 18: one sentence (three prompt tokens, then a new one) padded on the left with
    ``n_pad`` pads, against the same sentence alone, under three rules for the positions (from
    the first pad; from the first real token; ``two rules``: the prompt from its first real token
    and the new token at the cache's length), with absolute positions and with RoPE. Each row:
    the encoding, the rule, the positions and, per real token, the largest difference from the
    sentence alone (float32 rounding is below 1e-6)."""
    import pandas as pd

    torch.manual_seed(seed)
    sentence = torch.randn(4, d)  # three prompt tokens, then the new one
    padded = torch.cat([torch.zeros(n_pad, d), sentence])  # (n_pad + 4, d)
    keep = torch.arange(len(padded)) >= n_pad  # True = real token
    from_first_real = (keep.cumsum(0) - 1).clamp_min(0)  # 0, 0, 0, 1, 2, 3
    rules = {
        "from the first pad": torch.arange(len(padded)),
        "from the first real token": from_first_real,
        # the prompt from its first real token, the new token at the cache's length
        "two rules": torch.cat([from_first_real[:-1], torch.tensor([len(padded) - 1])]),
    }
    rows = []
    for rope in (False, True):
        alone = _attend_positions(sentence, torch.arange(len(sentence)),
                                  torch.ones(len(sentence), dtype=torch.bool), rope)
        for rule, positions in rules.items():
            if not rope and rule == "two rules":
                continue  # a rule of decoding with RoPE
            gap = (_attend_positions(padded, positions, keep, rope)[n_pad:] - alone).abs().amax(-1)
            rows.append({"encoding": "RoPE" if rope else "absolute", "rule": rule,
                         "positions": " ".join(map(str, positions.tolist())),
                         **{f"token {i}" if i < 3 else "new token": float(g)
                            for i, g in enumerate(gap)}})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# the exercises


def merge_heads_entry(shape: tuple[int, int, int, int], token: int, feature: int) -> int:
    """Chapter 8, exercise 1: for ``x = torch.arange(B * H * T * hd).reshape(shape)``, the number
    at ``[0, token, feature]`` of :func:`selfattn.merge_heads` ``(x)``."""
    x = torch.arange(math.prod(shape)).reshape(shape)
    return int(merge_heads(x)[0, token, feature])


def causal_pairs(L: int) -> int:
    """Chapter 8, exercise 3: how many (query, key) pairs the ``(L, L)`` causal mask lets attend."""
    return int(causal_mask(L).sum())


@_checker
def check_merge_heads(fn: object) -> str:
    """Chapter 8, exercise 1: ``fn(x)`` turns heads ``(B, H, T, hd)`` into ``(B, T, H * hd)``."""
    x = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(8))  # (B, H, T, hd)
    want = x.transpose(1, 2).reshape(2, 4, 15)  # (B, T, H * hd)
    got = _tensor(_call(fn, x), want)
    if torch.equal(got, x.reshape(2, 4, 15)):
        raise NotYet("the right shape, but in memory order: token 0 holds tokens 0 and 1 of head 0; "
                     "move the head axis first")
    if not torch.equal(got, want):
        raise NotYet("the values are not where they belong: token t, head h should sit at "
                     "[:, t, h * hd : (h + 1) * hd]")
    return "token t gets head 0's features, then head 1's, ..."
