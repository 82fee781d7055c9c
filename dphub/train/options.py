"""``dphub train``'s options: every knob, its default, and its validation.

Defaults are measured choices for ~100 patients on two CPU cores (see the class docstring); the
CLI fills :class:`TrainOptions` from flags, ``dphub.toml`` and these defaults.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError
from dphub.labels import get_schema
from dphub.privacy.accounting import ACCOUNTANTS
from dphub.privacy.policy import Policy

PRIVACY_UNITS = ("patient", "note", "sequence")


HEADS = ("crf", "softmax")


WARM_STARTS = ("synth", "none")


#: Where an owner model's training labels came from (the card's ``training_labels``).
TRAINING_LABELS = ("gold", "ensemble", "gold+ensemble")


#: Target ε used when neither ``--noise`` nor ``--target-epsilon`` is given.
DEFAULT_TARGET_EPSILON = 8.0
#: A pickled checkpoint of dphub < 0.2: never loaded (it could run code), only detected.


def check_encoder_layers(value: int | None) -> None:
    """``--encoder-layers``: None (all) or a positive integer (the upper bound is the base's
    depth, checked where the encoder is cut: :func:`dphub.tagger_model.truncate_encoder`)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"--encoder-layers must be >= 1, got {value!r}")


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
    * the rule member's flags are input features (``rule_features``, zero ε): DP only has to
      learn when to trust them, and their projection (``rule_proj``, 11 inputs per tag) steps
      ``rule_lr_scale`` = 30 times faster than the rest of the head: a few, well-determined weights
      that the 32 noisy steps of the recipe could otherwise barely move from the public warm
      start, which learned on synthetic notes to trust the rules less than real notes need;
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
    #: keep only the base model's first N transformer layers (None: all of them). A shallower
    #: encoder is proportionally faster at inference; with the default recipe 3 of MiniLM's 6
    #: kept the inner-split F1 and cost ~1.5 recall points on held-out patients (docs/speed.md,
    #: "A shallower encoder")
    encoder_layers: int | None = None
    recall_weight: float = 3.0
    #: give the tagger the zero-ε rule member's flags as input features (dphub.rule_features);
    #: default since it measured +10 F1 at ε 8 on the dev corpus's inner split (docs/results.md)
    rule_features: bool = True
    #: learning-rate multiplier of ``rule_proj`` (the rule features' projection); chosen on the
    #: dev corpus's inner split (docs/results.md, "Trusting the rules")
    rule_lr_scale: float = 30.0
    #: train on soft labels (the labels' span scores as the probability of each tag; local,
    #: non-private owner models only: ``dphub ensemble distill --soft-labels``)
    soft_labels: bool = False
    label_schema: str = "hipaa"
    max_epsilon: float | None = None
    seed: int = 0
    secure_rng: bool = False
    resume: bool = False
    init_from: str | None = None
    #: the trainer declares that the ``init_from`` model saw none of these patients: its ε is
    #: then not composed into the claim (checked against the privacy ledger where it knows the
    #: parent: :func:`dphub.train.lineage.settle_lineage`)
    disjoint_teacher: bool = False
    #: the ε policy the run must stay within (None: the default policy, ε ≤ 10 per patient);
    #: :func:`dphub.train.train` refuses before the first step a run whose projected claim
    #: exceeds it, unless ``allow_above_policy`` (issue 39 item 6)
    policy: Policy | None = None
    allow_above_policy: bool = False
    warm_start: str = "synth"
    no_dp: bool = False
    max_length: int = 128
    stride: int = 32
    checkpoint_every: int = 10
    checkpoint_dir: Path | None = None
    force: bool = False
    #: the trainer's own card texts (``[card]`` of dphub.toml: intended_use, out_of_scope,
    #: limitations, provenance); rendered in the card, never part of the training config
    card_text: dict[str, str] | None = None
    #: the model stays on the owner's machine (``dphub ensemble distill`` / ``ensemble train``
    #: without ``--dp``): its card says *local only* and the publish gate refuses it
    local_only: bool = False
    #: where the training labels came from (``gold``, ``ensemble`` or ``gold+ensemble``),
    #: recorded in the card; None for ``dphub train`` (gold labels, not stated)
    training_labels: str | None = None
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
            "--rule-lr-scale": self.rule_lr_scale,
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
        check_encoder_layers(self.encoder_layers)
        self.check_soft_labels()
        if self.local_only and not self.no_dp:
            raise ConfigError("a local-only model is trained without DP (a DP model is "
                              "publishable, not local only)")
        if self.disjoint_teacher and not self.init_from:
            raise ConfigError("--disjoint-teacher declares the --init-from model's patients "
                              "disjoint from these: give --init-from")
        if self.training_labels is not None:
            _choice("training labels", self.training_labels, TRAINING_LABELS)
        if self.recall_weight < 0:
            raise ConfigError(f"--recall-weight must be >= 0, got {self.recall_weight}")
        if not 8 <= self.max_length <= 512:
            raise ConfigError(f"max_length must be in [8, 512], got {self.max_length}")
        if not 0 <= self.stride < self.max_length - 2:
            raise ConfigError(f"stride must be in [0, max_length - 2), got {self.stride}")

        get_schema(self.label_schema)

    def check_soft_labels(self) -> None:
        """Soft labels train local models only (one message, before any work)."""
        if self.soft_labels and not self.no_dp:
            raise ConfigError("soft labels train local (non-DP) models only: the CRF's per-sample "
                              "gradients under DP are derived for hard labels; drop --dp or "
                              "--soft-labels")

    def public_dict(self) -> dict[str, Any]:
        """Hyper-parameters as recorded in ``training_config.json``: no paths, no user names."""
        hidden = {"data", "out", "checkpoint_dir", "resume", "force", "_stop_after", "base_model",
                  "init_from", "card_text", "local_only", "training_labels",
                  "disjoint_teacher", "policy", "allow_above_policy"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in hidden}


def _choice(flag: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{flag} must be one of {', '.join(allowed)}, got {value!r}")


def default_delta(num_units: int) -> float:
    """δ when none is given: ``min(1e-5, 1 / (10 N))`` rounded *down* to the 1-2-5 grid.

    δ bounds the probability that the ε guarantee fails for some unit; it must be much smaller
    than the chance of picking one unit at random (1/N). Why the grid: δ is published, and
    ``1 / (10 N)`` unrounded inverts to the exact N above 10,000 units (N is published only as
    a coarse range); on the grid it says no more than that range. Down, not to the nearest: a
    smaller δ keeps the guarantee's condition δ ≤ 1/(10 N).
    """
    return round_down_125(min(1e-5, 1.0 / (10 * max(num_units, 1))))


def round_down_125(x: float) -> float:
    """The largest ``m · 10^e`` (m in 1, 2, 5) not above ``x > 0``, as its shortest float."""
    import math

    e = math.floor(math.log10(x))
    for m in (5, 2, 1):
        v = float(f"{m}e{e}")
        if v <= x * (1 + 1e-12):  # x may sit a rounding error below its grid value
            return v
    return float(f"5e{e - 1}")
