"""Issue 36 item 3: the share of non-PHI tokens kept, beside recall, in ``ensemble evaluate`` and
``calibrate``; ``calibrate --aggregate inverse --min-kept K`` targets "recall >= R at kept >= K"
and refuses, naming the best reachable pairs, when the labelled notes cannot reach both."""

from __future__ import annotations

from pathlib import Path

import pytest

from dphub.cli.main import main
from dphub.ensemble.calibrate import CalibrationRefused
from dphub.ensemble.core import Ensemble
from dphub.ensemble.evaluation import evaluate_ensemble
from dphub.ensemble.inverse_calibrate import calibrate_inverse
from dphub.ensemble.manifest import Manifest
from dphub.errors import ConfigError
from tests.test_inverse import RULE, _labelled, model, vocab

#: "patient seen in clinic today zorbl Stable": 5 non-PHI tokens, 2 PHI; the surname "Stable" is a
#: vocabulary word the model scores 0.3, the non-PHI "today" 0.45: recall 1 costs "today"
PROBS = {"Stable": 0.3, "clinic": 0.1, "today": 0.45}


def ens() -> Ensemble:
    return Ensemble([model(PROBS)], RULE, safe_vocab=vocab())


def test_calibrate_reaches_recall_at_kept() -> None:
    res = calibrate_inverse(ens(), _labelled(), 1.0, min_kept=0.8)
    assert res.recall == 1.0 and res.kept == pytest.approx(0.8)
    assert res.rule == "inverse:0.1,0.3" and res.min_kept == 0.8
    # without --min-kept the kept share is reported too
    assert calibrate_inverse(ens(), _labelled(), 1.0).kept == pytest.approx(0.8)


@pytest.mark.parametrize("k", [0.81, 0.9, 1.0])
def test_calibrate_refuses_naming_the_best_reachable_pairs(k: float) -> None:
    with pytest.raises(CalibrationRefused, match=r"recall >= 1 with non-PHI tokens kept >= ") as e:
        calibrate_inverse(ens(), _labelled(), 1.0, min_kept=k)
    msg = str(e.value)
    assert "recall 0.5000, kept 1.0000" in msg  # the most recall at that kept share
    assert "recall 1.0000, kept 0.8000" in msg  # the most text at that recall
    forced = calibrate_inverse(ens(), _labelled(), 1.0, min_kept=k, force=True)
    assert forced.forced and forced.recall == 0.5 and forced.kept == 1.0


@pytest.mark.parametrize("k", [-0.1, 1.5, float("nan")])
def test_calibrate_refuses_a_bad_kept_share(k: float) -> None:
    with pytest.raises(ConfigError, match="kept share"):
        calibrate_inverse(ens(), _labelled(), 1.0, min_kept=k)


def _cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "m.toml"
    assert main(["ensemble", "add", "rules:default", "-e", str(path)]) == 0
    e = ens()
    monkeypatch.setattr("dphub.ensemble.core.build_ensemble", lambda *a, **k: e)
    monkeypatch.setattr("dphub.ensemble.evaluation.read_labelled", lambda *a, **k: _labelled())
    return path


def test_cli_calibrate_min_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    path = _cli(tmp_path, monkeypatch)
    gold = str(tmp_path / "gold.jsonl")
    assert main(["ensemble", "calibrate", gold, "--target-recall", "1", "--min-kept", "0.8",
                 "--holdout", "0", "-e", str(path)]) == 0
    out = capsys.readouterr().out
    assert "non-PHI tokens kept: 0.8000" in out and "(target 0.8)" in out
    assert Manifest.load(path).aggregate == "inverse:0.1,0.3"
    assert main(["ensemble", "calibrate", gold, "--target-recall", "1", "--min-kept", "0.9",
                 "--holdout", "0", "-e", str(path)]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[-1].startswith("error:") and "best reachable" in lines[-1]
    assert "Traceback" not in err and "zorbl" not in err
    for bad in ("1.5", "nan", "-1"):
        assert main(["ensemble", "calibrate", gold, "--min-kept", bad, "-e", str(path)]) == 2


def test_evaluate_prints_non_phi_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    rows = evaluate_ensemble(ens(), _labelled())
    assert all(0.0 <= r["non_phi_tokens_kept"] <= 1.0 for r in rows)
    path = _cli(tmp_path, monkeypatch)
    assert main(["ensemble", "evaluate", str(tmp_path / "gold.jsonl"), "-e", str(path)]) == 0
    assert "kept" in capsys.readouterr().out  # the table's column (rich may wrap its title)
    assert main(["ensemble", "evaluate", str(tmp_path / "gold.jsonl"), "--json", "-e",
                 str(path)]) == 0
    out = capsys.readouterr().out
    assert '"non_phi_tokens_kept": 0.8' in out
