"""The library's cost contracts: what each public path may allocate, which operations it runs and
what it hands PyTorch's kernel. The other tests assert what the library returns; these assert
what it costs, so that a path can no longer be right and quadratic, or right and copying its
cache at every step.

Each contract is stated in the docstring of the code it holds for, and asserted here:

* ``MultiHeadAttention``, every head layout (MHA, GQA, MQA), self- and cross-attention, with and
  without a mask, a cache or autograd: a plain causal call with several new queries (a prefill, a
  training step) hands ``F.scaled_dot_product_attention`` ``is_causal=True`` and no mask tensor,
  with the key/value heads as they are (``enable_gqa``: never a copy per query head); a mask it
  builds is at most ``(L, S)`` per sequence, never one per head or per stacked query; one new
  token after a cache gets no mask at all. A causal prefill holds at most 3x the bytes of its q,
  k, v and attention output, never an ``(L, S)`` tensor.
* The caches: one decoding step writes the new token and allocates a small constant number of
  one token's bytes, whatever the window or the length (the rolling caches neither gather nor
  concatenate their window); ``PagedKVCache`` copies what it holds, once (its documented gather);
  ``KVCache`` grows by doubling.
* ``MultiHeadLatentAttention``: its absorbed decode reads the latent cache as it is (no copy per
  head, none per step); MLA takes every cache.
* ``tiled_attention`` never holds an ``(L, S)`` tensor, forward or backward (a mask's gradient
  is accumulated in the mask's own shape).
* With the weights, in float16 or bfloat16: one float32 copy of the keys a call reads.
* The fast paths: ``inplace_softmax`` holds one ``(L, S)`` buffer per head; ``grouped_heads`` and
  ``split_kv`` never copy the cache.
* The functional ``scaled_dot_product_attention`` returns the weights, so it holds ``(L, S)``
  tensors: at most four at once.
* ``check_mask``: the layer reads a mask's values only on a CPU (no device synchronisation);
  the functions that return the weights on every device.

Every contract here failed on the code before it was written down, for each defect it names
(the commits that added them say how that was checked). Each contract that holds on every device
takes the ``device`` fixture (tests/conftest.py): on a machine with a GPU its ``cuda`` rows run
too (``make gpu``), where what reaches the kernel may differ only as PyTorch's own checks say
(grouped heads copied where no fused kernel takes them). The paths that exist on a CPU only
(``inplace_softmax``, ``split_kv``) and the scan read on the meta device stay on the CPU.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import selfattn
from selfattn import fastpaths
from selfattn.cache import (
    BlockPool,
    KVCache,
    PagedKVCache,
    SinkCache,
    SlidingWindowCache,
)

F32 = 4  # bytes of a float32


# ---------------------------------------------------------------------------------------------
# instruments


@dataclass
class Spend:
    """What a call allocated: the peak of the bytes of tensor storage alive at once (beyond what
    existed before), the total of every storage it created, the largest single one, and how many
    times it ran each ``aten`` operation."""

    peak: int = 0
    total: int = 0
    largest: int = 0
    ops: Counter = field(default_factory=Counter)


class _Recorder(TorchDispatchMode):
    """Counts the bytes of every storage a torch operation creates while on, frees them when the
    last tensor on a storage is gone, keeps the peak; a view or an in-place result of a storage
    that existed before is no new memory."""

    def __init__(self) -> None:
        super().__init__()
        self.spend = Spend()
        self.live = 0
        self.users: dict[int, list] = {}

    def _release(self, key: int) -> None:
        entry = self.users[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.users[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.spend.ops[func.overloadpacket.__name__] += 1
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            key = t.untyped_storage().data_ptr()
            if key not in self.users and key in inputs:
                continue
            if key not in self.users:
                nbytes = t.untyped_storage().nbytes()
                self.users[key] = [0, nbytes]
                self.live += nbytes
                self.spend.total += nbytes
                self.spend.largest = max(self.spend.largest, nbytes)
                self.spend.peak = max(self.spend.peak, self.live)
            self.users[key][0] += 1
            weakref.finalize(t, self._release, key)
        return out


def spend(fn) -> Spend:
    """:class:`Spend` of one call of ``fn`` (its result dropped at the end)."""
    recorder = _Recorder()
    with recorder:
        result = fn()
    del result
    return recorder.spend


@dataclass
class SdpaCall:
    q: tuple
    k: tuple
    attn_mask: torch.Tensor | None
    is_causal: bool
    enable_gqa: bool
    fused: bool | None  # what fastpaths._fused_takes_groups said for this call (None: not asked)


@pytest.fixture
def sdpa_calls(monkeypatch) -> list[SdpaCall]:
    """Every call of ``F.scaled_dot_product_attention`` while the test runs: what it received,
    and whether the grouped heads' path asked PyTorch's checks if its fused kernels take grouped
    heads as they are (on CUDA the answer decides between ``enable_gqa`` and the copy)."""
    calls: list[SdpaCall] = []
    said: list[bool] = []
    real, fused = F.scaled_dot_product_attention, fastpaths._fused_takes_groups

    def spy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
            enable_gqa=False):
        calls.append(SdpaCall(tuple(query.shape), tuple(key.shape), attn_mask, is_causal,
                              enable_gqa, said.pop() if said else None))
        return real(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                    is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(fastpaths, "_fused_takes_groups", lambda c: said.append(fused(c)) or said[-1])
    return calls


def assert_heads_as_they_are(call: SdpaCall, n_kv: int, device: str) -> None:
    """GQA and MQA reach the kernel with their key/value heads as they are (``enable_gqa``): on
    a CPU always; on CUDA where PyTorch's own checks said a fused kernel takes them, else as the
    readable copy, one key/value head per query head (its math backend would hold the scores)."""
    if n_kv == H:
        assert call.k[1] == H and not call.enable_gqa, call
        return
    assert call.fused is not None and (call.fused or device != "cpu"), call
    assert (call.k[1], call.enable_gqa) == ((n_kv, True) if call.fused else (H, False)), call


# ---------------------------------------------------------------------------------------------
# what the layer hands PyTorch's kernel

D, H = 32, 4  # d_model and query heads of the layers here
LAYOUTS = {"mha": 4, "gqa": 2, "mqa": 1}
CACHES = {"kv": lambda n_kv, device: KVCache(capacity=4),
          "window": lambda n_kv, device: SlidingWindowCache(16),
          "sink": lambda n_kv, device: SinkCache(2, 14),
          "paged": lambda n_kv, device: PagedKVCache(BlockPool(8, 8, n_kv, D // H, device=device))}


def layer(layout: str, device: str = "cpu", **kwargs) -> selfattn.MultiHeadAttention:
    torch.manual_seed(0)
    return selfattn.MultiHeadAttention(D, H, n_kv_heads=LAYOUTS[layout], **kwargs).to(device)


def grad_mode(grad: str):
    return torch.no_grad() if grad == "off" else contextlib.nullcontext()


@pytest.mark.parametrize("grad", ["off", "on"])
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_causal_prefill_reaches_the_kernel_as_is_causal_with_no_mask(sdpa_calls, layout,
                                                                      training, grad, device):
    """A prefill or a training step: several new queries, causal, no mask given. On every head
    layout SDPA gets is_causal=True and no mask tensor, and grouped key/value heads as they are
    (before: GQA and MQA stacked their query heads and built a (g*L, S) bool mask)."""
    m = layer(layout, device, dropout_p=0.1).train(training)
    x = torch.randn(2, 24, D, device=device, requires_grad=grad == "on")
    with grad_mode(grad):
        out, _ = m(x, is_causal=True)
    if grad == "on":
        out.sum().backward()
    (call,) = sdpa_calls
    assert call.is_causal and call.attn_mask is None, call
    assert call.q == (2, H, 24, D // H) and call.k[2:] == (24, D // H), call
    assert_heads_as_they_are(call, LAYOUTS[layout], device)


@pytest.mark.parametrize("grad", ["off", "on"])
@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_prompt_into_an_empty_cache_is_causal_then_a_chunk_gets_the_caches_mask(
        sdpa_calls, layout, cache, grad, device):
    """Into an empty cache that keeps it whole, a prompt is a plain causal call; a chunk of
    several tokens after it gets the cache's (T, S) bool mask, one for every head, and one new
    token gets no mask at all."""
    m = layer(layout, device)
    c = CACHES[cache](LAYOUTS[layout], device)
    x = torch.randn(1, 13, D, device=device, requires_grad=grad == "on")
    with grad_mode(grad):
        m(x[:, :8], is_causal=True, kv_cache=c)  # a prompt that every cache here keeps whole
        m(x[:, 8:12], is_causal=True, kv_cache=c)  # a chunk of 4
        m(x[:, 12:], is_causal=True, kv_cache=c)  # one token
    prompt, chunk, step = sdpa_calls
    assert prompt.is_causal and prompt.attn_mask is None, prompt
    assert not chunk.is_causal and chunk.attn_mask is not None
    assert chunk.attn_mask.dtype == torch.bool and chunk.attn_mask.shape[-2:] == (4, chunk.k[2])
    assert chunk.attn_mask.numel() == 4 * chunk.k[2]  # (T, S): not per head, not per query head
    assert not step.is_causal and step.attn_mask is None, step
    for call in (prompt, chunk):  # the grouped heads reach the kernel as they are
        assert_heads_as_they_are(call, LAYOUTS[layout], device)


@pytest.mark.parametrize("mask", ["padding", "float"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_mask_given_is_folded_with_the_causal_one_at_its_own_size(sdpa_calls, layout, mask,
                                                                    device):
    """A padding mask (B, 1, 1, S) with is_causal: SDPA gets one mask of (B, 1, L, S), the two
    folded; a float mask keeps its shape. Never multiplied by the heads or the group."""
    m = layer(layout, device)
    B, L = 2, 12
    keep = torch.ones(B, 1, 1, L, dtype=torch.bool, device=device)
    keep[1, ..., 9:] = False
    given = keep if mask == "padding" else torch.zeros(B, 1, L, L, device=device).masked_fill(
        ~keep, float("-inf"))
    with torch.no_grad():
        m(torch.randn(B, L, D, device=device), attn_mask=given, is_causal=True)
    (call,) = sdpa_calls
    assert not call.is_causal and call.attn_mask is not None
    assert call.attn_mask.numel() == B * L * L, call.attn_mask.shape
    assert_heads_as_they_are(call, LAYOUTS[layout], device)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cross_attention_hands_the_kernel_no_mask(sdpa_calls, layout, is_causal, device):
    m = layer(layout, device)
    with torch.no_grad():
        m(torch.randn(2, 5, D, device=device), torch.randn(2, 9, D, device=device),
          is_causal=is_causal)
    (call,) = sdpa_calls
    assert call.attn_mask is None and call.is_causal == is_causal and call.k[2:] == (9, 8), call
    assert_heads_as_they_are(call, LAYOUTS[layout], device)


def test_a_cache_refuses_a_key_of_its_own():
    """Cross-attention through a kv_cache appended the memory again at every step (its length
    35 after 5 steps over a memory of 7); the outputs stayed right, so only its cost showed."""
    m, cache = layer("gqa"), KVCache()
    memory = torch.randn(1, 7, D)
    with pytest.raises(ValueError, match="self-attention"):
        m(torch.randn(1, 1, D), memory, memory, kv_cache=cache)
    assert cache.length == 0


# ---------------------------------------------------------------------------------------------
# what a prefill holds


def attention_bytes(B: int, L: int, n_heads: int, n_kv_heads: int, head_dim: int) -> int:
    """Bytes of a layer's q, k, v and attention output, float32."""
    return B * L * head_dim * (2 * n_heads + 2 * n_kv_heads) * F32


@pytest.mark.parametrize("n_kv_heads", [8, 2, 1])
def test_a_causal_prefill_holds_no_score_matrix(n_kv_heads, device):
    """MQA at L = 1024 with 8 heads of 4: its (L, S) scores would be 4 MiB a head; the layer
    holds at most 3x its q, k, v and attention output (before: a (g*L, S) bool mask, 8 MiB for
    MQA, turned into a float one inside SDPA), and copies no key/value head where PyTorch's
    kernel takes them as they are (the copy, with grouped_heads off, is the control)."""
    B, L, hd = 1, 1024, 4
    torch.manual_seed(0)
    m = selfattn.MultiHeadAttention(8 * hd, 8, n_kv_heads=n_kv_heads).to(device).eval()
    x = torch.randn(B, L, 8 * hd, device=device)
    q, k, v = (torch.randn(B, n, L, hd, device=device) for n in (8, n_kv_heads, n_kv_heads))
    fused = n_kv_heads < 8 and fastpaths._fused_takes_groups(fastpaths.Call.of(q, k, v, is_causal=True))
    with torch.no_grad():
        cost = spend(lambda: m(x, is_causal=True))
        fast = spend(lambda: fastpaths.attend_heads(q, k, v, is_causal=True))
        with fastpaths.disabled("grouped_heads"):
            copied = spend(lambda: m(x, is_causal=True))
    budget = attention_bytes(B, L, 8, n_kv_heads, hd)
    copies = 0 if fused or n_kv_heads == 8 else 2 * B * 8 * L * hd * F32  # CUDA, where refused
    assert cost.peak <= 3 * budget + 2 * x.nbytes + copies, (cost.peak, budget)
    assert cost.largest < L * L, cost.largest  # not even one (L, S) bool
    assert fast.total <= B * 8 * L * (hd + 1) * F32 + copies, fast.total  # the output, its lse
    if n_kv_heads < 8:  # repeat_kv's copy shows as two clones of the (B, H, S, hd) keys, values
        assert copied.ops["clone"] == 2, copied.ops
        assert cost.ops["clone"] == (0 if fused else 2), cost.ops


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_training_step_saves_no_score_matrix(layout, device):
    """With autograd: what a causal training step keeps for backward grows as L, not L*S: the
    input, the projections, the attention's output and log-sum-exp, about 5x the input's bytes
    (MHA, d_model 32), at 512 tokens and at 1024 alike."""
    from selfattn.book.kit.measure import saved_tensor_bytes

    m = layer(layout, device).train()
    for L in (512, 1024):
        x = torch.randn(1, L, D, device=device, requires_grad=True)
        saved = saved_tensor_bytes(lambda x=x: m(x, is_causal=True)[0])
        assert saved <= 6 * x.nbytes, (L, saved / x.nbytes)


# ---------------------------------------------------------------------------------------------
# a decoding step, on every cache


def decode_spend(make, window: int, layout: str = "mha", d_model: int = 64, heads: int = 4,
                 steps: int = 3, prompt: int | None = None,
                 device: str = "cpu") -> tuple[list[Spend], object]:
    """:class:`Spend` of ``steps`` decoding steps of one token each, no grad, after a prompt that
    fills the cache past its window."""
    torch.manual_seed(0)
    n_kv_heads = {"mha": heads, "gqa": 2, "mqa": 1}[layout]
    m = selfattn.MultiHeadAttention(d_model, heads, n_kv_heads=n_kv_heads).to(device).eval()
    cache = make(window)
    prompt = window + 5 if prompt is None else prompt
    with torch.no_grad():
        m(torch.randn(1, prompt, d_model, device=device), is_causal=True, kv_cache=cache)
        out = [spend(lambda: m(torch.randn(1, 1, d_model, device=device), is_causal=True,
                               kv_cache=cache)) for _ in range(steps)]
    return out, cache


ROLLING = {"window": SlidingWindowCache, "sink": lambda w: SinkCache(4, w)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ROLLING)
def test_a_rolling_cache_decodes_without_copying_its_window(kind, layout, device):
    """One decoding step allocates a small constant times one token's bytes, the same at a window
    of 64 and of 512, neither gathering nor concatenating the window (before: a gather and a
    cat of the whole window, 1.5x what the cache holds, at every step)."""
    token = 64 * F32  # one token's query (d_model = 64); its k, v and output are no larger
    costs = {}
    for window in (64, 512):
        steps, cache = decode_spend(ROLLING[kind], window, layout, device=device)
        costs[window] = steps
        for s in steps:
            assert "cat" not in s.ops and "index" not in s.ops and "index_put_" not in s.ops, s.ops
            assert s.total <= 24 * token, (window, s.total)
            assert s.total <= cache.nbytes / 4
    assert [s.total for s in costs[64]] == [s.total for s in costs[512]]  # whatever the window


@pytest.mark.parametrize("kind", ROLLING)
def test_a_rolling_cache_moves_a_masks_columns_not_its_window(kind, device):
    """A padding mask (B, 1, 1, S), given by position, meets keys in the order of the ring's
    slots: the step gathers the mask's columns (B*S booleans, and the (S,) order), never the
    window's keys and values (before: the mask was applied to the wrong keys)."""
    torch.manual_seed(0)
    B, window = 2, 512
    m = selfattn.MultiHeadAttention(64, 4).to(device).eval()
    cache = ROLLING[kind](window)
    with torch.no_grad():
        m(torch.randn(B, window + 5, 64, device=device), is_causal=True, kv_cache=cache)
        S = cache.size_after(1)
        keep = torch.ones(B, 1, 1, S, dtype=torch.bool, device=device)
        keep[1, ..., :3] = False
        s = spend(lambda: m(torch.randn(B, 1, 64, device=device), is_causal=True, kv_cache=cache,
                            attn_mask=keep))
    assert "cat" not in s.ops and s.ops["index"] == 1, s.ops  # one gather: the mask's
    keys = cache.nbytes // 2  # the window's keys: what a copy of them would allocate
    assert s.largest <= S * 8 < keys / 32, s.largest  # (S,) integers: the order, its inverse
    assert s.total <= cache.nbytes / 8, (s.total, cache.nbytes)


def test_a_rolling_cache_still_orders_its_window_for_a_chunk_and_under_autograd(device):
    """What the fast step leaves to the ordered one: a chunk (it needs the band mask) and a step
    that autograd records (writing into saved views would invalidate them): both copy the window,
    as documented, and no more than once."""
    torch.manual_seed(0)
    m = selfattn.MultiHeadAttention(64, 4).to(device).eval()
    cache = SlidingWindowCache(64)
    m(torch.randn(1, 70, 64, device=device), is_causal=True, kv_cache=cache)
    with torch.no_grad():
        chunk = spend(lambda: m(torch.randn(1, 3, 64, device=device), is_causal=True,
                                kv_cache=cache))
    step = spend(lambda: m(torch.randn(1, 1, 64, device=device), is_causal=True,
                           kv_cache=cache))  # grad on
    for s in (chunk, step):
        assert s.ops["cat"] == 3 and s.total <= 4 * cache.nbytes, s


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_contiguous_cache_step_copies_one_token(layout, device):
    steps, _ = decode_spend(lambda w: KVCache(capacity=1024), 64, layout, device=device)
    for s in steps:
        assert "cat" not in s.ops and s.ops["copy_"] == 2, s.ops  # the token's k and v, written
        assert s.total <= 24 * 64 * F32, s.total


def test_a_contiguous_cache_doubles_rarely():
    """From capacity 2, 100 tokens one at a time: the buffers grow 6 times (to 128), each time
    copying what they hold, so the bytes copied stay under twice the final cache."""
    cache, grown = KVCache(capacity=2), 0
    with torch.no_grad():
        for _ in range(100):
            before = cache.allocated_bytes
            cache.append(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8))
            grown += cache.allocated_bytes != before and before > 0
    assert grown == 6 and cache.allocated_bytes == 2 * 2 * 128 * 8 * F32


def test_a_paged_cache_copies_what_it_holds_once(device):
    """The readable paged cache gathers its blocks into one tensor at every step (documented: a
    real kernel reads them in place): a step allocates the sequence's keys and values once, plus
    a token's worth, never the pool."""
    pool = BlockPool(64, 16, 4, 16, device=device)  # 1024 tokens of room; the sequence uses 69
    steps, cache = decode_spend(lambda w: PagedKVCache(pool), 64, device=device)
    for s in steps:
        # plus a token's worth, and the positions' block and slot (a few integers a token)
        assert s.total <= cache.nbytes + 24 * 64 * F32 + 64 * cache.length, (s.total, cache.nbytes)


@pytest.mark.parametrize("layout", ["gqa", "mqa"])
def test_grouped_heads_decode_without_copying_the_cache(layout, device):
    """GQA and MQA decode one token with the group's query heads stacked: no copy of the cache
    per query head (repeat_kv would move as many bytes as MHA's whole cache: two clones, which
    the same step with grouped_heads off shows)."""
    steps, _ = decode_spend(lambda w: KVCache(capacity=1024), 512, layout, device=device)
    with fastpaths.disabled("grouped_heads"):
        copied, _ = decode_spend(lambda w: KVCache(capacity=1024), 512, layout, device=device)
    for s, control in zip(steps, copied, strict=True):
        assert "clone" not in s.ops and s.total <= 24 * 64 * F32, s
        assert control.ops["clone"] == 2 and control.total > 512 * 16 * F32, control


@pytest.mark.parametrize("layout", ["mha", "mqa"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_a_decoding_step_with_the_weights_upcasts_the_keys_once_in_half_precision(dtype, layout,
                                                                                  device):
    """The weights asked for at a decoding step: the scores are computed in float32, so a float16
    or bfloat16 layer reads one float32 copy of the cached keys, twice their bytes, at every step
    (documented in MultiHeadAttention.forward), and nothing else of the cache's size: not the
    values, not a copy per query head. A float32 layer copies nothing."""
    torch.manual_seed(0)
    n_kv = LAYOUTS[layout]
    m = selfattn.MultiHeadAttention(64, 4, n_kv_heads=n_kv).to(device, dtype).eval()
    cache = KVCache(capacity=1100)
    with torch.no_grad():
        m(torch.randn(1, 1000, 64, dtype=dtype, device=device), is_causal=True, kv_cache=cache)
        s = spend(lambda: m(torch.randn(1, 1, 64, dtype=dtype, device=device), is_causal=True,
                            kv_cache=cache, need_weights=True))
    keys = cache.length * n_kv * 16 * F32  # the cached keys in float32
    weights = 4 * cache.length * F32
    if dtype == torch.float32:
        assert s.largest <= weights, s.largest
    else:
        assert s.largest == keys, (s.largest, keys)
        # the scores, the weights in place (a CPU) or beside them, and their cast
        assert s.total <= keys + 3 * weights + 64 * 64, (s.total, keys)


def test_split_kv_never_copies_the_cache(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    q, k = torch.randn(1, 1, 4, 16), torch.randn(1, 1, 8192, 16)
    with torch.no_grad():
        s = spend(lambda: fastpaths.decode_attention(q, k, k))
    assert s.ops["_scaled_dot_product_flash_attention_for_cpu"] == 1  # the parts, in one call
    assert s.total < k.nbytes / 8, s.total


# ---------------------------------------------------------------------------------------------
# MLA


def test_mla_absorbed_decode_reads_the_latents_as_they_are(device):
    """A decoding step of the absorbed form, batch 2, 8 heads: no tensor as large as the latent
    cache (before: the latents and rope keys concatenated into one key at every step, then
    broadcast over the heads by a copy per head)."""
    torch.manual_seed(0)
    mla = selfattn.MultiHeadLatentAttention(64, 8, 16, kv_rank=32, rope_dim=8).to(device).eval()
    cache = KVCache(capacity=2048)
    with torch.no_grad():
        mla(torch.randn(2, 1000, 64, device=device), is_causal=True, kv_cache=cache)
        s = spend(lambda: mla(torch.randn(2, 1, 64, device=device), is_causal=True,
                              kv_cache=cache, absorb=True))
    assert s.largest < cache.nbytes / 2, (s.largest, cache.nbytes)
    assert "cat" not in s.ops, s.ops


@pytest.mark.parametrize("make", [
    lambda: KVCache(), lambda: SlidingWindowCache(4), lambda: SinkCache(1, 4),
    lambda: PagedKVCache(BlockPool(8, 4, 1, 16, value_dim=0, dtype=torch.float64))])
def test_mla_without_rope_takes_every_cache(make):
    """MLA without RoPE caches latents as keys and nothing as values: a paged pool of value_dim 0
    holds them (before: 'value_dim must be positive')."""
    torch.manual_seed(0)
    mla = selfattn.MultiHeadLatentAttention(32, 4, 8, kv_rank=16).double().eval()
    x = torch.randn(1, 9, 32, dtype=torch.float64)
    cache = make()
    steps = torch.cat([mla(x[:, t : t + 1], is_causal=True, kv_cache=cache, absorb=True)
                       for t in range(9)], dim=1)
    window = {"SlidingWindowCache": {"window": 4}, "SinkCache": {"window": 4, "n_sink": 1}}.get(
        type(cache).__name__, {})
    q_rope, k_rope = mla._rope_parts(x, torch.arange(9))  # zero wide: no RoPE
    full = mla._explicit(x, q_rope, mla.kv_down(x)[:, None], k_rope,
                         selfattn.causal_mask(9, **window), False)
    torch.testing.assert_close(steps, full)


# ---------------------------------------------------------------------------------------------
# tiled attention, the fast paths, the functional form, the checks


@pytest.mark.parametrize("is_causal", [False, True])
def test_tiled_attention_holds_tiles_not_scores(is_causal, device):
    q = torch.randn(1, 2, 1024, 16, device=device)
    scores = 2 * 1024 * 1024 * F32
    with torch.no_grad():
        s = spend(lambda: selfattn.tiled_attention(q, q, q, is_causal=is_causal, block_size=128))
    assert s.peak < scores / 8 and s.largest < scores / 16, (s.peak, s.largest)
    q.requires_grad_()
    key_bias = torch.zeros(1, 1, 1, 1024, device=device, requires_grad=True)  # a learned bias
    for mask in (None, key_bias):
        out = selfattn.tiled_attention(q, q, q, mask, is_causal=is_causal, block_size=128)
        backward = spend(lambda out=out: out.sum().backward())
        # before: the bias's gradient was accumulated in a (L, S) tensor, 1.2x the scores' bytes
        assert backward.peak < scores / 8, (mask is None, backward.peak / scores)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_inplace_softmax_holds_one_buffer_of_scores(layout):
    """The weights asked for, no grad: one (B, H, L, S) buffer is the scores, the masked scores
    and the weights; the causal rule is one (L, S) of floats and two of bools, whatever the head
    layout (before: GQA and MQA stacked their query heads and regrouped the mask per group,
    (g*L, S) bools twice, and ran slower than copying their key/value heads)."""
    m = layer(layout).eval()
    L = 512
    x = torch.randn(1, L, D)
    weights = H * L * L * F32
    with torch.no_grad():
        s = spend(lambda: m(x, is_causal=True, need_weights=True))
        with fastpaths.disabled("inplace_softmax"):
            readable = spend(lambda: m(x, is_causal=True, need_weights=True))
    masks = L * L * (F32 + 2)  # the causal rule: never one per head or per stacked query
    activations = 8 * x.nbytes  # the projections, the output, the copied keys: (B, L, d) each
    assert s.peak <= weights + masks + activations, (s.peak - weights, masks + activations)
    assert s.largest == weights, s.largest
    assert readable.peak > 2 * weights  # what the path saves


def test_the_functional_form_holds_at_most_four_score_matrices(device):
    """The readable path returns the weights: it holds the scores, the masked scores, the
    weights and one step between, at most four (..., L, S) tensors at once; never a copy per
    head of a mask given once."""
    q = torch.randn(2, 4, 256, 16, device=device)
    weights = 2 * 4 * 256 * 256 * F32
    with torch.no_grad():
        for kwargs in ({}, {"is_causal": True},
                       {"attn_mask": torch.rand(256, 256, device=device) > 0.2, "is_causal": True}):
            s = spend(lambda kwargs=kwargs: selfattn.scaled_dot_product_attention(q, q, q, **kwargs))
            assert s.peak <= 4.2 * weights, (kwargs.keys(), s.peak / weights)


def test_the_layer_reads_a_masks_values_on_a_cpu_only_the_functions_everywhere():
    """The 0/1 scan of a float mask reads its values. The layer's forward does it only on a CPU
    (on a GPU the read would wait for the device at every call); the functions that return the
    weights do it on every device (before: on a CPU only, so chapter 2's cell, a 0/1 float mask
    given to scaled_dot_product_attention on pick_device(), stopped raising on a GPU). The meta
    device stands for a GPU: it has no values, so the read is seen as an aminmax there, then an
    error."""
    from selfattn.checks import check_mask

    q = torch.randn(1, 2, 4, 8, device="meta")
    mask = torch.zeros(4, 4, device="meta")
    for function in (lambda: selfattn.scaled_dot_product_attention(q, q, q, attn_mask=mask),
                     lambda: selfattn.masked_softmax(q @ q.mT, mask)):
        recorder = _Recorder()
        with recorder, pytest.raises((RuntimeError, NotImplementedError)):
            function()  # meta tensors hold no values
        assert recorder.spend.ops["aminmax"] == 1, recorder.spend.ops
    layer = selfattn.MultiHeadAttention(16, 2, n_kv_heads=1).to("meta")
    for need_weights in (False, True):
        cost = spend(lambda need_weights=need_weights: layer(
            torch.randn(1, 4, 16, device="meta"), attn_mask=mask, need_weights=need_weights))
        assert "aminmax" not in cost.ops, cost.ops  # shape and dtype only: no read, no error
    eye = torch.eye(4)
    with pytest.raises(TypeError, match="only 0 and 1"):  # on a CPU the layer scans too
        selfattn.MultiHeadAttention(16, 2)(torch.randn(1, 4, 16), attn_mask=eye)
    with pytest.raises(TypeError, match="only 0 and 1"):
        check_mask(eye, (1, 2, 4, 4))
    bias = torch.full((64, 64), -1.0)
    with torch.no_grad():
        s = spend(lambda: check_mask(bias, (64, 64)))
    assert s.total <= 64, s  # min and max only: no (L, S) of bools for a mask of no 0/1
