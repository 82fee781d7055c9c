"""``dphub pretrain``: a public base model, trained on public synthetic notes only, no DP.

Why a separate, shareable step: DP fine-tuning on a few hundred patients cannot learn the task
from scratch (patient-level noise drowns the rare PHI tokens), so it must start from a tagger
that already knows what PHI looks like in clinical notes. Learning that costs nothing private
when the notes are synthetic (:mod:`dphub.synth`'s realistic kinds), so it can be done once,
published like any model and reused by every site: the card says "public data only, no ε spent"
(``differential_privacy.training_data: public-synthetic``, ``epsilon: 0``) and the publish gate
accepts it on that provenance. ``dphub train --base-model DIR-or-org/name`` starts DP training
from it (:func:`dphub.train.sources.initial_model`).

The training itself is the public warm start's (:func:`dphub.train.warmstart.train_public`):
one loop, one data path, only the notes, layers and epochs differ.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dphub import card, synth
from dphub.card import SYNTH_DATASET, TRAINING_CONFIG_FORMAT
from dphub.card.probe import with_probe
from dphub.encoders import encoder_digest, resolve_base_model
from dphub.errors import ConfigError
from dphub.io import atomic_directory, atomic_write_text, file_sha256
from dphub.labels import get_schema
from dphub.train.options import HEADS, TrainOptions, check_encoder_layers
from dphub.train.output import TRAINING_CONFIG_FILE, check_output_dir
from dphub.train.results import Progress, ProgressFn
from dphub.train.sources import refuse_private_model_as_base
from dphub.train.warmstart import WarmStartConfig, train_public, train_rule_stage

#: Progress phase of ``dphub pretrain`` (the warm start's loop reports ``warm-start``).
PHASE = "pretrain"
#: Name recorded in the card's ``dataset`` block: the public generator, not anyone's notes.


@dataclass(frozen=True)
class PretrainConfig:
    """What ``dphub pretrain`` trains on and how (all public; recorded in the card)."""

    #: synthetic notes in all; ``discharge_share`` of them discharge summaries, the rest nursing.
    #: Defaults = the setting chosen on the inner dev split (docs/results.md, "Public
    #: pretraining"): 500 notes, 2 epochs, all layers (top 3 only: F1 0.68 instead of 0.77)
    notes: int = 500
    discharge_share: float = 0.1
    # the optimisation settings are the embedded warm start's (one place to change them)
    epochs: float = WarmStartConfig.epochs
    #: top encoder layers trained; None trains all of them
    train_layers: int | None = WarmStartConfig.train_layers
    synth_seed: int = WarmStartConfig.synth_seed
    #: keep only the base encoder's first N transformer blocks (None: all): a faster public base
    #: (docs/speed.md, "A shallower encoder"); recorded in the card
    encoder_layers: int | None = None
    batch_size: int = WarmStartConfig.batch_size
    lr_encoder: float = WarmStartConfig.lr_encoder
    lr_head: float = WarmStartConfig.lr_head

    @classmethod
    def from_options(cls, *, notes: int | None = None, epochs: float | None = None,
                     train_layers: str | int | None = None,
                     discharge_share: float | None = None,
                     encoder_layers: int | None = None) -> PretrainConfig:
        """The defaults with the given command-line values (``train_layers``: K or ``all``)."""
        cfg = cls()
        if notes is not None:
            cfg = replace(cfg, notes=notes)
        if epochs is not None:
            cfg = replace(cfg, epochs=float(epochs))
        if train_layers is not None:
            cfg = replace(cfg, train_layers=parse_train_layers(train_layers))
        if discharge_share is not None:
            cfg = replace(cfg, discharge_share=float(discharge_share))
        if encoder_layers is not None:
            cfg = replace(cfg, encoder_layers=encoder_layers)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if isinstance(self.notes, bool) or not isinstance(self.notes, int) or not \
                1 <= self.notes <= 1_000_000:
            raise ConfigError(f"--notes must be an integer from 1 to 1000000 (got {self.notes!r})")
        if not 0 < self.epochs <= 100:
            raise ConfigError(f"--epochs must be > 0 and <= 100 (got {self.epochs!r})")
        if not 0 <= self.discharge_share <= 1:
            raise ConfigError("discharge share must be between 0 and 1")
        if self.train_layers is not None and self.train_layers < 0:
            raise ConfigError("--train-layers must be a non-negative integer or 'all'")
        check_encoder_layers(self.encoder_layers)

    def kinds(self) -> tuple[tuple[str, int], ...]:
        """(synthetic kind, notes) pairs: realistic nursing notes and discharge summaries."""
        discharge = round(self.notes * self.discharge_share)
        parts = (("realistic-nursing", self.notes - discharge), ("realistic-discharge", discharge))
        return tuple((k, n) for k, n in parts if n > 0)

    def warm_start_config(self, max_length: int = 128, stride: int = 32) -> Any:
        """The equivalent :class:`~dphub.train.warmstart.WarmStartConfig` (same loop)."""
        return WarmStartConfig(
            notes=self.kinds(), synth_seed=self.synth_seed, train_layers=self.train_layers,
            epochs=self.epochs, batch_size=self.batch_size, lr_encoder=self.lr_encoder,
            lr_head=self.lr_head, max_length=max_length, stride=stride,
            encoder_layers=self.encoder_layers,
        )

    def iter_public_notes(self) -> Any:
        """The public corpus this configuration trains on, note by note (the loop's notes: same
        kinds, counts and seeds)."""
        for i, (kind, k) in enumerate(self.kinds()):
            yield from synth.iter_notes(k, kind=kind, seed=self.synth_seed + i)

    def data_record(self, notes: Any = None) -> dict[str, Any]:
        """What ``training_config.json`` records of the public data, so that anyone can
        regenerate it (:mod:`dphub.synth` with these parameters) and check its digest
        (:func:`public_data_digest`): the publish gate does exactly that. ``notes``: this
        configuration's notes, already generated (else they are generated here)."""
        return {"synth_notes": self.notes, "synth_discharge_share": self.discharge_share,
                "synth_seed": self.synth_seed,
                "synth_sha256": public_data_digest(
                    self.iter_public_notes() if notes is None else notes)}

    def card_block(self, steps: int | None = None, seed: int = 0) -> dict[str, Any]:
        """The card's ``public_pretraining`` block."""
        block = self.warm_start_config().card_block(steps=steps, seed=seed)
        block["train_layers"] = self.train_layers
        return block


def public_data_digest(notes: Any) -> str:
    """SHA-256 of a note stream in canonical form (id, text and labelled spans per note)."""
    import hashlib

    h = hashlib.sha256(b"dphub-synth-corpus-1")
    for n in notes:
        rec = json.dumps([n.id, n.text, [[s.start, s.end, s.label] for s in n.spans]],
                         ensure_ascii=False, separators=(",", ":"))
        h.update(len(rec).to_bytes(8, "little") + rec.encode("utf-8"))
    return h.hexdigest()


def parse_train_layers(value: str | int | None) -> int | None:
    """``all`` (or None) -> None (every layer); a non-negative integer -> that many top layers."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"--train-layers must be a non-negative integer or 'all' "
                          f"(got {value!r})") from None
    if n < 0:
        raise ConfigError(f"--train-layers must be a non-negative integer or 'all' (got {n})")
    return n


def pretrain(
    out: str | Path,
    cfg: PretrainConfig | None = None,
    *,
    options: Any = None,
    seed: int = 0,
    force: bool = False,
    on_progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Train a public base model on synthetic notes (no DP) and write its model directory.

    ``options`` is a :class:`~dphub.train.options.TrainOptions` whose model choices (base model,
    label schema, head, window length and stride) are used; its data, privacy and optimiser
    fields are not (nothing private is read). Returns the card's front matter.
    """
    cfg = cfg or PretrainConfig()
    cfg.validate()
    opts = options if options is not None else TrainOptions()
    if opts.head not in HEADS:
        raise ConfigError(f"--head must be one of {', '.join(HEADS)} (got {opts.head!r})")
    get_schema(opts.label_schema)  # an unknown schema is one readable error, before any work
    out = Path(out)
    check_output_dir(out, force=force)
    loadable, public_id = resolve_base_model(opts.base_model)
    if isinstance(loadable, str):
        raise ConfigError(f"base model {public_id!r} is not a local directory and nothing can be "
                          "downloaded; pass --base-model PATH")
    base_dir = Path(loadable)
    refuse_private_model_as_base(base_dir)
    ws = cfg.warm_start_config(max_length=opts.max_length, stride=opts.stride)

    steps = [0]

    def relay(p: Progress) -> None:  # the shared loop says warm-start; this run is a pretrain
        if p.phase in ("warm-start", "warm-start-rules"):
            steps[0] = max(steps[0], int(p.step))
            p = replace(p, phase=PHASE)
        if on_progress is not None:
            on_progress(p)

    model = train_public(base_dir, opts.label_schema, opts.head, ws, seed=seed, on_progress=relay)
    main_steps = steps[0]  # the card's steps and epochs describe this stage, not the head stage
    if opts.rule_features:  # the same rule-feature head stage as the embedded warm start
        import tempfile

        with tempfile.TemporaryDirectory(prefix="dphub-pretrain-") as tmp:
            model.save(Path(tmp), base_public_id=public_id, tokenizer_source=base_dir)
            model = train_rule_stage(Path(tmp), base_dir, opts.label_schema,
                                     replace(ws, rule_features=True), seed=seed,
                                     on_progress=relay)
    # the card's counts describe the public corpus (same notes, same seeds as the loop's)
    dataset = card.dataset_block(cfg.iter_public_notes(), label_schema=opts.label_schema,
                                 name=SYNTH_DATASET)
    return _write(out, model, base_dir, public_id, opts, cfg, seed, main_steps, dataset, force)


def _write(out: Path, model: Any, base_dir: Path, public_id: str, opts: Any, cfg: PretrainConfig,
           seed: int, steps: int, dataset: dict[str, Any], force: bool) -> dict[str, Any]:
    """Weights, config, tokenizer, allow-listed training config and card, atomically."""
    training_config = {
        "format_version": TRAINING_CONFIG_FORMAT,
        "dphub_training": {
            "epochs": cfg.epochs, "batch_size": cfg.batch_size, "lr": cfg.lr_encoder,
            "head": opts.head, "train_layers": cfg.train_layers, "label_schema": opts.label_schema,
            "seed": seed, "no_dp": True, "warm_start": "none", "max_length": opts.max_length,
            "stride": opts.stride, "rule_features": bool(opts.rule_features),
            **cfg.data_record(),
        },
        "base_model": public_id,
        "base_model_sha256": encoder_digest(base_dir),
        "init_from": None,
        "no_dp": True,
        "steps": steps,
    }
    try:
        with atomic_directory(out, overwrite=force) as tmp:
            model.save(tmp, base_public_id=public_id, tokenizer_source=base_dir)
            atomic_write_text(tmp / TRAINING_CONFIG_FILE,
                              json.dumps(training_config, indent=2) + "\n")
            dp = card.public_block(
                steps=steps, epochs=cfg.epochs,
                public_pretraining=cfg.card_block(steps=steps, seed=seed),
                weights_sha256=file_sha256(tmp / "model.safetensors"),
            )
            meta = card.card_meta(dp, dataset, base_model=public_id,
                                  extra_tags=("public-data-only", "synthetic-data"))
            meta = card.with_card_text(meta, opts.card_text or {})
            meta = with_probe(meta, tmp)  # issue 38: what the gate holds the model to
            card.write_card(tmp, meta)
    except FileExistsError:
        raise ConfigError(f"{out}: output directory exists and is not empty (use --force)") from None
    return meta
