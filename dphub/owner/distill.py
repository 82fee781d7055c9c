"""The data owner's own models, trained where the notes are (Scenario A+ and local Scenario B).

Two ways an owner turns its notes into a model of its own, both with :func:`dphub.train.train`
(one training loop for everything):

* :func:`distill` (``dphub ensemble distill``): the owner has notes but no labels. The configured
  ensemble (pulled models + rules, with the manifest's calibrated thresholds, else ``any``) labels
  them; a *student* is trained on those pseudo-labels (hard labels: the ensemble's merged spans).
  With ``labelled`` notes too, gold spans replace the ensemble's wherever a note is annotated.
  ``rounds > 1`` adds each round's student to the ensemble that labels the next round.
* :func:`train_local` (``dphub ensemble train``): the owner has labels; its model is trained on
  them, optionally from a pulled model (``init_from``).

Why no DP by default: the model never leaves the owner's machine, and DP costs recall. Such a model
*does* hold unprotected patient information, so its card says ``local_only`` (rendered as "local
only — contains unprotected patient information") and the publish gate refuses it. With
``dp=True`` it is an ordinary DP model, publishable with its ε; the pseudo-labels of a patient's
notes depend only on that patient's notes and on the (public, or ε-accounted) members, so the
patient-level guarantee covers them. Calibrated thresholds were chosen on the owner's labelled
notes, though: the card's ``not_covered`` then says so. A member without ε (another local
model) or a second round would break that argument, so ``dp=True`` refuses both.

A DP member may itself have been trained on these patients (a student of an earlier ``distill
--dp``, added to the ensemble as the CLI suggests, or the owner's own ``dphub train`` model):
the student's output then depends on those patients twice. dphub cannot tell which patients a
model saw (no card records its data), so every member with ε > 0 is a *teacher* that is composed
by default (:func:`teacher_lineage`): the card's lineage records it with its ε, δ and unit and
the claim becomes the run's (ε, δ) plus the teachers' (basic composition, checked by the gate and
``card validate``). The trainer may declare a member disjoint (``--disjoint-teacher NAME``: it
saw none of these patients), recorded as such and not composed. When the composition cannot be
stated (a teacher without δ or unit, one protecting a finer unit, a card that does not validate
or does not belong to its weights), the run is refused before any labelling.

Where text goes: the pseudo-labelled training notes are written to a fresh 0700 directory beside
the output (files 0600 via :func:`dphub.io.atomic_open`), read by the training, and removed when
the run ends, failed or not. Nothing is printed or logged but counts; the model directory is built
in that directory (0700) and renamed into place only when training completed and its card is
final (a DP student's teachers composed): ``out`` never holds a card claiming less than the
composition.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dphub import formats
from dphub.card import (
    compose_teachers,
    is_public_model,
    load_card,
    unit_covers,
    validate_meta,
    write_card,
)
from dphub.ensemble.core import Ensemble, Slot
from dphub.ensemble.members import ModelMember
from dphub.errors import ConfigError, DphubError, InputError
from dphub.hub.gate import public_provenance_problems
from dphub.io import file_sha256, move_into_place
from dphub.notes import Note, Span, merge_overlapping
from dphub.privacy.ledger import amend_release
from dphub.privacy.statement import RULES_NOT_COVERED
from dphub.rules.engine import RuleMember
from dphub.train import TrainOptions, TrainResult, train
from dphub.train.checkpoints import checkpoint_dir_for
from dphub.train.lineage import refuse_false_disjoint
from dphub.train.output import check_output_dir
from dphub.train.plan import PrivacyPlan
from dphub.train.results import ProgressFn

#: Defaults of a local (no-DP) owner model that differ from ``dphub train``'s DP recipe. Without
#: noise there is nothing to average over, so small batches of notes give many more optimiser
#: steps for the same epochs (the DP recipe takes one full-batch step per epoch on ~14 patients).
#: The unit only groups windows for sampling here: no guarantee is claimed. For the same reason the
#: rule projection keeps the head's learning rate (``rule_lr_scale`` 1): DP's faster rule step
#: exists because a few noisy full-batch steps cannot move it, and hundreds of exact ones can.
LOCAL_DEFAULTS: dict[str, object] = {"privacy_unit": "note", "batch_size": 8, "rule_lr_scale": 1.0}

#: Why a DP student refuses thresholds fitted on the owner's notes (issue 38, item 3).
CALIBRATED_DP_REFUSAL = (
    "distill --dp: the manifest sets thresholds on model members (from `ensemble calibrate` on "
    "the owner's notes, or by hand); thresholds fitted on your notes make every training label "
    "depend on other patients, which no accountant of this run covers. Remove threshold and "
    "label_thresholds from the model members of the manifest (they then use their own "
    "decoding), or distil without --dp (a local-only model)"
)

CountFn = Callable[[int, int], None]
#: ``on_plan`` of :func:`distill`: the student's privacy plan and its teachers' lineage entries
PlanFn = Callable[[PrivacyPlan, Sequence[dict[str, Any]]], None]


@dataclass
class OwnerResult:
    """What an owner training did: counts only (never text), and the last round's training."""

    out_dir: Path
    train: TrainResult
    notes: int
    gold_notes: int = 0
    pseudo_notes: int = 0
    pseudo_spans: int = 0
    rounds: int = 1
    local_only: bool = True
    round_spans: list[int] = field(default_factory=list)
    #: the card's claim (a DP student: the run's ε and δ plus its composed teachers')
    epsilon: float | None = None
    delta: float | None = None
    teachers: list[dict[str, Any]] = field(default_factory=list)


def pseudo_label(ensemble: Ensemble, notes: Sequence[Note], *, batch_size: int = 16,
                 progress: CountFn | None = None, scores: bool = False) -> list[Note]:
    """The ensemble's merged spans as training labels, one labelled copy per note.

    Spans carry the merged label (no voters): the training data is exactly what the ensemble
    would hide. ``scores`` keeps each span's score (the best member's) for soft labels; hard
    labels drop it.
    """
    if not ensemble.rule.typed_spans:  # the inverse rule (issue 26)
        raise ConfigError("the inverse rule hides every word it does not know, untyped (PHI): "
                          "no label a student could learn; label with --aggregate any or k-of-n")
    out: list[Note] = []
    total = len(notes)
    step = max(1, batch_size)
    for i in range(0, total, step):
        batch = list(notes[i:i + step])
        for note, res in zip(batch, ensemble.deid(batch), strict=True):
            spans = merge_overlapping(Span(s.start, s.end, s.label, s.score if scores else None)
                                      for s in res.spans)
            out.append(replace(note, spans=spans, labelled=True))
        if progress is not None:
            progress(len(out), total)
    return out


def combine_labels(pseudo: Sequence[Note], gold: Sequence[Note]) -> list[Note]:
    """Gold spans wherever a note is annotated, the ensemble's labels elsewhere.

    A note in both (same id) keeps its gold spans only: an annotator's labels are complete for
    the note, and the ensemble's are a guess. Annotated notes absent from ``pseudo`` are added.
    """
    gold_by_id = {n.id: n for n in gold}
    if len(gold_by_id) != len(gold):
        raise InputError("the labelled notes repeat a note id")
    out = [gold_by_id.pop(n.id) if n.id in gold_by_id else n for n in pseudo]
    return out + [n for n in gold if n.id in gold_by_id]


def _has_calibrated_thresholds(ensemble: Ensemble) -> bool:
    return any(isinstance(s.member, ModelMember)
               and (s.threshold is not None or s.label_thresholds) for s in ensemble.slots)


def local_options(opts: TrainOptions, *, dp: bool, explicit: set[str] | None = None
                  ) -> TrainOptions:
    """``opts`` made local (no DP, local-only card, :data:`LOCAL_DEFAULTS` for options the user
    did not set, named in ``explicit``) or left DP (``dp=True``)."""
    o = replace(opts)
    if dp:
        o.no_dp, o.local_only = False, False
        return o
    o.no_dp, o.local_only = True, True
    o.noise = o.target_epsilon = o.delta = o.max_epsilon = None  # no mechanism, no budget
    for key, value in LOCAL_DEFAULTS.items():
        if key not in (explicit or set()):
            setattr(o, key, value)
    return o


@contextlib.contextmanager
def _private_workdir(out: Path) -> Iterator[Path]:
    """A 0700 directory beside ``out`` for text-bearing files, removed whatever happens."""
    parent = out.expanduser().resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.owner-", suffix=".tmp", dir=parent))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write_notes(notes: Sequence[Note], path: Path) -> Path:
    formats.write(notes, path, "jsonl")  # atomic, 0600 (mkstemp)
    return path


def _train_on(notes: Sequence[Note], opts: TrainOptions, work: Path, tag: str,
              on_progress: ProgressFn | None,
              on_plan: Callable[[PrivacyPlan], None] | None = None) -> TrainResult:
    if not any(n.spans for n in notes):
        raise InputError("no PHI in the training labels: nothing to learn (is the ensemble "
                         "empty, or are the notes empty?)")
    unit = opts.privacy_unit
    if opts.no_dp and unit == "patient" and any(n.patient_id is None for n in notes):
        unit = "note"  # no guarantee is claimed: units only group windows
    data = _write_notes(notes, work / f"{tag}.jsonl")
    o = replace(opts, data=data, format="jsonl", privacy_unit=unit)
    return train(o, on_progress=on_progress, on_plan=on_plan)


def _check_out(out: Path | None, force: bool) -> Path:
    """The owner model's directory, checked like ``dphub train``'s output."""
    if out is None:
        raise ConfigError("give --out DIR: where the owner's model is written")
    check_output_dir(Path(out), force=force)
    return Path(out)


def distill(
    ensemble: Ensemble,
    notes: Sequence[Note],
    opts: TrainOptions,
    *,
    labelled: Sequence[Note] = (),
    rounds: int = 1,
    batch_size: int = 16,
    disjoint_teachers: Collection[str] = (),
    on_label: CountFn | None = None,
    on_progress: ProgressFn | None = None,
    on_plan: PlanFn | None = None,
) -> OwnerResult:
    """Scenario A+: label ``notes`` with ``ensemble``, train a student on the labels.

    ``opts`` is a complete :class:`TrainOptions` (``out`` set; ``data`` is filled in here); make
    it local with :func:`local_options`. ``labelled`` notes contribute their gold spans
    (:func:`combine_labels`). Each round after the first adds the previous student to the
    labelling ensemble (``any``). ``opts.soft_labels``: the student learns each pseudo-span's
    tag with the span's score as its probability (:func:`dphub.tagger_model.soft_crf_nll`; gold
    spans stay certain). ``disjoint_teachers``: member names the trainer declares were trained
    on none of these patients (DP only; :func:`teacher_lineage`). ``on_plan(plan, teachers)``
    sees the last round's privacy plan and the teachers' lineage entries before its first step,
    so that the projected claim (this run's ε plus the composed teachers') can be checked, and
    may raise to stop the run there (the CLI's hub-policy check).
    """
    if rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {rounds}")
    if not notes and not labelled:
        raise InputError("no notes to distil")
    opts.check_soft_labels()  # before the labelling, not after it
    teachers: list[dict[str, Any]] = []
    if not opts.no_dp:
        if _has_calibrated_thresholds(ensemble):
            raise ConfigError(CALIBRATED_DP_REFUSAL)
        _check_dp_teacher(ensemble, rounds)
        teachers = teacher_lineage(ensemble, opts.privacy_unit, disjoint=disjoint_teachers)
        refuse_false_disjoint(teachers, [*notes, *labelled])  # issue 53: the ledger knows
        opts = _run_budget(opts, teachers)
    elif disjoint_teachers:
        raise ConfigError("--disjoint-teacher applies to DP students (--dp): a local model "
                          "claims no guarantee to compose")
    out = _check_out(opts.out, opts.force)
    opts = replace(opts, training_labels="gold+ensemble" if labelled else "ensemble")
    teacher = ensemble
    round_spans: list[int] = []
    plan_cb = None if on_plan is None else functools.partial(_plan_with_teachers, on_plan,
                                                              teachers)
    with _private_workdir(out) as work:
        result: TrainResult | None = None
        train_notes: list[Note] = []
        gold_ids = {n.id for n in labelled}
        unlabelled = [n for n in notes if n.id not in gold_ids]  # gold notes keep gold spans
        for r in range(1, rounds + 1):
            pseudo = pseudo_label(teacher, unlabelled, batch_size=batch_size, progress=on_label,
                                  scores=opts.soft_labels)
            round_spans.append(sum(len(n.spans) for n in pseudo))
            train_notes = combine_labels(pseudo, labelled)
            last = r == rounds
            # every round trains into the private workdir; the last one's checkpoints (and its
            # run log) live where `dphub train --out OUT` keeps them, so --resume finds them
            ckpt = (opts.checkpoint_dir or checkpoint_dir_for(out)) if last \
                else opts.checkpoint_dir
            o = replace(opts, out=work / f"student-{r}", force=False, checkpoint_dir=ckpt)
            result = _train_on(train_notes, o, work, f"round-{r}", on_progress, plan_cb)
            if not last:
                teacher = _with_student(ensemble, work / f"student-{r}", r)
        assert result is not None
        student = work / f"student-{rounds}"
        claim: dict[str, Any] = {}
        if not opts.no_dp:
            # the card is complete (teachers composed, caveats added) before the directory
            # appears at `out`: a crash in between leaves no card claiming this run's ε alone
            claim = _amend_dp_card(student, teachers, rules=_has_rule_member(ensemble))
        move_into_place(student, out, overwrite=opts.force)
    result.out_dir = out
    return OwnerResult(
        out_dir=out, train=result, notes=len(train_notes), gold_notes=len(labelled),
        pseudo_notes=len(unlabelled),
        pseudo_spans=round_spans[-1], rounds=rounds, local_only=opts.local_only,
        round_spans=round_spans, epsilon=claim.get("epsilon", result.epsilon),
        delta=claim.get("delta", result.delta), teachers=teachers,
    )


def _plan_with_teachers(on_plan: PlanFn, teachers: Sequence[dict[str, Any]],
                        plan: PrivacyPlan) -> None:
    on_plan(plan, teachers)


def _check_dp_teacher(ensemble: Ensemble, rounds: int) -> None:
    """A DP student's labels may come only from members that cannot leak other patients.

    A member without ε (a local-only or --no-dp model) carries its training patients into every
    label it makes, unprotected; a second round's labels come from the first DP student, trained
    on the same patients, so the two ε would compose while the card states one.
    """
    leaky = [s.name for s in ensemble.slots if s.epsilon is None]
    if leaky:
        raise ConfigError(
            f"--dp: member(s) {', '.join(leaky)} have no differential-privacy guarantee; labels "
            "made with them would carry their training patients into the DP student "
            "unprotected. Remove them from the ensemble, or train without --dp (local only)"
        )
    if rounds > 1:
        raise ConfigError("--dp with --rounds > 1: every round's student learns from the same "
                          "patients, so the ε of the rounds would add up; use one round")


_PUBLIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")


def _public_name(name: str, i: int) -> str:
    """A member name as the card may show it: a hub id (``org/name``, a pulled member), else
    ``local-teacher-<i>``. A directory member's name is its local directory's, which may name a
    ward or a user: it never reaches the card (its weights digest identifies it)."""
    ok = "/" in name and _PUBLIC_NAME.match(name) and ".." not in name
    return name if ok else f"local-teacher-{i}"


def _public_revision(rev: str | None) -> str:
    """A registry commit as is; a directory pin ``sha256:<hex>`` as its hex; none: ``local``."""
    r = (rev or "").removeprefix("sha256:")
    return r if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", r) else "local"


def _teacher_card(name: str, path: Path) -> dict[str, Any]:
    """A model member's ``differential_privacy`` block, validated and bound to its weights.

    The ε composed is the card's claim, so the card must hold up: schema and recomputed
    accounting (:func:`dphub.card.validate_meta`), and its ``weights_sha256`` equal to the
    weights this member runs; a card claiming public synthetic data only, the training record
    the publish gate checks (:func:`dphub.hub.gate.public_provenance_problems`). Otherwise what
    the teacher saw is unknown: refused.
    """
    why = f"--dp: cannot state the composition with member {name!r}"
    try:
        card = load_card(path)
        validate_meta(card.meta)
    except DphubError as e:
        raise ConfigError(f"{why}: its model card does not validate ({e.message}); remove it "
                          "from the ensemble") from None
    dp = dict(card.meta.get("differential_privacy") or {})
    sha = dp.get("weights_sha256")
    weights = path / "model.safetensors"
    if sha is not None and (not weights.is_file() or file_sha256(weights) != sha):
        raise ConfigError(f"{why}: its card does not describe its weights (weights_sha256 "
                          "differs); remove it from the ensemble")
    if is_public_model(dp):
        # a public member is left out of the composition: its claim must hold up as the
        # publish gate checks it, or a rewritten card would make a model trained on these
        # patients without DP a free teacher
        problems = public_provenance_problems(path, card.meta)
        if problems:
            raise ConfigError(f"--dp: member {name!r} claims public synthetic training data "
                              f"that its training record does not bear out ({problems[0]}); "
                              "remove it from the ensemble")
    return dp


def teacher_lineage(ensemble: Ensemble, unit: str, *,
                    disjoint: Collection[str] = ()) -> list[dict[str, Any]]:
    """The lineage entries of a DP student's teachers: every member that holds private data.

    Members with ε 0 hold none (the rule member; a public-synthetic base, checked on its card
    and its training record) and are left out. Every other member may have been trained on the student's patients: dphub
    records no data provenance it could compare, so it is ``composed`` unless named in
    ``disjoint`` (the trainer's declaration, recorded). Raises :class:`ConfigError` when the
    composition cannot be stated: no δ or unit, a composed teacher protecting a finer unit than
    ``unit`` (a note-level ε does not bound a patient's loss), or a card that does not hold up
    (:func:`_teacher_card`).
    """
    names = [s.name for s in ensemble.slots]
    unknown = sorted(set(disjoint) - set(names))
    if unknown:
        raise ConfigError(f"--disjoint-teacher {unknown[0]!r}: no such member in the ensemble "
                          f"(members: {', '.join(names)})")
    out: list[dict[str, Any]] = []
    for i, slot in enumerate(ensemble.slots, 1):
        eps, delta, t_unit, rev = slot.epsilon, slot.delta, slot.unit, slot.revision
        path = getattr(slot.member, "path", None)
        if isinstance(slot.member, ModelMember) and path is not None:
            dp = _teacher_card(slot.name, Path(path))
            if is_public_model(dp):
                continue  # public synthetic notes only: no patient to compose
            if dp.get("private") is not True:
                raise ConfigError(f"--dp: member {slot.name!r} was trained without differential "
                                  "privacy (its card says so); remove it from the ensemble")
            eps, delta, t_unit = dp.get("epsilon"), dp.get("delta"), dp.get("privacy_unit")
            rev = rev or dp.get("weights_sha256")
        elif eps == 0:
            continue  # a member without training data (the rule member)
        why = f"--dp: cannot state the composition with member {slot.name!r}"
        missing = [w for w, v in (("ε", eps), ("δ", delta), ("privacy unit", t_unit)) if v is None]
        if missing:
            raise ConfigError(f"{why}: it records no {missing[0]}; remove it from the ensemble")
        composed = slot.name not in disjoint
        if composed and not unit_covers(str(t_unit), unit):
            raise ConfigError(
                f"{why}: it protects each {t_unit}, a finer unit than this student's {unit}, so "
                f"its ε does not bound what one {unit} can lose. Remove it, train the student "
                f"per {t_unit}, or declare it trained on none of these patients "
                f"(--disjoint-teacher {slot.name})"
            )
        out.append({"repo": _public_name(slot.name, i), "revision": _public_revision(rev),
                    "epsilon": float(eps), "delta": float(delta),
                    "privacy_unit": str(t_unit), "composed": composed})
    return out


def _run_budget(opts: TrainOptions, teachers: Sequence[dict[str, Any]]) -> TrainOptions:
    """``--max-epsilon`` bounds the composed claim: the run gets what the teachers left."""
    spent = sum(t["epsilon"] for t in teachers if t["composed"])
    if opts.max_epsilon is None or not spent:
        return opts
    left = opts.max_epsilon - spent
    if left <= 0:
        raise ConfigError(f"--max-epsilon {opts.max_epsilon:g}: the composed teachers may "
                          f"already have spent ε {spent:g} on these patients; nothing is left "
                          "for this run (declare a member trained on other patients with "
                          "--disjoint-teacher NAME)")
    return replace(opts, max_epsilon=left)


def _has_rule_member(ensemble: Ensemble) -> bool:
    return any(isinstance(s.member, RuleMember) for s in ensemble.slots)


def _amend_dp_card(out: Path, teachers: Sequence[dict[str, Any]], *,
                   rules: bool = False) -> dict[str, Any]:
    """Rewrite a DP student's card with its teachers composed and the caveat of its labels
    (the rule member's design), and its ledger record with the final claim. Returns the final
    block (its ``epsilon`` and ``delta`` are the claim)."""
    card = load_card(out)
    dp = compose_teachers(card.meta["differential_privacy"], teachers)
    before = list(dp.get("not_covered", []))
    extra = [RULES_NOT_COVERED] if rules and RULES_NOT_COVERED not in before else []
    dp["not_covered"] = before + extra
    if teachers or extra:
        write_card(out, {**card.meta, "differential_privacy": dp})
    # the ledger recorded the student's run as a plain training: it is this distillation
    amend_release(str(dp["weights_sha256"]), kind="distill", epsilon=float(dp["epsilon"]),
                  delta=float(dp["delta"]), composed=dp.get("composition") is not None,
                  composes=[str(t["revision"]) for t in teachers if t.get("composed")
                            and re.fullmatch(r"[0-9a-f]{64}", str(t["revision"]))])
    return dp


def _with_student(ensemble: Ensemble, student_dir: Path, r: int) -> Ensemble:
    """The labelling ensemble of the next round: the original members plus this student."""
    member = ModelMember.load(student_dir, f"student-round-{r}")
    return Ensemble([*ensemble.slots, Slot(member)], ensemble.rule)


def train_local(
    labelled: Sequence[Note],
    opts: TrainOptions,
    *,
    on_progress: ProgressFn | None = None,
    on_plan: Callable[[PrivacyPlan], None] | None = None,
) -> OwnerResult:
    """Scenario B: the owner's model on its own labelled notes (local unless ``opts`` is DP).

    ``on_plan`` is :func:`dphub.train.train`'s (the CLI's hub-policy check)."""
    if not labelled:
        raise InputError("no labelled notes to train on")
    out = _check_out(opts.out, opts.force)
    opts = replace(opts, training_labels="gold")
    with _private_workdir(out) as work:
        result = _train_on(list(labelled), opts, work, "labelled", on_progress, on_plan)
    return OwnerResult(out_dir=out, train=result, notes=len(labelled), gold_notes=len(labelled),
                       local_only=opts.local_only)
