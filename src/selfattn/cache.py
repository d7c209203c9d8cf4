r"""Caches of keys and values: what a decoder keeps of the tokens it has seen.

Decoding one token at a time, the new token's query needs the keys and values of every earlier
token it may attend to. Recomputing them each step costs a whole forward pass over the prefix; a
cache keeps them, and each step appends only the new token's. Serving systems differ in *which*
tokens they keep and *how* they store them:

======================  ============================================================================
cache                   keeps
======================  ============================================================================
:class:`KVCache`        every token, in one buffer that doubles when full
:class:`PagedKVCache`   every token, in fixed-size blocks taken from a shared :class:`BlockPool`
                        (PagedAttention, Kwon et al. 2023)
:class:`SlidingWindowCache`  the last ``window`` tokens, in a rolling buffer (Mistral 7B, Jiang et al.
                        2023)
:class:`SinkCache`      the first ``n_sink`` tokens and the last ``window`` (StreamingLLM, Xiao et al.
                        2023)
======================  ============================================================================

Every one implements :class:`Cache`, the protocol that
``MultiHeadAttention.forward(kv_cache=...)`` and ``MultiHeadLatentAttention.forward(kv_cache=...)``
use: ``append`` the new tokens' keys and values and get back the keys and values the new queries
attend to; :func:`causal_after_append` (the one place that rule is written) says how causal
attention under the cache's rule reaches the kernel: PyTorch's ``is_causal``, a mask, or nothing. A
cache that drops tokens equals full attention under the matching mask of
:func:`~selfattn.masks.causal_mask` (``window``, ``n_sink``): tests/test_cache.py checks each one
against that full pass.

What a step costs (asserted in tests/test_costs.py), where autograd records nothing (no_grad,
or nothing requires grad): :class:`KVCache` writes the new tokens into its buffer and returns
views of it (a copy of the whole cache only when it doubles); :class:`SlidingWindowCache` and
:class:`SinkCache` write one new token into its slot and return their buffers themselves (no
copy, whatever the window; a mask given with it has its columns put in the order of the slots,
:meth:`Cache.order`), and gather the keys in order of position for a chunk of several, which
needs its band mask; :class:`PagedKVCache` gathers the sequence's blocks into one tensor at every
step (a copy of what it holds: the readable stand-in for a kernel that reads the blocks in
place). Where autograd records (training through a cache), what a step hands out may be saved
for the backward pass, and no cache writes into it afterwards, in any grad mode: :class:`KVCache`
builds new buffers at the next step and the rolling caches gather their window at every step
(a copy of the cache a step, the price of gradients).

Keys are cached as the layer hands them over: with RoPE, already rotated at their own positions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

import torch
from torch import Tensor

from .checks import check_nonnegative_int, check_positive_int
from .masks import causal_mask


class Cache(ABC):
    """What ``MultiHeadAttention.forward(kv_cache=...)`` needs of a cache.

    ``length``: how many tokens have been appended so far, which is the absolute position of the
    next one (with RoPE the layer rotates new tokens to positions ``length, length + 1, ...``).
    Keys arrive ``(B, H_kv, T, hd)`` and values ``(B, H_kv, T, hd_v)``.
    """

    length: int

    @abstractmethod
    def append(self, k: Tensor, v: Tensor, *, recorded: bool = False) -> tuple[Tensor, Tensor]:
        """Add ``T`` new tokens' keys ``(B, H_kv, T, hd)`` and values ``(B, H_kv, T, hd_v)``;
        return the keys and values the ``T`` new queries attend to, ``(B, H_kv, S, ...)`` with
        ``S = size_after(T)``, in the cache's order: by position, the new tokens last, except
        one token into a rolling buffer (:class:`SlidingWindowCache`, :class:`SinkCache`),
        which comes back in the order of the buffer's slots; :meth:`order` says how to put
        them back in order of position.

        What comes back may be views of the cache's storage, valid until the next ``append``.
        Autograd may save them (grad mode on, and ``k``, ``v``, what the cache holds, or the
        caller's other inputs require grad: ``recorded``, which a layer passes when its queries
        or its mask do); a cache never writes into storage it handed out that way, in any
        later grad mode, so a backward pass through an earlier step stays valid."""

    @abstractmethod
    def size_after(self, T: int) -> int:
        """How many keys ``append`` of ``T`` tokens will return (``S``)."""

    @abstractmethod
    def mask(self, T: int, device: torch.device | str | None = None) -> Tensor | None:
        """Called right after ``append`` of ``T`` tokens: the bool ``(T, S)`` mask (True = may
        attend) that causal attention under this cache's rule gives the new queries over the
        returned keys; ``None`` when every new query may see every returned key."""

    def order(self, T: int, device: torch.device | str | None = None) -> Tensor | None:
        """Called right after ``append`` of ``T`` tokens: ``None`` when it returned the keys in
        order of position; otherwise the ``(S,)`` indices that put them in that order
        (``keys[:, :, order]`` is by position). A layer reads a caller's ``attn_mask``, which is
        over the keys by position, in the cache's order with it, and gives its weights back by
        position, so that neither depends on how the cache stores its tokens."""
        return None

    def is_plain_causal(self, T: int) -> bool:
        """Called right after ``append`` of ``T`` tokens: whether :meth:`mask` is PyTorch's own
        top-left causal mask ``causal_mask(T)`` (a prompt into an empty cache that keeps it
        all). The layer then passes ``is_causal=True`` instead of a mask tensor, which lets
        SDPA pick its flash kernel. ``False`` is always correct, only slower."""
        return False

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes of the keys and values of the tokens the cache keeps now."""

    @property
    @abstractmethod
    def allocated_bytes(self) -> int:
        """Bytes of storage the cache has allocated for keys and values (kept tokens and spare
        room)."""


def causal_after_append(cache: Cache, T: int,
                        device: torch.device | str | None = None) -> tuple[bool, Tensor | None]:
    """Causal attention of the ``T`` tokens just appended to ``cache``, as a kernel takes it:
    ``(is_causal, mask)``.

    PyTorch's ``is_causal`` is top-left aligned: right for queries ``0..T-1`` over keys
    ``0..S-1``, so only for a prompt into an empty cache that keeps it whole; it is then
    ``(True, None)``, and the kernel gets no mask tensor (SDPA's flash kernel). Otherwise the new
    queries sit at positions ``P..P+T-1`` after ``P`` cached tokens, and the cache may have
    dropped keys: ``(False, cache.mask(T))``, the bool ``(T, S)`` mask of the cache's rule, or
    ``(False, None)`` when every new query sees every key returned (one new token). The rule of
    both layers (:class:`~selfattn.MultiHeadAttention`, :class:`~selfattn.MultiHeadLatentAttention`),
    written once."""
    if cache.is_plain_causal(T):
        return True, None
    return False, cache.mask(T, device=device)


def _check_kv(k: object, v: object) -> tuple[Tensor, Tensor]:
    """``k`` (B, H_kv, T, hd) and ``v`` (B, H_kv, T, hd_v): tensors of one dtype and device."""
    k, v = _four_dims(k, "k"), _four_dims(v, "v")
    if k.shape[:3] != v.shape[:3] or k.dtype != v.dtype or k.device != v.device:
        raise ValueError(
            f"k and v must agree on (batch, n_kv_heads, T), dtype and device; got k "
            f"{tuple(k.shape)} {k.dtype} on {k.device}, v {tuple(v.shape)} {v.dtype} on {v.device}"
        )
    return k, v


def _four_dims(x: object, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"{name} must be (batch, n_kv_heads, T, width), got shape {tuple(x.shape)}")
    return x


def _check_like_stored(cache: str, k: Tensor, v: Tensor, k_store: Tensor, v_store: Tensor) -> None:
    """New keys and values must fit the buffers a cache already holds: same batch, heads, widths,
    dtype and device (dim 2, the tokens, may differ)."""
    for name, new, old in (("k", k, k_store), ("v", v, v_store)):
        want = (old.shape[0], old.shape[1], old.shape[3])
        got = (new.shape[0], new.shape[1], new.shape[3])
        if got != want or new.dtype != old.dtype or new.device != old.device:
            raise ValueError(
                f"{cache} holds {name} of (batch, n_kv_heads, width) {want}, {old.dtype} on "
                f"{old.device}; got {name} of shape {tuple(new.shape)}, {new.dtype} on {new.device}. "
                f"Use a new {cache} for a new batch or another layer"
            )


def _records(recorded: bool, *tensors: Tensor | None) -> bool:
    """Whether autograd may save what an ``append`` hands out: grad mode on, and the caller's
    step records (``recorded``: its queries or mask require grad) or any of ``tensors`` (the new
    keys and values, the cache's buffers) requires grad."""
    return torch.is_grad_enabled() and (
        recorded or any(t is not None and t.requires_grad for t in tensors))


def _bytes_per_token(k: Tensor, v: Tensor) -> int:
    """Bytes of one token's keys and values across the batch and the heads of ``k``, ``v``."""
    return (k.shape[0] * k.shape[1] * k.shape[3] + v.shape[0] * v.shape[1] * v.shape[3]) * k.element_size()


class _KeepsEveryToken(Cache):
    """A cache that keeps every token, in order of position (:class:`KVCache`,
    :class:`PagedKVCache`): ``append`` returns all ``length`` of them, the new ones last."""

    def size_after(self, T: int) -> int:
        return self.length + T

    def mask(self, T: int, device: torch.device | str | None = None) -> Tensor | None:
        """The bottom-right causal mask: the new queries sit at ``S - T, ..., S - 1``; one new
        query sees every key, so ``T == 1`` needs none."""
        S = self.length
        return None if T == 1 else causal_mask(T, S, offset=S - T, device=device)

    def is_plain_causal(self, T: int) -> bool:
        return self.length == T  # nothing was cached before these T tokens


class KVCache(_KeepsEveryToken):
    """Every token's keys and values, for token-by-token decoding, in one contiguous buffer.

    Stores ``(B, n_kv_heads, C, head_dim)`` buffers, allocated at the first append with room for
    ``C = max(capacity, tokens appended)`` tokens and doubled when full (``capacity`` stays the
    first buffer's size), so appending a token copies only that token (amortised O(1)), never the
    whole cache as ``torch.cat`` would; ``append`` returns views, no copy. MQA's cache is
    ``n_heads`` times smaller than MHA's. Doubling leaves up to half of the allocation unused:
    just after a doubling the cache holds little more than half of :attr:`allocated_bytes`.
    """

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = check_positive_int(capacity, "capacity")
        self.length = 0
        self._k: Tensor | None = None
        self._v: Tensor | None = None
        self._lent = False  # views of the buffers handed out that autograd may have saved

    def append(self, k: Tensor, v: Tensor, *, recorded: bool = False) -> tuple[Tensor, Tensor]:
        """Add ``k``, ``v`` of shape ``(B, n_kv_heads, T, head_dim)``; return all keys and values:
        views of the buffers, or, after a step that autograd recorded, new buffers (a copy of the
        cache, the price of gradients: autograd may have saved the views handed out, and writing
        into their storage would invalidate them, whatever the grad mode now)."""
        k, v = _check_kv(k, v)
        B, n_kv, T, _ = k.shape
        end = self.length + T
        if self._k is None or self._v is None:
            cap = max(self.capacity, end)
            self._k = k.new_empty(B, n_kv, cap, k.shape[-1])  # (B, n_kv, cap, hd)
            self._v = v.new_empty(B, n_kv, cap, v.shape[-1])  # (B, n_kv, cap, hd_v)
        else:
            _check_like_stored("KVCache", k, v, self._k, self._v)
            if self._lent:  # new buffers, holding exactly the tokens: the old ones stay as saved
                self._k = torch.cat([self._k[:, :, : self.length], k], dim=2)  # (B, n_kv, S, hd)
                self._v = torch.cat([self._v[:, :, : self.length], v], dim=2)
                self.length = end
                self._lent = _records(recorded, k, v, self._k, self._v)
                return self._k, self._v
            if end > self._k.shape[2]:
                cap = max(2 * self._k.shape[2], end)
                self._k, self._v = self._grown(self._k, cap), self._grown(self._v, cap)
        self._k[:, :, self.length : end] = k
        self._v[:, :, self.length : end] = v
        self.length = end
        self._lent = _records(recorded, k, v, self._k, self._v)
        return self._k[:, :, :end], self._v[:, :, :end]  # (B, n_kv, S, hd), views

    def _grown(self, old: Tensor, cap: int) -> Tensor:
        """A buffer of ``cap`` tokens holding the ``length`` tokens of ``old``."""
        new = old.new_empty(*old.shape[:2], cap, old.shape[3])  # (B, n_kv, cap, hd)
        new[:, :, : self.length] = old[:, :, : self.length]
        return new

    @property
    def nbytes(self) -> int:
        """Bytes held by the keys and values stored so far (not counting spare capacity)."""
        if self._k is None or self._v is None:
            return 0
        return self.length * _bytes_per_token(self._k, self._v)

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the two buffers: what the cache holds plus the spare room it keeps so that an
        append rarely copies."""
        if self._k is None or self._v is None:
            return 0
        return self._k.untyped_storage().nbytes() + self._v.untyped_storage().nbytes()


class BlockPool:
    r"""Preallocated key/value storage in fixed-size blocks, shared by many sequences
    (PagedAttention: Kwon et al. 2023, "Efficient Memory Management for Large Language Model
    Serving with PagedAttention", §4.1-4.2).

    ``k`` is ``(n_blocks, n_kv_heads, block_size, head_dim)`` and ``v``
    ``(n_blocks, n_kv_heads, block_size, value_dim)`` (``value_dim`` defaults to ``head_dim``; 0
    holds no values, as :class:`~selfattn.MultiHeadLatentAttention` without RoPE needs), allocated
    once. A block holds ``block_size`` consecutive tokens of one sequence; a free list
    says which blocks no sequence uses. Memory is handed out a block at a time, as a sequence
    grows, the way an operating system pages virtual memory: a sequence wastes less than one
    block, where a contiguous cache reserves room for the longest sequence it might reach.
    """

    def __init__(self, n_blocks: int, block_size: int, n_kv_heads: int, head_dim: int, *,
                 value_dim: int | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        for name, value in (("n_blocks", n_blocks), ("block_size", block_size),
                            ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
            check_positive_int(value, name)
        # value_dim may be 0: MLA without RoPE caches its latents as keys and nothing as values
        value_dim = head_dim if value_dim is None else check_nonnegative_int(value_dim, "value_dim")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype}")
        self.n_blocks, self.block_size = n_blocks, block_size
        self.k = torch.empty(n_blocks, n_kv_heads, block_size, head_dim, dtype=dtype,
                             device=device)  # (N, H_kv, block_size, hd)
        self.v = torch.empty(n_blocks, n_kv_heads, block_size, value_dim, dtype=dtype,
                             device=device)  # (N, H_kv, block_size, hd_v)
        self._free = list(range(n_blocks - 1, -1, -1))  # a stack: block 0 is handed out first

    @property
    def n_free(self) -> int:
        """How many blocks no sequence holds."""
        return len(self._free)

    @property
    def free_blocks(self) -> list[int]:
        """The free list, the block that :meth:`allocate` hands out next first."""
        return self._free[::-1]

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block's keys and values."""
        return self.k[0].nbytes + self.v[0].nbytes

    def allocate(self) -> int:
        """Take a free block; return its index into ``k`` and ``v``."""
        if not self._free:
            raise RuntimeError(self._exhausted(1))
        return self._free.pop()

    def free(self, blocks: Iterable[int]) -> None:
        """Give ``blocks`` back to the free list."""
        blocks = list(blocks)
        free = set(self._free)
        for b in blocks:
            if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < self.n_blocks:
                raise ValueError(f"blocks must be block indices in [0, {self.n_blocks}), got {b!r}")
            if b in free:
                raise ValueError(f"block {b} is already free (freed twice?)")
            free.add(b)
        self._free.extend(reversed(blocks))

    def _exhausted(self, needed: int) -> str:
        return (f"BlockPool exhausted: it has {self.n_blocks} blocks of {self.block_size} tokens, "
                f"{self.n_free} free, and {needed} more needed; release() the sequences that "
                "are done (PagedKVCache.release) to give their blocks back, or make a larger pool")


class PagedKVCache(_KeepsEveryToken):
    """One sequence's keys and values, in blocks of a :class:`BlockPool` (PagedAttention, Kwon
    et al. 2023, §4.1-4.2).

    ``block_table`` lists the pool's blocks that hold the sequence, in order: token ``p`` lives in
    block ``block_table[p // block_size]`` at slot ``p % block_size``. ``append`` fills the last
    block, then takes new blocks from the pool one at a time; :meth:`release` gives them back when
    the sequence is done. Batch 1: every sequence has its own table (serving systems batch
    sequences by batching their tables).

    A real PagedAttention kernel reads the blocks in place, following the table. This readable
    version gathers them into one ``(1, H_kv, S, hd)`` tensor (a copy) and hands that to ordinary
    attention: the same numbers, not the same memory traffic.
    """

    def __init__(self, pool: BlockPool) -> None:
        if not isinstance(pool, BlockPool):
            raise TypeError(f"pool must be a BlockPool, got {type(pool).__name__}")
        self.pool = pool
        self.block_table: list[int] = []
        self.length = 0

    def append(self, k: Tensor, v: Tensor, *, recorded: bool = False) -> tuple[Tensor, Tensor]:
        """Add ``k``, ``v`` of shape ``(1, n_kv_heads, T, head_dim)``; return all keys and values
        of the sequence, gathered from its blocks in order (a copy: nothing handed out shares
        the pool's storage, so ``recorded`` changes nothing here)."""
        k, v = self._checked(k, v)
        T, size = k.shape[2], self.pool.block_size
        needed = -(-(self.length + T) // size) - len(self.block_table)  # new blocks, rounded up
        if needed > self.pool.n_free:  # refuse before writing anything
            raise RuntimeError(self.pool._exhausted(needed))
        done = 0
        while done < T:
            slot = self.length % size  # where the next token goes in the last block
            if slot == 0:  # the last block is full, or there is none: take a new one
                self.block_table.append(self.pool.allocate())
            n = min(size - slot, T - done)  # tokens that fit in the last block
            block = self.block_table[-1]
            self.pool.k[block, :, slot : slot + n] = k[0, :, done : done + n]  # (H_kv, n, hd)
            self.pool.v[block, :, slot : slot + n] = v[0, :, done : done + n]  # (H_kv, n, hd_v)
            self.length += n
            done += n
        return self._gathered(self.pool.k), self._gathered(self.pool.v)

    def _gathered(self, store: Tensor) -> Tensor:
        """This sequence's tokens of ``store`` (the pool's ``k`` or ``v``), in order: one gather,
        a copy of exactly the tokens it holds."""
        table = torch.tensor(self.block_table, dtype=torch.long, device=store.device)
        positions = torch.arange(self.length, device=store.device)  # (S,)
        size = self.pool.block_size
        tokens = store[table[positions // size], :, positions % size]  # (S, H_kv, hd): block, slot
        return tokens.transpose(0, 1)[None]  # (1, H_kv, S, hd), a view

    def _checked(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        k, v = _check_kv(k, v)
        if k.shape[0] != 1:
            raise ValueError(f"PagedKVCache holds one sequence (batch 1), got batch {k.shape[0]} "
                             f"in k of shape {tuple(k.shape)}; give each sequence its own cache")
        for name, new, store in (("k", k, self.pool.k), ("v", v, self.pool.v)):
            if (new.shape[1], new.shape[3]) != (store.shape[1], store.shape[3]) \
                    or new.dtype != store.dtype or new.device != store.device:
                raise ValueError(
                    f"the BlockPool stores {name} of (n_kv_heads, width) "
                    f"{(store.shape[1], store.shape[3])}, {store.dtype} on {store.device}; got {name} "
                    f"of shape {tuple(new.shape)}, {new.dtype} on {new.device}"
                )
        return k, v

    def release(self) -> None:
        """Give every block back to the pool; the cache is empty again."""
        self.pool.free(self.block_table)
        self.block_table = []
        self.length = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the tokens held (the last block's empty slots not counted)."""
        return self.length * self.pool.bytes_per_block // self.pool.block_size

    @property
    def allocated_bytes(self) -> int:
        """Bytes of this sequence's blocks: :attr:`nbytes` plus less than one block."""
        return len(self.block_table) * self.pool.bytes_per_block


class _RollingCache(Cache):
    r"""The first ``n_sink`` tokens, kept forever, and a rolling buffer of the last ``window``.

    Position ``p`` lives in slot ``p`` if ``p < n_sink``, else in slot
    ``n_sink + (p - n_sink) mod window``: a new token overwrites the one ``window`` positions
    before it, which no later query may see. Query ``i`` sees key ``j`` iff ``j <= i`` and
    (``j < n_sink`` or ``i - j < window``).
    """

    def __init__(self, n_sink: int, window: int) -> None:
        self.n_sink, self.window = n_sink, window
        self.length = 0
        self._k: Tensor | None = None  # (B, H_kv, n_sink + window, hd), at the first append
        self._v: Tensor | None = None
        self._by_slot = False  # the last append returned the buffer in an order not by position

    def _seen(self, P: int) -> tuple[range, range]:
        """The positions of the cached tokens that the token at position ``P`` may see: the sinks
        and the last ``window - 1`` before it."""
        first_recent = max(self.n_sink, P - self.window + 1)  # the oldest outside the sinks
        return range(min(self.n_sink, P)), range(min(first_recent, P), P)

    def _slot(self, p: int) -> int:
        """Where position ``p`` lives in the buffer (:meth:`_slots` for one, without a tensor)."""
        return p if p < self.n_sink else self.n_sink + (p - self.n_sink) % self.window

    def _slots(self, positions: Tensor) -> Tensor:
        """Where each position lives in the buffer."""
        ring = self.n_sink + (positions - self.n_sink) % self.window
        return torch.where(positions < self.n_sink, positions, ring)

    def append(self, k: Tensor, v: Tensor, *, recorded: bool = False) -> tuple[Tensor, Tensor]:
        """Add ``T`` tokens; return the keys and values the new queries attend to,
        ``(B, H_kv, S, hd)``; afterwards the cache keeps only the sinks and the last ``window``.

        One new token (decoding): it is written into its slot, over the token ``window``
        positions before it, which it may not see, and the buffers themselves come back (views,
        valid until the next ``append``): exactly the tokens it sees, in the order of their slots
        (:meth:`order` gives the way back to the order of position). A single query's softmax
        and weighted sum do not depend on the order of the keys, and the keys are stored already
        rotated (RoPE), so nothing is gathered or copied, whatever the window (Mistral's rolling
        buffer); only a mask over the keys must follow their order, which the layer sees to.

        A chunk of several, or one token while autograd records (``recorded``, or anything
        requiring grad: autograd could save views handed out then, and later steps write into
        the buffer, which would invalidate them): the cached tokens the first new one may
        see, in order of position, then the new ones, a new tensor of up to
        ``n_sink + window - 1 + T`` tokens, for the band mask of :meth:`mask`."""
        k, v = _check_kv(k, v)
        B, H_kv, T, _ = k.shape
        P, device = self.length, k.device
        if self._k is None or self._v is None:
            size = self.n_sink + self.window
            self._k = k.new_empty(B, H_kv, size, k.shape[3])  # (B, H_kv, n_sink + window, hd)
            self._v = v.new_empty(B, H_kv, size, v.shape[3])  # (B, H_kv, n_sink + window, hd_v)
        else:
            _check_like_stored(type(self).__name__, k, v, self._k, self._v)
        if T == 1 and not _records(recorded, k, v, self._k, self._v):
            slot = self._slot(P)
            self._k[:, :, slot : slot + 1] = k  # (B, H_kv, 1, hd)
            self._v[:, :, slot : slot + 1] = v  # (B, H_kv, 1, hd_v)
            self.length = P + 1
            size = self.n_sink + self.window
            kept = min(P + 1, size)  # the slots filled so far
            # by position until the ring wraps, and again whenever the newest is in its last slot
            self._by_slot = P >= size and slot != size - 1
            return self._k[:, :, :kept], self._v[:, :, :kept]  # (B, H_kv, S, hd), views
        self._by_slot = False
        # the cached tokens the first new query may see, in order of position, then the new ones
        sinks, recent = self._seen(P)
        seen = torch.cat([torch.arange(sinks.start, sinks.stop, device=device),
                          torch.arange(recent.start, recent.stop, device=device)])  # (S - T,)
        keys = torch.cat([self._k[:, :, self._slots(seen)], k], dim=2)  # (B, H_kv, S, hd)
        values = torch.cat([self._v[:, :, self._slots(seen)], v], dim=2)  # (B, H_kv, S, hd_v)
        # store the new tokens that stay: sinks, and those among the last `window` positions
        new = torch.arange(P, P + T, device=device)  # (T,)
        stay = (new < self.n_sink) | (new >= P + T - self.window)  # (T,)
        self._k[:, :, self._slots(new[stay])] = k[:, :, stay]
        self._v[:, :, self._slots(new[stay])] = v[:, :, stay]
        self.length = P + T
        return keys, values

    def size_after(self, T: int) -> int:
        sinks, recent = self._seen(self.length)
        return len(sinks) + len(recent) + T

    def mask(self, T: int, device: torch.device | str | None = None) -> Tensor | None:
        """Over the returned keys (the seen cached tokens, then the new ones): query ``i`` sees
        key ``j`` iff ``j <= i`` and (``j < n_sink`` or ``i - j < window``), counted in columns
        with the new queries at ``S - T, ..., S - 1``. The positions skipped between the sinks
        and the window shift the later keys and the queries alike, so their differences of
        positions are those of columns (and the sinks before the gap are visible to every new
        query either way). One new query sees every key returned: ``None``."""
        if T == 1:
            return None
        sinks, recent = self._seen(self.length - T)
        S = len(sinks) + len(recent) + T
        return causal_mask(T, S, offset=S - T, window=self.window, n_sink=self.n_sink, device=device)

    def order(self, T: int, device: torch.device | str | None = None) -> Tensor | None:
        """After one token into a full ring (the only case that returns the slots' order): the
        slot of each key it sees, the sinks then the window, by position."""
        if not self._by_slot:
            return None
        P = self.length - 1  # the token just appended
        sinks, recent = self._seen(P)
        n = len(sinks)
        j = torch.arange(n + P + 1 - recent.start, device=device)  # (S,): the keys by position
        positions = torch.where(j < n, j, j - n + recent.start)  # the sinks, then the window
        return self._slots(positions)  # (S,)

    def is_plain_causal(self, T: int) -> bool:
        return self.length == T and T <= self.n_sink + self.window

    @property
    def nbytes(self) -> int:
        """Bytes of the tokens kept: never more than ``n_sink + window`` of them."""
        if self._k is None or self._v is None:
            return 0
        kept = min(self.length, self.n_sink + self.window)
        return kept * _bytes_per_token(self._k, self._v)

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the buffers: ``n_sink + window`` tokens from the first append on."""
        if self._k is None or self._v is None:
            return 0
        return self._k.nbytes + self._v.nbytes


class SlidingWindowCache(_RollingCache):
    r"""The last ``window`` tokens in a rolling buffer (Jiang et al. 2023, "Mistral 7B", §2,
    rolling buffer cache): the token at position ``p`` lives in slot ``p mod W``, so memory never
    exceeds ``W`` tokens however long the sequence grows.

    It computes sliding-window attention: query ``i`` sees key ``j`` iff ``i - W < j <= i``,
    $M_{ij} = [\, i - W < j \le i \,]$, which is ``causal_mask(L, window=W)``. Decoding with this
    cache equals one full pass under that mask, token by token or in chunks (a chunk longer
    than the window included).
    """

    def __init__(self, window: int) -> None:
        super().__init__(0, check_positive_int(window, "window"))


class SinkCache(_RollingCache):
    r"""The first ``n_sink`` tokens forever, plus a rolling window of the last ``window``
    (Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks", §3.2).

    Query ``i`` sees key ``j`` iff ``j <= i`` and (``j < n_sink`` or ``i - j < window``):
    $M_{ij} = [\, j \le i \,] \wedge ([\, j < n_\text{sink} \,] \vee [\, i - j < W \,])$, which is
    ``causal_mask(L, window=W, n_sink=n_sink)``. StreamingLLM found that the first tokens draw
    large attention whatever they hold ("attention sinks"), and that a window alone collapses once
    they are evicted; keeping them restores it.

    One difference from StreamingLLM: it re-assigns positions inside the cache (the kept tokens
    numbered ``0, 1, ...`` as they sit in the cache), so that a model can run past the length it
    was trained on. This cache keeps every token's own position (keys stay rotated where they
    were), so it equals full attention under the mask above exactly, and no more than that.
    """

    def __init__(self, n_sink: int, window: int) -> None:
        super().__init__(check_nonnegative_int(n_sink, "n_sink"), check_positive_int(window, "window"))
