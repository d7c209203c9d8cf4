"""What the tests compare the library against, written once: PyTorch's attention as the oracle,
a FLOP counter, and flash-attention's rule for judging half precision."""

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


def counted_flops(fn) -> int:
    """The FLOPs PyTorch's counter sees while ``fn()`` runs."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def assert_within_twice_the_reference_error(got: Tensor, same_dtype: Tensor, exact: Tensor,
                                            what: str = "result") -> None:
    """flash-attention's rule for low precision (tests/test_flash_attn.py, ``attention_ref``):
    ``got``'s largest error against ``exact`` (the float64 computation) is at most twice the
    largest error of the readable computation run in ``got``'s own dtype (``same_dtype``), plus a
    quarter of that dtype's rounding step at the result's scale."""
    exact = exact.double()
    error = (got.double() - exact).abs().max().item()
    reference_error = (same_dtype.double() - exact).abs().max().item()
    epsilon = torch.finfo(got.dtype).eps / 4 * max(1.0, exact.abs().max().item())
    assert error <= 2 * reference_error + epsilon, (
        f"{what}: error {error:.3g} against float64, more than twice the {got.dtype} readable "
        f"path's {reference_error:.3g} (+ {epsilon:.1g})")
