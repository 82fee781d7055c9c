"""The publish gate's check of a public student (``dphub ensemble distill-public``): its training
record is a run on public synthetic notes that regenerate to the recorded digest, labelled by the
teacher the card names, and nothing of a run on someone's notes.

Why the gate needs this: the card of a public student carries its teacher's accounting fields
and claim (post-processing keeps a DP model's guarantee, :mod:`dphub.card.post_processing`), so
the card's own checks recompute the *teacher's* ε. That claim is only true if the student never
saw private data; the record is how that becomes checkable, as for a public base
(:mod:`dphub.hub.gate_provenance`): the gate regenerates the notes with :mod:`dphub.synth` and
compares the digest, the teacher's weights digest, the step count and the labels' kind with the
card. What stays a trust assumption is, as for every card, that the weights were trained on that
record.

The copied DP block is checked against the teacher's own card where this machine has the teacher
(:func:`teacher_card_problems`: a hub id pulled into the local registry at the recorded revision):
the teacher's card must validate and name the recorded weights, and every field of the student's
block that is the teacher's (ε, δ, σ, q, steps, unit, accountant, lineage ...) must equal the
teacher's. Where the teacher is not here (a local directory's teacher, ``local-teacher-1``, or a
hub model not pulled) the check is not done; the card's own accounting is still recomputed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dphub.card import TRAINING_CONFIG_FORMAT, is_post_processing, load_valid_card
from dphub.errors import DphubError
from dphub.hub.gate_common import (
    PUBLIC_DATA_KEYS,
    GateViolation,
    read_training_config,
)
from dphub.hub.gate_provenance import (
    SYNTH_DIGEST_MISMATCH,
    record_key_problems,
    regenerate_recorded_notes,
)
from dphub.io import file_sha256
from dphub.registry import Registry

#: ``training_config.json`` keys of a public student: no privacy unit, accountant, sampling rate
#: or ε (the claim is the teacher's, recorded on the card), no ``init_from``.
STUDENT_TRAINING_CONFIG_KEYS = frozenset({
    "format_version", "dphub_training", "base_model", "base_model_sha256", "init_from", "no_dp",
    "steps",
})
#: Its ``dphub_training`` keys: the student's training settings, the public data's record and the
#: teacher's weights digest.
STUDENT_HYPERPARAM_KEYS = frozenset({
    "epochs", "batch_size", "lr", "head", "train_layers", "encoder_layers", "label_schema", "seed",
    "no_dp", "warm_start", "max_length", "stride", "rule_features", "rule_lr_scale",
    "recall_weight", "soft_labels", *PUBLIC_DATA_KEYS, "synth_discharge_share",
    "teacher_sha256", "teacher_rules",
})
#: warm starts a public student may begin from: the public one, or the base itself
PUBLIC_STARTS = ("synth", "none")
#: fields of a student's block that are its own (``dphub.card.post_processing``), not copied
#: from the teacher's: every other field must be the teacher's
STUDENT_OWN_FIELDS = frozenset({"weights_sha256", "public_pretraining", "training_labels",
                                "training_data", "post_processing", "local_only", "not_covered"})


def teacher_card_problems(dp: Any) -> list[str]:
    """The student's copied DP block against its teacher's validated card, where this machine
    has the teacher (a hub id in the local registry at the recorded revision); [] otherwise."""
    if not is_post_processing(dp):
        return []
    pp = dp.get("post_processing")
    teacher = pp.get("teacher") if isinstance(pp, dict) else None
    if not isinstance(teacher, dict):
        return []
    repo, revision = teacher.get("repo"), teacher.get("revision")
    if not isinstance(repo, str) or "/" not in repo or not isinstance(revision, str):
        return []  # a local directory's teacher: nothing here to compare with
    try:
        path = Registry().get(repo, revision).path
    except DphubError:
        return []  # not pulled here: the check is not done (docs/hub.md)
    try:
        tdp = load_valid_card(path, require_private=True).meta["differential_privacy"]
    except DphubError as e:
        return [f"the teacher {repo}@{revision[:12]}'s card does not validate ({e.message})"]
    weights = path / "model.safetensors"
    if tdp.get("weights_sha256") != teacher.get("weights_sha256") or not weights.is_file() \
            or file_sha256(weights) != tdp.get("weights_sha256"):
        return [f"post_processing.teacher.weights_sha256 is not the weights of the teacher "
                f"{repo}@{revision[:12]} pulled here: the card names another teacher"]
    keys = (set(tdp) | set(dp)) - STUDENT_OWN_FIELDS
    differ = sorted(k for k in keys if dp.get(k) != tdp.get(k))
    missing = [c for c in tdp.get("not_covered") or [] if c not in (dp.get("not_covered") or [])]
    if differ or missing:
        fields = ", ".join(differ + (["not_covered"] if missing else []))
        return [f"the card's differential_privacy {fields} differ from its teacher "
                f"{repo}@{revision[:12]}'s validated card: a public student's guarantee is its "
                "teacher's, copied unchanged"]
    return []


def post_processing_problems(model_dir: Path, dp: Any) -> list[str]:
    """Every way a public student's training record fails its card ([] for other cards)."""
    if not is_post_processing(dp):
        return []
    what = "a public student's card needs the training record of dphub ensemble distill-public"
    try:
        cfg = read_training_config(model_dir)
    except GateViolation as e:
        return [e.message]
    problems = record_key_problems(cfg, STUDENT_TRAINING_CONFIG_KEYS, STUDENT_HYPERPARAM_KEYS,
                                   "a student trained on public synthetic notes", what)
    if problems:
        return problems
    if cfg.get("format_version") != TRAINING_CONFIG_FORMAT:
        return [f"training_config.json format_version must be {TRAINING_CONFIG_FORMAT}"]
    hyper = cfg["dphub_training"]
    if cfg.get("no_dp") is not True or hyper.get("no_dp") is not True or cfg.get("init_from") \
            or hyper.get("warm_start") not in PUBLIC_STARTS:
        return [f"training_config.json does not describe a student's run on public notes "
                f"(no_dp, no init_from, warm_start synth or none): {what}"]
    missing = [k for k in (*PUBLIC_DATA_KEYS, "teacher_sha256", "teacher_rules", "soft_labels")
               if k not in hyper]
    if missing:
        return [f"training_config.json does not record {', '.join(missing)}, so the card's "
                f"post_processing cannot be checked: {what}"]
    pp = dp.get("post_processing") or {}
    teacher = pp.get("teacher") or {}
    claims = {
        "post_processing.notes": (pp.get("notes"), hyper.get("synth_notes")),
        "post_processing.steps": (pp.get("steps"), cfg.get("steps")),
        "post_processing.teacher.weights_sha256": (teacher.get("weights_sha256"),
                                                   hyper.get("teacher_sha256")),
        "post_processing.rules": (pp.get("rules"), hyper.get("teacher_rules")),
        "post_processing.labels": (pp.get("labels"),
                                   "soft" if hyper.get("soft_labels") is True else "hard"),
    }
    differ = [k for k, (card_v, rec_v) in claims.items() if card_v != rec_v]
    if differ:
        return [f"the card's {', '.join(differ)} differ from training_config.json: the card "
                "does not describe this student's run"]
    if teacher.get("weights_sha256") == dp.get("weights_sha256"):
        return ["post_processing.teacher.weights_sha256 is the model's own: a model cannot be "
                "its own teacher"]
    teacher_problems = teacher_card_problems(dp)
    if teacher_problems:
        return teacher_problems
    try:
        _, notes = regenerate_recorded_notes(hyper)
    except DphubError as e:
        return [f"the public notes training_config.json records cannot be regenerated "
                f"({e.message})"]
    return [] if notes is not None else [SYNTH_DIGEST_MISMATCH]
