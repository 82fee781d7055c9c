"""The federated guarantee, recomputed from what a card records (no Flower needed to check it).

A federated model (``dphub federate``) is trained by several sites, each running dphub's own
DP-SGD on *its own* patients with one accountant over all its local steps in all rounds. Sites
hold disjoint patients, so by parallel composition the model protects every patient with the
ε of the site that holds them: the claim is the maximum over the sites (the server's averaging
is post-processing). The card's ``differential_privacy.federation`` block records every site's
accounting (accountant, q, σ, T, δ, ε: the same fields a single-site card records, without
naming the site); :func:`federation_problems` recomputes each site's ε from them, as
:func:`dphub.card.accounting_problems` does for one run, and checks that the card's claim covers
the worst site.

The card's top-level accounting fields are those of the worst site, so every existing check
(gate, ``card validate``, the training config) recomputes the claim itself unchanged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from dphub.errors import DphubError
from dphub.privacy import accounting

#: ``federation.composition``: sites hold disjoint patients, so the claim is the max over sites.
PARALLEL_COMPOSITION = "parallel"

#: What the federated claim does not cover (added to the card's ``not_covered``).
FEDERATION_NOT_COVERED = (
    "a patient treated at two sites: their epsilons add (basic composition), the card's "
    "claim assumes each patient is at one site only",
    "a site that lies (poisoned updates, misreported accounting): it can damage the model; "
    "it cannot learn another site's patients beyond the guarantee",
    "which sites took part and when (sites are not named; the per-site accounting rows show "
    "how many there were)",
)


def site_epsilon(site: Mapping[str, Any]) -> float:
    """A site's ε recomputed from its recorded (accountant, q, σ, T, δ)."""
    return accounting.epsilon_for(str(site["accountant"]), float(site["sample_rate"]),
                                  float(site["noise_multiplier"]), int(site["steps"]),
                                  float(site["delta"]))


#: federated cards of this dphub release and later state the server's defences (issue 53);
#: older cards, which could not, stay valid without them
ROBUSTNESS_SINCE = (0, 2, 0)


def _dphub_release(dp: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The dphub version that wrote the card (``library_versions.dphub``), as numbers."""
    versions = dp.get("library_versions")
    text = versions.get("dphub") if isinstance(versions, Mapping) else None
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text) if isinstance(text, str) else None
    return tuple(int(x or 0) for x in m.groups()) if m else None


def robustness_problems(dp: Mapping[str, Any]) -> list[str]:
    """The federation block's ``robustness`` (the server's defences and its drops per round):
    required from :data:`ROBUSTNESS_SINCE` on, and consistent with the block when present."""
    fed = dp.get("federation")
    if not isinstance(fed, Mapping):
        return []
    where = "differential_privacy.federation.robustness"
    rob = fed.get("robustness")
    if rob is None:
        release = _dphub_release(dp)
        if release is not None and release >= ROBUSTNESS_SINCE:
            return [f"{where}: required field is missing (a federated card of dphub "
                    f"{'.'.join(map(str, ROBUSTNESS_SINCE))} or later states the server's "
                    "defences)"]
        return []
    problems: list[str] = []
    if len(rob["dropped_per_round"]) != int(fed["rounds"]):
        problems.append(f"{where}.dropped_per_round: {len(rob['dropped_per_round'])} rounds "
                        f"recorded, the federation ran {int(fed['rounds'])}")
    if (fed["aggregation"] == "trimmed-mean") != ("trim" in rob):
        problems.append(f"{where}.trim: stated if and only if the aggregation is trimmed-mean")
    return problems


def federation_problems(dp: Mapping[str, Any]) -> list[str]:
    """Everything wrong with a card's ``federation`` block (none when it has none).

    * every site's recorded ε may lie at most ``accounting.CLAIM_RTOL`` below its recomputation;
    * every site's steps are at most ``rounds × local_steps`` (one accountant per site over all
      rounds: a site cannot have taken more local steps than the federation ran);
    * the card's ε covers the worst site's recomputed ε, and its δ the largest site δ
      (parallel composition over disjoint patients);
    * the recorded ε range is the range of the sites' ε.
    """
    fed = dp.get("federation")
    if fed is None:
        return []
    if not dp.get("private"):
        return ["differential_privacy.federation: recorded on a non-private card"]
    sites = fed.get("site_accounting") or []
    if not sites:
        return ["differential_privacy.federation.site_accounting: no site recorded"]
    problems: list[str] = robustness_problems(dp)
    if fed.get("composition") != PARALLEL_COMPOSITION:
        problems.append("differential_privacy.federation.composition: must be "
                        f"{PARALLEL_COMPOSITION!r} (disjoint patients per site)")
    max_steps = int(fed["rounds"]) * int(fed["local_steps"])
    recomputed: list[float] = []
    for i, site in enumerate(sites):
        where = f"differential_privacy.federation.site_accounting.{i}"
        try:
            eps = site_epsilon(site)
        except DphubError as e:
            problems.append(f"{where}: accounting fields are inconsistent ({e})")
            continue
        recomputed.append(eps)
        if accounting.below(float(site["epsilon"]), eps, accounting.CLAIM_RTOL):
            problems.append(f"{where}.epsilon: records {float(site['epsilon']):.6g} but its "
                            f"accounting gives {eps:.6g}")
        if int(site["steps"]) > max_steps:
            problems.append(f"{where}.steps: {site['steps']} exceeds rounds x local_steps = "
                            f"{max_steps}")
        if str(site.get("privacy_unit", dp.get("privacy_unit"))) != dp.get("privacy_unit"):
            problems.append(f"{where}.privacy_unit: differs from the card's")
        policy = site.get("policy")
        if isinstance(policy, Mapping):
            # the site's own policy refuses a δ above its cap (min(1e-5, 1/(10 N)) when it
            # sets none) and an ε above its maximum: a row beyond its policy is not the site's
            cap = float(policy["delta"]) if policy.get("delta") is not None else 1e-5
            if float(site["delta"]) > cap * (1 + 1e-9):
                problems.append(f"{where}.delta: {float(site['delta']):.3g} is above the "
                                f"site's own policy ({cap:.3g})")
            if accounting.below(float(policy["max_epsilon"]), float(site["epsilon"]),
                                accounting.CLAIM_RTOL):
                problems.append(f"{where}.epsilon: above the site's own policy "
                                f"({float(policy['max_epsilon']):g})")
    if not recomputed:
        return problems
    worst = max(recomputed)
    claimed = float(dp["epsilon"])
    if not math.isfinite(worst) or accounting.below(claimed, worst, accounting.CLAIM_RTOL):
        problems.append(f"differential_privacy.epsilon: claims {claimed:.6g} but the worst "
                        f"site's accounting gives {worst:.6g} (parallel composition: the max)")
    need_delta = max(float(s["delta"]) for s in sites)
    if float(dp["delta"]) < need_delta * (1 - 1e-9):
        problems.append(f"differential_privacy.delta: claims {float(dp['delta']):.6g} but a "
                        f"site's delta is {need_delta:.6g}")
    lo, hi = (float(x) for x in fed["epsilon_range"])
    if not (accounting.agree(lo, min(recomputed), 1e-3, 1e-9)
            and accounting.agree(hi, worst, 1e-3, 1e-9)):
        problems.append(f"differential_privacy.federation.epsilon_range: records [{lo:.6g}, "
                        f"{hi:.6g}] but the sites' accounting gives [{min(recomputed):.6g}, "
                        f"{worst:.6g}]")
    return problems
