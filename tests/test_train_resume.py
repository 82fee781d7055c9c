"""Checkpoint and resume: an interrupted run, resumed, equals the uninterrupted run.

Same number of steps, same ε, and — because sampling, noise and dropout all come from generators
whose states the checkpoint holds — the same weights.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dphub import formats, synth
from dphub import train as T
from dphub.errors import ConfigError


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    notes = synth.generate(16, kind="nursing", seed=5, patients=8)
    path = tmp_path_factory.mktemp("corpus") / "train.jsonl"
    formats.write(notes, path, "jsonl")
    return path


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(model_dir / "model.safetensors")


def _same_weights(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6), k


def _opts(corpus: Path, base: Path, out: Path, **kw) -> T.TrainOptions:
    o = dict(data=corpus, out=out, base_model=str(base), warm_start="none", epochs=3.0,
             batch_size=2, max_physical_batch=1, noise=1.0, accountant="rdp", max_length=48,
             stride=8, checkpoint_every=2, lr=5e-3, recall_weight=1.0)
    o.update(kw)
    return T.TrainOptions(**o)


@pytest.mark.parametrize("no_dp", [False, True])
def test_resume_in_process_matches_uninterrupted(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, no_dp: bool
) -> None:
    extra = {"no_dp": True, "noise": None} if no_dp else {}
    full = T.train(_opts(corpus, tiny_base_model, tmp_path / "full", **extra))

    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        T.train(_opts(corpus, tiny_base_model, out, _stop_after=5, **extra))
    ckpt = T.checkpoint_dir_for(out) / T.CHECKPOINT_FILE
    assert ckpt.is_file() and not out.exists()
    assert T.load_checkpoint(ckpt)["step"] == 4  # the last multiple of checkpoint_every
    # starting over without --resume would silently drop the progress: refused
    with pytest.raises(ConfigError, match="--resume"):
        T.train(_opts(corpus, tiny_base_model, out, **extra))
    res = T.train(_opts(corpus, tiny_base_model, out, resume=True, **extra))

    assert res.steps == full.steps == 12
    assert res.epsilon == full.epsilon
    _same_weights(out, tmp_path / "full")
    assert not ckpt.parent.exists()


def test_resume_refuses_a_checkpoint_of_another_run(
    corpus: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "m"
    with pytest.raises(KeyboardInterrupt):
        T.train(_opts(corpus, tiny_base_model, out, _stop_after=2))
    with pytest.raises(ConfigError, match="different run"):
        T.train(_opts(corpus, tiny_base_model, out, resume=True, lr=1e-2))
    with pytest.raises(ConfigError, match="no checkpoint"):
        T.train(_opts(corpus, tiny_base_model, tmp_path / "other", resume=True))


def _cli(corpus: Path, base: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "dphub.cli.main", "train", str(corpus), "--out", str(out),
        "--base-model", str(base), "--warm-start", "none", "--epochs", "12", "--batch-size", "2",
        "--max-physical-batch", "1", "--noise", "1.0", "--accountant", "rdp",
        "--checkpoint-every", "3", "--lr", "0.005", "--seed", "7", "--train-layers", "1", *extra,
    ]


def test_sigkill_then_resume_matches_uninterrupted_run(
    corpus: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "DPHUB_CACHE_DIR": str(tmp_path / "cache")}
    full = tmp_path / "full"  # the uninterrupted run, in-process (same options as _cli)
    T.train(T.TrainOptions(
        data=corpus, out=full, base_model=str(tiny_base_model), warm_start="none", epochs=12.0,
        batch_size=2, max_physical_batch=1, noise=1.0, accountant="rdp", checkpoint_every=3,
        lr=0.005, seed=7, train_layers=1,
    ))

    out = tmp_path / "killed"
    ckpt = T.checkpoint_dir_for(out) / T.CHECKPOINT_FILE
    proc = subprocess.Popen(_cli(corpus, tiny_base_model, out), env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert ckpt.exists(), "the run never wrote a checkpoint"
    assert not out.exists(), "the run finished before it could be killed"
    step_at_kill = T.load_checkpoint(ckpt)["step"]
    assert 0 < step_at_kill < 48

    done = subprocess.run(_cli(corpus, tiny_base_model, out, "--resume"), env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]

    import json

    a = json.loads((full / "training_config.json").read_text())
    b = json.loads((out / "training_config.json").read_text())
    assert a["steps"] == b["steps"] == 48
    assert a["epsilon"] == b["epsilon"]
    assert a["loss_history"] == b["loss_history"]
    _same_weights(out, full)
