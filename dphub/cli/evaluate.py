"""``dphub evaluate``: score predictions (or a model) against gold annotations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from dphub.cli.options import apply_threads, reads_notes, threads_option
from dphub.errors import ConfigError, InputError


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def print_result(result: dict[str, Any], console: Console, *, title: str = "evaluation") -> None:
    """Rich tables for an :meth:`EvaluationResult.to_dict` (shared with ``ensemble evaluate``)."""
    tok = result["token"]
    phr = result["phrase_recall"]
    util = result["utility"]
    t = Table(title=f"{title}: {result['notes']} notes, {result['gold_phrases']} gold phrases")
    for col in ("metric", "P", "R", "F1"):
        t.add_column(col, justify="right" if col != "metric" else "left")
    t.add_row("token-binary", _pct(tok["precision"]), _pct(tok["recall"]), _pct(tok["f1"]))
    for name in ("strict", "relaxed"):
        e = result["entity_binary"][name]
        t.add_row(f"entity {name} (any label)", _pct(e["precision"]), _pct(e["recall"]),
                  _pct(e["f1"]))
    for name in ("entity_strict", "entity_relaxed"):
        for avg in ("micro", "macro"):
            e = result[name][avg]
            t.add_row(f"{name.replace('_', ' ')} {avg}", _pct(e["precision"]),
                      _pct(e["recall"]), _pct(e["f1"]))
    console.print(t)
    c = Table(title="per category")
    for col in ("category", "phrases", "recall any", "recall full", "strict F1", "relaxed F1"):
        c.add_column(col, justify="right" if col != "category" else "left")
    for cat, v in phr["per_category"].items():
        s = result["entity_strict"]["per_category"].get(cat, {})
        r = result["entity_relaxed"]["per_category"].get(cat, {})
        c.add_row(cat, str(v["phrases"]), _pct(v["any_overlap"]), _pct(v["full_cover"]),
                  _pct(s.get("f1", 0.0)), _pct(r.get("f1", 0.0)))
    c.add_row("ALL", str(phr["phrases"]), _pct(phr["any_overlap"]), _pct(phr["full_cover"]),
              _pct(result["entity_strict"]["micro"]["f1"]),
              _pct(result["entity_relaxed"]["micro"]["f1"]))
    console.print(c)
    console.print(
        f"utility: BLEU {util['bleu']:.1f}, non-PHI tokens kept {_pct(util['non_phi_tokens_kept'])}%"
        f"; leaks (gold phrases not fully covered): {len(result['leaks'])}"
    )


@reads_notes
def evaluate_cmd(
    gold: Path = typer.Option(..., "--gold", help="Gold annotations (any supported format)."),
    pred: Path | None = typer.Option(
        None, "--pred", show_default="none: give --pred or --model",
        help="Predicted spans: the output of `deid --mode spans` (its directory or file), or any "
        "labelled corpus. Tagged/redacted text is refused: it has no offsets to score.",
    ),
    model: Path | None = typer.Option(
        None, "--model", show_default="none: give --pred or --model",
        help="A model directory to run on the gold texts instead of --pred.",
    ),
    gold_format: str | None = typer.Option(
        None, "--gold-format", show_default="detect from the path", help="Format of --gold."
    ),
    pred_format: str | None = typer.Option(
        None, "--pred-format", show_default="detect from the path", help="Format of --pred."
    ),
    pred_text: Path | None = typer.Option(
        None, "--pred-text", show_default="none",
        help="Note texts for span-only predictions (deid.pl .phi files).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    out: Path | None = typer.Option(
        None, "--out", "-o", show_default="none", help="Also write the JSON result here."
    ),
    show_leaks: bool = typer.Option(
        False, "--show-leaks", help="Print the text of missed PHI (the only command that may)."
    ),
    ignore_extra: bool = typer.Option(
        False, "--ignore-extra", help="Skip predicted notes that have no gold counterpart."
    ),
    write_card: bool = typer.Option(
        False, "--write-card", help="Record the results in the --model's card."
    ),
    dataset_name: str | None = typer.Option(
        None, "--dataset-name", show_default="the --gold file name",
        help="Name of the evaluation data for the card (no paths).",
    ),
    threads: int | None = threads_option(),
) -> None:
    """Score predictions against gold: token-binary, entity, phrase recall, leaks, utility."""
    from dphub import formats
    from dphub.evaluate import check_gold, evaluate_spans, looks_like_predictions, read_predictions
    from dphub.io import atomic_write_text

    if (pred is None) == (model is None):
        raise ConfigError("give exactly one of --pred or --model")
    if write_card and model is None:
        raise ConfigError("--write-card needs --model")
    apply_threads(threads)
    if looks_like_predictions(gold):  # issue 56: say so, not "cannot detect the corpus format"
        raise InputError(
            f"{gold}: --gold holds a `dphub deid` output (predictions), not labelled "
            f"notes{': are --gold and --pred swapped?' if pred is not None else ''}"
        )
    gold_notes = list(formats.read(gold, format=gold_format))
    check_gold(gold, gold_notes, pred=pred)
    if model is not None:
        from dphub.progress import ProgressReporter
        from dphub.tagger import Tagger

        tagger = Tagger.load(model)
        spans: list[Any] = []
        with ProgressReporter() as reporter:
            on_count = reporter.count_callback("evaluate", "notes")
            for i in range(0, len(gold_notes), 64):  # chunks only to report progress
                spans.extend(tagger.tag(gold_notes[i : i + 64]))
                on_count(len(spans), len(gold_notes))
        by_id = {n.id: s for n, s in zip(gold_notes, spans, strict=True)}
    else:
        assert pred is not None
        by_id = read_predictions(pred, format=pred_format, text_path=pred_text)
    result = evaluate_spans(gold_notes, by_id, show_leaks=show_leaks, ignore_extra=ignore_extra)
    data = result.to_dict()
    if result.missing_predictions:
        typer.echo(
            f"warning: {result.missing_predictions} gold note(s) had no predictions "
            "(counted as all missed)",
            err=True,
        )
    if out is not None:
        atomic_write_text(out, json.dumps(data, indent=2) + "\n")
    if write_card and model is not None:
        from dphub.card import add_evaluation

        add_evaluation(model, data, dataset_name or gold.name)
    if json_out:
        typer.echo(json.dumps(data, indent=2))
        return
    console = Console()
    print_result(data, console)
    if show_leaks and result.leaks:
        t = Table(title="leaks")
        for col in ("note", "start", "end", "category", "covered", "text"):
            t.add_column(col)
        for leak in result.leaks:
            t.add_row(leak.note_id, str(leak.start), str(leak.end), leak.category,
                      f"{100 * leak.covered:.0f}%", leak.text or "")
        console.print(t)


def register(app: typer.Typer) -> None:
    """Add ``dphub evaluate`` to the root app."""
    app.command("evaluate")(evaluate_cmd)
