"""Rule features: the rule member's flags as tagger inputs (features, model directory, inference,
training, hub gate). Tiny random BERT, synthetic notes only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dphub import align, formats, synth
from dphub import rule_features as rf
from dphub.errors import ConfigError, ModelError
from dphub.notes import Note
from dphub.tagger import Tagger, TaggerModel
from dphub.tagger_model import BASIC_FORMAT_VERSION, FORMAT_VERSION


@pytest.fixture(scope="module")
def rf_dir(tiny_base_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CRF tagger with rule features and non-zero rule_proj, saved."""
    torch.manual_seed(0)
    model = TaggerModel.from_base(tiny_base_model, rule_features=True)
    with torch.no_grad():
        model.rule_proj.weight.normal_(0.0, 1.0)
    out = tmp_path_factory.mktemp("rf") / "rf-tagger"
    model.save(out)
    return out


def _tokens(text: str):
    from transformers import AutoTokenizer

    from dphub.encoders import embedded_model_dir

    tok = AutoTokenizer.from_pretrained(embedded_model_dir())
    return align.tokenize(tok, [text])[0]


def test_pieces_of_a_rule_span_get_its_category_score_and_boundaries():
    text = "Seen on 03/04/2091 by nurse. Call 617-555-0199 tomorrow."
    nt = _tokens(text)
    feats = rf.note_features(text, nt.offsets)
    assert feats.shape == (len(nt), rf.NUM_FEATURES) and feats.dtype == np.float32
    names = list(rf.FEATURE_NAMES)
    spans = {s.start: s for s in rf.shared_rule_member().spans(text)}
    date = spans[text.index("03/04")]
    inside = [i for i, (a, b) in enumerate(nt.offsets) if a < date.end and b > date.start]
    assert len(inside) > 1  # the date is several word pieces
    assert (feats[inside, names.index("rule_date")] == 1).all()
    assert feats[inside[0], names.index("rule_first")] == 1
    assert feats[inside[-1], names.index("rule_last")] == 1
    assert feats[inside[1:], names.index("rule_first")].sum() == 0
    assert feats[inside, names.index("rule_score")].min() > 0
    outside = [i for i, (a, _) in enumerate(nt.offsets) if text[a:].startswith("nurse")]
    assert feats[outside].sum() == 0
    # a deterministic function of the text
    assert np.array_equal(feats, rf.note_features(text, nt.offsets))


def test_model_directory_records_rules_and_stays_transformers_compatible(rf_dir: Path):
    from safetensors import safe_open
    from transformers import AutoModelForTokenClassification

    cfg = json.loads((rf_dir / "config.json").read_text())
    block = cfg["dphub"]["rule_features"]
    assert block == rf.feature_spec() and block["rules_digest"] == rf.rules_digest()
    assert cfg["dphub"]["format_version"] == FORMAT_VERSION > BASIC_FORMAT_VERSION
    with safe_open(str(rf_dir / "model.safetensors"), "pt") as fh:
        keys = set(fh.keys())
    assert {"rule_proj.weight", "rule_proj.bias"} <= keys
    # a stock transformers model ignores the extra tensors
    hf = AutoModelForTokenClassification.from_pretrained(rf_dir)
    assert hf.config.num_labels == len(cfg["id2label"])
    # and the gate's layout check expects exactly these tensors
    from dphub.hub.gate_common import config_problems
    from dphub.hub.gate_tensors import expected_tensors

    want = expected_tensors(rf_dir)
    assert want["rule_proj.weight"] == ("F32", (len(cfg["id2label"]), rf.NUM_FEATURES))
    assert config_problems(cfg) == []
    bad = json.loads(json.dumps(cfg))
    bad["dphub"]["rule_features"]["options"] = {"deny": ["some words"]}
    assert config_problems(bad)


def test_models_without_rule_features_keep_format_1(tiny_tagger_dir: Path):
    cfg = json.loads((tiny_tagger_dir / "config.json").read_text())
    assert cfg["dphub"]["format_version"] == BASIC_FORMAT_VERSION
    assert "rule_features" not in cfg["dphub"]


def test_inference_uses_the_features_and_the_shared_encoder_path(rf_dir: Path):
    tagger = Tagger.load(rf_dir)
    notes = synth.generate(3, kind="nursing", seed=4)
    direct = tagger.token_scores(notes)
    encoded = tagger.encode(notes)
    assert encoded.rule_features  # computed once, for every member on these rules
    shared = tagger.token_scores(notes, encoded=encoded)
    for a, b in zip(direct, shared, strict=True):
        assert np.allclose(a.phi_prob, b.phi_prob, atol=1e-6) and a.decoded == b.decoded
    # the features matter: zeroing the rule projection changes the scores
    with torch.no_grad():
        tagger.model.rule_proj.weight.zero_()
    plain = tagger.token_scores(notes)
    assert not all(np.allclose(a.phi_prob, b.phi_prob) for a, b in zip(direct, plain, strict=True))
    # an empty note still works
    assert len(tagger.token_scores([Note(id="e", text="")])[0].decoded) == 0


def test_features_and_the_rule_member_scan_each_note_once(rf_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    from dphub.ensemble.core import Ensemble, Slot, member_from_entry
    from dphub.ensemble.manifest import MemberEntry
    from dphub.ensemble.members import ModelMember
    from dphub.rules.engine import RuleMember

    shared = rf.shared_rule_member()
    rules = member_from_entry(MemberEntry("rules:default", "rules"))
    assert rules.member is shared
    # other options or another name: a member of its own, never the features' instance
    assert member_from_entry(MemberEntry("rules:default", "rules",
                                         options={"times": True})).member is not shared
    assert member_from_entry(MemberEntry("mine", "rules")).member is not shared
    notes = synth.generate(4, kind="nursing", seed=11)
    # the same ensemble with a rule member of its own (no memo, scans twice): the reference
    expected = Ensemble([Slot(ModelMember.load(rf_dir)), Slot(RuleMember())], "any").deid(notes)
    scans: list[str] = []
    plain_spans = RuleMember.spans

    def counting(self: RuleMember, text: str):  # noqa: ANN202
        scans.append(text)
        return plain_spans(self, text)

    monkeypatch.setattr(RuleMember, "spans", counting)
    shared._memo.clear()
    ens = Ensemble([Slot(ModelMember.load(rf_dir)), rules], "any")
    results = ens.deid(notes)
    assert sorted(scans) == sorted(n.text for n in notes)  # once per note, not twice
    for got, want in zip(results, expected, strict=True):  # the memo changes nothing
        assert got.by_member == want.by_member and got.merged == want.merged
    # bounded: the oldest texts are dropped
    for i in range(rf.SCAN_MEMO_NOTES + 5):
        shared.spans(f"note {i}")
    assert len(shared._memo) == rf.SCAN_MEMO_NOTES


def test_different_rules_are_refused_clearly(rf_dir: Path, tmp_path: Path):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(rf_dir, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["dphub"]["rule_features"]["rules_digest"] = "0" * 16
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="rule features from rules"):
        Tagger.load(other)


def test_dp_training_with_rule_features_end_to_end(tiny_base_model: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch):
    from dphub import train as T
    from dphub.hub import gate

    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))
    notes = synth.generate(12, kind="nursing", seed=3, patients=4)
    data = tmp_path / "train.jsonl"
    formats.write(notes, data, "jsonl")
    out = tmp_path / "model"
    opts = T.TrainOptions(
        data=data, out=out, base_model=str(tiny_base_model), warm_start="none", epochs=2.0,
        batch_size=2, max_physical_batch=2, noise=1.0, accountant="rdp", max_length=64,
        stride=16, rule_features=True,
    )
    start = TaggerModel.from_base(tiny_base_model, rule_features=True).rule_proj.weight.clone()
    res = T.train(opts)
    assert res.steps > 0
    tagger = Tagger.load(out)
    assert tagger.model.rule_features is not None
    assert not torch.equal(tagger.model.rule_proj.weight, start)  # DP trained it
    cfg = json.loads((out / "training_config.json").read_text())
    assert cfg["dphub_training"]["rule_features"] is True
    from dphub.card import load_card

    assert gate.model_dir_problems(out, load_card(out).meta) == []  # the gate accepts its layout
    assert len(tagger.tag(synth.generate(2, kind="nursing", seed=9))) == 2


def test_rule_warm_start_is_a_head_stage_on_the_plain_warm_start(tiny_base_model: Path,
                                                                  tmp_path: Path):
    from dataclasses import replace

    from dphub.train import warmstart

    cfg = warmstart.WarmStartConfig(notes=(("nursing", 3),), epochs=1.0, batch_size=4,
                                    max_length=64, stride=16, rule_features=True, rule_epochs=1.0)
    plain_cfg = replace(cfg, rule_features=False)
    key = warmstart.cache_key(tiny_base_model, "tiny", "hipaa", "crf", cfg, 0)
    plain_key = warmstart.cache_key(tiny_base_model, "tiny", "hipaa", "crf", plain_cfg, 0)
    # the rule stage's own settings never change a plain warm start's key (caches stay valid)
    assert plain_key == warmstart.cache_key(tiny_base_model, "tiny", "hipaa", "crf",
                                            replace(plain_cfg, rule_lr=1.0), 0)
    assert key != plain_key
    wdir = warmstart.warm_start(tiny_base_model, "tiny", "hipaa", "crf", cfg,
                                cache_dir=tmp_path)
    assert wdir.name == key and (tmp_path / "warmstart" / plain_key / "model.safetensors").is_file()
    rule_model = TaggerModel.load(wdir)
    plain = TaggerModel.load(tmp_path / "warmstart" / plain_key)
    assert rule_model.rule_features is not None and plain.rule_features is None
    assert float(rule_model.rule_proj.weight.detach().abs().sum()) > 0  # the stage trained it
    # the encoder is the plain warm start's, untouched
    for (n, a), (_, b) in zip(rule_model.encoder.state_dict().items(),
                              plain.encoder.state_dict().items(), strict=True):
        assert torch.equal(a, b), n


def test_train_and_audit_share_the_rule_features_flag():
    import typer.main

    from dphub.cli import train as cli_train
    from dphub.cli.main import app

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name in ("train", "audit"):
        params = {p.name: p for p in commands[name].params}
        assert "rule_features" in params, name
        assert "--rule-features" in params["rule_features"].opts
        assert "--no-rule-features" in params["rule_features"].secondary_opts
    assert cli_train.CONFIG_KEYS["rule_features"] == ("train", "rule_features")
    assert "rule_features" in cli_train.INIT_TEMPLATE


def test_rule_projection_steps_at_its_own_learning_rate(tiny_base_model: Path):
    from dphub.train import TrainOptions
    from dphub.train.loop import param_groups, trainable_parameters

    model = TaggerModel.from_base(tiny_base_model, rule_features=True)
    model.set_trainable(train_layers=0)
    params = trainable_parameters(model)
    groups = param_groups(model, params, TrainOptions(lr=2e-3, rule_lr_scale=10.0))
    assert [g["lr"] for g in groups] == [2e-3, pytest.approx(2e-2)]
    rule = {id(p) for p in model.rule_proj.parameters()}
    assert {id(p) for p in groups[1]["params"]} == rule
    assert {id(p) for g in groups for p in g["params"]} == {id(p) for p in params}  # all, once
    assert sum(len(g["params"]) for g in groups) == len(params)
    plain = TaggerModel.from_base(tiny_base_model)
    plain.set_trainable(train_layers=0)
    assert len(param_groups(plain, trainable_parameters(plain), TrainOptions())) == 1
    with pytest.raises(ConfigError, match="rule-lr-scale"):
        TrainOptions(data=Path("x.jsonl"), out=Path("o"), rule_lr_scale=0).validate()
    # one Adam step moves the rule projection `scale` times as far as the head (same gradient)
    torch.manual_seed(0)
    opt = torch.optim.Adam(groups, lr=2e-3)
    for p in params:
        p.grad = torch.ones_like(p)
    before = {id(p): p.detach().clone() for p in params}
    opt.step()
    head = model.classifier.weight
    w = model.rule_proj.weight
    assert float((w - before[id(w)]).abs().max()) == pytest.approx(
        10 * float((head - before[id(head)]).abs().max()), rel=1e-4)


@pytest.mark.parametrize("module", ["engine.py", "lexicon.py", "patterns.py"])
def test_rules_digest_covers_every_module_of_the_rule_member(module: str,
                                                             monkeypatch: pytest.MonkeyPatch):
    """Issue 30 cut ``rules.py`` into the member, its lexicon and its patterns: an edit to any of
    the three must change the digest rule-feature models pin, or a model would silently get
    features it was not trained on."""
    from pathlib import Path as _P

    import dphub.rules as rules_pkg

    on_disk = sorted(p.name for p in _P(rules_pkg.__file__).parent.glob("*.py")
                     if p.name != "__init__.py")
    assert sorted(rf.RULE_SOURCES) == on_disk
    real_files = rf.resources.files
    before = rf.rules_digest.__wrapped__()

    class _Edited:
        def __init__(self, inner):
            self._inner = inner

        def read_bytes(self) -> bytes:
            return self._inner.read_bytes() + b"\n# an edited pattern\n"

    class _Package:
        def __init__(self, inner):
            self._inner = inner

        def joinpath(self, *names: str):
            child = self._inner.joinpath(*names)
            return _Edited(child) if names == (module,) else child

    monkeypatch.setattr(rf.resources, "files", lambda pkg: _Package(real_files(pkg))
                        if pkg == "dphub.rules" else real_files(pkg))
    assert rf.rules_digest.__wrapped__() != before


def test_an_equivalent_rules_digest_loads_only_while_its_target_is_current(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A model trained before a code move (same outputs, other source bytes) still loads; the
    first real change to the rules (another current digest) refuses it again."""
    from dphub import rule_features as rf
    from dphub.errors import ModelError

    spec = {**rf.feature_spec(), "rules_digest": "0123456789abcdef"}
    with pytest.raises(ModelError, match="retrain"):
        rf.check_spec(spec, "m")
    monkeypatch.setitem(rf.RULES_DIGEST_EQUIVALENT, "0123456789abcdef", rf.rules_digest())
    assert rf.check_spec(spec, "m") == rf.NUM_FEATURES
    monkeypatch.setitem(rf.RULES_DIGEST_EQUIVALENT, "0123456789abcdef", "fedcba9876543210")
    with pytest.raises(ModelError, match="retrain"):
        rf.check_spec(spec, "m")


def test_the_rule_engine_loads_without_the_ensemble_or_the_tagger() -> None:
    """Issue 39: the rule engine lives in the model layer (``dphub/rules/``), so the rule
    features import it at the top; importing it must not pull in the ensemble, the tagger or
    torch (it once lived in ``dphub.ensemble``, whose package imports the tagger)."""
    import subprocess
    import sys

    code = ("import sys, dphub.rule_features, dphub.rules.engine; "
            "print(sorted(m for m in sys.modules if m.startswith(('dphub.ensemble', "
            "'dphub.tagger', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


@pytest.mark.parametrize("before", ["e7f686474bba5dfb", "7fab9046c3bbf6cd", "9657da16426dbbba"])
def test_a_model_pinned_before_the_age_and_year_fix_is_refused(before: str) -> None:
    """Issue 38 changed the rules' spans ("45.5 yo" is one age, "in 2150" a date), so a model
    trained before gets other rule features for such notes than it was trained on: the three
    digests of before (0.1.0's member, the cut of issue 30, the move of issue 39), which loaded
    as equivalent, are refused with the retrain message."""
    assert rf.rules_digest() != before
    spec = {**rf.feature_spec(), "rules_digest": before}
    with pytest.raises(rf.ModelError, match="retrain the model"):
        rf.check_spec(spec, "m")
