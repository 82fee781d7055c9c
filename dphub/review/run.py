"""A finished de-identification run read back for review: notes, audit spans, gold, counts.

Why here and not in the page: the page (:mod:`dphub.review.page`) and the server
(:mod:`dphub.review.server`) only render what this module computes, so the tests check the
numbers without a browser. The run's ``audit.jsonl`` is matched to the input notes by the
runner's own keys (:func:`dphub.runner.iter_input`: a relative path, ``line N`` or a note id),
the same reading ``ensemble deid`` did, so every offset lands on the text the members read.

Errors name files, keys and note ids, never text.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dphub.ensemble.aggregate import span_members
from dphub.ensemble.words import WORD_RE
from dphub.errors import DphubError, InputError
from dphub.evaluate import evaluate_spans
from dphub.formats import read as read_notes
from dphub.io import jsonl_lines, read_small_file
from dphub.labels import CATEGORIES, UNTYPED, category_of
from dphub.notes import Note, Span
from dphub.review.doubt import Doubt, doubt_order, note_doubt, span_disagrees, span_near
from dphub.runner import AUDIT, PARAMS, RUN_DIR, WorkItem, input_layout, iter_input
from dphub.runner.state import note_digest, note_digest_key, note_key_fingerprint

#: the largest run.json read (it holds settings, not notes)
_PARAMS_CAP = 1 << 20
#: categories a span can show: HIPAA's plus the inverse rule's untyped PHI
SHOWN_CATEGORIES = (*CATEGORIES, UNTYPED)
#: output modes whose files hold the released text (spans and brat hold annotations)
TEXT_MODES = ("tag", "redact", "surrogate")
#: the largest output file read to show the released text beside a note
_RELEASED_CAP = 64 << 20


@dataclass
class ReviewNote:
    """One note of the run: its text, its hidden spans (audit), gold misses, its doubt."""

    key: str
    id: str
    text: str
    spans: list[dict[str, Any]]
    doubt: Doubt
    misses: list[dict[str, Any]] = field(default_factory=list)
    patient_id: str | None = None
    #: the text the run's output file holds for this note (None: not text, or not found)
    released: str | None = None
    #: an inverse run's kept words per release path (``audit.jsonl``'s ``kept``; None otherwise)
    kept: dict[str, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"key": self.key, "id": self.id, "text": self.text, "spans": self.spans,
               "misses": self.misses, "doubt": self.doubt.to_dict(),
               "released": self.released}
        if self.kept is not None:
            out["kept"] = self.kept
        return out


@dataclass
class Review:
    """Everything the page shows, in the order of doubt (:mod:`dphub.review.doubt`)."""

    run_dir: Path
    rule: str
    members: list[str]
    thresholds: dict[str, float]
    notes: list[ReviewNote]
    scores: dict[str, Any] | None = None
    #: every note's text matched the run's keyed digest (False: a run without digests)
    checked: bool = False
    #: the run's random id (``run.json``; None for runs of an older dphub)
    run_id: str | None = None
    #: where the released text comes from (``{"mode", "path"}``, ``"why"`` when it is not shown)
    release: dict[str, Any] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Hidden spans per category over the run (categories without a span left out)."""
        c = Counter(s["category"] for n in self.notes for s in n.spans)
        return {cat: c[cat] for cat in SHOWN_CATEGORIES if c[cat]}

    def words(self) -> dict[str, int]:
        """Words of the run (letter/digit runs) and how many of them no span hides."""
        total = kept = 0
        for n in self.notes:
            hidden = np.zeros(len(n.text) + 1, dtype=bool)
            for s in n.spans:
                hidden[s["start"] : s["end"]] = True
            for m in WORD_RE.finditer(n.text):
                total += 1
                kept += not hidden[m.start() : m.end()].any()
        return {"total": total, "kept": kept}

    def note(self, key: str) -> ReviewNote:
        for n in self.notes:
            if n.key == key:
                return n
        raise InputError(f"no note {key!r} in this run")

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": {"name": self.run_dir.name, "rule": self.rule, "members": self.members,
                    "thresholds": self.thresholds, "checked": self.checked},
            "release": self.release,
            "categories": list(SHOWN_CATEGORIES),
            "label_categories": list(CATEGORIES),
            "counts": self.counts(),
            "words": self.words(),
            "scores": self.scores,
            "notes": [n.to_dict() for n in self.notes],
        }


def _params(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_DIR / PARAMS
    try:
        raw = read_small_file(path, _PARAMS_CAP, what="the run's settings")
    except FileNotFoundError:
        raise InputError(f"{run_dir}: not a de-identification run (no {RUN_DIR}/{PARAMS}); "
                         "give the --out DIR of `dphub ensemble deid`") from None
    try:
        params = json.loads(raw)
    except (ValueError, RecursionError):
        raise InputError(f"{path}: not valid JSON") from None
    if not isinstance(params, dict) or not isinstance(params.get("settings"), dict):
        raise InputError(f"{path}: not a run's settings")
    if params.get("status") != "complete":
        raise InputError(f"{run_dir}: the run is not finished (finish it with "
                         "`dphub ensemble deid ... --resume`)")
    return params


def _digest_key(run_dir: Path, params: Mapping[str, Any]) -> bytes | None:
    """The key of the audit's note digests (None: the run made none, an older dphub)."""
    fingerprint = params.get("note_key")
    if fingerprint is None:
        return None
    key = note_digest_key(create=False)
    if key is None or note_key_fingerprint(key) != fingerprint:
        raise InputError(f"{run_dir}: was run by another user (or with another DPHUB_HOME), "
                         "whose key made its note digests, so --notes cannot be checked "
                         "against the text the run read here; review it as that user")
    return key


def _members(settings: Mapping[str, Any]) -> tuple[str, list[str], dict[str, float]]:
    ens = settings.get("ensemble") or {}
    names: list[str] = []
    thresholds: dict[str, float] = {}
    for row in ens.get("members") or ():
        if not isinstance(row, list) or not row or not isinstance(row[0], str):
            raise InputError("the run's settings list a member without a name")
        names.append(row[0])
        if len(row) > 2 and isinstance(row[2], int | float) and not isinstance(row[2], bool):
            thresholds[row[0]] = float(row[2])
    return str(ens.get("rule", "")), names, thresholds


def _audit(run_dir: Path) -> dict[str, dict[str, Any]]:
    path = run_dir / AUDIT
    if not path.is_file():
        raise InputError(f"{run_dir}: no {AUDIT} (give the --out DIR of a finished run)")
    out: dict[str, dict[str, Any]] = {}
    # "\n" only: with --audit-text a record holds note text, raw U+2028/U+0085 included
    for lineno, line in jsonl_lines(path):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            raise InputError(f"{path}:{lineno}: not valid JSON") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("key"), str) \
                or not isinstance(rec.get("spans"), list):
            raise InputError(f"{path}:{lineno}: not an audit record")
        out[rec["key"]] = rec
    return out


def _span(d: Any, text_len: int, where: str, members: Sequence[str]) -> dict[str, Any]:
    try:
        start, end, label = int(d["start"]), int(d["end"]), str(d["label"])
        voters = span_members(d)
        score = None if d.get("score") is None else float(d["score"])
    except (KeyError, TypeError, ValueError):
        raise InputError(f"{where}: a span without start, end and label") from None
    if not 0 <= start < end <= text_len:
        raise InputError(f"{where}: a span [{start}, {end}) outside the note's {text_len} "
                         "characters (were these the notes the run read?)")
    out = {"start": start, "end": end, "label": label, "category": category_of(label),
           "members": voters, "score": score, "inverse": not voters,
           "disagree": span_disagrees(voters, members), "gold": None}
    if isinstance(d.get("hidden_by"), list):  # an inverse run: members and/or the rule
        out["hidden_by"] = [str(v) for v in d["hidden_by"]]
    return out


def _ranges(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _mark_gold(note: ReviewNote, gold: Note) -> None:
    """Spans no gold character overlaps become false positives; gold characters no span hides
    become misses (labelled with the gold span's label)."""
    n = len(note.text)
    gold_mask = np.zeros(n, dtype=bool)
    for g in gold.spans:
        gold_mask[g.start : g.end] = True
    pred_mask = np.zeros(n, dtype=bool)
    for s in note.spans:
        pred_mask[s["start"] : s["end"]] = True
        s["gold"] = "tp" if gold_mask[s["start"] : s["end"]].any() else "fp"
    for a, b in _ranges(gold_mask & ~pred_mask):
        # a miss is what leaks: the blank between two hidden words is not one (issue 54: 9 of
        # 32 "misses" were such blanks, shown in red and impossible to mark)
        while a < b and note.text[a].isspace():
            a += 1
        while b > a and note.text[b - 1].isspace():
            b -= 1
        if a == b:
            continue
        label = next((g.label for g in gold.spans if g.start < b and a < g.end), UNTYPED)
        note.misses.append({"start": a, "end": b, "label": label,
                            "category": category_of(label)})


def load_review(run_dir: Path, notes_path: Path, *, gold_path: Path | None = None,
                fmt: str | None = None) -> Review:
    """Read a finished run (``--out DIR`` of ``ensemble deid``) with its input notes.

    ``fmt`` is the notes' format when it cannot be detected (as for ``deid --format``);
    ``gold_path`` adds misses, false positives and the scores (:func:`dphub.evaluate`).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: not a directory (give the --out DIR of a finished run)")
    params = _params(run_dir)
    settings = params["settings"]
    key = _digest_key(run_dir, params)
    rule, members, thresholds = _members(settings)
    audit = _audit(run_dir)
    notes: list[ReviewNote] = []
    items: list[WorkItem] = []
    for item in iter_input(Path(notes_path), fmt or settings.get("format")):
        rec = audit.pop(item.key, None)
        # a finished run read every note of its input: one it did not audit, or one that no
        # longer reads, means --notes is not its input (it was shown nowhere and counted nowhere)
        if rec is None:
            raise InputError(f"{notes_path}: {item.key} is not in the run's {AUDIT} (the run "
                             "read other notes); give the notes the run read")
        if item.note is None:
            raise InputError(f"{notes_path}: {item.key} was read by the run but no longer "
                             f"reads ({item.error}); give the notes the run read")
        note = item.note
        if rec.get("id") != note.id:
            raise InputError(f"{item.key}: the run's audit names note {rec.get('id')!r}, the "
                             f"notes {note.id!r} (were these the notes the run read?)")
        if key is not None and rec.get("text_hmac") != note_digest(key, note.text):
            raise InputError(f"{item.key}: note {note.id} is not the text the run read (its "
                             "digest differs: edited, re-encoded or another file?); give the "
                             "notes the run read")
        where = f"{AUDIT}, {item.key}"
        spans = sorted((_span(d, len(note.text), where, members) for d in rec["spans"]),
                       key=lambda s: (s["start"], s["end"]))
        for s in spans:  # the page marks spans whose score lies near a voter's threshold
            s["near"] = round(span_near(s["members"], s["score"], thresholds), 3)
        items.append(item)
        kept = rec.get("kept")
        notes.append(ReviewNote(item.key, note.id, note.text, spans,
                                note_doubt(spans, members, thresholds),
                                patient_id=note.patient_id,
                                kept={str(k): int(v) for k, v in kept.items()
                                      if isinstance(v, int) and not isinstance(v, bool)}
                                if isinstance(kept, dict) else None))
    if audit:
        raise InputError(f"{len(audit)} audited note(s) are not in {notes_path} (first: "
                         f"{next(iter(audit))}); give the notes the run read")
    if not notes:
        raise InputError(f"{run_dir}: no note to review")
    release = _released(run_dir, settings, Path(notes_path), fmt or settings.get("format"),
                        items, notes)
    order = doubt_order([n.doubt for n in notes])
    notes = [notes[i] for i in order]
    if isinstance(params.get("notes"), int) and params["notes"] != len(notes):
        raise InputError(f"{run_dir}: the run read {params['notes']} notes, {notes_path} holds "
                         f"{len(notes)}; give the notes the run read")
    scores = _gold(notes, gold_path) if gold_path is not None else None
    return Review(run_dir, rule, members, thresholds, notes, scores, checked=key is not None,
                  run_id=params.get("run_id") if isinstance(params.get("run_id"), str) else None,
                  release=release)


def _released(run_dir: Path, settings: Mapping[str, Any], notes_path: Path, fmt: str | None,
              items: Sequence[WorkItem], notes: Sequence[ReviewNote]) -> dict[str, Any]:
    """Fill each note's ``released`` from the run's output files (what was handed out, read
    back, not re-rendered: a surrogate run's key is not needed and the page cannot differ from
    the file); returns ``{"mode", "path"}`` and ``"why"`` when some or all are not shown.

    The runner's layout (:mod:`dphub.runner`): a JSONL input gives one JSONL output named like
    the input, records in input order; other inputs give ``OUT/<stem>.txt`` per note."""
    mode = settings.get("mode")
    info: dict[str, Any] = {"mode": mode}
    if mode not in TEXT_MODES:
        return {**info, "why": f"this run's output ({mode} mode) holds annotations, not text: "
                "nothing released to show"}
    missing = 0
    if input_layout(notes_path, fmt) == "jsonl":
        src = settings.get("input")
        path = run_dir / (Path(src).name if isinstance(src, str) else notes_path.name)
        info["path"] = str(path)
        texts = _jsonl_texts(path)
        for i, note in enumerate(notes):  # records in input order, as ``notes`` still are
            rec = texts[i] if texts is not None and i < len(texts) else None
            if rec is not None and rec[0] == note.id:
                note.released = rec[1]
            else:
                missing += 1
    else:
        info["path"] = str(run_dir)
        for item, note in zip(items, notes, strict=True):
            note.released = _read_text(run_dir / f"{item.stem}.txt") if item.stem else None
            missing += note.released is None
    if missing:
        info["why"] = (f"{missing} of {len(notes)} note(s) have no released text in "
                       f"{info['path']} (moved, renamed or unreadable)")
    return info


def _read_text(path: Path) -> str | None:
    try:
        return read_small_file(path, _RELEASED_CAP, what="an output file").decode("utf-8")
    except (OSError, UnicodeDecodeError, DphubError):
        return None


def _jsonl_texts(path: Path) -> list[tuple[str, str] | None] | None:
    """(id, text) of each record of the run's JSONL output, in order (None: unreadable)."""
    out: list[tuple[str, str] | None] = []
    try:
        for _, line in jsonl_lines(path):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                out.append(None)
                continue
            ok = isinstance(rec, dict) and isinstance(rec.get("text"), str)
            out.append((str(rec.get("id")), rec["text"]) if ok else None)
    except (OSError, DphubError):
        return None
    return out


def _gold(notes: Sequence[ReviewNote], gold_path: Path) -> dict[str, Any]:
    if not Path(gold_path).exists():
        raise InputError(f"{gold_path}: not found")
    by_id = {n.id: n for n in notes}
    gold: list[Note] = []
    for g in read_notes(gold_path):
        if g.id not in by_id:
            continue
        if not g.labelled:
            raise InputError(f"{gold_path}: note {g.id} carries no gold annotations")
        if g.text != by_id[g.id].text:
            raise InputError(f"{gold_path}: note {g.id} differs from the run's note")
        gold.append(g)
        _mark_gold(by_id[g.id], g)
    if not gold:
        raise InputError(f"{gold_path}: no note of the run is in it")
    pred = {g.id: [Span(s["start"], s["end"], s["label"]) for s in by_id[g.id].spans]
            for g in gold}
    result = evaluate_spans(gold, pred)
    return {"notes": len(gold), **result.headline(),
            "non_phi_tokens_kept": result.utility["non_phi_tokens_kept"],
            "leaks": len(result.leaks)}
