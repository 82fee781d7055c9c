"""``dphub ensemble ...`` (manifest, deid, calibrate, evaluate) and the top-level ``dphub deid``.

Thin: parse options, call :mod:`dphub.ensemble` / :mod:`dphub.runner`, print. Exit codes: 0 ok,
2 a :class:`~dphub.errors.DphubError`, 3 when a run skipped notes that failed
(:data:`dphub.runner.EXIT_SOME_FAILED`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from dphub.errors import ConfigError, InputError

ensemble_app = typer.Typer(
    name="ensemble",
    help="Combine published models and rules into a local de-identification ensemble.",
    no_args_is_help=True,
)

ENSEMBLE_OPT = typer.Option(
    Path("dphub-ensemble.toml"), "--ensemble", "-e", help="The ensemble manifest (TOML)."
)


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


# ---------------------------------------------------------------------------- manifest commands
@ensemble_app.command("add")
def add_cmd(
    spec: str = typer.Argument(..., help="REPO[@rev] (pulled model), a model DIR, or rules:default."),
    threshold: float | None = typer.Option(
        None, "--threshold", min=0.0, max=1.0, help="Flag tokens with P(not O) >= t."
    ),
    name: str | None = typer.Option(None, "--name", help="Member name (default: repo/dir name)."),
    manifest_path: Path = ENSEMBLE_OPT,
) -> None:
    """Add a member, pinning its revision (registry sha or weights digest)."""
    from dphub.ensemble.manifest import Manifest, entry_from_spec

    entry = entry_from_spec(spec, name=name, threshold=threshold)  # hashing weights: unlocked
    with Manifest.editing(manifest_path, missing_ok=True) as manifest:
        manifest.add(entry)
    typer.echo(f"added {entry.name} ({entry.kind}"
               + (f", revision {entry.revision}" if entry.revision else "") + f") to {manifest_path}")


@ensemble_app.command("remove")
def remove_cmd(name: str = typer.Argument(..., help="Member name."), manifest_path: Path = ENSEMBLE_OPT) -> None:
    """Remove a member."""
    from dphub.ensemble.manifest import Manifest

    with Manifest.editing(manifest_path) as manifest:
        manifest.remove(name)
    typer.echo(f"removed {name} from {manifest_path}")


@ensemble_app.command("list")
def list_cmd(manifest_path: Path = ENSEMBLE_OPT,
             json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Members with revision, ε, privacy unit and threshold."""
    from dphub.ensemble.manifest import Manifest

    manifest = Manifest.load(manifest_path)
    if json_out:
        typer.echo(json.dumps({"aggregate": manifest.aggregate,
                               "members": [m.to_dict() for m in manifest.members]}, indent=2))
        return
    t = Table(title=f"{manifest_path} (aggregate: {manifest.aggregate})")
    for col in ("member", "kind", "revision", "ε", "unit", "threshold"):
        t.add_column(col)
    for m in manifest.members:
        rev = (m.revision or "-")
        t.add_row(m.name, m.kind, rev[:19], _fmt(m.epsilon), m.unit or "-",
                  "decode" if m.threshold is None and m.kind != "rules" else _fmt(m.threshold))
    Console().print(t)


@ensemble_app.command("show")
def show_cmd(name: str | None = typer.Argument(None, help="One member (default: all)."),
             manifest_path: Path = ENSEMBLE_OPT) -> None:
    """Print the manifest (or one member) as JSON."""
    from dphub.ensemble.manifest import Manifest

    manifest = Manifest.load(manifest_path)
    if name:
        typer.echo(json.dumps(manifest.get(name).to_dict(), indent=2))
    else:
        typer.echo(json.dumps({"aggregate": manifest.aggregate,
                               "members": [m.to_dict() for m in manifest.members]}, indent=2))


# ---------------------------------------------------------------------------- runs
def _progress_callback(enabled: bool) -> tuple[Any, Any]:
    """A rich progress bar with notes/s on stderr, only on a terminal (never note text)."""
    if not enabled or not sys.stderr.isatty():
        return None, None
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("de-identifying"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                        console=Console(stderr=True))
    task = progress.add_task("deid", total=None, rate="")
    start: dict[str, float] = {}

    def update(done: int, total: int) -> None:
        now = time.perf_counter()
        if not start:
            start.update(t=now, done=done)
        elapsed = now - start["t"]
        rate = f"{(done - start['done']) / elapsed:.1f} notes/s" if elapsed > 0 else ""
        progress.update(task, completed=done, total=total, rate=rate)

    return progress, update


def _run(input_path: Path, out: Path, ensemble: Any, *, mode: str, key_file: Path | None,
         batch_size: int, workers: int | None, resume: bool, audit_text: bool,
         fmt: str | None) -> int:
    from dphub.runner import run_deid

    if workers is not None:
        if workers < 1:
            raise ConfigError("--workers must be at least 1")
        import torch

        torch.set_num_threads(workers)
    key = None
    if key_file is not None:
        from dphub.render import load_key

        key = load_key(key_file)
    progress, update = _progress_callback(True)
    if progress is not None:
        with progress:
            report = run_deid(input_path, out, ensemble, mode=mode, key=key, fmt=fmt,
                              batch_size=batch_size, resume=resume, audit_text=audit_text,
                              progress=update)
    else:
        report = run_deid(input_path, out, ensemble, mode=mode, key=key, fmt=fmt,
                          batch_size=batch_size, resume=resume, audit_text=audit_text)
    msg = f"{report.done} note(s) de-identified into {out}"
    if report.already_complete:
        msg = f"the run in {out} is already complete ({report.skipped} note(s)); nothing to do"
    elif report.skipped:
        msg += f", {report.skipped} already done"
    typer.echo(msg)
    for err in report.errors:
        typer.echo(f"failed: {err}", err=True)
    if report.failed:
        typer.echo(f"{len(report.failed)} note(s) failed and were skipped", err=True)
    return report.exit_code


MODE_OPT = typer.Option("tag", "--mode", help="tag | redact | surrogate | spans | brat")
KEY_OPT = typer.Option(None, "--key-file", help="Secret key for consistent surrogates.")
BATCH_OPT = typer.Option(16, "--batch-size", min=1, help="Notes per batch.")
WORKERS_OPT = typer.Option(None, "--workers", help="CPU threads for the models.")
RESUME_OPT = typer.Option(False, "--resume", help="Continue an interrupted run in OUT.")
AUDIT_OPT = typer.Option(False, "--audit-text", help="Put the removed text in audit.jsonl.")
FORMAT_OPT = typer.Option(None, "--format", help="Input format (default: detect).")
INT8_OPT = typer.Option(False, "--int8", help="Int8 dynamic quantization of model members "
                        "(faster on CPU; check recall with `ensemble evaluate --int8`).")


@ensemble_app.command("deid")
def deid_cmd(
    input_path: Path = typer.Argument(..., help="Directory of .txt, a JSONL file, or a corpus."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    owner_model: Path | None = typer.Option(
        None, "--owner-model", help="Also use your own model directory (Scenario B)."
    ),
    aggregate: str | None = typer.Option(None, "--aggregate", help="any | k-of-n:K"),
    mode: str = MODE_OPT,
    key_file: Path | None = KEY_OPT,
    batch_size: int = BATCH_OPT,
    workers: int | None = WORKERS_OPT,
    resume: bool = RESUME_OPT,
    audit_text: bool = AUDIT_OPT,
    fmt: str | None = FORMAT_OPT,
    int8: bool = INT8_OPT,
    manifest_path: Path = ENSEMBLE_OPT,
) -> int:
    """De-identify notes with the ensemble (plus --owner-model); writes OUT/audit.jsonl."""
    from dphub.ensemble.core import build_ensemble
    from dphub.ensemble.manifest import Manifest

    manifest = Manifest.load(manifest_path, missing_ok=owner_model is not None)
    ensemble = build_ensemble(manifest, owner_model=owner_model, aggregate_rule=aggregate,
                              batch_size=batch_size, int8=int8)
    return _run(input_path, out, ensemble, mode=mode, key_file=key_file, batch_size=batch_size,
                workers=workers, resume=resume, audit_text=audit_text, fmt=fmt)


def deid_top_cmd(
    input_path: Path = typer.Argument(..., help="Directory of .txt, a JSONL file, or a corpus."),
    model: str = typer.Option(..., "--model", help="A model directory, org/name[@rev], or rules:default."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    threshold: float | None = typer.Option(None, "--threshold", min=0.0, max=1.0),
    mode: str = MODE_OPT,
    key_file: Path | None = KEY_OPT,
    batch_size: int = BATCH_OPT,
    workers: int | None = WORKERS_OPT,
    resume: bool = RESUME_OPT,
    audit_text: bool = AUDIT_OPT,
    fmt: str | None = FORMAT_OPT,
    int8: bool = INT8_OPT,
) -> int:
    """De-identify notes with one model (or rules:default)."""
    from dphub.ensemble.core import Ensemble, Slot, member_from_entry
    from dphub.ensemble.manifest import MemberEntry, card_privacy, weights_digest

    if model.startswith("rules:"):
        slot = member_from_entry(MemberEntry(model, "rules", threshold=threshold))
    else:
        p = Path(model).expanduser()
        if not p.is_dir():
            try:
                from dphub.hub.registry import resolve_model
            except ImportError:
                raise ConfigError(f"{model}: not a model directory") from None
            p = Path(resolve_model(model))
        from dphub.ensemble.members import ModelMember

        priv = card_privacy(p)
        member = ModelMember.load(p, batch_size=batch_size)
        if int8:
            member.quantize_int8()
        # the weights digest as revision: a resumed run refuses other weights (outputs would mix)
        slot = Slot(member, threshold, priv.get("epsilon"), priv.get("privacy_unit"),
                    weights_digest(p))
    return _run(input_path, out, Ensemble([slot]), mode=mode, key_file=key_file,
                batch_size=batch_size, workers=workers, resume=resume, audit_text=audit_text,
                fmt=fmt)


# ---------------------------------------------------------------------------- calibrate/evaluate
@ensemble_app.command("calibrate")
def calibrate_cmd(
    labelled: Path = typer.Argument(..., help="The owner's labelled notes (any format)."),
    target_recall: float = typer.Option(0.99, "--target-recall", help="Ensemble token recall."),
    aggregate: str | None = typer.Option(None, "--aggregate", help="any | k-of-n:K"),
    fmt: str | None = FORMAT_OPT,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print thresholds, do not store them."),
    manifest_path: Path = ENSEMBLE_OPT,
) -> None:
    """Choose per-member thresholds for a target ensemble recall; store them in the manifest."""
    from dphub.ensemble.calibrate import calibrate
    from dphub.ensemble.core import build_ensemble
    from dphub.ensemble.evaluation import read_labelled
    from dphub.ensemble.manifest import Manifest

    manifest = Manifest.load(manifest_path)
    ensemble = build_ensemble(manifest, aggregate_rule=aggregate)
    notes = read_labelled(labelled, fmt)
    res = calibrate(ensemble, notes, target_recall)
    for name, t in res.thresholds.items():
        typer.echo(f"{name}: threshold {t:g}")
    typer.echo(f"ensemble token recall {res.recall:.4f} (target {target_recall}), precision "
               f"{res.precision:.4f} on {res.tokens} tokens ({res.phi_tokens} PHI)")
    if not res.reached:
        typer.echo("warning: target recall not reached; lowest thresholds chosen", err=True)
    if not dry_run:
        for name, t in res.thresholds.items():
            manifest.get(name).threshold = t
        if aggregate:
            manifest.aggregate = aggregate
        manifest.save(manifest_path)
        typer.echo(f"thresholds stored in {manifest_path}")


@ensemble_app.command("evaluate")
def evaluate_cmd(
    labelled: Path = typer.Argument(..., help="Labelled notes (any format)."),
    owner_model: Path | None = typer.Option(None, "--owner-model", help="Add your own model."),
    aggregate: str | None = typer.Option(None, "--aggregate", help="any | k-of-n:K"),
    fmt: str | None = FORMAT_OPT,
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    int8: bool = INT8_OPT,
    manifest_path: Path = ENSEMBLE_OPT,
) -> None:
    """Each member and the aggregate side by side: token P/R/F1, phrase recall, ε, unit."""
    from dphub.ensemble.core import build_ensemble
    from dphub.ensemble.evaluation import evaluate_ensemble, read_labelled
    from dphub.ensemble.manifest import Manifest

    manifest = Manifest.load(manifest_path, missing_ok=owner_model is not None)
    ensemble = build_ensemble(manifest, owner_model=owner_model, aggregate_rule=aggregate,
                              int8=int8)
    notes = read_labelled(labelled, fmt)
    if not notes:
        raise InputError(f"{labelled}: no notes")
    rows = evaluate_ensemble(ensemble, notes)
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    t = Table(title=f"ensemble evaluation on {len(notes)} notes (token-binary)")
    for col in ("member", "ε", "unit", "P", "R", "F1", "phrase R any", "phrase R full"):
        t.add_column(col, justify="left" if col in ("member", "unit") else "right")
    for r in rows:
        t.add_row(r["name"], _fmt(r["epsilon"]), r["unit"] or "-",
                  *(f"{100 * r[k]:.1f}" for k in ("precision", "recall", "f1",
                                                  "phrase_recall_any", "phrase_recall_full")))
    Console().print(t)


def register(app: typer.Typer) -> None:
    """Add the ``ensemble`` group and the top-level ``deid`` command to the root app."""
    app.add_typer(ensemble_app, name="ensemble")
    app.command("deid")(deid_top_cmd)
