"""The owner's own models: distillation of the ensemble (Scenario A+) and local Scenario B.

Tiny random BERT, a few synthetic notes and the rule member as the teacher (it needs no weights
and finds PHI in synthetic notes), one epoch: what is tested is the contract (labels, card,
gate, files, messages), not accuracy.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import stat
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dphub import formats, synth
from dphub.card import LOCAL_ONLY_STATEMENT, load_card
from dphub.cli.main import main
from dphub.ensemble.core import Ensemble, Slot
from dphub.errors import ConfigError, DphubError
from dphub.hub import gate
from dphub.hub.validate import validate_card
from dphub.notes import Note, Span
from dphub.owner.distill import (
    combine_labels,
    distill,
    local_options,
    pseudo_label,
    train_local,
)
from dphub.rules.engine import RuleMember, RuleOptions
from dphub.train import TrainOptions


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def notes() -> list[Note]:
    return synth.generate(8, kind="nursing", seed=5, patients=3)


def _rules() -> Ensemble:
    return Ensemble([Slot(RuleMember("rules:default", RuleOptions()), None, 0.0)])


def _opts(base: Path, out: Path, **kw) -> TrainOptions:
    o = dict(out=out, base_model=str(base), warm_start="none", epochs=1.0, max_length=64,
             stride=16, accountant="rdp", noise=1.0, checkpoint_every=50)
    o.update(kw)
    return TrainOptions(**o)


def _gold_strings(notes: list[Note]) -> list[str]:
    return [n.text[s.start:s.end] for n in notes for s in n.spans if s.end - s.start >= 4]


def _only_model_dir_beside(out: Path) -> None:
    """No temp directory (which held note text) is left beside the output: only the private run
    log (counts and losses) of dphub.train."""
    left = [p for p in out.parent.iterdir() if p.name.startswith(".")]
    assert [p.name for p in left] == [f".{out.name}.trainlog.json"]
    assert stat.S_IMODE(os.stat(left[0]).st_mode) == 0o600


def test_distilled_student_is_local_only_and_refused_by_the_gate(
        notes: list[Note], tiny_base_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "models" / "student"
    opts = local_options(_opts(tiny_base_model, out, noise=None), dp=False)
    res = distill(_rules(), notes, opts)  # their gold spans are not read: the ensemble labels
    assert res.local_only and res.pseudo_notes == len(notes) and res.pseudo_spans > 0
    card = validate_card(out)  # schema-valid
    assert card.local_only and not card.private
    assert card.dp["training_labels"] == "ensemble"
    assert LOCAL_ONLY_STATEMENT.upper() in card.body
    # weights may memorise PHI: the directory is private to the owner
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o700
    _only_model_dir_beside(out)
    with pytest.raises(DphubError, match="LOCAL ONLY: it contains unprotected patient info"):
        gate.check_card(out)


def test_rule_design_is_not_covered_for_students_without_rule_features(
        notes: list[Note], tiny_base_model: Path, tmp_path: Path) -> None:
    """Issue 31 #6: labels made by the rule member carry its design (tuned on the dev corpus)
    even when the student takes no rule features."""
    from dphub.privacy.statement import RULES_NOT_COVERED

    out = tmp_path / "s"
    distill(_rules(), notes, local_options(_opts(tiny_base_model, out, batch_size=2,
                                                 rule_features=False), dp=True))
    assert load_card(out).dp["not_covered"].count(RULES_NOT_COVERED) == 1


def test_dp_student_is_an_ordinary_publishable_dp_model(
        notes: list[Note], tiny_base_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "dp-student"
    opts = local_options(_opts(tiny_base_model, out, batch_size=2), dp=True)
    res = distill(_rules(), notes, opts)
    assert not res.local_only and res.train.epsilon is not None
    meta = gate.check_card(out)  # the gate's card checks pass (valid, private, accounted)
    dp = meta["differential_privacy"]
    assert dp["private"] is True and "local_only" not in dp
    assert dp["training_labels"] == "ensemble"
    # the rule member (teacher and rule features) was designed on a private dev corpus
    from dphub.privacy.statement import RULES_NOT_COVERED

    assert dp["not_covered"].count(RULES_NOT_COVERED) == 1


def _student_slot(path: Path, name: str = "s1") -> Slot:
    """A student as `dphub ensemble add DIR` makes it a member (ε, δ, unit from its card)."""
    from dphub.ensemble.members import ModelMember

    dp = load_card(path).dp
    return Slot(ModelMember.load(path, name), None, dp["epsilon"], dp["privacy_unit"],
                None, None, dp["delta"])


def test_dp_student_appears_only_with_its_final_card(
        notes: list[Note], tiny_base_model: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure between training and the card's composition (a kill, a full disk, a card that
    does not validate) leaves no model at ``out``: a card there would claim the run's ε alone,
    understating a composed student's (issue 31 #1). --force keeps the previous model."""
    from dphub.owner import distill as D

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(D, "_amend_dp_card", fail)
    out = tmp_path / "models" / "student"
    opts = local_options(_opts(tiny_base_model, out, batch_size=2), dp=True)
    with pytest.raises(OSError, match="No space left"):
        distill(_rules(), notes, opts)
    assert not out.exists()
    _only_model_dir_beside(out)  # and no temp directory with the training notes
    monkeypatch.undo()
    distill(_rules(), notes, opts)
    before = load_card(out).meta
    monkeypatch.setattr(D, "_amend_dp_card", fail)
    with pytest.raises(OSError, match="No space left"):
        distill(_rules(), notes, replace(opts, force=True))
    assert load_card(out).meta == before  # the previous, complete model is still in place


def test_interrupted_distillation_resumes_from_its_checkpoint(
        notes: list[Note], tiny_base_model: Path, tmp_path: Path) -> None:
    """The last round trains in a private directory, but its checkpoints stay beside ``out``
    (where `dphub train` keeps them), so --resume continues it."""
    out = tmp_path / "student"
    opts = local_options(_opts(tiny_base_model, out, noise=None, batch_size=2,
                               checkpoint_every=1, _stop_after=1), dp=False,
                         explicit={"batch_size"})
    with pytest.raises(KeyboardInterrupt):
        distill(_rules(), notes, opts)
    assert not out.exists() and (tmp_path / ".student.ckpt").is_dir()
    res = distill(_rules(), notes, replace(opts, _stop_after=None, resume=True))
    assert res.out_dir == out and res.train.steps > 1
    validate_card(out)
    _only_model_dir_beside(out)


def test_second_dp_distillation_composes_the_first_student(
        notes: list[Note], tiny_base_model: Path, tmp_path: Path) -> None:
    """Issue 31 #1: s1 (distill --dp), added to the ensemble, teaches s2 on the same patients:
    s2's card claims ε(s2 run) + ε(s1) and δ likewise, records s1 in its lineage, and the gate
    and `card validate` refuse the card once the claim drops below that composition."""
    import copy

    from dphub.card import validate_meta, write_card

    s1 = tmp_path / "s1"
    distill(_rules(), notes, local_options(_opts(tiny_base_model, s1, batch_size=2), dp=True))
    first = load_card(s1).dp
    ens = Ensemble([*_rules().slots, _student_slot(s1)])
    s2 = tmp_path / "s2"
    res = distill(ens, notes, local_options(_opts(tiny_base_model, s2, batch_size=2), dp=True))
    meta = gate.check_card(s2)  # the composed card passes the gate's card checks
    validate_card(s2)
    dp = meta["differential_privacy"]
    run = dp["composition"]
    assert run["method"] == "basic" and run["run_epsilon"] == pytest.approx(res.train.epsilon)
    assert dp["epsilon"] == pytest.approx(res.train.epsilon + first["epsilon"])
    assert dp["delta"] == pytest.approx(res.train.delta + first["delta"])
    assert res.epsilon == dp["epsilon"]
    [entry] = dp["lineage"]
    assert entry["role"] == "teacher" and entry["composed"] is True
    assert entry["repo"] == "local-teacher-2"  # never the local directory's name
    assert entry["revision"] == load_card(s1).dp["weights_sha256"]
    assert entry["epsilon"] == first["epsilon"] and entry["privacy_unit"] == "patient"
    body = load_card(s2).body
    assert "teacher (same units possible: composed)" in body and "basic composition" in body
    # the published rule: the claim must cover the composition its lineage records
    for field, value in (("epsilon", run["run_epsilon"]), ("delta", run["run_delta"])):
        forged = copy.deepcopy(meta)
        forged["differential_privacy"][field] = value
        with pytest.raises(DphubError, match=f"differential_privacy.{field}"):
            validate_meta(forged)
    stripped = copy.deepcopy(meta)
    del stripped["differential_privacy"]["composition"]
    with pytest.raises(DphubError, match="composition"):
        validate_meta(stripped)
    forged = copy.deepcopy(meta)
    forged["differential_privacy"]["epsilon"] = run["run_epsilon"]
    write_card(s2, forged, check_accounting=False)
    with pytest.raises(DphubError, match="differential_privacy.epsilon"):
        validate_card(s2)
    with pytest.raises(DphubError, match="differential_privacy.epsilon"):
        gate.check_card(s2)


def test_dp_teacher_declared_disjoint_or_refused(
        notes: list[Note], tiny_base_model: Path, tmp_path: Path) -> None:
    """A teacher is composed unless declared disjoint; a composition that cannot be stated
    (finer unit, no δ, a card not bound to its weights) is refused before any labelling."""
    from dphub.ensemble.members import FixedMember
    from dphub.owner.distill import teacher_lineage

    s1 = tmp_path / "s1"
    distill(_rules(), notes, local_options(_opts(tiny_base_model, s1, batch_size=2), dp=True))
    ens = Ensemble([*_rules().slots, _student_slot(s1)])
    [declared] = teacher_lineage(ens, "patient", disjoint={"s1"})
    assert declared["composed"] is False
    with pytest.raises(ConfigError, match="no such member"):
        teacher_lineage(ens, "patient", disjoint={"s9"})
    # a note-level teacher cannot be composed into a per-patient claim
    note_level = Ensemble([*_rules().slots, Slot(FixedMember("nl", {}), None, 2.0, "note",
                                                 None, None, 1e-5)])
    with pytest.raises(ConfigError, match="finer unit"):
        teacher_lineage(note_level, "patient")
    assert teacher_lineage(note_level, "note")[0]["composed"] is True
    no_delta = Ensemble([Slot(FixedMember("nd", {}), None, 2.0, "patient")])
    with pytest.raises(ConfigError, match="cannot state the composition with member 'nd'"):
        teacher_lineage(no_delta, "patient")
    # weights swapped under the card: what the teacher saw is unknown
    (s1 / "model.safetensors").write_bytes((s1 / "model.safetensors").read_bytes() + b" ")
    with pytest.raises(ConfigError, match="cannot state the composition with member 's1'"):
        distill(ens, notes, local_options(_opts(tiny_base_model, tmp_path / "s2"), dp=True))
    assert not (tmp_path / "s2").exists()


def test_local_only_needs_no_dp() -> None:
    with pytest.raises(ConfigError, match="local-only model is trained without DP"):
        TrainOptions(data=Path("x"), out=Path("y"), local_only=True).validate()
    from hub_fixtures import card_meta

    from dphub.card import validate_meta

    validate_meta(card_meta(local_only=False), check_accounting=False)
    with pytest.raises(DphubError, match="local_only"):  # a DP card cannot be local only
        validate_meta(card_meta(local_only=True), check_accounting=False)


def test_gold_spans_win_over_pseudo_labels(notes: list[Note]) -> None:
    pseudo = pseudo_label(_rules(), notes[:3], batch_size=2)
    assert all(n.labelled for n in pseudo)
    gold = [Note(notes[0].id, notes[0].text, notes[0].patient_id,
                 spans=[Span(0, 3, "NAME")], labelled=True),
            Note("extra", "Seen by Dr Ames.", "p9", spans=[Span(11, 15, "NAME")],
                 labelled=True)]
    combined = combine_labels(pseudo, gold)
    assert [n.id for n in combined] == [notes[0].id, notes[1].id, notes[2].id, "extra"]
    assert combined[0].spans == [Span(0, 3, "NAME")]  # gold only, not the union
    assert combined[1].spans == pseudo[1].spans
    assert combined[3].spans == [Span(11, 15, "NAME")]


def test_local_scenario_b_model(notes: list[Note], tiny_base_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "owner"
    res = train_local(notes, local_options(_opts(tiny_base_model, out, noise=None), dp=False))
    card = load_card(out)
    assert res.local_only and card.local_only and card.dp["training_labels"] == "gold"
    assert card.dp["privacy_unit"] == "note"  # the local default (no guarantee is claimed)
    _only_model_dir_beside(out)


def test_cli_distill_with_labels_then_publish_is_refused(
        notes: list[Note], tiny_base_model: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "notes.jsonl"
    formats.write(notes[2:], src, "jsonl")
    labelled = tmp_path / "labelled.jsonl"
    formats.write(notes[:2], labelled, "jsonl")
    manifest = tmp_path / "ens.toml"
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(manifest)]) == 0
    out = tmp_path / "student"
    capsys.readouterr()
    code = main(["ensemble", "distill", str(src), "--out", str(out), "--labels", str(labelled),
                 "--ensemble", str(manifest), "--base-model", str(tiny_base_model),
                 "--warm-start", "none", "--epochs", "1", "--threads", "1"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert "LOCAL ONLY" in cap.out and "2 with gold labels" in cap.out
    assert load_card(out).dp["training_labels"] == "gold+ensemble"
    for text in _gold_strings(notes):
        assert text not in cap.out + cap.err
    code = main(["publish", str(out), "--repo", "acme/student", "--hub", str(tmp_path / "hub")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: refusing to publish") and err.count("\n") == 1
    assert "LOCAL ONLY" in err and "unprotected patient information" in err
    # and `dphub card validate` says what it is
    assert main(["card", "validate", str(out)]) == 0
    assert LOCAL_ONLY_STATEMENT in capsys.readouterr().out


def test_cli_two_dp_distillations_publish_the_composed_epsilon(
        notes: list[Note], tiny_base_model: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31 #1, the reproduction: distill --dp, add the student as the CLI suggests,
    distill --dp again on the same notes, publish: the hub holds the composed ε."""
    src = tmp_path / "s.jsonl"
    formats.write(notes, src, "jsonl")
    manifest = tmp_path / "ens.toml"
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(manifest)]) == 0
    common = ["--ensemble", str(manifest), "--base-model", str(tiny_base_model), "--warm-start",
              "none", "--epochs", "1", "--threads", "1", "--dp", "--noise", "1.0",
              "--train-batch-size", "2"]
    assert main(["ensemble", "distill", str(src), "--out", str(tmp_path / "s1"), *common]) == 0
    assert main(["ensemble", "add", str(tmp_path / "s1"), "--ensemble", str(manifest)]) == 0
    capsys.readouterr()
    assert main(["ensemble", "distill", str(src), "--out", str(tmp_path / "s2"), *common]) == 0
    out = capsys.readouterr().out
    assert "composed with 1 teacher(s)" in out
    e1 = load_card(tmp_path / "s1").dp["epsilon"]
    dp2 = load_card(tmp_path / "s2").dp
    assert dp2["epsilon"] == pytest.approx(dp2["composition"]["run_epsilon"] + e1)
    # the publish gate's checks of the card and the directory (a tiny test base has no public
    # tokenizer to resolve, so `publish` itself stops earlier for an unrelated reason)
    meta = gate.check_card(tmp_path / "s2")
    gate.check_training_config(tmp_path / "s2", meta)
    eps = gate.CardSummary.from_meta(meta).epsilon
    assert eps == pytest.approx(dp2["epsilon"]) and eps > e1
    assert main(["card", "validate", str(tmp_path / "s2")]) == 0


def _stop_at_first_step(monkeypatch: pytest.MonkeyPatch) -> None:
    import dphub.train.run as run

    def first_step(*a, **k):
        raise DphubError("reached the first step")

    monkeypatch.setattr(run, "TrainLoop", first_step)


def test_cli_owner_dp_training_above_the_policy_refuses_to_start(
        notes: list[Note], tiny_base_model: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31 item 21 for `ensemble train --dp` and `ensemble distill --dp`: the projected ε
    is checked against the hub policy before the first step, as `dphub train` does."""
    monkeypatch.setenv("DPHUB_HUB", str(tmp_path / "hub"))
    _stop_at_first_step(monkeypatch)
    data = tmp_path / "notes.jsonl"
    formats.write(notes, data, "jsonl")
    manifest = tmp_path / "ens.toml"
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(manifest)]) == 0
    common = ["--base-model", str(tiny_base_model), "--warm-start", "none", "--threads", "1",
              "--dp", "--noise", "0.3", "--epochs", "4"]
    for cmd, batch in ((["ensemble", "train"], "--batch-size"),
                       (["ensemble", "distill", "--ensemble", str(manifest)],
                        "--train-batch-size")):
        args = [*cmd, str(data), "--out", str(tmp_path / "m"), batch, "2", *common]
        capsys.readouterr()
        code = main(args)
        err = capsys.readouterr().err
        assert code == 2, err
        lines = err.strip().splitlines()
        assert lines[0].startswith("privacy plan: 3 patients, q = 0.5, σ = 0.3, 8 steps")
        assert lines[-1].startswith("error: projected ε = ") and "exceeds the maximum 10" in err
        assert "--noise " in lines[-1] and "--allow-above-policy" in lines[-1]
        assert "reached the first step" not in err
        assert not (tmp_path / "m").exists()
        assert main([*args, "--allow-above-policy"]) == 2
        err = capsys.readouterr().err
        assert "training anyway (--allow-above-policy)" in err
        assert err.endswith("error: reached the first step\n")
    # nothing left beside the output (the pseudo-labelled notes' work directory is removed)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == [
        "ens.toml", "notes.jsonl"]


def test_cli_distill_checks_the_composed_epsilon_against_the_policy(
        notes: list[Note], tiny_base_model: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A second `distill --dp` whose own ε (about 5.7) is within the policy (10) but whose
    claim, composed with the first student's, is not: refused before the first step."""
    monkeypatch.setenv("DPHUB_HUB", str(tmp_path / "hub"))
    src = tmp_path / "s.jsonl"
    formats.write(notes, src, "jsonl")
    manifest = tmp_path / "ens.toml"
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(manifest)]) == 0
    common = ["--ensemble", str(manifest), "--base-model", str(tiny_base_model), "--warm-start",
              "none", "--epochs", "1", "--threads", "1", "--dp", "--noise", "0.9",
              "--train-batch-size", "2"]
    assert main(["ensemble", "distill", str(src), "--out", str(tmp_path / "s1"), *common]) == 0
    assert main(["ensemble", "add", str(tmp_path / "s1"), "--ensemble", str(manifest)]) == 0
    e1 = load_card(tmp_path / "s1").dp["epsilon"]
    assert 5 < e1 <= 10
    _stop_at_first_step(monkeypatch)
    capsys.readouterr()
    args = ["ensemble", "distill", str(src), "--out", str(tmp_path / "s2"), *common]
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines[0].endswith(f"projected ε = {e1:.4g} for this run; composed with 1 "
                             f"teacher(s) claiming ε {e1:.4g}, the card claims ε = "
                             f"{2 * e1:.4g}"), lines[0]
    assert lines[-1].startswith(f"error: projected ε = {2 * e1:.4g} (this run {e1:.4g} "
                                f"composed with composed teachers claiming ε {e1:.4g}) "
                                "exceeds the maximum 10")
    for way in ("--noise ", "--target-epsilon ", "--disjoint-teacher NAME",
                "--allow-above-policy"):
        assert way in lines[-1], way
    assert "reached the first step" not in err and not (tmp_path / "s2").exists()
    # the advice works: more noise, or the flag
    sigma = re.search(r"--noise ([0-9.]+) or more", lines[-1]).group(1)
    for extra in (["--noise", sigma], ["--allow-above-policy"]):
        assert main([*args, *extra]) == 2
        err = capsys.readouterr().err
        assert err.endswith("error: reached the first step\n"), (extra, err)
    # issue 53: s1 was trained on these very notes, and the privacy ledger says so: declaring
    # it disjoint is refused (a teacher the ledger does not know is taken as declared)
    assert main([*args, "--disjoint-teacher", "s1"]) == 2
    err = capsys.readouterr().err
    assert "--disjoint-teacher" in err and "the privacy ledger records that this member" in err
    assert not (tmp_path / "s2").exists()


def test_cli_bad_input_is_one_error_line(tmp_path: Path, tiny_base_model: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "ens.toml"
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(manifest)]) == 0
    secret = tmp_path / "notes.jsonl"
    secret.write_text(json.dumps({"id": "n1", "text": "Pt Zebedee Quarrington seen."}) + "\n"
                      + "{not json\n", encoding="utf-8")
    capsys.readouterr()
    for args in (
        [str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "s1")],
        [str(secret), "--out", str(tmp_path / "s2")],
        [str(secret), "--out", str(tmp_path / "s3"), "--noise", "1.0"],
    ):
        code = main(["ensemble", "distill", *args, "--ensemble", str(manifest),
                     "--base-model", str(tiny_base_model), "--warm-start", "none"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert "Zebedee" not in err and "Quarrington" not in err
    assert not (tmp_path / "s2").exists() and not (tmp_path / "s3").exists()


def test_cli_train_local_and_dp(notes: list[Note], tiny_base_model: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    labelled = tmp_path / "labelled.jsonl"
    formats.write(notes, labelled, "jsonl")
    common = ["--base-model", str(tiny_base_model), "--warm-start", "none", "--epochs", "1",
              "--threads", "1"]
    assert main(["ensemble", "train", str(labelled), "--out", str(tmp_path / "own"),
                 *common]) == 0
    out = capsys.readouterr().out
    assert "LOCAL ONLY" in out and f"dphub ensemble add {tmp_path / 'own'}" in out
    assert load_card(tmp_path / "own").local_only
    # DP on request: an ordinary DP model with its ε
    assert main(["ensemble", "train", str(labelled), "--out", str(tmp_path / "own-dp"), "--dp",
                 "--noise", "1.0", "--batch-size", "2", *common]) == 0
    assert "ε = " in capsys.readouterr().out
    card = load_card(tmp_path / "own-dp")
    assert card.private and not card.local_only and card.dp["training_labels"] == "gold"


def test_dp_student_refuses_labels_from_a_member_without_epsilon(tmp_path: Path) -> None:
    from dphub.ensemble.members import FixedMember

    leaky = Ensemble([Slot(RuleMember("rules:default", RuleOptions()), None, 0.0),
                      Slot(FixedMember("owner-local", {}), None, None)])
    opts = local_options(TrainOptions(out=tmp_path / "s"), dp=True)
    with pytest.raises(ConfigError, match="owner-local have no differential-privacy"):
        distill(leaky, [Note("n", "text", "p", labelled=False)], opts)
    with pytest.raises(ConfigError, match="rounds"):
        distill(_rules(), [Note("n", "text", "p", labelled=False)], opts, rounds=2)
    assert not (tmp_path / "s").exists()


# ---------------------------------------------------------------------------- soft labels
def test_soft_crf_loss_with_certain_labels_is_the_crf_nll() -> None:
    """Soft labels generalise the hard-label loss: confidence 1 everywhere gives exactly the
    CRF's negative log-likelihood; lower confidence gives another loss (and gradients)."""
    from torchcrf import CRF

    from dphub.tagger_model import soft_crf_nll, soft_targets

    torch.manual_seed(0)
    crf = CRF(5, batch_first=True).double()
    em = torch.randn(3, 7, 5, dtype=torch.float64, requires_grad=True)
    tags = torch.randint(0, 5, (3, 7))
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, 1:] = False
    hard = -crf(em, tags, mask, reduction="none")
    q = soft_targets(tags, torch.ones(3, 7, dtype=torch.float64), 5)
    soft = soft_crf_nll(crf, em, q, mask)
    assert torch.allclose(soft, hard, atol=1e-10)
    conf = torch.full((3, 7), 0.6, dtype=torch.float64)
    q = soft_targets(tags, conf, 5)
    assert torch.allclose(q.sum(-1), torch.ones(3, 7, dtype=torch.float64))
    soft = soft_crf_nll(crf, em, q, mask)
    assert not torch.allclose(soft, hard)
    # the expected NLL under the product distribution, by enumerating every tag sequence of a
    # 3-piece window (start, pairwise and end terms all exercised)
    em2, t2 = em[:1, :3].detach(), tags[:1, :3]
    m2 = torch.ones(1, 3, dtype=torch.bool)
    q2 = soft_targets(t2, torch.tensor([[0.6, 0.9, 0.3]], dtype=torch.float64), 5)
    with torch.no_grad():
        expect = sum(
            float(q2[0, 0, a] * q2[0, 1, b] * q2[0, 2, c])
            * float(-crf(em2, torch.tensor([[a, b, c]]), m2))
            for a, b, c in itertools.product(range(5), repeat=3))
    assert float(soft_crf_nll(crf, em2, q2, m2)) == pytest.approx(expect, abs=1e-9)
    soft.sum().backward()
    assert em.grad is not None and torch.isfinite(em.grad).all()


def test_spans_to_confidence_follows_the_tags() -> None:
    import numpy as np

    from dphub.align import spans_to_confidence, spans_to_tags
    from dphub.labels import get_schema

    offsets = np.array([[0, 3], [4, 8], [9, 12], [13, 20]])
    spans = [Span(4, 12, "NAME", 0.7), Span(13, 20, "DATE")]
    conf = spans_to_confidence(offsets, spans)
    tags = spans_to_tags(offsets, spans, get_schema("hipaa"))
    assert tags == ["O", "B-NAME", "E-NAME", "S-DATE"]
    assert conf.tolist() == pytest.approx([1.0, 0.7, 0.7, 1.0])  # gold (no score): certain


def test_soft_labelled_student_and_its_refusal_under_dp(
        notes: list[Note], tiny_base_model: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "notes.jsonl"
    formats.write(notes, src, "jsonl")
    manifest = tmp_path / "ens.toml"
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(manifest)]) == 0
    base = ["ensemble", "distill", str(src), "--ensemble", str(manifest), "--base-model",
            str(tiny_base_model), "--warm-start", "none", "--epochs", "1", "--threads", "1",
            "--soft-labels"]
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "dp"), "--dp", "--noise", "1.0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: soft labels train local") and err.count("\n") == 1
    assert not (tmp_path / "dp").exists()
    out = tmp_path / "soft"
    assert main([*base, "--out", str(out)]) == 0, capsys.readouterr().err
    cfg = json.loads((out / "training_config.json").read_text())
    assert cfg["dphub_training"]["soft_labels"] is True
    assert validate_card(out).local_only


def test_soft_labels_reach_the_loss(notes: list[Note], tiny_base_model: Path,
                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pseudo-spans' scores arrive in the training batches as confidences below 1."""
    from dphub.tagger import TaggerModel

    seen: list[torch.Tensor] = []
    real = TaggerModel.per_sample_loss

    def spy(self, batch, tags, weights=None, confidence=None):  # type: ignore[no-untyped-def]
        if confidence is not None:
            seen.append(confidence)
        return real(self, batch, tags, weights, confidence)

    monkeypatch.setattr(TaggerModel, "per_sample_loss", spy)
    opts = local_options(_opts(tiny_base_model, tmp_path / "s", noise=None), dp=False)
    opts.soft_labels = True
    distill(_rules(), notes, opts)
    assert seen and all(((c > 0) & (c <= 1)).all() for c in seen)
    assert any((c < 1).any() for c in seen)  # the rule member's spans carry scores below 1
