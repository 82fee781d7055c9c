"""Issue 31 item 24: any --seed but 0 rebuilt the public warm start (25 minutes); the warm start
now has its own fixed seed and --seed acts on the private stage only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dphub.train import TrainOptions, sources, warmstart


@pytest.mark.parametrize("seed", [0, 7])
def test_every_seed_trains_from_the_one_public_warm_start(
    seed: int, tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []

    def fake_warm_start(*_a: Any, seed: int, **_k: Any) -> Path:
        asked.append(seed)
        return tmp_path

    monkeypatch.setattr(warmstart, "warm_start", fake_warm_start)
    wdir, block = sources.warm_start_dir(TrainOptions(base_model=str(tiny_base_model), seed=seed))
    assert wdir == tmp_path
    assert asked == [warmstart.WARM_START_SEED] and block["seed"] == warmstart.WARM_START_SEED


def test_seed_help_says_the_warm_start_is_shared() -> None:
    from dphub.cli.train import SEED_OPT

    assert "shared by every --seed" in " ".join(SEED_OPT.help.split())
