"""``dphub ensemble calibrate | evaluate``: the ensemble measured on the owner's labelled notes.

``calibrate`` chooses thresholds per (member, label) for a target recall and stores them in the
manifest (under its lock); ``evaluate`` prints each member and the aggregate side by side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from dphub.cli.ensemble._common import (
    AGGREGATE_OPT,
    DEVICE_OPT,
    ENSEMBLE_OPT,
    FORMAT_OPT,
    INT8_OPT,
    RUNTIME_OPT,
    SAFE_WORDS_OPT,
    _changes,
    _eps,
    _say,
    _used,
    ensemble_app,
)
from dphub.cli.options import FLOAT, apply_threads, finite_float, reads_notes, threads_option
from dphub.errors import ConfigError, InputError


@ensemble_app.command("calibrate")
@reads_notes
def calibrate_cmd(
    labelled: Path = typer.Argument(
        ..., metavar="LABELLED", help="The owner's labelled notes (any format)."
    ),
    target_recall: float = typer.Option(
        0.99, "--target-recall", parser=finite_float(min=0.0, max=1.0, min_open=True),
        metavar=FLOAT, help="Ensemble token recall to reach (0..1).",
    ),
    aggregate: str | None = AGGREGATE_OPT,
    fmt: str | None = FORMAT_OPT,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print thresholds, do not store them."),
    min_precision: float = typer.Option(
        0.5, "--min-precision", parser=finite_float(min=0.0, max=1.0), metavar=FLOAT,
        help="Refuse when the target costs precision below this (calibration or held-out notes)."),
    holdout: float = typer.Option(
        0.3, "--holdout", parser=finite_float(min=0.0, max=0.9), metavar=FLOAT,
        help="Share of patients held out to check the thresholds (0: calibrate on all)."),
    force: bool = typer.Option(
        False, "--force", help="Store the thresholds even below --min-precision (warns)."),
    per_label: bool = typer.Option(
        True, "--per-label/--per-member", help="A threshold per (member, label), or per member."),
    seed: int = typer.Option(0, "--seed", help="Seed of the patient holdout split."),
    manifest_path: Path = ENSEMBLE_OPT,
    threads: int | None = threads_option(),
    safe_words: list[Path] = SAFE_WORDS_OPT,
    min_kept: float | None = typer.Option(
        None, "--min-kept", parser=finite_float(min=0.0, max=1.0), metavar=FLOAT,
        show_default="none",
        help="--aggregate inverse: target recall >= --target-recall at non-PHI tokens kept >= this "
             "(replaces --min-precision); refuses naming the best reachable setting."),
) -> None:
    """Choose thresholds per (member, label) for a target ensemble recall; store them in the
    manifest. Refuses (exit 2) when the target costs precision below --min-precision (under
    --aggregate inverse with --min-kept: when no pair reaches the recall at that kept share)."""
    from dphub.ensemble.calibrate import calibrate
    from dphub.ensemble.core import build_ensemble
    from dphub.ensemble.evaluation import read_labelled
    from dphub.ensemble.manifest import Manifest

    apply_threads(threads)
    manifest = Manifest.load(manifest_path)
    ensemble = build_ensemble(manifest, aggregate_rule=aggregate, progress=_say,
                              safe_words=safe_words)
    notes = read_labelled(labelled, fmt)
    from dphub.progress import ProgressReporter

    if ensemble.rule.own_thresholds:  # the inverse rule (issue 26): its own LOW, HIGH
        _calibrate_inverse(ensemble, notes, target_recall, holdout=holdout, seed=seed,
                           min_precision=min_precision, force=force, dry_run=dry_run,
                           manifest_path=manifest_path, min_kept=min_kept)
        return
    if min_kept is not None:
        raise ConfigError("--min-kept is for --aggregate inverse (forward rules keep what no "
                          "member flags)")
    with ProgressReporter() as reporter:
        res = calibrate(ensemble, notes, target_recall, per_label=per_label, holdout=holdout,
                        seed=seed, min_precision=min_precision, force=force,
                        progress=reporter.count_callback("calibrate", "members"))
    for name, t in res.thresholds.items():
        per = res.label_thresholds.get(name, {})
        extra = f" ({', '.join(f'{lab} {v:g}' for lab, v in per.items())}; other labels {t:g})" \
            if per else ""
        typer.echo(f"{name}: threshold {t:g}{extra}")
    h = _echo_scores(res, target_recall)
    if h is not None and h.recall is not None and h.recall < target_recall:
        typer.echo(f"warning: held-out recall {h.recall:.4f} is below the target "
                   f"{target_recall}; more labelled notes would give steadier thresholds",
                   err=True)
    if not res.reached:
        typer.echo("warning: target recall not reached; lowest thresholds chosen", err=True)
    if res.forced:
        typer.echo(f"WARNING (--force): {res.refusal()}", err=True)
        typer.echo("WARNING (--force): these thresholds flag much that is not PHI; the output "
                   "will be over-redacted", err=True)
    if not dry_run:
        # stored under the manifest's lock: a concurrent `ensemble add` must not be lost
        with Manifest.editing(manifest_path) as current:
            for name, t in res.thresholds.items():
                entry = current.get(name)
                entry.threshold = t
                entry.label_thresholds = dict(res.label_thresholds.get(name, {}))
            if aggregate:
                current.aggregate = aggregate
        typer.echo(f"thresholds stored in {manifest_path}")
        _changes(current, manifest_path)
    else:
        _used(manifest_path)


def _echo_scores(res: Any, target_recall: float) -> Any:
    """Print a calibration's scores on its notes and on the held-out patients (forward and
    inverse alike); return the held-out report (None without one)."""
    typer.echo(f"calibration notes ({res.notes} notes, {res.patients} patients): ensemble token "
               f"recall {res.recall:.4f} (target {target_recall}), precision {res.precision:.4f} "
               f"on {res.tokens} tokens ({res.phi_tokens} PHI)")
    h = res.holdout
    if h is not None:
        rec = "-" if h.recall is None else f"{h.recall:.4f}"
        typer.echo(f"held-out check ({h.notes} notes, {h.patients} patients): token recall {rec}, "
                   f"precision {h.precision:.4f} on {h.tokens} tokens ({h.phi_tokens} PHI)")
    return h


def _calibrate_inverse(ensemble: Any, notes: Any, target_recall: float, *, holdout: float,
                       seed: int, min_precision: float, force: bool, dry_run: bool,
                       manifest_path: Path, min_kept: float | None = None) -> None:
    """``ensemble calibrate`` under the inverse rule: choose and store
    ``inverse:LOW,HIGH[,NAMED[,SURE]]``."""
    from dphub.ensemble.inverse_calibrate import calibrate_inverse
    from dphub.ensemble.manifest import Manifest
    from dphub.progress import ProgressReporter

    with ProgressReporter() as reporter:
        res = calibrate_inverse(ensemble, notes, target_recall, holdout=holdout, seed=seed,
                                min_precision=min_precision, force=force, min_kept=min_kept,
                                progress=reporter.count_callback("calibrate", "notes"))
    typer.echo(f"aggregate {res.rule}")
    _echo_scores(res, target_recall)
    held = "" if res.holdout_kept is None else f", held-out {res.holdout_kept:.4f}"
    typer.echo(f"non-PHI tokens kept: {res.kept:.4f} on the calibration notes{held}"
               + ("" if min_kept is None else f" (target {min_kept:g})"))
    if res.forced:
        why = (res.refusal() if min_kept is None else
               f"kept {res.kept:.4f} >= {min_kept:g} only at recall {res.recall:.4f} "
               f"(target {target_recall:g})")
        typer.echo(f"WARNING (--force): {why}", err=True)
    if not dry_run:
        with Manifest.editing(manifest_path) as current:
            current.aggregate = res.rule
        typer.echo(f"aggregate stored in {manifest_path}")
        _changes(current, manifest_path)
    else:
        _used(manifest_path)


@ensemble_app.command("evaluate")
@reads_notes
def evaluate_cmd(
    labelled: Path = typer.Argument(..., metavar="LABELLED", help="Labelled notes (any format)."),
    owner_model: Path | None = typer.Option(
        None, "--owner-model", show_default="none", help="Also evaluate your own model directory."
    ),
    aggregate: str | None = AGGREGATE_OPT,
    fmt: str | None = FORMAT_OPT,
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    int8: bool = INT8_OPT,
    runtime: str | None = RUNTIME_OPT,
    manifest_path: Path = ENSEMBLE_OPT,
    threads: int | None = threads_option(),
    safe_words: list[Path] = SAFE_WORDS_OPT,
    device: str | None = DEVICE_OPT,
) -> None:
    """Each member and the aggregate side by side: token P/R/F1, phrase recall, ε, unit."""
    from dphub.ensemble.core import build_ensemble
    from dphub.ensemble.evaluation import evaluate_ensemble, read_labelled
    from dphub.ensemble.manifest import Manifest
    from dphub.runtime import set_inference_device

    apply_threads(threads)
    set_inference_device(device)
    manifest = Manifest.load(manifest_path, missing_ok=owner_model is not None)
    ensemble = build_ensemble(manifest, owner_model=owner_model, aggregate_rule=aggregate,
                              int8=int8, runtime=runtime, progress=_say, safe_words=safe_words)
    notes = read_labelled(labelled, fmt)
    if not notes:
        raise InputError(f"{labelled}: no notes")
    from dphub.progress import ProgressReporter

    with ProgressReporter() as reporter:
        rows = evaluate_ensemble(ensemble, notes,
                                 progress=reporter.count_callback("evaluate", "notes"))
    if owner_model is None or manifest_path.is_file():
        _used(manifest_path)
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    t = Table(title=f"ensemble evaluation on {len(notes)} notes (token-binary)")
    for col in ("member", "ε", "unit", "P", "R", "F1", "phrase R any", "phrase R full",
                "non-PHI kept"):
        t.add_column(col, justify="left" if col in ("member", "unit") else "right")
    for r in rows:
        t.add_row(r["name"], _eps(r["epsilon"]), r["unit"] or "-",
                  *(f"{100 * r[k]:.1f}" for k in ("precision", "recall", "f1",
                                                  "phrase_recall_any", "phrase_recall_full",
                                                  "non_phi_tokens_kept")))
    console = Console()
    if not console.is_terminal:  # a pipe or a file: wide enough that no name or header is cut
        console = Console(width=max(console.width, 140))
    console.print(t)
