"""`dphub data synth|split|stats` end to end through the real formats layer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dphub import formats
from dphub.cli.main import main


@pytest.fixture()
def synth_file(tmp_path: Path) -> Path:
    out = tmp_path / "synth.jsonl"
    assert main(["data", "synth", "--n", "40", "--kind", "nursing", "--seed", "1",
                 "--patients", "10", "--out", str(out)]) == 0
    return out


def test_synth_writes_deterministic_jsonl_and_refuses_overwrite(synth_file: Path, tmp_path,
                                                                 capsys) -> None:
    notes = list(formats.read(synth_file))
    assert len(notes) == 40 and all(n.labelled for n in notes)
    again = tmp_path / "again.jsonl"
    assert main(["data", "synth", "--n", "40", "--seed", "1", "--patients", "10",
                 "--out", str(again)]) == 0
    assert again.read_bytes() == synth_file.read_bytes()
    before = synth_file.read_bytes()
    capsys.readouterr()
    assert main(["data", "synth", "--n", "5", "--out", str(synth_file)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert synth_file.read_bytes() == before
    assert main(["data", "synth", "--n", "5", "--out", str(synth_file), "--force"]) == 0
    assert len(synth_file.read_text().splitlines()) == 5


def test_synth_to_stdout_matches_file(synth_file: Path, capsysbinary) -> None:
    capsysbinary.readouterr()
    assert main(["data", "synth", "--n", "40", "--seed", "1", "--patients", "10",
                 "--out", "-"]) == 0
    assert capsysbinary.readouterr().out == synth_file.read_bytes()


def test_synth_bad_kind_exit_2(tmp_path: Path, capsys) -> None:
    out = tmp_path / "x.jsonl"
    assert main(["data", "synth", "--kind", "radiology", "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert not out.exists()


def test_split_patient_disjoint_with_names(synth_file: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "parts"
    assert main(["data", "split", str(synth_file), "--ratios", "0.75,0.25", "--seed", "3",
                 "--names", "train,test", "--out", str(out)]) == 0
    train = list(formats.read(out / "train.jsonl"))
    test = list(formats.read(out / "test.jsonl"))
    assert len(train) + len(test) == 40
    assert not {n.patient_id for n in train} & {n.patient_id for n in test}
    assert sorted(p.name for p in out.iterdir()) == ["test.jsonl", "train.jsonl"]
    # spans survive the round trip exactly
    orig = {n.id: n.spans for n in formats.read(synth_file)}
    assert all(orig[n.id] == n.spans for n in train + test)
    # existing parts are refused without --force, accepted with it
    assert main(["data", "split", str(synth_file), "--names", "train,test",
                 "--out", str(out)]) == 2
    assert main(["data", "split", str(synth_file), "--names", "train,test",
                 "--out", str(out), "--force"]) == 0


def test_split_default_names_and_bad_ratios(synth_file: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "p"
    assert main(["data", "split", str(synth_file), "--by", "note", "--out", str(out)]) == 0
    assert [len(list(formats.read(out / f"split-{i}.jsonl"))) for i in (0, 1)] == [32, 8]
    capsys.readouterr()
    assert main(["data", "split", str(synth_file), "--ratios", "0.9,0.2",
                 "--out", str(tmp_path / "q")]) == 2
    assert "sum to 1" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()


def test_stats_json_and_table(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "tiny.jsonl"
    recs = [
        {"id": "a-1", "patient_id": "a", "text": "Dr. Smith saw pt on 7/22.",
         "spans": [{"start": 4, "end": 9, "label": "DOCTOR"},
                   {"start": 20, "end": 24, "label": "DATE"}]},
        {"id": "b-1", "patient_id": "b", "text": "Wife Mary visited.",
         "spans": [{"start": 5, "end": 9, "label": "RELATIVE"}]},
        {"id": "b-2", "patient_id": "b", "text": "Quiet night.", "spans": []},
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in recs))
    capsys.readouterr()
    assert main(["data", "stats", str(corpus), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["notes"], d["patients"], d["phi_phrases"]) == (3, 2, 3)
    assert d["phi_per_category"] == {"NAME": 2, "DATE": 1}
    assert d["characters"] == 25 + 18 + 12 and d["word_pieces"] is None
    assert main(["data", "stats", str(corpus)]) == 0
    table = capsys.readouterr().out
    assert "PHI phrases" in table and "NAME" in table
    assert "Smith" not in table  # never note text


def test_stats_word_pieces_with_tokenizer_dir(tmp_path: Path, tiny_base_model, capsys) -> None:
    corpus = tmp_path / "t.jsonl"
    corpus.write_text(json.dumps({"id": "n", "text": "pt seen by dr smith", "spans": []}) + "\n")
    capsys.readouterr()
    assert main(["data", "stats", str(corpus), "--json",
                 "--tokenizer", str(tiny_base_model)]) == 0
    assert json.loads(capsys.readouterr().out)["word_pieces"] == 5


def test_stats_missing_input_exit_2(tmp_path: Path, capsys) -> None:
    assert main(["data", "stats", str(tmp_path / "nope.jsonl")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
