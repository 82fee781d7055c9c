"""PhysioNet deid 1.1 corpora (``physionet``) and deid.pl span lists (``deidpl``).

Layout of a corpus ``<stem>`` (the released corpus uses ``id``)::

    <stem>.text         START_OF_RECORD=P||||N||||\\n<body>||||END_OF_RECORD\\n ...
    <stem>-phi.phrase   typed gold: one line per phrase, ``P N start end TYPE text``
    <stem>.deid         untyped gold as a span list (the format below)

The body of a record is everything between the header line's newline and ``||||END_OF_RECORD``
(so it usually ends with the newline(s) before the marker); offsets count from its first
character. Note ids are ``"{P}-{N}"``, the patient id is ``P``.

Span lists (``.deid`` gold and deid.pl's ``.phi`` output) have a header per note, ``Patient P``
and ``Note N`` separated by a tab or spaces, followed by ``start start end`` lines (the first field
repeats the start). They carry no type, so their spans get the placeholder label ``OTHER`` and
the notes ``metadata["untyped"] = True``.

Reading prefers the typed ``-phi.phrase`` over ``.deid``; with neither, notes are unlabelled.
``deidpl`` reads a ``.phi`` file and takes the note texts from ``text_path=``, a sibling
``<stem>.text`` or ``id.text`` in the same directory; its spans are a peer tool's predictions, so
overlapping ones are merged whatever the overlap policy.

The text file is streamed record by record; annotation files (small next to the text) are
indexed in memory first.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from dphub.errors import ConfigError, FormatError
from dphub.formats._base import (
    DEFAULT_OVERLAPS,
    FormatSpec,
    finish_spans,
    iter_lines,
    make_span,
    normalize_ws,
    parse_int,
    same_text,
)
from dphub.io import atomic_open
from dphub.notes import Note, Span

_HEADER = re.compile(r"START_OF_RECORD=([^|\s]+)\|\|\|\|([^|\s]+)\|\|\|\|\s*")
_END = "||||END_OF_RECORD"
_PHRASE = re.compile(r"(\S+)[ \t]+(\S+)[ \t]+(\S+)[ \t]+(\S+)[ \t]+(\S+)(?:[ \t](.*))?")
_LIST_HEADER = re.compile(r"Patient\s+(\S+)\s+Note\s+(\S+)\s*")
_LIST_SPAN = re.compile(r"\s*(-?\d+)\s+(-?\d+)\s+(-?\d+)\s*")
UNTYPED_LABEL = "OTHER"

SpanIndex = dict[str, list[tuple[Span, str]]]


# --------------------------------------------------------------------------------------------
# parsing


def iter_records(path: Path) -> Iterator[tuple[str, str, str, int]]:
    """Yield ``(patient, note number, body, header line)`` for each record of a ``.text`` file."""
    inside: tuple[str, str, int] | None = None
    body: list[str] = []
    for lineno, line in iter_lines(path):
        if inside is None:
            if not line.strip():
                continue
            m = _HEADER.fullmatch(line)
            if m is None or not line.endswith("\n"):
                raise FormatError(
                    f"{path}:{lineno}: expected a 'START_OF_RECORD=P||||N||||' header line"
                )
            inside = (m[1], m[2], lineno)
            body = []
            continue
        idx = line.find(_END)
        if idx < 0:
            body.append(line)
            continue
        if line[idx + len(_END) :].strip():
            raise FormatError(f"{path}:{lineno}: unexpected characters after {_END}")
        body.append(line[:idx])
        yield inside[0], inside[1], "".join(body), inside[2]
        inside = None
    if inside is not None:
        raise FormatError(
            f"{path}:{inside[2]}: record {inside[0]}-{inside[1]} has no {_END} line"
        )


def read_phrases(path: Path) -> tuple[SpanIndex, dict[tuple[str, int], str]]:
    """Index a ``-phi.phrase`` file: note id -> [(span, where)], plus each line's quoted text."""
    index: SpanIndex = {}
    quoted: dict[tuple[str, int], str] = {}
    for lineno, line in iter_lines(path, allow_empty=True):
        content = line.rstrip("\r\n")
        if not content.strip():
            continue
        where = f"{path}:{lineno}"
        m = _PHRASE.fullmatch(content)
        if m is None or m[6] is None:
            raise FormatError(f"{where}: expected 'P N start end TYPE text' (6 fields)")
        start = _int(m[3], "start", where)
        end = _int(m[4], "end", where)
        note_id = f"{m[1]}-{m[2]}"
        span = make_span(m[5], start, end, where=where)
        index.setdefault(note_id, []).append((span, where))
        quoted[(note_id, lineno)] = m[6]
    return index, quoted


def read_span_list(path: Path, *, label: str = UNTYPED_LABEL, source: str | None = None
                   ) -> SpanIndex:
    """Index a deid.pl-style span list (``.deid`` / ``.phi``): note id -> [(span, where)]."""
    index: SpanIndex = {}
    current: str | None = None
    for lineno, line in iter_lines(path, allow_empty=True):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        m = _LIST_HEADER.fullmatch(line)
        if m is not None:
            current = f"{m[1]}-{m[2]}"
            if current in index:
                raise FormatError(f"{where}: note {current} is listed twice")
            index[current] = []
            continue
        m = _LIST_SPAN.fullmatch(line)
        if m is None:
            raise FormatError(f"{where}: expected 'Patient P  Note N' or 'start start end'")
        if current is None:
            raise FormatError(f"{where}: span line before any 'Patient P  Note N' header")
        start, end = _int(m[2], "start", where), _int(m[3], "end", where)
        index[current].append((make_span(label, start, end, where=where, source=source), where))
    return index


def _int(value: str, what: str, where: str) -> int:
    return parse_int(value, what=what, where=where)


def _notes(
    text_path: Path,
    index: SpanIndex | None,
    *,
    ann_path: Path | None,
    quoted: dict[tuple[str, int], str] | None = None,
    untyped: bool = False,
    overlaps: str = DEFAULT_OVERLAPS,
) -> Iterator[Note]:
    """Join the streamed records of ``text_path`` with their indexed spans."""
    seen: set[str] = set()
    for patient, number, body, _header_line in iter_records(text_path):
        note_id = f"{patient}-{number}"
        seen.add(note_id)
        pairs = index.get(note_id, []) if index is not None else []
        if quoted is not None:
            for span, where in pairs:
                lineno = int(where.rsplit(":", 1)[1])
                if 0 <= span.start < span.end <= len(body) and not same_text(
                    quoted[(note_id, lineno)], body[span.start : span.end]
                ):
                    raise FormatError(
                        f"{where}: phrase text does not match note {note_id} at "
                        f"{span.start}-{span.end}"
                    )
        spans = finish_spans(
            pairs, body, record=f"{ann_path or text_path}: note {note_id}", overlaps=overlaps
        )
        yield Note(
            id=note_id,
            text=body,
            patient_id=patient,
            metadata={"untyped": True} if untyped else {},
            spans=spans,
            labelled=index is not None,
        )
    if index is not None:
        missing = [n for n in index if n not in seen]
        if missing:
            where = index[missing[0]][0][1] if index[missing[0]] else str(ann_path)
            raise FormatError(
                f"{where}: note {missing[0]} is not in {text_path}"
                + (f" ({len(missing)} such notes)" if len(missing) > 1 else "")
            )


def resolve_corpus(path: Path) -> tuple[Path, Path | None, Path | None]:
    """``(text, phrase or None, deid or None)`` for a corpus directory or any of its files."""
    if path.is_dir():
        candidates = sorted(p for p in path.glob("*.text") if not p.name.startswith("."))
        if (path / "id.text").is_file():
            text = path / "id.text"
        elif len(candidates) == 1:
            text = candidates[0]
        elif not candidates:
            raise FormatError(f"{path}: no PhysioNet '.text' file in this directory")
        else:
            raise FormatError(
                f"{path}: several '.text' files and no id.text; pass the one to read"
            )
    elif path.name.endswith("-phi.phrase"):
        text = path.with_name(path.name[: -len("-phi.phrase")] + ".text")
    elif path.suffix in (".deid", ".text"):
        text = path.with_suffix(".text")
    else:
        raise FormatError(f"{path}: expected a PhysioNet '.text', '-phi.phrase' or '.deid' file")
    if not text.is_file():
        raise FormatError(f"{text}: no such file (note texts of the PhysioNet corpus)")
    stem = text.name[: -len(".text")]
    phrase = text.with_name(stem + "-phi.phrase")
    deid = text.with_name(stem + ".deid")
    return text, phrase if phrase.is_file() else None, deid if deid.is_file() else None


# --------------------------------------------------------------------------------------------
# physionet


def read_physionet(path: Path, *, overlaps: str = DEFAULT_OVERLAPS) -> Iterator[Note]:
    """Read a PhysioNet corpus (directory, ``.text``, ``-phi.phrase`` or ``.deid`` path)."""
    text, phrase, deid = resolve_corpus(path)
    if path.is_file() and path.suffix == ".deid":
        phrase = None  # the untyped span list was asked for by name
    elif path.is_file() and path.name.endswith("-phi.phrase"):
        deid = None
    if phrase is not None:
        index, quoted = read_phrases(phrase)
        yield from _notes(text, index, ann_path=phrase, quoted=quoted, overlaps=overlaps)
    elif deid is not None:
        index = read_span_list(deid)
        yield from _notes(text, index, ann_path=deid, untyped=True, overlaps=overlaps)
    else:
        yield from _notes(text, None, ann_path=None, overlaps=overlaps)


def split_note_id(note: Note) -> tuple[str, str]:
    """``"P-N"`` -> ``(P, N)``: the header fields a PhysioNet record needs."""
    patient, sep, number = note.id.rpartition("-")
    ok = sep and patient and number and not re.search(r"[\s|]", note.id)
    if not ok:
        raise FormatError(
            f"note {note.id!r}: PhysioNet needs ids 'P-N' (patient, note number; no spaces or '|')"
        )
    if note.patient_id is not None and note.patient_id != patient:
        raise FormatError(
            f"note {note.id}: patient id {note.patient_id!r} differs from the id's patient "
            f"{patient!r}; PhysioNet encodes the patient in the note id"
        )
    return patient, number


def write_physionet(notes: Iterable[Note], path: Path, *, overwrite: bool = False) -> int:
    """Write ``<stem>.text``, ``<stem>-phi.phrase`` and ``<stem>.deid`` (all or nothing).

    ``path`` is a ``.text`` file (its stem names the other two) or a directory (stem ``id``).
    Labels are written verbatim (any dphub label, not only PhysioNet types); phrase text is the
    span's text on one line.
    """
    if path.suffix == ".text":
        directory, stem = path.parent, path.name[: -len(".text")]
    else:
        directory, stem = path, "id"
    targets = [directory / f"{stem}.text", directory / f"{stem}-phi.phrase",
               directory / f"{stem}.deid"]
    if not overwrite:
        for t in targets:
            if t.exists():
                raise ConfigError(f"{t}: already exists (pass overwrite to replace it)")
    n = 0
    with contextlib.ExitStack() as stack:
        text_fh, phrase_fh, deid_fh = (
            stack.enter_context(atomic_open(t, "w", newline="")) for t in targets
        )
        for note in notes:
            patient, number = split_note_id(note)
            if _END in note.text:
                raise FormatError(f"note {note.id}: text contains the record marker {_END}")
            text_fh.write(f"START_OF_RECORD={patient}||||{number}||||\n{note.text}{_END}\n\n")
            deid_fh.write(f"Patient {patient}  Note {number}\n")
            for s in note.spans:
                phrase_fh.write(
                    f"{patient} {number} {s.start} {s.end} {s.label} "
                    f"{normalize_ws(note.text[s.start : s.end])}\n"
                )
                deid_fh.write(f"{s.start}  {s.start}  {s.end}\n")
            n += 1
    return n


def sniff_physionet(path: Path) -> bool:
    if path.is_dir():
        return any(not p.name.startswith(".") for p in path.glob("*.text"))
    return path.suffix in (".text", ".deid") or path.name.endswith("-phi.phrase")


# --------------------------------------------------------------------------------------------
# deidpl


def _deidpl_text(path: Path, text_path: str | Path | None) -> Path:
    if text_path is not None:
        text = Path(text_path)
        if not text.is_file():
            raise FormatError(f"{text}: no such file (note texts for {path})")
        return text
    for candidate in (path.with_suffix(".text"), path.with_name("id.text")):
        if candidate.is_file():
            return candidate
    raise FormatError(
        f"{path}: deid.pl span lists carry no note text; put {path.with_suffix('.text').name} "
        "or id.text next to it, or pass text_path"
    )


def read_deidpl(
    path: Path, *, text_path: str | Path | None = None, overlaps: str = DEFAULT_OVERLAPS
) -> Iterator[Note]:
    """Read deid.pl's ``.phi`` output as notes whose spans are its (untyped) predictions."""
    del overlaps  # predictions: overlapping spans are merged, never an error
    if not path.is_file():
        raise FormatError(f"{path}: no such file")
    text = _deidpl_text(path, text_path)
    index = read_span_list(path, source=path.name)
    yield from _notes(text, index, ann_path=path, untyped=True, overlaps="merge")


def write_deidpl(notes: Iterable[Note], path: Path, *, overwrite: bool = False) -> int:
    """Write a deid.pl-style span list (``Patient P<TAB>Note N``, ``start<TAB>start<TAB>end``).

    Only the spans go out; the note texts must be written separately (e.g. as ``physionet``).
    """
    if path.exists() and not overwrite:
        raise ConfigError(f"{path}: already exists (pass overwrite to replace it)")
    n = 0
    with atomic_open(path, "w", newline="") as fh:
        for note in notes:
            patient, number = split_note_id(note)
            fh.write(f"Patient {patient}\tNote {number}\n")
            for s in note.spans:
                fh.write(f"{s.start}\t{s.start}\t{s.end}\n")
            n += 1
    return n


def sniff_deidpl(path: Path) -> bool:
    return path.is_file() and path.suffix == ".phi"


PHYSIONET = FormatSpec(
    name="physionet",
    description="PhysioNet deid: <stem>.text + <stem>-phi.phrase (typed) or <stem>.deid",
    read=read_physionet,
    write=write_physionet,
    sniff=sniff_physionet,
    suffixes=(".text", "-phi.phrase", ".deid"),
)

DEIDPL = FormatSpec(
    name="deidpl",
    description="deid.pl span lists (.phi); note texts from text_path or a sibling .text",
    read=read_deidpl,
    write=write_deidpl,
    sniff=sniff_deidpl,
    suffixes=(".phi",),
)
