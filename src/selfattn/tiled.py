r"""Tiled attention with an online softmax: exact attention that never holds the ``(L, S)`` scores.

A softmax over a row of scores needs the row's maximum $m$ (to keep $e^{s - m}$ from
overflowing) and its sum $\ell = \sum_k e^{s_k - m}$ before the first weight is known. The online
softmax (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax") keeps both as
running values while it reads the row one block of columns at a time; after block $j$,

$$m^{(j)} = \max\big(m^{(j-1)},\, \max_k s^{(j)}_k\big), \qquad
\ell^{(j)} = e^{m^{(j-1)} - m^{(j)}}\, \ell^{(j-1)} + \sum_k e^{s^{(j)}_k - m^{(j)}}:$$

when the maximum grows, everything summed so far is rescaled by $e^{m^{(j-1)} - m^{(j)}}$.
Attention rescales its unnormalised output $O = \sum_k e^{s_k - m} v_k$ the same way, and
divides once, at the end:

$$O^{(j)} = e^{m^{(j-1)} - m^{(j)}}\, O^{(j-1)} + e^{s^{(j)} - m^{(j)}}\, V^{(j)}, \qquad
\operatorname{Attention}(Q, K, V) = O^{(\text{last})} / \ell^{(\text{last})}.$$

FlashAttention (Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention with
IO-Awareness", §3.1, Algorithm 1) computes attention tile by tile this way, with the key blocks in
the outer loop: it renormalises $O$ at every step and writes $O$, $\ell$ and $m$ back to memory
after each key block. This module follows FlashAttention-2 (Dao 2023, §3.1, Algorithm 1, and
§3.2): the query blocks are the outer loop and each block's $O$ stays unnormalised until one
division at the end. The swap makes the query blocks independent (on a GPU, one program each, with nothing
written back between key blocks). One tile of scores exists at a time, so memory grows as
$L + S$ instead of $L \cdot S$, and tiles that a mask hides entirely are never computed.

The backward pass needs the weights $P$ again, and storing them would bring the $L \cdot S$ back.
FlashAttention recomputes them instead (Dao et al. 2022, §3.1, "Recomputation"): the forward
keeps only each row's log-sum-exp $\mathrm{lse} = m + \log \ell$, and the backward recomputes a
tile's weights from $Q$ and $K$ as $P = e^{S - \mathrm{lse}}$, already normalised. With
$D = \operatorname{rowsum}(dO \circ O)$, each tile then adds its share of every gradient
(the per-tile equations of FlashAttention-2, Dao 2023, Algorithm 2):

$$dV \mathrel{+}= P^\top dO, \qquad dP = dO\, V^\top, \qquad dS = P \circ (dP - D), \qquad
dQ \mathrel{+}= dS\, K \cdot \text{scale}, \qquad dK \mathrel{+}= dS^\top Q \cdot \text{scale}.$$

$D$ is the softmax's backward in one number per row: $\sum_k P_k\, dP_k = dO \cdot O$. Autograd
keeps the inputs, the output and the log-sum-exp, $O(L + S)$, instead of every tile. The loops
here keep the forward's order, query blocks outside; FlashAttention-2's backward puts the key
blocks outside, so that a GPU program keeps its $dK$ and $dV$ on chip (adding into them from
many query blocks at once would need atomic additions) and only $dQ$ is accumulated in memory.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .checks import check_attention_inputs, check_positive_int, check_tensor
from .masks import causal_mask


def running_max_and_sum(scores: Tensor, block_size: int) -> list[tuple[Tensor, Tensor]]:
    r"""The online softmax's running $(m, \ell)$ over the last axis of ``scores`` (..., S), after
    each block of ``block_size`` columns: ``(..., 1)`` each. The last pair is the row's maximum
    and its $\sum_k e^{s_k - m}$."""
    check_tensor(scores, "scores")
    check_positive_int(block_size, "block_size")
    m = torch.full_like(scores[..., :1], torch.finfo(scores.dtype).min)  # (..., 1): max so far
    l = torch.zeros_like(m)  # (..., 1): sum of exp(s - m) so far
    history = []
    for j in range(0, scores.shape[-1], block_size):
        s = scores[..., j : j + block_size]  # (..., b)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (..., 1)
        l = torch.exp(m - m_new) * l + torch.exp(s - m_new).sum(dim=-1, keepdim=True)  # (..., 1)
        m = m_new
        history.append((m, l))
    return history


def online_softmax(scores: Tensor, block_size: int) -> Tensor:
    """``torch.softmax(scores, dim=-1)`` in two passes: the running maximum and sum, read one
    block of columns at a time (:func:`running_max_and_sum`), then one division."""
    m, l = running_max_and_sum(scores, block_size)[-1]  # (..., 1), (..., 1)
    return torch.exp(scores - m) / l  # (..., S)


def tiled_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_size: int = 256,
) -> Tensor:
    r"""$\operatorname{softmax}(QK^\top \cdot \text{scale} + M)\,V$, one tile of scores at a time.

    Arguments as in :func:`selfattn.scaled_dot_product_attention`, without dropout: a bool
    ``attn_mask`` is True where a query may attend, a float one is added to the scores;
    ``is_causal`` masks key ``j > i`` for query ``i`` (top-left aligned), ANDed with
    ``attn_mask``. Everything after ``attn_mask`` is keyword-only: PyTorch's fifth argument is
    ``dropout_p``, which this function does not take, so ``tiled_attention(q, k, v, None, 0.1)``
    is an error, not a causal call. A tile is ``block_size`` queries by ``block_size`` keys.
    Returns the output ``(..., L, Ev)`` in the inputs' dtype (accumulated in float32 for half
    precision), zero where every key is masked. The weights are never formed, in the forward
    (:func:`tiled_forward`) or in the backward, which recomputes them tile by tile
    (:func:`tiled_backward`); a fully masked row gets zero gradients.
    """
    check_attention_inputs(query, key, value, attn_mask, 0.0)
    b = check_positive_int(block_size, "block_size")
    (L, E), S, Ev = query.shape[-2:], key.shape[-2], value.shape[-1]
    batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    dtype = torch.promote_types(query.dtype, torch.float32)  # fp16/bf16 -> fp32, fp64 stays
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    # views with the whole batch (autograd sums their gradients back to the inputs' shapes)
    q = query.to(dtype).expand(*batch, L, E)  # (..., L, E)
    k = key.to(dtype).expand(*batch, S, E)  # (..., S, E)
    v = value.to(dtype).expand(*batch, S, Ev)  # (..., S, Ev)
    if attn_mask is not None:  # in its own shape: the tiles read it through a broadcast view
        attn_mask = attn_mask if attn_mask.dtype == torch.bool else attn_mask.to(dtype)
    out: Tensor = _TiledAttention.apply(q, k, v, attn_mask, is_causal, scale, b)  # (..., L, Ev)
    return out.to(query.dtype)


class _TiledAttention(torch.autograd.Function):
    """Autograd for :func:`tiled_attention`: saves the inputs, the output and the log-sum-exp,
    and recomputes the tiles in backward."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None,
                is_causal: bool, scale: float, block_size: int) -> Tensor:
        out, lse = tiled_forward(q, k, v, _full(attn_mask, q, k), is_causal, scale, block_size)
        ctx.save_for_backward(q, k, v, attn_mask, out, lse)
        ctx.options = is_causal, scale, block_size
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, attn_mask, out, lse = ctx.saved_tensors
        mask_grad = ctx.needs_input_grad[3]
        dq, dk, dv, dmask = tiled_backward(grad_out, q, k, v, attn_mask, out, lse, *ctx.options,
                                           mask_grad=mask_grad)
        return dq, dk, dv, dmask, None, None, None


def _full(mask: Tensor | None, q: Tensor, k: Tensor) -> Tensor | None:
    """``mask`` (broadcastable to the scores) as a view of the scores' whole shape
    ``(..., L, S)``, for slicing into tiles: no copy."""
    return None if mask is None else mask.broadcast_to(*q.shape[:-1], k.shape[-2])


def _key_blocks(i: int, b: int, S: int, is_causal: bool) -> range:
    """The first key of every block that the query block starting at ``i`` reads. Causal: the
    key blocks right of the diagonal are masked for every query of the block, so they stop at
    the diagonal and are never computed."""
    return range(0, min(S, i + b) if is_causal else S, b)


def _tile_scores(q_i: Tensor, k_j: Tensor, mask: Tensor | None, diagonal: bool) -> Tensor:
    """One tile's masked scores ``q_i @ k_jᵀ + M`` (``q_i`` already scaled), ``-inf`` where
    masked; ``diagonal``: the causal tile on the diagonal, whose keys after each query are
    masked too."""
    s = q_i @ k_j.transpose(-2, -1)  # (..., Lb, Sb): this tile's buffer
    if mask is not None and mask.dtype == torch.bool:
        s.masked_fill_(~mask, -math.inf)
    elif mask is not None:
        s.add_(mask)
    if diagonal:
        s.masked_fill_(~causal_mask(s.shape[-2], s.shape[-1], device=s.device), -math.inf)
    return s


def _hidden(mask: Tensor | None) -> bool:
    """Whether a bool mask tile hides every key from every query: such a tile adds nothing."""
    return mask is not None and mask.dtype == torch.bool and not mask.any()


def tiled_forward(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool,
                  scale: float, block_size: int) -> tuple[Tensor, Tensor]:
    r"""The online softmax over tiles (FlashAttention-2, Algorithm 1): the output ``(..., L, Ev)``
    and each row's log-sum-exp $m + \log \ell$, ``(..., L, 1)``, ``+inf`` for a row with every key
    masked (its output is 0, and $e^{s - \mathrm{lse}} = 0$ then gives it zero weights in
    backward). The unchecked core of :func:`tiled_attention`, in one dtype: ``q`` (..., L, E)
    with the whole batch, ``k`` (..., S, E), ``v`` (..., S, Ev), a mask (..., L, S) or None."""
    b, L, S, Ev = block_size, q.shape[-2], k.shape[-2], v.shape[-1]
    outputs, lses = [], []
    for i in range(0, L, b):  # a block of queries ...
        q_i = q[..., i : i + b, :] * scale  # (..., Lb, E)
        # m starts at the lowest finite number, not -inf: exp(m - m_new) is then never NaN
        m = q_i.new_full((*q_i.shape[:-1], 1), torch.finfo(q.dtype).min)  # (..., Lb, 1)
        l = torch.zeros_like(m)  # (..., Lb, 1)
        acc = q_i.new_zeros(*q_i.shape[:-1], Ev)  # (..., Lb, Ev): O, not yet divided by l
        for j in _key_blocks(i, b, S, is_causal):  # ... against a block of keys
            mask = None if attn_mask is None else attn_mask[..., i : i + b, j : j + b]  # (..., Lb, Sb)
            if _hidden(mask):
                continue
            s = _tile_scores(q_i, k[..., j : j + b, :], mask, is_causal and j == i)  # (..., Lb, Sb)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (..., Lb, 1)
            alpha = torch.exp(m - m_new)  # (..., Lb, 1): rescales what came before
            p = s.sub_(m_new).exp_()  # (..., Lb, Sb): exp(s - m_new), in s's buffer
            l = alpha * l + p.sum(dim=-1, keepdim=True)  # (..., Lb, 1)
            acc = alpha * acc + p @ v[..., j : j + b, :]  # (..., Lb, Ev)
            m = m_new
        dead = l == 0  # (..., Lb, 1): rows with every key masked
        outputs.append(acc / l.masked_fill(dead, 1.0))  # (..., Lb, Ev); masked rows stay 0
        lses.append((m + torch.log(l)).masked_fill(dead, math.inf))  # (..., Lb, 1)
    return torch.cat(outputs, dim=-2), torch.cat(lses, dim=-2)  # (..., L, Ev), (..., L, 1)


def tiled_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None,
                   out: Tensor, lse: Tensor, is_causal: bool, scale: float, block_size: int, *,
                   mask_grad: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    r"""The gradients of :func:`tiled_forward` with respect to ``q``, ``k``, ``v`` and a float
    mask (None unless ``mask_grad``), recomputing each tile's weights $P = e^{S - \mathrm{lse}}$
    (the per-tile equations of FlashAttention-2, Dao 2023, Algorithm 2, in the forward's loop
    order): with $D = \operatorname{rowsum}(dO \circ O)$,
    $dV \mathrel{+}= P^\top dO$, $dS = P \circ (dO\,V^\top - D)$,
    $dQ \mathrel{+}= dS\,K \cdot \text{scale}$, $dK \mathrel{+}= dS^\top Q \cdot \text{scale}$,
    and the mask's gradient is $dS$, summed tile by tile over the dims the mask broadcasts over,
    into a tensor of the mask's own shape (a per-key bias ``(B, 1, 1, S)`` gets ``B * S``
    numbers, never an ``(L, S)`` one). ``attn_mask`` broadcasts to the scores. The same tiles as
    the forward: those a bool mask hides, and causal ones past the diagonal, are skipped.
    """
    b, L, S = block_size, q.shape[-2], k.shape[-2]
    D = (grad_out * out).sum(dim=-1, keepdim=True)  # (..., L, 1)
    dq, dk, dv = q.new_zeros(q.shape), k.new_zeros(k.shape), v.new_zeros(v.shape)
    full = _full(attn_mask, q, k)  # (..., L, S), a view
    dmask = None
    if mask_grad and attn_mask is not None:  # the mask's shape, its missing leading dims as 1
        dmask = attn_mask.new_zeros((1,) * (q.dim() - attn_mask.dim()) + tuple(attn_mask.shape))
    for i in range(0, L, b):  # a block of queries ...
        rows = slice(i, i + b)
        q_i = q[..., rows, :] * scale  # (..., Lb, E)
        do_i = grad_out[..., rows, :]  # (..., Lb, Ev)
        for j in _key_blocks(i, b, S, is_causal):  # ... against a block of keys
            cols = slice(j, j + b)
            mask = None if full is None else full[..., rows, cols]  # (..., Lb, Sb)
            if _hidden(mask):
                continue
            s = _tile_scores(q_i, k[..., cols, :], mask, is_causal and j == i)  # (..., Lb, Sb)
            p = s.sub_(lse[..., rows, :]).exp_()  # (..., Lb, Sb): the weights, recomputed
            dv[..., cols, :] += p.transpose(-2, -1) @ do_i  # (..., Sb, Ev)
            dp = do_i @ v[..., cols, :].transpose(-2, -1)  # (..., Lb, Sb)
            ds = p.mul_(dp.sub_(D[..., rows, :]))  # (..., Lb, Sb): in p's buffer
            dq[..., rows, :] += (ds @ k[..., cols, :]) * scale  # (..., Lb, E)
            dk[..., cols, :] += ds.transpose(-2, -1) @ q_i  # (..., Sb, E): q_i holds the scale
            if dmask is not None:  # the tile's share, in the mask's shape (a row or column of 1)
                tile = dmask[..., rows if dmask.shape[-2] > 1 else slice(None),
                             cols if dmask.shape[-1] > 1 else slice(None)]
                tile += ds.sum_to_size(tile.shape)  # (..., Lb or 1, Sb or 1)
    return dq, dk, dv, None if dmask is None or attn_mask is None else dmask.view(attn_mask.shape)
