"""Whole-word spans: a member's flag never cuts a word in two.

Why: model members tag word pieces (``MRN`` -> ``mr`` ``##n``), so a flag on one piece used to
come out as ``MR[**ID**]``, an ``EMAILED`` that lost its ending to a CONTACT tag, or a surrogate
that rewrote half a word. Rendering part of a word as PHI is wrong both ways: the visible part can
still identify, and the output is garbled. So every member's spans are snapped to whole words
before aggregation and rendering (:meth:`dphub.ensemble.core.Ensemble.member_spans` is the one
place that calls :func:`snap_to_words`).

A *word* is a run of letters/digits (``[^\\W_]+``, the same tokens as the token-binary metric of
:mod:`dphub.evaluate`). Snapping only ever *extends* a span outward to the word boundaries where a
run continues across the span edge; it never shrinks a span (a flag is a vote to hide, and
shrinking could uncover PHI). Spans that then overlap merge into one; the merged span keeps the
label of the part that covered the most characters before snapping (ties: higher score, then the
earlier span), so a one-letter piece does not relabel the word it was attached to. Spans that only
touch stay separate (they meet at a word boundary, never inside a word).

A clock time counts as one word (``08:40``, ``8:40:15``): a model that flags a date and the hour
after it ("03/14/2026 08") used to leave ``[**DATE**]:40``; the span now covers the whole time.

Token-binary precision/recall (a token counts when any span overlaps it) cannot change under
snapping, but for the minutes of such a time; entity-level (strict) scores and every rendered output can.

:func:`trim_spans` then cuts what is not the entity from the edges of each span: whitespace and
punctuation ("Dr. Smith" flagged from the period came out as ``Dr[**NAME**]``; "31-year-old" with
its hyphen as ``[**AGE**]year-old``), the age words after the number of an AGE span
("31-year-old" flagged whole keeps "-year-old"; "64yo" is one word and stays whole), and a title
before the name of a NAME span ("Dr. Smith" flagged whole keeps "Dr. "). Brackets stay when their
partner is inside the span ("(617) 555-0143"), as does the apostrophe of a two-digit year
("'88"). Trimming only ever uncovers characters that are no letter or digit, age words or titles,
so token-binary scores of other words are unchanged by it as well.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import replace

from dphub.labels import category_of, is_known
from dphub.notes import Span

#: a word: a run of letters/digits (kept identical to :data:`dphub.evaluate.TOKEN_RE`)
WORD_RE = re.compile(r"[^\W_]+")
#: a run of letters only (the letter parts of ``s/p``, ``CABGx2``)
LETTER_RUN = re.compile(r"[^\W\d_]+")
#: the apostrophes of contractions and possessives (``pt's``, ``don’t``, ``80's``), read as the
#: vocabulary reads words (a fullwidth one is one)
APOSTROPHES = frozenset("'\u2019\u2018\u02bc`\u00b4")


def joined_by_apostrophe(text: str, before: re.Match[str], word: re.Match[str]) -> bool:
    """Whether ``word`` follows ``before`` across one apostrophe and nothing else (``pt's``)."""
    if before.end() + 1 != word.start():
        return False
    c = text[before.end()]
    return c in APOSTROPHES or unicodedata.normalize("NFKC", c) in APOSTROPHES


def word_runs(text: str) -> tuple[list[int], list[int]]:
    """Start and end offsets of every letter/digit run of ``text`` (increasing, disjoint)."""
    starts: list[int] = []
    ends: list[int] = []
    for m in WORD_RE.finditer(text):
        starts.append(m.start())
        ends.append(m.end())
    return starts, ends


#: a clock time, snapped as one word
_CLOCK = re.compile(r"(?<![\d:])\d{1,2}:\d{2}(?::\d{2})?(?![\d:])")


def _clock_around(text: str, pos: int) -> tuple[int, int] | None:
    """The clock time that ``pos`` falls strictly inside, if any (looks only near ``pos``)."""
    if not (0 < pos < len(text)) or not (text[pos - 1] in ":0123456789" and text[pos] in
                                          ":0123456789"):
        return None
    lo = max(0, pos - 9)
    for m in _CLOCK.finditer(text, lo, min(len(text), pos + 9)):
        if m.start() < pos < m.end():
            # the window's end cut the text: accept the match only if it is whole in the text
            whole = _CLOCK.match(text, m.start())
            return (m.start(), whole.end()) if whole else None
    return None


def _snap(start: int, end: int, starts: Sequence[int], ends: Sequence[int],
          text: str | None = None) -> tuple[int, int]:
    """Extend ``[start, end)`` so that neither edge falls strictly inside a word (or, with
    ``text``, a clock time)."""
    # the word containing position `start` strictly inside it (run start < start < run end)
    i = bisect.bisect_right(starts, start) - 1
    if i >= 0 and starts[i] < start < ends[i]:
        start = starts[i]
    j = bisect.bisect_left(starts, end) - 1  # last run starting before `end`
    if j >= 0 and starts[j] < end < ends[j]:
        end = ends[j]
    if text is not None:
        clock = _clock_around(text, start)
        if clock is not None:
            start = clock[0]
        clock = _clock_around(text, end)
        if clock is not None:
            end = clock[1]
    return start, end


def snap_to_words(
    text: str, spans: Sequence[Span], runs: tuple[list[int], list[int]] | None = None
) -> list[Span]:
    """``spans`` extended to whole words, overlaps merged; sorted by offsets.

    ``runs`` (from :func:`word_runs`) may be passed when several members' spans of one note are
    snapped, so the note is scanned once. Empty or out-of-range spans are returned unchanged
    (validation is the renderer's job, and its error names offsets only).
    """
    if not spans:
        return []
    starts, ends = runs if runs is not None else word_runs(text)
    n = len(text)
    snapped: list[tuple[int, int, Span]] = []
    invalid: list[Span] = []
    for s in spans:
        if not (0 <= s.start < s.end <= n):
            invalid.append(s)
            continue
        a, b = _snap(s.start, s.end, starts, ends, text)
        snapped.append((a, b, s))
    snapped.sort(key=lambda t: (t[0], -t[1]))
    out: list[Span] = []
    group: list[tuple[int, int, Span]] = []
    group_end = -1

    def flush() -> None:
        if not group:
            return
        a = group[0][0]
        b = max(t[1] for t in group)
        if len(group) == 1:
            s = group[0][2]
            out.append(s if (s.start, s.end) == (a, b) else replace(s, start=a, end=b))
            return
        # label of the largest original part; ties to the higher score, then the earlier span
        best = min(
            range(len(group)),
            key=lambda k: (-(group[k][2].end - group[k][2].start),
                           -(1.0 if group[k][2].score is None else group[k][2].score), k),
        )
        scores = [t[2].score for t in group if t[2].score is not None]
        out.append(replace(group[best][2], start=a, end=b,
                           score=max(scores) if scores else None))

    for t in snapped:
        if group and t[0] < group_end:  # strict overlap: merge
            group.append(t)
            group_end = max(group_end, t[1])
        else:
            flush()
            group = [t]
            group_end = t[1]
    flush()
    return out + invalid


#: age words after the number of an AGE span: "31-year-old", "31 yo", "6 month old", "72 y/o"
_AGE_WORDS = re.compile(
    r"(?:[\s-]*(?:years?|yrs?|y/?o|y\.o|yo[mf]|old|months?|mos?|weeks?|wks?|days?)\b\.?)+[\s.-]*$",
    re.IGNORECASE,
)
#: a title before a name ("Dr. Smith" flagged whole): not part of the name
_TITLE = re.compile(r"(?:dr|doctor|mr|mrs|ms|miss|mx|prof|professor)\b\.?[\s.]*", re.IGNORECASE)
_OPENERS = {"(": ")", "[": "]", "{": "}", "<": ">", "\u201c": "\u201d", "\u2018": "\u2019",
            "\u00ab": "\u00bb"}
_CLOSERS = {v: k for k, v in _OPENERS.items()}


def _edge(c: str) -> bool:
    """Whitespace or punctuation (not symbols: ``>89`` and ``+1 617`` keep theirs)."""
    return c.isspace() or unicodedata.category(c)[0] == "P"


def trim_spans(text: str, spans: Sequence[Span]) -> list[Span]:
    """``spans`` without whitespace and punctuation at their edges (an AGE span without the
    age words after its number, a NAME span without a title before the name); spans left with
    nothing are dropped. Invalid spans are kept
    as they are (the renderer reports them)."""
    out: list[Span] = []
    n = len(text)
    categories: dict[str, str | None] = {}
    for s in spans:
        if not (0 <= s.start < s.end <= n):
            out.append(s)
            continue
        a, b = s.start, s.end
        if s.label not in categories:
            categories[s.label] = category_of(s.label) if is_known(s.label) else None
        category = categories[s.label]
        if category == "AGE":
            m = _AGE_WORDS.search(text, a, b)
            # whole words only: "64yo" is one word and stays whole
            while (m is not None and m.start() > a and text[m.start() - 1].isalnum()
                   and text[m.start()].isalnum()):
                m = _AGE_WORDS.search(text, m.start() + 1, b)
            if m is not None and m.start() > a and any(c.isdigit() for c in text[a:m.start()]):
                b = m.start()
        while a < b and _edge(text[a]):
            c = text[a]
            if (c in _OPENERS and _OPENERS[c] in text[a + 1 : b]) or (
                    c in "'\u2019" and a + 1 < b and text[a + 1].isdigit()):
                break
            a += 1
        if category == "NAME":
            m = _TITLE.match(text, a, b)
            if m is not None and m.end() < b and (a == 0 or not text[a - 1].isalnum()):
                a = m.end()
        while b > a and _edge(text[b - 1]):
            c = text[b - 1]
            if c in _CLOSERS and _CLOSERS[c] in text[a : b - 1]:
                break
            b -= 1
        if b > a:
            out.append(s if (a, b) == (s.start, s.end) else replace(s, start=a, end=b))
    return out
