"""A newcomer's first hour (issue 16): the design card's literal commands after ``dphub init``,
the default output directory of ``deid``, and the faults a newcomer meets first (``data synth
--out DIR --force``, a full disk during deid or train).

``test_scripted_newcomer_session`` is the CI version of the session: in an empty directory,
``dphub init`` -> ``dphub data synth`` -> the design card's commands as printed in README.md ->
pull -> ``ensemble deid notes/`` -> the bare ``dphub train --noise 0.55 && dphub publish`` ->
evaluate. It trains a tiny model (tiny base, a few steps,
no warm start) set in dphub.toml the way a user edits it, and publishes to a local hub; the
tiny base is laid out as an offline Hugging Face cache entry (as in test_examples_smoke.py) so
the publish gate can check the tokenizer against it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tomllib
from pathlib import Path

import pytest
import torch

from dphub import formats, synth
from dphub.cli.main import main

#: The design card's commands, as README.md prints them (the test checks they are still there).
DESIGN_CARD = (
    "dphub train notes.jsonl --noise 0.55 --out models/site-a && "
    "dphub publish models/site-a --repo org/site-a",
    "dphub pull org/site-a && dphub ensemble add org/site-a",
    "dphub ensemble deid notes/",
)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DPHUB_HUB", str(tmp_path / "hub"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)


def _run(cmd: str) -> int:
    """Run one literal ``dphub ...`` command line (no shell quoting in these commands)."""
    argv = cmd.split()
    assert argv[0] == "dphub"
    return main(argv[1:])


def _owner_notes(dest: Path, n: int = 5, seed: int = 9) -> list:
    """The owner's notes as a directory of .txt files (what `deid notes/` reads)."""
    notes = synth.generate(n, kind="nursing", seed=seed)
    dest.mkdir()
    for note in notes:
        (dest / f"{note.id}.txt").write_text(note.text, encoding="utf-8")
    return notes


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ init and option precedence
def test_init_template_leaves_the_noise_choice_commented() -> None:
    from dphub.cli.train import INIT_TEMPLATE

    cfg = tomllib.loads(INIT_TEMPLATE)
    assert "noise" not in cfg["privacy"] and "target_epsilon" not in cfg["privacy"]
    assert "# target_epsilon = 8.0" in INIT_TEMPLATE and "# noise = 1.0" in INIT_TEMPLATE


def test_noise_flag_after_init_is_not_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: "give either --noise or --target-epsilon, not both" (the template set one)."""
    assert main(["init"]) == 0
    capsys.readouterr()
    assert main(["train", "--noise", "0.55"]) == 2  # no data yet: that is the only complaint
    err = capsys.readouterr().err
    assert "either" not in err and "data/train.jsonl" in err


@pytest.mark.parametrize(
    ("file_privacy", "flags", "expected"),
    [
        ({"target_epsilon": 8.0}, {"noise": 0.55}, {"noise": 0.55}),
        ({"noise": 1.0}, {"target_epsilon": 3.0}, {"target_epsilon": 3.0}),
        ({"noise": 1.0, "delta": 1e-6}, {"target_epsilon": 3.0},
         {"target_epsilon": 3.0, "delta": 1e-6}),
        ({"target_epsilon": 8.0}, {}, {"target_epsilon": 8.0}),
        ({}, {"noise": 2.0}, {"noise": 2.0}),
    ],
)
def test_flag_replaces_the_files_setting_of_the_other_mode(
    file_privacy: dict, flags: dict, expected: dict
) -> None:
    from dphub.cli.train import _merge

    all_flags = {"noise": None, "target_epsilon": None, "delta": None, "epochs": None}
    all_flags.update(flags)
    merged = _merge(all_flags, {"privacy": file_privacy, "train": {"epochs": 2.0}})
    assert {k: merged.get(k) for k in ("noise", "target_epsilon", "delta") if k in merged} \
        == expected
    assert merged["epochs"] == 2.0  # other keys still come from the file


def test_both_flags_are_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init"]) == 0
    assert main(["train", "--noise", "1", "--target-epsilon", "3"]) == 2
    assert "either" in capsys.readouterr().err


# ------------------------------------------------------------------ default deid output
def test_deid_without_out_writes_beside_the_input_and_never_overwrites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = Path.cwd()
    notes = _owner_notes(work / "notes")
    before = _tree(work / "notes")
    assert main(["ensemble", "add", "rules:default"]) == 0
    assert _run("dphub ensemble deid notes/") == 0
    out = work / "notes.deid"
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
        [f"{n.id}.txt" for n in notes] + ["audit.jsonl"])
    assert "into notes.deid" in capsys.readouterr().out
    assert _tree(work / "notes") == before  # nothing inside the input
    first = _tree(out)
    # a second run refuses (exit 2, one line naming --out) and changes nothing
    assert _run("dphub ensemble deid notes/") == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "--out" in err and len(err.strip().splitlines()) == 1
    assert _tree(out) == first
    # --resume continues the run in the default directory
    assert main(["ensemble", "deid", "notes/", "--resume"]) == 0
    assert _tree(out) == first
    # a JSONL input gets <stem>.deid/ too; the top-level deid has the same default
    formats.write(notes, work / "owner.jsonl", "jsonl")
    assert main(["deid", "owner.jsonl", "--model", "rules:default"]) == 0
    assert (work / "owner.deid" / "owner.jsonl").is_file()


# ------------------------------------------------------------------ faults
def test_synth_out_directory_with_force_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Fault 14: exit 1 (IsADirectoryError) before; --force never replaces a directory."""
    d = Path("d")
    d.mkdir()
    (d / "keep.txt").write_text("mine")
    assert main(["data", "synth", "--n", "2", "--out", "d", "--force"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: d: is a directory") and "Traceback" not in err
    assert [p.name for p in d.iterdir()] == ["keep.txt"]


def _no_space(*_a: object, **_k: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_full_disk_during_deid_is_one_error_line_and_resumable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import dphub.io
    import dphub.runner

    work = Path.cwd()
    _owner_notes(work / "notes", n=6)
    before = _tree(work / "notes")
    real = dphub.io.atomic_open
    calls = {"n": 0}

    def filling_disk(path: str | os.PathLike[str], text: str) -> None:
        if Path(path).suffix == ".txt":
            calls["n"] += 1
        with real(path, "w", newline="") as fh:
            fh.write(text[: len(text) // 2])
            if calls["n"] >= 3:  # the disk fills up while writing the third note
                _no_space()
            fh.write(text[len(text) // 2 :])

    unpatched = dphub.runner.atomic_write_text
    monkeypatch.setattr(dphub.runner, "atomic_write_text", filling_disk)
    code = main(["deid", "notes", "--model", "rules:default", "--out", "out",
                 "--batch-size", "1"])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "disk full" in lines[0]
    assert "Traceback" not in err
    written = [p for p in (work / "out").iterdir() if p.suffix == ".txt"]
    assert len(written) == 2  # the third was never renamed into place ...
    assert not list((work / "out").rglob("*.tmp"))  # ... and its temp file is gone
    assert _tree(work / "notes") == before
    # space freed: --resume finishes the run (the same DPHUB_HOME: monkeypatch.undo() would
    # also undo the per-test home, and the run's note digests need its key)
    monkeypatch.setattr(dphub.runner, "atomic_write_text", unpatched)
    assert main(["deid", "notes", "--model", "rules:default", "--out", "out", "--resume"]) == 0
    assert len([p for p in (work / "out").iterdir() if p.suffix == ".txt"]) == 6


def test_full_disk_during_train_is_one_error_line_and_no_output(
    tiny_base_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    formats.write(synth.generate(6, kind="nursing", seed=4, patients=3), Path("n.jsonl"), "jsonl")
    monkeypatch.setattr(os, "fsync", _no_space)  # every fsync of an output fails
    code = main(["train", "n.jsonl", "--out", "models/m", "--base-model", str(tiny_base_model),
                 "--warm-start", "none", "--noise", "1", "--epochs", "1", "--batch-size", "2",
                 "--accountant", "rdp"])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    # the first write may be the output or the ledger's key (created on first use): either way
    # one line that says the disk is full
    assert lines[-1].startswith("error: ") and ": disk full" in lines[-1], lines[-1]
    assert "Traceback" not in err
    assert not any(x.startswith("error:") for x in lines[:-1])
    assert not Path("models/m").exists()
    assert not Path("models").exists() or not [
        p for p in Path("models").iterdir() if p.name.endswith(".tmp")]


# ------------------------------------------------------------------ the scripted session
def _offline_hf_cache(base: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny base as an offline HF cache entry, so the publish gate can resolve it."""
    import huggingface_hub.constants as hf_constants

    snapshot = "0" * 40
    repo = root / f"models--{base.name}"
    shutil.copytree(base, repo / "snapshots" / snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snapshot)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)


def test_scripted_newcomer_session(
    tmp_path: Path, tiny_base_model: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for line in DESIGN_CARD:
        assert line in readme, f"README.md no longer prints: {line}"
    base = tmp_path / "tiny-bert"
    shutil.copytree(tiny_base_model, base)
    _offline_hf_cache(base, tmp_path / "hf-cache", monkeypatch)

    # 1. dphub init, then the user points the file at a tiny base and tiny epochs
    assert _run("dphub init") == 0
    toml = Path("dphub.toml")
    text = toml.read_text()
    for old, new in [
        ('base_model = "default"', f'base_model = "{base}"'),
        # q = 2/40, 10 steps: sigma 0.55 gives eps ~ 6.9 (prv), under a hub policy of eps <= 10;
        # if a policy refuses it, fewer epochs (fewer steps) is the one line to change
        ("epochs = 32.0", "epochs = 0.5"),
        ("batch_size = 96", "batch_size = 2"),
        ("max_physical_batch = 16", "max_physical_batch = 2"),
        ('warm_start = "synth"', 'warm_start = "none"'),
        ('# repo = "org/name"', 'repo = "org/site-b"'),  # for the bare `dphub publish`
    ]:
        assert old in text
        text = text.replace(old, new)
    toml.write_text(text)

    # 2. data: the site's labelled notes; the owner's notes as a directory of .txt
    assert _run("dphub data synth --n 40 --patients 40 --seed 1 --out notes.jsonl") == 0
    owner = _owner_notes(Path("notes"))
    formats.write(owner, Path("owner.jsonl"), "jsonl")

    # 3. the design card, literally (a hub policy refusing eps > 10 would still pass: eps ~ 7)
    for line in DESIGN_CARD:
        for cmd in line.split(" && "):
            assert _run(cmd) == 0, cmd
    out = capsys.readouterr().out
    assert "published org/site-a@" in out and "pulled org/site-a@" in out
    deid = Path("notes.deid")
    assert {p.name for p in deid.iterdir() if p.suffix == ".txt"} == {f"{n.id}.txt" for n in owner}

    # 3b. the bare form in the project directory: data where the template says, then
    #     `dphub train --noise 0.55 && dphub publish` (the flag replaces the file's choice)
    Path("data").mkdir()
    shutil.copyfile("notes.jsonl", "data/train.jsonl")
    assert _run("dphub train --noise 0.55") == 0
    assert _run("dphub publish") == 0
    assert "published org/site-b@" in capsys.readouterr().out

    # 4. evaluate: members side by side, and the trained model on the owner's gold
    assert _run("dphub ensemble evaluate owner.jsonl") == 0
    assert "org/site-a" in capsys.readouterr().out
    assert _run("dphub evaluate --gold owner.jsonl --model models/site-a --json") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["notes"] == len(owner)


@pytest.mark.parametrize("fmt", [[], ["--format", "text"]])
def test_a_folder_of_docx_is_told_it_is_unsupported_and_how_to_convert(
    fmt: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 31 item 24: the hint was `pass a format`, and `--format text` then found nothing."""
    docs = Path("word")
    docs.mkdir()
    (docs / "note1.docx").write_bytes(b"PK\x03\x04 not really a document")
    assert main(["deid", str(docs), "--model", "rules:default", *fmt]) == 2
    err = capsys.readouterr().err
    assert ".docx files are not supported" in err and "pandoc" in err and "--convert-to" in err
    assert "pass a format" not in err
