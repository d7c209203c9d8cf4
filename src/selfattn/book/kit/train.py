"""A small, deterministic training loop for the book's models, and the seed rule.

:func:`train` trains one model; :func:`train_seeds` trains one model per seed side by side, in one
batched run (``torch.func.vmap`` over the stacked weights), and gives the same models as calling
:func:`train` once per seed.

The seed rule: a conclusion drawn from training rests on at least :data:`MIN_SEEDS` seeds, and
the seeds come from one place, :func:`seed_range` (initial weights and batches) and
:func:`data_seed` (a task's data). Setting the environment variable ``SELFATTN_SEEDS_FROM=N``
shifts every seed both give by ``N``, so ``make robust`` re-runs every chapter that trains on a
range nobody chose; every assert must hold there too. :func:`k_of_n` prints a count over seeds,
:func:`seed_table`, :func:`seed_rows` and :func:`seed_frame` every seed's value.
"""

from __future__ import annotations

import copy
import os
import textwrap
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

if TYPE_CHECKING:
    import pandas as pd

MIN_SEEDS = 10


SEEDS_FROM = "SELFATTN_SEEDS_FROM"


def seeds_from() -> int:
    """The shift ``SELFATTN_SEEDS_FROM`` asks for: 0 when it is unset."""
    return int(os.environ.get(SEEDS_FROM, "").strip() or "0")


def seed_range(n: int = MIN_SEEDS) -> range:
    """The ``n`` seeds a chapter trains its models on (initial weights and batches):
    ``range(N, N + n)`` with ``N`` from ``SELFATTN_SEEDS_FROM`` (0 unless set).

    ``n`` below :data:`MIN_SEEDS` is refused: a conclusion from training rests on at least that
    many seeds.
    """
    if n < MIN_SEEDS:
        raise ValueError(f"a conclusion from training rests on at least {MIN_SEEDS} seeds, "
                         f"got n={n}")
    start = seeds_from()
    return range(start, start + n)


def data_seed(k: int = 0) -> int:
    """The seed of a task's ``k``-th draw of data (0 the training set, 1 the test set, ...),
    shifted like :func:`seed_range`, so a conclusion does not rest on one draw of the data."""
    return seeds_from() + k


def k_of_n(passed: Sequence[bool], seeds: Sequence[int]) -> str:
    """A count over seeds, with the range and the seeds that did not pass, named so a reader can
    look at them: ``"8 of 10 seeds (0-9); not seeds 3, 7"``."""
    passed, seeds = [bool(p) for p in passed], list(seeds)
    text = f"{sum(passed)} of {len(seeds)} seeds ({seeds[0]}-{seeds[-1]})"
    failed = [str(s) for s, p in zip(seeds, passed, strict=True) if not p]
    return text + (f"; not seed{'s' if len(failed) > 1 else ''} {', '.join(failed)}" if failed else "")


@dataclass(frozen=True)
class Sequences:
    """Token ids and one tag per token: what the taggers train on."""

    tokens: Tensor  # (N, T) token ids
    tags: Tensor  # (N, T) tag ids
    vocab_size: int
    n_tags: int

    def __len__(self) -> int:
        return self.tokens.shape[0]


@dataclass
class History:
    """What happened during training: the loss of every step, and if asked for, the weights
    every few steps (``snapshots``: (step, state_dict) pairs, the first at step 0)."""

    loss: list[float] = field(default_factory=list)
    snapshots: list[tuple[int, dict[str, Tensor]]] = field(default_factory=list)


def train(
    model: nn.Module,
    data: Sequences,
    steps: int = 300,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    progress: bool = True,
    desc: str = "training",
    snapshot_every: int | None = None,
) -> History:
    """Train ``model`` to predict ``data.tags`` from ``data.tokens`` with Adam and cross-entropy.

    Batches are drawn with a generator seeded by ``seed``, so the same seed and the same initial
    weights give the same model. Shows a tqdm bar unless ``progress=False``. Leaves the model in
    ``eval()`` mode. ``snapshot_every``: keep a copy of the weights every that many steps (and
    at the start and the end) in ``History.snapshots``, to measure how training went.
    """
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    history = History()
    model.train()
    for step in _steps(steps, desc, progress):
        if snapshot_every and step % snapshot_every == 0:
            history.snapshots.append((step, _copy(model.state_dict())))
        idx = torch.randint(0, len(data), (batch_size,), generator=g)
        tokens, tags = data.tokens[idx].to(device), data.tags[idx].to(device)
        logits = model(tokens)  # (B, T, n_tags)
        loss = F.cross_entropy(logits.flatten(0, 1), tags.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.loss.append(loss.item())
    if snapshot_every:
        history.snapshots.append((steps, _copy(model.state_dict())))
    model.eval()
    return history


def _snapshot(histories: list[History], step: int, params: dict, buffers: dict,
              keys: set[str]) -> None:
    stacked = {name: t for name, t in {**params, **buffers}.items() if name in keys}
    for i, history in enumerate(histories):  # seed i's slice of every stacked tensor
        history.snapshots.append((step, {name: t[i].detach().clone() for name, t in stacked.items()}))


def _copy(state: dict[str, Tensor]) -> dict[str, Tensor]:
    return {name: t.detach().clone() for name, t in state.items()}


def _steps(steps: int, desc: str, progress: bool):
    # TQDM_DISABLE=1 (set by the book build, where a bar would be a dead widget on a static
    # page) turns the bar off too: tqdm's notebook bar does not read it by itself
    disable = not progress or os.environ.get("TQDM_DISABLE", "0") not in ("", "0")
    return tqdm(range(steps), desc=desc, leave=False, disable=disable)


def train_seeds(
    make_model: Callable[[], nn.Module],
    data: Sequences,
    seeds: Sequence[int] | None = None,
    steps: int = 300,
    batch_size: int = 64,
    lr: float = 3e-3,
    progress: bool = True,
    desc: str = "training",
    snapshot_every: int | None = None,
) -> tuple[list[nn.Module], list[History]]:
    """One model per seed, trained side by side: ``torch.manual_seed(seed); make_model()``, then
    :func:`train` with that ``seed``, for every seed, as one batched computation.

    The models' weights are stacked along a new first axis (``torch.func.stack_module_state``) and
    the forward pass is ``vmap``-ed over it, each seed with its own batch, so one optimiser step
    moves every model. Adam works element by element, so these are the separate trainings, up to
    floating-point rounding (tested). ``snapshot_every`` keeps each seed's weights every that
    many steps, as in :func:`train`. ``seeds`` defaults to :func:`seed_range`. Recurrent layers
    (``nn.GRU``, ...), whose fused kernels cannot be batched this way, are trained one seed after
    the other. Returns the trained models
    (in ``eval()`` mode) and their histories.
    """
    if seeds is None:
        seeds = seed_range()
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(make_model())
    return _train_seeds(models, data, seeds, steps, batch_size, lr, progress, desc, snapshot_every)


def _train_seeds(models: list[nn.Module], data: Sequences, seeds: Sequence[int], steps: int,
                 batch_size: int, lr: float, progress: bool, desc: str,
                 snapshot_every: int | None) -> tuple[list[nn.Module], list[History]]:
    from torch.func import functional_call, stack_module_state, vmap

    if any(isinstance(m, nn.RNNBase) for m in models[0].modules()):
        # PyTorch's fused recurrent kernels have no batching rule: one seed after the other
        histories = [train(model, data, steps, batch_size, lr, seed, progress,
                           f"{desc}, seed {seed}", snapshot_every)
                     for model, seed in zip(models, seeds, strict=True)]
        return models, histories
    device = next(models[0].parameters()).device
    params, buffers = stack_module_state(models)  # name -> (n_seeds, *shape)
    skeleton = copy.deepcopy(models[0]).to("meta")  # the structure, without storage
    keys = set(models[0].state_dict())  # what a snapshot keeps: the persistent state

    def loss_of(p: dict, b: dict, tokens: Tensor, tags: Tensor) -> Tensor:
        logits = functional_call(skeleton, (p, b), (tokens,))  # (B, T, n_tags)
        return F.cross_entropy(logits.flatten(0, 1), tags.flatten())

    batched_loss = vmap(loss_of)  # one loss per seed
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    opt = torch.optim.Adam(params.values(), lr=lr)
    histories = [History() for _ in seeds]
    skeleton.train()
    with warnings.catch_warnings():  # a fused kernel without a batching rule runs once per seed
        warnings.filterwarnings("ignore", message=".*batching rule.*")
        for step in _steps(steps, desc, progress):
            if snapshot_every and step % snapshot_every == 0:
                _snapshot(histories, step, params, buffers, keys)
            idx = torch.stack([torch.randint(0, len(data), (batch_size,), generator=g)
                               for g in generators])  # (n_seeds, batch_size)
            losses = batched_loss(params, buffers, data.tokens[idx].to(device),
                                  data.tags[idx].to(device))  # (n_seeds,)
            opt.zero_grad()
            losses.sum().backward()  # seed s's loss reaches only seed s's weights
            opt.step()
            for history, loss in zip(histories, losses.tolist(), strict=True):
                history.loss.append(loss)
    if snapshot_every:
        _snapshot(histories, steps, params, buffers, keys)
    trained = {**params, **buffers}  # the weights, and the buffers training updates in place
    with torch.no_grad():  # (a BatchNorm's running statistics)
        for i, model in enumerate(models):
            for name, t in [*model.named_parameters(), *model.named_buffers()]:
                t.copy_(trained[name][i])
            model.eval()
    return models, histories


def seed_table(results: dict[str, list[float]], what: str = "accuracy", percent: bool = True,
               width: int = 86) -> str:
    """A text table of one number per seed for each arm of an experiment: the mean, the spread
    (lowest to highest) and every seed's value, so a reader sees how much seeds disagree. An arm
    whose line would be wider than ``width`` characters (ten seeds and more) gets its per-seed
    values on the lines under it, so the table fits a page's code block."""
    def fmt(x: float) -> str:
        return f"{x:.1%}" if percent else f"{x:.3f}"

    name_width = max(len(arm) for arm in results)
    lines = [f"{what}, over {max(len(v) for v in results.values())} seeds:",
             f"{'':{name_width}s}  mean (lowest..highest)  per seed"]
    for arm, values in results.items():
        mean = sum(values) / len(values)
        head = f"{arm:{name_width}s}  {fmt(mean):>8s} ({fmt(min(values))}..{fmt(max(values))})"
        seeds = " ".join(fmt(v) for v in values)
        if len(head) + 2 + len(seeds) <= width:
            lines.append(f"{head}  {seeds}")
        else:
            lines.append(head)
            lines += textwrap.wrap(seeds, width, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines)


def seed_rows(results: dict[str, list[float]], seeds: Sequence[int], what: str = "accuracy",
              fmt: str = "{:.1%}") -> str:
    """One row per seed, one column per arm, then each arm's mean and lowest..highest: the
    per-seed values of :func:`~selfattn.book.kit.train.seed_table`, turned so that ten or more
    seeds fit the page's width."""
    seeds = list(seeds)

    def show(x: float) -> str:  # a value that rounds to zero prints as zero, never "-0%"
        return fmt.format(0.0) if fmt.format(abs(x)) == fmt.format(0.0) else fmt.format(x)

    width = {arm: max(len(arm), len(fmt.format(1.0)) * 2 + 2) for arm in results}
    sw = max([4, *(len(str(s)) for s in seeds)])  # the seed column fits the widest seed
    lines = [f"{what}, over {len(seeds)} seeds:",
             f"{'seed':<{sw}s}  " + "  ".join(f"{arm:>{width[arm]}s}" for arm in results)]
    for i, seed in enumerate(seeds):
        lines.append(f"{seed:<{sw}d}  " + "  ".join(f"{show(v[i]):>{width[arm]}s}"
                                                  for arm, v in results.items()))
    means = [show(sum(v) / len(v)) for v in results.values()]
    spans = [f"{show(min(v))}..{show(max(v))}" for v in results.values()]
    for label, row in (("mean", means), ("span", spans)):
        lines.append(f"{label:<{sw}s}  " + "  ".join(f"{m:>{width[a]}s}"
                                                     for m, a in zip(row, results, strict=True)))
    return "\n".join(lines)


def seed_frame(results: Mapping[str, Sequence[float]], seeds: Sequence[int],
               percent: bool = True, digits: int = 3) -> pd.DataFrame:
    """One number per seed for each arm of an experiment, as a table narrow enough for the page
    at ten seeds and more: a column per arm, a row per seed, then the mean and the range
    (lowest..highest) over seeds. ``train.seed_table`` holds the same numbers, one line per arm."""
    import pandas as pd

    seeds = list(seeds)

    def fmt(x: float) -> str:
        return f"{x:.1%}" if percent else f"{x:.{digits}f}"

    table = {arm: [fmt(v) for v in values]
             + [fmt(sum(values) / len(values)), f"{fmt(min(values))}..{fmt(max(values))}"]
             for arm, values in results.items()}
    index = [f"seed {s}" for s in seeds] + ["mean", "range"]
    return pd.DataFrame(table, index=index)
