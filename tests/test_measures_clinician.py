"""Measurements read as a clinician writes them (issue 57 item 1), each with the look-alikes of
its shape that must stay hidden: a date, an age of 90 or more, an ID, a phone, a room."""

from __future__ import annotations

import pytest

from dphub.ensemble.measures import measurement_ranges


def released(text: str) -> list[str]:
    return [text[a:b] for a, b in measurement_ranges(text)]


def digits_released(text: str) -> list[str]:
    return [r for r in released(text) if any(c.isdigit() for c in r)]


@pytest.mark.parametrize(("text", "value"), [
    # blood gases in any order and with any separator
    ("abg 7.38-33-169 today", "7.38-33-169"),
    ("gas 169-33-7.38-20--4 noted", "169-33-7.38-20--4"),
    ("abg 7.47,35,124,2,26,98% on", "7.47,35,124,2,26,98%"),
    ("vbg 7.31/52/40 ok", "7.31/52/40"),
    ("ABG-139/33/7.44/23/0 w", "139/33/7.44/23/0"),   # a gas's name glued by a dash
    ("abg 7.46/33 ok", "7.46/33"),
    ("cr 1.9/bun 38 ok", "1.9"),                      # a value before the next one's name
    ("40%,TV500 IMV10", "TV500"),
    # ventilator modes with their settings
    ("vent AC/800/10/40% overnight", "800/10/40%"),
    ("on r-psv 13/peep 5", "13"),
    ("changed to ac8,tv800 now", "tv800"),
    ("SIMV/PS, 500X10, 40%", "500X10"),
    ("PS 10,peep-5,fio2-40%", "5"),
    ("fio2-40% now", "40"),
    # ranges and changes
    ("PS from 15 to 12 today", "15"),
    ("PS from 15 to 12 today", "12"),
    ("peep was weaned from 10 to 5", "10"),
    ("fio2 up to 40 now", "40"),
    ("sbp came down to 110's", "110's"),
    ("sbp up to 7.5 x", "7.5"),
    # pain and scores
    ("c/o 6/10 cp", "6/10"),
    ("rated 8/10", "8/10"),
    ("RSBI 64 this am", "64"),
    ("NIF -30 today", "30"),
    ("CIWA 12 so", "12"),
    ("HR- 75 paced", "75"),
    # device sizes, lab panels with names, grades, doses
    ("#8 ett in place", "8"),
    ("# 7.5 trach", "7.5"),
    ("Platelets low (55) today", "55"),
    ("pulses 3+/3+ feet", "3+/3+"),
    ("2-3+ edema", "2-3+"),
    ("benadryl 25 qhs", "25 qhs"),
    ("promote at 20/hour", "20/hour"),
    ("1/2NS at 100", "1/2NS"),
    ("a+ox3, calm", "ox3"),
    ("SR 1st degree AVB", "1st"),
    ("in 180s now", "180s"),
    ("0730: pt up", "0730"),
    # ages below 90 (HIPAA Safe Harbor names ages over 89 only)
    ("a 74 YR OLD man", "74"),
    ("is a 83 yo woman", "83"),
    ("a 47yo male", "47yo"),
    ("a 78 y.o. female", "78"),
    ("a 74-year-old man", "74"),
    ("age 67 here", "67"),
    ("aged 89 here", "89"),
])
def test_clinician_measurements_are_released(text: str, value: str) -> None:
    assert any(value in r for r in released(text)), (text, released(text))


@pytest.mark.parametrize("text", [
    # a gas's shape with a date, a year, a phone or an ID in it
    "abg 7.40-12-10 x", "abg 7.38-33-1969 x", "gas 7.38-555-0143 x",
    "7.38-3-10 seen",
    "abg 3/10 x", "abg-3/10/2026 x", "hct 3/jan", "cr 3/march", "abg-617-555-0143",
    # a ventilator's shape around a date
    "AC/11/17 placed", "on PSV 12/10 tolerating", "PSV 3/10/26", "psv 3/10/peep",
    # a change or a range that could be a day, a year
    "seen from 12 to 10", "PS from 3/10 to 3/12", "up to 12 today", "down to 1990 today", "fio2-3/10", "peep-5-0143 x",
    "went up to 25 pt",
    # a pain score that is a date: after a preposition of time, or with no pain word
    "on 8/10 cp", "since 6/10 headache", "seen 6/10 today",
    # a score's name before a date
    "RSBI 3/10", "CIWA 12/25",
    # a device size after a room, a bed, an ID word
    "rm #8 ett", "bed #12 tube", "#8 today", "MRN #12 ett",
    # a bracket value that is a phone's, a date's
    "(617) 555-0143", "plt (3/10)", "bp (617) 555-0143", "Ph (617) 555-0143",
    "call hr (555) 123-4567", "k (617)555-0143",
    # decades of years and of ages over 89
    "in 1980s", "in her 100s", "pt in 90s",
    # a grade's shape in a phone, a sum
    "call +1 617 555 0143",
    # a volume by a rate's shape in an extension, a chain
    "call 555-1234x12", "400x10x30", "ext 900x10", "call 555 800x12",
    # a timestamp that is a year
    "1994: CABG", "2015- MI", "0812-3345 x", "0812 - 3345 x", "call 555 - 1234", "id 4471 + 2290", "0812: 3345 x",
    # a dose's frequency after a month
    "Jan 25 qhs", "on 3/10 qhs",
    # ages of 90 and more; an age after a date, a room, an ID, a phone
    "a 92 yo woman", "a 90 YR OLD man", "aged 91 here", "age 104 here", "a 99yo", "a 90-year-old",
    "3/14 74 yo", "rm 12 yo", "555-12 yo", "MRN 12 yo", "Jan 74 yo", "1974 yo", "074 yo",
])
def test_clinician_look_alikes_stay_hidden(text: str) -> None:
    assert not digits_released(text), (text, digits_released(text))


@pytest.mark.parametrize(("text", "hidden"), [
    ("abg 7.38,12345,40 x", "12345"),   # an ID's length in a gas's chain
    ("ac8,MRN123 now", "MRN123"),       # glued terms after a comma that are an ID, a room
    ("ac8,rm12 now", "rm12"),
    ("ac8,bed4 now", "bed4"),
])
def test_clinician_chains_keep_their_identifiers_hidden(text: str, hidden: str) -> None:
    assert not any(hidden in r for r in released(text)), (text, released(text))
