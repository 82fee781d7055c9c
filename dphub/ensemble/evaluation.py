"""Members and their aggregate side by side on labelled notes (``dphub ensemble evaluate``).

Every member runs once; its own spans and the merged spans are scored with
:func:`dphub.evaluate.evaluate_spans`, so the table shows what each member adds to the union.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dphub.ensemble.core import Ensemble
from dphub.errors import FormatError, InputError
from dphub.evaluate import evaluate_spans
from dphub.notes import Note, Span, check_spans


def read_labelled(path: Path | str, fmt: str | None = None) -> list[Note]:
    """Labelled notes from any corpus format (:mod:`dphub.formats`); JSONL is read here too."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: not found")
    try:
        from dphub.formats import read
    except ImportError:
        read = None  # type: ignore[assignment]
    if read is not None:
        notes = list(read(p, format=fmt))
    elif p.is_file() and (fmt == "jsonl" or p.suffix.lower() in (".jsonl", ".ndjson")):
        notes = []
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                spans = [Span(int(s["start"]), int(s["end"]), str(s["label"]))
                         for s in rec.get("spans", [])]
                text = rec["text"]
            except (ValueError, KeyError, TypeError):
                raise FormatError(f"{p.name} line {i}: not a JSONL note record") from None
            where = f"{p.name} line {i}"
            notes.append(Note(str(rec.get("id", i)), text, rec.get("patient_id"),
                              spans=check_spans(spans, len(text), where=where), labelled=True))
    else:
        raise InputError(f"{p}: cannot read this corpus (format support not installed)")
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
                     "threshold": slot.threshold, **res.headline()})
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
    })
    return rows
