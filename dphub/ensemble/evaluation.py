"""Members and their aggregate side by side on labelled notes (``dphub ensemble evaluate``).

Every member runs once; its own spans and the merged spans are scored with
:func:`dphub.evaluate.evaluate_spans`, so the table shows what each member adds to the union.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dphub.ensemble.core import Ensemble
from dphub.errors import InputError
from dphub.evaluate import evaluate_spans
from dphub.formats import read
from dphub.notes import Note


def read_labelled(path: Path | str, fmt: str | None = None) -> list[Note]:
    """Labelled notes from any corpus format (:mod:`dphub.formats`); JSONL is read here too."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: not found")
    notes = list(read(p, format=fmt))
    if not notes:
        raise InputError(f"{p}: no notes")
    if not all(n.labelled for n in notes):
        raise InputError(f"{p}: notes carry no gold annotations")
    return notes


def evaluate_ensemble(
    ensemble: Ensemble,
    notes: Sequence[Note],
    *,
    progress: Callable[[int, int], None] | None = None,
    chunk: int = 64,
) -> list[dict[str, Any]]:
    """One row per member and one for the aggregate: headline metrics, ε and privacy unit.

    ``progress(done, total)`` is called after each ``chunk`` of notes is tagged (the members
    tag notes independently, so chunking changes no result; it lets the CLI show progress).
    """
    notes = list(notes)
    per_note: list[Any] = []
    for i in range(0, len(notes), max(1, chunk)):
        per_note.extend(ensemble.member_spans(notes[i : i + chunk]))
        if progress is not None:
            progress(len(per_note), len(notes))
    rows: list[dict[str, Any]] = []
    for slot in ensemble.slots:
        pred = {n.id: spans[slot.name] for n, spans in zip(notes, per_note, strict=True)}
        res = evaluate_spans(notes, pred)
        rows.append({"name": slot.name, "epsilon": slot.epsilon, "unit": slot.unit,
                     "threshold": slot.threshold, **res.headline(),
                     "non_phi_tokens_kept": res.utility["non_phi_tokens_kept"]})
    merged = {
        n.id: [m.to_span() for m in ensemble.combine(n, spans)]
        for n, spans in zip(notes, per_note, strict=True)
    }
    res = evaluate_spans(notes, merged)
    eps = [s.epsilon for s in ensemble.slots]
    rows.append({
        "name": f"ensemble ({ensemble.rule})",
        # releasing predictions of several DP models composes: report the largest member ε
        # (each member was trained on different data) and mark unknowns
        "epsilon": None if any(e is None for e in eps) else max(eps),
        "unit": ",".join(sorted({s.unit for s in ensemble.slots if s.unit})) or None,
        "threshold": None,
        **res.headline(),
        # issue 36: what a reader keeps of the text beside what the rule finds
        "non_phi_tokens_kept": res.utility["non_phi_tokens_kept"],
    })
    return rows
