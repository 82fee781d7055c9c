"""The habits of the shell (issue 56, item 5): CSV input, one note on stdin, ``--encoding``,
``--gold``/``--pred`` swapped.

Notes here are synthetic sentences written by the tests.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from dphub import formats
from dphub.cli.main import main
from dphub.errors import ConfigError, FormatError

NOTE = "Patient John Smith seen on 03/04/2019 at Boston General."


# ---------------------------------------------------------------------------- CSV
def _csv(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.write_bytes(text.encode(encoding))
    return path


def test_a_csv_is_detected_and_read_with_common_headers(tmp_path: Path) -> None:
    f = _csv(tmp_path / "notes.csv",
             "\ufeffROW_ID,SUBJECT_ID,TEXT,CATEGORY\r\n"
             '1,p1,"line one\r\nline two\u2028 end, with ""quotes""",Nursing\r\n'
             "\r\n"
             "2,p2,short,\r\n")
    assert formats.detect_format(f) == "csv"
    notes = list(formats.read(f))
    assert [n.id for n in notes] == ["1", "2"]
    assert notes[0].text == 'line one\r\nline two\u2028 end, with "quotes"'
    assert [n.patient_id for n in notes] == ["p1", "p2"]
    assert notes[0].metadata == {"CATEGORY": "Nursing"} and notes[1].metadata == {}
    assert not notes[0].labelled


def test_csv_columns_by_name_and_record_numbers_without_an_id(tmp_path: Path) -> None:
    f = _csv(tmp_path / "n.csv", "body,who,other\nfirst note,a,x\nsecond,b,y\n")
    notes = list(formats.read(f))
    assert [(n.id, n.text, n.patient_id) for n in notes] == [("1", "first note", None),
                                                             ("2", "second", None)]
    with formats.reading(text_column="other", id_column="body", patient_column="who"):
        notes = list(formats.read(f))
    assert [(n.id, n.text, n.patient_id) for n in notes] == [("first note", "x", "a"),
                                                             ("second", "y", "b")]
    t = _csv(tmp_path / "n.tsv", "id\ttext\nk1\ta, b\n")
    assert [(n.id, n.text) for n in formats.read(t)] == [("k1", "a, b")]


@pytest.mark.parametrize(("content", "options", "needle"), [
    ("name,age\nJohn Smith,44\n", {}, "no text column found"),
    ("text\nx\n", {"text_column": "body"}, "no column 'body'"),
    ("id,text\n1,x,extra\n", {}, "record 1 has 3 fields"),
    ('id,text\n1,"open\n', {}, "malformed CSV"),
    ("id,text\n,x\n", {}, "empty id"),
])
def test_csv_errors_name_the_file_never_a_value(tmp_path: Path, content: str,
                                                options: dict[str, str], needle: str) -> None:
    f = _csv(tmp_path / "bad.csv", content)
    with pytest.raises(FormatError, match=needle) as e, formats.reading(**options):
        list(formats.read(f))
    assert "bad.csv" in e.value.message and "John" not in e.value.message


def test_csv_duplicate_ids_refused(tmp_path: Path) -> None:
    f = _csv(tmp_path / "d.csv", "id,text\n1,a\n1,b\n")
    with pytest.raises(FormatError, match="duplicate note id"):
        list(formats.read(f))


def test_csv_write_read_round_trip(tmp_path: Path) -> None:
    from dphub.notes import Note

    notes = [Note(id="a", text="x,\n\"y\"\u2028z", patient_id="p"), Note(id="b", text="plain")]
    formats.write(notes, tmp_path / "o.csv", "csv")
    back = list(formats.read(tmp_path / "o.csv"))
    assert [(n.id, n.text, n.patient_id) for n in back] == [("a", notes[0].text, "p"),
                                                           ("b", "plain", None)]


def test_csv_long_field_is_read(tmp_path: Path) -> None:
    """The csv module's default field limit (128 KiB) is below a long note."""
    long = "word " * 40_000
    f = _csv(tmp_path / "l.csv", f'id,text\n1,"{long}"\n')
    assert next(iter(formats.read(f))).text == long


def test_deid_reads_a_csv_with_column_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    _csv(tmp_path / "n.csv", f'who,body,key\np1,"{NOTE}",k1\n')
    assert main(["deid", "n.csv", "--model", "rules:default", "-o", "out",
                 "--text-column", "body", "--id-column", "key", "--patient-column", "who"]) == 0
    assert "1 note(s) de-identified" in capsys.readouterr().out
    out = (tmp_path / "out" / "k1.txt").read_text()
    assert "John" not in out and "[**NAME**]" in out


# ---------------------------------------------------------------------------- --encoding
def test_encoding_reads_a_cp1252_corpus_and_a_wrong_one_names_file_and_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    rec = json.dumps({"id": "a", "text": "Caf\u00e9 visit of John Smith",
                      "spans": [{"start": 14, "end": 24, "label": "PATIENT"}]},
                     ensure_ascii=False)
    (tmp_path / "c.jsonl").write_bytes((rec + "\n").encode("cp1252"))
    assert main(["data", "stats", "c.jsonl"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: c.jsonl:1: not valid UTF-8")
    assert "--encoding" in err[0] and "Caf" not in err[0]
    assert main(["data", "stats", "c.jsonl", "--encoding", "cp1252"]) == 0
    capsys.readouterr()
    assert main(["data", "stats", "c.jsonl", "--encoding", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown encoding 'nope'")
    assert main(["data", "stats", "c.jsonl", "--encoding", "utf-16"]) == 2
    assert "not ASCII-compatible" in capsys.readouterr().err


def test_encoding_reaches_the_deid_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_bytes(("Caf\u00e9 " + NOTE).encode("cp1252"))
    assert main(["deid", "in", "--model", "rules:default", "-o", "o1"]) == 3
    err = capsys.readouterr().err
    assert "not valid UTF-8" in err and "--encoding" in err
    assert main(["deid", "in", "--model", "rules:default", "-o", "o2",
                 "--encoding", "cp1252"]) == 0
    assert (tmp_path / "o2" / "a.txt").read_text(encoding="utf-8").startswith("Caf\u00e9 ")


def test_reading_settings_are_restored_and_checked() -> None:
    before = formats.read_settings()
    with formats.reading(encoding="latin-1", text_column="t"):
        assert formats.read_settings().encoding == "iso8859-1"
    assert formats.read_settings() == before
    with pytest.raises(ConfigError, match="unknown reading settings"), formats.reading(x="y"):
        pass


def test_every_command_that_reads_notes_takes_the_reading_options(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["train"], ["audit"], ["deid"], ["evaluate"], ["data", "stats"],
                 ["data", "split"], ["ensemble", "deid"], ["ensemble", "evaluate"],
                 ["ensemble", "calibrate"], ["ensemble", "distill"], ["ledger", "show"],
                 ["review"]):
        assert main([*argv, "-h"]) == 0
        out = capsys.readouterr().out
        for option in ("--encoding", "--text-column", "--id-column", "--patient-column"):
            assert option in out, (argv, option)


# ---------------------------------------------------------------------------- stdin / stdout
class _Stdin(io.TextIOWrapper):
    def isatty(self) -> bool:
        return False


def _feed(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", _Stdin(io.BytesIO(data), encoding="utf-8"))


def test_deid_dash_reads_stdin_and_writes_the_note_to_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    _feed(monkeypatch, (NOTE + "\n").encode())
    assert main(["deid", "-", "--model", "rules:default", "--mode", "redact"]) == 0
    out = capsys.readouterr().out
    assert "John" not in out and "Smith" not in out and out.endswith("General.\n")
    assert "de-identified into" not in out  # stdout holds the note, nothing else
    assert not list(tmp_path.glob("dphub-stdin-*"))  # the private copy is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # and nothing else was written
    _feed(monkeypatch, ("Caf\u00e9 " + NOTE).encode("cp1252"))
    assert main(["deid", "-", "--model", "rules:default", "--out", "-",
                 "--encoding", "cp1252"]) == 0
    assert capsys.readouterr().out.startswith("Caf\u00e9 Patient [**NAME**]")


def test_ensemble_deid_dash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["ensemble", "add", "rules:default"]) == 0
    capsys.readouterr()
    _feed(monkeypatch, NOTE.encode())
    assert main(["ensemble", "deid", "-"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Patient [**NAME**] [**NAME**] seen on [**DATE**]")


@pytest.mark.parametrize(("argv", "stdin", "needle"), [
    (["deid", "-", "--model", "rules:default", "--mode", "spans"], b"x", "--mode must be one of"),
    (["deid", "-", "--model", "rules:default", "-o", "dir"], b"x", "leave out --out"),
    (["deid", "-", "--model", "rules:default", "--resume"], b"x", "--resume"),
    (["deid", "-", "--model", "rules:default"], b"", "stdin is empty"),
    (["deid", "-", "--model", "rules:default"], b"caf\xe9", "stdin:1: not valid UTF-8"),
    (["deid", "in.txt", "--model", "rules:default", "-o", "-"], b"", "--out - (stdout)"),
])
def test_deid_dash_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str], argv: list[str], stdin: bytes,
                            needle: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text(NOTE)
    _feed(monkeypatch, stdin)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and needle in err, err


# ---------------------------------------------------------------------------- evaluate swapped
def test_evaluate_gold_and_pred_swapped_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    rec = {"id": "a", "text": NOTE, "spans": [{"start": 8, "end": 18, "label": "PATIENT"}]}
    (tmp_path / "gold.jsonl").write_text(json.dumps(rec) + "\n")
    assert main(["deid", "gold.jsonl", "--model", "rules:default", "--mode", "spans",
                 "-o", "pred"]) == 0
    assert main(["deid", "gold.jsonl", "--model", "rules:default", "-o", "tagged"]) == 0
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "a.txt").write_text(NOTE)
    capsys.readouterr()
    assert main(["evaluate", "--gold", "gold.jsonl", "--pred", "pred", "--json"]) == 0
    capsys.readouterr()
    for gold, pred, needle in (
        ("pred", "gold.jsonl", "--gold holds a `dphub deid` output"),
        ("pred/gold.jsonl", "gold.jsonl", "swapped"),
        ("tagged", "gold.jsonl", "swapped"),
        ("txt", "gold.jsonl", "--gold has no annotations"),
        ("txt", "pred", "are --gold and --pred swapped?"),
    ):
        assert main(["evaluate", "--gold", gold, "--pred", pred]) == 2, gold
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, (gold, pred, err)
        assert "John" not in err


# ---------------------------------------------------------------------------- train's output
@pytest.mark.parametrize("command", ["train", "audit"])
def test_an_existing_out_is_refused_before_anything_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "x").write_text("x")
    (tmp_path / "d.jsonl").write_text(json.dumps({"id": "a", "text": NOTE, "spans": []}) + "\n")

    def too_late(*args: object, **kwargs: object) -> None:
        raise AssertionError("options built (torch imported) before the refusal")

    monkeypatch.setattr("dphub.cli.train.build_options", too_late)
    assert main([command, "d.jsonl", "--out", "model"]) == 2
    assert "model: output directory exists and is not empty (use --force)" in \
        capsys.readouterr().err
    (tmp_path / "afile").write_text("x")
    assert main([command, "d.jsonl", "--out", "afile"]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def test_train_says_where_the_model_goes_when_dphub_toml_says_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dphub.toml").write_text('[data]\npath = "missing.jsonl"\n\n[output]\n'
                                         'dir = "out/model"\n')
    assert main(["train"]) == 2
    err = capsys.readouterr().err
    assert f"output: {tmp_path / 'out' / 'model'} (dphub.toml [output] dir" in err
    assert main(["train", "--out", "elsewhere"]) == 2
    assert "dphub.toml [output] dir" not in capsys.readouterr().err


# ---------------------------------------------------------------------------- one name: members
def test_audit_names_the_members_as_the_cli_and_api_do_and_old_runs_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dphub.ensemble.aggregate import span_members
    from dphub.review.doubt import note_doubt

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text(NOTE)
    assert main(["deid", "in", "--model", "rules:default", "-o", "out"]) == 0
    spans = json.loads((tmp_path / "out" / "audit.jsonl").read_text().splitlines()[0])["spans"]
    assert spans and all(s["members"] == ["rules:default"] and "voters" not in s for s in spans)
    assert span_members({"voters": ["a"]}) == ["a"] == span_members({"members": ["a"]})
    old = note_doubt([{"voters": ["a"], "score": 0.5}], ["a", "b"], {})
    assert old == note_doubt([{"members": ["a"], "score": 0.5}], ["a", "b"], {})
