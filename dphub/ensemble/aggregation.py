"""Aggregation rules by name: one registry, one parser (Opacus-style, like
``opacus/accountants/registry.py``).

Why: "is this the inverse rule?" was asked by string prefix in the runner and the Ray engine and
by type elsewhere. Now the name before the first ``:`` or ``+`` picks a class here, the class
parses the rest, and callers ask the parsed rule what it needs (``uses_safe_vocabulary``).
Adding a rule is one class with ``parse``, ``check``, ``weight``, ``__str__`` and
``uses_safe_vocabulary``, plus one :func:`register_rule` call.
"""

from __future__ import annotations

import re
from typing import Protocol

from dphub.ensemble.aggregate import AggregateRule
from dphub.ensemble.inverse import InverseRule


class AggregationRule(Protocol):
    """What the ensemble, the runner and the Ray engine read from a parsed rule."""

    k: int
    alone: tuple[str, ...]
    #: the rule reads the safe vocabulary (its digest pins a resumed or distributed run)
    uses_safe_vocabulary: bool

    def check(self, names: list[str]) -> None: ...
    def weight(self, name: str) -> int: ...


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


def parse_rule(text: str) -> AggregateRule | InverseRule:
    """Any aggregation rule: ``any``, ``k-of-n:...`` (:class:`AggregateRule`) or
    ``inverse[:LOW,HIGH]`` (:class:`InverseRule`), chosen by its name in the registry."""
    name = re.split(r"[:+]", text.strip().lower(), maxsplit=1)[0].strip()
    return _RULES.get(name, _FALLBACK).parse(text)
