"""``dphub review``: the page of a finished de-identification run (issue 40).

Thin: read the run (:func:`dphub.review.run.load_review`), then either write the self-contained
page (``--html``, 0600, with a warning) or serve it on loopback and print its URL with the token.
"""

from __future__ import annotations

from pathlib import Path

import typer

from dphub.cli.options import reads_notes
from dphub.errors import ConfigError


def _need_extra() -> None:
    try:
        import jinja2  # noqa: F401
        import markdown_it  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError("dphub review needs the review extra: pip install 'dphub[review]'") \
            from None


@reads_notes
def review_cmd(
    run_dir: Path = typer.Argument(..., metavar="DIR",
                                   help="The --out DIR of a finished `dphub ensemble deid`."),
    notes: Path = typer.Option(..., "--notes", help="The notes the run read (its INPUT)."),
    gold: Path | None = typer.Option(
        None, "--gold", show_default="none", help="Gold annotations: mark misses and false positives, show scores."),
    html: Path | None = typer.Option(
        None, "--html", metavar="FILE", show_default="serve the page on 127.0.0.1",
        help="Write one self-contained, read-only HTML file (0600; it holds note text) "
             "instead of serving the page."),
    corrections: Path | None = typer.Option(
        None, "--corrections", metavar="FILE",
        show_default="$DPHUB_HOME/review/<run name>-<run identity>.corrections.jsonl",
        help="Where the page saves corrections (labelled notes, JSONL, 0600); never inside DIR."),
    port: int = typer.Option(0, "--port", min=0, max=65535,
                             help="Port on 127.0.0.1 (0: a free one)."),
    fmt: str | None = typer.Option(None, "--format", show_default="the run's, else detected",
                                      help="The notes' format, if not detected."),
    safe_words: Path | None = typer.Option(
        None, "--safe-words", metavar="FILE",
        show_default="site-safe-words.json beside the ensemble manifest, when it exists",
        help="Record the hidden words a reviewer rejects here: site-local safe words for the "
             "inverse rule (JSON, 0600, never published; apply them with `dphub ensemble deid "
             "--safe-words FILE`; docs/review.md)."),
    no_safe_words: bool = typer.Option(False, "--no-safe-words",
                                       help="Record no site-local safe words."),
    manifest_path: Path = typer.Option(
        Path("dphub-ensemble.toml"), "--ensemble", "--manifest", "-e", envvar="DPHUB_ENSEMBLE",
        show_default="dphub-ensemble.toml in the working directory",
        help="The ensemble manifest beside which site-local safe words are kept."),
) -> None:
    """See what a run hid and correct it: a page on 127.0.0.1 (or one HTML file)."""
    _need_extra()
    from dphub.review.corrections import check_corrections_path, default_corrections_path
    from dphub.review.run import load_review

    inputs = [notes] + ([gold] if gold is not None else [])
    if html is not None:
        check_corrections_path(html.with_suffix(".jsonl"), run_dir, inputs)  # same places refused
        if html.suffix.lower() not in (".html", ".htm"):
            raise ConfigError(f"{html}: name the page *.html")
    review = load_review(run_dir, notes, gold_path=gold, fmt=fmt)
    if not review.checked:
        typer.echo(f"warning: {run_dir} recorded no note digests (an older dphub): the notes "
                   "cannot be checked against the text the run read; make sure --notes is its "
                   "input, unchanged", err=True)
    if html is not None:
        from dphub.review.page import write_page

        write_page(review, html)
        typer.echo(f"wrote {html} ({len(review.notes)} notes)")
        typer.echo(f"warning: {html} holds note text (PHI): keep it private (0600), do not "
                   "share or upload it", err=True)
        return
    path = check_corrections_path(
        corrections or default_corrections_path(run_dir, review.run_id), run_dir, inputs)
    site = _safe_words_path(safe_words, no_safe_words, manifest_path, run_dir, inputs)
    from dphub.review.corrections import unwritable
    from dphub.review.server import bind_loopback, make_app, new_token, serve, url

    why = unwritable(path)
    if why is not None:  # the page says so too, at its top: reading works, correcting does not
        typer.echo(f"warning: corrections cannot be saved to {path} ({why}): the page is "
                   "read-only; give --corrections FILE where you can write", err=True)

    token = new_token()
    sock = bind_loopback(port)
    typer.echo(f"review page of {run_dir} ({len(review.notes)} notes), on this machine only:")
    typer.echo(f"  {url(sock, token)}")
    typer.echo(f"corrections are saved to {path}; Ctrl-C stops the server", err=True)
    if site is not None:
        typer.echo(f"rejected words are recorded as site-local safe words in {site} (never "
                   f"published; apply: dphub ensemble deid --safe-words {site})", err=True)
    serve(make_app(review, path, token, safe_words=site), sock)


def _safe_words_path(given: Path | None, off: bool, manifest_path: Path, run_dir: Path,
                     inputs: list[Path]) -> Path | None:
    """Where rejections are recorded: ``--safe-words``, else beside an existing manifest (said
    on stderr), else nowhere; ``--no-safe-words``: nowhere."""
    from dphub.review.safe_words import check_safe_words_path, default_safe_words_path

    if off:
        if given is not None:
            raise ConfigError("--safe-words and --no-safe-words exclude each other")
        return None
    if given is None:
        if not manifest_path.expanduser().is_file():
            return None
        given = default_safe_words_path(manifest_path)
    return check_safe_words_path(given, run_dir, inputs)


def review_hub_cmd(
    html: Path = typer.Option(..., "--html", metavar="FILE", help="Where to write the page."),
    hub: str | None = typer.Option(None, "--hub", show_default="$DPHUB_HUB or the local hub",
                                   help="The hub to list."),
) -> None:
    """The hub, readable: one HTML page of its models (ε, unit, labels, lineage, cards)."""
    _need_extra()
    from dphub.review.hub_page import write_hub_page

    n = write_hub_page(html, hub)
    typer.echo(f"wrote {html} ({n} model(s))")


def register(app: typer.Typer) -> None:
    """Add ``dphub review`` and ``dphub review-hub`` to the root app."""
    app.command("review")(review_cmd)
    app.command("review-hub")(review_hub_cmd)
