"""JSON Lines (``jsonl``): one note per line, streamed.

Record (the robust-deid convention, plus what dphub notes carry)::

    {"id": "n1", "text": "...", "patient_id": "p1",
     "spans": [{"start": 0, "end": 4, "label": "PATIENT"}], "metadata": {...}}

The id may instead be ``meta.note_id`` and the patient id ``meta.patient_id``; the other ``meta``
keys become metadata. A record without ``spans`` is an unlabelled note; ``"spans": []`` is a
labelled note without PHI. Spans may carry ``text`` (checked against the slice), ``score`` and
``source`` (kept). Ids and patient ids may be strings or integers (read as strings). Blank lines
are skipped. The file is read one line at a time, so its size is not bounded by memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError, FormatError
from dphub.formats._base import (
    DEFAULT_OVERLAPS,
    FormatSpec,
    finish_spans,
    iter_lines,
    make_span,
    parse_int,
)
from dphub.io import atomic_open
from dphub.notes import Note, Span, lone_surrogate


def _ident(value: Any, *, what: str, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise FormatError(f"{where}: {what} must be a non-empty string")
    return str(value)


def parse_record(obj: Any, *, where: str, overlaps: str = DEFAULT_OVERLAPS) -> Note:
    """Turn one decoded JSON record into a note."""
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: expected a JSON object per line")
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise FormatError(f"{where}: 'meta' must be an object")
    raw_id = obj.get("id", meta.get("note_id"))
    if raw_id is None:
        raise FormatError(f"{where}: missing field 'id' (or 'meta.note_id')")
    note_id = _ident(raw_id, what="id", where=where)
    if "text" not in obj:
        raise FormatError(f"{where}: note {note_id}: missing field 'text'")
    text = obj["text"]
    if not isinstance(text, str):
        raise FormatError(f"{where}: note {note_id}: 'text' must be a string")
    raw_pid = obj.get("patient_id", meta.get("patient_id"))
    patient_id = None if raw_pid is None else _ident(raw_pid, what="patient_id", where=where)
    metadata = obj.get("metadata")
    if metadata is None:
        metadata = {k: v for k, v in meta.items() if k not in ("note_id", "patient_id")}
    elif not isinstance(metadata, dict):
        raise FormatError(f"{where}: note {note_id}: 'metadata' must be an object")
    for what, value in (("text", text), ("id", raw_id), ("patient_id", raw_pid),
                        ("metadata", metadata)):
        at = lone_surrogate(value)
        if at is not None:  # json.loads decodes a "\ud800" escape to one: no UTF-8 can hold it
            place = f" at offset {at}" if at >= 0 and what == "text" else ""
            raise FormatError(f"{where}: note {note_id}: '{what}' holds a lone surrogate "
                              f"escape{place} (\\ud800-\\udfff: not a Unicode character)")
    labelled = "spans" in obj
    raw_spans = obj.get("spans") or []
    if not isinstance(raw_spans, list):
        raise FormatError(f"{where}: note {note_id}: 'spans' must be a list")
    pairs: list[tuple[Span, str]] = []
    for k, sp in enumerate(raw_spans):
        sw = f"{where}: note {note_id} span #{k}"
        if not isinstance(sp, dict):
            raise FormatError(f"{sw}: expected an object")
        for key in ("start", "end", "label"):
            if key not in sp:
                raise FormatError(f"{sw}: missing field {key!r}")
        start = parse_int(sp["start"], what="start", where=sw)
        end = parse_int(sp["end"], what="end", where=sw)
        if not isinstance(sp["label"], str):
            raise FormatError(f"{sw}: 'label' must be a string")
        span = make_span(sp["label"], start, end, where=sw)
        score = sp.get("score")
        if score is not None:
            if isinstance(score, bool) or not isinstance(score, int | float):
                raise FormatError(f"{sw}: 'score' must be a number")
            span = Span(span.start, span.end, span.label, float(score), span.source)
        source = sp.get("source")
        if source is not None:
            span = Span(span.start, span.end, span.label, span.score, str(source))
        quoted = sp.get("text")
        if isinstance(quoted, str) and 0 <= start < end <= len(text) and quoted != text[start:end]:
            raise FormatError(f"{sw}: span text does not match the note at {start}-{end}")
        pairs.append((span, sw))
    spans = finish_spans(pairs, text, record=f"{where}: note {note_id}", overlaps=overlaps)
    return Note(id=note_id, text=text, patient_id=patient_id, metadata=metadata, spans=spans,
                labelled=labelled)


def read_jsonl(path: Path, *, overlaps: str = DEFAULT_OVERLAPS) -> Iterator[Note]:
    """Stream notes from a JSON Lines file, one line at a time."""
    for lineno, line in iter_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise FormatError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise FormatError(f"{where}: invalid JSON (nested too deeply)") from None
        yield parse_record(obj, where=where, overlaps=overlaps)


def note_record(note: Note) -> dict[str, Any]:
    """The JSON record of a note (fields it does not need are left out)."""
    rec: dict[str, Any] = {"id": note.id, "text": note.text}
    if note.patient_id is not None:
        rec["patient_id"] = note.patient_id
    if note.labelled or note.spans:
        rec["spans"] = [s.to_dict() for s in note.spans]
    if note.metadata:
        rec["metadata"] = note.metadata
    return rec


def write_jsonl(notes: Iterable[Note], path: Path, *, overwrite: bool = False) -> int:
    """Write notes as JSON Lines, streaming, atomically."""
    if path.exists() and not overwrite:
        raise ConfigError(f"{path}: already exists (pass overwrite to replace it)")
    n = 0
    with atomic_open(path, "w", newline="") as fh:
        for note in notes:
            try:
                line = json.dumps(note_record(note), ensure_ascii=False)
            except (TypeError, ValueError):
                raise FormatError(f"note {note.id}: metadata is not JSON-serializable") from None
            fh.write(line + "\n")
            n += 1
    return n


def sniff_jsonl(path: Path) -> bool:
    return path.is_file() and path.suffix in (".jsonl", ".ndjson")


JSONL = FormatSpec(
    name="jsonl",
    description='JSON Lines: {"id", "text", "patient_id"?, "spans"?, "metadata"?} per line',
    read=read_jsonl,
    write=write_jsonl,
    sniff=sniff_jsonl,
    suffixes=(".jsonl", ".ndjson"),
)
