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

Where text goes: the pseudo-labelled training notes are written to a fresh 0700 directory beside
the output (files 0600 via :func:`dphub.io.atomic_open`), read by the training, and removed when
the run ends, failed or not. Nothing is printed or logged but counts; the model directory is built
under a temp name (0700) and renamed into place only when training completed.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from dphub.ensemble.core import Ensemble, Slot
from dphub.errors import ConfigError, InputError
from dphub.notes import Note, Span, merge_overlapping
from dphub.train import TrainOptions, TrainResult
from dphub.train.results import ProgressFn

#: Defaults of a local (no-DP) owner model that differ from ``dphub train``'s DP recipe. Without
#: noise there is nothing to average over, so small batches of notes give many more optimiser
#: steps for the same epochs (the DP recipe takes one full-batch step per epoch on ~14 patients).
#: The unit only groups windows for sampling here: no guarantee is claimed. For the same reason the
#: rule projection keeps the head's learning rate (``rule_lr_scale`` 1): DP's faster rule step
#: exists because a few noisy full-batch steps cannot move it, and hundreds of exact ones can.
LOCAL_DEFAULTS: dict[str, object] = {"privacy_unit": "note", "batch_size": 8, "rule_lr_scale": 1.0}

#: ``not_covered`` entry of a DP student labelled with thresholds calibrated on owner notes.
CALIBRATION_NOT_COVERED = ("thresholds calibrated on the owner's labelled notes, used to make the "
                           "training labels")

CountFn = Callable[[int, int], None]


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


def pseudo_label(ensemble: Ensemble, notes: Sequence[Note], *, batch_size: int = 16,
                 progress: CountFn | None = None, scores: bool = False) -> list[Note]:
    """The ensemble's merged spans as training labels, one labelled copy per note.

    Spans carry the merged label (no voters): the training data is exactly what the ensemble
    would hide. ``scores`` keeps each span's score (the best member's) for soft labels; hard
    labels drop it.
    """
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
    from dphub.ensemble.members import ModelMember

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
    from dphub import formats

    formats.write(notes, path, "jsonl")  # atomic, 0600 (mkstemp)
    return path


def _train_on(notes: Sequence[Note], opts: TrainOptions, work: Path, tag: str,
              on_progress: ProgressFn | None) -> TrainResult:
    from dphub.train import train

    if not any(n.spans for n in notes):
        raise InputError("no PHI in the training labels: nothing to learn (is the ensemble "
                         "empty, or are the notes empty?)")
    unit = opts.privacy_unit
    if opts.no_dp and unit == "patient" and any(n.patient_id is None for n in notes):
        unit = "note"  # no guarantee is claimed: units only group windows
    data = _write_notes(notes, work / f"{tag}.jsonl")
    o = replace(opts, data=data, format="jsonl", privacy_unit=unit)
    return train(o, on_progress=on_progress)


def _check_out(out: Path | None, force: bool) -> Path:
    """The owner model's directory, checked like ``dphub train``'s output."""
    from dphub.train.output import check_output_dir

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
    on_label: CountFn | None = None,
    on_progress: ProgressFn | None = None,
) -> OwnerResult:
    """Scenario A+: label ``notes`` with ``ensemble``, train a student on the labels.

    ``opts`` is a complete :class:`TrainOptions` (``out`` set; ``data`` is filled in here); make
    it local with :func:`local_options`. ``labelled`` notes contribute their gold spans
    (:func:`combine_labels`). Each round after the first adds the previous student to the
    labelling ensemble (``any``). ``opts.soft_labels``: the student learns each pseudo-span's
    tag with the span's score as its probability (:func:`dphub.tagger.soft_crf_nll`; gold
    spans stay certain).
    """
    if rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {rounds}")
    if not notes and not labelled:
        raise InputError("no notes to distil")
    opts.check_soft_labels()  # before the labelling, not after it
    if not opts.no_dp:
        _check_dp_teacher(ensemble, rounds)
    out = _check_out(opts.out, opts.force)
    opts = replace(opts, training_labels="gold+ensemble" if labelled else "ensemble")
    teacher = ensemble
    round_spans: list[int] = []
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
            o = replace(opts, out=out if last else work / f"student-{r}", force=opts.force and last)
            result = _train_on(train_notes, o, work, f"round-{r}", on_progress)
            if not last:
                teacher = _with_student(ensemble, work / f"student-{r}", r)
        assert result is not None
    if not opts.no_dp and _has_calibrated_thresholds(ensemble):
        _note_calibration_not_covered(out)
    return OwnerResult(
        out_dir=out, train=result, notes=len(train_notes), gold_notes=len(labelled),
        pseudo_notes=len(unlabelled),
        pseudo_spans=round_spans[-1], rounds=rounds, local_only=opts.local_only,
        round_spans=round_spans,
    )


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


def _with_student(ensemble: Ensemble, student_dir: Path, r: int) -> Ensemble:
    """The labelling ensemble of the next round: the original members plus this student."""
    from dphub.ensemble.members import ModelMember

    member = ModelMember.load(student_dir, f"student-round-{r}")
    return Ensemble([*ensemble.slots, Slot(member)], ensemble.rule)


def _note_calibration_not_covered(out: Path) -> None:
    """A DP student labelled with calibrated thresholds: the card says what ε does not cover."""
    from dphub.card import load_card, write_card

    card = load_card(out)
    dp = card.meta["differential_privacy"]
    dp["not_covered"] = [*dp.get("not_covered", []), CALIBRATION_NOT_COVERED]
    write_card(out, card.meta)


def train_local(
    labelled: Sequence[Note],
    opts: TrainOptions,
    *,
    on_progress: ProgressFn | None = None,
) -> OwnerResult:
    """Scenario B: the owner's model on its own labelled notes (local unless ``opts`` is DP)."""
    if not labelled:
        raise InputError("no labelled notes to train on")
    out = _check_out(opts.out, opts.force)
    opts = replace(opts, training_labels="gold")
    with _private_workdir(out) as work:
        result = _train_on(list(labelled), opts, work, "labelled", on_progress)
    return OwnerResult(out_dir=out, train=result, notes=len(labelled), gold_notes=len(labelled),
                       local_only=opts.local_only)
