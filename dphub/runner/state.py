"""Run state of a resumable de-identification run: the journal, the part files, the settings.

Why a module of its own: everything that lets a killed run be resumed without losing or
duplicating a note lives in ``OUT/.dphub-run/`` (0700, every file 0600), and the rules for it are
one concern: the append-only journal of keys and statuses (fsynced, a torn last line dropped),
the per-batch part files a finished note's audit record and JSONL record go to, the settings a
resumed run must match (input, mode, ensemble, a fingerprint of the surrogate key, never the
key), clean-up of temp files a killed run left, and removal of the state of a run that wrote
nothing. The run itself (:mod:`dphub.runner`) decides when to write what.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError, DphubError
from dphub.io import atomic_write_text, dphub_home, jsonl_lines, private_key

RUN_DIR = ".dphub-run"
JOURNAL = "journal.jsonl"
PARAMS = "run.json"
PARTS = "parts"
LOCK = "lock"
#: the per-user secret of the keyed note digests, under the dphub home
NOTE_KEY = Path("review") / "note.key"
_NOTE_KEY_BYTES = 32


def key_fingerprint(key: bytes | None) -> str | None:
    """A digest that tells two surrogate keys apart without revealing either (None: no key).

    Why: surrogates are keyed, so a run resumed with another key mixes two mappings in one output.
    The fingerprint is a salted SHA-256 of the key, truncated: enough to compare, useless to
    recover a key of the required length.
    """
    if key is None:
        return None
    return hashlib.sha256(b"dphub surrogate key fingerprint\x00" + key).hexdigest()[:24]


def note_digest_key(*, create: bool = True) -> bytes | None:
    """The per-user secret that keys each note's digest in the audit (created 0600 on first
    use, :func:`dphub.io.private_key`); None when the dphub home cannot hold it.

    Why keyed (issue 54): ``dphub review`` must check that ``--notes`` is the text the run read,
    so the audit records a digest per note. A plain hash would let anyone holding the released
    output and audit (every character but the hidden ones, and their lengths) confirm a guessed
    name by hashing the filled-in note; an HMAC under a key that never leaves this home confirms
    nothing. Without a key the run goes on without digests (review then says it cannot check).
    ``create=False`` (review): only read an existing key.
    """
    path = dphub_home() / NOTE_KEY
    if not create and not path.is_file():
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return private_key(path, _NOTE_KEY_BYTES)
    except (OSError, ValueError, DphubError):
        return None


def note_key_fingerprint(key: bytes) -> str:
    """Tells note-digest keys apart (recorded in ``run.json``) without revealing the key."""
    return hashlib.sha256(b"dphub note digest key fingerprint\x00" + key).hexdigest()[:24]


def note_digest(key: bytes, text: str) -> str:
    """HMAC-SHA256 of a note's text (UTF-8) under :func:`note_digest_key`, truncated to 128
    bits: enough to tell two texts apart, nothing without the key."""
    return hmac.new(key, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:32]


def _private_dir(path: Path) -> None:
    """Create ``path`` (and parents) and make it 0700: run state may describe PHI."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)


@dataclass
class Journal:
    """Append-only record of finished/failed notes (keys and status only); tolerates a torn line."""

    path: Path
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def open(cls, path: Path, *, resume: bool) -> Journal:
        j = cls(path)
        if path.exists():
            if not resume:
                raise ConfigError(f"{path.parent.parent}: holds an earlier run; pass --resume "
                                  "to continue it, or choose another --out")
            good: list[str] = []
            for _, line in jsonl_lines(path, errors="replace"):  # "\n" only, never splitlines()
                try:
                    e = json.loads(line)
                except json.JSONDecodeError:
                    break  # torn write: everything after it is gone
                good.append(line.rstrip("\r\n") + "\n")
                j.entries[e["key"]] = e
            atomic_write_text(path, "".join(good))  # 0600 (mkstemp)
        else:
            _private_dir(path.parent)
        return j

    def done(self, key: str) -> bool:
        return self.entries.get(key, {}).get("status") == "done"

    def append(self, entries: Sequence[dict[str, Any]]) -> None:
        if not entries:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            for e in entries:
                fh.write(json.dumps(e, sort_keys=True) + "\n")
                self.entries[e["key"]] = e
            fh.flush()
            os.fsync(fh.fileno())


class _PartCache:
    """Records of the part files, one file held in memory at a time (the last one read)."""

    def __init__(self, parts_dir: Path) -> None:
        self.parts_dir = parts_dir
        self.name: str | None = None
        self.records: dict[str, dict[str, Any]] = {}

    def get(self, name: str, key: str) -> dict[str, Any] | None:
        if not name:
            return None
        if name != self.name:
            self.records = _load_parts(self.parts_dir, {name}).get(name, {})
            self.name = name
        return self.records.get(key)


def _load_parts(parts_dir: Path, names: set[str]) -> dict[str, dict[str, Any]]:
    """key -> {"audit", "record"?} from the part files the journal names."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(names):
        f = parts_dir / name
        if not f.is_file():
            raise ConfigError(f"{parts_dir.parent.parent}: run state is incomplete (a part file "
                              "is missing); start over in another --out")
        # "\n" only: a note's U+2028, U+2029 or U+0085 is raw inside a record (ensure_ascii=False),
        # and str.splitlines() cut the record there (issue 54: one such note aborted the run)
        for _, line in jsonl_lines(f):
            if not line.strip():
                continue
            rec = json.loads(line)
            out.setdefault(name, {})[rec["key"]] = rec
    return out


def _read_params(path: Path) -> dict[str, Any] | None:
    """The run state file (``{"settings", "status", "notes"}``); None when absent or unreadable."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if "settings" not in data:  # written by an older dphub: the settings themselves
        data = {"settings": data, "status": "running"}
    return data


def _check_settings(root: Path, before: dict[str, Any], now: dict[str, Any]) -> None:
    """A resumed run must use the same input, mode, key and ensemble, or outputs would mix."""
    now = json.loads(json.dumps(now))
    changed = sorted(k for k in set(now) | set(before) if before.get(k) != now.get(k))
    if not changed:  # (a setting an older run state lacks counts as unset)
        return
    if "key" in changed:
        raise ConfigError(f"{root}: was started with a different --key-file (the key fingerprints "
                          "differ); resume with the same key, or start over in another --out")
    raise ConfigError(f"{root}: was started with different settings ({', '.join(changed)}); "
                      f"resume with the same ones, or start over in another --out (or remove "
                      f"{root})")


def _remove_stale_temps(root: Path) -> None:
    """Delete temp files a killed run left behind (``dphub.io`` names them ``.<name>.*.tmp``)."""
    for p in root.rglob(".*.tmp"):
        if p.is_file() and re.fullmatch(r"\..+\.[^.]+\.tmp", p.name):
            p.unlink(missing_ok=True)


def _discard_unused_state(dst: Path, *, created_out: bool, created_run: bool) -> None:
    """After a run that ended before finishing any note and wrote no output: remove its state.

    Why: a leftover ``run.json`` made the retry (often with corrected settings) fail with
    "started with different settings" although there was nothing to resume. State of an earlier
    run that finished notes is never touched; what the refused run created is removed.
    """
    run_dir = dst / RUN_DIR
    try:
        journal = run_dir / JOURNAL
        has_entries = journal.is_file() and bool(journal.read_text(encoding="utf-8").strip())
        params = _read_params(run_dir / PARAMS)
    except OSError:
        return
    if has_entries or (params is not None and params.get("status") == "complete"):
        return
    if params is not None and not created_run and any(p.name != RUN_DIR for p in dst.iterdir()):
        return  # an earlier run's state beside outputs it wrote (killed before its journal line)
    shutil.rmtree(run_dir, ignore_errors=True)
    if created_out:
        with contextlib.suppress(OSError):
            dst.rmdir()  # only when empty


def _describe_ensemble(ensemble: Any) -> Any:
    slots = getattr(ensemble, "slots", None)
    if slots is None:
        return None
    members = []
    for s in slots:
        row: list[Any] = [s.name, s.revision, s.threshold]
        per_label = getattr(s, "label_thresholds", None)
        if per_label:  # calibrated per label: a resumed run must use the same thresholds
            row.append(dict(sorted(per_label.items())))
        members.append(row)
    rule = getattr(ensemble, "rule", "")
    out = {"rule": str(rule), "members": members}
    runtime = getattr(ensemble, "runtime", "torch")
    if runtime != "torch":  # int8 outputs differ: a resume must use the same encoder runtime
        out["runtime"] = runtime
    if getattr(rule, "uses_safe_vocabulary", False):  # issue 26: a resume must use the same safe words
        out["safe_vocab_sha256"] = ensemble.vocabulary.digest
    return out


#: An engine maps a stream of batches to ``(batch, results)`` in the same order, one result per
