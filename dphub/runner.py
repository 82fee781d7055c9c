"""Resumable de-identification runs over a directory or corpus that lose nothing.

Why this shape: a run over thousands of notes gets killed (OOM, a laptop lid, Ctrl-C), and a
half-written output or a note written twice is a privacy and correctness problem. So:

* Inputs: a directory of ``.txt`` files (read here, one file at a time, so one undecodable file
  fails alone), a ``.jsonl`` file (one record per line, ``{"id", "text", ...}``), or any corpus
  format of :mod:`dphub.formats`. Inputs are opened read-only and never modified.
* Outputs mirror the input: a directory of ``.txt`` gives the same relative paths under OUT
  (``.txt`` for tag/redact/surrogate, ``.json`` for spans, ``.txt`` + ``.ann`` for brat); other
  corpus formats give one file per note id. A JSONL input gives ONE JSONL output
  ``OUT/<input name>`` with the records in input order (``{"id", "text"}``, or ``{"id", "spans"}``
  in spans mode), assembled atomically when the run finishes. Every file is written to a temp file
  and renamed (:mod:`dphub.io`).
* Run state lives in ``OUT/.dphub-run/`` (0700; every file in it 0600), under a lock so two runs
  never write into one OUT. The journal (``journal.jsonl``, fsynced after each batch) records only
  keys, positions, status and PHI-free errors: no note text, no spans. What a finished note
  contributes to the assembled files (its audit record, and for JSONL output its rendered record)
  goes to a per-batch part file (``parts/*.jsonl``, 0600) written atomically before the journal
  line. ``resume=True`` skips finished notes and retries failed ones; a torn last journal line
  (SIGKILL mid-write) is dropped. Because rendering is deterministic (surrogates are keyed, and the
  run records a fingerprint of the key, never the key, so a resume with another key is refused), a
  resumed run's outputs are byte-identical to an uninterrupted run's, with no note missing or
  duplicated. A run that ends with every note done removes the journal and the parts and keeps
  only ``run.json`` marked complete (settings, note count), so a later ``--resume`` says "already
  complete"; a run that ends with failed notes keeps its state for ``--resume`` (part files may
  hold removed text with ``audit_text`` and rendered JSONL records: 0600 in a 0700 directory); a
  run that failed before writing anything removes its state, so a retry with other settings is
  not blocked. A full disk (or quota, or read-only OUT) stops the run with
  :class:`OutputError`; ``--resume`` continues it.
* ``OUT`` must not be the input, lie inside it or contain it; ``--resume`` needs an earlier run
  of the same settings in ``OUT``.
* The ensemble's work goes through an *engine* (:data:`Engine`): :func:`local_engine` runs it
  here; :mod:`dphub.ray_engine` runs the same batches on Ray actors. Reading, rendering, writing
  and the journal stay in this process whatever the engine, so the bytes are the same.
* ``OUT/audit.jsonl``: per note, in input order, the spans removed (offsets, label, score) and
  the members that voted; no text unless ``audit_text``.
* A note that fails (unreadable or undecodable file, a malformed record or ``.ann``, a lone
  surrogate, an output name the file system refuses, a render error) is reported by its key
  (relative path, line number or note id) and skipped; the run goes on. The CLI exits with
  :data:`EXIT_SOME_FAILED` (3) when any note failed.

Messages name files, line numbers and note ids, never text.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import inspect
import json
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from dphub import formats
from dphub.errors import ConfigError, DphubError, InputError
from dphub.formats._base import read_sidecar
from dphub.io import DiskFullError, atomic_open, atomic_write_text
from dphub.notes import Note, Span
from dphub.render import RENDERERS, key_recipe

EXIT_SOME_FAILED = 3
RUN_DIR = ".dphub-run"
JOURNAL = "journal.jsonl"
PARAMS = "run.json"
PARTS = "parts"
LOCK = "lock"
AUDIT = "audit.jsonl"
MODES = ("tag", "redact", "surrogate", "spans", "brat")
#: Longest output file name component (bytes) before it is shortened with a digest; file systems
#: refuse names over 255 bytes, and the atomic writer adds a prefix and a suffix.
MAX_NAME_BYTES = 180
#: Write errors that concern the whole output (not one note): the run stops, resumable.
_RUN_LEVEL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO}


class OutputError(DphubError):
    """OUT cannot take more files (full disk, quota, read-only): the run stops, resumable."""


# ---------------------------------------------------------------------------- input
@dataclass
class WorkItem:
    """One unit of work: its stable key, its position, the note (or why it cannot be read)."""

    key: str
    index: int
    note: Note | None
    error: str | None = None
    stem: str | None = None  # output path without suffix, relative to OUT


def _short_name(part: str) -> str:
    """A file name component within :data:`MAX_NAME_BYTES`, kept unique by a digest when cut."""
    raw = part.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_NAME_BYTES:
        return part
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return raw[: MAX_NAME_BYTES - 17].decode("utf-8", "ignore") + "-" + digest


def _safe_stem(note_id: str) -> str:
    """A relative output path for a note id (no absolute paths, no ``..``, no overlong names)."""
    parts = [p for p in re.split(r"[\\/]+", note_id) if p not in ("", ".", "..")]
    parts = [_short_name(re.sub(r"[^\w.@+-]", "_", p)) for p in parts]
    return "/".join(parts) or "note"


def _os_reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def _iter_txt_dir(root: Path) -> Iterator[WorkItem]:
    files = sorted(p for p in root.rglob("*.txt") if p.is_file() and RUN_DIR not in p.parts)
    for i, f in enumerate(files):
        rel = f.relative_to(root).as_posix()
        stem = rel[: -len(".txt")]
        try:
            data = f.read_bytes()
        except OSError as e:  # permissions, a vanished file, an I/O error: this note alone
            yield WorkItem(rel, i, None, f"{rel}: cannot read ({_os_reason(e)})", stem)
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            yield WorkItem(rel, i, None, f"{rel}: not valid UTF-8 (byte {e.start})", stem)
            continue
        if text.startswith("\ufeff"):
            text = text[1:]
        try:  # the patient id of a .meta.json sidecar, as the text format reads it
            side = read_sidecar(f)
        except (DphubError, OSError, UnicodeDecodeError):
            yield WorkItem(rel, i, None, f"{rel}: its .meta.json sidecar cannot be read (expected "
                           '{"patient_id": "...", "metadata": {...}})', stem)
            continue
        patient, metadata = side if side is not None else (None, {})
        yield WorkItem(rel, i, Note(id=stem, text=text, patient_id=patient, metadata=metadata),
                       None, stem)


def patient_pattern(pattern: str | None) -> re.Pattern[str] | None:
    """``--patient-id-from``: a regular expression with at most one group, or a ConfigError."""
    if pattern is None:
        return None
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise ConfigError(f"--patient-id-from is not a valid regular expression ({e.msg})") from None
    if rx.groups > 1:
        raise ConfigError("--patient-id-from may hold one group (the patient id), not "
                          f"{rx.groups}; make the others non-capturing: (?:...)")
    return rx


def _with_patients(items: Iterator[WorkItem], rx: re.Pattern[str] | None,
                   warn: Callable[[str], None] | None) -> Iterator[WorkItem]:
    """Give notes without a patient id one from ``rx`` (searched in the note id's file name, or
    in the whole relative id when the pattern names a ``/``), and warn once, through ``warn``,
    when notes stay without one (each is then its own patient).

    Why: surrogates and date shifts are consistent per patient; a folder of ``.txt`` has no
    patients, so the same person got two names and dates moving both ways across two files.
    A note the pattern does not match fails alone (a silent fallback would bring that back).
    """
    warned = False
    for it in items:
        note = it.note
        if note is not None and note.patient_id is None:
            if rx is not None:
                where = note.id if "/" in rx.pattern else note.id.rsplit("/", 1)[-1]
                m = rx.search(where)
                if m is None or not (m.group(1) if rx.groups else m.group(0)):
                    it = WorkItem(it.key, it.index, None, f"{it.key}: --patient-id-from "
                                  "does not match its id (no patient id)", it.stem)
                else:
                    note.patient_id = m.group(1) if rx.groups else m.group(0)
            elif warn is not None and not warned:
                warned = True
                warn("warning: the input has notes without a patient id; each such note is its "
                     "own patient, so a person mentioned in two notes gets two surrogates and "
                     "two date shifts. Give patient ids with --patient-id-from REGEX (its group "
                     "taken from the file name, e.g. '^(\\d+)-'), a .meta.json sidecar "
                     '{"patient_id": ...} beside each .txt, or a patient_id field in JSONL.')
        yield it


def _encodable(obj: Any) -> bool:
    """Whether a decoded JSON value can be written back as UTF-8 (no lone surrogates)."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, ValueError, TypeError):
        return False
    return True


def _iter_jsonl(path: Path) -> Iterator[WorkItem]:
    with open(path, "rb") as fh:
        for i, raw in enumerate(fh):
            lineno = i + 1
            key = f"line {lineno}"
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                yield WorkItem(key, i, None, f"{path.name} line {lineno}: not valid UTF-8")
                continue
            except json.JSONDecodeError as e:
                yield WorkItem(key, i, None, f"{path.name} line {lineno}: not valid JSON "
                               f"(column {e.colno})")
                continue
            except RecursionError:
                yield WorkItem(key, i, None, f"{path.name} line {lineno}: JSON nested too deeply")
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                yield WorkItem(key, i, None, f"{path.name} line {lineno}: record needs a 'text' string")
                continue
            if not _encodable(rec):
                # json.loads accepts "\ud800"; no UTF-8 output can hold it
                yield WorkItem(key, i, None, f"{path.name} line {lineno}: holds a lone surrogate "
                               "escape (\\ud800-\\udfff), which is not valid Unicode text")
                continue
            meta = rec.get("meta") if isinstance(rec.get("meta"), dict) else {}
            note_id = rec.get("id") or meta.get("note_id") or str(lineno)
            metadata = rec.get("metadata") if isinstance(rec.get("metadata"), dict) else {}
            patient = rec.get("patient_id")
            note = Note(id=str(note_id), text=rec["text"],
                        patient_id=None if patient is None else str(patient), metadata=metadata)
            yield WorkItem(key, i, note, None, _safe_stem(str(note_id)))


def _iter_format(path: Path, fmt: str | None) -> Iterator[WorkItem]:
    for i, (key, note, error) in enumerate(formats.read_each(path, format=fmt)):
        if note is None:
            yield WorkItem(key, i, None, error, None)
        else:
            yield WorkItem(note.id, i, note, None, _safe_stem(note.id))


def input_layout(path: Path, fmt: str | None) -> str:
    """``txt`` (directory of .txt), ``jsonl`` (one JSONL file) or ``corpus`` (formats.read)."""
    if (fmt in (None, "text") and path.is_dir() and any(path.rglob("*.txt"))
            and (fmt == "text" or not any(path.rglob("*.ann")))):
        return "txt"
    if fmt in (None, "jsonl") and path.is_file() and path.suffix.lower() in (".jsonl", ".ndjson"):
        return "jsonl"
    if fmt == "jsonl" and path.is_file():
        return "jsonl"
    return "corpus"


def _count_input(path: Path, layout: str) -> int | None:
    """How many notes there are, cheaply (for the progress bar); None when unknown."""
    if layout == "txt":
        return sum(1 for p in path.rglob("*.txt") if p.is_file() and RUN_DIR not in p.parts)
    if layout == "jsonl":
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    return None


def check_input(path: Path) -> None:
    """Refuse an input that is not a readable directory or regular file, saying what it is.

    ``Path.exists`` answers False for a symbolic link loop, and a FIFO "exists" but would block
    the reader forever: both used to end as "input not found" (or a hang).
    """
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError(f"{path}: symbolic link loop") from None
        if e.errno == errno.ENOENT:
            what = "broken symbolic link" if os.path.lexists(path) else "input not found"
            raise InputError(f"{path}: {what}") from None
        raise InputError(f"{path}: cannot read ({_os_reason(e)})") from None
    mode = st.st_mode
    if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
        return
    kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file")
    raise InputError(f"{path}: not a regular file or directory ({kind})")


def iter_input(path: Path, fmt: str | None = None) -> Iterator[WorkItem]:
    check_input(path)
    layout = input_layout(path, fmt)
    if layout == "txt":
        return _iter_txt_dir(path)
    if layout == "jsonl":
        return _iter_jsonl(path)
    return _iter_format(path, fmt)


# ---------------------------------------------------------------------------- rendering
class Renderer:
    """Turns (note, merged spans) into output files ``{suffix: content}`` via :mod:`dphub.render`.

    The renderer is built once per run (surrogates need the key; they are keyed per patient so a
    resumed run renders byte-identically).
    """

    def __init__(self, mode: str, key: bytes | None = None, **options: Any) -> None:
        if mode not in MODES:
            raise ConfigError(f"unknown output mode {mode!r}; choose one of {', '.join(MODES)}")
        if mode == "surrogate":
            if key is None:
                raise ConfigError("surrogate mode needs --key-file FILE (a secret key for "
                                  "consistent surrogates); " + key_recipe())
            options = {**options, "key": key}
        try:
            self._renderer = RENDERERS[mode](**options)
        except TypeError:
            raise ConfigError(f"invalid options for output mode {mode!r}") from None
        self.mode = mode

    def files(self, note: Note, spans: Sequence[Span]) -> dict[str, str]:
        out = self._renderer.render(note, spans)
        if self.mode == "brat":  # a brat document is the text plus its annotations
            return {".txt": note.text, ".ann": out}
        return {self._renderer.suffix: out}

    def jsonl_record(self, note: Note, spans: Sequence[Span]) -> dict[str, Any]:
        out = self._renderer.render(note, spans)
        if self.mode == "spans":
            return json.loads(out)
        return {"id": note.id, "text": out}


def key_fingerprint(key: bytes | None) -> str | None:
    """A digest that tells two surrogate keys apart without revealing either (None: no key).

    Why: surrogates are keyed, so a run resumed with another key mixes two mappings in one output.
    The fingerprint is a salted SHA-256 of the key, truncated: enough to compare, useless to
    recover a key of the required length.
    """
    if key is None:
        return None
    return hashlib.sha256(b"dphub surrogate key fingerprint\x00" + key).hexdigest()[:24]


# ---------------------------------------------------------------------------- run state
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
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    e = json.loads(line)
                except json.JSONDecodeError:
                    break  # torn write: everything after it is gone
                good.append(line)
                j.entries[e["key"]] = e
            atomic_write_text(path, "".join(g + "\n" for g in good))  # 0600 (mkstemp)
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
        for line in f.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            out.setdefault(name, {})[rec["key"]] = rec
    return out


# ---------------------------------------------------------------------------- the run
@dataclass
class RunReport:
    total: int = 0
    done: int = 0
    skipped: int = 0  # finished in an earlier (resumed) run
    failed: list[str] = field(default_factory=list)  # keys (paths / line numbers), PHI-free
    errors: list[str] = field(default_factory=list)  # PHI-free messages
    out: Path | None = None
    already_complete: bool = False  # --resume of a run that had finished every note

    @property
    def exit_code(self) -> int:
        return EXIT_SOME_FAILED if self.failed else 0


def _audit_record(item: WorkItem, merged: Sequence[Any], note: Note, audit_text: bool) -> dict[str, Any]:
    spans = []
    for m in merged:
        d = m.to_dict() if hasattr(m, "to_dict") else dict(m)
        if audit_text:
            d["text"] = note.text[d["start"] : d["end"]]
        spans.append(d)
    return {"key": item.key, "id": note.id, "spans": spans}


def _check_paths(src: Path, dst: Path) -> None:
    """OUT is never the input, inside it, or around it: a run must not be able to touch its input."""
    src_r, dst_r = src.resolve(), dst.resolve()
    if dst_r == src_r:
        raise ConfigError(f"{dst}: the output must not be the input")
    if src.is_dir() and src_r in dst_r.parents:
        raise ConfigError(f"{dst}: the output must not be inside the input")
    if dst_r in src_r.parents:
        raise ConfigError(f"{dst}: the output must not contain the input (choose a directory "
                          "beside it)")
    if dst.exists() and not dst.is_dir():
        raise ConfigError(f"{dst}: --out must be a directory")


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


def run_deid(
    input_path: Path | str,
    out: Path | str,
    ensemble: Any,
    *,
    mode: str = "tag",
    key: bytes | None = None,
    fmt: str | None = None,
    batch_size: int = 16,
    resume: bool = False,
    audit_text: bool = False,
    progress: Callable[[int, int], None] | None = None,
    render_options: dict[str, Any] | None = None,
    engine: Engine | None = None,
    patient_id_from: str | None = None,
    warn: Callable[[str], None] | None = None,
    chunk_progress: Callable[[int, int], None] | None = None,
) -> RunReport:
    """De-identify every note of ``input_path`` into ``out`` with ``ensemble`` (``.deid(notes)``).

    ``progress(done, total)`` is called after each batch (the CLI draws a bar from it).
    ``chunk_progress(done, total)`` counts the chunks of a note too long to read at once
    (:mod:`dphub.ensemble.chunks`), restarting at 0 for each such note, so a run over one huge
    note is seen to advance (local engine, with an ensemble whose ``deid`` takes ``on_chunk``).
    ``engine`` computes the ensemble's results for a stream of batches (default
    :func:`local_engine`, in this process; :mod:`dphub.ray_engine` runs them on Ray). Whatever the
    engine, reading, rendering, writing and the journal stay here, in the driver, so outputs and
    run state are the same bytes.

    ``patient_id_from`` gives notes without a patient id one from their id (see
    :func:`_with_patients`); ``warn`` receives one line, once, when surrogates are drawn for notes
    that have none.
    """
    src = Path(input_path)
    dst = Path(out)
    check_input(src)
    _check_paths(src, dst)
    if batch_size < 1:
        raise ConfigError(f"batch size must be at least 1 (got {batch_size})")
    renderer = Renderer(mode, key, **(render_options or {}))
    patients = patient_pattern(patient_id_from)
    if resume and not (dst / RUN_DIR / PARAMS).is_file():
        raise ConfigError(f"{dst}: no earlier run to resume here (no {RUN_DIR}/{PARAMS}); drop "
                          "--resume to start a new run into an empty or new directory")
    settings = {
        "input": str(src.resolve()), "format": fmt, "mode": mode, "audit_text": audit_text,
        "render_options": render_options or {}, "ensemble": _describe_ensemble(ensemble),
        "key": key_fingerprint(key),
        **({"patient_id_from": patient_id_from} if patient_id_from is not None else {}),
    }
    created_out = not dst.exists()
    dst.mkdir(parents=True, exist_ok=True)
    if created_out:
        os.chmod(dst, 0o700)  # it will hold de-identified notes: private like its files
    run_dir = dst / RUN_DIR
    created_run = not run_dir.exists()
    _private_dir(run_dir)
    # one run per OUT: a second one fails at once instead of writing the same files
    lock = FileLock(str(run_dir / LOCK), timeout=0, mode=0o600)
    try:
        lock.acquire()
    except Timeout:
        raise ConfigError(f"{dst}: another dphub run is writing into this directory; wait for it "
                          "to finish, or choose another --out") from None
    wrote: list[bool] = []  # becomes non-empty once this run has written an output file
    try:
        return _locked_run(src, dst, ensemble, renderer, settings, fmt=fmt,
                           batch_size=batch_size, resume=resume, audit_text=audit_text,
                           progress=progress, wrote=wrote, engine=engine,
                           patients=patients, warn=warn if mode == "surrogate" else None,
                           chunk_progress=chunk_progress)
    except OSError as e:
        if e.errno not in _RUN_LEVEL_ERRNOS:
            raise
        # a full disk while writing run state or the assembled files: stop, resumable
        raise OutputError(f"{dst}: cannot write ({_os_reason(e)}); fix that and continue with "
                          "--resume") from None
    except DiskFullError:
        # raised by the atomic writer (it said "run again"): a rerun without --resume is
        # refused once this run wrote something, so say how to continue; else start afresh
        if not wrote:
            _discard_unused_state(dst, created_out=created_out, created_run=created_run)
        if (run_dir / PARAMS).exists():
            raise OutputError(f"{dst}: disk full; nothing half-written was kept: free some "
                              "space and continue with --resume") from None
        raise
    except BaseException:
        if not wrote:
            _discard_unused_state(dst, created_out=created_out, created_run=created_run)
        raise
    finally:
        lock.release()


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


def _locked_run(src: Path, dst: Path, ensemble: Any, renderer: Renderer,
                settings: dict[str, Any], *, fmt: str | None, batch_size: int, resume: bool,
                audit_text: bool, progress: Callable[[int, int], None] | None,
                wrote: list[bool], engine: Engine | None = None,
                patients: re.Pattern[str] | None = None,
                warn: Callable[[str], None] | None = None,
                chunk_progress: Callable[[int, int], None] | None = None) -> RunReport:
    """The run proper, under the lock (see :func:`run_deid`)."""
    run_dir = dst / RUN_DIR
    params_path = run_dir / PARAMS
    params = _read_params(params_path)
    if resume:
        if params is None:
            raise ConfigError(f"{dst}: no earlier run to resume here (no {RUN_DIR}/{PARAMS}); "
                              "drop --resume to start a new run into an empty or new directory")
        _check_settings(dst, params.get("settings") or {}, settings)
        if params.get("status") == "complete":
            n = int(params.get("notes") or 0)
            return RunReport(total=n, skipped=n, out=dst, already_complete=True)
    else:
        if any(p.name != RUN_DIR for p in dst.iterdir()):
            raise ConfigError(f"{dst}: output directory is not empty (use --resume to continue "
                              "a run)")
        if params is not None or (run_dir / JOURNAL).exists():
            raise ConfigError(f"{dst}: holds an earlier run; pass --resume to continue it, or "
                              "choose another --out")
    layout = input_layout(src, fmt)
    jsonl_out = layout == "jsonl" and renderer.mode != "brat"
    journal = Journal.open(run_dir / JOURNAL, resume=resume)
    if params is None:
        atomic_write_text(params_path, json.dumps({"settings": settings, "status": "running"},
                                                  indent=2, sort_keys=True) + "\n")
    parts_dir = run_dir / PARTS
    _private_dir(parts_dir)
    if resume:
        _remove_stale_temps(dst)
    report = RunReport(total=_count_input(src, layout) or 0, out=dst)
    done_count = 0
    keys: list[str] = []
    seen_keys: set[str] = set()
    seen_stems: set[str] = set()

    def write_output(it: WorkItem, note: Note, spans: list[Span]) -> None:
        for suffix, content in renderer.files(note, spans).items():
            target = dst / f"{it.stem}{suffix}"
            try:
                if not target.parent.is_dir():  # mirrored sub-directories: 0700 like OUT
                    for d in reversed([target.parent, *target.parent.parents]):
                        if d != dst and dst in d.parents and not d.is_dir():
                            d.mkdir(mode=0o700, exist_ok=True)
                atomic_write_text(target, content)
                wrote.append(True)
            except OSError as e:
                if e.errno in _RUN_LEVEL_ERRNOS:
                    raise OutputError(f"{dst}: cannot write outputs ({_os_reason(e)}); fix that "
                                      "and continue with --resume") from None
                raise InputError(f"cannot write its output file ({_os_reason(e)})") from None

    def process(batch: list[WorkItem], results: list[Any]) -> None:
        entries: list[dict[str, Any]] = []
        contents: list[dict[str, Any]] = []
        readable = [it for it in batch if it.note is not None]
        for it in batch:
            if it.note is None:
                entries.append({"key": it.key, "index": it.index, "status": "failed",
                                "error": it.error})
        part = f"{uuid.uuid4().hex}.jsonl"
        for it, res in zip(readable, results, strict=True):
            note = it.note
            assert note is not None
            try:
                if isinstance(res, str):
                    raise InputError(res)
                spans = [m.to_span() for m in res.merged]
                content: dict[str, Any] = {"key": it.key,
                                           "audit": _audit_record(it, res.merged, note, audit_text)}
                if jsonl_out:
                    content["record"] = json.dumps(renderer.jsonl_record(note, spans),
                                                   ensure_ascii=False, sort_keys=True)
                else:
                    write_output(it, note, spans)
                contents.append(content)
                entries.append({"key": it.key, "index": it.index, "status": "done", "part": part})
            except InputError as e:
                msg = e.message if e.message.startswith(it.key) else f"{it.key}: {e.message}"
                entries.append({"key": it.key, "index": it.index, "status": "failed",
                                "error": msg})
            except (OutputError, DiskFullError):
                raise  # the whole output is unwritable: stop, resumable
            except DphubError as e:
                entries.append({"key": it.key, "index": it.index, "status": "failed",
                                "error": f"{it.key}: {e.message}"})
        if contents:  # the part first: a journal line never points at a missing part
            atomic_write_text(parts_dir / part, "".join(
                json.dumps(c, ensure_ascii=False, sort_keys=True) + "\n" for c in contents))
        journal.append(entries)

    def batches() -> Iterator[list[WorkItem]]:
        """The pending notes in input order, in batches (streamed: the engine pulls them)."""
        batch: list[WorkItem] = []
        for it in _with_patients(map(_printable_key, iter_input(src, fmt)), patients, warn):
            if it.key in seen_keys:
                raise InputError(f"{src}: duplicate note id at {it.key}; outputs would collide")
            seen_keys.add(it.key)
            keys.append(it.key)
            if it.stem and not jsonl_out:
                if it.stem in seen_stems:
                    raise InputError(f"{src}: {it.key} maps to an output file name already used")
                seen_stems.add(it.stem)
            if journal.done(it.key):
                report.skipped += 1
                continue
            batch.append(it)
            if len(batch) >= batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    # stream the input: the local engine holds one batch of notes at a time
    run_engine = engine or (lambda stream: local_engine(ensemble, stream,
                                                        on_chunk=chunk_progress))
    if progress and report.total and not resume:  # a first line before the first batch
        progress(0, report.total)
    for batch, results in run_engine(batches()):
        process(batch, results)
        done_count += len(batch)
        if progress:
            progress(report.skipped + done_count, max(report.total, report.skipped + done_count))
    done_count += report.skipped
    report.total = len(keys)
    if progress:
        progress(done_count, report.total)
    # finalize: audit (and JSONL output) from the part files, in input order
    finished = sorted((e for e in journal.entries.values()
                       if e["status"] == "done" and e["key"] in seen_keys),
                      key=lambda e: e["index"])
    # streamed: one part file in memory at a time, outputs written line by line (constant
    # memory in the number of notes; a batch's notes are consecutive, so parts load once each)
    parts = _PartCache(parts_dir)

    def rows() -> Iterator[dict[str, Any]]:
        for e in finished:
            c = parts.get(e.get("part", ""), e["key"])
            if c is None and "audit" in e:  # a journal line written by an older dphub
                c = {"audit": e["audit"], "record": e.get("record")}
            if c is None:
                raise ConfigError(f"{dst}: run state is incomplete ({e['key']} has no part "
                                  "record); start over in another --out")
            yield c

    # one pass writes both files; a missing record aborts both (temp files removed, nothing
    # renamed), so a run never leaves an audit without its JSONL output or the reverse
    wrote.append(True)
    with contextlib.ExitStack() as files:
        audit_fh = files.enter_context(atomic_open(dst / AUDIT, newline=""))  # 0600: may hold text
        jsonl_fh = files.enter_context(atomic_open(dst / src.name, newline="")) if jsonl_out \
            else None
        for c in rows():
            audit_fh.write(json.dumps(c["audit"], ensure_ascii=False, sort_keys=True) + "\n")
            if jsonl_fh is not None:
                jsonl_fh.write(c["record"] + "\n")
    for key in keys:
        e = journal.entries.get(key)
        if e is None or e["status"] != "done":
            report.failed.append(_escaped(key))
            report.errors.append(_escaped((e or {}).get("error") or f"{key}: not processed"))
    report.done = len(finished) - report.skipped
    if not report.failed:  # nothing left to resume: keep only the completion marker
        atomic_write_text(params_path, json.dumps(
            {"settings": settings, "status": "complete", "notes": report.total},
            indent=2, sort_keys=True) + "\n")
        (run_dir / JOURNAL).unlink(missing_ok=True)
        shutil.rmtree(parts_dir, ignore_errors=True)
    return report


def _printable_key(it: WorkItem) -> WorkItem:
    """A note whose key or id cannot be encoded (POSIX hands an undecodable file name over with
    lone surrogates) cannot be printed, journaled or audited: it fails alone, under an escaped
    key."""
    try:
        it.key.encode("utf-8")
        if it.note is not None:
            it.note.id.encode("utf-8")
        return it
    except UnicodeEncodeError:
        pass
    try:  # the file name's own bytes, shown as \xNN
        key = it.key.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        key = _escaped(it.key)
    return WorkItem(key, it.index, None, f"{key}: the file name is not valid UTF-8; rename it")


def _escaped(s: str) -> str:
    """``s`` printable as UTF-8 (lone surrogates from odd file names shown as escapes)."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


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
    out = {"rule": str(getattr(ensemble, "rule", "")), "members": members}
    runtime = getattr(ensemble, "runtime", "torch")
    if runtime != "torch":  # int8 outputs differ: a resume must use the same encoder runtime
        out["runtime"] = runtime
    return out


#: An engine maps a stream of batches to ``(batch, results)`` in the same order, one result per
#: readable item (``it.note is not None``) of the batch: an object with ``merged`` (the
#: ensemble's :class:`~dphub.ensemble.core.NoteResult`) or a PHI-free error message.
Engine = Callable[[Iterator[list[WorkItem]]], Iterator[tuple[list[WorkItem], list[Any]]]]


def local_engine(ensemble: Any, batches: Iterator[list[WorkItem]], *,
                 on_chunk: Callable[[int, int], None] | None = None
                 ) -> Iterator[tuple[list[WorkItem], list[Any]]]:
    """The single-process engine: each batch through ``ensemble`` here, one at a time;
    ``on_chunk`` hears the chunks of a long note (see :func:`run_deid`'s ``chunk_progress``)."""
    for batch in batches:
        yield batch, deid_isolated(ensemble, [it for it in batch if it.note is not None],
                                   on_chunk=on_chunk)


def deid_isolated(ensemble: Any, items: Sequence[WorkItem], *,
                  on_chunk: Callable[[int, int], None] | None = None) -> list[Any]:
    """Public name of :func:`_deid_isolated` (engines on other processes call it per batch)."""
    return _deid_isolated(ensemble, items, on_chunk=on_chunk)


def _takes_on_chunk(ensemble: Any) -> bool:
    """Whether ``ensemble.deid`` reports a long note's chunks (an :class:`Ensemble` does; a
    stand-in with ``deid(notes)`` alone does not)."""
    try:
        return "on_chunk" in inspect.signature(ensemble.deid).parameters
    except (TypeError, ValueError):
        return False


def _deid_isolated(ensemble: Any, items: Sequence[WorkItem], *,
                   on_chunk: Callable[[int, int], None] | None = None) -> list[Any]:
    """Run the ensemble on a batch; if the batch fails, run notes one by one to isolate failures.

    Returns per item a NoteResult, or a PHI-free error message.
    """
    if not items:
        return []
    notes = [it.note for it in items]
    extra = {"on_chunk": on_chunk} if on_chunk is not None and _takes_on_chunk(ensemble) else {}
    try:
        return list(ensemble.deid(notes, **extra))
    except DphubError as e:
        if len(items) == 1:
            return [e.message]
    out: list[Any] = []
    for it in items:
        try:
            out.append(ensemble.deid([it.note], **extra)[0])
        except DphubError as e:
            out.append(e.message)
    return out
