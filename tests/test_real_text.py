"""Real-world note text through every JSON Lines boundary (issue 54): line and paragraph
separators (U+2028, U+2029, U+0085), ``\\r``, NUL, an astral character (an emoji), combining marks,
a right-to-left mark and a BOM inside notes. JSON Lines are split on ``\\n`` only; a note keeps
every one of these characters inside its text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dphub.ensemble import Ensemble, FixedMember
from dphub.ensemble.core import Slot
from dphub.errors import InputError
from dphub.evaluate import read_predictions
from dphub.io import jsonl_lines
from dphub.notes import Span
from dphub.runner import RUN_DIR, run_deid
from dphub.runner.state import Journal

#: every character that splits a line for str.splitlines() but not for JSON Lines, and others a
#: pasted note carries: an astral emoji (two UTF-16 units), combining marks, an RLM, NUL, a BOM
ODD = ["\u2028", "\u2029", "\u0085", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\U0001F600",
       "e\u0301\u0327", "\u200f", "\x00", "\ufeff"]


def _text(odd: str) -> str:
    return f"{odd}Call Yolanda {odd} Brisbee at {odd} 555-0134 {odd} tomorrow.{odd}"


def _spans(text: str) -> list[Span]:
    a = text.index("555-0134")
    b = text.index("Yolanda")
    return [Span(b, b + 7, "NAME", 0.9), Span(a, a + 8, "PHONE", 0.9)]


def _ensemble(texts: dict[str, str]) -> Ensemble:
    return Ensemble([Slot(FixedMember("m1", {k: _spans(t) for k, t in texts.items()}),
                          threshold=0.5)])


@pytest.mark.parametrize("mode", ["tag", "spans"])
@pytest.mark.parametrize("audit_text", [False, True])
def test_a_jsonl_run_keeps_notes_with_line_separators_whole(tmp_path: Path, mode: str,
                                                            audit_text: bool) -> None:
    # issue 54: the part files were split with str.splitlines(): one U+2028 in one note ended
    # the whole run with "unexpected JSONDecodeError" and nothing written
    texts = {f"n{i}": _text(o) for i, o in enumerate(ODD)}
    src = tmp_path / "notes.jsonl"
    src.write_text("".join(json.dumps({"id": k, "text": t}, ensure_ascii=False) + "\n"
                           for k, t in texts.items()), encoding="utf-8")
    rep = run_deid(src, tmp_path / "out", _ensemble(texts), mode=mode, audit_text=audit_text)
    assert rep.exit_code == 0, rep.errors
    assert rep.done == len(ODD)
    out = [json.loads(line) for _, line in jsonl_lines(tmp_path / "out" / "notes.jsonl")]
    assert [r["id"] for r in out] == list(texts)
    for r in out:
        t = texts[r["id"]]
        if mode == "tag":
            a, b = t.index("Yolanda"), t.index("555-0134")
            assert r["text"] == (t[:a] + "[**NAME**]" + t[a + 7 : b] + "[**CONTACT**]"
                                 + t[b + 8 :])
        else:
            assert [(s["start"], s["end"]) for s in r["spans"]] == [
                (s.start, s.end) for s in _spans(t)]
    audit = [json.loads(line) for _, line in jsonl_lines(tmp_path / "out" / "audit.jsonl")]
    assert [a["id"] for a in audit] == list(texts)
    if audit_text:
        assert [[s["text"] for s in a["spans"]] for a in audit] == [["Yolanda", "555-0134"]] * len(ODD)


def test_a_text_directory_run_and_its_resume_with_odd_names_and_text(tmp_path: Path) -> None:
    # the journal and the part files are read back on --resume: keys (file names) and text with
    # separators survive it; a note that failed (not UTF-8) is retried and the run completes
    src = tmp_path / "in"
    src.mkdir()
    texts: dict[str, str] = {}
    for i, odd in enumerate(ODD):
        stem = f"n{i}" + ("" if odd == "\x00" else odd)  # a file name cannot hold NUL
        (src / f"{stem}.txt").write_bytes(_text(odd).encode("utf-8"))
        texts[stem] = _text(odd)  # a leading BOM is kept: offsets as the text format reads them
    (src / "bad\u2028.txt").write_bytes(b"\xff\xfe not text")
    ens = _ensemble({**texts, "bad\u2028": "Call Yolanda at 555-0134"})
    out = tmp_path / "out"
    rep = run_deid(src, out, ens, mode="tag", audit_text=True)
    assert len(rep.failed) == 1 and rep.done == len(ODD)
    assert (out / RUN_DIR / "journal.jsonl").is_file()  # kept for --resume
    (src / "bad\u2028.txt").write_text("Call Yolanda at 555-0134", encoding="utf-8")
    rep = run_deid(src, out, ens, mode="tag", audit_text=True, resume=True)
    assert rep.exit_code == 0 and rep.skipped == len(ODD) and rep.done == 1
    for stem, t in texts.items():
        a, b = t.index("Yolanda"), t.index("555-0134")
        assert (out / f"{stem}.txt").read_bytes().decode("utf-8") == (
            t[:a] + "[**NAME**]" + t[a + 7 : b] + "[**CONTACT**]" + t[b + 8 :])
    audit = [json.loads(line) for _, line in jsonl_lines(out / "audit.jsonl")]
    assert len(audit) == len(ODD) + 1


def test_the_journal_is_split_on_newlines_only(tmp_path: Path) -> None:
    path = tmp_path / RUN_DIR / "journal.jsonl"
    path.parent.mkdir()
    keys = [f"k{o}" for o in ODD]
    lines = [json.dumps({"key": k, "status": "done"}, ensure_ascii=False) + "\n" for k in keys]
    path.write_text("".join(lines) + '{"key": "torn', encoding="utf-8", newline="")
    j = Journal.open(path, resume=True)
    assert list(j.entries) == keys  # the torn last line is dropped, no key is cut
    assert path.read_bytes().decode("utf-8") == "".join(lines)


def test_jsonl_lines_splits_on_newline_only_and_names_bad_bytes(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    recs = [{"text": o} for o in ODD]
    p.write_bytes(b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\r\n" for r in recs))
    assert [json.loads(line) for _, line in jsonl_lines(p)] == recs
    p.write_bytes(b'{"text": "a"}\n{"text": "\xff"}\n')
    with pytest.raises(InputError, match=r"a\.jsonl:2: not valid UTF-8"):
        list(jsonl_lines(p))


def test_span_predictions_with_separators_in_ids_are_read_whole(tmp_path: Path) -> None:
    # evaluate reads `deid --mode spans` records; an id may hold a separator raw
    p = tmp_path / "pred.jsonl"
    recs = [{"id": f"n{o}", "spans": [{"start": 0, "end": 4, "label": "NAME"}]} for o in ODD]
    p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs),
                 encoding="utf-8", newline="")
    got = read_predictions(p)
    assert list(got) == [r["id"] for r in recs]
    p.write_bytes(b'{"id": "a", "spans": []}\n{"id": "\xff", "spans": []}\n')
    with pytest.raises(InputError, match="not valid UTF-8"):
        read_predictions(p)


def _failing_run(tmp_path: Path) -> tuple[Path, Path, Ensemble]:
    """A text directory run with one undecodable note: its state is kept for --resume."""
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.txt").write_text(_text("\u2028"), encoding="utf-8")
    (src / "b.txt").write_bytes(b"\xff not text")
    ens = _ensemble({"a": _text("\u2028"), "b": _text("\U0001F600")})
    out = tmp_path / "out"
    assert len(run_deid(src, out, ens, mode="tag").failed) == 1
    (src / "b.txt").write_text(_text("\U0001F600"), encoding="utf-8")
    return src, out, ens


def test_a_resume_under_another_note_key_is_refused(tmp_path: Path, monkeypatch) -> None:
    # issue 54: the audit's keyed note digests of one run are all under one key
    from dphub.errors import ConfigError

    src, out, ens = _failing_run(tmp_path)
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "other-home"))
    with pytest.raises(ConfigError, match="another user"):
        run_deid(src, out, ens, mode="tag", resume=True)


def test_a_resume_of_a_run_without_digests_writes_none(tmp_path: Path) -> None:
    src, out, ens = _failing_run(tmp_path)
    p = out / RUN_DIR / "run.json"
    params = json.loads(p.read_text())
    run_id = params["run_id"]
    del params["note_key"]  # as an older dphub wrote it
    p.write_text(json.dumps(params))
    assert run_deid(src, out, ens, mode="tag", resume=True).exit_code == 0
    audit = [json.loads(line) for _, line in jsonl_lines(out / "audit.jsonl")]
    assert [("text_hmac" in a) for a in audit] == [True, False]  # b's digest is not made
    done = json.loads(p.read_text())
    assert done["run_id"] == run_id and "note_key" not in done and done["status"] == "complete"


@pytest.mark.parametrize("audit_text", [False, True])
def test_dphub_deid_over_pasted_notes_exits_0(tmp_path: Path, capsys, audit_text: bool) -> None:
    # the reproduction through the CLI: one pasted note (U+2028) among others
    from dphub.cli.main import main

    src = tmp_path / "notes.jsonl"
    src.write_text("".join(json.dumps({"id": f"n{i}", "text": _text(o)}, ensure_ascii=False)
                           + "\n" for i, o in enumerate(ODD)), encoding="utf-8")
    out = tmp_path / "out"
    args = ["deid", str(src), "--model", "rules:default", "--out", str(out)]
    assert main(args + (["--audit-text"] if audit_text else [])) == 0, capsys.readouterr().err
    got = [json.loads(line) for _, line in jsonl_lines(out / "notes.jsonl")]
    assert [r["id"] for r in got] == [f"n{i}" for i in range(len(ODD))]
    assert all("555-0134" not in r["text"] for r in got)


@pytest.mark.parametrize("fmt", ["jsonl", "brat", "physionet"])
def test_corpus_formats_keep_separators_inside_the_text(tmp_path: Path, fmt: str) -> None:
    # the neighbours: every reader of a file that holds note text splits lines on "\n" only
    from dphub import formats
    from dphub.notes import Note

    notes = []
    for i, o in enumerate(ODD):
        t = _text(o)
        notes.append(Note(id=f"p{i}-{i}", text=t, patient_id=f"p{i}", spans=_spans(t),
                          labelled=True))
    out = tmp_path / {"jsonl": "c.jsonl", "brat": "c", "physionet": "c.text"}[fmt]
    formats.write(notes, out, fmt)
    back = {n.text: [(s.start, s.end) for s in n.spans] for n in formats.read(out, format=fmt)}
    assert back == {n.text: [(s.start, s.end) for s in n.spans] for n in notes}
