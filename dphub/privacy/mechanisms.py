"""Pure ε-DP mechanisms for surrogates, driven by uniforms the caller supplies.

Why uniforms in, not a generator: surrogates must be *reproducible* (same key and input give
byte-identical output, in a resumed run and on Ray), so their randomness is a keyed stream (HMAC
of the key and what is being perturbed, :mod:`dphub.render.keys`). The mechanisms here turn
uniforms from ``(0, 1)`` into noisy values by inverse CDF and know nothing of keys or text.

* :class:`BoundedLaplace` — the bounded Laplace mechanism on a bounded domain ``[lower, upper]``
  (Holohan, Antonatos, Braghin, Mac Aonghusa, "The Bounded Laplace Mechanism in Differential
  Privacy", JPC 2020): the output is the Laplace distribution centred on the true value,
  truncated to the domain and renormalised. Truncation alone breaks ε-DP (the normalising mass
  depends on the value), so the scale is raised from ``sensitivity / ε`` to the ``b'`` that solves
  ``b' = Δ / (ε − ln ΔC(b'))`` (their Theorem; ΔC the worst ratio of normalising masses), found by
  the same bisection as IBM diffprivlib's ``LaplaceBoundedDomain._find_scale``, so the scales
  agree (``tests/test_dp_surrogates.py`` compares them when diffprivlib is importable).
  diffprivlib samples by rejection from its own generator; dphub samples the same distribution
  by the inverse CDF of one keyed uniform.
* :func:`planar_laplace` — geo-indistinguishability (Andrés et al., CCS 2013): a point moves by a
  uniform angle and a radius following Gamma(2, 1/ε) (the sum of two Exp(ε) draws), so any two
  points ``d`` km apart are ``ε·d``-indistinguishable (ε per km).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["BoundedLaplace", "planar_laplace", "EARTH_RADIUS_KM"]

EARTH_RADIUS_KM = 6371.0088
#: a bounded Laplace whose base scale exceeds this many domain widths samples the uniform law
UNIFORM_RATIO = 1e9


def _check_uniform(u: float) -> None:
    if not 0.0 < u < 1.0:
        raise ValueError(f"a uniform in (0, 1) is needed, got {u!r}")


@dataclass(frozen=True)
class BoundedLaplace:
    """ε-DP noise on the domain ``[lower, upper]`` for values whose ``sensitivity`` is given.

    ``sample(value, u)`` is the value perturbed with the uniform ``u``: the inverse CDF of the
    Laplace(value, :attr:`scale`) distribution truncated to the domain. Values outside the domain
    are clamped into it first (as diffprivlib does).
    """

    epsilon: float
    sensitivity: float
    lower: float
    upper: float
    scale: float = field(init=False)

    def __post_init__(self) -> None:
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"epsilon must be a positive number, got {self.epsilon!r}")
        if not self.sensitivity > 0:
            raise ValueError(f"sensitivity must be positive, got {self.sensitivity!r}")
        if not self.upper > self.lower:
            raise ValueError(f"empty domain [{self.lower}, {self.upper}]")
        if self.sensitivity / self.epsilon > UNIFORM_RATIO * (self.upper - self.lower):
            # the scale dwarfs the domain: the truncated Laplace is uniform to within 1e-9 and
            # its floating-point CDF loses the domain (ε = 1e-20 divided by zero); the uniform
            # law is 0-DP, so it keeps every ε
            object.__setattr__(self, "scale", math.inf)
            return
        object.__setattr__(self, "scale", self._find_scale())

    def _find_scale(self) -> float:
        """The smallest scale ``b`` with ``b = Δ / (ε − ln ΔC(b))`` (bisection, Holohan et al.)."""
        eps, dq, diam = self.epsilon, self.sensitivity, self.upper - self.lower

        def delta_c(b: float) -> float:
            return (2 - math.exp(-dq / b) - math.exp(-(diam - dq) / b)) / (1 - math.exp(-diam / b))

        def f(b: float) -> float:
            return dq / (eps - math.log(delta_c(b)))

        left = dq / eps
        right = f(left)
        old = (right - left) * 2
        while old > right - left:
            old = right - left
            mid = (right + left) / 2
            fm = f(mid)
            if fm >= mid:
                left = mid
            if fm <= mid:
                right = mid
        return (right + left) / 2

    def _cdf_untruncated(self, t: float, x: float) -> float:
        z = (t - x) / self.scale
        return 0.5 * math.exp(z) if z < 0 else 1.0 - 0.5 * math.exp(-z)

    def cdf(self, t: float, value: float) -> float:
        """P(output <= t) for the input ``value`` (the analytic truncated-Laplace CDF)."""
        x = min(max(value, self.lower), self.upper)
        if t < self.lower:
            return 0.0
        if t >= self.upper:
            return 1.0
        if math.isinf(self.scale):
            return (t - self.lower) / (self.upper - self.lower)
        lo, hi = self._cdf_untruncated(self.lower, x), self._cdf_untruncated(self.upper, x)
        return (self._cdf_untruncated(t, x) - lo) / (hi - lo)

    def sample(self, value: float, u: float) -> float:
        """``value`` perturbed by the uniform ``u`` in (0, 1), in ``[lower, upper]``."""
        _check_uniform(u)
        if math.isinf(self.scale):
            return self.lower + u * (self.upper - self.lower)
        x = min(max(value, self.lower), self.upper)
        lo, hi = self._cdf_untruncated(self.lower, x), self._cdf_untruncated(self.upper, x)
        p = lo + u * (hi - lo)
        t = x + self.scale * math.log(2 * p) if p < 0.5 else x - self.scale * math.log(2 * (1 - p))
        return min(max(t, self.lower), self.upper)


def planar_laplace(lat: float, lon: float, epsilon_per_km: float, u_angle: float,
                   u_r1: float, u_r2: float) -> tuple[float, float, float]:
    """``(lat, lon)`` moved under geo-indistinguishability: ``(new_lat, new_lon, radius_km)``.

    The radius is Gamma(2, 1/ε) km — ``-(ln u_r1 + ln u_r2) / ε``, exact (the planar Laplace's
    radial law, Andrés et al. 2013) — and the bearing uniform; the point is moved along the great
    circle (exact on the sphere, so no flat-earth distortion near the poles).
    """
    for u in (u_angle, u_r1, u_r2):
        _check_uniform(u)
    if not (epsilon_per_km > 0 and math.isfinite(epsilon_per_km)):
        raise ValueError(f"epsilon must be a positive number, got {epsilon_per_km!r}")
    r = -(math.log(u_r1) + math.log(u_r2)) / epsilon_per_km
    theta = 2 * math.pi * u_angle
    d = r / EARTH_RADIUS_KM
    p1, l1 = math.radians(lat), math.radians(lon)
    p2 = math.asin(min(1.0, max(-1.0, math.sin(p1) * math.cos(d)
                                + math.cos(p1) * math.sin(d) * math.cos(theta))))
    l2 = l1 + math.atan2(math.sin(theta) * math.sin(d) * math.cos(p1),
                         math.cos(d) - math.sin(p1) * math.sin(p2))
    lon2 = (math.degrees(l2) + 540.0) % 360.0 - 180.0
    return math.degrees(p2), lon2, r
