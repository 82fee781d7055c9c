"""Checkpoint and resume: an interrupted run, resumed, continues the same run.

Same number of steps and the same ε (the accountant's history is in the checkpoint). Without DP,
sampling and dropout follow generators whose states the checkpoint holds, so the weights are the
same too. Under DP the mechanism's noise and sampling are re-seeded from the operating system on
resume (never stored), so the weights differ from an uninterrupted run, as they differ between any
two DP runs. Checkpoints are safetensors + JSON in a 0700 directory; nothing is unpickled.
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

from dphub import checkpoint, formats, synth
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
    ckpt = T.checkpoint_dir_for(out)
    assert checkpoint.exists(ckpt) and not out.exists()
    assert (ckpt.stat().st_mode & 0o777) == 0o700
    for f in ckpt.iterdir():
        assert (f.stat().st_mode & 0o777) == 0o600, f.name
    assert checkpoint.read_manifest(ckpt)["state"]["step"] == 4  # last multiple of checkpoint_every
    # starting over without --resume would silently drop the progress: refused
    with pytest.raises(ConfigError, match="--resume"):
        T.train(_opts(corpus, tiny_base_model, out, **extra))
    res = T.train(_opts(corpus, tiny_base_model, out, resume=True, **extra))

    assert res.steps == full.steps == 12
    assert res.epsilon == full.epsilon
    if no_dp:
        _same_weights(out, tmp_path / "full")
    assert not ckpt.exists()


def test_resume_never_unpickles_a_planted_checkpoint(
    corpus: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    """A planted pickle is never loaded: neither a legacy checkpoint.pt nor inside our files."""
    import pickle

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (marker.touch, ())

    out = tmp_path / "m"
    ckpt = T.checkpoint_dir_for(out)
    ckpt.mkdir(parents=True)
    (ckpt / "checkpoint.pt").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ConfigError, match="pickled checkpoint"):
        T.train(_opts(corpus, tiny_base_model, out, resume=True))
    assert not marker.exists()

    # a real checkpoint whose tensor file was replaced by a pickle: refused, not executed
    (ckpt / "checkpoint.pt").unlink()
    with pytest.raises(KeyboardInterrupt):
        T.train(_opts(corpus, tiny_base_model, out, _stop_after=2))
    (ckpt / checkpoint.TENSOR_FILE).write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ConfigError, match="unreadable checkpoint"):
        T.train(_opts(corpus, tiny_base_model, out, resume=True))
    assert not marker.exists()


def test_a_checkpoint_with_non_finite_tensors_is_refused(tmp_path: Path) -> None:
    """Issue 31 item 8: training stops before it could save inf/NaN, so such a checkpoint was
    altered or damaged; resuming from it would continue a broken model."""
    state = {"step": 2, "model": {"w": torch.tensor([1.0, float("inf")])},
             "rng": {"torch": torch.zeros(8, dtype=torch.uint8)}}
    checkpoint.save(tmp_path / "ck", state)
    with pytest.raises(ConfigError, match=r"checkpoint holds non-finite values .*delete"):
        checkpoint.load(tmp_path / "ck")
    state["model"]["w"] = torch.tensor([1.0, 2.0])
    checkpoint.save(tmp_path / "ok", state)
    assert checkpoint.load(tmp_path / "ok")["model"]["w"].tolist() == [1.0, 2.0]


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
        "--checkpoint-every", "3", "--lr", "0.005", "--seed", "7", "--train-layers", "1",
        "--allow-above-policy",  # ε ≈ 13.7: this test is about resuming, not the policy
        *extra,
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
        allow_above_policy=True,  # ε ≈ 13.7, as the CLI run's --allow-above-policy
    ))

    out = tmp_path / "killed"
    ckpt = T.checkpoint_dir_for(out) / checkpoint.STATE_FILE
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
    step_at_kill = checkpoint.read_manifest(ckpt.parent)["state"]["step"]
    assert 0 < step_at_kill < 48

    done = subprocess.run(_cli(corpus, tiny_base_model, out, "--resume"), env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]

    import json

    a = json.loads((full / "training_config.json").read_text())
    b = json.loads((out / "training_config.json").read_text())
    assert a["steps"] == b["steps"] == 48
    assert a["epsilon"] == b["epsilon"]
    # the private run logs: the resumed run kept the losses of the steps before the kill
    la = json.loads(T.run_log_path(T.checkpoint_dir_for(full)).read_text())["loss_history"]
    lb = json.loads(T.run_log_path(T.checkpoint_dir_for(out)).read_text())["loss_history"]
    assert len(la) == len(lb) == 48
