"""TaggerModel and Tagger: losses, CRF marginals/Viterbi, trainable sets, model directory format,
transformers compatibility, and inference over long notes."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from torchcrf import CRF
from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

from dphub import align
from dphub.errors import ConfigError, ModelError
from dphub.labels import get_schema
from dphub.notes import Note
from dphub.tagger import Tagger, TaggerModel
from dphub.tagger_model import crf_marginals

ENCODER_KEYS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")


def _batch(n=3, length=9, num_tags=33, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [length, length - 3, 2][:n] + [length] * max(0, n - 3)
    ids = torch.zeros((n, length), dtype=torch.long)
    att = torch.zeros((n, length), dtype=torch.long)
    tags = torch.full((n, length), -100, dtype=torch.long)
    for i, k in enumerate(lengths):
        ids[i, 0], ids[i, k - 1] = 101, 102
        ids[i, 1 : k - 1] = torch.randint(1000, 9000, (k - 2,), generator=g)
        att[i, :k] = 1
        tags[i, 1 : k - 1] = torch.randint(0, num_tags, (k - 2,), generator=g)
    return {
        "input_ids": ids,
        "attention_mask": att,
        "token_type_ids": torch.zeros_like(ids),
        "position_ids": torch.arange(length).expand(n, length).contiguous(),
    }, tags


@pytest.fixture(scope="module")
def crf_model(tiny_base_model) -> TaggerModel:
    torch.manual_seed(0)
    return TaggerModel.from_base(tiny_base_model, head="crf").eval()


@pytest.fixture(scope="module")
def crf_dir(tiny_base_model, tmp_path_factory, crf_model):
    d = tmp_path_factory.mktemp("tagger") / "tiny-crf"
    crf_model.save(d)
    return d


@pytest.fixture(scope="module")
def tagger(crf_dir) -> Tagger:
    return Tagger.load(crf_dir)


def test_from_base_is_in_train_mode_with_schema_tags(tiny_base_model):
    model = TaggerModel.from_base(tiny_base_model, schema="i2b2-2014", head="softmax")
    assert model.training
    assert model.tags == get_schema("i2b2-2014").bioes_tags()
    assert model.crf is None and model.classifier.out_features == len(model.tags)
    assert not any("pooler" in n for n, _ in model.named_parameters())
    with pytest.raises(ConfigError):
        TaggerModel.from_base(tiny_base_model, head="lstm")
    with pytest.raises(ModelError, match="does not exist"):
        TaggerModel.from_base(str(tiny_base_model) + "-missing")


def test_crf_loss_is_pytorch_crf_nll_over_labelled_positions(crf_model):
    batch, tags = _batch()
    with torch.no_grad():
        loss = crf_model.per_sample_loss(batch, tags)
        em = crf_model.emissions(*(batch[k] for k in ENCODER_KEYS))
        assert loss.shape == (3,)
        for i in range(3):
            valid = tags[i] != -100
            if not valid.any():  # a window of only [CLS] [SEP] (empty note)
                assert float(loss[i]) == 0.0
                continue
            e = em[i][valid].unsqueeze(0)
            t = tags[i][valid].unsqueeze(0)
            full = torch.ones_like(t, dtype=torch.bool)
            expected = -crf_model.crf(e, t, full, reduction="none")
            assert float(loss[i]) == pytest.approx(float(expected[0]), rel=1e-5)
        weighted = crf_model.per_sample_loss(batch, tags, torch.tensor([2.0, 0.5, 3.0]))
    assert torch.allclose(weighted, loss * torch.tensor([2.0, 0.5, 3.0]))


def test_window_without_labels_has_zero_loss(crf_model):
    batch, tags = _batch()
    tags[1] = -100
    with torch.no_grad():
        loss = crf_model.per_sample_loss(batch, tags)
        only_empty = crf_model.per_sample_loss({k: v[1:2] for k, v in batch.items()}, tags[1:2])
    assert float(loss[1]) == 0.0 and float(loss[0]) > 0 and float(only_empty[0]) == 0.0


def test_empty_batch_gives_empty_outputs(crf_model):
    empty = {k: torch.zeros((0, 6), dtype=torch.long) for k in ENCODER_KEYS}
    with torch.no_grad():
        assert crf_model.per_sample_loss(empty, torch.zeros((0, 6), dtype=torch.long)).shape == (0,)
        assert crf_model.marginals(empty).shape == (0, 6, len(crf_model.tags))
    assert crf_model.decode(empty) == []


def test_softmax_loss_is_summed_token_cross_entropy(tiny_base_model):
    model = TaggerModel.from_base(tiny_base_model, head="softmax").eval()
    batch, tags = _batch()
    with torch.no_grad():
        loss = model.per_sample_loss(batch, tags)
        em = model.emissions(*(batch[k] for k in ENCODER_KEYS))
    for i in range(3):
        valid = tags[i] != -100
        ce = torch.nn.functional.cross_entropy(em[i][valid], tags[i][valid], reduction="sum")
        assert float(loss[i]) == pytest.approx(float(ce), rel=1e-5)


def test_crf_marginals_are_gradients_of_log_partition():
    """Forward-backward marginals = d log Z / d emissions (an independent autograd check)."""
    torch.manual_seed(0)
    crf = CRF(5, batch_first=True)
    torch.nn.init.normal_(crf.transitions)
    em = torch.randn(2, 6, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2], dtype=torch.bool)
    log_z = crf.double()._compute_normalizer(em.transpose(0, 1), mask.transpose(0, 1))
    (grad,) = torch.autograd.grad(log_z.sum(), em)
    marg = crf_marginals(em.detach(), mask, crf.start_transitions, crf.end_transitions,
                         crf.transitions)
    assert torch.allclose(marg[mask], grad[mask], atol=1e-10)


def test_marginals_and_decode_cover_real_pieces_only(crf_model):
    batch, _ = _batch()
    with torch.no_grad():
        marg = crf_model.marginals(batch)
        paths = crf_model.decode(batch)
        em = crf_model.emissions(*(batch[k] for k in ENCODER_KEYS))
    sums = marg.sum(-1)
    n_real = batch["attention_mask"].sum(1) - 2
    assert [len(p) for p in paths] == n_real.tolist()
    for i, n in enumerate(n_real.tolist()):
        assert torch.allclose(sums[i, 1 : 1 + n], torch.ones(n), atol=1e-5)
        assert float(sums[i, 0]) == 0 and float(sums[i, 1 + n :].abs().sum()) == 0
        if n:
            expected = crf_model.crf.decode(em[i : i + 1, 1 : 1 + n])[0]
            assert paths[i] == expected


def _trainable(model):
    return {n for n, p in model.named_parameters() if p.requires_grad}


def test_set_trainable_freezes_embeddings_and_lower_layers(tiny_base_model):
    model = TaggerModel.from_base(tiny_base_model)
    model.set_trainable(train_layers=1)
    names = _trainable(model)
    assert {"classifier.weight", "crf.transitions", "crf.start_transitions"} <= names
    assert any(".layer.1." in n for n in names)
    assert not any(".layer.0." in n or "embeddings" in n for n in names)
    model = TaggerModel.from_base(tiny_base_model)
    model.set_trainable(train_layers=0)
    assert _trainable(model) == {"classifier.weight", "classifier.bias", "crf.start_transitions",
                                 "crf.end_transitions", "crf.transitions"}
    model = TaggerModel.from_base(tiny_base_model)
    model.set_trainable(train_layers=None)
    assert any("word_embeddings" in n for n in _trainable(model))
    with pytest.raises(ConfigError):
        model.set_trainable(train_layers=5)


def test_lora_trains_only_adapters_and_head(tiny_base_model):
    model = TaggerModel.from_base(tiny_base_model)
    model.set_trainable(train_layers=1, lora_rank=2)
    enc = {n for n in _trainable(model) if not n.startswith(("classifier.", "crf."))}
    assert enc and all("lora_" in n for n in enc)
    assert all(".layer.1." in n for n in enc)
    assert any("query" in n for n in enc) and any("value" in n for n in enc)


def test_save_writes_transformers_compatible_directory(crf_dir, tiny_base_model, crf_model):
    names = sorted(p.name for p in crf_dir.iterdir())
    assert names == ["config.json", "model.safetensors", "special_tokens_map.json",
                     "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    for f in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        assert (crf_dir / f).read_bytes() == (tiny_base_model / f).read_bytes()
    cfg = json.loads((crf_dir / "config.json").read_text())
    assert cfg["architectures"] == ["BertForTokenClassification"]
    assert cfg["id2label"]["0"] == "O" and len(cfg["id2label"]) == len(crf_model.tags)
    assert cfg["dphub"]["head"] == "crf" and cfg["dphub"]["label_schema"] == "hipaa"
    assert cfg["dphub"]["max_length"] == 128 and cfg["dphub"]["stride"] == 32
    assert str(tiny_base_model) not in (crf_dir / "config.json").read_text()

    from safetensors import safe_open

    with safe_open(str(crf_dir / "model.safetensors"), "pt") as fh:
        keys = set(fh.keys())
    assert {"crf.transitions", "classifier.weight"} <= keys
    assert all(k.startswith(("bert.", "classifier.", "crf.")) for k in keys)

    # plain transformers loads it (CRF tensors ignored) and computes the same emissions
    hf = AutoModelForTokenClassification.from_pretrained(crf_dir).eval()
    batch, _ = _batch()
    with torch.no_grad():
        logits = hf(**batch).logits
        ours = crf_model.emissions(*(batch[k] for k in ENCODER_KEYS))
    assert torch.allclose(logits, ours, atol=1e-5)
    ner = pipeline("token-classification", model=str(crf_dir), device="cpu")
    out = ner("Mr John Smith was seen at Boston General on 3/4/2091.")
    assert isinstance(out, list)


def test_load_roundtrip_and_lora_merge(tiny_base_model, tmp_path):
    torch.manual_seed(3)
    model = TaggerModel.from_base(tiny_base_model)
    model.set_trainable(train_layers=2, lora_rank=2)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    model.eval()
    batch, _ = _batch()
    with torch.no_grad():
        before = model.emissions(*(batch[k] for k in ENCODER_KEYS))
        model.save(tmp_path / "m")
        loaded = TaggerModel.load(tmp_path / "m").eval()
        after = loaded.emissions(*(batch[k] for k in ENCODER_KEYS))
    assert loaded.training is False and loaded.tags == model.tags
    assert not any("lora" in n for n, _ in loaded.named_parameters())
    assert torch.allclose(before, after, atol=1e-5)
    assert torch.equal(loaded.crf.transitions, model.crf.transitions)
    assert "lora_A" in " ".join(n for n, _ in model.named_parameters())  # model untouched


def test_load_refuses_bad_directories(crf_dir, tmp_path):
    with pytest.raises(ModelError):
        TaggerModel.load(tmp_path)
    bad = tmp_path / "pickled"
    shutil.copytree(crf_dir, bad)
    (bad / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(ModelError, match="pickle"):
        TaggerModel.load(bad)
    (bad / "pytorch_model.bin").unlink()
    (bad / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ModelError):
        TaggerModel.load(bad)
    cfg = json.loads((crf_dir / "config.json").read_text())
    del cfg["dphub"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="dphub"):
        TaggerModel.load(bad)


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_load_refuses_non_finite_weights(crf_dir, tmp_path, value):
    """Issue 31 item 8: a diverged run's ±inf head loaded silently and tagged nothing."""
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "diverged"
    shutil.copytree(crf_dir, bad)
    tensors = load_file(bad / "model.safetensors")
    tensors["crf.transitions"][0, 0] = value
    tensors["classifier.bias"][1] = -value
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelError, match=r"2 tensor\(s\) hold non-finite values \(inf or NaN\): "
                                         r"classifier.bias, crf.transitions"):
        TaggerModel.load(bad)
    with pytest.raises(ModelError, match="non-finite"):
        Tagger.load(bad)


def test_base_encoder_with_non_finite_weights_is_refused(tiny_base_model, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "base"
    shutil.copytree(tiny_base_model, bad)
    weights = next(bad.glob("*.safetensors"))
    tensors = load_file(weights)
    name = next(k for k, t in tensors.items() if t.is_floating_point() and "embeddings" in k)
    tensors[name].view(-1)[0] = float("inf")
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(ModelError, match="base model .* hold non-finite values"):
        TaggerModel.from_base(bad, head="crf")


def _long_note(n_sentences: int) -> str:
    return " ".join(
        f"Pt John Smith{i} seen 3/{i % 28 + 1}/2091 at Boston unit {i}, MRN 12345{i}."
        for i in range(n_sentences)
    )


def test_token_scores_cover_every_piece_of_long_notes(tagger, crf_dir):
    notes = [Note("long", _long_note(40)), Note("empty", ""), Note("short", "Seen by Dr Lee.")]
    scores = tagger.token_scores(notes, batch_size=4)
    tok = AutoTokenizer.from_pretrained(crf_dir)
    pieces = align.tokenize(tok, [n.text for n in notes])
    assert len(pieces[0]) > 3 * 128  # several windows
    for ts, nt in zip(scores, pieces, strict=True):
        assert len(ts) == len(nt)
        assert np.array_equal(ts.offsets, nt.offsets)
        assert ts.labels == tagger.labels and ts.label_probs.shape == (len(nt), 8)
        assert len(ts.decoded) == len(nt)
        if len(nt):
            assert ((ts.phi_prob >= 0) & (ts.phi_prob <= 1)).all()
            # P(O) + sum of label probabilities = 1
            assert np.allclose(ts.label_probs.sum(1), ts.phi_prob, atol=1e-5)
    assert tagger.tokenizer_id.startswith("tiny-bert@")


def test_token_scores_do_not_depend_on_batching(tagger):
    notes = [Note(str(i), _long_note(3 + 4 * i)) for i in range(4)]
    a = tagger.token_scores(notes, batch_size=1)
    b = tagger.token_scores(notes, batch_size=16)
    for x, y in zip(a, b, strict=True):
        assert np.allclose(x.phi_prob, y.phi_prob, atol=1e-5)
        assert x.decoded == y.decoded


def test_short_note_scores_equal_direct_marginals(tagger):
    note = Note("n", "Seen by Dr Lee on 2/3/2090.")
    ts = tagger.token_scores([note])[0]
    windows = align.make_windows(align.tokenize(tagger.tokenizer, [note.text]), tagger.tokenizer)
    assert len(windows) == 1
    batch = align.collate(windows, 0)
    with torch.no_grad():
        marg = tagger.model.marginals(batch)[0, 1 : 1 + len(ts)].numpy()
    assert np.allclose(ts.phi_prob, 1 - marg[:, 0], atol=1e-5)


def test_tag_spans_with_thresholds(tagger):
    note = Note("n", _long_note(2))
    all_spans = tagger.tag([note], threshold=0.0)[0]
    assert all_spans and all(0 <= s.start < s.end <= len(note.text) for s in all_spans)
    assert sum(s.end - s.start for s in all_spans) > 0.5 * len(note.text.replace(" ", ""))
    assert tagger.tag([note], threshold=1.01)[0] == []
    decoded = tagger.tag([note])[0]
    assert all(s.source == tagger.name for s in decoded)


def test_tagger_save_roundtrip(tagger, tmp_path):
    tagger.save(tmp_path / "copy")
    again = Tagger.load(tmp_path / "copy")
    note = Note("n", "Seen by Dr Lee on 2/3/2090.")
    assert np.allclose(again.token_scores([note])[0].phi_prob,
                       tagger.token_scores([note])[0].phi_prob)
    assert again.tokenizer_id.split("@")[1] == tagger.tokenizer_id.split("@")[1]
