"""The ``"dphub"`` spaCy pipeline component: a dphub ensemble's spans as entities (issue 56).

Registered through the ``spacy_factories`` entry point (``pyproject.toml``), so after ``pip
install dphub`` a pipeline adds it by name, without importing dphub::

    nlp = spacy.blank("en")
    nlp.add_pipe("dphub", config={"manifest": "dphub-ensemble.toml"})
    doc = nlp("Seen by Dr. Kowalczyk on 03/04/2021.")
    [(e.text, e.label_, e._.dphub_score, e._.dphub_members) for e in doc.ents]

The component runs :class:`dphub.api.Deidentifier` on ``doc.text`` (``pipe`` in batches: the
batch path of ``dphub ensemble deid``, so the spans are the CLI's) and writes three views:

* ``doc._.dphub_spans``: the ensemble's spans exactly (character offsets, code points), as the
  records of ``--mode spans`` (``start``, ``end``, ``label``, ``score``, ``members``);
* ``doc.spans[spans_key]`` (default ``"dphub"``): each span widened to whole tokens with
  ``doc.char_span(..., alignment_mode="expand")``; spans that then share a token are one span
  (the label of the higher score, the members of both); ``Span._.dphub_score``,
  ``Span._.dphub_members`` and ``Span._.dphub_offsets`` (the exact ranges inside it);
* ``doc.ents`` (``set_ents``): the same spans, labelled with dphub's labels. Where one overlaps
  an entity already there (an upstream NER's), ``overwrite_ents`` decides: True (default) drops
  the other entity, False keeps it and leaves the dphub span in the span group only.

spaCy imports this module whenever it builds any pipeline (it loads every factory entry point),
so it imports only spaCy and dphub's light modules; the ensemble loads when the component is
made. No ``from __future__ import annotations`` here: spaCy validates the factory's arguments
from its annotations, which must be real types.
"""

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from spacy.language import Language
from spacy.tokens import Doc, Span
from spacy.util import minibatch

from dphub.errors import ConfigError

__all__ = ["DEFAULT_CONFIG", "DphubComponent", "make_dphub"]

#: the component's options (``nlp.add_pipe("dphub", config={...})``): ``manifest`` and/or
#: ``members``, ``aggregate``, ``owner_model``, ``runtime``, ``batch_size`` as :func:`dphub.load`
#: takes them; ``set_ents``, ``overwrite_ents``, ``spans_key`` as the module docstring says
DEFAULT_CONFIG: dict[str, Any] = {
    "manifest": None,
    "members": [],
    "aggregate": None,
    "owner_model": None,
    "runtime": None,
    "batch_size": 16,
    "set_ents": True,
    "overwrite_ents": True,
    "spans_key": "dphub",
}

for _name in ("dphub_score", "dphub_members", "dphub_offsets"):
    if not Span.has_extension(_name):
        Span.set_extension(_name, default=None)
if not Doc.has_extension("dphub_spans"):
    Doc.set_extension("dphub_spans", default=None)


@Language.factory("dphub", default_config=DEFAULT_CONFIG,
                  assigns=["doc.ents", "doc.spans", "doc._.dphub_spans"])
def make_dphub(nlp: Language, name: str, manifest: str | None, members: list[str],
               aggregate: str | None, owner_model: str | None, runtime: str | None,
               batch_size: int, set_ents: bool, overwrite_ents: bool,
               spans_key: str | None) -> "DphubComponent":
    """The factory spaCy calls for ``nlp.add_pipe("dphub", config=...)``: loads the ensemble
    once (a manifest path and/or member specs, as :func:`dphub.load`)."""
    # the API loads torch and the ensemble: imported here, when a pipeline uses the component,
    # and not when spaCy imports this module for every pipeline it builds (see the docstring)
    from dphub.api import load

    deid = load(manifest, members=members, aggregate=aggregate, owner_model=owner_model,
                runtime=runtime, batch_size=batch_size)
    return DphubComponent(deid, name=name, set_ents=set_ents, overwrite_ents=overwrite_ents,
                          spans_key=spans_key, batch_size=batch_size)


class DphubComponent:
    """The component itself; ``deidentifier`` is a :class:`dphub.api.Deidentifier` (made by
    :func:`make_dphub`, or by hand: ``nlp.add_pipe`` takes only registered names, so a
    component built by hand is called directly or wrapped in a factory of the user's)."""

    def __init__(self, deidentifier: Any, *, name: str = "dphub", set_ents: bool = True,
                 overwrite_ents: bool = True, spans_key: str | None = "dphub",
                 batch_size: int = 16) -> None:
        if not set_ents and not spans_key:
            raise ConfigError("the dphub component would set nothing: keep set_ents or give a "
                              "spans_key")
        if batch_size < 1:
            raise ConfigError("batch_size must be at least 1")
        self.deidentifier = deidentifier
        self.name = name
        self.set_ents = set_ents
        self.overwrite_ents = overwrite_ents
        self.spans_key = spans_key or None
        self.batch_size = batch_size

    def __call__(self, doc: Doc) -> Doc:
        return self.annotate(doc, self.deidentifier(doc.text).spans)

    def pipe(self, stream: Iterable[Doc], batch_size: int | None = None) -> Iterator[Doc]:
        """Docs in batches: one ensemble call per batch, as a directory run makes it."""
        for docs in minibatch(stream, size=batch_size or self.batch_size):
            results = self.deidentifier.deid([d.text for d in docs])
            for doc, res in zip(docs, results, strict=True):
                yield self.annotate(doc, res.spans)

    def annotate(self, doc: Doc, spans: Sequence[Any]) -> Doc:
        """Write dphub's spans (:class:`dphub.api.PhiSpan`) onto ``doc`` (module docstring)."""
        doc._.dphub_spans = [s.to_dict() for s in spans]
        merged = self._token_spans(doc, spans)
        if self.spans_key:
            doc.spans[self.spans_key] = merged
        if self.set_ents:
            doc.ents = self._ents(doc, merged)
        return doc

    @staticmethod
    def _token_spans(doc: Doc, spans: Sequence[Any]) -> list[Span]:
        groups: list[dict[str, Any]] = []
        for s in sorted(spans, key=lambda s: (s.start, s.end)):
            cs = doc.char_span(s.start, s.end, alignment_mode="expand")
            if cs is None or not len(cs):  # whitespace only: no token to carry it
                continue
            last = groups[-1] if groups else None
            if last is not None and cs.start < last["end"]:
                last["end"] = max(last["end"], cs.end)
                if s.score > last["score"]:
                    last["label"], last["score"] = s.label, s.score
                last["members"] += [m for m in s.members if m not in last["members"]]
                last["offsets"].append([s.start, s.end])
            else:
                groups.append({"start": cs.start, "end": cs.end, "label": s.label,
                               "score": float(s.score), "members": list(s.members),
                               "offsets": [[s.start, s.end]]})
        out = []
        for g in groups:
            span = Span(doc, g["start"], g["end"], label=g["label"])
            span._.dphub_score = g["score"]
            span._.dphub_members = g["members"]
            span._.dphub_offsets = g["offsets"]
            out.append(span)
        return out

    def _ents(self, doc: Doc, ours: list[Span]) -> list[Span]:
        mine = {i for s in ours for i in range(s.start, s.end)}
        if self.overwrite_ents:
            kept = [e for e in doc.ents if not mine.intersection(range(e.start, e.end))]
            return sorted([*kept, *ours], key=lambda s: s.start)
        theirs = {i for e in doc.ents for i in range(e.start, e.end)}
        added = [s for s in ours if not theirs.intersection(range(s.start, s.end))]
        return sorted([*doc.ents, *added], key=lambda s: s.start)
