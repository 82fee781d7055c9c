"""`dphub card show|validate` through the real CLI entry point."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from dphub import card as C
from dphub.cli.main import main

DATASET = {
    "patients": "5-9",
    "notes": "5-9",
    "sequences": "10-19",
    "phi_per_category": {"NAME": "2-4"},
    "note_types": {"discharge": "5-9"},
    "language": "en",
    "label_schema": "hipaa",
}


def _dp(unit: str = "patient") -> dict[str, Any]:
    return C.dp_block(accountant="rdp", sample_rate=0.5, noise_multiplier=1.0, steps=3,
                      delta=1e-5, privacy_unit=unit, max_grad_norm=1.0, epochs=1.5,
                      max_examples_per_unit=8, num_units=5, weights_sha256="0" * 64,
                      grad_sample_mode="ghost")


@pytest.fixture
def private_dir(tmp_path: Path) -> Path:
    d = tmp_path / "private-model"
    C.write_card(d, C.card_meta(_dp(), DATASET, base_model="org/base", model_name="demo"))
    return d


@pytest.fixture
def baseline_dir(tmp_path: Path) -> Path:
    d = tmp_path / "baseline"
    C.write_card(d, C.card_meta(C.non_private_block(), DATASET, base_model="org/base"))
    return d


def test_validate_ok(private_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["card", "validate", str(private_dir), "--require-private"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("valid: ")
    assert "unit=patient" in out and "schema + accounting" in out


def test_validate_negative_epsilon(private_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    readme = private_dir / "README.md"
    text = readme.read_text(encoding="utf-8")
    head, sep, rest = text.partition("\n  epsilon: ")
    readme.write_text(head + sep + "-1" + rest[rest.index("\n"):], encoding="utf-8")
    assert main(["card", "validate", str(private_dir)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        "error: differential_privacy.epsilon: -1 is less than the minimum of 0\n"
    )
    assert captured.out == ""


def test_validate_smaller_epsilon_refused(
    private_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = private_dir / "README.md"
    text = readme.read_text(encoding="utf-8")
    head, sep, rest = text.partition("\n  epsilon: ")
    readme.write_text(head + sep + "0.5" + rest[rest.index("\n"):], encoding="utf-8")
    assert main(["card", "validate", str(private_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: differential_privacy.epsilon: claims 0.5")
    assert err.count("\n") == 1 and "Traceback" not in err
    # without the accounting recomputation the edited card passes the schema
    assert main(["card", "validate", str(private_dir), "--no-accounting"]) == 0


def test_validate_non_private(baseline_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["card", "validate", str(baseline_dir)]) == 0
    assert "NOT PRIVATE" in capsys.readouterr().out
    assert main(["card", "validate", str(baseline_dir), "--require-private"]) == 2
    assert capsys.readouterr().err.startswith("error: differential_privacy.private: ")


def test_validate_missing_card(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["card", "validate", str(tmp_path)]) == 2
    assert "no model card found" in capsys.readouterr().err


def test_show_private(private_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["card", "show", str(private_dir)]) == 0
    out = capsys.readouterr().out
    assert "epsilon" in out and "patient" in out
    assert "protects each patient: everything one patient contributed" in out
    assert "NOT patient-level" not in out


def test_show_json(private_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["card", "show", str(private_dir / "README.md"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["unit"] == "patient" and summary["private"] is True
    assert summary["epsilon"] == pytest.approx(_dp()["epsilon"])
    assert summary["patients"] == "5-9" and summary["name"] == "demo"


def test_show_sequence_unit_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    C.write_card(tmp_path, C.card_meta(_dp("sequence"), DATASET, base_model="org/base"))
    assert main(["card", "show", str(tmp_path)]) == 0
    assert "NOT patient-level protection" in capsys.readouterr().out


def test_show_non_private(baseline_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["card", "show", str(baseline_dir)]) == 0
    assert "NOT PRIVATE" in capsys.readouterr().out


def test_show_repo_id_resolves_through_registry(
    private_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked: list[str] = []

    def resolve_model(spec: str) -> Path:
        asked.append(spec)
        return private_dir

    fake = types.ModuleType("dphub.registry")
    fake.resolve_model = resolve_model  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dphub.registry", fake)
    assert main(["card", "show", "acme/deid-tagger@v2", "--json"]) == 0
    assert asked == ["acme/deid-tagger@v2"]
    assert json.loads(capsys.readouterr().out)["name"] == "demo"


def test_show_unknown_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["card", "show", str(tmp_path / "nope" / "x y")]) == 2
    assert "no such model directory" in capsys.readouterr().err
