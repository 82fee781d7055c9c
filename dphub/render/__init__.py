"""Renderers: what a de-identified note looks like, given its predicted PHI spans.

A renderer turns one :class:`~dphub.notes.Note` and its (merged) predicted spans into output text:

``tag``        each span becomes its category, ``[**NAME**]`` (MIMIC style) or ``<NAME>``;
``redact``     each span becomes a fixed mask (``XXXXX``), or a same-length mask;
``surrogate``  each span becomes a realistic fake value (see :class:`SurrogateRenderer`);
``spans``      one JSONL record ``{"id", "spans": [{start, end, label, score, members}]}``
               (offsets only, no note text);
``brat``       the ``.ann`` file content (T-lines carry the span text: brat output is the user's
               own annotated data, and writing it is the point).

Spans are validated against the note (out-of-range offsets raise :class:`InputError` naming the
note id and offsets, never text). Overlapping spans are merged before text is replaced, so the
union of everything any ensemble member flagged disappears.

The modules: :mod:`~dphub.render.base` (the renderer contract; tag, redact, spans, brat),
:mod:`~dphub.render.surrogate` (surrogates: policy, :class:`SurrogateRenderer`),
:mod:`~dphub.render.dates` (the date forms), :mod:`~dphub.render.values` (Faker, case,
measurement checks), :mod:`~dphub.render.keys` (the secret and the keyed draws). Everything public
is importable from ``dphub.render``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dphub.errors import ConfigError
from dphub.notes import Note, Span
from dphub.render.base import (
    BratRenderer,
    RedactRenderer,
    Renderer,
    SpansRenderer,
    TagRenderer,
    prepare_spans,
)
from dphub.render.dates import shift_date_text
from dphub.render.keys import MIN_KEY_BYTES, date_offset_days, key_recipe, load_key
from dphub.render.surrogate import SurrogateRenderer

__all__ = [
    "RENDERERS",
    "Renderer",
    "TagRenderer",
    "RedactRenderer",
    "SurrogateRenderer",
    "SpansRenderer",
    "BratRenderer",
    "render",
    "load_key",
    "prepare_spans",
    "date_offset_days",
    "key_recipe",
    "shift_date_text",
    "MIN_KEY_BYTES",
]


#: mode name -> renderer class; ``render`` instantiates it with the caller's options.
RENDERERS: dict[str, type[Renderer]] = {
    cls.name: cls
    for cls in (TagRenderer, RedactRenderer, SurrogateRenderer, SpansRenderer, BratRenderer)
}


def render(note: Note, spans: Sequence[Span], mode: str, **options: Any) -> str:
    """Render one note in ``mode`` (a key of :data:`RENDERERS`) with the renderer's options.

    For many notes build the renderer once (``RENDERERS[mode](**options)``) and call its
    ``render``; this helper is for one-offs.
    """
    try:
        cls = RENDERERS[mode]
    except KeyError:
        raise ConfigError(
            f"unknown render mode {mode!r}; available: {', '.join(RENDERERS)}"
        ) from None
    try:
        renderer = cls(**options)
    except TypeError:
        raise ConfigError(
            f"invalid options for render mode {mode!r}: {', '.join(sorted(options)) or 'none'}"
        ) from None
    return renderer.render(note, spans)
