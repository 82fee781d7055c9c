"""Rendering a run's outputs: the output modes and what a finished note contributes.

Why a module of its own: what a note becomes (tagged, redacted or surrogate text, spans, brat)
is :mod:`dphub.render`'s; this module adapts it to a run: one :class:`Renderer` per run (built
once, with the surrogate key, so a resumed run renders byte-identically), the files or JSONL
record of each note, and its audit record (offsets, label, score, members; text only with
``audit_text``). Writing them atomically, in input order, is the run's (:mod:`dphub.runner`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from dphub.errors import ConfigError
from dphub.notes import Note, Span
from dphub.render import RENDERERS, key_recipe
from dphub.render import date_count as _date_count
from dphub.runner.inputs import WorkItem

MODES = ("tag", "redact", "surrogate", "spans", "brat")


class Explanation(Protocol):
    """Why a rule kept and hid what it did (the inverse rule's
    :class:`dphub.ensemble.release_paths.Explanation`; the runner sits beside the ensemble, not
    above it, so it reads it by this shape)."""

    kept: tuple[tuple[int, int, str], ...]

    def counts(self) -> dict[str, int]: ...

    def hidden_by(self, start: int, end: int, members: Iterable[str]) -> list[str]: ...


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

    def files(self, note: Note, spans: Sequence[Span], why: Explanation | None = None
              ) -> dict[str, str]:
        out = self._renderer.render(*self._shown(note, spans))
        if self.mode == "brat":  # a brat document is the text plus its annotations
            return {".txt": note.text, ".ann": out}
        if self.mode == "spans" and why is not None:
            out = json.dumps(explained(json.loads(out), why), ensure_ascii=False) + "\n"
        return {self._renderer.suffix: out}

    def jsonl_record(self, note: Note, spans: Sequence[Span], why: Explanation | None = None
                     ) -> dict[str, Any]:
        out = self._renderer.render(*self._shown(note, spans))
        if self.mode == "spans":
            return explained(json.loads(out), why)
        return {"id": note.id, "text": out}


def explained(record: dict[str, Any], why: Explanation | None) -> dict[str, Any]:
    """A ``--mode spans`` record of an inverse run with why (issue 54 item 5): each span's
    ``hidden_by`` (its members, ``inverse`` when the rule hid a word of it alone) and ``kept``,
    every kept word as ``[start, end, release path]`` (offsets, never text)."""
    if why is None:
        return record
    for s in record["spans"]:
        s["hidden_by"] = why.hidden_by(s["start"], s["end"], s.get("members") or ())
    record["kept"] = [list(k) for k in why.kept]
    return record


def audit_record(item: WorkItem, merged: Sequence[Any], note: Note, audit_text: bool,
                 why: Explanation | None = None) -> dict[str, Any]:
    """A note's line of ``audit.jsonl``: its spans (offsets, label, score, members; text only
    with ``audit_text``); under the inverse rule also what hid each span (``hidden_by``) and
    how many words each release path kept (``kept``: path -> count; offsets of each kept word
    are in ``--mode spans``, never text here)."""
    spans = []
    for m in merged:
        d = m.to_dict() if hasattr(m, "to_dict") else dict(m)
        if why is not None:
            d["hidden_by"] = why.hidden_by(d["start"], d["end"], d.get("members") or ())
        if audit_text:
            d["text"] = note.text[d["start"] : d["end"]]
        spans.append(d)
    rec: dict[str, Any] = {"key": item.key, "id": note.id, "spans": spans}
    if why is not None:
        rec["kept"] = why.counts()
    return rec
