"""Choosing per-member thresholds on the owner's labelled notes for a target ensemble recall.

Why on the ensemble: the union rule means a member may be precise as long as the others cover
what it misses, so thresholds are chosen jointly for the *ensemble's* token-binary recall (the
i2b2 tokenization of :mod:`dphub.evaluate`: runs of letters/digits; a token is PHI when a span
overlaps it).

Cost: every model member runs once (``token_scores``); each candidate threshold is then applied to
the cached scores (:func:`dphub.scores.spans_from_scores`) and reduced to a boolean vector over
all evaluation tokens, so the search only adds and compares vectors. Non-model members (rules)
keep their threshold.

Search (documented heuristic, not an exhaustive optimum):

1. start every model member at the highest grid threshold (most precise);
2. greedy descent: while the ensemble recall is below the target, lower ONE member by one grid
   step, the move that gains the most true-positive tokens per false-positive token added;
3. coordinate ascent: for each member, raise its threshold as far as the target recall still
   holds if that improves precision; repeat until nothing changes.

If the target cannot be reached even with every member at the lowest grid threshold, the lowest
thresholds are returned with ``reached = False``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dphub.ensemble.core import Ensemble
from dphub.ensemble.members import ModelMember
from dphub.errors import ConfigError, InputError
from dphub.evaluate import TOKEN_RE
from dphub.notes import Note, Span

#: candidate thresholds on P(not O), most precise first
GRID: tuple[float, ...] = (
    0.95, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.15, 0.1, 0.07, 0.05, 0.03, 0.02, 0.01, 0.005,
    0.002, 0.001,
)


@dataclass
class CalibrationResult:
    thresholds: dict[str, float]
    recall: float
    precision: float
    target_recall: float
    reached: bool
    tokens: int
    phi_tokens: int


def _token_bounds(notes: Sequence[Note]) -> list[np.ndarray]:
    return [
        np.array([m.span() for m in TOKEN_RE.finditer(n.text)], dtype=np.int64).reshape(-1, 2)
        for n in notes
    ]


def _flags(bounds: Sequence[np.ndarray], spans_per_note: Sequence[Sequence[Span]]) -> np.ndarray:
    """One boolean per evaluation token (all notes concatenated): does any span overlap it?"""
    out = []
    for b, spans in zip(bounds, spans_per_note, strict=True):
        f = np.zeros(len(b), dtype=bool)
        if len(b) and spans:
            starts, ends = b[:, 0], b[:, 1]
            for s in spans:
                f |= (starts < s.end) & (ends > s.start)
        out.append(f)
    return np.concatenate(out) if out else np.zeros(0, dtype=bool)


def calibrate(
    ensemble: Ensemble,
    notes: Sequence[Note],
    target_recall: float = 0.99,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> CalibrationResult:
    """Per-member thresholds reaching ``target_recall`` at the best precision found.

    ``progress(done, total)`` is called after each member has scored the notes (the long part;
    the CLI shows it).
    """
    if not 0.0 < target_recall <= 1.0:
        raise ConfigError(f"target recall must be in (0, 1] (got {target_recall})")
    notes = list(notes)
    if not notes or not all(n.labelled for n in notes):
        raise InputError("calibration needs labelled notes (gold spans)")
    bounds = _token_bounds(notes)
    gold = _flags(bounds, [n.spans for n in notes])
    if not gold.any():
        raise InputError("the labelled notes contain no PHI; nothing to calibrate on")
    k = ensemble.rule.k
    fixed_votes = np.zeros(len(gold), dtype=np.int32)
    options: dict[str, list[np.ndarray]] = {}  # member -> flags per GRID index
    for done, slot in enumerate(ensemble.slots, start=1):
        m = slot.member
        if isinstance(m, ModelMember):
            scores = m.token_scores(notes)
            options[slot.name] = [_flags(bounds, m.spans_from(scores, t)) for t in GRID]
        else:
            fixed_votes += _flags(bounds, m.tag(notes, threshold=slot.threshold))
        if progress is not None:
            progress(done, len(ensemble.slots))
    if not options:
        raise ConfigError("the ensemble has no model members: nothing to calibrate")
    names = list(options)
    n_gold = int(gold.sum())

    def score(idx: dict[str, int]) -> tuple[float, float, int, int]:
        votes = fixed_votes.copy()
        for n in names:
            votes += options[n][idx[n]]
        pred = votes >= k
        tp = int((pred & gold).sum())
        fp = int((pred & ~gold).sum())
        recall = tp / n_gold
        precision = tp / (tp + fp) if tp + fp else 1.0
        return recall, precision, tp, fp

    idx = {n: 0 for n in names}
    rec, prec, tp, fp = score(idx)
    while rec < target_recall:
        best: tuple[float, float, str] | None = None
        for n in names:
            if idx[n] + 1 >= len(GRID):
                continue
            trial = dict(idx, **{n: idx[n] + 1})
            _, _, tp2, fp2 = score(trial)
            gain = (tp2 - tp) / (fp2 - fp + 1.0)
            cand = (gain, tp2 - tp, n)
            if best is None or cand[:2] > best[:2]:
                best = cand
        if best is None:
            break
        idx[best[2]] += 1
        rec, prec, tp, fp = score(idx)
    reached = rec >= target_recall
    if reached:
        changed = True
        while changed:
            changed = False
            for n in names:
                for j in range(idx[n]):  # higher thresholds first
                    trial = dict(idx, **{n: j})
                    r2, p2, tp2, fp2 = score(trial)
                    if r2 >= target_recall and p2 > prec:
                        idx, rec, prec, tp, fp = trial, r2, p2, tp2, fp2
                        changed = True
                        break
    return CalibrationResult(
        thresholds={n: GRID[idx[n]] for n in names},
        recall=rec,
        precision=prec,
        target_recall=target_recall,
        reached=reached,
        tokens=len(gold),
        phi_tokens=n_gold,
    )
