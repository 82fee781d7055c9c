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

Token-binary precision/recall (a token counts when any span overlaps it) cannot change under
snapping; entity-level (strict) scores and every rendered output can.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import replace

from dphub.notes import Span

#: a word: a run of letters/digits (kept identical to :data:`dphub.evaluate.TOKEN_RE`)
WORD_RE = re.compile(r"[^\W_]+")


def word_runs(text: str) -> tuple[list[int], list[int]]:
    """Start and end offsets of every letter/digit run of ``text`` (increasing, disjoint)."""
    starts: list[int] = []
    ends: list[int] = []
    for m in WORD_RE.finditer(text):
        starts.append(m.start())
        ends.append(m.end())
    return starts, ends


def _snap(start: int, end: int, starts: Sequence[int], ends: Sequence[int]) -> tuple[int, int]:
    """Extend ``[start, end)`` so that neither edge falls strictly inside a word."""
    # the word containing position `start` strictly inside it (run start < start < run end)
    i = bisect.bisect_right(starts, start) - 1
    if i >= 0 and starts[i] < start < ends[i]:
        start = starts[i]
    j = bisect.bisect_left(starts, end) - 1  # last run starting before `end`
    if j >= 0 and starts[j] < end < ends[j]:
        end = ends[j]
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
        a, b = _snap(s.start, s.end, starts, ends)
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
