"""What every ``dphub ensemble`` command module shares: the Typer sub-app, the options that
several subcommands declare (one declaration each, so their help and defaults cannot drift) and
the small output helpers.

The commands themselves live in :mod:`.manifest`, :mod:`.deid`, :mod:`.evaluate` and
:mod:`.owner`; they register on :data:`ensemble_app` when :mod:`dphub.cli.ensemble` imports them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

ensemble_app = typer.Typer(
    name="ensemble",
    help="Combine published models and rules into a local de-identification ensemble.",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help: keep literal brackets
)

ENSEMBLE_OPT = typer.Option(
    Path("dphub-ensemble.toml"), "--ensemble", "--manifest", "-e", envvar="DPHUB_ENSEMBLE",
    show_default="dphub-ensemble.toml in the working directory",
    help="The ensemble manifest (TOML); the command says which one it used.",
)


def _used(manifest_path: Path) -> None:
    """Say which manifest a command read (issue 56: it was found through the working
    directory, silently); on stderr, so JSON on stdout stays JSON."""
    typer.echo(f"manifest: {manifest_path.expanduser().resolve()}", err=True)


def _changes(manifest: Any, manifest_path: Path) -> None:
    """Print what an edit changed in the manifest (before -> after) and how to undo it."""
    from dphub.ensemble.manifest import previous_path

    if not manifest.changes:
        typer.echo(f"{manifest_path}: nothing changed")
        return
    for line in manifest.changes:
        typer.echo(f"  {line}")
    typer.echo(f"previous version kept in {previous_path(manifest_path)}; undo with "
               f"`dphub ensemble undo -e {manifest_path}`")


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def _eps(x: float | None) -> str:
    """An ε as every command shows it (3 significant digits, rounded up; issue 56)."""
    from dphub.privacy.statement import format_epsilon

    return "-" if x is None else format_epsilon(x)


def _say(msg: str) -> None:
    """Status lines of slow set-up steps (ONNX export), on stderr; never note text."""
    typer.echo(msg, err=True)


BATCH_OPT = typer.Option(16, "--batch-size", min=1, help="Notes per batch.")
RESUME_OPT = typer.Option(False, "--resume", help="Continue an interrupted run in OUT.")
FORMAT_OPT = typer.Option(
    None, "--format", "-f", show_default="detect from the path", help="Input format."
)
AGGREGATE_OPT = typer.Option(
    None, "--aggregate", show_default="the manifest's, else any",
    help="Aggregation: any (a character is PHI if any member flags it) | k-of-n:K (K members "
         "must agree) | k-of-n:K+NAME+... (as k-of-n:K, but the named members' flags count "
         "alone, e.g. k-of-n:2+rules:default: two pulled models must agree, the rules need not) "
         "| inverse[:LOW,HIGH[,NAMED[,SURE]]] (recall first: hide every word unless no member "
         "flags it and it is a safe word or a number in a measurement that every model scores "
         "below HIGH (NAMED if it shows a sign of a name), an unknown lower-case word below "
         "LOW, or any word no shape refuses below SURE; docs/recall_first.md).",
)
SAFE_WORDS_OPT = typer.Option(
    [], "--safe-words", metavar="FILE",
    help="With --aggregate inverse: your own safe words (one word per line), added to the "
         "shipped vocabulary; each word added comes back whenever the models let it; "
         "'builtin:weekdays' adds weekday names where your guideline does not count them as "
         "PHI; or a site-local safe words file that `dphub review` records (JSON: released "
         "only under its guard) (repeatable; docs/recall_first.md, docs/review.md).",
)
RUNTIME_OPT = typer.Option(
    None, "--runtime", show_default="the manifest's, else auto",
    help="Encoder runtime of model members: auto | torch | torch-bf16 | onnx | onnx-int8. auto: "
         "torch-bf16 where the CPU (or GPU) has native bfloat16, else torch; said once on "
         "stderr. ONNX graphs are built once per encoder and cached; torch-bf16 needs native "
         "bfloat16.",
)
DEVICE_OPT = typer.Option(
    None, "--device", show_default="auto: cuda when PyTorch sees a GPU, else cpu",
    help="Where model members run: auto | cpu | cuda | cuda:N (the ONNX runtimes are CPU only).",
)
INT8_OPT = typer.Option(False, "--int8", help="Int8 dynamic quantization of model members "
                        "(faster on CPU; check recall with `ensemble evaluate --int8`).")
