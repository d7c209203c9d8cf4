"""selfattn: self-attention from first principles, the tested code behind the book."""

from .attention import masked_softmax, scaled_dot_product_attention
from .device import pick_device
from .heads import merge_heads, repeat_kv, split_heads
from .masks import causal_mask, padding_mask, to_additive, to_bool
from .multihead import AttentionConfig, KVCache, MultiHeadAttention, expand_kv_heads
from .tiled import tiled_attention

__all__ = [
    "AttentionConfig",
    "KVCache",
    "MultiHeadAttention",
    "causal_mask",
    "exercises",
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


def __getattr__(name: str):
    # selfattn.exercises (the chapters' self-checks) loads on first use, not with the library
    if name == "exercises":
        import importlib

        return importlib.import_module(".exercises", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
