"""DP-SGD training of PHI taggers: data preparation, the training loop, checkpoints and resume.

The pipeline is ``notes -> windows (dphub.align) -> units (dphub.privacy.units) -> Opacus DP-SGD ->
model directory (dphub.tagger) + card (dphub.card)``.

Privacy mechanics (why the code looks the way it does):

* The privacy *unit* (patient by default) is what the guarantee protects, so sampling and clipping
  work on units, not windows: the Poisson sampler draws units with probability ``q``; after the
  backward pass every parameter's per-window ``grad_sample`` rows are summed per unit
  (``aggregate_grad_sample_by_unit``) and Opacus's ``DPOptimizer`` clips each unit's gradient to
  ``max_grad_norm`` and adds Gaussian noise. ``BatchMemoryManager`` splits a logical batch by
  dataset items, i.e. by whole units, so one unit never straddles two physical batches.
* ``q`` is ``1 / k`` for an integer ``k`` (steps per epoch): Opacus derives the accountant's sample
  rate from the data loader's length, and ``1 / len(loader)`` must equal the rate the sampler uses.
  The expected logical batch is ``q * N`` units.
* An empty Poisson batch still takes a step (noise only): skipping it would change the mechanism
  the accountant assumes.
* Recall weighting multiplies sample ``i``'s loss by ``rho_i = 1 + delta_p * FNR_i`` where
  ``FNR_i`` comes from sample ``i``'s own detached predictions; it only rescales that sample's
  gradient before per-unit clipping, so the sensitivity bound (and ε) is unchanged.
* ``--max-epsilon`` is enforced *before* training: the number of steps is capped at the largest
  ``T`` whose ε stays within the budget, so training never takes a step that would exceed it.

Checkpoints hold everything a resumed run needs to continue the *same* random process: model and
optimizer state, the sampler and noise generators, the global RNG (dropout), the accountant
history and the step. They are private (pickles via ``torch.save``) and live outside the published
directory (``<out>/../.<name>.ckpt/``); they are removed after a successful run.

The library never prints: progress goes to an optional callback.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dphub.errors import ConfigError, InputError, PrivacyError
from dphub.io import atomic_directory, atomic_open, atomic_write_text
from dphub.notes import Note

log = logging.getLogger(__name__)

PRIVACY_UNITS = ("patient", "note", "sequence")
HEADS = ("crf", "softmax")
WARM_STARTS = ("synth", "none")
ACCOUNTANTS = ("prv", "rdp")
#: Target ε used when neither ``--noise`` nor ``--target-epsilon`` is given.
DEFAULT_TARGET_EPSILON = 8.0
#: A pickled checkpoint of dphub < 0.2: never loaded (it could run code), only detected.
LEGACY_CHECKPOINT_FILE = "checkpoint.pt"
TRAINING_CONFIG_FILE = "training_config.json"


# --------------------------------------------------------------------------------------------
# options
# --------------------------------------------------------------------------------------------


@dataclass
class TrainOptions:
    """Every knob of ``dphub train``; the CLI fills it from flags, ``dphub.toml`` and defaults.

    Defaults are chosen for ~1,500 nursing notes of ~100 patients on two CPU cores:

    * a public warm start (synthetic notes, no ε) carries most of the skill;
    * under DP only the emission layer and the CRF train (``train_layers=0``): with ~100 patients
      the noise per coordinate is large, so DP can only adapt few parameters; the frozen
      encoder then runs once per window (cached), which makes each DP epoch cheap;
    * large logical batches (``batch_size`` 96 units: q = 1 for up to ~140 patients) give the
      best signal-to-noise ratio per unit of ε for a given amount of compute;
    * recall weighting (δp = 3) counters DP's drift towards predicting "no PHI";
    * windows of 128 word pieces with 32 of overlap, at most 64 windows per unit.
    """

    data: Path | None = None
    format: str | None = None
    out: Path | None = None
    base_model: str | None = None
    noise: float | None = None
    target_epsilon: float | None = None
    delta: float | None = None
    epochs: float = 32.0
    batch_size: int = 96
    max_physical_batch: int = 16
    max_grad_norm: float = 1.0
    lr: float = 5e-3
    privacy_unit: str = "patient"
    max_examples_per_unit: int = 64
    accountant: str = "prv"
    head: str = "crf"
    train_layers: int = 0
    lora_rank: int | None = None
    recall_weight: float = 3.0
    label_schema: str = "hipaa"
    max_epsilon: float | None = None
    seed: int = 0
    secure_rng: bool = False
    resume: bool = False
    init_from: str | None = None
    warm_start: str = "synth"
    no_dp: bool = False
    max_length: int = 128
    stride: int = 32
    checkpoint_every: int = 10
    checkpoint_dir: Path | None = None
    force: bool = False
    #: stop (as if killed) after this many steps; only for tests of resume
    _stop_after: int | None = field(default=None, repr=False)

    def validate(self) -> None:
        """Refuse inconsistent options with one readable message."""
        if self.data is None:
            raise ConfigError("no training data: pass DATA or set [data] path in dphub.toml")
        if self.out is None:
            raise ConfigError("no output directory: pass --out or set [output] dir in dphub.toml")
        _choice("--privacy-unit", self.privacy_unit, PRIVACY_UNITS)
        _choice("--head", self.head, HEADS)
        _choice("--warm-start", self.warm_start, WARM_STARTS)
        _choice("--accountant", self.accountant, ACCOUNTANTS)
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                flag = "--" + f.name.replace("_", "-")
                raise ConfigError(f"{flag} must be a finite number, got {value}")
        if self.noise is not None and self.target_epsilon is not None:
            raise ConfigError("give either --noise or --target-epsilon, not both")
        if self.noise is not None and self.noise <= 0:
            raise ConfigError(f"--noise must be > 0, got {self.noise}")
        for name, value in (
            ("--target-epsilon", self.target_epsilon),
            ("--max-epsilon", self.max_epsilon),
        ):
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be > 0, got {value}")
        if self.delta is not None and not 0 < self.delta < 1:
            raise ConfigError(f"--delta must be in (0, 1), got {self.delta}")
        positive = {
            "--epochs": self.epochs,
            "--batch-size": self.batch_size,
            "--max-physical-batch": self.max_physical_batch,
            "--max-grad-norm": self.max_grad_norm,
            "--lr": self.lr,
            "--max-examples-per-unit": self.max_examples_per_unit,
            "--checkpoint-every": self.checkpoint_every,
        }
        for name, value in positive.items():
            if value is None or value <= 0:
                raise ConfigError(f"{name} must be > 0, got {value}")
        if self.train_layers < 0:
            raise ConfigError(f"--train-layers must be >= 0, got {self.train_layers}")
        if self.lora_rank is not None and self.lora_rank <= 0:
            raise ConfigError(f"--lora-rank must be > 0, got {self.lora_rank}")
        if self.recall_weight < 0:
            raise ConfigError(f"--recall-weight must be >= 0, got {self.recall_weight}")
        if not 8 <= self.max_length <= 512:
            raise ConfigError(f"max_length must be in [8, 512], got {self.max_length}")
        if not 0 <= self.stride < self.max_length - 2:
            raise ConfigError(f"stride must be in [0, max_length - 2), got {self.stride}")
        from dphub.labels import get_schema

        get_schema(self.label_schema)

    def public_dict(self) -> dict[str, Any]:
        """Hyper-parameters as recorded in ``training_config.json``: no paths, no user names."""
        hidden = {"data", "out", "checkpoint_dir", "resume", "force", "_stop_after", "base_model",
                  "init_from"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in hidden}


def _choice(flag: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{flag} must be one of {', '.join(allowed)}, got {value!r}")


def default_delta(num_units: int) -> float:
    """δ when none is given: ``min(1e-5, 1 / (10 N))`` — always well below ``1 / N``.

    δ bounds the probability that the ε guarantee fails for some unit; it must be much smaller
    than the chance of picking one unit at random (1/N).
    """
    return min(1e-5, 1.0 / (10 * max(num_units, 1)))


# --------------------------------------------------------------------------------------------
# data preparation
# --------------------------------------------------------------------------------------------


@dataclass
class Example:
    """One training window: word-piece ids with specials and tag ids (-100 at specials)."""

    unit: str
    note_index: int
    input_ids: list[int]
    labels: list[int]


def encode_notes(
    notes: Sequence[Note],
    tokenizer: Any,
    tags: Sequence[str],
    schema_name: str,
    *,
    max_length: int = 128,
    stride: int = 32,
    unit: str = "patient",
) -> list[Example]:
    """Window every note (nothing truncated) and attach BIOES tag ids to each window's tokens.

    ``unit`` decides which id each window is grouped under: the patient, the note, or the window
    itself (``sequence``).
    """
    from dphub import align
    from dphub.labels import get_schema
    from dphub.privacy.units import unit_key

    schema = get_schema(schema_name)
    tag_id = {t: i for i, t in enumerate(tags)}
    toks = align.tokenize(tokenizer, [n.text for n in notes])
    note_tags: list[list[int]] = []
    for n, nt in zip(notes, toks, strict=True):
        try:
            note_tags.append([tag_id[t] for t in align.spans_to_tags(nt.offsets, n.spans, schema)])
        except KeyError as e:  # a tag outside the model's tag set: schema mismatch
            raise InputError(f"note {n.id}: tag {e.args[0]} not in the model's tags") from None
    windows = align.make_windows(toks, tokenizer, max_length=max_length, stride=stride)
    out: list[Example] = []
    for wi, w in enumerate(windows):
        n = notes[w.note_index]
        if w.n_tokens == 0:  # an empty note: nothing to learn from
            continue
        labels = [-100] * len(w.input_ids)
        labels[w.content_slice] = note_tags[w.note_index][w.token_start : w.token_end]
        u = unit_key(unit, n.id, n.patient_id, wi)
        out.append(Example(u, w.note_index, list(w.input_ids), labels))
    return out


def check_patient_ids(notes: Sequence[Note], unit: str) -> None:
    """Patient-level DP needs patient ids on every note; refuse rather than silently weaken it."""
    if unit != "patient":
        return
    missing = [n.id for n in notes if n.patient_id is None]
    if missing:
        raise ConfigError(
            f"--privacy-unit patient needs a patient id on every note; {len(missing)} note(s) "
            f"have none (first: note {missing[0]}); use --privacy-unit note for notes without "
            "patients (weaker: NOT patient-level protection)"
        )


def batch_from_examples(examples: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a list of windows into batch-shaped, contiguous tensors (plus ``labels``)."""
    n = len(examples)
    length = max((len(e.input_ids) for e in examples), default=2)
    ids = torch.full((n, length), pad_id, dtype=torch.long)
    mask = torch.zeros((n, length), dtype=torch.long)
    labels = torch.full((n, length), -100, dtype=torch.long)
    for i, e in enumerate(examples):
        k = len(e.input_ids)
        ids[i, :k] = torch.tensor(e.input_ids)
        mask[i, :k] = 1
        labels[i, :k] = torch.tensor(e.labels)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": torch.zeros((n, length), dtype=torch.long),
        "position_ids": torch.arange(length).unsqueeze(0).expand(n, length).contiguous(),
        "labels": labels,
    }


def recall_weights(
    model: Any, batch: dict[str, torch.Tensor], labels: torch.Tensor, delta_p: float
) -> torch.Tensor | None:
    """ρ_i = 1 + δp · FNR_i per window, from the window's OWN predictions (detached).

    FNR_i is the share of the window's gold PHI tokens that its current prediction (argmax of the
    emissions) calls ``O``; windows without gold PHI get ρ = 1. The weights are constants of the
    backward pass, so they only rescale each sample's gradient before clipping.
    """
    if delta_p <= 0:
        return None
    with torch.no_grad():
        em = model.emissions(
            batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
            batch["position_ids"],
        )
        pred = em.argmax(-1)
        gold_phi = (labels > 0) & (labels != -100)  # tag 0 is "O"
        missed = gold_phi & (pred == 0)
        n_gold = gold_phi.sum(-1)
        fnr = torch.where(n_gold > 0, missed.sum(-1) / n_gold.clamp(min=1), torch.zeros(()))
    return (1.0 + delta_p * fnr).detach().float()


# --------------------------------------------------------------------------------------------
# results and progress
# --------------------------------------------------------------------------------------------


@dataclass
class Progress:
    """What a progress display may show: numbers only, never text."""

    phase: str  # "warm-start" | "train"
    step: int
    total_steps: int
    loss: float | None
    epsilon: float | None
    steps_per_second: float | None


@dataclass
class TrainResult:
    out_dir: Path
    steps: int
    planned_steps: int
    epsilon: float | None
    delta: float | None
    noise_multiplier: float | None
    sample_rate: float
    num_units: int
    seconds: float
    stopped_by_max_epsilon: bool
    meta: dict[str, Any]


ProgressFn = Callable[[Progress], None]


# --------------------------------------------------------------------------------------------
# privacy planning
# --------------------------------------------------------------------------------------------


@dataclass
class PrivacyPlan:
    num_units: int
    steps_per_epoch: int
    sample_rate: float
    steps: int
    planned_steps: int
    noise_multiplier: float | None
    delta: float | None
    stopped_by_max_epsilon: bool

    @property
    def expected_batch(self) -> float:
        return self.sample_rate * self.num_units

    @property
    def expected_batch_units(self) -> int:
        """The divisor of the mean-reduced noisy sum: ``round(N · q)``, never 0.

        ``q = 1 / k`` with ``k = round(N / batch_size) ≤ N``, so ``N · q ≥ 1`` mathematically; in
        floating point ``N · (1 / N)`` can come out just below 1, which Opacus truncates to 0.
        """
        return max(1, round(self.sample_rate * self.num_units))


def _eps_quiet(accountant: str, q: float, sigma: float, steps: int, delta: float) -> float:
    from dphub.privacy import accounting

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return accounting.epsilon_for(accountant, q, sigma, steps, delta)


def plan_privacy(opts: TrainOptions, num_units: int) -> PrivacyPlan:
    """Sample rate, steps, σ and δ for a run over ``num_units`` units."""
    if num_units < 1:
        raise InputError("no training units: the data has no labelled notes")
    k = max(1, round(num_units / opts.batch_size))
    q = 1.0 / k
    steps = max(1, round(opts.epochs * k))
    if opts.no_dp:
        return PrivacyPlan(num_units, k, q, steps, steps, None, None, False)
    delta = opts.delta if opts.delta is not None else default_delta(num_units)
    if delta > 1.0 / num_units:
        raise PrivacyError(f"--delta {delta:g} exceeds 1/N = 1/{num_units}; choose δ ≤ 1/N")
    if opts.noise is not None:
        sigma = float(opts.noise)
    else:
        from dphub.privacy import accounting

        target = opts.target_epsilon if opts.target_epsilon is not None else DEFAULT_TARGET_EPSILON
        sigma = accounting.noise_for_target_epsilon(opts.accountant, target, q, steps, delta, 0.01)
    planned = steps
    stopped = False
    if (
        opts.max_epsilon is not None
        and _eps_quiet(opts.accountant, q, sigma, steps, delta) > opts.max_epsilon
    ):
        lo, hi = 0, steps  # eps(lo) <= max < eps(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if _eps_quiet(opts.accountant, q, sigma, mid, delta) <= opts.max_epsilon:
                lo = mid
            else:
                hi = mid
        if lo == 0:
            raise PrivacyError(
                f"even one step exceeds --max-epsilon {opts.max_epsilon} "
                f"(σ = {sigma:.3g}, q = {q:.3g}); raise the noise or the budget"
            )
        steps = lo
        stopped = True
    return PrivacyPlan(num_units, k, q, steps, planned, sigma, delta, stopped)


# --------------------------------------------------------------------------------------------
# checkpoints
# --------------------------------------------------------------------------------------------


def checkpoint_dir_for(out: Path, override: Path | None = None) -> Path:
    """``<out>/../.<name>.ckpt/``: next to, never inside, the published directory."""
    if override is not None:
        return Path(override)
    out = Path(out).resolve()
    return out.parent / f".{out.name}.ckpt"


def save_checkpoint(directory: Path, state: dict[str, Any]) -> None:
    """Write a private checkpoint (safetensors + JSON, no pickle) atomically into ``directory``."""
    from dphub import checkpoint

    checkpoint.save(directory, state)


def load_checkpoint(directory: Path, fingerprint: str) -> dict[str, Any]:
    """Load a checkpoint of *this* run: the fingerprint is checked before any tensor is read."""
    from dphub import checkpoint

    manifest = checkpoint.read_manifest(directory)
    if manifest["state"].get("fingerprint") != fingerprint:
        raise ConfigError(
            f"{directory}: checkpoint belongs to a different run (data or options changed)"
        )
    return checkpoint.load(directory, manifest)


def _fingerprint(opts: TrainOptions, examples: Sequence[Example], base_id: str) -> str:
    """Hash of everything that must match for a resumed run to continue the same run."""
    h = hashlib.sha256()
    keep = {k: v for k, v in opts.public_dict().items() if k not in ("checkpoint_every",)}
    h.update(json.dumps(keep, sort_keys=True, default=str).encode())
    h.update(base_id.encode())
    h.update(str(opts.init_from).encode())
    for ex in examples:
        h.update(ex.unit.encode())
        h.update(np.asarray(ex.input_ids, dtype=np.int64).tobytes())
        h.update(np.asarray(ex.labels, dtype=np.int64).tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# the training loop
# --------------------------------------------------------------------------------------------


def _trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _loss(model: Any, batch: dict[str, torch.Tensor], recall_weight: float) -> torch.Tensor:
    """Per-window loss (recall-weighted when asked), shape [B]."""
    labels = batch["tags"]
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids", "position_ids")}
    weights = recall_weights(model, inputs, labels, recall_weight)
    return model.per_sample_loss(inputs, labels, weights=weights)


def load_training_notes(opts: TrainOptions) -> list[Note]:
    """Read the training corpus; only labelled notes train."""
    from dphub import formats

    path = Path(opts.data)  # type: ignore[arg-type]
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    notes = [n for n in formats.read(path, opts.format) if n.labelled]
    if not notes:
        raise InputError(f"{path}: no labelled notes to train on")
    return notes


@dataclass
class _Source:
    """Where the initial weights come from and what the card says about them."""

    model: Any
    base_public_id: str
    tokenizer_dir: Path
    public_pretraining: dict[str, Any] | None
    lineage: list[dict[str, Any]]


def _initial_model(opts: TrainOptions, on_progress: ProgressFn | None) -> _Source:
    from dphub.encoders import resolve_base_model
    from dphub.tagger import TaggerModel

    if opts.init_from:
        return _from_pulled_model(opts)
    loadable, public_id = resolve_base_model(opts.base_model)
    if isinstance(loadable, str):
        raise ConfigError(
            f"base model {public_id!r} is not a local directory and nothing can be downloaded; "
            "pass --base-model PATH"
        )
    if opts.warm_start == "synth":
        from dphub import warmstart

        ws = warmstart.WarmStartConfig(max_length=opts.max_length, stride=opts.stride)
        wdir = warmstart.warm_start(
            Path(loadable), public_id, opts.label_schema, opts.head, ws, seed=opts.seed,
            on_progress=on_progress,
        )
        model = TaggerModel.load(wdir)
        return _Source(model, public_id, Path(loadable), ws.card_block(seed=opts.seed), [])
    model = TaggerModel.from_base(loadable, schema=opts.label_schema, head=opts.head)
    return _Source(model, public_id, Path(loadable), None, [])


def _from_pulled_model(opts: TrainOptions) -> _Source:
    """Fine-tune a pulled DP model: its weights start, its card gives the lineage."""
    from dphub.tagger import TaggerModel

    p = Path(str(opts.init_from)).expanduser()
    if p.is_dir():
        src = p
    else:
        from dphub.hub.registry import resolve_model

        src = Path(resolve_model(str(opts.init_from)))
    model = TaggerModel.load(src)
    if model.head != opts.head:
        raise ConfigError(f"--init-from model has head {model.head!r}, not {opts.head!r}")
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    schema = cfg.get("dphub", {}).get("label_schema", opts.label_schema)
    if schema != opts.label_schema:
        raise ConfigError(f"--init-from model uses label schema {schema!r}, not {opts.label_schema!r}")
    base_id = str(cfg.get("_name_or_path") or src.name)
    from dphub.card import load_card

    meta = load_card(src).meta
    dp = meta.get("differential_privacy", {}) or {}
    base_id = str(meta.get("base_model") or base_id)
    pretraining = dp.get("public_pretraining")
    lineage: list[dict[str, Any]] = list(dp.get("lineage") or [])
    if not dp.get("private") or dp.get("epsilon") is None:
        raise PrivacyError(
            f"--init-from {opts.init_from}: the source model is not private (its card says "
            "private: false); fine-tuning it cannot produce a private model"
        )
    repo, rev = _source_repo_revision(str(opts.init_from), src, p.is_dir())
    lineage.append({
        "repo": repo,
        "revision": rev,
        "epsilon": dp.get("epsilon"),
        "delta": dp.get("delta"),
        "privacy_unit": dp.get("privacy_unit"),
    })
    return _Source(model, base_id, src, pretraining, lineage)


def _source_repo_revision(spec: str, src: Path, is_dir: bool) -> tuple[str, str]:
    """Public (repo, revision) of an ``--init-from`` source: hub id and pulled revision, or the
    directory name and ``local`` for a directory (never its path)."""
    if is_dir:
        return src.name, "local"
    repo, _, requested = spec.partition("@")
    rev = ""
    with contextlib.suppress(Exception):
        from dphub.hub.registry import Registry

        rev = str(Registry().get(repo, requested or None).revision or "")
    return repo, rev or requested or "unknown"


def is_model_directory(path: Path) -> bool:
    """A directory ``dphub train`` wrote (the only kind ``--force`` may replace)."""
    return (path / TRAINING_CONFIG_FILE).is_file() and (path / "model.safetensors").is_file()


def check_output_dir(out: Path, data: Path, *, force: bool) -> None:
    """Refuse an output that is a file, overlaps the training data, or is not ours to replace.

    ``--force`` replaces a previous model directory and nothing else: never the corpus, never a
    directory holding it, never a directory that ``dphub train`` did not write.
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a directory; choose another --out")
    o, d = out.resolve(), data.resolve()
    if o == d or d.is_relative_to(o) or o.is_relative_to(d):
        raise ConfigError(
            f"--out {out} overlaps the training data {data}; write the model elsewhere"
        )
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ConfigError(f"{out}: output directory exists and is not empty (use --force)")
        if not is_model_directory(out):
            raise ConfigError(
                f"{out}: --force replaces only a model directory written by dphub train "
                f"({TRAINING_CONFIG_FILE} + model.safetensors); this is not one, so nothing "
                "was removed"
            )


def run_log_path(ckpt_dir: Path) -> Path:
    """The private run log (loss curve, exact counts) beside the checkpoint directory."""
    name = ckpt_dir.name.removesuffix(".ckpt")
    return ckpt_dir.parent / f"{name}.trainlog.json"


def write_run_log(path: Path, record: dict[str, Any]) -> None:
    """Write the run's private log (0600): values the accountant did not pay for stay here."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "w") as fh:
        fh.write(json.dumps(record, indent=2) + "\n")
    os.chmod(path, 0o600)


def train(opts: TrainOptions, *, on_progress: ProgressFn | None = None,
          extra_notes: Sequence[Note] = ()) -> TrainResult:
    """Train a tagger with DP-SGD (or without, for ``no_dp`` baselines) and write its directory.

    Returns what was done (steps, ε, δ, σ, q). Raises :class:`DphubError` subclasses for bad
    input or options; nothing is written to ``opts.out`` unless training completes.

    ``extra_notes`` are public synthetic notes trained on beside the corpus (the canary patients
    of :mod:`dphub.audit`): they are units like any other (so the accounting covers them), but
    the card's ``dataset`` block describes the real corpus only.
    """
    opts.validate()
    out = Path(opts.out)  # type: ignore[arg-type]
    check_output_dir(out, Path(opts.data), force=opts.force)  # type: ignore[arg-type]
    from dphub import checkpoint

    ckpt_dir = checkpoint_dir_for(out, opts.checkpoint_dir)
    if (ckpt_dir / LEGACY_CHECKPOINT_FILE).exists():
        raise ConfigError(
            f"{ckpt_dir}: holds a pickled checkpoint of an older dphub, which is never loaded "
            "(unpickling can run code); delete that directory to start over"
        )
    if checkpoint.exists(ckpt_dir) and not opts.resume:
        raise ConfigError(
            f"{ckpt_dir}: a checkpoint of an interrupted run exists; pass --resume to continue "
            "it, or delete it to start over"
        )
    if opts.resume and not checkpoint.exists(ckpt_dir):
        raise ConfigError(f"--resume: no checkpoint in {ckpt_dir}")

    t0 = time.monotonic()
    torch.manual_seed(opts.seed)
    notes = load_training_notes(opts)
    train_notes = [*notes, *extra_notes]
    check_patient_ids(train_notes, opts.privacy_unit)
    src = _initial_model(opts, on_progress)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?",
                        src.base_public_id):
        # the card records the base as a public hub id; find out now, not after training
        raise ConfigError(
            f"base model name {src.base_public_id!r} is not a hub-style id (org/name); rename "
            "the base model directory to its public name"
        )
    model = src.model
    from transformers import AutoTokenizer

    from dphub.privacy.units import UnitDataset

    tokenizer = AutoTokenizer.from_pretrained(src.tokenizer_dir)
    examples = encode_notes(
        train_notes, tokenizer, model.tags, opts.label_schema, max_length=opts.max_length,
        stride=opts.stride, unit=opts.privacy_unit,
    )
    if not examples:
        raise InputError(f"{opts.data}: the labelled notes contain no tokens")
    dataset = UnitDataset.from_windows(
        [e.input_ids for e in examples], [e.labels for e in examples],
        [e.unit for e in examples], max_examples_per_unit=opts.max_examples_per_unit,
    )
    plan = plan_privacy(opts, len(dataset))
    log.info(
        "%d units, %d windows used (%d left out by max_examples_per_unit), q = %.4g, %d steps, "
        "sigma = %s", len(dataset), dataset.num_windows, dataset.dropped_windows,
        plan.sample_rate, plan.steps, plan.noise_multiplier,
    )
    fingerprint = _fingerprint(opts, examples, src.base_public_id)
    state = load_checkpoint(ckpt_dir, fingerprint) if opts.resume else None

    torch.manual_seed(opts.seed)
    model.set_trainable(train_layers=opts.train_layers, lora_rank=opts.lora_rank)
    model.max_length, model.stride = opts.max_length, opts.stride
    model.train()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    with _cached_encoder(model, opts, examples, pad_id):
        loop = _Loop(opts, plan, model, dataset, tokenizer, on_progress)
        if state is not None:
            loop.restore(state)
        loop.run(ckpt_dir, fingerprint)
    if opts._stop_after is not None and loop.step < plan.steps:
        raise KeyboardInterrupt  # simulated kill (tests)
    if loop.step != plan.steps:  # pragma: no cover - invariant
        raise PrivacyError(f"internal: took {loop.step} steps, planned {plan.steps}")

    # windows of the real corpus (extra units are small: never capped by max_examples_per_unit)
    real_windows = max(0, dataset.num_windows
                       - sum(1 for e in examples if e.note_index >= len(notes)))
    epsilon = None
    if loop.engine is not None:
        # the ε the training accountant tracked; the card adds the dp-accounting cross-check
        epsilon = _quiet_epsilon(loop.engine.accountant, plan.delta)
    model.eval()
    meta = _write_output(
        out, model, src, opts, plan, loop.step, epsilon,
        lambda sha: build_meta(opts, plan, src, notes, real_windows, loop.step, epsilon,
                               weights_sha256=sha),
    )
    write_run_log(run_log_path(ckpt_dir), {
        "steps": loop.step,
        "loss_history": [None if math.isnan(v) else round(v, 5) for v in loop.losses],
        "num_units": plan.num_units,
        "windows": dataset.num_windows,
        "windows_left_out": dataset.dropped_windows,
        "seconds": round(time.monotonic() - t0, 1),
    })
    with contextlib.suppress(OSError):
        shutil.rmtree(ckpt_dir)
    return TrainResult(
        out_dir=out, steps=loop.step, planned_steps=plan.planned_steps, epsilon=epsilon,
        delta=plan.delta, noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate,
        num_units=plan.num_units, seconds=time.monotonic() - t0,
        stopped_by_max_epsilon=plan.stopped_by_max_epsilon, meta=meta,
    )


class FrozenEncoderCache(torch.nn.Module):
    """Stands in for a fully frozen encoder: returns its precomputed outputs.

    With ``train_layers=0`` (and no LoRA) nothing in the encoder trains, so its output for a
    window is a fixed function of the window's token ids once dropout is off. Computing it once
    (eval mode) and looking it up by the ids makes every DP epoch cost only the head and the CRF —
    on two CPU cores the difference between minutes and an hour. Keys are the window's token ids
    (identical windows share an entry, which is exact since their outputs are identical).
    """

    def __init__(self, encoder: torch.nn.Module, windows: Sequence[Sequence[int]],
                 pad_id: int, batch_size: int = 32) -> None:
        super().__init__()
        self.config = getattr(encoder, "config", None)
        self.table: dict[bytes, torch.Tensor] = {}
        was_training = encoder.training
        encoder.eval()
        uniq = list({np.asarray(w, dtype=np.int64).tobytes(): list(w) for w in windows}.items())
        uniq.sort(key=lambda kv: len(kv[1]))  # length bucketing: little padding
        with torch.inference_mode():
            for i in range(0, len(uniq), batch_size):
                chunk = uniq[i : i + batch_size]
                n, width = len(chunk), max(len(w) for _, w in chunk)
                ids = torch.full((n, width), pad_id, dtype=torch.long)
                mask = torch.zeros((n, width), dtype=torch.long)
                for r, (_, w) in enumerate(chunk):
                    ids[r, : len(w)] = torch.tensor(w)
                    mask[r, : len(w)] = 1
                out = encoder(input_ids=ids, attention_mask=mask,
                              token_type_ids=torch.zeros_like(ids),
                              position_ids=torch.arange(width).expand(n, width).contiguous())
                hidden = out[0] if isinstance(out, tuple) else out.last_hidden_state
                for r, (key, w) in enumerate(chunk):
                    self.table[key] = hidden[r, : len(w)].to(torch.float16).clone()
        encoder.train(was_training)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor]:
        b, width = input_ids.shape
        if b == 0:
            return (torch.zeros((0, width, self._hidden()), dtype=torch.float32),)
        rows = []
        lengths = attention_mask.sum(-1).tolist()
        for r in range(b):
            key = input_ids[r, : int(lengths[r])].numpy().astype(np.int64).tobytes()
            h = self.table[key].float()
            rows.append(torch.nn.functional.pad(h, (0, 0, 0, width - h.shape[0])))
        return (torch.stack(rows),)

    def _hidden(self) -> int:
        return next(iter(self.table.values())).shape[-1]


@contextlib.contextmanager
def _cached_encoder(model: Any, opts: TrainOptions, examples: Sequence[Example],
                    pad_id: int) -> Iterator[None]:
    """Swap a frozen encoder for its feature cache while training (head-only runs)."""
    if opts.train_layers != 0 or opts.lora_rank is not None:
        yield
        return
    real = model.encoder
    model.encoder = FrozenEncoderCache(real, [e.input_ids for e in examples], pad_id)
    try:
        yield
    finally:
        model.encoder = real


def _quiet_epsilon(accountant: Any, delta: float) -> float:
    """The accountant's ε, without numpy's edge-case warnings (q = 1) reaching the terminal."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return float(accountant.get_epsilon(delta))


class _Loop:
    """The step loop, DP (Opacus) or not, with its resumable state.

    Both modes draw units by Poisson sampling (:class:`~dphub.privacy.randomness.PoissonUnitSampler`)
    so ``--no-dp`` is an ablation of clipping and noise only. Under DP the sampler and the noise
    draw from a :class:`~dphub.privacy.randomness.MechanismRandomness` seeded from the OS on every
    run (never from ``--seed``); without DP the data order follows ``--seed``.
    """

    def __init__(self, opts: TrainOptions, plan: PrivacyPlan, model: Any, dataset: Any,
                 tokenizer: Any, on_progress: ProgressFn | None) -> None:
        from dphub.privacy.randomness import (
            MechanismRandomness,
            PoissonUnitSampler,
            install_noise_source,
        )
        from dphub.privacy.units import unit_collate

        self.opts, self.plan, self.model, self.on_progress = opts, plan, model, on_progress
        self.params = _trainable(model)
        self.optimizer: Any = torch.optim.Adam(self.params, lr=opts.lr)
        self.source = MechanismRandomness.for_run(
            private=not opts.no_dp, secure=opts.secure_rng, seed=opts.seed
        )
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.sampler = PoissonUnitSampler(
            num_samples=len(dataset), sample_rate=plan.sample_rate, source=self.source,
            steps=plan.steps_per_epoch,
        )
        loader: Any = torch.utils.data.DataLoader(
            dataset, batch_sampler=self.sampler,
            collate_fn=functools.partial(unit_collate, pad_id=pad_id),
        )
        self.engine: Any = None
        if not opts.no_dp:
            from opacus import PrivacyEngine

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.engine = PrivacyEngine(accountant=opts.accountant)
                # poisson_sampling=False: the loader's batch sampler already *is* a Poisson
                # sampler (ours, drawing from the mechanism's randomness); Opacus would replace
                # it by one drawing from torch's seeded global generator
                gsm, self.optimizer, loader = self.engine.make_private(
                    module=model, optimizer=self.optimizer, data_loader=loader,
                    noise_multiplier=plan.noise_multiplier, max_grad_norm=opts.max_grad_norm,
                    loss_reduction="mean", poisson_sampling=False, grad_sample_mode="hooks",
                )
            gsm.forbid_grad_accumulation()
            install_noise_source(self.optimizer, self.source)
            # Opacus sets int(N * q), which is 0 when N * q rounds below 1 in floating point
            self.optimizer.expected_batch_size = plan.expected_batch_units
            if abs(1.0 / len(loader) - plan.sample_rate) > 1e-12:  # pragma: no cover
                raise PrivacyError("internal: sampler rate differs from the accounted rate")
            account = self.optimizer.step_hook

            def _hook(opt: Any) -> None:
                account(opt)
                self.step += 1

            self.optimizer.step_hook = _hook
        self.loader = loader
        self.step = 0
        self.losses: list[float] = []
        self.rng_state: dict[str, Any] | None = None
        self._eps: float | None = None
        self._t0 = time.monotonic()
        self._done = 0

    def restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.engine is not None:
            self.engine.accountant.load_state_dict(state["accountant"])
        self.step = int(state["step"])
        self.losses = [float("nan") if v is None else float(v) for v in state.get("losses", [])]
        self.rng_state = state["rng"]

    def checkpoint(self, path: Path, fingerprint: str) -> None:
        save_checkpoint(path, {
            "fingerprint": fingerprint,
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "accountant": self.engine.accountant.state_dict() if self.engine else None,
            # DP runs: the mechanism's generator is never stored (fresh OS entropy on resume)
            "rng": {"torch": torch.get_rng_state(), "data_order": self.source.state()},
            "losses": [None if math.isnan(v) else v for v in self.losses],
        })

    def _report(self, loss: float) -> None:
        if self.on_progress is None:
            return
        n = self.step
        if self.engine is not None and (n % self.opts.checkpoint_every == 0 or n == self.plan.steps
                                        or self._eps is None):
            with contextlib.suppress(Exception):
                self._eps = _quiet_epsilon(self.engine.accountant, self.plan.delta)
        el = time.monotonic() - self._t0
        self.on_progress(Progress("train", n, self.plan.steps, loss, self._eps,
                                  self._done / el if el > 0 else None))

    def _after_step(self, loss: float, ckpt: Path, fingerprint: str) -> bool:
        """Bookkeeping after a logical step; True when the loop must stop (test kill)."""
        self.losses.append(loss)
        self._done += 1
        if self.step % self.opts.checkpoint_every == 0 and self.step < self.plan.steps:
            self.checkpoint(ckpt, fingerprint)
        self._report(loss)
        return self.opts._stop_after is not None and self.step >= self.opts._stop_after

    def run(self, ckpt: Path, fingerprint: str) -> None:
        remaining = self.plan.steps - self.step
        if remaining <= 0:
            return
        self.loader.batch_sampler.steps = remaining
        if self.engine is not None:
            from opacus.utils.batch_memory_manager import BatchMemoryManager

            ctx: Any = BatchMemoryManager(
                data_loader=self.loader, max_physical_batch_size=self.opts.max_physical_batch,
                optimizer=self.optimizer,
            )
        else:
            ctx = contextlib.nullcontext(self.loader)
        with ctx as phys_loader:
            it = iter(phys_loader)
            # creating the iterator may draw from the sampler's generator: restore afterwards,
            # so a resumed run draws exactly the batches the uninterrupted run would have drawn
            if self.rng_state is not None:
                torch.set_rng_state(self.rng_state["torch"])
                self.source.set_state(self.rng_state.get("data_order"))
            with warnings.catch_warnings():
                # frozen embeddings: torch notes that backward hooks fire on outputs only
                warnings.filterwarnings("ignore", message="Full backward hook")
                if self.engine is not None:
                    self._run_dp(it, ckpt, fingerprint)
                else:
                    self._run_plain(it, ckpt, fingerprint)

    def _run_dp(self, it: Iterator[Any], ckpt: Path, fingerprint: str) -> None:
        from dphub.privacy.units import (
            aggregate_grad_sample_by_unit,
            batch_num_units,
            check_one_gradient_per_unit,
        )

        step_loss: list[float] = []
        for batch in it:
            before = self.step
            n_units = batch_num_units(batch) if isinstance(batch, dict) else 0
            if n_units == 0:  # empty Poisson batch: a noise-only step
                aggregate_grad_sample_by_unit(self.model, torch.zeros(0, dtype=torch.long), 0)
            else:
                per = _loss(self.model, batch, self.opts.recall_weight)
                per.mean().backward()
                step_loss.append(float(per.detach().mean()))
                aggregate_grad_sample_by_unit(self.model, batch["unit_index"], n_units)
            # the guarantee's invariant, checked on every physical batch: the optimizer is about
            # to clip exactly one gradient per sampled unit
            check_one_gradient_per_unit(self.model, n_units)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.step > before:
                loss = float(np.mean(step_loss)) if step_loss else float("nan")
                step_loss = []
                if self._after_step(loss, ckpt, fingerprint):
                    return

    def _run_plain(self, it: Iterator[Any], ckpt: Path, fingerprint: str) -> None:
        from dphub.privacy.units import batch_num_units

        for batch in it:
            n_units = batch_num_units(batch) if isinstance(batch, dict) else 0
            loss = float("nan")
            if n_units:
                total = int(batch["input_ids"].shape[0])
                acc = 0.0
                for chunk in _physical_chunks(batch, self.opts.max_physical_batch):
                    per = _loss(self.model, chunk, self.opts.recall_weight)
                    (per.sum() / total).backward()
                    acc += float(per.detach().sum())
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                loss = acc / total
            self.step += 1
            if self._after_step(loss, ckpt, fingerprint):
                return


def _physical_chunks(batch: dict[str, torch.Tensor], max_units: int) -> list[dict[str, torch.Tensor]]:
    """Split a non-private logical batch into chunks of at most ``max_units`` whole units."""
    ui = batch["unit_index"]
    n_units = int(batch["unit_sizes"].numel())
    out = []
    for start in range(0, n_units, max_units):
        sel = (ui >= start) & (ui < start + max_units)
        out.append({k: v[sel] for k, v in batch.items() if k != "unit_sizes"})
    return out


def build_meta(
    opts: TrainOptions,
    plan: PrivacyPlan,
    src: _Source,
    notes: Sequence[Note],
    n_sequences: int,
    steps: int,
    epsilon: float | None,
    *,
    weights_sha256: str | None = None,
) -> dict[str, Any]:
    """Card front matter (HF keys + ``differential_privacy`` + ``dataset``) via dphub.card."""
    from dphub import card

    recall = (
        {"enabled": True, "delta_p": float(opts.recall_weight), "rho": "1 + delta_p * FNR_i",
         "computed_from": "own-detached-predictions"}
        if opts.recall_weight > 0 else {"enabled": False}
    )
    common: dict[str, Any] = {
        "recall_weighting": recall,
        "public_pretraining": src.public_pretraining or {"enabled": False},
        "lineage": src.lineage or None,
    }
    epochs = round(steps * plan.sample_rate, 4)
    if opts.no_dp:
        dp = card.non_private_block(
            privacy_unit=opts.privacy_unit, steps=steps, epochs=epochs,
            sample_rate=plan.sample_rate, max_examples_per_unit=opts.max_examples_per_unit,
            num_units=card.coarsen_count(plan.num_units), weights_sha256=weights_sha256,
            **{k: v for k, v in common.items() if v is not None},
        )
    else:
        from dphub.privacy.randomness import MechanismRandomness

        dp = card.dp_block(
            accountant=opts.accountant, sample_rate=plan.sample_rate,
            noise_multiplier=float(plan.noise_multiplier), steps=steps,
            delta=float(plan.delta), privacy_unit=opts.privacy_unit,
            max_grad_norm=opts.max_grad_norm, epochs=epochs,
            max_examples_per_unit=opts.max_examples_per_unit, num_units=plan.num_units,
            grad_sample_mode="hooks", secure_rng=opts.secure_rng, epsilon=epsilon,
            mechanism_rng=MechanismRandomness.for_run(
                private=True, secure=opts.secure_rng, seed=0).mode,
            weights_sha256=weights_sha256, **common,
        )
    dataset = card.dataset_block(notes, label_schema=opts.label_schema, sequences=n_sequences)
    return card.card_meta(dp, dataset, base_model=src.base_public_id)


#: Top-level keys of the published ``training_config.json`` (hyper-parameters and the values
#: the card's accounting is recomputed from; nothing measured on the private data).
TRAINING_CONFIG_KEYS: tuple[str, ...] = (
    "format_version", "dphub_training", "base_model", "init_from", "no_dp", "privacy_unit",
    "accountant", "steps", "sample_rate", "noise_multiplier", "delta", "epsilon",
)


def training_config(opts: TrainOptions, src: _Source, plan: PrivacyPlan, steps: int,
                    epsilon: float | None) -> dict[str, Any]:
    """The published ``training_config.json``: hyper-parameters and the accounted quantities."""
    cfg = {
        "format_version": 2,
        "dphub_training": opts.public_dict(),
        "base_model": src.base_public_id,
        "init_from": _public_init_from(opts.init_from),
        "no_dp": bool(opts.no_dp),
        "privacy_unit": opts.privacy_unit,
        "accountant": None if opts.no_dp else opts.accountant,
        "steps": steps,
        "sample_rate": plan.sample_rate,
        "noise_multiplier": plan.noise_multiplier,
        "delta": plan.delta,
        "epsilon": epsilon,
    }
    assert tuple(cfg) == TRAINING_CONFIG_KEYS
    return cfg


def _write_output(
    out: Path,
    model: Any,
    src: _Source,
    opts: TrainOptions,
    plan: PrivacyPlan,
    steps: int,
    epsilon: float | None,
    make_meta: Callable[[str], dict[str, Any]],
) -> dict[str, Any]:
    """Build the model directory under a temp name and rename it into place.

    The card is made after the weights are written, so it records the SHA-256 of exactly the
    ``model.safetensors`` it describes (the publish gate checks the two belong together).
    """
    from dphub.card import write_card
    from dphub.hub.common import file_sha256

    try:
        with atomic_directory(out, overwrite=opts.force) as tmp:
            model.save(tmp, base_public_id=src.base_public_id, tokenizer_source=src.tokenizer_dir)
            cfg = training_config(opts, src, plan, steps, epsilon)
            atomic_write_text(tmp / TRAINING_CONFIG_FILE, json.dumps(cfg, indent=2) + "\n")
            meta = make_meta(file_sha256(tmp / "model.safetensors"))
            write_card(tmp, meta)
    except FileExistsError:
        raise ConfigError(f"{out}: output directory exists and is not empty (use --force)") from None
    return meta


def _public_init_from(spec: str | None) -> str | None:
    """A hub id (``org/name[@rev]``) is public; a local directory is recorded by name only."""
    if spec is None:
        return None
    p = Path(spec).expanduser()
    return p.name if p.exists() else spec
