"""The structured patterns of the rule member: regular expressions and their number checks.

Why a module of its own: dates, phone numbers, ids, ZIP codes and ages are matched by format, and
each format needs a check on its numbers and context (a month is 1-12; "4/5" after a strength or
"10/5" after PEEP is not a date; "2/10" next to "pain" is a score; "800-1000" is a time range,
not a phone). Those regexes and checks (:func:`pattern_check_passes`) change together and independently of the
word lists (:mod:`dphub.rules.lexicon`) and of the member that applies them
(:mod:`dphub.rules.engine`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# ----------------------------------------------------------------------------- patterns
_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
    r"sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)
_ORD = r"(?:st|nd|rd|th)?"
_YEAR = r"(?:\d{4}|'\d{2})"
#: month abbreviations that are also clinical abbreviations (MAR = medication record, DEC =
#: decreased): accepted only spelled out or with a year.
_RISKY_MONTHS = {"mar", "mar.", "dec", "dec."}
#: common fractions written like m/d dates ("1/2 NS", "3/4 strength")
_FRACTIONS = {(1, 2), (1, 3), (1, 4), (1, 8), (2, 3), (3, 4)}
_UNIT_AFTER = re.compile(r"\s*(?:mg|mcg|ml|cc|units?|u\b|kcal|cal|gm?\b|meq|x\b|/|cm|mm|#)", re.I)
_YEAR_CONTEXT = re.compile(r"\b(?:in|since|from|of|year|yr|circa|born|dob|summer|winter|"
                           r"spring|fall|autumn|early|late|mid|jan\w*|feb\w*|mar\w*|apr(?:il)?|may|"
                           r"jun\w*|jul\w*|aug\w*|sep\w*|oct\w*|nov\w*|dec\w*|"
                           # a past event: "CVA 2006", "MI 1994", "CABG 1958, 1972", "dx'd 2009"
                           r"mi|cva|tia|cabg|ptca|pci|avr|mvr|stent(?:ed|s)?|turp|dx(?:'?d)?|"
                           r"diagnosed|surgery|repair|resection|transplant|\d{4},)[\s.,']*$",
                           re.IGNORECASE)
_VENT_CONTEXT = re.compile(r"\b(?:peep|ps|psv|cpap|bipap|ips|eps|imv|simv|ac|vent|strength)\b[\s:]*$|"
                           r"\b(?:peep|ps|psv|cpap|bipap)\b", re.IGNORECASE)

_PAIN_CONTEXT = re.compile(r"pain|\bcp\b|discomfort|ache\b|\bscale\b|\brat(?:es|ed|ing)\b",
                           re.IGNORECASE)
_VENT_AFTER = re.compile(r"\s{0,2}(?:peep|ps|psv|cpap|bipap)\b", re.IGNORECASE)

IGNORECASE = re.IGNORECASE
#: where a numeric date may start: not inside a number, a fraction or a decimal ("0.8/31"), but
#: right after a word joined by a hyphen or period ("LEVEL-4/7/91", "Vornakwood.6/14")
_NUM_DATE_START = r"(?<![\d/])(?<!\d[.-])"
#: an age in years, whole or decimal ("45", "45.5", "45,5", ".5"): the number as one group, never
#: the digits after a decimal point alone ("45.5 yo" once became "45.[**AGE**] yo", issue 38)
_AGE_DIGITS = r"(\d{1,3}(?:[.,]\d+)?|(?<![.,])\.\d+)"
_AGE_NUMBER = r"(?<!\w)(?<!\d[.,])" + _AGE_DIGITS


@dataclass(frozen=True)
class _Pattern:
    label: str
    regex: re.Pattern[str]
    group: int = 0
    check: str | None = None  # name of a validation function


PATTERNS: tuple[_Pattern, ...] = (
    # --- contact
    _Pattern("EMAIL", re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")),
    _Pattern("URL", re.compile(r"\b(?:https?://|www\.)[^\s<>\"']+[^\s<>\"'.,;:)]", IGNORECASE)),
    _Pattern("IPADDR", re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])"), check="ip"),
    _Pattern("SSN", re.compile(r"(?<![\d-])\d{3}-\d{2}-\d{4}(?![\d-])")),
    _Pattern("SSN", re.compile(r"\b(?:ssn|social security(?: number| no\.?)?)[:#\s]*(\d{9})\b", IGNORECASE), 1),
    _Pattern(
        "PHONE",
        re.compile(
            # "(617) 555-1234", "617.555.1234", "617 555-0199", "617- 555- 0143", "617/555/0143";
            # a hyphen before it only counts when it follows a digit ("SON---617 555-0199")
            r"(?<!\d)(?<!\d-)(?:\+?1[\s.-]?)?(?:\(\d{3}\)\s*|\d{3}(?:[\s.-]|-\s|/(?=\d{3}/)))"
            r"\d{3}(?:[\s.-]|-\s|/)\d{4}"
            r"(?:\s*(?:x|ext\.?)\s*\d{1,5})?(?![\d-])",
            IGNORECASE,
        ),
        check="phone",
    ),
    _Pattern("PHONE", re.compile(r"(?<![\d-])\d{3}-\d{4}(?![\d-])"), check="phone"),
    # area code run into the exchange: "617555-0143"
    _Pattern("PHONE", re.compile(r"(?<![\d-])\d{6}-\d{4}(?![\d-])"), check="phone"),
    _Pattern(
        "PHONE",
        # "pager 12345", "Pager: #41234", "PG 55021", "beeper number 30917", "x4567"
        re.compile(r"\b(?:pager|beeper|pgr|pg|bpr|ext|x)\.?:?\s*(?:(?:number|no\.?|num)\s*)?#?\s*"
                   r"(\d{4,5})(?!\d|[.,]\d|[/:]|\s*(?:mg|mcg|ml|cc|units?|u\b|kcal|cal|gm?\b|meq|%))", IGNORECASE),
        1,
        check="phone",
    ),
    # --- ids
    _Pattern(
        "MEDICALRECORD",
        re.compile(
            r"\b(?:mrn|mr\s?#|mr no\.?|medical record(?: number| no\.?| #)?|unit no\.?|"
            r"record #|acct\.?|account(?: number| no\.?)?)[:#\s]*([a-z]{0,2}\d[\d-]{3,}\d)",
            IGNORECASE,
        ),
        1,
    ),
    _Pattern("IDNUM", re.compile(r"(?<![\d.,/-])\d{7,}(?![\d.,/-])")),
    # --- dates
    _Pattern("DATE", re.compile(_NUM_DATE_START + r"\d{1,2}([/-])\d{1,2}\1(?:1[89]\d\d|[2-9]\d{3}|\d{2})(?![\d/-]|\s?%)"), check="mdy"),
    _Pattern("DATE", re.compile(_NUM_DATE_START + r"\d{4}([/-])\d{1,2}\1\d{1,2}(?![\d/-])"), check="ymd"),
    _Pattern("DATE", re.compile(_NUM_DATE_START + r"\d{1,2}/\d{1,2}(?![\d/]|\.\d|\s?%)"), check="md"),
    # the second date of a range: "1/12-1/13"
    _Pattern("DATE", re.compile(r"(?<![\d/])\d{1,2}/\d{1,2}-(\d{1,2}/\d{1,2})(?![\d/]|\.\d|\s?%)"), 1,
             check="md_range"),
    # month/year: "echo 5/84", "s/p AVR 6/81", "3/1993" (the m/d reading was rejected above)
    _Pattern("DATE", re.compile(_NUM_DATE_START + r"\d{1,2}/(?:\d{2}|19\d\d|2[0-2]\d\d)(?![\d/]|\.\d|\s?%)"),
             check="my"),
    _Pattern("DATE", re.compile(rf"\b{_MONTH}\s+\d{{1,2}}{_ORD}(?:,?\s+{_YEAR})?(?!\d)", IGNORECASE), check="month"),
    _Pattern("DATE", re.compile(rf"\b\d{{1,2}}{_ORD}\s+(?:of\s+)?{_MONTH}(?:,?\s+{_YEAR})?(?![a-z])", IGNORECASE), check="month"),
    _Pattern("DATE", re.compile(rf"\b{_MONTH},?\s+(?:of\s+)?(?:\d{{4}}|'\d{{2}})(?!\d)", IGNORECASE)),
    _Pattern("DATE", re.compile(r"(?<![\d'])'\d{2}(?![\d'])")),  # "in '88", "prostate CA'91"
    # a bare year (1900-2299: the years surrogates move; a later one is a count or a clock time,
    # "since 2315"); from 2000 on only after a year word (the check), so "bp 2100" stays
    _Pattern("DATE", re.compile(r"(?<![\d.:/-])(?:19\d\d|2[0-2]\d\d)(?!\d|\.\d|[:/%-])"), check="year"),
    _Pattern(
        "DATE",
        re.compile(
            r"\b(?:christmas(?: eve| day)?|thanksgiving|easter|new year'?s(?: eve| day)?|"
            r"independence day|memorial day|labor day|veterans day|halloween|hanukkah|"
            r"valentine'?s day|mother'?s day|father'?s day)\b",
            IGNORECASE,
        ),
    ),
    # --- locations with structure
    _Pattern("ZIP", re.compile(r"(?<![\d-])\d{5}-\d{4}(?![\d-])")),
    _Pattern("ZIP", re.compile(r"\bzip(?:\s*code)?[:#\s]*(\d{5})(?!\d)", IGNORECASE), 1),
    # --- ages
    _Pattern(
        "AGE",
        re.compile(
            _AGE_NUMBER + r"\s*-?\s*(?:yo|y/o|y\.o\.?|yrs?\.?[- ]old|years?[- ]old|"
            r"yo[mf]|yow[mf]|year-old)(?![a-z])",
            IGNORECASE,
        ),
        1,
    ),
    _Pattern("AGE", re.compile(r"\bage[d:]?\s*" + _AGE_DIGITS + r"(?!\d)", IGNORECASE), 1),
    _Pattern("AGE", re.compile(r"(?<![\w>])>\s?89(?![\d.])")),
    _Pattern("AGE", re.compile(r"\b(?:his|her|their)\s+(?:early\s+|late\s+|mid\s+)?(\d0'?s)\b", IGNORECASE), 1),
)

TIME_PATTERNS: tuple[_Pattern, ...] = (
    _Pattern("DATE", re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s*(?:am|pm|a\.m\.|p\.m\.))?", IGNORECASE)),
    _Pattern("DATE", re.compile(r"\b\d{1,2}\s*(?:am|pm|a\.m\.|p\.m\.)", IGNORECASE)),
)


def _is_time_range(s: str) -> bool:
    """``800-1000``, ``0930-1000``: two clock times on the hour or half hour, increasing."""
    a, b = s.split("-")
    times = [(int(x[:-2]), int(x[-2:])) for x in (a, b)]
    if not all(h <= 24 and mi < 60 for h, mi in times):
        return False
    return times[1] > times[0] and (a.endswith(("00", "30")) or b.endswith(("00", "30")))


def pattern_check_passes(check: str | None, m: re.Match[str], text: str) -> bool:
    if check is None:
        return True
    s = m.group(0)
    if check == "ip":
        return all(int(p) <= 255 for p in s.split("."))
    if check == "phone":
        # preceded by a decimal point: a measurement; "800-1000": a time range
        before = text[max(0, m.start() - 1) : m.start()]
        if re.fullmatch(r"\d{3,4}-\d{3,4}", s) and _is_time_range(s):
            return False
        return before != "."
    if check == "year":
        # a bare 4-digit number is a year when it cannot be a clock time (19xx with xx >= 60) or
        # a year word precedes it ("in 2001", "since 1998"), and no unit follows ("1000 units")
        if _UNIT_AFTER.match(text, m.end()):
            return False
        y = int(s)
        return (y < 2000 and y % 100 >= 60) or _YEAR_CONTEXT.search(
            text, max(0, m.start() - 16), m.start()) is not None
    nums = [int(x) for x in re.findall(r"\d+", s)]
    if check in ("mdy", "md", "my", "md_range") and _VENT_CONTEXT.search(text, max(0, m.start() - 12), m.start()):
        return False  # ventilator settings: "PS 10/5", "CPAP 5/5"
    if check in ("md", "md_range") and _VENT_AFTER.match(text, m.end()):
        return False  # "x.4/8 peep"
    if check == "mdy":
        a, b = nums[0], nums[1]
        return 1 <= a <= 12 and 1 <= b <= 31
    if check == "my":
        a, b = nums
        # a second part up to 31 is a day (the m/d pattern's case); above it, a year
        return 1 <= a <= 12 and (31 < b < 100 or b >= 1900)
    if check == "ymd":
        return 1 <= nums[1] <= 12 and 1 <= nums[2] <= 31
    if check == "md_range":  # both ends must read as month/day, the second not before the first
        a, b, c, d = nums
        return (1 <= a <= 12 and 1 <= b <= 31 and 1 <= c <= 12 and 1 <= d <= 31
                and (c, d) >= (a, b) and (a, b) not in _FRACTIONS and (c, d) not in _FRACTIONS)
    if check == "md":
        a, b = nums
        if b == 10 and _PAIN_CONTEXT.search(text, max(0, m.start() - 25), m.end() + 25):
            return False  # a pain score: "2/10 back pain", "cp 6/10"
        if (a, b) in _FRACTIONS or (b == 5 and a <= 5):  # fractions, motor strength "4/5"
            return False
        return 1 <= a <= 12 and 1 <= b <= 31
    if check == "month":
        word = re.search(r"[a-z]+\.?", s, re.IGNORECASE)
        day = nums[0]
        if not 1 <= day <= 31:
            return False
        has_year = len(nums) > 1
        return not (word and word.group(0).lower() in _RISKY_MONTHS and not has_year)
    return True
