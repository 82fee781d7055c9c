"""Composing the guarantees of several releases over the same patients: the one function that the
training plan check, the card's claim, its validation and the ledger all use.

Two ways, the smaller wins (both are valid upper bounds at the summed δ):

* **basic** sequential composition: ε and δ add up. Valid for any mechanisms, whatever their
  accountants (a teacher's claim, a composed parent, a federated round).
* **exact** composition of Gaussian-mechanism DP-SGD runs: when every part records its accountant
  history (Poisson-subsampled Gaussian steps: q, σ, T), the histories are concatenated in one
  Opacus accountant (PRV when every part used PRV, else RDP; both compose heterogeneous steps
  exactly in their own representation) and ε is read at the summed δ.

Why one function: the CLI's projection before the first step, the card's claim and ``card
validate``'s floor must agree to the last digit, so none of them codes the sum again.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dphub.errors import PrivacyError

#: ``composition.method`` values: basic, or the accountant that composed the Gaussian histories.
BASIC = "basic"
EXACT_METHODS = ("prv", "rdp")


@dataclass(frozen=True)
class GaussianSteps:
    """``steps`` Poisson-subsampled Gaussian steps (DP-SGD) as one accountant records them."""

    accountant: str
    sample_rate: float
    noise_multiplier: float
    steps: int

    def to_json(self) -> dict[str, Any]:
        return {"accountant": self.accountant, "sample_rate": float(self.sample_rate),
                "noise_multiplier": float(self.noise_multiplier), "steps": int(self.steps)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GaussianSteps:
        return cls(str(data["accountant"]), float(data["sample_rate"]),
                   float(data["noise_multiplier"]), int(data["steps"]))


@dataclass(frozen=True)
class Part:
    """One release's (ε, δ), and its Gaussian history when it is a plain DP-SGD run (empty:
    unknown mechanism or already a composition, so only basic composition applies)."""

    epsilon: float
    delta: float
    history: tuple[GaussianSteps, ...] = ()


@dataclass(frozen=True)
class Composed:
    epsilon: float
    delta: float
    #: :data:`BASIC` or one of :data:`EXACT_METHODS`
    method: str
    #: the basic sum, always computed (what a reader can check by hand)
    basic_epsilon: float


def compose(parts: Sequence[Part]) -> Composed:
    """The guarantee of releasing every part: the smaller of basic and exact composition."""
    if not parts:
        raise PrivacyError("internal: nothing to compose")
    basic = math.fsum(float(p.epsilon) for p in parts)
    delta = math.fsum(float(p.delta) for p in parts)
    if len(parts) > 1 and all(p.history for p in parts):
        steps = [s for p in parts for s in p.history]
        method = "prv" if all(s.accountant == "prv" for s in steps) else "rdp"
        exact = history_epsilon(method, steps, delta)
        if exact < basic:
            return Composed(exact, delta, method, basic)
    return Composed(basic, delta, BASIC, basic)


def history_epsilon(accountant: str, history: Iterable[GaussianSteps], delta: float) -> float:
    """ε of a sequence of Gaussian DP-SGD phases at ``delta``, composed by one Opacus accountant."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    entries = [(s.noise_multiplier, s.sample_rate, s.steps) for s in history if s.steps > 0]
    if not entries:
        return 0.0
    if any(sigma <= 0 for sigma, _, _ in entries):
        return math.inf
    if accountant not in EXACT_METHODS:
        raise PrivacyError(f"unknown accountant {accountant!r}")
    acc = PRVAccountant() if accountant == "prv" else RDPAccountant()
    acc.history = entries
    import numpy as np

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return float(acc.get_epsilon(delta=delta))


def run_history(dp: Mapping[str, Any]) -> tuple[GaussianSteps, ...]:
    """The Gaussian history of a card's own training run (its accounting fields, which describe
    the run even when the claim composes others), or ``()`` when it is not one DP-SGD run (a
    federation, no accounting fields)."""
    if dp.get("federation") is not None:
        return ()
    try:
        return (GaussianSteps(str(dp["accountant"]), float(dp["sample_rate"]),
                              float(dp["noise_multiplier"]), int(dp["steps"])),)
    except (KeyError, TypeError, ValueError):
        return ()


def lineage_part(entry: Mapping[str, Any]) -> Part:
    """A card lineage entry as a :class:`Part` (its ``accounting`` history when recorded)."""
    hist = entry.get("accounting")
    history = (GaussianSteps.from_json(hist),) if isinstance(hist, Mapping) else ()
    return Part(float(entry["epsilon"]), float(entry["delta"]), history)


__all__ = ["BASIC", "EXACT_METHODS", "Composed", "GaussianSteps", "Part", "compose",
           "history_epsilon", "lineage_part", "run_history"]
