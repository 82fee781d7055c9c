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
* A journal (``OUT/.dphub-run/journal.jsonl``, fsynced after each batch) records each finished or
  failed note with its audit record (and, for JSONL output, its output record). ``resume=True``
  skips finished notes and retries failed ones; a torn last journal line (SIGKILL mid-write) is
  dropped. Because rendering is deterministic (surrogates are keyed), a resumed run's outputs are
  byte-identical to an uninterrupted run's, with no note missing or duplicated.
* ``OUT/audit.jsonl``: per note, in input order, the spans removed (offsets, label, score) and
  the members that voted; no text unless ``audit_text``.
* A note that fails (undecodable bytes, a malformed record, a render error) is reported by its
  key (relative path or line number) and skipped; the run goes on. The CLI exits with
  :data:`EXIT_SOME_FAILED` (3) when any note failed.

Messages name files, line numbers and note ids, never text.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError, DphubError, InputError
from dphub.io import DiskFullError, atomic_write_text
from dphub.notes import Note, Span

EXIT_SOME_FAILED = 3
RUN_DIR = ".dphub-run"
JOURNAL = "journal.jsonl"
PARAMS = "run.json"
AUDIT = "audit.jsonl"
MODES = ("tag", "redact", "surrogate", "spans", "brat")


# ---------------------------------------------------------------------------- input
@dataclass
class WorkItem:
    """One unit of work: its stable key, its position, the note (or why it cannot be read)."""

    key: str
    index: int
    note: Note | None
    error: str | None = None
    stem: str | None = None  # output path without suffix, relative to OUT


def _safe_stem(note_id: str) -> str:
    """A relative output path for a note id (no absolute paths, no ``..``)."""
    parts = [p for p in re.split(r"[\\/]+", note_id) if p not in ("", ".", "..")]
    parts = [re.sub(r"[^\w.@+-]", "_", p) for p in parts]
    return "/".join(parts) or "note"


def _iter_txt_dir(root: Path) -> Iterator[WorkItem]:
    files = sorted(p for p in root.rglob("*.txt") if p.is_file() and RUN_DIR not in p.parts)
    for i, f in enumerate(files):
        rel = f.relative_to(root).as_posix()
        stem = rel[: -len(".txt")]
        data = f.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            yield WorkItem(rel, i, None, f"{rel}: not valid UTF-8 (byte {e.start})", stem)
            continue
        if text.startswith("\ufeff"):
            text = text[1:]
        yield WorkItem(rel, i, Note(id=stem, text=text), None, stem)


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
            if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                yield WorkItem(key, i, None, f"{path.name} line {lineno}: record needs a 'text' string")
                continue
            note_id = rec.get("id") or (rec.get("meta") or {}).get("note_id") or str(lineno)
            note = Note(id=str(note_id), text=rec["text"],
                        patient_id=rec.get("patient_id"), metadata=rec.get("metadata") or {})
            yield WorkItem(key, i, note, None, _safe_stem(str(note_id)))


def _iter_format(path: Path, fmt: str | None) -> Iterator[WorkItem]:
    try:
        from dphub import formats
    except ImportError:  # pragma: no cover - formats always ships
        raise ConfigError("corpus formats are not available in this installation") from None
    read = getattr(formats, "read", None)
    if read is None:
        raise ConfigError(f"{path}: cannot read this input (formats.read is not available)")
    for i, note in enumerate(read(path, format=fmt)):
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


def iter_input(path: Path, fmt: str | None = None) -> Iterator[WorkItem]:
    if not path.exists():
        raise InputError(f"{path}: input not found")
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
        from dphub.render import RENDERERS

        if mode not in MODES:
            raise ConfigError(f"unknown output mode {mode!r}; choose one of {', '.join(MODES)}")
        if mode == "surrogate":
            if key is None:
                raise ConfigError("surrogate mode needs --key-file (a secret key for consistent "
                                  "surrogates)")
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


# ---------------------------------------------------------------------------- journal
@dataclass
class Journal:
    """Append-only record of finished/failed notes; tolerant of a torn last line."""

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
            atomic_write_text(path, "".join(g + "\n" for g in good))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        return j

    def done(self, key: str) -> bool:
        return self.entries.get(key, {}).get("status") == "done"

    def append(self, entries: Sequence[dict[str, Any]]) -> None:
        if not entries:
            return
        with open(self.path, "a", encoding="utf-8") as fh:
            for e in entries:
                fh.write(json.dumps(e, sort_keys=True) + "\n")
                self.entries[e["key"]] = e
            fh.flush()
            os.fsync(fh.fileno())


# ---------------------------------------------------------------------------- the run
@dataclass
class RunReport:
    total: int = 0
    done: int = 0
    skipped: int = 0  # finished in an earlier (resumed) run
    failed: list[str] = field(default_factory=list)  # keys (paths / line numbers), PHI-free
    errors: list[str] = field(default_factory=list)  # PHI-free messages
    out: Path | None = None

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
) -> RunReport:
    """De-identify every note of ``input_path`` into ``out`` with ``ensemble`` (``.deid(notes)``).

    ``progress(done, total)`` is called after each batch (the CLI draws a bar from it).
    """
    src = Path(input_path)
    dst = Path(out)
    if not src.exists():
        raise InputError(f"{src}: input not found")
    src_r, dst_r = src.resolve(), dst.resolve()
    if dst_r == src_r or (src.is_dir() and src_r in dst_r.parents):
        raise ConfigError(f"{dst}: the output must not be inside the input")
    if batch_size < 1:
        raise ConfigError(f"batch size must be at least 1 (got {batch_size})")
    renderer = Renderer(mode, key, **(render_options or {}))
    layout = input_layout(src, fmt)
    jsonl_out = layout == "jsonl" and mode != "brat"
    if dst.exists() and not dst.is_dir():
        raise ConfigError(f"{dst}: --out must be a directory")
    if dst.exists() and not resume and any(p.name != RUN_DIR for p in dst.iterdir()):
        raise ConfigError(f"{dst}: output directory is not empty (use --resume to continue a run)")
    dst.mkdir(parents=True, exist_ok=True)
    journal = Journal.open(dst / RUN_DIR / JOURNAL, resume=resume)
    _check_run_params(dst / RUN_DIR / PARAMS, {
        "input": str(src_r), "format": fmt, "mode": mode, "audit_text": audit_text,
        "render_options": render_options or {}, "ensemble": _describe_ensemble(ensemble),
    })
    if resume:
        _remove_stale_temps(dst)
    report = RunReport(total=_count_input(src, layout) or 0, out=dst)
    done_count = 0
    keys: list[str] = []
    seen_keys: set[str] = set()
    seen_stems: set[str] = set()

    def process(batch: list[WorkItem]) -> None:
        entries: list[dict[str, Any]] = []
        readable = [it for it in batch if it.note is not None]
        for it in batch:
            if it.note is None:
                entries.append({"key": it.key, "index": it.index, "status": "failed",
                                "error": it.error})
        results = _deid_isolated(ensemble, readable)
        for it, res in zip(readable, results, strict=True):
            note = it.note
            assert note is not None
            try:
                if isinstance(res, str):
                    raise InputError(res)
                spans = [m.to_span() for m in res.merged]
                entry: dict[str, Any] = {"key": it.key, "index": it.index, "status": "done",
                                         "audit": _audit_record(it, res.merged, note, audit_text)}
                if jsonl_out:
                    entry["record"] = json.dumps(renderer.jsonl_record(note, spans),
                                                 ensure_ascii=False, sort_keys=True)
                else:
                    for suffix, content in renderer.files(note, spans).items():
                        atomic_write_text(dst / f"{it.stem}{suffix}", content)
                entries.append(entry)
            except DiskFullError:
                raise  # not this note's fault: stop the run (the journal keeps what is done)
            except DphubError as e:
                entries.append({"key": it.key, "index": it.index, "status": "failed",
                                "error": f"{it.key}: {e.message}"})
        journal.append(entries)

    # stream the input: only one batch of notes is in memory at a time
    batch: list[WorkItem] = []
    for it in iter_input(src, fmt):
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
            done_count += 1
            continue
        batch.append(it)
        if len(batch) >= batch_size:
            process(batch)
            done_count += len(batch)
            batch = []
            if progress:
                progress(done_count, max(report.total, done_count))
    if batch:
        process(batch)
        done_count += len(batch)
    report.total = len(keys)
    if progress:
        progress(done_count, report.total)
    # finalize: audit (and JSONL output) from the journal, in input order
    finished = sorted((e for e in journal.entries.values() if e["status"] == "done"),
                      key=lambda e: e["index"])
    atomic_write_text(dst / AUDIT, "".join(
        json.dumps(e["audit"], ensure_ascii=False, sort_keys=True) + "\n" for e in finished))
    if jsonl_out:
        atomic_write_text(dst / src.name, "".join(e["record"] + "\n" for e in finished))
    for key in keys:
        e = journal.entries.get(key)
        if e is None or e["status"] != "done":
            report.failed.append(key)
            report.errors.append((e or {}).get("error") or f"{key}: not processed")
    report.done = len(finished) - report.skipped
    return report


def _describe_ensemble(ensemble: Any) -> Any:
    slots = getattr(ensemble, "slots", None)
    if slots is None:
        return None
    return {"rule": str(getattr(ensemble, "rule", "")),
            "members": [[s.name, s.revision, s.threshold] for s in slots]}


def _check_run_params(path: Path, params: dict[str, Any]) -> None:
    """A resumed run must use the same input, mode and ensemble, or outputs would mix."""
    if path.is_file():
        try:
            before = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            before = None
        if before is not None and before != json.loads(json.dumps(params)):
            changed = sorted(k for k in params if before.get(k) != json.loads(json.dumps(params[k])))
            raise ConfigError(f"{path.parent.parent}: was started with different settings "
                              f"({', '.join(changed)}); resume with the same ones or use another "
                              "--out")
        return
    atomic_write_text(path, json.dumps(params, indent=2, sort_keys=True) + "\n")


def _remove_stale_temps(root: Path) -> None:
    """Delete temp files a killed run left behind (``dphub.io`` names them ``.<name>.*.tmp``)."""
    for p in root.rglob(".*.tmp"):
        if p.is_file() and re.fullmatch(r"\..+\.[^.]+\.tmp", p.name):
            p.unlink(missing_ok=True)


def _deid_isolated(ensemble: Any, items: Sequence[WorkItem]) -> list[Any]:
    """Run the ensemble on a batch; if the batch fails, run notes one by one to isolate failures.

    Returns per item a NoteResult, or a PHI-free error message.
    """
    if not items:
        return []
    notes = [it.note for it in items]
    try:
        return list(ensemble.deid(notes))
    except DphubError as e:
        if len(items) == 1:
            return [e.message]
    out: list[Any] = []
    for it in items:
        try:
            out.append(ensemble.deid([it.note])[0])
        except DphubError as e:
            out.append(e.message)
    return out
