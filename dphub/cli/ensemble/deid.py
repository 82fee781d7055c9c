"""``dphub ensemble deid`` and the top-level ``dphub deid``: directory runs of de-identification.

Thin: check the run's own arguments (:func:`_preflight`) before any member is loaded, choose the
output directory, build the ensemble (or the one model), pick the engine (local or Ray) and call
:func:`dphub.runner.run_deid`. Exit codes: 0 ok, 2 a :class:`~dphub.errors.DphubError`, 3 when a
run skipped notes that failed (:data:`dphub.runner.EXIT_SOME_FAILED`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from dphub.cli.ensemble._common import (
    AGGREGATE_OPT,
    BATCH_OPT,
    DEVICE_OPT,
    ENSEMBLE_OPT,
    FORMAT_OPT,
    INT8_OPT,
    RESUME_OPT,
    RUNTIME_OPT,
    SAFE_WORDS_OPT,
    _say,
    ensemble_app,
)
from dphub.cli.ensemble._surrogates import (  # issue 28: --dates/--ages/--places
    AGE_EPSILON_OPT,
    AGES_OPT,
    DATE_COUNT_OPT,
    DATE_EPSILON_OPT,
    DATE_UNIT_OPT,
    DATES_OPT,
    PLACE_EPSILON_OPT,
    PLACES_OPT,
    surrogate_options,
)
from dphub.cli.options import (
    FLOAT,
    MAX_THREADS,
    apply_threads,
    reads_notes,
    threads_option,
    unit_interval,
)
from dphub.errors import ConfigError

DEFAULT_OUT_SUFFIX = ".deid"


def default_out_dir(input_path: Path) -> Path:
    """``--out`` when none is given: ``<input name without extension>.deid`` beside the input.

    Beside, never inside, so the output is never read back as input; an existing directory is
    refused rather than overwritten or renamed around (a second run must say where it writes,
    or continue the first with ``--resume``).
    """
    src = input_path.expanduser()
    resolved = src.resolve()
    name = resolved.name if resolved.is_dir() else resolved.stem
    if not name:
        raise ConfigError(f"{input_path}: give --out (no default output directory beside it)")
    # keep a relative path relative (shorter messages); "." and ".." need the resolved parent
    parent = src.parent if src.name not in ("", ".", "..") else resolved.parent
    return parent / f"{name}{DEFAULT_OUT_SUFFIX}"


def _resolve_out(input_path: Path, out: Path | None, resume: bool) -> Path:
    if out is not None:
        return out
    dflt = default_out_dir(input_path)
    if dflt.exists() and not resume and input_path.exists():  # a missing input: say that
        raise ConfigError(
            f"{dflt} exists (the default output of {input_path}); pass --out DIR to write "
            "elsewhere, or --resume to continue that run"
        )
    return dflt


#: the INPUT (and --out) that means one note on stdin (and the result on stdout)
STDIO = "-"
#: modes whose output is one note's text (what stdout can carry)
_TEXT_MODES = ("tag", "redact", "surrogate")


def _is_stdio(path: Path | None) -> bool:
    return path is not None and str(path) == STDIO


def _stdio_preflight(input_path: Path, out: Path | None, mode: str, resume: bool) -> bool:
    """Whether this run reads one note from stdin; refuse what cannot go with it, before any model
    is loaded. ``--out -`` without ``-`` as INPUT is refused too (a corpus has many notes)."""
    if not _is_stdio(input_path):
        if _is_stdio(out):
            raise ConfigError("--out - (stdout) takes one note: give INPUT - and the note on stdin")
        return False
    if out is not None and not _is_stdio(out):
        raise ConfigError("INPUT - writes the de-identified note to stdout: leave out --out "
                          "(or pass --out -)")
    if resume:
        raise ConfigError("--resume has nothing to continue with INPUT - (one note on stdin)")
    if mode not in _TEXT_MODES:
        raise ConfigError(f"INPUT - writes one note's text to stdout: --mode must be one of "
                          f"{', '.join(_TEXT_MODES)}, not {mode!r}")
    if sys.stdin is None or sys.stdin.isatty():
        raise ConfigError("INPUT - reads one note from stdin, and stdin is a terminal: "
                          "e.g. `dphub deid - --model rules:default < note.txt`")
    return True


@contextlib.contextmanager
def _stdin_note() -> Iterator[tuple[Path, Path]]:
    """(input directory holding stdin's note as ``stdin.txt``, output directory), private (0700
    and 0600: the note is PHI) and removed afterwards, whatever happens."""
    from dphub.formats._base import decode
    from dphub.io import atomic_write_text

    data = sys.stdin.buffer.read()
    if not data:
        raise ConfigError("stdin is empty: pipe one note in, e.g. `dphub deid - < note.txt`")
    text = decode(data, "stdin")
    if text.startswith("\ufeff"):
        text = text[1:]
    with tempfile.TemporaryDirectory(prefix="dphub-stdin-") as tmp:
        os.chmod(tmp, 0o700)
        src = Path(tmp, "in")
        src.mkdir(mode=0o700)
        atomic_write_text(src / "stdin.txt", text)
        os.chmod(src / "stdin.txt", 0o600)
        yield src, Path(tmp, "out")


def _stdout_note(out: Path, code: int) -> int:
    """Write the de-identified note of a stdin run to stdout, exactly as the run wrote it."""
    result = out / "stdin.txt"
    if code == 0 and result.is_file():
        sys.stdout.write(result.read_text(encoding="utf-8"))
        sys.stdout.flush()
    return code


def _preflight(input_path: Path, mode: str, key_file: Path | None,
               patient_id_from: str | None) -> bytes | None:
    """Check the run's own arguments before any member is loaded, and return the key.

    Why: loading every model took long enough that a typo (``--mode tagg``), a missing input or
    a missing key was only reported after it.
    """
    from dphub.runner import MODES, check_input, patient_pattern

    if mode not in MODES:
        raise ConfigError(f"unknown --mode {mode!r}; choose one of {', '.join(MODES)}")
    if not _is_stdio(input_path):
        check_input(input_path)
    patient_pattern(patient_id_from)
    if mode != "surrogate":
        return None
    if key_file is None:
        from dphub.render import key_recipe

        raise ConfigError("--mode surrogate needs --key-file FILE, a secret that seeds the "
                          "surrogates; " + key_recipe())
    from dphub.render import load_key

    return load_key(key_file)


def process_age() -> float | None:
    """Seconds since this process started (Linux ``/proc``), or None elsewhere."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def timing_line(run_start: float, run_end: float, notes: int) -> str:
    """Start-up and per-note cost of a run, apart (issue 55): a one-shot wall time mixes them.

    Start-up is from the process's start (imports, models, tokenizers, ONNX sessions) to the
    first note, else from the command's; the notes' part is the run itself (reading, every
    member, aggregation, writing). Numbers only, never note text.
    """
    from dphub.progress import command_start

    age = process_age()
    t0 = (time.monotonic() - age) if age is not None else command_start()
    startup = "?" if t0 is None else f"{max(0.0, run_start - t0):.1f} s"
    took = max(run_end - run_start, 1e-9)
    return (f"timing: start-up {startup}; {notes} note(s) in {took:.1f} s "
            f"({notes / took:.1f} notes/s, {1000 * took / notes:.0f} ms/note)")


def _deid_run(input_path: Path, out: Path, ensemble: Any, *, mode: str, key_file: Path | None,
         batch_size: int, workers: int | None, resume: bool, audit_text: bool,
         fmt: str | None, engine: Any = None, patient_id_from: str | None = None,
         render_options: dict[str, Any] | None = None, manifest: Path | None = None,
         stdio: bool = False) -> int:
    """Run the de-identification; with ``stdio``, ``input_path`` is ``-``: stdin's note is
    de-identified in a private temporary directory and written to stdout (messages to stderr)."""
    if stdio:
        from dphub.formats import reading

        # the temporary copy is UTF-8, whatever --encoding stdin was decoded with
        with _stdin_note() as (src, tmp_out), reading(encoding="utf-8"):
            code = _run(src, tmp_out, ensemble, mode=mode, key_file=key_file,
                        batch_size=batch_size, workers=workers, resume=False,
                        audit_text=False, fmt="text", engine=engine,
                        patient_id_from=patient_id_from, render_options=render_options,
                        manifest=None, quiet=True)
            return _stdout_note(tmp_out, code)
    return _run(input_path, out, ensemble, mode=mode, key_file=key_file, batch_size=batch_size,
                workers=workers, resume=resume, audit_text=audit_text, fmt=fmt, engine=engine,
                patient_id_from=patient_id_from, render_options=render_options,
                manifest=manifest)


def _run(input_path: Path, out: Path, ensemble: Any, *, mode: str, key_file: Path | None,
         batch_size: int, workers: int | None, resume: bool, audit_text: bool,
         fmt: str | None, engine: Any = None, patient_id_from: str | None = None,
         render_options: dict[str, Any] | None = None, manifest: Path | None = None,
         quiet: bool = False) -> int:
    from dphub.runner import run_deid

    if workers is not None and engine is None:  # with Ray: threads per actor, set there
        if workers < 1:
            raise ConfigError("--workers must be at least 1")
        import torch

        torch.set_num_threads(workers)
    key = None
    if key_file is not None:
        from dphub.render import load_key

        key = load_key(key_file)
    from dphub.io import disk_full_as_error
    from dphub.progress import ProgressReporter

    started = time.monotonic()
    with ProgressReporter() as reporter, disk_full_as_error(out):
        report = run_deid(input_path, out, ensemble, mode=mode, key=key, fmt=fmt,
                          batch_size=batch_size, resume=resume, audit_text=audit_text,
                          progress=reporter.count_callback("deid", "notes"), engine=engine,
                          patient_id_from=patient_id_from, warn=_say,
                          render_options=render_options,
                          chunk_progress=reporter.count_callback("deid-chunks", "chunks",
                                                                 restart=True))
    msg = f"{report.done} note(s) de-identified into {out}"
    if manifest is not None:  # issue 56: which manifest, not only "the one in this directory"
        msg += f" with the ensemble of {manifest.expanduser().resolve()}"
    if report.already_complete:
        msg = f"the run in {out} is already complete ({report.skipped} note(s)); nothing to do"
    elif report.skipped:
        msg += f", {report.skipped} already done"
    if not quiet:
        typer.echo(msg)
    if report.done and reporter.mode != "off" and not quiet:  # with the progress lines
        _say(timing_line(started, time.monotonic(), report.done))
    for err in report.errors:
        typer.echo(f"failed: {err}", err=True)
    if report.failed:
        typer.echo(f"{len(report.failed)} note(s) failed and were skipped", err=True)
    return report.exit_code


MODE_OPT = typer.Option(
    "tag", "--mode",
    help="Output: tag | redact | surrogate | spans (what `dphub evaluate --pred` reads) | brat.",
)
KEY_OPT = typer.Option(
    None, "--key-file", show_default="none; required by --mode surrogate",
    help="Secret key file that seeds consistent surrogates (--mode surrogate).",
)
# `--threads` as everywhere else; `--workers` kept as the old spelling of the same option.
WORKERS_OPT = threads_option(
    "--workers",
    help="CPU threads for torch (intra-op parallelism); with --engine ray, per actor (default 1).",
)
PATIENT_ID_OPT = typer.Option(
    None, "--patient-id-from", metavar="REGEX", show_default="the input's patient ids, else none",
    help="Patient id of notes that have none, from their file name (or note id): the regex's "
         "group, e.g. '^(\\d+)-' for 1234-note.txt (a pattern with a / is matched against the "
         "path below INPUT). Surrogates and date shifts are consistent per patient; a .meta.json "
         "sidecar {\"patient_id\": ...} beside a .txt gives it too.",
)
AUDIT_OPT = typer.Option(
    False, "--audit-text", help="Also put the removed text in audit.jsonl (it then holds PHI)."
)


ENGINE_OPT = typer.Option(
    "local", "--engine",
    help="local (this process) | ray (Ray Data actors; same output bytes, journal and exit codes).",
)
ADDRESS_OPT = typer.Option(
    None, "--address", show_default="start a local Ray runtime",
    help="With --engine ray: an existing Ray cluster (host:port, or auto).",
)
# Bounded like --threads (issue 31 #12): each actor is a process holding its own copy of the
# ensemble, so an absurd count exhausts the machine (or a cluster's scheduler) before any note.
RAY_WORKERS_OPT = typer.Option(
    2, "--ray-workers", min=1, max=MAX_THREADS,
    help="With --engine ray: actors, each loading the ensemble once (--threads: threads each).",
)


def _site_words(ensemble: Any, manifest_path: Path, safe_words: list[Path]) -> None:
    """Say how many site-local safe words apply (issue 54), or that the manifest's sibling file
    exists and is not applied: it never applies unless named (numbers and paths only)."""
    from dphub.review.safe_words import DEFAULT_NAME

    vocab = ensemble.safe_vocab
    if vocab is not None and vocab.site:
        _say(f"site-local safe words: {len(vocab.site)} word(s) with two or more independent "
             "rejections, released only in lower case, where no name stands and no model is "
             "sure of PHI")
    sibling = manifest_path.expanduser().resolve().parent / DEFAULT_NAME
    given = {Path(p).expanduser().resolve() for p in safe_words}
    if sibling.is_file() and sibling not in given:
        _say(f"note: site-local safe words in {sibling} are not applied; add --safe-words "
             f"{sibling} (with --aggregate inverse) to apply them")


def _ray_engine(engine: str, address: str | None, ray_workers: int, threads: int | None,
                recipe: Any) -> Any:
    """The runner's engine for ``--engine``: None for local, a Ray engine from the recipe."""
    if engine == "local":
        if address is not None:
            raise ConfigError("--address needs --engine ray")
        return None
    if engine != "ray":
        raise ConfigError(f"unknown --engine {engine!r}; choose local or ray")
    from dphub.ray_engine import RayOptions, ray_engine

    return ray_engine(recipe(), RayOptions(address=address, workers=ray_workers,
                                           threads=threads or 1))


@ensemble_app.command("deid")
@reads_notes
def deid_cmd(
    input_path: Path = typer.Argument(
        ..., metavar="INPUT", help="Directory of .txt, a JSONL or CSV file, a corpus, or - for one note on stdin "
        "(the de-identified note goes to stdout)."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", show_default="INPUT.deid beside the input",
        help="Output directory (refused if it exists, unless --resume); - with INPUT -: stdout.",
    ),
    owner_model: Path | None = typer.Option(
        None, "--owner-model", show_default="none",
        help="Also use your own model directory (Scenario B).",
    ),
    aggregate: str | None = AGGREGATE_OPT,
    mode: str = MODE_OPT,
    key_file: Path | None = KEY_OPT,
    batch_size: int = BATCH_OPT,
    workers: int | None = WORKERS_OPT,
    resume: bool = RESUME_OPT,
    audit_text: bool = AUDIT_OPT,
    fmt: str | None = FORMAT_OPT,
    int8: bool = INT8_OPT,
    runtime: str | None = RUNTIME_OPT,
    manifest_path: Path = ENSEMBLE_OPT,
    engine: str = ENGINE_OPT,
    address: str | None = ADDRESS_OPT,
    ray_workers: int = RAY_WORKERS_OPT,
    patient_id_from: str | None = PATIENT_ID_OPT,
    safe_words: list[Path] = SAFE_WORDS_OPT,
    dates: str = DATES_OPT,
    date_epsilon: float | None = DATE_EPSILON_OPT,
    date_unit: str = DATE_UNIT_OPT,
    date_count: str = DATE_COUNT_OPT,
    ages: str = AGES_OPT,
    age_epsilon: float | None = AGE_EPSILON_OPT,
    places: str = PLACES_OPT,
    place_epsilon: float | None = PLACE_EPSILON_OPT,
    device: str | None = DEVICE_OPT,
) -> int:
    """De-identify notes with the ensemble (plus --owner-model); writes OUT/audit.jsonl."""
    from dphub.ensemble.core import build_ensemble, pick_runtime
    from dphub.ensemble.manifest import Manifest
    from dphub.runtime import set_inference_device

    stdio = _stdio_preflight(input_path, out, mode, resume)
    _preflight(input_path, mode, key_file, patient_id_from)
    render_options = surrogate_options(
        mode, dates=dates, date_epsilon=date_epsilon, date_unit=date_unit, ages=ages,
        age_epsilon=age_epsilon, places=places, place_epsilon=place_epsilon,
        date_count=date_count)
    out = Path(STDIO) if stdio else _resolve_out(input_path, out, resume)
    manifest = Manifest.load(manifest_path, missing_ok=owner_model is not None)
    if workers is not None:  # before ONNX sessions are made: they take torch's thread count
        apply_threads(workers)
    set_inference_device(device)

    def recipe() -> Any:  # what each Ray actor builds its copy of the ensemble from
        from dphub.ray_engine import recipe_from_manifest

        # the driver's concrete runtime, not "auto": every worker computes what the run describes
        chosen = pick_runtime(manifest, runtime, owner_model=owner_model is not None, int8=int8)
        return recipe_from_manifest(manifest, owner_model=owner_model, aggregate_rule=aggregate,
                                    batch_size=batch_size, int8=int8,
                                    runtime=chosen[0], safe_words=safe_words)

    run_engine = _ray_engine(engine, address, ray_workers, workers, recipe)
    # built here too with --engine ray: it checks every member before Ray starts, and the run's
    # settings (what a --resume must match) describe it
    ensemble = build_ensemble(manifest, owner_model=owner_model, aggregate_rule=aggregate,
                              batch_size=batch_size, int8=int8, runtime=runtime, progress=_say,
                              safe_words=safe_words)
    _site_words(ensemble, manifest_path, safe_words)
    return _deid_run(input_path, out, ensemble, mode=mode, key_file=key_file,
                     batch_size=batch_size, workers=workers, resume=resume,
                     audit_text=audit_text, fmt=fmt, engine=run_engine,
                     patient_id_from=patient_id_from, render_options=render_options,
                     manifest=manifest_path if manifest_path.is_file() else None, stdio=stdio)


@reads_notes
def deid_top_cmd(
    input_path: Path = typer.Argument(
        ..., metavar="INPUT", help="Directory of .txt, a JSONL or CSV file, a corpus, or - for one note on stdin "
        "(the de-identified note goes to stdout)."
    ),
    model: str = typer.Option(
        ..., "--model", help="A model directory, org/name[@revision], rules:default, "
        "deidpl:DIR or presidio:default."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", show_default="INPUT.deid beside the input",
        help="Output directory (refused if it exists, unless --resume); - with INPUT -: stdout.",
    ),
    threshold: float | None = typer.Option(
        None, "--threshold", parser=unit_interval, metavar=FLOAT, show_default="decode (Viterbi)",
        help="Flag tokens whose P(PHI) >= this threshold (0..1) instead of decoding.",
    ),
    mode: str = MODE_OPT,
    key_file: Path | None = KEY_OPT,
    batch_size: int = BATCH_OPT,
    workers: int | None = WORKERS_OPT,
    resume: bool = RESUME_OPT,
    audit_text: bool = AUDIT_OPT,
    fmt: str | None = FORMAT_OPT,
    int8: bool = INT8_OPT,
    runtime: str | None = RUNTIME_OPT,
    engine: str = ENGINE_OPT,
    address: str | None = ADDRESS_OPT,
    ray_workers: int = RAY_WORKERS_OPT,
    patient_id_from: str | None = PATIENT_ID_OPT,
    dates: str = DATES_OPT,
    date_epsilon: float | None = DATE_EPSILON_OPT,
    date_unit: str = DATE_UNIT_OPT,
    date_count: str = DATE_COUNT_OPT,
    ages: str = AGES_OPT,
    age_epsilon: float | None = AGE_EPSILON_OPT,
    places: str = PLACES_OPT,
    place_epsilon: float | None = PLACE_EPSILON_OPT,
    device: str | None = DEVICE_OPT,
) -> int:
    """De-identify notes with one model (or rules:default)."""
    from dphub.ensemble.core import Ensemble, Slot, member_from_entry, pick_runtime
    from dphub.ensemble.kinds import parse_spec
    from dphub.ensemble.manifest import MemberEntry, card_privacy, entry_from_spec, weights_digest
    from dphub.runtime import set_inference_device

    stdio = _stdio_preflight(input_path, out, mode, resume)
    _preflight(input_path, mode, key_file, patient_id_from)
    render_options = surrogate_options(
        mode, dates=dates, date_epsilon=date_epsilon, date_unit=date_unit, ages=ages,
        age_epsilon=age_epsilon, places=places, place_epsilon=place_epsilon,
        date_count=date_count)
    out = Path(STDIO) if stdio else _resolve_out(input_path, out, resume)
    _ray_engine(engine, address, ray_workers, workers, lambda: None)  # check the options first
    kind, _ = parse_spec(model)
    set_inference_device(device)
    chosen = "torch"
    if not kind.model:  # rules:default, deidpl:DIR, presidio:default ...
        entry = entry_from_spec(model, threshold=threshold)
        slot = member_from_entry(entry)
    else:
        p = Path(model).expanduser()
        if not p.is_dir():
            try:
                from dphub.registry import resolve_model
            except ImportError:
                raise ConfigError(f"{model}: not a model directory") from None
            p = Path(resolve_model(model))
        from dphub.ensemble.members import ModelMember

        priv = card_privacy(p)
        member = ModelMember.load(p, batch_size=batch_size)
        if int8 and runtime not in (None, "torch"):
            raise ConfigError(f"--int8 and --runtime {runtime} exclude each other; use "
                              "--runtime onnx-int8")
        if int8:
            member.quantize_int8()
        chosen, why = pick_runtime(None, runtime, owner_model=True, int8=int8)
        if why is not None:
            _say(f"runtime: {chosen} ({why}); --runtime overrides")
        if chosen != "torch":
            if workers is not None:
                apply_threads(workers)
            member.use_runtime(chosen, progress=_say)
        # the weights digest as revision: a resumed run refuses other weights (outputs would mix)
        slot = Slot(member, threshold, priv.get("epsilon"), priv.get("privacy_unit"),
                    weights_digest(p))
        # what a Ray actor loads: the same directory, name and weights (pinned by digest)
        entry = MemberEntry(p.name, "dir", path=str(p.resolve()), revision=slot.revision,
                            threshold=threshold)

    def recipe() -> Any:
        from dphub.ray_engine import EnsembleRecipe

        return EnsembleRecipe([entry.to_dict()], "any", None, batch_size, int8,
                              ensemble.runtime)

    ensemble = Ensemble([slot])
    ensemble.runtime = chosen
    return _deid_run(input_path, out, ensemble, mode=mode, key_file=key_file,
                     batch_size=batch_size, workers=workers, resume=resume,
                     audit_text=audit_text, fmt=fmt,
                     engine=_ray_engine(engine, address, ray_workers, workers, recipe),
                     patient_id_from=patient_id_from, render_options=render_options, stdio=stdio)
