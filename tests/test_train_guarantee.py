"""The published guarantee holds: unpredictable mechanism randomness, one clipped gradient per
sampled unit on every step, nothing unaccounted in the output, and outputs that never replace
inputs. Each test here fails on the behaviour the privacy review found (see CHANGELOG 0.2.0)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dphub import formats, synth
from dphub import train as T
from dphub.errors import ConfigError, PrivacyError
from dphub.hub import gate
from dphub.notes import Note
from dphub.privacy import randomness as R

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 synthetic notes of 4 patients: every patient has several windows."""
    notes = synth.generate(16, kind="nursing", seed=11, patients=4)
    path = tmp_path_factory.mktemp("corpus") / "train.jsonl"
    formats.write(notes, path, "jsonl")
    return path


def _opts(corpus: Path, base: Path, out: Path, **kw) -> T.TrainOptions:
    o = dict(data=corpus, out=out, base_model=str(base), warm_start="none", epochs=2.0,
             batch_size=2, max_physical_batch=8, noise=1.0, accountant="rdp", max_length=48,
             stride=8, lr=1e-2, train_layers=1, seed=5)
    o.update(kw)
    return T.TrainOptions(**o)


def _weights(d: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(d / "model.safetensors")


def _identical(a: Path, b: Path) -> bool:
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# ---------------------------------------------------------------- 1. unpredictable randomness


@pytest.mark.parametrize("batch_size", [2, 8], ids=["q=1/2", "q=1"])
def test_same_seed_gives_different_dp_weights_and_identical_baselines(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, batch_size: int
) -> None:
    """At q = 1 the sampling is deterministic, so only the noise can make the runs differ."""
    kw = {"batch_size": batch_size}
    T.train(_opts(corpus, tiny_base_model, tmp_path / "dp1", **kw))
    # the same patients twice: the ledger total is above the default policy (issue 53)
    T.train(_opts(corpus, tiny_base_model, tmp_path / "dp2", allow_above_policy=True, **kw))
    assert not _identical(tmp_path / "dp1", tmp_path / "dp2"), "DP noise replayable from --seed"

    T.train(_opts(corpus, tiny_base_model, tmp_path / "b1", no_dp=True, noise=None, **kw))
    T.train(_opts(corpus, tiny_base_model, tmp_path / "b2", no_dp=True, noise=None, **kw))
    assert _identical(tmp_path / "b1", tmp_path / "b2"), "--seed must fix non-private runs"


def test_published_directory_holds_no_mechanism_seed(
    corpus: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    from dphub.card import load_card

    out = tmp_path / "m"
    T.train(_opts(corpus, tiny_base_model, out))
    cfg = json.loads((out / "training_config.json").read_text())
    assert set(cfg) == gate.TRAINING_CONFIG_KEYS

    def keys(obj: object, path: str = "") -> list[str]:
        if isinstance(obj, dict):
            return [k2 for k, v in obj.items() for k2 in [f"{path}.{k}", *keys(v, f"{path}.{k}")]]
        return []

    seeds = [k for k in keys(cfg) + keys(load_card(out).meta) if "seed" in k.lower()]
    # the only seed published is the initialisation seed, which the mechanism never uses
    assert seeds == [".dphub_training.seed"]
    dp = load_card(out).meta["differential_privacy"]
    assert dp["mechanism_rng"] == "os-seeded" and dp["secure_rng"] is False


def test_dp_noise_comes_from_the_mechanism_source(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every noisy step draws its noise from MechanismRandomness, never from torch's RNG."""
    calls: list[tuple[str, float]] = []
    real = R.MechanismRandomness.normal

    def spy(self, shape, std, dtype=torch.float32, device="cpu"):
        calls.append((self.mode, std))
        return real(self, shape, std, dtype, device)

    monkeypatch.setattr(R.MechanismRandomness, "normal", spy)
    res = T.train(_opts(corpus, tiny_base_model, tmp_path / "m", max_grad_norm=0.5))
    assert len(calls) >= res.steps  # at least one trainable tensor per step
    assert {m for m, _ in calls} == {"os-seeded"}
    assert all(std == pytest.approx(1.0 * 0.5) for _, std in calls)


@pytest.mark.parametrize("mode", ["os-seeded", "csprng"])
def test_noise_sources_are_gaussian_with_the_right_scale(mode: str) -> None:
    src = R.MechanismRandomness(mode)
    z = src.normal((200_000,), std=2.5, dtype=torch.float64).numpy()
    assert abs(z.mean()) < 0.03 and z.std() == pytest.approx(2.5, rel=0.01)
    # tails are Gaussian (a uniform or a broken transform fails this)
    assert np.mean(np.abs(z) > 2 * 2.5) == pytest.approx(0.0455, abs=0.004)
    u = src.uniform(100_000)
    assert u.min() >= 0 and u.max() < 1 and u.mean() == pytest.approx(0.5, abs=0.01)
    # two sources of the same mode never agree (fresh OS entropy each)
    assert not torch.equal(R.MechanismRandomness(mode).normal((8,), 1.0),
                           R.MechanismRandomness(mode).normal((8,), 1.0))


def test_seeded_source_is_only_for_baselines_and_restores_its_state() -> None:
    with pytest.raises(PrivacyError):
        R.MechanismRandomness("seeded")
    a = R.MechanismRandomness.for_run(private=False, secure=False, seed=3)
    state = a.state()
    first = a.uniform(5)
    a.set_state(state)
    assert np.array_equal(first, a.uniform(5))
    assert R.MechanismRandomness.for_run(private=True, secure=False, seed=3).state() is None


def test_secure_mode_trains_and_says_so(corpus: Path, tiny_base_model: Path, tmp_path: Path) -> None:
    from dphub.card import load_card

    out = tmp_path / "secure"
    T.train(_opts(corpus, tiny_base_model, out, secure_rng=True, epochs=1.0))
    dp = load_card(out).meta["differential_privacy"]
    assert dp["mechanism_rng"] == "csprng" and dp["secure_rng"] is True


# ---------------------------------------------------------------- 7. one gradient per unit


def _record_clipping(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """Record, per logical step, the units the sampler drew and the rows the optimizer clipped."""
    from opacus.optimizers.optimizer import DPOptimizer

    drawn: list[int] = []
    clipped: list[int] = []
    real_iter = R.PoissonUnitSampler.__iter__
    real_clip = DPOptimizer.clip_and_accumulate

    def iter_spy(self):
        for batch in real_iter(self):
            drawn.append(len(batch))
            yield batch

    def clip_spy(self):
        clipped.append(int(self.grad_samples[0].shape[0]))
        return real_clip(self)

    monkeypatch.setattr(R.PoissonUnitSampler, "__iter__", iter_spy)
    monkeypatch.setattr(DPOptimizer, "clip_and_accumulate", clip_spy)
    return drawn, clipped


def test_each_noisy_step_clips_exactly_one_gradient_per_sampled_unit(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn, clipped = _record_clipping(monkeypatch)
    res = T.train(_opts(corpus, tiny_base_model, tmp_path / "m"))
    assert len(drawn) == res.steps and sum(drawn) > 0
    assert clipped == drawn  # one physical batch per step here (max_physical_batch = 8 units)


def test_skipping_the_per_unit_aggregation_is_caught(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutation the review tried: per-window clipping (sensitivity k·C per patient)."""
    import dphub.privacy.units as U

    monkeypatch.setattr(U, "aggregate_grad_sample_by_unit", lambda *a, **k: None)
    # q = 1 (batch 8 >= 4 units): every step samples every unit, never an empty batch
    with pytest.raises(PrivacyError, match="per-sample gradient rows"):
        T.train(_opts(corpus, tiny_base_model, tmp_path / "m", batch_size=8))
    assert not (tmp_path / "m").exists()

    # and with the in-loop check removed too, the clipping recorder above turns red
    monkeypatch.setattr(U, "check_one_gradient_per_unit", lambda *a, **k: None)
    drawn, clipped = _record_clipping(monkeypatch)
    T.train(_opts(corpus, tiny_base_model, tmp_path / "m2", batch_size=8))
    assert clipped != drawn


# ---------------------------------------------------------------- 8. expected batch never 0


@pytest.mark.parametrize("n", [49, 98])
def test_expected_batch_is_never_zero(n: int) -> None:
    plan = T.plan_privacy(T.TrainOptions(data=Path("x"), out=Path("y"), batch_size=1, noise=1.0,
                                         accountant="rdp", epochs=1.0), n)
    assert int(plan.num_units * plan.sample_rate) == 0  # what Opacus computes: the old bug
    assert plan.expected_batch_units == 1


def test_training_with_n_q_below_one_in_floating_point(tiny_base_model: Path,
                                                       tmp_path: Path) -> None:
    notes = [Note(id=f"n{i}", text=f"Seen by Dr. Smith on 03/0{i % 9 + 1}/2020.",
                  patient_id=f"p{i}", spans=[], labelled=True) for i in range(49)]
    path = tmp_path / "tiny.jsonl"
    formats.write(notes, path, "jsonl")
    res = T.train(T.TrainOptions(
        data=path, out=tmp_path / "m", base_model=str(tiny_base_model), warm_start="none",
        batch_size=1, epochs=0.1, noise=1.0, accountant="rdp", max_length=32, stride=4,
    ))
    assert res.steps == 5 and res.sample_rate == pytest.approx(1 / 49)
    # q = 1/N publishes N exactly (issue 31 #5): the card says so
    from dphub.card import load_card
    from dphub.privacy.statement import EXACT_UNITS_NOT_COVERED

    assert EXACT_UNITS_NOT_COVERED in load_card(tmp_path / "m").dp["not_covered"]


@pytest.mark.parametrize("first", [10_001, 20_001, 123_400])
def test_default_delta_does_not_reveal_the_number_of_units(first: int) -> None:
    """Issue 31 #5: δ = 1/(10 N) unrounded inverted to N above 10,000 units; on the 1-2-5 grid,
    rounded down (δ ≤ 1/(10 N) still), a hundred neighbouring N publish one δ."""
    deltas = {T.default_delta(n) for n in range(first, first + 100)}
    assert len(deltas) == 1
    [delta] = deltas
    assert delta <= 1 / (10 * (first + 99)) and f"{delta:g}"[0] in "125"
    plan = T.plan_privacy(T.TrainOptions(data=Path("x"), out=Path("y"), noise=1.0,
                                         accountant="rdp", epochs=1.0), first)
    assert plan.delta == delta


# ---------------------------------------------------------------- outputs never replace inputs


def test_force_never_removes_the_training_data(corpus: Path, tiny_base_model: Path,
                                               tmp_path: Path) -> None:
    data_dir = tmp_path / "corpus"
    data_dir.mkdir()
    data = data_dir / "train.jsonl"
    data.write_bytes(corpus.read_bytes())
    for out in (data_dir, tmp_path):  # the corpus directory itself, a directory holding it
        with pytest.raises(ConfigError, match="overlaps the training data"):
            T.train(_opts(data, tiny_base_model, out, force=True))
    assert data.read_bytes() == corpus.read_bytes()

    other = tmp_path / "notes-of-mine"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    with pytest.raises(ConfigError, match="not one, so nothing was removed"):
        T.train(_opts(data, tiny_base_model, other, force=True))
    assert (other / "keep.txt").read_text() == "x"

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        T.train(_opts(data, tiny_base_model, a_file))

    # --force does replace a previous model directory
    out = tmp_path / "model"
    T.train(_opts(data, tiny_base_model, out, epochs=1.0))
    T.train(_opts(data, tiny_base_model, out, epochs=1.0, force=True))
    assert T.is_model_directory(out)
