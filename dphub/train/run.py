"""``train()``: one run from notes to a model directory, resumable, nothing written until done."""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from dphub import checkpoint
from dphub.errors import ConfigError, InputError, PrivacyError
from dphub.notes import Note
from dphub.privacy.ledger import Footprint, footprint
from dphub.privacy.units import UnitDataset
from dphub.train.checkpoints import (
    LEGACY_CHECKPOINT_FILE,
    checkpoint_dir_for,
    load_checkpoint,
    run_fingerprint,
    run_log_path,
    write_run_log,
)
from dphub.train.data import check_patient_ids, encode_notes, load_training_notes
from dphub.train.encoder_cache import cached_encoder
from dphub.train.lineage import check_policy, record_run, settle_lineage
from dphub.train.loop import TrainingDiverged, TrainLoop, quiet_epsilon
from dphub.train.options import TrainOptions
from dphub.train.output import build_meta, check_output_dir, write_model_dir
from dphub.train.plan import PrivacyPlan, plan_privacy
from dphub.train.results import ProgressFn, TrainResult
from dphub.train.sources import REPO_ID, ModelSource, initial_model

log = logging.getLogger(__name__)


def train(opts: TrainOptions, *, on_progress: ProgressFn | None = None,
          extra_notes: Sequence[Note] = (),
          on_plan: Callable[[PrivacyPlan], None] | None = None,
          gradient_audit: Callable[[Any, PrivacyPlan], None] | None = None) -> TrainResult:
    """Train a tagger with DP-SGD (or without, for ``no_dp`` baselines) and write its directory.

    Returns what was done (steps, ε, δ, σ, q). Raises :class:`DphubError` subclasses for bad
    input or options; nothing is written to ``opts.out`` unless training completes.

    ``extra_notes`` are public synthetic notes trained on beside the corpus (the canary patients
    of :mod:`dphub.audit`): they are units like any other (so the accounting covers them), but
    the card's ``dataset`` block describes the real corpus only.

    ``on_plan`` sees the privacy plan (q, σ, steps, δ: the projected ε) before the first step;
    it may raise a :class:`DphubError` to stop the run there (the CLI's hub-policy check, which
    calls :func:`dphub.train.lineage.above_policy`). Without it, ``train()`` refuses by itself
    a run whose projected claim exceeds ``opts.policy`` (default ε ≤ 10 per patient) unless
    ``opts.allow_above_policy``.
    ``gradient_audit(optimizer, plan)`` is called once the DP optimizer's noise source is
    installed (the white-box canaries of :class:`dphub.audit.GradientCanaries`); DP runs only.
    """
    opts.validate()
    out = Path(opts.out)  # type: ignore[arg-type]
    check_output_dir(out, Path(opts.data), force=opts.force)  # type: ignore[arg-type]

    ckpt_dir = _checkpoint_dir(out, opts)

    t0 = time.monotonic()
    torch.manual_seed(opts.seed)
    notes = load_training_notes(opts)
    train_notes = [*notes, *extra_notes]
    check_patient_ids(train_notes, opts.privacy_unit)
    src = initial_model(opts, on_progress)
    # the privacy ledger: keyed digests of the real corpus's patients (never the canaries')
    fp = Footprint(frozenset()) if opts.no_dp else footprint(notes)
    settle_lineage(opts, src, fp)
    model = _source_model(opts, src)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(src.tokenizer_dir)
    examples = encode_notes(
        train_notes, tokenizer, model.tags, opts.label_schema, max_length=opts.max_length,
        stride=opts.stride, unit=opts.privacy_unit, rule_features=opts.rule_features,
        soft_labels=opts.soft_labels,
    )
    if not examples:
        raise InputError(f"{opts.data}: the labelled notes contain no tokens")
    dataset = _unit_dataset(examples, opts)
    plan = plan_privacy(opts, len(dataset))
    plan.lineage = tuple(src.lineage)  # the plan check projects the composed claim
    plan.footprint = None if opts.no_dp else fp  # ... and the patients' ledger total
    log.info(
        "%d units, %d windows used (%d left out by max_examples_per_unit), q = %.4g, %d steps, "
        "sigma = %s", len(dataset), dataset.num_windows, dataset.dropped_windows,
        plan.sample_rate, plan.steps, plan.noise_multiplier,
    )
    if on_plan is not None:
        on_plan(plan)  # the caller's check (the CLI's: the hub's policy, printed advice)
    else:
        check_policy(opts, plan)  # a library caller gets the policy check by itself
    fingerprint = run_fingerprint(opts, examples, src.base_public_id)
    state = load_checkpoint(ckpt_dir, fingerprint) if opts.resume else None

    torch.manual_seed(opts.seed)
    model.set_trainable(train_layers=opts.train_layers, lora_rank=opts.lora_rank)
    model.max_length, model.stride = opts.max_length, opts.stride
    model.train()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    with cached_encoder(model, opts, examples, pad_id, on_progress):
        loop = TrainLoop(opts, plan, model, dataset, tokenizer, on_progress)
        if gradient_audit is not None:
            if loop.engine is None:
                raise ConfigError("gradient canaries audit the DP noise step: not without DP")
            gradient_audit(loop.optimizer, plan)
        if state is not None:
            loop.restore(state)
        try:
            loop.run(ckpt_dir, fingerprint)
        except TrainingDiverged:
            # its checkpoints lead to the same divergence (a resume must keep every option):
            # leave nothing behind that a rerun with a smaller --lr would trip over
            with contextlib.suppress(OSError):
                shutil.rmtree(ckpt_dir)
            raise
    if opts._stop_after is not None and loop.step < plan.steps:
        raise KeyboardInterrupt  # simulated kill (tests)
    if loop.step != plan.steps:  # pragma: no cover - invariant
        raise PrivacyError(f"internal: took {loop.step} steps, planned {plan.steps}")

    # windows of the real corpus (extra units are small: never capped by max_examples_per_unit)
    real_windows = max(0, dataset.num_windows
                       - sum(1 for e in examples if e.note_index >= len(notes)))
    epsilon = None
    if loop.engine is not None:
        # the ε the training accountant tracked; the card adds the dp-accounting cross-check
        epsilon = quiet_epsilon(loop.engine.accountant, plan.delta)
    model.eval()
    meta = write_model_dir(
        out, model, src, opts, plan, loop.step, epsilon,
        lambda sha: build_meta(opts, plan, src, notes, real_windows, loop.step, epsilon,
                               weights_sha256=sha),
    )
    if not opts.no_dp:
        record_run(opts, src, plan, notes, meta, patients=fp)
    _write_run_log(ckpt_dir, loop, plan, dataset, t0)
    with contextlib.suppress(OSError):
        shutil.rmtree(ckpt_dir)
    return TrainResult(
        out_dir=out, steps=loop.step, planned_steps=plan.planned_steps, epsilon=epsilon,
        delta=plan.delta, noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate,
        num_units=plan.num_units, seconds=time.monotonic() - t0,
        stopped_by_max_epsilon=plan.stopped_by_max_epsilon, meta=meta,
    )


def _checkpoint_dir(out: Path, opts: TrainOptions) -> Path:
    """Where this run checkpoints; refuses a pickled legacy checkpoint, a leftover checkpoint
    without ``--resume`` and ``--resume`` without one."""
    ckpt_dir = checkpoint_dir_for(out, opts.checkpoint_dir)
    if (ckpt_dir / LEGACY_CHECKPOINT_FILE).exists():
        raise ConfigError(
            f"{ckpt_dir}: holds a pickled checkpoint of an older dphub, which is never loaded "
            "(unpickling can run code); delete that directory to start over"
        )
    if checkpoint.exists(ckpt_dir) and not opts.resume:
        raise ConfigError(
            f"{ckpt_dir}: a checkpoint of an interrupted run exists; pass --resume to continue "
            "it, or delete it to start over"
        )
    if opts.resume and not checkpoint.exists(ckpt_dir):
        raise ConfigError(f"--resume: no checkpoint in {ckpt_dir}")
    return ckpt_dir


def _source_model(opts: TrainOptions, src: ModelSource) -> Any:
    """The model training starts from, with rule features added when asked (a zero projection:
    it starts exactly as the source); refuses a base without a hub-style public id."""
    if not REPO_ID.fullmatch(src.base_public_id):
        # the card records the base as a public hub id; find out now, not after training
        raise ConfigError(
            f"base model name {src.base_public_id!r} is not a hub-style id (org/name); rename "
            "the base model directory to its public name"
        )
    model = src.model
    if opts.rule_features and model.rule_features is None:
        model.add_rule_features()  # zero projection: starts exactly as the source model
    elif not opts.rule_features and model.rule_features is not None:
        raise ConfigError("the initial model takes rule features: train with --rule-features")
    return model


def _unit_dataset(examples: Sequence[Any], opts: TrainOptions) -> UnitDataset:
    """The windows grouped by privacy unit (at most ``max_examples_per_unit`` each)."""
    return UnitDataset.from_windows(
        [e.input_ids for e in examples], [e.labels for e in examples],
        [e.unit for e in examples], max_examples_per_unit=opts.max_examples_per_unit,
        features=[e.features for e in examples] if opts.rule_features else None,
        confidence=[e.confidence for e in examples] if opts.soft_labels else None,
    )


def _write_run_log(ckpt_dir: Path, loop: Any, plan: PrivacyPlan, dataset: UnitDataset,
                   t0: float) -> None:
    """The run's numbers (steps, losses, units, windows, seconds) beside its checkpoints."""
    write_run_log(run_log_path(ckpt_dir), {
        "steps": loop.step,
        "loss_history": [None if math.isnan(v) else round(v, 5) for v in loop.losses],
        "num_units": plan.num_units,
        "windows": dataset.num_windows,
        "windows_left_out": dataset.dropped_windows,
        "seconds": round(time.monotonic() - t0, 1),
    })
