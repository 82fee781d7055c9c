"""What the federation tests share: the tiny training recipe and one thread per test."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

#: a recipe small enough for a round in seconds on the test suite's tiny base
OPTIONS = dict(warm_start="none", batch_size=2, max_physical_batch=8, accountant="rdp",
               max_length=48, stride=8, lr=1e-2, rule_features=False)


@pytest.fixture(autouse=True)
def one_thread(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One torch thread and a private encoder cache per test."""
    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
