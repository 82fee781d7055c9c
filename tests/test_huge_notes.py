"""One huge note (issue 31 #15): read in overlapping chunks, with progress and bounded memory.

A note longer than ``Ensemble.chunk_chars`` is cut at line boundaries into chunks that every
member reads one at a time (:mod:`dphub.ensemble.chunks`). Tests lower the chunk size so that a
note of a few hundred kB is cut many times in a few seconds.
"""

from __future__ import annotations

import io
import json
import re
import tracemalloc
from pathlib import Path

import pytest

from dphub.ensemble.chunks import CHUNK_CHARS, CHUNK_OVERLAP, chunk_bounds
from dphub.ensemble.core import Ensemble, Slot
from dphub.ensemble.members import FixedMember
from dphub.ensemble.peers import DeidPlMember, PresidioMember
from dphub.notes import Note, Span
from dphub.progress import ProgressReporter
from dphub.rules.engine import RuleMember
from dphub.runner import run_deid
from dphub.synth import iter_notes

SEP = "\n\n"


def _concatenated(n: int, seed: int = 3) -> tuple[list[Note], Note]:
    """``n`` synthetic notes and one note that is all of them, joined by a blank line."""
    notes = list(iter_notes(n, seed=seed))
    return notes, Note("huge", SEP.join(n.text for n in notes), "p1")


def _offsets(notes: list[Note]) -> list[int]:
    out, off = [], 0
    for n in notes:
        out.append(off)
        off += len(n.text) + len(SEP)
    return out


def _gold_member(notes: list[Note], big: Note) -> tuple[FixedMember, FixedMember]:
    """The notes' gold spans as a fixed member, per small note and for the huge note."""
    small = {n.id: n.spans for n in notes}
    huge = [Span(s.start + off, s.end + off, s.label) for n, off in zip(notes, _offsets(notes),
                                                                       strict=True)
            for s in n.spans]
    return FixedMember("gold", small), FixedMember("gold", {big.id: huge})


# ---------------------------------------------------------------------------- the cuts
def test_chunks_tile_the_note_cut_at_lines_with_overlap() -> None:
    lines = [f"line {i} " + "x" * (i % 37) for i in range(4000)]
    text = "\n".join(lines)
    chunks = chunk_bounds(text, 5000, 300)
    assert chunks[0].own_start == 0 and chunks[-1].own_end == len(text)
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert a.own_end == b.own_start  # own parts tile the note
        assert text[b.own_start - 1] == "\n"  # cut after a newline
        assert b.start <= b.own_start - 300  # context on both sides
        assert a.end >= min(len(text), a.own_end + 300)
        assert text[b.start - 1] == "\n"  # edges at lines too
        assert a.end == len(text) or text[a.end - 1] == "\n"
    assert all(c.own_end - c.own_start <= 5000 for c in chunks)
    # no newline: whitespace; no whitespace at all: a hard cut of the same size
    words = chunk_bounds("word " * 3000, 1000, 50)
    assert all(c.own_start % 5 == 0 for c in words)
    hard = chunk_bounds(";" * 10_000, 1000, 50)
    assert [c.own_start for c in hard] == list(range(0, 10_000, 1000))


def test_a_note_up_to_the_chunk_size_takes_the_one_pass_path(monkeypatch) -> None:
    """Below the threshold nothing changes: the spans are those of the one-pass path, and the
    chunker is never called (the default threshold is far above any real note)."""
    assert CHUNK_CHARS >= 65_536 and CHUNK_OVERLAP >= 1024
    notes, _ = _concatenated(40)
    ens = Ensemble([Slot(RuleMember())])
    want = ens._note_spans(notes)

    def boom(*a, **k):
        raise AssertionError("chunked")

    monkeypatch.setattr("dphub.ensemble.core.chunk_bounds", boom)
    assert ens.member_spans(notes) == want
    ens.chunk_chars = max(len(n.text) for n in notes)  # exactly the longest: still one pass
    got = ens.member_spans(notes)
    assert [{k: [(s.start, s.end, s.label, s.score, s.source) for s in v] for k, v in d.items()}
            for d in got] == \
        [{k: [(s.start, s.end, s.label, s.score, s.source) for s in v] for k, v in d.items()}
         for d in want]


# ---------------------------------------------------------------------------- the spans
@pytest.mark.parametrize("size,overlap", [(4_000, 300), (None, None)])
def test_a_huge_note_gives_the_union_of_its_notes_spans(size, overlap) -> None:
    """A huge note made of many synthetic notes: its spans (each member's and the merged ones)
    equal the union of each small note's spans, shifted to where the note sits. Rules at 0.7
    (the patterns: no note-wide state) and a fixed member with the gold spans."""
    notes, big = _concatenated(260)
    assert len(big.text) > (size or CHUNK_CHARS) * 2
    small_gold, huge_gold = _gold_member(notes, big)
    per = Ensemble([Slot(RuleMember(), threshold=0.7), Slot(small_gold)]).deid(notes)
    ens = Ensemble([Slot(RuleMember(), threshold=0.7), Slot(huge_gold)])
    if size:
        ens.chunk_chars, ens.chunk_overlap = size, overlap
    calls: list[tuple[int, int]] = []
    (got,) = ens.deid([big], on_chunk=lambda d, n: calls.append((d, n)))
    assert calls[0][0] == 0 and calls[-1][0] == calls[-1][1] > 2

    def shifted(res_spans, off):
        return [(s.start + off, s.end + off, s.label) for s in res_spans]

    want_merged = [t for r, off in zip(per, _offsets(notes), strict=True)
                   for t in shifted(r.spans, off)]
    assert [(s.start, s.end, s.label) for s in got.spans] == want_merged
    for name in ("rules:default", "gold"):
        want = [t for r, off in zip(per, _offsets(notes), strict=True)
                for t in shifted(r.by_member[name], off)]
        assert [(s.start, s.end, s.label) for s in got.by_member[name]] == want, name


def test_an_entity_across_a_cut_is_found_whole_and_once() -> None:
    """No whitespace at all (hard cuts every 1,000 characters): a phone number that straddles
    each cut is found whole, once; a fixed span across a cut comes back whole."""
    phone = "617-555-0199"
    parts, spans = [], []
    pos = 0
    for cut in range(1000, 20_000, 1000):
        filler = ";" * (cut - 5 - pos)
        parts.append(filler)
        pos += len(filler)
        parts.append(phone)
        spans.append((pos, pos + len(phone)))
        pos += len(phone)
    text = "".join(parts) + ";" * 500
    note = Note("n", text, "p")
    fixed = FixedMember("fixed", {"n": [Span(a, b, "PHONE") for a, b in spans]})
    ens = Ensemble([Slot(RuleMember()), Slot(fixed)])
    ens.chunk_chars, ens.chunk_overlap = 1000, 100
    assert len(chunk_bounds(text, 1000, 100)) > 10
    (res,) = ens.deid([note])
    assert [(s.start, s.end) for s in res.by_member["rules:default"]] == spans
    assert [(s.start, s.end) for s in res.by_member["fixed"]] == spans
    assert [(s.start, s.end, s.label) for s in res.spans] == [(a, b, "PHONE") for a, b in spans]


def test_same_label_spans_across_a_cut_are_joined() -> None:
    from dphub.ensemble.chunks import merge_chunk_spans

    got = merge_chunk_spans([(0, Span(10, 20, "NAME", 0.6)), (1, Span(15, 30, "NAME", 0.9)),
                             (1, Span(25, 28, "DATE", 0.5)), (1, Span(40, 45, "NAME", 0.7)),
                             (2, Span(40, 45, "NAME", 0.8))])
    assert [(s.start, s.end, s.label, s.score) for s in got] == [
        (10, 30, "NAME", 0.9), (25, 28, "DATE", 0.5), (40, 45, "NAME", 0.8)]


# ---------------------------------------------------------------------------- progress, memory
def test_a_run_over_one_huge_note_reports_its_chunks(tmp_path: Path) -> None:
    """The runner passes "chunk i of n" of a long note to ``chunk_progress`` (numbers only)."""
    _, big = _concatenated(120)
    src = tmp_path / "in"
    src.mkdir()
    (src / "big.txt").write_text(big.text, encoding="utf-8")
    (src / "small.txt").write_text("Seen by Dr. Smith on 03/14/2021.", encoding="utf-8")
    ens = Ensemble([Slot(RuleMember())])
    ens.chunk_chars, ens.chunk_overlap = 10_000, 500
    n = len(chunk_bounds(big.text, 10_000, 500))
    calls: list[tuple[int, int]] = []
    report = run_deid(src, tmp_path / "out", ens, chunk_progress=lambda d, t: calls.append((d, t)))
    assert report.done == 2 and not report.failed
    assert calls == [(i, n) for i in range(n + 1)]


def test_the_reporter_shows_a_long_note_and_stays_quiet_for_many_short_ones() -> None:
    t = [100.0]
    out = io.StringIO()
    rep = ProgressReporter(out, mode="plain", interval=30, percent=25, grace=0, clock=lambda: t[0],
                           start=100.0)
    cb = rep.count_callback("deid-chunks", "chunks", restart=True)
    for i in range(5):  # a note of 4 chunks, one a second
        t[0] += 1
        cb(i, 4)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("de-identifying a long note: 0/4 chunks")
    assert lines[-1].startswith("de-identifying a long note: 4/4 chunks (100%)")
    assert all(re.fullmatch(r"[\w -]+: \d+/\d+ chunks \(\d+%\), elapsed \w+, (ETA [\w?]+|done)", x)
               for x in lines)
    # then 20 notes of 2 chunks each within 20 s: no line per note
    before = len(lines)
    for _ in range(20):
        for i in range(3):
            t[0] += 0.3
            cb(i, 2)
    assert len(out.getvalue().splitlines()) - before <= 1
    for mode in ("off", "bar"):  # no phase kept when off; a bar task replaced per note
        with ProgressReporter(io.StringIO(), mode=mode) as other:
            cb = other.count_callback("deid-chunks", "chunks", restart=True)
            for total in (3, 2):
                for i in range(total + 1):
                    cb(i, total)


def test_memory_grows_with_the_chunk_not_the_note() -> None:
    """The members' working memory (``tracemalloc`` peak, beyond the note text) for a 150 kB
    note read in 8 kB chunks: about 1.2 MiB (a chunk's worth plus the note's spans); the
    one-pass path needed 11.5 MiB (≈ 75 bytes per character of the note)."""
    _, big = _concatenated(250)
    assert len(big.text) > 140_000
    ens = Ensemble([Slot(RuleMember())])
    ens.member_spans([Note("warm", "Seen by Dr. Smith on 03/14/2021.")])  # lists loaded
    ens.chunk_chars, ens.chunk_overlap = 8_000, 500
    tracemalloc.start()
    try:
        ens.deid([big])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * 2**20, peak


# ---------------------------------------------------------------------------- tool members
def test_deidpl_and_presidio_members_read_chunks(tmp_path: Path, monkeypatch) -> None:
    """deid.pl (a fake, see test_peer_members) gets one record per chunk, all of the note's
    patient, numbered 1..n; Presidio gets each chunk's text; both spans map back whole."""
    from test_peer_members import make_tool

    target = "Zoë Ngata"
    d, perl = make_tool(tmp_path, [target])
    log = tmp_path / "log.json"
    monkeypatch.setenv("FAKE_DEIDPL_LOG", str(log))
    lines = [f"Line {i}: seen by {target} today." if i % 7 == 0 else f"Line {i}: stable."
             for i in range(2000)]
    note = Note("n1", "\n".join(lines), "42")
    want = [(m.start(), m.end()) for m in re.finditer(target, note.text)]

    class Analyzer:
        def analyze(self, text: str, language: str, entities=None):
            from test_peer_members import FakeResult

            return [FakeResult("PERSON", m.start(), m.end(), 0.9)
                    for m in re.finditer(target, text)]

    seen: list[tuple[str, str | None]] = []
    real_tag = DeidPlMember.tag

    def tag(self, notes, threshold=None):
        seen.extend((n.id, n.patient_id) for n in notes)
        return real_tag(self, notes, threshold)

    monkeypatch.setattr(DeidPlMember, "tag", tag)
    ens = Ensemble([Slot(DeidPlMember("deidpl", d, perl=str(perl))),
                    Slot(PresidioMember("presidio", analyzer=Analyzer()))])
    ens.chunk_chars, ens.chunk_overlap = 5_000, 300
    n = len(chunk_bounds(note.text, 5_000, 300))
    (res,) = ens.deid([note])
    for name in ("deidpl", "presidio"):
        assert [(s.start, s.end) for s in res.by_member[name]] == want, name
    # one deid.pl run per chunk, each chunk with an id of its own and the note's patient (a
    # numeric patient id is kept, so the owner's PID lists still apply)
    assert len(seen) == len({i for i, _ in seen}) == n > 3
    assert {p for _, p in seen} == {"42"}
    assert json.loads(log.read_text())["headers"] == [["42", "1"]]


def test_a_model_member_reads_a_long_note_in_chunks(tiny_tagger_dir: Path) -> None:
    """A model member (its own windows inside each chunk) gives spans in the note's offsets:
    inside the note, sorted, no span twice; the chunks are reported."""
    from dphub.ensemble.core import owner_slot

    notes, big = _concatenated(40)
    ens = Ensemble([owner_slot(tiny_tagger_dir, threshold=0.0)])
    ens.chunk_chars, ens.chunk_overlap = 4_000, 600
    calls: list[tuple[int, int]] = []
    (res,) = ens.deid([big], on_chunk=lambda d, n: calls.append((d, n)))
    assert calls[-1][0] == calls[-1][1] == len(chunk_bounds(big.text, 4_000, 600)) > 3
    (spans,) = res.by_member.values()
    assert spans and all(0 <= s.start < s.end <= len(big.text) for s in spans)
    keys = [(s.start, s.end) for s in spans]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert all(big.text[s.start:s.end].strip() == big.text[s.start:s.end] for s in spans)
