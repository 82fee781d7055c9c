"""Corpus formats: read any supported corpus as a stream of notes, write notes back out.

::

    from dphub import formats
    for note in formats.read("corpora/physionet-deid-dev"):   # format detected
        ...
    formats.write(notes, "out.jsonl", "jsonl")
    formats.count("notes/", format="text")

Formats (one module each, registered in :data:`FORMATS`): ``physionet``, ``deidpl``, ``i2b2``,
``brat``, ``jsonl``, ``conll``, ``csv``, ``text``; each module's docstring defines its layout. Adding a
format is one module exposing a :class:`FormatSpec` and one entry in ``_SPECS`` below.

Contract of every reader: notes come out lazily (JSONL, CoNLL and PhysioNet records are streamed
line by line; directory formats one file at a time); span labels keep the source's label
string verbatim and are validated; bad input raises :class:`~dphub.errors.FormatError`
naming the file and line/record and the offsets, never note text. :func:`read` adds the checks
every format shares: the path exists, note ids are unique, and the corpus is not empty.
Overlapping gold spans with the same label are merged (``overlaps="merge"``, the default;
``"error"`` refuses any overlap, ``"keep"`` keeps them for counting; see
:data:`dphub.formats._base.OVERLAP_POLICIES`), with different labels they are an error.

How notes are decoded (``encoding``, UTF-8 by default) and which CSV columns hold the text, id and
patient id are reading settings, set for a block with :func:`reading` (the CLI's ``--encoding``,
``--text-column`` ...): every reader honours them.

Writers write atomically (temp file or directory, renamed into place when complete): a failure
leaves nothing behind, an existing target is refused unless ``overwrite=True``, and spans are
validated first (no overlaps, known labels, in bounds).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError, FormatError, InputError
from dphub.formats._base import FormatSpec, ReadSettings, not_a_file_reason, read_settings, reading
from dphub.formats.brat import BRAT
from dphub.formats.conll import CONLL
from dphub.formats.i2b2 import I2B2
from dphub.formats.jsonl import JSONL
from dphub.formats.physionet import DEIDPL, PHYSIONET
from dphub.formats.table import CSV
from dphub.formats.text import TEXT
from dphub.notes import Note, check_spans, lone_surrogate

# Order matters for detection: the first format whose sniff() accepts a path wins.
_SPECS: tuple[FormatSpec, ...] = (PHYSIONET, DEIDPL, BRAT, I2B2, JSONL, CONLL, CSV, TEXT)

#: Registered formats by name.
FORMATS: dict[str, FormatSpec] = {spec.name: spec for spec in _SPECS}

__all__ = [
    "FORMATS", "FormatSpec", "ReadSettings", "count", "detect_format", "get_format", "read",
    "read_each", "read_settings", "reading", "write",
]


def _check_readable(path: Path) -> None:
    """A directory or a regular file, or a FormatError saying what the path is instead.

    A FIFO would block a reader forever and a symbolic link loop "does not exist" to
    ``Path.exists``; both deserve their own words (issue 16).
    """
    if not (path.is_dir() or path.is_file()):
        reason = not_a_file_reason(path)
        raise FormatError(f"{path}: {'no such file or directory' if reason == 'no such file' else reason}")


def get_format(name: str) -> FormatSpec:
    """The registered format ``name``; ConfigError listing the known ones otherwise."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ConfigError(
            f"unknown corpus format {name!r}; known: {', '.join(FORMATS)}"
        ) from None


#: document formats people export notes in that dphub does not read (it reads plain text)
_DOCUMENT_SUFFIXES = (".docx", ".doc", ".rtf", ".odt", ".pdf")


def _documents_hint(path: Path) -> str:
    """When ``path`` is, or is a directory of, word-processor documents: how to convert them.

    Why: a folder of ``.docx`` was told to pass ``--format text``, which then found no notes.
    """
    if path.is_dir():
        try:
            found = sorted({p.suffix.lower() for p in path.rglob("*")
                            if p.suffix.lower() in _DOCUMENT_SUFFIXES and p.is_file()})
        except OSError:
            return ""
    else:
        found = [path.suffix.lower()] if path.suffix.lower() in _DOCUMENT_SUFFIXES else []
    if not found:
        return ""
    return (f"; {'/'.join(found)} files are not supported (dphub reads plain text): convert them "
            "to .txt first, e.g. `pandoc -t plain NOTE.docx -o NOTE.txt` or `libreoffice "
            "--headless --convert-to txt:Text --outdir TXT_DIR *.docx`, then pass TXT_DIR")


def _no_notes(path: Path, fmt: str) -> FormatError:
    return FormatError(f"{path}: no notes found (format {fmt}){_documents_hint(path)}")


def detect_format(path: str | os.PathLike[str]) -> str:
    """Guess a path's format from its suffix or, for a directory, the files it holds."""
    path = Path(path)
    _check_readable(path)
    for spec in _SPECS:
        if spec.sniff(path):
            return spec.name
    kind = "directory holds no known corpus files" if path.is_dir() else "unknown file type"
    hint = _documents_hint(path)
    if hint:
        raise FormatError(f"{path}: cannot read it ({kind}){hint}")
    raise FormatError(
        f"{path}: cannot detect the corpus format ({kind}); pass a format: {', '.join(FORMATS)}"
    )


def _bind(func: Any, args: tuple[Any, ...], options: dict[str, Any], fmt: str) -> None:
    """Refuse options a format does not take with a readable ConfigError (not a TypeError)."""
    try:
        inspect.signature(func).bind(*args, **options)
    except TypeError:
        known = [p for p in list(inspect.signature(func).parameters)[len(args):]]
        raise ConfigError(
            f"format {fmt!r} takes options {', '.join(known) or 'none'}; "
            f"got {', '.join(sorted(options))}"
        ) from None


def read(path: str | os.PathLike[str], format: str | None = None, **options: Any
         ) -> Iterator[Note]:
    """Notes of the corpus at ``path``, lazily; ``format`` is detected when None.

    Path, format and option errors raise at once; errors in the data raise while iterating, at
    the first bad record (earlier notes have been yielded).
    """
    path = Path(path)
    _check_readable(path)
    fmt = format or detect_format(path)
    spec = get_format(fmt)
    _bind(spec.read, (path,), options, fmt)
    return _checked(spec.read(path, **options), path, fmt)


def _checked(notes: Iterator[Note], path: Path, fmt: str) -> Iterator[Note]:
    seen: set[str] = set()
    for note in notes:
        if note.id in seen:
            raise FormatError(f"{path}: duplicate note id {note.id!r}")
        seen.add(note.id)
        yield note
    if not seen:
        raise _no_notes(path, fmt)


def read_each(path: str | os.PathLike[str], format: str | None = None, **options: Any
              ) -> Iterator[tuple[str, Note | None, str | None]]:
    """``(key, note, None)`` per readable note and ``(key, None, error)`` per unreadable one.

    Why: a de-identification run over a corpus must not stop at one malformed note (a bad
    ``.ann``, an undecodable ``.txt``). The one-file-per-note formats (brat, i2b2, text) parse each
    note on its own, so a bad note costs only itself; in the stream formats (PhysioNet, CoNLL,
    JSONL) the first error ends the stream, reported as one failure after the notes read so far
    (an error before the first note refuses the corpus, as :func:`read` does).
    Errors are the readers' PHI-free :class:`FormatError` messages; keys are note ids (or, for an
    orphan or stream error, the file name).
    """
    path = Path(path)
    _check_readable(path)
    fmt = format or detect_format(path)
    spec = get_format(fmt)
    _bind(spec.read, (path,), options, fmt)
    seen: set[str] = set()
    any_item = False
    if spec.read_each is not None and path.is_dir():
        for key, load in spec.read_each(path, **options):
            any_item = True
            try:
                note = load()
            except InputError as e:
                yield key, None, e.message
                continue
            except OSError as e:
                yield key, None, f"{key}: cannot read ({e.strerror or type(e).__name__})"
                continue
            if note.id in seen:
                raise FormatError(f"{path}: duplicate note id {note.id!r}")
            seen.add(note.id)
            yield note.id, note, None
        if not any_item:
            raise _no_notes(path, fmt)
        return
    notes = spec.read(path, **options)
    last = None
    while True:
        try:
            note = next(notes)
        except StopIteration:
            break
        except InputError as e:
            if last is None:
                raise  # nothing readable at all: the corpus is refused as a whole
            yield (f"{path.name} after note {last!r}", None,
                   f"{e.message} (the rest of {path.name} was not read)")
            return
        if note.id in seen:
            raise FormatError(f"{path}: duplicate note id {note.id!r}")
        seen.add(note.id)
        last = note.id
        yield note.id, note, None
    if last is None:
        raise _no_notes(path, fmt)


def count(path: str | os.PathLike[str], format: str | None = None, **options: Any) -> int:
    """Number of notes at ``path``, streaming (the corpus is validated on the way)."""
    return sum(1 for _ in read(path, format, **options))


def write(
    notes: Iterable[Note],
    path: str | os.PathLike[str],
    format: str,
    **options: Any,
) -> int:
    """Write ``notes`` to ``path`` in ``format`` atomically; return how many were written.

    Options are the format's (``overwrite=True`` for all; ``scheme="bioes"`` for conll).
    """
    path = Path(path)
    spec = get_format(format)
    _bind(spec.write, ((), path), options, format)
    return spec.write(_validated(notes), path, **options)


def _check_unicode(note: Note) -> None:
    """Refuse, before anything is written, a note no UTF-8 file can hold (a lone surrogate in its
    text, id, patient id or metadata), naming where, never the text."""
    for what, value in (("text", note.text), ("id", note.id), ("patient id", note.patient_id),
                        ("metadata", note.metadata)):
        at = lone_surrogate(value)
        if at is not None:
            place = f" at offset {at}" if at >= 0 and what == "text" else ""
            raise InputError(
                f"note {note.id!r}: its {what} holds a lone surrogate{place} (U+D800-U+DFFF, "
                "not a Unicode character; no UTF-8 file can hold it): nothing was written")


def _validated(notes: Iterable[Note]) -> Iterator[Note]:
    seen: set[str] = set()
    for note in notes:
        if note.id in seen:
            raise InputError(f"duplicate note id {note.id!r}: nothing was written")
        seen.add(note.id)
        _check_unicode(note)
        try:
            spans = check_spans(note.spans, len(note.text), where=f"note {note.id}")
        except InputError as e:
            raise InputError(f"{e.message}: nothing was written") from None
        yield note if spans == note.spans else replace(note, spans=spans)
    if not seen:
        raise InputError("no notes to write: nothing was written")
