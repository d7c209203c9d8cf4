"""Input checks shared by every public function.

Bad input gets a clear ``ValueError`` or ``TypeError`` early, naming the argument and the shapes
seen, never a deep ``RuntimeError`` from inside torch. Public functions check once, at the
boundary; the code they call does not check again.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_tensor(x: object, name: str, min_rank: int = 1) -> Tensor:
    """Check that ``x`` is a floating-point tensor of rank at least ``min_rank``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < min_rank:
        raise ValueError(
            f"{name} must have at least {min_rank} dimensions, got shape {tuple(x.shape)}"
        )
    return x


def check_same_dtype_device(**tensors: Tensor) -> None:
    """Check that all ``tensors`` share one dtype and one device."""
    names = list(tensors)
    first = tensors[names[0]]
    for name in names[1:]:
        t = tensors[name]
        if t.dtype != first.dtype:
            raise TypeError(
                f"{names[0]} and {name} must have the same dtype, got {first.dtype} and {t.dtype}"
            )
        if t.device != first.device:
            raise ValueError(
                f"{names[0]} and {name} must be on the same device, "
                f"got {first.device} and {t.device}"
            )


def check_mask(attn_mask: object, target: tuple[int, ...], name: str = "attn_mask", *,
               read_values: bool = True) -> Tensor:
    """Check a mask: bool (True = may attend) or float (added to the scores).

    It must broadcast to ``target`` (the shape of the scores). Integer masks are rejected, and so
    are float masks holding only 0 and 1 (read from its values): both are almost always a boolean
    mask in disguise, and adding 1 to the allowed scores would silently mask nothing. The scan is
    one pass (the smallest and largest value) and a second only when those are 0 and 1.

    ``read_values=False`` skips the scan. On a GPU, a Python ``bool`` of a tensor waits for the
    device: a synchronisation, which a check must not add to every forward of a layer.
    :class:`~selfattn.MultiHeadAttention` therefore scans a CPU mask only; the functions that
    return the weights (:func:`~selfattn.scaled_dot_product_attention`,
    :func:`~selfattn.masked_softmax`) scan on every device: they hold every score anyway.
    """
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(
            f"{name} must be bool (True = may attend) or float (added to the scores), "
            f"got dtype {attn_mask.dtype}; use mask.bool() if 1 means 'may attend'"
        )
    if read_values and attn_mask.is_floating_point() and attn_mask.numel() > 0:
        low, high = torch.aminmax(attn_mask)
        if (low.item(), high.item()) == (0.0, 1.0) and bool(
                ((attn_mask == 0) | (attn_mask == 1)).all()):
            raise TypeError(
                f"{name} is a float tensor holding only 0 and 1 (shape {tuple(attn_mask.shape)}): "
                "a float mask is added to the scores, so this masks nothing. Pass a bool mask "
                "(True = may attend), e.g. mask.bool(), or an additive mask of 0 and -inf"
            )
    try:
        shape = torch.broadcast_shapes(attn_mask.shape, target)
    except RuntimeError:
        shape = None
    if shape != torch.Size(target):
        raise ValueError(
            f"{name} of shape {tuple(attn_mask.shape)} does not broadcast to the scores' "
            f"shape {tuple(target)}"
        )
    return attn_mask


def check_dropout(dropout_p: object, name: str = "dropout_p") -> float:
    """Check a dropout probability in [0, 1]."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1], got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {dropout_p}")
    return float(dropout_p)


def check_positive_int(value: object, name: str, most: int | None = None) -> int:
    """Check a strictly positive integer (a size or a count), at most ``most`` if given."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    if most is not None and value > most:
        raise ValueError(f"{name} must be at most {most}, got {value}")
    return value


def check_nonnegative_int(value: object, name: str) -> int:
    """Check an integer that may be 0 (a count of optional things)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be at least 0, got {value}")
    return value


def check_attention_inputs(query: object, key: object, value: object, attn_mask: object,
                           dropout_p: object) -> float:
    """Check the arguments of scaled dot-product attention; return ``dropout_p`` as a float.

    ``query`` (..., L, E), ``key`` (..., S, E), ``value`` (..., S, Ev): floating point, one dtype
    and device, leading dimensions that broadcast; ``attn_mask`` broadcastable to (..., L, S).
    """
    query = check_tensor(query, "query", min_rank=2)
    key = check_tensor(key, "key", min_rank=2)
    value = check_tensor(value, "value", min_rank=2)
    check_same_dtype_device(query=query, key=key, value=value)
    L, E = query.shape[-2:]
    S, E_k = key.shape[-2:]
    if E_k != E:
        raise ValueError(
            f"query and key must have the same last dimension E, got query {tuple(query.shape)} "
            f"and key {tuple(key.shape)}"
        )
    if value.shape[-2] != S:
        raise ValueError(
            f"key and value must have the same sequence length S (dim -2), got key "
            f"{tuple(key.shape)} and value {tuple(value.shape)}"
        )
    try:
        batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the leading (batch, head) dimensions of query {tuple(query.shape)}, key "
            f"{tuple(key.shape)} and value {tuple(value.shape)} do not broadcast"
        ) from None
    if attn_mask is not None:
        check_mask(attn_mask, (*batch, L, S))
    return check_dropout(dropout_p)
