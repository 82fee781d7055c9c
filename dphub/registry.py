"""The local registry of pulled models, which the ensemble, training (``--init-from``) and the hub
read. It sits below training and the hub (docs/architecture.md), so it needs nothing above them.

One JSON file, ``<dphub_home>/registry.json``, lists every verified pull (repo, hub, commit,
ε, δ, privacy unit, directory); model files live under ``<dphub_home>/models/<org>/<name>/<sha>``.
Entries are only added after a download was verified and moved into place, and the file is
rewritten atomically under a lock, so concurrent pulls never lose each other's entries.

Each entry also records the SHA-256 of every file of the pulled directory (``files``), taken when
it is registered, and :meth:`Registry.get` checks them again before a model is used: the hub
verified the download, but a byte flipped on disk afterwards (bit rot, an edit, a planted file
content) would otherwise be loaded silently. Entries registered by an older dphub carry no digests
and are not checked.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from filelock import FileLock

from dphub.errors import HubError
from dphub.io import atomic_write_text, dphub_home, file_sha256
from dphub.repo_ids import parse_repo_spec

REGISTRY_FILE = "registry.json"


@dataclass(frozen=True)
class Entry:
    """One pulled model revision."""

    name: str
    hub: str
    revision: str
    epsilon: float | None
    delta: float | None
    unit: str | None
    path: Path
    requested: str | None = None
    pulled_at: float = field(default_factory=time.time)
    #: relative file path -> sha256 hex, taken at registration (None: not recorded)
    files: dict[str, str] | None = field(default=None, compare=False, hash=False)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Entry:
        return cls(**{**d, "path": Path(d["path"])})


class Registry:
    """``Registry(root=None)``: root defaults to ``$DPHUB_HOME`` / the user data dir."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else dphub_home()
        self.file = self.root / REGISTRY_FILE

    def model_dir(self, repo_id: str, revision: str) -> Path:
        org, name = repo_id.split("/")
        return self.root / "models" / org / name / revision

    def staging_dir(self) -> Path:
        d = self.root / "models" / ".staging"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def _lock(self) -> FileLock:
        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / f".{REGISTRY_FILE}.lock"))

    def _read(self) -> list[Entry]:
        if not self.file.is_file():
            return []
        try:
            data = json.loads(self.file.read_text(encoding="utf-8"))
            return [Entry.from_json(e) for e in data.get("models", [])]
        except (OSError, ValueError, TypeError, KeyError):
            raise HubError(f"{self.file}: registry file is corrupt; fix or remove it") from None

    def add(self, entry: Entry) -> Entry:
        """Record ``entry``, replacing an older record of the same repo and revision.

        The digests of the entry's files are taken now (the download has just been verified)
        unless the entry already carries them.
        """
        if entry.files is None and Path(entry.path).is_dir():
            entry = replace(entry, files=file_digests(Path(entry.path)))
        with self._lock():
            entries = [e for e in self._read()
                       if not (e.name == entry.name and e.revision == entry.revision)]
            entries.append(entry)
            atomic_write_text(self.file, json.dumps(
                {"version": 1, "models": [e.to_json() for e in entries]}, indent=2) + "\n")
        return entry

    def list(self) -> list[Entry]:
        return sorted(self._read(), key=lambda e: (e.name, -e.pulled_at))

    def get(self, repo: str, revision: str | None = None) -> Entry:
        """The latest pull of ``repo``, or the one whose commit / requested tag is ``revision``."""
        cands = [e for e in self._read() if e.name == repo]
        if revision is not None:
            cands = [e for e in cands if e.revision.startswith(revision.lower())
                     or e.requested == revision]
        if not cands:
            what = f"{repo}@{revision}" if revision else repo
            raise HubError(f"model {what} is not in the local registry; run `dphub pull {what}` "
                           "first")
        best = max(cands, key=lambda e: e.pulled_at)
        if not best.path.is_dir():
            raise HubError(f"model {repo}@{best.revision[:12]} is registered but its directory "
                           f"{best.path} is gone; pull it again")
        verify_files(best)
        return best


def file_digests(root: Path) -> dict[str, str]:
    """SHA-256 of every non-hidden regular file under ``root`` (relative posix path -> hex)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            f = Path(dirpath, name)
            if f.is_file():
                out[f.relative_to(root).as_posix()] = file_sha256(f)
    return out


def verify_files(entry: Entry) -> None:
    """Refuse a pulled model whose files changed since they were registered (exit 2).

    The message names the model and the file, never content.
    """
    if not entry.files:
        return
    where = f"{entry.name}@{entry.revision[:12]}"
    for rel, digest in sorted(entry.files.items()):
        f = Path(entry.path) / rel
        try:
            ok = f.is_file() and file_sha256(f) == digest
        except OSError:
            ok = False
        if not ok:
            what = "is missing" if not f.exists() else "does not match the digest recorded at pull"
            raise HubError(f"model {where}: {rel} {what} (changed or corrupted on disk since it "
                           f"was pulled); refusing to load it; pull it again")


def resolve_model(spec: str, registry: Registry | None = None) -> Path:
    """A model directory from a directory path or a pulled ``org/name[@rev]``."""
    p = Path(spec).expanduser()
    if p.is_dir():
        return p
    if "/" not in spec or spec.startswith((".", "/", "~")):
        raise HubError(f"{spec} is neither a model directory nor an org/name[@revision] repo id")
    repo_id, revision = parse_repo_spec(spec)
    return (registry or Registry()).get(repo_id, revision).path
