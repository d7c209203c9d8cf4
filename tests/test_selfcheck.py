"""The on-page self-checks, without a built book: the HTML that `selfattn.book.kit.selfcheck` writes,
the note a live kernel shows instead (no answer in it), its argument checks, the chapters'
self-check cells (where they sit, and that each expected value is one its exercise's checker
accepts, from a function of the exercise's topic module, never by running a notebook), and the page's
script `assets/selfcheck.js` in Node: parsing what a reader types and the verdict.

tests/test_selfcheck_browser.py checks the same widgets in the built book, in a browser.
"""

import ast
import html.parser
import inspect
import json
import math
import pathlib
import re
import shutil
import subprocess

import pytest
import torch

import selfattn
from selfattn.book import decoding, multi_head, performance, pitfalls, single_head
from selfattn.book.kit import measure
from selfattn.book.kit.selfcheck import CLOSE, DEFAULT_RTOL, MAX_EXACT, self_check
from selfattn.book.kit.viz import STATIC_ENV

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
SCRIPT = ROOT / "assets" / "selfcheck.js"
MESSAGES = ROOT / "assets" / "messages.js"  # its words, loaded before it as in the page
NODE = shutil.which("node")


# --- the Python side: what the cell displays ---------------------------------------------------


class _Widget(html.parser.HTMLParser):
    """The tags of a self-check's HTML, with their attributes, and its text."""

    def __init__(self, source):
        super().__init__()
        self.tags, self.text = [], []
        self.feed(source)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def first(self, tag, **attrs):
        return next(a for t, a in self.tags if t == tag and all(a.get(k) == v for k, v in attrs.items()))


def bundle(check, static, monkeypatch):
    if static:
        monkeypatch.setenv(STATIC_ENV, "1")
    else:
        monkeypatch.delenv(STATIC_ENV, raising=False)
    return check._repr_mimebundle_()


@pytest.mark.parametrize("expected, kind, data", [
    (4_294_967_296, "count", 4_294_967_296),
    (25.0, "number", 25.0),
    (0.125, "number", 0.125),
    ((12, 5, 7), "shape", [12, 5, 7]),
    (torch.Size([2, 12, 10, 64]), "shape", [2, 12, 10, 64]),
])
def test_static_html_carries_the_kind_and_the_expected_value(expected, kind, data, monkeypatch):
    check = self_check("How many <bytes> does `x` take, at d = 64?", expected, kind=kind)
    shown = bundle(check, static=True, monkeypatch=monkeypatch)
    widget = _Widget(shown["text/html"])
    box = widget.first("div", **{"class": "selfattn-selfcheck"})
    assert box["data-kind"] == kind
    assert json.loads(box["data-expected"]) == data
    assert ("data-rtol" in box) == (kind == "number")
    assert "data-unit" not in box and "data-hints" not in box  # a plain number, no hints
    if kind == "number":
        assert float(box["data-rtol"]) == DEFAULT_RTOL
    field = widget.first("input")
    assert field["type"] == "text"
    assert widget.first("label")["for"] == field["id"]  # the question labels the text box
    verdict = widget.first("p", role="status")
    assert field["aria-describedby"] == verdict["id"]  # ... and the verdict describes it
    assert "Your answer." in "".join(widget.text)
    assert not any(t == "details" for t, _ in widget.tags), "one reveal: the exercise's solution"
    assert widget.first("button") is not None
    assert widget.first("p", role="status") is not None
    assert "<bytes>" not in shown["text/html"] and "&lt;bytes&gt;" in shown["text/html"]
    assert "<code>x</code>" in shown["text/html"]  # backticks: code
    assert "How many <bytes> does x take, at d = 64?" in "".join(widget.text)
    assert shown["text/plain"] == check.note()  # a plain fallback, without the answer


def test_a_number_keeps_its_own_tolerance(monkeypatch):
    box = _Widget(self_check("q?", 2.5, rtol=0.01).html()).first("div")
    assert float(box["data-rtol"]) == 0.01


@pytest.mark.parametrize("kind, expected", [("count", 4_294_967_296), ("number", 1.5 * 2**20)])
def test_a_question_about_bytes_says_so_and_asks_for_bytes(kind, expected):
    check = self_check("How many bytes?", expected, kind=kind, unit="bytes")
    widget = _Widget(check.html())
    assert widget.first("div")["data-unit"] == "bytes"
    assert widget.first("input")["placeholder"].startswith("bytes, e.g.")
    plain = _Widget(self_check("How many FLOPs?", 2**38, kind="count").html())
    assert "data-unit" not in plain.first("div") and "MiB" not in plain.first("input")["placeholder"]


def test_hints_are_written_as_json_pairs_and_escaped():
    check = self_check("How many FLOPs?", 2**38, kind="count",
                       hints={0.5: 'a multiply-add counts as "two" FLOPs.', 2: "  once   only. "})
    assert check.hints == ((0.5, 'a multiply-add counts as "two" FLOPs.'), (2.0, "once only."))
    box = _Widget(check.html()).first("div")  # the parser unescapes the attribute
    assert json.loads(box["data-hints"]) == [[0.5, 'a multiply-add counts as "two" FLOPs.'],
                                             [2.0, "once only."]]
    assert '"two"' not in check.html()  # the quotes inside the attribute are escaped


@pytest.mark.parametrize("expected, kind", [
    (327_680, "count"), (25.0, "number"), (2.5, "number"), ((12, 5, 7), "shape"), (128, "count")])
def test_a_live_kernel_gets_one_plain_line_without_the_answer(expected, kind, monkeypatch):
    check = self_check("How much does a cache of 80 layers hold?", expected, kind=kind)
    shown = bundle(check, static=False, monkeypatch=monkeypatch)
    assert set(shown) == {"text/plain"}  # no HTML: the page's script is not loaded in a kernel
    note = shown["text/plain"]
    assert "\n" not in note and note.startswith("Self-check: How much does a cache of 80 layers hold?")
    assert "checker cell below" in note
    if kind == "shape":
        forms = [str(expected), ", ".join(map(str, expected))]
    else:
        forms = [str(expected), repr(expected), f"{expected:,}", f"{expected:g}"]
    for form in forms:
        assert form not in note.removeprefix("Self-check: How much does a cache of 80 layers hold?")
        assert form not in repr(check)  # printing the object gives nothing away either


@pytest.mark.parametrize("factor", [1.01, 0.99, 1.02, 0.985])
def test_a_hint_is_further_from_the_answer_than_close_reaches(factor):
    """A hint's slip is matched within 1 % (CLOSE), as "close" is: a factor whose band would
    overlap the answer's is refused."""
    with pytest.raises(AssertionError, match="'close' reaches"):
        self_check("q?", 1000, kind="count", hints={factor: "a slip."})
    assert self_check("q?", 1000, kind="count", hints={1.03: "a slip.", 0.97: "a slip."}).hints


def test_the_question_is_one_line():
    assert self_check("  How many\n  heads?  ", 3, kind="count").question == "How many heads?"


@pytest.mark.parametrize("args, kwargs", [
    (("q?", 3), {"kind": "integer"}),  # no such kind: the page could not read it
    (("q?", math.inf), {}),  # no finite answer
    (("q?", 2**53), {"kind": "count"}),  # more than JavaScript holds exactly
    (("q?", (2, -1)), {"kind": "shape"}),
    (("q?", 128), {"kind": "count", "rtol": 0.1}),  # a count is right only when equal
    (("q?", 3), {"kind": "count", "unit": "GiB"}),  # the page knows bytes only
    (("q?", 8), {"kind": "count", "hints": {1.005: "near"}}),  # "close" would answer first
])
def test_what_the_page_relies_on_is_asserted(args, kwargs):
    with pytest.raises(AssertionError):
        self_check(*args, **kwargs)


def test_the_largest_exact_count_is_accepted():
    assert self_check("q?", MAX_EXACT, kind="count").expected == MAX_EXACT


# --- the chapters: where the self-checks sit, and that each agrees with its checker ----------


def cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def source(cell):
    return "".join(cell["source"])


def is_self_check(cell):
    return cell["cell_type"] == "code" and re.search(r"^self_check\(", source(cell), re.M)


CHECK_CALL = re.compile(r"selfattn\.book\.\w+\.check_")
# the modules a self-check may take its expected value from: a topic, or the kit's measurements
SOURCES = {"single_head": single_head, "multi_head": multi_head, "pitfalls": pitfalls,
           "performance": performance, "decoding": decoding, "measure": measure}
SELF_CHECKS = [(path.stem, i, source(c)) for path in CHAPTERS
               for i, c in enumerate(cells(path)) if is_self_check(c)]


def test_at_least_ten_self_checks_across_the_book():
    assert len(SELF_CHECKS) >= 10, [(name, i) for name, i, _ in SELF_CHECKS]


def tags(cell):
    return cell["metadata"].get("tags", [])


PLACEHOLDER = re.compile(r"\bNone\b.*#\s*your")  # the answer cell's blank: `x = None  # your answer`


@pytest.mark.parametrize("name, index, text", SELF_CHECKS, ids=lambda x: str(x)[:20])
def test_a_self_check_follows_its_exercise_and_shows_only_its_widget(name, index, text):
    """The exercise block on the page: the exercise's text (and the code it is about, in a
    find-the-bug exercise), the self-check (the place to answer), the folded solution. The
    notebook's answer cell and checker stay for a reader who runs it, removed from the page."""
    all_cells = cells(ROOT / "chapters" / f"{name}.ipynb")
    cell = all_cells[index]
    assert "remove-input" in tags(cell), "the page shows the widget alone"
    before = all_cells[index - 1]
    if before["cell_type"] == "code":  # the code a find-the-bug exercise shows
        assert not PLACEHOLDER.search(source(before)) and "remove-cell" not in tags(before)
        assert not CHECK_CALL.search(source(before))
        before = all_cells[index - 2]
    else:
        answer = all_cells[index + 1]
        assert PLACEHOLDER.search(source(answer)), "a blank answer cell follows the self-check"
        assert "remove-cell" in tags(answer), "the page's one place to answer is the self-check"
    assert before["cell_type"] == "markdown" and "**Exercise" in source(before), (
        "a self-check goes right after its exercise's text")
    checker = next(c for c in all_cells[index + 1:] if c["cell_type"] == "code"
                   and CHECK_CALL.search(source(c)))
    assert all_cells.index(checker) - index in (1, 2), "the checker follows the answer cell"
    assert "remove-cell" in tags(checker), "no verdict on the page that nobody asked for"
    for out in cell["outputs"]:  # the committed notebook ran live: the note, no HTML
        assert set(out.get("data", {})) == {"text/plain"}, "commit the notebook executed live"
        assert "".join(out["data"]["text/plain"]).startswith("Self-check:")


def _givens(tree):
    """The literal assignments of a cell (``L = S = 4096``, ``d, v = 100, 0.5``) as name -> value."""
    known = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            continue
        for target in node.targets:
            if isinstance(target, ast.Name):
                known[target.id] = value
            elif isinstance(target, ast.Tuple) and isinstance(value, tuple):
                known.update({t.id: v for t, v in zip(target.elts, value, strict=True)})
    return known


def _expected_call(text):
    """The self-check's expected value as (its function, the function's name, its arguments, the
    ``kind``):
    read from the cell's code, the sizes resolved from its literal assignments."""
    tree = ast.parse(text)
    known = _givens(tree)
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Name) and n.func.id == "self_check")
    expected = call.args[1]
    if isinstance(expected, ast.Name):  # expected = recall....(...) earlier in the cell
        expected = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                        and any(isinstance(t, ast.Name) and t.id == expected.id for t in n.targets))
    assert isinstance(expected, ast.Call) and isinstance(expected.func, ast.Attribute), (
        "compute the expected value with a function of the exercise's topic module")
    assert isinstance(expected.func.value, ast.Name) and expected.func.value.id in SOURCES

    def value(node):
        if isinstance(node, ast.Name):
            return known[node.id]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
            return getattr(torch, node.attr)
        return ast.literal_eval(node)

    kind = next((ast.literal_eval(k.value) for k in call.keywords if k.arg == "kind"), "number")
    function = getattr(SOURCES[expected.func.value.id], expected.func.attr)
    return function, expected.func.attr, [value(a) for a in expected.args], kind


def _keyword(text, name):
    """The literal value of keyword ``name`` of the cell's self_check call, None when not given."""
    call = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Name) and n.func.id == "self_check")
    return next((ast.literal_eval(k.value) for k in call.keywords if k.arg == name), None)


_ITEMSIZE = {4: torch.float32, 2: torch.float16}  # bfloat16 takes the bytes of float16


def _from_arange(shape):
    return torch.arange(math.prod(shape)).reshape(shape)


def agrees(function, value, args):
    """Does the checker of the exercise whose self-check takes its expected value from
    ``<module>.<function>(*args)`` accept that value? A checker that takes a value gets it; one that
    takes a function gets that function (or the library function the value is read from), which
    it runs at its own sizes."""
    if function == "additive_parameters":
        return single_head.check_additive_parameters(single_head.additive_parameters)
    if function == "additive_pair_bytes":
        return single_head.check_additive_bytes(single_head.additive_pair_bytes)
    if function == "mha_parameters":
        return multi_head.check_mha_parameters(multi_head.mha_parameters)
    if function == "attention_flops":
        return performance.check_attention_flops(measure.attention_flops)
    if function == "kv_cache_bytes":
        return multi_head.check_cache_bytes(
            lambda batch, n_kv, context, hd, itemsize: multi_head.kv_cache_bytes(
                batch, n_kv, context, hd, _ITEMSIZE[itemsize]))
    if function in ("dot_variance", "saturation_width", "gradient_crossover", "scores_bytes",
                    "article_attention_shape", "model_cache_bytes"):
        checker = {"dot_variance": single_head.check_dot_variance,
                   "saturation_width": single_head.check_saturation_width,
                   "gradient_crossover": single_head.check_gradient_crossover,
                   "scores_bytes": performance.check_scores_bytes,
                   "article_attention_shape": multi_head.check_article_attention_shape,
                   "model_cache_bytes": decoding.check_model_cache_bytes}[function]
        return checker(value)
    if function == "repeat_kv_shape":  # the checker's reference is selfattn.repeat_kv
        shape, g = args
        return (multi_head.check_repeat_kv(selfattn.repeat_kv)
                and value == tuple(selfattn.repeat_kv(torch.zeros(shape), g).shape))
    if function == "merge_heads_entry":  # ... selfattn.merge_heads; and the bug gives another
        shape, token, feature = args
        B, H, T, hd = shape
        bug = _from_arange(shape).reshape(B, T, H * hd)[0, token, feature]
        return (pitfalls.check_merge_heads(selfattn.merge_heads)
                and value == int(selfattn.merge_heads(_from_arange(shape))[0, token, feature])
                and value != int(bug))
    if function == "causal_pairs":  # ... selfattn.causal_mask; the bug (diagonal=-1) another
        (L,) = args
        return (single_head.check_causal_mask(selfattn.causal_mask)
                and value == int(selfattn.causal_mask(L).sum())
                and value != int(torch.ones(L, L).tril(diagonal=-1).sum()))
    raise AssertionError(f"say in agrees() which checker {function} agrees with")


AGREES = ("additive_parameters", "additive_pair_bytes", "mha_parameters", "attention_flops",
          "kv_cache_bytes", "dot_variance", "saturation_width", "gradient_crossover", "scores_bytes",
          "article_attention_shape", "model_cache_bytes", "repeat_kv_shape", "merge_heads_entry",
          "causal_pairs")


@pytest.mark.parametrize("name, index, text", SELF_CHECKS, ids=lambda x: str(x)[:20])
def test_each_expected_value_is_one_its_exercises_checker_accepts(name, index, text, capsys):
    compute, function, args, kind = _expected_call(text)
    value = compute(*args)
    check = self_check("q?", value, kind=kind)  # the kind fits the value
    assert agrees(function, check.expected, args) is True, capsys.readouterr().out


BYTE_FUNCTIONS = ("additive_pair_bytes", "kv_cache_bytes", "scores_bytes", "model_cache_bytes")


@pytest.mark.parametrize("name, index, text", SELF_CHECKS, ids=lambda x: str(x)[:20])
def test_units_are_accepted_exactly_where_the_answer_is_bytes(name, index, text):
    """A question about bytes passes unit="bytes" (the page then accepts "4 GiB"); any other
    question passes no unit, so that "256 GiB" is not a count of FLOPs."""
    _, function, _, _ = _expected_call(text)
    unit = _keyword(text, "unit")
    assert set(BYTE_FUNCTIONS) <= set(AGREES)
    if function not in BYTE_FUNCTIONS:
        assert unit is None, f"{function} is not a size in bytes: pass no unit"
    else:
        assert unit == "bytes", f"{function} is a size in bytes: pass unit=\"bytes\""


def test_the_flops_question_states_its_convention_and_hints_at_half():
    ((name, index, text),) = [c for c in SELF_CHECKS if _expected_call(c[2])[1] == "attention_flops"]
    exercise = source(cells(ROOT / "chapters" / f"{name}.ipynb")[index - 1])  # the statement
    assert "multiply-add counted as 2 FLOPs" in exercise and "both matrix products" in exercise
    hints = _keyword(text, "hints")
    assert "multiply-add counts as two FLOPs" in hints[0.5]
    assert not any(ch.isdigit() for hint in hints.values() for ch in hint)  # no number given away


def test_every_expected_value_function_is_paired_with_its_checker():
    used = {_expected_call(text)[1] for _, _, text in SELF_CHECKS}
    assert used == set(AGREES), used ^ set(AGREES)
    handled = inspect.getsource(agrees)
    assert all(f'"{name}"' in handled for name in AGREES)


# --- the page's script, in Node ----------------------------------------------------------------


def in_node(expression, data=None):
    """Load assets/selfcheck.js (after its messages) in a fresh Node ``vm`` context (no window,
    no document), then evaluate ``expression`` there, with ``data`` as a global; its value, through JSON."""
    if NODE is None:
        pytest.skip("node is not on PATH: the page script's logic is not tested")
    script = f"""
const vm = require("vm"), fs = require("fs");
const context = vm.createContext({{}});
vm.runInContext(fs.readFileSync({json.dumps(str(MESSAGES))}, "utf8"), context, {{filename: "messages.js"}});
vm.runInContext(fs.readFileSync({json.dumps(str(SCRIPT))}, "utf8"), context, {{filename: "selfcheck.js"}});
context.data = JSON.parse(fs.readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify(vm.runInContext({json.dumps(expression)}, context)));
"""
    done = subprocess.run([NODE, "-e", script], input=json.dumps(data), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_script_loads_without_a_dom_and_offers_its_test_entry():
    names = in_node("Object.keys(selfattnSelfCheck).sort()")
    assert {"parseNumber", "parseShape", "judge", "readSpec", "verdict", "wireAll"} <= set(names)


def test_the_script_and_the_module_share_the_default_tolerance():
    found = re.search(r"var DEFAULT_RTOL = ([0-9.e+-]+);", SCRIPT.read_text())
    assert found and float(found.group(1)) == DEFAULT_RTOL
    close = re.search(r"var CLOSE = ([0-9.e+-]+);", SCRIPT.read_text())
    assert close and float(close.group(1)) == CLOSE == 0.01  # the messages say "within 1%"


NUMBERS = {
    "1024": 1024, "1,024": 1024, "1_024": 1024, "1 024": 1024, "1,048,576": 2**20,
    "1e6": 1e6, "1E6": 1e6, "2.5e-3": 0.0025, "2**20": 2**20, "2 ** 20": 2**20, "2^20": 2**20,
    "4 * 2**30": 4 * 2**30, "4*2^30": 4 * 2**30, "4 × 2**30": 4 * 2**30, "32*8192*8192*4": 32 * 8192**2 * 4,
    "0.25": 0.25, ".5": 0.5, "-2**2": -4, "2**3**2": 512,
    "(3 + 1) / 2": 2, "100 * 0.5 * 0.5": 25, "−3": -3, " 25 ": 25,
    # full-width, as a Chinese input method types them (read after NFKC)
    "１０２４": 1024, "１，０２４": 1024, "1，024": 1024, "2＊＊20": 2**20, "２＾２０": 2**20,
    "０．２５": 0.25, "0。25": 0.25, "（３＋１）／２": 2, "\u3000２５\u3000": 25, "－３": -3,
}
NOT_NUMBERS = ["", "abc", "1,5", "12,34", "1 2", "3e", "2(3)", "(2", "2)", "1/0", "2 **",
               "1,0245", "five", "0x10", "b", "GiB"]
UNITS_REFUSED = ["4 GiB", "4GiB", "0.125 KiB", "256 GiB", "16777216 bytes", "4 GB", "3 MB", "512 B",
                 "1 byte"]  # a plain number: a unit is refused, and says so (why "unit")
BYTES = {  # with unit "bytes": value in bytes, the number as typed, the unit's name
    "4 GiB": (4 * 2**30, 4, "GiB"), "4GiB": (4 * 2**30, 4, "GiB"), "4 gib": (4 * 2**30, 4, "GiB"),
    "320 KiB": (320 * 1024, 320, "KiB"), "16 MiB": (2**24, 16, "MiB"), "1 TiB": (2**40, 1, "TiB"),
    "0.5 GiB": (2**29, 0.5, "GiB"), "2**4 MiB": (2**24, 16, "MiB"),
    "4 GB": (4e9, 4, "GB"), "4 gb": (4e9, 4, "GB"), "3 MB": (3e6, 3, "MB"), "1.5 kB": (1500, 1.5, "kB"),
    "2 KB": (2000, 2, "kB"), "1 TB": (1e12, 1, "TB"),
    "16777216 bytes": (16777216, 16777216, "bytes"), "512 B": (512, 512, "bytes"),
    "1 byte": (1, 1, "bytes"), "1,024": (1024, 1024, None), "2**20": (2**20, 2**20, None),
}
NOT_BYTES = ["4 PB", "GiB", "4 GiBs", "4 Gi", "4 gigabytes", "4 GiB GiB", "bytes", "4 KiB 2"]


def test_typed_numbers_parse():
    got = in_node("data.map(t => selfattnSelfCheck.parseNumber(t))", list(NUMBERS))
    for text, result in zip(NUMBERS, got, strict=True):
        assert result["ok"] and result["value"] == pytest.approx(NUMBERS[text], rel=1e-12), text


def test_what_is_not_a_number_does_not_parse():
    got = in_node("data.map(t => selfattnSelfCheck.parseNumber(t).ok)", NOT_NUMBERS)
    assert not any(got), [t for t, ok in zip(NOT_NUMBERS, got, strict=True) if ok]


def test_a_plain_number_refuses_a_unit_and_says_why():
    got = in_node("data.map(t => selfattnSelfCheck.parseNumber(t))", UNITS_REFUSED)
    assert all(r == {"ok": False, "why": "unit"} for r in got), dict(zip(UNITS_REFUSED, got, strict=True))


def test_bytes_parse_with_binary_and_decimal_units():
    got = in_node("data.map(t => selfattnSelfCheck.parseNumber(t, 'bytes'))", list(BYTES) + NOT_BYTES)
    for text, result in zip(BYTES, got, strict=False):
        value, number, unit = BYTES[text]
        assert result["ok"], text
        assert result["value"] == pytest.approx(value, rel=1e-12), text
        assert (result["number"], result["unit"]) == (pytest.approx(number), unit), text
    assert not any(r["ok"] for r in got[len(BYTES):]), dict(zip(NOT_BYTES, got[len(BYTES):], strict=True))


SHAPES = {
    "(12, 5, 7)": [12, 5, 7], "12, 5, 7": [12, 5, 7], "[12,5,7]": [12, 5, 7],
    "torch.Size([12, 5, 7])": [12, 5, 7], "12 x 5 x 7": [12, 5, 7], "12×5×7": [12, 5, 7],
    "(3 * 4, 5, 7)": [12, 5, 7], "(12,)": [12], "12": [12], "(2, 12, 10, 64)": [2, 12, 10, 64],
    "（12，5，7）": [12, 5, 7], "（１２， ５， ７）": [12, 5, 7], "［12，5，7］": [12, 5, 7],
    "12、5、7": [12, 5, 7], "１２ｘ５ｘ７": [12, 5, 7], "torch.Size（[12, 5, 7]）": [12, 5, 7],
}
NOT_SHAPES = ["", "()", "(1.5, 2)", "(2, -1)", "(2,, 3)", "shape", "(2, 3"]


def test_typed_shapes_parse_and_others_do_not():
    got = in_node("data.map(t => selfattnSelfCheck.parseShape(t))", list(SHAPES) + NOT_SHAPES)
    for text, result in zip(SHAPES, got, strict=False):
        assert result == {"ok": True, "value": SHAPES[text]}, text
    assert not any(r["ok"] for r in got[len(SHAPES):]), got[len(SHAPES):]


FLOPS = {"kind": "count", "expected": 274877906944,
         "hints": [[0.5, "a multiply-add counts as two FLOPs."], [0.25, "two FLOPs, both products."]]}
GIB4 = {"kind": "count", "expected": 4294967296, "unit": "bytes"}
VERDICTS = [  # spec, typed, state, words in the message
    ({"kind": "count", "expected": 240}, "240", "right", "Right"),
    ({"kind": "count", "expected": 240}, "2.4e2", "right", "Right"),
    ({"kind": "count", "expected": 240}, "250", "wrong", "too high"),
    ({"kind": "count", "expected": 240}, "230", "wrong", "too low"),
    ({"kind": "count", "expected": 240}, "250.5", "wrong", "whole number"),
    ({"kind": "count", "expected": 240}, "many", "unreadable", "Can't read"),
    ({"kind": "count", "expected": 240}, "   ", "empty", "Type an answer"),
    # close: within 1 % but not right, a rounded answer, gets no direction
    ({"kind": "count", "expected": 274877906944}, "2.75e11", "wrong", "close (within 1%), but not exact"),
    ({"kind": "count", "expected": 274877906944}, "2.74e11", "wrong", "give the exact count"),
    ({"kind": "count", "expected": 4294967296}, "4.29e9", "wrong", "close (within 1%)"),
    ({"kind": "count", "expected": 4294967296}, "4.3e9", "wrong", "give the exact count"),
    ({"kind": "count", "expected": 274877906944}, "2.8e11", "wrong", "too high"),  # 1.9 % off
    ({"kind": "count", "expected": 274877906944}, "2.7e11", "wrong", "too low"),
    ({"kind": "count", "expected": 240}, "241", "wrong", "close (within 1%), but not exact"),
    ({"kind": "count", "expected": 240}, "240.5", "wrong", "close (within 1%), but the answer is a whole"),
    ({"kind": "number", "expected": 25.0, "rtol": 1e-6}, "25.001", "wrong", "close (within 1%)"),
    ({"kind": "number", "expected": 25.0, "rtol": 1e-6}, "24.999", "wrong", "give more digits"),
    ({"kind": "number", "expected": 0.7071067811865476}, "0.707", "wrong", "give more digits"),
    ({"kind": "number", "expected": 25.0, "rtol": 1e-6}, "25.5", "wrong", "too high"),
    ({"kind": "number", "expected": 25.0, "rtol": 1e-6}, "24.5", "wrong", "too low"),
    # a hint for a factor of the answer: half the FLOPs
    (FLOPS, "274877906944", "right", "Right"),
    (FLOPS, "137,438,953,472", "wrong", "a multiply-add counts as two FLOPs."),
    (FLOPS, "2 * 4096**2 * 64 * 32 * 2", "wrong", "a multiply-add counts as two FLOPs."),
    (FLOPS, "68719476736", "wrong", "two FLOPs, both products."),
    # ... and a rounded half, within the same 1 % as "close"
    (FLOPS, "1.37e11", "wrong", "a multiply-add counts as two FLOPs."),
    (FLOPS, "1.374e11", "wrong", "a multiply-add counts as two FLOPs."),
    (FLOPS, "１．３７ｅ１１", "wrong", "a multiply-add counts as two FLOPs."),
    (FLOPS, "1.35e11", "wrong", "too low"),  # 1.8 % from half: no hint
    (FLOPS, "549755813888", "wrong", "too high"),  # twice: no hint named for it
    ({"kind": "number", "expected": 3.0, "hints": [[0.5, "halved."]]}, "1.5000001", "wrong", "halved."),
    # units: only for a question about bytes
    (FLOPS, "256 GiB", "unreadable", "plain number, not bytes"),
    ({"kind": "count", "expected": 128}, "0.125 KiB", "unreadable", "without a unit"),
    ({"kind": "number", "expected": 25.0}, "25 bytes", "unreadable", "plain number"),
    ({"kind": "count", "expected": 8589934592}, "8 GiB", "unreadable", "plain number, not bytes"),
    ({"kind": "count", "expected": 8589934592}, "32 * 8192**2 * 4", "right", "Right"),
    ({"kind": "count", "expected": 8589934592}, "8,589,934,592", "right", "Right"),
    (GIB4, "4 GiB", "right", "Right"),
    (GIB4, "４ ＧｉＢ", "right", "Right"),
    ({"kind": "count", "expected": 1024}, "１０２４", "right", "Right"),
    ({"kind": "shape", "expected": [12, 5, 7]}, "（１２， ５， ７）", "right", "Right"),
    (GIB4, "4294967296", "right", "Right"),
    (GIB4, "4294967296 bytes", "right", "Right"),
    (GIB4, "4,096 MiB", "right", "Right"),
    (GIB4, "2^32 B", "right", "Right"),
    (GIB4, "4.294967296 GB", "right", "Right"),  # decimal units: powers of 10
    (GIB4, "4294967.296 kB", "right", "Right"),
    (GIB4, "4", "wrong", "that is the size in GiB, and a number alone is read as bytes"),
    (GIB4, "4096", "wrong", "write the unit (4096 MiB) or the bytes"),
    (GIB4, "4 GB", "wrong", "a GB is a power of 10 bytes, a GiB a power of 2"),
    (GIB4, "4,096 MB", "wrong", "your number is right in MiB"),
    (GIB4, "4.29e9", "wrong", "give the exact number of bytes, or an exact value with a unit"),
    (GIB4, "4.29 GB", "wrong", "close (within 1%)"),
    (GIB4, "4.2 GiB", "wrong", "too high"),  # a fraction of a GiB is whole bytes: no "whole number"
    (GIB4, "3 GiB", "wrong", "too low"),
    (GIB4, "4.5 bytes", "wrong", "whole number"),
    (GIB4, "4 PB", "unreadable", "Can't read that as a number of bytes"),
    (GIB4, "four GiB", "unreadable", "KiB, MiB, GiB, TiB are powers of 2"),
    ({"kind": "number", "expected": 1536.0, "unit": "bytes"}, "1.5 KiB", "right", "Right"),
    ({"kind": "number", "expected": 1536.0, "unit": "bytes"}, "1.5", "wrong", "the size in KiB"),
    ({"kind": "number", "expected": 25.0, "rtol": 1e-6}, "25", "right", "Right"),
    ({"kind": "number", "expected": 25.0, "rtol": 1e-6}, "25.00001", "right", "Right"),
    ({"kind": "number", "expected": 25.0}, "100*0.5^2", "right", "Right"),  # the default rtol
    ({"kind": "number", "expected": 25.0, "rtol": 0.06}, "24", "right", "Right"),
    ({"kind": "number", "expected": 0.0, "rtol": 1e-6}, "0", "right", "Right"),
    ({"kind": "number", "expected": 0.0, "rtol": 1e-6}, "-0.1", "wrong", "too low"),
    ({"kind": "number", "expected": -2.0, "rtol": 1e-6}, "-1", "wrong", "too high"),
    ({"kind": "shape", "expected": [12, 5, 7]}, "(12, 5, 7)", "right", "Right"),
    ({"kind": "shape", "expected": [12, 5, 7]}, "12, 5, 7", "right", "Right"),
    ({"kind": "shape", "expected": [12, 5, 7]}, "(3, 4, 5, 7)", "wrong", "fewer dimensions"),
    ({"kind": "shape", "expected": [12, 5, 7]}, "(60, 7)", "wrong", "more dimensions"),
    ({"kind": "shape", "expected": [12, 5, 7]}, "(12, 7, 5)", "wrong",
     "shape[1] and shape[2] are not right; the rest are"),
    ({"kind": "shape", "expected": [12, 5, 7]}, "(13, 5, 7)", "wrong", "shape[0] is not right"),
    ({"kind": "shape", "expected": [12, 5, 7]}, "(1, 2, 3)", "wrong",
     "shape[0], shape[1] and shape[2] are not right."),
    ({"kind": "shape", "expected": [12, 5, 7]}, "twelve", "unreadable", "Can't read"),
]


def test_the_verdicts_say_right_or_what_is_off_without_the_answer():
    got = in_node("data.map(([spec, text]) => selfattnSelfCheck.judge(spec, text))",
                  [[spec, text] for spec, text, _, _ in VERDICTS])
    for (spec, text, state, words), verdict in zip(VERDICTS, got, strict=True):
        assert verdict["state"] == state, (spec, text, verdict)
        assert words in verdict["message"], (spec, text, verdict)
        if state != "right":
            expected = spec["expected"]
            forms = ([", ".join(map(str, expected))] if spec["kind"] == "shape"
                     else [str(expected), f"{expected:,}", f"{expected:g}"])
            assert not any(f in verdict["message"] for f in forms), (spec, text, verdict)


def test_an_unknown_kind_is_an_error_not_a_verdict():
    assert in_node("""(() => { try { selfattnSelfCheck.judge({kind: "tuple", expected: 1}, "1");
                      return "no error"; } catch (e) { return e.message; } })()""") == (
        "unknown self-check kind tuple")


def test_an_unknown_unit_is_an_error_not_a_verdict():
    assert in_node("""(() => { try { selfattnSelfCheck.judge({kind: "count", expected: 1,
                      unit: "flops"}, "1"); return "no error"; } catch (e) { return e.message; }
                      })()""") == "unknown self-check unit flops"


def _attributes(check):
    box = _Widget(check.html()).first("div", **{"class": "selfattn-selfcheck"})
    return {k: v for k, v in box.items() if k.startswith("data-")}


def _typed(check):
    """The expected value as a reader would type it: a shape in brackets, a count with commas,
    a number with every digit it takes."""
    if check.kind == "shape":
        return "(" + ", ".join(str(n) for n in check.expected) + ")"
    return f"{check.expected:,}" if check.kind == "count" else repr(check.expected)


def test_the_script_reads_what_the_module_writes_and_accepts_the_typed_answer():
    """From self_check's HTML to the script's verdict: the data attributes, read by readSpec from
    a fake element, and the answer as a reader types it."""
    checks = [self_check("q?", 4_294_967_296, kind="count"), self_check("q?", 25.0),
              self_check("q?", 2.5, rtol=0.01), self_check("q?", (12, 5, 7), kind="shape"),
              self_check("q?", 1 / 3), self_check("q?", 4_294_967_296, kind="count", unit="bytes"),
              self_check("q?", 2**38, kind="count", hints={0.5: 'two "FLOPs" & more.'})]
    cases = [[_attributes(check), _typed(check)] for check in checks]
    got = in_node("""data.map(([attributes, typed]) => {
        const element = {getAttribute: name => name in attributes ? attributes[name] : null};
        const spec = selfattnSelfCheck.readSpec(element);
        return [spec, selfattnSelfCheck.verdict(element, typed).state];
    })""", cases)
    for check, (spec, state) in zip(checks, got, strict=True):
        assert spec["kind"] == check.kind
        assert spec["expected"] == (list(check.expected) if check.kind == "shape" else check.expected)
        assert spec.get("rtol") == check.rtol
        assert spec.get("unit") == check.unit
        assert spec["hints"] == [list(h) for h in check.hints]
        assert state == "right", (check, spec)


def test_wiring_checks_on_the_button_and_on_enter_and_clears_on_typing():
    """wireAll on a minimal fake DOM: the button is enabled, a click and Enter write the verdict
    and its state, typing clears it, and a second wireAll adds no second listener."""
    attributes = _attributes(self_check("q?", 21, kind="count"))
    result = in_node("""(() => {
        function node() {
            return {attrs: {}, listeners: {}, textContent: "", value: "", disabled: true,
                    setAttribute(k, v) { this.attrs[k] = String(v); },
                    getAttribute(k) { return k in this.attrs ? this.attrs[k] : null; },
                    removeAttribute(k) { delete this.attrs[k]; },
                    addEventListener(type, f) {
                        (this.listeners[type] = this.listeners[type] || []).push(f); },
                    fire(type, event) { (this.listeners[type] || []).forEach(f => f(event || {})); }};
        }
        const box = node(), input = node(), button = node(), status = node();
        Object.assign(box.attrs, data);
        box.querySelector = s => s === "input" ? input : s === "button" ? button : status;
        const root = {querySelectorAll: () => [box]};
        const wired = [selfattnSelfCheck.wireAll(root), selfattnSelfCheck.wireAll(root)];
        const seen = {wired: wired, enabled: !button.disabled, clicks: button.listeners.click.length};
        input.value = "22"; button.fire("click");
        seen.afterClick = [status.textContent, status.getAttribute("data-state"),
                           input.getAttribute("aria-invalid")];
        input.value = "21"; let prevented = false;
        input.fire("keydown", {key: "Enter", preventDefault() { prevented = true; }});
        seen.afterEnter = [status.textContent, box.getAttribute("data-state"), prevented];
        input.fire("input");
        seen.afterTyping = [status.textContent, status.getAttribute("data-state")];
        return seen;
    })()""", attributes)
    assert result["wired"] == [1, 1] and result["enabled"] and result["clicks"] == 1
    assert result["afterClick"][1:] == ["wrong", "true"] and "too high" in result["afterClick"][0]
    assert result["afterEnter"][1:] == ["right", True] and "Right" in result["afterEnter"][0]
    assert result["afterTyping"] == ["", None]
