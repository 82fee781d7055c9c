"""`dphub card show|validate|edit`: read a card, check it like the publish gate, set its texts.

Thin layer: resolution, validation and rendering live in :mod:`dphub.card` and
:mod:`dphub.privacy.statement`; this module parses arguments and prints.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import typer

from dphub.errors import CardError
from dphub.privacy.statement import format_epsilon

card_app = typer.Typer(
    name="card",
    help="Show or validate a model card (the DP guarantee and dataset counts).",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help: keep literal brackets such as org/name[@revision]
)

_REPO_SPEC = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[^\s@]+)?$")


def _resolve(target: str) -> Path:
    """A local directory / README path as is; ``org/name[@rev]`` through the hub registry."""
    path = Path(target).expanduser()
    if path.exists():
        return path
    if _REPO_SPEC.match(target):
        try:
            from dphub.registry import resolve_model
        except ImportError:
            raise CardError(
                f"{target}: not a local path, and the hub registry is not available to resolve it"
            ) from None
        return Path(resolve_model(target))
    raise CardError(f"{target}: no such model directory or card (nor an org/name repo id)")


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "—"
    return str(value)


@card_app.command("show")
def show(
    target: str = typer.Argument(
        ..., metavar="TARGET", help="Model directory, README.md, or org/name[@revision]."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary fields as JSON."),
) -> None:
    """Print a summary of the card and its plain-language privacy statement."""
    from rich.console import Console
    from rich.table import Table

    from dphub.card import (
        CARD_TEXT_FIELDS,
        CARD_TEXT_KEY,
        LOCAL_ONLY_STATEMENT,
        dp_summary,
        load_card,
    )
    from dphub.privacy.statement import privacy_statement

    card = load_card(_resolve(target))
    summary = dp_summary(card)
    if as_json:
        summary["empirical_audit"] = card.meta.get("empirical_audit")
        typer.echo(json.dumps(summary, indent=2, sort_keys=True))
        return
    table = Table(title="model card", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in summary.items():
        table.add_row(key, format_epsilon(value) if key == "epsilon" else _fmt(value))
    console = Console(highlight=False, soft_wrap=True)
    console.print(table)
    heading = "PRIVACY" if card.private else (
        f"PRIVACY: NOT PRIVATE, {LOCAL_ONLY_STATEMENT.upper()}" if card.local_only
        else "PRIVACY: NOT PRIVATE")
    console.print(f"\n[bold]{heading}[/bold]", markup=True)
    typer.echo(privacy_statement(card.dp, markdown=False))
    if summary.get("eval_privacy"):
        typer.echo(f"\nEVALUATION\n{summary['eval_privacy']}")
    texts = card.meta.get(CARD_TEXT_KEY)
    for key in CARD_TEXT_FIELDS:
        value = texts.get(key) if isinstance(texts, dict) else None
        if isinstance(value, str) and value.strip():
            typer.echo(f"\n{key.replace('_', ' ').upper()} (from the trainer)\n{value.strip()}")
    _print_audit(card, console)


def _print_audit(card: Any, console: Any) -> None:
    """The card's empirical audit beside the proven ε (nothing when the card has none)."""
    block = card.meta.get("empirical_audit")
    if not isinstance(block, dict):
        return
    from dphub.card.audit import describe

    heading = "EMPIRICAL AUDIT (a lower bound, not a proof)"
    if block.get("verdict") == "failed":
        heading = "EMPIRICAL AUDIT: FAILED"
    elif block.get("verdict") == "inconclusive":
        heading = "EMPIRICAL AUDIT: INCONCLUSIVE (it could not have failed at this ε)"
    console.print(f"\n[bold]{heading}[/bold]", markup=True)
    typer.echo(f"proven ε = {format_epsilon(card.epsilon)}; audited lower bound "
               f"ε ≥ {_fmt(block.get('epsilon_lower_bound'))}")
    typer.echo(describe(block, markdown=False))


@card_app.command("validate")
def validate(
    target: str = typer.Argument(
        ..., metavar="TARGET", help="Model directory, README.md, or org/name[@revision]."
    ),
    require_private: bool = typer.Option(
        False, "--require-private", help="Refuse non-private cards, as the publish gate does."
    ),
    accounting: bool = typer.Option(
        True, "--accounting/--no-accounting", help="Recompute ε from the recorded fields."
    ),
) -> None:
    """Check the card against the DP metadata schema and its own accounting fields.

    In a model directory, also what publish checks of the files beside it: allow-listed files,
    the training config, the weights' hash and layout, a public-synthetic claim's record, and
    the encoder against the declared base (when this machine has that base; otherwise a
    warning says it was not checked).
    """
    from dphub.card import LOCAL_ONLY_STATEMENT, dp_summary
    from dphub.hub.validate import validate_card

    card = validate_card(
        _resolve(target), require_private=require_private, check_accounting=accounting
    )
    unchecked = _unchecked(card)
    s = dp_summary(card)
    if s["private"]:
        what = f"private, epsilon={format_epsilon(s['epsilon'])}, delta={_fmt(s['delta'])}, unit={s['unit']}"
    elif s["local_only"]:
        what = f"NOT PRIVATE, {LOCAL_ONLY_STATEMENT}"
    else:
        what = "NOT PRIVATE (trained without DP)"
    checked = "schema + accounting" if accounting and s["private"] else "schema"
    if unchecked is not None:  # a model directory: its files were checked too
        checked += " + model files" + ("" if unchecked else " + base encoder")
    typer.echo(f"valid: {card.path} ({what}; checked {checked})")
    if unchecked:
        typer.echo(f"warning: not checked: {unchecked} (it is neither the embedded encoder nor a "
                   "model pulled to this machine); `dphub publish` refuses the model until it "
                   "can be checked", err=True)


def _unchecked(card: Any) -> str | None:
    """None for a card alone; for a model directory, what could not be checked ('' when
    everything could): the encoder needs the declared base on this machine."""
    from dphub.hub.gate import base_unresolved

    model_dir = card.path.parent if card.path is not None else None
    if model_dir is None or not any(
        (model_dir / n).is_file() for n in ("model.safetensors", "training_config.json")
    ):
        return None
    return base_unresolved(card.meta) or ""


@card_app.command("edit")
def edit(
    model_dir: Path = typer.Argument(..., help="Model directory whose card (README.md) to edit."),
    intended_use: str | None = typer.Option(
        None, "--intended-use", show_default="unchanged", help="What the model is for (free text, at most 4000 chars)."),
    out_of_scope: str | None = typer.Option(
        None, "--out-of-scope", show_default="unchanged", help="Uses the model is not meant for (free text)."),
    limitations: str | None = typer.Option(
        None, "--limitations", show_default="unchanged", help="Known weaknesses, in the trainer's words (free text)."),
    provenance: str | None = typer.Option(
        None, "--provenance", show_default="unchanged", help="Where the training notes come from (free text; no patient "
                                   "details, no paths)."),
) -> None:
    """Set the trainer's free texts of a card ('' removes one); the card is re-validated.

    The same texts come from the [card] section of dphub.toml at training time. dphub's own
    intended-use, out-of-scope and limitation notes always stay in the card.
    """
    from dphub.card import load_card, with_card_text, write_card

    texts = {"intended_use": intended_use, "out_of_scope": out_of_scope,
             "limitations": limitations, "provenance": provenance}
    if all(v is None for v in texts.values()):
        raise CardError("nothing to edit: give --intended-use, --out-of-scope, --limitations "
                        "or --provenance")
    if not model_dir.is_dir():
        raise CardError(f"{model_dir}: not a model directory")
    card = load_card(model_dir)
    meta = with_card_text(card.meta, texts, where="--")
    write_card(model_dir, meta)
    changed = ", ".join(k for k, v in texts.items() if v is not None)
    typer.echo(f"updated {model_dir / 'README.md'} ({changed}; card re-validated)")


def register(app: typer.Typer) -> None:
    """Add the ``card`` command group to the root app."""
    app.add_typer(card_app, name="card")
