"""A run's place in the privacy ledger: the ``--init-from`` declaration checked against the
ledger's records before the first step, the claim the card will make, and the release recorded
once the model directory is written (:mod:`dphub.privacy.ledger`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dphub.card import composed_lineage
from dphub.errors import ConfigError
from dphub.notes import Note
from dphub.privacy import ledger as L
from dphub.privacy.composition import Composed, GaussianSteps, Part, compose, lineage_part
from dphub.train.options import TrainOptions
from dphub.train.plan import PrivacyPlan
from dphub.train.sources import ModelSource


def settle_lineage(opts: TrainOptions, src: ModelSource, patients: frozenset[str]) -> None:
    """Refuse a ``--disjoint-teacher`` declaration that the ledger contradicts.

    The ledger knows the patients of every release made here; when the ``--init-from`` model
    (or a recorded ancestor) used any of this run's patients, its ε must compose, whatever the
    trainer declares. A parent the ledger does not know (trained elsewhere) is taken as
    declared. Nothing is said about which or how many patients are shared.
    """
    if not opts.disjoint_teacher or src.parent_weights_sha256 is None:
        return
    ledger = L.load_ledger()
    if L.ancestry(ledger, [src.parent_weights_sha256]) & patients:
        raise ConfigError(
            "--disjoint-teacher: the privacy ledger records that the --init-from model (or one "
            "it descends from) was trained on some of these patients, so its epsilon composes "
            "with this run's; drop --disjoint-teacher"
        )


def projected_claim(run_epsilon: float, plan: PrivacyPlan, opts: TrainOptions,
                    lineage: Sequence[Mapping[str, Any]]) -> Composed:
    """What the card will claim: this run's projected ε composed with the composed entries of
    ``lineage`` (the same function the card and ``card validate`` use)."""
    run = Part(run_epsilon, float(plan.delta or 0.0), run_steps(opts, plan))
    parts = [lineage_part(e) for e in composed_lineage({"lineage": list(lineage)})]
    return compose([run, *parts])


def run_steps(opts: TrainOptions, plan: PrivacyPlan) -> tuple[GaussianSteps, ...]:
    """This run's Gaussian history (empty without DP)."""
    if plan.noise_multiplier is None:
        return ()
    return (GaussianSteps(opts.accountant, plan.sample_rate, plan.noise_multiplier,
                          plan.steps),)


def record_run(opts: TrainOptions, src: ModelSource, plan: PrivacyPlan,
               notes: Sequence[Note], meta: Mapping[str, Any], *, kind: str | None = None,
               patients: frozenset[str] | None = None) -> None:
    """Record a DP run's release in the ledger: its weights, claim, history, parent, patients."""
    dp = meta["differential_privacy"]
    if not dp.get("private"):
        return
    if not notes and patients is None:
        raise ConfigError("internal: a release without patients cannot be recorded")
    L.record_release(L.Release(
        release=str(dp["weights_sha256"]),
        kind=kind or ("init_from" if opts.init_from else "train"),
        epsilon=float(dp["epsilon"]), delta=float(dp["delta"]),
        privacy_unit=str(dp["privacy_unit"]),
        patients=L.patient_digests(notes) if patients is None else patients,
        history=run_steps(opts, plan) if dp.get("composition") is None else (),
        parents=(src.parent_weights_sha256,) if src.parent_weights_sha256 else (),
    ))
