"""DP ages for ``--mode surrogate --ages dp`` (issue 28).

By default ages of 89 and below are kept (no identifier under HIPAA Safe Harbor) and older ones
become ``90+``. ``--ages dp`` perturbs each age of at most 89 *years* with the bounded Laplace
mechanism on ``[0, 89]`` (sensitivity 1 year, ``ε`` per year: two ages ``k`` years apart are
``exp(k·ε)``-indistinguishable), rounded to whole years; ``90+`` stays. Ages in months, weeks or
days (an infant's ``18 months``) and decades (``80s``) are kept: their scale is not the domain's.
The noise is keyed by the patient and the age (HMAC of the key), so one age of a patient gets
one surrogate in every note (repeating it releases nothing new).
"""

from __future__ import annotations

import math

from dphub.privacy.mechanisms import BoundedLaplace
from dphub.render.dp_dates import keyed_uniform

__all__ = ["AGE_MECHANISM", "DEFAULT_AGE_EPSILON", "DpAges", "MAX_KEPT_AGE"]

AGE_MECHANISM = "bounded-laplace"
DEFAULT_AGE_EPSILON = 0.5
#: the oldest age written as a number; older ones are ``90+`` (HIPAA Safe Harbor)
MAX_KEPT_AGE = 89


class DpAges:
    def __init__(self, key: bytes, epsilon: float) -> None:
        if not (isinstance(epsilon, int | float) and epsilon > 0 and math.isfinite(epsilon)):
            raise ValueError(f"the age epsilon must be a positive number, got {epsilon!r}")
        self._key = key
        self.epsilon = float(epsilon)
        self._mech = BoundedLaplace(self.epsilon, 1.0, 0.0, float(MAX_KEPT_AGE))

    def age(self, patient: str, years: int) -> int:
        """The surrogate of an age of ``years`` (0..89) of ``patient``."""
        u = keyed_uniform(self._key, "dp-age", patient, str(years))
        return min(MAX_KEPT_AGE, max(0, round(self._mech.sample(years, u))))
