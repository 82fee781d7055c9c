"""Public students (issue 29): a DP model labels public synthetic notes, a student learns them
without noise and is published with the teacher's ε (post-processing).

Tiny random BERT and a DP teacher distilled from the rule member on a few synthetic notes, one
epoch: what is tested is the contract (the card's claim, the gate's checks of the training
record, the refusals), not accuracy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dphub import synth
from dphub.card import (
    DP_POST_PROCESSING,
    POST_PROCESSING_NOT_COVERED,
    load_card,
    meta_problems,
    validate_meta,
    write_card,
)
from dphub.cli.main import main
from dphub.ensemble.core import Ensemble, Slot
from dphub.errors import ConfigError, DphubError
from dphub.hub import gate
from dphub.owner.distill import distill, local_options
from dphub.owner.public_student import PublicInputs, Teacher, distill_public
from dphub.privacy.statement import privacy_statement
from dphub.rules.engine import RuleMember, RuleOptions
from dphub.train import TrainOptions


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))


def _opts(base: Path, out: Path, **kw) -> TrainOptions:
    o = dict(out=out, base_model=str(base), warm_start="none", epochs=1.0, max_length=64,
             stride=16, accountant="rdp", noise=1.0, checkpoint_every=50, batch_size=2)
    o.update(kw)
    return TrainOptions(**o)


def _rules() -> Ensemble:
    return Ensemble([Slot(RuleMember("rules:default", RuleOptions()), None, 0.0)])


@pytest.fixture(scope="module")
def teacher_dir(tiny_base_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DP model (a DP student of the rule member on synthetic 'private' notes)."""
    torch.set_num_threads(1)
    notes = synth.generate(8, kind="nursing", seed=5, patients=3)
    out = tmp_path_factory.mktemp("teacher") / "dp-teacher"
    distill(_rules(), notes, local_options(_opts(tiny_base_model, out), dp=True))
    return out


@pytest.fixture(scope="module")
def student_dir(teacher_dir: Path, tiny_base_model: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("student") / "public-student"
    opts = local_options(_opts(tiny_base_model, out), dp=False)
    distill_public(Teacher.load(teacher_dir, "acme/dp-teacher", "abc123"), opts,
                   PublicInputs(notes=5, synth_seed=7))
    return out


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _gate_problems(model_dir: Path) -> list[str]:
    """The gate's card and training-record checks (a tiny test base has no public tokenizer to
    resolve, so `publish` itself stops earlier for an unrelated reason)."""
    try:
        meta = gate.check_card(model_dir)
    except DphubError as e:
        return [e.message]
    return gate.training_config_problems(model_dir, meta["differential_privacy"])


def test_student_card_claims_exactly_the_teachers_guarantee(
        teacher_dir: Path, student_dir: Path) -> None:
    t, s = load_card(teacher_dir).dp, load_card(student_dir).dp
    for key in ("epsilon", "delta", "privacy_unit", "accountant", "noise_multiplier",
                "sample_rate", "steps", "cross_check", "mechanism_rng"):
        assert s[key] == t[key], key
    assert s["private"] is True and s["training_data"] == DP_POST_PROCESSING
    assert s["weights_sha256"] != t["weights_sha256"]
    pp = s["post_processing"]
    assert pp["teacher"] == {"repo": "acme/dp-teacher", "revision": "abc123",
                             "weights_sha256": t["weights_sha256"]}
    assert pp["notes"] == 5 and pp["rules"] is True and pp["labels"] == "hard"
    assert POST_PROCESSING_NOT_COVERED in s["not_covered"]
    from dphub.privacy.statement import RULES_NOT_COVERED

    assert s["not_covered"].count(RULES_NOT_COVERED) == 1  # rule-made labels
    assert "local_only" not in s and "training_labels" not in s
    # the dataset block is the teacher's: the private data the guarantee covers
    assert load_card(student_dir).meta["dataset"] == load_card(teacher_dir).meta["dataset"]
    validate_meta(load_card(student_dir).meta)
    from dphub.card import dp_summary

    assert dp_summary(load_card(student_dir))["student_of"].startswith("acme/dp-teacher@abc123")
    assert dp_summary(load_card(teacher_dir))["student_of"] is None
    words = privacy_statement(s)
    assert "public student" in words and "acme/dp-teacher@abc123" in words
    assert "post-processing" in words
    assert "carries the guarantee of the model it was distilled from" in words
    assert "of its teacher's training data" in words
    assert "This model was trained with differential privacy" not in words


def test_the_gate_accepts_the_student_with_the_teachers_epsilon(
        teacher_dir: Path, student_dir: Path) -> None:
    assert _gate_problems(student_dir) == []
    summary = gate.CardSummary.from_meta(gate.check_card(student_dir))
    assert summary.epsilon == pytest.approx(load_card(teacher_dir).dp["epsilon"])
    gate.check_weights(student_dir, gate.read_card_meta(student_dir))
    assert main(["card", "validate", str(student_dir)]) == 0
    record = json.loads((student_dir / "training_config.json").read_text())
    assert record["no_dp"] is True and "privacy_unit" not in record and "epsilon" not in record


def _edit_record(d: Path, **hyper) -> None:
    p = d / "training_config.json"
    cfg = json.loads(p.read_text())
    for k, v in hyper.items():
        if k.startswith("top_"):
            cfg[k[4:]] = v
        else:
            cfg["dphub_training"][k] = v
    p.write_text(json.dumps(cfg))


@pytest.mark.parametrize(("edit", "words"), [
    ({"synth_seed": 8}, "do not regenerate"),
    ({"synth_notes": 6}, "post_processing.notes"),
    ({"teacher_sha256": "0" * 64}, "post_processing.teacher.weights_sha256"),
    ({"soft_labels": True}, "post_processing.labels"),
    ({"no_dp": False}, "does not describe a student's run"),
    ({"top_init_from": "acme/private-model"}, "does not describe a student's run"),
    ({"top_privacy_unit": "patient"}, "privacy_unit"),
    ({"top_steps": 999}, "post_processing.steps"),
])
def test_the_gate_refuses_a_record_that_does_not_bear_the_card_out(
        student_dir: Path, tmp_path: Path, edit: dict, words: str) -> None:
    d = _copy(student_dir, tmp_path / "s")
    _edit_record(d, **edit)
    problems = _gate_problems(d)
    assert problems and words in problems[0], problems


def test_a_lowered_claim_or_a_borrowed_block_is_refused(student_dir: Path,
                                                         teacher_dir: Path) -> None:
    meta = load_card(student_dir).meta
    low = {**meta, "differential_privacy": {**meta["differential_privacy"],
                                            "epsilon": meta["differential_privacy"]["epsilon"] * 0.9}}
    assert any("epsilon: claims" in p for p in meta_problems(low))
    # a post_processing block on an ordinary DP card, or a student card without one
    t = load_card(teacher_dir).meta
    borrowed = {**t, "differential_privacy": {**t["differential_privacy"],
                                              "post_processing": meta["differential_privacy"]
                                              ["post_processing"]}}
    assert any("post_processing" in p for p in meta_problems(borrowed))
    bare = {**meta, "differential_privacy": {k: v for k, v in meta["differential_privacy"].items()
                                             if k != "post_processing"}}
    assert any("post_processing" in p for p in meta_problems(bare))


def test_a_student_card_next_to_a_dp_run_record_is_refused(
        student_dir: Path, teacher_dir: Path, tmp_path: Path) -> None:
    """The teacher's own record (a DP run on private notes) does not bear out a student card."""
    d = _copy(student_dir, tmp_path / "s")
    (d / "training_config.json").write_bytes((teacher_dir / "training_config.json").read_bytes())
    problems = _gate_problems(d)
    assert problems and "which a student trained on public synthetic notes does not record" \
        in problems[0], problems


def test_teachers_that_would_break_post_processing_are_refused(
        tiny_base_model: Path, tmp_path: Path, teacher_dir: Path) -> None:
    notes = synth.generate(6, kind="nursing", seed=3, patients=2)
    local = tmp_path / "local"
    distill(_rules(), notes, local_options(_opts(tiny_base_model, local), dp=False))
    with pytest.raises(ConfigError, match="without differential privacy"):
        Teacher.load(local, "local")
    # a card that does not describe its teacher's weights
    forged = _copy(teacher_dir, tmp_path / "forged")
    meta = load_card(forged).meta
    meta["differential_privacy"]["weights_sha256"] = "0" * 64
    write_card(forged, meta)
    with pytest.raises(ConfigError, match="weights_sha256"):
        Teacher.load(forged, "forged")
    t = Teacher.load(teacher_dir, "t")
    with pytest.raises(ConfigError, match="--init-from"):
        distill_public(t, local_options(_opts(tiny_base_model, tmp_path / "s",
                                              init_from=str(teacher_dir)), dp=False))
    assert not (tmp_path / "s").exists()


def test_post_processing_block_is_only_for_students() -> None:
    from hub_fixtures import card_meta as fixture_meta

    meta = fixture_meta()
    dp = {**meta["differential_privacy"], "training_data": DP_POST_PROCESSING}
    assert any("post_processing: required" in p
               for p in meta_problems({**meta, "differential_privacy": dp}))


def test_cli_distill_public_then_validate(teacher_dir: Path, tiny_base_model: Path,
                                         tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli-student"
    code = main(["ensemble", "distill-public", str(teacher_dir), "--out", str(out), "--notes",
                 "4", "--base-model", str(tiny_base_model), "--warm-start", "none", "--epochs",
                 "1", "--threads", "1"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    from dphub.privacy.statement import format_epsilon

    eps = load_card(teacher_dir).dp["epsilon"]  # shown as everywhere: rounded up (issue 56)
    assert f"ε = {format_epsilon(eps)}," in cap.out and "public student" in cap.out
    assert load_card(out).dp["post_processing"]["teacher"]["repo"] == "local-teacher-1"
    assert main(["card", "validate", str(out)]) == 0
    # without --epochs: the student's 8, not dphub train's 32 full-batch DP epochs
    assert main(["ensemble", "distill-public", str(teacher_dir), "--out", str(tmp_path / "d"),
                 "--notes", "2", "--base-model", str(tiny_base_model), "--warm-start", "none",
                 "--threads", "1"]) == 0
    record = json.loads((tmp_path / "d" / "training_config.json").read_text())
    assert record["dphub_training"]["epochs"] == 8.0
    capsys.readouterr()
    code = main(["ensemble", "distill-public", str(tmp_path / "nowhere"), "--out",
                 str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and err.count("\n") == 1


def test_cli_defaults_are_the_librarys() -> None:
    """The command's --notes and --synth-seed defaults are the ones chosen and documented
    (PublicInputs; the CLI declares them as literals so as not to load torch at start-up)."""
    import inspect

    from dphub.cli.ensemble.owner import distill_public_cmd

    params = inspect.signature(distill_public_cmd).parameters
    assert params["notes"].default.default == PublicInputs().notes
    assert params["synth_seed"].default.default == PublicInputs().synth_seed
