"""The Presidio kind: ``presidio:default`` (presidio-analyzer with its default recognizers, if
the ``presidio`` extra is installed), pinned by the installed versions."""

from __future__ import annotations

from typing import ClassVar

from dphub.ensemble.core import Slot, TaggerCache
from dphub.ensemble.kinds import MemberKind, register_member_kind
from dphub.ensemble.manifest import MemberEntry
from dphub.ensemble.peers import PRESIDIO_SPECS, PresidioMember, presidio_versions
from dphub.errors import ConfigError


class PresidioKind(MemberKind):
    """Presidio's analyzer as a member (option ``entities``: the entity types to use)."""

    kinds: ClassVar[tuple[str, ...]] = ("presidio",)
    prefix: ClassVar[str | None] = "presidio"

    def parse(self, arg: str, *, name: str | None, threshold: float | None,
              timeout: float | None) -> MemberEntry:
        spec = f"{self.prefix}:{arg}"
        if spec not in PRESIDIO_SPECS:
            raise ConfigError(f"unknown Presidio member {spec!r}; available: "
                              f"{', '.join(PRESIDIO_SPECS)}")
        return MemberEntry(name=name or spec, kind="presidio", revision=presidio_versions(),
                           threshold=threshold)

    def load(self, entry: MemberEntry, *, batch_size: int = 16, int8: bool = False,
             taggers: TaggerCache | None = None) -> Slot:
        unknown = set(entry.options) - {"entities"}
        entities = entry.options.get("entities")
        if unknown or not (entities is None or (isinstance(entities, list) and all(
                isinstance(e, str) for e in entities))):
            raise ConfigError(f"member {entry.name!r}: the only option is entities (a list of "
                              "Presidio entity types)")
        member = PresidioMember(entry.name, revision=entry.revision, entities=entities)
        return Slot(member, entry.threshold, None, None, entry.revision)


KIND = register_member_kind(PresidioKind())

__all__ = ["KIND", "PresidioKind"]
