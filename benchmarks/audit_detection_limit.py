"""The gradient-canary audit's detection limit, simulated (no training, no data; seconds).

Usage (from the repository root)::

    python benchmarks/audit_detection_limit.py                 # the default recipe (ε 8)
    python benchmarks/audit_detection_limit.py --target-epsilon 1 --seed 0

For ``dphub train``'s default recipe (q = 1, 32 steps, σ from the PRV accountant for the target
ε at δ 1e-5) and the default audit (30,000 canaries, 95 %), prints per guess rule: the number
of guesses, the ceiling, the median simulated bound at the recipe's noise and at noise × 0.25
(the issue's example), the detection limit (the largest noise factor that at least 95 % of 200
simulated audits flag, :func:`dphub.privacy.audit_bound.detection_limit`; beside it the old
statistic, the median's limit) and the mechanism's true ε at
that noise (same accountant). Rows with 60,000 canaries are two independent runs of 30,000
combined (one bound over both: each canary's bit touches one run). docs/privacy.md has the table.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from dphub.privacy.accounting import epsilon_for, noise_for_target_epsilon
from dphub.privacy.audit_bound import (
    DETECTION_POWER,
    DETECTION_REPETITIONS,
    choose_abstain,
    detection_limit,
    epsilon_lower_bound,
    gradient_correct,
)


def median_bound(m: int, steps: int, sigma: float, factor: float, abstain: float,
                 delta: float, confidence: float, rng: np.random.Generator, reps: int) -> float:
    """Median bound of ``reps`` simulated audits at q = 1 with noise × ``factor``."""
    counts = []
    for _ in range(reps):
        included = rng.random(m) < 0.5
        sums = steps * included + rng.standard_normal(m) * (math.sqrt(steps) * sigma * factor)
        r, v = gradient_correct(sums, included, 0.5 * steps, abstain)
        counts.append(v)
    return epsilon_lower_bound(m, r, int(np.median(counts)), delta, confidence)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target-epsilon", type=float, default=8.0)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=0, help="seed of the simulation (not the audit)")
    ap.add_argument("--reps", type=int, default=DETECTION_REPETITIONS)
    args = ap.parse_args(argv)
    q, steps, delta, conf = 1.0, args.steps, args.delta, args.confidence
    sigma = noise_for_target_epsilon("prv", args.target_epsilon, q, steps, delta)
    claim = epsilon_for("prv", q, sigma, steps, delta)
    print(f"recipe: q = 1, {steps} steps, σ = {sigma:.4f}, proven ε = {claim:.4f} at δ = {delta:g}"
          f"; audit at {conf:.0%}, {args.reps} simulated audits per figure (bounds: their median)")
    print(f"| canaries | abstain | guesses | ceiling | bound at recipe | bound at noise × 0.25 "
          f"| flags noise ≤ k × recipe in {DETECTION_POWER:.0%} of runs | true ε at k "
          f"| k of the median (old) |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows: list[tuple[int, float | None]] = [(30000, 0.0), (30000, 0.05), (30000, 0.1),
                                            (30000, 0.2), (30000, 0.5), (30000, 0.9),
                                            (30000, None), (60000, 0.0), (60000, 0.05),
                                            (10000, 0.05)]
    for m, given in rows:
        rng = np.random.default_rng(args.seed)
        settings = dict(sample_rate=q, steps=steps, noise_multiplier=sigma, delta=delta,
                        confidence=conf, claimed_epsilon=claim)
        if given is None:  # --abstain auto: the fraction chosen, then its own row
            abstain, lim = choose_abstain(m, rng=rng, **settings)
        else:
            abstain = given
            lim = detection_limit(m, abstain=abstain, repetitions=args.reps, rng=rng,
                                  **settings)
        old = detection_limit(m, abstain=abstain, repetitions=args.reps, power=0.5, rng=rng,
                              **settings)
        r = max(1, m - round(abstain * m))
        ceiling = epsilon_lower_bound(m, r, r, delta, conf)
        at1 = median_bound(m, steps, sigma, 1.0, abstain, delta, conf, rng, args.reps)
        at25 = median_bound(m, steps, sigma, 0.25, abstain, delta, conf, rng, args.reps)
        k = lim.noise_factor
        true = epsilon_for("prv", q, sigma * k, steps, delta) if k > 0 else math.inf
        label = f"{abstain:.0%}" + (" (auto)" if given is None else "")
        print(f"| {m:,} | {label} | {r:,} | {ceiling:.2f} | {at1:.2f} | {at25:.2f} "
              f"| {k:.3f} | {true:.0f} | {old.noise_factor:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
