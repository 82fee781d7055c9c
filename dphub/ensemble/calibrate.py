"""Choosing thresholds per (member, label) on the owner's labelled notes for a target recall,
and saying no when the target costs too much precision.

Why on the ensemble: the union rule means a member may be precise as long as the others cover
what it misses, so thresholds are chosen jointly for the *ensemble's* token-binary recall (the
i2b2 tokenization of :mod:`dphub.evaluate`: runs of letters/digits; a token is PHI when a span
overlaps it). Snapping spans to whole words (:mod:`dphub.ensemble.words`) cannot change these
token flags, so what calibration measures is what a run gets.

Why per label: one threshold per member trades every category at the same rate; a recall target
that one hard category needs (a rare ID shape) used to drag the member to 0.002 and the ensemble's
precision to 0.04. Each model member gets a threshold per *predicted* label (the label whose
probability is highest for the token, :class:`dphub.scores.LabelThresholds`). Labels with fewer
than ``min_label_tokens`` gold PHI tokens within their reach share one pooled threshold, which is
also the member's default for labels never seen: a label without support would otherwise be
switched off for free.

Why say no: a recall target reached by flagging almost everything is not de-identification, it is
deletion, and nobody notices from a recall figure. With ``min_precision`` the calibration refuses
(:class:`CalibrationRefused`, exit 2) when the chosen thresholds fall below that precision on the
calibration notes or on the held-out patients, naming the best reachable (precision, recall) pair;
``force`` stores them anyway and the result carries a loud warning.

Why hold out: thresholds chosen on a few notes fit those notes. ``holdout`` keeps a share of the
owner's *patients* (:func:`dphub.splits.split_notes`, patient-disjoint) out of the search and
reports precision/recall of the chosen thresholds on them.

Cost: every model member runs once over all notes (``token_scores``); each candidate threshold is
then applied to the cached scores, vectorised, and reduced to a boolean vector over all evaluation
tokens, so the search only ORs, adds and compares vectors. Non-model members (rules) keep their
threshold.

Search (documented heuristic, not an exhaustive optimum), over coordinates (member, label group):

1. start every coordinate at the highest grid threshold (most precise);
2. greedy descent: while the ensemble recall is below the target, lower ONE coordinate by one grid
   step, the move that gains the most true-positive tokens per false-positive token added (the
   points visited trace a precision/recall frontier: the best reachable pair is read from it);
3. coordinate ascent: for each coordinate, raise its threshold as far as the target recall still
   holds if that improves precision; repeat until nothing changes.

If the target cannot be reached even with every coordinate at the lowest grid threshold, the
lowest thresholds are returned with ``reached = False``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from dphub.ensemble.aggregate import AggregateRule
from dphub.ensemble.core import Slot
from dphub.ensemble.members import ModelMember
from dphub.errors import ConfigError, InputError
from dphub.evaluate import TOKEN_RE
from dphub.notes import Note, Span
from dphub.scores import TokenScores
from dphub.splits import assign_units

if TYPE_CHECKING:
    from dphub.ensemble.core import Ensemble

#: candidate thresholds on P(not O), most precise first
GRID: tuple[float, ...] = (
    0.95, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.15, 0.1, 0.07, 0.05, 0.03, 0.02, 0.01, 0.005,
    0.002, 0.001,
)
#: the pooled label group of a member: labels with little support, and the member's default
POOLED = "*"


class CalibrationRefused(ConfigError):
    """The recall target costs precision below the floor the user set (exit 2)."""


@dataclass
class HoldoutReport:
    """The chosen thresholds on held-out patients (never used by the search)."""

    patients: int
    notes: int
    tokens: int
    phi_tokens: int
    recall: float | None  # None when the held-out notes contain no PHI
    precision: float


@dataclass
class CalibrationResult:
    """Thresholds and what they give.

    ``thresholds`` maps each model member to its default threshold (the pooled labels, and what a
    reader unaware of per-label thresholds uses); ``label_thresholds`` maps members to
    ``{label: threshold}`` overrides. ``recall``/``precision`` are measured on the calibration notes
    (``notes``/``patients``), ``holdout`` on the held-out ones. ``best_reachable`` is the
    (precision, recall) pair with the highest recall whose precision reaches ``min_precision``
    (the most precise pair found when none does).
    """

    thresholds: dict[str, float]
    recall: float
    precision: float
    target_recall: float
    reached: bool
    tokens: int
    phi_tokens: int
    label_thresholds: dict[str, dict[str, float]] = field(default_factory=dict)
    min_precision: float | None = None
    best_reachable: tuple[float, float] | None = None
    holdout: HoldoutReport | None = None
    notes: int = 0
    patients: int = 0
    forced: bool = False

    @property
    def below_floor(self) -> bool:
        """Do the thresholds fall below ``min_precision`` (calibration or held-out notes)?"""
        if self.min_precision is None:
            return False
        if self.precision < self.min_precision:
            return True
        h = self.holdout
        return h is not None and h.phi_tokens > 0 and h.precision < self.min_precision

    def refusal(self) -> str | None:
        """One line naming the problem and the best reachable pair (None when above the floor)."""
        if not self.below_floor:
            return None
        floor = self.min_precision
        where = (f"precision {self.precision:.3f} on the calibration notes"
                 if self.precision < (floor or 0.0) else
                 f"precision {self.holdout.precision:.3f} on the held-out patients"  # type: ignore[union-attr]
                 f" ({self.precision:.3f} on the calibration notes)")
        target = (f"target recall {self.target_recall:g}" if self.reached else
                  f"target recall {self.target_recall:g} (not reached: {self.recall:.3f})")
        best = ""
        if self.best_reachable is not None:
            p, r = self.best_reachable
            best = (f"; best reachable at precision >= {floor:g}: precision {p:.3f}, recall {r:.3f}"
                    if p >= (floor or 0.0) else
                    f"; no thresholds reach precision {floor:g} (most precise: precision {p:.3f}, "
                    f"recall {r:.3f})")
        return f"{target} costs {where}, below the minimum precision {floor:g}{best}"

    def apply(self, slots: Sequence[Slot]) -> list[Slot]:
        """Copies of ``slots`` carrying the calibrated thresholds (others unchanged)."""
        out = []
        for s in slots:
            if s.name in self.thresholds:
                s = Slot(s.member, self.thresholds[s.name], s.epsilon, s.unit, s.revision,
                         dict(self.label_thresholds.get(s.name, {})) or None)
            out.append(s)
        return out


# ---------------------------------------------------------------------------- token geometry
@dataclass
class _Notes:
    """A set of notes laid end to end: evaluation tokens and gold flags on global offsets."""

    notes: list[Note]
    bases: np.ndarray  # global offset of each note's first character
    ev_start: np.ndarray
    ev_end: np.ndarray
    gold: np.ndarray

    @classmethod
    def of(cls, notes: Sequence[Note]) -> _Notes:
        notes = list(notes)
        lengths = np.array([len(n.text) + 1 for n in notes], dtype=np.int64)
        bases = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        bounds = [
            np.array([m.span() for m in TOKEN_RE.finditer(n.text)], dtype=np.int64).reshape(-1, 2)
            + base
            for n, base in zip(notes, bases, strict=True)
        ]
        allb = np.concatenate(bounds) if bounds else np.zeros((0, 2), dtype=np.int64)
        out = cls(notes, bases, allb[:, 0], allb[:, 1], np.zeros(len(allb), dtype=bool))
        out.gold = out.cover_spans([n.spans for n in notes])
        return out

    def cover(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """One boolean per evaluation token: does any global range ``[a_i, b_i)`` overlap it?"""
        n = len(self.ev_start)
        keep = b > a
        a, b = a[keep], b[keep]
        if not len(a) or not n:
            return np.zeros(n, dtype=bool)
        lo = np.searchsorted(self.ev_end, a, side="right")  # first token ending after a
        hi = np.searchsorted(self.ev_start, b, side="left")  # first token starting at/after b
        ok = lo < hi
        diff = np.zeros(n + 1, dtype=np.int64)
        np.add.at(diff, lo[ok], 1)
        np.add.at(diff, hi[ok], -1)
        return np.cumsum(diff[:-1]) > 0

    def cover_spans(self, spans_per_note: Sequence[Sequence[Span]]) -> np.ndarray:
        a = [s.start + int(base) for spans, base in zip(spans_per_note, self.bases, strict=True)
             for s in spans]
        b = [s.end + int(base) for spans, base in zip(spans_per_note, self.bases, strict=True)
             for s in spans]
        return self.cover(np.array(a, dtype=np.int64), np.array(b, dtype=np.int64))


@dataclass
class _Pieces:
    """One model member's word pieces over a :class:`_Notes`, concatenated."""

    start: np.ndarray
    end: np.ndarray
    phi: np.ndarray
    label: np.ndarray  # index into labels of the most probable label
    first: np.ndarray  # first piece of its note (runs never cross notes)
    labels: tuple[str, ...]

    @classmethod
    def of(cls, scores: Sequence[TokenScores], bases: np.ndarray) -> _Pieces:
        labels: tuple[str, ...] = next((ts.labels for ts in scores if len(ts)), ())
        live = [(ts, int(b)) for ts, b in zip(scores, bases, strict=True) if len(ts)]
        if not live:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, np.zeros(0), empty, np.zeros(0, dtype=bool), labels)
        off = np.concatenate([ts.offsets.reshape(-1, 2).astype(np.int64) + b for ts, b in live])
        phi = np.concatenate([np.asarray(ts.phi_prob, dtype=float) for ts, _ in live])
        lab = np.concatenate([np.argmax(ts.label_probs, axis=1) for ts, _ in live]).astype(np.int64)
        first = np.zeros(len(off), dtype=bool)
        first[np.cumsum([0] + [len(ts) for ts, _ in live[:-1]])] = True
        return cls(off[:, 0], off[:, 1], phi, lab, first, labels)

    def flags(self, where: _Notes, mask: np.ndarray) -> np.ndarray:
        """Evaluation-token flags of the spans that the flagged pieces ``mask`` form.

        Exactly :func:`dphub.scores.spans_from_scores`'s threshold path: a span is a run of
        consecutive flagged pieces with the same label, covering the text between them.
        """
        idx = np.flatnonzero(mask)
        if not len(idx):
            return np.zeros(len(where.ev_start), dtype=bool)
        new = np.ones(len(idx), dtype=bool)
        new[1:] = ((np.diff(idx) != 1) | self.first[idx[1:]]
                   | (self.label[idx[1:]] != self.label[idx[:-1]]))
        heads = np.flatnonzero(new)
        tails = np.r_[heads[1:] - 1, len(idx) - 1]
        return where.cover(self.start[idx[heads]], self.end[idx[tails]])


def _split(scores: Sequence[TokenScores], index: Sequence[int]) -> list[TokenScores]:
    return [scores[i] for i in index]


# ---------------------------------------------------------------------------- search
Coord = tuple[str, str]  # (member, label group)


@dataclass
class _Search:
    options: dict[Coord, list[np.ndarray]]  # coordinate -> flags per GRID index
    groups: dict[str, list[str]]  # member -> its label groups
    fixed_votes: np.ndarray
    gold: np.ndarray
    rule: AggregateRule  # K, and the members whose flag counts alone (weight K)

    def member_flags(self, m: str, idx: dict[Coord, int]) -> np.ndarray:
        f = np.zeros(len(self.gold), dtype=bool)
        for g in self.groups[m]:
            f |= self.options[(m, g)][idx[(m, g)]]
        return f

    def swap(self, votes: np.ndarray, m: str, old: np.ndarray, new: np.ndarray) -> np.ndarray:
        """``votes`` with member ``m``'s flags ``old`` replaced by ``new`` (weighted by the rule)."""
        return votes + self.rule.weight(m) * (new.astype(np.int32) - old.astype(np.int32))

    def counts(self, votes: np.ndarray) -> tuple[int, int]:
        pred = votes >= self.rule.k
        return int((pred & self.gold).sum()), int((pred & ~self.gold).sum())

    def run(self, target: float) -> tuple[dict[Coord, int], list[tuple[float, float, int]]]:
        """The chosen grid indices and the (recall, precision, step) points visited."""
        n_gold = int(self.gold.sum())
        coords = list(self.options)
        idx = {c: 0 for c in coords}
        mflags = {m: self.member_flags(m, idx) for m in self.groups}
        votes = self.fixed_votes + sum((self.rule.weight(m) * f.astype(np.int32)
                                        for m, f in mflags.items()),
                                       np.zeros(len(self.gold), dtype=np.int32))
        tp, fp = self.counts(votes)

        def rp(tp_: int, fp_: int) -> tuple[float, float]:
            return tp_ / n_gold, (tp_ / (tp_ + fp_) if tp_ + fp_ else 1.0)

        path = [(*rp(tp, fp), 0)]
        while rp(tp, fp)[0] < target:
            best: tuple[float, int, Coord] | None = None
            for c in coords:
                if idx[c] + 1 >= len(GRID):
                    continue
                m = c[0]
                new_m = mflags[m] | self.options[c][idx[c] + 1]  # lowering only adds flags
                v2 = self.swap(votes, m, mflags[m], new_m)
                tp2, fp2 = self.counts(v2)
                cand = ((tp2 - tp) / (fp2 - fp + 1.0), tp2 - tp, c)
                if best is None or cand[:2] > best[:2]:
                    best = cand
            if best is None:
                break
            c = best[2]
            m = c[0]
            idx[c] += 1
            new_m = mflags[m] | self.options[c][idx[c]]
            votes = self.swap(votes, m, mflags[m], new_m)
            mflags[m] = new_m
            tp, fp = self.counts(votes)
            path.append((*rp(tp, fp), len(path)))
        rec, prec = rp(tp, fp)
        if rec >= target:
            changed = True
            while changed:
                changed = False
                for c in coords:
                    m = c[0]
                    for j in range(idx[c]):  # higher thresholds first
                        trial = dict(idx)
                        trial[c] = j
                        new_m = self.member_flags(m, trial)
                        v2 = self.swap(votes, m, mflags[m], new_m)
                        tp2, fp2 = self.counts(v2)
                        r2, p2 = rp(tp2, fp2)
                        if r2 >= target and p2 > prec:
                            idx, votes, tp, fp, rec, prec = trial, v2, tp2, fp2, r2, p2
                            mflags[m] = new_m
                            changed = True
                            break
        path.append((rec, prec, len(path)))
        return idx, path


def _best_reachable(path: Sequence[tuple[float, float, int]], floor: float | None
                    ) -> tuple[float, float]:
    """(precision, recall): the highest recall at precision >= floor, else the most precise."""
    ok = [(r, p) for r, p, _ in path if floor is None or p >= floor]
    if ok:
        r, p = max(ok)
        return p, r
    r, p = max(((r, p) for r, p, _ in path), key=lambda rp: (rp[1], rp[0]))
    return p, r


# ---------------------------------------------------------------------------- entry point
def check_calibration_args(notes: Sequence[Note], target_recall: float, holdout: float,
                           min_precision: float | None) -> list[Note]:
    """The checks every calibration (forward and inverse) makes of its arguments; the notes as a
    list."""
    if not 0.0 < target_recall <= 1.0:
        raise ConfigError(f"target recall must be in (0, 1] (got {target_recall})")
    if not 0.0 <= holdout < 1.0:
        raise ConfigError(f"holdout must be in [0, 1) (got {holdout})")
    if min_precision is not None and not 0.0 <= min_precision <= 1.0:
        raise ConfigError(f"minimum precision must be in [0, 1] (got {min_precision})")
    notes = list(notes)
    if not notes or not all(n.labelled for n in notes):
        raise InputError("calibration needs labelled notes (gold spans)")
    return notes


def calibrate(
    ensemble: Ensemble,
    notes: Sequence[Note],
    target_recall: float = 0.99,
    *,
    per_label: bool = True,
    min_label_tokens: int = 20,
    holdout: float = 0.0,
    seed: int = 0,
    min_precision: float | None = None,
    force: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> CalibrationResult:
    """Thresholds per (model member, label) reaching ``target_recall`` at the best precision found.

    ``progress(done, total)`` is called after each member has scored the notes (the long part;
    the CLI shows it).

    ``holdout``: share of patients kept out of the search to check the result on. With
    ``min_precision``, raises :class:`CalibrationRefused` when the thresholds fall below it (on
    the calibration notes or the held-out patients) unless ``force`` (then ``result.forced``).
    """
    if ensemble.rule.own_thresholds:  # the inverse rule: its own LOW, HIGH (issue 26)
        raise ConfigError("the inverse rule is calibrated by "
                          "dphub.ensemble.inverse_calibrate.calibrate_inverse")
    notes = check_calibration_args(notes, target_recall, holdout, min_precision)
    cal_idx, held_idx = _holdout_split(notes, holdout, seed)
    cal = _Notes.of([notes[i] for i in cal_idx])
    held = _Notes.of([notes[i] for i in held_idx]) if held_idx else None
    if not cal.gold.any():
        raise InputError("the labelled notes used for calibration contain no PHI; nothing to "
                         "calibrate on")
    fixed_cal = np.zeros(len(cal.gold), dtype=np.int32)
    fixed_held = np.zeros(len(held.gold) if held else 0, dtype=np.int32)
    pieces: dict[str, tuple[_Pieces, _Pieces | None]] = {}
    # members on one tagger (one model listed twice, e.g. with a low threshold) score it once
    scored: dict[tuple[int, int], list[TokenScores]] = {}
    for done, slot in enumerate(ensemble.slots, start=1):
        m = slot.member
        if isinstance(m, ModelMember):
            if type(m).token_scores is ModelMember.token_scores:
                key = (id(m.tagger), m.batch_size)
                if key not in scored:
                    scored[key] = m.token_scores(notes)  # one inference over all notes
                scores = scored[key]
            else:  # a subclass's own scores (e.g. a cache)
                scores = m.token_scores(notes)
            pieces[slot.name] = (
                _Pieces.of(_split(scores, cal_idx), cal.bases),
                _Pieces.of(_split(scores, held_idx), held.bases) if held else None,
            )
        else:
            spans = m.tag(notes, threshold=slot.threshold)
            w = ensemble.rule.weight(slot.name)
            fixed_cal += w * cal.cover_spans(_split(spans, cal_idx))
            if held:
                fixed_held += w * held.cover_spans(_split(spans, held_idx))
        if progress is not None:
            progress(done, len(ensemble.slots))
    if not pieces:
        raise ConfigError("the ensemble has no model members: nothing to calibrate")

    options: dict[Coord, list[np.ndarray]] = {}
    groups: dict[str, list[str]] = {}
    members_labels: dict[str, dict[str, list[int]]] = {}  # member -> group -> label indices
    lowest = GRID[-1]
    for name, (pc, _) in pieces.items():
        label_groups: dict[str, list[int]] = {}
        pooled: list[int] = []
        for j, lab in enumerate(pc.labels):
            support = int((pc.flags(cal, (pc.label == j) & (pc.phi >= lowest)) & cal.gold).sum())
            if per_label and support >= min_label_tokens and lab != POOLED:
                label_groups[lab] = [j]
            else:
                pooled.append(j)
        if pooled or not label_groups:
            label_groups[POOLED] = pooled
        members_labels[name] = label_groups
        groups[name] = list(label_groups)
        for g, labs in label_groups.items():
            in_group = np.isin(pc.label, labs)
            options[(name, g)] = [pc.flags(cal, in_group & (pc.phi >= t)) for t in GRID]

    search = _Search(options, groups, fixed_cal, cal.gold, ensemble.rule)
    idx, path = search.run(target_recall)
    rec, prec = path[-1][0], path[-1][1]
    thresholds = {name: GRID[idx[(name, POOLED)]] if (name, POOLED) in idx
                  else min(GRID[idx[(name, g)]] for g in groups[name]) for name in groups}
    label_thresholds = {
        name: {g: GRID[idx[(name, g)]] for g in groups[name] if g != POOLED}
        for name in groups
    }
    label_thresholds = {k: v for k, v in label_thresholds.items() if v}
    report = None
    if held is not None:
        report = _check_holdout(held, fixed_held, pieces, members_labels, idx, ensemble.rule,
                                len({notes[i].effective_patient_id for i in held_idx}))
    result = CalibrationResult(
        thresholds=thresholds,
        recall=rec,
        precision=prec,
        target_recall=target_recall,
        reached=rec >= target_recall,
        tokens=len(cal.gold),
        phi_tokens=int(cal.gold.sum()),
        label_thresholds=label_thresholds,
        min_precision=min_precision,
        best_reachable=_best_reachable(path, min_precision),
        holdout=report,
        notes=len(cal_idx),
        patients=len({notes[i].effective_patient_id for i in cal_idx}),
    )
    if result.below_floor:
        if not force:
            raise CalibrationRefused(result.refusal() or "calibration refused")
        result.forced = True
    return result


def _holdout_split(notes: Sequence[Note], holdout: float, seed: int) -> tuple[list[int], list[int]]:
    """Indices of the calibration and held-out notes, patient-disjoint."""
    if holdout == 0.0:
        return list(range(len(notes))), []

    patients = sorted({n.effective_patient_id for n in notes})
    if len(patients) < 2:
        raise InputError(f"holding out {holdout:g} of the patients needs notes of at least 2 "
                         f"patients (got {len(patients)}); use holdout 0 to calibrate on all")
    sizes: dict[str, int] = {}
    for n in notes:
        sizes[n.effective_patient_id] = sizes.get(n.effective_patient_id, 0) + 1
    part = assign_units(sizes, [1.0 - holdout, holdout], seed)
    cal = [i for i, n in enumerate(notes) if part[n.effective_patient_id] == 0]
    held = [i for i, n in enumerate(notes) if part[n.effective_patient_id] == 1]
    return cal, held


def _check_holdout(
    held: _Notes,
    fixed: np.ndarray,
    pieces: dict[str, tuple[_Pieces, _Pieces | None]],
    members_labels: dict[str, dict[str, list[int]]],
    idx: dict[Coord, int],
    rule: AggregateRule,
    patients: int,
) -> HoldoutReport:
    votes = fixed.copy()
    for name, (_, ph) in pieces.items():
        assert ph is not None
        per_label = np.zeros(max(len(ph.labels), 1))
        for g, labs in members_labels[name].items():
            per_label[labs] = GRID[idx[(name, g)]]
        mask = ph.phi >= per_label[ph.label] if len(ph.phi) else np.zeros(0, dtype=bool)
        votes += rule.weight(name) * ph.flags(held, mask)
    pred = votes >= rule.k
    tp = int((pred & held.gold).sum())
    fp = int((pred & ~held.gold).sum())
    n_gold = int(held.gold.sum())
    return HoldoutReport(
        patients=patients,
        notes=len(held.notes),
        tokens=len(held.gold),
        phi_tokens=n_gold,
        recall=tp / n_gold if n_gold else None,
        precision=tp / (tp + fp) if tp + fp else 1.0,
    )
