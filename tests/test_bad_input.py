"""Bad input gets a ValueError/TypeError that names the argument and the shapes it saw."""

import pytest
import torch

import selfattn
from selfattn.positional import LearnedPositionalEmbedding, apply_rope, sinusoidal_encoding

sdpa = selfattn.scaled_dot_product_attention
MHA = selfattn.MultiHeadAttention
q = torch.randn(2, 4, 8)
kv = torch.randn(2, 6, 8)
x = torch.randn(2, 5, 16)

CASES = [
    # (id, call, exception, words the message must contain)
    ("query not a tensor", lambda: sdpa([[1.0]], kv, kv), TypeError, ["query", "list"]),
    ("query of rank 1", lambda: sdpa(torch.randn(8), kv, kv), ValueError, ["query", "(8,)"]),
    ("integer query", lambda: sdpa(q.long(), kv, kv), TypeError, ["query", "int64"]),
    ("E of query and key differ", lambda: sdpa(q, torch.randn(2, 6, 5), kv), ValueError,
     ["query", "key", "(2, 4, 8)", "(2, 6, 5)"]),
    ("S of key and value differ", lambda: sdpa(q, kv, torch.randn(2, 5, 8)), ValueError,
     ["key", "value", "(2, 6, 8)", "(2, 5, 8)"]),
    ("batch sizes do not broadcast", lambda: sdpa(q, torch.randn(3, 6, 8), torch.randn(3, 6, 8)),
     ValueError, ["batch", "(2, 4, 8)", "(3, 6, 8)"]),
    ("dtypes differ", lambda: sdpa(q, kv.double(), kv), TypeError,
     ["query", "key", "float32", "float64"]),
    ("mask does not broadcast", lambda: sdpa(q, kv, kv, attn_mask=torch.ones(4, 5, dtype=torch.bool)),
     ValueError, ["attn_mask", "(4, 5)", "(2, 4, 6)"]),
    ("float-typed boolean mask", lambda: sdpa(q, kv, kv, attn_mask=torch.ones(4, 6).tril()),
     TypeError, ["attn_mask", "0 and 1", "bool"]),
    ("integer mask", lambda: sdpa(q, kv, kv, attn_mask=torch.ones(4, 6, dtype=torch.long)),
     TypeError, ["attn_mask", "int64"]),
    ("negative dropout", lambda: sdpa(q, kv, kv, dropout_p=-0.1), ValueError, ["dropout_p", "-0.1"]),
    ("d_model not divisible by n_heads", lambda: MHA(10, 3), ValueError,
     ["d_model", "10", "n_heads", "3"]),
    ("n_heads not a multiple of n_kv_heads", lambda: MHA(16, 4, n_kv_heads=3), ValueError,
     ["n_heads", "4", "n_kv_heads", "3"]),
    ("zero heads", lambda: MHA(16, 0), ValueError, ["n_heads", "0"]),
    ("module dropout above 1", lambda: MHA(16, 4, dropout_p=1.5), ValueError, ["dropout_p", "1.5"]),
    ("module input of rank 2", lambda: MHA(16, 4)(torch.randn(5, 16)), ValueError,
     ["query", "(5, 16)"]),
    ("module input of the wrong width", lambda: MHA(16, 4)(torch.randn(2, 5, 12)), ValueError,
     ["query", "16", "(2, 5, 12)"]),
    ("key width is not kdim", lambda: MHA(16, 4, kdim=8)(x, torch.randn(2, 5, 16)), ValueError,
     ["key", "8", "(2, 5, 16)"]),
    ("key batch differs from query", lambda: MHA(16, 4)(x, torch.randn(3, 5, 16)), ValueError,
     ["batch", "(2, 5, 16)", "(3, 5, 16)"]),
    ("module mask does not broadcast to (B, H, L, S)",
     lambda: MHA(16, 4)(x, attn_mask=torch.ones(3, 5, 5, dtype=torch.bool)), ValueError,
     ["attn_mask", "(3, 5, 5)", "(2, 4, 5, 5)"]),
    ("kv_cache of the wrong type", lambda: MHA(16, 4)(x, kv_cache={}), TypeError,
     ["kv_cache", "dict"]),
    ("padding lengths not 1-D", lambda: selfattn.padding_mask(torch.tensor([[3]])), ValueError,
     ["lengths", "(1, 1)"]),
    ("padding max_len too short", lambda: selfattn.padding_mask(torch.tensor([3, 5]), max_len=4),
     ValueError, ["max_len", "4", "5"]),
    ("odd head_dim with rope", lambda: MHA(18, 2, rope=True), ValueError, ["head_dim", "9", "even"]),
    ("odd width for sinusoidal", lambda: sinusoidal_encoding(4, 7), ValueError,
     ["d_model", "7", "even"]),
    ("position beyond the learned table",
     lambda: LearnedPositionalEmbedding(8, 4)(9), ValueError,
     ["position 8", "max_len=8"]),
    ("causal mask of zero length", lambda: selfattn.causal_mask(0), ValueError, ["L", "0"]),
    ("masked_softmax with a float 0/1 mask",
     lambda: selfattn.masked_softmax(torch.zeros(2, 3), torch.tensor([[1.0, 0.0, 1.0]])), TypeError,
     ["attn_mask", "0 and 1", "bool"]),
    ("masked_softmax mask does not broadcast",
     lambda: selfattn.masked_softmax(torch.zeros(2, 3), torch.ones(4, 3, dtype=torch.bool)),
     ValueError, ["attn_mask", "(4, 3)", "(2, 3)"]),
    ("split_heads: width not a multiple of n_heads",
     lambda: selfattn.split_heads(torch.zeros(2, 3, 10), 4), ValueError, ["10", "4 heads"]),
    ("split_heads of rank 2", lambda: selfattn.split_heads(torch.zeros(3, 10), 2), ValueError,
     ["(batch, seq, n_heads * head_dim)", "(3, 10)"]),
    ("merge_heads of rank 3", lambda: selfattn.merge_heads(torch.zeros(2, 3, 10)), ValueError,
     ["(batch, n_heads, seq, head_dim)", "(2, 3, 10)"]),
    ("a config built by position, not by keyword", lambda: selfattn.AttentionConfig(16, 4),
     TypeError, ["positional"]),
    ("repeat_kv zero times", lambda: selfattn.repeat_kv(torch.zeros(1, 2, 3, 4), 0), ValueError,
     ["n_rep", "0"]),
    ("rope: one position for five tokens", lambda: apply_rope(torch.randn(5, 8), torch.tensor([3])),
     ValueError, ["positions", "(1,)", "(5,)", "x", "(5, 8)"]),
    ("rope: four positions for five tokens", lambda: apply_rope(torch.randn(2, 5, 8), torch.arange(4)),
     ValueError, ["positions", "(4,)", "(5,)", "x", "(2, 5, 8)"]),
    ("rope: positions not 1-D", lambda: apply_rope(torch.randn(5, 8), torch.arange(5)[None]),
     ValueError, ["positions", "(1, 5)", "(5,)"]),
    ("rope: float positions", lambda: apply_rope(torch.randn(5, 8), torch.arange(5.0)), TypeError,
     ["positions", "integer", "float32"]),
    ("rope: positions on another device",
     lambda: apply_rope(torch.randn(5, 8, device="meta"), torch.arange(5)), ValueError,
     ["positions", "x", "cpu", "meta"]),
    ("rope: x not a tensor", lambda: apply_rope([[1.0, 2.0]]), TypeError, ["x", "list"]),
    ("rope: x of rank 1", lambda: apply_rope(torch.randn(8)), ValueError, ["x", "(8,)"]),
]


@pytest.mark.parametrize(("call", "exc", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_input_raises_a_clear_error(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} missing from: {message}"

