"""A finished run over notes with real-world text, for the review tests of issue 54.

Made here (synthetic): emoji (outside the BMP: two UTF-16 units each) before and between the
spans, U+2028/U+2029/U+0085 separators, CRLF, combining marks, an RLM and a NUL. One fixed member
hides names and phone numbers; the gold adds a missed place after the emoji.
"""

from __future__ import annotations

import json
from pathlib import Path

from dphub.ensemble import Ensemble, FixedMember
from dphub.ensemble.core import Slot
from dphub.notes import Span
from dphub.runner import run_deid

TEXTS = {
    "a": "\U0001F600\U0001F4A5 Call Yolanda Brisbee \U0001F600 at 555-0134 from Quarrytown.",
    "b": "Note\u2028Seen by Quinby Marlowe\u2029 \U0001F9D1\u200d\u2695\ufe0f at\u0085 "
         "Elmsworth Clinic\r\nthen Quarrytown.",
    "c": "Cafe\u0301 \U0001D11E \u200fname: Ysolde Crane\x00 phone 555-0199 \U0001F600 Quarrytown",
}
HIDDEN = {"a": [("Yolanda Brisbee", "NAME"), ("555-0134", "PHONE")],
          "b": [("Quinby Marlowe", "DOCTOR"), ("Elmsworth Clinic", "HOSPITAL")],
          "c": [("Ysolde Crane", "NAME"), ("555-0199", "PHONE")]}


def at(note: str, phrase: str) -> tuple[int, int]:
    """Code point offsets of ``phrase`` in note ``note`` (dphub's unit)."""
    i = TEXTS[note].index(phrase)
    return i, i + len(phrase)


def u16(note: str, cp: int) -> int:
    """The UTF-16 offset of code point offset ``cp`` (what the browser counts)."""
    return len(TEXTS[note][:cp].encode("utf-16-le")) // 2


def js_slice(text: str, a: int, b: int) -> str:
    """``text.slice(a, b)`` as JavaScript computes it (UTF-16 units)."""
    return text.encode("utf-16-le")[2 * a : 2 * b].decode("utf-16-le")


def make_run(root: Path) -> tuple[Path, Path, Path]:
    """(run dir, notes JSONL, gold JSONL) under ``root``."""
    notes = root / "notes.jsonl"
    notes.write_text("".join(json.dumps({"id": k, "text": t, "patient_id": f"p-{k}"},
                                        ensure_ascii=False) + "\n" for k, t in TEXTS.items()),
                     encoding="utf-8")
    spans = {k: [Span(*at(k, p), lab, 0.9) for p, lab in v] for k, v in HIDDEN.items()}
    gold = root / "gold.jsonl"
    gold.write_text("".join(json.dumps(
        {"id": k, "text": t, "spans": [s.to_dict() for s in spans[k]]
         + [{"start": at(k, "Quarrytown")[0], "end": at(k, "Quarrytown")[1],
             "label": "LOCATION"}]}, ensure_ascii=False) + "\n" for k, t in TEXTS.items()),
        encoding="utf-8")
    out = root / "run"
    rep = run_deid(notes, out, Ensemble([Slot(FixedMember("m1", spans), threshold=0.5)]),
                   mode="tag", audit_text=True)
    assert rep.exit_code == 0, rep.errors
    return out, notes, gold
