"""`dphub ledger show`: what the releases made here spent on a dataset's patients.

Thin: read the notes (when a DATA path is given), ask :mod:`dphub.privacy.ledger`, print. Prints
digests (keyed, local), kinds, ε, δ, units and counts of patients and notes; never a patient id
or note text. The last line of each dataset is the figure a privacy officer signs: ε per patient
composed over every linked release, or NOT BOUNDED and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dphub.cli.options import reads_notes
from dphub.privacy.statement import format_epsilon

if TYPE_CHECKING:
    from dphub.privacy.ledger import Spend

ledger_app = typer.Typer(
    name="ledger",
    help="The site-local privacy ledger: every DP release computed from a dataset here.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@ledger_app.command("show")
@reads_notes
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
        spends = [L.dataset_spend(book, L.footprint(list(formats.read(data, format))))]
    else:
        spends = L.all_datasets(book)
    if not spends:
        typer.echo(f"no release recorded in {L.ledger_dir()}")
        return
    for s in spends:
        notes = f", {len(s.footprint.notes)} notes" if s.footprint.notes else ""
        typer.echo(f"dataset {s.dataset[:12]} ({s.patients} patients{notes})")
        for rec, shared in s.releases:
            parents = ""
            if rec.parents:
                how = "from" if rec.composes_parents else "from (declared disjoint, not composed)"
                parents = f", {how} {','.join(p[:12] for p in rec.parents)}"
            group = f" (≤ {rec.group_size} per patient)" if (
                rec.privacy_unit not in (L.PATIENT_UNIT,) and rec.group_size) else ""
            typer.echo(f"  {rec.release[:12]}  {rec.kind:<15} ε = {format_epsilon(rec.epsilon)}, "
                       f"δ = {rec.delta:.2g}, unit {rec.privacy_unit}{group}, "
                       f"{shared.describe(s.footprint)}{parents}")
        typer.echo(_total_line(s.spend))


def _total_line(spend: Spend) -> str:
    """The figure: the patient-level composition, or why there is none, and what it leaves
    out (DP surrogates' metric ε)."""
    lines = []
    if spend.unbounded:
        units = "/".join(sorted({r.privacy_unit for r in spend.unbounded}))
        lines.append(f"  spent per patient: NOT BOUNDED ({len(spend.unbounded)} {units}-level "
                     "release(s): group size unknown, or too large for group privacy)")
        if spend.total is not None:
            lines.append(f"  the patient-level releases alone: ε = {format_epsilon(spend.total.epsilon)}, "
                         f"δ = {spend.total.delta:.2g}")
    elif spend.total is not None:
        t = spend.total
        lines.append(f"  spent: ε = {format_epsilon(t.epsilon)}, δ = {t.delta:.2g} per patient "
                     f"({t.method} composition of {len(spend.parts)} release(s); basic sum "
                     f"ε = {format_epsilon(t.basic_epsilon)})")
    elif not spend.metric:
        lines.append("  no release used these patients")
    if spend.metric:
        lines.append(f"  not composed: {len(spend.metric)} DP surrogate release(s), ε per day, "
                     "year or km (docs/surrogates.md)")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add the ``ledger`` group to the root app."""
    app.add_typer(ledger_app)
