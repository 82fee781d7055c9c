"""dphub as a Presidio recognizer: ``DphubRecognizer``, an ``EntityRecognizer`` backed by a
loaded dphub ensemble (issue 56).

A Presidio user keeps the ``AnalyzerEngine`` (and its own recognizers) and the anonymizer's
operators, and adds dphub in a line::

    from dphub.integrations.presidio import DphubRecognizer

    analyzer.registry.add_recognizer(DphubRecognizer.from_manifest("dphub-ensemble.toml"))

Each call runs :class:`dphub.api.Deidentifier` on the text (the batch path of ``dphub ensemble
deid``, so the spans are the CLI's); every span dphub hides becomes one ``RecognizerResult`` at
the same offsets (code points: Presidio and dphub both index Python strings), its label mapped
to a Presidio entity name (:data:`ENTITY_OF_CATEGORY`, :data:`ENTITY_OF_FINE`, the ``CONTACT``
shape rule in :func:`entity_of`), its score dphub's, and its ``analysis_explanation`` naming
the members that voted. The reverse (Presidio as an ensemble member) is
:mod:`dphub.ensemble.member_kinds.presidio`.

Two Presidio behaviours would otherwise drop a span dphub decided to hide, silently: results
scored exactly 0 are removed as duplicates, and the engine's ``default_score_threshold`` applies
to every recognizer. A dphub score of 0 is reported as :data:`MIN_REPORTED_SCORE` (the raw
score stays in ``recognition_metadata["dphub_score"]``), and the recognizer's own default
threshold is 0 (``score_threshold=None`` hands the choice back to the engine). An explicit
``score_threshold`` passed to ``analyze`` still applies: that is the caller's decision.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

try:  # the module is the integration: without Presidio it has nothing to offer
    from presidio_analyzer import AnalysisExplanation, EntityRecognizer, RecognizerResult
except ImportError:
    raise ModuleNotFoundError(
        "dphub.integrations.presidio needs presidio-analyzer: pip install 'dphub[presidio]'",
        name="presidio_analyzer") from None

from dphub import __version__
from dphub.api import Deidentifier, PhiSpan, load
from dphub.errors import ConfigError
from dphub.labels import CATEGORIES, UNTYPED, category_of, fine_of, is_known

__all__ = ["ENTITY_OF_CATEGORY", "ENTITY_OF_FINE", "MIN_REPORTED_SCORE", "DphubRecognizer",
           "entity_of"]

#: dphub's HIPAA category -> Presidio entity name (Presidio's own names where one means the
#: same; AGE, PROFESSION and OTHER, which Presidio's predefined recognizers lack, keep dphub's)
ENTITY_OF_CATEGORY: dict[str, str] = {
    "NAME": "PERSON",
    "DATE": "DATE_TIME",
    "AGE": "AGE",
    "CONTACT": "PHONE_NUMBER",  # HIPAA's other contacts: by shape, see entity_of
    "ID": "ID",
    "LOCATION": "LOCATION",
    "PROFESSION": "PROFESSION",
    "OTHER": "OTHER",
    UNTYPED: "OTHER",  # the inverse rule's untyped word
}

#: an i2b2-style subcategory whose Presidio name is more precise than its category's
ENTITY_OF_FINE: dict[str, str] = {
    "PHONE": "PHONE_NUMBER",
    "FAX": "PHONE_NUMBER",
    "EMAIL": "EMAIL_ADDRESS",
    "URL": "URL",
    "IPADDR": "IP_ADDRESS",
    "SSN": "US_SSN",  # i2b2's SSN is the US number (dphub's pattern is ddd-dd-dddd)
    "LICENSE": "MEDICAL_LICENSE",  # in clinical notes, mostly clinicians' (DEA) numbers
}

#: what a dphub score of 0 is reported as (Presidio drops results scored exactly 0)
MIN_REPORTED_SCORE = 0.01

_IPV4 = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")


def entity_of(label: str, text: str = "", entity_map: Mapping[str, str] | None = None) -> str:
    """The Presidio entity name of a dphub span: ``entity_map`` (dphub label -> name, case
    ignored) first, then a subcategory's (:data:`ENTITY_OF_FINE`), then its category's
    (:data:`ENTITY_OF_CATEGORY`). A span labelled with the bare category ``CONTACT`` (what a
    model on the ``hipaa`` schema predicts) is named by its shape: ``EMAIL_ADDRESS`` with an
    ``@``, ``URL`` with ``://`` or ``www.``, ``IP_ADDRESS`` for a dotted quad, else
    ``PHONE_NUMBER`` (HIPAA's remaining contacts are telephone and fax numbers). An unknown
    label is ``OTHER``: a vote to hide is never dropped for its name."""
    up = label.upper()
    if entity_map and up in entity_map:
        return entity_map[up]
    if not is_known(label):
        return ENTITY_OF_CATEGORY["OTHER"]
    if up == "CONTACT":
        value = text.strip().lower()
        if "@" in value:
            return "EMAIL_ADDRESS"
        if "://" in value or value.startswith("www."):
            return "URL"
        if _IPV4.fullmatch(value):
            return "IP_ADDRESS"
        return "PHONE_NUMBER"
    if up not in CATEGORIES and up != UNTYPED:
        fine = ENTITY_OF_FINE.get(fine_of(label))
        if fine is not None:
            return fine
    return ENTITY_OF_CATEGORY[category_of(label)]


# Presidio 2.2.36x added per-recognizer thresholds; an older analyzer has no such argument
_HAS_THRESHOLDS = "score_thresholds" in inspect.signature(EntityRecognizer.__init__).parameters


class DphubRecognizer(EntityRecognizer):
    """A Presidio recognizer that runs a dphub ensemble (:class:`dphub.api.Deidentifier`).

    ``entity_map`` overrides the mapping of dphub labels to Presidio names (e.g.
    ``{"HOSPITAL": "ORGANIZATION"}``); ``score_threshold`` is the recognizer's default
    threshold in Presidio (0: every span dphub hides is kept whatever the engine's default;
    None: the engine's). Build it with :meth:`from_manifest` or :meth:`from_members`, or from a
    :class:`~dphub.api.Deidentifier` loaded already.
    """

    def __init__(self, deidentifier: Deidentifier, *,
                 entity_map: Mapping[str, str] | None = None, name: str = "DphubRecognizer",
                 supported_language: str = "en", score_threshold: float | None = 0.0) -> None:
        if not isinstance(deidentifier, Deidentifier):
            raise ConfigError("DphubRecognizer needs a dphub Deidentifier (dphub.load(...)); "
                              "or use DphubRecognizer.from_manifest / from_members")
        self.deidentifier = deidentifier
        self.entity_map = {str(k).upper(): str(v) for k, v in (entity_map or {}).items()}
        # the CONTACT shapes (e-mail, URL, IP) are among the subcategories' names
        entities = (set(ENTITY_OF_CATEGORY.values()) | set(ENTITY_OF_FINE.values())
                    | set(self.entity_map.values()))
        options: dict[str, Any] = {}
        if score_threshold is not None and _HAS_THRESHOLDS:
            options["score_thresholds"] = {"default": float(score_threshold)}
        super().__init__(supported_entities=sorted(entities), name=name,
                         supported_language=supported_language, version=__version__, **options)

    @classmethod
    def from_manifest(cls, manifest: str | os.PathLike[str], *,
                      entity_map: Mapping[str, str] | None = None,
                      name: str = "DphubRecognizer", supported_language: str = "en",
                      score_threshold: float | None = 0.0,
                      **load_options: Any) -> DphubRecognizer:
        """The ensemble of a manifest (``dphub-ensemble.toml``); ``load_options`` are those of
        :func:`dphub.load` (``aggregate``, ``owner_model``, ``runtime``, ``batch_size`` ...)."""
        return cls(load(manifest, **load_options), entity_map=entity_map, name=name,
                   supported_language=supported_language, score_threshold=score_threshold)

    @classmethod
    def from_members(cls, members: Sequence[str], *,
                     entity_map: Mapping[str, str] | None = None,
                     name: str = "DphubRecognizer", supported_language: str = "en",
                     score_threshold: float | None = 0.0,
                     **load_options: Any) -> DphubRecognizer:
        """An ensemble of member specs (``["rules:default", "models/ward", "org/name@rev"]``),
        pinned as ``dphub ensemble add`` pins them; ``load_options`` as :meth:`from_manifest`."""
        if isinstance(members, str):
            members = [members]
        return cls(load(members=members, **load_options), entity_map=entity_map, name=name,
                   supported_language=supported_language, score_threshold=score_threshold)

    def load(self) -> None:
        """Nothing to do: the ensemble was loaded before the recognizer was built."""

    def analyze(self, text: str, entities: Sequence[str] | None = None,
                nlp_artifacts: Any = None) -> list[RecognizerResult]:
        """dphub's spans on ``text`` as Presidio results (only the ``entities`` asked for, if
        any); ``nlp_artifacts`` is not used: the ensemble tokenizes for itself."""
        wanted = set(entities) if entities else None
        out = []
        for span in self.deidentifier(text).spans:
            entity = entity_of(span.label, text[span.start:span.end], self.entity_map)
            if wanted is None or entity in wanted:
                out.append(self._result(entity, span))
        return out

    def _result(self, entity: str, span: PhiSpan) -> RecognizerResult:
        raw = float(span.score)
        score = min(1.0, raw) if raw > 0 else MIN_REPORTED_SCORE  # NaN and <= 0 alike
        members = ", ".join(span.members) or "none"
        explanation = AnalysisExplanation(
            recognizer=self.name, original_score=score,
            textual_explanation=(f"dphub ensemble ({self.deidentifier.rule}): {span.label} "
                                 f"flagged by {members}"))
        metadata = {RecognizerResult.RECOGNIZER_NAME_KEY: self.name,
                    RecognizerResult.RECOGNIZER_IDENTIFIER_KEY: self.id,
                    "dphub_label": span.label, "dphub_members": list(span.members),
                    "dphub_score": raw}
        return RecognizerResult(entity, span.start, span.end, score,
                                analysis_explanation=explanation, recognition_metadata=metadata)

    def __repr__(self) -> str:
        return f"DphubRecognizer(name={self.name!r}, deidentifier={self.deidentifier!r})"
