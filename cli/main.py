"""Entry point of the ``dphub`` console script.

Command groups live in one module each (``dphub.cli.data`` ...) and expose ``register(app)``.
``main`` maps :class:`~dphub.errors.DphubError` to one ``error:`` line and its exit code, and any
other exception to a short message plus the path of a private log file holding the traceback:
no traceback (which might quote note text) ever reaches the terminal.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import traceback
from pathlib import Path

import click
import typer

from dphub import __version__
from dphub.errors import DphubError

app = typer.Typer(
    name="dphub",
    help="Train, publish, pull and ensemble differentially private PHI taggers.",
    no_args_is_help=True,
    add_completion=False,
    # Rich tracebacks with locals could print note text: never.
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dphub {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress details to stderr."),
) -> None:
    """dphub: share DP de-identification models without sharing patients."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


def _register_all() -> None:
    from dphub.cli import audit, card, data, ensemble, evaluate, hub, train

    for module in (data, evaluate, train, audit, card, hub, ensemble):
        module.register(app)


_register_all()


def _crash_log(exc: BaseException) -> Path:
    fd, name = tempfile.mkstemp(prefix="dphub-crash-", suffix=".log")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:  # mkstemp creates it 0600
        fh.write("".join(traceback.format_exception(exc)))
    return Path(name)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns (and exits with) the process exit code."""
    try:
        rv = app(args=argv, standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except DphubError as e:
        typer.echo(f"error: {e.message}", err=True)
        code = e.exit_code
    except click.exceptions.Exit as e:
        code = e.exit_code
    except click.exceptions.Abort:
        typer.echo("aborted", err=True)
        code = 130
    except click.ClickException as e:
        e.show()
        code = e.exit_code
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        code = 130
    except Exception as e:  # noqa: BLE001 - last-resort guard; details go to a private log file
        log = _crash_log(e)
        typer.echo(
            f"error: unexpected {type(e).__name__}; details (may include data) in {log}",
            err=True,
        )
        code = 1
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
