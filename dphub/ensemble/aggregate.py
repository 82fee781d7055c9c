"""Combining members' predictions on characters.

Members tokenize differently (their own word pieces, windows, or none at all for rules), so the
only common ground is the note's characters. Each member contributes the characters its spans
cover; a character is PHI when at least ``k`` members cover it (``any``: k = 1, the minimality rule
of the ensemble: one member is enough to hide a character; ``k-of-n:K``: K members must agree).
``k-of-n:K+NAME+NAME`` names members whose flag counts *alone* (their vote weighs K): the owner's
rules and its own model hide what they flag, while pulled models, trained on other sites' notes,
must agree before they hide a character. Why: community models add recall together but most of
their false positives are flagged by one model only, so a quorum among them keeps the recall they
add in agreement and drops most of what they add alone (measured on the owner's labels:
``benchmarks/owner_cv.py --what aggregate``). Contiguous PHI characters form merged spans, except
that spans which only *touch* (one ends where the next begins, with no member spanning the seam)
stay separate entities.

A merged span's label is the label of the highest-scoring member span overlapping it; ties go to
the category earlier in :data:`dphub.labels.CATEGORY_PRECEDENCE` (names leak most), then to the
member listed first. Labels of category ``OTHER`` come last whatever their score: a tool that
gives no type (deid.pl's spans are all ``OTHER``) votes to hide, but a typed member's label says
better *what* is hidden (the tag and the surrogate). The merged score is the highest member score.
A span without a score (fixed/gold-like spans) counts as score 1.0: it comes
from a deterministic source. ``voters`` records which members flagged any of its characters; as a :class:`Span` they travel
comma-joined in ``source`` (the contract :mod:`dphub.render` reads).
"""

from __future__ import annotations

import difflib
import heapq
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from dphub.errors import ConfigError
from dphub.labels import CATEGORY_PRECEDENCE, category_of
from dphub.notes import Span


@dataclass(frozen=True)
class AggregateRule:
    """``any`` (k = 1), ``k-of-n:K``, or ``k-of-n:K+NAME[+NAME...]`` (NAME's flag counts alone)."""

    k: int = 1
    alone: tuple[str, ...] = ()
    #: the forward rules read no safe vocabulary (:mod:`dphub.ensemble.aggregation`)
    uses_safe_vocabulary: ClassVar[bool] = False
    #: the members' thresholds are what ``ensemble calibrate`` chooses (the rule has none)
    own_thresholds: ClassVar[bool] = False
    #: every span it hides carries a member's label (a student can learn from its output)
    typed_spans: ClassVar[bool] = True

    @classmethod
    def parse(cls, text: str) -> AggregateRule:
        head, *alone = (part.strip() for part in text.strip().split("+"))
        t = head.lower()
        shown = text if len(text) <= 80 else text[:60] + "..."  # one readable line
        usage = (f"aggregate rule {shown!r}: use 'any', 'k-of-n:K' with K >= 1, or "
                 "'k-of-n:K+NAME+...' (members whose flag counts alone)")
        if t == "any" and not alone:
            return cls(1)
        # K has at most 9 digits: no ensemble has more members, and int() refuses > 4,300 digits
        if re.fullmatch(r"k-of-n:\d{10,}", t):
            raise ConfigError(f"aggregate rule {shown!r}: K is larger than any ensemble")
        m = re.fullmatch(r"k-of-n:(\d{1,9})", t)
        if not m or int(m.group(1)) < 1 or not all(alone):
            raise ConfigError(usage)
        k = int(m.group(1))
        if alone and k < 2:
            raise ConfigError(f"aggregate rule {shown!r}: members counting alone need K >= 2 "
                              "(with K = 1 every member counts alone)")
        if len(set(alone)) != len(alone):
            raise ConfigError(f"aggregate rule {shown!r}: a member is named twice")
        return cls(k, tuple(alone))

    def check(self, names: Sequence[str]) -> None:
        """The rule fits an ensemble of these members, or a :class:`ConfigError` names the fix.

        Refused (issue 56): K larger than the ensemble; a named member that is not in it (with
        the closest names); and a quorum the members that do not count alone can never reach
        (``k-of-n:3+rules:default`` over two models): their votes could then never hide a
        character the named members had not hidden already, so the run silently equalled the
        named members alone (recall 75.2 where the owner's model alone had 94.2).
        """
        rule = str(self)
        if self.k > len(names):
            raise ConfigError(
                f"aggregate rule {rule} needs at least {self.k} members; the ensemble has "
                f"{len(names)} ({_listed(names)}): use k-of-n:{max(1, len(names))}"
                f"{''.join('+' + a for a in self.alone)} or fewer, or add members "
                "(`dphub ensemble add`)"
            )
        unknown = [a for a in self.alone if a not in names]
        if unknown:
            hints = []
            for a in unknown:
                close = difflib.get_close_matches(a, list(names), n=1, cutoff=0.5)
                hints.append(f"{a} (did you mean {close[0]}?)" if close else a)
            raise ConfigError(f"aggregate rule {rule}: no member named {', '.join(hints)}; the "
                              f"members are {_listed(names)} (see `dphub ensemble list`)")
        voters = [n for n in names if n not in self.alone]
        if self.alone and voters and len(voters) < self.k:
            n = len(voters)
            fix = (f"k-of-n:{n}{''.join('+' + a for a in self.alone)}" if n >= 2 else
                   "any (one vote then hides a character, as the named members' do)")
            raise ConfigError(
                f"aggregate rule {rule}: the {n} member{'s' if n != 1 else ''} that "
                f"{'do' if n != 1 else 'does'} not count alone ({_listed(voters)}) can never "
                f"reach {self.k} votes, so "
                f"{'they' if n != 1 else 'it'} would never hide anything and the result would "
                f"be {'+'.join(self.alone)}'s alone; use {fix}, or add members"
            )

    def weight(self, name: str) -> int:
        """Votes one flag of member ``name`` is worth: K for a member that counts alone, else 1."""
        return self.k if name in self.alone else 1

    def floor(self, own: object) -> None:
        """None: a forward rule reads each model member's flags at its own threshold."""
        return None

    def merge(self, text: str, member_spans: Mapping[str, Sequence[Span]], *,
              vocabulary: object = None, models: object = None) -> list[MergedSpan]:
        """One note's merged spans (the text, vocabulary and models are the inverse rule's)."""
        return aggregate(member_spans, self)

    def __str__(self) -> str:
        return "any" if self.k == 1 else "+".join((f"k-of-n:{self.k}", *self.alone))


@dataclass(frozen=True)
class MergedSpan:
    """An ensemble span: the chosen label, the best member score, and the members that voted."""

    start: int
    end: int
    label: str
    score: float
    voters: tuple[str, ...]

    def to_span(self) -> Span:
        return Span(self.start, self.end, self.label, score=self.score, source=",".join(self.voters))

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "label": self.label,
            "score": round(self.score, 6),
            # "members", the word the CLI and the API use (audit.jsonl said "voters" before
            # issue 56; readers accept both: see span_members)
            "members": list(self.voters),
        }


def span_members(record: Mapping[str, Any]) -> list[str]:
    """The members of an audit span record: ``members``, or ``voters`` in runs written before
    issue 56 (one name now, the old one still read)."""
    found = record.get("members")
    if found is None:
        found = record.get("voters")
    return [str(v) for v in found or ()]


def _listed(names: Sequence[str], most: int = 8) -> str:
    """Member names for a message, at most ``most`` of them."""
    shown = list(names[:most]) + ([f"... {len(names) - most} more"] if len(names) > most else [])
    return ", ".join(shown) or "none"


def _score(s: Span) -> float:
    return 1.0 if s.score is None else float(s.score)


_UNTYPED = CATEGORY_PRECEDENCE.index("OTHER")


def _precedence(label: str) -> int:
    return CATEGORY_PRECEDENCE.index(category_of(label))


def aggregate(
    member_spans: Mapping[str, Sequence[Span]],
    rule: AggregateRule | str = "any",
    *,
    thresholds: Mapping[str, float | None] | None = None,
) -> list[MergedSpan]:
    """Merge the spans of several members (name -> spans, in member order) over one note.

    ``thresholds`` drops a member's spans scoring below its threshold (for members whose spans
    carry scores but were produced without one, e.g. fixed spans in tests).
    """
    if isinstance(rule, str):
        rule = AggregateRule.parse(rule)
    names = list(member_spans)
    rule.check(names)
    order = {n: i for i, n in enumerate(names)}
    spans: list[tuple[str, Span]] = []
    for name in names:
        t = (thresholds or {}).get(name)
        for s in member_spans[name]:
            if s.end <= s.start or (t is not None and _score(s) < t):
                continue
            spans.append((name, s))
    if not spans:
        return []
    # votes per character: +1/-1 events per member over that member's merged coverage
    events: dict[int, int] = {}
    by_name: dict[str, list[tuple[int, int]]] = {n: [] for n in names}
    for n, s in spans:
        by_name[n].append((s.start, s.end))
    for name in names:
        own = sorted(by_name[name])
        merged: list[list[int]] = []
        for a, b in own:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        w = rule.weight(name)
        for a, b in merged:
            events[a] = events.get(a, 0) + w
            events[b] = events.get(b, 0) - w
    regions: list[tuple[int, int]] = []
    votes, start = 0, None
    for pos in sorted(events):
        votes += events[pos]
        if votes >= rule.k and start is None:
            start = pos
        elif votes < rule.k and start is not None:
            regions.append((start, pos))
            start = None
    # sweep the regions in order over the spans sorted by start; a heap keyed by end drops the
    # spans that ended before the current region (regions are disjoint and increasing), so each
    # span enters and leaves once: O(n log n) instead of scanning every span per region
    by_start = sorted(range(len(spans)), key=lambda i: spans[i][1].start)
    active: list[tuple[int, int]] = []  # (end, index into spans)
    nxt = 0
    out: list[MergedSpan] = []
    for ra, rb in regions:
        while nxt < len(by_start) and spans[by_start[nxt]][1].start < rb:
            i = by_start[nxt]
            heapq.heappush(active, (spans[i][1].end, i))
            nxt += 1
        while active and active[0][0] <= ra:
            heapq.heappop(active)
        # the input order breaks ties, as the stable sort over all spans used to
        inside = [spans[i] for i in sorted(
            (i for _, i in active),
            key=lambda i: (max(spans[i][1].start, ra), -spans[i][1].end, i),
        )]
        # components of strictly overlapping spans (clipped to the region)
        comps: list[list[Any]] = []  # [start, end, members]
        for n, s in inside:
            a, b = max(s.start, ra), min(s.end, rb)
            if comps and a < comps[-1][1]:
                comps[-1][1] = max(comps[-1][1], b)
                comps[-1][2].append((n, s))
            else:
                comps.append([a, b, [(n, s)]])
        for a, b, members in comps:
            # an untyped vote (OTHER: deid.pl gives no type) never names what a typed one names
            best_name, best = min(
                members,
                key=lambda ns: (_precedence(ns[1].label) == _UNTYPED, -_score(ns[1]),
                                _precedence(ns[1].label), order[ns[0]]),
            )
            voters = tuple(sorted({n for n, _ in members}, key=order.__getitem__))
            top = max(_score(s) for _, s in members)
            out.append(MergedSpan(a, b, best.label, top, voters))
    return out
