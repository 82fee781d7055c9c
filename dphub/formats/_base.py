"""Shared plumbing of the format readers and writers.

Every reader turns a corpus into a stream of :class:`~dphub.notes.Note`; every problem it finds is
a :class:`~dphub.errors.FormatError` whose message names the file and the line (or record) and the
offsets, never the note text: a malformed corpus is still a corpus of patients' notes, and error
messages end up in terminals, CI logs and bug reports.

This module holds what the format modules have in common: the registry entry type
(:class:`FormatSpec`), strict UTF-8 line iteration, span validation with a uniform overlap policy,
the ``.meta.json`` sidecar used by the one-file-per-note formats, and safe relative paths for
note ids.
"""

from __future__ import annotations

import codecs
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError, FormatError, InputError
from dphub.io import atomic_directory, atomic_write_text
from dphub.labels import CATEGORIES, is_known
from dphub.notes import Note, Span, check_spans

log = logging.getLogger("dphub.formats")

#: How readers treat overlapping gold spans. ``merge``: spans with the *same* label that overlap
#: are merged into one (real corpora carry such quirks, e.g. one PhysioNet note annotates
#: "X-Y" and "Y Z" as two Location phrases; merging keeps every PHI character covered); spans of
#: different labels that overlap are an error. ``error``: any overlap is an error. ``keep``: like
#: ``merge``, but same-label overlaps are kept as the source has them (for counting annotations;
#: consumers that need disjoint spans must not use it).
OVERLAP_POLICIES = ("merge", "error", "keep")
DEFAULT_OVERLAPS = "merge"

#: Suffix of the optional per-note sidecar of the one-file-per-note formats (brat, i2b2, text):
#: ``<note>.meta.json`` = ``{"patient_id": str | null, "metadata": {...}}``. It carries what those
#: formats cannot (the privacy unit and free metadata) so that a write/read round trip is exact.
SIDECAR_SUFFIX = ".meta.json"


@dataclass(frozen=True)
class FormatSpec:
    """One registered corpus format.

    ``read(path, **options)`` yields notes (lazily where the format allows); ``write(notes, path,
    **options)`` writes them atomically and returns how many it wrote. ``sniff(path)`` tells whether
    a path (file or directory) looks like this format; :func:`dphub.formats.detect_format` asks the
    registered formats in order.
    """

    name: str
    description: str
    read: Callable[..., Iterator[Note]]
    write: Callable[..., int]
    sniff: Callable[[Path], bool]
    streaming: bool = True
    suffixes: tuple[str, ...] = field(default_factory=tuple)
    #: One-file-per-note formats: ``read_each(directory, **options)`` yields ``(key, load)`` per
    #: note, ``load()`` parsing that note alone (so one bad note fails alone); None otherwise.
    read_each: Callable[..., Iterator[tuple[str, Callable[[], Note]]]] | None = None


# --------------------------------------------------------------------------------------------
# reading settings


@dataclass(frozen=True)
class ReadSettings:
    """How notes are read, whatever the format: the text encoding and the CSV columns.

    Why a setting rather than a reader argument: ``--encoding`` and the CSV column options must
    reach every reader behind every command (train, deid's runner, evaluate, data ...), through
    layers that only pass a path and a format. The CLI sets them once per command with
    :func:`reading`; library callers may do the same or pass the CSV reader's own arguments.
    """

    encoding: str = "utf-8"
    text_column: str | None = None
    id_column: str | None = None
    patient_column: str | None = None


_SETTINGS = ReadSettings()


def check_encoding(name: str) -> str:
    """The codec's canonical name; ConfigError for an unknown codec or one whose bytes are not a
    superset of ASCII (UTF-16/32: lines and CSV records are split on ASCII bytes)."""
    try:
        info = codecs.lookup(name)
    except (LookupError, TypeError, ValueError):
        raise ConfigError(f"unknown encoding {name!r} (e.g. utf-8, cp1252, latin-1)") from None
    try:
        ascii_safe = "a\n,".encode(info.name) == b"a\n,"
    except (UnicodeError, LookupError):  # pragma: no cover - every text codec encodes ASCII
        ascii_safe = False
    if not ascii_safe:
        raise ConfigError(
            f"encoding {name!r} is not ASCII-compatible: convert the notes to UTF-8 first "
            f"(e.g. `iconv -f {name} -t UTF-8 IN > OUT`)"
        )
    return info.name


@contextmanager
def reading(**settings: str | None) -> Iterator[ReadSettings]:
    """Read notes with these :class:`ReadSettings` (``encoding``, ``text_column`` ...) inside the
    block; None leaves a setting as it is. A plain module value, not a ContextVar: the runner reads
    notes on helper threads, which do not inherit a context."""
    global _SETTINGS
    known = set(ReadSettings.__dataclass_fields__)
    unknown = set(settings) - known
    if unknown:
        raise ConfigError(f"unknown reading settings {', '.join(sorted(unknown))}")
    changes = {k: v for k, v in settings.items() if v is not None}
    if "encoding" in changes:
        changes["encoding"] = check_encoding(str(changes["encoding"]))
    previous = _SETTINGS
    _SETTINGS = replace(previous, **changes)
    try:
        yield _SETTINGS
    finally:
        _SETTINGS = previous


def read_settings() -> ReadSettings:
    """The :class:`ReadSettings` in force (see :func:`reading`)."""
    return _SETTINGS


def decode_error(path: Path | str, line: int, column: int | None = None) -> FormatError:
    """The one message for bytes that are not text in the encoding in force: it names the file,
    the place and the option that fixes it (never the bytes themselves)."""
    enc = _SETTINGS.encoding
    name = "UTF-8" if enc == "utf-8" else enc
    return FormatError(
        f"{path}:{line}: not valid {name} ("
        f"{'a bad byte' if column is None else f'bad byte at column {column}'}); if the notes are in "
        "another encoding, pass it with --encoding (e.g. --encoding cp1252)"
    )


def decode(data: bytes, path: Path | str) -> str:
    """``data`` decoded with the encoding in force, exactly (a BOM is kept: offsets count it)."""
    try:
        text = data.decode(_SETTINGS.encoding)
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise decode_error(path, line, col) from None
    return text


# --------------------------------------------------------------------------------------------
# input


def not_a_file_reason(path: Path) -> str:
    """Why ``path`` cannot be read as a regular file, in words ("no such file" is not always it).

    A FIFO, a socket, a device, a directory or a symbolic link loop each deserve their own name:
    "no such file" for a path that plainly exists sends the user looking in the wrong place.
    """
    import errno
    import stat

    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "symbolic link loop"
        if e.errno == errno.ENOENT:
            return "no such file" if not os.path.lexists(path) else "broken symbolic link"
        return f"cannot read ({e.strerror or 'error'})"
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        return "a directory, not a file"
    if stat.S_ISFIFO(mode):
        return "not a regular file (a named pipe / FIFO)"
    if stat.S_ISSOCK(mode):
        return "not a regular file (a socket)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "not a regular file (a device)"
    return "not a regular file"


def require_nonempty_file(path: Path) -> None:
    """Raise a FormatError for a missing, non-regular or zero-byte file."""
    if not path.is_file():
        raise FormatError(f"{path}: {not_a_file_reason(path)}")
    if path.stat().st_size == 0:
        raise FormatError(f"{path}: file is empty")


def iter_lines(path: Path, *, allow_empty: bool = False) -> Iterator[tuple[int, str]]:
    """Yield ``(line number, line)`` with line endings kept, decoding each line strictly in the
    encoding in force (UTF-8 unless :func:`reading` says otherwise).

    Reads bytes and splits on ``\\n`` only, so ``\\r`` stays part of the text (offsets into
    CRLF files stay right) and nothing but the current line is held in memory. A UTF-8 BOM at the
    start of the file is dropped. An empty file is an error unless ``allow_empty`` (annotation
    files of notes without PHI).
    """
    if allow_empty and path.is_file():
        if path.stat().st_size == 0:
            return
    else:
        require_nonempty_file(path)
    encoding = _SETTINGS.encoding
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode(encoding)
            except UnicodeDecodeError as e:
                raise decode_error(path, lineno, e.start + 1) from None
            if lineno == 1 and line.startswith("\ufeff"):
                line = line[1:]
            yield lineno, line


def read_text(path: Path, *, allow_empty: bool = False) -> str:
    """Read a whole file strictly in the encoding in force (UTF-8 by default), exactly (no
    newline translation)."""
    if not path.is_file():
        raise FormatError(f"{path}: {not_a_file_reason(path)}")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise FormatError(f"{path}: cannot read ({e.strerror or type(e).__name__})") from None
    if not data and not allow_empty:
        raise FormatError(f"{path}: file is empty")
    return decode(data, path)


def same_text(a: str, b: str) -> bool:
    """Compare a span's quoted text with its slice, ignoring whitespace differences.

    Formats that quote span text on one line (PhysioNet phrases, brat, i2b2 attributes) cannot
    carry newlines or tabs verbatim, and XML normalizes whitespace in attributes; the characters
    themselves must still match.
    """
    return a.split() == b.split()


def normalize_ws(s: str) -> str:
    """Single-line form of a span's text (what writers put in one-line text fields)."""
    return " ".join(s.split())


def make_span(label: str, start: int, end: int, *, where: str, source: str | None = None) -> Span:
    """Build a span keeping the source's label string; unknown labels raise FormatError.

    The label is kept verbatim rather than respelled with ``canonical_label``: i2b2's ``DATE``
    and PhysioNet's ``Date`` share one canonical spelling, and statistics should show the
    source's own vocabulary. Lookups in :mod:`dphub.labels` are case-insensitive anyway.
    """
    if not is_known(label):
        # The value is not echoed: a shifted column puts note text where the label should be.
        raise FormatError(
            f"{where}: unknown PHI label (known: the categories {', '.join(CATEGORIES)}, "
            "i2b2-2014 subcategories and PhysioNet types; see dphub.labels)"
        )
    return Span(start, end, label, source=source)


#: Most digits an offset may have: far beyond any note, and far below Python's 4,300-digit limit
#: of ``int()`` (a longer number raised ``ValueError`` and aborted a whole run, not its record).
MAX_OFFSET_DIGITS = 18


def parse_int(value: Any, *, what: str, where: str) -> int:
    """Parse an offset that must be a non-negative-looking integer (no bools, no floats), of at
    most :data:`MAX_OFFSET_DIGITS` digits."""
    if isinstance(value, bool):
        raise FormatError(f"{where}: {what} must be an integer")
    if isinstance(value, int):
        if abs(value) >= 10**MAX_OFFSET_DIGITS:
            raise FormatError(f"{where}: {what} is out of range")
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        if len(value.strip().lstrip("-")) > MAX_OFFSET_DIGITS:
            raise FormatError(f"{where}: {what} is out of range ({len(value.strip())} digits)")
        return int(value)
    raise FormatError(f"{where}: {what} must be an integer")


def finish_spans(
    items: Iterable[tuple[Span, str]],
    text: str,
    *,
    record: str,
    overlaps: str = DEFAULT_OVERLAPS,
) -> list[Span]:
    """Validate a note's spans and return them sorted (overlaps resolved per ``overlaps``).

    ``items`` pairs each span with where it came from (``file:line``) so the message of a bad span
    points at its line. ``record`` names the note (``file: note 1-2``) for overlap messages.
    Span-level rules are those of :func:`dphub.notes.check_spans`.
    """
    if overlaps not in OVERLAP_POLICIES:
        raise ConfigError(f"overlaps must be one of {', '.join(OVERLAP_POLICIES)}, not {overlaps!r}")
    pairs = list(items)
    for span, where in pairs:
        try:
            check_spans([span], len(text), where=where)
        except InputError as e:
            raise FormatError(str(e)) from None
    pairs.sort(key=lambda p: (p[0].start, p[0].end))
    out: list[Span] = []  # disjoint spans (merged groups under "merge")
    kept: list[Span] = []  # same-label overlaps kept under "keep"
    group_end, group_where = -1, ""
    for span, where in pairs:
        if out and span.start < group_end:
            prev = out[-1]
            if overlaps == "error" or prev.label.upper() != span.label.upper():
                raise FormatError(
                    f"{where}: span {span.start}-{span.end} ({span.label}) overlaps span "
                    f"{prev.start}-{prev.end} ({prev.label}) of {group_where}"
                )
            log.info(
                "%s: %s overlapping %s spans %d-%d and %d-%d",
                record, "kept" if overlaps == "keep" else "merged",
                span.label, prev.start, group_end, span.start, span.end,
            )
            if overlaps == "keep":
                kept.append(span)
            elif span.end > prev.end:
                out[-1] = replace(prev, end=span.end)
            group_end = max(group_end, span.end)
            continue
        out.append(span)
        group_end, group_where = span.end, where
    if kept:
        return sorted(out + kept, key=lambda s: (s.start, s.end))
    try:
        return check_spans(out, len(text), where=record)
    except InputError as e:  # pragma: no cover - finish_spans already enforces every rule
        raise FormatError(str(e)) from None


# --------------------------------------------------------------------------------------------
# one-file-per-note formats


def sidecar_path(note_file: Path) -> Path:
    """``notes/a.txt`` -> ``notes/a.meta.json``."""
    return note_file.with_name(note_file.name[: -len(note_file.suffix) or None] + SIDECAR_SUFFIX)


def read_sidecar(note_file: Path) -> tuple[str | None, dict[str, Any]] | None:
    """The (patient id, metadata) of a note's optional sidecar, or None when there is none."""
    side = sidecar_path(note_file)
    if not side.is_file():
        return None
    try:
        obj = json.loads(read_text(side))
    except json.JSONDecodeError as e:
        raise FormatError(f"{side}:{e.lineno}: invalid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise FormatError(f"{side}: expected a JSON object")
    pid = obj.get("patient_id")
    if pid is not None and not isinstance(pid, str):
        raise FormatError(f"{side}: patient_id must be a string or null")
    meta = obj.get("metadata", {})
    if not isinstance(meta, dict):
        raise FormatError(f"{side}: metadata must be an object")
    return pid, meta


def sidecar_payload(note: Note, implied_patient_id: str | None = None) -> str | None:
    """The sidecar JSON a writer must put next to a note, or None when it carries nothing new."""
    if note.patient_id == implied_patient_id and not note.metadata:
        return None
    try:
        return json.dumps(
            {"patient_id": note.patient_id, "metadata": note.metadata}, ensure_ascii=False,
            indent=1, sort_keys=True,
        ) + "\n"
    except (TypeError, ValueError):
        raise FormatError(f"note {note.id}: metadata is not JSON-serializable") from None


def note_relpath(note_id: str, suffix: str) -> Path:
    """A note id as a relative file path (``a/b`` -> ``a/b.txt``); refuse ids that escape."""
    parts = note_id.split("/")
    if (
        not note_id
        or note_id.startswith("/")
        or any(p in ("", ".", "..") or p.startswith(".") for p in parts)
        or "\\" in note_id
        or "\x00" in note_id
    ):
        raise FormatError(
            f"note {note_id!r}: id cannot be used as a file name (needs non-empty '/'-separated "
            "parts, none starting with '.')"
        )
    return Path(*parts[:-1], parts[-1] + suffix)


def iter_note_files(root: Path, suffix: str) -> Iterator[tuple[str, Path]]:
    """``(note id, file)`` for every ``*suffix`` file under ``root``, recursively, sorted.

    The note id is the relative path without the suffix (posix separators). Hidden files and
    directories (``.name``: temp files, checkpoints) are skipped.
    """
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if name.startswith(".") or not name.endswith(suffix):
                continue
            if name.endswith(SIDECAR_SUFFIX):
                continue
            full = Path(dirpath, name)
            rel = full.relative_to(root).as_posix()
            found.append((rel[: -len(suffix)], full))
    found.sort(key=lambda t: t[0])
    yield from found


def has_files(root: Path, suffix: str) -> bool:
    """Whether any non-hidden ``*suffix`` file lies under ``root``."""
    return next(iter_note_files(root, suffix), None) is not None


def write_note_files(
    notes: Iterable[Note],
    path: Path,
    *,
    format_name: str,
    overwrite: bool = False,
    companions: Callable[[Note], dict[str, str]] | None = None,
) -> int:
    """Write a directory of ``<id>.txt`` notes (brat and plain text share this layout).

    ``companions`` gives the extra files of a note as ``{suffix: content}`` (brat's ``.ann``);
    patient id and metadata go to the ``.meta.json`` sidecar. The directory is built under a
    temporary name and moved into place when complete, so a failure leaves no partial output.
    """
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
        raise ConfigError(f"{path}: already exists and is not empty (pass overwrite)")
    n = 0
    with atomic_directory(path, overwrite=True) as tmp:
        for note in notes:
            if not note.text:
                raise FormatError(f"note {note.id}: empty text cannot be written as "
                                  f"{format_name} (an empty .txt is refused on reading)")
            txt = tmp / note_relpath(note.id, ".txt")
            atomic_write_text(txt, note.text)
            for suffix, content in (companions(note) if companions else {}).items():
                atomic_write_text(txt.with_suffix(suffix), content)
            payload = sidecar_payload(note)
            if payload is not None:
                atomic_write_text(sidecar_path(txt), payload)
            n += 1
    return n
