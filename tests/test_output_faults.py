"""Issue 31 #11-#13, #15: output locations that cannot be written, unbounded numbers and files.

A read-only file system (EROFS) or a location this user may not write (EACCES) is the user's to
fix: one ``error:`` line naming the path, exit 2, no crash log. Root ignores permission bits, so
the tests make ``os.open`` (write flags) and ``os.mkdir`` fail under one directory, which is what
the kernel does on a read-only mount (checked by hand with ``mount -o ro``).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest

from dphub.cli.main import main


@pytest.fixture(autouse=True)
def _private_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Crash logs go to tempfile's directory: point it at this test's own folder."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.chdir(tmp_path)


def _crash_logs(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "tmp").glob("dphub-crash-*"))


def _deny_writes(monkeypatch: pytest.MonkeyPatch, root: Path, code: int) -> None:
    """Every create/write under ``root`` fails with ``code``, as on a read-only mount."""
    prefix = str(root.resolve())
    real_open, real_mkdir = os.open, os.mkdir

    def inside(path: object) -> bool:
        return os.path.abspath(os.fsdecode(path)).startswith(prefix)  # type: ignore[arg-type]

    def open_(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(code, os.strerror(code), os.fsdecode(path))  # type: ignore[arg-type]
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    def mkdir(path: object, *args: object, **kwargs: object) -> None:
        if inside(path):
            raise OSError(code, os.strerror(code), os.fsdecode(path))  # type: ignore[arg-type]
        real_mkdir(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "mkdir", mkdir)


def _commands(tmp_path: Path, ro: Path) -> dict[str, list[str]]:
    return {
        "data synth --out": ["data", "synth", "--n", "3", "--out", str(ro / "s.jsonl")],
        "hub policy --hub (new)": ["hub", "policy", "--hub", str(ro / "hub"),
                                   "--max-epsilon", "5"],
        "hub policy --hub": ["hub", "policy", "--hub", str(ro), "--max-epsilon", "5"],
        "ensemble add -e": ["ensemble", "add", "rules:default", "-e", str(ro / "m.toml")],
        "deid --out": ["deid", str(tmp_path / "notes"), "--model", "rules:default",
                       "--out", str(ro / "out")],
        "ensemble deid --out": ["ensemble", "deid", str(tmp_path / "notes"), "-e",
                                str(tmp_path / "e.toml"), "--out", str(ro / "out")],
        "ensemble train --out": ["ensemble", "train", str(tmp_path / "s.jsonl"), "--out",
                                 str(ro / "m"), "--epochs", "1", "--threads", "1"],
    }


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
@pytest.mark.parametrize("which", ["data synth --out", "hub policy --hub (new)", "hub policy --hub",
                                   "ensemble add -e", "deid --out", "ensemble deid --out",
                                   "ensemble train --out"])
def test_unwritable_output_is_one_error_line(which: str, code: int, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("Seen by Dr. Smith on 03/14/2021.\n")
    if which == "ensemble deid --out":
        assert main(["ensemble", "add", "rules:default", "-e", str(tmp_path / "e.toml")]) == 0
    if which == "ensemble train --out":
        assert main(["data", "synth", "--n", "4", "--out", str(tmp_path / "s.jsonl")]) == 0
    capsys.readouterr()
    ro = tmp_path / "ro"
    ro.mkdir()
    _deny_writes(monkeypatch, ro, code)
    assert main(_commands(tmp_path, ro)[which]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert str(ro) in lines[0] and os.strerror(code) in lines[0]
    assert "unexpected" not in err and "Traceback" not in err
    assert not _crash_logs(tmp_path)


def test_other_os_errors_still_get_a_crash_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Only the user's errnos are mapped: an I/O error stays a crash with its private log."""
    ro = tmp_path / "ro"
    ro.mkdir()
    _deny_writes(monkeypatch, ro, errno.EBADF)
    assert main(["hub", "policy", "--hub", str(ro), "--max-epsilon", "5"]) == 1
    assert "unexpected OSError" in capsys.readouterr().err
    assert _crash_logs(tmp_path)


# ---------------------------------------------------------------------------- #13: numbers
def test_offsets_beyond_int_parsing_fail_their_record(tmp_path: Path) -> None:
    """A span number of more than 4,300 digits raised ValueError from int() (a crash that
    aborted the whole run); now a FormatError of that record, like any malformed offset."""
    from dphub import formats
    from dphub.errors import FormatError
    from dphub.formats.physionet import read_span_list

    huge = "9" * 5000
    phi = tmp_path / "x.phi"
    phi.write_text(f"Patient 1\tNote 1\n0\t0\t{huge}\n")
    with pytest.raises(FormatError, match="x.phi:2: end is out of range"):
        read_span_list(phi)
    brat = tmp_path / "brat"
    brat.mkdir()
    (brat / "a.txt").write_text("John Smith\n")
    (brat / "a.ann").write_text(f"T1\tNAME 0 {huge}\tJohn Smith\n")
    with pytest.raises(FormatError, match="a.ann:1: end is out of range"):
        list(formats.read(brat, "brat"))
    (brat / "a.ann").write_text("T1\tNAME 0 10\tJohn Smith\n")
    assert [(s.start, s.end) for s in next(iter(formats.read(brat, "brat"))).spans] == [(0, 10)]


def test_huge_k_in_an_aggregate_rule_is_refused_in_one_short_line() -> None:
    from dphub.ensemble.aggregate import AggregateRule
    from dphub.errors import ConfigError

    for k in ("9" * 5000, "9" * 10):
        with pytest.raises(ConfigError, match="K is larger than any ensemble") as info:
            AggregateRule.parse(f"k-of-n:{k}")
        assert len(info.value.message) < 200
    assert AggregateRule.parse("k-of-n:3").k == 3


def test_overlong_deidpl_path_is_one_error_line(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    for spec in ("a" * 5000, "a/" * 3000):
        assert main(["ensemble", "add", f"deidpl:{spec}", "-e", str(tmp_path / "e.toml")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: deid.pl directory ")
        assert len(err[0]) < 400
    assert not _crash_logs(tmp_path)


# ---------------------------------------------------------------------------- #15: member names
@pytest.mark.parametrize(("name", "needle"), [
    ("", "must not be empty"), ("   ", "must not be empty"), ("a+b", "contains '+'"),
    (" a", "leading/trailing spaces"), ("a\tb", "control characters"),
])
def test_member_names_an_aggregate_rule_cannot_name_are_refused(
        name: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--name a+b` was accepted but `k-of-n:2+a+b` can never name it; `--name ""` fell back to
    the default name and failed with a misleading "already has a member named ..."."""
    m = tmp_path / "e.toml"
    assert main(["ensemble", "add", "rules:default", "-e", str(m)]) == 0
    capsys.readouterr()
    assert main(["ensemble", "add", "rules:default", "--name", name, "-e", str(m)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "already has" not in err[0], err
    assert main(["ensemble", "add", "rules:default", "--name", "rules two", "-e", str(m)]) == 0


def test_a_default_member_name_with_a_plus_is_refused(tmp_path: Path) -> None:
    from dphub.ensemble.manifest import Manifest, MemberEntry
    from dphub.errors import ConfigError

    with pytest.raises(ConfigError, match="contains '\\+'.*--name"):
        Manifest().add(MemberEntry(name="model+v2", kind="dir", path=str(tmp_path)))
