"""The book's promise: no measured number is typed into prose.

A number an experiment produced appears only in an output the build computes (a printed sentence,
a table, a figure's label); the prose says what the output shows and points to it. The rule is
enforced on every page's prose (the chapters' markdown cells, intro.md, glossary.md): any number
written with digits fails this test unless it is one of the few kinds the allow-list names:

* a number in a sentence that cites its source ("Shazeer (2019) reports ..."): quoted from a
  paper, with its citation in the same sentence;
* a reference to a part of a text: chapter 5, §3.2.1, Table 1, exercise 2, Algorithm 1, or to
  an issue or pull request (pytorch/pytorch#133882);
* a digit inside a name: GPT-2, float16, all-MiniLM-L6-v2, a 1-D convolution, the T4 GPU;
* the number of a list item, a heading or a table row; a version (Python 3.11);
* the givens of an exercise (a paragraph that starts with **Exercise N.**);
* 0 and 1 on their own, the constants of the mathematics (weights between 0 and 1, mean 0 and
  variance 1, token 1);
* a whole number inside a formula ($2i$, $10000^{2i/d}$): part of a definition. A decimal number
  inside a formula is flagged like any other.

Settings of an experiment (sizes, steps, seeds) live in the code that sets them, not in prose.
"""

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "intro.md", ROOT / "glossary.md", *sorted((ROOT / "chapters").glob("*.ipynb"))]

CITATION = re.compile(r"\b[A-Z][A-Za-z'-]+(?:\s+et\s+al\.(?:'s)?|\s+and\s+[A-Z][A-Za-z'-]+)?,?\s+"
                      r"\(?(?:19|20)\d\d[a-z]?\b")
PART = re.compile(r"#\d+\b|\b(?:chapters?|sections?|tables?|figures?|fig\.|exercises?|algorithms?|"
                  r"equations?|appendix|part|steps?|cells?|items?|pitfalls?)\s+\d+(?:\.\d+)*"
                  r"(?:\s*(?:,|and|or|to|-|–)\s*\d+(?:\.\d+)*)*|§\s?\d+(?:\.\d+)*", re.I)
NAME = re.compile(r"\b[A-Za-z_][\w]*\d[\w.-]*|\b\d+-D\b|\b\d+(?:st|nd|rd|th)\b|[A-Za-z]-\d+\b|"
                  r"\b\d+[A-Za-z_]+[A-Za-z_\d]*\b(?<!\dx)")
VERSION = re.compile(r"\b(?:Python|PyTorch|torch|ipywidgets|version)\s+\d+(?:\.\d+)*\+?", re.I)
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:\s?%|x\b)?")
MATH_CONSTANT = re.compile(r"[01],?")  # 0 and 1 alone


def prose_of(path: pathlib.Path) -> list[str]:
    """The page's prose: markdown cells of a notebook, or the markdown file."""
    if path.suffix == ".md":
        return [path.read_text(encoding="utf-8")]
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]


def hand_typed_numbers(text: str) -> list[str]:
    """The numbers in ``text`` that the rule does not allow, each with its context."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)  # code blocks: code, not prose
    text = re.sub(r"<details>.*?</details>", " ", text, flags=re.S)  # folded exercise solutions
    text = re.sub(r"^\*\*Exercise \d+.*?(?=\n\s*\n|\Z)", " ", text, flags=re.M | re.S)  # exercise givens
    text = re.sub(r"\(https?://[^)]*\)|<https?://[^>]*>|https?://\S+", " ", text)  # addresses
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    text = re.sub(r"\{(?:doc|ref|numref)\}`[^`]*`", " ", text)  # cross-references
    found = []
    for math in re.findall(r"\$\$.*?\$\$|\$[^$\n]+\$", text, flags=re.S):
        found += [f"{d} (in {math.strip()[:40]!r})" for d in re.findall(r"\d+\.\d+", math)]
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]+\$", " ", text, flags=re.S)  # formulas: definitions
    text = re.sub(r"`[^`]*`", " ", text)  # inline code: names from the code
    text = re.sub(r"^\s*(?:#+\s*)?\d+\.\s", " ", text, flags=re.M)  # list items, numbered headings
    text = re.sub(r"^\|\s*\d+\s*\|", "|", text, flags=re.M)  # numbered table rows
    # sentences end at . ! ? ; : (not after "et al." or "e.g.") and at paragraphs and list items
    ends = r"(?<!\bal\.)(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bvs\.)(?<=[.!?:;])\s+|\n\s*\n|\n[-*|]"
    for sentence in re.split(ends, text):
        if CITATION.search(sentence):
            continue  # quoted from a paper, cited in the same sentence
        rest = NAME.sub(" ", PART.sub(" ", VERSION.sub(" ", sentence)))
        for number in NUMBER.findall(rest):
            if MATH_CONSTANT.fullmatch(number):
                continue
            found.append(f"{number!r} in: {' '.join(sentence.split())[:100]}")
    return found


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.stem)
def test_prose_holds_no_hand_typed_number(path):
    found = [n for cell in prose_of(path) for n in hand_typed_numbers(cell)]
    assert found == [], (
        f"{path.name}: numbers typed into prose; put them in a computed output, cite the paper "
        "in the same sentence, or leave the setting to the code:\n  " + "\n  ".join(found))


@pytest.mark.parametrize("planted", [
    "The tagger reaches 98% on `saw`.",
    "It was 3.8 times faster than MHA.",
    "After training, the loss is 0.03.",
    "MQA decodes 4x faster here.",
    "We trained for 400 steps on 4,000 sentences.",
    "The largest weight is $0.74$ on the cue.",
])
def test_the_scanner_flags_a_planted_number(planted):
    assert hand_typed_numbers(planted), planted


@pytest.mark.parametrize("allowed", [
    "Shazeer (2019) reports the decoder's time per token falling from 46 to 3.8 µs.",
    "Vaswani et al. 2017, §3.2.1, divide by the square root.",
    "Chapter 5 trains it; see exercise 2 and Table 1.",
    "GPT-2 and all-MiniLM-L6-v2 use float16 on a T4 with a 1-D convolution.",
    "1. First item\n2. Second item",
    "## 3. Time and memory",
    "The angle is $\\theta_i = 10000^{-2i/d}$ for pair $i$.",
    "The exercise uses `steps=400` in code.",
    "Weights lie between 0 and 1, with mean 0 and variance 1; token 1 attends to itself.",
    "| 4 | a chapter | what it shows |",
    "With Python 3.11+ and make.",
    "**Exercise 2.** A model with 32 heads runs on 8,192 tokens. How many bytes?",
])
def test_the_scanner_allows_what_the_rule_allows(allowed):
    assert hand_typed_numbers(allowed) == [], allowed
