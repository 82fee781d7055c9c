"""``dphub ensemble distill | distill-public | train``: models trained on this machine.

Scenario A+ (``distill``: the ensemble labels the owner's notes, a student learns them) and
Scenario B (``train``: the owner's labelled notes). Local only (no DP) unless ``--dp``; the
training options are ``dphub train``'s own declarations (:mod:`dphub.cli.train`).
``distill-public`` reads no owner notes: a DP model labels public synthetic notes and the
student, post-processing of it, is publishable with the teacher's ε.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from dphub.cli.ensemble._common import (
    AGGREGATE_OPT,
    BATCH_OPT,
    ENSEMBLE_OPT,
    FORMAT_OPT,
    RESUME_OPT,
    _eps,
    _used,
    ensemble_app,
)
from dphub.cli.options import FLOAT, apply_threads, positive_float, reads_notes, threads_option

# one declaration of each training option (dphub/cli/train.py)
from dphub.cli.train import (
    ALLOW_ABOVE_POLICY_OPT,
    BASE_MODEL_OPT,
    DELTA_OPT,
    ENCODER_LAYERS_OPT,
    EPOCHS_OPT,
    FORCE_OPT,
    HEAD_OPT,
    INIT_FROM_OPT,
    LABEL_SCHEMA_OPT,
    LORA_RANK_OPT,
    LR_OPT,
    MAX_EPSILON_OPT,
    NOISE_OPT,
    PRIVACY_UNIT_OPT,
    RECALL_WEIGHT_OPT,
    SEED_OPT,
    TARGET_EPSILON_OPT,
    TRAIN_LAYERS_OPT,
    WARM_START_OPT,
)
from dphub.cli.train import BATCH_SIZE_OPT as TRAIN_BATCH_OPT
from dphub.errors import ConfigError, InputError

OWNER_OUT_OPT = typer.Option(
    ..., "--out", "-o", help="Model directory to write (stays on this machine unless --dp).",
)
DP_OPT = typer.Option(
    False, "--dp", help="Train with DP-SGD instead: an ordinary DP model with its ε, publishable. "
    "Default: no DP, a LOCAL ONLY model that the publish gate refuses.",
)
#: the flags that are training options (TrainOptions fields), as the commands name them
_TRAIN_FLAGS = ("base_model", "noise", "target_epsilon", "delta", "epochs", "batch_size", "lr",
                "privacy_unit", "head", "train_layers", "encoder_layers", "lora_rank",
                "recall_weight",
                "label_schema", "max_epsilon", "seed", "warm_start", "init_from")


def _owner_options(flags: dict[str, Any], out: Path, dp: bool, force: bool,
                   resume: bool = False) -> Any:
    """TrainOptions of an owner model: the flags given, made local unless ``--dp``."""
    from dphub.cli.train import build_options
    from dphub.owner.distill import local_options

    given = {k: flags[k] for k in _TRAIN_FLAGS if flags.get(k) is not None}
    if not dp:
        dp_only = [k for k in ("noise", "target_epsilon", "delta", "max_epsilon") if k in given]
        if dp_only:
            raise ConfigError(f"--{dp_only[0].replace('_', '-')} applies to DP training: add --dp")
    opts = build_options({**given, "out": out}, {}, force=force, resume=resume)
    return local_options(opts, dp=dp, explicit=set(given))


def _plan_check(opts: Any, allow: bool, batch_flag: str) -> Any:
    """``dphub train``'s check of the projected ε against the hub policy, before the first step
    (a local model projects none). The hub is the default one (``$DPHUB_HUB``): like the
    training options, these commands read nothing from dphub.toml."""
    from dphub.cli.train import plan_check as check

    return check(opts, {}, allow=allow, batch_flag=batch_flag)


def _report_owner(res: Any) -> None:
    from dphub.card import LOCAL_ONLY_STATEMENT

    t = res.train
    if res.local_only:
        what = f"{LOCAL_ONLY_STATEMENT.upper()} (no DP; the publish gate refuses it)"
    else:
        eps = res.epsilon if res.epsilon is not None else t.epsilon
        delta = res.delta if res.delta is not None else t.delta
        what = f"ε = {_eps(eps)}, δ = {delta:.2g} (DP, publishable)"
        composed = [e for e in res.teachers if e["composed"]]
        if composed:
            what += (f"; composed with {len(composed)} teacher(s) that may have seen these "
                     f"patients (this run alone: ε = {_eps(t.epsilon)}, δ = {t.delta:.2g}; "
                     "declare a member trained on other patients with --disjoint-teacher NAME)")
    typer.echo(f"wrote {res.out_dir}: {what}; {res.notes} training notes ({res.gold_notes} with "
               f"gold labels, {res.pseudo_notes} labelled by the ensemble), {t.steps} steps")
    typer.echo(f"use it: dphub ensemble add {res.out_dir}  (or dphub deid NOTES --model "
               f"{res.out_dir})")


@ensemble_app.command("distill")
@reads_notes
def distill_cmd(
    notes_path: Path = typer.Argument(
        ..., metavar="NOTES", help="The owner's notes (any format; gold spans, if any, ignored)."
    ),
    out: Path = OWNER_OUT_OPT,
    dp: bool = DP_OPT,
    labels: Path | None = typer.Option(
        None, "--labels", show_default="none",
        help="The owner's labelled notes: their gold spans replace the ensemble's labels.",
    ),
    rounds: int = typer.Option(
        1, "--rounds", min=1, help="Rounds; each adds the previous student to the labelling "
        "ensemble.",
    ),
    soft_labels: bool = typer.Option(
        False, "--soft-labels",
        help="Soft labels: each ensemble span's score is the probability the student learns "
             "for its tag (the rest goes to O); local (non-DP) students only.",
    ),
    disjoint_teacher: list[str] = typer.Option(
        [], "--disjoint-teacher", metavar="NAME",
        help="With --dp: declare that member NAME was trained on none of these patients, so "
             "its ε is not composed into the student's (recorded on the card as your "
             "declaration). Default: every member with ε > 0 may have seen them and is composed.",
    ),
    aggregate: str | None = AGGREGATE_OPT,
    fmt: str | None = FORMAT_OPT,
    batch_size: int = BATCH_OPT,
    base_model: str | None = BASE_MODEL_OPT,
    noise: float | None = NOISE_OPT,
    target_epsilon: float | None = TARGET_EPSILON_OPT,
    delta: float | None = DELTA_OPT,
    max_epsilon: float | None = MAX_EPSILON_OPT,
    epochs: float | None = EPOCHS_OPT,
    train_batch_size: int | None = typer.Option(
        None, "--train-batch-size", min=1, show_default="8 (local), 96 (--dp)",
        help="Expected units per training step (`dphub train --batch-size`).",
    ),
    lr: float | None = LR_OPT,
    privacy_unit: str | None = PRIVACY_UNIT_OPT,
    head: str | None = HEAD_OPT,
    train_layers: int | None = TRAIN_LAYERS_OPT,
    encoder_layers: int | None = ENCODER_LAYERS_OPT,
    lora_rank: int | None = LORA_RANK_OPT,
    recall_weight: float | None = RECALL_WEIGHT_OPT,
    label_schema: str | None = LABEL_SCHEMA_OPT,
    seed: int | None = SEED_OPT,
    warm_start: str | None = WARM_START_OPT,
    init_from: str | None = INIT_FROM_OPT,
    force: bool = FORCE_OPT,
    resume: bool = RESUME_OPT,
    manifest_path: Path = ENSEMBLE_OPT,
    threads: int | None = threads_option(),
    allow_above_policy: bool = ALLOW_ABOVE_POLICY_OPT,
) -> None:
    """Scenario A+: the ensemble labels your unlabelled notes; a student model learns them.

    Nothing leaves the machine. Without --dp the student is LOCAL ONLY (no DP: it contains
    unprotected patient information; its card says so and `dphub publish` refuses it), trained
    with --train-batch-size 8 and --privacy-unit note unless given.
    """
    from dphub import formats
    from dphub.ensemble.core import build_ensemble
    from dphub.ensemble.evaluation import read_labelled
    from dphub.ensemble.manifest import Manifest
    from dphub.io import disk_full_as_error
    from dphub.owner.distill import distill
    from dphub.progress import ProgressReporter

    apply_threads(threads)
    flags = {**locals(), "batch_size": train_batch_size}
    opts = _owner_options(flags, out, dp, force, resume)
    opts.soft_labels = soft_labels
    opts.check_soft_labels()
    if not notes_path.exists():
        raise InputError(f"{notes_path}: not found")
    notes = list(formats.read(notes_path, fmt))
    gold = read_labelled(labels) if labels is not None else []
    ensemble = build_ensemble(Manifest.load(manifest_path), aggregate_rule=aggregate,
                              batch_size=batch_size)
    with ProgressReporter() as reporter, disk_full_as_error(out):
        res = distill(ensemble, notes, opts, labelled=gold, rounds=rounds, batch_size=batch_size,
                      disjoint_teachers=disjoint_teacher,
                      on_label=reporter.count_callback("label", "notes"),
                      on_progress=reporter.train_callback(),
                      on_plan=_plan_check(opts, allow_above_policy, "--train-batch-size"))
    _report_owner(res)
    _used(manifest_path)


@ensemble_app.command("distill-public")
@reads_notes
def distill_public_cmd(
    teacher: str = typer.Argument(
        ..., metavar="TEACHER",
        help="The DP model to distil: a model directory or a pulled org/name[@revision].",
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Model directory to write: a public student, publishable with "
        "the teacher's ε.",
    ),
    notes: int = typer.Option(
        3000, "--notes", min=1, max=1_000_000,
        help="Public synthetic notes to label and learn (dphub's generator; recorded, and "
             "regenerated by the publish gate).",
    ),
    synth_seed: int = typer.Option(
        1000, "--synth-seed", min=0, help="Seed of the public synthetic notes (public data: "
        "recorded on the card's training record).",
    ),
    rules: bool = typer.Option(
        True, "--rules/--no-rules",
        help="Label with the rule member beside the teacher (public code; `any` of the two).",
    ),
    soft_labels: bool = typer.Option(
        False, "--soft-labels", help="Learn each span's score as its probability.",
    ),
    batch_size: int = BATCH_OPT,
    base_model: str | None = BASE_MODEL_OPT,
    epochs: float | None = typer.Option(
        None, "--epochs", parser=positive_float, metavar=FLOAT, show_default="8",
        help="Passes over the public notes (no noise: no ε is spent).",
    ),
    train_batch_size: int | None = typer.Option(
        None, "--train-batch-size", min=1, show_default="8",
        help="Notes per training step.",
    ),
    lr: float | None = LR_OPT,
    head: str | None = HEAD_OPT,
    train_layers: int | None = TRAIN_LAYERS_OPT,
    encoder_layers: int | None = ENCODER_LAYERS_OPT,
    recall_weight: float | None = RECALL_WEIGHT_OPT,
    label_schema: str | None = LABEL_SCHEMA_OPT,
    seed: int | None = SEED_OPT,
    warm_start: str | None = WARM_START_OPT,
    force: bool = FORCE_OPT,
    resume: bool = RESUME_OPT,
    threads: int | None = threads_option(),
) -> None:
    """A public student: the teacher (a DP model) and the rule member label public synthetic
    notes; a student learns them without noise.

    Nothing private is read, so the student is post-processing of the teacher and carries its
    guarantee: the card records the teacher's ε, δ and accounting, names the teacher by its
    weights' digest, and the publish gate accepts it on a training record it regenerates. Use it
    to move a DP model onto a smaller base (e.g. --base-model minilm-l3) without spending ε.
    """
    from dphub.io import disk_full_as_error
    from dphub.owner.public_student import (
        STUDENT_EPOCHS,
        PublicInputs,
        Teacher,
        distill_public,
    )
    from dphub.progress import ProgressReporter

    apply_threads(threads)
    flags = {**locals(), "batch_size": train_batch_size}
    opts = _owner_options(flags, out, False, force, resume)
    opts.soft_labels = soft_labels
    if epochs is None:  # the DP recipe's 32 full-batch epochs are not a student's
        opts.epochs = STUDENT_EPOCHS
    path, name, revision = _teacher_source(teacher)
    tm = Teacher.load(path, name, revision)
    inputs = PublicInputs(notes=notes, synth_seed=synth_seed)
    with ProgressReporter() as reporter, disk_full_as_error(out):
        res = distill_public(tm, opts, inputs, rules=rules, batch_size=batch_size,
                             on_label=reporter.count_callback("label", "notes"),
                             on_progress=reporter.train_callback())
    typer.echo(f"wrote {res.out_dir}: public student of {tm.repo}@{tm.revision[:12]}, "
               f"ε = {_eps(res.epsilon)}, δ = {res.delta:.2g} per {tm.dp.get('privacy_unit')} "
               f"(the teacher's: post-processing, publishable); {res.notes} public synthetic "
               f"notes, {res.pseudo_spans} labelled spans, {res.train.steps} steps")


def _teacher_source(spec: str) -> tuple[Path, str, str | None]:
    """(directory, name, revision) of a teacher given as a directory or a pulled hub id."""
    from dphub.registry import Registry

    p = Path(spec).expanduser()
    if p.is_dir():
        return p, p.name, None
    if p.exists():
        raise InputError(f"{spec}: not a model directory")
    repo, _, rev = spec.partition("@")
    entry = Registry().get(repo, rev or None)
    return entry.path, repo, entry.revision


@ensemble_app.command("train")
@reads_notes
def train_cmd(
    labelled: Path = typer.Argument(
        ..., metavar="LABELLED", help="The owner's labelled notes (any format)."
    ),
    out: Path = OWNER_OUT_OPT,
    dp: bool = DP_OPT,
    init_from: str | None = INIT_FROM_OPT,
    fmt: str | None = FORMAT_OPT,
    base_model: str | None = BASE_MODEL_OPT,
    noise: float | None = NOISE_OPT,
    target_epsilon: float | None = TARGET_EPSILON_OPT,
    delta: float | None = DELTA_OPT,
    max_epsilon: float | None = MAX_EPSILON_OPT,
    epochs: float | None = EPOCHS_OPT,
    batch_size: int | None = TRAIN_BATCH_OPT,
    lr: float | None = LR_OPT,
    privacy_unit: str | None = PRIVACY_UNIT_OPT,
    head: str | None = HEAD_OPT,
    train_layers: int | None = TRAIN_LAYERS_OPT,
    encoder_layers: int | None = ENCODER_LAYERS_OPT,
    lora_rank: int | None = LORA_RANK_OPT,
    recall_weight: float | None = RECALL_WEIGHT_OPT,
    label_schema: str | None = LABEL_SCHEMA_OPT,
    seed: int | None = SEED_OPT,
    warm_start: str | None = WARM_START_OPT,
    force: bool = FORCE_OPT,
    resume: bool = RESUME_OPT,
    threads: int | None = threads_option(),
    allow_above_policy: bool = ALLOW_ABOVE_POLICY_OPT,
) -> None:
    """Scenario B: your own model on your own labelled notes (optionally from a pulled model).

    Without --dp it is LOCAL ONLY (no DP: it contains unprotected patient information; its card
    says so and `dphub publish` refuses it), trained with --batch-size 8 and --privacy-unit note
    unless given. With --dp it is `dphub train` (publishable with its ε).
    """
    from dphub.ensemble.evaluation import read_labelled
    from dphub.io import disk_full_as_error
    from dphub.owner.distill import train_local
    from dphub.progress import ProgressReporter

    apply_threads(threads)
    opts = _owner_options(dict(locals()), out, dp, force, resume)
    notes = read_labelled(labelled, fmt)
    with ProgressReporter() as reporter, disk_full_as_error(out):
        res = train_local(notes, opts, on_progress=reporter.train_callback(),
                          on_plan=_plan_check(opts, allow_above_policy, "--batch-size"))
    _report_owner(res)
