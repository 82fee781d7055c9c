"""Why the inverse rule kept each word, and who hid each hidden span (issue 54 item 5).

The inverse rule (:mod:`dphub.ensemble.inverse`) hides every word unless something vouches for
it. Each way a word comes back is a *release path* with a stable name (:class:`ReleasePath`);
``--mode spans`` lists the path of every kept word, ``audit.jsonl`` counts them per note (offsets
and names only, never text), and every hidden span names what hid it (the members that flagged
it, and ``inverse`` when the rule hid a word no member flagged).

The paths are read off the same :class:`~dphub.ensemble.inverse.WordTable` columns the decision
uses (:meth:`~dphub.ensemble.inverse.WordTable.release_paths`), in the order below; a kept word
that no path accounts for is named :data:`UNEXPLAINED`, and :func:`unexplained` reports it, so a
release added to the rule without a name here cannot pass unnoticed. docs/recall_first.md gives
each path with its threshold.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dphub.ensemble.words import WORD_RE


class ReleasePath(StrEnum):
    """How a kept word came back (the stable names written to ``--mode spans`` and the audit).

    The first eight are vouched words (P < HIGH; < NAMED with a sign of a name); the others
    are what a model member's confidence lets back.
    """

    #: a safe word: in the safe vocabulary (shipped, or a site's ``--safe-words``)
    VOCABULARY = "vocabulary"
    #: a letter of clinical shorthand (``s/p``, ``w/``)
    SHORTHAND = "shorthand"
    #: a context word (``good``, ``will``) its neighbours show to be no name
    CONTEXT = "context"
    #: a shape no name has (``S:`` heading a line, ``r arm``, ``w/pt``, ``K+``, ``80's``)
    SHAPE = "shape"
    #: the end of a contraction or possessive of a safe word (``pt's``)
    CLITIC = "clitic"
    #: a one-letter value name right before a released measurement (``T 37.2``)
    VALUE_KEY = "value_key"
    #: a number inside a measurement context (``5 mg``, ``BP 120/80``)
    MEASUREMENT = "measurement"
    #: a site-local safe word a reviewer rejected, under its guard (``--safe-words`` site file)
    SITE_WORD = "site_word"
    #: a word outside the vocabulary, in lower case, no sign of a name, P < LOW
    UNKNOWN_LOWER = "unknown_lower"
    #: a context word written as words are, nothing else signing it, P < min(NAMED, HIGH)
    CONTEXT_WORD = "context_word"
    #: a word in capitals in a line of capitals, P < min(LOW, NAMED)
    CAPITALS = "capitals"
    #: a closed-class word (``the``, ``his``) with SURE given, whatever P
    CLOSED_CLASS = "closed_class"
    #: any word no shape refuses, P < SURE
    SURE = "sure"


#: the name of a kept word no path accounts for (a bug: :func:`unexplained` reports it)
UNEXPLAINED = "unexplained"
#: what a hidden span names when the rule hid a word of it that no member flagged
RULE_HIDER = "inverse"

#: the vouching sources of the word table's ``vouch`` column, by code (index)
VOUCHES: tuple[ReleasePath, ...] = (
    ReleasePath.VOCABULARY, ReleasePath.SHORTHAND, ReleasePath.CONTEXT, ReleasePath.SHAPE,
    ReleasePath.CLITIC, ReleasePath.VALUE_KEY, ReleasePath.MEASUREMENT, ReleasePath.SITE_WORD)
#: every path by code (the ``release_paths`` array's values; -1: hidden, -2: unexplained)
PATHS: tuple[ReleasePath, ...] = (*VOUCHES, ReleasePath.CONTEXT_WORD,
                                  ReleasePath.UNKNOWN_LOWER, ReleasePath.CAPITALS,
                                  ReleasePath.CLOSED_CLASS, ReleasePath.SURE)
CODE = {p: i for i, p in enumerate(PATHS)}
HIDDEN_CODE = -1
UNEXPLAINED_CODE = -2


@dataclass(frozen=True)
class Explanation:
    """One note under the inverse rule: each kept word with its path, each word the rule hid
    that no member flagged (offsets only)."""

    kept: tuple[tuple[int, int, str], ...]
    rule_hidden: tuple[tuple[int, int], ...]

    def counts(self) -> dict[str, int]:
        """Kept words per path (the audit's compact form), paths in :data:`PATHS` order."""
        c = Counter(p for _, _, p in self.kept)
        return {p: c[p] for p in [*PATHS, UNEXPLAINED] if c[p]}

    def hidden_by(self, start: int, end: int, members: Iterable[str]) -> list[str]:
        """What hid the span ``[start, end)``: its members, and :data:`RULE_HIDER` when a word
        in it was hidden by the rule alone."""
        out = list(members)
        if any(a < end and start < b for a, b in self.rule_hidden):
            out.append(RULE_HIDER)
        return out

    def to_wire(self) -> list[Any]:
        """A JSON form (the Ray engine carries it between processes)."""
        return [[list(k) for k in self.kept], [list(h) for h in self.rule_hidden]]

    @classmethod
    def from_wire(cls, data: Sequence[Any]) -> Explanation:
        kept, hidden = data
        return cls(tuple((int(a), int(b), str(p)) for a, b, p in kept),
                   tuple((int(a), int(b)) for a, b in hidden))


def unexplained(text: str, hidden: Sequence[tuple[int, int]],
                kept: Sequence[Sequence[Any]]) -> list[tuple[int, int]]:
    """Words of ``text`` that are neither inside a hidden span nor kept with a named path
    (offsets only): what an audit of an inverse run must never hold.

    ``hidden``: the run's spans ``(start, end)``; ``kept``: its ``[start, end, path]`` rows.
    """
    names = {p.value for p in PATHS}
    named = {(int(a), int(b)) for a, b, p in kept if p in names}
    out = []
    for m in WORD_RE.finditer(text):
        a, b = m.start(), m.end()
        if (a, b) in named or any(s <= a and b <= e for s, e in hidden):
            continue
        out.append((a, b))
    return out
