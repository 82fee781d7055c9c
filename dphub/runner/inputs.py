"""Inputs of a de-identification run: one :class:`WorkItem` per note, failures kept per note.

Why a module of its own: a run reads a directory of ``.txt`` files (one file at a time, so one
undecodable file fails alone), a ``.jsonl`` file (one record per line) or any corpus format of
:mod:`dphub.formats`, and turns each note into a work item with a stable key (relative path,
line number or note id), its position, and a safe relative output path; a note that cannot be
read becomes an item with a PHI-free error instead of stopping the run. Inputs are opened
read-only and never modified. Patient ids from note ids (``--patient-id-from``) are given here.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dphub import formats
from dphub.errors import ConfigError, DphubError, InputError
from dphub.formats._base import read_settings, read_sidecar
from dphub.notes import Note
from dphub.runner.state import RUN_DIR

#: Longest output file name component (bytes) before it is shortened with a digest; file systems
#: refuse names over 255 bytes, and the atomic writer adds a prefix and a suffix.
MAX_NAME_BYTES = 180


# ---------------------------------------------------------------------------- input
@dataclass
class WorkItem:
    """One unit of work: its stable key, its position, the note (or why it cannot be read)."""

    key: str
    index: int
    note: Note | None
    error: str | None = None
    stem: str | None = None  # output path without suffix, relative to OUT


def _short_name(part: str) -> str:
    """A file name component within :data:`MAX_NAME_BYTES`, kept unique by a digest when cut."""
    raw = part.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_NAME_BYTES:
        return part
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return raw[: MAX_NAME_BYTES - 17].decode("utf-8", "ignore") + "-" + digest


def _safe_stem(note_id: str) -> str:
    """A relative output path for a note id (no absolute paths, no ``..``, no overlong names)."""
    parts = [p for p in re.split(r"[\\/]+", note_id) if p not in ("", ".", "..")]
    parts = [_short_name(re.sub(r"[^\w.@+-]", "_", p)) for p in parts]
    return "/".join(parts) or "note"


def os_reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


#: what a note that does not decode is told (issue 56: name the option that fixes it)
ENCODING_HINT = "if the notes are in another encoding, pass it with --encoding (e.g. cp1252)"


def _encoding_name(encoding: str) -> str:
    return "UTF-8" if encoding == "utf-8" else encoding


def _iter_txt_dir(root: Path) -> Iterator[WorkItem]:
    files = sorted(p for p in root.rglob("*.txt") if p.is_file() and RUN_DIR not in p.parts)
    for i, f in enumerate(files):
        rel = f.relative_to(root).as_posix()
        stem = rel[: -len(".txt")]
        try:
            data = f.read_bytes()
        except OSError as e:  # permissions, a vanished file, an I/O error: this note alone
            yield WorkItem(rel, i, None, f"{rel}: cannot read ({os_reason(e)})", stem)
            continue
        encoding = read_settings().encoding
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError as e:
            yield WorkItem(rel, i, None, f"{rel}: not valid {_encoding_name(encoding)} (byte "
                           f"{e.start}); {ENCODING_HINT}", stem)
            continue
        # a BOM is kept, as the text format and brat read it: offsets count the file's code
        # points exactly, so spans of this run and a gold read from the same files agree
        try:  # the patient id of a .meta.json sidecar, as the text format reads it
            side = read_sidecar(f)
        except (DphubError, OSError, UnicodeDecodeError):
            yield WorkItem(rel, i, None, f"{rel}: its .meta.json sidecar cannot be read (expected "
                           '{"patient_id": "...", "metadata": {...}})', stem)
            continue
        patient, metadata = side if side is not None else (None, {})
        yield WorkItem(rel, i, Note(id=stem, text=text, patient_id=patient, metadata=metadata),
                       None, stem)


def patient_pattern(pattern: str | None) -> re.Pattern[str] | None:
    """``--patient-id-from``: a regular expression with at most one group, or a ConfigError."""
    if pattern is None:
        return None
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise ConfigError(f"--patient-id-from is not a valid regular expression ({e.msg})") from None
    if rx.groups > 1:
        raise ConfigError("--patient-id-from may hold one group (the patient id), not "
                          f"{rx.groups}; make the others non-capturing: (?:...)")
    return rx


def with_patients(items: Iterator[WorkItem], rx: re.Pattern[str] | None,
                   warn: Callable[[str], None] | None) -> Iterator[WorkItem]:
    """Give notes without a patient id one from ``rx`` (searched in the note id's file name, or
    in the whole relative id when the pattern names a ``/``), and warn once, through ``warn``,
    when notes stay without one (each is then its own patient).

    Why: surrogates and date shifts are consistent per patient; a folder of ``.txt`` has no
    patients, so the same person got two names and dates moving both ways across two files.
    A note the pattern does not match fails alone (a silent fallback would bring that back).
    """
    warned = False
    for it in items:
        note = it.note
        if note is not None and note.patient_id is None:
            if rx is not None:
                where = note.id if "/" in rx.pattern else note.id.rsplit("/", 1)[-1]
                m = rx.search(where)
                if m is None or not (m.group(1) if rx.groups else m.group(0)):
                    it = WorkItem(it.key, it.index, None, f"{it.key}: --patient-id-from "
                                  "does not match its id (no patient id)", it.stem)
                else:
                    note.patient_id = m.group(1) if rx.groups else m.group(0)
            elif warn is not None and not warned:
                warned = True
                warn("warning: the input has notes without a patient id; each such note is its "
                     "own patient, so a person mentioned in two notes gets two surrogates and "
                     "two date shifts. Give patient ids with --patient-id-from REGEX (its group "
                     "taken from the file name, e.g. '^(\\d+)-'), a .meta.json sidecar "
                     '{"patient_id": ...} beside each .txt, or a patient_id field in JSONL.')
        yield it


def _encodable(obj: Any) -> bool:
    """Whether a decoded JSON value can be written back as UTF-8 (no lone surrogates)."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, ValueError, TypeError):
        return False
    return True


def _iter_jsonl(path: Path) -> Iterator[WorkItem]:
    with open(path, "rb") as fh:
        for i, raw in enumerate(fh):
            lineno = i + 1
            key = f"line {lineno}"
            if not raw.strip():
                continue
            encoding = read_settings().encoding
            try:
                rec = json.loads(raw.decode(encoding))
            except UnicodeDecodeError:
                yield WorkItem(key, i, None, f"{path.name} line {lineno}: not valid "
                               f"{_encoding_name(encoding)}; {ENCODING_HINT}")
                continue
            except json.JSONDecodeError as e:
                yield WorkItem(key, i, None, f"{path.name} line {lineno}: not valid JSON "
                               f"(column {e.colno})")
                continue
            except RecursionError:
                yield WorkItem(key, i, None, f"{path.name} line {lineno}: JSON nested too deeply")
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                yield WorkItem(key, i, None, f"{path.name} line {lineno}: record needs a 'text' string")
                continue
            if not _encodable(rec):
                # json.loads accepts "\ud800"; no UTF-8 output can hold it
                yield WorkItem(key, i, None, f"{path.name} line {lineno}: holds a lone surrogate "
                               "escape (\\ud800-\\udfff), which is not valid Unicode text")
                continue
            meta = rec.get("meta") if isinstance(rec.get("meta"), dict) else {}
            note_id = rec.get("id") or meta.get("note_id") or str(lineno)
            metadata = rec.get("metadata") if isinstance(rec.get("metadata"), dict) else {}
            patient = rec.get("patient_id")
            note = Note(id=str(note_id), text=rec["text"],
                        patient_id=None if patient is None else str(patient), metadata=metadata)
            yield WorkItem(key, i, note, None, _safe_stem(str(note_id)))


def _iter_format(path: Path, fmt: str | None) -> Iterator[WorkItem]:
    for i, (key, note, error) in enumerate(formats.read_each(path, format=fmt)):
        if note is None:
            yield WorkItem(key, i, None, error, None)
        else:
            yield WorkItem(note.id, i, note, None, _safe_stem(note.id))


def input_layout(path: Path, fmt: str | None) -> str:
    """``txt`` (directory of .txt), ``jsonl`` (one JSONL file) or ``corpus`` (formats.read)."""
    if (fmt in (None, "text") and path.is_dir() and any(path.rglob("*.txt"))
            and (fmt == "text" or not any(path.rglob("*.ann")))):
        return "txt"
    if fmt in (None, "jsonl") and path.is_file() and path.suffix.lower() in (".jsonl", ".ndjson"):
        return "jsonl"
    if fmt == "jsonl" and path.is_file():
        return "jsonl"
    return "corpus"


def count_input(path: Path, layout: str) -> int | None:
    """How many notes there are, cheaply (for the progress bar); None when unknown."""
    if layout == "txt":
        return sum(1 for p in path.rglob("*.txt") if p.is_file() and RUN_DIR not in p.parts)
    if layout == "jsonl":
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    return None


def check_input(path: Path) -> None:
    """Refuse an input that is not a readable directory or regular file, saying what it is.

    ``Path.exists`` answers False for a symbolic link loop, and a FIFO "exists" but would block
    the reader forever: both used to end as "input not found" (or a hang).
    """
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError(f"{path}: symbolic link loop") from None
        if e.errno == errno.ENOENT:
            what = "broken symbolic link" if os.path.lexists(path) else "input not found"
            raise InputError(f"{path}: {what}") from None
        raise InputError(f"{path}: cannot read ({os_reason(e)})") from None
    mode = st.st_mode
    if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
        return
    kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file")
    raise InputError(f"{path}: not a regular file or directory ({kind})")


def iter_input(path: Path, fmt: str | None = None) -> Iterator[WorkItem]:
    check_input(path)
    layout = input_layout(path, fmt)
    if layout == "txt":
        return _iter_txt_dir(path)
    if layout == "jsonl":
        return _iter_jsonl(path)
    return _iter_format(path, fmt)


def printable_key(it: WorkItem) -> WorkItem:
    """A note whose key or id cannot be encoded (POSIX hands an undecodable file name over with
    lone surrogates) cannot be printed, journaled or audited: it fails alone, under an escaped
    key."""
    try:
        it.key.encode("utf-8")
        if it.note is not None:
            it.note.id.encode("utf-8")
        return it
    except UnicodeEncodeError:
        pass
    try:  # the file name's own bytes, shown as \xNN
        key = it.key.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        key = escaped(it.key)
    return WorkItem(key, it.index, None, f"{key}: the file name is not valid UTF-8; rename it")


def escaped(s: str) -> str:
    """``s`` printable as UTF-8 (lone surrogates from odd file names shown as escapes)."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")
