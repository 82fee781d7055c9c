"""The distributed engine: the ensemble's work of a directory run on Ray Data actors.

Why this shape: a health system's note store is too big for one machine, but the guarantees of
:mod:`dphub.runner` (outputs written atomically once per note, a journal that a killed run resumes
from without losing or duplicating a note, the same bytes whatever happens) are easiest to keep
when exactly one process reads, renders, writes and journals. So the *driver* keeps all of that,
unchanged: it is :func:`dphub.runner.run_deid` with another ``engine``. Only the expensive part,
``ensemble.deid(batch)`` (the encoders take ~97 % of the time), runs on Ray:

* The runner's batches are grouped into windows (``RayOptions.window`` batches). Each window is a
  Ray Dataset of one row per batch (``from_items``), mapped by a pool of actors
  (``map_batches`` with a callable class, ``concurrency=workers``), each of which builds the
  ensemble **once** from a plain-data :class:`EnsembleRecipe` and runs exactly the runner's batch
  through :func:`dphub.runner.deid_isolated`. Same batches, same code, so the same spans and
  scores: the outputs are byte-identical to a single-process run. A window bounds the driver's
  memory (one window of notes in flight) whatever the size of the input.
* Results come back in input order (``preserve_order``) as JSON strings (offsets, labels, scores,
  voter names; or a PHI-free error message); the driver renders, writes and journals them batch
  by batch, so progress advances and a killed driver loses at most the batches in flight, which
  a ``--resume`` recomputes. A killed worker is restarted by Ray and its batch retried; nothing is
  written twice because workers write nothing.
* What leaves a worker: per note, offsets, labels, scores and member names, or an error message
  built from note ids only; an unexpected exception is reported by its type name only. Note text
  travels only driver -> worker, inside Ray's object store (shared memory, spilled to the Ray
  temp directory under pressure: inside a 0700 directory for the local runtime, removed at the end;
  on a cluster, see docs/scale.md). Ray is started with the dashboard off,
  worker logs not forwarded to the driver, usage statistics off and Ray Data's progress bars off;
  one known line of Ray's C++ core is filtered from the driver's stderr (:data:`_RAY_NOISE`).
* A driver killed with ``kill -9`` runs no cleanup: its local runtime's daemons and private
  directory (``dphub-ray-<pid>-*``) stay. The next local start removes them for every driver that
  is no longer alive (:func:`_clean_stale_runtimes`).
* Nothing read from disk is unpickled by dphub. Ray itself serialises the recipe and the rows it
  moves (plain strings, numbers and dicts) between its processes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dphub.ensemble.aggregate import MergedSpan
from dphub.ensemble.aggregation import parse_rule
from dphub.ensemble.core import NoteResult, build_ensemble
from dphub.ensemble.kinds import member_kind
from dphub.ensemble.manifest import Manifest, MemberEntry, run_rule
from dphub.ensemble.release_paths import Explanation
from dphub.errors import ConfigError
from dphub.notes import Note
from dphub.runner import Engine, WorkItem, deid_isolated
from dphub.safe_vocab import load as load_safe_vocab

#: Default runner batches per Ray Dataset (window): large enough that loading the ensemble in each
#: actor once per window is a small cost, small enough to bound the driver's memory.
DEFAULT_WINDOW = 512
#: Name prefix of a local runtime's private temp directory: ``dphub-ray-<driver pid>-<random>``.
PRIVATE_TMP_PREFIX = "dphub-ray-"


@dataclass
class RayOptions:
    """How to run on Ray: where (``address``), how many actors, threads per actor, window."""

    address: str | None = None  # None: start a local Ray runtime; else connect ("auto", host:port)
    workers: int = 2  # actors, each holding one copy of the ensemble
    threads: int = 1  # torch intra-op threads per actor (and the CPUs Ray reserves for it)
    window: int = DEFAULT_WINDOW  # runner batches per Ray Dataset

    def check(self) -> None:
        for name in ("workers", "threads", "window"):
            if getattr(self, name) < 1:
                raise ConfigError(f"Ray engine: {name} must be at least 1 "
                                  f"(got {getattr(self, name)})")


@dataclass
class EnsembleRecipe:
    """Plain data from which each worker builds the driver's ensemble (nothing pickled but this).

    ``members`` are manifest entries as dicts (registry members already resolved by the driver to
    their model directory, pinned by weights digest, so a worker loads exactly the driver's
    weights or refuses); ``owner_model`` a model directory; the rest as ``build_ensemble`` takes.
    """

    members: list[dict[str, Any]] = field(default_factory=list)
    aggregate: str = "any"
    owner_model: str | None = None
    batch_size: int = 16
    int8: bool = False
    #: the encoder runtime (``torch``, ``torch-bf16``, ``onnx``, ``onnx-int8``): the driver's, so every actor
    #: computes what the driver's settings describe
    runtime: str | None = None
    #: the owner's safe words files of the inverse rule (paths the workers read; the digest a
    #: resume checks is the driver's)
    safe_words: list[str] = field(default_factory=list, kw_only=True)
    #: the driver's vocabulary digest: a worker that reads other words refuses to start
    safe_vocab_sha256: str | None = field(default=None, kw_only=True)

    def build(self) -> Any:
        manifest = Manifest([MemberEntry.from_dict(d, "the Ray engine's recipe")
                             for d in self.members], self.aggregate)
        ensemble = build_ensemble(manifest, owner_model=None if self.owner_model is None
                                  else Path(self.owner_model), aggregate_rule=self.aggregate,
                                  batch_size=self.batch_size, int8=self.int8,
                                  runtime=self.runtime,
                                  safe_words=[Path(p) for p in self.safe_words])
        vocab = getattr(ensemble, "safe_vocab", None)
        if self.safe_vocab_sha256 and (vocab is None or vocab.digest != self.safe_vocab_sha256):
            raise ConfigError("a Ray worker reads other safe words than the driver (the "
                              "--safe-words files or the installed dphub differ on its node)")
        return ensemble


def recipe_from_manifest(manifest: Any, *, owner_model: Path | None, aggregate_rule: str | None,
                         batch_size: int, int8: bool,
                         runtime: str | None = None,
                         safe_words: Any = ()) -> EnsembleRecipe:
    """The recipe of ``build_ensemble(manifest, ...)``, each member as its kind hands it to a
    worker (``for_worker``: a registry member resolved to its directory, pinned by digest)."""
    members = [member_kind(e.kind).for_worker(e) for e in (manifest.members if manifest else [])]
    rule = run_rule(manifest, aggregate_rule)
    return EnsembleRecipe(members, rule,
                          None if owner_model is None else str(Path(owner_model).resolve()),
                          batch_size, int8,
                          runtime or (getattr(manifest, "runtime", None) if manifest else None),
                          safe_words=[str(Path(p).resolve()) for p in safe_words],
                          safe_vocab_sha256=load_safe_vocab(extra=list(safe_words)).digest
                          if parse_rule(str(rule)).uses_safe_vocabulary else None)


# ---------------------------------------------------------------------------- wire format
def _encode_notes(items: list[WorkItem]) -> str:
    return json.dumps([[it.key, it.note.id, it.note.text, it.note.patient_id, it.note.metadata]
                       for it in items if it.note is not None], ensure_ascii=False, default=str)


def _decode_notes(payload: str) -> list[WorkItem]:
    return [WorkItem(key, i, Note(id=nid, text=text, patient_id=pid, metadata=meta or {}))
            for i, (key, nid, text, pid, meta) in enumerate(json.loads(payload))]


def _encode_results(results: list[Any]) -> str:
    out: list[Any] = []
    for r in results:
        if isinstance(r, str):
            out.append({"error": r})
        else:
            row: dict[str, Any] = {"merged": [[m.start, m.end, m.label, float(m.score),
                                                list(m.voters)] for m in r.merged]}
            if getattr(r, "why", None) is not None:  # the inverse rule's reasons (issue 54)
                row["why"] = r.why.to_wire()
            out.append(row)
    return json.dumps(out, ensure_ascii=False)


def _decode_results(payload: str) -> list[Any]:
    data = json.loads(payload)
    if isinstance(data, dict):  # the worker failed unexpectedly: its exception's type only
        raise RuntimeError(f"a Ray worker failed unexpectedly ({data.get('crash', 'unknown')})")
    return [r["error"] if "error" in r else
            NoteResult([MergedSpan(s, e, label, score, tuple(voters))
                        for s, e, label, score, voters in r["merged"]],
                       why=Explanation.from_wire(r["why"]) if "why" in r else None)
            for r in data]


class DeidWorker:
    """A Ray Data actor: builds the ensemble once, then de-identifies one runner batch per row."""

    def __init__(self, recipe: EnsembleRecipe, threads: int = 1) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch

        torch.set_num_threads(threads)
        self.ensemble = recipe.build()

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        out = []
        for payload in batch["notes"]:
            try:
                out.append(_encode_results(deid_isolated(self.ensemble,
                                                         _decode_notes(str(payload)))))
            except Exception as e:  # never the message: it might quote a note
                out.append(json.dumps({"crash": type(e).__name__}))
        return {"seq": batch["seq"], "results": np.array(out, dtype=object)}


# ---------------------------------------------------------------------------- driver
def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("--engine ray needs Ray: install dphub with its 'ray' extra "
                          "(pip install 'dphub[ray]')") from None
    return ray


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Refuse a ``host:port`` that does not answer, at once: Ray itself retries for minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # "auto", ray:// client addresses: Ray resolves and reports them itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConfigError(f"cannot reach the Ray cluster at {address} "
                          f"({e.strerror or type(e).__name__}); start it with `ray start --head` "
                          "or check --address") from None


@contextlib.contextmanager
def ray_session(options: RayOptions) -> Iterator[Any]:
    """Ray, connected: the caller's when already initialised, else local or ``options.address``.

    A runtime started here is shut down on exit; one the caller started is left alone.
    """
    ray = _import_ray()
    if ray.is_initialized():
        yield ray
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report leaves the site
    env = {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(options.threads),
           "RAY_USAGE_STATS_ENABLED": "0"}
    kwargs: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR,
                              "runtime_env": {"env_vars": env}}
    private_tmp = None
    if options.address is None:  # a local runtime sized for the actors asked for
        # Ray's temp dir (/tmp/ray) is world-writable (Ray chmods it 0777) and the object store
        # spills there (note text) under memory pressure: this runtime's sits inside a 0700
        # directory, removed at the end
        _clean_stale_runtimes()  # a killed earlier run's processes and spilled text
        private_tmp = tempfile.mkdtemp(prefix=f"{PRIVATE_TMP_PREFIX}{os.getpid()}-")
        kwargs.update(include_dashboard=False, _temp_dir=os.path.join(private_tmp, "r"),
                      num_cpus=max(os.cpu_count() or 1, options.workers * options.threads))
    if options.address is not None:
        _check_reachable(options.address)
    try:
        ray.init(address=options.address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        if private_tmp is not None:
            shutil.rmtree(private_tmp, ignore_errors=True)
        if options.address is None:
            raise ConfigError(f"cannot start a local Ray runtime ({type(e).__name__})") from None
        raise ConfigError(f"cannot connect to the Ray cluster at {options.address} "
                          f"({type(e).__name__}); a cluster with token authentication needs "
                          "RAY_AUTH_MODE=token and its token on this machine "
                          "(docs/scale.md)") from None
    try:
        yield ray
    finally:
        ray.shutdown()
        if private_tmp is not None:
            shutil.rmtree(private_tmp, ignore_errors=True)


#: Lines of Ray's C++ core that the driver prints to stderr on every successful run, which say
#: nothing the user can act on. The one known: Ray Data always puts an actor pool's constructor
#: arguments in the object store, and Ray logs at ERROR level that such an actor's restart could
#: fail if they were lost (ray-project/ray#53727); they stay referenced for the whole run.
_RAY_NOISE = (b"has constructor arguments in the object store and max_restarts > 0",)


@contextlib.contextmanager
def _without_lines(drop: tuple[bytes, ...]) -> Iterator[None]:
    """Pass this process's stderr (file descriptor 2, where Ray's C++ core writes) through a
    filter that drops the lines containing one of ``drop``; everything else, progress bars
    included, goes through unchanged and at once. Restored on exit. Ray offers no switch: its
    log level variable (``RAY_BACKEND_LOG_LEVEL``) prints a line of its own when set.
    """
    import threading

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no usable stderr: nothing to filter
        yield
        return
    r, w = os.pipe()
    os.dup2(w, 2)
    os.close(w)

    def pump() -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(r, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            out = []
            while b"\n" in buf:
                line, _, buf = buf.partition(b"\n")
                if not any(d in line for d in drop):
                    out.append(line + b"\n")
            if buf and not (buf.startswith(b"[") and len(buf) < 4096):
                out.append(buf)  # not the start of a log line (a progress bar's "\r..."): now
                buf = b""
            _write_all(saved, b"".join(out))
        _write_all(saved, buf)
        os.close(r)

    thread = threading.Thread(target=pump, name="dphub-stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the pump drains it and ends
        thread.join(timeout=5)
        os.close(saved)


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(fd, data):]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _processes_using(path: str) -> list[int]:
    """This user's processes whose command line names ``path`` (Ray's daemons and workers of a
    local runtime carry its temp/session/log directory in their arguments). Linux ``/proc``
    only; elsewhere none are found."""
    found = []
    needle = os.fsencode(path)
    uid = os.getuid()
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for d in proc.iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if d.stat().st_uid != uid:
                continue
            cmdline = (d / "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours
            continue
        if needle in cmdline:
            found.append(int(d.name))
    return found


def _clean_stale_runtimes(root: str | None = None, *, grace: float = 5.0) -> list[str]:
    """Remove what a local runtime of a *killed* dphub left: its private temp directory
    (``dphub-ray-<pid>-*`` whose driver ``pid`` is dead; it may hold spilled note text) and the
    Ray daemons still running from it (stopped with SIGTERM, then SIGKILL after ``grace`` s).

    Why: ``kill -9`` of the driver runs no ``finally``: Ray's raylet, GCS and agents kept running
    and the directory stayed. Only this user's directories and processes are touched, and only
    those of a dead driver (a live one's run is left alone). Returns the directories removed.
    """
    import re
    import signal
    import time

    base = Path(root or tempfile.gettempdir())
    removed = []
    pattern = re.compile(re.escape(PRIVATE_TMP_PREFIX) + r"(\d+)-[^/]+")
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    for d in entries:
        m = pattern.fullmatch(d.name)
        try:
            if m is None or not d.is_dir() or d.is_symlink() or d.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if _pid_alive(int(m.group(1))):
            continue
        pids = _processes_using(str(d))
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _pid_alive(p) and not _is_zombie(p)]
            time.sleep(0.1)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(d, ignore_errors=True)
        removed.append(str(d))
    return removed


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def _quiet_ray_data() -> None:
    """No progress bars or execution banners from Ray Data (dphub reports its own progress)."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.execution_options.preserve_order = True  # results in input order, as the driver writes
    ctx.enable_progress_bars = False
    ctx.enable_auto_log_stats = False
    if hasattr(ctx, "print_on_execution_start"):
        ctx.print_on_execution_start = False
    for name in ("ray", "ray.data"):
        logging.getLogger(name).setLevel(logging.ERROR)


def ray_engine(recipe: EnsembleRecipe, options: RayOptions | None = None) -> Engine:
    """An engine for :func:`dphub.runner.run_deid` that runs the ensemble on Ray actors."""
    opts = options or RayOptions()
    opts.check()

    def run(batches: Iterator[list[WorkItem]]) -> Iterator[tuple[list[WorkItem], list[Any]]]:
        stream = iter(batches)
        try:
            first = next(stream)
        except StopIteration:  # every note done already: no need for Ray at all
            return
        stream = itertools.chain([first], stream)
        with ray_session(opts) as ray, _without_lines(_RAY_NOISE):
            _quiet_ray_data()
            while True:
                window: list[list[WorkItem]] = []
                stopped: BaseException | None = None
                try:  # a bad input item ends the stream: first finish what was read before it
                    for b in stream:
                        window.append(b)
                        if len(window) >= opts.window:
                            break
                except Exception as e:
                    stopped = e
                if window:
                    yield from _run_window(ray, window, recipe, opts)
                if stopped is not None:
                    raise stopped
                if len(window) < opts.window:
                    return

    return run


def _run_window(ray: Any, window: list[list[WorkItem]], recipe: EnsembleRecipe,
                opts: RayOptions) -> Iterator[tuple[list[WorkItem], list[Any]]]:
    """One Ray Dataset over ``window``; yields ``(batch, results)`` in order as they arrive."""
    rows = [{"seq": i, "notes": _encode_notes(b)} for i, b in enumerate(window)
            if any(it.note is not None for it in b)]
    got: dict[int, list[Any]] = {}
    nxt = 0

    def ready() -> Iterator[tuple[list[WorkItem], list[Any]]]:
        nonlocal nxt
        while nxt < len(window):
            if not any(it.note is not None for it in window[nxt]):
                yield window[nxt], []  # nothing readable: no round trip
            elif nxt in got:
                yield window[nxt], got.pop(nxt)
            else:
                return
            nxt += 1

    if rows:
        n_rows = len(rows)
        ds = ray.data.from_items(rows, override_num_blocks=n_rows)
        del rows  # the object store holds them now: one copy of the window's text in the driver
        ds = ds.map_batches(
            DeidWorker, fn_constructor_kwargs={"recipe": recipe, "threads": opts.threads},
            batch_size=1, batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=min(opts.workers, n_rows)),
            num_cpus=opts.threads)
        for row in ds.iter_rows():
            got[int(row["seq"])] = _decode_results(str(row["results"]))
            yield from ready()
    yield from ready()
    if nxt != len(window):  # Ray returned fewer rows than it was given
        raise RuntimeError("the Ray engine lost results of a window")
