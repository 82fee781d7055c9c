"""`dphub ledger show`: what the releases made here spent on a dataset's patients.

Thin: read the notes (when a DATA path is given), ask :mod:`dphub.privacy.ledger`, print. Prints
digests (keyed, local), kinds, ε, δ and counts of patients; never a patient id or note text.
"""

from __future__ import annotations

from pathlib import Path

import typer

ledger_app = typer.Typer(
    name="ledger",
    help="The site-local privacy ledger: every DP release computed from a dataset here.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@ledger_app.command("show")
def show(
    data: Path | None = typer.Argument(
        None, metavar="[DATA]", show_default="every dataset recorded",
        help="Notes whose patients' spend to show."),
    format: str | None = typer.Option(None, "--format", "-f", show_default="detect from the path",
                                      help="Input format of DATA."),
) -> None:
    """List the releases that used a dataset's patients and their composed (ε, δ)."""
    from dphub import formats
    from dphub.privacy import ledger as L

    book = L.load_ledger()
    if data is not None:
        spends = [L.dataset_spend(book, L.patient_digests(formats.read(data, format)))]
    else:
        spends = L.all_datasets(book)
    if not spends:
        typer.echo(f"no release recorded in {L.ledger_dir()}")
        return
    for s in spends:
        typer.echo(f"dataset {s.dataset[:12]} ({s.patients} patients)")
        for rec, shared in s.releases:
            parents = f", from {','.join(p[:12] for p in rec.parents)}" if rec.parents else ""
            typer.echo(f"  {rec.release[:12]}  {rec.kind:<15} ε = {rec.epsilon:.4g}, "
                       f"δ = {rec.delta:.2g}, unit {rec.privacy_unit}, {shared} of these "
                       f"patients{parents}")
        if s.total is None:
            typer.echo("  no release used these patients")
        else:
            typer.echo(f"  spent: ε = {s.total.epsilon:.4g}, δ = {s.total.delta:.2g} "
                       f"({s.total.method} composition; basic sum ε = "
                       f"{s.total.basic_epsilon:.4g})")


def register(app: typer.Typer) -> None:
    """Add the ``ledger`` group to the root app."""
    app.add_typer(ledger_app)
