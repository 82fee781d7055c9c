"""`dphub audit`: train as `dphub train` would, with canary patients, and audit the result.

Thin layer over :mod:`dphub.audit`: options are merged with ``dphub.toml`` exactly like
``dphub train`` (the same keys), the model directory is written with an ``empirical_audit``
block in its card, and the verdict is printed. A failed audit (the empirical lower bound exceeds
the proven ε) is a refused operation: one ``error:`` line with the numbers, exit code 2, and no
model directory.
A non-private run whose bound is not clearly positive says the attack is too weak to mean
anything.
"""

from __future__ import annotations

from pathlib import Path

import typer

from dphub import config as project


def audit(
    data: Path | None = typer.Argument(None, help="Labelled notes (file or directory)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Model directory to write."),
    canaries: int = typer.Option(64, "--canaries", help="Canary patients (each in with p = 1/2)."),
    canary_notes: int = typer.Option(2, "--canary-notes", help="Notes per canary patient."),
    canary_kind: str = typer.Option("nursing", "--canary-kind", help="nursing|discharge"),
    canary_note_chars: int | None = typer.Option(
        None, "--canary-note-chars", help="Cut canary notes to this many characters."),
    candidates: int = typer.Option(
        15, "--candidates", help="Random alternative secrets per canary (the reference)."),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the ε bound."),
    format: str | None = typer.Option(None, "--format", help="Input format (default: detect)."),
    base_model: str | None = typer.Option(None, "--base-model", help="Base encoder path or id."),
    noise: float | None = typer.Option(None, "--noise", help="Noise multiplier σ."),
    target_epsilon: float | None = typer.Option(None, "--target-epsilon", help="Target ε."),
    delta: float | None = typer.Option(None, "--delta", help="δ (default min(1e-5, 1/(10N)))."),
    epochs: float | None = typer.Option(None, "--epochs"),
    batch_size: int | None = typer.Option(None, "--batch-size", help="Expected units per step."),
    max_physical_batch: int | None = typer.Option(None, "--max-physical-batch"),
    max_grad_norm: float | None = typer.Option(None, "--max-grad-norm"),
    lr: float | None = typer.Option(None, "--lr"),
    max_examples_per_unit: int | None = typer.Option(None, "--max-examples-per-unit"),
    accountant: str | None = typer.Option(None, "--accountant", help="prv|rdp"),
    head: str | None = typer.Option(None, "--head", help="crf|softmax"),
    train_layers: int | None = typer.Option(None, "--train-layers"),
    lora_rank: int | None = typer.Option(None, "--lora-rank"),
    recall_weight: float | None = typer.Option(None, "--recall-weight", help="δp."),
    label_schema: str | None = typer.Option(None, "--label-schema"),
    max_epsilon: float | None = typer.Option(None, "--max-epsilon"),
    seed: int | None = typer.Option(None, "--seed", help="Initialisation only: never the "
                                    "canaries, their inclusion or the DP noise."),
    secure_rng: bool | None = typer.Option(None, "--secure-rng/--no-secure-rng"),
    init_from: str | None = typer.Option(None, "--init-from", help="Pulled model or directory."),
    warm_start: str | None = typer.Option(None, "--warm-start", help="synth|none"),
    no_dp: bool = typer.Option(False, "--no-dp", help="Non-private run: checks the attack works."),
    checkpoint_every: int | None = typer.Option(None, "--checkpoint-every"),
    checkpoint_dir: Path | None = typer.Option(None, "--checkpoint-dir"),
    force: bool = typer.Option(False, "--force", help="Replace an existing model directory."),
) -> None:
    """Train with synthetic canary patients and report an empirical ε lower bound.

    The bound (one-run method, Steinke, Nasr & Jagielski 2023) goes into the card.

    It is a LOWER bound, not a proof. Check the attack with the same command and --no-dp.
    """
    flags = {k: v for k, v in locals().items() if k not in (
        "canaries", "canary_notes", "canary_kind", "canary_note_chars", "candidates",
        "confidence")}
    from dphub import audit as auditing
    from dphub import train as training
    from dphub.cli.train import _merge, _run_with_progress

    cfg = project.load_project_config()
    merged = _merge(flags, cfg)
    merged["no_dp"], merged["force"] = no_dp, force
    if merged.get("base_model") is not None:
        p = project.project_path(cfg, str(merged["base_model"]))
        if p is not None and p.is_dir():
            merged["base_model"] = str(p)
    for k in ("data", "out", "checkpoint_dir"):
        if merged.get(k) is not None:
            merged[k] = Path(merged[k])
    opts = training.TrainOptions(**merged)
    aopts = auditing.AuditOptions(
        canaries=canaries, notes_per_canary=canary_notes, candidates=candidates,
        confidence=confidence, kind=canary_kind, max_note_chars=canary_note_chars,
    )
    result = _run_with_progress(_Audit(auditing, aopts), opts)
    project.record_last_model(result.train.out_dir)
    block = result.block
    typer.echo(f"wrote {result.train.out_dir} (card carries the empirical_audit block)")
    typer.echo(auditing.describe(block, markdown=False))
    if result.verdict == "not-private" and not result.attack_works:
        typer.echo(
            f"warning: audit too weak to mean anything: without DP the attack reaches only "
            f"ε ≥ {block['epsilon_lower_bound']:.3g} (needs ≥ {auditing.ATTACK_MIN_EPSILON}); "
            "a small bound on a private run of this recipe would say nothing about its privacy",
            err=True,
        )


class _Audit:
    """Adapter so the train command's progress display drives ``run_audit``."""

    def __init__(self, auditing: object, aopts: object) -> None:
        self.auditing, self.aopts = auditing, aopts

    def train(self, opts: object, on_progress: object = None) -> object:
        run = self.auditing.run_audit  # type: ignore[attr-defined]
        return run(opts, self.aopts, on_progress=on_progress)


def register(app: typer.Typer) -> None:
    """Add ``audit`` to the root app."""
    app.command("audit")(audit)
