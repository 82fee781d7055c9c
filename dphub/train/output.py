"""The model directory a run writes: weights, config, tokenizer, the allow-listed training config
and the card, built under a temporary name and renamed into place; and the checks that keep an
output from ever replacing an input."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dphub import card
from dphub.card import TRAINING_CONFIG_FORMAT, write_card
from dphub.card.probe import with_probe
from dphub.errors import ConfigError
from dphub.io import atomic_directory, atomic_write_text, file_sha256
from dphub.notes import Note
from dphub.privacy.randomness import dp_mode
from dphub.privacy.statement import EXACT_UNITS_NOT_COVERED, RULES_NOT_COVERED
from dphub.train.options import TrainOptions
from dphub.train.plan import PrivacyPlan
from dphub.train.sources import ModelSource

TRAINING_CONFIG_FILE = "training_config.json"


def is_model_directory(path: Path) -> bool:
    """A directory ``dphub train`` wrote (the only kind ``--force`` may replace)."""
    return (path / TRAINING_CONFIG_FILE).is_file() and (path / "model.safetensors").is_file()


def check_output_dir(out: Path, data: Path | None = None, *, force: bool) -> None:
    """Refuse an output that is a file, overlaps the training data, or is not ours to replace.

    ``--force`` replaces a previous model directory and nothing else: never the corpus, never a
    directory holding it, never a directory that dphub did not write. ``data`` None: the
    training notes are not a file the output could overlap (synthetic or in memory).
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a directory; choose another --out")
    if data is not None:
        o, d = out.resolve(), data.resolve()
        if o == d or d.is_relative_to(o) or o.is_relative_to(d):
            raise ConfigError(
                f"--out {out} overlaps the training data {data}; write the model elsewhere"
            )
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ConfigError(f"{out}: output directory exists and is not empty (use --force)")
        if not is_model_directory(out):
            raise ConfigError(
                f"{out}: --force replaces only a model directory written by dphub "
                f"({TRAINING_CONFIG_FILE} + model.safetensors); this is not one, so nothing "
                "was removed"
            )


def build_meta(
    opts: TrainOptions,
    plan: PrivacyPlan,
    src: ModelSource,
    notes: Sequence[Note],
    n_sequences: int,
    steps: int,
    epsilon: float | None,
    *,
    weights_sha256: str | None = None,
) -> dict[str, Any]:
    """Card front matter (HF keys + ``differential_privacy`` + ``dataset``) via dphub.card."""
    recall = (
        {"enabled": True, "delta_p": float(opts.recall_weight), "rho": "1 + delta_p * FNR_i",
         "computed_from": "own-detached-predictions"}
        if opts.recall_weight > 0 else {"enabled": False}
    )
    common: dict[str, Any] = {
        "recall_weighting": recall,
        "public_pretraining": src.public_pretraining or {"enabled": False},
        "lineage": src.lineage or None,
    }
    epochs = round(steps * plan.sample_rate, 4)
    if opts.no_dp:
        dp = card.non_private_block(
            privacy_unit=opts.privacy_unit, steps=steps, epochs=epochs,
            sample_rate=plan.sample_rate, max_examples_per_unit=opts.max_examples_per_unit,
            num_units=card.coarsen_count(plan.num_units), weights_sha256=weights_sha256,
            **{k: v for k, v in common.items() if v is not None},
        )
    else:
        dp = card.dp_block(
            accountant=opts.accountant, sample_rate=plan.sample_rate,
            noise_multiplier=float(plan.noise_multiplier), steps=steps,
            delta=float(plan.delta), privacy_unit=opts.privacy_unit,
            max_grad_norm=opts.max_grad_norm, epochs=epochs,
            max_examples_per_unit=opts.max_examples_per_unit, num_units=plan.num_units,
            grad_sample_mode="hooks", secure_rng=opts.secure_rng, epsilon=epsilon,
            mechanism_rng=dp_mode(opts.secure_rng),
            weights_sha256=weights_sha256, **common,
        )
        dp = card.apply_composition(dp)  # a composed --init-from parent: the claim adds it
    if not opts.no_dp and opts.rule_features:
        dp["not_covered"] = [*dp["not_covered"], RULES_NOT_COVERED]
    if not opts.no_dp and plan.steps_per_epoch == plan.num_units > 1:
        # q = 1/k is the mechanism's sampling rate (the gate recomputes ε from it, so it is
        # published as used); with k = N it publishes N itself: the card says so

        dp["not_covered"] = [*dp["not_covered"], EXACT_UNITS_NOT_COVERED]
    if opts.local_only:  # trained without DP on the owner's notes: it must never leave
        dp["local_only"] = True
    if opts.training_labels is not None:
        dp["training_labels"] = opts.training_labels
    dataset = card.dataset_block(notes, label_schema=opts.label_schema, sequences=n_sequences)
    meta = card.card_meta(dp, dataset, base_model=src.base_public_id)
    return card.with_card_text(meta, opts.card_text or {})


def training_config(opts: TrainOptions, src: ModelSource, plan: PrivacyPlan, steps: int,
                    epsilon: float | None) -> dict[str, Any]:
    """The published ``training_config.json``: hyper-parameters and the accounted quantities.

    Its keys are the publish gate's allow-list (``dphub.hub.gate.TRAINING_CONFIG_KEYS``,
    ``TRAINING_HYPERPARAM_KEYS``): the gate owns the contract, training writes to it.
    """

    return {
        "format_version": TRAINING_CONFIG_FORMAT,
        "dphub_training": opts.public_dict(),
        "base_model": src.base_public_id,
        "base_model_sha256": src.base_sha256,
        "init_from": _public_init_from(opts.init_from),
        "no_dp": bool(opts.no_dp),
        "privacy_unit": opts.privacy_unit,
        "accountant": None if opts.no_dp else opts.accountant,
        "steps": steps,
        "sample_rate": plan.sample_rate,
        "noise_multiplier": plan.noise_multiplier,
        "delta": plan.delta,
        "epsilon": epsilon,
    }


def write_model_dir(
    out: Path,
    model: Any,
    src: ModelSource,
    opts: TrainOptions,
    plan: PrivacyPlan,
    steps: int,
    epsilon: float | None,
    make_meta: Callable[[str], dict[str, Any]],
) -> dict[str, Any]:
    """Build the model directory under a temp name and rename it into place.

    The card is made after the weights are written, so it records the SHA-256 of exactly the
    ``model.safetensors`` it describes (the publish gate checks the two belong together).
    """
    with atomic_directory(out, overwrite=opts.force) as tmp:
        model.save(tmp, base_public_id=src.base_public_id, tokenizer_source=src.tokenizer_dir)
        cfg = training_config(opts, src, plan, steps, epsilon)
        atomic_write_text(tmp / TRAINING_CONFIG_FILE, json.dumps(cfg, indent=2) + "\n")
        meta = make_meta(file_sha256(tmp / "model.safetensors"))
        meta = with_probe(meta, tmp)  # public probe notes: no privacy cost (issue 38)
        write_card(tmp, meta)
    return meta


def _public_init_from(spec: str | None) -> str | None:
    """A hub id (``org/name[@rev]``) is public; a local directory is recorded by name only."""
    if spec is None:
        return None
    p = Path(spec).expanduser()
    return p.name if p.exists() else spec
