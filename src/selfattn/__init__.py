"""selfattn: self-attention from first principles, the tested code behind the book.

Two layers, one package:

* ``selfattn`` itself is the attention library, what a reader learns and can reuse:
  :mod:`~selfattn.attention` (scaled dot-product attention, step by step), :mod:`~selfattn.masks`,
  :mod:`~selfattn.heads`, :mod:`~selfattn.multihead` (MHA, GQA, MQA), :mod:`~selfattn.cache`
  (the KV caches of decoding: contiguous, paged, sliding window, attention sinks),
  :mod:`~selfattn.latent` (multi-head latent attention),
  :mod:`~selfattn.fastpaths`, :mod:`~selfattn.tiled`, :mod:`~selfattn.scoring`,
  :mod:`~selfattn.positional`, with :mod:`~selfattn.checks` and :mod:`~selfattn.device`.
* :mod:`selfattn.book` is the book's apparatus around it: the synthetic tasks, the taggers and
  their training, figures and explorers, diagrams, measurement and ``make bench``, the pretrained
  model of chapter 10 and the exercises' checkers. It imports the library, never the reverse, and
  ``import selfattn`` does not load it (``selfattn.book`` loads on first use).
"""

from .attention import masked_softmax, scaled_dot_product_attention
from .cache import BlockPool, Cache, KVCache, PagedKVCache, SinkCache, SlidingWindowCache
from .device import pick_device
from .heads import merge_heads, repeat_kv, split_heads
from .latent import MultiHeadLatentAttention
from .masks import causal_mask, padding_mask, to_additive, to_bool
from .multihead import AttentionConfig, MultiHeadAttention, expand_kv_heads
from .tiled import tiled_attention

__all__ = [
    "AttentionConfig",
    "BlockPool",
    "Cache",
    "KVCache",
    "MultiHeadAttention",
    "MultiHeadLatentAttention",
    "PagedKVCache",
    "SinkCache",
    "SlidingWindowCache",
    "book",
    "causal_mask",
    "expand_kv_heads",
    "masked_softmax",
    "merge_heads",
    "padding_mask",
    "pick_device",
    "repeat_kv",
    "scaled_dot_product_attention",
    "split_heads",
    "tiled_attention",
    "to_additive",
    "to_bool",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # selfattn.book (the book's apparatus) loads on first use, not with the library
    if name == "book":
        import importlib

        return importlib.import_module(".book", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
