"""The model kind: a DP tagger pulled from a hub (``org/name[@rev]``, manifest kind
``registry``) or in a directory (``DIR``, kind ``dir``); the kind of every spec without a
registered prefix."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, ClassVar

from dphub.ensemble.core import Slot, TaggerCache, load_model_member
from dphub.ensemble.kinds import MemberKind, register_member_kind
from dphub.ensemble.manifest import MemberEntry, card_privacy, model_dir_of, weights_digest
from dphub.errors import ConfigError, HubError
from dphub.registry import Registry
from dphub.repo_ids import parse_repo_spec


def _looks_like_path(arg: str, p: Path) -> bool:
    """Whether a spec that is no directory was meant as a path, not a hub repo: it starts like a
    path, names something that exists (a file), or lies in a directory that exists (``models/x``
    with ``./models`` present). Why: ``ensemble add models/nope`` advised ``dphub pull``."""
    return (arg.startswith((".", "/", "~")) or os.path.lexists(p)
            or ("/" in arg and p.parent != Path(".") and p.parent.is_dir()))


def _close(word: str, candidates: list[str]) -> str:
    return " or ".join(difflib.get_close_matches(word, sorted(set(candidates)), n=3, cutoff=0.6))


def _no_directory(arg: str, p: Path) -> str:
    """The message for a path that is not a model directory, with the closest siblings."""
    if os.path.lexists(p):
        return f"{arg}: not a directory (a model is a directory with model.safetensors and a card)"
    try:
        siblings = [str(p.parent / d.name) if str(p.parent) != "." else d.name
                    for d in p.parent.iterdir() if d.is_dir() and not d.name.startswith(".")]
    except OSError:
        siblings = []
    close = _close(str(p), siblings)
    return f"{arg}: no such model directory" + (f"; did you mean {close}?" if close else "")


class ModelKind(MemberKind):
    """A DP model member, pinned by registry revision or weights digest."""

    kinds: ClassVar[tuple[str, ...]] = ("registry", "dir")
    model: ClassVar[bool] = True

    def parse(self, arg: str, *, name: str | None, threshold: float | None,
              timeout: float | None) -> MemberEntry:
        p = Path(arg).expanduser()
        if p.is_dir():
            priv = card_privacy(p)
            return MemberEntry(
                name=name or p.resolve().name,
                kind="dir",
                path=str(p.resolve()),
                revision=weights_digest(p),
                threshold=threshold,
                epsilon=priv.get("epsilon"),
                delta=priv.get("delta"),
                unit=priv.get("privacy_unit"),
            )
        if _looks_like_path(arg, p):
            raise ConfigError(_no_directory(arg, p))
        if not re.fullmatch(r"[\w.-]+/[\w.-]+(@[\w.-]+)?", arg):
            raise ConfigError(f"{arg!r} is neither a model directory, a hub repo (org/name[@rev]), "
                              "rules:default, deidpl:DIR nor presidio:default")
        repo, rev = parse_repo_spec(arg)
        registry = Registry()
        try:
            entry = registry.get(repo, rev)
        except HubError as e:
            close = _close(repo, [x.name for x in registry.list()])
            raise HubError(e.message + (f"; did you mean {close}?" if close else "")) from None
        return MemberEntry(
            name=name or repo,
            kind="registry",
            repo=repo,
            revision=entry.revision,
            threshold=threshold,
            epsilon=entry.epsilon,
            delta=getattr(entry, "delta", None),
            unit=entry.unit,
        )

    def load(self, entry: MemberEntry, *, batch_size: int = 16, int8: bool = False,
             taggers: TaggerCache | None = None) -> Slot:
        path = model_dir_of(entry)
        member = load_model_member(path, entry.name, pin=entry.revision, int8=int8,
                                   taggers=taggers, epsilon=entry.epsilon, unit=entry.unit,
                                   revision=entry.revision, batch_size=batch_size)
        return Slot(member, entry.threshold, entry.epsilon, entry.unit, entry.revision,
                    dict(entry.label_thresholds) or None, entry.delta)

    def for_worker(self, entry: MemberEntry) -> dict[str, Any]:
        """A directory member on the resolved path; a registry member resolved by this (the
        driver's) registry to its directory, pinned by weights digest. Why: a worker on another
        node has its own registry (or none); the driver has verified the pulled files, and the
        digest it pins is checked again by every worker."""
        d = entry.to_dict()
        if entry.kind == "registry":
            path = model_dir_of(entry).resolve()
            d.pop("repo", None)
            d.update(kind="dir", path=str(path), revision=weights_digest(path))
        else:
            d["path"] = str(Path(entry.path or "").resolve())
        return d


KIND = register_member_kind(ModelKind())

__all__ = ["KIND", "ModelKind"]


