"""Rendering a run's outputs: the output modes and what a finished note contributes.

Why a module of its own: what a note becomes (tagged, redacted or surrogate text, spans, brat)
is :mod:`dphub.render`'s; this module adapts it to a run: one :class:`Renderer` per run (built
once, with the surrogate key, so a resumed run renders byte-identically), the files or JSONL
record of each note, and its audit record (offsets, label, score, members; text only with
``audit_text``). Writing them atomically, in input order, is the run's (:mod:`dphub.runner`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dphub.errors import ConfigError
from dphub.notes import Note, Span
from dphub.render import RENDERERS, key_recipe
from dphub.render import date_count as _date_count
from dphub.runner.inputs import WorkItem

MODES = ("tag", "redact", "surrogate", "spans", "brat")


#: the options of :class:`dphub.render.SurrogateRenderer` that choose a DP mechanism (issue 28)
_DP_SURROGATE_OPTIONS = frozenset(("dates", "date_epsilon", "date_unit", "ages", "age_epsilon",
                                   "places", "place_epsilon"))


class Renderer:
    """Turns (note, merged spans) into output files ``{suffix: content}`` via :mod:`dphub.render`.

    The renderer is built once per run (surrogates need the key; they are keyed per patient so a
    resumed run renders byte-identically).
    """

    def __init__(self, mode: str, key: bytes | None = None, **options: Any) -> None:
        if mode not in MODES:
            raise ConfigError(f"unknown output mode {mode!r}; choose one of {', '.join(MODES)}")
        count = options.pop("date_count", "keep")
        _date_count.check_date_count(count, mode)
        #: ``--date-count note|none`` (issue 38): fewer date mentions, recorded in run.json and
        #: the audit; None when the count is kept (older runs' records stay the same)
        self._count = count
        self.date_count = _date_count.describe(count) if count != "keep" else None
        if mode == "surrogate":
            if key is None:
                raise ConfigError("surrogate mode needs --key-file FILE (a secret key for "
                                  "consistent surrogates); " + key_recipe())
            options = {**options, "key": key}
        try:
            self._renderer = RENDERERS[mode](**options)
        except TypeError:
            raise ConfigError(f"invalid options for output mode {mode!r}") from None
        self.mode = mode
        # issue 28: the DP mechanisms of surrogates (names and ε, never values) for run.json and
        # audit.jsonl; None with the default surrogates (older runs' records stay the same)
        dp = mode == "surrogate" and any(k in _DP_SURROGATE_OPTIONS for k in options)
        self.mechanisms = self._renderer.describe() if dp else None
        self.needs_prepass = bool(getattr(self._renderer, "needs_prepass", False))

    def _shown(self, note: Note, spans: Sequence[Span]) -> tuple[Note, Sequence[Span]]:
        """The note and spans the mode renders: with ``--date-count note|none``, fewer dates."""
        if self._count == "keep":
            return note, spans
        return _date_count.fewer_dates(note, spans, self._count)

    def observe(self, note: Note, spans: Sequence[Span]) -> None:
        """Pre-pass of ``--date-unit patient``: the renderer learns every date of the patient."""
        self._renderer.observe(*self._shown(note, spans))

    def files(self, note: Note, spans: Sequence[Span]) -> dict[str, str]:
        out = self._renderer.render(*self._shown(note, spans))
        if self.mode == "brat":  # a brat document is the text plus its annotations
            return {".txt": note.text, ".ann": out}
        return {self._renderer.suffix: out}

    def jsonl_record(self, note: Note, spans: Sequence[Span]) -> dict[str, Any]:
        out = self._renderer.render(*self._shown(note, spans))
        if self.mode == "spans":
            return json.loads(out)
        return {"id": note.id, "text": out}


def audit_record(item: WorkItem, merged: Sequence[Any], note: Note, audit_text: bool) -> dict[str, Any]:
    spans = []
    for m in merged:
        d = m.to_dict() if hasattr(m, "to_dict") else dict(m)
        if audit_text:
            d["text"] = note.text[d["start"] : d["end"]]
        spans.append(d)
    return {"key": item.key, "id": note.id, "spans": spans}
