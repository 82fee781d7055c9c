"""`dphub evaluate` end to end through the formats layer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


# ------------------------------------------------------------------ predictions it cannot read
def _deid(tmp_path, src, mode: str, name: str) -> Path:
    out = tmp_path / name
    assert main(["deid", str(src), "--model", "rules:default", "--out", str(out),
                 "--mode", mode]) == 0
    return out


@pytest.fixture
def synth_gold(tmp_path):
    from dphub import synth

    path = tmp_path / "owner.jsonl"
    formats.write(synth.generate(6, kind="nursing", seed=5, patients=3), path, "jsonl")
    return path


@pytest.mark.parametrize("mode", ["tag", "redact"])
def test_tagged_or_redacted_output_is_refused_with_what_to_pass(tmp_path, capsys, synth_gold,
                                                                mode):
    out = _deid(tmp_path, synth_gold, mode, "deid")
    capsys.readouterr()
    for pred in (out, out / "owner.jsonl"):
        assert main(["evaluate", "--gold", str(synth_gold), "--pred", str(pred)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and "--mode spans" in err
        assert len(err.strip().splitlines()) == 1


def test_deid_spans_output_is_read_as_a_directory_and_as_a_file(tmp_path, capsys, synth_gold):
    out = _deid(tmp_path, synth_gold, "spans", "deid")
    results = []
    for pred in (out, out / "owner.jsonl"):
        capsys.readouterr()
        assert main(["evaluate", "--gold", str(synth_gold), "--pred", str(pred), "--json"]) == 0
        captured = capsys.readouterr()
        assert "no predictions" not in captured.err
        results.append(json.loads(captured.out))
    assert results[0] == results[1]
    assert results[0]["pred_spans"] > 0 and results[0]["token"]["recall"] > 0.5


def test_deid_spans_of_a_text_directory_are_read(tmp_path, capsys, synth_gold):
    notes = list(formats.read(synth_gold))
    src = tmp_path / "notes"
    src.mkdir()
    for n in notes:
        (src / f"{n.id}.txt").write_text(n.text, encoding="utf-8")
    out = _deid(tmp_path, src, "spans", "deid-txt")
    capsys.readouterr()
    assert main(["evaluate", "--gold", str(synth_gold), "--pred", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["missing_predictions"] == 0 and data["token"]["recall"] > 0.5


def test_deid_brat_output_directory_is_read(tmp_path, capsys, synth_gold):
    out = _deid(tmp_path, synth_gold, "brat", "deid-brat")
    capsys.readouterr()
    assert main(["evaluate", "--gold", str(synth_gold), "--pred", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["missing_predictions"] == 0 and data["token"]["recall"] > 0.5


def test_unlabelled_text_directory_is_refused(tmp_path, capsys, synth_gold):
    src = tmp_path / "plain"
    src.mkdir()
    for n in formats.read(synth_gold):
        (src / f"{n.id}.txt").write_text(n.text, encoding="utf-8")
    assert main(["evaluate", "--gold", str(synth_gold), "--pred", str(src)]) == 2
    err = capsys.readouterr().err
    assert "no span annotations" in err and "--mode spans" in err


def test_span_records_that_do_not_fit_the_gold_notes_are_refused(tmp_path, capsys, synth_gold):
    first = next(iter(formats.read(synth_gold)))
    bad = tmp_path / "spans.jsonl"
    bad.write_text(json.dumps({"id": first.id, "spans": [
        {"start": 0, "end": len(first.text) + 5, "label": "NAME"}]}) + "\n")
    assert main(["evaluate", "--gold", str(synth_gold), "--pred", str(bad),
                 "--ignore-extra"]) == 2
    err = capsys.readouterr().err
    assert "beyond" in err and first.text[:10] not in err
    bad.write_text(json.dumps({"id": first.id, "spans": [{"start": "0", "end": 3}]}) + "\n")
    assert main(["evaluate", "--gold", str(synth_gold), "--pred", str(bad)]) == 2
    assert "line 1" in capsys.readouterr().err


def test_readme_spans_and_evaluate_commands_work_as_printed(tmp_path, monkeypatch, capsys):
    """The README tour's last two lines, run literally after `ensemble add rules:default`."""
    import shlex

    from dphub import synth

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    lines = [ln.split("#")[0].strip() for ln in readme.splitlines()
             if ln.startswith(("dphub ensemble deid split/owner-test.jsonl --out spans/",
                               "dphub evaluate --gold split/owner-test.jsonl --pred spans/"))]
    assert len(lines) == 2, lines
    monkeypatch.chdir(tmp_path)
    (tmp_path / "split").mkdir()
    formats.write(synth.generate(6, kind="nursing", seed=2, patients=3),
                  tmp_path / "split" / "owner-test.jsonl", "jsonl")
    assert main(["ensemble", "add", "rules:default"]) == 0
    for line in lines:
        argv = shlex.split(line)
        assert argv[0] == "dphub"
        assert main(argv[1:]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "token-binary" in out and "no predictions" not in out
