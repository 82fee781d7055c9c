"""Entry point of the ``dphub`` console script.

Command groups live in one module each (``dphub.cli.data`` ...) and expose ``register(app)``.
``main`` maps every outcome to one exit code:

* :class:`~dphub.errors.DphubError` -> one ``error:`` line, its exit code (2, or 3);
* an ``OSError`` the user must fix that no command turned into a DphubError (a read-only file
  system, no permission, a full disk: :data:`_USER_ERRNOS`) -> one ``error:`` line naming the
  path, exit 2: it is the environment, not a bug, and needs no crash log;
* a usage error (unknown command or option, missing argument, a value that does not parse) -> the
  command's usage line and one ``error:`` line, exit 2, no crash-log (it is not a crash);
* Ctrl-C -> one ``interrupted`` line, exit 130;
* anything else -> a short message plus the path of a private log file holding the traceback:
  no traceback (which might quote note text) ever reaches the terminal.

Why ``main`` parses and invokes the command itself instead of calling ``app(...)``: Typer's own
driver turns Ctrl-C into a silent ``Exit(130)`` and, since Typer 0.2x, raises the usage errors of
the click copy it vendors (``typer._click``), which are not ``click.ClickException``. Driving
``make_context``/``invoke`` here keeps every exception in our hands, whichever Typer/click pair is
installed: both exception families are recognised (:data:`_USAGE_ERRORS`).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from dphub import __version__
from dphub.errors import DphubError
from dphub.io import DISK_FULL_ERRNOS, UNWRITABLE_ERRNOS, os_error_message


def _exception_families() -> tuple[tuple[type[BaseException], ...], ...]:
    """(usage errors, other click errors, exits, aborts) of every click the CLI may meet.

    Typer >= 0.2x vendors click as ``typer._click`` (its classes derive from
    ``typer.exceptions.TyperException``); older Typer uses the real ``click``. Both may be
    installed at once, so both families are collected.
    """
    usage: list[type[BaseException]] = []
    other: list[type[BaseException]] = []
    exits: list[type[BaseException]] = [typer.Exit]
    aborts: list[type[BaseException]] = [typer.Abort]
    try:
        from typer._click import exceptions as vendored  # type: ignore[import-not-found]

        usage.append(vendored.UsageError)
        other.append(vendored.ClickException)
    except ImportError:  # a Typer that uses the real click
        pass
    try:
        import click

        usage.append(click.UsageError)
        other.append(click.ClickException)
        exits.append(click.exceptions.Exit)
        aborts.append(click.exceptions.Abort)
    except ImportError:  # a Typer that vendors click, without click installed
        pass
    return tuple(usage), tuple(other), tuple(exits), tuple(aborts)


_USAGE_ERRORS, _CLICK_ERRORS, _EXITS, _ABORTS = _exception_families()

app = typer.Typer(
    name="dphub",
    help="Train, publish, pull and ensemble differentially private PHI taggers.",
    no_args_is_help=True,
    add_completion=False,
    # Rich tracebacks with locals could print note text: never.
    pretty_exceptions_enable=False,
    # Plain help text: rich markup would eat literal brackets such as `org/name[@revision]`.
    rich_markup_mode=None,
    # `-h` as well as `--help`, on every command (click passes it down to sub-contexts).
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Typer escapes the "[default: ...]" of every option for rich's HTML export whenever rich is
# installed, even with rich_markup_mode=None, so plain help showed "\[default: ...]". Plain help
# is what we render: tell Typer's help builder that rich is not in use (its only other uses are the
# rich renderers, which rich_markup_mode=None already bypasses).
typer.core.HAS_RICH = False


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
    from dphub.cli import (
        audit,
        card,
        data,
        ensemble,
        evaluate,
        hub,
        ledger,  # issue 38: the privacy ledger
        pretrain,
        review,  # issue 40: the review page
        train,
    )

    for module in (data, evaluate, train, pretrain, audit, card, hub, ensemble, ledger, review):
        module.register(app)
    from dphub.cli import federate  # issue 27: Flower itself is imported only when a command runs

    federate.register(app)


_register_all()


def _crash_log(exc: BaseException) -> Path:
    fd, name = tempfile.mkstemp(prefix="dphub-crash-", suffix=".log")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:  # mkstemp creates it 0600
        fh.write("".join(traceback.format_exception(exc)))
    return Path(name)


def _crashed(e: BaseException) -> int:
    """Report an unexpected exception: one line with the path of its private crash log; 1."""
    log = _crash_log(e)
    typer.echo(f"error: unexpected {type(e).__name__}; details (may include data) in {log}",
               err=True)
    return 1


#: errno values of an ``OSError`` that is the user's to fix (see the module docstring)
_USER_ERRNOS = DISK_FULL_ERRNOS | UNWRITABLE_ERRNOS


def _invoke(argv: list[str] | None) -> Any:
    """Parse ``argv`` and run the command; exceptions propagate unchanged to :func:`main`."""
    command = typer.main.get_command(app)
    args = sys.argv[1:] if argv is None else list(argv)
    with command.make_context("dphub", args) as ctx:
        return command.invoke(ctx)


def _show_usage_error(e: BaseException) -> None:
    """The command's usage line, then one ``error:`` line (no colours, no rich panels)."""
    ctx = getattr(e, "ctx", None)
    if type(e).__name__ == "NoArgsIsHelpError":
        # `dphub data` alone: the group's help is the most useful answer.
        typer.echo(ctx.get_help() if ctx is not None else str(e), err=True)
        return
    if ctx is not None:
        typer.echo(ctx.get_usage(), err=True)
    message = e.format_message() if hasattr(e, "format_message") else str(e)
    message = " ".join(str(message).split())  # one line, whatever the formatter wrapped
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    typer.echo(f"error: {message}{hint}", err=True)


class _Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or ``kill``'s stop) raised as an interrupt, so that every
    ``finally`` runs: temporary directories of note text are removed and half-written outputs
    discarded, exactly as on Ctrl-C; a checkpointed job resumes from its last checkpoint."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated()


def _handle_sigterm() -> Callable[[], None]:
    """Turn SIGTERM into :class:`_Terminated` (main thread only; a handler someone else set —
    an embedding program — is left alone). Returns what puts the previous handler back."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        return lambda: None
    signal.signal(signal.SIGTERM, _raise_terminated)
    return lambda: signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns (and exits with) the process exit code."""
    from dphub.progress import mark_command_start

    mark_command_start()  # progress lines count elapsed time from here
    restore_sigterm = _handle_sigterm()
    try:
        rv = _invoke(argv)
        code = rv if isinstance(rv, int) else 0
    except DphubError as e:
        typer.echo(f"error: {e.message}", err=True)
        code = e.exit_code
    except _EXITS as e:
        code = int(getattr(e, "exit_code", 0) or 0)
    except _ABORTS as e:  # click turns an interrupt inside a command into Abort
        terminated = isinstance(e.__cause__ or e.__context__, _Terminated)
        typer.echo("terminated" if terminated else "aborted", err=True)
        code = 143 if terminated else 130
    except _USAGE_ERRORS as e:
        _show_usage_error(e)
        code = 2
    except _CLICK_ERRORS as e:
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        typer.echo(f"error: {' '.join(str(message).split())}", err=True)
        code = int(getattr(e, "exit_code", 1) or 1)
    except _Terminated:
        typer.echo("terminated", err=True)
        code = 143
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        code = 130
    except OSError as e:
        if e.errno not in _USER_ERRNOS:
            code = _crashed(e)
        else:
            typer.echo(f"error: {os_error_message(e)}", err=True)
            code = 2
    except Exception as e:  # noqa: BLE001 - last-resort guard; details go to a private log file
        code = _crashed(e)
    finally:  # also when something escapes the handlers above (SystemExit from a callback)
        restore_sigterm()
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
