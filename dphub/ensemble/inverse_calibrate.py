"""``ensemble calibrate`` for the inverse rule: LOW, HIGH, NAMED and SURE for a target recall.

Under ``--aggregate inverse`` the recall lever is not a member's threshold but the rule's own
(:mod:`dphub.ensemble.inverse`): HIGH, the P(PHI) below which a vocabulary word or a measurement
number comes back, LOW, the one for a word nothing vouches for, NAMED, a stricter HIGH for
vouched words with a sign of a name, and SURE, the one below which any word no shape refuses
comes back. Members keep their thresholds (their flags hide words whatever the rule's are).

How: every member runs once over the owner's labelled notes, model members reporting every word's
P(PHI) (:func:`dphub.ensemble.inverse.model_word_spans`, down to the lowest grid value); each note
becomes a :class:`~dphub.ensemble.inverse.WordTable`, the object a run decides from, so the
token-binary recall and precision computed here are those of a run (the words are the tokens of
:mod:`dphub.evaluate`; merging hidden words adds no token). Every pair LOW <= HIGH on
:data:`PAIR_GRID` is scored, each with NAMED = HIGH and with every :data:`NAMED_GRID` value below
HIGH, each of those without SURE and with every :data:`SURE_GRID` value at most LOW (the notes'
tables joined into one, :meth:`~dphub.ensemble.inverse.WordTable.joined`, so a setting costs one
array operation): the setting reaching the target recall at the highest precision wins
(ties: the higher thresholds, more text kept; no SURE, then the strictest). ``inverse:0,0`` hides every word, so recall 1 is
always reachable; what a high target costs is precision, and the same floor as the forward
calibration (``min_precision``, on the calibration notes and the held-out patients) refuses a
pair below it, naming the best reachable pair, unless ``force``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from dphub.ensemble.calibrate import (
    GRID,
    CalibrationRefused,
    CalibrationResult,
    HoldoutReport,
    _best_reachable,
    _holdout_split,
    check_calibration_args,
)
from dphub.ensemble.core import Ensemble
from dphub.ensemble.inverse import InverseRule, WordTable, word_table
from dphub.ensemble.members import ModelMember
from dphub.errors import ConfigError, InputError
from dphub.notes import Note

#: the values LOW and HIGH are chosen from: 1 (the vocabulary and the measurements decide alone),
#: the forward calibration's grid, and 0 (every word hidden)
PAIR_GRID: tuple[float, ...] = (1.0, *GRID, 0.0)
#: the values NAMED (a stricter HIGH for vouched words with a sign of a name) is chosen from,
#: besides HIGH itself; only those below HIGH are tried
NAMED_GRID: tuple[float, ...] = (0.01, 0.005, 0.002, 0.001, 0.0)
#: the values SURE (the P(PHI) below which any word no shape refuses comes back) is chosen from,
#: besides none; only those at most LOW are tried (a model "very sure" is surer than LOW asks)
SURE_GRID: tuple[float, ...] = (0.002, 0.001, 0.0005, 0.0002, 0.0001)
#: the lowest P(PHI) any grid setting reads: the models report every word down to it
GRID_FLOOR: float = min(v for v in (*PAIR_GRID, *SURE_GRID) if v > 0)

class _Point(NamedTuple):
    """One scored setting on the calibration notes."""

    recall: float
    precision: float
    rule: InverseRule
    #: share of the non-PHI tokens it keeps
    kept: float

    @property
    def named_high(self) -> float:
        return self.rule.high if self.rule.named is None else self.rule.named

    @property
    def sure_rank(self) -> float:
        """SURE for ordering ties of the same counts: none first, then the strictest (a SURE
        that changed nothing on the owner's labels is not stored; one that did is the least
        that did)."""
        return 1.0 if self.rule.sure is None else -self.rule.sure


@dataclass
class InverseCalibration(CalibrationResult):
    """A :class:`~dphub.ensemble.calibrate.CalibrationResult` whose choice is the rule itself
    (``rule``: ``inverse:LOW,HIGH[,NAMED[,SURE]]``); ``thresholds`` stays empty (members keep theirs)."""

    rule: str = ""
    #: share of the non-PHI tokens the chosen pair keeps (calibration notes; held-out patients)
    kept: float | None = None
    holdout_kept: float | None = None
    #: the ``min_kept`` asked for (``recall >= target at kept >= min_kept``), if any
    min_kept: float | None = None


class _Words:
    """The words of some notes, joined into one table, and which are PHI."""

    def __init__(self, tables: Sequence[WordTable], gold: Sequence[np.ndarray]) -> None:
        self.tables = list(tables)
        self.table = WordTable.joined(self.tables)
        self.gold = np.concatenate(list(gold)) if gold else np.zeros(0, dtype=bool)

    def counts(self, low: float, high: float, named: float | None = None,
               sure: float | None = None) -> tuple[int, int, int]:
        """(true-positive, false-positive, gold) token counts under
        ``inverse:low,high[,named[,sure]]``."""
        hide = ~self.table.kept(low, high, named, sure)
        return (int((hide & self.gold).sum()), int((hide & ~self.gold).sum()),
                int(self.gold.sum()))

    def kept(self, fp: int) -> float:
        """Share of non-PHI tokens kept when ``fp`` of them are hidden."""
        other = int((~self.gold).sum())
        return 1.0 - fp / other if other else 1.0


def _gold_flags(note: Note, table: WordTable) -> np.ndarray:
    flags = np.zeros(len(table.start), dtype=bool)
    for s in note.spans:
        flags |= (table.start < s.end) & (s.start < table.end)
    return flags


def grid_rules() -> Iterator[InverseRule]:
    """The settings calibration scores: every LOW <= HIGH of :data:`PAIR_GRID`, each with
    NAMED = HIGH and every :data:`NAMED_GRID` value below HIGH, each without SURE and with
    every :data:`SURE_GRID` value at most LOW (``benchmarks/recall_first.py --sweep`` prints
    the same settings)."""
    for hi in PAIR_GRID:
        for lo in PAIR_GRID:
            if lo > hi:
                continue
            for named in (None, *(v for v in NAMED_GRID if v < hi)):
                for sure in (None, *(v for v in SURE_GRID if v <= lo)):
                    yield InverseRule(lo, hi, named, sure)


def _score_grid(cal: _Words, n_gold: int) -> list[_Point]:
    """Every setting of :func:`grid_rules`, scored on the calibration notes."""
    points: list[_Point] = []
    for rule in grid_rules():
        tp, fp, _ = cal.counts(rule.low, rule.high, rule.named, rule.sure)
        points.append(_Point(tp / n_gold, tp / (tp + fp) if tp + fp else 1.0, rule,
                             cal.kept(fp)))
    return points


def _choose(points: list[_Point], target_recall: float, min_kept: float | None,
            force: bool) -> tuple[_Point, bool]:
    """The chosen point and whether ``force`` chose it below the targets (see
    :func:`calibrate_inverse`)."""

    def shown(pt: _Point) -> str:
        return f"{pt.rule} (recall {pt.recall:.4f}, kept {pt.kept:.4f})"

    def recall_first(pt: _Point) -> tuple[float, float]:
        return pt.recall, pt.kept

    if min_kept is None:
        ok = [pt for pt in points if pt.recall >= target_recall]
        # highest precision; ties: the higher thresholds (more text kept)
        return max(ok, key=lambda pt: (pt.precision, pt.rule.high, pt.named_high,
                                       pt.rule.low, pt.sure_rank)), False
    both = [pt for pt in points if pt.recall >= target_recall and pt.kept >= min_kept]
    if both:
        return max(both, key=recall_first), False
    at_kept = [pt for pt in points if pt.kept >= min_kept]
    at_rec = [pt for pt in points if pt.recall >= target_recall]
    best = []
    if at_kept:
        best.append(shown(max(at_kept, key=recall_first)))
    if at_rec:
        best.append(shown(max(at_rec, key=lambda pt: (pt.kept, pt.recall))))
    if not force or not at_kept:
        raise CalibrationRefused(
            f"no inverse:LOW,HIGH[,NAMED[,SURE]] reaches token recall >= {target_recall:g} with "
            f"non-PHI tokens kept >= {min_kept:g} on the calibration notes; best reachable: "
            + " or ".join(best) + " (lower --target-recall or --min-kept, or add --safe-words)")
    return max(at_kept, key=recall_first), True


def calibrate_inverse(
    ensemble: Ensemble,
    notes: Sequence[Note],
    target_recall: float = 0.99,
    *,
    holdout: float = 0.0,
    seed: int = 0,
    min_precision: float | None = None,
    force: bool = False,
    progress: Callable[[int, int], None] | None = None,
    chunk: int = 64,
    min_kept: float | None = None,
) -> InverseCalibration:
    """LOW, HIGH, NAMED and SURE of the inverse rule reaching ``target_recall`` at the best precision found
    (arguments as :func:`dphub.ensemble.calibrate.calibrate`; ``progress(done, total)`` counts
    notes scored).

    With ``min_kept`` the target is "recall >= R at non-PHI tokens kept >= K" (issue 36: the
    number a reviewer reads): the pair with the highest recall among those reaching both wins
    (then the most text kept); when no pair reaches both, :class:`CalibrationRefused` names the
    best reachable pairs (the highest recall at kept >= K, the most text at recall >= R), unless
    ``force`` (the highest recall at kept >= K is stored, with a warning)."""
    if not ensemble.rule.own_thresholds:
        raise ConfigError("calibrating the inverse rule needs --aggregate inverse")
    if min_kept is not None and not 0.0 <= min_kept <= 1.0:
        raise ConfigError(f"minimum kept share must be in [0, 1] (got {min_kept})")
    notes = check_calibration_args(notes, target_recall, holdout, min_precision)
    cal_idx, held_idx = _holdout_split(notes, holdout, seed)
    # every word's P(PHI) down to the lowest grid value: the same spans a run at that rule reads
    lowest = GRID_FLOOR
    probe = copy.copy(ensemble)
    probe.rule = InverseRule(lowest, lowest)
    models = {s.name: s.tag_threshold for s in ensemble.slots if isinstance(s.member, ModelMember)}
    vocab = ensemble.vocabulary
    tables: list[WordTable] = []
    for i in range(0, len(notes), max(1, chunk)):
        part = notes[i:i + chunk]
        for note, by_member in zip(part, probe.member_spans(part), strict=True):
            tables.append(word_table(note.text, by_member, vocab, models=models))
        if progress is not None:
            progress(len(tables), len(notes))
    gold = [_gold_flags(n, t) for n, t in zip(notes, tables, strict=True)]
    cal = _Words([tables[i] for i in cal_idx], [gold[i] for i in cal_idx])
    tp, fp, n_gold = cal.counts(0.0, 0.0)
    if not n_gold:
        raise InputError("the labelled notes used for calibration contain no PHI; nothing to "
                         "calibrate on")
    points = _score_grid(cal, n_gold)
    chosen, forced_kept = _choose(points, target_recall, min_kept, force)
    rule = chosen.rule
    report = None
    held_kept = None
    if held_idx:
        held = _Words([tables[i] for i in held_idx], [gold[i] for i in held_idx])
        htp, hfp, hg = held.counts(rule.low, rule.high, rule.named, rule.sure)
        held_kept = held.kept(hfp)
        report = HoldoutReport(
            patients=len({notes[i].effective_patient_id for i in held_idx}),
            notes=len(held_idx), tokens=sum(len(t.start) for t in held.tables), phi_tokens=hg,
            recall=htp / hg if hg else None, precision=htp / (htp + hfp) if htp + hfp else 1.0)
    result = InverseCalibration(
        thresholds={}, recall=chosen.recall, precision=chosen.precision,
        target_recall=target_recall, reached=True,
        tokens=sum(len(t.start) for t in cal.tables), phi_tokens=n_gold,
        min_precision=min_precision,
        best_reachable=_best_reachable([(pt.recall, pt.precision, k)
                                        for k, pt in enumerate(points)],
                                       min_precision),
        holdout=report, notes=len(cal_idx),
        patients=len({notes[i].effective_patient_id for i in cal_idx}), rule=str(rule),
        kept=chosen.kept, holdout_kept=held_kept, min_kept=min_kept)
    if forced_kept:
        result.forced = True
    if result.below_floor and min_kept is None:
        if not force:
            raise CalibrationRefused(result.refusal() or "calibration refused")
        result.forced = True
    return result
