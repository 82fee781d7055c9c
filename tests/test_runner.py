"""Directory runs that lose nothing: kill -9 and resume, failed notes, untouched inputs."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dphub.cli.main import main
from dphub.ensemble.core import Ensemble, Slot
from dphub.ensemble.members import FixedMember
from dphub.errors import ConfigError
from dphub.notes import Span
from dphub.runner import EXIT_SOME_FAILED, RUN_DIR, run_deid


def _tree(root: Path, skip_run_dir: bool = True) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not (skip_run_dir and RUN_DIR in p.parts)}


def _make_notes(root: Path, n: int) -> None:
    from faker import Faker

    fake = Faker("en_US")
    fake.seed_instance(5)
    for i in range(n):
        d = root / f"d{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        text = (f"PT SEEN BY DR. {fake.last_name().upper()} ON {fake.date('%m/%d/%Y')}. "
                f"CALL {fake.numerify('617-###-####')}. WIFE {fake.first_name().upper()} IN.\n") * 3
        (d / f"n{i:04d}.txt").write_text(text, encoding="utf-8")


def test_failed_note_is_skipped_and_reported(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in"
    _make_notes(src, 4)
    (src / "d0" / "broken.txt").write_bytes(b"DR. SMITH \xff\xfe ON 10/12/2003")
    before = {k: hashlib.sha256(v).hexdigest() for k, v in _tree(src).items()}
    code = main(["deid", str(src), "--model", "rules:default", "--out", str(tmp_path / "out")])
    assert code == EXIT_SOME_FAILED
    err = capsys.readouterr().err
    assert "d0/broken.txt" in err and "SMITH" not in err
    out = _tree(tmp_path / "out")
    assert "d0/broken.txt" not in out and "d0/n0000.txt" in out
    assert len((tmp_path / "out" / "audit.jsonl").read_text().splitlines()) == 4
    assert {k: hashlib.sha256(v).hexdigest() for k, v in _tree(src).items()} == before
    # a second run without --resume refuses to mix into the earlier output
    assert main(["deid", str(src), "--model", "rules:default", "--out",
                 str(tmp_path / "out")]) == 2
    # --resume retries the failure (still failing) and keeps everything else
    assert main(["deid", str(src), "--model", "rules:default", "--out", str(tmp_path / "out"),
                 "--resume"]) == EXIT_SOME_FAILED


def test_bad_jsonl_record_fails_alone(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "DR. SMITH"}\nnot json\n{"id": "c", "text": "ok 10/12/2003"}\n')
    ens = Ensemble([Slot(FixedMember("f", {"a": [Span(4, 9, "NAME", 0.9)]}))])
    rep = run_deid(src, tmp_path / "out", ens)
    assert rep.failed == ["line 2"] and rep.exit_code == EXIT_SOME_FAILED
    recs = [json.loads(x) for x in (tmp_path / "out" / "in.jsonl").read_text().splitlines()]
    assert [r["id"] for r in recs] == ["a", "c"]
    assert recs[0]["text"] == "DR. [**NAME**]"


def test_output_inside_input_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "in"
    _make_notes(src, 1)
    ens = Ensemble([Slot(FixedMember("f", {}))])
    with pytest.raises(ConfigError):
        run_deid(src, src / "out", ens)


def _start(src: Path, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-c", "from dphub.cli.main import main; main()", "deid", str(src),
           "--model", "rules:default", "--out", str(out), "--batch-size", "1", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _kill_after(proc: subprocess.Popen[bytes], journal: Path, lines: int) -> bool:
    """SIGKILL the run once its journal holds ``lines`` entries; False if it finished first."""
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        if journal.exists() and journal.read_bytes().count(b"\n") >= lines:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.005)
    proc.kill()
    raise AssertionError("run did not progress")


@pytest.mark.parametrize("mode", ["tag", "spans"])
def test_kill_and_resume_is_byte_identical(tmp_path: Path, mode: str) -> None:
    src = tmp_path / "in"
    _make_notes(src, 300)
    ref = tmp_path / "ref"
    assert main(["deid", str(src), "--model", "rules:default", "--out", str(ref),
                 "--mode", mode]) == 0
    out = tmp_path / "out"
    journal = out / RUN_DIR / "journal.jsonl"
    killed = _kill_after(_start(src, out, "--mode", mode), journal, 20)
    assert killed, "the run finished before it could be killed"
    if killed:  # kill the resumed run too, later
        _kill_after(_start(src, out, "--mode", mode, "--resume"), journal, 120)
    proc = _start(src, out, "--mode", mode, "--resume")
    assert proc.wait(timeout=300) == 0
    assert _tree(out) == _tree(ref)
    audit = [json.loads(x)["key"] for x in (out / "audit.jsonl").read_text().splitlines()]
    assert sorted(audit) == sorted(set(audit)) and len(audit) == 300  # none missing, none twice
    # a complete run keeps only its completion marker (no journal, no part files)
    assert sorted(p.name for p in (out / RUN_DIR).iterdir() if p.name != "lock") == ["run.json"]
    assert json.loads((out / RUN_DIR / "run.json").read_text())["status"] == "complete"


def test_resume_with_other_settings_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "in"
    _make_notes(src, 2)
    out = str(tmp_path / "out")
    assert main(["deid", str(src), "--model", "rules:default", "--out", out]) == 0
    assert main(["deid", str(src), "--model", "rules:default", "--out", out, "--resume",
                 "--mode", "redact"]) == 2
    assert main(["deid", str(src), "--model", "rules:default", "--out", out, "--resume"]) == 0
