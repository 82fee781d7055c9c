"""The privacy ledger: a site-local record of every release computed from a dataset.

Why: each release spends ε on its patients, and what a patient loses is the composition over
every release that used them, not one card's ε. The ledger lets a new release find the earlier
ones it depends on (an ``--init-from`` parent, a distillation's teachers) and check a trainer's
declaration that a parent saw none of these patients; ``dphub ledger show`` lists a dataset's
spend.

What it holds, in ``<dphub home>/ledger/`` (directory 0700, files 0600, never published):

* ``patient.key``: a per-user random secret (created on first use);
* ``ledger.json``: one record per release: its weights digest, kind, (ε, δ, unit), its Gaussian
  history when it is one DP-SGD run, the weights digests of its parents, and the set of keyed
  patient digests (HMAC-SHA256 of each patient id under the key). Never a patient id, a note, a
  path or a note text. A keyed digest means nothing outside this home, so it never goes on a card.

A dataset is identified by its set of keyed patient digests: two runs on the same notes, or one
on a superset, share digests whatever the paths; ``overlap`` is the number shared.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError
from dphub.io import atomic_write_text, dphub_home, private_key, read_small_file
from dphub.notes import Note
from dphub.privacy.composition import Composed, GaussianSteps, Part, compose

LEDGER_DIR = "ledger"
KEY_FILE = "patient.key"
LEDGER_FILE = "ledger.json"
LOCK_FILE = ".lock"
LEDGER_FORMAT = 1
#: Largest ledger file read (a record per release; a million patients' digests is ~70 MB)
MAX_LEDGER_BYTES = 512 * 1024 * 1024
_KEY_BYTES = 32
#: release kinds: what produced the release
KINDS = ("train", "init_from", "distill", "public_student", "federated_round")


def ledger_dir() -> Path:
    """``<dphub home>/ledger``: where the key and the records live."""
    return dphub_home() / LEDGER_DIR


def _private_dir() -> Path:
    d = ledger_dir()
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.stat(d, follow_symlinks=False)
    except OSError as e:
        raise ConfigError(f"cannot create the privacy ledger {d} "
                          f"({e.strerror or type(e).__name__})") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ConfigError(f"the privacy ledger {d} is not a private directory of yours "
                          "(mode 700): fix its owner and mode")
    return d


def ledger_key() -> bytes:
    """The per-user secret of the keyed patient digests, created (random, 0600) on first use
    (:func:`dphub.io.private_key`: two processes end with one key)."""
    path = _private_dir() / KEY_FILE
    try:
        return private_key(path, _KEY_BYTES)
    except OSError as e:
        raise ConfigError(f"cannot read or create the ledger key {path} "
                          f"({e.strerror or type(e).__name__})") from None
    except ValueError:
        raise ConfigError(f"the ledger key {path} is not a private key file of yours "
                          f"({_KEY_BYTES} bytes, mode 600)") from None


def patient_digests(notes: Iterable[Note], key: bytes | None = None) -> frozenset[str]:
    """The keyed digests of the notes' patients (a note without a patient id is its own
    patient, digested from its note id): HMAC-SHA256 under :func:`ledger_key`."""
    key = ledger_key() if key is None else key
    ids = {f"p:{n.patient_id}" if n.patient_id else f"n:{n.id}" for n in notes}
    return frozenset(hmac.new(key, i.encode("utf-8"), hashlib.sha256).hexdigest() for i in ids)


def dataset_digest(digests: Iterable[str]) -> str:
    """One name for a set of keyed patient digests (local: it means nothing without the key)."""
    h = hashlib.sha256()
    for d in sorted(digests):
        h.update(d.encode("ascii") + b"\n")
    return h.hexdigest()


@dataclass(frozen=True)
class Release:
    """One release computed from a dataset (see the module docstring for what is kept)."""

    release: str  # weights SHA-256 of the model released
    kind: str
    epsilon: float  # the release's card claim (already composed with what it depends on)
    delta: float
    privacy_unit: str
    patients: frozenset[str]
    history: tuple[GaussianSteps, ...] = ()
    parents: tuple[str, ...] = ()
    created: float = field(default_factory=time.time)

    @property
    def dataset(self) -> str:
        return dataset_digest(self.patients)

    def to_json(self) -> dict[str, Any]:
        return {"release": self.release, "kind": self.kind, "epsilon": float(self.epsilon),
                "delta": float(self.delta), "privacy_unit": self.privacy_unit,
                "history": [s.to_json() for s in self.history], "parents": list(self.parents),
                "dataset": self.dataset, "patients": sorted(self.patients),
                "created": round(float(self.created), 3)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Release:
        return cls(str(d["release"]), str(d["kind"]), float(d["epsilon"]), float(d["delta"]),
                   str(d["privacy_unit"]), frozenset(map(str, d["patients"])),
                   tuple(GaussianSteps.from_json(s) for s in d.get("history") or []),
                   tuple(map(str, d.get("parents") or [])), float(d.get("created") or 0.0))

    def part(self) -> Part:
        return Part(self.epsilon, self.delta, self.history)


@dataclass
class Ledger:
    releases: list[Release]

    def find(self, release: str | None) -> Release | None:
        """The record of the release with these weights (None: not released here)."""
        return next((r for r in self.releases if release and r.release == release), None)

    def overlapping(self, patients: frozenset[str]) -> list[tuple[Release, int]]:
        """Every release sharing a patient with ``patients``, with the number shared."""
        return [(r, len(r.patients & patients)) for r in self.releases
                if not r.patients.isdisjoint(patients)]

    def spend(self, patients: frozenset[str]) -> Composed | None:
        """What the patients of ``patients`` lost over every release that used any of them:
        the composition of those releases (an upper bound for each such patient); None when
        none did. Releases that depend on another (``parents``) already include it."""
        rel = [r for r, _ in self.overlapping(patients)]
        included = {p for r in rel for p in r.parents}
        tops = [r for r in rel if r.release not in included]
        return compose([r.part() for r in tops]) if tops else None


def _read(path: Path) -> Ledger:
    try:
        raw = read_small_file(path, MAX_LEDGER_BYTES, what="the privacy ledger")
    except FileNotFoundError:
        return Ledger([])
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the privacy ledger ({e.strerror})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
        if data.get("format") != LEDGER_FORMAT:
            raise ValueError
        return Ledger([Release.from_json(r) for r in data["releases"]])
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(f"{path}: the privacy ledger is not a dphub ledger (format "
                          f"{LEDGER_FORMAT}); it was not changed") from None


@contextlib.contextmanager
def _locked() -> Iterator[Path]:
    d = _private_dir()
    fd = os.open(d / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield d / LEDGER_FILE
    finally:
        os.close(fd)


def load_ledger() -> Ledger:
    """The ledger of this user (empty when nothing was recorded yet)."""
    with _locked() as path:
        return _read(path)


def record_release(release: Release) -> None:
    """Add ``release`` (replacing an earlier record of the same weights), atomically, 0600."""
    if release.kind not in KINDS:
        raise ConfigError(f"internal: unknown release kind {release.kind!r}")
    with _locked() as path:
        ledger = _read(path)
        kept = [r.to_json() for r in ledger.releases if r.release != release.release]
        text = json.dumps({"format": LEDGER_FORMAT, "releases": [*kept, release.to_json()]},
                          sort_keys=True) + "\n"
        atomic_write_text(path, text)  # mkstemp: 0600


def amend_release(release: str, *, kind: str, epsilon: float, delta: float,
                  composed: bool) -> None:
    """Re-record a release under its final kind and claim (a distillation amends the card of
    the student its training recorded); ``composed``: the claim is a composition, so its
    Gaussian history alone no longer describes it. Nothing recorded: nothing to amend."""
    with _locked() as path:
        rec = _read(path).find(release)
    if rec is None:
        return
    record_release(Release(rec.release, kind, epsilon, delta, rec.privacy_unit, rec.patients,
                           () if composed else rec.history, rec.parents, rec.created))


def record_inherited(release: str, parent: str) -> None:
    """Record a release that spends nothing itself but carries ``parent``'s guarantee (a public
    student: post-processing of its teacher), with the parent's patients and claim. A parent
    this ledger does not know (trained elsewhere) leaves nothing to record."""
    with _locked() as path:
        ledger = _read(path)
    rec = ledger.find(parent)
    if rec is None:
        return
    record_release(Release(release, "public_student", rec.epsilon, rec.delta, rec.privacy_unit,
                           ancestry(ledger, [parent]), rec.history, (parent,)))


def federated_release_id(site_id: str) -> str:
    """The ledger record of a federated site's spend (one per site and federation)."""
    return hashlib.sha256(f"federated-site:{site_id}".encode()).hexdigest()


def record_federated_round(site_id: str, steps: GaussianSteps, *, epsilon: float,
                           delta: float, privacy_unit: str, patients: frozenset[str]) -> None:
    """Record (or update) a federated site's spend: one record per site, its one accountant over
    all its rounds so far (the server's model is post-processing of the sites' updates)."""
    record_release(Release(federated_release_id(site_id), "federated_round", epsilon, delta,
                           privacy_unit, patients, (steps,)))


@dataclass(frozen=True)
class DatasetSpend:
    """One dataset's entry in ``dphub ledger show``: the releases that used any of its patients
    (with the number of its patients each used) and their composition."""

    dataset: str
    patients: int
    releases: tuple[tuple[Release, int], ...]
    total: Composed | None


def dataset_spend(ledger: Ledger, patients: frozenset[str]) -> DatasetSpend:
    """What the releases recorded here spent on ``patients`` (see :meth:`Ledger.spend`)."""
    rel = tuple(sorted(ledger.overlapping(patients), key=lambda x: x[0].created))
    return DatasetSpend(dataset_digest(patients), len(patients), rel, ledger.spend(patients))


def all_datasets(ledger: Ledger) -> list[DatasetSpend]:
    """Every dataset released from here (one per distinct patient set), oldest first."""
    seen: dict[str, frozenset[str]] = {}
    for r in sorted(ledger.releases, key=lambda r: r.created):
        seen.setdefault(r.dataset, r.patients)
    return [dataset_spend(ledger, p) for p in seen.values()]


def ancestry(ledger: Ledger, parents: Sequence[str]) -> frozenset[str]:
    """The patients of the recorded parents and their recorded ancestors."""
    out: set[str] = set()
    todo, seen = list(parents), set()
    while todo:
        sha = todo.pop()
        if sha in seen:
            continue
        seen.add(sha)
        rec = ledger.find(sha)
        if rec is not None:
            out |= rec.patients
            todo.extend(rec.parents)
    return frozenset(out)


__all__ = ["KINDS", "DatasetSpend", "Ledger", "Release", "all_datasets", "amend_release",
           "ancestry", "dataset_spend", "record_federated_round", "record_inherited", "dataset_digest", "ledger_dir",
           "ledger_key", "load_ledger", "patient_digests", "record_release"]
