"""The Python API: load an ensemble once, then de-identify strings or notes as often as needed.

Three lines from a notebook (``import dphub`` stays light: this module, and the ensemble behind
it, load on first use)::

    import dphub
    deid = dphub.load("dphub-ensemble.toml")          # or dphub.load(members=["rules:default"])
    print(deid("Seen by Dr. Kowalczyk on 03/04/2021.").render("redact"))

Why a module of its own (issue 56): a notebook had to assemble ``Tagger``, ``build_ensemble``,
``Manifest`` and ``render`` by hand, and reloaded the models for each string. Here the ensemble is
built once (:func:`load`, through :func:`dphub.ensemble.core.build_ensemble`, as every CLI
command builds it) and each call runs the batch path of ``dphub ensemble deid``: notes go to
:meth:`Ensemble.deid <dphub.ensemble.core.Ensemble.deid>` in batches of ``batch_size`` and are
rendered by the run's own :class:`dphub.runner.output.Renderer`; there is no second
implementation, so the spans are those of the CLI on the same notes.

Offsets are Python string indices (code points) into the text, end exclusive, as everywhere in
dphub (:mod:`dphub.notes`): an emoji is one position, as ``len()`` counts it. Nothing here prints
or logs; the reprs of results show ids, offsets and labels, never the text.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, overload

from dphub.ensemble.aggregate import MergedSpan
from dphub.ensemble.core import Ensemble, NoteResult, build_ensemble
from dphub.ensemble.evaluation import evaluate_ensemble, read_labelled
from dphub.ensemble.manifest import Manifest, entry_from_spec
from dphub.errors import ConfigError, InputError
from dphub.notes import Note, Span, lone_surrogate
from dphub.render import MIN_KEY_BYTES, load_key
from dphub.runner.output import MODES, Renderer

__all__ = ["DeidResult", "Deidentifier", "PhiSpan", "load"]

#: the id a string passed on its own gets (strings in an iterable get ``"1"``, ``"2"`` ...)
TEXT_ID = "text"


@dataclass(frozen=True)
class PhiSpan:
    """One span the ensemble hides: ``text[start:end]`` (code points), its label, the best
    member score, and the members that flagged any of its characters."""

    start: int
    end: int
    label: str
    score: float
    members: tuple[str, ...]

    @classmethod
    def from_merged(cls, m: MergedSpan) -> PhiSpan:
        return cls(m.start, m.end, m.label, m.score, tuple(m.voters))

    def to_span(self) -> Span:
        """As a :class:`~dphub.notes.Span` (members comma-joined in ``source``, the renderers'
        contract)."""
        return Span(self.start, self.end, self.label, score=self.score,
                    source=",".join(self.members))

    def to_dict(self) -> dict[str, Any]:
        """The record of ``--mode spans`` (``start``, ``end``, ``label``, ``score``, ``members``)."""
        return {"start": self.start, "end": self.end, "label": self.label,
                "score": float(self.score), "members": list(self.members)}


@dataclass(frozen=True)
class DeidResult:
    """One note de-identified: the note, the spans to hide, and each member's own spans.

    The repr shows the note id and the spans' offsets and labels, never the text (results end up
    in logs and tracebacks).
    """

    note: Note = field(repr=False)
    spans: tuple[PhiSpan, ...]
    by_member: Mapping[str, tuple[Span, ...]] = field(repr=False, default_factory=dict)

    @property
    def id(self) -> str:
        return self.note.id

    @property
    def text(self) -> str:
        """The original text (it holds PHI)."""
        return self.note.text

    def render(self, mode: str = "tag", *, key: bytes | str | os.PathLike[str] | None = None,
               **options: Any) -> str:
        """The note in ``mode``: ``tag`` (``[**NAME**]``), ``redact`` (``XXXXX``), ``surrogate``
        (needs ``key``: the secret bytes or a key file), ``spans`` (the JSONL record) or
        ``brat`` (the ``.ann`` content); ``options`` as the renderers take them (e.g.
        ``style="angle"``, ``preserve_length=True``). For many notes, :meth:`Deidentifier.render`
        builds the renderer once."""
        return _render_with(_renderer(mode, key, options), self)

    def __repr__(self) -> str:
        return f"DeidResult(id={self.id!r}, spans={self.spans!r})"

    def __iter__(self) -> Iterator[PhiSpan]:
        return iter(self.spans)

    def __len__(self) -> int:
        return len(self.spans)


class Deidentifier:
    """An ensemble loaded once (:func:`load`); call it on a string, or :meth:`deid` on many.

    ``members`` and ``rule`` say what it runs; ``manifest`` is the file it was loaded from
    (None when built from member specs alone).
    """

    def __init__(self, ensemble: Ensemble, *, batch_size: int = 16,
                 manifest: Path | None = None) -> None:
        if batch_size < 1:
            raise ConfigError("batch_size must be at least 1")
        self.ensemble = ensemble
        self.batch_size = batch_size
        self.manifest = manifest

    @property
    def members(self) -> list[str]:
        return [s.name for s in self.ensemble.slots]

    @property
    def rule(self) -> str:
        return str(self.ensemble.rule)

    def __repr__(self) -> str:
        return (f"Deidentifier(members={self.members!r}, rule={self.rule!r}, "
                f"manifest={None if self.manifest is None else str(self.manifest)!r})")

    def __call__(self, text: str | Note) -> DeidResult:
        """One string (or :class:`~dphub.notes.Note`) de-identified."""
        return next(self._stream([_as_note(text, None)]))

    @overload
    def deid(self, notes: str | Note) -> DeidResult: ...
    @overload
    def deid(self, notes: Iterable[str | Note]) -> Iterator[DeidResult]: ...

    def deid(self, notes: str | Note | Iterable[str | Note]
             ) -> DeidResult | Iterator[DeidResult]:
        """A string or note: its :class:`DeidResult`. An iterable of strings or notes: their
        results in order, streamed (``batch_size`` notes are read, run and yielded at a time,
        as ``dphub ensemble deid`` does; the iterable may be a generator over a large corpus).
        Strings get the ids ``"1"``, ``"2"``, ... (a lone string ``"text"``)."""
        if isinstance(notes, str | Note):
            return self(notes)
        return self._stream(_as_note(n, i) for i, n in enumerate(notes, start=1))

    def _stream(self, notes: Iterable[Note]) -> Iterator[DeidResult]:
        it = iter(notes)
        while batch := list(islice(it, self.batch_size)):
            # the call of the CLI's batch path (dphub.runner.engine): one Ensemble.deid a batch
            for note, res in zip(batch, self.ensemble.deid(batch), strict=True):
                yield _result(note, res)

    def render(self, notes: str | Note | Iterable[str | Note], mode: str = "tag", *,
               key: bytes | str | os.PathLike[str] | None = None,
               **options: Any) -> Iterator[str]:
        """Each note de-identified and rendered in ``mode`` (see :meth:`DeidResult.render`),
        streamed; the renderer is built once, as a directory run builds it."""
        renderer = _renderer(mode, key, options)
        results = [self.deid(notes)] if isinstance(notes, str | Note) else self.deid(notes)
        for res in results:
            yield _render_with(renderer, res)

    def evaluate(self, labelled: str | os.PathLike[str] | Iterable[Note], *,
                 fmt: str | None = None) -> list[dict[str, Any]]:
        """Each member and the ensemble scored against gold, as ``dphub ensemble evaluate
        --json`` prints them (one dict per row: ``name``, ``precision``, ``recall``, ``f1``,
        phrase recalls, ``non_phi_tokens_kept``, ``epsilon``, ``unit``). ``labelled``: a
        labelled corpus path (any format) or notes carrying gold spans."""
        if isinstance(labelled, str | os.PathLike):
            notes = read_labelled(Path(labelled), fmt)
        else:
            notes = list(labelled)
            if not notes:
                raise InputError("no labelled notes to evaluate on")
            if not all(isinstance(n, Note) and n.labelled for n in notes):
                raise InputError("evaluate needs notes carrying gold spans (Note(..., "
                                 "spans=[...], labelled=True))")
        return evaluate_ensemble(self.ensemble, notes)


def load(manifest: str | os.PathLike[str] | Manifest | None = None, *,
         members: Sequence[str] = (), aggregate: str | None = None,
         owner_model: str | os.PathLike[str] | None = None, batch_size: int = 16,
         runtime: str | None = None, int8: bool = False,
         safe_words: Sequence[str | os.PathLike[str]] = ()) -> Deidentifier:
    """Load an ensemble once: from a manifest (a path to ``dphub-ensemble.toml`` or a
    :class:`~dphub.ensemble.manifest.Manifest`), from member specs (``members=["rules:default",
    "path/to/model", "org/name@rev"]``, pinned as ``dphub ensemble add`` pins them), or both
    (the specs are added after the manifest's members, in memory only).

    ``aggregate`` overrides the manifest's rule (``any``, ``k-of-n:K[+NAME...]``, ``inverse``);
    ``owner_model``, ``runtime``, ``int8``, ``safe_words`` and ``batch_size`` are the options of
    ``dphub ensemble deid``. A rule that does not fit the members (a quorum they cannot reach, a
    name that is not a member) raises :class:`~dphub.errors.ConfigError` here, before any note.
    There is no implicit manifest: name one (the CLI's ``-e``), or give members.
    """
    if manifest is None and not members and owner_model is None:
        raise ConfigError("dphub.load needs a manifest path, members=[...] specs, or an "
                          "owner_model")
    path: Path | None = None
    if isinstance(manifest, Manifest):
        m, path = manifest, manifest.path
    elif manifest is not None:
        path = Path(manifest).expanduser()
        m = Manifest.load(path)
    else:
        m = Manifest()
    if members:
        m = Manifest(list(m.members), m.aggregate, m.path, m.runtime)
        for spec in members:
            m.add(entry_from_spec(spec))
    ensemble = build_ensemble(m, owner_model=None if owner_model is None else Path(owner_model),
                              aggregate_rule=aggregate, batch_size=batch_size, int8=int8,
                              runtime=runtime, safe_words=[Path(p) for p in safe_words])
    return Deidentifier(ensemble, batch_size=batch_size, manifest=path)


def _as_note(x: str | Note, index: int | None) -> Note:
    if isinstance(x, Note):
        note = x
    elif isinstance(x, str):
        note = Note(id=TEXT_ID if index is None else str(index), text=x)
    else:
        raise InputError(f"expected a string or a Note, got {type(x).__name__}"
                         + ("" if index is None else f" (item {index})"))
    at = lone_surrogate(note.text)
    if at is not None:  # a str can hold one; no tokenizer or UTF-8 output can (issue 54)
        raise InputError(f"note {note.id!r}: its text holds a lone surrogate at offset {at} "
                         "(U+D800-U+DFFF, not a Unicode character)")
    return note


def _result(note: Note, res: NoteResult) -> DeidResult:
    return DeidResult(note, tuple(PhiSpan.from_merged(m) for m in res.merged),
                      {name: tuple(spans) for name, spans in res.by_member.items()})


def _renderer(mode: str, key: bytes | str | os.PathLike[str] | None,
              options: dict[str, Any]) -> Renderer:
    """The run's renderer (:class:`dphub.runner.output.Renderer`) for ``mode``."""
    if mode not in MODES:
        raise ConfigError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if isinstance(key, str | os.PathLike):
        key = load_key(key)
    elif key is not None and len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"the surrogate key holds {len(key)} bytes; use at least "
                          f"{MIN_KEY_BYTES} secret bytes")
    renderer = Renderer(mode, key, **options)
    if renderer.needs_prepass:
        raise ConfigError("these surrogate options read every note of a patient first; use "
                          "`dphub ensemble deid` on the whole input")
    return renderer


def _render_with(renderer: Renderer, res: DeidResult) -> str:
    spans = [s.to_span() for s in res.spans]
    if renderer.mode == "brat":
        return renderer.files(res.note, spans)[".ann"]
    return next(iter(renderer.files(res.note, spans).values()))
