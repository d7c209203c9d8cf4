"""One self-attention call's peak memory, measured in a fresh Python process.

``python -m selfattn.book.kit.peak FUNCTION --length T --heads H --head-dim D [--backward]
[--threads N]`` prints the peak bytes the process held while it ran ``FUNCTION(x, x, x)`` on a
random ``x`` of shape ``(1, H, T, D)`` (:func:`~selfattn.book.kit.measure.process_peak_memory`),
or ``None`` where the operating system does not say. ``FUNCTION`` is a self-attention function
named by its import path (``selfattn.tiled_attention``,
``torch.nn.functional.scaled_dot_product_attention``); when it returns a tuple, its first item is
the output. With ``--backward`` the call is one forward and backward pass of the output's sum;
without, a forward pass with autograd off.

A fresh process has freed nothing it could reuse, so every page the call touches counts, a fused
kernel's own buffers included. Before the measured call the function runs once on 16 tokens, so
what a process allocates once (code, thread pools) is not counted; ``x`` is made before the
measurement, so it is not counted either (its gradient is).
:func:`~selfattn.book.kit.measure.fresh_process_peak_memory` runs this module.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

import torch
from torch import Tensor

from .measure import process_peak_memory


def attention(path: str) -> Callable[[Tensor], Tensor]:
    """The function at ``path`` (``module.name``) as self-attention on ``x``: its output for
    ``(x, x, x)``."""
    module, _, name = path.rpartition(".")
    fn = getattr(importlib.import_module(module), name)

    def call(x: Tensor) -> Tensor:
        out = fn(x, x, x)
        return out[0] if isinstance(out, tuple) else out

    return call


def step(fn: Callable[[Tensor], Tensor], x: Tensor, backward: bool) -> Tensor | None:
    """One call: the forward pass's output, or, with ``backward``, a forward and backward pass."""
    if not backward:
        return fn(x)
    fn(x).sum().backward()
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m selfattn.book.kit.peak", description=__doc__)
    parser.add_argument("function", help="a self-attention function by its import path")
    parser.add_argument("--length", type=int, required=True, help="T, the tokens of x")
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--head-dim", type=int, required=True)
    parser.add_argument("--backward", action="store_true", help="forward and backward, not forward")
    parser.add_argument("--threads", type=int, default=1, help="torch's threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(args.backward)
    fn = attention(args.function)
    step(fn, torch.randn(1, args.heads, 16, args.head_dim, requires_grad=args.backward), args.backward)
    x = torch.randn(1, args.heads, args.length, args.head_dim, requires_grad=args.backward)  # (1, H, T, D)
    print(process_peak_memory(lambda: step(fn, x, args.backward)))


if __name__ == "__main__":
    main()
