"""`dphub data synth|split|stats`: make, split and count corpora.

Thin on purpose: parse options, call :mod:`dphub.synth`, :mod:`dphub.splits` or
:mod:`dphub.stats`, print counts. Nothing printed here ever contains note text.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dphub.cli.options import reads_notes
from dphub.errors import ConfigError

data_app = typer.Typer(
    name="data",
    help="Synthetic notes, patient-disjoint splits and corpus statistics.",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help: keep literal brackets
)


@data_app.command("synth")
def synth(
    n: int = typer.Option(500, "--n", min=1, help="Number of notes."),
    kind: str = typer.Option(
        "nursing", "--kind",
        help="Note kind: nursing | discharge | realistic-nursing | realistic-discharge."),
    seed: int = typer.Option(0, "--seed", help="Same seed, byte-identical output."),
    patients: int | None = typer.Option(
        None, "--patients", min=1, show_default="a few notes each",
        help="Number of distinct patients."
    ),
    out: str = typer.Option(..., "--out", "-o", help="Output JSONL file, or - for stdout."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
) -> None:
    """Write Faker-based synthetic labelled notes (JSONL, i2b2-2014 labels)."""
    from dphub import formats
    from dphub.synth import iter_notes

    if out != "-" and Path(out).is_dir():
        # --force replaces a file, never a directory (it may hold anything, inputs included)
        raise ConfigError(f"{out}: is a directory; --out takes a JSONL file name (or -)")
    if out != "-" and Path(out).exists() and not force:
        raise ConfigError(f"{out} already exists (use --force to overwrite)")
    notes = iter_notes(n, kind=kind, seed=seed, patients=patients)
    if out == "-":
        # Same bytes as a file output: write through the formats layer, then copy to stdout.
        with tempfile.TemporaryDirectory(prefix="dphub-synth-") as tmp:
            path = Path(tmp) / "synth.jsonl"
            formats.write(notes, path, "jsonl")
            with open(path, "rb") as fh:
                sys.stdout.flush()
                shutil.copyfileobj(fh, sys.stdout.buffer)
                sys.stdout.buffer.flush()
        return
    written = formats.write(notes, Path(out), "jsonl", overwrite=force)
    typer.echo(f"wrote {written} {kind} notes to {out}", err=True)


@data_app.command("split")
@reads_notes
def split(
    path: Path = typer.Argument(..., metavar="PATH", help="Corpus file or directory."),
    by: str = typer.Option("patient", "--by", help="Split unit: patient | note."),
    ratios: str = typer.Option("0.8,0.2", "--ratios", help="Comma-separated, summing to 1."),
    seed: int = typer.Option(0, "--seed", help="Same seed, same split."),
    out: Path = typer.Option(..., "--out", "-o", help="Output directory."),
    names: str | None = typer.Option(
        None, "--names", show_default="split-0,split-1,...",
        help="Comma-separated part names, e.g. train,test."
    ),
    format: str | None = typer.Option(
        None, "--format", "-f", show_default="detect from the path", help="Input format."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite existing part files."),
) -> None:
    """Split a corpus into patient-disjoint JSONL parts."""
    from dphub.splits import parse_ratios, split_corpus

    parts = split_corpus(
        path,
        out,
        parse_ratios(ratios),
        by=by,
        seed=seed,
        names=names.split(",") if names is not None else None,
        format=format,
        force=force,
    )
    unit = "patients" if by == "patient" else "notes"
    for part in parts:
        typer.echo(f"{part.path}: {part.notes} notes, {part.units} {unit}")


@data_app.command("stats")
@reads_notes
def stats(
    path: Path = typer.Argument(..., metavar="PATH", help="Corpus file or directory."),
    format: str | None = typer.Option(
        None, "--format", "-f", show_default="detect from the path", help="Input format."
    ),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", show_default="no word-piece count",
        help="Count word pieces with this tokenizer (a model directory or 'default').",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Count notes, patients, PHI phrases per category and label, characters, word pieces."""
    from dphub.stats import corpus_stats

    st = corpus_stats(path, format=format, tokenizer=tokenizer,
                      count_word_pieces=tokenizer is not None)
    if as_json:
        typer.echo(json.dumps(st.to_dict(), indent=2))
        return
    console = Console()
    table = Table(title=f"corpus statistics: {escape(str(path))}", show_header=True)
    table.add_column("measure")
    table.add_column("count", justify="right")
    table.add_row("notes", f"{st.notes:,}")
    table.add_row("labelled notes", f"{st.labelled_notes:,}")
    table.add_row("patients", f"{st.patients:,}")
    if st.notes_without_patient:
        table.add_row("notes without patient id", f"{st.notes_without_patient:,}")
    table.add_row("characters", f"{st.characters:,}")
    if st.word_pieces is not None:
        table.add_row(f"word pieces ({st.tokenizer})", f"{st.word_pieces:,}")
    table.add_row("PHI phrases", f"{st.phi_phrases:,}")
    table.add_row("PHI characters", f"{st.phi_characters:,}")
    for cat, c in st.phi_per_category.items():
        table.add_row(f"  category {cat}", f"{c:,}")
    for lab, c in st.phi_per_label.items():
        table.add_row(f"  label {lab}", f"{c:,}")
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add the ``data`` command group to the root app."""
    app.add_typer(data_app, name="data")
