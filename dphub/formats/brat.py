"""brat standoff (``brat``): a directory of ``<note>.txt`` + ``<note>.ann`` pairs.

``.ann`` text-bound lines are ``T<id><TAB><LABEL> <start> <end><TAB><text>``; the text must
match the slice (whitespace-insensitively: brat writes a multi-line span's text on one line).
Discontinuous spans (``start end;start end``) have no counterpart in dphub and are an error.
Other annotation lines (``#`` notes, ``A``/``M`` attributes, ``R`` relations, ``E`` events, ``N``
normalizations, ``*`` equivalences) are ignored. Every ``.txt`` needs its ``.ann`` (an empty
``.ann`` means "no PHI"); an ``.ann`` without ``.txt`` is an error too.

Directories are read recursively in sorted order; the note id is the relative path without
``.txt``; a path to one ``.txt`` or ``.ann`` reads that note. brat has no patients: the patient id
is None unless a ``<note>.meta.json`` sidecar (``{"patient_id", "metadata"}``, see
:mod:`dphub.formats._base`) gives one; the writer writes a sidecar only when there is something to
keep.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path

from dphub.errors import FormatError
from dphub.formats._base import (
    DEFAULT_OVERLAPS,
    FormatSpec,
    finish_spans,
    iter_lines,
    iter_note_files,
    make_span,
    normalize_ws,
    parse_int,
    read_sidecar,
    read_text,
    same_text,
    write_note_files,
)
from dphub.notes import Note, Span

_OFFSETS = re.compile(r"(\d+) (\d+)")
_IGNORED = ("#", "A", "M", "R", "E", "N", "*")


def parse_pair(txt: Path, ann: Path, note_id: str, *, overlaps: str = DEFAULT_OVERLAPS) -> Note:
    """Parse one ``.txt`` + ``.ann`` pair."""
    text = read_text(txt)
    if not ann.is_file():
        raise FormatError(f"{txt}: no matching annotation file {ann.name}")
    pairs: list[tuple[Span, str]] = []
    ids: set[str] = set()
    for lineno, line in iter_lines(ann, allow_empty=True):
        content = line.rstrip("\r\n")
        if not content.strip():
            continue
        where = f"{ann}:{lineno}"
        if content.startswith(_IGNORED):
            continue
        if not content.startswith("T"):
            raise FormatError(f"{where}: unknown annotation line (expected T, #, A, R, E, N, M)")
        fields = content.split("\t")
        if len(fields) < 3:
            raise FormatError(f"{where}: expected 'T<id><TAB>LABEL start end<TAB>text'")
        tid, middle, quoted = fields[0], fields[1], "\t".join(fields[2:])
        if tid in ids:
            raise FormatError(f"{where}: annotation id {tid} is used twice")
        ids.add(tid)
        label, _, offsets = middle.partition(" ")
        if ";" in offsets:
            raise FormatError(f"{where}: discontinuous span (start end;start end) is not supported")
        m = _OFFSETS.fullmatch(offsets.strip())
        if not label or m is None:
            raise FormatError(f"{where}: expected 'LABEL start end' in the second field")
        start = parse_int(m[1], what="start", where=where)
        end = parse_int(m[2], what="end", where=where)
        span = make_span(label, start, end, where=where)
        if 0 <= start < end <= len(text) and not same_text(quoted, text[start:end]):
            raise FormatError(f"{where}: span text does not match the note at {start}-{end}")
        pairs.append((span, where))
    spans = finish_spans(pairs, text, record=str(ann), overlaps=overlaps)
    side = read_sidecar(txt)
    patient, metadata = side if side is not None else (None, {})
    return Note(id=note_id, text=text, patient_id=patient, metadata=metadata, spans=spans,
                labelled=True)


def read_brat(path: Path, *, overlaps: str = DEFAULT_OVERLAPS) -> Iterator[Note]:
    """Read a brat directory (recursively) or a single ``.txt``/``.ann`` note."""
    if not path.is_dir():
        if path.suffix not in (".txt", ".ann"):
            raise FormatError(f"{path}: expected a brat directory, .txt or .ann file")
        txt, ann = path.with_suffix(".txt"), path.with_suffix(".ann")
        if not txt.is_file():
            raise FormatError(f"{ann}: no matching text file {txt.name}")
        yield parse_pair(txt, ann, path.stem, overlaps=overlaps)
        return
    texts = dict(iter_note_files(path, ".txt"))
    for note_id, ann in iter_note_files(path, ".ann"):
        if note_id not in texts:
            raise FormatError(f"{ann}: no matching text file {Path(note_id).name}.txt")
    for note_id, txt in texts.items():
        yield parse_pair(txt, txt.with_suffix(".ann"), note_id, overlaps=overlaps)


def each_brat(path: Path, *, overlaps: str = DEFAULT_OVERLAPS
              ) -> Iterator[tuple[str, Callable[[], Note]]]:
    """Per note of a brat directory, a loader that parses that note alone (see ``read_each``)."""
    texts = dict(iter_note_files(path, ".txt"))
    for note_id, ann in iter_note_files(path, ".ann"):
        if note_id not in texts:
            def orphan(ann: Path = ann, note_id: str = note_id) -> Note:
                raise FormatError(f"{ann}: no matching text file {Path(note_id).name}.txt")
            yield note_id, orphan
    for note_id, txt in texts.items():
        yield note_id, partial(parse_pair, txt, txt.with_suffix(".ann"), note_id,
                               overlaps=overlaps)


def render_ann(note: Note) -> str:
    """The ``.ann`` lines of a note's spans."""
    return "".join(
        f"T{k}\t{s.label} {s.start} {s.end}\t{normalize_ws(note.text[s.start : s.end])}\n"
        for k, s in enumerate(note.spans, 1)
    )


def write_brat(notes: Iterable[Note], path: Path, *, overwrite: bool = False) -> int:
    """Write a brat directory (built under a temp name, moved into place when complete)."""
    return write_note_files(notes, path, format_name="brat", overwrite=overwrite,
                            companions=lambda note: {".ann": render_ann(note)})


def sniff_brat(path: Path) -> bool:
    if path.is_dir():
        return next(iter_note_files(path, ".ann"), None) is not None
    if path.suffix == ".ann":
        return True
    return path.suffix == ".txt" and path.with_suffix(".ann").is_file()


BRAT = FormatSpec(
    name="brat",
    description="brat standoff: directory of .txt + .ann (T lines; no discontinuous spans)",
    read=read_brat,
    write=write_brat,
    sniff=sniff_brat,
    suffixes=(".ann",),
    read_each=each_brat,
)
