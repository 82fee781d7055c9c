"""The span-level renderers and what they share: spans checked against the note, sorted,
merged and replaced (``tag``, ``redact``, ``spans``, ``brat``; the surrogates are in
:mod:`dphub.render.surrogate`)."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import ClassVar

from dphub.errors import ConfigError, InputError
from dphub.formats.brat import render_ann
from dphub.labels import category_of, fine_of
from dphub.notes import Note, Span, merge_overlapping


def prepare_spans(note: Note, spans: Sequence[Span], *, merge: bool = True) -> list[Span]:
    """Check spans against the note and return them sorted (and merged when ``merge``).

    Errors name the note id and offsets only.
    """
    n = len(note.text)
    for s in spans:
        if not (0 <= s.start < s.end <= n):
            raise InputError(
                f"note {note.id}: span {s.start}-{s.end} is empty or outside the text "
                f"(length {n})"
            )
        category_of(s.label, where=f"note {note.id}")
    if merge:
        return merge_overlapping(spans)
    return sorted(spans, key=lambda s: (s.start, s.end))


def replace_spans(note: Note, spans: Sequence[Span], replacement: Callable[[Span], str]) -> str:
    """The note text with each (merged, sorted) span replaced by ``replacement(span)``."""
    out: list[str] = []
    pos = 0
    for s in prepare_spans(note, spans):
        out.append(note.text[pos : s.start])
        out.append(replacement(s))
        pos = s.end
    out.append(note.text[pos:])
    return "".join(out)


class Renderer(ABC):
    """Turns a note and its predicted spans into output text (one file's content)."""

    #: registry name (``--mode``)
    name: ClassVar[str]
    #: file suffix a runner should give the output
    suffix: ClassVar[str] = ".txt"

    @abstractmethod
    def render(self, note: Note, spans: Sequence[Span]) -> str:
        """Output for one note; never mutates ``note`` or ``spans``."""


class TagRenderer(Renderer):
    """Replace spans with their label: ``[**NAME**]`` (``style="mimic"``) or ``<NAME>``
    (``style="angle"``). ``granularity`` picks the HIPAA category (default) or the fine
    i2b2-style subcategory (``DOCTOR``, ``HOSPITAL`` ...)."""

    name = "tag"
    STYLES: ClassVar[dict[str, str]] = {"mimic": "[**{}**]", "angle": "<{}>"}

    def __init__(self, style: str = "mimic", granularity: str = "category") -> None:
        if style not in self.STYLES:
            raise ConfigError(f"unknown tag style {style!r}; use one of {', '.join(self.STYLES)}")
        if granularity not in ("category", "fine"):
            raise ConfigError(f"unknown tag granularity {granularity!r}; use category or fine")
        self.template = self.STYLES[style]
        self.label_of = category_of if granularity == "category" else fine_of

    def render(self, note: Note, spans: Sequence[Span]) -> str:
        return replace_spans(note, spans, lambda s: self.template.format(self.label_of(s.label)))


class RedactRenderer(Renderer):
    """Replace spans with ``mask``; with ``preserve_length`` every non-whitespace character of a
    span becomes ``mask_char`` instead (layout and offsets survive, word lengths leak)."""

    name = "redact"

    def __init__(
        self, mask: str = "XXXXX", preserve_length: bool = False, mask_char: str = "X"
    ) -> None:
        if len(mask_char) != 1:
            raise ConfigError("the length-preserving mask must be a single character")
        self.mask = mask
        self.preserve_length = preserve_length
        self.mask_char = mask_char

    def render(self, note: Note, spans: Sequence[Span]) -> str:
        if not self.preserve_length:
            return replace_spans(note, spans, lambda s: self.mask)
        return replace_spans(
            note,
            spans,
            lambda s: "".join(c if c.isspace() else self.mask_char for c in note.span_text(s)),
        )


class SpansRenderer(Renderer):
    """One JSONL line per note: ``{"id", "spans": [{start, end, label, score, members}]}``.

    ``members`` lists the ensemble members that flagged the span, read from ``Span.source`` as a
    comma-joined string (the aggregation contract); ``[]`` when unknown. Spans are not merged
    (overlaps from different members are information here); no note text is written.
    """

    name = "spans"
    suffix = ".jsonl"

    def render(self, note: Note, spans: Sequence[Span]) -> str:
        records = [
            {
                "start": s.start,
                "end": s.end,
                "label": s.label,
                "score": None if s.score is None else float(s.score),
                "members": [m.strip() for m in (s.source or "").split(",") if m.strip()],
            }
            for s in prepare_spans(note, spans, merge=False)
        ]
        return json.dumps({"id": note.id, "spans": records}, ensure_ascii=False) + "\n"


class BratRenderer(Renderer):
    """The brat ``.ann`` content for the note's spans, as :mod:`dphub.formats.brat` writes it
    (one T-line per span, whitespace in the span text folded to single spaces)."""

    name = "brat"
    suffix = ".ann"

    def render(self, note: Note, spans: Sequence[Span]) -> str:
        return render_ann(replace(note, spans=prepare_spans(note, spans, merge=False)))
