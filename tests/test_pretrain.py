"""Public pretraining: the realistic generator, `dphub pretrain`, its card, the gate, and DP
training from the public base. Tiny models and synthetic notes only."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_base_model

from dphub import formats, synth
from dphub import train as T
from dphub.card import is_public_model, load_card
from dphub.cli.main import main
from dphub.encoders import DEFAULT_BASE_MODEL_ID
from dphub.errors import ConfigError
from dphub.hub.gate import check_publishable
from dphub.hub.validate import validate_card
from dphub.notes import check_spans
from dphub.train.pretrain import PretrainConfig, parse_train_layers, pretrain


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module", autouse=True)
def tiny_embedded(tmp_path_factory: pytest.TempPathFactory):
    """The tiny encoder stands in for the embedded package's model in this module: the gate
    identifies a base by its weights, so a tiny model can be "the public base" only by being it
    (``make_tiny_base_model`` with seed 0 writes these same weights wherever it is called)."""
    from dphub import encoders

    tiny = make_tiny_base_model(tmp_path_factory.mktemp("embedded") / "model")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(encoders, "embedded_model_dir", lambda: tiny)
        yield tiny


@pytest.fixture(scope="module")
def public_base(tmp_path_factory: pytest.TempPathFactory, tiny_embedded: Path) -> Path:
    """A tiny public base model written by ``pretrain`` on a copy of the (tiny) embedded encoder,
    so the gate can check tokenizer and weights against the declared base."""
    root = tmp_path_factory.mktemp("pretrain")
    encoder = make_tiny_base_model(root / "enc" / "my-copy")
    opts = T.TrainOptions(base_model=str(encoder), max_length=64, stride=16)
    out = root / "public-base"
    pretrain(out, PretrainConfig(notes=24, epochs=1.0), options=opts)
    return out


# ------------------------------------------------------------------------------ generator


@pytest.mark.parametrize("kind", synth.REALISTIC_KINDS)
def test_realistic_kinds_are_deterministic_and_spans_exact(kind: str) -> None:
    a = synth.generate(40, kind=kind, seed=5)
    b = list(synth.iter_notes(40, kind=kind, seed=5))
    assert [(n.id, n.text, n.spans) for n in a] == [(n.id, n.text, n.spans) for n in b]
    assert [n.text for n in synth.generate(40, kind=kind, seed=6)] != [n.text for n in a]
    for n in a:
        assert check_spans(n.spans, len(n.text), where=n.id) == n.spans
        for s in n.spans:
            piece = n.text[s.start:s.end]
            assert piece and piece == piece.strip()


def test_realistic_notes_have_low_phi_density_and_hipaa_ages() -> None:
    notes = synth.generate(400, kind="realistic-nursing", seed=1)
    labels = {s.label for n in notes for s in n.spans}
    assert {"DOCTOR", "RELATIVE", "DATE", "HOSPITAL", "PHONE", "AGE"} <= labels
    chars = sum(len(n.text) for n in notes)
    phi = sum(s.end - s.start for n in notes for s in n.spans)
    assert phi / chars < 0.05  # real notes: about half a percent; the old kinds: over 10 %
    assert sum(1 for n in notes if not n.spans) > 40  # many notes carry no PHI at all
    for n in notes:
        for s in n.spans:
            if s.label == "AGE":  # HIPAA Safe Harbor: only ages over 89 are PHI
                assert int(n.text[s.start:s.end]) >= 89
    text = " ".join(n.text for n in notes)
    phi_text = {n.text[s.start:s.end] for n in notes for s in n.spans}
    for lookalike in ("Foley", "Lasix", "Trendelenburg"):  # capitalised, clinical, never PHI
        assert re.search(lookalike, text, re.I) and lookalike not in phi_text
    assert any(n.text.isupper() for n in notes) and any(not n.text.isupper() for n in notes)


def test_realistic_discharge_has_sections_and_dates() -> None:
    notes = synth.generate(30, kind="realistic-discharge", seed=2)
    assert all("discharge medications:" in n.text.lower() for n in notes)
    assert {"DATE", "DOCTOR"} <= {s.label for n in notes for s in n.spans}


# ------------------------------------------------------------------------------ pretrain


def test_pretrain_card_says_public_only_and_validates(public_base: Path) -> None:
    card = validate_card(public_base)  # schema + the files next to it, as the gate checks them
    dp = card.dp
    assert is_public_model(dp) and dp["epsilon"] == 0 and dp["private"] is False
    assert dp["public_pretraining"]["kinds"] == ["realistic-nursing", "realistic-discharge"]
    assert card.dataset["name"] == "dphub-synth"
    assert "public data only" in card.body and "PUBLIC DATA ONLY" in card.body
    assert "NOT PRIVATE" not in card.body
    cfg = json.loads((public_base / "training_config.json").read_text())
    assert cfg["no_dp"] is True
    # the default recipe's rule-feature head stage ran too: DP fine-tuning starts from a trained
    # rule projection, not from zero
    assert cfg["dphub_training"]["rule_features"] is True
    model_cfg = json.loads((public_base / "config.json").read_text())
    assert model_cfg["dphub"]["rule_features"]["rules_digest"]
    from safetensors import safe_open

    with safe_open(str(public_base / "model.safetensors"), "pt") as f:
        assert float(f.get_tensor("rule_proj.weight").abs().sum()) > 0


def test_gate_and_pull_accept_a_public_base(public_base: Path, tmp_path: Path) -> None:
    from dphub.hub.ops import publish, pull

    summary = check_publishable(public_base)
    assert summary.public and summary.epsilon == 0
    hub = tmp_path / "hub"
    hub.mkdir()  # default policy: epsilon <= 10 per patient; a public base has no private data
    publish(public_base, "acme/public-base", hub=str(hub))
    entry = pull("acme/public-base", hub=str(hub))
    assert entry.epsilon == 0
    # `dphub train --base-model acme/public-base` starts from the pulled public base
    from dphub.train.sources import initial_model

    src = initial_model(T.TrainOptions(base_model="acme/public-base", max_length=64, stride=16),
                        None)
    assert src.public_pretraining["model"] == "acme/public-base"
    assert src.base_public_id == DEFAULT_BASE_MODEL_ID and src.lineage == []


def test_cli_train_pulls_the_public_base_from_the_hub_on_first_use(
    public_base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dphub.hub.ops import publish

    monkeypatch.chdir(tmp_path)  # `dphub train` records its last model in ./.dphub
    from dphub.hub.bases import pull_base_model
    from dphub.registry import Registry

    hub = tmp_path / "hub"
    hub.mkdir()
    publish(public_base, "acme/shared-base", hub=str(hub))
    # names the hub does not hold resolve as before (encoder ids, the embedded default)
    assert pull_base_model("acme/not-there", hub=str(hub)) is None
    assert pull_base_model("sentence-transformers/all-MiniLM-L6-v2", hub=str(hub)) is None
    assert pull_base_model(str(public_base), hub=str(hub)) is None
    data = tmp_path / "train.jsonl"
    formats.write(synth.generate(8, kind="nursing", seed=4, patients=4), data, "jsonl")
    assert main(["train", str(data), "--out", str(tmp_path / "m"), "--base-model",
                 "acme/shared-base", "--hub", str(hub), "--epochs", "1", "--batch-size", "2",
                 "--max-physical-batch", "2", "--noise", "1.0", "--accountant", "rdp",
                 "--threads", "1"]) == 0
    assert "pulled the public base acme/shared-base" in capsys.readouterr().err
    assert Registry().get("acme/shared-base").epsilon == 0
    dp = load_card(tmp_path / "m").dp
    assert dp["public_pretraining"]["model"] == "acme/shared-base" and dp["private"] is True
    # a DP model on the hub is not a base: refused with the pointer to --init-from, one line
    publish(tmp_path / "m", "acme/site-model", hub=str(hub))
    code = main(["train", str(data), "--out", str(tmp_path / "m2"), "--base-model",
                 "acme/site-model", "--hub", str(hub), "--epochs", "1", "--noise", "1.0"])
    err = capsys.readouterr().err
    assert code != 0 and "--init-from" in err and "Traceback" not in err
    assert not (tmp_path / "m2").exists()


def test_gate_refuses_a_public_claim_with_epsilon(public_base: Path, tmp_path: Path) -> None:
    from dphub.card import write_card
    from dphub.errors import CardError, PublishRefused

    bad = shutil.copytree(public_base, tmp_path / "bad")
    meta = load_card(bad).meta
    meta["differential_privacy"]["epsilon"] = 3.0
    with pytest.raises(CardError):  # the schema ties public-synthetic to epsilon 0
        write_card(bad, meta)
    meta["differential_privacy"]["epsilon"] = 0
    meta["dataset"]["name"] = "my-hospital"
    write_card(bad, meta)
    with pytest.raises(PublishRefused, match="dphub-synth"):
        check_publishable(bad)


def test_dp_training_starts_from_the_public_base(public_base: Path, tmp_path: Path) -> None:
    from dphub.tagger import TaggerModel

    data = tmp_path / "train.jsonl"
    formats.write(synth.generate(12, kind="nursing", seed=3, patients=4), data, "jsonl")
    out = tmp_path / "dp"
    opts = T.TrainOptions(data=data, out=out, base_model=str(public_base), epochs=1.0,
                          batch_size=2, max_physical_batch=2, noise=1.0, accountant="rdp",
                          max_length=64, stride=16, lr=5e-4)
    # two noisy steps at lr 5e-3 left the probe recall anywhere in 1-49 % (the gate's floor is
    # 2 %); at 5e-4 the model stays near its public base's (5.4-5.9 % in six runs)
    T.train(opts)
    meta = load_card(out).meta
    dp = meta["differential_privacy"]
    assert dp["private"] is True and dp["epsilon"] > 0
    assert dp["public_pretraining"]["model"] == "public-base"
    assert dp["public_pretraining"]["epsilon_cost"] == 0
    assert meta["base_model"] == DEFAULT_BASE_MODEL_ID  # the encoder, identified by weights
    check_publishable(out)
    # the encoder started from the public base's weights, not from the raw encoder
    start = TaggerModel.load(public_base).export_state_dict()
    name = "bert.embeddings.word_embeddings.weight"
    assert torch.equal(TaggerModel.load(out).export_state_dict()[name], start[name])


def test_base_model_refuses_a_private_model_directory(public_base: Path, tmp_path: Path) -> None:
    fake = shutil.copytree(public_base, tmp_path / "site-model")
    (fake / "README.md").write_text("---\nnot: a public card\n---\n", encoding="utf-8")
    opts = T.TrainOptions(data=tmp_path / "x.jsonl", out=tmp_path / "o", base_model=str(fake))
    from dphub.train.sources import initial_model

    with pytest.raises(ConfigError, match="--init-from"):
        initial_model(opts, None)


def test_pretrain_and_train_refuse_a_private_model_as_their_base(public_base: Path,
                                                                 tmp_path: Path) -> None:
    """A model that learned from patients must not become a "public data only" base, nor a plain
    encoder under a new ε: with or without its card, a dphub model directory is refused."""
    from dphub.train.sources import initial_model

    site = shutil.copytree(public_base, tmp_path / "site-model")
    (site / "README.md").write_text("---\nnot: a public card\n---\n", encoding="utf-8")
    carded = T.TrainOptions(base_model=str(site), max_length=64, stride=16)
    with pytest.raises(ConfigError, match="--init-from"):
        pretrain(tmp_path / "pb", PretrainConfig(notes=4, epochs=1.0), options=carded)
    assert not (tmp_path / "pb").exists()
    (site / "README.md").unlink()  # the card removed: its config.json still says dphub
    (site / "training_config.json").unlink()
    bare = T.TrainOptions(data=tmp_path / "x.jsonl", out=tmp_path / "o", base_model=str(site))
    with pytest.raises(ConfigError, match="not a public base"):
        initial_model(bare, None)
    with pytest.raises(ConfigError, match="not a public base"):
        pretrain(tmp_path / "pb", PretrainConfig(notes=4, epochs=1.0), options=carded)


def test_train_layers_values() -> None:
    assert parse_train_layers("all") is None and parse_train_layers("2") == 2
    with pytest.raises(ConfigError):
        parse_train_layers("top")
    with pytest.raises(ConfigError):
        PretrainConfig.from_options(notes=0)


def test_cli_pretrain_writes_a_public_model_and_errors_are_one_line(
    tmp_path: Path, public_base: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    encoder = make_tiny_base_model(tmp_path / "enc" / "all-MiniLM-L6-v2")
    assert main(["pretrain", "--out", "pb", "--notes", "10", "--epochs", "1",
                 "--base-model", str(encoder), "--threads", "1"]) == 0
    out = capsys.readouterr()
    assert "public synthetic data only" in out.out
    assert is_public_model(load_card(tmp_path / "pb").dp)
    # the notes it trained on are public, but progress and errors never print note text anyway
    notes = synth.generate(10, kind="realistic-nursing", seed=0)
    for n in notes:
        for s in n.spans:
            if len(n.span_text(s)) >= 5:
                assert n.span_text(s) not in out.err
    for args, needle in (
        (["--notes", "5", "--train-layers", "top"], "--train-layers"),
        (["--notes", "5", "--epochs", "0"], "--epochs"),
        (["--notes", "5", "--label-schema", "nope"], "label schema"),
        (["--notes", "5"], "not empty"),  # pb exists
    ):
        code = main(["pretrain", "--out", "pb", "--base-model", str(encoder), *args])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.startswith("error:") and needle in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1


def test_a_shallower_public_base(tmp_path: Path) -> None:
    """`pretrain --encoder-layers N`: the public base keeps its encoder's first N blocks, says so
    in its card, and DP training from it keeps that depth (and refuses to change it)."""
    from dphub.errors import ConfigError
    from dphub.tagger import TaggerModel
    from dphub.tagger_model import _encoder_layers

    encoder = make_tiny_base_model(tmp_path / "enc" / "all-MiniLM-L6-v2")
    opts = T.TrainOptions(base_model=str(encoder), max_length=64, stride=16)
    out = tmp_path / "shallow-base"
    pretrain(out, PretrainConfig(notes=6, epochs=1.0, encoder_layers=1), options=opts)
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1
    assert load_card(out).dp["public_pretraining"]["encoder_layers"] == 1
    data = tmp_path / "train.jsonl"
    formats.write(synth.generate(6, kind="nursing", seed=3, patients=3), data, "jsonl")
    base = dict(data=data, base_model=str(out), epochs=1.0, batch_size=2, noise=1.0,
                accountant="rdp", max_length=64, stride=16)
    T.train(T.TrainOptions(out=tmp_path / "dp", **base))
    assert len(_encoder_layers(TaggerModel.load(tmp_path / "dp").encoder)) == 1
    with pytest.raises(ConfigError, match="encoder depth is fixed"):
        T.train(T.TrainOptions(out=tmp_path / "dp2", encoder_layers=1, **base))
    with pytest.raises(ConfigError, match="--encoder-layers must be >= 1"):
        PretrainConfig.from_options(encoder_layers=0)
