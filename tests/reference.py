"""What the tests compare the library against, written once: PyTorch's attention as the oracle,
a plain-torch attention in the inputs' own dtype (flash-attention's ``attention_ref``), a FLOP
counter, and flash-attention's rule for judging half precision."""

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

import selfattn


def pytorch_reference(q, k, v, attn_mask=None, is_causal=False, **kwargs) -> Tensor:
    """``F.scaled_dot_product_attention`` called the way the library's attention means it.

    PyTorch's math backend refuses ``attn_mask`` together with ``is_causal`` (its fused CPU
    kernel ANDs them); the library always ANDs them, which is this call. It also wants a mask of
    rank 2 or more, no wider than ``q @ k^T``: q, k and the mask get the full broadcast batch.
    """
    (L, E), S = q.shape[-2:], k.shape[-2]
    if attn_mask is not None and is_causal:
        attn_mask = attn_mask & selfattn.causal_mask(L, S, device=attn_mask.device)
        is_causal = False
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k = q.expand(*batch, L, E), k.expand(*batch, S, E)
    attn_mask = None if attn_mask is None else attn_mask.expand(*batch, L, S)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                          **kwargs)


def attention_ref(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                  is_causal: bool = False, dropout_p: float = 0.0, *,
                  upcast: bool = True) -> tuple[Tensor, Tensor]:
    """Attention in a few lines of plain torch, written apart from the library, as
    flash-attention's tests write theirs (tests/test_flash_attn.py, ``attention_ref``):
    ``(output, weights)``. ``upcast=False`` computes every step in the inputs' dtype (the scores,
    the mask, the softmax, the product): the error a straightforward implementation makes in
    that dtype, the yardstick of :func:`assert_within_twice_the_reference_error`.

    ``q`` (..., H, L, E) may have a multiple of the heads of ``k`` and ``v`` (GQA: each key/value
    head serves consecutive query heads). ``attn_mask`` bool (True = may attend) or float
    (added); ``is_causal`` top-left, ANDed with it. A row with every key masked gets zero
    weights (its scores are zeroed before the softmax, so no NaN reaches a gradient).
    """
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    if q.dim() >= 3 and q.shape[-3] != k.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    (L, E), S = q.shape[-2:], k.shape[-2]
    scores = (q / math.sqrt(E)) @ k.transpose(-2, -1)
    keep = torch.ones(L, S, dtype=torch.bool, device=q.device)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        keep = keep & attn_mask
    elif attn_mask is not None:
        scores = scores + attn_mask.to(scores.dtype)
        keep = keep & (attn_mask != float("-inf"))
    if is_causal:
        keep = keep & torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
    dead = ~keep.any(dim=-1, keepdim=True)
    scores = scores.masked_fill(~keep, float("-inf")).masked_fill(dead, 0.0)
    weights = torch.softmax(scores, dim=-1).masked_fill(dead, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    return (weights @ v).to(dtype), weights.to(dtype)


def counted_flops(fn) -> int:
    """The FLOPs PyTorch's counter sees while ``fn()`` runs."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def assert_within_twice_the_reference_error(got: Tensor, same_dtype: Tensor, exact: Tensor,
                                            what: str = "result") -> None:
    """flash-attention's rule for low precision (tests/test_flash_attn.py, ``attention_ref``):
    ``got``'s largest error against ``exact`` (the float64 computation) is at most twice the
    largest error of a plain implementation run in ``got``'s own dtype (``same_dtype``: computed
    with :func:`attention_ref` ``(upcast=False)``, never with the code under test, so a
    precision regression there cannot widen its own tolerance), plus a quarter of that dtype's
    rounding step at the result's scale."""
    exact = exact.double()
    error = (got.double() - exact).abs().max().item()
    reference_error = (same_dtype.double() - exact).abs().max().item()
    epsilon = torch.finfo(got.dtype).eps / 4 * max(1.0, exact.abs().max().item())
    assert error <= 2 * reference_error + epsilon, (
        f"{what}: error {error:.3g} against float64, more than twice the {got.dtype} plain "
        f"reference's {reference_error:.3g} (+ {epsilon:.1g})")
