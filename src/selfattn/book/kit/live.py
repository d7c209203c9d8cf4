"""Live explorers for the static book: a model's weights in the page, its forward pass in JavaScript.

The explorers of :mod:`.viz` switch between states the build computed. The ones
made here take a sentence the reader types and compute its attention in the browser, with no
kernel and no server: the build writes the trained weights into the page as a JSON *spec*
(float32, base64), and ``assets/live/live.js`` runs the same forward pass on them and draws the
heatmap in the book's colours. The spec sits in the page itself, so this works from ``file://``
too.

Two kinds of spec:

- ``"attention"``: one head of scaled dot-product attention over a fixed word embedding
  (chapter 2): ``softmax(x W_q (x W_k)^T / (tau sqrt(d_k)))``, optionally causal.
- ``"tagger"``: :class:`~selfattn.book.tagging.AttentionTagger` (chapters 1 and 5): embedding,
  positions (none, sinusoidal, learned, RoPE or ALiBi), one multi-head attention layer with a
  residual, an MLP, and the tags it predicts.

:func:`forward` recomputes a spec in PyTorch from the weights the page holds: the build asserts
that it gives the trained model's numbers, and the browser test compares the page with it.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import pathlib
import re
import unicodedata
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from ... import masks
from ...attention import scaled_dot_product_attention
from ...multihead import MultiHeadAttention
from ..tagging import AttentionTagger
from .viz import STATIC_ENV

RULES = ("cue_before_saw", "latest_cue")  # the tasks' own tagging rules, which the page checks


def _encode(t: Tensor) -> dict:
    """A tensor as ``{"shape", "data"}``: float32, little-endian, base64."""
    array = t.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4")
    return {"shape": list(array.shape), "data": base64.b64encode(array.tobytes()).decode()}


def _decode(entry: Mapping) -> Tensor:
    array = np.frombuffer(base64.b64decode(entry["data"]), dtype="<f4").reshape(entry["shape"])
    return torch.from_numpy(array.copy())


def _colormap(name: str = "YlGnBu") -> list[str]:
    """The heatmaps' 256 colours, as ``selfattn.viz.heatmap`` draws them."""
    from matplotlib import colormaps

    cmap = colormaps[name].resampled(256)
    return ["#" + "".join(f"{round(255 * c):02x}" for c in cmap(i)[:3]) for i in range(256)]


def _check_words(words: Sequence[str | None]) -> list[str | None]:
    words = list(words)
    named = [w for w in words if w is not None]
    if not named:
        raise ValueError("words must name at least one token")
    if len(set(named)) != len(named):
        raise ValueError("words must not repeat: each names one token id")
    bad = [w for w in named if not isinstance(w, str) or not re.fullmatch(r"\S+", w)
           or _without_punctuation(w) != w]
    if bad:
        raise ValueError(f"each word must be one non-empty token without spaces or punctuation "
                         f"(the page reads punctuation as a space), got {bad[0]!r}")
    return words


def attention_spec(name: str, words: Sequence[str], embedding: Tensor, W_q: Tensor, W_k: Tensor,
                   *, temperatures: Sequence[float], sentences: Sequence[str],
                   max_tokens: int = 16) -> dict:
    """Chapter 2's view: word ``i`` of ``words`` has the vector ``embedding[i]`` ``(V, d_model)``;
    queries ``x W_q`` and keys ``x W_k`` ``(d_model, d_k)``; the reader picks the temperature
    among ``temperatures`` and a mask (none or causal) and types a sentence of these words."""
    checked = _check_words(words)
    if embedding.ndim != 2 or embedding.shape[0] != len(checked):
        raise ValueError(f"embedding must be (len(words), d_model) = ({len(checked)}, d), "
                         f"got {tuple(embedding.shape)}")
    for label, W in (("W_q", W_q), ("W_k", W_k)):
        if W.ndim != 2 or W.shape[0] != embedding.shape[1]:
            raise ValueError(f"{label} must be (d_model, d_k) with d_model={embedding.shape[1]}, "
                             f"got {tuple(W.shape)}")
    if W_q.shape != W_k.shape:
        raise ValueError(f"W_q and W_k must have one shape, got {tuple(W_q.shape)} and "
                         f"{tuple(W_k.shape)}")
    if not temperatures or any(t <= 0 for t in temperatures):
        raise ValueError(f"temperatures must be positive numbers, got {list(temperatures)}")
    return _spec(name, "attention", checked, sentences, max_tokens,
                 temperatures=[float(t) for t in temperatures], masks=["none", "causal"],
                 weights={"embedding": _encode(embedding), "W_q": _encode(W_q),
                          "W_k": _encode(W_k)})


def tagger_spec(name: str, taggers: Mapping[str, AttentionTagger], words: Sequence[str | None],
                tags: Sequence[str], *, rule: str, sentences: Sequence[str],
                max_tokens: int = 24) -> dict:
    """Chapters 1 and 5: one or more trained :class:`AttentionTagger` (the reader picks one by its
    key in ``taggers``). ``words[i]`` names token id ``i`` (None: an id the task never uses),
    ``tags[j]`` tag id ``j``; ``rule`` is the task's tagging rule (one of :data:`RULES`), which
    the page applies to the typed sentence to say where the model agrees."""
    words = _check_words(words)
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if not taggers:
        raise ValueError("taggers must hold at least one model")
    models = {}
    for key, model in taggers.items():
        if not isinstance(model, AttentionTagger) or not isinstance(model.attn, MultiHeadAttention):
            raise TypeError(f"{key!r}: a live tagger is an AttentionTagger with the multi-head "
                            f"layer (no scorer), got {type(model).__name__}")
        cfg = model.attn.config
        if model.embed.num_embeddings != len(words):
            raise ValueError(f"{key!r} has {model.embed.num_embeddings} token ids, and words "
                             f"names {len(words)}")
        if model.mlp[-1].out_features != len(tags):
            raise ValueError(f"{key!r} predicts {model.mlp[-1].out_features} tags, and tags "
                             f"names {len(tags)}")
        if max_tokens > model.max_len:
            raise ValueError(f"max_tokens={max_tokens} exceeds {key!r}'s max_len={model.max_len}")
        config = {"vocab_size": len(words), "n_tags": len(tags), "d": model.embed.embedding_dim,
                  "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
                  "max_len": model.max_len, "positions": model.positions, "causal": model.causal}
        state = {k: _encode(v) for k, v in model.state_dict().items()}
        if model.positions == "alibi":
            from ...positional import alibi_slopes

            state["alibi_slopes"] = _encode(alibi_slopes(cfg.n_heads))
        models[key] = {"config": config, "weights": state}
    return _spec(name, "tagger", words, sentences, max_tokens, tags=list(tags), rule=rule,
                 models=models)


def _check_name_and_sentences(name: str, sentences: Sequence[str]) -> list[str]:
    if not re.fullmatch(r"[a-z0-9-]+", name):
        raise ValueError(f"name must be lowercase letters, digits and dashes, got {name!r}")
    sentences = list(sentences)
    if not sentences:
        raise ValueError("sentences must hold at least one example sentence")
    return sentences


def _spec(name: str, kind: str, words: list[str | None], sentences: Sequence[str],
          max_tokens: int, **rest: object) -> dict:
    sentences = _check_name_and_sentences(name, sentences)
    spec = {"name": name, "kind": kind, "words": words, "sentences": sentences,
            "max_tokens": max_tokens, "colors": _colormap(), **rest}
    for s in sentences:
        tokenize(spec, s)  # every example must be valid input
    return spec


def _without_punctuation(text: str) -> str:
    r"""``text`` with every punctuation mark (Unicode's category P) read as a space, as live.js's
    ``\p{P}`` does."""
    return "".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in text)


def tokenize(spec: Mapping, text: str) -> list[int]:
    """The token ids of ``text`` as the page reads it: punctuation (Unicode's category P) read as
    a space, words split on spaces and lowercased, so that "I saw a saw." is "i saw a saw";
    ``ValueError`` naming the first unknown word, or for too many or no words."""
    ids = {w: i for i, w in enumerate(spec["words"]) if w is not None}
    words = _without_punctuation(text).lower().split()
    if not words:
        raise ValueError("type a sentence first")
    if len(words) > spec["max_tokens"]:
        raise ValueError(f"{len(words)} words; this view takes at most {spec['max_tokens']}")
    unknown = [w for w in words if w not in ids]
    if unknown:
        raise ValueError(f"unknown word {unknown[0]!r}")
    return [ids[w] for w in words]


@torch.no_grad()
def forward(spec: Mapping, text: str, *, model: str | None = None, temperature: float = 1.0,
            mask: str = "none") -> dict[str, Tensor]:
    """What the page computes for ``text``, recomputed in PyTorch from the spec's own weights:
    ``{"weights": (H, T, T)}``, plus ``"logits": (T, n_tags)`` for a tagger (``model`` picks
    one of its models; default the first)."""
    ids = torch.tensor(tokenize(spec, text))
    if spec["kind"] == "attention":
        w = {k: _decode(v) for k, v in spec["weights"].items()}
        x = w["embedding"][ids]  # (T, d_model)
        q, k = x @ w["W_q"], x @ w["W_k"]  # (T, d_k) each
        m = masks.causal_mask(len(ids)) if mask == "causal" else None
        scale = 1 / (temperature * math.sqrt(q.shape[-1]))
        _, weights = scaled_dot_product_attention(q, k, k, attn_mask=m, scale=scale)  # (T, T)
        return {"weights": weights[None]}  # (1, T, T)
    tagger = rebuild(spec, model)
    logits, weights = tagger(ids[None], need_weights=True)  # (1, T, C), (1, H, T, T)
    return {"weights": weights[0], "logits": logits[0]}


def rebuild(spec: Mapping, model: str | None = None) -> AttentionTagger:
    """The :class:`AttentionTagger` a tagger spec holds, with the page's weights."""
    entry = spec["models"][model if model is not None else next(iter(spec["models"]))]
    c = entry["config"]
    tagger = AttentionTagger(c["vocab_size"], c["n_tags"], d=c["d"], n_heads=c["n_heads"],
                             n_kv_heads=c["n_kv_heads"], head_dim=c["head_dim"],
                             max_len=c["max_len"], positions=c["positions"], causal=c["causal"])
    state = {k: _decode(v) for k, v in entry["weights"].items() if k != "alibi_slopes"}
    tagger.load_state_dict(state)
    return tagger.eval()


VENDOR = pathlib.Path(__file__).resolve().parents[4] / "_vendor"  # what make puts in _static/


MINILM_MODEL = "minilm/minilm-attention-fp16.onnx"
MINILM_VOCAB = "minilm/vocab.txt"
MINILM_RUNTIME = ("ort/ort.wasm.min.mjs", "ort/ort-wasm-simd-threaded.mjs",
                  "ort/ort-wasm-simd-threaded.wasm")


def minilm_spec(name: str, sentences: Sequence[str], *, max_pieces: int = 48,
                vendor: pathlib.Path = VENDOR) -> dict:
    """Chapter 10: all-MiniLM-L6-v2 live in the page, through onnxruntime-web in a worker.

    Nothing is downloaded until the reader presses a button, which states the size: the files
    ``make`` exported and copied into ``_vendor`` (``tools/export_minilm.py``: the model with
    float16 weights, checked against PyTorch; the runtime from npm), measured here."""
    missing = [f for f in (MINILM_MODEL, MINILM_VOCAB, *MINILM_RUNTIME)
               if not (vendor / f).exists()]
    if missing:
        raise FileNotFoundError(f"{missing[0]} is not in {vendor}: `make book` exports the model "
                                "and copies the runtime there before the chapters run")
    size = {"model": (vendor / MINILM_MODEL).stat().st_size,
            "vocab": (vendor / MINILM_VOCAB).stat().st_size,
            "runtime": sum((vendor / f).stat().st_size for f in MINILM_RUNTIME)}
    sentences = _check_name_and_sentences(name, sentences)
    from ..pretrained import BertConfig, find_model_dir

    config = BertConfig.from_json(find_model_dir() / "config.json")
    return {"name": name, "kind": "minilm", "sentences": sentences, "max_pieces": max_pieces,
            "layers": config.num_hidden_layers, "heads": config.num_attention_heads,
            "colors": _colormap(), "bytes": size,
            "model": MINILM_MODEL, "vocab": MINILM_VOCAB,
            "ort": MINILM_RUNTIME[0], "wasm": "ort/", "worker": "live/minilm-worker.mjs",
            "tokenizer": "live/wordpiece.js"}


def markup(spec: Mapping) -> str:
    """The page's HTML for a spec: a mount that ``live.js`` fills, the spec beside it."""
    data = json.dumps(spec, separators=(",", ":")).replace("</", "<\\/")
    return (f'<div class="selfattn-live" data-live="{html.escape(spec["name"])}">'
            f'<script type="application/json" class="selfattn-live-spec">{data}</script>'
            '<p class="selfattn-live-fallback">This explorer computes in your browser with '
            "JavaScript, which is off here; the precomputed explorer below needs none of it.</p>"
            "</div>")


def show(spec: Mapping) -> None:
    """Display the live explorer in the static book (``SELFATTN_STATIC=1``); in a kernel, where
    the page's script is not loaded and the ipywidgets explorer is live anyway, nothing."""
    if os.environ.get(STATIC_ENV) != "1":
        return
    from IPython.display import HTML, display

    display(HTML(markup(spec)))
