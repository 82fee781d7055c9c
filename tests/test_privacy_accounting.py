"""Accounting: Opacus's ε agrees with Google's dp-accounting, and target-ε calibration never
overshoots the budget."""

from __future__ import annotations

import math
import warnings

import pytest

from dphub.errors import PrivacyError
from dphub.privacy import accounting

# (sample rate q, noise σ, steps T, δ): the regimes dphub trains in (ε from ~2 to ~8)
CASES = [
    (0.05, 0.8, 100, 1e-6),
    (0.2, 1.5, 50, 1e-4),
    (1.0, 5.0, 10, 1e-5),
    (0.1, 1.0, 100, 1e-5),
]


@pytest.mark.parametrize("accountant", accounting.ACCOUNTANTS)
@pytest.mark.parametrize(("q", "sigma", "steps", "delta"), CASES)
def test_opacus_agrees_with_dp_accounting(accountant, q, sigma, steps, delta):
    cc = accounting.cross_check(accountant, q, sigma, steps, delta)
    assert cc.method == ("pld" if accountant == "prv" else "rdp")
    assert 0 < cc.epsilon < math.inf
    assert cc.relative_difference <= accounting.CROSS_CHECK_RTOL, cc
    assert cc.agrees


@pytest.mark.parametrize(("q", "sigma", "steps", "delta"), CASES[:2])
def test_prv_is_tighter_than_rdp(q, sigma, steps, delta):
    prv = accounting.epsilon_for("prv", q, sigma, steps, delta)
    rdp = accounting.epsilon_for("rdp", q, sigma, steps, delta)
    assert prv < rdp


def test_low_noise_rdp_cross_check_is_conservative():
    """At σ ≈ 0.55 dp-accounting cannot evaluate the small fractional RDP orders and drops them,
    so its RDP ε is looser (higher) than Opacus's: the cross-check then refuses, never passes, a
    claim. PRV↔PLD still agree there."""
    cc = accounting.cross_check("rdp", 0.12, 0.55, 300, 1e-5)
    assert cc.epsilon_independent >= cc.epsilon
    prv = accounting.cross_check("prv", 0.12, 0.55, 30, 1e-5)
    assert prv.agrees


def test_edge_cases_and_bad_input():
    assert accounting.epsilon_for("prv", 0.1, 1.0, 0, 1e-5) == 0.0
    assert accounting.epsilon_for("rdp", 0.1, 0.0, 10, 1e-5) == math.inf
    assert accounting.epsilon_dp_accounting("pld", 0.1, 0.0, 10, 1e-5) == math.inf
    assert accounting.cross_check("rdp", 0.1, 0.0, 10, 1e-5).agrees
    for bad in [(0.0, 1.0, 10, 1e-5), (1.5, 1.0, 10, 1e-5), (0.1, -1.0, 10, 1e-5),
                (0.1, 1.0, -1, 1e-5), (0.1, 1.0, 10, 0.0), (0.1, 1.0, 10, 1.0)]:
        with pytest.raises(PrivacyError):
            accounting.epsilon_for("rdp", *bad)
    with pytest.raises(PrivacyError):
        accounting.epsilon_for("gdp", 0.1, 1.0, 10, 1e-5)
    with pytest.raises(PrivacyError):
        accounting.epsilon_dp_accounting("moments", 0.1, 1.0, 10, 1e-5)


@pytest.mark.parametrize(
    ("accountant", "target", "q", "steps", "delta"),
    [("rdp", 2.0, 0.05, 200, 1e-5), ("rdp", 8.0, 0.12, 300, 1e-5), ("prv", 3.0, 0.1, 50, 1e-5)],
)
def test_target_epsilon_is_hit_from_below(accountant, target, q, steps, delta):
    tol = 0.01
    sigma = accounting.noise_for_target_epsilon(accountant, target, q, steps, delta, tol)
    eps = accounting.epsilon_for(accountant, q, sigma, steps, delta)
    assert target - tol <= eps <= target
    # and it is (nearly) the least noise that fits: 3 % less noise overshoots the budget
    assert accounting.epsilon_for(accountant, q, sigma * 0.97, steps, delta) > target


@pytest.mark.parametrize(
    ("accountant", "target", "q", "steps"),
    [("prv", 8.0, 1 / 3, 6), ("prv", 8.0, 1.0, 32), ("rdp", 100.0, 0.01, 10), ("prv", 0.5, 1.0, 1)],
)
def test_target_epsilon_search_agrees_with_opacus(accountant, target, q, steps):
    """dphub's faster σ search lands where Opacus's bisection does (same contract)."""
    from opacus.accountants.utils import get_noise_multiplier

    tol, delta = 0.01, 1e-5
    ours = accounting.noise_for_target_epsilon(accountant, target, q, steps, delta, tol)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = get_noise_multiplier(target_epsilon=target, target_delta=delta, sample_rate=q,
                                      steps=steps, accountant=accountant, epsilon_tolerance=tol)
    for sigma in (ours, theirs):
        assert target - tol <= accounting.epsilon_for(accountant, q, sigma, steps, delta) <= target
    assert ours == pytest.approx(theirs, rel=0.01)


def test_target_epsilon_bad_input():
    with pytest.raises(PrivacyError):
        accounting.noise_for_target_epsilon("rdp", 0.0, 0.1, 10, 1e-5)
    with pytest.raises(PrivacyError):
        accounting.noise_for_target_epsilon("gdp", 1.0, 0.1, 10, 1e-5)
