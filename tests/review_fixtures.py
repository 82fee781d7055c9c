"""A tiny finished run for the review tests: synthetic notes, two fixed members that disagree.

Made here (no corpus): note ``x`` both members agree on, note ``y`` they disagree on, note ``z``
has nothing hidden. Member ``m2`` has threshold 0.5 and scores ``Elmsworth Clinic`` 0.6, near it.
"""

from __future__ import annotations

import json
from pathlib import Path

from dphub.ensemble import Ensemble, FixedMember
from dphub.ensemble.core import Slot
from dphub.notes import Span
from dphub.runner import run_deid

TEXTS = {
    "x": "Call Yolanda Brisbee at 555-0134 tomorrow.",
    "y": "Seen by Dr. Quinby Marlowe on 03/04/2021 at Elmsworth Clinic, then home.",
    "z": "Patient stable, no change overnight.",
}


def at(note: str, phrase: str) -> tuple[int, int]:
    i = TEXTS[note].index(phrase)
    return i, i + len(phrase)


def sp(note: str, phrase: str, label: str, score: float) -> Span:
    return Span(*at(note, phrase), label, score)


M1 = {"x": [sp("x", "Yolanda Brisbee", "NAME", 0.97), sp("x", "555-0134", "PHONE", 0.99)],
      "y": [sp("y", "Quinby Marlowe", "DOCTOR", 0.95), sp("y", "03/04/2021", "DATE", 0.9)]}
M2 = {"x": [sp("x", "Yolanda Brisbee", "NAME", 0.9), sp("x", "555-0134", "PHONE", 0.93)],
      "y": [sp("y", "Quinby Marlowe", "DOCTOR", 0.55),
            sp("y", "Elmsworth Clinic", "HOSPITAL", 0.6)]}
#: gold: the members' spans without the DATE (so it is a false positive) plus "home" (a miss)
GOLD = {"x": [sp("x", "Yolanda Brisbee", "NAME", 1), sp("x", "555-0134", "PHONE", 1)],
        "y": [sp("y", "Quinby Marlowe", "DOCTOR", 1), sp("y", "Elmsworth Clinic", "HOSPITAL", 1),
              sp("y", "home", "LOCATION-OTHER", 1)],
        "z": []}


def make_run(root: Path) -> tuple[Path, Path, Path]:
    """(run dir, notes JSONL, gold JSONL) under ``root``."""
    notes = root / "notes.jsonl"
    notes.write_text("".join(json.dumps({"id": k, "text": t, "patient_id": f"p-{k}"}) + "\n"
                             for k, t in TEXTS.items()))
    gold = root / "gold.jsonl"
    gold.write_text("".join(
        json.dumps({"id": k, "text": t, "spans": [s.to_dict() for s in GOLD[k]]}) + "\n"
        for k, t in TEXTS.items()))
    ens = Ensemble([Slot(FixedMember("m1", M1), threshold=0.5),
                    Slot(FixedMember("m2", M2), threshold=0.5)])
    out = root / "run"
    rep = run_deid(notes, out, ens, mode="tag")
    assert rep.exit_code == 0
    return out, notes, gold


def audit(run: Path) -> dict[str, list[dict]]:
    return {r["id"]: r["spans"] for r in map(json.loads, (run / "audit.jsonl").open())}


def leaks(text: str) -> bool:
    """Whether ``text`` holds a distinctive word of the notes (for logs and errors)."""
    return any(w in text for w in ("Yolanda", "Brisbee", "Quinby", "Marlowe", "Elmsworth",
                                   "0134", "overnight"))

