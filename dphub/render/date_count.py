"""``--date-count note|none``: fewer date mentions, so a patient's notes do not count their dates.

Why: a date rendered in place ("[**DATE**]", a mask, a surrogate) still shows that a date was
there, and the number of date mentions of a patient's notes is nearly unique: counting
``[**DATE**]`` tags alone re-links about a third of patients in ``benchmarks/date_linkage.py``,
at any ``--date-epsilon``. ``note`` renders the first date of each note as its mode does and
removes every later date mention of the note (its text becomes empty; the words around it stay);
``none`` removes every date mention. Both are deterministic and spend no ε. What stays visible:
with ``note``, whether a note has a date, where its first one is and (with surrogates) that date;
with both, the words around a removed mention ("from ... to") that tell a reader a date was there,
and the number of notes per patient, which no date option hides (docs/surrogates.md gives the
linkage figures of each).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from dphub.errors import ConfigError
from dphub.labels import category_of
from dphub.notes import Note, Span
from dphub.render.base import prepare_spans

__all__ = ["DATE_COUNTS", "DATE_COUNT_MECHANISMS", "check_date_count", "describe",
           "fewer_dates"]

#: the values of ``--date-count``: every mention, the first of each note, none
DATE_COUNTS = ("keep", "note", "none")
#: what run.json and the audit name for each value but ``keep``, and how many mentions of a note
#: stay
DATE_COUNT_MECHANISMS = {"note": ("one-date-mention-per-note", 1),
                         "none": ("no-date-mention", 0)}
#: the output modes that write note text (the others write spans: no count to hide there)
TEXT_MODES = ("tag", "redact", "surrogate")


def check_date_count(value: str, mode: str) -> None:
    """ConfigError unless ``value`` is a ``--date-count`` that ``mode`` can apply."""
    if value not in DATE_COUNTS:
        raise ConfigError(f"unknown --date-count {value!r}; choose one of {', '.join(DATE_COUNTS)}")
    if value != "keep" and mode not in TEXT_MODES:
        raise ConfigError(f"--date-count {value} applies to --mode {', '.join(TEXT_MODES)} only")


def describe(value: str) -> dict[str, object]:
    """The record of ``--date-count note|none`` for run.json and the audit (ε 0: deterministic)."""
    first = "whether a note has a date, where its first date is (and its surrogate), " \
        if value == "note" else ""
    return {
        "mechanism": DATE_COUNT_MECHANISMS[value][0],
        "epsilon": 0.0,
        "left_visible": first + "the words around removed mentions, the number of notes per "
                                "patient",
    }


def fewer_dates(note: Note, spans: Sequence[Span], value: str) -> tuple[Note, list[Span]]:
    """The note without the text of its date mentions past the first (``note``) or all of them
    (``none``), and its spans moved to match (merged and sorted; the input is not changed)."""
    merged = prepare_spans(note, spans)
    dates = [s for s in merged if category_of(s.label) == "DATE"]
    dropped = {(s.start, s.end) for s in dates[DATE_COUNT_MECHANISMS[value][1]:]}
    if not dropped:
        return note, merged
    pieces: list[str] = []
    kept: list[Span] = []
    pos = removed = 0
    for s in merged:
        pieces.append(note.text[pos : s.start])
        pos = s.end
        if (s.start, s.end) in dropped:
            removed += s.end - s.start
            continue
        pieces.append(note.text[s.start : s.end])
        kept.append(replace(s, start=s.start - removed, end=s.end - removed))
    pieces.append(note.text[pos:])
    return replace(note, text="".join(pieces), spans=[]), kept
