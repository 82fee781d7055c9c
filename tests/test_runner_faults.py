"""Issue 16 faults of directory runs and the ensemble (#3, #7, #8, #9, #10, #13, #17).

Each test reproduces a campaign finding that the previous code got wrong: PHI in a world-readable
journal, one bad note aborting a run, --resume overwriting an input, a second key accepted,
concurrent runs and manifest edits, a tampered pulled model loaded, misleading messages.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
from hub_fixtures import copy_model

from dphub.cli.main import main
from dphub.ensemble.core import Ensemble, Slot
from dphub.ensemble.members import FixedMember
from dphub.errors import ConfigError, InputError
from dphub.notes import Note, Span
from dphub.rules.engine import RuleMember
from dphub.runner import EXIT_SOME_FAILED, RUN_DIR, run_deid

pytest_plugins = ("hub_fixtures",)


def _notes(root: Path, n: int = 4) -> list[str]:
    """Synthetic notes as a .txt directory; returns the names written into them."""
    from faker import Faker

    fake = Faker("en_US")
    fake.seed_instance(16)
    root.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(n):
        name = fake.last_name().upper()
        names.append(name)
        (root / f"n{i}.txt").write_text(
            f"SEEN BY DR. {name} ON {fake.date('%m/%d/%Y')}. CALL {fake.numerify('617-###-####')}.\n",
            encoding="utf-8")
    return names


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _rules() -> Ensemble:
    return Ensemble([Slot(RuleMember())])


# ---------------------------------------------------------------------------- 3: the journal
def test_run_state_holds_no_note_text_and_is_private(tmp_path: Path) -> None:
    src = tmp_path / "in"
    names = _notes(src)
    (src / "broken.txt").write_bytes(b"\xff\xfe")  # one failure: the run state stays
    out = tmp_path / "out"
    rep = run_deid(src, out, _rules(), audit_text=True)
    assert rep.failed == ["broken.txt"]
    removed = [s["text"] for line in (out / "audit.jsonl").read_text().splitlines()
               for s in json.loads(line)["spans"]]
    assert any(n in removed for n in names)  # the audit does hold text (asked for)
    run = out / RUN_DIR
    state = b"".join(p.read_bytes() for p in run.rglob("*") if p.is_file()
                     and "parts" not in p.parts)
    for text in removed + names:
        assert text.encode() not in state, "note text in the journal / run.json"
    assert _mode(run) == 0o700 and _mode(run / "parts") == 0o700
    for p in run.rglob("*"):
        if p.is_file():
            assert _mode(p) == 0o600, p.name
    assert _mode(out / "audit.jsonl") == 0o600 and _mode(out / "n0.txt") == 0o600
    assert _mode(out) == 0o700
    sub = tmp_path / "nested"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "x.txt").write_text("DR. SMITH", encoding="utf-8")
    run_deid(src, sub, _rules())
    assert _mode(sub / "a") == 0o700 and _mode(sub / "a" / "b") == 0o700
    # fixed and resumed: the run completes and keeps no journal and no part files
    (src / "broken.txt").write_text("DR. SMITH", encoding="utf-8")
    assert run_deid(src, out, _rules(), audit_text=True, resume=True).exit_code == 0
    assert not (run / "journal.jsonl").exists() and not (run / "parts").exists()


def test_jsonl_records_are_not_journaled(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "CALL DR. QUIMBLEY NOW"}\nnot json\n', encoding="utf-8")
    ens = Ensemble([Slot(FixedMember("f", {"a": [Span(9, 17, "NAME", 0.9)]}))])
    rep = run_deid(src, tmp_path / "out", ens)
    assert rep.failed == ["line 2"]
    journal = (tmp_path / "out" / RUN_DIR / "journal.jsonl").read_text()
    assert "CALL" not in journal and "QUIMBLEY" not in journal
    assert json.loads((tmp_path / "out" / "in.jsonl").read_text())["text"] == "CALL DR. [**NAME**] NOW"


def test_a_lost_part_file_leaves_both_final_files_as_they_were(tmp_path: Path) -> None:
    """Finishing writes audit.jsonl and the JSONL output in one pass; a record missing from the
    run state aborts both, so neither is half-replaced and no temp file is left."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "CALL DR. QUIMBLEY NOW"}\nnot json\n'
                   '{"id": "c", "text": "SEEN BY DR. QUIMBLEY"}\n', encoding="utf-8")
    ens = Ensemble([Slot(FixedMember("f", {"a": [Span(9, 17, "NAME", 0.9)],
                                             "c": [Span(11, 19, "NAME", 0.9)]}))])
    out = tmp_path / "out"
    assert run_deid(src, out, ens, batch_size=1).failed == ["line 2"]  # state kept for --resume
    before = _tree(out)
    parts = sorted((out / RUN_DIR / "parts").iterdir())
    assert len(parts) == 2
    parts[-1].unlink()
    with pytest.raises(ConfigError, match="run state is incomplete"):
        run_deid(src, out, ens, batch_size=1, resume=True)
    after = _tree(out)
    assert {k: v for k, v in after.items() if not k.startswith(RUN_DIR)} == \
        {k: v for k, v in before.items() if not k.startswith(RUN_DIR)}
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


# ---------------------------------------------------------------------------- 7: bad notes
def test_lone_surrogate_line_fails_alone(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "DR. SMITH"}\n{"id": "b", "text": "x \\ud800 y"}\n'
                   '{"id": "c", "text": "ON 10/12/2003"}\n', encoding="utf-8")
    rep = run_deid(src, tmp_path / "out", _rules())
    assert rep.failed == ["line 2"] and "surrogate" in rep.errors[0]
    ids = [json.loads(x)["id"] for x in (tmp_path / "out" / "in.jsonl").read_text().splitlines()]
    assert ids == ["a", "c"]
    assert len((tmp_path / "out" / "audit.jsonl").read_text().splitlines()) == 2


def test_unreadable_txt_fails_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "in"
    _notes(src)
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:  # tests run as root: chmod 000 would not stop us
        if self.name == "n1.txt":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    rep = run_deid(src, tmp_path / "out", _rules())
    assert rep.failed == ["n1.txt"] and "Permission denied" in rep.errors[0]
    assert sorted(p.name for p in (tmp_path / "out").glob("*.txt")) == ["n0.txt", "n2.txt", "n3.txt"]
    assert len((tmp_path / "out" / "audit.jsonl").read_text().splitlines()) == 3


def test_long_note_id_in_brat_mode_is_written(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    long_id = "w" * 400
    src.write_text("".join(json.dumps({"id": i, "text": f"DR. SMITH {i[:3]}"}) + "\n"
                           for i in ("a", long_id, "c")), encoding="utf-8")
    rep = run_deid(src, tmp_path / "out", _rules(), mode="brat")
    assert rep.exit_code == 0 and rep.done == 3
    names = sorted(p.name for p in (tmp_path / "out").glob("*.ann"))
    assert len(names) == 3 and all(len(n.encode()) < 255 for n in names)


def test_output_write_error_fails_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dphub.runner as runner

    src = tmp_path / "in"
    _notes(src)
    real = runner.atomic_write_text

    def write(path: Path, text: str) -> None:
        if Path(path).name == "n2.txt":
            raise OSError(errno.ENAMETOOLONG, "File name too long")
        real(path, text)

    monkeypatch.setattr(runner, "atomic_write_text", write)
    rep = run_deid(src, tmp_path / "out", _rules())
    assert rep.failed == ["n2.txt"] and "File name too long" in rep.errors[0]
    assert (tmp_path / "out" / "n3.txt").is_file()
    assert len((tmp_path / "out" / "audit.jsonl").read_text().splitlines()) == 3


def test_bad_ann_fails_alone_in_a_brat_corpus(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "brat"
    src.mkdir()
    for i in range(1, 6):
        (src / f"n{i}.txt").write_text(f"DR. QUIMBLEY SAW HIM {i}", encoding="utf-8")
        (src / f"n{i}.ann").write_text("T1\tDOCTOR 4 12\tQUIMBLEY\n", encoding="utf-8")
    (src / "n3.ann").write_text("T1\tDOCTOR 4 twelve\tQUIMBLEY\n", encoding="utf-8")
    out = tmp_path / "out"
    code = main(["deid", str(src), "--model", "rules:default", "--out", str(out)])
    assert code == EXIT_SOME_FAILED
    err = capsys.readouterr().err
    assert "n3.ann" in err and "QUIMBLEY" not in err
    assert sorted(p.name for p in out.glob("*.txt")) == ["n1.txt", "n2.txt", "n4.txt", "n5.txt"]
    assert len((out / "audit.jsonl").read_text().splitlines()) == 4


# ---------------------------------------------------------------------------- 8: where OUT may be
def test_resume_needs_a_run_and_out_is_never_the_input(tmp_path: Path) -> None:
    src = tmp_path / "in"
    _notes(src)
    before = _tree(tmp_path)
    for out, extra in ((src, ["--resume"]), (src, []), (tmp_path, []), (tmp_path, ["--resume"]),
                       (src / "sub", [])):
        assert main(["deid", str(src), "--model", "rules:default", "--out", str(out),
                     *extra]) == 2
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("not ours", encoding="utf-8")
    assert main(["deid", str(src), "--model", "rules:default", "--out", str(other),
                 "--resume"]) == 2
    assert _tree(other) == {"keep.txt": b"not ours"}
    after = _tree(tmp_path)
    after.pop("other/keep.txt")
    assert after == before  # the input untouched, no output or run state left anywhere
    # a JSONL input: OUT must not be (or contain) the input's directory either
    jl = tmp_path / "j" / "notes.jsonl"
    jl.parent.mkdir()
    jl.write_text('{"id": "a", "text": "DR. SMITH"}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="contain the input"):
        run_deid(jl, jl.parent, _rules())


# ---------------------------------------------------------------------------- 9: the key
def test_resume_with_another_key_is_refused(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in"
    _notes(src)
    (src / "broken.txt").write_bytes(b"\xff")
    ka, kb = tmp_path / "a.key", tmp_path / "b.key"
    ka.write_text("a" * 32)
    kb.write_text("b" * 32)
    out = str(tmp_path / "out")
    args = ["deid", str(src), "--model", "rules:default", "--out", out, "--mode", "surrogate"]
    assert main([*args, "--key-file", str(ka)]) == EXIT_SOME_FAILED
    capsys.readouterr()
    assert main([*args, "--key-file", str(kb), "--resume"]) == 2
    assert "--key-file" in capsys.readouterr().err
    assert b"a" * 32 not in (tmp_path / "out" / RUN_DIR / "run.json").read_bytes()
    assert main([*args, "--key-file", str(ka), "--resume"]) == EXIT_SOME_FAILED


# ---------------------------------------------------------------------------- 10: concurrency
class _Slow(FixedMember):
    def tag(self, notes: list[Note], threshold: float | None = None) -> list[list[Span]]:
        time.sleep(0.3)
        return super().tag(notes, threshold)


def test_two_runs_into_one_out_do_not_both_run(tmp_path: Path) -> None:
    src = tmp_path / "in"
    _notes(src, 6)
    out = tmp_path / "out"
    barrier = threading.Barrier(2)
    results: list[object] = []

    def go() -> None:
        barrier.wait()
        try:
            results.append(run_deid(src, out, Ensemble([Slot(_Slow("s", {}))]), batch_size=1))
        except ConfigError as e:
            results.append(e)

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r for r in results if isinstance(r, ConfigError)]
    assert len(errors) == 1, results
    assert "another dphub run" in errors[0].message or "not empty" in errors[0].message
    done = [r for r in results if not isinstance(r, ConfigError)]
    assert done[0].exit_code == 0 and done[0].done == 6


def test_lock_held_means_in_progress(tmp_path: Path) -> None:
    from filelock import FileLock

    src = tmp_path / "in"
    _notes(src, 1)
    out = tmp_path / "out"
    (out / RUN_DIR).mkdir(parents=True)
    with FileLock(str(out / RUN_DIR / "lock")), pytest.raises(ConfigError, match="another dphub run"):
        run_deid(src, out, _rules())


def test_parallel_ensemble_add_keeps_every_member(tmp_path: Path) -> None:
    m = tmp_path / "ens.toml"
    procs = [subprocess.Popen(
        [sys.executable, "-c", "from dphub.cli.main import main; main()", "ensemble", "add",
         "rules:default", "--name", f"r{i}", "--ensemble", str(m)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(6)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 6
    names = sorted(x["name"] for x in tomllib.loads(m.read_text())["members"])
    assert names == [f"r{i}" for i in range(6)]
    # no .ens.toml.lock or temp file left; the previous manifest is kept for `ensemble undo`
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ens.toml", "ens.toml.prev"]


def test_manifest_lock_is_removed_and_still_serialises_edits(tmp_path: Path) -> None:
    """The lock file is unlinked by its holder: waiters must re-lock the new file (issue 31)."""
    import threading

    from dphub.ensemble.manifest import Manifest, MemberEntry

    m = tmp_path / "ens.toml"

    def add(i: int) -> None:
        for j in range(5):
            with Manifest.editing(m, missing_ok=True) as manifest:
                manifest.add(MemberEntry(f"r{i}-{j}", "rules"))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    names = {x["name"] for x in tomllib.loads(m.read_text())["members"]}
    assert names == {f"r{i}-{j}" for i in range(8) for j in range(5)}
    assert not (tmp_path / ".ens.toml.lock").exists()


# ---------------------------------------------------------------------------- 13: pulled weights
def test_pulled_model_is_verified_when_loaded(model_template: Path, hub_env: dict[str, Path],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from dphub.registry import Registry

    model = copy_model(model_template, hub_env["tmp"] / "model")
    assert main(["publish", str(model), "--repo", "acme/deid", "--tag", "v1"]) == 0
    assert main(["pull", "acme/deid@v1"]) == 0
    m = hub_env["tmp"] / "ens.toml"
    assert main(["ensemble", "add", "acme/deid", "--ensemble", str(m)]) == 0
    entry = Registry().get("acme/deid")
    assert entry.files and "model.safetensors" in entry.files
    src = hub_env["tmp"] / "notes"
    _notes(src, 1)
    weights = entry.path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["ensemble", "deid", str(src), "--out", str(hub_env["tmp"] / "o1"),
                 "--ensemble", str(m)]) == 2
    err = capsys.readouterr().err
    assert "acme/deid" in err and "model.safetensors" in err
    assert main(["deid", str(src), "--model", "acme/deid", "--out",
                 str(hub_env["tmp"] / "o2")]) == 2
    assert not (hub_env["tmp"] / "o1").exists() and not (hub_env["tmp"] / "o2").exists()


# ---------------------------------------------------------------------------- 17: messages
def test_fifo_and_symlink_loop_are_named(tmp_path: Path) -> None:
    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="FIFO"):
        run_deid(fifo, tmp_path / "o", _rules())
    a, b = tmp_path / "a", tmp_path / "b"
    a.symlink_to(b)
    b.symlink_to(a)
    with pytest.raises(InputError, match="symbolic link loop"):
        run_deid(a, tmp_path / "o", _rules())
    assert not (tmp_path / "o").exists()
    from dphub import formats
    from dphub.formats._base import read_text

    with pytest.raises(InputError, match="FIFO"):
        read_text(fifo)
    with pytest.raises(InputError, match="FIFO"):
        list(formats.read(fifo))
    with pytest.raises(InputError, match="symbolic link loop"):
        formats.detect_format(a)


def test_run_that_failed_before_any_output_does_not_block_a_retry(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "DR. SMITH"}\n{"id": "a", "text": "DR. JONES"}\n',
                   encoding="utf-8")
    out = tmp_path / "out"
    with pytest.raises(InputError, match="output file name already used"):
        run_deid(src, out, _rules(), mode="brat")  # two notes, one file name
    assert not out.exists()
    rep = run_deid(src, out, _rules(), mode="tag")  # other settings: not "started with different"
    assert rep.exit_code == 0 and rep.done == 2


def test_read_each_isolates_files_and_reports_a_broken_stream(tmp_path: Path) -> None:
    from dphub import formats

    d = tmp_path / "txt"
    d.mkdir()
    for name, text in (("a", "DR. SMITH"), ("b", ""), ("c", "ON 10/12/2003")):
        (d / f"{name}.txt").write_text(text, encoding="utf-8")
    got = list(formats.read_each(d, format="text"))
    assert [(k, n is not None) for k, n, _ in got] == [("a", True), ("b", False), ("c", True)]
    assert "empty" in got[1][2]
    jl = tmp_path / "c.jsonl"
    jl.write_text('{"id": "a", "text": "DR. SMITH"}\n{"id": "b"}\n{"id": "c", "text": "x"}\n',
                  encoding="utf-8")
    got = list(formats.read_each(jl, format="jsonl"))
    assert got[0][0] == "a" and got[1][1] is None and len(got) == 2
    assert "after note 'a'" in got[1][0] and "not read" in got[1][2]


def test_resume_of_a_run_started_by_the_previous_format(tmp_path: Path) -> None:
    """Run state written before this change (flat run.json, audits inside the journal) resumes."""
    src = tmp_path / "in"
    _notes(src, 3)
    (src / "broken.txt").write_bytes(b"\xff")
    out = tmp_path / "out"
    assert run_deid(src, out, _rules()).failed == ["broken.txt"]
    run = out / RUN_DIR
    params = json.loads((run / "run.json").read_text())["settings"]
    del params["key"]
    (run / "run.json").write_text(json.dumps(params))
    parts = {}
    for f in (run / "parts").iterdir():
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            parts[rec["key"]] = rec["audit"]
    old = []
    for line in (run / "journal.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e.pop("part", None):
            e["audit"] = parts[e["key"]]
        old.append(json.dumps(e))
    (run / "journal.jsonl").write_text("\n".join(old) + "\n")
    import shutil

    shutil.rmtree(run / "parts")
    (src / "broken.txt").write_text("DR. SMITH", encoding="utf-8")
    rep = run_deid(src, out, _rules(), resume=True)
    assert rep.exit_code == 0 and rep.skipped == 3 and rep.done == 1
    assert len((out / "audit.jsonl").read_text().splitlines()) == 4


def test_file_name_that_is_not_utf8_fails_alone(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in"
    _notes(src, 2)
    with open(os.path.join(os.fsencode(src), b"odd\xff.txt"), "wb") as fh:
        fh.write(b"DR. SMITH")
    code = main(["deid", str(src), "--model", "rules:default", "--out", str(tmp_path / "out")])
    assert code == EXIT_SOME_FAILED
    assert "odd\\xff.txt" in capsys.readouterr().err
    assert len((tmp_path / "out" / "audit.jsonl").read_text().splitlines()) == 2


def test_resume_of_a_complete_run_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in"
    _notes(src, 2)
    out = str(tmp_path / "out")
    assert main(["deid", str(src), "--model", "rules:default", "--out", out]) == 0
    capsys.readouterr()
    assert main(["deid", str(src), "--model", "rules:default", "--out", out, "--resume"]) == 0
    assert "already complete" in capsys.readouterr().out
    assert main(["deid", str(src), "--model", "rules:default", "--out", out, "--resume",
                 "--mode", "redact"]) == 2
    err = capsys.readouterr().err
    assert "different settings (mode)" in err and "another --out" in err


@pytest.mark.parametrize("victim", ["n2.txt", "audit.jsonl"])
def test_full_disk_stops_the_run_resumably(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           victim: str) -> None:
    import dphub.runner as runner

    src = tmp_path / "in"
    _notes(src)
    real = runner.atomic_write_text

    def write(path: Path, text: str) -> None:
        if Path(path).name == victim:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, text)

    real_open = runner.atomic_open

    def open_(path: Path, *args: object, **kwargs: object) -> object:  # streamed outputs
        if Path(path).name == victim:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(runner, "atomic_write_text", write)
    monkeypatch.setattr(runner, "atomic_open", open_)
    with pytest.raises(runner.OutputError, match="No space left"):
        run_deid(src, tmp_path / "out", _rules(), batch_size=1)
    monkeypatch.setattr(runner, "atomic_write_text", real)
    monkeypatch.setattr(runner, "atomic_open", real_open)
    rep = run_deid(src, tmp_path / "out", _rules(), batch_size=1, resume=True)
    assert rep.exit_code == 0 and rep.skipped + rep.done == 4
    ref = tmp_path / "ref"
    run_deid(src, ref, _rules())
    assert {k: v for k, v in _tree(tmp_path / "out").items() if RUN_DIR not in k} == \
        {k: v for k, v in _tree(ref).items() if RUN_DIR not in k}


def test_resume_with_retrained_weights_is_refused(model_template: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from hub_fixtures import make_model_dir

    model = copy_model(model_template, tmp_path / "model")
    src = tmp_path / "in"
    _notes(src, 2)
    (src / "broken.txt").write_bytes(b"\xff")
    out = str(tmp_path / "out")
    args = ["deid", str(src), "--model", str(model), "--out", out]
    assert main(args) == EXIT_SOME_FAILED
    other = make_model_dir(tmp_path / "other", seed=7)
    (model / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    capsys.readouterr()
    assert main([*args, "--resume"]) == 2
    assert "different settings (ensemble)" in capsys.readouterr().err


@pytest.mark.parametrize("victim", ["n0.txt", "n3.txt"])
def test_disk_full_message_says_resume_when_a_rerun_needs_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], victim: str) -> None:
    """Issue 31 #15: the atomic writer's DiskFullError said "run again", and the rerun was then
    refused without --resume. Now: --resume once a note was written; "run again" (and a plain
    rerun works) when the run wrote nothing."""
    import dphub.runner as runner
    from dphub.io import _disk_full

    src = tmp_path / "in"
    _notes(src)
    real = runner.atomic_write_text

    def write(path: Path, text: str) -> None:
        if Path(path).name == victim:
            raise _disk_full(path)
        real(path, text)

    monkeypatch.setattr(runner, "atomic_write_text", write)
    out = str(tmp_path / "out")
    assert main(["deid", str(src), "--model", "rules:default", "--out", out,
                 "--batch-size", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "disk full" in err[0]
    monkeypatch.setattr(runner, "atomic_write_text", real)
    if victim == "n0.txt":  # nothing written: the state is gone, a plain rerun works
        assert "run again" in err[0] and "--resume" not in err[0]
        assert main(["deid", str(src), "--model", "rules:default", "--out", out]) == 0
    else:
        assert "continue with --resume" in err[0]
        assert main(["deid", str(src), "--model", "rules:default", "--out", out]) == 2
        assert "--resume" in capsys.readouterr().err
        assert main(["deid", str(src), "--model", "rules:default", "--out", out,
                     "--resume"]) == 0
