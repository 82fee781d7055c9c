"""Whole-word spans (issue 14.3): a flagged word piece flags its word, in every output mode."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dphub import synth
from dphub.ensemble.core import Ensemble, Slot
from dphub.ensemble.members import FixedMember
from dphub.ensemble.words import WORD_RE, snap_to_words, trim_spans
from dphub.notes import Note, Span
from dphub.runner import run_deid

KEY = b"0123456789abcdef-words-test-key"
LABELS = ("NAME", "DATE", "ID", "CONTACT", "LOCATION", "AGE")
NOTES = synth.generate(12, kind="nursing", seed=5) + synth.generate(6, kind="discharge", seed=5)


def _inside_word(text: str, pos: int) -> bool:
    """Is ``pos`` a boundary strictly inside a letter/digit run?"""
    return 0 < pos < len(text) and text[pos - 1].isalnum() and text[pos].isalnum()


def _cuts(text: str, spans: list[Span]) -> list[tuple[int, int]]:
    return [(s.start, s.end) for s in spans
            if _inside_word(text, s.start) or _inside_word(text, s.end)]


# ---------------------------------------------------------------------------- unit
def test_word_piece_flags_its_word() -> None:
    text = "MRN 1410221 EMAILED"
    # the model flagged the piece ##n of MRN, the number, and EMAIL without its ending
    got = snap_to_words(text, [Span(2, 3, "ID", 0.6, "m"), Span(4, 11, "ID", 0.9, "m"),
                               Span(12, 17, "CONTACT", 0.7, "m")])
    assert [(s.start, s.end, s.label) for s in got] == [(0, 3, "ID"), (4, 11, "ID"),
                                                        (12, 19, "CONTACT")]
    assert got[0].source == "m" and got[0].score == 0.6


def test_never_shrinks_and_merges_with_the_label_of_the_larger_part() -> None:
    text = "Smithfield7 clinic"
    # a long NAME part and a one-digit ID piece of the same word end up as one span, NAME
    got = snap_to_words(text, [Span(0, 10, "NAME", 0.5), Span(10, 11, "ID", 0.9)])
    assert [(s.start, s.end, s.label, s.score) for s in got] == [(0, 11, "NAME", 0.9)]
    # spans covering whole words (or non-word characters) are unchanged
    same = [Span(0, 11, "NAME"), Span(11, 12, "OTHER"), Span(12, 18, "LOCATION")]
    assert snap_to_words(text, same) == same


def test_touching_spans_stay_separate_and_bad_spans_are_left_for_validation() -> None:
    text = "Ann-Lee 03/04"
    got = snap_to_words(text, [Span(0, 3, "NAME"), Span(3, 7, "NAME"), Span(9, 10, "DATE"),
                               Span(20, 25, "DATE")])
    assert [(s.start, s.end) for s in got] == [(0, 3), (3, 7), (8, 10), (20, 25)]


# ---------------------------------------------------------------------------- property
@st.composite
def note_and_spans(draw: st.DrawFn) -> tuple[Note, list[Span]]:
    note = draw(st.sampled_from(NOTES))
    n = len(note.text)
    spans = []
    for _ in range(draw(st.integers(0, 25))):
        a = draw(st.integers(0, n - 1))
        b = draw(st.integers(a + 1, min(n, a + 40)))
        spans.append(Span(a, b, draw(st.sampled_from(LABELS)), draw(st.floats(0, 1))))
    return note, spans


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(note_and_spans())
def test_snapped_spans_never_cut_a_word_and_never_uncover(case: tuple[Note, list[Span]]) -> None:
    note, spans = case
    text = note.text
    got = snap_to_words(text, spans)
    assert not _cuts(text, got)
    covered = set()
    for s in got:
        covered.update(range(s.start, s.end))
    for s in spans:  # never shrunk: every flagged character stays flagged
        assert covered.issuperset(range(s.start, s.end))
    for a, b in zip(got, got[1:], strict=False):  # overlaps merged
        assert a.end <= b.start
    # token-binary scores (a token counts when any span overlaps it) cannot change, except that
    # a span ending (or starting) inside a clock time covers the whole time (issue 31.18)
    from dphub.evaluate import evaluate_spans

    clocks = [m.span() for m in re.finditer(r"\d{1,2}:\d{2}(?::\d{2})?", text)]
    if not any(a < p < b for s in spans for p in (s.start, s.end) for a, b in clocks):
        gold = Note(note.id, text, spans=list(note.spans), labelled=True)
        before = evaluate_spans([gold], {note.id: spans}).headline()
        after = evaluate_spans([gold], {note.id: got}).headline()
        assert (before["precision"], before["recall"]) == (after["precision"], after["recall"])
    # extended only as far as the words the spans touched
    words = {m.span() for m in WORD_RE.finditer(text)}
    for s in got:
        assert s.start in {s0.start for s0 in spans} or any(w[0] == s.start for w in words)
        assert s.end in {s0.end for s0 in spans} or any(w[1] == s.end for w in words)


# ---------------------------------------------------------------------------- end to end
def _piece_spans(note: Note) -> list[Span]:
    """Word-piece-like predictions: every gold span cut inside its first and last word, plus a
    piece at the end of an ordinary word (the ``##n`` of ``MRN``)."""
    out = []
    for k, s in enumerate(note.spans):
        words = [m.span() for m in WORD_RE.finditer(note.text, s.start, s.end)]
        if not words:
            continue
        a = words[0][0] + (1 if words[0][1] - words[0][0] > 1 else 0)
        b = words[-1][1] - (1 if words[-1][1] - words[-1][0] > 1 and k % 2 else 0)
        if a < b:
            out.append(Span(a, b, s.label, 0.8))
    return out


def _cases() -> list[Note]:
    mrn = Note("mrn", "Seen today. MRN 1410221, EMAILED pharmacy.\n", "p-mrn")
    notes = [Note(n.id, n.text, n.patient_id) for n in NOTES[:8]] + [mrn]
    return notes


@pytest.fixture(scope="module")
def piece_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Note], Ensemble]:
    notes = _cases()
    preds = {n.id: _piece_spans(g) for n, g in zip(notes, NOTES[:8], strict=False)}
    preds["mrn"] = [Span(14, 15, "ID", 0.6), Span(16, 23, "ID", 0.9), Span(25, 30, "CONTACT", 0.7)]
    # a second member that cuts other words, so the aggregate sees both
    other = {n.id: [Span(s.start, s.end - 1, s.label, 0.5) for s in preds[n.id] if s.end - s.start > 2]
             for n in notes}
    ens = Ensemble([Slot(FixedMember("pieces", preds)), Slot(FixedMember("other", other))])
    src = tmp_path_factory.mktemp("words-in") / "notes"
    src.mkdir()
    for n in notes:
        (src / f"{n.id}.txt").write_text(n.text, encoding="utf-8")
    return src, notes, ens


def _run(piece_run: tuple[Path, list[Note], Ensemble], tmp_path: Path, mode: str,
         **render_options: str) -> tuple[Path, list[Note]]:
    src, notes, ens = piece_run
    out = tmp_path / mode
    rep = run_deid(src, out, ens, mode=mode, key=KEY if mode == "surrogate" else None,
                   render_options=render_options or None)
    assert rep.exit_code == 0
    return out, notes


@pytest.mark.parametrize("mode,marker", [("tag", r"\[\*\*[A-Z]+\*\*\]"),
                                         ("redact", r"\[REDACTED\]")])
def test_replacing_modes_never_cut_a_word(piece_run: tuple[Path, list[Note], Ensemble],
                                          tmp_path: Path, mode: str, marker: str) -> None:
    opts = {"mask": "[REDACTED]"} if mode == "redact" else {}
    out, notes = _run(piece_run, tmp_path, mode, **opts)
    for n in notes:
        rendered = (out / f"{n.id}.txt").read_text(encoding="utf-8")
        assert re.search(marker, rendered)
        # a replacement glued to a letter/digit is a cut word
        assert not re.search(rf"[^\W_](?:{marker})|(?:{marker})[^\W_]", rendered), n.id
    mrn = (out / "mrn.txt").read_text(encoding="utf-8")
    assert "MR" not in mrn and "EMAIL" not in mrn


def test_spans_and_brat_modes_never_cut_a_word(piece_run: tuple[Path, list[Note], Ensemble],
                                               tmp_path: Path) -> None:
    out, notes = _run(piece_run, tmp_path, "spans")
    out_b, _ = _run(piece_run, tmp_path, "brat")
    for n in notes:
        rec = json.loads((out / f"{n.id}.jsonl").read_text(encoding="utf-8"))
        spans = [Span(s["start"], s["end"], s["label"]) for s in rec["spans"]]
        assert spans and not _cuts(n.text, spans), n.id
        ann = (out_b / f"{n.id}.ann").read_text(encoding="utf-8").splitlines()
        brat = [Span(int(a), int(b), lab) for lab, a, b in
                (line.split("\t")[1].split() for line in ann)]
        assert brat and not _cuts(n.text, brat), n.id


def test_surrogate_mode_replaces_whole_words(piece_run: tuple[Path, list[Note], Ensemble],
                                             tmp_path: Path) -> None:
    out, notes = _run(piece_run, tmp_path, "surrogate")
    out_s, _ = _run(piece_run, tmp_path, "spans")
    for n in notes:
        rendered = (out / f"{n.id}.txt").read_text(encoding="utf-8")
        merged = json.loads((out_s / f"{n.id}.jsonl").read_text(encoding="utf-8"))["spans"]
        # the text outside the spans survives verbatim, so each replacement sits between
        # non-word characters of the original: no word is half original, half surrogate
        kept, pos = [], 0
        for s in merged:
            kept.append(n.text[pos:s["start"]])
            pos = s["end"]
        kept.append(n.text[pos:])
        for seg_left, seg_right in zip(kept, kept[1:], strict=False):
            assert not seg_left or not seg_left[-1].isalnum()
            assert not seg_right or not seg_right[0].isalnum()
        pattern = "(.+?)".join(re.escape(k) for k in kept)
        assert re.fullmatch(pattern, rendered, re.DOTALL), n.id
    mrn = (out / "mrn.txt").read_text(encoding="utf-8")
    assert mrn.startswith("Seen today. ") and not re.match(r"Seen today\. MR[^N]", mrn)
    assert not re.search(r"EMAIL[^E]", mrn)


# ---------------------------------------------------------------------------- trimming (31.18)
def _tag(text: str, spans: list[Span]) -> str:
    from dphub.render import render

    note = Note("t", text)
    ens = Ensemble([Slot(FixedMember("m", {"t": spans}))])
    return render(note, ens.deid([note])[0].spans, "tag")


def test_a_title_keeps_its_period_and_space() -> None:
    text = "Seen by Dr. Smith and MR. JONES."
    # a model flagged the title's period and the space with the name
    assert _tag(text, [Span(10, 17, "DOCTOR", 0.9), Span(24, 31, "NAME", 0.9)]) == (
        "Seen by Dr. [**NAME**] and MR. [**NAME**].")
    # or the title with the name: the title is no part of it
    assert _tag(text, [Span(8, 17, "DOCTOR", 0.9), Span(22, 31, "PATIENT", 0.9)]) == (
        "Seen by Dr. [**NAME**] and MR. [**NAME**].")
    # a title alone, or a word that only starts like one, is left as flagged
    assert _tag("Drake Mrsic", [Span(0, 5, "NAME", 0.9), Span(6, 11, "NAME", 0.9)]) == (
        "[**NAME**] [**NAME**]")


def test_a_hyphenated_age_keeps_its_words() -> None:
    text = "A 31-year-old man, a 6 month old, 64yo F"
    # "31-" flagged with its hyphen, "31-year-old" flagged whole, "6 month old" whole, "64yo"
    for spans in ([Span(2, 5, "AGE", 0.9)], [Span(2, 13, "AGE", 0.9)], [Span(2, 10, "AGE", 0.9)]):
        assert _tag(text, spans).startswith("A [**AGE**]-year-old man,")
    assert _tag(text, [Span(21, 32, "AGE", 0.9)]) == "A 31-year-old man, a [**AGE**] month old, 64yo F"
    # "64yo" is one word: it stays whole rather than being cut into [**AGE**]yo
    assert _tag(text, [Span(34, 36, "AGE", 0.9)]).endswith(", [**AGE**] F")


def test_a_time_after_a_date_is_covered_whole() -> None:
    text = "Seen 03/14/2026 08:40, again 03/15/2026 9:05:30 pm."
    # the model flagged the date and the hour ("08"); the minutes must not be left behind
    assert _tag(text, [Span(5, 18, "DATE", 0.9)]) == "Seen [**DATE**], again 03/15/2026 9:05:30 pm."
    assert _tag(text, [Span(29, 41, "DATE", 0.9)]) == "Seen 03/14/2026 08:40, again [**DATE**] pm."
    # a flag starting inside the time covers it from its hour
    assert _tag(text, [Span(19, 21, "DATE", 0.9)]) == "Seen 03/14/2026 [**DATE**], again 03/15/2026 9:05:30 pm."


def test_trimming_keeps_what_belongs_to_the_entity() -> None:
    text = "Call (617) 555-0143 in '88, age >89."
    spans = [Span(4, 19, "PHONE", 0.9), Span(23, 26, "DATE", 0.9), Span(32, 36, "AGE", 0.9)]
    got = Ensemble([Slot(FixedMember("m", {"t": spans}))]).deid([Note("t", text)])[0].spans
    # balanced brackets, the apostrophe of a two-digit year and the ">" stay; the space and the
    # final period go
    assert [text[s.start : s.end] for s in got] == ["(617) 555-0143", "'88", ">89"]
    # a span of punctuation alone hides nothing and is dropped
    assert trim_spans(text, [Span(26, 28, "NAME")]) == []


def test_the_rule_member_already_gives_entity_spans() -> None:
    from dphub.render import render
    from dphub.rules.engine import RuleMember

    text = "Seen by Dr. Smith and MR. JONES, a 31-year-old seen 03/14/2026 08:40."
    note = Note("r", text)
    got = render(note, Ensemble([Slot(RuleMember())]).deid([note])[0].spans, "tag")
    assert got == ("Seen by Dr. [**NAME**] and MR. [**NAME**], a [**AGE**]-year-old seen "
                   "[**DATE**] 08:40.")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(note_and_spans())
def test_trimming_uncovers_only_punctuation_space_and_age_words(
        case: tuple[Note, list[Span]]) -> None:
    note, spans = case
    text = note.text
    snapped = snap_to_words(text, spans)
    got = trim_spans(text, snapped)
    assert not _cuts(text, got)
    covered = set()
    for s in got:
        covered.update(range(s.start, s.end))
        assert not text[s.start].isspace() and not text[s.end - 1].isspace()
    for s in snapped:
        for i in set(range(s.start, s.end)) - covered:
            assert not text[i].isalnum() or s.label in ("AGE", "NAME"), (s, text[s.start : s.end])
