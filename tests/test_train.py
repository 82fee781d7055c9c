"""DP training end to end on tiny synthetic data: output layout, card, accounting, options.

Everything runs on the session's tiny random BERT (hidden 32, 2 layers) and ~20 synthetic notes,
with the RDP accountant and an explicit σ where the test is not about planning (PRV's noise search
takes seconds per evaluation).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from dphub import formats, synth
from dphub import train as T
from dphub.errors import CardError, ConfigError, PrivacyError
from dphub.hub import gate
from dphub.privacy import accounting

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 synthetic nursing notes of 6 patients as JSONL."""
    notes = synth.generate(20, kind="nursing", seed=3, patients=6)
    path = tmp_path_factory.mktemp("corpus") / "train.jsonl"
    formats.write(notes, path, "jsonl")
    return path


def _opts(corpus: Path, base: Path, out: Path, **kw) -> T.TrainOptions:
    base_kw = dict(
        data=corpus, out=out, base_model=str(base), warm_start="none", epochs=2.0, batch_size=2,
        max_physical_batch=2, noise=1.0, accountant="rdp", max_length=64, stride=16,
        checkpoint_every=2, lr=5e-3,
    )
    base_kw.update(kw)
    return T.TrainOptions(**base_kw)


def test_dp_training_writes_a_valid_private_model_dir(
    corpus: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    from dphub.card import load_card
    from dphub.hub.validate import validate_card
    from dphub.tagger import Tagger

    out = tmp_path / "model"
    res = T.train(_opts(corpus, tiny_base_model, out))

    # layout: weights, config, tokenizer, training config, card; no pickles, no optimizer state
    names = {p.name for p in out.iterdir()}
    for required in ("model.safetensors", "config.json", "tokenizer.json", "vocab.txt",
                     "training_config.json", "README.md"):
        assert required in names
    assert not [n for n in names if n.endswith(PICKLE_SUFFIXES)]
    # tokenizer files are byte copies of the public base
    assert (out / "vocab.txt").read_bytes() == (tiny_base_model / "vocab.txt").read_bytes()
    # no local paths in what gets published
    for name in ("training_config.json", "README.md", "config.json"):
        text = (out / name).read_text(encoding="utf-8")
        assert str(tmp_path) not in text, name
        assert str(corpus.parent) not in text, name
    # the checkpoint (private) is gone after success, and was never inside the output dir
    assert not T.checkpoint_dir_for(out).exists()

    # 6 patients, batch 2 -> q = 1/3, 2 epochs -> 6 steps; ε is the accountant's
    assert res.num_units == 6 and res.sample_rate == pytest.approx(1 / 3) and res.steps == 6
    expected = accounting.epsilon_for("rdp", 1 / 3, 1.0, 6, res.delta)
    assert res.epsilon == pytest.approx(expected, rel=1e-9)
    assert res.delta == T.default_delta(6) <= 1 / 6

    card = validate_card(out, require_private=True)
    dp = card.meta["differential_privacy"]
    assert dp["private"] is True and dp["privacy_unit"] == "patient"
    assert dp["epsilon"] == pytest.approx(expected, rel=1e-6)
    assert dp["steps"] == 6 and dp["num_units"] == "5-9" and dp["noise_multiplier"] == 1.0
    # counts are published as ranges only (exact counts are not protected by ε)
    assert card.meta["dataset"]["notes"] == "20-49" and card.meta["dataset"]["patients"] == "5-9"
    assert load_card(out).meta["base_model"] == tiny_base_model.name

    cfg = json.loads((out / "training_config.json").read_text())
    assert cfg["steps"] == 6 and set(cfg) == gate.TRAINING_CONFIG_KEYS
    assert "loss_history" not in cfg and "num_units" not in cfg
    # the loss curve stays in the private run log next to the (removed) checkpoints
    log = T.run_log_path(T.checkpoint_dir_for(out))
    assert log.is_file() and (log.stat().st_mode & 0o777) == 0o600
    assert len(json.loads(log.read_text())["loss_history"]) == 6
    # the model loads for inference
    tagger = Tagger.load(out)
    notes = synth.generate(2, kind="nursing", seed=9)
    assert len(tagger.tag(notes)) == 2


def test_no_dp_baseline_is_marked_non_private(
    corpus: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    from dphub.hub.validate import validate_card

    out = tmp_path / "baseline"
    res = T.train(_opts(corpus, tiny_base_model, out, no_dp=True, noise=None))
    assert res.epsilon is None and res.steps == 6
    dp = validate_card(out).meta["differential_privacy"]
    assert dp["private"] is False and dp["epsilon"] is None
    with pytest.raises(CardError):
        validate_card(out, require_private=True)


def test_training_changes_the_weights_and_respects_frozen_layers(
    corpus: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    from dphub.tagger import TaggerModel

    out = tmp_path / "m"
    T.train(_opts(corpus, tiny_base_model, out, train_layers=1, noise=0.5, epochs=1.0,
                  allow_above_policy=True))  # ε ≈ 15.6: this test is about the layers
    trained = load_file(out / "model.safetensors")
    torch.manual_seed(0)
    fresh = TaggerModel.from_base(tiny_base_model).export_state_dict()
    emb = "bert.embeddings.word_embeddings.weight"
    assert torch.equal(trained[emb], fresh[emb])  # frozen
    low = "bert.encoder.layer.0.attention.self.query.weight"
    assert torch.equal(trained[low], fresh[low])  # below the trainable top layer
    top = "bert.encoder.layer.1.attention.self.query.weight"
    assert not torch.equal(trained[top], fresh[top])
    assert "crf.transitions" in trained


def test_existing_output_is_refused_without_force(
    corpus: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ConfigError, match="exists"):
        T.train(_opts(corpus, tiny_base_model, out))
    assert (out / "keep.txt").read_text() == "x"


@pytest.mark.parametrize("no_dp", [False, True])
def test_a_non_finite_loss_stops_training_and_leaves_nothing(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    no_dp: bool,
) -> None:
    """Issue 31 item 8: a loss that becomes inf midway stops the run before its backward pass;
    the checkpoints already written (steps 1-2) go too, since a resume would repeat it."""
    from dphub.train import loop as L

    steps_done: list[int] = []
    real = L.window_loss

    def poisoned(model, batch, recall_weight):
        per = real(model, batch, recall_weight)
        return per * math.inf if len(steps_done) >= 2 else per

    monkeypatch.setattr(L, "window_loss", poisoned)
    out = tmp_path / "m"
    # q = 1 (batch 6 of 6 patients): no empty Poisson batch can postpone the poisoned step
    opts = _opts(corpus, tiny_base_model, out, checkpoint_every=1, batch_size=6, epochs=6.0,
                 no_dp=no_dp, noise=None if no_dp else 1.0,
                 allow_above_policy=True)  # q = 1, 6 steps: above 10; about divergence
    with pytest.raises(L.TrainingDiverged, match=r"^training stopped at step 3 of 6: the loss "
                                                 r"became non-finite"):
        T.train(opts, on_progress=lambda p: steps_done.append(p.step)
                if p.phase.startswith("train") else None)
    assert steps_done == [1, 2]
    assert not out.exists()
    assert not T.checkpoint_dir_for(out).exists(), "the diverged run's checkpoints are removed"


def test_patient_unit_needs_patient_ids(tiny_base_model: Path, tmp_path: Path) -> None:
    notes = synth.generate(4, kind="nursing", seed=1)
    for n in notes:
        n.patient_id = None
    path = tmp_path / "nopat.jsonl"
    formats.write(notes, path, "jsonl")
    with pytest.raises(ConfigError, match="patient id"):
        T.train(_opts(path, tiny_base_model, tmp_path / "m"))
    assert not (tmp_path / "m").exists()


def test_note_unit_counts_notes(corpus: Path, tiny_base_model: Path, tmp_path: Path) -> None:
    res = T.train(_opts(corpus, tiny_base_model, tmp_path / "m", privacy_unit="note",
                        batch_size=5, epochs=1.0))
    assert res.num_units == 20 and res.sample_rate == pytest.approx(1 / 4) and res.steps == 4


def _plan(num_units: int, **kw) -> T.PrivacyPlan:
    o = T.TrainOptions(data=Path("x"), out=Path("y"), accountant="rdp", **kw)
    return T.plan_privacy(o, num_units)


def test_target_epsilon_is_hit_from_below() -> None:
    plan = _plan(100, target_epsilon=3.0, batch_size=10, epochs=2.0)
    eps = accounting.epsilon_for("rdp", plan.sample_rate, plan.noise_multiplier, plan.steps,
                                 plan.delta)
    assert plan.sample_rate == pytest.approx(0.1) and plan.steps == 20
    assert 3.0 * 0.95 <= eps <= 3.0


def test_max_epsilon_stops_before_exceeding() -> None:
    plan = _plan(100, noise=0.8, batch_size=10, epochs=5.0, max_epsilon=4.0)
    assert plan.stopped_by_max_epsilon and plan.steps < plan.planned_steps == 50
    eps = lambda t: accounting.epsilon_for("rdp", 0.1, 0.8, t, plan.delta)  # noqa: E731
    assert eps(plan.steps) <= 4.0 < eps(plan.steps + 1)


def test_max_epsilon_below_one_step_is_an_error() -> None:
    with pytest.raises(PrivacyError, match="max-epsilon"):
        _plan(100, noise=0.3, batch_size=50, max_epsilon=0.01)


def test_default_delta_is_well_below_one_over_n() -> None:
    for n in (1, 6, 105, 10_000, 10**7):
        assert T.default_delta(n) <= 1 / (10 * n)
        assert T.default_delta(n) <= 1e-5
    with pytest.raises(PrivacyError, match="1/N"):
        _plan(100, noise=1.0, delta=0.05)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"noise": 1.0, "target_epsilon": 2.0}, "either"),
        ({"privacy_unit": "ward"}, "privacy-unit"),
        ({"head": "mlp"}, "head"),
        ({"batch_size": 0}, "batch-size"),
        ({"delta": 2.0}, "delta"),
        ({"lr": float("nan")}, "lr"),
        ({"noise": float("inf")}, "noise"),
        ({"noise": float("nan")}, "noise"),
        ({"target_epsilon": float("nan")}, "target-epsilon"),
        ({"epochs": float("nan")}, "epochs"),
    ],
)
def test_bad_options_are_config_errors(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        T.TrainOptions(data=Path("x"), out=Path("y"), **kw).validate()


class _FixedEmissions(torch.nn.Module):
    """Stands in for a tagger: emissions are given, so predictions are known."""

    def __init__(self, em: torch.Tensor) -> None:
        super().__init__()
        self.em = em

    def emissions(self, *args: torch.Tensor) -> torch.Tensor:
        return self.em


def test_recall_weights_come_from_each_samples_own_misses() -> None:
    # 2 windows x 4 positions x 3 tags; tag 0 is O. Window 0 predicts O everywhere.
    em = torch.zeros(2, 4, 3)
    em[0, :, 0] = 5.0
    em[1, :, 1] = 5.0
    labels = torch.tensor([[-100, 1, 2, -100], [-100, 1, 0, 2]])
    batch = {k: torch.zeros(2, 4, dtype=torch.long) for k in
             ("input_ids", "attention_mask", "token_type_ids", "position_ids")}
    rho = T.recall_weights(_FixedEmissions(em), batch, labels, delta_p=3.0)
    # window 0 misses both gold PHI tokens: FNR 1 -> 4; window 1 misses none: FNR 0 -> 1
    assert rho.tolist() == [4.0, 1.0]
    assert not rho.requires_grad
    assert T.recall_weights(_FixedEmissions(em), batch, labels, delta_p=0.0) is None


def test_recall_weighted_training_records_it(
    corpus: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    from dphub.card import load_card

    out = tmp_path / "m"
    T.train(_opts(corpus, tiny_base_model, out, recall_weight=2.0, epochs=1.0))
    rw = load_card(out).meta["differential_privacy"]["recall_weighting"]
    assert rw["enabled"] is True and rw["delta_p"] == 2.0


def test_warm_start_is_cached_and_recorded(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dphub.card import load_card
    from dphub.train import warmstart

    small = warmstart.WarmStartConfig(notes=(("nursing", 3), ("discharge", 3)), epochs=1.0, batch_size=4, max_length=64,
                                      stride=16)
    monkeypatch.setattr(warmstart, "WarmStartConfig", lambda **kw: small)
    calls = []
    real = warmstart.train_public

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(warmstart, "train_public", counting)
    T.train(_opts(corpus, tiny_base_model, tmp_path / "a", warm_start="synth", epochs=1.0))
    T.train(_opts(corpus, tiny_base_model, tmp_path / "b", warm_start="synth", epochs=1.0))
    assert len(calls) == 1  # the second training reused the cached warm start
    cached = list((tmp_path / "cache" / "warmstart").iterdir())
    assert any((d / "model.safetensors").is_file() for d in cached)
    pp = load_card(tmp_path / "b").meta["differential_privacy"]["public_pretraining"]
    assert pp["enabled"] is True and pp["epsilon_cost"] == 0 and pp["notes"] == 6
    # a different seed is a different warm start
    key = warmstart.cache_key(tiny_base_model, "tiny", "hipaa", "crf", small, 0)
    assert key != warmstart.cache_key(tiny_base_model, "tiny", "hipaa", "crf", small, 1)
    assert key != warmstart.cache_key(tiny_base_model, "tiny", "hipaa", "softmax", small, 0)


def test_init_from_records_lineage(corpus: Path, tiny_base_model: Path, tmp_path: Path) -> None:
    from dphub.card import load_card
    from dphub.hub.validate import validate_card

    first = tmp_path / "first"
    r1 = T.train(_opts(corpus, tiny_base_model, first, epochs=1.0))
    second = tmp_path / "second"
    r2 = T.train(_opts(corpus, tiny_base_model, second, init_from=str(first), epochs=1.0))
    validate_card(second, require_private=True)
    dp = load_card(second).meta["differential_privacy"]
    first_dp = load_card(first).meta["differential_privacy"]
    assert dp["lineage"] == [{"repo": "first", "revision": "local",
                              "epsilon": pytest.approx(r1.epsilon, rel=1e-6),
                              "delta": r1.delta, "privacy_unit": "patient",
                              "role": "init_from", "composed": True,
                              "weights_sha256": first_dp["weights_sha256"],
                              "accounting": {"accountant": "rdp", "sample_rate": r1.sample_rate,
                                             "noise_multiplier": r1.noise_multiplier,
                                             "steps": r1.steps}}]
    # issue 38: the parent may have seen these patients, so the claim composes both runs
    assert dp["composition"]["run_epsilon"] == pytest.approx(r2.epsilon, rel=1e-6)
    assert max(r1.epsilon, r2.epsilon) < dp["epsilon"] <= r1.epsilon + r2.epsilon


def test_init_from_a_non_private_model_is_refused(
    corpus: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    base = tmp_path / "baseline"
    T.train(_opts(corpus, tiny_base_model, base, no_dp=True, noise=None, epochs=1.0))
    with pytest.raises(PrivacyError, match="not private"):
        T.train(_opts(corpus, tiny_base_model, tmp_path / "m", init_from=str(base)))


def test_head_only_training_uses_exact_cached_encoder_outputs(
    corpus: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    from dphub.tagger import TaggerModel

    model = TaggerModel.from_base(tiny_base_model)
    ids = [[101, 2000, 3000, 102], [101, 2500, 102], [101, 2000, 3000, 102]]
    cache = T.FrozenEncoderCache(model.encoder, ids, pad_id=0)
    assert len(cache.table) == 2  # identical windows share one entry
    batch = T.batch_from_examples([T.Example("u", 0, w, [-100] * len(w)) for w in ids], 0)
    model.encoder.eval()
    with torch.no_grad():
        ref = model.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            token_type_ids=batch["token_type_ids"],
                            position_ids=batch["position_ids"]).last_hidden_state
    got = cache(batch["input_ids"], batch["attention_mask"])[0]
    for r, w in enumerate(ids):  # float16 storage: close, not bit-equal
        assert torch.allclose(got[r, : len(w)], ref[r, : len(w)], atol=1e-2)
        assert torch.count_nonzero(got[r, len(w):]) == 0

    out = tmp_path / "head"
    T.train(_opts(corpus, tiny_base_model, out, train_layers=0, epochs=1.0))
    trained = load_file(out / "model.safetensors")
    torch.manual_seed(0)  # train() seeds before building the model: same initial weights
    fresh = TaggerModel.from_base(tiny_base_model).export_state_dict()
    enc_keys = [k for k in fresh if k.startswith("bert.")]
    assert enc_keys and all(torch.equal(trained[k], fresh[k]) for k in enc_keys)
    assert not torch.equal(trained["crf.transitions"], fresh["crf.transitions"])
    assert not torch.equal(trained["classifier.weight"], fresh["classifier.weight"])


def test_base_without_a_public_name_is_refused_before_training(
    corpus: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    import shutil

    odd = tmp_path / "my base"
    shutil.copytree(tiny_base_model, odd)
    with pytest.raises(ConfigError, match="hub-style id"):
        T.train(_opts(corpus, odd, tmp_path / "m"))
    assert not (tmp_path / "m").exists()
    assert not T.checkpoint_dir_for(tmp_path / "m").exists()


def test_trainer_card_text_goes_to_the_card_not_the_training_config(
    corpus: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    from dphub.card import load_card

    out = tmp_path / "m"
    T.train(_opts(corpus, tiny_base_model, out, epochs=1.0,
                  card_text={"provenance": "Synthetic ward notes written for this test."}))
    meta = load_card(out).meta
    assert meta["card_text"] == {"provenance": "Synthetic ward notes written for this test."}
    assert "Synthetic ward notes written for this test." in (out / "README.md").read_text()
    cfg = json.loads((out / "training_config.json").read_text())
    assert "card_text" not in cfg["dphub_training"]


def test_head_only_run_reports_the_encoder_cache_before_training(
    corpus: Path, tiny_base_model: Path, tmp_path: Path
) -> None:
    """The minutes spent encoding windows before the first DP step are reported (numbers only)."""
    events: list[T.Progress] = []
    T.train(_opts(corpus, tiny_base_model, tmp_path / "m", train_layers=0, epochs=1.0),
            on_progress=events.append)
    phases = [e.phase for e in events]
    assert "encoder-cache" in phases and phases.index("encoder-cache") < phases.index("train")
    cache = [e for e in events if e.phase == "encoder-cache"]
    assert cache[-1].step == cache[-1].total_steps > 0
