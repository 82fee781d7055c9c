"""`dphub audit`: train as `dphub train` would, with canaries, and audit the result.

Thin layer over :mod:`dphub.audit`: options are merged with ``dphub.toml`` exactly like
``dphub train`` (the same keys), the model directory is written with an ``empirical_audit``
block in its card, and the verdict is printed. Exit codes:

* 0: ``passed`` (or ``not-private`` for a ``--no-dp`` run of ``--method patients``);
* 2: ``failed`` (the empirical lower bound exceeds the proven ε): a refused operation, one
  ``error:`` line with the numbers, and no model directory;
* 3: ``inconclusive`` (the audit's ceiling is below the proven ε, so it could not have failed):
  the model directory *is* written, its card says inconclusive and why, and a ``warning:`` line
  says so; like the other commands' 3, "done, but not everything asked for" — a script that gates
  on the audit must not read "could not check" as "checked".

A non-private run whose bound is not clearly positive says the attack is too weak to mean
anything.
"""

from __future__ import annotations

from pathlib import Path

import typer

from dphub import config as project
from dphub.cli import train as T
from dphub.cli.options import apply_threads, reads_notes, threads_option
from dphub.errors import ConfigError


@reads_notes
def audit(
    data: Path | None = T.DATA_OPT,
    out: Path | None = T.OUT_OPT,
    method: str = typer.Option(
        "gradient", "--method",
        help="gradient: white-box Dirac gradient canaries in the clipped sum before the noise "
        "(catches a missing or grossly small noise at ε 8) | patients: black-box synthetic "
        "canary patients (weak: inconclusive above ε ≈ 2.7 with 64)."),
    canaries: int | None = typer.Option(
        None, "--canaries", show_default="gradient: the count with the highest ceiling at the "
        "run's δ (30,000 at δ 1e-5); patients: 64",
        help="Canaries (each included with probability 1/2)."),
    canary_notes: int = typer.Option(2, "--canary-notes", min=1,
                                     help="Notes per canary patient (--method patients)."),
    canary_kind: str = typer.Option(
        "nursing", "--canary-kind",
        help="Kind of canary notes: nursing | discharge (--method patients)."),
    canary_note_chars: int | None = typer.Option(
        None, "--canary-note-chars", min=1, show_default="whole notes",
        help="Cut canary notes to this many characters (--method patients)."),
    candidates: int = typer.Option(
        15, "--candidates", min=1,
        help="Random alternative secrets per canary, the attack's reference (--method "
        "patients)."),
    abstain: str = typer.Option(
        "auto", "--abstain",
        help="Gradient canaries: the fraction not guessed on, those closest to the guess "
        "threshold (Steinke et al.'s abstention; 0: guess every canary; auto: the fraction "
        "with the largest simulated detection limit at the run's settings)."),
    confidence: float = typer.Option(
        0.95, "--confidence", help="Confidence of the ε lower bound (0 < c < 1)."),
    format: str | None = T.FORMAT_OPT,
    base_model: str | None = T.BASE_MODEL_OPT,
    noise: float | None = T.NOISE_OPT,
    target_epsilon: float | None = T.TARGET_EPSILON_OPT,
    delta: float | None = T.DELTA_OPT,
    epochs: float | None = T.EPOCHS_OPT,
    batch_size: int | None = T.BATCH_SIZE_OPT,
    max_physical_batch: int | None = T.MAX_PHYSICAL_BATCH_OPT,
    max_grad_norm: float | None = T.MAX_GRAD_NORM_OPT,
    lr: float | None = T.LR_OPT,
    max_examples_per_unit: int | None = T.MAX_EXAMPLES_PER_UNIT_OPT,
    accountant: str | None = T.ACCOUNTANT_OPT,
    head: str | None = T.HEAD_OPT,
    train_layers: int | None = T.TRAIN_LAYERS_OPT,
    lora_rank: int | None = T.LORA_RANK_OPT,
    recall_weight: float | None = T.RECALL_WEIGHT_OPT,
    rule_features: bool | None = T.RULE_FEATURES_OPT,
    rule_lr_scale: float | None = T.RULE_LR_SCALE_OPT,
    label_schema: str | None = T.LABEL_SCHEMA_OPT,
    max_epsilon: float | None = T.MAX_EPSILON_OPT,
    seed: int | None = T.SEED_OPT,
    secure_rng: bool | None = T.SECURE_RNG_OPT,
    init_from: str | None = T.INIT_FROM_OPT,
    warm_start: str | None = T.WARM_START_OPT,
    no_dp: bool = typer.Option(
        False, "--no-dp", help="Non-private run: checks the attack works (--method patients)."),
    checkpoint_every: int | None = T.CHECKPOINT_EVERY_OPT,
    checkpoint_dir: Path | None = T.CHECKPOINT_DIR_OPT,
    force: bool = T.FORCE_OPT,
    threads: int | None = threads_option(),
    allow_above_policy: bool = T.ALLOW_ABOVE_POLICY_OPT,
) -> None:
    """Train with canaries and report an empirical ε lower bound.

    The bound (one-run method, Steinke, Nasr & Jagielski 2023) goes into the card. Exit 0:
    passed; 2: failed (nothing written); 3: inconclusive (the audit could not have failed at
    the proven ε; the model is written and its card says so).

    It is a LOWER bound, not a proof: a sanity check of the mechanism; the proven ε is the
    guarantee.
    """
    flags = {k: v for k, v in locals().items() if k not in (
        "method", "canaries", "canary_notes", "canary_kind", "canary_note_chars", "candidates",
        "confidence", "abstain", "threads", "allow_above_policy")}
    T.early_output_check(out, project.load_project_config(), force=force)  # before torch
    apply_threads(threads)
    from dphub import audit as auditing

    try:
        abstain_fraction = None if abstain == "auto" else float(abstain)
    except ValueError:
        raise ConfigError(f"--abstain must be auto or in [0, 0.95], got {abstain!r}") from None
    cfg = project.load_project_config()
    opts = T.build_options(flags, cfg, no_dp=no_dp, force=force)
    aopts = auditing.AuditOptions(
        canaries=canaries, notes_per_canary=canary_notes, candidates=candidates,
        confidence=confidence, kind=canary_kind, max_note_chars=canary_note_chars,
        method=method, abstain=abstain_fraction,
    )
    T.run_and_report(opts, aopts, on_plan=T.plan_check(opts, cfg, allow=allow_above_policy))


def register(app: typer.Typer) -> None:
    """Add ``audit`` to the root app."""
    app.command("audit")(audit)
