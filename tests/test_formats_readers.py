"""Reader details per format: layouts as found in the wild, streaming, detection, registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dphub import formats
from dphub.errors import ConfigError, FormatError

BODY = "Patient Jane Roe seen 3/4.\n\n"  # PhysioNet bodies end with the newlines before the marker


def _phys(tmp: Path, text: str, phrase: str | None = None, deid: str | None = None) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "id.text").write_text(text, newline="")
    if phrase is not None:
        (tmp / "id-phi.phrase").write_text(phrase)
    if deid is not None:
        (tmp / "id.deid").write_text(deid)
    return tmp


def test_registry_names_every_format() -> None:
    assert set(formats.FORMATS) == {"physionet", "deidpl", "i2b2", "brat", "jsonl", "conll",
                                    "csv", "text"}
    with pytest.raises(ConfigError, match="unknown corpus format"):
        formats.read(".", format="xlsx")


def test_unknown_option_is_a_config_error(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_text(json.dumps({"id": "a", "text": "x"}) + "\n")
    with pytest.raises(ConfigError, match="takes options"):
        formats.read(f, colour="red")


def test_physionet_body_boundaries_and_paths(tmp_path: Path) -> None:
    rec = f"START_OF_RECORD=7||||2||||\n{BODY}||||END_OF_RECORD\n\n"
    rec2 = "START_OF_RECORD=7||||3||||\nno phi||||END_OF_RECORD\n"
    d = _phys(tmp_path / "c", rec + rec2, phrase="7 2 8 16 PTName Jane Roe\n7 2 22 25 Date 3/4\n")
    for path in (d, d / "id.text", d / "id-phi.phrase"):
        notes = list(formats.read(path))
        assert [(n.id, n.patient_id) for n in notes] == [("7-2", "7"), ("7-3", "7")]
        assert notes[0].text == BODY and notes[1].text == "no phi"
        assert [(notes[0].span_text(s), s.label) for s in notes[0].spans] == [
            ("Jane Roe", "PTName"), ("3/4", "Date")]
        assert formats.detect_format(path) == "physionet"


def test_physionet_untyped_deid_and_unlabelled(tmp_path: Path) -> None:
    rec = f"START_OF_RECORD=7||||2||||\n{BODY}||||END_OF_RECORD\n"
    d = _phys(tmp_path / "u", rec, deid="Patient 7  Note 2\n8  8  16\n")
    (note,) = formats.read(d)
    assert [(s.start, s.end, s.label) for s in note.spans] == [(8, 16, "OTHER")]
    assert note.metadata == {"untyped": True} and note.labelled
    d2 = _phys(tmp_path / "plain", rec)
    (plain,) = formats.read(d2)
    assert not plain.labelled and plain.spans == []


def test_same_label_overlap_merges_by_default_and_fails_when_asked(tmp_path: Path) -> None:
    rec = "START_OF_RECORD=1||||1||||\nFrom Zandrit-Vornakton Hosp today\n||||END_OF_RECORD\n"
    phrase = "1 1 5 22 Location Zandrit-Vornakton\n1 1 13 27 Location Vornakton Hosp\n"
    d = _phys(tmp_path / "o", rec, phrase=phrase)
    (note,) = formats.read(d)
    assert [(s.start, s.end) for s in note.spans] == [(5, 27)]
    with pytest.raises(FormatError, match=r"id-phi.phrase:2: span 13-27 .* overlaps"):
        list(formats.read(d, overlaps="error"))
    (kept,) = formats.read(d, overlaps="keep")
    assert [(s.start, s.end) for s in kept.spans] == [(5, 22), (13, 27)]


def test_deidpl_headers_with_tab_or_spaces_and_text_path(tmp_path: Path) -> None:
    rec = f"START_OF_RECORD=7||||2||||\n{BODY}||||END_OF_RECORD\n"
    texts = _phys(tmp_path / "texts", rec)
    for sep in ("\t", "  "):
        phi = tmp_path / f"out{len(sep)}.phi"
        phi.write_text(f"Patient 7{sep}Note 2\n8{sep}8{sep}16\n12{sep}12{sep}16\n")
        with pytest.raises(FormatError, match="carry no note text"):
            list(formats.read(phi))
        (note,) = formats.read(phi, text_path=texts / "id.text")
        assert [(s.start, s.end, s.label) for s in note.spans] == [(8, 16, "OTHER")]
        assert formats.detect_format(phi) == "deidpl"


def test_i2b2_keeps_crlf_and_cdata_exactly(tmp_path: Path) -> None:
    text = "Record date: 2069-04-07\r\nJohn  Smith\r\n"
    xml = ('<?xml version="1.0" encoding="UTF-8" ?>\r\n<deIdi2b2>\r\n<TEXT><![CDATA['
           f"{text}]]></TEXT>\r\n<TAGS>\r\n"
           '<DATE id="P0" start="13" end="23" text="2069-04-07" TYPE="DATE" comment="" />\r\n'
           '<NAME id="P1" start="25" end="36" text="John  Smith" TYPE="PATIENT" comment="" />\r\n'
           "</TAGS>\r\n</deIdi2b2>\r\n")
    f = tmp_path / "110-02.xml"
    f.write_bytes(xml.encode())
    (note,) = formats.read(f)
    assert note.text == text
    assert note.id == "110-02" and note.patient_id == "110"
    assert [(note.span_text(s), s.label) for s in note.spans] == [
        ("2069-04-07", "DATE"), ("John  Smith", "PATIENT")]


def test_brat_ignores_notes_and_attributes_and_reads_nested_dirs(tmp_path: Path) -> None:
    d = tmp_path / "b" / "ward"
    d.mkdir(parents=True)
    (d / "n1.txt").write_text("Seen by Dr Ames.\n")
    (d / "n1.ann").write_text("T1\tDOCTOR 11 15\tAmes\n#1\tAnnotatorNotes T1\tchecked\n"
                              "A1\tUncertain T1\n")
    (note,) = formats.read(tmp_path / "b")
    assert note.id == "ward/n1" and note.patient_id is None
    assert [(note.span_text(s), s.label) for s in note.spans] == [("Ames", "DOCTOR")]
    assert formats.detect_format(tmp_path / "b") == "brat"


def test_jsonl_streams_and_accepts_meta_convention(tmp_path: Path) -> None:
    f = tmp_path / "n.jsonl"
    lines = [
        json.dumps({"meta": {"note_id": "a", "patient_id": "p", "site": "x"}, "text": "Ann here",
                    "spans": [{"start": 0, "end": 3, "label": "PATIENT", "text": "Ann"}]}),
        "",
        json.dumps({"id": 5, "text": "no labels"}),
        "{broken",
    ]
    f.write_text("\n".join(lines) + "\n")
    it = formats.read(f)
    first = next(it)
    assert (first.id, first.patient_id, first.metadata) == ("a", "p", {"site": "x"})
    second = next(it)  # read before the broken line is reached: streamed, not loaded whole
    assert (second.id, second.labelled) == ("5", False)
    with pytest.raises(FormatError, match=r"n.jsonl:4: invalid JSON"):
        next(it)


def test_conll_reads_conll2003_columns_bioes_and_lenient_inside(tmp_path: Path) -> None:
    f = tmp_path / "x.conll"
    f.write_text(
        "-DOCSTART- -X- -X- O\n\n"
        "Mr NNP B-NP O\nJohn NNP I-NP I-PATIENT\nSmith NNP I-NP E-PATIENT\nleft VBD B-VP O\n\n"
        "Boston NNP B-NP S-CITY\n\n"
        "-DOCSTART- doc2 patient=p9\n\nseen O\non O\n5/6 B-DATE\n"
    )
    a, b = formats.read(f)
    assert a.id == "x-1" and a.text == "Mr John Smith left\nBoston"
    assert [(a.span_text(s), s.label) for s in a.spans] == [("John Smith", "PATIENT"),
                                                          ("Boston", "CITY")]
    assert (b.id, b.patient_id, b.text) == ("doc2", "p9", "seen on 5/6")
    assert [b.span_text(s) for s in b.spans] == ["5/6"]


def test_text_directory_ids_sorted_recursive_hidden_skipped(tmp_path: Path) -> None:
    d = tmp_path / "t"
    (d / "b").mkdir(parents=True)
    (d / ".cache").mkdir()
    (d / "z.txt").write_text("last")
    (d / "b" / "a.txt").write_text("first")
    (d / ".cache" / "x.txt").write_text("hidden")
    (d / ".tmp.txt").write_text("hidden")
    notes = list(formats.read(d))
    assert [(n.id, n.text, n.labelled) for n in notes] == [("b/a", "first", False),
                                                         ("z", "last", False)]
    assert formats.detect_format(d) == "text" and formats.count(d) == 2


def test_missing_path_and_undetectable_file(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="no such file"):
        formats.read(tmp_path / "nope.jsonl")
    f = tmp_path / "notes.xlsx"  # a CSV is a format since issue 56
    f.write_text("a,b\n")
    with pytest.raises(FormatError, match="cannot detect"):
        formats.detect_format(f)


def test_keep_policy_still_refuses_conflicting_labels(tmp_path: Path) -> None:
    f = tmp_path / "o.jsonl"
    spans = [{"start": 0, "end": 6, "label": "CITY"}, {"start": 3, "end": 10, "label": "CITY"},
             {"start": 8, "end": 12, "label": "DATE"}]  # overlaps only the second, kept span
    f.write_text(json.dumps({"id": "a", "text": "abcdefghijklmn", "spans": spans}) + "\n")
    with pytest.raises(FormatError, match=r"span 8-12 \(DATE\) overlaps span 0-6"):
        list(formats.read(f, overlaps="keep"))
    with pytest.raises(FormatError, match=r"span 8-12 \(DATE\) overlaps"):
        list(formats.read(f))
    with pytest.raises(ConfigError, match="overlaps must be one of"):
        list(formats.read(f, overlaps="ignore"))
