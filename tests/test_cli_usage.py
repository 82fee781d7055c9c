"""Usage errors, Ctrl-C and help text of the whole command tree (issue 16, Deliver 1 and 4).

Usage errors are bad input, not crashes: exit 2, the command's usage line and one ``error:``
line, no crash-log file. Every option has a description and shows its default, and literal
brackets in help text survive rendering.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from dphub.cli.main import main


@pytest.fixture(autouse=True)
def _private_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Crash logs go to tempfile's directory: point it at this test's own folder."""
    crash_dir = tmp_path / "tmp"
    crash_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(crash_dir))
    monkeypatch.chdir(tmp_path)
    return crash_dir


def _no_crash_log(tmp_path: Path) -> bool:
    return not list((tmp_path / "tmp").glob("dphub-crash-*"))


@pytest.mark.parametrize(
    ("argv", "usage", "needle"),
    [
        (["foo"], "Usage: dphub ", "No such command 'foo'"),  # unknown command
        (["train", "--bogus"], "Usage: dphub train ", "--bogus"),  # unknown option
        (["pull"], "Usage: dphub pull ", "Missing argument"),  # missing argument
        (["data", "synth"], "Usage: dphub data synth ", "--out"),  # missing required option
        (["train", "x.jsonl", "--epochs", "abc"], "Usage: dphub train ", "--epochs"),  # bad value
        (["data", "synth", "--n", "many", "--out", "x.jsonl"], "Usage: dphub data synth", "--n"),
        (["ensemble", "nope"], "Usage: dphub ensemble ", "No such command 'nope'"),
        (["card", "show", "a", "b"], "Usage: dphub card show ", "extra argument"),
    ],
)
def test_usage_errors_exit_2_with_usage_and_one_error_line(
    argv: list[str], usage: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith(usage)
    assert lines[1].startswith("error: ") and needle in lines[1]
    assert "Traceback" not in err and "error: unexpected" not in err
    assert _no_crash_log(tmp_path)
    assert not list(tmp_path.glob("x.jsonl"))


def test_group_without_subcommand_shows_its_help(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["data"]) == 2
    err = capsys.readouterr().err
    assert "synth" in err and "split" in err
    assert _no_crash_log(tmp_path)


def test_help_and_version_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("dphub ")
    assert main(["train", "--help"]) == 0
    assert "Usage: dphub train" in capsys.readouterr().out


def test_ctrl_c_prints_interrupted_and_exits_130(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("dphub.stats.corpus_stats", interrupted)
    (tmp_path / "c.jsonl").write_text("")
    assert main(["data", "stats", "c.jsonl"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "interrupted"
    assert _no_crash_log(tmp_path)


def test_unexpected_errors_still_get_a_private_crash_log(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret note text")

    monkeypatch.setattr("dphub.stats.corpus_stats", broken)
    (tmp_path / "c.jsonl").write_text("")
    assert main(["data", "stats", "c.jsonl"]) == 1
    err = capsys.readouterr().err
    assert "secret" not in err and err.startswith("error: unexpected RuntimeError")
    logs = list((tmp_path / "tmp").glob("dphub-crash-*"))
    assert len(logs) == 1 and (logs[0].stat().st_mode & 0o777) == 0o600
