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
* ``OUT/audit.jsonl``: per note, in input order, the spans removed (offsets in code points,
  label, score) and the members that voted; under the inverse rule also what hid each span
  (``hidden_by``: members, ``inverse``) and how many words each release path kept (``kept``;
  ``--mode spans`` lists each kept word's offsets and path: :mod:`dphub.ensemble.release_paths`);
  no text unless ``audit_text``; ``text_hmac``, a
  digest of the note's text keyed by a per-user secret (``$DPHUB_HOME/review/note.key``,
  :func:`~dphub.runner.state.note_digest_key`), so ``dphub review`` can check that its
  ``--notes`` are the text the run read without the audit confirming any guess of a hidden
  word. ``run.json`` keeps the run's random ``run_id`` and the key's fingerprint
  (``note_key``). All JSON Lines files here are split on ``\n`` only (:func:`dphub.io.jsonl_lines`):
  a note's U+2028, U+2029, U+0085 or ``\r`` stays inside its record.
* A note that fails (unreadable or undecodable file, a malformed record or ``.ann``, a lone
  surrogate, an output name the file system refuses, a render error) is reported by its key
  (relative path, line number or note id) and skipped; the run goes on. The CLI exits with
  :data:`EXIT_SOME_FAILED` (3) when any note failed.

Messages name files, line numbers and note ids, never text.

Where the parts live (the module was cut by issue 30; this ``__init__`` keeps the run itself,
:func:`run_deid` and its loop, and re-exports the public names of the others):
:mod:`~dphub.runner.inputs` (work items from a directory, a JSONL file or a corpus),
:mod:`~dphub.runner.state` (journal, part files, settings a resume must match),
:mod:`~dphub.runner.output` (output modes, rendering and audit records) and
:mod:`~dphub.runner.engine` (how batches reach the ensemble, here or on workers).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from dphub.errors import ConfigError, DphubError, InputError
from dphub.io import DiskFullError, atomic_open, atomic_write_text
from dphub.notes import Note, Span
from dphub.privacy.ledger import footprint, record_surrogates
from dphub.runner.engine import Engine, deid_isolated, local_engine
from dphub.runner.inputs import (
    MAX_NAME_BYTES,
    WorkItem,
    check_input,
    count_input,
    escaped,
    input_layout,
    iter_input,
    os_reason,
    patient_pattern,
    printable_key,
    with_patients,
)
from dphub.runner.output import MODES, Renderer, audit_record
from dphub.runner.state import (
    JOURNAL,
    LOCK,
    PARAMS,
    PARTS,
    RUN_DIR,
    Journal,
    _check_settings,
    _describe_ensemble,
    _discard_unused_state,
    _PartCache,
    _private_dir,
    _read_params,
    _remove_stale_temps,
    key_fingerprint,
    note_digest,
    note_digest_key,
    note_key_fingerprint,
)

#: the public names, including those that live in the submodules since the cut of issue 30
#: (``from dphub.runner import WorkItem`` keeps working)
__all__ = [
    "AUDIT", "EXIT_SOME_FAILED", "JOURNAL", "LOCK", "MAX_NAME_BYTES", "MODES", "PARAMS", "PARTS",
    "RUN_DIR", "Engine", "Journal", "OutputError", "Renderer", "RunReport", "WorkItem",
    "check_input", "deid_isolated", "input_layout", "iter_input", "key_fingerprint",
    "local_engine", "patient_pattern", "run_deid",
]

EXIT_SOME_FAILED = 3
AUDIT = "audit.jsonl"
_RUN_LEVEL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO}


class OutputError(DphubError):
    """OUT cannot take more files (full disk, quota, read-only): the run stops, resumable."""


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
    :func:`with_patients`); ``warn`` receives one line, once, when surrogates are drawn for notes
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
        **({"surrogates": renderer.mechanisms} if renderer.mechanisms else {}),
        **({"date_count": renderer.date_count} if renderer.date_count else {}),
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
        raise OutputError(f"{dst}: cannot write ({os_reason(e)}); fix that and continue with "
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


def _observe_patients(renderer: Renderer, run_engine: Engine, src: Path, fmt: str | None,
                      patients: re.Pattern[str] | None, batch_size: int) -> None:
    """The pre-pass of ``--dates dp --date-unit patient`` (issue 28): every readable note, done
    or not, through the engine once, so the renderer knows all of a patient's dates before the
    first note is written. Deterministic (same spans), so a resumed run and a Ray run rebuild the
    same per-patient chains and write the same bytes; the cost is a second pass of the ensemble.
    Nothing is written: the dates stay in memory."""
    readable = (it for it in with_patients(map(printable_key, iter_input(src, fmt)), patients,
                                           None) if it.note is not None)
    for batch, results in run_engine(_batches(readable, batch_size)):
        for it, res in zip([b for b in batch if b.note is not None], results, strict=True):
            if it.note is not None and not isinstance(res, str):
                renderer.observe(it.note, [m.to_span() for m in res.merged])


def _locked_run(src: Path, dst: Path, ensemble: Any, renderer: Renderer,
                settings: dict[str, Any], *, fmt: str | None, batch_size: int, resume: bool,
                audit_text: bool, progress: Callable[[int, int], None] | None,
                wrote: list[bool], engine: Engine | None = None,
                patients: re.Pattern[str] | None = None,
                warn: Callable[[str], None] | None = None,
                chunk_progress: Callable[[int, int], None] | None = None) -> RunReport:
    """The run proper, under the lock (see :func:`run_deid`): checks (:func:`_earlier_run`),
    the notes through the engine, journal and part files, then :func:`_finish`."""
    run_dir = dst / RUN_DIR
    params_path = run_dir / PARAMS
    params, complete = _earlier_run(dst, settings, resume=resume)
    if complete is not None:
        return complete
    layout = input_layout(src, fmt)
    jsonl_out = layout == "jsonl" and renderer.mode != "brat"
    journal = Journal.open(run_dir / JOURNAL, resume=resume)
    identity, digest_key = _identity(dst, params)
    if params is None:
        atomic_write_text(params_path, json.dumps(
            {"settings": settings, "status": "running", **identity},
            indent=2, sort_keys=True) + "\n")
    parts_dir = run_dir / PARTS
    _private_dir(parts_dir)
    if resume:
        _remove_stale_temps(dst)
    report = RunReport(total=count_input(src, layout) or 0, out=dst)
    vocab_digest = (settings.get("ensemble") or {}).get("safe_vocab_sha256")
    done_count = 0
    keys: list[str] = []
    seen_keys: set[str] = set()

    def process(batch: list[WorkItem], results: list[Any]) -> None:
        entries: list[dict[str, Any]] = []
        contents: list[dict[str, Any]] = []
        readable = [it for it in batch if it.note is not None]
        for it in batch:
            if it.note is None:
                entries.append({"key": it.key, "index": it.index, "status": "failed",
                                "error": it.error})
        if renderer.mechanisms and readable:  # recorded before any output of them exists
            _record_surrogates(renderer.mechanisms, dst, [it.note for it in readable
                                                          if it.note is not None])
        part = f"{uuid.uuid4().hex}.jsonl"
        for it, res in zip(readable, results, strict=True):
            note = it.note
            assert note is not None
            try:
                if isinstance(res, str):
                    raise InputError(res)
                spans = [m.to_span() for m in res.merged]
                why = getattr(res, "why", None)  # issue 54: the inverse rule's reasons
                content: dict[str, Any] = {"key": it.key, "audit": audit_record(
                    it, res.merged, note, audit_text, why)}
                if digest_key is not None:  # issue 54: review checks --notes against it
                    content["audit"]["text_hmac"] = note_digest(digest_key, note.text)
                if vocab_digest:  # issue 26: which safe words let this note's words back
                    content["audit"]["safe_vocab_sha256"] = vocab_digest
                if renderer.mechanisms:  # issue 28: which mechanisms and ε, never values
                    content["audit"]["surrogates"] = renderer.mechanisms
                if renderer.date_count:  # issue 38: one date mention per note
                    content["audit"]["date_count"] = renderer.date_count
                if jsonl_out:
                    content["record"] = json.dumps(renderer.jsonl_record(note, spans, why),
                                                   ensure_ascii=False, sort_keys=True)
                else:
                    _write_output(dst, renderer, wrote, it, note, spans, why)
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

    # stream the input: the local engine holds one batch of notes at a time
    run_engine = engine or (lambda stream: local_engine(ensemble, stream,
                                                        on_chunk=chunk_progress))
    if renderer.needs_prepass:
        _observe_patients(renderer, run_engine, src, fmt, patients, batch_size)
    if progress and report.total and not resume:  # a first line before the first batch
        progress(0, report.total)
    pending = _pending_batches(src, fmt, patients, warn, journal, report, keys, seen_keys,
                               batch_size=batch_size, jsonl_out=jsonl_out)
    for batch, results in run_engine(pending):
        process(batch, results)
        done_count += len(batch)
        if progress:
            progress(report.skipped + done_count, max(report.total, report.skipped + done_count))
    done_count += report.skipped
    report.total = len(keys)
    if progress:
        progress(done_count, report.total)
    return _finish(src, dst, settings, journal, report, keys, seen_keys, wrote=wrote,
                   jsonl_out=jsonl_out, identity=identity)


def _identity(dst: Path, params: dict[str, Any] | None) -> tuple[dict[str, Any], bytes | None]:
    """The run's identity kept in ``run.json`` (issue 54) and the note-digest key to use.

    ``run_id``: random, made once per run (a resume keeps it), so two runs that share an OUT
    name, or one OUT reused after removal, are told apart (``dphub review`` keys its default
    corrections file by it). ``note_key``: the fingerprint of :func:`note_digest_key` the
    audit's ``text_hmac`` digests are made with; a resume under another key is refused (one audit
    would hold digests under two keys), one of a run made without digests writes none.
    """
    if params is None:
        key = note_digest_key()
        ident: dict[str, Any] = {"run_id": uuid.uuid4().hex}
        if key is not None:
            ident["note_key"] = note_key_fingerprint(key)
        return ident, key
    ident = {k: params[k] for k in ("run_id", "note_key") if k in params}
    if "note_key" not in ident:
        return ident, None  # started without digests (an older dphub, or no key then)
    key = note_digest_key()
    if key is None or note_key_fingerprint(key) != ident["note_key"]:
        raise ConfigError(f"{dst}: was started by another user (or with another DPHUB_HOME): "
                          "its note digests need that user's key; resume it as them, or start "
                          "over in another --out")
    return ident, key


#: the metric unit of each DP surrogate mechanism's ε (docs/surrogates.md)
_SURROGATE_UNITS = (("dates", "interval band unit"), ("ages", "year"), ("places", "km"))


def _record_surrogates(mechanisms: dict[str, Any], dst: Path, notes: list[Note]) -> None:
    """Record the DP surrogates of these notes in the privacy ledger (issue 53: every DP release
    made here), one record per mechanism and run (``dst``; a resume adds to it)."""
    mechs = [(name, float(m["epsilon"]), unit) for name, unit in _SURROGATE_UNITS
             if isinstance(m := mechanisms.get(name), dict) and "epsilon" in m]
    if mechs:
        record_surrogates(str(dst.resolve()), mechs, footprint(notes))


def _write_output(dst: Path, renderer: Renderer, wrote: list[bool], it: WorkItem, note: Note,
                  spans: list[Span], why: Any = None) -> None:
    """A note's output files under ``dst`` (mirrored sub-directories 0700, atomic writes)."""
    for suffix, content in renderer.files(note, spans, why).items():
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
                raise OutputError(f"{dst}: cannot write outputs ({os_reason(e)}); fix that "
                                  "and continue with --resume") from None
            raise InputError(f"cannot write its output file ({os_reason(e)})") from None


def _pending_batches(src: Path, fmt: str | None, patients: re.Pattern[str] | None,
                     warn: Callable[[str], None] | None, journal: Journal, report: RunReport,
                     keys: list[str], seen_keys: set[str], *, batch_size: int, jsonl_out: bool
                     ) -> Iterator[list[WorkItem]]:
    """The pending notes in input order, in batches (streamed: the engine pulls them); every
    key goes into ``keys``/``seen_keys``, a journaled one counts as skipped in ``report``."""
    seen_stems: set[str] = set()

    def pending() -> Iterator[WorkItem]:
        for it in with_patients(map(printable_key, iter_input(src, fmt)), patients, warn):
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
            yield it

    return _batches(pending(), batch_size)


def _batches(items: Iterable[WorkItem], size: int) -> Iterator[list[WorkItem]]:
    """``items`` in lists of ``size`` (the last shorter), pulled lazily (itertools.batched is
    3.12+; dphub supports 3.11)."""
    batch: list[WorkItem] = []
    for it in items:
        batch.append(it)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _earlier_run(dst: Path, settings: dict[str, Any], *, resume: bool
                 ) -> tuple[dict[str, Any] | None, RunReport | None]:
    """(the earlier run's params or None, a report when that run is already complete); refuses
    a resume without an earlier run of the same settings, and a new run into a used OUT."""
    run_dir = dst / RUN_DIR
    params = _read_params(run_dir / PARAMS)
    if resume:
        if params is None:
            raise ConfigError(f"{dst}: no earlier run to resume here (no {RUN_DIR}/{PARAMS}); "
                              "drop --resume to start a new run into an empty or new directory")
        _check_settings(dst, params.get("settings") or {}, settings)
        if params.get("status") == "complete":
            n = int(params.get("notes") or 0)
            return params, RunReport(total=n, skipped=n, out=dst, already_complete=True)
    else:
        if any(p.name != RUN_DIR for p in dst.iterdir()):
            raise ConfigError(f"{dst}: output directory is not empty (use --resume to continue "
                              "a run)")
        if params is not None or (run_dir / JOURNAL).exists():
            raise ConfigError(f"{dst}: holds an earlier run; pass --resume to continue it, or "
                              "choose another --out")
    return params, None


def _finish(src: Path, dst: Path, settings: dict[str, Any], journal: Journal, report: RunReport,
            keys: list[str], seen_keys: set[str], *, wrote: list[bool], jsonl_out: bool,
            identity: dict[str, Any]) -> RunReport:
    """The audit (and JSONL output) from the part files, in input order; the failed notes in
    ``report``; once nothing failed, only the completion marker is kept."""
    run_dir = dst / RUN_DIR
    params_path = run_dir / PARAMS
    parts_dir = run_dir / PARTS
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
            report.failed.append(escaped(key))
            report.errors.append(escaped((e or {}).get("error") or f"{key}: not processed"))
    report.done = len(finished) - report.skipped
    if not report.failed:  # nothing left to resume: keep only the completion marker
        atomic_write_text(params_path, json.dumps(
            {"settings": settings, "status": "complete", "notes": report.total, **identity},
            indent=2, sort_keys=True) + "\n")
        (run_dir / JOURNAL).unlink(missing_ok=True)
        shutil.rmtree(parts_dir, ignore_errors=True)
    return report
