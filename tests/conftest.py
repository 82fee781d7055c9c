"""Shared test fixtures.

``tiny_base_model`` is a randomly initialised, very small BERT (hidden 32, 2 layers, 2 heads)
saved like a public base model (safetensors weights + the embedded MiniLM tokenizer files), so that
tests can build, train, save and load taggers in seconds on CPU without any download. It keeps the
full MiniLM vocabulary so the real fast WordPiece tokenizer drives it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

#: Tokenizer files a base model directory carries (copied byte-for-byte from the embedded model).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def make_tiny_base_model(out_dir: Path, seed: int = 0) -> Path:
    """Write a tiny random ``BertModel`` plus the embedded tokenizer files into ``out_dir``."""
    import torch
    from transformers import BertConfig, BertModel

    from dphub.encoders import embedded_model_dir

    out_dir.mkdir(parents=True, exist_ok=True)
    src = embedded_model_dir()
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        type_vocab_size=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = BertModel(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, out_dir / name)
    return out_dir


def pytest_configure(config: pytest.Config) -> None:
    """One intra-op thread: test models are tiny, and on a shared 2-core machine torch's thread
    pool spends far more time spinning than computing (a CRF forward-backward over a few windows
    measured 9.7 s with the default pool vs 0.16 s with one thread)."""
    import torch

    torch.set_num_threads(1)
    # the test hub server olah lives in its own environment (scripts/setup.sh; issue 37)
    olah = Path(__file__).resolve().parent.parent / ".venv-olah" / "bin" / "python"
    if olah.is_file():
        os.environ.setdefault("DPHUB_OLAH_PYTHON", str(olah))


@pytest.fixture(autouse=True)
def _no_progress_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """No progress lines on stderr unless a test asks for them (test_progress, test_newcomer):
    on a loaded machine a run can outlast the reporter's quiet first seconds, and tests that
    read stderr should not depend on the machine's speed."""
    monkeypatch.setenv("DPHUB_PROGRESS", "off")


@pytest.fixture(scope="session", autouse=True)
def _session_dphub_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A dphub home for session- and module-scoped fixtures (which run before the per-test one
    below): a fixture that trains a DP model never writes the user's own privacy ledger."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPHUB_HOME", str(tmp_path_factory.mktemp("dphub-home")))
        yield


@pytest.fixture(scope="module", autouse=True)
def _module_dphub_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A dphub home per module for module-scoped fixtures: two modules whose fixtures train on
    the same synthetic notes (the same generator seeds) must not compose in one ledger, which
    now recognises a dataset by its notes' content (issue 53)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPHUB_HOME", str(tmp_path_factory.mktemp("dphub-home")))
        yield


@pytest.fixture(autouse=True)
def _private_dphub_home(monkeypatch: pytest.MonkeyPatch,
                        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A dphub home per test: DP trainings record their releases in the privacy ledger there
    (never the user's own ledger, and no test composes with another test's releases)."""
    # beside tmp_path, not in it: tests list what a command left in their tmp_path
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path_factory.mktemp("dphub-home")))


@pytest.fixture(scope="session")
def tiny_base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of a tiny random BERT base model (safetensors + MiniLM tokenizer files).

    Session-scoped and read-only by convention: tests that need to modify it should copy it.
    """
    return make_tiny_base_model(tmp_path_factory.mktemp("tiny-base") / "tiny-bert")


@pytest.fixture(scope="session")
def tiny_tagger_dir(tiny_base_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained CRF tagger (hipaa schema) on ``tiny_base_model``, saved as a model directory
    (``model.safetensors``, ``config.json``, tokenizer files; no card). Session-scoped, read-only
    by convention: copy it before adding files."""
    import torch

    from dphub.tagger import TaggerModel

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny-tagger") / "tiny-tagger"
    TaggerModel.from_base(tiny_base_model, schema="hipaa", head="crf").save(out)
    return out
