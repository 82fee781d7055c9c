"""Repo ids (``org/name``) and revisions, checked before they build a path or a git command line.

They sit below the hub: the registry of pulled models and training's ``--init-from`` parse them
too, and a hostile hub must not make dphub write outside its target directory or run git with an
option (see :mod:`dphub.hub.common`).
"""

from __future__ import annotations

import re

from dphub.errors import HubError

#: One component of a repo id: what the Hugging Face Hub accepts, minus anything path-like.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
#: A revision: a branch, tag or (abbreviated) commit sha; never an option or a range.
_REV_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")


def check_repo_id(repo_id: str) -> str:
    """Return ``repo_id`` if it is ``org/name`` with safe components, else raise HubError."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_NAME_RE.match(p) for p in parts) or ".." in repo_id:
        raise HubError(
            f"invalid repo id {repo_id!r}: expected org/name (letters, digits, '.', '_', '-')"
        )
    return repo_id


def check_revision(revision: str) -> str:
    """Return ``revision`` if it is a plausible branch/tag/sha (no '..', no leading '-')."""
    if not _REV_RE.match(revision) or ".." in revision or revision.endswith((".lock", "/")):
        raise HubError(f"invalid revision {revision!r}")
    return revision


def is_commit_sha(revision: str) -> bool:
    return bool(_SHA_RE.match(revision))


def parse_repo_spec(spec: str) -> tuple[str, str | None]:
    """Split ``org/name[@revision]`` into a checked repo id and revision (None: latest)."""
    repo_id, _, revision = spec.partition("@")
    check_repo_id(repo_id)
    if revision:
        check_revision(revision)
    return repo_id, revision or None
