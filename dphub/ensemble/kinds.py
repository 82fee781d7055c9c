"""Member kinds by name: one registry, one spec parser (Opacus-style, like
``opacus/accountants/registry.py`` and :mod:`dphub.ensemble.aggregation`).

Why: a member's kind was chosen by spec prefix in the manifest, the CLI and the peers
(``spec.startswith("deidpl:")`` ...). Now :func:`parse_spec` is the one place a spec is split:
``PREFIX:ARG`` goes to the kind that registered PREFIX, any other spec (a model directory,
``org/name[@rev]``) to the kind registered without a prefix. A kind is one :class:`MemberKind`
object: it turns the argument into a pinned manifest entry (``parse``), an entry into an
ensemble slot (``load``; ``for_worker``: the entry a Ray worker loads), and says what a listing
should add about an entry (``describe``).
The built-in kinds are :mod:`dphub.ensemble.member_kinds` (registered when ``dphub.ensemble``
is imported); adding one is one module that registers itself (docs/extending.md).

``parse`` returns a :class:`~dphub.ensemble.manifest.MemberEntry` and ``load`` a
:class:`~dphub.ensemble.core.Slot`; both modules sit above this one (they look kinds up here).
"""

from __future__ import annotations

from typing import Any, ClassVar

from dphub.errors import ConfigError


class MemberKind:
    """One kind of ensemble member (subclass it; register an instance)."""

    #: the manifest ``kind`` values of its entries (the model kind writes ``registry`` or ``dir``)
    kinds: ClassVar[tuple[str, ...]] = ()
    #: the spec prefix before the first ``:`` (``rules`` for ``rules:default``); None: the kind
    #: of every spec without a registered prefix (one kind at most)
    prefix: ClassVar[str | None] = None
    #: its members run a DP model's encoder (runtimes, int8, Viterbi decoding without threshold)
    model: ClassVar[bool] = False
    #: ``ensemble add --timeout`` applies to it
    takes_timeout: ClassVar[bool] = False

    def parse(self, arg: str, *, name: str | None, threshold: float | None,
              timeout: float | None) -> Any:
        """The pinned :class:`~dphub.ensemble.manifest.MemberEntry` of spec ``PREFIX:arg``."""
        raise NotImplementedError

    def load(self, entry: Any, *, batch_size: int = 16, int8: bool = False,
             taggers: dict[Any, Any] | None = None) -> Any:
        """The :class:`~dphub.ensemble.core.Slot` of a manifest entry (pins verified)."""
        raise NotImplementedError

    def for_worker(self, entry: Any) -> dict[str, Any]:
        """``entry`` as a Ray worker on another node loads it (:mod:`dphub.ray_engine`)."""
        d: dict[str, Any] = entry.to_dict()
        return d

    def describe(self, entry: Any, where: str) -> str | None:
        """A line ``ensemble add`` and ``ensemble list`` print about ``entry`` (of the manifest
        ``where``), or None."""
        return None


_KINDS: dict[str, MemberKind] = {}
_PREFIXES: dict[str, MemberKind] = {}


def register_member_kind(kind: MemberKind) -> MemberKind:
    """Make ``kind`` the parser of its prefix and the loader of its manifest kinds."""
    taken = [k for k in kind.kinds if k in _KINDS]
    prefix = kind.prefix or ""
    if not kind.kinds or taken or prefix in _PREFIXES or ":" in prefix:
        raise ValueError(f"member kind {type(kind).__name__}: kinds {kind.kinds} or prefix "
                         f"{kind.prefix!r} empty, taken or with ':'")
    for k in kind.kinds:
        _KINDS[k] = kind
    _PREFIXES[prefix] = kind
    return kind


def unregister_member_kind(kind: MemberKind) -> None:
    """Forget ``kind`` (tests register toy kinds for one test)."""
    for k in kind.kinds:
        _KINDS.pop(k, None)
    _PREFIXES.pop(kind.prefix or "", None)


def kind_names() -> tuple[str, ...]:
    """The manifest ``kind`` values registered, in registration order."""
    return tuple(_KINDS)


def member_kind(name: str) -> MemberKind:
    """The kind that loads manifest entries of ``kind = name``."""
    try:
        return _KINDS[name]
    except KeyError:
        raise ConfigError(f"unknown member kind {name!r}; choose one of "
                          f"{', '.join(_KINDS)}") from None


def parse_spec(spec: str) -> tuple[MemberKind, str]:
    """``(kind, argument)`` of a member spec: the one place a spec's prefix is read."""
    prefix, sep, arg = spec.partition(":")
    if sep and prefix and prefix in _PREFIXES:
        return _PREFIXES[prefix], arg
    if "" not in _PREFIXES:
        raise ConfigError(f"{spec!r}: no member kind reads it (known prefixes: "
                          f"{', '.join(p + ':' for p in _PREFIXES)})")
    return _PREFIXES[""], spec
