"""The order of review: notes that teach most come first (issue 40, docs/review.md).

Why a score of its own: a reviewer reads a sample, not the run, so the sample should be the notes
whose labels would change the next model most. Three signals, all read from the run's audit (no
model is loaded, no note text is needed), summed per note:

* **members disagree** (weight 1 per span): a hidden span that some, but not all, of the run's
  members voted for;
* **near a threshold** (up to 1 per span): a span whose score (the best voter's P(PHI)) lies
  within :data:`NEAR` of the threshold of a voting member that has one, ``1 - |score - t| / NEAR``
  (0 at the edge of the band, 1 on the threshold); members without a threshold (rules, fixed
  spans) give none;
* **inverse-rule words** (weight 1 per span): words the inverse rule hid that no member typed
  (label ``PHI``, no voter), where the members' view and the rule's disagree by construction.

Ties keep the run's order, so the order is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dphub.ensemble.aggregate import span_members

#: the width of the band around a member's threshold in which a score counts as doubtful
NEAR = 0.2


@dataclass(frozen=True)
class Doubt:
    """A note's doubt: the total and its three parts (shown on the page next to the note)."""

    disagree: int
    near: float
    inverse: int

    @property
    def total(self) -> float:
        return round(self.disagree + self.near + self.inverse, 6)

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "disagree": self.disagree, "near": round(self.near, 6),
                "inverse": self.inverse}


def span_disagrees(voters: Sequence[str], members: Sequence[str]) -> bool:
    """Some but not all of the run's members voted for the span."""
    return 0 < len(set(voters) & set(members)) < len(set(members))


def span_near(voters: Sequence[str], score: float | None,
              thresholds: Mapping[str, float]) -> float:
    """How near one span's score lies to a voter's threshold: ``1 - |score - t| / NEAR`` at
    best over its voters with a threshold, 0 outside the band (the page marks a span above 0)."""
    best = 0.0
    if score is None:
        return best
    for v in voters:
        t = thresholds.get(v)
        if t is not None:
            best = max(best, 1.0 - abs(float(score) - t) / NEAR)
    return best


def note_doubt(spans: Sequence[Mapping[str, Any]], members: Sequence[str],
               thresholds: Mapping[str, float]) -> Doubt:
    """The doubt of one note from its audit spans (``members``, ``score``, ``label``)."""
    disagree = inverse = 0
    near = 0.0
    for s in spans:
        voters = span_members(s)
        if not voters:
            inverse += 1
            continue
        if span_disagrees(voters, members):
            disagree += 1
        near += span_near(voters, s.get("score"), thresholds)
    return Doubt(disagree, near, inverse)


def doubt_order(doubts: Sequence[Doubt]) -> list[int]:
    """Indices of the notes, most doubtful first; ties in the run's order."""
    return sorted(range(len(doubts)), key=lambda i: (-doubts[i].total, i))
