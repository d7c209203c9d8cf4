"""selfattn: self-attention from first principles, the tested code behind the book."""

from . import exercises
from .attention import masked_softmax, scaled_dot_product_attention
from .device import pick_device
from .masks import causal_mask, padding_mask, to_additive, to_bool
from .multihead import AttentionConfig, KVCache, MultiHeadAttention

__all__ = [
    "AttentionConfig",
    "KVCache",
    "MultiHeadAttention",
    "causal_mask",
    "exercises",
    "masked_softmax",
    "padding_mask",
    "pick_device",
    "scaled_dot_product_attention",
    "to_additive",
    "to_bool",
]

__version__ = "0.1.0"
