"""Issue 16, Deliver 7: a card a data owner can judge.

The rendered body has intended use, out-of-scope uses, limitations, the trainer's provenance
text, an evaluation section that states its privacy status, and a glossary of every label.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from dphub import card as C
from dphub.cli.main import main
from dphub.errors import CardError
from dphub.hub.validate import validate_card
from dphub.labels import SCHEMAS

DATASET = {
    "patients": "5-9", "notes": "5-9", "sequences": "10-19", "phi_per_category": {"NAME": "2-4"},
    "note_types": {"discharge": "5-9"}, "language": "en", "label_schema": "hipaa",
}
TEXTS = {
    "intended_use": "Tagging discharge letters of the cardiology ward before research export.",
    "out_of_scope": "Radiology reports.",
    "limitations": "Few phone numbers in training.",
    "provenance": "Discharge letters 2019-2021 of one teaching hospital, double annotated.",
}
RESULTS = {
    "token": {"precision": 0.91, "recall": 0.82, "f1": 0.86},
    "phrase_recall": {"any_overlap": 0.95, "full_cover": 0.9},
}


def _meta(label_schema: str = "hipaa") -> dict[str, Any]:
    dp = C.dp_block(accountant="rdp", sample_rate=0.5, noise_multiplier=1.0, steps=3,
                    delta=1e-5, privacy_unit="patient", max_grad_norm=1.0, epochs=1.5,
                    max_examples_per_unit=8, num_units=5, weights_sha256="0" * 64,
                    grad_sample_mode="ghost")
    return C.card_meta(dp, {**DATASET, "label_schema": label_schema}, base_model="org/base")


def _section(body: str, title: str) -> str:
    """The text of one ``## title`` section (up to the next ``## ``)."""
    head = f"\n## {title}\n"
    assert head in body, f"missing section {title!r}"
    return body.split(head, 1)[1].split("\n## ", 1)[0]


def test_sections_with_defaults_only() -> None:
    body = C.parse_card(C.build_card(_meta())).body
    intended = _section(body, "Intended use")
    assert "English clinical notes" in intended and "ensemble" in intended
    assert "From the trainer" not in intended
    assert "sole safeguard" in _section(body, "Out-of-scope uses")
    assert "other languages than English" in _section(body, "Out-of-scope uses")
    limits = _section(body, "Limitations")
    assert "Differential privacy lowers recall" in limits and "Not measured" in limits
    assert "Not stated by the trainer" in _section(body, "Training data provenance")
    assert "Not evaluated" in _section(body, "Evaluation")


def test_trainer_texts_are_stored_in_front_matter_and_rendered(tmp_path: Path) -> None:
    meta = C.with_card_text(_meta(), TEXTS)
    assert meta["card_text"] == TEXTS
    C.write_card(tmp_path, meta)
    card = validate_card(tmp_path)
    assert card.meta["card_text"] == TEXTS
    body = card.body
    for key, title in (("intended_use", "Intended use"), ("out_of_scope", "Out-of-scope uses"),
                       ("limitations", "Limitations"), ("provenance", "Training data provenance")):
        assert TEXTS[key] in _section(body, title)
    # dphub's defaults stay next to the trainer's words
    assert "sole safeguard" in _section(body, "Out-of-scope uses")
    assert "Differential privacy lowers recall" in _section(body, "Limitations")


def test_with_card_text_merges_removes_and_checks() -> None:
    meta = C.with_card_text(_meta(), {"provenance": "  Site A letters.  "})
    assert meta["card_text"] == {"provenance": "Site A letters."}
    meta = C.with_card_text(meta, {"limitations": "Short notes only.", "provenance": None})
    assert meta["card_text"] == {"limitations": "Short notes only.", "provenance": "Site A letters."}
    meta = C.with_card_text(meta, {"limitations": "", "provenance": ""})
    assert "card_text" not in meta
    with pytest.raises(CardError, match=r"unknown key nosie \(allowed: intended_use"):
        C.with_card_text(meta, {"nosie": "x"})
    with pytest.raises(CardError, match=r"^\[card\] provenance: 4001 characters, at most 4000"):
        C.with_card_text(meta, {"provenance": "x" * 4001})
    with pytest.raises(CardError, match="expected a string, got int"):
        C.with_card_text(meta, {"provenance": 3})
    with pytest.raises(CardError, match=r"control characters \(text not shown\)") as err:
        C.with_card_text(meta, {"provenance": "secret\x1b[2J"})
    assert "secret" not in str(err.value)


def test_evaluation_section_after_add_evaluation(tmp_path: Path) -> None:
    C.write_card(tmp_path, _meta())
    before = _section(C.load_card(tmp_path).body, "Evaluation")
    assert "Not evaluated" in before and "0.86" not in before
    C.add_evaluation(tmp_path, RESULTS, "heldout.jsonl")
    card = validate_card(tmp_path)
    section = _section(card.body, "Evaluation")
    assert "Evaluated on private data; these numbers are not covered by ε." in section
    assert "| metric | `heldout.jsonl` |" in section
    assert "| Token precision | 0.91 |" in section and "| Token F1 | 0.86 |" in section
    assert "—" not in section
    assert "`heldout.jsonl`" in _section(card.body, "Limitations")
    summary = C.dp_summary(card)
    assert summary["eval_privacy"] == C.EVAL_PRIVACY_STATUS and summary["eval_f1"] == 0.86


def test_evaluate_write_card_fills_the_section(tmp_path: Path, tiny_tagger_dir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The normal flow: `dphub evaluate --model DIR --gold NOTES --write-card`."""
    import json

    from dphub import formats, synth
    from dphub.io import file_sha256

    model = tmp_path / "model"
    shutil.copytree(tiny_tagger_dir, model)
    meta = _meta()
    dp = meta["differential_privacy"]
    dp["weights_sha256"] = file_sha256(model / "model.safetensors")
    (model / "training_config.json").write_text(json.dumps({
        "format_version": 2, "dphub_training": {}, "base_model": "org/base", "init_from": None,
        "no_dp": False, **{k: dp[k] for k in ("privacy_unit", "accountant", "steps",
                                               "sample_rate", "noise_multiplier", "delta",
                                               "epsilon")},
    }))
    C.write_card(model, meta)
    gold = tmp_path / "heldout.jsonl"
    formats.write(synth.generate(3, seed=5), gold, "jsonl")
    rc = main(["evaluate", "--model", str(model), "--gold", str(gold), "--write-card", "--json"])
    assert rc == 0, capsys.readouterr().err
    section = _section(validate_card(model).body, "Evaluation")
    assert C.EVAL_PRIVACY_STATUS in section and "| Token recall |" in section
    assert "Not evaluated" not in section


@pytest.mark.parametrize("schema", sorted(SCHEMAS))
def test_glossary_explains_every_label(schema: str) -> None:
    section = _section(C.parse_card(C.build_card(_meta(schema))).body, "Label glossary")
    for label in SCHEMAS[schema].labels:
        row = next(line for line in section.splitlines() if line.startswith(f"| `{label}` |"))
        assert "Not documented" not in row and len(row) > len(label) + 20
    if schema == "hipaa":
        assert "| `OTHER` | Identifying information that fits none" in section


def test_card_edit_sets_provenance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    C.write_card(tmp_path, _meta())
    assert main(["card", "edit", str(tmp_path), "--provenance", TEXTS["provenance"]]) == 0
    assert "card re-validated" in capsys.readouterr().out
    card = validate_card(tmp_path)
    assert TEXTS["provenance"] in _section(card.body, "Training data provenance")
    assert main(["card", "show", str(tmp_path)]) == 0
    assert "PROVENANCE (from the trainer)" in capsys.readouterr().out
    before = (tmp_path / "README.md").read_bytes()
    assert main(["card", "edit", str(tmp_path), "--provenance", "x" * 5000]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --provenance: 5000 characters, at most 4000") and "xxxx" not in err
    assert (tmp_path / "README.md").read_bytes() == before
    assert main(["card", "edit", str(tmp_path)]) == 2
    assert "nothing to edit" in capsys.readouterr().err
