"""write -> read round trips through every format, plus the writers' all-or-nothing guarantees."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dphub import formats
from dphub.errors import ConfigError, InputError
from dphub.notes import Note, Span


def _note(nid: str, text: str, pid: str | None, spans: list[tuple[str, str]],
          metadata: dict | None = None) -> Note:
    """A labelled note whose spans are given by (substring, label), found in order."""
    out, pos = [], 0
    for piece, label in spans:
        start = text.index(piece, pos)
        out.append(Span(start, start + len(piece), label))
        pos = start + len(piece)
    return Note(nid, text, pid, metadata or {}, out, labelled=True)


def hand_notes() -> list[Note]:
    """Awkward but valid notes: CRLF, XML-special characters, non-ASCII, adjacent spans."""
    return [
        _note("1-1", "Pt Quinn Harper seen 3/4/2019 at Mercy General.\r\nCall 555-0100.\n\n",
              "1", [("Quinn Harper", "PATIENT"), ("3/4/2019", "DATE"),
                    ("Mercy General", "HOSPITAL"), ("555-0100", "PHONE")]),
        _note("1-2", 'No PHI here ]]> <tag a="b"> & done\n', "1", []),
        _note("2-1", "Dr. Zoë Ångström:\tüber 😀 ok, age 87, 12/1 DOCTOR", "2",
              [("Zoë Ångström", "HCPName"), ("87", "Age"), ("12/1", "Date")]),
        _note("2-2", "Seen by MorganLee on 5/6", "2", [("Morgan", "DOCTOR"), ("Lee", "PATIENT"),
                                                     ("5/6", "DATE")]),
    ]


def normalized_notes() -> list[Note]:
    """Notes whose text CoNLL can carry exactly: single spaces, single newlines, no leading or
    trailing whitespace, spans starting and ending at whitespace token edges and not crossing a
    newline."""
    return [
        _note("1-1", "Pt Quinn Harper seen 3/4/2019\nat Mercy General .", "1",
              [("Quinn Harper", "PATIENT"), ("3/4/2019", "DATE"), ("Mercy General", "HOSPITAL")]),
        _note("1-2", "no phi here", "1", []),
        _note("2-1", "Dr. Zoë Ångström , age 87\ncall 555-0100", None,
              [("Zoë Ångström", "HCPName"), ("87", "AGE"), ("555-0100", "PHONE")]),
        _note("2-2", "Seen by Morgan Lee on 5/6 and\nnew line span", "2",
              [("Morgan", "DOCTOR"), ("Lee", "PATIENT"), ("5/6", "DATE"),
               ("new line", "LOCATION")]),
    ]


def key(note: Note, *, patient: bool = True, metadata: bool = False) -> tuple:
    return (
        note.id,
        note.text,
        note.patient_id if patient else None,
        [(s.start, s.end, s.label) for s in note.spans],
        note.metadata if metadata else None,
    )


def with_metadata(notes: list[Note]) -> list[Note]:
    for n in notes:
        n.metadata = {"ward": "3B", "n": 1}
    return notes


FILE_TARGETS = {"physionet": "corpus/id.text", "jsonl": "notes.jsonl", "conll": "notes.conll",
                "i2b2": "xml", "brat": "brat", "text": "text"}


@pytest.mark.parametrize("fmt", ["physionet", "jsonl", "i2b2", "brat"])
def test_exact_round_trip(tmp_path: Path, fmt: str) -> None:
    notes = hand_notes()
    out = tmp_path / FILE_TARGETS[fmt]
    assert formats.write(notes, out, fmt) == len(notes)
    back = list(formats.read(out if fmt != "physionet" else out.parent))
    assert formats.detect_format(out) == fmt
    assert [key(n) for n in back] == [key(n) for n in notes]
    assert all(n.labelled for n in back)


@pytest.mark.parametrize("fmt", ["jsonl", "i2b2", "brat", "text"])
def test_metadata_and_patient_survive(tmp_path: Path, fmt: str) -> None:
    notes = with_metadata(hand_notes())
    notes[0].patient_id = "patient-A"  # not implied by the id: needs the sidecar in i2b2
    out = tmp_path / FILE_TARGETS[fmt]
    formats.write(notes, out, fmt)
    back = list(formats.read(out, fmt))
    assert [(n.id, n.patient_id, n.metadata) for n in back] == [
        (n.id, n.patient_id, n.metadata) for n in notes
    ]


def test_text_format_keeps_text_drops_spans(tmp_path: Path) -> None:
    notes = hand_notes()
    formats.write(notes, tmp_path / "t", "text")
    back = list(formats.read(tmp_path / "t"))
    assert [(n.id, n.text, n.patient_id) for n in back] == [
        (n.id, n.text, n.patient_id) for n in notes
    ]
    assert all(not n.labelled and not n.spans for n in back)


@pytest.mark.parametrize("scheme", ["bio", "bioes"])
def test_conll_round_trip_on_normalized_text(tmp_path: Path, scheme: str) -> None:
    notes = normalized_notes()
    out = tmp_path / "notes.conll"
    formats.write(notes, out, "conll", scheme=scheme)
    back = list(formats.read(out))
    assert [key(n) for n in back] == [key(n) for n in notes]
    tags = {line.split()[-1][:2] for line in out.read_text().splitlines()
            if line and not line.startswith("-DOCSTART-")}
    assert ("E-" in tags) == (scheme == "bioes")


def test_conll_normalizes_whitespace_but_keeps_span_texts(tmp_path: Path) -> None:
    notes = hand_notes()
    formats.write(notes, tmp_path / "n.conll", "conll")
    back = list(formats.read(tmp_path / "n.conll"))
    for a, b in zip(notes, back, strict=True):
        # tokens split at span edges ("MorganLee" -> "Morgan Lee") gain a space; nothing else
        assert "".join(b.text.split()) == "".join(a.text.split())
        assert "  " not in b.text and "\n\n" not in b.text and b.text == b.text.strip()
        assert [(" ".join(a.span_text(s).split()), s.label) for s in a.spans] == [
            (b.span_text(s), s.label) for s in b.spans
        ]


def test_deidpl_round_trip_against_physionet_texts(tmp_path: Path) -> None:
    notes = hand_notes()
    formats.write(notes, tmp_path / "id.text", "physionet")
    formats.write(notes, tmp_path / "id.phi", "deidpl")
    back = list(formats.read(tmp_path / "id.phi"))
    assert [(n.id, [(s.start, s.end) for s in n.spans]) for n in back] == [
        (n.id, [(s.start, s.end) for s in n.spans]) for n in notes
    ]
    assert {s.label for n in back for s in n.spans} == {"OTHER"}
    assert all(n.metadata == {"untyped": True} for n in back)


def test_synthetic_notes_round_trip_through_every_format(tmp_path: Path) -> None:
    synth = pytest.importorskip("dphub.synth")
    notes = synth.generate(4, "nursing", seed=3) + synth.generate(2, "discharge", seed=3)
    assert sum(len(n.spans) for n in notes) > 10
    for fmt in ("physionet", "jsonl", "i2b2", "brat"):
        out = tmp_path / FILE_TARGETS[fmt]
        formats.write(notes, out, fmt)
        back = list(formats.read(out, fmt))
        assert sorted(key(n) for n in back) == sorted(key(n) for n in notes), fmt
    formats.write(notes, tmp_path / "s.conll", "conll", scheme="bioes")
    back = list(formats.read(tmp_path / "s.conll"))
    assert [[(" ".join(a.span_text(s).split()), s.label) for s in a.spans] for a in notes] == [
        [(b.span_text(s), s.label) for s in b.spans] for b in back
    ]


def _failing(notes: list[Note]) -> Iterator[Note]:
    yield notes[0]
    yield notes[1]
    raise RuntimeError("source broke mid-stream")


@pytest.mark.parametrize("fmt", sorted(FILE_TARGETS))
def test_failed_write_leaves_nothing(tmp_path: Path, fmt: str) -> None:
    out = tmp_path / FILE_TARGETS[fmt]
    with pytest.raises(RuntimeError):
        formats.write(_failing(hand_notes()), out, fmt)
    leftovers = [p for p in tmp_path.rglob("*")
                 if p.is_file() or (p.is_dir() and any(p.iterdir()))]
    assert leftovers == []


def test_write_validates_spans_and_ids(tmp_path: Path) -> None:
    bad = Note("x", "abcdef", None, {}, [Span(0, 3, "NAME"), Span(2, 4, "DATE")], True)
    with pytest.raises(InputError, match="overlap"):
        formats.write([bad], tmp_path / "a.jsonl", "jsonl")
    dup = hand_notes()[:1] * 2
    with pytest.raises(InputError, match="duplicate note id"):
        formats.write(dup, tmp_path / "b.jsonl", "jsonl")
    assert list(tmp_path.iterdir()) == []


def test_existing_target_needs_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "n.jsonl"
    formats.write(hand_notes(), out, "jsonl")
    before = out.read_bytes()
    with pytest.raises(ConfigError, match="already exists"):
        formats.write(hand_notes()[:1], out, "jsonl")
    assert out.read_bytes() == before
    formats.write(hand_notes()[:1], out, "jsonl", overwrite=True)
    assert formats.count(out) == 1


def test_physionet_writer_needs_patient_note_ids(tmp_path: Path) -> None:
    note = Note("note one", "text", None, {}, [], True)
    with pytest.raises(InputError, match="P-N"):
        formats.write([note], tmp_path / "c", "physionet")
    assert not (tmp_path / "c").exists() or list((tmp_path / "c").iterdir()) == []
