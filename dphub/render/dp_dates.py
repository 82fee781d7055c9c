"""Differentially private dates for ``--mode surrogate --dates dp`` (issue 28).

Why: the default surrogate moves every date of a patient by one secret offset, so the intervals
between a patient's dates survive exactly, and that sequence of intervals is unique for almost
every patient: whoever knows a few true dates of a stay re-links the document (Tchouka, Couchot,
Laiymani 2023; ``benchmarks/date_linkage.py`` measures it on a corpus). Here the *intervals*
are perturbed, with the bounded Laplace mechanism (:class:`dphub.privacy.mechanisms.BoundedLaplace`):

1. the unit's dates (one note, or every note of one patient: ``date_unit``) are turned into
   points in time (:func:`dphub.render.dates.date_point`) on two timelines, dates with a year and
   month/day dates without one (the latter unrolled at their widest gap, so a stay over New Year
   reads as one stay); each timeline is sorted and deduplicated;
2. each interval between consecutive points (``Δ >= 1`` day) is replaced by a draw of the bounded
   Laplace mechanism on the domain of its **scale band** — days ``[1, 31]``, months
   ``[32, 365]``, years ``[366, 36525]`` — with the band's unit as sensitivity (1 day, 30 days,
   365 days) and ``ε`` per unit, rounded to whole days;
3. the points are rebuilt from an anchor — the first point moved by the patient's secret offset
   (the per-patient shift of the default mode) and by bounded Laplace noise on ``[-365, 365]``
   days (unit 1 day, the same ε) — adding the noisy intervals: every noisy interval is at least
   one day, so **the order of the dates is kept**;
4. each date is re-emitted in its own format by :func:`~dphub.render.dates.shift_date_text` with
   its own ``(days, months, years)`` shift (a month-level date moves by whole months, a year by
   whole years; weekdays, days alone and decades move by the patient's offset as in the default).

**Guarantee** (metric DP, the notion of geo-indistinguishability, applied per interval): for two
intervals of the same band that differ by ``k`` units of that band (days, 30-day months, years),
the distributions of their noisy values differ by a factor of at most ``exp(k·ε)``. The band of
an interval is disclosed (a 3-day and a 3-month interval are not hidden from each other). The
noise of an interval is keyed by the patient and the interval's two end points
(HMAC-SHA256 of the key), so the same interval gets the same noisy value in every note of the
patient: repeating it releases nothing new (no averaging). The intervals of one patient
compose: the ``n`` distinct intervals released for a patient are ``(k_1 + ... + k_n)·ε``
distinguishable in total. With ``date_unit="note"`` each note is its own chain (streaming: no
state across notes), so intervals between dates of different notes are never released, but
one true date may get a different surrogate in each note; with ``date_unit="patient"`` every
date of the patient is one chain (one surrogate per true date, consistent across notes), which
needs all of the patient's dates before the first note is written: a pre-pass
(:meth:`dphub.render.surrogate.SurrogateRenderer.observe`; the runner runs the ensemble over the
input twice). Each chain's first date counts once more (the anchor noise, ε per day, keyed by
that date); without it, notes of one date each would give away the exact (shifted) timeline.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import dataclass

from dphub.privacy.mechanisms import BoundedLaplace
from dphub.render.dates import DatePoint, Shift
from dphub.render.keys import hmac_int

__all__ = ["BANDS", "DATE_MECHANISM", "DEFAULT_DATE_EPSILON", "DateBand", "DpDates", "keyed_uniform"]

#: what the audit log names for ``--dates dp``
DATE_MECHANISM = "bounded-laplace-intervals"
#: ``--date-epsilon`` when none is given (ε per band unit, per interval): chosen from
#: ``benchmarks/date_linkage.py`` on the PhysioNet dev corpus (docs/surrogates.md)
DEFAULT_DATE_EPSILON = 0.1
#: the anchor's noise domain, in days either way (on top of the secret per-patient offset)
ANCHOR_DAYS = 365


@dataclass(frozen=True)
class DateBand:
    """One scale of intervals: its domain in days and its unit (the sensitivity)."""

    name: str
    lower: int
    upper: int
    unit: int


BANDS: tuple[DateBand, ...] = (
    DateBand("days", 1, 31, 1),
    DateBand("months", 32, 365, 30),
    DateBand("years", 366, 36525, 365),
)


def band_of(interval: int) -> DateBand:
    """The scale band of an interval of ``interval`` days (>= 1)."""
    for b in BANDS:
        if interval <= b.upper:
            return b
    return BANDS[-1]


def keyed_uniform(key: bytes, *parts: str) -> float:
    """A uniform in (0, 1) from HMAC-SHA256(key, parts): 53 bits, never 0 or 1."""
    bits = hmac_int(key, *parts) >> (256 - 53)
    return (bits + 0.5) / 2.0**53


def unroll(values: list[int]) -> dict[int, int]:
    """Month/day points of the leap reference year placed on one line: cut the year at the widest
    gap between consecutive dates (a stay from 12/30 to 1/2 is four days, not a year)."""
    v = sorted(set(values))
    if len(v) < 2:
        return {x: x for x in v}
    gaps = [(v[i + 1] - v[i], i) for i in range(len(v) - 1)]
    widest, at = max(gaps)
    if widest <= v[0] + 366 - v[-1]:  # the widest gap is across New Year: nothing to move
        return {x: x for x in v}
    return {x: x + 366 if i <= at else x for i, x in enumerate(v)}


class DpDates:
    """The per-unit date mapping of ``--dates dp`` (see the module docstring)."""

    def __init__(self, key: bytes, epsilon: float) -> None:
        if not (isinstance(epsilon, int | float) and epsilon > 0 and math.isfinite(epsilon)):
            raise ValueError(f"the date epsilon must be a positive number, got {epsilon!r}")
        self._key = key
        self.epsilon = float(epsilon)
        self._mechs = {b.name: BoundedLaplace(self.epsilon, b.unit, b.lower, b.upper)
                       for b in BANDS}
        self._anchor = BoundedLaplace(self.epsilon, 1, -ANCHOR_DAYS, ANCHOR_DAYS)

    def patient_total(self) -> dict[str, object]:
        """What one patient's dates cost in all (issue 38), for the audit and run.json: the
        released intervals and anchors compose (basic composition, a sum), each at most ε times
        its domain's width in units (two timelines of a patient can differ anywhere in it)."""
        eps = self.epsilon
        return {
            "composition": "basic (sum) over the patient's released intervals and chain anchors",
            "total": "epsilon x (anchor shift in days + sum of interval changes in band units)",
            "worst_case_per_interval": {b.name: round(eps * (b.upper - b.lower) / b.unit, 6)
                                        for b in BANDS},
            "worst_case_per_anchor": round(eps * 2 * ANCHOR_DAYS, 6),
            "left_visible": "the number of distinct dates of each chain, their order, each "
                            "interval's band, which mentions are the same date, each date's format",
        }

    def noisy_interval(self, patient: str, line: str, a: int, b: int, interval: int) -> int:
        """The perturbed interval between the points ``a`` < ``b`` (``interval`` days apart)."""
        band = band_of(interval)
        u = keyed_uniform(self._key, "dp-date", patient, line, str(a), str(b))
        return max(band.lower, round(self._mechs[band.name].sample(interval, u)))

    def anchor_noise(self, patient: str, line: str, first: int) -> int:
        """The noise on the chain's first date (on top of the patient's secret offset): bounded
        Laplace around 0 on ``[-365, 365]`` days, 1 day as the unit, keyed by the first date
        (so notes that start on the same true date start on the same surrogate)."""
        u = keyed_uniform(self._key, "dp-date-anchor", patient, line, str(first))
        return round(self._anchor.sample(0.0, u))

    def shifts(self, patient: str, offset: int, points: Iterable[DatePoint]
               ) -> dict[tuple[str, int], Shift]:
        """``(timeline, day) -> (days, months, years)`` for each of the unit's points."""
        by_line: dict[str, set[int]] = {}
        for line, day, _resolution in points:
            by_line.setdefault(line, set()).add(day)
        out: dict[tuple[str, int], Shift] = {}
        for line, days in by_line.items():
            placed = unroll(sorted(days)) if line == "md" else {d: d for d in days}
            chain = sorted(days, key=lambda d: placed[d])
            new = placed[chain[0]] + offset + self.anchor_noise(patient, line, chain[0])
            prev = chain[0]
            for i, d in enumerate(chain):
                if i:
                    gap = placed[d] - placed[prev]
                    new += self.noisy_interval(patient, line, prev, d, gap)
                    prev = d
                out[(line, d)] = _shift(placed[d], new)
        return out


def _shift(old: int, new: int) -> Shift:
    """``(days, months, years)`` from the day ordinal ``old`` to ``new``."""
    a = dt.date.fromordinal(old)
    b = dt.date.fromordinal(max(1, min(new, dt.date.max.toordinal())))
    return new - old, (b.year * 12 + b.month) - (a.year * 12 + a.month), b.year - a.year
