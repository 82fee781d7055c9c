"""One huge note read in overlapping chunks, so that time shows progress and memory stays bounded.

Why: a member's working memory grows with the text it reads (normalisation offset maps, word
runs, rule tokens, a model's windows): one 50 MB note (a concatenated export) took 10 minutes
and 4.3 GiB with the rules alone and printed nothing until it was done (issue 31 #15). A note
longer than :data:`CHUNK_CHARS` is therefore cut into chunks that every member reads one at a
time (:meth:`dphub.ensemble.core.Ensemble.member_spans`); peak memory then grows with the chunk,
not the note, beyond the note's text and its spans, and a progress callback hears "chunk i of n".

How a chunk keeps every entity whole: the note is cut into consecutive *own* parts at line
boundaries (else whitespace, else a hard cut), and each chunk gives the members its own part
plus :data:`CHUNK_OVERLAP` characters of context on each side (edges again at line boundaries).
A member's span is kept from the one chunk whose own part holds the span's first character, so
a span found in two chunks is counted once, and an entity that crosses a cut is taken from the
chunk that sees it whole, with at least the overlap's context before and after it. Where two
kept spans of one member and one label still overlap across a cut they are joined (their union),
as the aggregation would join their characters anyway.

Notes up to :data:`CHUNK_CHARS` characters never come here: their output is what it always was.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from dphub.notes import Note, Span

#: Notes longer than this many characters are read in chunks of about this size. 64 Ki
#: characters: well above any real clinical note (a few kB; the longest discharge summaries are
#: tens of kB), so ordinary notes keep the one-pass path and its outputs, while one chunk costs
#: the rules about a second and a few MiB, so a huge note reports progress every few seconds.
CHUNK_CHARS = 65_536

#: Characters of context on each side of a chunk's own part. The rules look at most a few words
#: (tens of characters, within a line or two) around a match, and a model's window is at most
#: 512 word pieces (about 2,000 characters) with its own stride inside it: 2 Ki characters cover
#: both, so an entity near a cut is read with the same context as in the whole note. Entities
#: longer than this are not expected (the longest are addresses and URLs).
CHUNK_OVERLAP = 2_048

#: Metadata key of a chunk's :class:`~dphub.notes.Note`: ``{"id": note id, "start": offset of
#: the chunk in the note}``, for members that answer per note id (``FixedMember``).
CHUNK_OF = "dphub.chunk_of"


@dataclass(frozen=True)
class Chunk:
    """``[start, end)`` is the text the members read; spans starting in ``[own_start, own_end)``
    are kept from this chunk."""

    start: int
    end: int
    own_start: int
    own_end: int


def _combining(c: str) -> bool:
    return unicodedata.combining(c) != 0 or unicodedata.category(c) in ("Mn", "Me", "Cf")


def _cut_back(text: str, target: int, floor: int) -> int:
    """A cut position in ``(floor, target]``: after the last newline, else after the last
    whitespace, else ``target`` itself (moved back off a combining mark when it can)."""
    if target <= 0:
        return 0
    i = text.rfind("\n", floor, target)
    if i >= 0:
        return i + 1
    for j in range(target - 1, floor - 1, -1):
        if text[j].isspace():
            return j + 1
    cut = target
    while cut > floor + 1 and _combining(text[cut]):
        cut -= 1
    return cut


def _cut_forward(text: str, target: int, ceiling: int) -> int:
    """A cut position in ``[target, ceiling]``: after the first newline at or after ``target``,
    else after the first whitespace, else ``target``."""
    n = len(text)
    if target >= n:
        return n
    ceiling = min(ceiling, n)
    i = text.find("\n", target, ceiling)
    if i >= 0:
        return i + 1
    for j in range(target, ceiling):
        if text[j].isspace():
            return j + 1
    return target


def chunk_bounds(text: str, size: int = CHUNK_CHARS, overlap: int = CHUNK_OVERLAP
                 ) -> list[Chunk]:
    """The chunks of ``text``: own parts of about ``size`` characters that tile it, each read
    with ``overlap`` characters of context on each side (see the module's docstring)."""
    if size < 1 or overlap < 0:
        raise ValueError("chunk size must be >= 1 and overlap >= 0")
    n = len(text)
    cuts = [0]
    while n - cuts[-1] > size:
        target = cuts[-1] + size
        cut = _cut_back(text, target, max(cuts[-1], target - size // 4))
        cuts.append(cut if cut > cuts[-1] else target)
    cuts.append(n)
    slack = max(overlap, 64)
    out = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        start = 0 if a - overlap <= 0 else _cut_back(text, a - overlap,
                                                     max(0, a - overlap - slack))
        end = n if b + overlap >= n else _cut_forward(text, b + overlap, b + overlap + slack)
        out.append(Chunk(start, end, a, b))
    return out


def chunk_note(note: Note, chunk: Chunk, index: int) -> Note:
    """The note members read for ``chunk``: its text, the note's patient (deid.pl remembers a
    patient's names across their notes), an id of its own, and no gold spans."""
    return Note(f"{note.id}#chunk{index}", note.text[chunk.start:chunk.end],
                note.effective_patient_id,
                metadata={CHUNK_OF: {"id": note.id, "start": chunk.start, "end": chunk.end}})


def merge_chunk_spans(found: list[tuple[int, Span]]) -> list[Span]:
    """One member's kept spans of all chunks (``(chunk index, span)`` in note offsets) -> its
    spans of the note: same-label spans of different chunks that overlap become their union
    (highest score); anything else is kept as the member gave it."""
    found = sorted(found, key=lambda cs: (cs[1].start, cs[1].end, cs[0]))
    out: list[Span] = []
    chunk_of: list[int] = []
    for k, s in found:
        if out and chunk_of[-1] != k and s.label == out[-1].label and s.start < out[-1].end:
            last = out[-1]
            score = last.score if s.score is None else (
                s.score if last.score is None else max(last.score, s.score))
            out[-1] = Span(last.start, max(last.end, s.end), last.label, score=score,
                           source=last.source)
            continue
        out.append(s)
        chunk_of.append(k)
    return out
