"""A small, deterministic training loop for the book's taggers, with a progress bar."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from .data import Sequences, TaggingData


@dataclass
class History:
    """What happened during training: the loss of every step."""

    loss: list[float] = field(default_factory=list)


def train(
    model: nn.Module,
    data: Sequences,
    steps: int = 300,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    progress: bool = True,
    desc: str = "training",
) -> History:
    """Train ``model`` to predict ``data.tags`` from ``data.tokens`` with Adam and cross-entropy.

    Batches are drawn with a generator seeded by ``seed``, so the same seed and the same initial
    weights give the same model. Shows a tqdm bar unless ``progress=False``.
    """
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    history = History()
    model.train()
    # TQDM_DISABLE=1 (set by the book build, where a bar would be a dead widget on a static
    # page) turns the bar off too: tqdm's notebook bar does not read it by itself
    disable = not progress or os.environ.get("TQDM_DISABLE", "0") not in ("", "0")
    for _ in tqdm(range(steps), desc=desc, leave=False, disable=disable):
        idx = torch.randint(0, len(data), (batch_size,), generator=g)
        tokens, tags = data.tokens[idx].to(device), data.tags[idx].to(device)
        logits = model(tokens)  # (B, T, n_tags)
        loss = F.cross_entropy(logits.flatten(0, 1), tags.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.loss.append(loss.item())
    model.eval()
    return history


@torch.no_grad()
def ambiguous_correct(model: nn.Module, data: TaggingData, batch_size: int = 512) -> Tensor:
    """Bool ``(N,)``: was the ambiguous word of each sequence tagged right?"""
    device = next(model.parameters()).device
    model.eval()
    out = []
    for start in range(0, len(data), batch_size):
        tokens = data.tokens[start : start + batch_size].to(device)
        pred = model(tokens).argmax(-1).cpu()  # (b, T)
        rows = torch.arange(pred.shape[0])
        pos = data.position[start : start + batch_size]
        out.append(pred[rows, pos] == data.tags[start : start + batch_size][rows, pos])
    return torch.cat(out)


def accuracy_by_distance(model: nn.Module, data: TaggingData) -> dict[int, float]:
    """Accuracy on the ambiguous word, for each cue distance present in ``data``."""
    correct = ambiguous_correct(model, data).float()
    return {int(k): correct[data.distance == k].mean().item() for k in data.distance.unique()}
