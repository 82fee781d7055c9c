"""``dphub ensemble add | remove | list | show | runtime | aggregate | undo``: edits and views of
the manifest.

Each edit runs under the manifest's lock (:meth:`dphub.ensemble.manifest.Manifest.editing`);
nothing here runs the ensemble: ``add`` and ``runtime`` load model members only to ready them
for the manifest's runtime (ONNX graphs built or verified) before the manifest names it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from dphub.cli.ensemble._common import (
    ENSEMBLE_OPT,
    _changes,
    _eps,
    _fmt,
    _say,
    _used,
    ensemble_app,
)
from dphub.cli.options import FLOAT, positive_float, unit_interval


@ensemble_app.command("add")
def add_cmd(
    spec: str = typer.Argument(
        ..., metavar="SPEC",
        help="org/name[@revision] (a pulled model), a model directory, rules:default, "
             "deidpl:DIR (deid.pl in DIR, or DIR/FILE.config; needs perl) or presidio:default "
             "(needs the presidio extra).",
    ),
    threshold: float | None = typer.Option(
        None, "--threshold", parser=unit_interval, metavar=FLOAT, show_default="decode (Viterbi)",
        help="Flag tokens whose P(PHI) >= this threshold (0..1) instead of decoding.",
    ),
    name: str | None = typer.Option(
        None, "--name", show_default="the repo or directory name", help="Member name."
    ),
    timeout: float | None = typer.Option(
        None, "--timeout", parser=positive_float, metavar=FLOAT,
        show_default="600 s per batch",
        help="deidpl: members only: seconds one deid.pl run (one batch of notes) may take before "
             "it is stopped and its batch fails.",
    ),
    manifest_path: Path = ENSEMBLE_OPT,
) -> None:
    """Add a member, pinning its revision (registry sha, weights or tool digest)."""
    from dphub.ensemble.core import prepare_runtime
    from dphub.ensemble.manifest import Manifest, entry_from_spec

    entry = entry_from_spec(spec, name=name, threshold=threshold,  # hashing weights: unlocked
                            timeout=timeout)
    current = Manifest.load(manifest_path).runtime if manifest_path.exists() else None
    if current not in (None, "torch"):  # the manifest's runtime, ready for the new member now
        prepare_runtime([entry], current, progress=_say)
    with Manifest.editing(manifest_path, missing_ok=True) as manifest:
        manifest.add(entry)
    typer.echo(f"added {entry.name} ({entry.kind}"
               + (f", revision {entry.revision}" if entry.revision else "") + f") to {manifest_path}")
    _describe(entry, manifest_path)


def _describe(entry: Any, manifest_path: Path) -> None:
    """Print what the member's kind says about it (a rule member: which ages it flags)."""
    from dphub.ensemble.kinds import member_kind

    line = member_kind(entry.kind).describe(entry, str(manifest_path))
    if line:
        typer.echo(line)


@ensemble_app.command("remove")
def remove_cmd(
    name: str = typer.Argument(..., metavar="NAME", help="Member name."),
    manifest_path: Path = ENSEMBLE_OPT,
) -> None:
    """Remove a member."""
    from dphub.ensemble.manifest import Manifest

    with Manifest.editing(manifest_path) as manifest:
        manifest.remove(name)
    typer.echo(f"removed {name} from {manifest_path}")
    _changes(manifest, manifest_path)


@ensemble_app.command("list")
def list_cmd(manifest_path: Path = ENSEMBLE_OPT,
             json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Members with revision, ε, privacy unit and threshold."""
    from dphub.ensemble.kinds import member_kind
    from dphub.ensemble.manifest import Manifest

    manifest = Manifest.load(manifest_path)
    if json_out:
        typer.echo(json.dumps({"aggregate": manifest.aggregate,
                               **({"runtime": manifest.runtime} if manifest.runtime else {}),
                               "members": [m.to_dict() for m in manifest.members]}, indent=2))
        return
    t = Table(title=f"{manifest_path} (aggregate: {manifest.aggregate})")
    for col in ("member", "kind", "revision", "ε", "unit", "threshold"):
        t.add_column(col)
    for m in manifest.members:
        rev = (m.revision or "-")
        t.add_row(m.name, m.kind, rev[:19], _eps(m.epsilon), m.unit or "-",
                  "decode" if m.threshold is None and member_kind(m.kind).model
                  else _fmt(m.threshold))
    Console().print(t)
    for m in manifest.members:
        _describe(m, manifest_path)
    _rule_fits(manifest)


def _rule_fits(manifest: Any) -> None:
    """Warn when the stored rule no longer fits the members (a hand edit): every run would
    refuse it, and the listing is where the user looks first."""
    from dphub.ensemble.aggregation import parse_rule
    from dphub.errors import ConfigError

    if not manifest.members:
        return
    try:
        parse_rule(manifest.aggregate).check([m.name for m in manifest.members])
    except ConfigError as e:
        typer.echo(f"warning: runs will refuse this manifest: {e.message}", err=True)


@ensemble_app.command("show")
def show_cmd(name: str | None = typer.Argument(None, metavar="NAME", show_default="all members",
                                              help="One member."),
             manifest_path: Path = ENSEMBLE_OPT) -> None:
    """Print the manifest (or one member) as JSON."""
    from dphub.ensemble.manifest import Manifest

    manifest = Manifest.load(manifest_path)
    if name:
        typer.echo(json.dumps(manifest.get(name).to_dict(), indent=2))
    else:
        typer.echo(json.dumps({"aggregate": manifest.aggregate,
                               **({"runtime": manifest.runtime} if manifest.runtime else {}),
                               "members": [m.to_dict() for m in manifest.members]}, indent=2))
    _used(manifest_path)


@ensemble_app.command("runtime")
def runtime_cmd(runtime: str | None = typer.Argument(
                    None, metavar="RUNTIME", show_default="print the current one",
                    help="torch | torch-bf16 | onnx | onnx-int8 (stored in the manifest)."),
                manifest_path: Path = ENSEMBLE_OPT) -> None:
    """Show or set the encoder runtime that deid and evaluate use by default."""
    from dphub.ensemble.manifest import Manifest
    from dphub.runtime import DEFAULT_RUNTIME, check_runtime

    if runtime is None:
        stored = Manifest.load(manifest_path).runtime
        if stored:
            typer.echo(stored)
        else:  # auto: say what it means on this machine
            from dphub.runtime import choose_runtime, inference_device

            name, why = choose_runtime(inference_device())
            typer.echo(f"{DEFAULT_RUNTIME} ({name} here: {why})")
        _used(manifest_path)
        return
    from dphub.ensemble.core import prepare_runtime

    check_runtime(runtime)
    # every model member's encoder readied first (ONNX graphs built or verified; bf16 support
    # checked): a runtime that cannot work here is refused before the manifest names it
    n = prepare_runtime(Manifest.load(manifest_path).members, runtime, progress=_say)
    with Manifest.editing(manifest_path) as manifest:
        manifest.runtime = runtime
    typer.echo(f"runtime {runtime} stored in {manifest_path}"
               + (f" ({n} encoder{'s' if n != 1 else ''} ready)" if n else ""))
    _changes(manifest, manifest_path)


@ensemble_app.command("aggregate")
def aggregate_cmd(rule: str | None = typer.Argument(
                      None, metavar="RULE", show_default="print the current one",
                      help="any | k-of-n:K | k-of-n:K+NAME+... | inverse | "
                           "inverse:LOW,HIGH[,NAMED[,SURE]] (stored in the manifest)."),
                  manifest_path: Path = ENSEMBLE_OPT) -> None:
    """Show or set the aggregation rule that deid, evaluate and calibrate use by default."""
    from dphub.ensemble.aggregation import parse_rule
    from dphub.ensemble.manifest import Manifest

    if rule is None:
        typer.echo(Manifest.load(manifest_path).aggregate)
        _used(manifest_path)
        return
    parsed = parse_rule(rule)
    with Manifest.editing(manifest_path) as manifest:
        parsed.check([m.name for m in manifest.members])
        manifest.aggregate = str(parsed)
    typer.echo(f"aggregate {parsed} stored in {manifest_path}")
    _changes(manifest, manifest_path)


@ensemble_app.command("undo")
def undo_cmd(manifest_path: Path = ENSEMBLE_OPT) -> None:
    """Put back the manifest as it was before the last edit (add, remove, runtime, aggregate,
    calibrate); undo again to redo."""
    from dphub.ensemble.manifest import Manifest, describe_changes, previous_path

    before, after = Manifest.undo(manifest_path)
    typer.echo(f"{manifest_path} restored from its previous version")
    for line in describe_changes(before, after) or ["(the two versions mean the same)"]:
        typer.echo(f"  {line}")
    typer.echo(f"the version undone is kept in {previous_path(manifest_path)} (undo again to "
               "redo)")
