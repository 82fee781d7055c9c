"""Tests for dphub.render: tag / redact / surrogate / spans / brat renderers."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest
from faker import Faker
from hypothesis import given, settings
from hypothesis import strategies as st

from dphub.errors import ConfigError, DphubError, InputError
from dphub.notes import Note, Span
from dphub.render import (
    RENDERERS,
    SurrogateRenderer,
    date_offset_days,
    load_key,
    render,
    shift_date_text,
)

KEY = b"0123456789abcdef-test-key"
OTHER_KEY = b"fedcba9876543210-other-key"


def build_note(
    note_id: str, patient: str | None, parts: list[tuple[str, str | None]]
) -> Note:
    """Concatenate ``(text, label)`` parts; labelled parts become spans."""
    text, spans = "", []
    for chunk, label in parts:
        if label is not None:
            spans.append(Span(len(text), len(text) + len(chunk), label))
        text += chunk
    return Note(id=note_id, text=text, patient_id=patient, spans=spans)


def synthetic_note(seed: int, patient: str = "p1", note_id: str = "n1") -> Note:
    fk = Faker("en_US")
    fk.seed_instance(seed)
    return build_note(
        note_id,
        patient,
        [
            ("Pt ", None), (f"{fk.first_name()} {fk.last_name()}", "PATIENT"),
            (" seen by Dr. ", None), (fk.last_name(), "DOCTOR"),
            (" on ", None), (fk.date("%m/%d/%Y"), "DATE"),
            (" at ", None), (f"{fk.last_name()} Memorial Hospital", "HOSPITAL"),
            (".\nCall ", None), (fk.numerify("###-###-####"), "PHONE"),
            (", MRN ", None), (fk.bothify("??##-####").upper(), "MEDICALRECORD"),
            (". Lives in ", None), (fk.city(), "CITY"),
            (" ", None), (fk.zipcode(), "ZIP"),
            (".", None),
        ],
    )


def surrogates(note: Note, key: bytes = KEY) -> list[str]:
    """The surrogate text of each span (spans sorted, rendering done span by span)."""
    renderer = SurrogateRenderer(key)
    return [
        renderer.render(Note(note.id, note.span_text(s), note.patient_id), [
            Span(0, s.end - s.start, s.label)
        ])
        for s in note.spans
    ]


def shape(value: str) -> str:
    return re.sub(r"[a-z]", "a", re.sub(r"[A-Z]", "A", re.sub(r"\d", "9", value)))


# ----------------------------------------------------------------------------- tag / redact


@pytest.mark.parametrize("seed", range(5))
def test_tag_mode_removes_every_span_text(seed: int) -> None:
    note = synthetic_note(seed)
    out = render(note, note.spans, "tag")
    for s in note.spans:
        assert note.span_text(s) not in out
    assert "[**NAME**]" in out and "[**CONTACT**]" in out and "[**LOCATION**]" in out
    assert out.startswith("Pt [**NAME**] seen by Dr. [**NAME**] on [**DATE**] at ")


def test_tag_styles_and_granularity() -> None:
    note = build_note("n", None, [("Dr. ", None), ("Kim", "DOCTOR"), (" at ", None),
                                  ("Mercy", "HOSPITAL")])
    assert render(note, note.spans, "tag", style="angle") == "Dr. <NAME> at <LOCATION>"
    assert render(note, note.spans, "tag", granularity="fine") == (
        "Dr. [**DOCTOR**] at [**HOSPITAL**]"
    )
    with pytest.raises(ConfigError):
        render(note, note.spans, "tag", style="curly")


def test_overlapping_spans_are_merged_before_replacement() -> None:
    note = Note("n", "Seen by John Smith today")
    spans = [Span(8, 12, "NAME"), Span(8, 18, "PATIENT"), Span(13, 18, "NAME")]
    assert render(note, spans, "tag") == "Seen by [**NAME**] today"


def test_redact_fixed_and_length_preserving() -> None:
    note = synthetic_note(1)
    fixed = render(note, note.spans, "redact", mask="***")
    assert fixed.count("***") == len(note.spans)
    same = render(note, note.spans, "redact", preserve_length=True, mask_char="#")
    assert len(same) == len(note.text)
    covered = {i for s in note.spans for i in range(s.start, s.end)}
    for i, (a, b) in enumerate(zip(note.text, same, strict=True)):
        if i not in covered or a.isspace():
            assert a == b
        else:
            assert b == "#"


def test_inputs_are_not_modified_and_bad_spans_are_named_without_text() -> None:
    note = synthetic_note(2)
    text, spans = note.text, list(note.spans)
    for mode in ("tag", "redact", "spans", "brat"):
        render(note, note.spans, mode)
    render(note, note.spans, "surrogate", key=KEY)
    assert note.text == text and note.spans == spans
    with pytest.raises(InputError) as exc:
        render(note, [Span(3, len(text) + 5, "NAME")], "tag")
    assert "note n1" in str(exc.value) and note.text[3:10] not in str(exc.value)
    with pytest.raises(DphubError):
        render(note, [Span(0, 2, "NOT-A-LABEL")], "redact")


def test_unknown_mode_and_options_are_config_errors() -> None:
    note = Note("n", "x")
    with pytest.raises(ConfigError):
        render(note, [], "shout")
    with pytest.raises(ConfigError):
        render(note, [], "tag", colour="red")
    assert set(RENDERERS) == {"tag", "redact", "surrogate", "spans", "brat"}


# ----------------------------------------------------------------------------- spans / brat


def test_spans_jsonl_record() -> None:
    note = Note("note-7", "Call John at 555-1234")
    spans = [Span(13, 21, "PHONE", score=0.75, source="rules:default"),
             Span(5, 9, "NAME", score=0.9, source="org/a, org/b")]
    line = render(note, spans, "spans")
    assert line.endswith("\n") and line.count("\n") == 1
    record = json.loads(line)
    assert record == {
        "id": "note-7",
        "spans": [
            {"start": 5, "end": 9, "label": "NAME", "score": 0.9, "members": ["org/a", "org/b"]},
            {"start": 13, "end": 21, "label": "PHONE", "score": 0.75,
             "members": ["rules:default"]},
        ],
    }
    assert "John" not in line


def test_brat_output_reads_back_with_the_brat_format(tmp_path: Path) -> None:
    from dphub.formats.brat import parse_pair

    note = Note("n1", "Pt Ann\nLee seen 7/22.\n", spans=[])
    spans = [Span(3, 10, "PATIENT"), Span(16, 20, "DATE")]
    ann = render(note, spans, "brat")
    assert ann == "T1\tPATIENT 3 10\tAnn Lee\nT2\tDATE 16 20\t7/22\n"
    (tmp_path / "n1.txt").write_text(note.text, encoding="utf-8")
    (tmp_path / "n1.ann").write_text(ann, encoding="utf-8")
    back = parse_pair(tmp_path / "n1.txt", tmp_path / "n1.ann", "n1")
    assert [(s.start, s.end, s.category) for s in back.spans] == [
        (3, 10, "NAME"), (16, 20, "DATE")
    ]


# ----------------------------------------------------------------------------- surrogates


def test_surrogate_needs_a_key_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_key(tmp_path / "missing.key")
    short = tmp_path / "short.key"
    short.write_text("abc\n")
    with pytest.raises(ConfigError):
        load_key(short)
    with pytest.raises(ConfigError):
        SurrogateRenderer()
    good = tmp_path / "good.key"
    good.write_bytes(KEY + b"\n")
    assert load_key(good) == KEY
    note = synthetic_note(3)
    assert render(note, note.spans, "surrogate", key_file=good) == SurrogateRenderer(KEY).render(
        note, note.spans
    )
    with pytest.raises(ConfigError):
        render(note, note.spans, "surrogate", key_file=tmp_path / "missing.key")


def test_surrogates_are_consistent_within_a_patient_and_differ_across_patients() -> None:
    a1 = build_note("a1", "A", [("Seen ", None), ("John Smith", "PATIENT"), (", MRN ", None),
                                ("123-45", "MEDICALRECORD"), (" at ", None),
                                ("Boston", "CITY")])
    a2 = build_note("a2", "A", [("SMITH", "PATIENT"), (" and ", None), ("john", "PATIENT"),
                                (" called from ", None), ("boston", "CITY"),
                                (", MRN ", None), ("12345", "MEDICALRECORD")])
    b1 = build_note("b1", "B", [("Seen ", None), ("John Smith", "PATIENT"), (", MRN ", None),
                                ("123-45", "MEDICALRECORD"), (" at ", None),
                                ("Boston", "CITY")])
    first, last = surrogates(a1)[0].split()
    s2 = surrogates(a2)
    assert s2[0] == last.upper()  # same normalized word, case of the original
    assert s2[1] == first.lower()
    assert s2[2].casefold() == surrogates(a1)[2].casefold()
    assert re.sub(r"\D", "", s2[3]) == re.sub(r"\D", "", surrogates(a1)[1])
    assert surrogates(b1) != surrogates(a1)  # another patient, another mapping


def test_dates_keep_intervals_across_a_patients_notes_and_their_format() -> None:
    n1 = build_note("1", "P", [("Admitted ", None), ("07/22/2094", "DATE"), (".", None)])
    n2 = build_note("2", "P", [("Seen ", None), ("2094-08-05", "DATE"), (" and ", None),
                               ("Aug 9th", "DATE"), (" and ", None),
                               ("January 3, 2095", "DATE")])
    (d1,) = surrogates(n1)
    d2, d3, d4 = surrogates(n2)
    assert re.fullmatch(r"\d\d/\d\d/\d{4}", d1) and re.fullmatch(r"\d{4}-\d\d-\d\d", d2)
    assert re.fullmatch(r"[A-Z][a-z]{2} \d{1,2}(st|nd|rd|th)", d3)
    assert re.fullmatch(r"[A-Z][a-z]+ \d{1,2}, \d{4}", d4)
    t1 = dt.datetime.strptime(d1, "%m/%d/%Y").date()
    t2 = dt.datetime.strptime(d2, "%Y-%m-%d").date()
    t4 = dt.datetime.strptime(d4, "%B %d, %Y").date()
    assert (t2 - t1).days == 14
    assert (t4 - t1).days == (dt.date(2095, 1, 3) - dt.date(2094, 7, 22)).days
    offset = date_offset_days(KEY, "P")
    assert (t1 - dt.date(2094, 7, 22)).days == offset


@pytest.mark.parametrize(
    ("text", "offset", "expected"),
    [
        ("7/22", 10, "8/1"),
        ("07/22/2094", -22, "06/30/2094"),
        ("7-22-94", 10, "8-1-94"),
        ("2094-07-22", 10, "2094-08-01"),
        ("Jan 3rd", 30, "Feb 2nd"),
        ("January 3, 2094", -4, "December 30, 2093"),
        ("JAN. 3", 1, "JAN. 4"),
        ("3 Jan 2094", 1, "4 Jan 2094"),
        ("Jan 2094", 45, "Feb 2094"),
        ("2/29", 1, "3/1"),
        ("1992", 200, "1993"),
        ("'92", -5, "'91"),
        ("Monday", 2, "Wednesday"),
        ("31/12/2094", 1, "01/01/2095"),
        ("2/83", 30, "3/83"),
        ("25 Sep, 86", 10, "5 Oct, 86"),
        ("1/12-1/13", 10, "1/22-1/23"),
        ("Jan 3 to Jan 5", -3, "Dec 31 to Jan 2"),
        ("20th", 12, "1st"),
        ("1980s", -1, "1970s"),
        ("not a date", 5, None),
        ("7/22/2094 10:30", 1, "7/23/2094 10:30"),
        ("Jan 3rd at 5:45 pm", 2, "Jan 5th at 5:45 pm"),
    ],
)
def test_shift_date_text_formats(text: str, offset: int, expected: str | None) -> None:
    assert shift_date_text(text, offset) == expected


@settings(max_examples=50, deadline=None)
@given(
    day=st.dates(min_value=dt.date(1950, 1, 1), max_value=dt.date(2150, 12, 31)),
    offset=st.integers(min_value=-365, max_value=365).filter(bool),
    fmt=st.sampled_from(["%m/%d/%Y", "%Y-%m-%d", "%B %d, %Y", "%b %d %Y", "%d %B %Y"]),
)
def test_shifted_dates_parse_back_to_the_offset(day: dt.date, offset: int, fmt: str) -> None:
    out = shift_date_text(day.strftime(fmt), offset)
    assert out is not None
    if day.month == 5 and "%b" in fmt:  # "May" reads as a full name: "April 30" is expected
        fmt = fmt.replace("%b", "%B")
    assert dt.datetime.strptime(out, fmt).date() - day == dt.timedelta(days=offset)


def test_date_offsets_are_nonzero_within_a_year_and_key_dependent() -> None:
    offsets = [date_offset_days(KEY, f"patient-{i}") for i in range(300)]
    assert all(o != 0 and -365 <= o <= 365 for o in offsets)
    assert min(offsets) < 0 < max(offsets)
    assert offsets != [date_offset_days(OTHER_KEY, f"patient-{i}") for i in range(300)]


@pytest.mark.parametrize("seed", range(8))
def test_contact_and_id_surrogates_keep_format_and_never_reuse_the_value(seed: int) -> None:
    note = synthetic_note(seed)
    out = surrogates(note)
    for s, sur in zip(note.spans, out, strict=True):
        original = note.span_text(s)
        assert sur.casefold() != original.casefold(), s.label
        if s.label in ("PHONE", "MEDICALRECORD", "ZIP"):
            assert shape(sur) == shape(original)


def test_names_keep_case_titles_and_initials() -> None:
    note = build_note("n", "p", [("DR. JOHN Q. SMITH", "DOCTOR"), (" ", None),
                                 ("mary", "RELATIVE")])
    name, rel = surrogates(note)
    assert name.startswith("DR. ") and name == name.upper()
    words = name.split()
    assert len(words) == 4 and re.fullmatch(r"[A-Z]\.", words[2]) and words[2] != "Q."
    assert words[1] != "JOHN" and words[3] != "SMITH"
    assert rel == rel.lower() and rel != "mary"


def test_ages_over_89_are_aggregated_others_kept() -> None:
    note = build_note("n", "p", [("92", "AGE"), (" ", None), ("45", "AGE"), (" ", None),
                                 ("101yo", "AGE")])
    assert surrogates(note) == ["90+", "45", "90+yo"]


def test_surrogate_output_is_deterministic_and_key_dependent() -> None:
    notes = [synthetic_note(i, patient=f"p{i % 2}", note_id=str(i)) for i in range(4)]
    first = [SurrogateRenderer(KEY).render(n, n.spans) for n in notes]
    again = [SurrogateRenderer(KEY).render(n, n.spans) for n in reversed(notes)][::-1]
    assert first == again
    other = [SurrogateRenderer(OTHER_KEY).render(n, n.spans) for n in notes]
    assert all(a != b for a, b in zip(first, other, strict=True))
    for note, out in zip(notes, first, strict=True):
        for s in note.spans:
            if s.label not in ("AGE",):
                assert note.span_text(s) not in out


def test_exhausted_redraws_fall_back_to_the_category_tag() -> None:
    # one-digit rooms have ten possible surrogates; forbid them all via the note's other spans
    parts: list[tuple[str, str | None]] = []
    for d in range(10):
        parts += [(str(d), "ROOM"), (" ", None)]
    note = build_note("n", "p", parts)
    out = SurrogateRenderer(KEY).render(note, note.spans)
    assert out.split() == ["[**LOCATION**]"] * 10  # the tag of --mode tag, not [**ROOM**]


def test_possessive_names_keep_the_suffix_and_the_mapping() -> None:
    note = build_note("n", "p", [("Smith", "PATIENT"), (" ", None), ("Smith's", "PATIENT")])
    plain, possessive = surrogates(note)
    assert possessive == plain + "'s"


def test_spans_scores_may_be_numpy_floats() -> None:
    import numpy as np

    note = Note("n", "Ann")
    line = render(note, [Span(0, 3, "NAME", score=np.float32(0.5))], "spans")
    assert json.loads(line)["spans"][0]["score"] == 0.5


@settings(max_examples=50, deadline=None)
@given(
    value=st.text(alphabet="0123456789ABCXYZabcxyz-./ #()", min_size=1, max_size=16).filter(
        lambda v: v.strip() == v and any(c.isalnum() for c in v)
    ),
    label=st.sampled_from(["PHONE", "FAX", "MEDICALRECORD", "SSN", "IDNUM", "ZIP", "ACCOUNT"]),
    patient=st.sampled_from(["p1", "p2"]),
)
def test_format_preserving_surrogates_property(value: str, label: str, patient: str) -> None:
    note = build_note("n", patient, [("ID ", None), (value, label), (".", None)])
    (sur,) = surrogates(note)
    # a value that does not parse as its category (a 1-digit phone, "7.4" as an ID) is masked
    # with the category tag; every other one keeps its format
    assert sur == f"[**{Span(0, 1, label).category}**]" or shape(sur) == shape(value)
    assert sur.casefold() != value.casefold()
    assert surrogates(note) == [sur]  # deterministic


@settings(max_examples=50, deadline=None)
@given(
    case=st.one_of(
        st.tuples(st.from_regex(r"\(?[2-9]\d{2}\)?[ .-]?\d{3}-\d{4}( x\d{3,5})?",
                                fullmatch=True), st.sampled_from(["PHONE", "FAX"])),
        st.tuples(st.from_regex(r"[A-Z]{0,2}\d{4,8}|\d{3}-\d{2}-\d{4}", fullmatch=True),
                  st.sampled_from(["MEDICALRECORD", "IDNUM", "SSN"])),
        st.tuples(st.from_regex(r"\d{5}(-\d{4})?", fullmatch=True), st.just("ZIP")),
    ),
)
def test_realistic_codes_always_get_a_format_preserving_surrogate(case: tuple[str, str]) -> None:
    value, label = case
    note = build_note("n", "p", [("ID ", None), (value, label), (".", None)])
    (sur,) = surrogates(note)
    assert shape(sur) == shape(value) and sur != value


# ------------------------------------------ surrogates never rewrite what is not their category


def _render_marked(text: str, marks: list[tuple[str, str]], patient: str = "p") -> str:
    """Render ``text`` with a span on the first occurrence of each marked substring."""
    spans = []
    for sub, label in marks:
        i = text.index(sub)
        spans.append(Span(i, i + len(sub), label))
    return SurrogateRenderer(KEY).render(Note("n", text, patient), spans)


@pytest.mark.parametrize(
    ("text", "marks", "expected"),
    [
        # vitals and lab values a model flagged (issue 31, item 17)
        ("ABG 7.47/32/151", [("32", "DATE")], "ABG 7.47/[**DATE**]/151"),
        ("NBP 91/92-173/84", [("91/92", "DATE")], "NBP [**DATE**]-173/84"),
        ("BP 153/98", [("98", "AGE")], "BP 153/[**AGE**]"),
        ("BP 80/98-166/77", [("98", "AGE"), ("-", "DATE")], "BP 80/[**AGE**][**DATE**]166/77"),
        ("BP 120/80", [("120/80", "DATE")], "BP [**DATE**]"),
        ("pH 7.4 K 3.9", [("7.4", "DATE"), ("3.9", "IDNUM")], "pH [**DATE**] K [**ID**]"),
        ("SpO2 97% HR 98", [("97", "AGE"), ("98", "PHONE")], "SpO2 [**AGE**]% HR [**CONTACT**]"),
        ("Hct 32 today", [("32", "DATE")], "Hct [**DATE**] today"),
        ("urine 1500 cc", [("1500", "DATE")], "urine [**DATE**] cc"),
        # doses
        ("metoprolol 25 mg", [("25", "DATE")], "metoprolol [**DATE**] mg"),
        ("1/2 tab qhs", [("1/2", "DATE")], "[**DATE**] tab qhs"),
        ("take 1-2 puffs", [("1-2", "DATE")], "take [**DATE**] puffs"),
        ("heparin 5000 units", [("5000", "IDNUM")], "heparin [**ID**] units"),
        # times
        ("given at 08:40", [("08:40", "DATE")], "given at [**DATE**]"),
        ("08:40", [("08:40", "PHONE")], "[**CONTACT**]"),
        # not a category value at all
        ("age ninety", [("ninety", "AGE")], "age [**AGE**]"),
        ("pt 250 lbs", [("250", "AGE")], "pt [**AGE**] lbs"),
        ("seen by 12", [("12", "DOCTOR")], "seen by [**NAME**]"),
        ("in 32", [("32", "CITY")], "in [**LOCATION**]"),
    ],
)
def test_surrogates_never_rewrite_clinical_numbers(
    text: str, marks: list[tuple[str, str]], expected: str
) -> None:
    assert _render_marked(text, marks) == expected


@pytest.mark.parametrize(
    ("text", "marks", "expected"),
    [
        # invisible characters inside or beside the span: judged as members read the note
        ("BP 1\u200b2\u200b0/80", [("1\u200b2\u200b0", "AGE")], "BP [**AGE**]/80"),
        ("BP 120\u200b/80", [("120", "AGE")], "BP [**AGE**]\u200b/80"),
        ("BP 153/\u200b\u200b98", [("98", "AGE")], "BP 153/\u200b\u200b[**AGE**]"),
        ("metoprolol 1\u200b2\u200b5 mg", [("1\u200b2\u200b5", "IDNUM")], "metoprolol [**ID**] mg"),
        ("heparin 5000\u200b units", [("5000", "IDNUM")], "heparin [**ID**]\u200b units"),
        ("pt 95\u200b kg", [("95", "AGE")], "pt [**AGE**]\u200b kg"),
        # the same without them: unchanged
        ("BP 120/80", [("120", "AGE")], "BP [**AGE**]/80"),
        ("BP 153/98", [("98", "AGE")], "BP 153/[**AGE**]"),
        ("aged 98 today", [("98", "AGE")], "aged 90+ today"),
        # a real age with an invisible character is still an age
        ("aged 9\u200b8 today", [("9\u200b8", "AGE")], "aged 90+ today"),
        ("aged \u200b98 today", [("98", "AGE")], "aged \u200b90+ today"),
    ],
)
def test_measurements_are_recognised_through_invisible_characters(
    text: str, marks: list[tuple[str, str]], expected: str
) -> None:
    """The renderer draws a surrogate from the normalised value, so the measurement test must
    read the normalised note too: ``BP 1<U+200B>2<U+200B>0/80`` became ``BP 90+/80``."""
    assert _render_marked(text, marks) == expected


def test_real_dates_ages_and_codes_still_get_surrogates() -> None:
    text = ("Seen 7/22/2094 and in 1994 and '92, aged 98, 45 yo, call 617-555-1234, MRN 1234567, "
            "on 7/22.")
    marks = [("7/22/2094", "DATE"), ("1994", "DATE"), ("'92", "DATE"), ("aged 98", "AGE"),
             ("45 yo", "AGE"), ("617-555-1234", "PHONE"), ("1234567", "MEDICALRECORD"),
             ("7/22.", "DATE")]
    out = _render_marked(text, [(m, lbl) if m != "7/22." else ("7/22", lbl) for m, lbl in marks])
    assert "[**" not in out
    offset = date_offset_days(KEY, "p")
    moved = dt.date(2094, 7, 22) + dt.timedelta(days=offset)
    assert f"Seen {moved.month}/{moved.day}/{moved.year}" in out
    assert "aged 90+" in out and "45 yo" in out
    assert "617-555-1234" not in out and "1234567" not in out and "1994" not in out


def test_surrogate_fallback_is_the_upper_case_category_tag_of_tag_mode() -> None:
    """Issue 31 item 19: no lower-case or fine-label marker ever appears in surrogate output."""
    text = "Contact: john.at.example, mail JOHN, code 7, on -, age unknown."
    marks = [("john.at.example", "EMAIL"), ("JOHN", "EMAIL"), ("7", "IDNUM"), ("-", "DATE"),
             ("unknown", "AGE")]
    out = _render_marked(text, marks)
    tags = re.findall(r"\[\*\*(.*?)\*\*\]", out)
    assert tags == ["CONTACT", "CONTACT", "ID", "DATE", "AGE"]
    for email in ("jane.roe@example.org", "Jane.Roe@Example.org", "jroe@gmail.com"):
        note = build_note("n", "p", [("Contact: ", None), (email, "EMAIL")])
        sur = SurrogateRenderer(KEY).render(note, note.spans)
        assert "[**" not in sur and "@" in sur and email not in sur  # was "[**email**]"


def test_one_value_of_a_patient_gets_one_surrogate_whatever_its_fine_label() -> None:
    """Issue 31 item 20: LOWELL as CITY in one note and LOCATION in another was two cities."""
    n1 = build_note("1", "P", [("Lives in ", None), ("LOWELL", "CITY"), (", MRN ", None),
                               ("BX-12345", "MEDICALRECORD"), (", ", None), ("Jane", "PATIENT")])
    n2 = build_note("2", "P", [("Moved from ", None), ("Lowell", "LOCATION"), (", MRN ", None),
                               ("bx 12345", "IDNUM"), (", ", None), ("JANE", "RELATIVE")])
    s1, s2 = surrogates(n1), surrogates(n2)
    assert s1[0].casefold() == s2[0].casefold() and s1[0] == s1[0].upper()
    assert re.sub(r"\W", "", s1[1]).casefold() == re.sub(r"\W", "", s2[1]).casefold()
    assert s1[2].casefold() == s2[2].casefold()
    assert date_offset_days(KEY, "P") == date_offset_days(KEY, "P")


# ----------------------------------------------------------------------------- issue 38


def _rule_rendered(text: str, mode: str, patient: str = "p", **options: object) -> str:
    """``text`` tagged by the default rule member, rendered in ``mode``."""
    from dphub.rules.engine import RuleMember

    note = Note(id="n", text=text, patient_id=patient)
    return render(note, RuleMember().spans(text), mode, **options)


@pytest.mark.parametrize(("mode", "options"), [("tag", {}), ("redact", {}),
                                               ("redact", {"preserve_length": True})])
def test_a_decimal_age_and_a_far_date_are_hidden_whole(mode: str, options: dict) -> None:
    """"45.5 yo" became "45.[**AGE**] yo"; "12/31/9999" and "in 2150" were kept."""
    out = _rule_rendered("A 95.5 yo man, aged 45,5, seen 12/31/9999 and 01/02/2100, CABG in 2150.",
                         mode, **options)
    for kept in ("95", "45", "9999", "2100", "2150", ".5", ",5"):
        assert kept not in out, (mode, kept)


@pytest.mark.parametrize("patient", [f"p{i}" for i in range(8)])
def test_surrogates_of_decimal_ages_and_far_dates(patient: str) -> None:
    """Surrogate mode: a decimal age over 89 becomes 90+ (it was kept: only its "5" was a span);
    one up to 89 is kept as whole ages are; a date of year 9999 never crashes the shift (it
    overflowed the calendar for patients with a positive offset) and is masked: a known
    placeholder shifted would give the patient's offset away; a year of 2100 is shifted."""
    out = _rule_rendered("A 95.5 yo man, aged 45.5, seen 12/31/9999, 9999-12-31 and 01/02/2100, "
                         "CABG in 2150.", "surrogate", patient=patient, key=KEY)
    assert out.startswith("A 90+ yo man, aged 45.5, seen [**DATE**], [**DATE**] and ")
    assert "9999" not in out and "01/02/2100" not in out and "2150" not in out
    assert re.search(r" and \d\d/\d\d/(?:2099|2100) *, CABG in (?:2149|2151)\.$", out), out


def test_dp_dates_and_dp_ages_take_decimal_ages_and_far_dates() -> None:
    """The DP mechanisms: an age of 45.5 gets a noisy whole age (the fraction would tell more
    than the noise hides), a year-9999 date stays out of the chain (no interval to it)."""
    text = "aged 45.5, seen 12/31/9999 and 01/02/2100, 01/09/2100."
    r = SurrogateRenderer(KEY, dates="dp", date_unit="note", ages="dp")
    from dphub.rules.engine import RuleMember

    note = Note(id="n", text=text, patient_id="p")
    out = r.render(note, RuleMember().spans(text))
    m = re.fullmatch(r"aged (\d+), seen \[\*\*DATE\*\*\] and \d\d/\d\d/\d{4}, \d\d/\d\d/\d{4}\.",
                     out)
    assert m is not None, out
    assert r.date_points(note, RuleMember().spans(text)) == {
        ("abs", dt.date(2100, 1, 2).toordinal(), "day"),
        ("abs", dt.date(2100, 1, 9).toordinal(), "day")}
