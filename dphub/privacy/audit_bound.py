"""The one-run ε lower bound of an empirical privacy audit (Steinke, Nasr & Jagielski 2023).

Pure statistics and the card's ``empirical_audit`` vocabulary: the bound, its ceiling and the
verdict they give. It sits in the privacy layer, below the card, so that the card can check an
audit block's verdict against its own numbers without importing the audit's runner
(:mod:`dphub.audit`, which trains and scores canaries and re-exports these names).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dphub.errors import ConfigError

#: ``empirical_audit.method`` in the card.
METHOD = "one-run-steinke-nasr-jagielski-2023"
#: ``empirical_audit.signal`` in the card (black-box canary patients).
SIGNAL = "secret-loss-ratio-vs-alternatives"
#: ``empirical_audit.signal`` of the white-box gradient-canary audit.
GRADIENT_SIGNAL = "noisy-gradient-sum-on-dirac-canary"
#: ``empirical_audit.setting`` per audit method (``--method``).
SETTINGS = {"gradient": "white-box-gradient-canaries", "patients": "black-box-canary-patients"}
#: Gradient canaries: the counts :func:`gradient_canary_count` picks from (largest ceiling wins).
GRADIENT_COUNTS: tuple[int, ...] = (1_000, 2_000, 5_000, 10_000, 20_000, 30_000, 50_000,
                                    100_000, 200_000, 300_000, 500_000, 1_000_000)
#: At most this many gradient canaries (one float each per step: memory and noise draws).
MAX_GRADIENT_CANARIES = 10_000_000
#: A non-private audit must reach at least this bound for the attack to count as working.
ATTACK_MIN_EPSILON = 0.5
#: Fractions of the canaries the auditor guesses on (half "in", half "out"); Bonferroni-corrected.
GUESS_FRACTIONS: tuple[float, ...] = (0.25, 0.5, 1.0)
#: Verdicts of an audit; a ``failed`` one is never written into a card (see :class:`AuditFailed`).
VERDICTS = ("passed", "failed", "inconclusive", "not-private")


# --------------------------------------------------------------------------------------------
# the one-run bound
# --------------------------------------------------------------------------------------------


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[at least ``v`` of ``r`` guesses correct] for an (ε, δ)-DP mechanism (Theorem 5.2).

    ``m`` canaries, each included with probability ½; the auditor makes ``r`` guesses (abstains
    on ``m - r``). With ``q = e^ε / (1 + e^ε)`` (the accuracy of ε-randomized response) the
    tail is ``P[Binomial(r, q) >= v] + 2 m δ · max_{1<=i<=v} P[v - i <= Binomial(r, q) < v] / i``.
    """
    if not 0 <= v <= r <= m:
        raise ConfigError(f"audit counts must satisfy 0 <= v <= r <= m (got v={v}, r={r}, m={m})")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ConfigError("audit needs epsilon >= 0 and 0 <= delta <= 1")
    import numpy as np
    from scipy.special import expit
    from scipy.stats import binom

    q = float(expit(epsilon))
    tail = float(binom.sf(v - 1, r, q))  # P[Binomial(r, q) >= v]
    if delta > 0 and v > 0:
        below = binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[B = v-1], P[B = v-2], ..., P[B = 0]
        alpha = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
        tail += 2.0 * m * delta * alpha
    return min(tail, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float) -> float:
    """The largest ε that ``v`` correct out of ``r`` guesses rejects at ``confidence``.

    ``p_value`` grows with ε, so this is a bisection for ``p_value(ε) = 1 - confidence``;
    0 when even ε = 0 is not rejected.
    """
    if not 0 < confidence < 1:
        raise ConfigError(f"audit confidence must be in (0, 1), got {confidence}")
    beta = 1.0 - confidence
    if p_value(m, r, v, 0.0, delta) > beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) <= beta:
        lo, hi = hi, hi * 2
        if hi > 1e3:  # pragma: no cover - only with absurd m
            return lo
    for _ in range(60):
        mid = (lo + hi) / 2
        if p_value(m, r, v, mid, delta) <= beta:
            lo = mid
        else:
            hi = mid
    return lo


def max_possible_bound(m: int, delta: float, confidence: float,
                       fractions: Sequence[float] = GUESS_FRACTIONS) -> float:
    """The largest bound an audit with ``m`` canaries can report (every guess right).

    One run with few canaries cannot show a large ε: with 64 canaries at 95 % the ceiling is
    about 2.7, so such an audit can never fail a claim of ε = 8, however broken the mechanism.
    """
    each = 1.0 - (1.0 - confidence) / len(fractions)
    return epsilon_lower_bound(m, m, m, delta, each)


@dataclass
class Bound:
    """The best of the Bonferroni-corrected guess counts: ε lower bound from ``v`` of ``r``."""

    epsilon: float
    guesses: int
    correct: int
    confidence: float


def one_run_bound(scores: Sequence[float], included: Sequence[bool], delta: float,
                  confidence: float, fractions: Sequence[float] = GUESS_FRACTIONS) -> Bound:
    """Guess "in" for the highest scores and "out" for the lowest; return the best bound.

    For each fraction ``f`` the auditor guesses on ``round(f m)`` canaries (half the highest
    scores "in", the rest the lowest scores "out") and computes the bound at confidence
    ``1 - (1 - confidence) / len(fractions)``: the union bound makes the best of them valid at
    ``confidence``. Guesses depend on the scores only, never on the inclusion bits.
    """
    m = len(scores)
    if m != len(included) or m == 0:
        raise ConfigError("audit needs one inclusion bit per canary score, and canaries")
    order = sorted(range(m), key=lambda i: scores[i], reverse=True)
    each = 1.0 - (1.0 - confidence) / len(fractions)
    best = Bound(0.0, 0, 0, confidence)
    for f in fractions:
        r = max(1, min(m, round(f * m)))
        k_in = (r + 1) // 2
        guess_in, guess_out = order[:k_in], order[m - (r - k_in):] if r > k_in else []
        v = sum(bool(included[i]) for i in guess_in) + sum(not included[i] for i in guess_out)
        eps = epsilon_lower_bound(m, r, v, delta, each)
        if eps > best.epsilon or best.guesses == 0:
            best = Bound(eps, r, v, confidence)
    return best


def judge(bound: float, ceiling: float, proven_epsilon: float | None) -> str:
    """The verdict of an audit from its bound, its ceiling and the proven ε (None: no DP).

    ``inconclusive`` whenever the ceiling is below the proven ε: no outcome of that audit could
    have exceeded the claim, so "passed" would say nothing. Rounded as the card records them
    (4 decimals), so the card's numbers give the same verdict (:func:`check_audit_block`).
    """
    if proven_epsilon is None:
        return "not-private"
    bound, ceiling, proven = (round(float(x), 4) for x in (bound, ceiling, proven_epsilon))
    if bound > proven:
        return "failed"
    if ceiling < proven:
        return "inconclusive"
    return "passed"


def verdict_reason(verdict: str, *, bound: float, ceiling: float, proven: float | None,
                   count: int, confidence: float) -> str:
    """One sentence of numbers saying why the verdict is what it is (card, CLI and JSON)."""
    if verdict == "not-private":
        return (f"no DP claim to check; the attack reached ε ≥ {bound:.4g} of a possible "
                f"{ceiling:.4g}")
    if verdict == "failed":
        return (f"the lower bound ε ≥ {bound:.4g} exceeds the proven ε = {proven:.4g}: the "
                "mechanism does not deliver its claimed guarantee")
    if verdict == "inconclusive":
        return (f"with {count} canaries at {confidence:.0%} confidence no outcome of this audit "
                f"can show more than ε ≥ {ceiling:.4g}, below the proven ε = {proven:.4g}: it "
                "could not have failed, so it checks nothing about this claim")
    return (f"the lower bound ε ≥ {bound:.4g} does not exceed the proven ε = {proven:.4g}, and "
            f"this audit could have shown up to ε ≥ {ceiling:.4g}")


@functools.lru_cache(maxsize=64)
def gradient_canary_count(delta: float, confidence: float) -> int:
    """The number of gradient canaries whose ceiling is largest at ``delta`` and ``confidence``.

    The ceiling (every guess right) grows like ``ln(m)`` until the ``2 m δ`` term of the bound
    (Theorem 5.2) takes over: at δ = 1e-5 and 95 % it peaks near 30,000 canaries at ≈ 8.24 and
    falls beyond (8.20 at 20,000, 8.13 at 100,000). Canaries are one float each per step.
    """
    best, best_m, falls = -1.0, GRADIENT_COUNTS[0], 0
    for m in GRADIENT_COUNTS:
        c = epsilon_lower_bound(m, m, m, delta, confidence)
        if c > best:
            best, best_m, falls = c, m, 0
        else:
            falls += 1
            if falls == 2:
                break
    return best_m


# --------------------------------------------------------------------------------------------
# gradient canaries: abstention and the detection limit
# --------------------------------------------------------------------------------------------

#: Gradient canaries: the fraction of canaries the auditor abstains on, those whose released
#: sums lie closest to the guess threshold (the least confident), when ``--abstain`` is a number.
#: Theorem 5.2 of Steinke, Nasr & Jagielski (2023) bounds any guesses that depend on the released
#: output only, abstentions included, with ``r`` (the number of guesses) in place of ``m`` in the
#: binomial. 5 % raises the detection limit at the default recipe from noise × 0.22 to × 0.30 for
#: a ceiling of 8.19 instead of 8.24; ``auto`` picks 20 % there (× 0.34, docs/privacy.md).
GRADIENT_ABSTAIN = 0.05
#: The fractions ``--abstain auto`` (the default) chooses from: the one with the largest simulated
#: detection limit at the run's public settings (:func:`choose_abstain`).
ABSTAIN_CHOICES: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9)
#: Simulated audits per noise factor in :func:`detection_limit`.
DETECTION_REPETITIONS = 200
#: The share of simulated audits that must flag a noise factor for it to count as detected:
#: "would flag noise <= k" means "flags it in at least 95 % of runs", the power a reader expects
#: of a test (a median, the old statistic, flags its limit only about half the time).
DETECTION_POWER = 0.95
#: What no gradient-canary audit tests (the report says so beside its detection limit).
OUTSIDE_GRADIENT_AUDIT: tuple[str, ...] = (
    "the sampling of real units (the canaries are Poisson-sampled by the audit itself, "
    "not by the run's sampler)",
    "the clipping and per-patient aggregation of real gradients (the canaries arrive clipped)",
    "composition across releases: federated rounds, --init-from and distill are each audited "
    "alone, if at all",
)


def guess_count(m: int, abstain: float) -> int:
    """How many of ``m`` gradient canaries are guessed when ``abstain`` of them are not."""
    if not 0 <= abstain < 1:
        raise ConfigError(f"--abstain must be in [0, 1), got {abstain}")
    return max(1, m - round(abstain * m))


def gradient_correct(sums: Any, included: Any, threshold: float, abstain: float
                     ) -> tuple[int, int]:
    """``(r, v)``: guesses made and guesses right, "in" above ``threshold``.

    The auditor abstains on the ``m - r`` canaries whose sums are closest to the threshold: a
    function of the released sums only, as Theorem 5.2 requires.
    """
    import numpy as np

    sums, included = np.asarray(sums, dtype=np.float64), np.asarray(included, dtype=bool)
    m = sums.size
    r = guess_count(m, abstain)
    if r < m:
        keep = np.argpartition(-np.abs(sums - threshold), r - 1)[:r]
        sums, included = sums[keep], included[keep]
    return r, int(np.sum((sums > threshold) == included))


@dataclass
class DetectionLimit:
    """The largest noise factor the audit flags with probability ``power`` (simulated runs).

    ``noise_factor`` 0 means that even a noise-free mechanism would not be flagged that often
    (e.g. the ceiling is below the claim). ``bound_at_recipe`` is the median simulated bound at
    factor 1, to compare with the real run's bound.
    """

    noise_factor: float
    bound_at_recipe: float
    repetitions: int
    power: float = DETECTION_POWER


def _simulated_counts(m: int, *, sample_rate: float, steps: int, noise_multiplier: float,
                      abstain: float, seeds: Sequence[int]) -> Any:
    """``counts(k)``: the correct guesses of simulated gradient audits (one per seed) with every
    noise draw scaled by ``k`` (in units of C: an included canary adds Binomial(T, q), the noise
    N(0, T σ²)). The draws are made once, so every ``k`` sees the same runs (common random
    numbers: each run's count falls as ``k`` grows, up to the guess rule's ties)."""
    import numpy as np

    included = np.empty((len(seeds), m), dtype=bool)
    drawn = np.empty((len(seeds), m), dtype=np.float64)
    z = np.empty((len(seeds), m), dtype=np.float64)
    for i, seed in enumerate(seeds):
        rng = np.random.default_rng(seed)
        included[i] = rng.random(m) < 0.5
        drawn[i] = rng.binomial(steps, sample_rate, m) * included[i]
        z[i] = rng.standard_normal(m)
    scale = math.sqrt(steps) * noise_multiplier
    threshold = 0.5 * sample_rate * steps

    r = guess_count(m, abstain)

    def counts(k: float) -> Any:
        # gradient_correct, one row per run: guess on the r sums farthest from the threshold
        sums = drawn + z * (scale * k)
        right = (sums > threshold) == included
        if r < m:
            keep = np.argpartition(-np.abs(sums - threshold), r - 1, axis=1)[:, :r]
            right = np.take_along_axis(right, keep, axis=1)
        return right.sum(axis=1)

    return counts


def detection_limit(m: int, *, sample_rate: float, steps: int, noise_multiplier: float,
                    delta: float, confidence: float, claimed_epsilon: float,
                    abstain: float = GRADIENT_ABSTAIN, repetitions: int = DETECTION_REPETITIONS,
                    power: float = DETECTION_POWER, rng: Any = None) -> DetectionLimit:
    """Largest factor ``k`` in [0, 1] such that this audit, run on the same ``m``, ``q``,
    ``steps``, ``δ`` and confidence with noise ``k σ``, shows a bound above ``claimed_epsilon``
    in at least ``power`` of ``repetitions`` simulated runs.

    The canaries' coordinates are independent of the model, so the released sums of a run are
    exactly the simulated ones (Poisson participation plus Gaussian noise); the same draws at
    every factor (common random numbers) make the share that flags monotone enough for a
    bisection. The bound grows with the number right, so a run flags iff its count reaches the
    fewest right guesses that reject the claim. ``rng``: a numpy Generator for the
    per-repetition seeds (None: fresh OS entropy).
    """
    import numpy as np

    if repetitions < 1 or steps < 0 or not 0 < sample_rate <= 1:
        raise ConfigError("detection limit needs repetitions >= 1, steps >= 0 and 0 < q <= 1")
    if not 0 < power < 1:
        raise ConfigError(f"detection power must be in (0, 1), got {power}")
    rng = rng if rng is not None else np.random.default_rng()
    seeds = [int(s) for s in rng.integers(0, 2**63 - 1, size=repetitions)]
    r = guess_count(m, abstain)
    counts = _simulated_counts(m, sample_rate=sample_rate, steps=steps,
                               noise_multiplier=noise_multiplier, abstain=abstain, seeds=seeds)
    # odd repetitions: a count; even: rounded down
    at_recipe = epsilon_lower_bound(m, r, int(np.median(counts(1.0))), delta, confidence)
    if steps == 0 or p_value(m, r, r, claimed_epsilon, delta) > 1.0 - confidence:
        return DetectionLimit(0.0, at_recipe, repetitions, power)
    # the fewest right guesses whose bound exceeds the claim: those that reject ε = the claim
    # (p_value grows with ε, so the bound exceeds the claim iff the claim itself is rejected)
    lo_v, hi_v = 0, r
    while hi_v - lo_v > 1:
        mid = (lo_v + hi_v) // 2
        if p_value(m, r, mid, claimed_epsilon, delta) <= 1.0 - confidence:
            hi_v = mid
        else:
            lo_v = mid
    need = hi_v

    def flags(k: float) -> bool:
        return float(np.mean(counts(k) >= need)) >= power

    lo, hi = 0.0, 1.0
    if flags(hi):  # pragma: no cover - a valid bound rarely exceeds the claim
        return DetectionLimit(1.0, at_recipe, repetitions, power)
    if not flags(lo):  # not even a noise-free mechanism is flagged that often
        return DetectionLimit(0.0, at_recipe, repetitions, power)
    for _ in range(14):
        k = (lo + hi) / 2
        if flags(k):
            lo = k
        else:
            hi = k
    return DetectionLimit(lo, at_recipe, repetitions, power)


def choose_abstain(m: int, *, sample_rate: float, steps: int, noise_multiplier: float,
                   delta: float, confidence: float, claimed_epsilon: float,
                   choices: Sequence[float] = ABSTAIN_CHOICES, rng: Any = None
                   ) -> tuple[float, DetectionLimit]:
    """The abstention fraction with the largest simulated detection limit, and its limit.

    A function of public settings (``m``, q, steps, σ, δ, confidence, the claim) and of the
    simulation's own randomness, never of the released sums or the inclusion bits: the guess
    rule it picks is still a function of the output alone, as Theorem 5.2 requires. The winner's
    limit is measured again with fresh draws, so the report is not the best of several noisy
    estimates. Ties (e.g. all 0: the claim is above every ceiling) go to the smaller fraction.
    """
    import numpy as np

    rng = rng if rng is not None else np.random.default_rng()
    seed = int(rng.integers(0, 2**63 - 1))
    settings = dict(sample_rate=sample_rate, steps=steps, noise_multiplier=noise_multiplier,
                    delta=delta, confidence=confidence, claimed_epsilon=claimed_epsilon)
    best, best_k = 0.0, -1.0
    for a in choices:
        k = detection_limit(m, abstain=a, rng=np.random.default_rng(seed), **settings)
        if k.noise_factor > best_k:
            best, best_k = a, k.noise_factor
    return best, detection_limit(m, abstain=best, rng=rng, **settings)
