"""``dphub ensemble ...`` (manifest, deid, calibrate, evaluate) and the top-level ``dphub deid``.

Thin: parse options, call :mod:`dphub.ensemble` / :mod:`dphub.runner`, print. Exit codes: 0 ok,
2 a :class:`~dphub.errors.DphubError`, 3 when a run skipped notes that failed
(:data:`dphub.runner.EXIT_SOME_FAILED`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from dphub.cli.options import (
    FLOAT,
    MAX_THREADS,
    apply_threads,
    finite_float,
    positive_float,
    threads_option,
    unit_interval,
)

# one declaration of each training option (cli/train.py)
from dphub.cli.train import (
    ALLOW_ABOVE_POLICY_OPT,
    BASE_MODEL_OPT,
    DELTA_OPT,
    ENCODER_LAYERS_OPT,
    EPOCHS_OPT,
    FORCE_OPT,
    HEAD_OPT,
    INIT_FROM_OPT,
    LABEL_SCHEMA_OPT,
    LORA_RANK_OPT,
    LR_OPT,
    MAX_EPSILON_OPT,
    NOISE_OPT,
    PRIVACY_UNIT_OPT,
    RECALL_WEIGHT_OPT,
    SEED_OPT,
    TARGET_EPSILON_OPT,
    TRAIN_LAYERS_OPT,
    WARM_START_OPT,
)
from dphub.cli.train import BATCH_SIZE_OPT as TRAIN_BATCH_OPT
from dphub.errors import ConfigError, InputError

ensemble_app = typer.Typer(
    name="ensemble",
    help="Combine published models and rules into a local de-identification ensemble.",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help: keep literal brackets
)

ENSEMBLE_OPT = typer.Option(
    Path("dphub-ensemble.toml"), "--ensemble", "-e", help="The ensemble manifest (TOML)."
)


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


# ---------------------------------------------------------------------------- manifest commands
@ensemble_app.command("add")
def add_cmd(
    spec: str = typer.Argument(
        ..., metavar="SPEC",
        help="org/name[@revision] (a pulled model), a model directory, rules:default, "
             "deidpl:DIR (deid.pl in DIR, or DIR/FILE.config; needs perl) or presidio:default "
             "(needs the presidio extra).",
    ),
    threshold: float | None = typer.Option(
        None, "--threshold", parser=unit_interval, metavar=FLOAT, show_default="decode (Viterbi)",
        help="Flag tokens whose P(PHI) >= this threshold (0..1) instead of decoding.",
    ),
    name: str | None = typer.Option(
        None, "--name", show_default="the repo or directory name", help="Member name."
    ),
    timeout: float | None = typer.Option(
        None, "--timeout", parser=positive_float, metavar=FLOAT,
        show_default="600 s per batch",
        help="deidpl: members only: seconds one deid.pl run (one batch of notes) may take before "
             "it is stopped and its batch fails.",
    ),
    manifest_path: Path = ENSEMBLE_OPT,
) -> None:
    """Add a member, pinning its revision (registry sha, weights or tool digest)."""
    from dphub.ensemble.core import prepare_runtime
    from dphub.ensemble.manifest import Manifest, entry_from_spec

    entry = entry_from_spec(spec, name=name, threshold=threshold,  # hashing weights: unlocked
                            timeout=timeout)
    current = Manifest.load(manifest_path).runtime if manifest_path.exists() else None
    if current not in (None, "torch"):  # the manifest's runtime, ready for the new member now
        prepare_runtime([entry], current, progress=_say)
    with Manifest.editing(manifest_path, missing_ok=True) as manifest:
        manifest.add(entry)
    typer.echo(f"added {entry.name} ({entry.kind}"
               + (f", revision {entry.revision}" if entry.revision else "") + f") to {manifest_path}")
    if entry.kind == "rules":
        typer.echo(_min_age_note(entry, manifest_path))


def _min_age_note(entry: Any, manifest_path: Path) -> str:
    """Which ages a rule member flags, said where it is chosen (issue: the README's figures use
    ``min_age = 90`` while the default flags every age, and the two differ in precision)."""
    from dphub.ensemble.rules import RuleOptions

    min_age = RuleOptions.from_dict(entry.options).min_age
    if min_age:
        return f"{entry.name}: flags ages of {min_age} and over (min_age = {min_age})"
    return (f"{entry.name}: flags EVERY age (min_age = 0, as i2b2-2014 and dphub's own models "
            "label ages). HIPAA Safe Harbor needs only ages over 89, as in the README's rule "
            f"figures: give this member options = {{ min_age = 90 }} in "
            f"{manifest_path} for fewer false positives on ages")


@ensemble_app.command("remove")
def remove_cmd(
    name: str = typer.Argument(..., metavar="NAME", help="Member name."),
    manifest_path: Path = ENSEMBLE_OPT,
) -> None:
    """Remove a member."""
    from dphub.ensemble.manifest import Manifest

    with Manifest.editing(manifest_path) as manifest:
        manifest.remove(name)
    typer.echo(f"removed {name} from {manifest_path}")


@ensemble_app.command("list")
def list_cmd(manifest_path: Path = ENSEMBLE_OPT,
             json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Members with revision, ε, privacy unit and threshold."""
    from dphub.ensemble.manifest import Manifest

    manifest = Manifest.load(manifest_path)
    if json_out:
        typer.echo(json.dumps({"aggregate": manifest.aggregate,
                               **({"runtime": manifest.runtime} if manifest.runtime else {}),
                               "members": [m.to_dict() for m in manifest.members]}, indent=2))
        return
    t = Table(title=f"{manifest_path} (aggregate: {manifest.aggregate})")
    for col in ("member", "kind", "revision", "ε", "unit", "threshold"):
        t.add_column(col)
    for m in manifest.members:
        rev = (m.revision or "-")
        t.add_row(m.name, m.kind, rev[:19], _fmt(m.epsilon), m.unit or "-",
                  "decode" if m.threshold is None and m.kind in ("registry", "dir")
                  else _fmt(m.threshold))
    Console().print(t)
    for m in manifest.members:
        if m.kind == "rules":
            typer.echo(_min_age_note(m, manifest_path))


@ensemble_app.command("show")
def show_cmd(name: str | None = typer.Argument(None, metavar="NAME", show_default="all members",
                                              help="One member."),
             manifest_path: Path = ENSEMBLE_OPT) -> None:
    """Print the manifest (or one member) as JSON."""
    from dphub.ensemble.manifest import Manifest

    manifest = Manifest.load(manifest_path)
    if name:
        typer.echo(json.dumps(manifest.get(name).to_dict(), indent=2))
    else:
        typer.echo(json.dumps({"aggregate": manifest.aggregate,
                               **({"runtime": manifest.runtime} if manifest.runtime else {}),
                               "members": [m.to_dict() for m in manifest.members]}, indent=2))


@ensemble_app.command("runtime")
def runtime_cmd(runtime: str | None = typer.Argument(
                    None, metavar="RUNTIME", show_default="print the current one",
                    help="torch | torch-bf16 | onnx | onnx-int8 (stored in the manifest)."),
                manifest_path: Path = ENSEMBLE_OPT) -> None:
    """Show or set the encoder runtime that deid and evaluate use by default."""
    from dphub.ensemble.manifest import Manifest
    from dphub.runtime import DEFAULT_RUNTIME, check_runtime

    if runtime is None:
        typer.echo(Manifest.load(manifest_path).runtime or DEFAULT_RUNTIME)
        return
    from dphub.ensemble.core import prepare_runtime

    check_runtime(runtime)
    # every model member's encoder readied first (ONNX graphs built or verified; bf16 support
    # checked): a runtime that cannot work here is refused before the manifest names it
    n = prepare_runtime(Manifest.load(manifest_path).members, runtime, progress=_say)
    with Manifest.editing(manifest_path) as manifest:
        manifest.runtime = runtime
    typer.echo(f"runtime {runtime} stored in {manifest_path}"
               + (f" ({n} encoder{'s' if n != 1 else ''} ready)" if n else ""))


# ---------------------------------------------------------------------------- runs
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


def _preflight(input_path: Path, mode: str, key_file: Path | None,
               patient_id_from: str | None) -> bytes | None:
    """Check the run's own arguments before any member is loaded, and return the key.

    Why: loading every model took long enough that a typo (``--mode tagg``), a missing input or
    a missing key was only reported after it.
    """
    from dphub.runner import MODES, check_input, patient_pattern

    if mode not in MODES:
        raise ConfigError(f"unknown --mode {mode!r}; choose one of {', '.join(MODES)}")
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


def _run(input_path: Path, out: Path, ensemble: Any, *, mode: str, key_file: Path | None,
         batch_size: int, workers: int | None, resume: bool, audit_text: bool,
         fmt: str | None, engine: Any = None, patient_id_from: str | None = None) -> int:
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

    with ProgressReporter() as reporter, disk_full_as_error(out):
        report = run_deid(input_path, out, ensemble, mode=mode, key=key, fmt=fmt,
                          batch_size=batch_size, resume=resume, audit_text=audit_text,
                          progress=reporter.count_callback("deid", "notes"), engine=engine,
                          patient_id_from=patient_id_from, warn=_say,
                          chunk_progress=reporter.count_callback("deid-chunks", "chunks",
                                                                 restart=True))
    msg = f"{report.done} note(s) de-identified into {out}"
    if report.already_complete:
        msg = f"the run in {out} is already complete ({report.skipped} note(s)); nothing to do"
    elif report.skipped:
        msg += f", {report.skipped} already done"
    typer.echo(msg)
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
BATCH_OPT = typer.Option(16, "--batch-size", min=1, help="Notes per batch.")
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
RESUME_OPT = typer.Option(False, "--resume", help="Continue an interrupted run in OUT.")
AUDIT_OPT = typer.Option(
    False, "--audit-text", help="Also put the removed text in audit.jsonl (it then holds PHI)."
)
FORMAT_OPT = typer.Option(
    None, "--format", "-f", show_default="detect from the path", help="Input format."
)
AGGREGATE_OPT = typer.Option(
    None, "--aggregate", show_default="the manifest's, else any",
    help="Aggregation: any (a character is PHI if any member flags it) | k-of-n:K (K members "
         "must agree) | k-of-n:K+NAME+... (as k-of-n:K, but the named members' flags count "
         "alone, e.g. k-of-n:2+rules:default: two pulled models must agree, the rules need not).",
)
RUNTIME_OPT = typer.Option(
    None, "--runtime", show_default="the manifest's, else torch",
    help="Encoder runtime of model members: torch | torch-bf16 | onnx | onnx-int8 (ONNX graphs "
         "are built once per encoder and cached; torch-bf16 needs a CPU with native bfloat16).",
)


def _say(msg: str) -> None:
    """Status lines of slow set-up steps (ONNX export), on stderr; never note text."""
    typer.echo(msg, err=True)


INT8_OPT = typer.Option(False, "--int8", help="Int8 dynamic quantization of model members "
                        "(faster on CPU; check recall with `ensemble evaluate --int8`).")
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
def deid_cmd(
    input_path: Path = typer.Argument(
        ..., metavar="INPUT", help="Directory of .txt, a JSONL file, or a corpus."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", show_default="INPUT.deid beside the input",
        help="Output directory (refused if it exists, unless --resume).",
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
) -> int:
    """De-identify notes with the ensemble (plus --owner-model); writes OUT/audit.jsonl."""
    from dphub.ensemble.core import build_ensemble
    from dphub.ensemble.manifest import Manifest

    _preflight(input_path, mode, key_file, patient_id_from)
    out = _resolve_out(input_path, out, resume)
    manifest = Manifest.load(manifest_path, missing_ok=owner_model is not None)
    if workers is not None:  # before ONNX sessions are made: they take torch's thread count
        apply_threads(workers)

    def recipe() -> Any:  # what each Ray actor builds its copy of the ensemble from
        from dphub.ray_engine import recipe_from_manifest

        return recipe_from_manifest(manifest, owner_model=owner_model, aggregate_rule=aggregate,
                                    batch_size=batch_size, int8=int8,
                                    runtime=runtime)

    run_engine = _ray_engine(engine, address, ray_workers, workers, recipe)
    # built here too with --engine ray: it checks every member before Ray starts, and the run's
    # settings (what a --resume must match) describe it
    ensemble = build_ensemble(manifest, owner_model=owner_model, aggregate_rule=aggregate,
                              batch_size=batch_size, int8=int8, runtime=runtime, progress=_say)
    return _run(input_path, out, ensemble, mode=mode, key_file=key_file, batch_size=batch_size,
                workers=workers, resume=resume, audit_text=audit_text, fmt=fmt,
                engine=run_engine, patient_id_from=patient_id_from)


def deid_top_cmd(
    input_path: Path = typer.Argument(
        ..., metavar="INPUT", help="Directory of .txt, a JSONL file, or a corpus."
    ),
    model: str = typer.Option(
        ..., "--model", help="A model directory, org/name[@revision], rules:default, "
        "deidpl:DIR or presidio:default."
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", show_default="INPUT.deid beside the input",
        help="Output directory (refused if it exists, unless --resume).",
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
) -> int:
    """De-identify notes with one model (or rules:default)."""
    from dphub.ensemble.core import Ensemble, Slot, member_from_entry
    from dphub.ensemble.manifest import MemberEntry, card_privacy, weights_digest

    _preflight(input_path, mode, key_file, patient_id_from)
    out = _resolve_out(input_path, out, resume)
    _ray_engine(engine, address, ray_workers, workers, lambda: None)  # check the options first
    if model.startswith("rules:"):
        entry = MemberEntry(model, "rules", threshold=threshold)
        slot = member_from_entry(entry)
    elif model.startswith(("deidpl:", "presidio:")):
        from dphub.ensemble.manifest import entry_from_spec

        entry = entry_from_spec(model, threshold=threshold)
        slot = member_from_entry(entry)
    else:
        p = Path(model).expanduser()
        if not p.is_dir():
            try:
                from dphub.hub.registry import resolve_model
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
        if runtime not in (None, "torch"):
            if workers is not None:
                apply_threads(workers)
            member.use_runtime(runtime, progress=_say)
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
    if runtime not in (None, "torch") and not model.startswith("rules:"):
        ensemble.runtime = runtime
    return _run(input_path, out, ensemble, mode=mode, key_file=key_file,
                batch_size=batch_size, workers=workers, resume=resume, audit_text=audit_text,
                fmt=fmt, engine=_ray_engine(engine, address, ray_workers, workers, recipe),
                patient_id_from=patient_id_from)


# ---------------------------------------------------------------------------- calibrate/evaluate
@ensemble_app.command("calibrate")
def calibrate_cmd(
    labelled: Path = typer.Argument(
        ..., metavar="LABELLED", help="The owner's labelled notes (any format)."
    ),
    target_recall: float = typer.Option(
        0.99, "--target-recall", parser=finite_float(min=0.0, max=1.0, min_open=True),
        metavar=FLOAT, help="Ensemble token recall to reach (0..1).",
    ),
    aggregate: str | None = AGGREGATE_OPT,
    fmt: str | None = FORMAT_OPT,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print thresholds, do not store them."),
    min_precision: float = typer.Option(
        0.5, "--min-precision", parser=finite_float(min=0.0, max=1.0), metavar=FLOAT,
        help="Refuse when the target costs precision below this (calibration or held-out notes)."),
    holdout: float = typer.Option(
        0.3, "--holdout", parser=finite_float(min=0.0, max=0.9), metavar=FLOAT,
        help="Share of patients held out to check the thresholds (0: calibrate on all)."),
    force: bool = typer.Option(
        False, "--force", help="Store the thresholds even below --min-precision (warns)."),
    per_label: bool = typer.Option(
        True, "--per-label/--per-member", help="A threshold per (member, label), or per member."),
    seed: int = typer.Option(0, "--seed", help="Seed of the patient holdout split."),
    manifest_path: Path = ENSEMBLE_OPT,
    threads: int | None = threads_option(),
) -> None:
    """Choose thresholds per (member, label) for a target ensemble recall; store them in the
    manifest. Refuses (exit 2) when the target costs precision below --min-precision."""
    from dphub.ensemble.calibrate import calibrate
    from dphub.ensemble.core import build_ensemble
    from dphub.ensemble.evaluation import read_labelled
    from dphub.ensemble.manifest import Manifest

    apply_threads(threads)
    manifest = Manifest.load(manifest_path)
    ensemble = build_ensemble(manifest, aggregate_rule=aggregate, progress=_say)
    notes = read_labelled(labelled, fmt)
    from dphub.progress import ProgressReporter

    with ProgressReporter() as reporter:
        res = calibrate(ensemble, notes, target_recall, per_label=per_label, holdout=holdout,
                        seed=seed, min_precision=min_precision, force=force,
                        progress=reporter.count_callback("calibrate", "members"))
    for name, t in res.thresholds.items():
        per = res.label_thresholds.get(name, {})
        extra = f" ({', '.join(f'{lab} {v:g}' for lab, v in per.items())}; other labels {t:g})" \
            if per else ""
        typer.echo(f"{name}: threshold {t:g}{extra}")
    typer.echo(f"calibration notes ({res.notes} notes, {res.patients} patients): ensemble token "
               f"recall {res.recall:.4f} (target {target_recall}), precision {res.precision:.4f} "
               f"on {res.tokens} tokens ({res.phi_tokens} PHI)")
    h = res.holdout
    if h is not None:
        rec = "-" if h.recall is None else f"{h.recall:.4f}"
        typer.echo(f"held-out check ({h.notes} notes, {h.patients} patients): token recall {rec}, "
                   f"precision {h.precision:.4f} on {h.tokens} tokens ({h.phi_tokens} PHI)")
        if h.recall is not None and h.recall < target_recall:
            typer.echo(f"warning: held-out recall {h.recall:.4f} is below the target "
                       f"{target_recall}; more labelled notes would give steadier thresholds",
                       err=True)
    if not res.reached:
        typer.echo("warning: target recall not reached; lowest thresholds chosen", err=True)
    if res.forced:
        typer.echo(f"WARNING (--force): {res.refusal()}", err=True)
        typer.echo("WARNING (--force): these thresholds flag much that is not PHI; the output "
                   "will be over-redacted", err=True)
    if not dry_run:
        # stored under the manifest's lock: a concurrent `ensemble add` must not be lost
        with Manifest.editing(manifest_path) as current:
            for name, t in res.thresholds.items():
                entry = current.get(name)
                entry.threshold = t
                entry.label_thresholds = dict(res.label_thresholds.get(name, {}))
            if aggregate:
                current.aggregate = aggregate
        typer.echo(f"thresholds stored in {manifest_path}")


@ensemble_app.command("evaluate")
def evaluate_cmd(
    labelled: Path = typer.Argument(..., metavar="LABELLED", help="Labelled notes (any format)."),
    owner_model: Path | None = typer.Option(
        None, "--owner-model", show_default="none", help="Also evaluate your own model directory."
    ),
    aggregate: str | None = AGGREGATE_OPT,
    fmt: str | None = FORMAT_OPT,
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    int8: bool = INT8_OPT,
    runtime: str | None = RUNTIME_OPT,
    manifest_path: Path = ENSEMBLE_OPT,
    threads: int | None = threads_option(),
) -> None:
    """Each member and the aggregate side by side: token P/R/F1, phrase recall, ε, unit."""
    from dphub.ensemble.core import build_ensemble
    from dphub.ensemble.evaluation import evaluate_ensemble, read_labelled
    from dphub.ensemble.manifest import Manifest

    apply_threads(threads)
    manifest = Manifest.load(manifest_path, missing_ok=owner_model is not None)
    ensemble = build_ensemble(manifest, owner_model=owner_model, aggregate_rule=aggregate,
                              int8=int8, runtime=runtime, progress=_say)
    notes = read_labelled(labelled, fmt)
    if not notes:
        raise InputError(f"{labelled}: no notes")
    from dphub.progress import ProgressReporter

    with ProgressReporter() as reporter:
        rows = evaluate_ensemble(ensemble, notes,
                                 progress=reporter.count_callback("evaluate", "notes"))
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    t = Table(title=f"ensemble evaluation on {len(notes)} notes (token-binary)")
    for col in ("member", "ε", "unit", "P", "R", "F1", "phrase R any", "phrase R full"):
        t.add_column(col, justify="left" if col in ("member", "unit") else "right")
    for r in rows:
        t.add_row(r["name"], _fmt(r["epsilon"]), r["unit"] or "-",
                  *(f"{100 * r[k]:.1f}" for k in ("precision", "recall", "f1",
                                                  "phrase_recall_any", "phrase_recall_full")))
    Console().print(t)


# ---------------------------------------------------------------------------- the owner's models

OWNER_OUT_OPT = typer.Option(
    ..., "--out", "-o", help="Model directory to write (stays on this machine unless --dp).",
)
DP_OPT = typer.Option(
    False, "--dp", help="Train with DP-SGD instead: an ordinary DP model with its ε, publishable. "
    "Default: no DP, a LOCAL ONLY model that the publish gate refuses.",
)
#: the flags that are training options (TrainOptions fields), as the commands name them
_TRAIN_FLAGS = ("base_model", "noise", "target_epsilon", "delta", "epochs", "batch_size", "lr",
                "privacy_unit", "head", "train_layers", "encoder_layers", "lora_rank",
                "recall_weight",
                "label_schema", "max_epsilon", "seed", "warm_start", "init_from")


def _owner_options(flags: dict[str, Any], out: Path, dp: bool, force: bool,
                   resume: bool = False) -> Any:
    """TrainOptions of an owner model: the flags given, made local unless ``--dp``."""
    from dphub.cli.train import build_options
    from dphub.ensemble.distill import local_options

    given = {k: flags[k] for k in _TRAIN_FLAGS if flags.get(k) is not None}
    if not dp:
        dp_only = [k for k in ("noise", "target_epsilon", "delta", "max_epsilon") if k in given]
        if dp_only:
            raise ConfigError(f"--{dp_only[0].replace('_', '-')} applies to DP training: add --dp")
    opts = build_options({**given, "out": out}, {}, force=force, resume=resume)
    return local_options(opts, dp=dp, explicit=set(given))


def _plan_check(opts: Any, allow: bool, batch_flag: str) -> Any:
    """``dphub train``'s check of the projected ε against the hub policy, before the first step
    (a local model projects none). The hub is the default one (``$DPHUB_HUB``): like the
    training options, these commands read nothing from dphub.toml."""
    from dphub.cli.train import _plan_check as check

    return check(opts, {}, allow=allow, batch_flag=batch_flag)


def _report_owner(res: Any) -> None:
    from dphub.card import LOCAL_ONLY_STATEMENT

    t = res.train
    if res.local_only:
        what = f"{LOCAL_ONLY_STATEMENT.upper()} (no DP; the publish gate refuses it)"
    else:
        eps = res.epsilon if res.epsilon is not None else t.epsilon
        delta = res.delta if res.delta is not None else t.delta
        what = f"ε = {eps:.3f}, δ = {delta:.2g} (DP, publishable)"
        composed = [e for e in res.teachers if e["composed"]]
        if composed:
            what += (f"; composed with {len(composed)} teacher(s) that may have seen these "
                     f"patients (this run alone: ε = {t.epsilon:.3f}, δ = {t.delta:.2g}; "
                     "declare a member trained on other patients with --disjoint-teacher NAME)")
    typer.echo(f"wrote {res.out_dir}: {what}; {res.notes} training notes ({res.gold_notes} with "
               f"gold labels, {res.pseudo_notes} labelled by the ensemble), {t.steps} steps")
    typer.echo(f"use it: dphub ensemble add {res.out_dir}  (or dphub deid NOTES --model "
               f"{res.out_dir})")


@ensemble_app.command("distill")
def distill_cmd(
    notes_path: Path = typer.Argument(
        ..., metavar="NOTES", help="The owner's notes (any format; gold spans, if any, ignored)."
    ),
    out: Path = OWNER_OUT_OPT,
    dp: bool = DP_OPT,
    labels: Path | None = typer.Option(
        None, "--labels", show_default="none",
        help="The owner's labelled notes: their gold spans replace the ensemble's labels.",
    ),
    rounds: int = typer.Option(
        1, "--rounds", min=1, help="Rounds; each adds the previous student to the labelling "
        "ensemble.",
    ),
    soft_labels: bool = typer.Option(
        False, "--soft-labels",
        help="Soft labels: each ensemble span's score is the probability the student learns "
             "for its tag (the rest goes to O); local (non-DP) students only.",
    ),
    disjoint_teacher: list[str] = typer.Option(
        [], "--disjoint-teacher", metavar="NAME",
        help="With --dp: declare that member NAME was trained on none of these patients, so "
             "its ε is not composed into the student's (recorded on the card as your "
             "declaration). Default: every member with ε > 0 may have seen them and is composed.",
    ),
    aggregate: str | None = AGGREGATE_OPT,
    fmt: str | None = FORMAT_OPT,
    batch_size: int = BATCH_OPT,
    base_model: str | None = BASE_MODEL_OPT,
    noise: float | None = NOISE_OPT,
    target_epsilon: float | None = TARGET_EPSILON_OPT,
    delta: float | None = DELTA_OPT,
    max_epsilon: float | None = MAX_EPSILON_OPT,
    epochs: float | None = EPOCHS_OPT,
    train_batch_size: int | None = typer.Option(
        None, "--train-batch-size", min=1, show_default="8 (local), 96 (--dp)",
        help="Expected units per training step (`dphub train --batch-size`).",
    ),
    lr: float | None = LR_OPT,
    privacy_unit: str | None = PRIVACY_UNIT_OPT,
    head: str | None = HEAD_OPT,
    train_layers: int | None = TRAIN_LAYERS_OPT,
    encoder_layers: int | None = ENCODER_LAYERS_OPT,
    lora_rank: int | None = LORA_RANK_OPT,
    recall_weight: float | None = RECALL_WEIGHT_OPT,
    label_schema: str | None = LABEL_SCHEMA_OPT,
    seed: int | None = SEED_OPT,
    warm_start: str | None = WARM_START_OPT,
    init_from: str | None = INIT_FROM_OPT,
    force: bool = FORCE_OPT,
    resume: bool = RESUME_OPT,
    manifest_path: Path = ENSEMBLE_OPT,
    threads: int | None = threads_option(),
    allow_above_policy: bool = ALLOW_ABOVE_POLICY_OPT,
) -> None:
    """Scenario A+: the ensemble labels your unlabelled notes; a student model learns them.

    Nothing leaves the machine. Without --dp the student is LOCAL ONLY (no DP: it contains
    unprotected patient information; its card says so and `dphub publish` refuses it), trained
    with --train-batch-size 8 and --privacy-unit note unless given.
    """
    from dphub import formats
    from dphub.ensemble.core import build_ensemble
    from dphub.ensemble.distill import distill
    from dphub.ensemble.evaluation import read_labelled
    from dphub.ensemble.manifest import Manifest
    from dphub.io import disk_full_as_error
    from dphub.progress import ProgressReporter

    apply_threads(threads)
    flags = {**locals(), "batch_size": train_batch_size}
    opts = _owner_options(flags, out, dp, force, resume)
    opts.soft_labels = soft_labels
    opts.check_soft_labels()
    if not notes_path.exists():
        raise InputError(f"{notes_path}: not found")
    notes = list(formats.read(notes_path, fmt))
    gold = read_labelled(labels) if labels is not None else []
    ensemble = build_ensemble(Manifest.load(manifest_path), aggregate_rule=aggregate,
                              batch_size=batch_size)
    with ProgressReporter() as reporter, disk_full_as_error(out):
        res = distill(ensemble, notes, opts, labelled=gold, rounds=rounds, batch_size=batch_size,
                      disjoint_teachers=disjoint_teacher,
                      on_label=reporter.count_callback("label", "notes"),
                      on_progress=reporter.train_callback(),
                      on_plan=_plan_check(opts, allow_above_policy, "--train-batch-size"))
    _report_owner(res)


@ensemble_app.command("train")
def train_cmd(
    labelled: Path = typer.Argument(
        ..., metavar="LABELLED", help="The owner's labelled notes (any format)."
    ),
    out: Path = OWNER_OUT_OPT,
    dp: bool = DP_OPT,
    init_from: str | None = INIT_FROM_OPT,
    fmt: str | None = FORMAT_OPT,
    base_model: str | None = BASE_MODEL_OPT,
    noise: float | None = NOISE_OPT,
    target_epsilon: float | None = TARGET_EPSILON_OPT,
    delta: float | None = DELTA_OPT,
    max_epsilon: float | None = MAX_EPSILON_OPT,
    epochs: float | None = EPOCHS_OPT,
    batch_size: int | None = TRAIN_BATCH_OPT,
    lr: float | None = LR_OPT,
    privacy_unit: str | None = PRIVACY_UNIT_OPT,
    head: str | None = HEAD_OPT,
    train_layers: int | None = TRAIN_LAYERS_OPT,
    encoder_layers: int | None = ENCODER_LAYERS_OPT,
    lora_rank: int | None = LORA_RANK_OPT,
    recall_weight: float | None = RECALL_WEIGHT_OPT,
    label_schema: str | None = LABEL_SCHEMA_OPT,
    seed: int | None = SEED_OPT,
    warm_start: str | None = WARM_START_OPT,
    force: bool = FORCE_OPT,
    resume: bool = RESUME_OPT,
    threads: int | None = threads_option(),
    allow_above_policy: bool = ALLOW_ABOVE_POLICY_OPT,
) -> None:
    """Scenario B: your own model on your own labelled notes (optionally from a pulled model).

    Without --dp it is LOCAL ONLY (no DP: it contains unprotected patient information; its card
    says so and `dphub publish` refuses it), trained with --batch-size 8 and --privacy-unit note
    unless given. With --dp it is `dphub train` (publishable with its ε).
    """
    from dphub.ensemble.distill import train_local
    from dphub.ensemble.evaluation import read_labelled
    from dphub.io import disk_full_as_error
    from dphub.progress import ProgressReporter

    apply_threads(threads)
    opts = _owner_options(dict(locals()), out, dp, force, resume)
    notes = read_labelled(labelled, fmt)
    with ProgressReporter() as reporter, disk_full_as_error(out):
        res = train_local(notes, opts, on_progress=reporter.train_callback(),
                          on_plan=_plan_check(opts, allow_above_policy, "--batch-size"))
    _report_owner(res)


def register(app: typer.Typer) -> None:
    """Add the ``ensemble`` group and the top-level ``deid`` command to the root app."""
    app.add_typer(ensemble_app, name="ensemble")
    app.command("deid")(deid_top_cmd)
