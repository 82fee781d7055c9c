"""CoNLL-style token-per-line files with BIO or BIOES tags (``conll``), streamed.

Layout defined here::

    -DOCSTART- <note id> [patient=<patient id>]

    John B-PATIENT
    Smith I-PATIENT
    seen O

    next O
    sentence O

One token per line: the first column is the token, the last the tag (middle columns, as in
CoNLL-2003, are ignored); a blank line ends a sentence; ``-DOCSTART-`` starts a document. A
CoNLL-2003 style ``-DOCSTART- -X- ...`` line (no id) gets the id ``<file stem>-<k>``; tokens
before any ``-DOCSTART-`` form a document with the file stem as id. Tags are ``O`` or
``B-/I-/E-/S-`` (``L-/U-`` accepted as ``E-/S-``) plus a known label. Sequences are decoded
leniently, as conlleval does: an ``I-``/``E-`` that does not continue a span of its label starts
one; a span never crosses a sentence boundary.

The text is rebuilt by joining tokens with single spaces and sentences with ``\\n``: whitespace is
normalized, so a round trip is exact only for normalized text (single spaces, single newlines, no
leading/trailing whitespace) whose spans start and end at whitespace token edges and contain no
newline. The writer
splits the text on whitespace keeping offsets, splits tokens further at span edges (so every span
comes back with its text and label; ``MorganLee`` with two spans comes back as ``Morgan Lee``),
and starts a new sentence at each newline that no span crosses (a newline inside a span becomes a
space, since a span never crosses a sentence boundary). Ids and patient ids must not
contain whitespace.
"""

from __future__ import annotations

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
)
from dphub.io import atomic_open
from dphub.notes import Note, Span

DOCSTART = "-DOCSTART-"
_TAG = re.compile(r"([BIESLU])-(\S+)")
SCHEMES = ("bio", "bioes")


class _DocBuilder:
    """Accumulates one document's tokens, text and spans."""

    def __init__(self, note_id: str, patient_id: str | None, lineno: int) -> None:
        self.note_id = note_id
        self.patient_id = patient_id
        self.lineno = lineno
        self.parts: list[str] = []
        self.length = 0
        self.sentence_open = False
        self.pairs: list[tuple[Span, str]] = []
        self.current: tuple[str, int, int, str] | None = None  # label, start, end, where

    def close_span(self) -> None:
        if self.current is not None:
            label, start, end, where = self.current
            self.pairs.append((make_span(label, start, end, where=where), where))
            self.current = None

    def end_sentence(self) -> None:
        self.close_span()
        self.sentence_open = False

    def add(self, token: str, tag: str, where: str) -> None:
        if self.length and not self.sentence_open:
            self.parts.append("\n")
            self.length += 1
        elif self.sentence_open:
            self.parts.append(" ")
            self.length += 1
        self.sentence_open = True
        start = self.length
        self.parts.append(token)
        self.length += len(token)
        if tag == "O":
            self.close_span()
            return
        m = _TAG.fullmatch(tag)
        if m is None:
            raise FormatError(f"{where}: tag must be O or B-/I-/E-/S-<label>")
        prefix, label = m[1], m[2]
        make_span(label, 0, 1, where=where)  # unknown labels fail on their own line
        continues = (
            prefix in "IEL"
            and self.current is not None
            and self.current[0].upper() == label.upper()
        )
        if continues:
            assert self.current is not None
            self.current = (self.current[0], self.current[1], self.length, self.current[3])
        else:
            self.close_span()
            self.current = (label, start, self.length, where)
        if prefix in "ESLU":
            self.close_span()

    def note(self, *, source: Path, overlaps: str) -> Note:
        self.end_sentence()
        text = "".join(self.parts)
        spans = finish_spans(self.pairs, text, record=f"{source}:{self.lineno}: "
                             f"document {self.note_id}", overlaps=overlaps)
        return Note(id=self.note_id, text=text, patient_id=self.patient_id, spans=spans,
                    labelled=True)


def read_conll(path: Path, *, overlaps: str = DEFAULT_OVERLAPS) -> Iterator[Note]:
    """Stream documents of a CoNLL BIO/BIOES file."""
    stem = path.name[: -len(path.suffix) or None]
    doc: _DocBuilder | None = None
    anonymous = 0
    for lineno, line in iter_lines(path):
        fields = line.split()
        where = f"{path}:{lineno}"
        if not fields:
            if doc is not None:
                doc.end_sentence()
            continue
        if fields[0] == DOCSTART:
            if doc is not None:
                yield doc.note(source=path, overlaps=overlaps)
            rest = fields[1:]
            if not rest or rest[0] == "-X-" or rest[0].startswith("patient="):
                anonymous += 1
                note_id = f"{stem}-{anonymous}"
                rest = rest[1:] if rest and rest[0] == "-X-" else rest
            else:
                note_id, rest = rest[0], rest[1:]
            patient = None
            for extra in rest:
                if extra.startswith("patient="):
                    patient = extra[len("patient="):] or None
            doc = _DocBuilder(note_id, patient, lineno)
            continue
        if len(fields) < 2:
            raise FormatError(f"{where}: expected 'token tag' (two columns)")
        if doc is None:
            doc = _DocBuilder(stem, None, lineno)
        doc.add(fields[0], fields[-1], where)
    if doc is not None:
        yield doc.note(source=path, overlaps=overlaps)


def tokenize(note: Note) -> list[list[tuple[int, int]]]:
    """Sentences of ``(start, end)`` tokens: whitespace tokens split at span edges.

    A newline between two tokens starts a new sentence unless a span covers it.
    """
    edges = sorted({s.start for s in note.spans} | {s.end for s in note.spans})
    tokens: list[tuple[int, int]] = []
    for m in re.finditer(r"\S+", note.text):
        start = m.start()
        for edge in edges:
            if m.start() < edge < m.end():
                tokens.append((start, edge))
                start = edge
        tokens.append((start, m.end()))
    sentences: list[list[tuple[int, int]]] = []
    for tok in tokens:
        if sentences:
            gap_start = sentences[-1][-1][1]
            breaks = "\n" in note.text[gap_start : tok[0]] and not any(
                s.start < tok[0] and s.end > gap_start for s in note.spans
            )
            if not breaks:
                sentences[-1].append(tok)
                continue
        sentences.append([tok])
    return sentences


def _tags(note: Note, sentence: list[tuple[int, int]], scheme: str) -> list[str]:
    tags: list[str] = []
    for i, (start, end) in enumerate(sentence):
        span = next((s for s in note.spans if s.start <= start and end <= s.end), None)
        if span is None:
            tags.append("O")
            continue
        first = i == 0 or sentence[i - 1][0] < span.start
        last = i == len(sentence) - 1 or sentence[i + 1][1] > span.end
        if scheme == "bio":
            tags.append(("B-" if first else "I-") + span.label)
        else:
            prefix = "S-" if first and last else "B-" if first else "E-" if last else "I-"
            tags.append(prefix + span.label)
    return tags


def write_conll(
    notes: Iterable[Note], path: Path, *, scheme: str = "bio", overwrite: bool = False
) -> int:
    """Write notes as one CoNLL file (``scheme`` ``bio`` or ``bioes``), streaming, atomically."""
    if scheme not in SCHEMES:
        raise ConfigError(f"scheme must be one of {', '.join(SCHEMES)}, not {scheme!r}")
    if path.exists() and not overwrite:
        raise ConfigError(f"{path}: already exists (pass overwrite to replace it)")
    n = 0
    with atomic_open(path, "w", newline="") as fh:
        for note in notes:
            for value, what in ((note.id, "id"), (note.patient_id or "x", "patient id")):
                if re.search(r"\s", value) or value in ("-X-",) or value.startswith("patient="):
                    raise FormatError(f"note {note.id!r}: {what} cannot be written to CoNLL "
                                      "(no whitespace, not '-X-' or 'patient=...')")
            header = f"{DOCSTART} {note.id}"
            if note.patient_id is not None:
                header += f" patient={note.patient_id}"
            fh.write(header + "\n\n")
            for sentence in tokenize(note):
                for (start, end), tag in zip(sentence, _tags(note, sentence, scheme), strict=True):
                    token = note.text[start:end]
                    if token == DOCSTART and start == sentence[0][0]:
                        raise FormatError(f"note {note.id}: a sentence starts with {DOCSTART}")
                    fh.write(f"{token} {tag}\n")
                fh.write("\n")
            n += 1
    return n


def sniff_conll(path: Path) -> bool:
    return path.is_file() and path.suffix in (".conll", ".bio", ".bioes", ".iob", ".iob2")


CONLL = FormatSpec(
    name="conll",
    description="CoNLL BIO/BIOES: 'token tag' lines, blank line per sentence, -DOCSTART- <id>",
    read=read_conll,
    write=write_conll,
    sniff=sniff_conll,
    suffixes=(".conll", ".bio", ".bioes", ".iob", ".iob2"),
)
