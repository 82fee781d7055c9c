"""What `--places geo` guarantees, measured over the gazetteer (public data only; a minute or two).

Usage (from the repository root; needs the ``dphub[geo]`` extra)::

    python benchmarks/geo_guarantee.py [--cities 300] [--draws 2000] [--seed 0]

For a seeded sample of gazetteer cities and several ε (per km), prints:

* **not moved**: the share of cities whose excluded probability's upper bound is above the cap
  (``dphub.render.geo.P_CAP``): they get a Faker city, not the geo-indistinguishable one;
* **δ of a moved city**: the rule "never a word of the original" makes an output that shares a
  word with a place x′ impossible for x′ and possible for another place x, so a pair (x, x′) is
  only (ε·d + ln(1/(1 − p_x)), δ_x)-indistinguishable, with δ_x = P(x's output contains a given
  word), largest over words: the share of x's outputs (after the redraws) naming the most
  frequent word. Median, 90th percentile and maximum over the moved cities;
* the pair of issue 53: P(the output for Somerville contains "boston").

docs/surrogates.md ("Places") has the table.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter

import numpy as np

from dphub.render.geo import P_CAP, Gazetteer, _move, name_words


def outputs(gz: Gazetteer, city, words: frozenset[str], eps: float, draws: int,
            rng: np.random.Generator) -> tuple[float, list[frozenset[str]]]:
    """(share rejected, the accepted outputs' word sets) of ``draws`` noisy points."""
    r = rng.gamma(2.0, 1.0 / eps, draws)
    theta = rng.uniform(0.0, 2 * math.pi, draws)
    lat, lon = _move(city.lat, city.lon, r, theta)
    near = gz.nearest_index(lat, lon, (city, float(r.max())))
    out = [gz._words[int(i)] for i in near]
    kept = [w for w in out if not w & words]
    return 1 - len(kept) / draws, kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cities", type=int, default=300)
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    gz = Gazetteer.load()
    rng = np.random.default_rng(args.seed)
    sample = [gz.cities[int(i)] for i in rng.choice(len(gz.cities), args.cities, replace=False)]
    print(f"{args.cities} random gazetteer cities of {len(gz.cities):,}, {args.draws} draws each, "
          f"seed {args.seed}; cap p <= {P_CAP}")
    print("| ε per km | not moved (p above the cap) | δ of a moved city: median | 90th pct | max |")
    print("|---|---|---|---|---|")
    for eps in (0.02, 0.05, 0.1, 0.5, 1.0):
        unmoved, deltas = 0, []
        for city in sample:
            words = name_words(city.name)
            p = gz.excluded_probability(city, words, eps)
            if p > P_CAP:
                unmoved += 1
                continue
            _, kept = outputs(gz, city, words, eps, args.draws, rng)
            counts = Counter(w for ws in kept for w in ws)
            deltas.append(max(counts.values()) / len(kept) if kept else 0.0)
        d = np.array(deltas) if deltas else np.zeros(1)
        print(f"| {eps:g} | {unmoved / len(sample):.1%} | {np.median(d):.3f} "
              f"| {np.quantile(d, 0.9):.3f} | {d.max():.3f} |")
    some, boston = gz.by_name["somerville"], frozenset({"boston"})
    for eps in (0.05,):
        _, kept = outputs(gz, some, name_words(some.name), eps, 20 * args.draws, rng)
        share = sum(1 for w in kept if w & boston) / len(kept)
        print(f"ε {eps}: P(Somerville's output contains 'boston') = {share:.3%} "
              f"({20 * args.draws} draws); given Boston it is 0 by the rule")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
