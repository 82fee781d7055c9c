"""``--date-count note|none`` (issue 38, item 4): the number of a patient's date mentions does not
show in the output; the option spends no ε and says what stays visible."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dphub.cli.main import main
from dphub.notes import Note, Span
from dphub.render.date_count import fewer_dates
from dphub.runner import RUN_DIR
from dphub.runner.output import Renderer

KEY = b"0123456789abcdef-date-count-key"
#: two patients: A's note has four dates, B's one
NOTES = [("a1", "A", "Admitted 3/4/2101, echo 3/6/2101, seen 3/9/2101 and 3/12/2101 by Dr. Smith."),
         ("b1", "B", "Admitted 5/1/2101 and discharged home.")]


def _spans(text: str) -> list[Span]:
    return [Span(m.start(), m.end(), "DATE") for m in re.finditer(r"\d+/\d+/\d{4}", text)]


def _rendered(mode: str, count: str, **options: Any) -> list[str]:
    r = Renderer(mode, KEY if mode == "surrogate" else None, date_count=count, **options)
    notes = [Note(id=i, text=t, patient_id=p) for i, p, t in NOTES]
    for n in notes if r.needs_prepass else ():  # --dates dp --date-unit patient
        r.observe(n, _spans(n.text))
    return [r.files(n, _spans(n.text))[".txt"] for n in notes]


@pytest.mark.parametrize(("mode", "options"), [("tag", {}), ("redact", {}),
                                               ("surrogate", {}),
                                               ("surrogate", {"dates": "dp"})])
def test_two_patients_with_different_date_counts_show_the_same_count(
        mode: str, options: dict[str, Any]) -> None:
    """With ``note`` each note shows one date whatever it had (A's 4, B's 1); with ``none``, none."""
    a, b = _rendered(mode, "note", **options)
    if mode == "tag":
        assert a.count("[**DATE**]") == b.count("[**DATE**]") == 1
    elif mode == "redact":
        assert a.count("XXXXX") == b.count("XXXXX") == 1
    else:
        assert len(re.findall(r"\d+/\d+/\d{4}", a)) == len(re.findall(r"\d+/\d+/\d{4}", b)) == 1
        assert "3/4/2101" not in a and "5/1/2101" not in b
    assert a.startswith("Admitted ") and a.endswith(" by Dr. Smith.")
    assert "2101" not in a.split(",", 1)[1]  # the later mentions are gone, their words stay
    a, b = _rendered(mode, "none", **options)
    assert a == "Admitted , echo , seen  and  by Dr. Smith."
    assert b == "Admitted  and discharged home."


def test_the_input_note_and_spans_are_not_changed() -> None:
    note = Note(id="a1", text=NOTES[0][2], patient_id="A")
    spans = _spans(note.text)
    shown, kept = fewer_dates(note, spans, "note")
    assert note.text == NOTES[0][2] and len(spans) == 4
    assert [shown.text[s.start:s.end] for s in kept] == ["3/4/2101"]


def test_cli_records_the_option_and_refuses_bad_values(tmp_path: Path, capsys: Any) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "patient_id": p, "text": t}) + "\n"
                           for i, p, t in NOTES))
    key = tmp_path / "key"
    key.write_bytes(KEY)
    base = ["deid", str(src), "--model", "rules:default"]
    assert main([*base, "--out", str(tmp_path / "o1"), "--mode", "surrogate", "--key-file",
                 str(key), "--dates", "dp", "--date-count", "note"]) == 0
    texts = [json.loads(x)["text"] for x in (tmp_path / "o1" / "in.jsonl").read_text()
             .splitlines()]
    assert [len(re.findall(r"\d+/\d+/\d{4}", t)) for t in texts] == [1, 1]
    audit = [json.loads(x) for x in (tmp_path / "o1" / "audit.jsonl").read_text().splitlines()]
    record = {"mechanism": "one-date-mention-per-note", "epsilon": 0.0,
              "left_visible": audit[0]["date_count"]["left_visible"]}
    assert all(a["date_count"] == record for a in audit)
    assert "number of notes per patient" in record["left_visible"]
    settings = json.loads((tmp_path / "o1" / RUN_DIR / "run.json").read_text())["settings"]
    assert settings["date_count"] == record and settings["render_options"]["date_count"] == "note"
    assert "per_patient" in settings["surrogates"]["dates"]  # the DP dates' total, beside it
    capsys.readouterr()
    for bad, word in ((["--date-count", "pad"], "pad"),
                      (["--date-count", "note", "--mode", "spans"], "--mode")):
        assert main([*base, "--out", str(tmp_path / "o2"), *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--date-count" in err and word in err, err
        assert not (tmp_path / "o2").exists()
