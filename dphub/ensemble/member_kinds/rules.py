"""The rule kind: ``rules:default`` (:mod:`dphub.rules`: patterns and dictionaries, ε = 0),
options from the manifest (:class:`~dphub.rules.engine.RuleOptions`)."""

from __future__ import annotations

from typing import ClassVar

from dphub.ensemble.core import Slot, TaggerCache
from dphub.ensemble.kinds import MemberKind, register_member_kind
from dphub.ensemble.manifest import MemberEntry
from dphub.ensemble.members import Member
from dphub.errors import ConfigError
from dphub.rule_features import shared_rule_member
from dphub.rules.engine import RULES_DEFAULT, RuleMember, RuleOptions

#: the rule members a spec may name
RULE_SPECS = (RULES_DEFAULT,)


class RulesKind(MemberKind):
    """The rule engine as a member: no model, no privacy cost (ε = 0)."""

    kinds: ClassVar[tuple[str, ...]] = ("rules",)
    prefix: ClassVar[str | None] = "rules"

    def parse(self, arg: str, *, name: str | None, threshold: float | None,
              timeout: float | None) -> MemberEntry:
        spec = f"{self.prefix}:{arg}"
        if spec not in RULE_SPECS:
            raise ConfigError(f"unknown rule member {spec!r}; available: {', '.join(RULE_SPECS)}")
        return MemberEntry(name=name or spec, kind="rules", threshold=threshold, epsilon=0.0)

    def load(self, entry: MemberEntry, *, batch_size: int = 16, int8: bool = False,
             taggers: TaggerCache | None = None) -> Slot:
        options = RuleOptions.from_dict(entry.options)
        if entry.name == RULES_DEFAULT and options == RuleOptions():
            # the instance rule features use: each note is scanned once for both
            member: Member = shared_rule_member()
        else:
            member = RuleMember(entry.name, options)
        return Slot(member, entry.threshold, 0.0, None, None)

    def describe(self, entry: MemberEntry, where: str) -> str:
        """Which ages it flags, said where it is chosen (the README's figures use ``min_age =
        90`` while the default flags every age, and the two differ in precision)."""
        min_age = RuleOptions.from_dict(entry.options).min_age
        if min_age:
            return f"{entry.name}: flags ages of {min_age} and over (min_age = {min_age})"
        return (f"{entry.name}: flags EVERY age (min_age = 0, as i2b2-2014 and dphub's own "
                "models label ages). HIPAA Safe Harbor needs only ages over 89, as in the "
                "README's rule figures: give this member options = { min_age = 90 } in "
                f"{where} for fewer false positives on ages")


KIND = register_member_kind(RulesKind())

__all__ = ["KIND", "RULE_SPECS", "RulesKind"]
