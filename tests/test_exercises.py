"""The build-it checkers of the book's topic modules: the solution a chapter shows folded passes, a
blank answer fails without raising, and each typical mistake gets its own hint. Every checker is a
topic's check_*, and `import selfattn` still does not load the topics.

Solutions are source text run the way tests/test_book.py runs a chapter's folded solution (in a
namespace holding only torch and selfattn); each mistake is the solution with a few edits.
"""

import subprocess
import sys
import textwrap

import pytest
import torch
from topics import CHECKERS, TOPICS

import selfattn
from selfattn.book import decoding, single_head
from selfattn.book.kit.checkers import WIDTH

SOLUTIONS = {
    "check_attention_layer": '''
import math
from torch import nn

class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.W_q = nn.Linear(d_model, d_k, bias=False)
        self.W_k = nn.Linear(d_model, d_k, bias=False)
        self.W_v = nn.Linear(d_model, d_v, bias=False)

    def forward(self, x):  # (B, T, d_model)
        q, k, v = self.W_q(x), self.W_k(x), self.W_v(x)  # (B, T, d_k), (B, T, d_k), (B, T, d_v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, T, T)
        return torch.softmax(scores, dim=-1) @ v  # (B, T, d_v)

answer = SelfAttention
''',
    "check_rope": '''
def rope(x, positions):  # x (..., T, d), positions (T,)
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2) / d)  # (d/2,): pair i turns by theta_i per position
    angles = positions[:, None] * theta  # (T, d/2)
    cos, sin = torch.cos(angles), torch.sin(angles)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., T, d/2): the pairs (x_2i, x_2i+1)
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out

answer = rope
''',
    "check_split_heads": '''
def split_heads(x, n_heads):  # (B, T, n_heads * hd)
    B, T, width = x.shape
    return x.view(B, T, n_heads, width // n_heads).transpose(1, 2)  # (B, n_heads, T, hd)

answer = split_heads
''',
    "check_multi_head_forward": '''
def multi_head_forward(layer, x):  # x (B, T, d_model)
    B, T, _ = x.shape
    H = layer.config.n_heads

    def split(t):  # (B, T, H * hd) -> (B, H, T, hd)
        return t.view(B, T, H, -1).transpose(1, 2)

    q, k, v = split(layer.q_proj(x)), split(layer.k_proj(x)), split(layer.v_proj(x))
    out, _ = selfattn.scaled_dot_product_attention(q, k, v)  # (B, H, T, hd)
    return layer.out_proj(out.transpose(1, 2).reshape(B, T, -1))  # (B, T, d_model)

answer = multi_head_forward
''',
    "check_kv_cache": '''
class Cache:
    def __init__(self):
        self.keys = self.values = None

    def append(self, k, v):  # (B, H_kv, T_new, hd) each
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys = torch.cat([self.keys, k], dim=2)  # (B, H_kv, T_so_far, hd)
            self.values = torch.cat([self.values, v], dim=2)
        return self.keys, self.values

answer = Cache
''',
    "check_online_softmax": '''
def online_softmax(scores, block_size):  # (..., S)
    shape = scores.shape[:-1] + (1,)
    m = torch.full(shape, float("-inf"))  # the running maximum
    l = torch.zeros(shape)  # the running sum of exp(s - m)
    for start in range(0, scores.shape[-1], block_size):
        block = scores[..., start : start + block_size]
        m_new = torch.maximum(m, block.max(dim=-1, keepdim=True).values)
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum(dim=-1, keepdim=True)
        m = m_new
    return torch.exp(scores - m) / l  # (..., S)

answer = online_softmax
''',
}

BLANKS = {
    "check_attention_layer": '''
from torch import nn

class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.W_q = nn.Linear(d_model, d_k, bias=False)
        self.W_k = nn.Linear(d_model, d_k, bias=False)
        self.W_v = nn.Linear(d_model, d_v, bias=False)

    def forward(self, x):
        return None  # your code here

answer = SelfAttention
''',
    "check_kv_cache": '''
class Cache:
    def append(self, k, v):
        return None  # your code here

answer = Cache
''',
}

# the online softmax without its maximum: right for small scores, inf / inf = NaN for large ones
NO_MAX = [("l * torch.exp(m - m_new)", "l"), ("torch.exp(block - m_new)", "torch.exp(block)"),
          ("torch.exp(scores - m)", "torch.exp(scores)")]

# (checker, edits to its solution, a word the hint must hold)
MISTAKES = [
    ("check_attention_layer", [(" / math.sqrt(q.shape[-1])", "")], "forgot the scale"),
    ("check_attention_layer", [("math.sqrt(q.shape[-1])", "math.sqrt(x.shape[-1])")], "sqrt(d_model)"),
    ("check_attention_layer", [("dim=-1) @ v", "dim=1) @ v")], "over the queries"),
    ("check_attention_layer", [("dim=-1) @ v", "dim=0) @ v")], "over the batch"),
    ("check_attention_layer", [("self.W_v(x)", "self.W_k(x)")], "your values come from W_k"),
    ("check_attention_layer", [("self.W_k(x)", "self.W_v(x)")], "your keys come from W_v"),
    ("check_attention_layer", [("torch.softmax(scores, dim=-1) @ v", "scores @ v")], "no softmax"),
    ("check_attention_layer", [("nn.Linear(d_model, d_v, bias=False)",
                                "nn.Linear(d_model, d_k, bias=False)")], "W_v maps 12 features to 4"),
    ("check_attention_layer", [("nn.Linear(d_model, d_k, bias=False)\n        self.W_k",
                                "nn.Linear(d_model, d_k)\n        self.W_k")], "bias=False"),
    ("check_attention_layer", [("self.W_q = nn.Linear", "self.query = nn.Linear")], "no attribute W_q"),
    ("check_attention_layer", [("        super().__init__()\n", "")], "super().__init__()"),
    ("check_attention_layer", [("@ v  # (B, T, d_v)", "@ v, scores")], "tuple"),
    ("check_rope", [("x1 * cos - x2 * sin", "x1 * cos + x2 * sin"),
                    ("x1 * sin + x2 * cos", "-x1 * sin + x2 * cos")], "other way"),
    ("check_rope", [("x1, x2 = x[..., 0::2], x[..., 1::2]", "x1, x2 = x[..., : d // 2], x[..., d // 2 :]"),
                    ("out[..., 0::2]", "out[..., : d // 2]"), ("out[..., 1::2]", "out[..., d // 2 :]")],
     "pairs the halves"),
    ("check_rope", [("torch.arange(0, d, 2) / d", "torch.arange(d // 2) / d")], "10000^(-i/d)"),
    ("check_rope", [("torch.arange(0, d, 2) / d", "2 * torch.arange(0, d, 2) / d")], "10000^(-4i/d)"),
    ("check_rope", [("-torch.arange(0, d, 2) / d", "torch.arange(0, d, 2) / d")], "minus sign"),
    ("check_rope", [("x1 * sin + x2 * cos", "x1 * sin + x2 * sin")], "lengths"),
    ("check_rope", [("positions[:, None]", "torch.arange(x.shape[-2])[:, None]")], "use the positions"),
    ("check_rope", [("out = torch.empty_like(x)", "out = x")], "in place"),
    ("check_split_heads", [("x.view(B, T, n_heads, width // n_heads).transpose(1, 2)",
                            "x.view(B, n_heads, T, width // n_heads)")], "whole tokens"),
    ("check_split_heads", [(".transpose(1, 2)", ".transpose(2, 3)")], "wrong order"),
    ("check_split_heads", [(".transpose(1, 2)", ".transpose(0, 1)")], "wrong order"),
    ("check_split_heads", [("x.view(B, T, n_heads, width // n_heads).transpose(1, 2)",
                            "x.view(B, T, width // n_heads, n_heads).permute(0, 3, 1, 2)")], "interleaved"),
    ("check_multi_head_forward", [("t.view(B, T, H, -1).transpose(1, 2)", "t.view(B, H, T, -1)")],
     "split the heads by a plain reshape"),
    ("check_multi_head_forward", [("out.transpose(1, 2).reshape(B, T, -1)", "out.reshape(B, T, -1)")],
     "merge the heads by a plain reshape"),
    ("check_multi_head_forward", [("t.view(B, T, H, -1).transpose(1, 2)", "t.view(B, H, T, -1)"),
                                  ("out.transpose(1, 2).reshape(B, T, -1)", "out.reshape(B, T, -1)")],
     "split the heads by a plain reshape to (B, H, T, hd), which puts whole tokens in one head (view as "
     "(B, T, H, hd), then transpose(1, 2)), and merge"),
    ("check_multi_head_forward", [("return layer.out_proj(out.transpose(1, 2).reshape(B, T, -1))",
                                   "return out.transpose(1, 2).reshape(B, T, -1)")], "out_proj"),
    ("check_multi_head_forward", [("H = layer.config.n_heads", "H = 1")], "one head of full width"),
    ("check_multi_head_forward", [("(q, k, v)  #", "(q, k, v, scale=1 / x.shape[-1] ** 0.5)  #")],
     "1/sqrt(d_model)"),
    ("check_multi_head_forward", [("(q, k, v)  #", "(q, k, v, is_causal=True)  #")], "causal mask"),
    ("check_kv_cache", [("return self.keys, self.values", "return k, v")], "only the new keys (1 of 2)"),
    ("check_kv_cache", [("dim=2)", "dim=1)")], "grown along dim 1"),
    ("check_kv_cache", [("dim=2)", "dim=-1)")], "grown along dim 3"),
    ("check_kv_cache", [("self.keys = torch.cat", "self.keys.data = torch.cat")], "must not modify"),
    ("check_kv_cache", [("return self.keys, self.values", "return self.values, self.keys")], "values first"),
    ("check_online_softmax", NO_MAX, "inf or NaN"),
    ("check_online_softmax", [("l * torch.exp(m - m_new)", "l")], "exp(m - m')"),
    ("check_online_softmax", [("torch.exp(scores - m) / l", "scores.sub_(m).exp_() / l")], "in place"),
]

# mistakes written out in full, where edits to the solution would not read well
WRITTEN = [
    ("check_kv_cache", '''
class Cache:
    keys, values = [], []  # class attributes: shared by every cache

    def append(self, k, v):
        self.keys.append(k)
        self.values.append(v)
        return torch.cat(self.keys, dim=2), torch.cat(self.values, dim=2)

answer = Cache
''', "class attribute"),
    ("check_online_softmax", '''
def online_softmax(scores, block_size):
    blocks = scores.split(block_size, dim=-1)
    return torch.cat([torch.exp(b - b.max(-1, keepdim=True).values)
                      / torch.exp(b - b.max(-1, keepdim=True).values).sum(-1, keepdim=True)
                      for b in blocks], dim=-1)

answer = online_softmax
''', "on its own"),
    ("check_online_softmax", '''
def online_softmax(scores, block_size):  # no rescaling, and the maximum started at 0, not -inf
    m = torch.zeros(scores.shape[:-1] + (1,))
    l = torch.zeros(scores.shape[:-1] + (1,))
    for start in range(0, scores.shape[-1], block_size):
        block = scores[..., start : start + block_size]
        m = torch.maximum(m, block.max(dim=-1, keepdim=True).values)
        l = l + torch.exp(block - m).sum(dim=-1, keepdim=True)
    return torch.exp(scores - m) / l

answer = online_softmax
''', "right when the first block holds the maximum"),
    ("check_online_softmax", '''
def online_softmax(scores, block_size):  # right numbers, not the algorithm
    return torch.softmax(scores, dim=-1)

answer = online_softmax
''', "calls torch.softmax"),
    ("check_online_softmax", '''
def online_softmax(scores, block_size):  # the two-pass softmax: the whole row's max at once
    m = scores.amax(dim=-1, keepdim=True)
    return torch.exp(scores - m) / torch.exp(scores - m).sum(dim=-1, keepdim=True)

answer = online_softmax
''', "amax, over 7 numbers at once"),
    ("check_online_softmax", '''
def online_softmax(scores, block_size):  # the log-sum-exp of the whole row, by a running op
    return torch.exp(scores - torch.logcumsumexp(scores, -1)[..., -1:])

answer = online_softmax
''', "calls torch.logcumsumexp"),
    ("check_online_softmax", '''
def online_softmax(scores, block_size):  # the maximum by aminmax, the sum as a product
    m = torch.aminmax(scores, dim=-1, keepdim=True).max
    e = torch.exp(scores - m)
    return e / (e @ torch.ones(scores.shape[-1], 1))

answer = online_softmax
''', "aminmax, over 7 numbers at once"),
    ("check_online_softmax", '''
def online_softmax(scores, block_size):  # a running maximum over the whole row at once
    m = torch.cummax(scores, dim=-1).values[..., -1:]
    e = torch.exp(scores - m)
    return e / torch.nansum(e, dim=-1, keepdim=True)

answer = online_softmax
''', "cummax, over 7 numbers at once"),
]

# right answers written differently from the folded solution: each must pass
RIGHT = {
    "columns moved to the front": '''
def online_softmax(scores, block_size):
    cols = scores.movedim(-1, 0)  # (S, ...)
    m = torch.full_like(cols[:1], float("-inf"))
    l = torch.zeros_like(m)
    for block in cols.split(block_size, dim=0):
        m_new = torch.maximum(m, block.amax(dim=0, keepdim=True))
        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum(0, keepdim=True)
        m = m_new
    return torch.exp(cols - m).div(l).movedim(0, -1)

answer = online_softmax
''',
}


def run(code):
    """The ``answer`` that ``code`` defines, run as test_book runs a chapter's folded solution."""
    ns = {"torch": torch, "selfattn": selfattn}
    exec(textwrap.dedent(code), ns)
    return ns["answer"]


def edited(name, edits):
    code = SOLUTIONS[name]
    for old, new in edits:
        assert old in code, (name, old)
        code = code.replace(old, new)
    return code


def verdict(capsys, name, answer):
    """(what the checker returned, the verdict it printed, joined into one line)."""
    capsys.readouterr()
    ok = CHECKERS[name](answer)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines and lines[0].startswith(("✓ Correct: ", "✗ Not yet: ")), out
    assert all(len(line) <= WIDTH for line in lines), out  # fits a code block
    assert all(line.startswith("  ") for line in lines[1:]), out  # one verdict, wrapped
    return ok, " ".join(line.strip() for line in lines) + "\n"


@pytest.mark.parametrize("name", SOLUTIONS)
def test_the_solution_passes(name, capsys):
    ok, out = verdict(capsys, name, run(SOLUTIONS[name]))
    assert ok is True, out
    assert out.startswith("✓ Correct: ")


@pytest.mark.parametrize("name", SOLUTIONS)
@pytest.mark.parametrize("blank", ["none", "returns_none", "raises"])
def test_a_blank_answer_fails_without_raising(name, blank, capsys):
    if blank == "none":
        answer = None
    elif blank == "returns_none":
        answer = run(BLANKS.get(name, "def answer(*args):\n    return None\n"))
    else:
        answer = run("def answer(*args):\n    raise NotImplementedError('your code here')\n")
    ok, out = verdict(capsys, name, answer)
    assert ok is False
    assert out.startswith("✗ Not yet: ")
    assert "raised NotImplementedError" in out if blank == "raises" else "raised" not in out


@pytest.mark.parametrize(("name", "edits", "hint"), MISTAKES,
                         ids=[f"{m[0]}-{m[2][:30]}" for m in MISTAKES])
def test_a_typical_mistake_gets_its_hint(name, edits, hint, capsys):
    ok, out = verdict(capsys, name, run(edited(name, edits)))
    assert ok is False
    assert hint in out, out


@pytest.mark.parametrize(("name", "code", "hint"), WRITTEN, ids=[f"{m[0]}-{m[2][:30]}" for m in WRITTEN])
def test_a_typical_mistake_written_out_gets_its_hint(name, code, hint, capsys):
    ok, out = verdict(capsys, name, run(code))
    assert ok is False
    assert hint in out, out


def test_without_the_maximum_only_large_scores_show_the_mistake():
    no_max = run(edited("check_online_softmax", NO_MAX))
    small = torch.randn(3, 10)
    assert torch.allclose(no_max(small, 3), torch.softmax(small, dim=-1))
    assert no_max(small + 1000, 3).isnan().all()


@pytest.mark.parametrize("name", SOLUTIONS)
def test_a_checker_leaves_the_global_random_state_alone(name, capsys):
    state = torch.random.get_rng_state()
    CHECKERS[name](run(SOLUTIONS[name]))
    assert torch.equal(torch.random.get_rng_state(), state)


def test_every_check_is_a_topics_check_and_documented():
    assert {"check_merge_heads", "check_attention", "check_rope_turn", *SOLUTIONS} <= set(CHECKERS)
    for name, check in CHECKERS.items():
        module = next(m for m in TOPICS if getattr(m, name, None) is check)
        assert getattr(selfattn.book, module.__name__.rsplit(".", 1)[1]) is module
        assert check.__doc__.startswith("Chapter")
    for name in SOLUTIONS:
        assert "build-it exercise" in CHECKERS[name].__doc__.split(":")[0]
    assert issubclass(selfattn.book.kit.checkers.NotYet, Exception)


@pytest.mark.slow
def test_importing_selfattn_does_not_import_the_books_apparatus():
    code = ("import selfattn, sys; "
            "print(sorted(m for m in sys.modules if m.startswith(('selfattn.book', 'matplotlib'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    code = "import selfattn; selfattn.book.positional_encoding.check_rope; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


# --- chapter 3: masked additive attention, Luong's general score --------------------------------

CH3_SOLUTIONS = {
    "check_masked_additive_attention": '''
def additive_attention(query, key, value, mask, scorer):  # (B, L, Eq), (B, S, Ek), (B, S, Ev)
    hq = scorer.w_q(query).unsqueeze(-2)  # (B, L, 1, h)
    hk = scorer.w_k(key).unsqueeze(-3)  # (B, 1, S, h)
    scores = scorer.w(torch.tanh(hq + hk)).squeeze(-1)  # (B, L, S, 1) -> (B, L, S)
    scores = scores.masked_fill(~mask, float("-inf"))  # True = may attend
    weights = torch.softmax(scores, dim=-1)  # (B, L, S)
    return weights @ value, weights  # (B, L, Ev), (B, L, S)

answer = additive_attention
''',
    "check_general_score": '''
def general_score(query, key, W):  # (..., L, Eq), (..., S, Ek), W (Eq, Ek)
    return query @ W @ key.transpose(-2, -1)  # (..., L, S)

answer = general_score
''',
}

CH3_MISTAKES = [
    ("check_masked_additive_attention", [('scores = scores.masked_fill(~mask, float("-inf"))', "")],
     "mask is not applied"),
    ("check_masked_additive_attention", [("masked_fill(~mask", "masked_fill(mask")], "polarity"),
    ("check_masked_additive_attention", [("dim=-1)  # (B, L, S)", "dim=-2)  # (B, L, S)")],
     "over the queries"),
    ("check_masked_additive_attention", [('scores = scores.masked_fill(~mask, float("-inf"))', ""),
                                         ("weights = torch.softmax(scores, dim=-1)",
                                          "weights = torch.softmax(scores, dim=-1) * mask")],
     "zeroed after the softmax"),
    ("check_masked_additive_attention", [("torch.tanh(hq + hk)", "hq + hk")], "no tanh"),
    ("check_masked_additive_attention", [("scorer.w_k(key)", "(key @ scorer.w_k.weight.T)")],
     "bias of W_k"),
    ("check_masked_additive_attention", [("hq = scorer.w_q(query).unsqueeze(-2)",
                                          "hq = scorer.w_q(query).unsqueeze(-3)"),
                                         ("hk = scorer.w_k(key).unsqueeze(-3)",
                                          "hk = scorer.w_k(key).unsqueeze(-2)")], "transposed"),
    ("check_masked_additive_attention", [(".squeeze(-1)  #", ".squeeze(-1) / 8 ** 0.5  #")],
     "not scaled"),
    ("check_masked_additive_attention", [("return weights @ value, weights",
                                          "return weights @ value")], "return (output, weights)"),
    ("check_masked_additive_attention", [("return weights @ value, weights",
                                          "return weights @ value.flip(-2), weights")],
     "weights are right but the output is not"),
    ("check_masked_additive_attention", [("scores = scorer.w(torch.tanh(hq + hk)).squeeze(-1)",
                                          "scores = scorer(query, key)")], "build the scores"),
    ("check_general_score", [("query @ W @ key", "query @ W.T @ key")], "W is used transposed"),
    ("check_general_score", [("query @ W @ key.transpose(-2, -1)",
                              "(query @ W @ key.transpose(-2, -1)).transpose(-2, -1)")],
     "scores are transposed"),
    ("check_general_score", [("query @ W @ key.transpose(-2, -1)",
                              "key @ W.T @ query.transpose(-2, -1)")], "transposed"),
    ("check_general_score", [("query @ W @ key.transpose(-2, -1)",
                              "query @ W @ key.transpose(-2, -1) / query.shape[-1] ** 0.5")],
     "square root of the width"),
    ("check_general_score", [("query @ W @ key.transpose(-2, -1)",
                              "query @ W @ key.transpose(-2, -1) / key.shape[-1] ** 0.5")],
     "square root of the width"),
    ("check_general_score", [("key.transpose(-2, -1)", "key.T")], "transpose only the last two"),
    ("check_masked_additive_attention", [('masked_fill(~mask, float("-inf"))',
                                          "masked_fill(mask, -1e9)")], "polarity"),
    ("check_masked_additive_attention", [('masked_fill(~mask, float("-inf"))',
                                          "masked_fill(~mask, 0.0)")], "set to 0"),
    ("check_masked_additive_attention", [('scores = scores.masked_fill(~mask, float("-inf"))',
                                          "scores = scores * mask")], "set to 0"),
    ("check_masked_additive_attention", [("return weights @ value, weights",
                                          "return weights, weights @ value")], "in that order"),
]


def ch3_run(name, edits=()):
    code = CH3_SOLUTIONS[name]
    for old, new in edits:
        assert old in code, (name, old)
        code = code.replace(old, new)
    return run(code)


@pytest.mark.parametrize("name", CH3_SOLUTIONS)
def test_chapter_3_solutions_pass_and_leave_the_random_state_alone(name, capsys):
    state = torch.random.get_rng_state()
    ok, out = verdict(capsys, name, ch3_run(name))
    assert ok is True, out
    assert torch.equal(torch.random.get_rng_state(), state)
    assert "build-it exercise" in CHECKERS[name].__doc__.split(":")[0]


@pytest.mark.parametrize("name", CH3_SOLUTIONS)
@pytest.mark.parametrize("blank", ["none", "returns_none", "raises"])
def test_chapter_3_blank_answers_fail_without_raising(name, blank, capsys):
    answer = {"none": None,
              "returns_none": run("def answer(*args):\n    return None\n"),
              "raises": run("def answer(*args):\n    raise NotImplementedError('your code here')\n")}
    ok, out = verdict(capsys, name, answer[blank])
    assert ok is False and out.startswith("✗ Not yet: ")
    assert "raised NotImplementedError" in out if blank == "raises" else "raised" not in out


@pytest.mark.filterwarnings("ignore:The use of `x.T`:UserWarning")  # the .T mistake, on purpose
@pytest.mark.parametrize(("name", "edits", "hint"), CH3_MISTAKES,
                         ids=[f"{m[0]}-{m[2][:30]}" for m in CH3_MISTAKES])
def test_chapter_3_typical_mistakes_get_their_hint(name, edits, hint, capsys):
    ok, out = verdict(capsys, name, ch3_run(name, edits))
    assert ok is False
    assert hint in out, out


def test_chapter_3_masked_additive_checker_uses_every_key_the_mask_keeps():
    # the right weights over the keys kept, but a fully uniform row elsewhere: caught
    def half_right(query, key, value, mask, scorer):
        weights = mask.expand(query.shape[0], query.shape[1], key.shape[1]).float()
        weights = weights / weights.sum(-1, keepdim=True)  # uniform over the kept keys
        return weights @ value, weights

    assert single_head.check_masked_additive_attention(half_right) is False


# Chapter 4's measured exercises: each answer is a power of two that the checker measures itself
@pytest.mark.parametrize(("name", "right", "too_small", "too_large", "hints"), [
    ("check_saturation_width", 128, 64, 256, ("go wider", "smaller")),
    ("check_gradient_crossover", 128, 64, 256, ("go wider", "smaller widths")),
])
def test_chapter_4_measured_answers(name, right, too_small, too_large, hints, capsys):
    check = CHECKERS[name]
    assert check(right) is True
    for answer in (None, "128", 3, 100.0, 0, True):
        assert check(answer) is False  # a blank, not a number, or not a power of two
    assert check(too_small) is False
    assert hints[0] in capsys.readouterr().out
    assert check(too_large) is False
    assert hints[1] in capsys.readouterr().out


def test_chapter_4_checkers_agree_with_the_measurement_they_ask_for():
    from selfattn.book import single_head

    widths = [2**i for i in range(1, 13)]
    width = next(d for d in widths if single_head.median_top_weight(d, 64) > 0.9)
    assert single_head.check_saturation_width(width) is True

    ratio = single_head.query_gradient_ratio
    assert single_head.check_gradient_crossover(next(d for d in widths if ratio(d) > 1)) is True


@pytest.mark.parametrize("name", RIGHT)
def test_a_right_online_softmax_written_another_way_passes(name, capsys):
    assert selfattn.book.performance.check_online_softmax(run(RIGHT[name])) is True
    assert "Correct" in capsys.readouterr().out



@pytest.mark.parametrize("almost", [1e-6, 1e-4, -1e-9, 0.5])
def test_uniform_scale_takes_only_zero_and_prints_the_spread(almost, capsys):
    """A scale near 0 gives nearly uniform weights, not uniform ones whatever q and k are: it
    fails, and the hint prints the spread, not two equal-looking rounded weights."""
    assert single_head.check_uniform_scale(almost) is False
    out = " ".join(capsys.readouterr().out.split())  # the hint is wrapped
    assert "spread over" in out and "every score is 0" not in out
    assert "0.200 to 0.200" not in out
    assert single_head.check_uniform_scale(0) is True and single_head.check_uniform_scale(0.0) is True
    assert "every score is 0" in capsys.readouterr().out


def test_chapter_4_query_gradient_ratio_is_the_median_over_draws():
    from selfattn.book import single_head

    def one(d, seed):
        s = single_head.attention_gradients(d, True, seed=seed)
        u = single_head.attention_gradients(d, False, seed=seed)
        return (s.at_q.median() / u.at_q.median()).item()

    draws = [one(128, 1000 + 128 + 100_003 * i) for i in range(5)]
    assert single_head.query_gradient_ratio(128) == pytest.approx(sorted(draws)[2])
    assert single_head.query_gradient_ratio(64, 1) == pytest.approx(one(64, 1064))
    # the crossover, away from the draw: below one at 64, above at 128
    assert single_head.query_gradient_ratio(64) < 1 < single_head.query_gradient_ratio(128)


@pytest.mark.parametrize("body", [
    "return torch.einsum('lq,qk,sk->ls', query, W, key)",  # no batch axes: fails on the batch
    "return torch.stack([q @ W @ k.T for q, k in zip(query, key)])",  # 2-D only, then unbind
])
def test_chapter_3_general_score_gives_the_transpose_hint_only_for_its_error(body, capsys):
    code = f"def general_score(query, key, W):\n    {body}\n\nanswer = general_score\n"
    ok, out = verdict(capsys, "check_general_score", run(code))
    assert ok is False and "reverses every axis" not in out, out


@pytest.mark.parametrize("answer, hint", [
    (80 * 2 * 8 * 128 * 2, None),
    (80 * 8 * 128 * 2, "keys or the values"),
    (80 * 2 * 64 * 128 * 2, "query heads"),
    (2 * 8 * 128 * 2, "one layer"),
    (80 * 2 * 8 * 128 * 4, "4 bytes"),
    (12345, "is not it"),
    (None, "set the answer"),
])
def test_chapter_11_model_cache_bytes(answer, hint, capsys):
    passed = decoding.check_model_cache_bytes(answer)
    out = capsys.readouterr().out
    assert passed is (hint is None)
    if hint is None:
        assert "320 KiB" in out
    else:
        assert hint in out


def test_a_count_checker_names_the_first_case_it_fails_and_the_mistake_it_matches():
    from selfattn.book.kit.checkers import NotYet, same_as

    def area(w, h):
        return w * h

    same_as(lambda w, h: h * w, area, [(2, 3), (4, 5)], "unused")  # every case right: no verdict
    with pytest.raises(NotYet) as why:
        same_as(lambda w, h: w + h if w > 2 else w * h, area, [(2, 3), (4, 5)],
                "{args} ({case}): you say {got!r}, the area is {want}{hint}; w was {w}", names=("w", "h"),
                mistakes=[(lambda w, h: 2 * (w + h), " (the perimeter)"), (lambda w, h: w + h, " (a sum)")])
    assert str(why.value) == "w=4, h=5 ((4, 5)): you say 9, the area is 20 (a sum); w was 4"
    with pytest.raises(NotYet, match="your function, given \\(1, 1\\), raised ZeroDivisionError"):
        same_as(lambda w, h: 1 / 0, area, [(1, 1)], "{got}")
