"""Where a published model's encoder comes from, checked by weights and records, not by names.

Issue 31, items 2 and 3: a directory named like the embedded public encoder is not that encoder
(its weights are compared, by digest and tensor by tensor), and a card claiming "public synthetic
notes only" must come with a pretraining record whose data the gate regenerates. Tiny models and
synthetic notes only; the tiny encoder stands in for the embedded package's model where a test
needs a base the gate can resolve.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_base_model

from dphub import formats, synth
from dphub import train as T
from dphub.card import SYNTH_DATASET, card_meta, dataset_block, load_card, public_block, write_card
from dphub.encoders import (
    DEFAULT_BASE_MODEL_ID,
    LOCAL_ENCODER_ID,
    encoder_digest,
    resolve_base_model,
)
from dphub.errors import PublishRefused
from dphub.hub.gate import check_publishable
from dphub.io import file_sha256


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "home"))


@pytest.fixture
def tiny_embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny encoder installed as "the embedded package's model" for one test."""
    from dphub import encoders

    tiny = make_tiny_base_model(tmp_path / "site-packages" / "model")
    monkeypatch.setattr(encoders, "embedded_model_dir", lambda: tiny)
    return tiny


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "train.jsonl"
    if not data.exists():
        formats.write(synth.generate(6, kind="nursing", seed=3, patients=3), data, "jsonl")
    return data


def _train(tmp_path: Path, out: str, base: str | None, **kw) -> Path:
    o = dict(data=_data(tmp_path), out=tmp_path / out, base_model=base, warm_start="none",
             epochs=1.0, batch_size=2, max_physical_batch=2, noise=1.0, accountant="rdp",
             max_length=64, stride=16, checkpoint_every=50, rule_features=False)
    o.update(kw)
    T.train(T.TrainOptions(**o))
    return tmp_path / out


def _as_plain_encoder(model_dir: Path, dest: Path) -> Path:
    """The issue's repro: a dphub model turned into a "plain encoder" directory (README.md and
    training_config.json dropped, the ``dphub`` block removed from config.json)."""
    shutil.copytree(model_dir, dest)
    (dest / "README.md").unlink()
    (dest / "training_config.json").unlink()
    cfg = json.loads((dest / "config.json").read_text())
    cfg.pop("dphub")
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def _rewrite(model_dir: Path, *, card: dict | None = None, config: dict | None = None) -> None:
    """Edit card front matter and/or training_config.json (the card re-bound to the weights)."""
    if config is not None:
        path = model_dir / "training_config.json"
        cfg = json.loads(path.read_text())
        for k, v in config.items():
            if isinstance(v, dict):
                cfg[k].update(v)
            else:
                cfg[k] = v
        path.write_text(json.dumps(cfg))
    meta = load_card(model_dir).meta
    meta["differential_privacy"]["weights_sha256"] = file_sha256(model_dir / "model.safetensors")
    for k, v in (card or {}).items():
        if isinstance(v, dict):
            meta[k].update(v)
        else:
            meta[k] = v
    write_card(model_dir, meta)


# ------------------------------------------------------------------ item 2: the base by weights


def test_a_directory_named_like_the_embedded_base_is_not_it(tmp_path: Path) -> None:
    other = make_tiny_base_model(tmp_path / "all-MiniLM-L6-v2", seed=1)
    _, public_id = resolve_base_model(str(other))
    assert public_id == LOCAL_ENCODER_ID  # not "all-MiniLM-L6-v2", which the gate once aliased


def test_a_copy_of_the_embedded_base_is_recognised_by_its_weights(tiny_embedded: Path,
                                                                   tmp_path: Path) -> None:
    copy = shutil.copytree(tiny_embedded, tmp_path / "some-name")
    assert resolve_base_model(str(copy))[1] == DEFAULT_BASE_MODEL_ID
    assert resolve_base_model(str(tiny_embedded))[1] == DEFAULT_BASE_MODEL_ID
    assert encoder_digest(copy) == encoder_digest(tiny_embedded)
    # the digest names the encoder tensors, whether stored bare or inside a tagger
    from dphub.tagger import TaggerModel

    TaggerModel.from_base(copy, schema="hipaa", head="crf").save(tmp_path / "tagger")
    assert encoder_digest(tmp_path / "tagger") == encoder_digest(copy)
    assert encoder_digest(make_tiny_base_model(tmp_path / "x", seed=1)) != encoder_digest(copy)


def test_spoofed_public_base_is_refused(tiny_embedded: Path, tmp_path: Path) -> None:
    """The issue's repro: a non-DP fine-tuned encoder saved as ``all-MiniLM-L6-v2/`` and used as
    the base of a DP run; the published model would have carried its weights as "public"."""
    baseline = _train(tmp_path, "nodp", None, no_dp=True, noise=None, train_layers=1)
    spoof = _as_plain_encoder(baseline, tmp_path / "spoof" / "all-MiniLM-L6-v2")
    dp = _train(tmp_path, "dp", str(spoof))
    cfg = json.loads((dp / "training_config.json").read_text())
    assert cfg["base_model_sha256"] == encoder_digest(spoof) != encoder_digest(tiny_embedded)
    assert load_card(dp).meta["base_model"] == LOCAL_ENCODER_ID
    with pytest.raises(PublishRefused, match="cannot resolve the card's base_model"):
        check_publishable(dp)
    # the card's name put back to the public id: the recorded digest says otherwise
    _rewrite(dp, card={"base_model": DEFAULT_BASE_MODEL_ID},
             config={"base_model": DEFAULT_BASE_MODEL_ID})
    with pytest.raises(PublishRefused, match="base_model_sha256 differs from the declared"):
        check_publishable(dp)
    # and the digest forged too: the encoder tensors training kept frozen are not the base's
    _rewrite(dp, config={"base_model_sha256": encoder_digest(tiny_embedded)})
    with pytest.raises(PublishRefused, match="was frozen in training but differs"):
        check_publishable(dp)


def test_card_validate_checks_the_encoder_against_the_declared_base(
    tiny_embedded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """`dphub card validate` runs publish's base checks: a spoofed base fails it as it fails
    the gate, and a base this machine lacks is reported as not checked (never silently)."""
    from dphub.cli.main import main

    good = _train(tmp_path, "good", None)
    assert main(["card", "validate", str(good)]) == 0
    cap = capsys.readouterr()
    assert "checked schema + accounting + model files + base encoder)" in cap.out
    assert cap.err == ""

    baseline = _train(tmp_path, "nodp", None, no_dp=True, noise=None, train_layers=1)
    spoof = _as_plain_encoder(baseline, tmp_path / "spoof" / "all-MiniLM-L6-v2")
    dp = _train(tmp_path, "dp", str(spoof))
    # its card names a local encoder, which no machine can resolve: valid, but not all checked
    assert main(["card", "validate", str(dp)]) == 0
    cap = capsys.readouterr()
    assert "checked schema + accounting + model files)" in cap.out
    assert cap.err.startswith(f"warning: not checked: cannot resolve the card's base_model "
                              f"{LOCAL_ENCODER_ID} to check the encoder against it")
    assert "`dphub publish` refuses the model until it can be checked" in cap.err
    assert cap.err.count("\n") == 1
    # named as the public base: the recorded digest says otherwise
    _rewrite(dp, card={"base_model": DEFAULT_BASE_MODEL_ID},
             config={"base_model": DEFAULT_BASE_MODEL_ID})
    assert main(["card", "validate", str(dp)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "base_model_sha256 differs from the declared" in err
    # the digest forged too: the frozen encoder tensors are not the base's
    _rewrite(dp, config={"base_model_sha256": encoder_digest(tiny_embedded)})
    assert main(["card", "validate", str(dp)]) == 2
    assert "was frozen in training but differs" in capsys.readouterr().err


def test_model_from_the_declared_base_passes_and_tampered_frozen_tensors_do_not(
    tiny_embedded: Path, tmp_path: Path,
) -> None:
    from safetensors.torch import load_file, save_file

    dp = _train(tmp_path, "dp", None)
    assert load_card(dp).meta["base_model"] == DEFAULT_BASE_MODEL_ID
    check_publishable(dp)
    state = load_file(str(dp / "model.safetensors"))
    state["bert.encoder.layer.0.output.dense.bias"] += 0.5  # a frozen block (train_layers 0)
    save_file(state, str(dp / "model.safetensors"), metadata={"format": "pt"})
    _rewrite(dp)
    with pytest.raises(PublishRefused, match=r"layer\.0\.output\.dense\.bias was frozen"):
        check_publishable(dp)


def test_a_model_without_the_base_digest_is_refused(tiny_embedded: Path, tmp_path: Path) -> None:
    dp = _train(tmp_path, "dp", None)
    cfg = json.loads((dp / "training_config.json").read_text())
    del cfg["base_model_sha256"]
    (dp / "training_config.json").write_text(json.dumps(cfg))
    with pytest.raises(PublishRefused, match="does not record the base encoder's weights"):
        check_publishable(dp)


def test_frozen_tensors_are_checked_against_the_cached_warm_start(tiny_embedded: Path,
                                                                  tmp_path: Path) -> None:
    """Default recipe: DP starts from the public warm start; when it is in this machine's cache,
    the frozen encoder must be the warm start's."""
    from dphub.io import cache_root
    from dphub.tagger import TaggerModel
    from dphub.train.warmstart import WARM_START_SEED, WarmStartConfig, cache_key

    dp = _train(tmp_path, "dp", None)
    # a --seed other than the warm start's: every seed shares the one public warm start
    _rewrite(dp, config={"dphub_training": {"warm_start": "synth", "seed": WARM_START_SEED + 7}})
    check_publishable(dp)  # no warm start cached here: the recorded digest is the evidence
    key = cache_key(tiny_embedded, DEFAULT_BASE_MODEL_ID, "hipaa", "crf",
                    WarmStartConfig(max_length=64, stride=16, rule_features=False),
                    WARM_START_SEED)
    cached = cache_root() / "warmstart" / key
    TaggerModel.from_base(make_tiny_base_model(tmp_path / "other", seed=2)).save(
        cached, tokenizer_source=tiny_embedded)
    with pytest.raises(PublishRefused, match="differs from the public warm start"):
        check_publishable(dp)
    shutil.rmtree(cached)
    TaggerModel.from_base(tiny_embedded).save(cached)  # the start this run really had
    check_publishable(dp)


# ------------------------------------------------------------------ item 3: public provenance


@pytest.fixture
def public_base(tiny_embedded: Path, tmp_path: Path) -> Path:
    from dphub.train.pretrain import PretrainConfig, pretrain

    opts = T.TrainOptions(base_model=None, max_length=64, stride=16, rule_features=False)
    out = tmp_path / "public-base"
    pretrain(out, PretrainConfig(notes=12, epochs=1.0), options=opts)
    return out


def _forge_public_card(local: Path) -> None:
    """Rewrite a local-only model's card as a public-synthetic base's, bound to its weights
    (what dphub's own card helpers allow)."""
    meta = load_card(local).meta
    notes = synth.generate(12, kind="realistic-nursing", seed=0)
    forged = card_meta(
        public_block(steps=meta["differential_privacy"]["steps"], epochs=1.0,
                     public_pretraining={"enabled": True, "data": SYNTH_DATASET,
                                         "kinds": ["realistic-nursing"], "notes": 12,
                                         "epochs": 1.0, "seed": 0, "epsilon_cost": 0},
                     weights_sha256=file_sha256(local / "model.safetensors")),
        dataset_block(notes, name=SYNTH_DATASET), base_model=meta["base_model"],
        extra_tags=("public-data-only", "synthetic-data"))
    write_card(local, forged)


def test_forged_public_card_on_a_local_only_model_is_refused(
        tiny_embedded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's repro: dphub's own card helpers turn a local-only model (no DP, the owner's
    notes) into a "public synthetic" base; its training record gives it away."""
    local = _train(tmp_path, "local", None, no_dp=True, noise=None, local_only=True)
    with pytest.raises(PublishRefused, match="LOCAL ONLY"):
        check_publishable(local)
    _forge_public_card(local)
    with pytest.raises(PublishRefused, match="a public-synthetic card needs the training record"):
        check_publishable(local)
    # and `dphub card validate` says so too, as publish and pull do
    from dphub.cli.main import main

    assert main(["card", "validate", str(local)]) == 2
    assert "a public-synthetic card needs the training record" in capsys.readouterr().err
    # a hub that does not run the gate could still serve it: pull checks the record too
    from dphub.hub.gate import GateViolation, check_shareable

    with pytest.raises(GateViolation, match="a public-synthetic card needs the training record"):
        check_shareable(local)


def test_forged_public_member_is_no_free_teacher_of_a_dp_student(
        tiny_embedded: Path, public_base: Path, tmp_path: Path) -> None:
    """A local-only model (no DP, these patients) with a card rewritten to "public synthetic,
    ε 0" would be left out of a DP student's composition, so the student's card would not count
    what it leaked: `distill --dp` checks the training record as the gate does. A genuine
    public base stays out of the composition (no patients)."""
    from dphub.ensemble.core import Ensemble, Slot
    from dphub.ensemble.members import ModelMember
    from dphub.errors import ConfigError
    from dphub.owner.distill import distill, local_options, teacher_lineage

    local = _train(tmp_path, "local", None, no_dp=True, noise=None, local_only=True)
    _forge_public_card(local)
    forged = Ensemble([Slot(ModelMember.load(local, "forged"), None, 0.0)])
    out = tmp_path / "student"
    opts = local_options(T.TrainOptions(out=out, base_model=None, warm_start="none"), dp=True)
    notes = synth.generate(4, kind="nursing", seed=1, patients=2)
    with pytest.raises(ConfigError, match="member 'forged' claims public synthetic training data"
                                          ".*a public-synthetic card needs the training record"):
        distill(forged, notes, opts)
    assert not out.exists()
    genuine = Ensemble([Slot(ModelMember.load(public_base, "base"), None, 0.0)])
    assert teacher_lineage(genuine, "patient") == []


def test_genuine_public_base_passes_and_its_record_is_checked(public_base: Path,
                                                              tmp_path: Path) -> None:
    from dphub.hub.gate import check_shareable

    check_publishable(public_base)
    check_shareable(public_base)
    from dphub.cli.main import main

    assert main(["card", "validate", str(public_base)]) == 0  # record regenerated, base checked
    hyper = json.loads((public_base / "training_config.json").read_text())["dphub_training"]
    assert {"synth_notes", "synth_seed", "synth_sha256"} <= set(hyper)

    def broken(name: str, **kw) -> Path:
        d = shutil.copytree(public_base, tmp_path / name)
        _rewrite(d, **kw)
        return d

    cases = [
        # other notes than the record says were generated
        (dict(config={"dphub_training": {"synth_seed": 7}}), "do not regenerate"),
        (dict(config={"dphub_training": {"synth_sha256": "0" * 64}}), "do not regenerate"),
        # the record without the data's parameters
        (dict(config={"dphub_training": {"synth_notes": None}}), "cannot be regenerated"),
        # a run on someone's notes: a privacy unit and a sampling rate
        (dict(config={"privacy_unit": "patient", "sample_rate": 0.5}), "does not record"),
        # card and record disagree
        (dict(card={"differential_privacy": {"public_pretraining": {
            **load_card(public_base).dp["public_pretraining"], "notes": 500}}}),
         "public_pretraining.notes"),
        # steps that the recorded epochs and batch size do not give on these notes
        (dict(config={"steps": 999}, card={"differential_privacy": {
            "steps": 999, "public_pretraining": {
                **load_card(public_base).dp["public_pretraining"], "steps": 999}}}),
         "is not what its epochs and batch_size give"),
    ]
    for i, (edit, needle) in enumerate(cases):
        with pytest.raises(PublishRefused, match=needle):
            check_publishable(broken(f"b{i}", **edit))
    # `card validate` regenerates the record as publish does
    assert main(["card", "validate", str(tmp_path / "b0")]) == 2
