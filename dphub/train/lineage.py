"""A run's place in the privacy ledger: the ``--init-from`` declaration checked against the
ledger's records before the first step, the claim the card will make, and the release recorded
once the model directory is written (:mod:`dphub.privacy.ledger`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dphub.card import composed_lineage
from dphub.errors import ConfigError, PrivacyError
from dphub.notes import Note
from dphub.privacy import ledger as L
from dphub.privacy.composition import Composed, GaussianSteps, Part, compose, lineage_part
from dphub.privacy.policy import DEFAULT_POLICY, Policy
from dphub.train.options import TrainOptions
from dphub.train.plan import PrivacyPlan, projected_epsilon, ways_to_reach
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


_UNIT_PLURAL = {"patient": "patients", "note": "notes", "sequence": "sequences"}


def above_policy(opts: TrainOptions, plan: PrivacyPlan, policy: Policy, *,
                 teachers: Sequence[Mapping[str, Any]] = (), where: str = "the default policy",
                 batch_flag: str = "--batch-size") -> PrivacyError | None:
    """The refusal of a run whose projected claim exceeds ``policy`` (None: within it, or no DP).

    The claim is this run composed with its lineage (``plan.lineage``) and ``teachers`` (a DP
    student's): what the card will say. The message says how to get within the policy (more
    noise, fewer epochs, a smaller batch when q = 1, fewer composed releases) and how to train
    anyway. One function: :func:`dphub.train.train` and the CLI's plan check both call it.
    """
    run_eps = projected_epsilon(opts, plan)
    if run_eps is None:
        return None
    entries = [*plan.lineage, *({**t, "role": "teacher"} for t in teachers)]
    composed = [t for t in entries if t.get("composed")]
    eps = projected_claim(run_eps, plan, opts, entries).epsilon
    if eps <= policy.max_epsilon:
        return None
    units = _UNIT_PLURAL.get(opts.privacy_unit, "units")
    # what the run itself may spend (basic composition: following the advice stays within)
    left = policy.max_epsilon - sum(float(t["epsilon"]) for t in composed)
    sigma, epochs = ways_to_reach(opts, plan, left) if left > 0 else (None, None)
    ways = []
    if sigma is not None:
        ways.append(f"more noise (--noise {sigma:g} or more, or --target-epsilon {left:g})")
    if epochs is not None:
        ways.append(f"fewer epochs (--epochs {epochs:.6g} or fewer, or --max-epsilon "
                    f"{policy.max_epsilon:g} to stop in time)")
    if plan.sample_rate >= 1.0:
        ways.append(f"a {batch_flag} well below the {plan.num_units} {units} (q = 1 now)")
    teach = any(t.get("role") == "teacher" for t in composed)
    parent = any(t.get("role") != "teacher" for t in composed)
    if teach:
        ways.append("fewer composed teachers (remove a member, or declare one trained on "
                    "none of these patients with --disjoint-teacher NAME)")
    if parent:
        ways.append("another --init-from model, or --disjoint-teacher if it was trained on "
                    "none of these patients")
    what = "composed teachers" if not parent else "the composed --init-from model" + (
        " and teachers" if teach else "")
    parts = f" (this run {run_eps:.4g} + {what} {eps - run_eps:.4g})" if composed else ""
    return PrivacyError(
        f"projected ε = {eps:.4g}{parts} exceeds the maximum {policy.max_epsilon:g} of "
        f"{where} ({policy.describe()}); nothing was trained. To reach it, train with "
        f"{' or '.join(ways) if ways else 'more noise'}; or pass --allow-above-policy to train "
        "anyway (`dphub publish` to that hub will refuse the model)"
    )


def check_policy(opts: TrainOptions, plan: PrivacyPlan) -> None:
    """Refuse, before the first step, a run above ``opts.policy`` (default: ε ≤ 10 per patient)
    unless ``opts.allow_above_policy``: what a library caller of ``train()`` gets by itself."""
    if opts.allow_above_policy:
        return
    err = above_policy(opts, plan, opts.policy or DEFAULT_POLICY,
                       where="the default policy" if opts.policy is None else "the policy")
    if err is not None:
        raise err


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
