"""The live page's JavaScript tokenizer (assets/live/wordpiece.js) equals the Python one.

The reference is the model's tokenizer.json read by ``tokenizers`` as
``selfattn.book.pretrained.load()`` configures it (no padding, no truncation). One Node process
encodes every sentence of :data:`SENTENCES` (ordinary text, and the corners of BERT's
normaliser: accents, other scripts, case, control and invisible characters, emoji, long words);
ids and tokens must be equal, [CLS] and [SEP] included. A second test loads the file as a
classic script, as a page or a Web Worker does, and checks the global it sets.
"""

import json
import pathlib
import shutil
import subprocess

import pytest
from tokenizers import Tokenizer

from selfattn.book.pretrained import find_model_dir

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "assets" / "live" / "wordpiece.js"

LONG = " ".join(["Self-attention lets every token look at every other token, weighing each by "
                 "how well its key matches the query; the weights sum to one."] * 20)
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention is all you need.",
    "I saw a saw.",
    "Don't stop; it's John's book, isn't it? We'll see -- y'all'd've agreed.",
    'Well... "quoted" (parens) [brackets] {braces} <angles> a/b a\\b a|b a~b a^b a`b a=b a+b',
    "$100 + 20% = #1 @home & more_under_score",
    "Hello...!!!??? “curly” ‘quotes’ «guillemets» — em – en … ¿qué? ¡sí!",
    "café naïve Ångström résumé coöperate",
    "CAFÉ NAÏVE ÅNGSTRÖM",
    "e\u0301 combining acute and \u00e9 precomposed",
    "自然语言处理很有趣。",
    "日本語のテキスト、カタカナとひらがな。",
    "한국어 문장입니다.",
    "Mixed中文English混合text",
    "Η γλώσσα είναι ελληνική.",
    "ΟΔΟΣ",  # a word-final capital sigma
    "ΟΣ ΟΔΟΣ.",
    "ΣΑΣ σας Σ ς",
    "Привет, мир! Ёлка и йод.",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "I love pizza \U0001f355\U0001f600\U0001f44d\U0001f3fd and \U0001f1eb\U0001f1f7!",
    "family \U0001f468\u200d\U0001f469\u200d\U0001f467 heart \u2764\ufe0f",  # joiner, variation selector
    "\U0001d401\U0001d428\U0001d425\U0001d41d math letters \U0001d49c",
    "İstanbul, DİYARBAKIR, ıi",
    "ﬁnancial ﬂow ﬀ",
    "Straße STRASSE ß ẞ",
    "Ǆ ǅ ǆ digraphs, Ⅻ numeral, ℌ",
    "Ｆｕｌｌ－ｗｉｄｔｈ\u3000ＡＢＣ１２３！",
    "zero\u200bwidth soft\u00adhyphen \ufeffBOM nul\x00here bad\ufffdchar next\x85line",
    "tabs\tand\nnewlines\r\nand\u2028separators\u00a0nbsp\u3000ideographic",
    "controls \x07bell \x1b[0m escape \x7f del \x0bvt \x0cff \x1fus \ue000private",
    "Visit https://example.com/path?q=1&x=2#frag or mail a.b@c.org",
    "Numbers: 3.14159, 1,000,000, -42, 1e-9, 2024-06-01, 10:30",
    "Supercalifragilisticexpialidocious flibbertigibbetized unbelievabilityness",
    "transformerization of tokenizers",
    "x" * 101 + " is over the limit",
    "ab" * 50 + " is on it",
    "\u00e9" * 100 + " e and an accent each",
    LONG,
    "",
    "   \t\n  ",
    "[CLS] [MASK] fills a[SEP]b; [mask] and [UNK] too",  # the added tokens
    "\u3400\U00020000\uf900\U0002b820\U0002b920",  # CJK blocks; Rust's table starts at 2B920
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(str(find_model_dir() / "tokenizer.json"))
    tok.no_padding()  # as pretrained.load() does
    tok.no_truncation()
    return tok


@pytest.fixture(scope="module")
def vocab_file(tokenizer, tmp_path_factory) -> pathlib.Path:
    """The vocabulary as the book's build writes it: one token a line, in id order."""
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    path = tmp_path_factory.mktemp("wordpiece") / "vocab.txt"
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


def run_node(code: str, stdin: object) -> object:
    """Run ``code`` in Node with ``stdin`` as JSON on its standard input; return its JSON output."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: the JavaScript tokenizer's tests need Node.js")
    done = subprocess.run([node, "-e", code], input=json.dumps(stdin), capture_output=True,
                          text=True, encoding="utf-8", timeout=60)
    assert done.returncode == 0, f"node failed:\n{done.stderr}"
    return json.loads(done.stdout)


ENCODE_ALL = """
const {script, vocab, sentences} = JSON.parse(require("fs").readFileSync(0, "utf8"));
const tok = require(script).fromVocab(require("fs").readFileSync(vocab, "utf8"));
process.stdout.write(JSON.stringify(sentences.map((s) => tok.encode(s))));
"""


def test_equals_python_tokenizer(tokenizer, vocab_file):
    assert len(SENTENCES) >= 30
    assert len(tokenizer.encode(LONG).ids) > 300  # the long input is several hundred pieces
    got = run_node(ENCODE_ALL, {"script": str(SCRIPT), "vocab": str(vocab_file),
                                "sentences": SENTENCES})
    wrong = []
    for sentence, js in zip(SENTENCES, got, strict=True):
        py = tokenizer.encode(sentence)
        if js["ids"] != py.ids or js["tokens"] != py.tokens:
            wrong.append(f"{sentence!r}\n  python: {py.tokens}\n  js:     {js['tokens']}")
    assert not wrong, "the JavaScript tokenizer differs on:\n" + "\n".join(wrong)


# A page's <script> and a Worker's importScripts() run the file with no `module`, and its global
# object as `self` (and `window` on a page)
CLASSIC = """
const vm = require("vm"), fs = require("fs");
const {script, vocab} = JSON.parse(fs.readFileSync(0, "utf8"));
const page = {};
page.self = page.window = page;
vm.createContext(page);
vm.runInContext(fs.readFileSync(script, "utf8"), page, {filename: script});
const tok = page.SelfattnWordPiece.fromVocab(fs.readFileSync(vocab, "utf8"));
process.stdout.write(JSON.stringify({globals: Object.keys(page), hello: tok.encode("Hello, world!")}));
"""


def test_classic_script_sets_one_global(tokenizer, vocab_file):
    got = run_node(CLASSIC, {"script": str(SCRIPT), "vocab": str(vocab_file)})
    assert sorted(got["globals"]) == ["SelfattnWordPiece", "self", "window"]
    hello = tokenizer.encode("Hello, world!")
    assert got["hello"] == {"ids": hello.ids, "tokens": hello.tokens}
