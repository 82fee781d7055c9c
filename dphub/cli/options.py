"""Option helpers shared by every command module: finite numbers and ``--threads``.

Why a parser instead of plain ``float`` options: click and pydantic both accept ``nan`` and
``inf`` as floats, and range checks (``min=``) let NaN through because every comparison with NaN
is false. A NaN ε bound made ``pull --max-epsilon nan`` accept any model (the ε policy failed
open), and ``--lr nan`` trained for half a minute before failing. :func:`finite_float` refuses
such values at parse time, as a usage error (exit 2).
"""

from __future__ import annotations

import functools
import inspect
import math
import os
from collections.abc import Callable
from typing import Any, TypeVar

import typer

__all__ = ["FLOAT", "MAX_THREADS", "apply_threads", "finite_float", "reads_notes",
           "threads_option"]

#: metavar of the options parsed by :func:`finite_float`
FLOAT = "<float>"


def finite_float(
    *,
    min: float | None = None,
    max: float | None = None,
    min_open: bool = False,
    max_open: bool = False,
) -> Callable[[Any], float]:
    """A Typer ``parser`` that accepts only finite floats within the given bounds.

    ``min_open``/``max_open`` make the bound exclusive (``min=0, min_open=True``: positive). The
    returned callable raises :class:`ValueError`, which Typer (vendored click or click) turns into
    a usage error naming the option.
    """

    def parse(value: Any) -> float:
        if isinstance(value, bool):  # bool is an int subclass: not a number here
            raise ValueError(f"{value!r} is not a number")
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{value!r} is not a number") from None
        if not math.isfinite(x):
            raise ValueError(f"{value!r} is not a finite number")
        if min is not None and (x <= min if min_open else x < min):
            raise ValueError(f"{value!r} must be {'>' if min_open else '>='} {min:g}")
        if max is not None and (x >= max if max_open else x > max):
            raise ValueError(f"{value!r} must be {'<' if max_open else '<='} {max:g}")
        return x

    parse.__name__ = "finite_float"
    return parse


#: positive finite floats (noise, ε, learning rate, clipping bound, epochs ...)
positive_float = finite_float(min=0.0, min_open=True)
#: probabilities and thresholds in [0, 1]
unit_interval = finite_float(min=0.0, max=1.0)


#: Largest ``--threads``: the machine's CPU count, but at least 64 (a script written for a bigger
#: machine still runs). Why a bound: more threads than cores only slow torch down, and far more
#: exhaust the process: ``--threads 100000`` created 32k threads and then segfaulted (or hit a
#: Rust allocation failure that ignored SIGTERM), 30000 failed inside libgomp.
MAX_THREADS = max(os.cpu_count() or 1, 64)


def threads_option(*names: str, help: str = "CPU threads for torch (intra-op parallelism)."
                   ) -> Any:
    """``--threads N`` (1..:data:`MAX_THREADS`): torch intra-op CPU threads for commands that run
    a model. ``names``: further spellings of the option (``--workers``)."""
    return typer.Option(
        None,
        "--threads",
        *names,
        min=1,
        max=MAX_THREADS,
        show_default="all cores",
        help=help,
    )


def apply_threads(threads: int | None) -> None:
    """Apply ``--threads`` before any model runs (torch is imported only when it is given)."""
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)


F = TypeVar("F", bound=Callable[..., Any])

#: The reading options every command that reads notes takes (issue 56), as (parameter, option).
_READING_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("encoding", typer.Option(
        None, "--encoding", metavar="CODEC", show_default="utf-8",
        help="Text encoding of the notes (e.g. cp1252, latin-1); a note that does not decode "
             "is refused with its file and line.")),
    ("text_column", typer.Option(
        None, "--text-column", metavar="NAME", show_default="text, note_text, TEXT ...",
        help="CSV/TSV input: the column holding the note text.")),
    ("id_column", typer.Option(
        None, "--id-column", metavar="NAME", show_default="id, note_id, row_id ..., else the "
        "record number", help="CSV/TSV input: the column holding the note id.")),
    ("patient_column", typer.Option(
        None, "--patient-column", metavar="NAME", show_default="patient_id, subject_id, "
        "person_id ..., else none", help="CSV/TSV input: the column holding the patient id.")),
)


def reads_notes(func: F) -> F:
    """Give a command that reads notes ``--encoding`` and the CSV column options, in force (see
    :func:`dphub.formats.reading`) while it runs.

    Why a decorator: the options must reach every reader behind a dozen commands (train, deid,
    evaluate, data ...) through layers that pass only a path and a format; declaring them once
    keeps their names, help and behaviour the same everywhere.
    """
    sig = inspect.signature(func)
    names = [name for name, _ in _READING_OPTIONS]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from dphub.formats import reading

        settings = {name: kwargs.pop(name, None) for name in names}
        with reading(**settings):
            return func(*args, **kwargs)

    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                               annotation=str | None) for name, option in _READING_OPTIONS]
    wrapper.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[*sig.parameters.values(), *extra])
    wrapper.__annotations__ = {**getattr(func, "__annotations__", {}),
                               **dict.fromkeys(names, str | None)}
    return wrapper  # type: ignore[return-value]
