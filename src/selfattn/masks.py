"""Attention masks: causal (with a sliding window and attention sinks), padding, and the two ways
of writing a mask.

Convention (as in ``torch.nn.functional.scaled_dot_product_attention``):

* a **bool** mask says where a query *may attend*: ``True`` = attend, ``False`` = masked out;
* a **float** mask is *added* to the scores: ``0`` keeps a score, ``-inf`` removes it.

Beware: ``torch.nn.MultiheadAttention``'s ``key_padding_mask`` and bool ``attn_mask`` use the
opposite polarity (``True`` = ignore).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .checks import check_nonnegative_int, check_positive_int


def causal_mask(
    L: int,
    S: int | None = None,
    offset: int = 0,
    device: torch.device | str | None = None,
    *,
    window: int | None = None,
    n_sink: int = 0,
) -> Tensor:
    r"""Bool mask of shape ``(L, S)`` where query ``i`` may attend to key ``j`` iff ``j <= i + offset``.

    With ``offset=0`` this is the top-left aligned lower triangle that ``is_causal=True`` means in
    PyTorch's SDPA. When ``L`` new queries follow ``P`` cached keys (``S = P + L``), use
    ``offset=P``: query ``i`` sits at absolute position ``P + i``.

    $$M_{ij} = [\, j \le i + \text{offset} \,]$$  (Vaswani et al. 2017, §3.2.3, "masking out ... illegal
    connections" in the decoder).

    ``window``: sliding-window attention, each query sees only the last ``window`` keys up to
    its own position (Mistral 7B, Jiang et al. 2023, §2); ``n_sink``: the first ``n_sink`` keys
    stay visible to every later query, outside the window (StreamingLLM's attention sinks,
    Xiao et al. 2023, §3.2). With query ``i`` at position $q_i = i + \text{offset}$:

    $$M_{ij} = [\, j \le q_i \,] \wedge \big([\, q_i - j < \text{window} \,] \vee
    [\, j < n_\text{sink} \,]\big)$$

    These are the masks under which :class:`~selfattn.cache.SlidingWindowCache` and
    :class:`~selfattn.cache.SinkCache` equal full attention.
    """
    check_positive_int(L, "L")
    S = L if S is None else check_positive_int(S, "S")
    if window is not None:
        check_positive_int(window, "window")
    check_nonnegative_int(n_sink, "n_sink")
    if n_sink and window is None:
        raise ValueError(f"n_sink={n_sink} keeps keys visible outside a window: give window too "
                         "(without one every earlier key is visible anyway)")
    mask = torch.ones(L, S, dtype=torch.bool, device=device).tril(diagonal=offset)  # j <= i + offset
    if window is not None:
        query = torch.arange(L, device=device)[:, None] + offset  # (L, 1): each query's position
        key = torch.arange(S, device=device)[None, :]  # (1, S)
        mask &= (query - key < window) | (key < n_sink)  # (L, S)
    return mask


def padding_mask(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """Bool mask of shape ``(B, S)``: ``True`` at the real tokens of each sequence, ``False`` at padding.

    ``lengths`` is a 1-D integer tensor of sequence lengths. To mask keys in scores of shape
    ``(B, L, S)`` use ``mask[:, None, :]``; for ``(B, H, L, S)`` use ``mask[:, None, None, :]``.
    """
    if not isinstance(lengths, Tensor):
        raise TypeError(f"lengths must be a torch.Tensor, got {type(lengths).__name__}")
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(
            f"lengths must be a 1-D integer tensor, got shape {tuple(lengths.shape)} "
            f"and dtype {lengths.dtype}"
        )
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be non-negative, got {lengths.tolist()}")
    longest = int(lengths.max()) if lengths.numel() else 0
    S = longest if max_len is None else max_len
    if S < longest:
        raise ValueError(f"max_len={S} is shorter than the longest sequence ({longest})")
    positions = torch.arange(S, device=lengths.device)  # (S,)
    return positions[None, :] < lengths[:, None]  # (B, S)


def to_additive(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Turn a bool mask (True = attend) into an additive one: ``0`` where True, ``-inf`` where False."""
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be bool to convert to additive, got dtype {mask.dtype}")
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill_(~mask, float("-inf"))


def to_bool(mask: Tensor) -> Tensor:
    """Turn an additive mask into a bool one: True where the added value is not ``-inf``.

    Finite values (a bias such as ALiBi, or a large negative fill like ``-1e9``) count as "attend":
    only ``-inf`` removes a key for certain.
    """
    if not mask.is_floating_point():
        raise TypeError(f"mask must be a float (additive) mask, got dtype {mask.dtype}")
    return mask != float("-inf")
