"""Aggregation rules by name: one registry, one parser (Opacus-style, like
``opacus/accountants/registry.py``).

Why: "is this the inverse rule?" was asked by string prefix in the runner and the Ray engine and
by type elsewhere. Now the name before the first ``:`` or ``+`` picks a class here, the class
parses the rest, and callers ask the parsed rule what it does (:class:`AggregationRule`: which
spans it merges, whether it reads the safe vocabulary or model probabilities, whose thresholds
``ensemble calibrate`` chooses, whether its spans are labels a student can learn). Adding a rule
is one class with that interface, plus one :func:`register_rule` call.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Protocol

from dphub.ensemble.aggregate import AggregateRule, MergedSpan
from dphub.ensemble.inverse import InverseRule
from dphub.notes import Span
from dphub.safe_vocab import SafeVocabulary
from dphub.scores import LabelThresholds


class AggregationRule(Protocol):
    """What the ensemble, calibration, distillation, the runner and the Ray engine read from a
    parsed rule (none of them asks which class it is)."""

    k: int
    alone: tuple[str, ...]
    #: the rule reads the safe vocabulary (its digest pins a resumed or distributed run)
    uses_safe_vocabulary: bool
    #: the rule has thresholds of its own, which ``ensemble calibrate`` chooses instead of the
    #: members' (:mod:`dphub.ensemble.inverse_calibrate`)
    own_thresholds: bool
    #: every span it hides carries a member's label (False: ``ensemble distill`` refuses it)
    typed_spans: bool

    def check(self, names: Sequence[str]) -> None: ...
    def weight(self, name: str) -> int: ...

    def floor(self, own: float | LabelThresholds | None) -> float | None:
        """The P(PHI) down to which a model member with threshold ``own`` reports every word
        (:func:`dphub.ensemble.inverse.model_word_spans`); None: its flags at ``own``."""
        ...

    def merge(self, text: str, member_spans: Mapping[str, Sequence[Span]], *,
              vocabulary: SafeVocabulary | None,
              models: Mapping[str, float | LabelThresholds | None]) -> list[MergedSpan]:
        """One note's merged spans from its members' spans (``vocabulary`` when the rule
        ``uses_safe_vocabulary``; ``models``: each model member's threshold)."""
        ...


_RULES: dict[str, type[AggregateRule] | type[InverseRule]] = {
    "any": AggregateRule,
    "k-of-n": AggregateRule,
    "inverse": InverseRule,
}

#: a rule name not registered here is parsed as the forward rule, whose error names the choices
_FALLBACK = AggregateRule


def register_rule(name: str, rule: type) -> None:
    """Make ``rule`` (a class with a ``parse(text)`` classmethod) the parser of ``name[:...]``."""
    _RULES[name.lower()] = rule


def rule_names() -> tuple[str, ...]:
    """The registered rule names, in registration order."""
    return tuple(_RULES)


def parse_rule(text: str) -> AggregationRule:
    """Any aggregation rule: ``any``, ``k-of-n:...`` (:class:`AggregateRule`) or
    ``inverse[:LOW,HIGH[,NAMED[,SURE]]]`` (:class:`InverseRule`), chosen by its name in the registry."""
    name = re.split(r"[:+]", text.strip().lower(), maxsplit=1)[0].strip()
    return _RULES.get(name, _FALLBACK).parse(text)
