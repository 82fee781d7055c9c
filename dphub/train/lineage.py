"""A run's place in the privacy ledger: the ``--init-from`` declaration checked against the
ledger's records before the first step, the claim the card will make, and the release recorded
once the model directory is written (:mod:`dphub.privacy.ledger`)."""

from __future__ import annotations

import math
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


def settle_lineage(opts: TrainOptions, src: ModelSource, fp: L.Footprint) -> None:
    """Check the ``--init-from`` parent against the ledger (nothing without DP).

    The parent is found by the SHA-256 of its weights (hashed, not read from its card). When
    the ledger recorded it, its card may not claim less than the record. A ``--disjoint-teacher``
    declaration is refused when the parent (or a recorded ancestor) used any of this run's
    patients or notes: its ε must compose, whatever the trainer declares. A parent the ledger
    does not know (trained elsewhere) is taken as declared. Nothing is said about which or how
    many patients are shared.
    """
    if opts.no_dp:
        return
    ledger = L.load_ledger()
    parent = src.parent_weights_sha256
    rec = ledger.find(parent)
    if rec is not None and src.lineage:
        claimed = float(src.lineage[0].get("epsilon") or 0.0)
        if claimed < rec.epsilon * (1 - 1e-9):
            raise PrivacyError(
                f"--init-from: the model's card claims ε = {claimed:.4g} but the privacy ledger "
                f"recorded ε = {rec.epsilon:.4g} for these weights when they were trained here; "
                "its card was edited: use the model as it was written")
    if opts.disjoint_teacher and parent is not None:
        anc = L.ancestry_footprint(ledger, [parent])
        if L.links(anc, fp):
            raise ConfigError(
                "--disjoint-teacher: the privacy ledger records that the --init-from model (or "
                "one it descends from) was trained on some of these patients or notes, so its "
                "epsilon composes with this run's; drop --disjoint-teacher"
            )


def refuse_false_disjoint(teachers: Sequence[Mapping[str, Any]], notes: Sequence[Note]) -> None:
    """Refuse a teacher declared disjoint (``composed: false``) that the ledger records was
    trained on some of these patients or notes (what :func:`settle_lineage` does for an
    ``--init-from`` parent). A teacher found by its weights digest (``revision``, a directory
    member's pin); one the ledger does not know is taken as declared."""
    declared = [t for t in teachers if not t.get("composed")]
    if not declared or not notes:
        return
    ledger = L.load_ledger()
    known = [t for t in declared if ledger.find(str(t.get("revision"))) is not None]
    if not known:
        return
    fp = L.footprint(notes)
    for t in known:
        anc = L.ancestry_footprint(ledger, [str(t["revision"])])
        if L.links(anc, fp):
            raise ConfigError(
                f"--disjoint-teacher {t.get('repo')}: the privacy ledger records that this member "
                "(or one it descends from) was trained on some of these patients or notes, so "
                "its epsilon composes with this run's; drop the declaration")


def _patient_part(part: Part, unit: str, fp: L.Footprint | None) -> Part | None:
    """``part`` (this run's) per patient: as is at patient level, by group privacy over the
    notes of the busiest patient at note level, none at sequence level (see
    :meth:`dphub.privacy.ledger.Release.patient_part`)."""
    group = fp.group_size(unit) if fp is not None else (1 if unit == L.PATIENT_UNIT else None)
    probe = L.Release("", "train", part.epsilon, part.delta, unit, frozenset(), part.history,
                      group_size=group)
    return probe.patient_part()


def prior_spend(plan: PrivacyPlan, entries: Sequence[Mapping[str, Any]]) -> L.Spend | None:
    """What the ledger records on the run's patients and notes (``plan.footprint``) beyond what
    its claim composes (the composed entries of its lineage and teachers, by weights digest);
    None without a footprint (no DP)."""
    fp: L.Footprint | None = plan.footprint
    if fp is None or not (fp.patients or fp.notes):
        return None
    # a teacher entry names its weights by ``revision`` (the digest of a local member)
    inside = [str(e[k]) for e in entries if e.get("composed")
              for k in ("weights_sha256", "revision") if isinstance(e.get(k), str)]
    return L.load_ledger().spend(fp, exclude=inside)


def ledger_total(run_epsilon: float, plan: PrivacyPlan, opts: TrainOptions,
                 entries: Sequence[Mapping[str, Any]], prior: L.Spend) -> Composed | None:
    """What this run's patients will have lost once it is released: the run composed with its
    composed lineage and ``prior``, every earlier release the ledger links to its patients or
    notes. None when no patient-level bound holds (a release, or this run, at a finer unit whose
    group size is unknown)."""
    claim = projected_claim(run_epsilon, plan, opts, entries)
    run = Part(run_epsilon, float(plan.delta or 0.0), run_steps(opts, plan))
    lineage = [lineage_part(e) for e in composed_lineage({"lineage": list(entries)})]
    own = ([run, *lineage] if opts.privacy_unit == L.PATIENT_UNIT
           else [_patient_part(Part(claim.epsilon, claim.delta), opts.privacy_unit,
                               plan.footprint)])
    if prior.unbounded or any(p is None for p in own):
        return None
    return compose([*(p for p in own if p is not None), *prior.parts])


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
    claims = math.fsum(float(t["epsilon"]) for t in composed)
    parts = (f" (this run {run_eps:.4g} composed with {what} claiming ε {claims:.4g})"
             if composed else "")
    return PrivacyError(
        f"projected ε = {eps:.4g}{parts} exceeds the maximum {policy.max_epsilon:g} of "
        f"{where} ({policy.describe()}); nothing was trained. To reach it, train with "
        f"{' or '.join(ways) if ways else 'more noise'}; or pass --allow-above-policy to train "
        "anyway (`dphub publish` to that hub will refuse the model)"
    )


def above_ledger(opts: TrainOptions, plan: PrivacyPlan, policy: Policy, *,
                 teachers: Sequence[Mapping[str, Any]] = (),
                 where: str = "the default policy") -> PrivacyError | None:
    """The refusal of a run that takes its patients' ledger total above ``policy`` (None: no
    earlier release on them, or within it, or no DP).

    Why: the card claims this run and what it composes (its lineage); independent releases on
    the same patients (another ``dphub train`` on the same or renamed notes) are on no card, and
    the policy is a bound on what a patient loses, so the check adds what the ledger records.
    A linked release with no patient-level bound (a note or sequence unit whose group size is
    unknown) leaves no figure to check: refused too.
    """
    run_eps = projected_epsilon(opts, plan)
    entries = [*plan.lineage, *({**t, "role": "teacher"} for t in teachers)]
    prior = prior_spend(plan, entries) if run_eps is not None else None
    if run_eps is None or prior is None or not (prior.parts or prior.unbounded):
        return None
    total = ledger_total(run_eps, plan, opts, entries, prior)
    anyway = ("; nothing was trained. `dphub ledger show DATA` lists them; train on other "
              "patients, or pass --allow-above-policy to train anyway")
    n = prior.releases - len(prior.metric)
    if total is None:
        fine = sorted({r.privacy_unit for r in prior.unbounded} or {opts.privacy_unit})
        return PrivacyError(
            f"no patient-level ε holds for these patients: the privacy ledger links {n} earlier "
            f"release(s) to them, and a {'/'.join(fine)}-level release (group size unknown, or "
            f"too large for group privacy) bounds no patient's loss, so {where} "
            f"({policy.describe()}) cannot be met{anyway}")
    if total.epsilon <= policy.max_epsilon:
        return None
    return PrivacyError(
        f"projected ε = {total.epsilon:.4g} for these patients (this run composed with {n} "
        f"earlier release(s) on their patients or notes that the privacy ledger records, "
        f"{total.method} composition) exceeds the maximum {policy.max_epsilon:g} of {where} "
        f"({policy.describe()}){anyway}")


def check_policy(opts: TrainOptions, plan: PrivacyPlan) -> None:
    """Refuse, before the first step, a run above ``opts.policy`` (default: ε ≤ 10 per patient)
    unless ``opts.allow_above_policy``: what a library caller of ``train()`` gets by itself.
    Both the card's claim and the patients' ledger total (:func:`above_ledger`) are checked."""
    if opts.allow_above_policy:
        return
    policy = opts.policy or DEFAULT_POLICY
    where = "the default policy" if opts.policy is None else "the policy"
    err = above_policy(opts, plan, policy, where=where) or above_ledger(opts, plan, policy,
                                                                        where=where)
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
               patients: L.Footprint | None = None) -> None:
    """Record a DP run's release in the ledger: its weights, claim, history, parent, patients
    and notes (keyed digests), and its group size."""
    dp = meta["differential_privacy"]
    if not dp.get("private"):
        return
    if not notes and patients is None:
        raise ConfigError("internal: a release without patients cannot be recorded")
    fp = L.footprint(notes) if patients is None else patients
    unit = str(dp["privacy_unit"])
    L.record_release(L.Release(
        release=str(dp["weights_sha256"]),
        kind=kind or ("init_from" if opts.init_from else "train"),
        epsilon=float(dp["epsilon"]), delta=float(dp["delta"]),
        privacy_unit=unit,
        patients=fp.patients,
        history=run_steps(opts, plan) if dp.get("composition") is None else (),
        parents=(src.parent_weights_sha256,) if src.parent_weights_sha256 else (),
        notes=fp.notes,
        sketches=fp.sketches,
        group_size=fp.group_size(unit),
        composes_parents=not opts.disjoint_teacher,
    ))
