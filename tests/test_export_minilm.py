"""tools/export_minilm.py: chapter 10's live page gets an ONNX MiniLM (float16 weights) whose
attention probabilities match the PyTorch model's, and the vocabulary for its tokenizer.

One export for the module (about 10 s); no test touches the network.
"""

import importlib.util
import os
import pathlib

import numpy as np
import onnx
import pytest
import torch

from selfattn.book import pretrained

pytestmark = pytest.mark.slow  # the export takes seconds (tools/export_minilm.py)

os.environ["HF_HUB_OFFLINE"] = "1"
ROOT = pathlib.Path(__file__).resolve().parent.parent

spec = importlib.util.spec_from_file_location("export_minilm", ROOT / "tools" / "export_minilm.py")
export_minilm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(export_minilm)

# Not the exporter's own sentences: a question, a list, quotes, digits, a long one (~60 pieces),
# words split into pieces and characters the vocabulary lacks.
SENTENCES = [
    "Why?",
    "Apples, pears, plums; cherries: all ripe.",
    "She said \"no\" twice -- then yes.",
    "In 1969, 3 astronauts flew 384,400 km to the Moon and back.",
    "Photosynthesising cyanobacteria outcompeted anaerobic microorganisms.",
    "Snowmen \u2603\u2603 and the glyphs \u0F00\u0F01 are not in the vocabulary.",
    "The old man the boats.",
    "Although the river had flooded the lower fields twice that spring, the farmers, who had seen "
    "worse years and remembered them well, replanted the barley in late May and hoped, as they "
    "always did, that the summer would be dry enough for a decent harvest in September.",
]


@pytest.fixture(scope="module")
def model():
    return pretrained.load()


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("minilm-onnx")
    return out, export_minilm.export(out, model=model)


@pytest.fixture(scope="module")
def session(exported):
    return export_minilm._session(exported[0] / export_minilm.MODEL_FILE)


def test_the_test_sentences_are_new_and_varied(model):
    assert not set(SENTENCES) & set(export_minilm.SENTENCES)
    tokens = [model.tokenizer.encode(s).tokens for s in SENTENCES]
    assert any("[UNK]" in t for t in tokens)
    assert min(map(len, tokens)) <= 4 and max(map(len, tokens)) >= 56


def test_report(exported):
    out, report = exported
    assert report["sizes"] == {name: (out / name).stat().st_size
                               for name in (export_minilm.MODEL_FILE, export_minilm.VOCAB_FILE)}
    assert report["max_abs_error"] <= 2e-3
    assert 0 < report["mean_abs_error"] < report["max_abs_error"]
    assert 0.99 <= report["same_top_key"] <= 1
    assert report["export_seconds"] > 0


def test_matches_pytorch_on_other_sentences(session, model):
    errors = export_minilm.compare(session, model, SENTENCES)
    assert errors["max_abs_error"] <= 2e-3
    assert errors["mean_abs_error"] <= 1e-4
    assert errors["same_top_key"] >= 0.99


def test_the_check_can_fail(exported, model):
    # a tighter bound than float16 weights can meet
    path = exported[0] / export_minilm.MODEL_FILE
    assert export_minilm.check(path, model, SENTENCES[:2])["max_abs_error"] <= 2e-3
    with pytest.raises(AssertionError, match="differ from PyTorch's"):
        export_minilm.check(path, model, SENTENCES[:2], bound=1e-6)


@pytest.mark.parametrize("T", [2, 3, 17, 128, 512])
def test_any_length_from_2_to_512(session, T):
    ids = torch.randint(999, 30522, (1, T))
    ids[0, 0], ids[0, -1] = 101, 102  # [CLS] ... [SEP]
    (inputs,) = session.get_inputs()
    (outputs,) = session.get_outputs()
    assert (inputs.name, inputs.type, outputs.name) == ("input_ids", "tensor(int64)", "attentions")
    (out,) = session.run(["attentions"], {"input_ids": ids.numpy()})
    assert out.shape == (6, 12, T, T) and out.dtype == np.float32
    assert (out >= 0).all()
    np.testing.assert_allclose(out.sum(-1), 1, atol=1e-5)  # every row a distribution


def test_more_than_512_tokens_is_an_error(session):
    ids = np.full((1, 513), 1000, dtype=np.int64)
    with pytest.raises(Exception, match="513"):
        session.run(["attentions"], {"input_ids": ids})


def test_weights_are_float16_but_the_attention_projections_and_the_file_small(exported):
    path = exported[0] / export_minilm.MODEL_FILE
    assert path.stat().st_size < 50e6
    proto = onnx.load(str(path))
    init = proto.graph.initializer
    large = [i for i in init if int(np.prod(i.dims)) >= 1024]
    square = [i for i in large if len(i.dims) == 2 and i.dims[0] == i.dims[1]]
    # query, key, value and output projections, float32; the last layer's value and output
    # projections do not reach its attention probabilities, so the export drops them
    assert len(square) == 6 * 4 - 2
    assert all(i.data_type == onnx.TensorProto.FLOAT for i in square)
    rest = [i for i in large if i not in square]
    assert rest and all(i.data_type == onnx.TensorProto.FLOAT16 for i in rest)
    assert not [i.name for i in init if i.data_type == onnx.TensorProto.DOUBLE]
    half = sum(int(np.prod(i.dims)) for i in init if i.data_type == onnx.TensorProto.FLOAT16)
    assert half > 17e6  # the embedding tables and the feed-forward matrices: 17.8 million
    casts = {n.input[0] for n in proto.graph.node if n.op_type == "Cast"}
    assert {i.name for i in rest} <= casts  # each one cast back to float32 before use


def test_vocab_file(exported, model):
    lines = (exported[0] / export_minilm.VOCAB_FILE).read_text(encoding="utf-8").split("\n")
    assert lines[-1] == ""  # one token a line, every line ended
    vocab = lines[:-1]
    assert len(vocab) == model.tokenizer.get_vocab_size() == 30522
    assert vocab[101] == "[CLS]" and vocab[102] == "[SEP]" and vocab[0] == "[PAD]"
    assert vocab == [model.tokenizer.id_to_token(i) for i in range(len(vocab))]
