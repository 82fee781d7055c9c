"""Plain text (``text``): a directory of unlabelled ``.txt`` notes, read recursively, sorted.

The note id is the relative path without ``.txt`` (``ward3/0001``); a path to one ``.txt`` file
reads that note (id = its stem). Hidden files and directories are skipped. Notes carry no spans
(``labelled`` is False); patient id and metadata come from an optional ``.meta.json`` sidecar (see
:mod:`dphub.formats._base`). An empty ``.txt`` is an error: it is almost always a failed export.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path

from dphub.errors import FormatError
from dphub.formats._base import (
    FormatSpec,
    has_files,
    iter_note_files,
    read_sidecar,
    read_text,
    write_note_files,
)
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


def each_plain(path: Path) -> Iterator[tuple[str, Callable[[], Note]]]:
    """Per ``.txt`` under a directory, a loader that reads that note alone (see ``read_each``)."""
    for note_id, file in iter_note_files(path, ".txt"):
        yield note_id, partial(_note, file, note_id)


def write_plain(notes: Iterable[Note], path: Path, *, overwrite: bool = False) -> int:
    """Write each note's text to ``<id>.txt`` (spans are dropped: the format has none)."""
    return write_note_files(notes, path, format_name="text", overwrite=overwrite)


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
    read_each=each_plain,
)
