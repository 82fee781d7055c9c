"""i2b2 2014 de-identification XML (``i2b2``): one file per note, or a directory of them.

::

    <?xml version="1.0" encoding="UTF-8" ?>
    <deIdi2b2>
    <TEXT><![CDATA[...note text...]]></TEXT>
    <TAGS>
    <NAME id="P0" start="16" end="20" text="..." TYPE="PATIENT" comment="" />
    </TAGS>
    </deIdi2b2>

The tag element is the category, ``TYPE`` the label kept in ``Span.label`` (the element name when
``TYPE`` is absent); the two must agree (``NAME`` + ``DATE`` is an error). ``text`` must match the
slice (whitespace-insensitively: XML normalizes whitespace in attributes).

Parsing uses the stdlib expat parser directly (what ``xml.etree`` runs on) so that errors name the
line of the bad tag. DOCTYPE and entity declarations are refused before anything is expanded.
XML parsers turn ``\\r\\n`` into ``\\n`` even inside CDATA, which would shift every offset of a
CRLF note; carriage returns inside CDATA sections are therefore swapped for a private-use
character before parsing and restored after, so the text is the file's characters exactly.

Note ids are the file name without ``.xml`` (relative path in a directory). i2b2 2014 names files
``PPP-NN.xml`` (patient PPP, record NN): such ids get patient id ``PPP``; a ``.meta.json``
sidecar (see :mod:`dphub.formats._base`) overrides that and carries metadata.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any
from xml.parsers import expat

from dphub.errors import ConfigError, FormatError
from dphub.formats._base import (
    DEFAULT_OVERLAPS,
    FormatSpec,
    finish_spans,
    iter_note_files,
    make_span,
    note_relpath,
    parse_int,
    read_sidecar,
    read_text,
    same_text,
    sidecar_path,
    sidecar_payload,
)
from dphub.io import atomic_directory, atomic_open, atomic_write_text
from dphub.labels import category_of
from dphub.notes import Note, Span

ROOT = "deIdi2b2"
_CDATA = re.compile(r"<!\[CDATA\[.*?\]\]>", re.S)
_PATIENT_FROM_NAME = re.compile(r"(\d+)-(\d+)")
# Characters XML 1.0 cannot carry, even in CDATA.
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


class _Doc:
    """What the expat callbacks collect from one file."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.text_parts: list[str] = []
        self.saw_text = False
        self.tags: list[tuple[str, dict[str, str], int]] = []


def _patient_from_id(note_id: str) -> str | None:
    m = _PATIENT_FROM_NAME.fullmatch(note_id.rsplit("/", 1)[-1])
    return m[1] if m else None


def parse_file(path: Path, note_id: str, *, overlaps: str = DEFAULT_OVERLAPS) -> Note:
    """Parse one i2b2 XML file into a note."""
    raw = read_text(path)
    outside_cdata = _CDATA.sub("", raw)
    if "<!DOCTYPE" in outside_cdata or "<!ENTITY" in outside_cdata:
        raise FormatError(f"{path}: DOCTYPE/ENTITY declarations are not allowed in i2b2 files")
    cr = "\ue000"
    while cr in raw:
        cr = chr(ord(cr) + 1)
    doc = _Doc()
    parser = expat.ParserCreate(encoding="UTF-8")

    def refuse(*_: Any) -> None:
        raise FormatError(
            f"{path}:{parser.CurrentLineNumber}: DOCTYPE/ENTITY declarations are not allowed"
        )

    def start(name: str, attrs: dict[str, str]) -> None:
        depth = len(doc.stack)
        if depth == 0 and name != ROOT:
            raise FormatError(f"{path}:{parser.CurrentLineNumber}: root element must be <{ROOT}>")
        if depth == 1 and name == "TEXT":
            doc.saw_text = True
        if depth == 2 and doc.stack[1] == "TAGS":
            doc.tags.append((name, attrs, parser.CurrentLineNumber))
        doc.stack.append(name)

    def end(name: str) -> None:
        doc.stack.pop()

    def chars(data: str) -> None:
        if len(doc.stack) == 2 and doc.stack[1] == "TEXT":
            doc.text_parts.append(data)

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    try:
        protected = _CDATA.sub(lambda m: m[0].replace("\r", cr), raw)
        parser.Parse(protected.encode("utf-8"), True)
    except expat.ExpatError as e:
        raise FormatError(
            f"{path}:{e.lineno}: not well-formed XML ({expat.ErrorString(e.code)})"
        ) from None
    if not doc.saw_text:
        raise FormatError(f"{path}: no <TEXT> element")
    text = "".join(doc.text_parts).replace(cr, "\r")
    pairs: list[tuple[Span, str]] = []
    for element, attrs0, lineno in doc.tags:
        attrs = {k: v.replace(cr, "\r") for k, v in attrs0.items()}
        where = f"{path}:{lineno}"
        category = make_span(element, 0, 1, where=where).category
        for key in ("start", "end"):
            if key not in attrs:
                raise FormatError(f"{where}: <{element}> tag has no {key!r} attribute")
        s = parse_int(attrs["start"], what="start", where=where)
        e = parse_int(attrs["end"], what="end", where=where)
        label = attrs.get("TYPE") or element
        span = make_span(label, s, e, where=where)
        if category_of(span.label) != category:
            raise FormatError(
                f"{where}: TYPE {label!r} is not a subcategory of <{element}>"
            )
        if "text" in attrs and 0 <= s < e <= len(text) and not same_text(attrs["text"], text[s:e]):
            raise FormatError(f"{where}: the tag's text attribute does not match {s}-{e}")
        pairs.append((span, where))
    spans = finish_spans(pairs, text, record=f"{path}", overlaps=overlaps)
    side = read_sidecar(path)
    patient, metadata = side if side is not None else (_patient_from_id(note_id), {})
    return Note(id=note_id, text=text, patient_id=patient, metadata=metadata, spans=spans,
                labelled=True)


def read_i2b2(path: Path, *, overlaps: str = DEFAULT_OVERLAPS) -> Iterator[Note]:
    """Read one ``.xml`` file or every ``.xml`` under a directory (sorted, recursive)."""
    if path.is_dir():
        for note_id, file in iter_note_files(path, ".xml"):
            yield parse_file(file, note_id, overlaps=overlaps)
    else:
        yield parse_file(path, path.name[: -len(path.suffix) or None], overlaps=overlaps)


def each_i2b2(path: Path, *, overlaps: str = DEFAULT_OVERLAPS
              ) -> Iterator[tuple[str, Callable[[], Note]]]:
    """Per ``.xml`` under a directory, a loader that parses that note alone (see ``read_each``)."""
    for note_id, file in iter_note_files(path, ".xml"):
        yield note_id, partial(parse_file, file, note_id, overlaps=overlaps)


def _attr(value: str) -> str:
    """Escape an attribute value so that a parser gives back exactly ``value``."""
    return (
        value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        .replace('"', "&quot;").replace("\r", "&#13;").replace("\n", "&#10;")
        .replace("\t", "&#9;")
    )


def render(note: Note) -> str:
    """One note as an i2b2 2014 XML document."""
    if _XML_ILLEGAL.search(note.text):
        raise FormatError(f"note {note.id}: text contains control characters XML cannot carry")
    cdata = note.text.replace("]]>", "]]]]><![CDATA[>")
    lines = ['<?xml version="1.0" encoding="UTF-8" ?>', f"<{ROOT}>",
             f"<TEXT><![CDATA[{cdata}]]></TEXT>", "<TAGS>"]
    for k, s in enumerate(note.spans):
        lines.append(
            f'<{s.category} id="P{k}" start="{s.start}" end="{s.end}" '
            f'text="{_attr(note.text[s.start : s.end])}" TYPE="{_attr(s.label)}" comment="" />'
        )
    lines += ["</TAGS>", f"</{ROOT}>", ""]
    return "\n".join(lines)


def write_i2b2(notes: Iterable[Note], path: Path, *, overwrite: bool = False) -> int:
    """Write one ``.xml`` (``path`` ends in ``.xml``: exactly one note) or a directory of them.

    ``TYPE`` is the note's label verbatim (so any dphub label round-trips), the element its
    category. A sidecar is written where the patient id is not implied by the file name or the
    note has metadata.
    """
    if path.suffix == ".xml":
        it = iter(notes)
        note = next(it, None)
        if note is None or next(it, None) is not None:
            raise ConfigError(f"{path}: a single .xml file holds exactly one note; "
                              "write to a directory instead")
        if path.exists() and not overwrite:
            raise ConfigError(f"{path}: already exists (pass overwrite to replace it)")
        payload = sidecar_payload(note, _patient_from_id(path.stem))
        with atomic_open(path, "w", newline="") as fh:
            fh.write(render(note))
            if payload is not None:
                atomic_write_text(sidecar_path(path), payload)
        return 1
    if path.exists() and any(path.iterdir()) and not overwrite:
        raise ConfigError(f"{path}: directory exists and is not empty (pass overwrite)")
    n = 0
    with atomic_directory(path, overwrite=True) as tmp:
        for note in notes:
            rel = note_relpath(note.id, ".xml")
            atomic_write_text(tmp / rel, render(note))
            payload = sidecar_payload(note, _patient_from_id(note.id))
            if payload is not None:
                atomic_write_text(sidecar_path(tmp / rel), payload)
            n += 1
    return n


def sniff_i2b2(path: Path) -> bool:
    if path.is_dir():
        return any(p.suffix == ".xml" for p in path.rglob("*.xml") if not p.name.startswith("."))
    return path.suffix == ".xml"


I2B2 = FormatSpec(
    name="i2b2",
    description="i2b2 2014 XML (<deIdi2b2>): one .xml file or a directory of them",
    read=read_i2b2,
    write=write_i2b2,
    sniff=sniff_i2b2,
    suffixes=(".xml",),
    read_each=each_i2b2,
)
