"""Ensemble settings that used to go wrong silently (issue 56 item 4) now fail loudly.

* ``k-of-n:3+rules:default`` over two models equalled the rules alone (the models could never
  reach 3 votes): refused where the rule is stored, where it is loaded and where it is run;
* a member named in a rule that is not in the manifest: refused with the closest name;
* ``calibrate`` and ``aggregate`` rewrote the manifest in place: they print before -> after and
  keep the previous version, which ``dphub ensemble undo`` puts back;
* the manifest was found through the working directory: ``-e/--manifest`` (or
  ``$DPHUB_ENSEMBLE``) names it, and commands say which one they used.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dphub
from dphub.cli.main import main
from dphub.errors import ConfigError

QUORUM = "k-of-n:3+rules:default"  # the setting: two models, the rules counting alone


@pytest.fixture
def two_models(tiny_tagger_dir: Path, tmp_path: Path) -> Path:
    """Two model members (one tiny tagger under two names) and the rules."""
    m = tmp_path / "ens.toml"
    for args in (["--name", "site-a"], ["--name", "site-b"], []):
        spec = "rules:default" if not args else str(tiny_tagger_dir)
        assert main(["ensemble", "add", spec, *args, "-e", str(m)]) == 0
    return m


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    src = tmp_path / "notes.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "Seen by Dr. Okafor on 03/04/2021."}) + "\n",
                   encoding="utf-8")
    return src


def _one_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    return err[0]


def test_a_quorum_the_models_cannot_reach_is_refused_everywhere(
        two_models: Path, notes: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    before = two_models.read_bytes()
    capsys.readouterr()
    # where it is stored
    assert main(["ensemble", "aggregate", QUORUM, "-e", str(two_models)]) == 2
    err = _one_error(capsys)
    assert "the 2 members that do not count alone (site-a, site-b) can never reach 3" in err
    assert "use k-of-n:2+rules:default" in err
    assert two_models.read_bytes() == before
    # where it is run: --aggregate on deid, evaluate, calibrate; nothing written
    out = tmp_path / "out"
    assert main(["ensemble", "deid", str(notes), "--out", str(out), "--aggregate", QUORUM,
                 "-e", str(two_models)]) == 2
    assert "can never reach 3 votes" in _one_error(capsys) and not out.exists()
    # a manifest edited by hand: refused when it is loaded, by the CLI and by the API
    two_models.write_text(two_models.read_text().replace('aggregate = "any"',
                                                         f'aggregate = "{QUORUM}"'))
    assert main(["ensemble", "deid", str(notes), "--out", str(out), "-e", str(two_models)]) == 2
    assert "can never reach 3 votes" in _one_error(capsys) and not out.exists()
    with pytest.raises(ConfigError, match="can never reach 3 votes"):
        dphub.load(two_models)
    assert main(["ensemble", "list", "-e", str(two_models)]) == 0  # listed, with the warning
    assert "warning: runs will refuse this manifest" in capsys.readouterr().err
    # the quorum the two models can reach is taken
    assert main(["ensemble", "deid", str(notes), "--out", str(out), "--aggregate",
                 "k-of-n:2+rules:default", "-e", str(two_models)]) == 0


def test_a_member_named_in_a_rule_must_exist(two_models: Path, notes: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["ensemble", "aggregate", "k-of-n:2+rules:defualt", "-e", str(two_models)]) == 2
    err = _one_error(capsys)
    assert "no member named rules:defualt (did you mean rules:default?)" in err
    assert "site-a, site-b, rules:default" in err
    assert main(["ensemble", "deid", str(notes), "--out", str(tmp_path / "o"), "--aggregate",
                 "k-of-n:2+site-c", "-e", str(two_models)]) == 2
    assert "did you mean site-" in _one_error(capsys)
    assert main(["ensemble", "show", "site-c", "-e", str(two_models)]) == 2
    assert "no member named 'site-c' in the ensemble (did you mean 'site-" in _one_error(capsys)
    # k larger than the ensemble: the count and the fix
    assert main(["ensemble", "aggregate", "k-of-n:4", "-e", str(two_models)]) == 2
    err = _one_error(capsys)
    assert "the ensemble has 3 (site-a, site-b, rules:default): use k-of-n:3 or fewer" in err


def test_removing_a_member_the_rule_needs_is_refused(two_models: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ensemble", "aggregate", "k-of-n:2+rules:default", "-e", str(two_models)]) == 0
    capsys.readouterr()
    for name in ("rules:default", "site-b"):  # named by the rule; needed by its quorum
        assert main(["ensemble", "remove", name, "-e", str(two_models)]) == 2
        assert f"removing '{name}' breaks the aggregation rule" in _one_error(capsys)
    assert main(["ensemble", "aggregate", "any", "-e", str(two_models)]) == 0
    assert main(["ensemble", "remove", "site-b", "-e", str(two_models)]) == 0


def test_aggregate_shows_the_change_and_undo_puts_it_back(
        two_models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prev = two_models.with_name(two_models.name + ".prev")
    original = two_models.read_bytes()
    capsys.readouterr()
    assert main(["ensemble", "aggregate", "k-of-n:2+rules:default", "-e", str(two_models)]) == 0
    out = capsys.readouterr().out
    assert "aggregate: any -> k-of-n:2+rules:default" in out
    assert f"dphub ensemble undo -e {two_models}" in out
    assert prev.read_bytes() == original
    changed = two_models.read_bytes()
    assert main(["ensemble", "undo", "-e", str(two_models)]) == 0
    assert "aggregate: k-of-n:2+rules:default -> any" in capsys.readouterr().out
    assert two_models.read_bytes() == original and prev.read_bytes() == changed
    assert main(["ensemble", "undo", "-e", str(two_models)]) == 0  # undo again: redo
    assert two_models.read_bytes() == changed
    # storing the same rule again changes nothing and says so (the backup stays the real one)
    assert main(["ensemble", "aggregate", "k-of-n:2+rules:default", "-e", str(two_models)]) == 0
    assert "nothing changed" in capsys.readouterr().out and prev.read_bytes() == original


def test_undo_without_a_previous_version(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", "rules:default", "-e", str(m)]) == 0  # a new file: no .prev
    capsys.readouterr()
    assert main(["ensemble", "undo", "-e", str(m)]) == 2
    assert "no previous version to go back to" in _one_error(capsys)
    # a broken backup is refused before anything is written
    prev = m.with_name(m.name + ".prev")
    prev.write_text("aggregate = [")
    before = m.read_bytes()
    assert main(["ensemble", "undo", "-e", str(m)]) == 2
    assert "not a valid TOML manifest" in _one_error(capsys) and m.read_bytes() == before


def test_calibrate_shows_the_thresholds_it_changed_and_can_be_undone(
        tiny_tagger_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dphub import synth

    m = tmp_path / "ens.toml"
    assert main(["ensemble", "add", str(tiny_tagger_dir), "--name", "tiny", "-e", str(m)]) == 0
    assert main(["ensemble", "add", "rules:default", "-e", str(m)]) == 0
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps({"id": n.id, "text": n.text, "patient_id": n.patient_id,
                                        "spans": [s.to_dict() for s in n.spans]}) + "\n"
                            for n in synth.generate(6, seed=11, patients=3)), encoding="utf-8")
    original = m.read_bytes()
    capsys.readouterr()
    assert main(["ensemble", "calibrate", str(gold), "--target-recall", "0.9", "--min-precision",
                 "0", "--per-member", "-e", str(m)]) == 0
    out = capsys.readouterr().out
    assert "tiny: threshold - -> " in out and "dphub ensemble undo" in out
    assert m.read_bytes() != original
    assert main(["ensemble", "undo", "-e", str(m)]) == 0
    assert m.read_bytes() == original


def test_the_manifest_is_named_and_commands_say_which(
        two_models: Path, notes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no dphub-ensemble.toml here
    capsys.readouterr()
    assert main(["ensemble", "show", "--manifest", str(two_models)]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["aggregate"] == "any"  # stdout stays JSON
    assert got.err.strip() == f"manifest: {two_models.resolve()}"
    monkeypatch.setenv("DPHUB_ENSEMBLE", str(two_models))
    assert main(["ensemble", "aggregate"]) == 0
    got = capsys.readouterr()
    assert got.out.strip() == "any" and str(two_models.resolve()) in got.err
    assert main(["ensemble", "deid", str(notes), "--out", str(tmp_path / "o")]) == 0
    assert f"with the ensemble of {two_models.resolve()}" in capsys.readouterr().out
    monkeypatch.delenv("DPHUB_ENSEMBLE")
    assert main(["ensemble", "list"]) == 2  # nothing implicit found: one error naming the file
    assert "dphub-ensemble.toml: no ensemble manifest" in _one_error(capsys)


def test_every_ensemble_command_that_reads_a_manifest_takes_e() -> None:
    import inspect

    from dphub.cli.ensemble import ensemble_app

    for cmd in ensemble_app.registered_commands:
        params = inspect.signature(cmd.callback).parameters
        src = inspect.getsource(cmd.callback)
        if "Manifest" in src:
            assert "manifest_path" in params, cmd.name
            opt = params["manifest_path"].default
            assert {"-e", "--manifest", "--ensemble"} <= set(opt.param_decls), cmd.name


def test_the_change_lines_name_every_kind_of_setting() -> None:
    from dphub.ensemble.manifest import Manifest, MemberEntry, describe_changes

    a = Manifest([MemberEntry("m", "dir", path="/x", threshold=None,
                              options={"config": "deid.config", "timeout": 600.0}),
                  MemberEntry("gone", "rules")], "any")
    b = Manifest([MemberEntry("m", "dir", path="/x", threshold=0.35,
                              label_thresholds={"NAME": 0.2},
                              options={"config": "other.config", "timeout": 600.0}),
                  MemberEntry("new", "rules")], "k-of-n:2+new", runtime="onnx")
    assert describe_changes(a, b) == [
        "aggregate: any -> k-of-n:2+new", "runtime: - -> onnx", "member removed: gone",
        "member added: new (rules)", "m: label_thresholds - -> {NAME 0.2}",
        "m: options {config deid.config, timeout 600} -> {config other.config, timeout 600}",
        "m: threshold - -> 0.35"]
    assert describe_changes(b, b) == []
