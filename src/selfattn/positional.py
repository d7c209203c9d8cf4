r"""Positional encodings: how attention learns where a token is.

* sinusoidal (Vaswani et al. 2017, §3.5), added to the embeddings:
  $PE_{(pos, 2i)} = \sin(pos / 10000^{2i/d})$, $PE_{(pos, 2i+1)} = \cos(pos / 10000^{2i/d})$;
* learned absolute embeddings, added to the embeddings;
* RoPE (Su et al. 2021), a rotation of the queries and keys;
* ALiBi (Press et al. 2022), a bias added to the scores (an additive ``attn_mask``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from .checks import check_positive_int, check_tensor


def sinusoidal_encoding(
    n_positions: int, d_model: int, base: float = 10000.0, device: torch.device | str | None = None
) -> Tensor:
    """The ``(n_positions, d_model)`` table of sines and cosines, added to the token embeddings."""
    check_positive_int(n_positions, "n_positions")
    check_positive_int(d_model, "d_model")
    if d_model % 2:
        raise ValueError(f"d_model must be even to pair sines with cosines, got {d_model}")
    pos = torch.arange(n_positions, dtype=torch.float32, device=device)[:, None]  # (P, 1)
    freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float32, device=device) / d_model)
    angles = pos * freq  # (P, d/2)
    pe = torch.empty(n_positions, d_model, device=device)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe


class LearnedPositionalEmbedding(nn.Module):
    """Learned absolute positions: one trained vector per position, added to the embeddings.

    It knows only the ``max_len`` positions it was built with; asking for a later one is an
    error (this is why it cannot extrapolate to longer sequences).
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.table = nn.Embedding(check_positive_int(max_len, "max_len"),
                                  check_positive_int(d_model, "d_model"))

    def forward(self, n_positions: int) -> Tensor:
        """The ``(n_positions, d_model)`` vectors of positions ``0 .. n_positions - 1``."""
        max_len = self.table.num_embeddings
        if n_positions > max_len:
            raise ValueError(f"position {n_positions - 1} is beyond the learned table of "
                             f"{max_len} positions (max_len={max_len})")
        return self.table.weight[:n_positions]  # (T, d)


ROPE_LAYOUTS = ("neighbours", "halves")


def apply_rope(x: Tensor, positions: Tensor | None = None, base: float = 10000.0,
               *, layout: str = "neighbours") -> Tensor:
    r"""Rotary position embedding (RoPE, Su et al. 2021, §3.2) of queries or keys ``(..., T, d)``.

    Each pair of features $(x_{2i}, x_{2i+1})$ at position $m$ is rotated by the angle
    $m\,\theta_i$, $\theta_i = \text{base}^{-2i/d}$. A rotation keeps lengths, and
    $\langle R_m q, R_n k \rangle$ depends on $m - n$ only: the score sees relative position.
    ``positions``: one integer position per token, a ``(T,)`` tensor on ``x``'s device; it
    defaults to ``0 .. T-1`` (pass an offset range when decoding with a cache).

    ``layout`` says which features form a pair. ``"neighbours"`` (the default, as in the RoFormer
    paper and GPT-J): $(x_{2i}, x_{2i+1})$. ``"halves"`` (the ``rotate_half`` of LLaMA's and
    GPT-NeoX's code): $(x_i, x_{i + d/2})$, with the same $\theta_i$. Both are RoPE, the same
    rotation of a permuted vector; a pretrained checkpoint works only with the layout it was
    trained with.
    """
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"layout must be one of {ROPE_LAYOUTS}, got {layout!r}")
    if layout == "halves":
        x = check_tensor(x, "x", min_rank=2)
        if x.shape[-1] % 2:
            raise ValueError(f"RoPE rotates pairs of features: the last dimension must be even, "
                             f"got shape {tuple(x.shape)}")
        half = x.shape[-1] // 2
        # (..., T, d): feature i and i + d/2 side by side, as neighbours 2i and 2i + 1
        paired = torch.stack([x[..., :half], x[..., half:]], dim=-1).flatten(-2)
        rotated = apply_rope(paired, positions, base)  # (..., T, d), neighbours layout
        # (..., T, d/2, 2) -> back to halves: the even features first, then the odd ones
        return torch.cat([rotated[..., 0::2], rotated[..., 1::2]], dim=-1)
    x = check_tensor(x, "x", min_rank=2)
    if x.shape[-1] % 2:
        raise ValueError(f"RoPE rotates pairs of features: the last dimension must be even, "
                         f"got shape {tuple(x.shape)}")
    T = x.shape[-2]
    if positions is None:
        return _apply_rope(x, torch.arange(T, device=x.device), base)
    if not isinstance(positions, Tensor):
        raise TypeError(f"positions must be a torch.Tensor, got {type(positions).__name__}")
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(f"positions must be an integer tensor, got dtype {positions.dtype}")
    if positions.shape != (T,):
        raise ValueError(f"positions must hold one position per token of x, shape ({T},) for x "
                         f"of shape {tuple(x.shape)}; got positions of shape "
                         f"{tuple(positions.shape)}")
    if positions.device != x.device:
        raise ValueError(f"positions and x must be on the same device, got {positions.device} "
                         f"and {x.device}")
    return _apply_rope(x, positions, base)


_position_divisor = 1.0  # set by interpolate_positions


@contextlib.contextmanager
def interpolate_positions(factor: float) -> Iterator[None]:
    """Position interpolation (Chen et al. 2023): inside this block, RoPE divides every position
    by ``factor`` before it turns the pairs, so a sequence ``factor`` times longer than the
    training length meets only the angles of trained offsets (now at fractional positions). It
    applies to :func:`apply_rope` and to every ``MultiHeadAttention(..., rope=True)``; no
    weights change. Not thread-safe: the setting is global while the block runs.
    """
    global _position_divisor
    if not (isinstance(factor, (int, float)) and factor > 0):
        raise ValueError(f"factor must be a positive number, got {factor!r}")
    previous, _position_divisor = _position_divisor, float(factor)
    try:
        yield
    finally:
        _position_divisor = previous


def _apply_rope(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """:func:`apply_rope` without checking its inputs (``MultiHeadAttention`` checked its sizes
    when it was built)."""
    d = x.shape[-1]
    dtype = torch.promote_types(x.dtype, torch.float32)  # angles in fp32 at least, fp64 if given
    theta = base ** (-torch.arange(0, d, 2, device=x.device, dtype=dtype) / d)  # (d/2,)
    angles = (positions.to(dtype) / _position_divisor)[:, None] * theta  # (T, d/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., T, d/2) each
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi's head-specific slopes (Press et al. 2022, §3): a geometric sequence starting at
    ``2**(-8/n)``; for a head count that is not a power of two, the slopes of the closest power
    of two followed by every other slope of the next one, as in the paper's code."""
    check_positive_int(n_heads, "n_heads")

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(closest)
    if closest < n_heads:
        slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes)


def alibi_bias(n_heads: int, L: int, S: int | None = None, device: torch.device | str | None = None
               ) -> Tensor:
    r"""The additive ALiBi mask ``(n_heads, L, S)``: $-m_h\,|i - j|$ for query $i$ and key $j$.

    Pass it as a float ``attn_mask`` (it is added to the scores); combine with ``is_causal`` for a
    decoder, where only $j \le i$ remains and the bias is $-m_h (i - j)$ as in the paper.
    """
    check_positive_int(L, "L")
    S = L if S is None else check_positive_int(S, "S")
    i = torch.arange(L, device=device)[:, None]  # (L, 1)
    j = torch.arange(S, device=device)[None, :]  # (1, S)
    distance = (i - j).abs().float()  # (L, S)
    return -alibi_slopes(n_heads).to(device)[:, None, None] * distance  # (H, L, S)
