"""Privacy accounting for Poisson-subsampled Gaussian DP-SGD, and its independent cross-check.

The primary accountant is Opacus's (PRV by default, RDP on request) so the ε dphub reports is the
one the training loop's accountant tracked. The cross-check recomputes ε for the same
(sample rate q, noise σ, steps T, δ) with Google's ``dp-accounting`` library, an implementation
that shares no code with Opacus: its RDP accountant (and PLD for the PRV case, which is the tighter
comparable). Cards record both; validation refuses a card whose claimed ε is below either
recomputation by more than the tolerance.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

from dphub.errors import PrivacyError


@dataclass(frozen=True)
class Accountant:
    """One accountant dphub offers: Opacus's registry name and the dp-accounting method that
    cross-checks it (Opacus-style: ``opacus/accountants/registry.py``)."""

    #: the mechanism name of ``opacus.accountants.create_accountant``
    opacus: str
    #: dp-accounting's method for the same mechanism family (``pld`` or ``rdp``)
    cross_check: str


#: the accountants by the name ``--accountant`` and the card use; adding one is one entry here
_ACCOUNTANTS: dict[str, Accountant] = {
    "prv": Accountant(opacus="prv", cross_check="pld"),
    "rdp": Accountant(opacus="rdp", cross_check="rdp"),
}
ACCOUNTANTS: tuple[str, ...] = tuple(_ACCOUNTANTS)


def lookup_accountant(name: str) -> Accountant:
    """The registered accountant ``name``, or one error naming the choices."""
    try:
        return _ACCOUNTANTS[name]
    except (KeyError, TypeError):
        raise PrivacyError(
            f"unknown accountant {name!r}; choose one of {', '.join(_ACCOUNTANTS)}") from None

#: How far (relative) a card's claimed ε may lie *below* Opacus's recomputation of its own
#: accountant for the recorded (q, σ, T, δ): only float noise, so a 1 % under-claim is refused.
CLAIM_RTOL = 1e-3
#: How far a card's recorded dp-accounting ε may differ from its recomputation (same library,
#: same inputs: deterministic), so an edited cross-check value is refused too.
RECORD_RTOL = 1e-3
#: Tolerance between Opacus and dp-accounting for the same mechanism family. Measured over
#: q ∈ {0.01, 0.05, 0.12, 0.3, 1}, σ ∈ {0.55, 0.8, 1, 2, 5}, T ∈ {10, 100, 1000}, δ = 1e-5:
#: Opacus's PRV is never below dp-accounting's PLD; it lies above it by its own ``eps_error``
#: (≈ 0.010–0.017 absolute), i.e. ≤ 0.4 % relative for ε ≥ 2.5 but up to 56 % at ε ≈ 0.03 (so a
#: *symmetric* agreement needs an absolute term, :data:`CROSS_CHECK_ATOL`). RDP↔RDP agree within
#: 0.01 % in most cells; where σ is small and runs are long dp-accounting drops the fractional
#: orders it cannot evaluate and is looser (Opacus up to 0.83 % below it for ε ≈ 10, 1.7–50 %
#: below for ε ≥ 30); at σ = 5, q = 0.01 it is tighter (orders up to 512; Opacus up to 120 %
#: above at ε ≈ 0.1). Card validation refuses a claim more than this below dp-accounting's ε,
#: which refuses those ε ≥ 30 RDP cards rather than passing an under-claim.
CROSS_CHECK_RTOL = 0.01
#: Absolute slack of :attr:`CrossCheck.agrees` (symmetric): twice PRV's default ``eps_error``
#: of 0.01, which dominates the PRV↔PLD difference at small ε. Card validation does not use it:
#: there only a claim *below* dp-accounting counts, and PRV never is.
CROSS_CHECK_ATOL = 0.02


def below(claimed: float, reference: float, rtol: float) -> bool:
    """``claimed`` is more than ``rtol`` (relative) below ``reference`` (an under-claim).

    An infinite reference makes every finite claim an under-claim.
    """
    if math.isinf(reference):
        return not math.isinf(claimed)
    return (reference - claimed) > rtol * max(abs(reference), 1e-12)


def agree(a: float, b: float, rtol: float, atol: float = 0.0) -> bool:
    """``|a - b| <= rtol * |b| + atol`` (both infinite counts as agreement)."""
    if math.isinf(a) or math.isinf(b):
        return math.isinf(a) and math.isinf(b)
    return abs(a - b) <= rtol * abs(b) + atol


def _opacus_accountant(name: str):
    from opacus.accountants import create_accountant

    return create_accountant(lookup_accountant(name).opacus)


def epsilon_for(
    accountant: str, sample_rate: float, noise_multiplier: float, steps: int, delta: float
) -> float:
    """ε after ``steps`` Poisson-subsampled Gaussian steps, as Opacus's accountant computes it.

    Returns ``math.inf`` for zero noise. ``steps == 0`` gives 0.
    """
    _check(sample_rate, noise_multiplier, steps, delta)
    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    acc = _opacus_accountant(accountant)
    acc.history = [(noise_multiplier, sample_rate, steps)]
    import numpy as np

    # q = 1 makes Opacus's PRV take log(0) on a branch np.where discards: harmless, silenced
    with np.errstate(divide="ignore"):
        return float(acc.get_epsilon(delta=delta))


def epsilon_dp_accounting(
    method: str, sample_rate: float, noise_multiplier: float, steps: int, delta: float
) -> float:
    """ε for the same mechanism from Google's dp-accounting (``rdp`` or ``pld``)."""
    _check(sample_rate, noise_multiplier, steps, delta)
    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier)
        ),
        steps,
    )
    if method == "rdp":
        orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [128, 256, 512]
        acc = rdp_privacy_accountant.RdpAccountant(orders)
    elif method == "pld":
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    else:
        raise PrivacyError(f"unknown dp-accounting method {method!r}")
    # dp-accounting (through absl) logs a warning per fractional RDP order it cannot evaluate;
    # those orders are simply excluded from the minimum, which is the documented behaviour. The
    # warnings come from compose() as well as get_epsilon(), so both run with them silenced.
    with _quiet_logger("absl"):
        acc.compose(event)
        return float(acc.get_epsilon(delta))


@contextlib.contextmanager
def _quiet_logger(name: str) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


#: Largest σ the search tries before declaring the budget unreachable (Opacus's bound).
MAX_SIGMA = 1e6


def noise_for_target_epsilon(
    accountant: str,
    target_epsilon: float,
    sample_rate: float,
    steps: int,
    delta: float,
    tolerance: float = 0.01,
) -> float:
    """The smallest σ (within ``tolerance`` in ε) whose ε after ``steps`` is ≤ the target.

    Same contract as ``opacus.accountants.utils.get_noise_multiplier`` — the returned σ never
    overshoots the budget, ``target - tolerance <= ε(σ) <= target``, every ε computed by Opacus's
    own accountant — but a different search. Opacus bisects σ on [0, 20], about 12–15 ε
    evaluations; with sub-sampling (q < 1) each PRV evaluation costs ~1 s on a CPU (its domain
    bound runs RDP over fractional orders in pure Python), so ``dphub train --target-epsilon``
    spent 7–14 s here before doing any work. ε(σ) is smooth and decreasing and close to a power
    law, so a bracket by doubling/halving σ and then regula falsi on (log σ, log ε) with the
    Illinois modification needs 4–7 evaluations; bisection steps take over if an evaluation is
    not finite. A :class:`PrivacyError` replaces Opacus's ValueError when no σ ≤ 1e6 fits.
    """
    _check(sample_rate, 1.0, steps, delta)
    if accountant not in ACCOUNTANTS:
        raise PrivacyError(
            f"unknown accountant {accountant!r}; choose one of {', '.join(ACCOUNTANTS)}"
        )
    if target_epsilon <= 0 or steps < 1:
        raise PrivacyError(
            f"target ε must be > 0 with at least one step (got ε={target_epsilon}, {steps} steps)"
        )
    if tolerance <= 0:
        raise PrivacyError(f"tolerance must be > 0 (got {tolerance})")

    def eps(sigma: float) -> float:
        import numpy as np

        # large σ make the optimal RDP order the largest one, tiny σ overflow: both harmless,
        # the value is still an upper bound or infinite
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            try:
                value = epsilon_for(accountant, sample_rate, sigma, steps, delta)
            except (ValueError, OverflowError, FloatingPointError):
                return math.inf  # too little noise for the accountant's numerics: over budget
        return value if math.isfinite(value) else math.inf

    # 1. bracket: lo over budget (or σ → 0), hi within budget
    lo, eps_lo = 0.0, math.inf
    hi = 1.0
    eps_hi = eps(hi)
    while eps_hi > target_epsilon:
        lo, eps_lo = hi, eps_hi
        hi *= 2.0
        if hi > MAX_SIGMA:
            raise PrivacyError(
                f"cannot reach ε = {target_epsilon} with δ = {delta:g}: the privacy budget is "
                f"too low (σ > {MAX_SIGMA:g})"
            )
        eps_hi = eps(hi)
    while lo == 0.0 and target_epsilon - eps_hi > tolerance:
        sigma = hi / 2.0
        e = eps(sigma)
        if e > target_epsilon:
            lo, eps_lo = sigma, e
        else:
            hi, eps_hi = sigma, e
    # 2. refine: regula falsi (Illinois) in log-log space, bisection where ε(lo) is not finite
    side = 0
    f_lo = math.log(eps_lo / target_epsilon) if math.isfinite(eps_lo) else math.inf
    f_hi = math.log(eps_hi / target_epsilon) if eps_hi > 0 else -math.inf
    for _ in range(200):
        if target_epsilon - eps_hi <= tolerance:
            break
        x_lo, x_hi = math.log(lo), math.log(hi)
        if math.isfinite(f_lo) and math.isfinite(f_hi) and f_lo != f_hi:
            x = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo)
            if not x_lo < x < x_hi:
                x = (x_lo + x_hi) / 2.0
        else:
            x = (x_lo + x_hi) / 2.0
        sigma = math.exp(x)
        e = eps(sigma)
        f = math.log(e / target_epsilon) if math.isfinite(e) and e > 0 else math.inf
        if e > target_epsilon:
            lo, eps_lo, f_lo = sigma, e, f
            if side == -1:
                f_hi /= 2.0  # Illinois: the end that stays put loses weight
            side = -1
        else:
            hi, eps_hi, f_hi = sigma, e, f
            if side == 1:
                f_lo /= 2.0
            side = 1
    else:  # pragma: no cover - ε(σ) is continuous, the bracket always shrinks
        raise PrivacyError(f"the σ search for ε = {target_epsilon} did not converge")
    return float(hi)


@dataclass(frozen=True)
class CrossCheck:
    """ε from Opacus and from dp-accounting for one (q, σ, T, δ)."""

    accountant: str
    epsilon: float
    method: str
    epsilon_independent: float

    @property
    def relative_difference(self) -> float:
        if math.isinf(self.epsilon) and math.isinf(self.epsilon_independent):
            return 0.0
        return abs(self.epsilon - self.epsilon_independent) / max(self.epsilon_independent, 1e-12)

    @property
    def agrees(self) -> bool:
        """Within ``CROSS_CHECK_RTOL`` relative, or ``CROSS_CHECK_ATOL`` absolute (PRV's
        ``eps_error`` dominates at small ε)."""
        return self.relative_difference <= CROSS_CHECK_RTOL or agree(
            self.epsilon, self.epsilon_independent, 0.0, CROSS_CHECK_ATOL)


def cross_check(
    accountant: str, sample_rate: float, noise_multiplier: float, steps: int, delta: float
) -> CrossCheck:
    """Compute ε with Opacus and with dp-accounting (PRV↔PLD, RDP↔RDP)."""
    epsilon = epsilon_for(accountant, sample_rate, noise_multiplier, steps, delta)
    method = _ACCOUNTANTS[accountant].cross_check  # epsilon_for refused an unknown one
    return CrossCheck(
        accountant=accountant,
        epsilon=epsilon,
        method=method,
        epsilon_independent=epsilon_dp_accounting(
            method, sample_rate, noise_multiplier, steps, delta
        ),
    )


def _check(sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> None:
    if not 0 < sample_rate <= 1:
        raise PrivacyError(f"sample rate must be in (0, 1], got {sample_rate}")
    if noise_multiplier < 0:
        raise PrivacyError(f"noise multiplier must be >= 0, got {noise_multiplier}")
    if steps < 0:
        raise PrivacyError(f"steps must be >= 0, got {steps}")
    if not 0 < delta < 1:
        raise PrivacyError(f"delta must be in (0, 1), got {delta}")
