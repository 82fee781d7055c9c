"""The privacy plan of a run: sample rate, steps, σ and δ, fixed before the first step.

``q`` is ``1 / k`` for an integer ``k`` (steps per epoch): Opacus derives the accountant's sample
rate from the data loader's length, and ``1 / len(loader)`` must equal the rate the sampler uses.
``--max-epsilon`` is enforced here, *before* training: the number of steps is capped at the
largest ``T`` whose ε stays within the budget, so training never takes a step that would exceed it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dphub.errors import InputError, PrivacyError
from dphub.privacy import accounting
from dphub.train.options import DEFAULT_TARGET_EPSILON, TrainOptions, default_delta


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
    #: the card lineage the run starts with (an ``--init-from`` parent): its composed entries
    #: are part of the claim the plan check projects
    lineage: tuple[Mapping[str, Any], ...] = field(default=())
    #: the run's :class:`dphub.privacy.ledger.Footprint` (None: no DP, nothing looked up): the
    #: plan check adds what the privacy ledger records on these patients and notes
    footprint: Any = None

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
        target = opts.target_epsilon if opts.target_epsilon is not None else DEFAULT_TARGET_EPSILON
        sigma = accounting.noise_for_target_epsilon(opts.accountant, target, q, steps, delta, 0.01)
    planned = steps
    stopped = False
    if (
        opts.max_epsilon is not None
        and _eps_quiet(opts.accountant, q, sigma, steps, delta) > opts.max_epsilon
    ):
        lo = _steps_within(opts.accountant, q, sigma, steps, delta, opts.max_epsilon)
        if lo == 0:
            raise PrivacyError(
                f"even one step exceeds --max-epsilon {opts.max_epsilon} "
                f"(σ = {sigma:.3g}, q = {q:.3g}); raise the noise or the budget"
            )
        steps = lo
        stopped = True
    return PrivacyPlan(num_units, k, q, steps, planned, sigma, delta, stopped)


def _steps_within(accountant: str, q: float, sigma: float, steps: int, delta: float,
                  max_epsilon: float) -> int:
    """The largest ``T < steps`` whose ε stays within ``max_epsilon`` (0: not even one step),
    given that ``steps`` exceeds it (bisection: ε grows with T)."""
    lo, hi = 0, steps  # eps(lo) <= max < eps(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _eps_quiet(accountant, q, sigma, mid, delta) <= max_epsilon:
            lo = mid
        else:
            hi = mid
    return lo


def projected_epsilon(opts: TrainOptions, plan: PrivacyPlan) -> float | None:
    """The ε the run will report after its planned steps (None without DP).

    Known before the first step: the accountant needs only (q, σ, T, δ), all fixed by the plan,
    so a run whose guarantee will be too weak can be stopped before it spends any time.
    """
    if plan.noise_multiplier is None or plan.delta is None:
        return None
    return _eps_quiet(opts.accountant, plan.sample_rate, plan.noise_multiplier, plan.steps,
                      plan.delta)


def _round_up(x: float, digits: int = 2) -> float:
    """``x`` rounded up to ``digits`` significant digits (more noise never raises ε)."""
    scale = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return math.ceil(x / scale) * scale


def ways_to_reach(opts: TrainOptions, plan: PrivacyPlan,
                  max_epsilon: float) -> tuple[float | None, float | None]:
    """How this run could stay within ``max_epsilon``: (σ for the planned steps, epochs at the
    planned σ); either is None when it cannot (σ beyond the search range, not even one step).

    Both are checked with the run's own accountant, so following either advice gives an ε the
    card will show within the bound.
    """
    if plan.noise_multiplier is None or plan.delta is None:
        return None, None

    try:
        sigma: float | None = _round_up(accounting.noise_for_target_epsilon(
            opts.accountant, max_epsilon, plan.sample_rate, plan.steps, plan.delta, 0.01))
    except PrivacyError:
        sigma = None
    within = _steps_within(opts.accountant, plan.sample_rate, plan.noise_multiplier, plan.steps,
                           plan.delta, max_epsilon)
    epochs = within / plan.steps_per_epoch if within else None
    return sigma, epochs
