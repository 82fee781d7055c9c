"""A gate that tests what a model does (issue 38, items 6 and 7's cap).

Weights that are huge but finite (1e30 in the head) passed ``card validate``, ``publish`` and
``pull``, and ``deid`` with that model flagged nothing. The gate now refuses weights beyond any
DP-SGD run's reach and runs the model on dphub's public probe notes (``dphub.card.probe``),
refusing a model whose token recall there is below the floor its card states, or whose
activations are absurd. A card cannot make the gate regenerate more synthetic notes than a cap.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hub_fixtures import card_meta, copy_model, write_card

from dphub.card.probe import (
    MIN_PROBE_FLOOR,
    floor_for,
    probe_notes,
    run_probe,
    token_recall,
)
from dphub.cli.main import main
from dphub.errors import CardError, ConfigError, PublishRefused, PullRefused
from dphub.notes import Note, Span

pytest_plugins = ("hub_fixtures",)


@pytest.fixture
def model(model_template: Path, hub_env: dict[str, Path]) -> Path:
    return copy_model(model_template, hub_env["tmp"] / "model")


def _poison(model: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Change the weights and re-card them as their author would: the card's hash names the new
    file and its gate_probe block is the honest model's (a forger copies the best one)."""
    from safetensors.torch import load_file, save_file

    from dphub.card import load_card

    honest = load_card(model).meta.get("gate_probe")
    tensors = load_file(model / "model.safetensors")
    edit(tensors)
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    write_card(model, {**card_meta(), **({"gate_probe": honest} if honest else {})})


def _set(name: str, index: Any, value: float) -> Callable[[dict[str, Any]], None]:
    def edit(t: dict[str, Any]) -> None:
        t[name][index] = value
    return edit


def _alternating(name: str, value: float) -> Callable[[dict[str, Any]], None]:
    """Every entry ±value, alternating along the last axis (LayerNorm outputs sum to zero, so a
    constant row would cancel)."""
    def edit(t: dict[str, Any]) -> None:
        import torch

        w = t[name]
        sign = torch.ones(w.shape[-1])
        sign[1::2] = -1.0
        t[name] = (sign * value).expand_as(w).contiguous()
    return edit


#: what each poisoned model is refused for: weights beyond DP-SGD's reach, or a model that runs
#: but finds nothing, or whose activations are absurd
HUGE = "values beyond 10000 in magnitude"
FINDS_NOTHING = "of the PHI tokens in dphub's public probe notes, below the floor"
ABSURD = "activations on dphub's public probe notes reach"
POISONS = {
    "head_bias_o_1e30": (_set("classifier.bias", 0, 1e30), HUGE),
    "head_bias_o_minus_1e30": (_set("classifier.bias", 0, -1e30), HUGE),
    "head_weight_1e30": (_set("classifier.weight", (1, 0), 1e30), HUGE),
    "crf_transition_1e5": (_set("crf.transitions", (slice(None), 0), 1e5), HUGE),
    "crf_start_minus_1e30": (_set("crf.start_transitions", slice(None), -1e30), HUGE),
    "encoder_layernorm_1e30": (_set("bert.embeddings.LayerNorm.weight", 0, 1e30), HUGE),
    "head_bias_forces_o": (_set("classifier.bias", 0, 50.0), FINDS_NOTHING),
    "head_weight_9e3": (_alternating("classifier.weight", 9e3), ABSURD),
}


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_poisoned_model_is_refused_at_publish(model: Path, hub_env: dict[str, Path],
                                              poison: str) -> None:
    from dphub.hub.gate import check_publishable

    edit, why = POISONS[poison]
    _poison(model, edit)
    with pytest.raises(PublishRefused, match=why):
        check_publishable(model)


@pytest.mark.parametrize("poison", ["head_bias_o_1e30", "head_bias_forces_o"])
def test_poisoned_model_is_refused_by_pull_and_card_validate(model: Path,
                                                             hub_env: dict[str, Path],
                                                             poison: str) -> None:
    from dphub.hub import ops
    from dphub.hub.local import LocalHub
    from dphub.hub.validate import validate_card
    from dphub.registry import Registry

    edit, why = POISONS[poison]
    _poison(model, edit)
    with pytest.raises(CardError, match=why):
        validate_card(model)
    LocalHub(hub_env["hub"]).publish(model, "evil/model", "around the gate")
    with pytest.raises(PullRefused, match=why):
        ops.pull("evil/model")
    assert Registry().list() == []


def test_the_1e30_model_gets_one_error_line_from_each_command(
        model: Path, hub_env: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    from dphub.hub.local import LocalHub

    _poison(model, POISONS["head_bias_o_1e30"][0])
    commands = {
        "publish": ["publish", str(model), "--repo", "acme/deid"],
        "card validate": ["card", "validate", str(model)],
    }
    LocalHub(hub_env["hub"]).publish(model, "evil/model", "around the gate")
    commands["pull"] = ["pull", "evil/model"]
    for what, argv in commands.items():
        capsys.readouterr()
        assert main(argv) == 2, what
        out, err = capsys.readouterr()
        assert err.startswith("error: ") and err.count("\n") == 1, (what, err)
        assert HUGE in err and "Traceback" not in out + err, what


def test_honest_model_passes_and_its_card_states_the_floor(
        model: Path, hub_env: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    from dphub.card import load_card
    from dphub.hub.validate import validate_card

    block = load_card(model).meta["gate_probe"]
    assert block["recall"] >= 0.9 and block["floor"] == floor_for(block["recall"])
    validate_card(model, require_private=True)
    assert main(["publish", str(model), "--repo", "acme/deid"]) == 0
    assert main(["pull", "acme/deid"]) == 0


def test_card_without_probe_is_refused_at_publish_and_probed_at_pull(
        model: Path, hub_env: dict[str, Path]) -> None:
    """A card written before the probe: publish asks for a retraining, pull and card validate
    run the probe with the dphub-wide minimum floor."""
    from dphub.card import build_card, load_card
    from dphub.hub import ops
    from dphub.hub.gate import check_publishable
    from dphub.hub.local import LocalHub
    from dphub.hub.validate import validate_card

    meta = load_card(model).meta
    meta.pop("gate_probe")
    (model / "README.md").write_text(build_card(meta), encoding="utf-8")
    with pytest.raises(PublishRefused, match="the card states no gate_probe"):
        check_publishable(model)
    validate_card(model)
    LocalHub(hub_env["hub"]).publish(model, "old/model", "published before the probe")
    ops.pull("old/model")
    # the same old card on weights that find nothing: refused at the minimum floor
    _poison(model, POISONS["head_bias_forces_o"][0])
    meta = load_card(model).meta
    meta.pop("gate_probe")
    (model / "README.md").write_text(build_card(meta), encoding="utf-8")
    with pytest.raises(CardError, match=f"below the floor of {MIN_PROBE_FLOOR:.0%}"):
        validate_card(model)


@pytest.mark.parametrize("floor", [0.0, 0.019, -1.0])
def test_a_card_cannot_lower_the_floor(model: Path, hub_env: dict[str, Path],
                                       floor: float) -> None:
    from dphub.card import load_card
    from dphub.hub.gate import check_publishable

    meta = load_card(model).meta
    write_card(model, {**meta, "gate_probe": {**meta["gate_probe"], "floor": floor}})
    with pytest.raises(PublishRefused, match="gate_probe"):
        check_publishable(model)


def test_a_card_can_raise_the_floor_above_what_the_model_does(
        model: Path, hub_env: dict[str, Path]) -> None:
    """The floor is the card's own claim: a model below it is refused even when above the
    dphub-wide minimum (the recall here is about 0.97 on the probe notes)."""
    from dphub.card import load_card
    from dphub.hub.gate import check_publishable

    meta = load_card(model).meta
    write_card(model, {**meta, "gate_probe": {**meta["gate_probe"], "floor": 1.0}})
    recall = meta["gate_probe"]["recall"]
    if recall < 1.0:
        with pytest.raises(PublishRefused, match="below the floor of 100%"):
            check_publishable(model)


def test_probe_measures_token_recall() -> None:
    note = Note(id="n1", text="Seen by John Smith on 3/4", spans=(Span(8, 18, "NAME"),
                                                                  Span(22, 25, "DATE")))
    assert token_recall([note], [[]]) == (0.0, 4)  # John, Smith, 3, 4
    assert token_recall([note], [[Span(8, 12, "NAME")]]) == (0.25, 4)
    assert token_recall([note], [[Span(0, 25, "OTHER")]]) == (1.0, 4)
    assert len(probe_notes()) == 8 and probe_notes() == probe_notes()


def test_probe_on_tiny_test_taggers_clears_the_minimum(tiny_tagger_dir: Path) -> None:
    from dphub.tagger import Tagger

    result = run_probe(Tagger.load(tiny_tagger_dir))
    assert result.recall >= MIN_PROBE_FLOOR and not result.nonfinite
    assert result.tokens > 100


# --------------------------------------------------------------------------- the cap (item 7)


@pytest.mark.parametrize("notes", [1_000_000, 20_001, 10**30, -1, 0, True, "500"])
def test_a_record_cannot_make_the_gate_regenerate_a_million_notes(notes: Any) -> None:
    from dphub.hub.gate_provenance import regenerate_recorded_notes

    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="the most the gate regenerates"):
        regenerate_recorded_notes({"synth_notes": notes, "synth_discharge_share": 0.1,
                                   "synth_seed": 0, "synth_sha256": "0" * 64})
    assert time.perf_counter() - t0 < 1.0


def test_public_card_claiming_a_million_notes_is_refused_before_the_work(
        model: Path, hub_env: dict[str, Path]) -> None:
    """A public base's record naming 1,000,000 notes: publish, pull and card validate refuse it
    in about a second (it took 12 minutes and 1.5 GB before the digest check)."""
    from dphub.card import SYNTH_DATASET, dataset_block, public_block
    from dphub.card import card_meta as build_meta
    from dphub.hub.gate import check_publishable
    from dphub.hub.validate import validate_card
    from dphub.io import file_sha256
    from dphub.train.pretrain import PretrainConfig

    small = PretrainConfig(notes=4)
    block = {**small.card_block(steps=10, seed=0), "notes": 1_000_000}
    dp = public_block(steps=10, epochs=1.0, public_pretraining=block,
                      weights_sha256=file_sha256(model / "model.safetensors"))
    dataset = dataset_block(small.iter_public_notes(), label_schema="hipaa", name=SYNTH_DATASET)
    meta = build_meta(dp, dataset, base_model="sentence-transformers/all-MiniLM-L6-v2",
                      extra_tags=("public-data-only", "synthetic-data"))
    record = json.loads((model / "training_config.json").read_text(encoding="utf-8"))
    record = {k: record[k] for k in ("format_version", "base_model", "base_model_sha256")}
    record.update(init_from=None, no_dp=True, steps=10, dphub_training={
        "epochs": 1.0, "batch_size": 8, "lr": 1e-3, "head": "crf", "train_layers": None,
        "label_schema": "hipaa", "seed": 0, "no_dp": True, "warm_start": "none",
        "max_length": 128, "stride": 32, "rule_features": False, "synth_notes": 1_000_000,
        "synth_discharge_share": 0.0, "synth_seed": 0, "synth_sha256": "0" * 64})
    (model / "training_config.json").write_text(json.dumps(record), encoding="utf-8")
    write_card(model, meta, sync=False)
    t0 = time.perf_counter()
    with pytest.raises(PublishRefused, match="the most the gate regenerates"):
        check_publishable(model)
    with pytest.raises(CardError, match="the most the gate regenerates"):
        validate_card(model)
    assert time.perf_counter() - t0 < 20.0  # two probes of the tiny model at most
