"""The seed rule (CONTRIBUTING, rule 8): a conclusion from training rests on at least ten seeds,
which come from one place (``train.seed_range``, ``train.data_seed``) so that
``SELFATTN_SEEDS_FROM`` moves every chapter onto another range (``make robust``).

The chapters are read, not run: every ``train_seeds`` call must take its seeds from
``seed_range`` with at least ``MIN_SEEDS`` of them (traced through the notebook's own
assignments, including a ``dict(seeds=...)`` passed with ``**``), and every dataset a chapter
draws (a ``*_task`` call of more than one sequence) must take its seed from ``data_seed``.
"""

from __future__ import annotations

import ast
import json
import pathlib

import pytest

from selfattn.book.kit import train

CHAPTERS = sorted((pathlib.Path(__file__).parent.parent / "chapters").glob("*.ipynb"))


def _tree(path: pathlib.Path) -> ast.Module:
    cells = json.loads(path.read_text())["cells"]
    code = []
    for cell in cells:
        if cell["cell_type"] == "code":
            lines = "".join(cell["source"]).splitlines()
            code += [line for line in lines if not line.lstrip().startswith(("%", "!"))]
    return ast.parse("\n".join(code))


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _assignments(tree: ast.Module) -> dict[str, ast.expr]:
    out: dict[str, ast.expr] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                out[target.id] = node.value
    return out


def _resolve(node: ast.expr, names: dict[str, ast.expr]) -> ast.expr:
    seen = 0
    while isinstance(node, ast.Name) and node.id in names and seen < 10:
        node, seen = names[node.id], seen + 1
    return node


def _int(node: ast.expr, names: dict[str, ast.expr]) -> int | None:
    node = _resolve(node, names)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    return None


def _seeds_problem(call: ast.Call, names: dict[str, ast.expr]) -> str | None:
    """Why this ``train_seeds`` call breaks the rule, or None."""
    seeds: ast.expr | None = None
    for kw in call.keywords:
        if kw.arg == "seeds":
            seeds = kw.value
        elif kw.arg is None:  # **BUDGET: look inside the dict it names
            budget = _resolve(kw.value, names)
            if isinstance(budget, ast.Call) and _name(budget.func) == "dict":
                seeds = next((k.value for k in budget.keywords if k.arg == "seeds"), seeds)
    if seeds is None and len(call.args) >= 3:
        seeds = call.args[2]
    if seeds is None:
        return None  # the default: seed_range()
    seeds = _resolve(seeds, names)
    if not (isinstance(seeds, ast.Call) and _name(seeds.func) == "seed_range"):
        return f"seeds={ast.unparse(seeds)} does not come from train.seed_range"
    if seeds.args:
        n = _int(seeds.args[0], names)
        if n is None or n < train.MIN_SEEDS:
            return f"seed_range({ast.unparse(seeds.args[0])}) is not at least {train.MIN_SEEDS}"
    return None


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_training_run_takes_ten_seeds_from_seed_range(path):
    tree = _tree(path)
    names = _assignments(tree)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) == "train_seeds":
            problem = _seeds_problem(node, names)
            if problem:
                problems.append(f"line {node.lineno}: {problem}")
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("train", "train.train"):
            problems.append(f"line {node.lineno}: a single-seed train(...); use train_seeds")
    assert not problems, f"{path.name}: " + "; ".join(problems)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_dataset_takes_its_seed_from_data_seed(path):
    tree = _tree(path)
    names = _assignments(tree)
    problems = []
    for node in ast.walk(tree):
        fname = _name(node.func) if isinstance(node, ast.Call) else None
        if not (fname and fname.endswith("_task")):
            continue
        assert isinstance(node, ast.Call)
        size = _int(node.args[0], names) if node.args else None
        if size is not None and size <= 1:
            continue  # one example sequence, shown to the reader
        seed = next((kw.value for kw in node.keywords if kw.arg == "seed"), None)
        seed = _resolve(seed, names) if seed is not None else None
        if not (isinstance(seed, ast.Call) and _name(seed.func) == "data_seed"):
            shown = ast.unparse(seed) if seed is not None else "the default"
            problems.append(f"line {node.lineno}: {fname}(...) seed={shown}, not data_seed(...)")
    assert not problems, f"{path.name}: " + "; ".join(problems)


def test_the_rule_catches_what_it_should():
    """The checker itself, on small pieces of code that break the rule and that keep it."""
    def problems(code: str) -> list[str | None]:
        tree = ast.parse(code)
        names = _assignments(tree)
        return [_seeds_problem(n, names) for n in ast.walk(tree)
                if isinstance(n, ast.Call) and _name(n.func) == "train_seeds"]

    assert problems("train.train_seeds(m, d, seeds=[0, 1, 2])")[0]
    assert problems("S = [0, 1, 2]\nB = dict(seeds=S)\ntrain.train_seeds(m, d, **B)")[0]
    assert problems("S = train.seed_range(3)\ntrain.train_seeds(m, d, seeds=S)")[0]
    assert problems("train_seeds(m, d, range(10))")[0]
    assert problems("S = train.seed_range()\nB = dict(seeds=S)\ntrain.train_seeds(m, d, **B)") == [None]
    assert problems("N = 12\ntrain_seeds(m, d, seeds=seed_range(N))") == [None]
    assert problems("train.train_seeds(m, d, steps=5)") == [None]


def test_seed_range_and_data_seed_move_together(monkeypatch):
    monkeypatch.delenv(train.SEEDS_FROM, raising=False)
    assert train.seed_range() == range(0, train.MIN_SEEDS)
    assert train.data_seed(1) == 1
    monkeypatch.setenv(train.SEEDS_FROM, "500")
    assert train.seed_range(12) == range(500, 512)
    assert train.data_seed() == 500 and train.data_seed(2) == 502


def test_fewer_than_ten_seeds_is_refused():
    with pytest.raises(ValueError, match="at least 10 seeds"):
        train.seed_range(3)


def test_k_of_n_names_the_seeds_that_did_not_pass():
    assert train.k_of_n([True] * 10, range(0, 10)) == "10 of 10 seeds (0-9)"
    assert train.k_of_n([True, False, True, False], range(20, 24)) == \
        "2 of 4 seeds (20-23); not seeds 21, 23"
    assert train.k_of_n([False, True], [5, 6]).endswith("not seed 5")
