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


# ---------------------------------------------------------------------------- help text
def _commands() -> list[tuple[tuple[str, ...], object]]:
    """Every leaf command and group of the app, with its path (() for the root)."""
    import typer.main

    from dphub.cli.main import app

    found: list[tuple[tuple[str, ...], object]] = []

    def walk(cmd: object, path: tuple[str, ...]) -> None:
        found.append((path, cmd))
        for name, sub in sorted((getattr(cmd, "commands", None) or {}).items()):
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return found


def _squash(text: str) -> str:
    """Help output without whitespace: the formatter wraps lines (also at hyphens)."""
    return "".join(text.split())


def test_every_option_is_described_shows_its_default_and_keeps_brackets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import re

    problems: list[str] = []
    commands = _commands()
    assert len(commands) > 25
    for path, cmd in commands:
        assert main([*path, "--help"]) == 0, path
        rendered = _squash(capsys.readouterr().out)
        where = "dphub " + " ".join(path)
        texts = [getattr(cmd, "help", None) or ""]
        for param in cmd.params:  # type: ignore[attr-defined]
            name = "/".join(param.opts) or param.name
            helptext = getattr(param, "help", None)
            if not helptext:
                problems.append(f"{where} {name}: no help text")
                continue
            texts.append(helptext)
            show = getattr(param, "show_default", None)
            if isinstance(show, str):
                texts.append(show)
            flag = getattr(param, "is_flag", False)
            if not (param.required or flag or isinstance(show, str)
                    or (param.default is not None and show is not False)):
                problems.append(f"{where} {name}: default not shown")
        for text in texts:
            for bracketed in re.findall(r"\S*\[[^\]\s]*\]\S*", text):
                if _squash(bracketed) not in rendered:
                    problems.append(f"{where}: {bracketed!r} lost in the rendered help")
    assert not problems, "\n".join(problems)


def test_help_shows_literal_brackets_and_the_recall_weight_formula(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["pull", "--help"]) == 0
    assert "org/name[@revision]" in capsys.readouterr().out
    assert main(["publish", "--help"]) == 0
    assert "[hub]" in capsys.readouterr().out
    assert main(["train", "--help"]) == 0
    out = _squash(capsys.readouterr().out)
    assert "ρ_i=1+δp·FNR_i" in out


def test_every_help_is_free_of_escaped_brackets_and_answers_to_dash_h(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 56: Typer escaped "[default: ...]" as "\\[default: ...]" in plain help (rich
    installed), and `-h` was refused as an unknown option."""
    problems: list[str] = []
    for path, _cmd in _commands():
        assert main([*path, "-h"]) == 0, path
        out = capsys.readouterr().out
        if "\\[" in out:
            problems.append(f"dphub {' '.join(path)}: stray backslash before a bracket")
        if "-h, --help" not in out:
            problems.append(f"dphub {' '.join(path)}: -h not listed")
    assert not problems, "\n".join(problems)


def test_train_help_defaults_are_the_library_defaults() -> None:
    """The defaults `train --help` spells out are TrainOptions' (the flags default to None so
    that dphub.toml can fill them)."""
    import dataclasses

    import typer.main

    from dphub.cli.main import app
    from dphub.train import TrainOptions

    defaults = {f.name: f.default for f in dataclasses.fields(TrainOptions)}
    train = typer.main.get_command(app).commands["train"]  # type: ignore[attr-defined]
    checked = 0
    for param in train.params:
        show = getattr(param, "show_default", None)
        value = defaults.get(param.name)
        if not isinstance(show, str) or value is None or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            assert float(show) == float(value), (param.name, show, value)
        else:
            assert show == value, (param.name, show, value)
        checked += 1
    assert checked >= 15


@pytest.mark.parametrize(
    "path",
    [("train",), ("deid",), ("evaluate",), ("ensemble", "deid"), ("ensemble", "evaluate"),
     ("ensemble", "calibrate")],
)
def test_commands_that_compute_take_threads(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*path, "--help"]) == 0
    assert "--threads" in capsys.readouterr().out


def test_threads_is_applied_before_the_library_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import torch

    seen: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)

    def stop(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("dphub.train.train", stop)
    (tmp_path / "n.jsonl").write_text("")
    assert main(["train", "n.jsonl", "--out", "m", "--threads", "3"]) == 130
    assert seen == [3]


@pytest.mark.parametrize("path", [("deid", "--model", "rules:default"), ("ensemble", "deid")])
@pytest.mark.parametrize("workers", ["100000", "0"])
def test_ray_workers_is_bounded(path: tuple[str, ...], workers: str,
                                monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    """Like --threads: `--ray-workers 100000` is a usage error naming the option and the bound,
    before Ray (or any model) is started."""
    import dphub.ray_engine as R
    from dphub.cli.options import MAX_THREADS

    started: list[object] = []
    monkeypatch.setattr(R, "ray_engine", lambda *a, **k: started.append(a))
    (tmp_path / "n.jsonl").write_text("")
    code = main([*path, "n.jsonl", "--out", "o", "--engine", "ray", "--ray-workers", workers])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--ray-workers" in err.splitlines()[-1]
    if workers != "0":
        assert str(MAX_THREADS) in err
    assert started == [] and not (tmp_path / "o").exists() and _no_crash_log(tmp_path)


@pytest.mark.parametrize(
    "path",
    [("train",), ("deid", "--model", "rules:default"), ("evaluate",), ("ensemble", "deid"),
     ("ensemble", "train"), ("pretrain",), ("audit",)],
)
@pytest.mark.parametrize("threads", ["100000", "30000"])
def test_threads_is_bounded(path: tuple[str, ...], threads: str, monkeypatch: pytest.MonkeyPatch,
                            tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31 #12: `--threads 100000` created 32k threads and segfaulted; now a usage error
    naming --threads and the bound (the machine's CPUs, at least 64), before torch is told."""
    import torch

    from dphub.cli.options import MAX_THREADS

    seen: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    (tmp_path / "n.jsonl").write_text("")
    assert main([*path, "n.jsonl", "--threads", threads]) == 2
    err = capsys.readouterr().err
    assert "--threads" in err.splitlines()[-1] and str(MAX_THREADS) in err
    assert seen == [] and _no_crash_log(tmp_path)


# ---------------------------------------------------------------------------- NaN and infinity
@pytest.mark.parametrize(
    "argv",
    [
        ["train", "n.jsonl", "--out", "m", "--lr", "nan"],
        ["train", "n.jsonl", "--out", "m", "--noise", "nan"],
        ["train", "n.jsonl", "--out", "m", "--noise", "inf"],
        ["train", "n.jsonl", "--out", "m", "--noise", "-inf"],
        ["train", "n.jsonl", "--out", "m", "--target-epsilon", "nan"],
        ["train", "n.jsonl", "--out", "m", "--epochs", "nan"],
        ["train", "n.jsonl", "--out", "m", "--epochs", "Infinity"],
        ["train", "n.jsonl", "--out", "m", "--delta", "nan"],
        ["train", "n.jsonl", "--out", "m", "--max-grad-norm", "nan"],
        ["train", "n.jsonl", "--out", "m", "--recall-weight", "nan"],
        ["train", "n.jsonl", "--out", "m", "--max-epsilon", "inf"],
        ["train", "n.jsonl", "--out", "m", "--lr", "0"],
        ["pull", "org/x", "--max-epsilon", "nan"],
        ["pull", "org/x", "--max-epsilon", "NaN"],
        ["search", "--max-epsilon", "nan"],
        ["ensemble", "add", "rules:default", "--threshold", "nan"],
        ["deid", "in", "--model", "rules:default", "--out", "o", "--threshold", "nan"],
        ["ensemble", "calibrate", "n.jsonl", "--target-recall", "nan"],
        ["ensemble", "calibrate", "n.jsonl", "--target-recall", "1.5"],
    ],
)
def test_non_finite_numbers_are_usage_errors(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the library was called with a non-finite option")

    for target in ("dphub.train.train", "dphub.hub.ops.pull", "dphub.hub.ops.search"):
        monkeypatch.setattr(target, must_not_run)
    assert main(argv) == 2
    err = capsys.readouterr().err
    option = next(a for a in argv if a.startswith("--") and a != "--out" and a != "--model")
    assert f"'{option}'" in err and err.strip().splitlines()[-1].startswith("error: ")
    assert _no_crash_log(tmp_path)
    assert not (tmp_path / "dphub-ensemble.toml").exists()


def test_finite_float_parser_bounds() -> None:
    from dphub.cli.options import finite_float

    parse = finite_float(min=0.0, max=1.0, min_open=True)
    assert parse("0.5") == 0.5 and parse(1.0) == 1.0
    for bad in ("nan", "inf", "-inf", "0", "1.01", "x", True):
        with pytest.raises(ValueError):
            parse(bad)


def test_sigterm_runs_cleanups_and_exits_143(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A scheduler's SIGTERM unwinds like Ctrl-C: ``finally`` blocks (temporary note-text
    directories, half-written outputs) run, and the exit code says terminated."""
    import os
    import signal

    import dphub.cli.main as cli_main

    cleaned: list[bool] = []

    def invoke(argv: object) -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next bytecode
            return 0
        finally:
            cleaned.append(True)

    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(cli_main, "_invoke", invoke)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        code = cli_main.main(["--help"])
        after = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 143 and cleaned == [True]
    assert "terminated" in capsys.readouterr().err
    assert after is signal.SIG_DFL  # the CLI puts the handler it found back
