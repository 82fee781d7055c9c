"""Invisible and look-alike characters (issue 31.9): members read a normalised note, the output
hides the original characters, and offsets stay the note's own."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dphub import synth
from dphub.cli.main import main
from dphub.ensemble.core import Ensemble, Slot
from dphub.ensemble.members import FixedMember
from dphub.ensemble.words import snap_to_words
from dphub.notes import Note, Span
from dphub.render import render
from dphub.rules.engine import RuleMember
from dphub.textnorm import normalize

ZW = "\u200b"


def _fw(s: str) -> str:
    """Fullwidth digits and slash."""
    return "".join(chr(ord(c) + 0xFEE0) if c.isdigit() or c == "/" else c for c in s)


#: every case of issue 31.9: (note text, the PHI strings as written, as a reader sees them)
CASES = {
    "zwsp": (f"Call Jo{ZW}hn Sm{ZW}ith at 555-1{ZW}23-4567", ["John", "Smith", "555-123-4567"]),
    "zwnj": ("Call Jo\u200chn Sm\u200cith at 555-1\u200c23-4567", ["John", "Smith", "555-123-4567"]),
    "zwj": ("Call Jo\u200dhn Sm\u200dith at 555-1\u200d23-4567", ["John", "Smith", "555-123-4567"]),
    "word-joiner": ("Call Jo\u2060hn Sm\u2060ith at 555-1\u206023-4567",
                    ["John", "Smith", "555-123-4567"]),
    "soft-hyphen": ("Call Jo\u00adhn Sm\u00adith at 555-1\u00ad23-4567",
                    ["John", "Smith", "555-123-4567"]),
    "bom": ("Call Jo\ufeffhn Sm\ufeffith at 555-1\ufeff23-4567", ["John", "Smith", "555-123-4567"]),
    "ansi": ("Call \x1b[31mJo\x1b[0mhn Smith at 555-\x1b[1m123\x1b[0m-4567",
             ["John", "Smith", "555-123-4567"]),
    "cyrillic-o": ("Call J\u043ehn Smith at 555-123-4567", ["John", "Smith", "555-123-4567"]),
    "fullwidth-phone": (f"Call John Smith at {_fw('555-123-4567')}", ["John", "Smith", "555-123-4567"]),
    "fullwidth-date": (f"Seen on {_fw('03/14/2021')} by the team", ["03/14/2021"]),
    # digits of another script (Arabic-Indic): also decimal digits a reader reads as a number
    "arabic-indic-phone": ("Call John Smith at " + "555-123-4567".translate(
        {ord(d): 0x0660 + int(d) for d in "0123456789"}), ["John", "Smith", "555-123-4567"]),
}

#: escapes that ate note text (review of 31.9): (note text, the PHI as written in the note)
ESCAPE_CASES = {
    "osc-payload": ("Pt seen. \x1b]0;Call John Smith at 555-123-4567\x07 ok",
                    ["John", "Smith", "555-123-4567"]),
    "osc-st-payload": ("Pt seen. \x1b]2;John Smith 555-123-4567\x1b\\ ok",
                       ["John", "Smith", "555-123-4567"]),
    "esc-letter": ("Call \x1bJohn \x1bSmith at 555-123-4567", ["John", "Smith"]),
    "esc-digit": ("Call John Smith at \x1b555-123-4567", ["555-123-4567"]),
    "csi-letter": ("Call \x1b[John \x1b[Smith at 555-123-4567", ["John", "Smith"]),
    "csi8-letter": ("Call \x9bJohn \x9bSmith at 555-123-4567", ["John", "Smith"]),
    # a phone number is no CSI parameter: only "ESC[" goes
    "csi-digits": ("Call John Smith at \x1b[555-123-4567 or \x1b[5551234567m",
                   ["555-123-4567", "5551234567"]),
}
CASES.update(ESCAPE_CASES)


def _visible(s: str) -> str:
    """What a reader sees: the note with escapes and invisible characters gone, NFKC, Latin."""
    n = normalize(s)
    return s if n is None else n.text


def _leaks(output: str, phi: Sequence[str]) -> list[str]:
    seen = _visible(output)
    return [p for p in phi if p in seen or p.split("-")[-1] in seen]


def _rules() -> Ensemble:
    return Ensemble([Slot(RuleMember())])


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_member_hides_invisible_and_lookalike_phi(case: str) -> None:
    text, phi = CASES[case]
    note = Note(case, text)
    res = _rules().deid([note])[0]
    out = render(note, res.spans, "tag")
    assert not _leaks(out, phi), (case, out)
    # the spans are in the note's own offsets and cover the original characters
    for s in res.spans:
        assert 0 <= s.start < s.end <= len(text)
    hidden = "".join(text[s.start : s.end] for s in res.spans)
    assert all(_visible(p) in _visible(hidden) for p in phi), case


@pytest.mark.parametrize("case", sorted(ESCAPE_CASES))
def test_escapes_never_eat_the_letters_and_digits_a_reader_sees(case: str) -> None:
    """The PHI next to or inside an escape is flagged, and the output spans cover every one of
    its original characters (the first letter after ``ESC[`` included)."""
    text, phi = ESCAPE_CASES[case]
    n = normalize(text)
    assert n is not None
    for p in phi:
        assert p in n.text, (case, p)
    spans = _rules().deid([Note(case, text)])[0].spans
    covered = {i for s in spans for i in range(s.start, s.end)}
    for p in phi:
        at = text.index(p)
        assert set(range(at, at + len(p))) <= covered, (case, p)


def test_real_terminal_sequences_still_go_whole() -> None:
    """Colour codes, erase/cursor sequences and charset switches are no text; an OSC's text
    stays apart from the words around it."""
    assert normalize("\x1b[1;31mJo\x1b[0mhn\x1b(B\x1b[mSmith\x1b[2K \x1b[?25l7\x1b[3~") is not None
    assert _visible("\x1b[1;31mJo\x1b[0mhn\x1b(B\x1b[m Smith\x1b[2K \x1b[?25l7\x1b[3~") == \
        "John Smith 7"
    assert _visible("\x1b[38;5;208mok\x1b[m\x1b[10;20Hok\x1b[K") == "okok"
    link = "see \x1b]8;;https://x.org/p\x1b\\John Smith\x1b]8;;\x1b\\ today"
    assert _visible(link).split() == ["see", "8;;https://x.org/p", "John", "Smith", "8;;", "today"]


def _alnum_kept(text: str, exempt: set[int]) -> list[int]:
    """Original positions of ASCII letters and digits (outside ``exempt``) that no letter or
    digit of the normalised text comes from."""
    n = normalize(text)
    if n is None:
        return []
    reached = set()
    for j, c in enumerate(n.text):
        if c.isalnum():
            a, b = n.to_original(j, j + 1)
            reached.update(range(a, b))
    return [i for i, c in enumerate(text)
            if c.isascii() and c.isalnum() and i not in exempt and i not in reached]


#: real sequences (their own bytes may go); the words never begin with "m" (``ESC[m`` is the
#: colour reset and goes whole) and are not single letters or short numbers outside an OSC
#: (after ``ESC[`` or ``ESC(`` those are the final byte or parameter of a real sequence)
_REAL = ["\x1b[31m", "\x1b[0m", "\x1b[1;32m", "\x1b[2K", "\x1b[?25l", "\x1b(B", "\x1b[m"]
_PIECES = ["John", "Smith", "ok", "Ann", "5551234567", "55512", "\x1b", "\x9b", "\x1b[", "\x1b]",
           "\x1b(", "\x9d", "\x07", "\x1b\\", "\x9c", "[", "]", ";", "\x1b]0;", "\x9d8;;", " ", "-", "/",
           ZW, "\u00ad", "\u043e", "\uff15", "\u00b2", "\u2075", "\u0665", "\x00"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_REAL + _PIECES), max_size=25))
def test_no_letter_or_digit_of_the_note_disappears(parts: list[str]) -> None:
    text = "".join(parts)
    exempt, at = set(), 0
    for p in parts:
        if p in _REAL:
            exempt.update(range(at, at + len(p)))
        at += len(p)
    assert _alnum_kept(text, exempt) == [], ascii(text)


def test_spans_cover_the_removed_characters_inside_and_map_back_exactly() -> None:
    text = f"Call Jo{ZW}hn Sm{ZW}ith at 555-1{ZW}23-4567"
    spans = _rules().deid([Note("n", text)])[0].spans
    assert [(text[s.start : s.end], s.label) for s in spans] == [
        (f"Jo{ZW}hn", "NAME"), (f"Sm{ZW}ith", "NAME"), (f"555-1{ZW}23-4567", "PHONE")]


class _AsciiDigits:
    """A model-like member: it only understands ASCII digits (as the patterns of a tokenizer
    trained on ASCII would) and answers in offsets of the text it was given."""

    name = "digits"

    def __init__(self) -> None:
        self.seen: list[str] = []

    def tag(self, notes: Sequence[Note], threshold: float | None = None) -> list[list[Span]]:
        self.seen.extend(n.text for n in notes)
        return [[Span(m.start(), m.end(), "PHONE" if "-" in m.group(0) else "DATE", 0.9,
                      self.name) for m in re.finditer(r"[0-9]+(?:[-/][0-9]+)+", n.text)]
                for n in notes]


def test_every_member_reads_the_normalised_note_and_answers_in_original_offsets() -> None:
    member = _AsciiDigits()
    text = f"Call {_fw('555-123-4567')} on {_fw('03/14/2021')} or 555-1{ZW}23-4568."
    note = Note("m", text)
    res = Ensemble([Slot(member)]).deid([note])[0]
    assert member.seen == ["Call 555-123-4567 on 03/14/2021 or 555-123-4568."]
    assert [text[s.start : s.end] for s in res.spans] == [
        _fw("555-123-4567"), _fw("03/14/2021"), f"555-1{ZW}23-4568"]
    assert render(note, res.spans, "tag") == "Call [**CONTACT**] on [**DATE**] or [**CONTACT**]."


def test_nfkc_expansion_maps_back_to_the_whole_character() -> None:
    text = "Dose \u2488 tab, \ufb01le e\u0301 \U0001d409\U0001d428\U0001d421\U0001d427 Smith"
    n = normalize(text)
    assert n is not None and n.text == "Dose 1. tab, file \u00e9 John Smith"
    one = n.text.index("1")
    assert n.to_original(one, one + 1) == (5, 6)  # "1" of "1." is the whole "⒈"
    assert n.to_original(one + 1, one + 2) == (5, 6)
    f = n.text.index("file")
    assert n.to_original(f, f + 1) == (text.index("\ufb01"), text.index("\ufb01") + 1)
    e = n.text.index("\u00e9")
    assert n.to_original(e, e + 1) == (text.index("e\u0301"), text.index("e\u0301") + 2)
    j = n.text.index("John")
    a, b = n.to_original(j, j + 4)
    assert text[a:b] == "\U0001d409\U0001d428\U0001d421\U0001d427"
    # the bold name is found and hidden as a whole
    out = render(Note("x", text), _rules().deid([Note("x", text)])[0].spans, "tag")
    assert "\U0001d409" not in out and "Smith" not in out


def test_lookalikes_are_mapped_only_in_words_that_read_as_latin() -> None:
    n = normalize("\u0422\u041e\u041c and \u0418\u0432\u0430\u043d")  # all-Cyrillic "TOM", "Ivan"
    assert n is not None and n.text == "TOM and \u0418\u0432\u0430\u043d"


def test_plain_and_ordinary_notes_are_not_copied() -> None:
    assert normalize("Pt seen 03/14/2021, BP 120/80.\n\tOK\r\n") is None
    # ordinary non-ASCII (accents, degrees, typographic quotes) reads as it is
    assert normalize("Caf\u00e9 38.5\u00b0C, pt\u2019s \u201cgood\u201d") is None
    # units, exponents, fractions and symbols keep their meaning as written
    assert normalize("WBC 5.2 x10\u00b3/\u00b5L, BSA 1.9 m\u00b2, \u00bd tab Tylenol\u2122") is None


def test_superscript_digits_standing_alone_are_digits() -> None:
    sup = str.maketrans("0123456789", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")
    text = "Call " + "555-123-4567".translate(sup) + " today"
    n = normalize(text)
    assert n is not None and n.text == "Call 555-123-4567 today"
    note = Note("s", text)
    assert render(note, _rules().deid([note])[0].spans, "tag") == "Call [**CONTACT**] today"


def test_superscripts_inside_a_number_are_digits_and_units_stay() -> None:
    text = "Call 5\u2075\u2075-\u00b9\u00b2\u00b3-\u2074\u2075\u2076\u2077 or 555-12\u00b3-4567 today"
    n = normalize(text)
    assert n is not None and n.text == "Call 555-123-4567 or 555-123-4567 today"
    note = Note("s", text)
    assert render(note, _rules().deid([note])[0].spans, "tag") == \
        "Call [**CONTACT**] or [**CONTACT**] today"
    for unit in ("10\u00b3/\u00b5L", "x10\u2079/L", "1.9 m\u00b2", "CO\u2082", "cm\u00b3"):
        assert normalize(unit) is None, unit


def test_normal_notes_give_byte_identical_spans() -> None:
    """The fast path: a normal note's member spans are the rule member's own, snapped to whole
    words as before (trimming and normalising change nothing on them)."""
    notes = synth.generate(20, kind="nursing", seed=3) + synth.generate(10, kind="discharge", seed=4)
    notes.append(Note("accents", "Jos\u00e9 Garc\u00eda seen 03/14/2021, temp 38.5\u00b0C."))
    member = RuleMember()
    got = Ensemble([Slot(member)]).member_spans(notes)
    for note, by in zip(notes, got, strict=True):
        assert by[member.name] == snap_to_words(note.text, member.spans(note.text)), note.id


def test_fixed_spans_are_taken_in_the_note_offsets() -> None:
    text = f"Jo{ZW}hn Smith"
    spans = [Span(0, 5, "NAME"), Span(6, 11, "NAME")]
    got = Ensemble([Slot(FixedMember("f", {"n": spans}))]).deid([Note("n", text)])[0].spans
    assert [(s.start, s.end) for s in got] == [(0, 5), (6, 11)]


def test_cli_ensemble_deid_hides_every_case(tmp_path: Path) -> None:
    manifest = tmp_path / "e.toml"
    assert main(["ensemble", "add", "rules:default", "--ensemble", str(manifest)]) == 0
    src = tmp_path / "in"
    src.mkdir()
    for case, (text, _) in CASES.items():
        (src / f"{case}.txt").write_text(text + "\n", encoding="utf-8")
    out = tmp_path / "out"
    assert main(["ensemble", "deid", str(src), "--out", str(out), "--ensemble",
                 str(manifest)]) == 0
    for case, (_, phi) in CASES.items():
        rendered = (out / f"{case}.txt").read_text(encoding="utf-8")
        assert not _leaks(rendered, phi), (case, rendered)
    spans_out = tmp_path / "spans"
    assert main(["ensemble", "deid", str(src), "--out", str(spans_out), "--mode", "spans",
                 "--ensemble", str(manifest)]) == 0
    rec = json.loads((spans_out / "zwsp.jsonl").read_text(encoding="utf-8"))
    assert [(s["start"], s["end"]) for s in rec["spans"]] == [(5, 10), (11, 17), (21, 34)]


def test_surrogates_are_drawn_from_the_value_as_read() -> None:
    """A disguised value gets the surrogate of the plain value (one person, one surrogate), and
    a fullwidth date is shifted as a date rather than scrambled digit by digit."""
    key = b"0123456789abcdef-textnorm"
    plain = Note("p", "Call John Smith at 555-123-4567 on 03/14/2021", "pt")
    want = render(plain, _rules().deid([plain])[0].spans, "surrogate", key=key)
    disguised = Note("d", f"Call Jo{ZW}hn Sm\u00adith at {_fw('555-123-4567')} on {_fw('03/14/2021')}",
                     "pt")
    got = render(disguised, _rules().deid([disguised])[0].spans, "surrogate", key=key)
    assert got == want and got.isascii()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "J", "o", "7", " ", "-", "/", "\n", ZW, "\u00ad", "\ufeff",
                                 "\x1b[31m", "\x1b", "[", "\u043e", "\u0422", "\u0418", "\uff15",
                                 "\u0301", "\ufb01", "\u00bd", "\x00", "\u00e9", "\u00b2", "\u00b5",
                                 "\u2122", "\u2488", "\u2075", "\u0665"]), max_size=30))
def test_mapping_is_monotonic_in_bounds_and_normalising_twice_changes_nothing(
        parts: list[str]) -> None:
    text = "".join(parts)
    n = normalize(text)
    if n is None:
        return
    assert normalize(n.text) is None
    last = (0, 0)
    for i in range(len(n.text)):
        a, b = n.to_original(i, i + 1)
        assert 0 <= a < b <= len(text) and (a, b) >= last
        last = (a, b)
    if n.text:
        assert n.spans_to_original([Span(0, len(n.text), "NAME")])[0].end <= len(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "1", " ", "/", ZW, "\u00ad", "\ufeff", "\x1b[31m", "\u043e",
                                 "\uff15", "\u0301", "\ufb01", "\u2488", "\u00b2", "\x00"]),
                max_size=20))
def test_original_offsets_map_to_the_normalised_range_they_read_as(parts: list[str]) -> None:
    """from_original inverts to_original: a range of the normalised text, taken to the original
    and back, is itself, or grows only to the whole of an NFKC-expanded character."""
    text = "".join(parts)
    n = normalize(text)
    if n is None:
        return
    for i in range(len(n.text)):
        for j in range(i + 1, len(n.text) + 1):
            a, b = n.to_original(i, j)
            i2, j2 = n.from_original(a, b)
            assert i2 <= i and j <= j2 and n.to_original(i2, j2) == (a, b)


def test_a_span_with_invisible_characters_reads_as_its_visible_value() -> None:
    text = f"BP 1{ZW}2{ZW}0/80"
    n = normalize(text)
    assert n is not None and n.from_original(3, 8) == (3, 6) and n.from_original(8, 11) == (6, 9)
    assert n.from_original(4, 5) == (4, 4)  # the zero-width space alone reads as nothing
