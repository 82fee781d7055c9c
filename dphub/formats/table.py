"""CSV and TSV tables of notes (``csv``): one note per record, one column holds the text.

A header row is required. The note text comes from the ``text_column`` (else the first header among
:data:`TEXT_HEADERS`, compared case-insensitively: ``text``, ``note_text``, MIMIC's ``TEXT`` ...),
the note id from ``id_column`` (else :data:`ID_HEADERS`; without one, the record's number, 1 for the
first record after the header), the patient id from ``patient_column`` (else
:data:`PATIENT_HEADERS`; without one, no patient id). The CLI's ``--text-column``,
``--id-column`` and ``--patient-column`` set them (see :func:`dphub.formats._base.reading`).
Other columns become the note's metadata. Notes carry no spans (``labelled`` is False).

Parsing is Python's :mod:`csv` in strict mode (RFC 4180 quoting): a quoted field may hold newlines
(``\\r\\n`` is kept as written, so offsets are offsets into the field), U+2028 and any other
character. The file is decoded in the encoding in force (``--encoding``). A UTF-8 byte order mark is dropped. ``.tsv`` files are tab-separated. The file is read
one record at a time. Errors name the file and the record (its first line), never a field's value:
a shifted column puts note text where an id should be.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from dphub.errors import ConfigError, FormatError
from dphub.formats._base import (
    FormatSpec,
    iter_lines,
    read_settings,
)
from dphub.io import atomic_open
from dphub.notes import Note

#: Headers taken as the note text, id and patient id when no column is named (first match wins;
#: case-insensitive). They cover the common exports: MIMIC-III NOTEEVENTS (TEXT, ROW_ID,
#: SUBJECT_ID), MIMIC-IV note (text, note_id, subject_id), OMOP NOTE (note_text, note_id,
#: person_id) and hand-made tables.
TEXT_HEADERS = ("text", "note_text", "note", "body", "report_text", "report", "content")
ID_HEADERS = ("id", "note_id", "row_id", "document_id", "doc_id", "record_id")
PATIENT_HEADERS = ("patient_id", "subject_id", "person_id", "patient", "mrn")

#: Largest field, in characters (the csv module's default, 128 KiB, is below a long discharge note).
FIELD_LIMIT = 2**31 - 1


def _delimiter(path: Path) -> str:
    return "\t" if path.suffix.lower() == ".tsv" else ","


def _column(header: Sequence[str], named: str | None, candidates: tuple[str, ...], *,
            option: str, path: Path, required: bool) -> int | None:
    """Index of the named column, else of the first candidate header; None when optional."""
    if named is not None:
        for i, h in enumerate(header):
            if h == named:
                return i
        lowered = [i for i, h in enumerate(header) if h.strip().lower() == named.strip().lower()]
        if len(lowered) == 1:
            return lowered[0]
        # The name is the user's own argument, so it may be echoed; the header is not.
        raise FormatError(f"{path}: no column {named!r} in the header row ({len(header)} "
                          f"columns); check --{option}")
    lowered_header = [h.strip().lower() for h in header]
    for cand in candidates:
        if cand in lowered_header:
            return lowered_header.index(cand)
    if required:
        raise FormatError(
            f"{path}: no text column found in the header row (looked for "
            f"{', '.join(candidates)}); name it with --{option} NAME"
        )
    return None


def read_csv(path: Path, *, text_column: str | None = None, id_column: str | None = None,
             patient_column: str | None = None) -> Iterator[Note]:
    """Stream the notes of a CSV/TSV table, one record at a time (see the module docstring).

    Column arguments left None fall back to the reading settings in force, then to the common
    headers.
    """
    settings = read_settings()
    text_column = text_column if text_column is not None else settings.text_column
    id_column = id_column if id_column is not None else settings.id_column
    patient_column = patient_column if patient_column is not None else settings.patient_column
    csv.field_size_limit(FIELD_LIMIT)
    # iter_lines splits the bytes on "\n" only and decodes each line in the encoding in force
    # (exact line numbers in a decoding error; U+2028 and "\r" stay inside their field).
    lines = (line for _, line in iter_lines(path))
    reader = csv.reader(lines, delimiter=_delimiter(path), strict=True)
    try:
        header = next(reader, None)
        if header is None:
            raise FormatError(f"{path}: no header row")
        t = _column(header, text_column, TEXT_HEADERS, option="text-column", path=path,
                    required=True)
        i = _column(header, id_column, ID_HEADERS, option="id-column", path=path,
                    required=id_column is not None)
        p = _column(header, patient_column, PATIENT_HEADERS, option="patient-column",
                    path=path, required=patient_column is not None)
        used = {t, i, p}
        extra = [(k, h) for k, h in enumerate(header) if k not in used and h]
        number = 0
        while True:
            line = reader.line_num + 1
            row = next(reader, None)
            if row is None:
                return
            if not row:  # a blank line between records
                continue
            number += 1
            where = f"{path}:{line}"
            if len(row) != len(header):
                raise FormatError(f"{where}: record {number} has {len(row)} fields, the "
                                  f"header {len(header)}")
            note_id = row[i] if i is not None else str(number)
            if not note_id.strip():
                raise FormatError(f"{where}: record {number} has an empty id")
            patient = row[p] if p is not None and row[p].strip() else None
            metadata = {h: row[k] for k, h in extra if row[k] != ""}
            assert t is not None
            yield Note(id=note_id, text=row[t], patient_id=patient, metadata=metadata)
    except csv.Error as e:
        raise FormatError(f"{path}:{reader.line_num}: malformed CSV ({e})") from None


def write_csv(notes: Iterable[Note], path: Path, *, overwrite: bool = False) -> int:
    """Write ``id, patient_id, text`` records (spans and metadata are dropped), atomically."""
    if path.exists() and not overwrite:
        raise ConfigError(f"{path}: already exists (pass overwrite to replace it)")
    n = 0
    with atomic_open(path, "w", newline="") as fh:
        writer = csv.writer(fh, delimiter=_delimiter(path), lineterminator="\r\n")
        writer.writerow(["id", "patient_id", "text"])
        for note in notes:
            writer.writerow([note.id, note.patient_id or "", note.text])
            n += 1
    return n


def sniff_csv(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in (".csv", ".tsv")


CSV = FormatSpec(
    name="csv",
    description="CSV/TSV table with a header row: a text column, optional id and patient id "
                "columns (--text-column, --id-column, --patient-column)",
    read=read_csv,
    write=write_csv,
    sniff=sniff_csv,
    suffixes=(".csv", ".tsv"),
)
