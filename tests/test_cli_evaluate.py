"""`dphub evaluate` end to end through the formats layer."""

from __future__ import annotations

import json

from dphub import formats
from dphub.cli.main import main
from dphub.notes import Note, Span

SECRET = "Zebulon Quartermaine"


def _corpus(tmp_path):
    text = f"Pt {SECRET} seen 7/22 at GH."
    gold = [Note("1-1", text, "1", spans=[Span(3, 23, "PTName"), Span(29, 33, "Date")],
                 labelled=True)]
    pred = [Note("1-1", text, "1", spans=[Span(3, 10, "NAME"), Span(29, 33, "DATE")],
                 labelled=True)]
    formats.write(gold, tmp_path / "gold.jsonl", "jsonl")
    formats.write(pred, tmp_path / "pred.jsonl", "jsonl")
    return tmp_path / "gold.jsonl", tmp_path / "pred.jsonl"


def test_json_output_and_no_text_without_show_leaks(tmp_path, capsys):
    gold, pred = _corpus(tmp_path)
    assert main(["evaluate", "--gold", str(gold), "--pred", str(pred), "--json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out)
    assert data["token"]["recall"] == 3 / 4  # Zebulon, 7, 22 of Zebulon Quartermaine 7 22
    assert data["phrase_recall"]["any_overlap"] == 1.0
    assert data["phrase_recall"]["full_cover"] == 0.5
    assert "Quartermaine" not in out
    assert main(["evaluate", "--gold", str(gold), "--pred", str(pred)]) == 0
    assert "Quartermaine" not in capsys.readouterr().out


def test_show_leaks_prints_missed_text(tmp_path, capsys):
    gold, pred = _corpus(tmp_path)
    assert main(["evaluate", "--gold", str(gold), "--pred", str(pred), "--show-leaks"]) == 0
    assert "Quartermaine" in capsys.readouterr().out


def test_out_file_and_gold_against_itself(tmp_path, capsys):
    gold, _ = _corpus(tmp_path)
    out = tmp_path / "r.json"
    assert main(["evaluate", "--gold", str(gold), "--pred", str(gold), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["token"]["f1"] == 1.0 and data["entity_strict"]["micro"]["f1"] == 1.0


def test_bad_arguments_exit_2(tmp_path, capsys):
    gold, pred = _corpus(tmp_path)
    assert main(["evaluate", "--gold", str(gold)]) == 2
    assert "exactly one of --pred or --model" in capsys.readouterr().err
    assert main(["evaluate", "--gold", str(tmp_path / "missing.jsonl"), "--pred", str(pred)]) == 2
