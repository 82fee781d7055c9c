"""scripts/corpus_overlap.py: what its 4-word check accepts and what fails it (issue 31 #6).

A made-up corpus and a made-up repository, so the test needs no private data: record delimiters
and the listed generic phrases are reported as accepted, any other shared 4-word run fails.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "corpus_overlap.py"


def _module():
    spec = importlib.util.spec_from_file_location("corpus_overlap", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def _repo(root: Path, text: str) -> Path:
    root.mkdir()
    (root / "notes.md").write_text(text, encoding="utf-8")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "notes.md"], cwd=root, check=True)
    return root


@pytest.mark.parametrize(("text", "code"), [
    ("START_OF_RECORD=1||||1||||\nwe keep it as long as the test runs\n", 0),
    ("the patient xylophone quartz wandered off\n", 1),
])
def test_overlap_accepts_delimiters_and_listed_phrases_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        text: str, code: int) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "id.text").write_text(
        "START_OF_RECORD=1||||1||||\nwill stay as long as the family wants. the patient "
        "xylophone quartz wandered off again.\n||||END_OF_RECORD\n", encoding="utf-8")
    (corpus / "id-phi.phrase").write_text("", encoding="utf-8")
    root = _repo(tmp_path / "repo", text)
    monkeypatch.setattr(sys, "argv", ["corpus_overlap.py", str(corpus), "--root", str(root)])
    assert _module().main() == code
    out = capsys.readouterr().out
    failing, accepted = out.split("# accepted")
    if code:
        assert "xylophone quartz" in failing
    else:
        assert "start of record 1" in accepted and "as long as the" in accepted
        assert "record" not in failing.split("verbatim in tracked files")[1]
