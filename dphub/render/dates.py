"""Dates in surrogates: the forms dphub parses and re-emits in their own format (zero padding,
separators, month-name spelling and case, ordinals, 2- or 4-digit years, ranges, a trailing
time of day), moved by an offset. See :mod:`dphub.render.surrogate` for the policy."""

from __future__ import annotations

import calendar
import datetime as dt
import re
from collections.abc import Callable

from dphub.render.values import match_case

_MONTHS_FULL = [calendar.month_name[i] for i in range(1, 13)]
_MONTHS_ABBR = [calendar.month_abbr[i] for i in range(1, 13)]
_MONTH_RE = (
    r"(?P<mon>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
    r"sept?(?:ember)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)(?P<dot>\.)?"
)
_WEEKDAYS = [calendar.day_name[i] for i in range(7)]
_WEEKDAY_RE = re.compile(
    r"(?P<wd>mon(?:day)?|tue(?:s(?:day)?)?|wed(?:nesday)?|thu(?:r(?:s(?:day)?)?)?|"
    r"fri(?:day)?|sat(?:urday)?|sun(?:day)?)(?P<dot>\.)?",
    re.I,
)
_ORD = r"(?P<ord>st|nd|rd|th)?"
_DATE_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("ymd", re.compile(r"(?P<y>\d{4})(?P<sep>[-/.])(?P<m>\d{1,2})(?P=sep)(?P<d>\d{1,2})")),
    (
        "mdy",
        re.compile(r"(?P<m>\d{1,2})(?P<sep>[-/.])(?P<d>\d{1,2})(?:(?P=sep)(?P<y>\d{4}|\d{2}))?"),
    ),
    ("my", re.compile(r"(?P<m>\d{1,2})(?P<sep>/)(?P<y>\d{4}|\d{2})")),
    (
        "name_md",
        re.compile(
            _MONTH_RE + r"(?:(?P<sp>\s+)(?P<d>\d{1,2})" + _ORD + r")?"
            r"(?:(?P<ysep>,?\s+|,|\s*')(?P<y>\d{4}|\d{2}))?",
            re.I,
        ),
    ),
    (
        "name_dm",
        re.compile(
            r"(?P<d>\d{1,2})" + _ORD + r"(?P<sp>\s+(?:of\s+)?)" + _MONTH_RE
            + r"(?:(?P<ysep>,?\s+)(?P<y>\d{4}|\d{2}))?",
            re.I,
        ),
    ),
    ("year", re.compile(r"(?P<apos>')?(?P<y>\d{4}|\d{2})")),
    ("decade", re.compile(r"(?P<apos>')?(?P<y>\d{3}|\d)0(?P<s>'?s)", re.I)),
    ("day", re.compile(r"(?P<d>\d{1,2})(?P<ord>st|nd|rd|th)", re.I)),
]
_RANGE_RE = re.compile(r"(?P<a>.+?)(?P<sep>\s*(?:-|–|to|through|thru)\s*)(?P<b>.+)", re.I)
_TIME_RE = re.compile(
    r"(?P<date>.+?)(?P<time>,?\s*(?:at\s+)?\d{1,2}:\d{2}(?::\d{2})?(?:\s*[ap]\.?m\.?)?)", re.I
)
_REF_YEAR = 2000  # leap year: dates without a year are shifted inside it
#: a 4-digit number alone is read as a year only inside this range, and a full date is moved only
#: when its year lies in it: "12/31/9999" is an end-of-time placeholder everyone knows, so its
#: shifted form would tell the patient's offset (and it overflows the calendar); outside the
#: range a date falls back to the category tag (issue 38)
_YEARS = (1800, 2299)


def _month_index(token: str) -> int:
    t = token.casefold()[:3]
    return [m.casefold()[:3] for m in _MONTHS_ABBR].index(t) + 1


def _zero_padded(*fields: str) -> bool:
    """Whether a numeric date writes ``07``: a field with a leading zero, or all fields 2 digits."""
    return any(len(f) == 2 and f.startswith("0") for f in fields) or all(
        len(f) == 2 for f in fields
    )


def _fmt_num(value: int, padded: bool) -> str:
    return f"{value:02d}" if padded else str(value)


def _fmt_year(year: int, original: str) -> str:
    return f"{year % 100:02d}" if len(original) == 2 else f"{year:04d}"


def _full_year(text: str) -> int:
    y = int(text)
    if len(text) == 2:  # 2-digit years: 00-29 -> 2000s, else 1900s (only the last 2 digits return)
        y += 2000 if y < 30 else 1900
    return y


def _dated(g: dict[str, str | None]) -> bool:
    """Whether a parsed date has no year or one in :data:`_YEARS` (the range dphub moves)."""
    y = g.get("y")
    return not y or _YEARS[0] <= _full_year(y) <= _YEARS[1]


def _fmt_month_name(month: int, original: str) -> str:
    o = original.rstrip(".")
    full = _MONTHS_FULL[month - 1]
    if len(o) <= 3 and o.casefold() != "may":  # "May" could be either: it reads as full
        name = full[:3]
    elif len(o) == 4 and o.casefold() == "sept":
        name = "Sept" if month == 9 else full[:3]
    else:
        name = full
    return match_case(o, name)


def _ordinal(day: int, original: str | None) -> str:
    if not original:
        return ""
    suffix = "th" if 11 <= day % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return suffix.upper() if original.isupper() else suffix


def _add_months(year: int, month: int, months: int) -> tuple[int, int]:
    k = year * 12 + (month - 1) + months
    return k // 12, k % 12 + 1


def _valid(year: int, month: int, day: int) -> bool:
    return 1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]


#: ``(days, months, years)`` to move one parsed date by (see :func:`shift_date_text`)
Shift = tuple[int, int, int]
#: per-date shifts: given a parsed date (its pattern kind and match), its own shift, or None for
#: the run's offset
ShiftOf = Callable[[str, re.Match[str]], Shift | None]


def shift_date_text(text: str, offset: int, shift_of: ShiftOf | None = None) -> str | None:
    """``text`` (one date, any supported form) shifted by ``offset`` days in the same form, or
    None when it is not a date dphub can parse. See the module docstring for the policy.

    ``shift_of`` gives each parsed date (each end of a range) its own ``(days, months, years)``
    shift instead (DP dates, :mod:`dphub.render.dp_dates`); where it returns None, and for
    weekdays, ``offset`` applies as without it.
    """
    for kind, pattern in _DATE_PATTERNS:
        m = pattern.fullmatch(text)
        if m is None:
            continue
        own = shift_of(kind, m) if shift_of is not None else None
        out = _shift_match(kind, m, offset, own)
        if out is not None:
            return out
    m = _TIME_RE.fullmatch(text)
    if m is not None:  # "7/22/2094 10:30": the date moves, the time of day is kept
        day = shift_date_text(m["date"], offset, shift_of)
        return None if day is None else day + m["time"]
    m = _RANGE_RE.fullmatch(text)
    if m is not None:  # "1/12-1/13", "Jan 3 to Jan 5": shift both ends
        left = shift_date_text(m["a"], offset, shift_of)
        right = shift_date_text(m["b"], offset, shift_of)
        if left is not None and right is not None:
            return left + m["sep"] + right
    m = _WEEKDAY_RE.fullmatch(text)
    if m is not None:
        wd = [w.casefold()[:3] for w in _WEEKDAYS].index(m["wd"].casefold()[:3])
        new = _WEEKDAYS[(wd + (offset % 7 or 1)) % 7]
        token = m["wd"]
        name = new if len(token) > 4 else new[: max(3, len(token))]
        return match_case(token, name) + (m["dot"] or "")
    return None


def _shift_match(kind: str, m: re.Match[str], offset: int, own: Shift | None = None
                 ) -> str | None:
    g = m.groupdict()
    if own is None:
        month_shift = (1 if offset > 0 else -1) * max(1, round(abs(offset) / 30.44))
        year_shift = 1 if offset > 0 else -1
    else:
        offset, month_shift, year_shift = own
    if kind == "year":
        # a bare "32" or "1500" is a number before it is a year: only "'92" and 4-digit years of
        # a plausible range are years (anything else falls back to the category tag)
        if not g["apos"] and not (len(g["y"]) == 4 and _YEARS[0] <= int(g["y"]) <= _YEARS[1]):
            return None
        return (g["apos"] or "") + _fmt_year(_full_year(g["y"]) + year_shift, g["y"])
    if kind == "decade":
        if not g["apos"] and len(g["y"]) != 3:  # "1980s", "'80s"; a bare "80s" may be an age
            return None
        decade = int(g["y"]) * 10 + 10 * year_shift
        width = len(g["y"]) + 1
        return (g["apos"] or "") + f"{decade % 10**width:0{width}d}" + g["s"]
    if kind == "day":
        new = dt.date(_REF_YEAR, 1, 1) + dt.timedelta(days=int(g["d"]) - 1 + offset)
        if not 1 <= int(g["d"]) <= 31:
            return None
        return _fmt_num(new.day, g["d"].startswith("0")) + _ordinal(new.day, g["ord"])
    if not _dated(g):
        return None
    if kind == "my":
        month, year = int(g["m"]), int(g["y"])
        if not 1 <= month <= 12:
            return None
        y, mo = _add_months(year, month, month_shift)
        return f"{_fmt_num(mo, _zero_padded(g['m']))}{g['sep']}{_fmt_year(y, g['y'])}"
    if kind in ("ymd", "mdy"):
        month, day = int(g["m"]), int(g["d"])
        year = _full_year(g["y"]) if g.get("y") else _REF_YEAR
        swapped = False
        if kind == "mdy" and not g.get("y") and g["sep"] != "/":
            return None  # "7.4" is a lab value, "1-2" a dose: without a year only 7/22 is a date
        if kind == "mdy" and month > 12 and day <= 12:  # day/month order
            month, day, swapped = day, month, True
        if not _valid(year, month, day):
            return None
        new = dt.date(year, month, day) + dt.timedelta(days=offset)
        pad = _zero_padded(g["m"], g["d"])
        if kind == "ymd":
            return (
                f"{new.year:04d}{g['sep']}{_fmt_num(new.month, pad)}{g['sep']}"
                f"{_fmt_num(new.day, pad)}"
            )
        first, second = (new.day, new.month) if swapped else (new.month, new.day)
        out = f"{_fmt_num(first, pad)}{g['sep']}{_fmt_num(second, pad)}"
        if g.get("y"):
            out += g["sep"] + _fmt_year(new.year, g["y"])
        return out
    # month names
    month = _month_index(g["mon"])
    mon_text = g["mon"] + (g["dot"] or "")
    if g.get("d") is None:  # month alone or month + year
        if g.get("y"):
            y, mo = _add_months(_full_year(g["y"]), month, month_shift)
            return _fmt_month_name(mo, mon_text) + (g["dot"] or "") + g["ysep"] + _fmt_year(
                y, g["y"]
            )
        _, mo = _add_months(_REF_YEAR, month, month_shift)
        return _fmt_month_name(mo, mon_text) + (g["dot"] or "")
    day = int(g["d"])
    year = _full_year(g["y"]) if g.get("y") else _REF_YEAR
    if not _valid(year, month, day):
        return None
    new = dt.date(year, month, day) + dt.timedelta(days=offset)
    mon_out = _fmt_month_name(new.month, mon_text) + (g["dot"] or "")
    day_out = _fmt_num(new.day, g["d"].startswith("0")) + _ordinal(new.day, g.get("ord"))
    year_out = g["ysep"] + _fmt_year(new.year, g["y"]) if g.get("y") else ""
    if kind == "name_md":
        return f"{mon_out}{g['sp']}{day_out}{year_out}"
    return f"{day_out}{g['sp']}{mon_out}{year_out}"


#: what DP dates (:mod:`dphub.render.dp_dates`) perturb: the timeline a parsed date lies on
#: (``abs``: dates with a year; ``md``: month/day without one, in the leap reference year), its
#: day (the 1st of a month-level date, 1 January of a year) and its resolution
DatePoint = tuple[str, int, str]


def date_point(kind: str, m: re.Match[str]) -> DatePoint | None:
    """The point in time of one parsed date (a pattern of :data:`_DATE_PATTERNS`), or None for
    what has no place on a timeline (a day alone, a decade) or is no date.

    Mirrors the checks of :func:`_shift_match`, so a date gets a point exactly when it would be
    shifted.
    """
    g = m.groupdict()
    try:
        if kind == "year":
            if not g["apos"] and not (len(g["y"]) == 4 and _YEARS[0] <= int(g["y"]) <= _YEARS[1]):
                return None
            return ("abs", dt.date(_full_year(g["y"]), 1, 1).toordinal(), "year")
        if kind in ("my", "ymd", "mdy", "name_md", "name_dm") and not _dated(g):
            return None
        if kind == "my":
            month = int(g["m"])
            if not 1 <= month <= 12:
                return None
            return ("abs", dt.date(_full_year(g["y"]), month, 1).toordinal(), "month")
        if kind in ("ymd", "mdy"):
            month, day = int(g["m"]), int(g["d"])
            year = _full_year(g["y"]) if g.get("y") else _REF_YEAR
            if kind == "mdy" and not g.get("y") and g["sep"] != "/":
                return None
            if kind == "mdy" and month > 12 and day <= 12:
                month, day = day, month
            if not _valid(year, month, day):
                return None
            return ("abs" if g.get("y") else "md", dt.date(year, month, day).toordinal(), "day")
        if kind in ("name_md", "name_dm"):
            month = _month_index(g["mon"])
            year = _full_year(g["y"]) if g.get("y") else _REF_YEAR
            line = "abs" if g.get("y") else "md"
            if g.get("d") is None:
                return (line, dt.date(year, month, 1).toordinal(), "month")
            if not _valid(year, month, int(g["d"])):
                return None
            return (line, dt.date(year, month, int(g["d"])).toordinal(), "day")
    except (ValueError, OverflowError):
        return None
    return None  # "day" ("20th") and "decade" ("1980s"): no point in time


def date_points(text: str) -> list[DatePoint]:
    """Every point in time of a date span (both ends of a range); [] when none parses."""
    found: list[DatePoint] = []

    def collect(kind: str, m: re.Match[str]) -> Shift | None:
        p = date_point(kind, m)
        if p is not None:
            found.append(p)
        return None

    if shift_date_text(text, 1, collect) is None:
        return []
    return found
