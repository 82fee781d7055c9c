"""The rule member: patterns and dictionaries, positives and negatives (incl. ALL CAPS notes)."""

from __future__ import annotations

import pytest

from dphub.errors import ConfigError
from dphub.notes import Note
from dphub.rules.engine import DICTIONARY_SCORE, PATTERN_SCORE, RuleMember, RuleOptions


@pytest.fixture(scope="module")
def rules() -> RuleMember:
    return RuleMember()


def found(rules: RuleMember, text: str) -> list[tuple[str, str]]:
    return [(text[s.start : s.end], s.label) for s in rules.spans(text)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("seen 10/12/2003 and 2003-10-12", [("10/12/2003", "DATE"), ("2003-10-12", "DATE")]),
        ("on 3/15 and 12-25-99", [("3/15", "DATE"), ("12-25-99", "DATE")]),
        ("Jan 5th, 2019 and 5 March 2020", [("Jan 5th, 2019", "DATE"), ("5 March 2020", "DATE")]),
        ("SEEN ON DECEMBER 3RD", [("DECEMBER 3RD", "DATE")]),
        ("home for Christmas", [("Christmas", "DATE")]),
        ("CABG IN 2001, MI '92, DX 1987", [("2001", "DATE"), ("'92", "DATE"), ("1987", "DATE")]),
        ("call (617) 555-1234 or 617.555.1234 x12", [("(617) 555-1234", "PHONE"),
                                                     ("617.555.1234 x12", "PHONE")]),
        ("FAMILY AT 555-1234", [("555-1234", "PHONE")]),
        ("mail a.b@example.org see www.example.org/x.", [("a.b@example.org", "EMAIL"),
                                                         ("www.example.org/x", "URL")]),
        ("ip 10.0.0.255 ssn 123-45-6789", [("10.0.0.255", "IPADDR"), ("123-45-6789", "SSN")]),
        ("MRN: 00123456", [("00123456", "MEDICALRECORD")]),
        ("Boston, MA 02215-1234", [("Boston", "CITY"), ("MA", "STATE"), ("02215-1234", "ZIP")]),
        ("PT IS A 58 YO MAN", [("58", "AGE")]),
        ("58yo woman, 71 y/o man, 64-year-old", [("58", "AGE"), ("71", "AGE"), ("64", "AGE")]),
        ("AGE >89", [(">89", "AGE")]),
        ("DR. SMITH NOTIFIED", [("SMITH", "DOCTOR")]),
        ("MR. KOWALCZYK VISITED", [("KOWALCZYK", "NAME")]),
        ("WIFE MARY AND SON JOHN IN", [("MARY", "RELATIVE"), ("JOHN", "RELATIVE")]),
        ("spoke with son mark and dr. kowalczyk", [("mark", "RELATIVE"), ("kowalczyk", "DOCTOR")]),
        ("JOHN HAMILTON VISITED", [("JOHN", "NAME"), ("HAMILTON", "NAME")]),
        ("DR. MARK GRANT CALLED", [("MARK", "DOCTOR"), ("GRANT", "DOCTOR")]),
        ("TRANSFER TO BETH ISRAEL DEACONESS MEDICAL CENTER",
         [("BETH ISRAEL DEACONESS MEDICAL CENTER", "HOSPITAL")]),
        ("moved from Mexico to Worcester", [("Mexico", "COUNTRY"), ("Worcester", "CITY")]),
        ("TRANSFERRED TO PFEIFFER REHAB", [("PFEIFFER REHAB", "HOSPITAL")]),
        ("PT LIVES IN QUIXBURY", [("QUIXBURY", "LOCATION-OTHER")]),  # no list has it
        ("PT LIVES IN MARSHFIELD", [("MARSHFIELD", "CITY")]),  # a GeoNames town
    ],
)
def test_positives(rules: RuleMember, text: str, expected: list[tuple[str, str]]) -> None:
    assert found(rules, text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "PT MAY NEED FOLEY. WILL MONITOR. BILL PAID.",
        "AMBER URINE, LE EDEMA, MAX ASSIST WITH WALKER, X-RAY DONE",
        "HOPE TO WEAN. MARK ON SKIN. GRANT FUNDING. WHITE SPUTUM. SHORT OF BREATH",
        "GIVE 1/2 NS AND 3/4 STRENGTH FEEDS",
        "BP 120/80 HR 88 RR 18 T 98.6 K 4.2 WBC 12.5",
        "MS: ALERT. MD AWARE. DEC BS ON LEFT. PER MAR 5 MG",
        "HEPARIN 1000 UNITS, 25000 UNITS IN 500",
        "SEEN AT 1900 AND 2000, IN 1500 ML, 1980 KCAL",
        "TRANSFERRED TO HOSPITAL. GENERAL HOSPITAL COURSE",
        "the hospital and the clinic, mark the page",
        "PS 10/5 PEEP 5, CPAP 5/5, STRENGTH 4/5, FIO2 12/5/40%",
        "ABD SOFT, NT, ND. BP 90'S, HR >90, SATS MID 90S",
        "NP SUCTIONED. MS. O SLEEPING. 800-1000 NAP, 0930-1000 PT",
        "TRANSFERRED TO FLOOR, DISCHARGED TO REHAB, ADMITTED FROM OSH",
    ],
)
def test_negatives(rules: RuleMember, text: str) -> None:
    assert found(rules, text) == []


def test_scores_patterns_over_dictionaries_and_threshold(rules: RuleMember) -> None:
    note = Note("n", "DR. SMITH SAW HIM ON 10/12/2003")
    (spans,) = rules.tag([note])
    assert [s.score for s in spans] == [DICTIONARY_SCORE, PATTERN_SCORE]
    assert all(s.source == "rules:default" for s in spans)
    (only_patterns,) = rules.tag([note], threshold=0.7)
    assert [s.label for s in only_patterns] == ["DATE"]


def test_allow_deny_and_times_options() -> None:
    text = "Dr. Smith at Acme Ward at 10:30 pm"
    plain = RuleMember()
    assert found(plain, text) == [("Smith", "DOCTOR")]
    opts = RuleOptions.from_dict({"allow": ["smith"], "deny": {"Acme Ward": "HOSPITAL"},
                                  "times": True})
    custom = RuleMember(options=opts)
    assert found(custom, text) == [("Acme Ward", "HOSPITAL"), ("10:30 pm", "DATE")]
    with pytest.raises(ConfigError):
        RuleOptions.from_dict({"colour": 1})
    with pytest.raises(ConfigError):
        RuleOptions.from_dict({"deny": {"x": "NOT-A-LABEL"}})


def test_min_age_keeps_only_hipaa_ages() -> None:
    hipaa = RuleMember(options=RuleOptions.from_dict({"min_age": 90}))
    assert found(hipaa, "58 YO MAN, 92 YO WOMAN, AGE >89") == [("92", "AGE"), (">89", "AGE")]
    with pytest.raises(ConfigError):
        RuleOptions.from_dict({"min_age": "ninety"})


# --- context rules for words that are in no list (invented names: Quelpor, Zandrit, Vornak ...)
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # month/year dates and "MONTH of YEAR"
        ("echo 5/84 showed EF 35%", [("5/84", "DATE")]),
        ("S/P AVR 6/81, MI 3/1993", [("6/81", "DATE"), ("3/1993", "DATE")]),
        ("SEEN ONCE IN APRIL OF 1987.", [("APRIL OF 1987", "DATE")]),
        # a relative word, then a word that is no English word
        ("dtr quelpor called", [("quelpor", "RELATIVE")]),
        ("SOCIAL:SISTER-ZANDRIT---555", [("ZANDRIT", "RELATIVE")]),
        # "Name Surname (son)"
        ("Quelpor Vornak (son) cell", [("Quelpor", "RELATIVE"), ("Vornak", "RELATIVE")]),
        # an initial and a surname
        ("Z. VORNAK AWARE OF K+", [("Z", "NAME"), ("VORNAK", "NAME")]),
        # a signature with a credential, hyphenated surname included
        ("QUIET NIGHT.   ZANDRIT Q. VORNAK-QUELPOR, RRT",
         [("ZANDRIT", "DOCTOR"), ("Q", "DOCTOR"), ("VORNAK", "DOCTOR"), ("QUELPOR", "DOCTOR")]),
        ("resp- Zandrit Vornak,MD made aware", [("Zandrit", "DOCTOR"), ("Vornak", "DOCTOR")]),
        # an abbreviated role, then a word in no list
        ("SPOKE WITH HO VORNAK", [("VORNAK", "DOCTOR")]),
        # places after a transfer verb: a word in no list, or a GeoNames town
        ("transfer to quelpor 6 when bed ready", [("quelpor", "LOCATION-OTHER")]),
        ("TRANSFERRED TO VH FOR MRI", [("VH", "LOCATION-OTHER")]),
        ("TAKEN TO LIBERTY REGIONAL", [("LIBERTY REGIONAL", "HOSPITAL")]),
        ("son from Kalispell called", [("Kalispell", "CITY")]),
        # hospital initialisms and wards after a preposition
        ("MED FLIGHTED TO BWH FOR CATH", [("BWH", "HOSPITAL")]),
        ("seen at cpmc; RESP DISTRESS ON QUELPOR 6",
         [("cpmc", "LOCATION-OTHER"), ("QUELPOR", "LOCATION-OTHER")]),
    ],
)
def test_context_positives(rules: RuleMember, text: str, expected: list[tuple[str, str]]) -> None:
    assert found(rules, text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "DAUGHTER HAS LEFT AND WILL RETURN AT NOON",  # a function word after a relative word
        "son visited, wife at bedside",              # English words after relative words
        "GROWING E. COLI AND C. DIFF NEG",           # organisms, not initials + surnames
        "pt denies N/V. Ondansetron held.",          # a letter after a slash
        "crackles at the L. Sao2 >93%",              # a side letter, a word with digits
        "S. CAPTOPRIL GIVEN",                        # a section letter before a drug name
        "TRANSFERRED TO MICU, THEN TO OR",           # units and rooms
        "GO TO SLEEP",                               # no place context, English word
        "MS slowly clearing today",                  # mental status, not Ms.
        "Per HO RUL infiltrate",                     # an abbreviation after a role
        "PA CATHETER PLACED",                        # pulmonary artery, an English word
        "PS 10/60 AND PEEP 5",                       # ventilator settings, not 10/1960
        "PT ON SIMV 12, MSO4 2MG, FIO2 50%",         # ventilator modes and drugs, not wards
        "WARM TO TOUCH, ENCOURAGED TO COUGH",        # English words shaped like initialisms
        "ICH ON CT, TRANSFERRED FOR SAH",            # clinical initialisms
        "CHANGED TO QUELPORIN 40 DAILY",             # a drug and its dose
    ],
)
def test_context_negatives(rules: RuleMember, text: str) -> None:
    assert found(rules, text) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # numeric dates joined to a word, ranges, years ending a sentence or after an event
        ("LITHIUM LEVEL-4/7/91. UO-8/12 LOW", [("4/7/91", "DATE"), ("8/12", "DATE")]),
        ("back to Vornakwood.6/14 stable", [("6/14", "DATE")]),
        ("cultures from 1/12-1/13 pending", [("1/12", "DATE"), ("1/13", "DATE")]),
        ("PMH: CVA 2006, CABG 1958, 1972. MI 1994.",
         [("2006", "DATE"), ("1958", "DATE"), ("1972", "DATE"), ("1994", "DATE")]),
        ("prostate CA'91, GERD", [("'91", "DATE")]),
        # phone numbers in more shapes, pagers
        ("dtr Zandrit- 617- 555- 0143.", [("Zandrit", "RELATIVE"), ("617- 555- 0143", "PHONE")]),
        ("(617/555/0143) and SON---617 555-0199", [("617/555/0143", "PHONE"),
                                                 ("617 555-0199", "PHONE")]),
        ("wife (617555-0143) called", [("617555-0143", "PHONE")]),
        ("Pager: #41234, PG 55021, beeper number 30917",
         [("41234", "PHONE"), ("55021", "PHONE"), ("30917", "PHONE")]),
        # institutions: a specific word with qualifiers, a saint's name
        ("WORKS AT QUIXBURY MEMORIAL HOSPITAL, NIGHTS", [("QUIXBURY MEMORIAL HOSPITAL", "HOSPITAL")]),
        ("SEEN AT SYCAMORE MEMORIAL LAST YEAR", [("SYCAMORE MEMORIAL", "HOSPITAL")]),
        ("wants to return to St. Agnes's after weaning", [("St. Agnes's", "HOSPITAL")]),
        ("FOUND DOWN IN ST JOSEPH HOSPITAL", [("ST JOSEPH HOSPITAL", "HOSPITAL")]),
        # names that are also words, written as names; a name found once is found again
        ("Family: son Jack called, will call back", [("Jack", "RELATIVE")]),
        ("Spoke with Quelpor Vornak (son). Quelpor agrees with plan.",
         [("Quelpor", "RELATIVE"), ("Vornak", "RELATIVE"), ("Quelpor", "RELATIVE")]),
        # a note written all in lower case: its case says nothing, so dictionary names count
        ("pt seen by nurse. susan wheeler rn aware. plan as above.",
         [("susan", "DOCTOR"), ("wheeler", "DOCTOR")]),
    ],
)
def test_more_positives(rules: RuleMember, text: str, expected: list[tuple[str, str]]) -> None:
    assert found(rules, text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "rates pain 2/10, cp 6/10 eased, c/o 7/10 HA",       # pain scores, not dates
        "vent ac 450x14x.4/8 peep, wean to 5/5",             # ventilator settings
        "Keep leg straight until 2000. NPO after 2400",      # clock times
        "SON IN LAW PHONED, WILL RETURN",                    # census names that are words
        "lengthy hospital stay, poss rehab after",           # lower case: no institution
        "HAD LENGTHY HOSPITAL STAY, SEEN WANDERING HOSPITAL HALLS",  # capitals: none either
        "ST ELEVATION IN V2, ST CHANGES, ON ETOH GTT, MECH VENT",
    ],
)
def test_more_negatives(rules: RuleMember, text: str) -> None:
    assert found(rules, text) == []


# --- issue 38: a decimal age is one span; far years are dates, quantities stay numbers
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Pt is a 45.5 yo man", [("45.5", "AGE")]),
        ("45,5 y/o F", [("45,5", "AGE")]),
        ("aged 45.5", [("45.5", "AGE")]),
        ("AGE: 45.5, MALE", [("45.5", "AGE")]),
        ("a 45.5-year-old", [("45.5", "AGE")]),
        ("an infant of .5 yo", [(".5", "AGE")]),
        ("a 2.25 yr old", [("2.25", "AGE")]),
    ],
)
def test_a_decimal_age_is_one_span(rules: RuleMember, text: str,
                                   expected: list[tuple[str, str]]) -> None:
    """The age pattern once took only the digits after the point: "45.5 yo" became
    "45.[**AGE**] yo", the age in plain sight."""
    assert found(rules, text) == expected


def test_min_age_reads_a_decimal_age_whole() -> None:
    """With HIPAA's min_age 90, "90.5 yo" was dropped (its "5" is below 90) and kept."""
    hipaa = RuleMember(options=RuleOptions.from_dict({"min_age": 90}))
    assert found(hipaa, "A 90.5 YO WOMAN, 89.5 YO MAN, AGED 93.5") == [("90.5", "AGE"),
                                                                         ("93.5", "AGE")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("seen 12/31/9999, 12/31/99 and 9999-12-31",
         [("12/31/9999", "DATE"), ("12/31/99", "DATE"), ("9999-12-31", "DATE")]),
        ("seen 01/02/2100 and 3-4-2187", [("01/02/2100", "DATE"), ("3-4-2187", "DATE")]),
        ("CABG in 2150, MI since 2099", [("2150", "DATE"), ("2099", "DATE")]),
        ("echo 3/2150", [("3/2150", "DATE")]),
        # the neighbours: kept as before (a dose, a blood pressure, a unit, a clock time, a count)
        ("in 2150 gave 2500 mg, bp 2100, of 2400 kcal, NPO after 2400, total of 3500, "
         "aprox 2400, off since 2315", [("2150", "DATE")]),
    ],
)
def test_years_after_2029_are_dates(rules: RuleMember, text: str,
                                    expected: list[tuple[str, str]]) -> None:
    """A bare or month/year year up to 2299 (the years surrogates move) needs a year word before
    it, as 2000-2029 always did; a m/d/y date takes any 4-digit year from 1800 (the date itself is
    the evidence: "12/31/9999" is an end-of-time placeholder, a year of 2100 a shifted one)."""
    assert found(rules, text) == expected
