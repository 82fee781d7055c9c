"""The publish gate's check of a public-synthetic claim (``dphub pretrain``): the recorded public
data regenerates to its digest and the card's blocks and step count agree with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dphub.card import (
    SYNTH_DATASET,
    dataset_block,
)
from dphub.errors import ConfigError, DphubError
from dphub.hub.gate_common import (
    PUBLIC_DATA_KEYS,
    PUBLIC_SYNTHETIC,
    GateViolation,
    check_config,
    key_list,
    read_training_config,
    refuse,
    safe_name,
)

# --------------------------------------------------------------------------- public provenance

#: ``training_config.json`` keys of a public base (``dphub pretrain``): no privacy unit, no
#: accountant, no sampling rate: nothing of a run on someone's notes.
PUBLIC_TRAINING_CONFIG_KEYS = frozenset({
    "format_version", "dphub_training", "base_model", "base_model_sha256", "init_from", "no_dp",
    "steps",
})
#: Its ``dphub_training`` keys: the pretraining loop's settings and the public data's record.
PUBLIC_HYPERPARAM_KEYS = frozenset({
    "epochs", "batch_size", "lr", "head", "train_layers", "label_schema", "seed", "no_dp",
    "warm_start", "max_length", "stride", "rule_features", "synth_notes",
    "synth_discharge_share", "synth_seed", "synth_sha256",
})


def check_public_provenance(model_dir: Path, meta: dict[str, Any]) -> None:
    """Raise :class:`GateViolation` on the first problem of a public-synthetic claim
    (:func:`public_provenance_problems`); other cards pass untouched."""
    problems = public_provenance_problems(model_dir, meta)
    if problems:
        raise refuse(model_dir, problems[0])


def public_provenance_problems(model_dir: Path, meta: dict[str, Any]) -> list[str]:
    """A card saying "public synthetic notes only" describes a ``dphub pretrain`` run, on data
    anyone can regenerate.

    Why: the card alone is text; dphub's own helpers write a valid public card for any weights,
    e.g. a local-only model trained on patients without DP. The claim becomes checkable through
    the training record: ``training_config.json`` must be a pretraining record (no privacy unit,
    accountant or sampling rate; ``no_dp``, no ``init_from``, started from the base itself) that
    names the generator's parameters (``synth_notes``, ``synth_discharge_share``,
    ``synth_seed``); the gate regenerates those notes with :mod:`dphub.synth`, compares their
    digest (``synth_sha256``), the card's ``dataset`` block and ``public_pretraining`` block with
    them, and the number of steps with what the recorded epochs and batch size give on them.

    What stays a trust assumption: that the weights were trained on that data. Only retraining
    could show it; a forger who copies a genuine pretraining record next to other weights is
    not caught here, as a forged DP record would not be either (docs/hub.md).
    """
    dp = meta.get("differential_privacy")
    if not isinstance(dp, dict) or dp.get("training_data") != PUBLIC_SYNTHETIC:
        return []
    try:
        cfg = read_training_config(model_dir)
    except GateViolation as e:
        return [e.message]
    what = "a public-synthetic card needs the training record of dphub pretrain"
    problems = record_key_problems(cfg, PUBLIC_TRAINING_CONFIG_KEYS, PUBLIC_HYPERPARAM_KEYS,
                                   "a run on public synthetic notes", what)
    if problems:
        return problems
    hyper = cfg["dphub_training"]
    if cfg.get("no_dp") is not True or hyper.get("no_dp") is not True or cfg.get("init_from") \
            or hyper.get("warm_start") != "none":
        return [f"training_config.json does not describe a pretraining run (no_dp, no "
                f"init_from, warm_start none): {what}"]
    missing = [k for k in (*PUBLIC_DATA_KEYS, "epochs", "batch_size", "seed", "label_schema")
               if k not in hyper]
    if missing:
        return [f"training_config.json does not record the public data it trained on "
                f"({', '.join(missing)}), so the claim cannot be checked: {what}"]
    if cfg.get("base_model") != meta.get("base_model"):
        return ["training_config.json base_model differs from the card's"]
    try:
        return _regenerated_data_problems(model_dir, meta, cfg, hyper)
    except DphubError as e:
        return [f"the public data training_config.json records cannot be regenerated "
                f"({e.message})"]


def record_key_problems(cfg: dict[str, Any], top_keys: frozenset[str],
                        hyper_keys: frozenset[str], run: str, what: str) -> list[str]:
    """Keys of a training record outside a kind of run's allow-lists (top level and
    ``dphub_training``), or no ``dphub_training`` block: the record is not of ``run``."""
    extra = set(cfg) - top_keys
    if extra:
        return [f"training_config.json holds {key_list(extra)}, which {run} does not record: "
                f"{what}"]
    hyper = cfg.get("dphub_training")
    if not isinstance(hyper, dict):
        return [f"training_config.json has no dphub_training block: {what}"]
    extra = set(hyper) - hyper_keys
    if extra:
        return [f"training_config.json dphub_training holds {key_list(extra)}, which {run} "
                f"does not record: {what}"]
    return []


#: why a record's public notes are refused when they do not regenerate to its digest
SYNTH_DIGEST_MISMATCH = (
    "the synthetic notes training_config.json records (synth_notes, synth_discharge_share, "
    "synth_seed) do not regenerate to its synth_sha256 with this dphub: the data is not the "
    "public generator's (or was made by another dphub or Faker version: publish with that one)"
)


#: Most synthetic notes a training record can make the gate regenerate (publish, pull and
#: ``card validate`` alike). A card claiming 1,000,000 notes made them regenerate for about 12
#: minutes and 1.5 GB before the digest check; 20,000 take about 15 s. Checked before any work.
MAX_REGENERATED_NOTES = 20_000


def regenerate_recorded_notes(hyper: dict[str, Any]) -> tuple[Any, list[Any] | None]:
    """(generator configuration, notes) of the public data a training record names, regenerated
    with :mod:`dphub.synth`; the notes are None when they do not match the record's digest
    (``synth_sha256``). Raises :class:`ConfigError` when the parameters are not numbers or name
    more than :data:`MAX_REGENERATED_NOTES` notes (before generating any)."""
    n = hyper.get("synth_notes")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_REGENERATED_NOTES:
        raise ConfigError(f"synth_notes must be an integer from 1 to {MAX_REGENERATED_NOTES}, the "
                          "most the gate regenerates (checked before generating any)")
    # heavy: the dphub.train package loads torch and opacus; only this provenance check needs it
    from dphub.train.pretrain import PretrainConfig, public_data_digest

    try:
        pc = PretrainConfig(notes=hyper["synth_notes"],
                            discharge_share=float(hyper["synth_discharge_share"]),
                            synth_seed=int(hyper["synth_seed"]))
        pc.validate()
    except (TypeError, ValueError):
        raise ConfigError("the generator's parameters are not numbers") from None
    notes = list(pc.iter_public_notes())
    return pc, (notes if public_data_digest(notes) == hyper["synth_sha256"] else None)


def _regenerated_data_problems(model_dir: Path, meta: dict[str, Any], cfg: dict[str, Any],
                               hyper: dict[str, Any]) -> list[str]:
    """Regenerate the recorded synthetic corpus; compare digest, card blocks and step count."""
    pc, notes = regenerate_recorded_notes(hyper)
    if notes is None:
        return [SYNTH_DIGEST_MISMATCH]
    dp = meta["differential_privacy"]
    pre = dp.get("public_pretraining")
    if not isinstance(pre, dict):
        return ["a public-synthetic card needs its public_pretraining block"]
    claims = {
        "public_pretraining.notes": (pre.get("notes"), pc.notes),
        "public_pretraining.kinds": (pre.get("kinds"), [k for k, _ in pc.kinds()]),
        "public_pretraining.epochs": (pre.get("epochs"), hyper.get("epochs")),
        "public_pretraining.seed": (pre.get("seed"), hyper.get("seed")),
        "public_pretraining.train_layers": (pre.get("train_layers"), hyper.get("train_layers")),
        "public_pretraining.steps": (pre.get("steps"), cfg.get("steps")),
        "steps": (dp.get("steps"), cfg.get("steps")),
    }
    differ = [k for k, (card_v, rec_v) in claims.items() if card_v != rec_v]
    if differ:
        return [f"the card's {', '.join(differ)} differ from training_config.json: the card "
                "does not describe this pretraining run"]
    schema = str(hyper["label_schema"])
    expected = dataset_block(notes, label_schema=schema, name=SYNTH_DATASET)
    card_data = meta.get("dataset") if isinstance(meta.get("dataset"), dict) else {}
    if any(card_data.get(k) != v for k, v in expected.items()):
        return ["the card's dataset block does not describe the regenerated synthetic notes: "
                "the card does not belong to this public data"]
    steps = _pretrain_steps(model_dir, notes, hyper)
    if steps is not None and steps != cfg.get("steps"):
        return [f"training_config.json steps ({safe_name(str(cfg.get('steps')))}) is not what "
                f"its epochs and batch_size give on the regenerated notes ({steps}): the record "
                "does not describe a run on this data"]
    return []


def _pretrain_steps(model_dir: Path, notes: list[Any], hyper: dict[str, Any]) -> int | None:
    """Steps of the pretraining loop on these notes (``warmstart._fit``: epochs times windows
    per batch), tokenised with the model's (public, already checked) tokenizer."""
    from transformers import AutoTokenizer

    # heavy: the dphub.train package loads torch and opacus; only this provenance check needs it
    from dphub.train.data import encode_notes

    try:
        epochs, batch = float(hyper["epochs"]), int(hyper["batch_size"])
        max_length, stride = int(hyper.get("max_length", 128)), int(hyper.get("stride", 32))
        if batch < 1:
            return None
        id2label = check_config(model_dir)["id2label"]
        tags = [id2label[k] for k in sorted(id2label, key=int)]
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
        examples = encode_notes(notes, tokenizer, tags, str(hyper["label_schema"]),
                                max_length=max_length, stride=stride, unit="sequence")
    except (TypeError, ValueError, KeyError, OSError):
        return None
    return max(1, round(epochs * max(1, len(examples) // batch)))
