"""Export the book's all-MiniLM-L6-v2 to ONNX for chapter 10's live page, which runs it in the
browser with onnxruntime-web (wasm backend) and draws every layer's attention.

    .venv/bin/python tools/export_minilm.py OUT_DIR

writes two files into OUT_DIR:

``minilm-attention-fp16.onnx``
    The encoder of :func:`selfattn.book.pretrained.load` (the book's own ``BertEncoder``, not
    transformers), wrapped to return only its attention probabilities. Input ``input_ids``:
    int64 ``(1, T)``, the tokenizer's ids with ``[CLS]`` first and ``[SEP]`` last, one sentence,
    no padding, ``T`` dynamic from 2 to 512 (the model has 512 positions; more is an error).
    Output ``attentions``: float32 ``(6, 12, T, T)``, layer, head, query, key; every row sums to 1.
``vocab.txt``
    The WordPiece vocabulary, one token per line in id order (line ``i`` is id ``i``), read from
    ``tokenizer.json``'s ``model.vocab``, for the page's JavaScript tokenizer.

Why float16 weights: in float32 the file is about 85 MB, a long download for one page. The
embedding tables and the feed-forward matrices (most of the bytes) are stored as float16, each
followed by a ``Cast`` to float32, which onnxruntime folds when the session is created, so the
arithmetic stays float32. The attention's square projection matrices, the biases and the
LayerNorm weights stay float32: with every matrix in float16, long sentences in other scripts
(48 word pieces of Arabic letters, say) moved some attention probabilities by more than
:data:`MAX_ABS_ERROR` (2e-3). :func:`export` checks the written file with onnxruntime (CPU, one
thread) against the float32 PyTorch model on :data:`SENTENCES`, which include such sentences,
and raises if the largest difference exceeds :data:`MAX_ABS_ERROR`; it returns the sizes and
the errors it measured. Longer inputs than the page takes (it stops at 48 word pieces) move
more: the difference grows slowly with the length.

Needs ``onnx``, ``onnxscript`` (``torch.onnx.export(dynamo=True)``) and ``onnxruntime``
(requirements.txt).
"""

from __future__ import annotations

import contextlib
import json
import logging
import pathlib
import sys
import time
import warnings

import numpy as np
import torch
from torch import Tensor, nn

MODEL_FILE = "minilm-attention-fp16.onnx"
VOCAB_FILE = "vocab.txt"
INPUT_NAME = "input_ids"
OUTPUT_NAME = "attentions"
OPSET = 18
MIN_T, MAX_T = 2, 512  # [CLS] and [SEP] at least; the model's 512 positions at most
FP16_MIN_SIZE = 1024  # float initializers with at least this many numbers are stored as float16
MAX_ABS_ERROR = 2e-3  # on the attention probabilities, against the float32 PyTorch model

# What the check runs: short and long (about 64 word pieces), punctuation, numbers, words split
# into several pieces, and characters the vocabulary lacks ([UNK]).
SENTENCES = [
    "Hi.",
    "The cat sat on the mat.",
    "I saw a saw, and it saw me!",
    "Wait... what?! (No way.) \"Yes\" -- really; 100% sure: 3.14159 & 2 + 2 = 4?",
    "Antidisestablishmentarianism and floccinaucinihilipilification are rarely tokenised whole.",
    "The bank raised its rates, so she walked along the river bank to think it over.",
    "Emoji like \U0001F99C\U0001F680 and scripts like \u16A0\u16A2\u16A6 become unknown tokens.",
    "Xylophonists' quizzical zephyrs jumbled the vexed pterodactyl's unguarded kumquats.",
    "When the committee finally met on Tuesday afternoon, after weeks of delays caused by "
    "scheduling conflicts, missing reports and a broken projector, the chairwoman opened by "
    "thanking everyone for their patience and then, without any further ceremony, asked the "
    "treasurer to explain why the budget was short by exactly $4,812.",
    # other scripts, up to the page's 48 word pieces, where float16 rounding moves the most
    "مرحبا بالعالم هذه جملة عربية طويلة نوعا ما لاختبار",
    "東京は日本の首都です北京是中国的首都我们今天去公园散步天气很好東京は日本の首都です北京是中国",
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο",
    "नमस्ते दुनिया यह एक हिंदी वाक्य है और यह थोड़ा लंबा है ताकि परीक्षण हो",
    "passengers handy pc unofficially intimate murmured knight cretaceous codex "
    "bourgeois tortured perished elephant forecast spit anymore drops contradictory "
    "normandy lead don ར crawled argus farewell precinct lush tensions gradual "
    "selected variety unnamed alcoholism bas user superman cab craftsman bourgeois "
    "spoiled hepatitis gunner timing journalism stilled monica",
    "Съешь же ещё этих мягких французских булок да выпей чаю и",
]


class AttentionOnly(nn.Module):
    """The encoder with one output: every layer's attention probabilities of one sentence,
    ``input_ids`` (1, T) -> ``(layers, heads, T, T)``."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: Tensor) -> Tensor:
        _, attentions = self.encoder(input_ids, need_weights=True)  # (layers, 1, H, T, T)
        return attentions[:, 0]


def write_vocab(tokenizer_json: pathlib.Path, path: pathlib.Path) -> int:
    """Write ``tokenizer.json``'s ``model.vocab`` one token a line, in id order; returns how many."""
    vocab = json.loads(tokenizer_json.read_text(encoding="utf-8"))["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise ValueError(f"{tokenizer_json}: the vocabulary's ids are not 0..{len(tokens) - 1}")
    if any("\n" in t or "\r" in t for t in tokens):
        raise ValueError(f"{tokenizer_json}: a token holds a line break; one token a line fails")
    path.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return len(tokens)


def to_fp16_weights(model, min_size: int = FP16_MIN_SIZE):
    """Store every float32 initializer of ``min_size`` numbers or more as float16, each followed
    by a ``Cast`` back to float32 under its old name (the rest of the graph is unchanged), except
    the square matrices (``d_model x d_model``: the attention's query, key, value and output
    projections), which stay float32: rounding them moved the attention of long sentences in
    other scripts past :data:`MAX_ABS_ERROR`. ``model`` is an ``onnx.ModelProto``, changed in
    place and returned."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    casts = []
    for init in graph.initializer:
        if init.data_type != TensorProto.FLOAT or int(np.prod(init.dims)) < min_size:
            continue
        if len(init.dims) == 2 and init.dims[0] == init.dims[1]:  # an attention projection
            continue
        name = init.name
        half = numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), f"{name}_fp16")
        init.CopyFrom(half)
        casts.append(helper.make_node("Cast", [half.name], [name], to=TensorProto.FLOAT,
                                      name=f"{name}_cast"))
    nodes = [*casts, *graph.node]  # the casts first: the nodes stay in topological order
    del graph.node[:]
    graph.node.extend(nodes)
    return model


@contextlib.contextmanager
def _quiet():
    """Silence what the exporter says on every run and that concerns it, not this model: that
    torchvision's operators are skipped, and a FutureWarning from inside torch.export."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*LeafSpec", category=FutureWarning)
            yield
    finally:
        registration.setLevel(level)


def _session(path: pathlib.Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def compare(session, model, sentences: list[str]) -> dict[str, float]:
    """Run each sentence (alone, no padding) through the ONNX ``session`` and the PyTorch
    ``model`` (a :class:`~selfattn.book.pretrained.Pretrained`); return the largest and the mean
    absolute difference of the attention probabilities, and the share of (layer, head, query)
    rows whose strongest key is the same in both."""
    largest, total, count, same, rows = 0.0, 0.0, 0, 0, 0
    for sentence in sentences:
        enc = model.encode(sentence)
        ours = enc.attentions[:, 0].numpy()  # (layers, H, T, T)
        theirs = session.run([OUTPUT_NAME], {INPUT_NAME: enc.input_ids.numpy()})[0]
        if theirs.shape != ours.shape:
            raise AssertionError(f"{sentence!r}: ONNX gives {theirs.shape}, PyTorch {ours.shape}")
        gap = np.abs(theirs.astype(np.float64) - ours)
        largest = max(largest, float(gap.max()))
        total += float(gap.sum())
        count += gap.size
        same += int((theirs.argmax(-1) == ours.argmax(-1)).sum())
        rows += ours.shape[0] * ours.shape[1] * ours.shape[2]
    return {"max_abs_error": largest, "mean_abs_error": total / count, "same_top_key": same / rows}


def check(path, model, sentences: list[str], bound: float | None = None) -> dict[str, float]:
    """:func:`compare` the ONNX file at ``path`` (onnxruntime, CPU, one thread) with ``model`` on
    ``sentences``; raise ``AssertionError`` if the largest difference exceeds ``bound`` (default
    :data:`MAX_ABS_ERROR`), else return what :func:`compare` measured."""
    bound = MAX_ABS_ERROR if bound is None else bound
    errors = compare(_session(pathlib.Path(path)), model, sentences)
    if not errors["max_abs_error"] <= bound:
        raise AssertionError(
            f"{path}: the attention probabilities differ from PyTorch's by up to "
            f"{errors['max_abs_error']:.2e}, more than the {bound:.0e} allowed")
    return errors


def export(out_dir, model=None, sentences: list[str] | None = None) -> dict:
    """Write :data:`MODEL_FILE` and :data:`VOCAB_FILE` into ``out_dir`` (created if missing),
    check the model against PyTorch on ``sentences`` (default :data:`SENTENCES`), and return a
    report: the files' sizes in bytes, ``max_abs_error``, ``mean_abs_error``, ``same_top_key``
    (see :func:`compare`), ``export_seconds`` (PyTorch to ONNX, float16 weights, written) and
    ``check_seconds``. ``model``: a loaded :class:`~selfattn.book.pretrained.Pretrained`
    (default :func:`~selfattn.book.pretrained.load`). Raises ``AssertionError`` if the largest
    difference exceeds :data:`MAX_ABS_ERROR`."""
    import onnx

    from selfattn.book import pretrained

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = pretrained.load() if model is None else model
    model.model.eval()

    start = time.perf_counter()
    example = torch.tensor([model.tokenizer.encode(SENTENCES[1]).ids])  # (1, T), int64
    with _quiet():
        program = torch.onnx.export(
            AttentionOnly(model.model).eval(), (example,), dynamo=True,
            dynamic_shapes=({1: torch.export.Dim("T", min=MIN_T, max=MAX_T)},),
            input_names=[INPUT_NAME], output_names=[OUTPUT_NAME], opset_version=OPSET,
            verbose=False)
    proto = to_fp16_weights(program.model_proto)
    proto.doc_string = (f"{pretrained.HUB_REPO} at {pretrained.HUB_REVISION}: every layer's "
                        f"attention probabilities; {INPUT_NAME} int64 (1, T), T in {MIN_T}..{MAX_T} "
                        f"-> {OUTPUT_NAME} float32 (layers, heads, T, T)")
    onnx.checker.check_model(proto)
    model_path = out_dir / MODEL_FILE
    onnx.save(proto, str(model_path))
    export_seconds = time.perf_counter() - start
    n_vocab = write_vocab(model.model_dir / "tokenizer.json", out_dir / VOCAB_FILE)
    if n_vocab != model.tokenizer.get_vocab_size():
        raise AssertionError(f"vocab.txt has {n_vocab} tokens, the tokenizer "
                             f"{model.tokenizer.get_vocab_size()}")

    start = time.perf_counter()
    errors = check(model_path, model, SENTENCES if sentences is None else sentences)
    return {"sizes": {MODEL_FILE: model_path.stat().st_size,
                      VOCAB_FILE: (out_dir / VOCAB_FILE).stat().st_size},
            **errors, "export_seconds": export_seconds,
            "check_seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.exit(__doc__.split("\n\n")[1])
    report = export(args[0])
    sizes = report["sizes"]
    print(f"{args[0]}/{MODEL_FILE}: {sizes[MODEL_FILE] / 1e6:.1f} MB, "
          f"{args[0]}/{VOCAB_FILE}: {sizes[VOCAB_FILE] / 1e3:.0f} kB")
    print(f"attention probabilities vs PyTorch over {len(SENTENCES)} sentences: max abs error "
          f"{report['max_abs_error']:.2e} (allowed {MAX_ABS_ERROR:.0e}), mean "
          f"{report['mean_abs_error']:.2e}, same strongest key in {report['same_top_key']:.2%} of rows")
    print(f"export {report['export_seconds']:.1f} s, check {report['check_seconds']:.1f} s")


if __name__ == "__main__":
    main()
