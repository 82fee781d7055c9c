"""Plain text (``text``): a directory of unlabelled ``.txt`` notes, read recursively, sorted.

The note id is the relative path without ``.txt`` (``ward3/0001``); a path to one ``.txt`` file
reads that note (id = its stem). Hidden files and directories are skipped. Notes carry no spans
(``labelled`` is False); patient id and metadata come from an optional ``.meta.json`` sidecar (see
:mod:`dphub.formats._base`). An empty ``.txt`` is an error: it is almost always a failed export.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from dphub.errors import ConfigError, FormatError
from dphub.formats._base import (
    FormatSpec,
    has_files,
    iter_note_files,
    note_relpath,
    read_sidecar,
    read_text,
    sidecar_path,
    sidecar_payload,
)
from dphub.io import atomic_directory, atomic_write_text
from dphub.notes import Note


def _note(file: Path, note_id: str) -> Note:
    side = read_sidecar(file)
    patient, metadata = side if side is not None else (None, {})
    return Note(id=note_id, text=read_text(file), patient_id=patient, metadata=metadata)


def read_plain(path: Path) -> Iterator[Note]:
    """Read one ``.txt`` file or every ``.txt`` under a directory."""
    if path.is_dir():
        for note_id, file in iter_note_files(path, ".txt"):
            yield _note(file, note_id)
    else:
        if path.suffix != ".txt":
            raise FormatError(f"{path}: expected a directory of .txt files or a .txt file")
        yield _note(path, path.stem)


def write_plain(notes: Iterable[Note], path: Path, *, overwrite: bool = False) -> int:
    """Write each note's text to ``<id>.txt`` (spans are dropped: the format has none)."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
        raise ConfigError(f"{path}: already exists and is not empty (pass overwrite)")
    n = 0
    with atomic_directory(path, overwrite=True) as tmp:
        for note in notes:
            if not note.text:
                raise FormatError(f"note {note.id}: empty text cannot be written as text "
                                  "(an empty .txt is refused on reading)")
            rel = note_relpath(note.id, ".txt")
            atomic_write_text(tmp / rel, note.text)
            payload = sidecar_payload(note)
            if payload is not None:
                atomic_write_text(sidecar_path(tmp / rel), payload)
            n += 1
    return n


def sniff_plain(path: Path) -> bool:
    if path.is_dir():
        return has_files(path, ".txt")
    return path.suffix == ".txt"


TEXT = FormatSpec(
    name="text",
    description="plain text: a directory of unlabelled .txt notes (recursive, sorted)",
    read=read_plain,
    write=write_plain,
    sniff=sniff_plain,
    suffixes=(".txt",),
)
