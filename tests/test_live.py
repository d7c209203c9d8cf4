"""The live explorers' forward passes in JavaScript (assets/live/live.js) against PyTorch.

selfattn.book.kit.live writes a model into a spec; live.js computes on it in the browser. Here Node
runs live.js (without a page) on specs of small random models, one for every kind of position
the taggers use, a grouped-query one and chapter 2's single head, and every typed sentence's
weights and logits must match :func:`selfattn.book.kit.live.forward` (PyTorch, from the spec's own
weights), which must match the model itself. Bad specs and bad sentences get clear errors.
tests/test_live_browser.py does the same in the built book, through the page.
"""

import json
import pathlib
import shutil
import subprocess

import pytest
import torch

from selfattn.book import tagging
from selfattn.book.kit import live, viz

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIVE_JS = ROOT / "assets" / "live" / "live.js"
MESSAGES_JS = ROOT / "assets" / "messages.js"  # live.js's words, loaded before it as in the page
WORDS = [None, *(f"c{i}" for i in range(1, 5)), *(f"w{i}" for i in range(5, 16))]
TAGS = ["c1", "c2", "c3", "c4", "no cue yet"]
SENTENCES = ["c1 w5 w7 c3 w9", "w6", "c2 c2 c4 w15 w5 w5 c1 w8 w9 w10 w11 w12 c3 w13 w14 w15"]


def node_compute(spec, calls):
    """live.js's compute() on each (text, options) in Node, with no DOM."""
    node = shutil.which("node")
    assert node, "the live explorers' test needs Node.js (node) on PATH"
    script = f"""
const fs = require("fs"), vm = require("vm");
const ctx = {{atob, Math, console}};
vm.createContext(ctx);
vm.runInContext(fs.readFileSync({json.dumps(str(MESSAGES_JS))}, "utf8"), ctx);
vm.runInContext(fs.readFileSync({json.dumps(str(LIVE_JS))}, "utf8"), ctx);
const input = JSON.parse(fs.readFileSync(0, "utf8"));
const out = input.calls.map(([text, options]) => {{
  try {{
    const r = ctx.selfattnLive.compute(input.spec, text, options);
    return {{weights: r.weights, logits: r.logits || null, tokens: r.tokens,
             predicted: r.predicted || null, rule: r.rule || null, dropped: r.dropped}};
  }} catch (e) {{ return {{error: e.message, input_error: e instanceof ctx.selfattnLive.InputError}}; }}
}});
process.stdout.write(JSON.stringify(out));
"""
    result = subprocess.run([node, "-e", script], input=json.dumps({"spec": spec, "calls": calls}),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def tagger(positions, n_kv_heads=None, causal=True):
    torch.manual_seed(len(positions))
    model = tagging.AttentionTagger(len(WORDS), len(TAGS), d=16, n_heads=4, max_len=32,
                                   positions=positions, causal=causal, n_kv_heads=n_kv_heads)
    with torch.no_grad():  # weights larger than at init, so the maps are far from uniform
        for p in model.parameters():
            p.mul_(3)
    return model.eval()


def tagger_models():
    found = {p: tagger(p) for p in tagging.POSITIONS}
    found["rope, 2 key/value heads"] = tagger("rope", n_kv_heads=2)
    found["sinusoidal, both sides"] = tagger("sinusoidal", causal=False)
    return found


def test_each_tagger_in_javascript_equals_pytorch():
    taggers = tagger_models()
    spec = live.tagger_spec("test-tagger", taggers, WORDS, TAGS, rule="latest_cue",
                            sentences=SENTENCES)
    calls = [[s, {"model": name}] for name in taggers for s in SENTENCES]
    results = node_compute(spec, calls)
    for (text, options), got in zip(calls, results, strict=True):
        name = options["model"]
        want = live.forward(spec, text, model=name)
        ids = torch.tensor(live.tokenize(spec, text))
        logits, weights = taggers[name](ids[None], need_weights=True)  # the model itself
        torch.testing.assert_close(want["weights"], weights[0].detach(), rtol=0, atol=0)
        torch.testing.assert_close(want["logits"], logits[0].detach(), rtol=0, atol=0)
        w = torch.tensor(got["weights"][0], dtype=torch.float32)  # (H, T, T): one layer
        torch.testing.assert_close(w, want["weights"], rtol=0, atol=1e-5, msg=f"{name}: {text}")
        torch.testing.assert_close(torch.tensor(got["logits"], dtype=torch.float32),
                                   want["logits"], rtol=1e-5, atol=1e-4,  # logits up to ~70
                                   msg=f"{name}: {text}")
        assert got["predicted"] == [TAGS[i] for i in want["logits"].argmax(-1)]
        assert got["tokens"] == text.split()
        assert w.max() > 0.5, "a test whose weights are all near uniform would prove little"


def test_the_page_applies_the_tasks_own_rules():
    spec = live.tagger_spec("test-tagger", {"m": tagger("none")}, WORDS, TAGS, rule="latest_cue",
                            sentences=SENTENCES)
    (got,) = node_compute(spec, [["w5 c2 w6 c4 w7", {}]])
    assert got["rule"] == ["no cue yet", "c2", "c2", "c4", "c4"]
    words = ["saw", *WORDS[1:]]
    model = tagging.AttentionTagger(len(words), 4, d=8, n_heads=2, max_len=16)
    spec = live.tagger_spec("test-saw", {"m": model}, words, ["a", "b", "c", "d"],
                            rule="cue_before_saw", sentences=["c2 w5 saw"], max_tokens=8)
    # the task's sentences: one 'saw', exactly one cue before it, decoys only after it
    got = node_compute(spec, [["c3 w5 saw c1 w6", {}], ["c3 w5 saw c1 saw w6", {}],
                              ["c2 c3 w5 saw", {}], ["w5 saw c1", {}]])
    assert got[0]["rule"] == [None, None, "sense 3", None, None]
    assert got[1]["rule"] == [None, None, "outside the task", None, "outside the task", None]
    assert got[2]["rule"] == [None, None, None, "outside the task"]
    assert got[3]["rule"] == [None, "outside the task", None]


def test_chapter_two_head_in_javascript_equals_pytorch():
    words = "the a cat dog sat on mat i saw".split()
    g = torch.Generator().manual_seed(0)
    emb, W_q, W_k = (torch.randn(*s, generator=g) for s in [(9, 8), (8, 4), (8, 4)])
    spec = live.attention_spec("test-head", words, emb, W_q, W_k, temperatures=[0.25, 1, 4],
                               sentences=["the cat sat"])
    calls = [[s, {"temperature": t, "mask": m}] for s in ["the cat sat on the mat", "I saw",
                                                           "saw"]
             for t in (0.25, 1, 4) for m in ("none", "causal")]
    for (text, options), got in zip(calls, node_compute(spec, calls), strict=True):
        want = live.forward(spec, text, **options)["weights"]  # (1, T, T)
        got_w = torch.tensor(got["weights"][0], dtype=torch.float32)  # (1, T, T)
        torch.testing.assert_close(got_w, want, rtol=0, atol=2e-6, msg=f"{options}: {text}")


def test_unknown_words_and_long_sentences_get_a_message_naming_them():
    spec = live.tagger_spec("test-tagger", {"m": tagger("none")}, WORDS, TAGS,
                            rule="latest_cue", sentences=["c1 w5"], max_tokens=6)
    results = node_compute(spec, [["c1 w5 hello", {}], ["c1 " * 7, {}], ["   ", {}]])
    assert all(r["input_error"] for r in results)
    assert "“hello”" in results[0]["error"] and "vocabulary" in results[0]["error"]
    assert "7 words" in results[1]["error"] and "at most 6" in results[1]["error"]
    assert "Type a sentence" in results[2]["error"]
    for text, match in [("c1 hello", "unknown word 'hello'"), ("c1 " * 7, "at most 6"),
                        ("", "type a sentence")]:
        with pytest.raises(ValueError, match=match):
            live.tokenize(spec, text)


def test_punctuation_is_read_as_a_space_and_said_in_javascript_and_in_python():
    """'I saw a saw.' is the sentence 'i saw a saw': live.js and live.tokenize drop every
    punctuation mark (Unicode's category P, full-width ones too) the same way, and the page is
    told which it dropped, so that its caption can say so."""
    spec = live.tagger_spec("test-tagger", {"m": tagger("none")}, WORDS, TAGS,
                            rule="latest_cue", sentences=["c1 w5"])
    texts = ["C1, w5.", "c1 w5!?", "“c2” (w7); c3…", "c1。w5，w6", "c1-w5"]
    got = node_compute(spec, [[t, {}] for t in texts])
    for text, result in zip(texts, got, strict=True):
        assert "error" not in result, (text, result)
        assert result["tokens"] == [WORDS[i] for i in live.tokenize(spec, text)], text
        assert set(result["dropped"]) == {ch for ch in text if not ch.isalnum() and not ch.isspace()}
    assert got[0]["tokens"] == ["c1", "w5"] and got[3]["tokens"] == ["c1", "w5", "w6"]
    plain = node_compute(spec, [["c1 w5", {}]])[0]
    assert plain["dropped"] == []
    with pytest.raises(ValueError, match="punctuation"):  # a word the page could never match
        live.tagger_spec("t", {"m": tagger("none")}, [*WORDS[:-1], "w15."], TAGS,
                         rule="latest_cue", sentences=["c1"])


def test_bad_specs_are_refused_with_clear_errors():
    model = tagger("none")
    with pytest.raises(ValueError, match="token ids"):
        live.tagger_spec("t", {"m": model}, WORDS[:-1], TAGS, rule="latest_cue",
                         sentences=["c1"])
    with pytest.raises(ValueError, match="tags"):
        live.tagger_spec("t", {"m": model}, WORDS, TAGS[:-1], rule="latest_cue",
                         sentences=["c1"])
    with pytest.raises(ValueError, match="rule"):
        live.tagger_spec("t", {"m": model}, WORDS, TAGS, rule="nearest", sentences=["c1"])
    with pytest.raises(ValueError, match="unknown word"):
        live.tagger_spec("t", {"m": model}, WORDS, TAGS, rule="latest_cue", sentences=["cat"])
    with pytest.raises(ValueError, match="max_len"):
        live.tagger_spec("t", {"m": model}, WORDS, TAGS, rule="latest_cue", sentences=["c1"],
                         max_tokens=64)
    with pytest.raises(ValueError, match="repeat"):
        live.tagger_spec("t", {"m": model}, ["c1"] * len(WORDS), TAGS, rule="latest_cue",
                         sentences=["c1"])
    with pytest.raises(ValueError, match="lowercase"):
        live.tagger_spec("Bad Name", {"m": model}, WORDS, TAGS, rule="latest_cue",
                         sentences=["c1"])
    scored = tagging.AttentionTagger(len(WORDS), len(TAGS), d=8, scorer="additive")
    with pytest.raises(TypeError, match="multi-head"):
        live.tagger_spec("t", {"m": scored}, WORDS, TAGS, rule="latest_cue", sentences=["c1"])
    with pytest.raises(ValueError, match="W_q"):
        live.attention_spec("t", ["a", "b"], torch.zeros(2, 8), torch.zeros(4, 4),
                            torch.zeros(8, 4), temperatures=[1], sentences=["a b"])
    with pytest.raises(ValueError, match="temperatures"):
        live.attention_spec("t", ["a", "b"], torch.zeros(2, 8), torch.zeros(8, 4),
                            torch.zeros(8, 4), temperatures=[0], sentences=["a b"])


def test_the_markup_appears_only_in_the_static_book(monkeypatch, capsys):
    spec = live.attention_spec("test-head", ["a", "b"], torch.ones(2, 4), torch.ones(4, 2),
                               torch.ones(4, 2), temperatures=[1], sentences=["a b </script>"
                                                                              .split()[0]])
    html = live.markup(spec)
    assert html.count("</script>") == 1  # the spec cannot close its own script tag
    assert json.loads(html.split('class="selfattn-live-spec">')[1].split("</script>")[0]
                      .replace("<\\/", "</")) == spec
    monkeypatch.delenv(viz.STATIC_ENV, raising=False)
    assert live.show(spec) is None and capsys.readouterr().out == ""


def test_the_minilm_spec_states_the_sizes_of_the_files_it_will_fetch(tmp_path):
    for name in [live.MINILM_MODEL, live.MINILM_VOCAB,
                 *live.MINILM_RUNTIME]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * (len(name) * 1000))
    spec = live.minilm_spec("test-minilm", ["I saw a saw."], vendor=tmp_path)
    assert spec["bytes"]["model"] == len(live.MINILM_MODEL) * 1000
    assert spec["bytes"]["runtime"] == sum(len(n) * 1000 for n in live.MINILM_RUNTIME)
    assert (spec["layers"], spec["heads"]) == (6, 12)
    (tmp_path / live.MINILM_MODEL).unlink()
    with pytest.raises(FileNotFoundError, match="make book"):
        live.minilm_spec("test-minilm", ["I saw a saw."], vendor=tmp_path)


def test_the_minilm_files_are_looked_for_where_make_puts_them():
    """The Makefile exports the model into the repository's _vendor/, beside the Makefile (a
    module moved one folder deeper once looked in src/_vendor and failed chapter 10's build)."""
    assert live.VENDOR == ROOT / "_vendor"
    assert "MINILM := _vendor/minilm/" in (ROOT / "Makefile").read_text()
