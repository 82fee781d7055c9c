"""The deid.pl kind: ``deidpl:DIR[/CONFIG]``, the PhysioNet tool run as a separate program
(:class:`~dphub.ensemble.peers.DeidPlMember`), pinned by the digest of its files."""

from __future__ import annotations

from typing import Any, ClassVar

from dphub.ensemble.core import Slot, TaggerCache
from dphub.ensemble.kinds import MemberKind, register_member_kind
from dphub.ensemble.manifest import MemberEntry
from dphub.ensemble.peers import DeidPlMember, deidpl_digest, deidpl_options, deidpl_paths


class DeidPlKind(MemberKind):
    """deid.pl in the owner's directory (needs perl)."""

    kinds: ClassVar[tuple[str, ...]] = ("deidpl",)
    prefix: ClassVar[str | None] = "deidpl"
    takes_timeout: ClassVar[bool] = True

    def parse(self, arg: str, *, name: str | None, threshold: float | None,
              timeout: float | None) -> MemberEntry:
        directory, config = deidpl_paths(arg)
        options: dict[str, Any] = {"config": config}
        if timeout is not None:
            options["timeout"] = timeout
        deidpl_options(options, name or "deidpl")
        return MemberEntry(name=name or "deidpl", kind="deidpl", path=str(directory),
                           revision=deidpl_digest(directory, config), threshold=threshold,
                           options=options)

    def load(self, entry: MemberEntry, *, batch_size: int = 16, int8: bool = False,
             taggers: TaggerCache | None = None) -> Slot:
        opts = deidpl_options(entry.options, entry.name)
        member = DeidPlMember(entry.name, entry.path or "", revision=entry.revision, **opts)
        member.check()
        return Slot(member, entry.threshold, None, None, entry.revision)


KIND = register_member_kind(DeidPlKind())

__all__ = ["KIND", "DeidPlKind"]
