"""The ε policy itself: the weakest guarantee accepted (a maximum ε and a minimum privacy unit),
and the one predicate that compares a guarantee with it.

It lives in the privacy layer so that training can refuse a run above it before the first step
(:func:`dphub.train.train` refuses by itself, issue 39 item 6); where a hub keeps its policy is the
hub's (:mod:`dphub.hub.policy`, which re-exports these names). Non-finite values are refused
everywhere: ``--max-epsilon nan`` compares false with every ε and would make the policy fail open.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from dphub.errors import ConfigError
from dphub.privacy.statement import format_epsilon

#: privacy units, strongest first (as ``dphub.hub.common.PRIVACY_UNITS``)
PRIVACY_UNITS = ("patient", "note", "sequence")
#: Strength of each privacy unit: a larger number protects more (a patient covers their notes).
UNIT_STRENGTH: dict[str, int] = {"sequence": 0, "note": 1, "patient": 2}


def check_max_epsilon(value: Any, *, what: str = "max_epsilon") -> float:
    """``value`` as a finite positive float, else :class:`ConfigError` (NaN would fail open)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{what} must be a number (got {type(value).__name__})")
    try:  # a 400-digit integer overflows a float: OverflowError, which used to crash
        x = float(value)
    except OverflowError:
        raise ConfigError(f"{what} must be a finite number > 0 (got an integer of "
                          f"{len(str(abs(value)))} digits)") from None
    if not math.isfinite(x) or x <= 0:
        raise ConfigError(f"{what} must be a finite number > 0 (got {value!r})")
    return x


def check_unit(value: Any, *, what: str = "min_unit") -> str:
    """``value`` if it is a privacy unit name, else :class:`ConfigError`."""
    if value not in UNIT_STRENGTH:
        raise ConfigError(f"{what} must be one of {', '.join(PRIVACY_UNITS)} (got {value!r})")
    return str(value)


@dataclass(frozen=True)
class Policy:
    """Largest ε and weakest privacy unit accepted. Construction validates both."""

    max_epsilon: float = 10.0
    min_unit: str = "patient"

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_epsilon", check_max_epsilon(self.max_epsilon))
        check_unit(self.min_unit)

    def with_overrides(self, *, max_epsilon: float | None = None,
                       min_unit: str | None = None) -> Policy:
        """A copy with the given (validated) values replaced; ``None`` keeps a value."""
        return replace(
            self,
            max_epsilon=self.max_epsilon if max_epsilon is None else max_epsilon,
            min_unit=self.min_unit if min_unit is None else min_unit,
        )

    def to_json(self) -> dict[str, Any]:
        return {"max_epsilon": self.max_epsilon, "min_unit": self.min_unit}

    @classmethod
    def from_json(cls, data: Any, *, where: str) -> Policy:
        """Parse a policy object; unknown keys are refused (a typo would silently loosen it)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: a policy must be a JSON object")
        unknown = sorted(set(data) - {"max_epsilon", "min_unit"})
        if unknown:
            shown = ", ".join(k if str(k).isidentifier() else "<key>" for k in map(str, unknown))
            raise ConfigError(f"{where}: unknown policy key(s): {shown}")
        try:
            return cls(max_epsilon=data.get("max_epsilon", DEFAULT_POLICY.max_epsilon),
                       min_unit=data.get("min_unit", DEFAULT_POLICY.min_unit))
        except ConfigError as e:
            raise ConfigError(f"{where}: {e.message}") from None

    def describe(self) -> str:
        return f"epsilon <= {self.max_epsilon:g}, privacy unit {self.min_unit} or stronger"


#: ε ≤ 10 per patient: the card calls anything above 10 a weak formal guarantee.
DEFAULT_POLICY = Policy()


def policy_violation(epsilon: float | None, unit: str | None,
                     policy: Policy = DEFAULT_POLICY, *, public: bool = False) -> str | None:
    """Why a model with this guarantee exceeds ``policy`` (one phrase), or None if it complies.

    ``epsilon`` None or non-finite means no DP guarantee at all. Used by publish, pull and (as a
    warning) at the end of ``dphub train``; the caller adds how to change the policy.
    ``public``: a public base model (public synthetic notes only, ε 0, checked by the gate) has
    no private data and no privacy unit to compare, so every policy accepts it.
    """
    if public and epsilon == 0:
        return None
    if epsilon is None or isinstance(epsilon, bool) or not isinstance(epsilon, int | float) \
            or not math.isfinite(epsilon):
        return f"the model has no finite epsilon (the policy requires {policy.describe()})"
    if epsilon > policy.max_epsilon:
        return (f"epsilon {format_epsilon(epsilon)} exceeds the policy's maximum "
                f"{policy.max_epsilon:g}")
    if UNIT_STRENGTH.get(unit or "", -1) < UNIT_STRENGTH[policy.min_unit]:
        return (f"privacy unit {unit} is weaker than the policy's minimum {policy.min_unit} "
                "(patient > note > sequence)")
    return None


__all__ = ["DEFAULT_POLICY", "UNIT_STRENGTH", "Policy", "check_max_epsilon", "check_unit",
           "policy_violation"]
