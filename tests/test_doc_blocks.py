"""Every doc block marked runnable runs as written (issue 56, item 6).

A shell block of README.md or docs/*.md is runnable when the line before its fence is
``<!-- doc-test -->``. The runnable blocks of one document run in order, as one ``bash -euo
pipefail`` script each, in one fresh directory with its own ``DPHUB_HOME`` (and ``HOME``), the
project's ``dphub`` first on ``PATH``, and nothing else: whatever a block needs, the document
creates first (synthetic notes, a key file, a word list). So a renamed option, a removed command
or a file a block forgets to create breaks this test, not a reader.

Blocks that train a real model, need the development corpus, a network, a browser or an optional
extra are not marked (each document's unmarked blocks are listed in the docstring of
:data:`UNMARKED`); they are exercised by the tests of their commands instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARK = "<!-- doc-test -->"
FENCE = re.compile(r"^```(?P<info>\S*)\s*$")
#: Seconds one block may take (the two documents' blocks took 170 s together on 2 busy cores).
DOC_TIMEOUT_S = 420

#: Documents with shell blocks that are deliberately not runnable, and why (kept in step with the
#: documents by test_every_document_with_shell_blocks_is_accounted_for).
UNMARKED: dict[str, str] = {
    "README.md": "the one-line summary and the tour's training, publishing, distillation and "
                 "owner-model blocks train real models (minutes each; the first training on a "
                 "machine builds the public warm start, ~15 min); `scripts/demo.sh` / "
                 "`scripts/test.sh` set up a virtual environment",
    "docs/federated.md": "trains a federated model (Flower simulation, minutes) and deploys "
                         "SuperLink/SuperNodes with TLS",
    "docs/privacy.md": "audits train real models; the benchmark needs the development corpus",
    "docs/review.md": "serves a page or needs a finished run and a browser; the benchmark needs "
                      "the development corpus",
    "docs/safe_vocab.md": "rebuilds the vocabulary from downloaded word lists",
    "docs/scale.md": "needs the Ray extra and a Ray runtime",
    "docs/recall_first.md": "the reference block uses placeholders (NOTES, GOLD); calibrating "
                            "to recall 0.995 at precision 0.6 refuses on a few synthetic notes",
    "docs/surrogates.md": "the benchmark needs the development corpus",
    "docs/owner.md": "needs a trained owner model and deid.pl",
    "docs/hub.md": "a synopsis of the options, not commands",
    "docs/results.md": "benchmarks that train on the development corpus",
}


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # of the opening fence, 1-based
    script: str


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def runnable_blocks(path: Path) -> list[Block]:
    """The blocks of ``path`` marked runnable, in order. A mark not followed by a fence is an
    error (it would mark nothing, silently)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    rel = path.relative_to(ROOT).as_posix()
    out: list[Block] = []
    for i, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if fence is None or fence["info"] not in ("", "bash", "sh"):
            raise AssertionError(f"{rel}:{i + 1}: {MARK} must be followed by a ```bash fence")
        body: list[str] = []
        for j in range(i + 2, len(lines)):
            if lines[j].startswith("```"):
                break
            body.append(lines[j])
        else:
            raise AssertionError(f"{rel}:{i + 2}: the block never closes")
        out.append(Block(rel, i + 2, "\n".join(body) + "\n"))
    return out


def _env(work: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DPHUB_") and k not in ("HOME", "PYTHONPATH")}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        HOME=str(work / "home"),
        DPHUB_HOME=str(work / "dphub-home"),
        DPHUB_PROGRESS="off",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def run_blocks(blocks: list[Block], work: Path) -> None:
    """Run ``blocks`` in order in ``work``; AssertionError naming the block that failed."""
    (work / "home").mkdir(parents=True, exist_ok=True)
    env = _env(work)
    for block in blocks:
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.script], cwd=work, env=env,
            capture_output=True, text=True, timeout=DOC_TIMEOUT_S, stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0:
            raise AssertionError(
                f"{block.doc}:{block.line}: the block exits {proc.returncode}\n"
                f"--- stderr (tail)\n{proc.stderr[-3000:]}\n--- stdout (tail)\n"
                f"{proc.stdout[-1500:]}")


_MARKED = [p.relative_to(ROOT).as_posix() for p in _docs() if runnable_blocks(p)]


def test_the_readme_tour_has_runnable_blocks() -> None:
    assert "README.md" in _MARKED and "docs/recall_first.md" in _MARKED


@pytest.mark.slow
@pytest.mark.parametrize("doc", _MARKED)
def test_doc_blocks_run_as_written(doc: str, tmp_path: Path) -> None:
    run_blocks(runnable_blocks(ROOT / doc), tmp_path)


def test_a_block_that_no_longer_runs_fails_the_test(tmp_path: Path) -> None:
    """The runner cannot pass a block with a renamed option (the point of the test)."""
    doc = tmp_path / "doc.md"
    doc.write_text(f"text\n\n{MARK}\n```bash\ndphub data synth --n 2 --out a.jsonl\n"
                   "dphub data stats a.jsonl --no-such-option\n```\n", encoding="utf-8")
    blocks = [Block("doc.md", b.line, b.script) for b in _blocks_of(doc)]
    with pytest.raises(AssertionError, match=r"doc.md:4: the block exits 2"):
        run_blocks(blocks, tmp_path / "w")


def _blocks_of(path: Path) -> list[Block]:
    """runnable_blocks for a file outside the repository (the test's own)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    i = lines.index(MARK)
    end = lines.index("```", i + 2)
    return [Block(path.name, i + 2, "\n".join(lines[i + 2:end]) + "\n")]


def test_a_mark_must_mark_a_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    doc = tmp_path / "x.md"
    doc.write_text(f"{MARK}\nno fence here\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="must be followed by a ```bash fence"):
        runnable_blocks(doc)


def test_every_document_with_shell_blocks_is_accounted_for() -> None:
    """A document with shell blocks either marks some runnable or says here why not."""
    for path in _docs():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        has_shell = re.search(r"^```(bash|sh)?\s*\n\s*(dphub|python|pip|bash) ", text, re.M)
        if has_shell:
            assert rel in _MARKED or rel in UNMARKED, f"{rel}: no runnable block, no reason"
