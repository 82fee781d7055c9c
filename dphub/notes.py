"""The one currency of dphub: notes and character-offset spans.

Tokenizers, windows and BIOES tags exist only inside a tagger; everything between stages is a
:class:`Note` (its text and gold spans, if any) or a list of :class:`Span` predictions. Offsets are
Python string indices (code points) into ``Note.text``, end-exclusive.

Messages raised from here name the note id and offsets, never the text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dphub.errors import InputError
from dphub.labels import category_of


@dataclass(frozen=True, slots=True, order=True)
class Span:
    """A labelled character range ``[start, end)`` of a note.

    ``score`` is a model's confidence (None for gold or rules without one); ``source`` names the
    member or file that produced it.
    """

    start: int
    end: int
    label: str
    score: float | None = field(default=None, compare=False)
    source: str | None = field(default=None, compare=False)

    @property
    def category(self) -> str:
        """The HIPAA category of the label (``NAME``, ``DATE`` ...)."""
        return category_of(self.label)

    def with_label(self, label: str) -> Span:
        return replace(self, label=label)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"start": self.start, "end": self.end, "label": self.label}
        if self.score is not None:
            d["score"] = self.score
        if self.source is not None:
            d["source"] = self.source
        return d


@dataclass(slots=True)
class Note:
    """A clinical note: id, text, the patient it belongs to, metadata, and gold spans.

    ``spans`` holds gold annotations when the source carries them (empty for unlabelled input;
    ``labelled`` tells the two apart). ``patient_id`` is the privacy unit for patient-level DP; when
    a format has none, readers leave it None and callers decide (see ``effective_patient_id``).
    """

    id: str
    text: str
    patient_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    labelled: bool = False

    @property
    def effective_patient_id(self) -> str:
        """The patient id, or the note id when the source has no patients (one note = one unit)."""
        return self.patient_id if self.patient_id is not None else self.id

    def span_text(self, span: Span) -> str:
        return self.text[span.start : span.end]


def check_spans(
    spans: Sequence[Span],
    text_length: int,
    *,
    where: str,
    allow_overlap: bool = False,
) -> list[Span]:
    """Validate gold spans and return them sorted.

    Raises :class:`InputError` naming ``where`` (file, line or note id) and the offsets for spans
    that are zero-length, out of bounds, carry an unknown label, or overlap (unless allowed).
    """
    out = sorted(spans, key=lambda s: (s.start, s.end))
    prev: Span | None = None
    for s in out:
        if not isinstance(s.start, int) or not isinstance(s.end, int):
            raise InputError(f"{where}: span offsets must be integers")
        if s.start < 0 or s.end > text_length:
            raise InputError(
                f"{where}: span {s.start}-{s.end} lies outside the text (length {text_length})"
            )
        if s.end <= s.start:
            raise InputError(f"{where}: span {s.start}-{s.end} is empty or reversed")
        category_of(s.label, where=where)
        if prev is not None and s.start < prev.end and not allow_overlap:
            raise InputError(
                f"{where}: spans {prev.start}-{prev.end} and {s.start}-{s.end} overlap"
            )
        prev = s
    return out


def merge_overlapping(spans: Iterable[Span]) -> list[Span]:
    """Merge overlapping or touching-by-overlap spans; the merged label is the first span's.

    Used where overlaps are legitimate (predictions); gold spans should be validated instead.
    """
    out: list[Span] = []
    for s in sorted(spans, key=lambda s: (s.start, -s.end)):
        if out and s.start < out[-1].end:
            last = out[-1]
            if s.end > last.end:
                out[-1] = replace(last, end=s.end)
        else:
            out.append(s)
    return out


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(value: Any) -> int | None:
    """The offset of the first lone surrogate in ``value`` (a string, or the strings of a JSON
    value), None when there is none (a string's offset; -1 for one deeper in a JSON value).

    Why: a Python ``str`` can hold U+D800-U+DFFF alone (``json.loads`` turns a ``"\\ud800"``
    escape into one), but no UTF-8 file can: every writer failed on it with a bare
    ``UnicodeEncodeError`` after part of its output was made. Readers refuse such text and
    writers check before writing anything (issue 54).
    """
    if isinstance(value, str):
        m = _LONE_SURROGATE.search(value)
        return None if m is None else m.start()
    if isinstance(value, dict):
        items: Iterable[Any] = [*value.keys(), *value.values()]
    elif isinstance(value, list | tuple):
        items = value
    else:
        return None
    return next((-1 for v in items if lone_surrogate(v) is not None), None)
