"""Renderers: what a de-identified note looks like, given its predicted PHI spans.

A renderer turns one :class:`~dphub.notes.Note` and its (merged) predicted spans into output text:

``tag``        each span becomes its category, ``[**NAME**]`` (MIMIC style) or ``<NAME>``;
``redact``     each span becomes a fixed mask (``XXXXX``), or a same-length mask;
``surrogate``  each span becomes a realistic fake value (see :class:`SurrogateRenderer`);
``spans``      one JSONL record ``{"id", "spans": [{start, end, label, score, members}]}``
               (offsets only, no note text);
``brat``       the ``.ann`` file content (T-lines carry the span text: brat output is the user's
               own annotated data, and writing it is the point).

Spans are validated against the note (out-of-range offsets raise :class:`InputError` naming the
note id and offsets, never text). Overlapping spans are merged before text is replaced, so the
union of everything any ensemble member flagged disappears.

Surrogates (:class:`SurrogateRenderer`) are deterministic: every random choice is seeded with
``HMAC-SHA256(key, patient id, HIPAA category, normalised original value)``, so

* the same name/ID/place of one patient gets the same surrogate in every note of that patient
  (without any state shared between notes, so a resumed or parallel run is byte-identical),
  whatever the fine label a member gave it (``LOWELL`` as CITY in one note and as LOCATION in
  the next is one city); the value is normalised case-insensitively to its letters and digits;
* every date of a patient moves by the same offset of 1..365 days (either direction), derived from
  the key and the patient id only, so intervals between dates survive across notes;
* without the key nobody can recompute the mapping (the key must come from a file; there is no
  default key).

**A surrogate never rewrites what does not parse as its category.** A model may flag a piece
of a clinical value (``32`` in ``ABG 7.47/32/151`` as a date, ``98`` in ``BP 153/98`` as an age).
Drawing a surrogate for it would change a clinical number silently, so surrogate mode has one
fallback: the span becomes its upper-case category tag, exactly as ``--mode tag`` writes it
(``[**DATE**]``, ``[**AGE**]``, ``[**CONTACT**]`` ...). The fallback applies when

* the span is part of a number around it (a digit, or ``/ . : , -`` and a digit, right before or
  after it: ``7.47/[32]/151``, ``153/[98]``, ``[91/92]-173/84``) or a dose (a unit follows:
  ``[25] mg``, ``[1/2] tab``);
* a date does not parse as a date (below): ``91/92``, ``7.4``, ``08:40``, ``-``, a bare ``32``;
* an age is not a standalone age of at most 120 (``92``, ``92yo``, ``aged 92``, ``92-year-old``,
  ``18 months``, ``80s``): ``ninety``, ``153/98``, ``250``;
* a name holds a digit or no letter; a profession no letter;
* a phone or fax is not 5-15 digits in phone punctuation (``120/80``, ``7.47``); an email has no
  ``@``; a URL no host;
* an ID, ZIP or other code has fewer than 3 letters or digits (a room or OTHER: fewer than 1),
  or is a measurement (a decimal, a fraction, a time, a number with a unit);
* a place without letters is not a ZIP or room (``32`` as a city);
* every one of the redraws below collided.

No other tag marker ever appears in surrogate output.

Policies (documented choices where HIPAA Safe Harbor leaves room):

* **Dates** are parsed in many forms (``7/22``, ``07/22/2094``, ``7-22-94``, ``2094-07-22``,
  ``Jan 3rd``, ``January 3, 2094``, ``3 Jan 2094``, ``Jan 2094``, ``January``, weekday names,
  years alone) and re-emitted in the same form (zero padding, separators, month-name spelling and
  case, ordinal suffix, 2- or 4-digit years), as are ranges of two dates (``1/12-1/13``).
  A trailing time of day (``7/22/2094 10:30``) is kept.
  Dates without a year are shifted within the leap reference year 2000, so ``2/29`` stays
  valid; a day alone (``20th``) is shifted as a day of January 2000. Month-level dates move by the offset in whole
  months (at least one), **years alone move by one year in the direction of the offset**, so no
  year alone is ever re-emitted unchanged and year-to-year intervals are kept (decades, ``1980s``,
  move by ten years the same way); a full date's year follows from day arithmetic. Weekdays move by ``offset mod 7`` (one day when that is 0).
  A number alone is a year only with an apostrophe (``'92``) or as 4 digits in 1800-2299; a
  month/day without a year only with a slash (``7/22``, not ``7.4`` or ``1-2``); a decade with 4
  digits or an apostrophe (``1980s``, ``'80s``). Anything else becomes ``[**DATE**]``.
* **Ages** above 89 become ``90+`` (HIPAA aggregates them); ages of 89 and below are kept, being
  no identifier under Safe Harbor and clinically meaningful.
* **Phones, fax, IDs, MRNs, ZIP codes, rooms** keep their format: digits become random digits,
  letters random letters of the same case, punctuation and spacing are kept.
* **Names** are replaced word by word: a word Faker knows as a first name gets a first name,
  other words a last name, single letters (initials) another letter; titles (Dr., Mrs. ...)
  stay. So "John Smith", "Smith" and "JOHN" map consistently.
* **Case** follows the original: ALL CAPS stays caps, lower case stays lower, otherwise Faker's
  capitalisation.
* A surrogate equal to its original (case-insensitively), or sharing a word with any PHI span
  of the same note, is redrawn; that rare redraw is the only case where the same original can
  get different surrogates in two notes of a patient (when all 50 redraws collide the span is
  masked). The only values ever kept are ages <= 89, titles, and text without any letter or
  digit.

Determinism holds for a given Faker version (its name lists are data); record the version with
the output when byte-identical reruns matter.
"""

from __future__ import annotations

import calendar
import datetime as dt
import functools
import hashlib
import hmac
import json
import os
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from dphub.errors import ConfigError, InputError
from dphub.formats.brat import render_ann
from dphub.labels import category_of, fine_of
from dphub.notes import Note, Span, merge_overlapping
from dphub.textnorm import NormalizedText, normalize, normalized_text

__all__ = [
    "RENDERERS",
    "Renderer",
    "TagRenderer",
    "RedactRenderer",
    "SurrogateRenderer",
    "SpansRenderer",
    "BratRenderer",
    "render",
    "load_key",
    "prepare_spans",
    "date_offset_days",
]

#: Shortest secret accepted for surrogate seeding (bytes after stripping whitespace).
MIN_KEY_BYTES = 16


def prepare_spans(note: Note, spans: Sequence[Span], *, merge: bool = True) -> list[Span]:
    """Check spans against the note and return them sorted (and merged when ``merge``).

    Errors name the note id and offsets only.
    """
    n = len(note.text)
    for s in spans:
        if not (0 <= s.start < s.end <= n):
            raise InputError(
                f"note {note.id}: span {s.start}-{s.end} is empty or outside the text "
                f"(length {n})"
            )
        category_of(s.label, where=f"note {note.id}")
    if merge:
        return merge_overlapping(spans)
    return sorted(spans, key=lambda s: (s.start, s.end))


def _replace_spans(note: Note, spans: Sequence[Span], replacement: Callable[[Span], str]) -> str:
    """The note text with each (merged, sorted) span replaced by ``replacement(span)``."""
    out: list[str] = []
    pos = 0
    for s in prepare_spans(note, spans):
        out.append(note.text[pos : s.start])
        out.append(replacement(s))
        pos = s.end
    out.append(note.text[pos:])
    return "".join(out)


class Renderer(ABC):
    """Turns a note and its predicted spans into output text (one file's content)."""

    #: registry name (``--mode``)
    name: ClassVar[str]
    #: file suffix a runner should give the output
    suffix: ClassVar[str] = ".txt"

    @abstractmethod
    def render(self, note: Note, spans: Sequence[Span]) -> str:
        """Output for one note; never mutates ``note`` or ``spans``."""


class TagRenderer(Renderer):
    """Replace spans with their label: ``[**NAME**]`` (``style="mimic"``) or ``<NAME>``
    (``style="angle"``). ``granularity`` picks the HIPAA category (default) or the fine
    i2b2-style subcategory (``DOCTOR``, ``HOSPITAL`` ...)."""

    name = "tag"
    STYLES: ClassVar[dict[str, str]] = {"mimic": "[**{}**]", "angle": "<{}>"}

    def __init__(self, style: str = "mimic", granularity: str = "category") -> None:
        if style not in self.STYLES:
            raise ConfigError(f"unknown tag style {style!r}; use one of {', '.join(self.STYLES)}")
        if granularity not in ("category", "fine"):
            raise ConfigError(f"unknown tag granularity {granularity!r}; use category or fine")
        self.template = self.STYLES[style]
        self.label_of = category_of if granularity == "category" else fine_of

    def render(self, note: Note, spans: Sequence[Span]) -> str:
        return _replace_spans(note, spans, lambda s: self.template.format(self.label_of(s.label)))


class RedactRenderer(Renderer):
    """Replace spans with ``mask``; with ``preserve_length`` every non-whitespace character of a
    span becomes ``mask_char`` instead (layout and offsets survive, word lengths leak)."""

    name = "redact"

    def __init__(
        self, mask: str = "XXXXX", preserve_length: bool = False, mask_char: str = "X"
    ) -> None:
        if len(mask_char) != 1:
            raise ConfigError("the length-preserving mask must be a single character")
        self.mask = mask
        self.preserve_length = preserve_length
        self.mask_char = mask_char

    def render(self, note: Note, spans: Sequence[Span]) -> str:
        if not self.preserve_length:
            return _replace_spans(note, spans, lambda s: self.mask)
        return _replace_spans(
            note,
            spans,
            lambda s: "".join(c if c.isspace() else self.mask_char for c in note.span_text(s)),
        )


class SpansRenderer(Renderer):
    """One JSONL line per note: ``{"id", "spans": [{start, end, label, score, members}]}``.

    ``members`` lists the ensemble members that flagged the span, read from ``Span.source`` as a
    comma-joined string (the aggregation contract); ``[]`` when unknown. Spans are not merged
    (overlaps from different members are information here); no note text is written.
    """

    name = "spans"
    suffix = ".jsonl"

    def render(self, note: Note, spans: Sequence[Span]) -> str:
        records = [
            {
                "start": s.start,
                "end": s.end,
                "label": s.label,
                "score": None if s.score is None else float(s.score),
                "members": [m.strip() for m in (s.source or "").split(",") if m.strip()],
            }
            for s in prepare_spans(note, spans, merge=False)
        ]
        return json.dumps({"id": note.id, "spans": records}, ensure_ascii=False) + "\n"


class BratRenderer(Renderer):
    """The brat ``.ann`` content for the note's spans, as :mod:`dphub.formats.brat` writes it
    (one T-line per span, whitespace in the span text folded to single spaces)."""

    name = "brat"
    suffix = ".ann"

    def render(self, note: Note, spans: Sequence[Span]) -> str:
        return render_ann(replace(note, spans=prepare_spans(note, spans, merge=False)))


# --------------------------------------------------------------------------------------------
# surrogates


def key_recipe(path: str | os.PathLike[str] = "FILE") -> str:
    """How to make a surrogate key file: private from its first byte (``umask 077`` in a
    subshell), not made readable and then tightened by a later ``chmod``."""
    return f"create one with `(umask 077; openssl rand -hex 32 > {path})`"


def load_key(path: str | os.PathLike[str]) -> bytes:
    """Read the surrogate secret from ``path`` (surrounding whitespace stripped).

    A missing, unreadable or short key file is a :class:`ConfigError`: silently falling back to
    a default key would make every surrogate mapping recomputable by anyone.
    """
    p = Path(path)
    try:
        key = p.read_bytes().strip()
    except FileNotFoundError:
        raise ConfigError(
            f"key file {p} does not exist; {key_recipe(p)}"
        ) from None
    except OSError as exc:
        raise ConfigError(f"key file {p} cannot be read ({exc.strerror})") from None
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"key file {p} holds {len(key)} bytes; use at least {MIN_KEY_BYTES}: "
                          f"{key_recipe(p)}")
    return key


def _hmac_int(key: bytes, *parts: str) -> int:
    msg = "\x1f".join(parts).encode("utf-8")
    return int.from_bytes(hmac.new(key, msg, hashlib.sha256).digest(), "big")


def date_offset_days(key: bytes, patient_id: str) -> int:
    """The patient's date shift in days: in ``[-365, -1] U [1, 365]``, from HMAC(key, patient)."""
    v = _hmac_int(key, "date-offset", patient_id) % 730
    return v - 365 if v < 365 else v - 364


@functools.lru_cache(maxsize=4)
def _faker(locale: str) -> Any:
    from faker import Faker

    return Faker(locale)


@functools.lru_cache(maxsize=4)
def _first_name_method(locale: str) -> dict[str, str]:
    """Casefolded first name -> the Faker method drawing a replacement of the same gender."""
    provider = _faker(locale).provider("faker.providers.person")
    female = {n.casefold() for n in getattr(provider, "first_names_female", ()) or ()}
    male = {n.casefold() for n in getattr(provider, "first_names_male", ()) or ()}
    other = {n.casefold() for n in getattr(provider, "first_names", ()) or ()}
    methods = dict.fromkeys(other | female | male, "first_name")
    methods.update(dict.fromkeys(female - male, "first_name_female"))
    methods.update(dict.fromkeys(male - female, "first_name_male"))
    return methods


def _match_case(original: str, surrogate: str) -> str:
    letters = [c for c in original if c.isalpha()]
    if not letters:
        return surrogate
    if all(c.isupper() for c in letters) and (len(letters) > 1 or len(original) == 1):
        return surrogate.upper()
    if all(c.islower() for c in letters):
        return surrogate.lower()
    return surrogate


def _normalize(value: str) -> str:
    """What must match for two mentions to get the same surrogate: letters and digits, casefolded."""
    return "".join(c for c in value.casefold() if c.isalnum())


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _scramble(value: str, rng: random.Random) -> str:
    """Digits -> random digits, letters -> random ASCII letters of the same case, rest kept."""
    out = []
    for c in value:
        if c.isdigit():
            out.append(str(rng.randrange(10)))
        elif c.isalpha():
            ch = rng.choice(_LETTERS)
            out.append(ch.upper() if c.isupper() else ch)
        else:
            out.append(c)
    return "".join(out)


# ---- dates

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
_YEARS = (1800, 2299)  # a 4-digit number alone is read as a year only inside this range


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


def _fmt_month_name(month: int, original: str) -> str:
    o = original.rstrip(".")
    full = _MONTHS_FULL[month - 1]
    if len(o) <= 3 and o.casefold() != "may":  # "May" could be either: it reads as full
        name = full[:3]
    elif len(o) == 4 and o.casefold() == "sept":
        name = "Sept" if month == 9 else full[:3]
    else:
        name = full
    return _match_case(o, name)


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


def shift_date_text(text: str, offset: int) -> str | None:
    """``text`` (one date, any supported form) shifted by ``offset`` days in the same form, or
    None when it is not a date dphub can parse. See the module docstring for the policy."""
    for kind, pattern in _DATE_PATTERNS:
        m = pattern.fullmatch(text)
        if m is None:
            continue
        out = _shift_match(kind, m, offset)
        if out is not None:
            return out
    m = _TIME_RE.fullmatch(text)
    if m is not None:  # "7/22/2094 10:30": the date moves, the time of day is kept
        day = shift_date_text(m["date"], offset)
        return None if day is None else day + m["time"]
    m = _RANGE_RE.fullmatch(text)
    if m is not None:  # "1/12-1/13", "Jan 3 to Jan 5": shift both ends
        left, right = shift_date_text(m["a"], offset), shift_date_text(m["b"], offset)
        if left is not None and right is not None:
            return left + m["sep"] + right
    m = _WEEKDAY_RE.fullmatch(text)
    if m is not None:
        wd = [w.casefold()[:3] for w in _WEEKDAYS].index(m["wd"].casefold()[:3])
        new = _WEEKDAYS[(wd + (offset % 7 or 1)) % 7]
        token = m["wd"]
        name = new if len(token) > 4 else new[: max(3, len(token))]
        return _match_case(token, name) + (m["dot"] or "")
    return None


def _shift_match(kind: str, m: re.Match[str], offset: int) -> str | None:
    g = m.groupdict()
    month_shift = (1 if offset > 0 else -1) * max(1, round(abs(offset) / 30.44))
    year_shift = 1 if offset > 0 else -1
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


# ---- the renderer

_TITLES = frozenset(
    ("mr", "mrs", "ms", "miss", "mx", "dr", "prof", "sir", "madam", "md", "do", "rn", "np", "pa",
     "phd", "jr", "sr", "ii", "iii", "iv")
)
_WORD_RE = re.compile(r"[^\W\d_](?:[\w'’-]*\w)?")
_FACILITY_RE = re.compile(
    r"\b(?:hospital|hosp|medical|center|centre|clinic|health|memorial|infirmary|institute)\b",
    re.I,
)
#: a standalone age: "92", "92yo", "aged 92", "92-year-old", "92 y/o", "18 months", "80s"
_AGE_RE = re.compile(
    r"(?P<pre>(?:aged?:?\s*)?)(?P<n>\d{1,3})(?P<post>(?P<decade>'?s)|\+?(?:\s*-?\s*(?:"
    r"years?|yrs?|yo|y/o|y\.o\.?|y|months?|mos?|weeks?|wks?|days?)(?:[\s-]*old)?)?)",
    re.I,
)
_MAX_AGE = 120  # a bigger number is not an age (it falls back to the category tag)
#: spans that are measurements, never a date, age, phone or ID: lab values and vitals
#: (``7.47``, ``120/80``, ``7.47/32/151``), times (``08:40``), doses (``25 mg``, ``1/2 tab``)
_UNITS = (
    r"(?:mg|mcg|µg|ug|ng|g|kg|lbs?|ml|cc|l|dl|units?|u|iu|meq|mmol|mol|mmhg|cmh2o|%|bpm|"
    r"tabs?|tablets?|caps?|capsules?|puffs?|gtts?|drops?|amps?|vials?|sprays?|l/min|mg/dl)"
)
_MEASURE_RE = re.compile(
    r"[<>~]?\s*\d+(?:[.,]\d+)?(?:"
    r"(?:[.,]\d+)|(?:\s*/\s*\d+(?:\.\d+)?)+|:\d{2}(?::\d{2})?(?:\s*[ap]\.?m\.?)?|\s*"
    + _UNITS + r")",
    re.I,
)
_UNIT_AFTER_RE = re.compile(r"\s?" + _UNITS + r"(?![^\W_])", re.I)
_JOINERS = "/.:,-"
_PHONE_RE = re.compile(
    r"[#+(\s]*\d(?:[\d\s.()-]*\d)?(?:\s*(?:x|ext\.?)\s*\d{1,6})?"
    r"|(?:x|ext\.?)\s*\d{3,6}",
    re.I,
)


#: parts of e-mail addresses and URLs that every draw shares with many originals: a collision
#: on them is no reuse of PHI (without this, "jo@example.org" could never get a surrogate)
_WEB_WORDS = frozenset(
    ("www", "http", "https", "com", "org", "net", "edu", "gov", "info", "biz", "io", "co", "us",
     "uk", "example", "mail", "email", "gmail", "yahoo", "hotmail")
)


class _NoSurrogate(Exception):
    """A span's text does not parse as its category (or no surrogate could be drawn): it is
    masked with its category tag, ``[**DATE**]``, as ``--mode tag`` writes it."""


def _mask(label: str) -> str:
    """The one fallback of surrogate mode: the upper-case category tag of mask (tag) mode."""
    return f"[**{category_of(label)}**]"


def _in_a_measurement(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` is part of a number around it or a dose: ``32`` in
    ``7.47/32/151``, ``98`` in ``153/98``, ``91/92`` in ``91/92-173/84``, ``25`` in ``25 mg``.

    Such a span is a fragment of a clinical value, not a standalone date, age or ID, so no
    surrogate may rewrite it (it is masked instead).
    """
    core = text[start:end]
    before = text[max(0, start - 2) : start]
    after = text[end : end + 2]
    if core[:1].isdigit() and before and (
        before[-1].isdigit() or (len(before) == 2 and before[0].isdigit() and before[1] in _JOINERS)
    ):
        return True
    if core[-1:].isdigit():
        if after[:1].isdigit() or (len(after) == 2 and after[0] in _JOINERS and after[1].isdigit()):
            return True
        if _UNIT_AFTER_RE.match(text, end):
            return True
    return False


def _span_in_a_measurement(text: str, norm: NormalizedText | None, span: Span) -> bool:
    """:func:`_in_a_measurement` for the span's stripped value, on the note as members read it:
    the surrogate is drawn from the normalised value, so its neighbours are judged normalised
    too (``BP 1<U+200B>2<U+200B>0/80``: ``120`` is a blood pressure, not an age)."""
    if norm is None:
        read, (start, end) = text, (span.start, span.end)
    else:
        read, (start, end) = norm.text, norm.from_original(span.start, span.end)
    value = read[start:end]
    start += len(value) - len(value.lstrip())
    return _in_a_measurement(read, start, start + len(value.strip()))


def _is_measurement(text: str) -> bool:
    return _MEASURE_RE.fullmatch(text) is not None


def _code_like(text: str, min_alnum: int) -> bool:
    """Whether ``text`` can be an identifier (ID, ZIP, room): enough letters or digits, and not
    a measurement (``7.47`` flagged as an ID is a lab value, not an ID to scramble)."""
    return sum(c.isalnum() for c in text) >= min_alnum and not _is_measurement(text)


def _is_phone(text: str) -> bool:
    digits = sum(c.isdigit() for c in text)
    return (
        _PHONE_RE.fullmatch(text) is not None
        and 5 <= digits <= 15
        and re.fullmatch(r"\d+[.,]\d+", text) is None
    )


@dataclass(frozen=True)
class _Ctx:
    patient: str
    offset: int
    #: normalised words of every span of the note: no surrogate may reuse one
    forbidden: frozenset[str] = frozenset()


class SurrogateRenderer(Renderer):
    """Replace spans with realistic, per-patient consistent, key-seeded surrogates.

    ``key`` is the secret (bytes, at least 16) or ``key_file`` a path to it (see :func:`load_key`).
    The patient is ``note.effective_patient_id`` (the note id when the source has no patients).
    """

    name = "surrogate"
    MAX_REDRAWS: ClassVar[int] = 50

    def __init__(
        self,
        key: bytes | str | None = None,
        *,
        key_file: str | os.PathLike[str] | None = None,
        locale: str = "en_US",
    ) -> None:
        if (key is None) == (key_file is None):
            raise ConfigError("surrogate mode needs a secret key: pass exactly one --key-file")
        if key_file is not None:
            key = load_key(key_file)
        if isinstance(key, str):
            key = key.encode("utf-8")
        assert key is not None
        if len(key) < MIN_KEY_BYTES:
            raise ConfigError(f"the surrogate key must have at least {MIN_KEY_BYTES} bytes")
        self._key = bytes(key)
        self.locale = locale

    # -- seeded randomness
    def _seed(self, ctx: _Ctx, kind: str, value: str, attempt: int) -> int:
        return _hmac_int(self._key, "surrogate", ctx.patient, kind, _normalize(value), str(attempt))

    def _draw(
        self, ctx: _Ctx, kind: str, original: str, make: Callable[[int], str],
        common: frozenset[str] = frozenset(),
    ) -> str:
        """``make(seed)`` until the result differs from ``original`` (case-insensitively) and
        shares no word with any PHI of the note; :class:`_NoSurrogate` when every draw collides.

        ``kind`` is the HIPAA category (not the fine label): one value of a patient labelled
        CITY in one note and LOCATION in another gets the same seed, so the same surrogate.
        ``common`` are words no collision counts on (``com``, ``example`` in every Faker email).
        """
        norm = _normalize(original)
        for attempt in range(self.MAX_REDRAWS):
            out = make(self._seed(ctx, kind, original, attempt))
            if not norm:
                return out
            words = ({_normalize(w) for w in _WORD_RE.findall(out)} - common) | {_normalize(out)}
            if norm not in words and not (words & ctx.forbidden):
                return out
        raise _NoSurrogate  # every draw collided (tiny value space): mask instead

    def _faker_value(
        self, ctx: _Ctx, kind: str, original: str, method: str,
        common: frozenset[str] = frozenset(),
    ) -> str:
        fk = _faker(self.locale)

        def make(seed: int) -> str:
            fk.seed_instance(seed)
            return str(getattr(fk, method)())

        return _match_case(original, self._draw(ctx, kind, original, make, common))

    def _scrambled(self, ctx: _Ctx, kind: str, original: str) -> str:
        return self._draw(ctx, kind, original, lambda seed: _scramble(original, random.Random(seed)))

    # -- per kind (each raises _NoSurrogate when the text does not parse as its category)
    def _name(self, ctx: _Ctx, text: str) -> str:
        if not any(c.isalpha() for c in text) or any(c.isdigit() for c in text):
            raise _NoSurrogate  # "98" or "Smith2" flagged as a name: not a name to replace

        def word(m: re.Match[str]) -> str:
            w, possessive = m.group(0), ""
            if len(w) > 3 and w[-2] in "'’" and w[-1] in "sS":  # Smith's -> <surrogate>'s
                w, possessive = w[:-2], w[-2:]
            return name_word(w) + possessive

        def name_word(w: str) -> str:
            if w.casefold().rstrip(".") in _TITLES and len(_WORD_RE.findall(text)) > 1:
                return w
            if len(w) == 1:
                return self._scrambled(ctx, "NAME", w)
            method = _first_name_method(self.locale).get(w.casefold(), "last_name")
            return self._faker_value(ctx, "NAME", w, method)

        return _WORD_RE.sub(word, text)

    def _date(self, ctx: _Ctx, text: str) -> str:
        shifted = shift_date_text(text, ctx.offset)
        if shifted is None:  # "91/92", "7.4", "08:40", "-": not a date to move
            raise _NoSurrogate
        return shifted

    def _age(self, text: str) -> str:
        m = _AGE_RE.fullmatch(text)
        if m is None or int(m["n"]) > _MAX_AGE:
            raise _NoSurrogate  # "153/98", "ninety", "250": not a standalone age
        if int(m["n"]) > 89:
            return f"{m['pre']}90+" if m["decade"] else f"{m['pre']}90+{m['post'].lstrip('+')}"
        return text

    def _location(self, ctx: _Ctx, fine: str, text: str) -> str:
        letters = [c for c in text if c.isalpha()]
        is_acronym = (
            " " not in text and 0 < len(letters) <= 4 and all(c.isupper() for c in letters)
        )
        if fine == "STATE" and len(text) == 2 and len(letters) == 2:
            return self._faker_value(ctx, "LOCATION", text, "state_abbr")
        if fine in ("ZIP", "ROOM") or not letters:
            if fine not in ("ZIP", "ROOM") or not _code_like(text, 3 if fine == "ZIP" else 1):
                raise _NoSurrogate  # "32" as a city, "7.4" as a ZIP: not a place
            return self._scrambled(ctx, "LOCATION", text)
        if is_acronym:
            return self._scrambled(ctx, "LOCATION", text)
        method = {
            "STATE": "state",
            "COUNTRY": "country",
            "STREET": "street_address",
            "ORGANIZATION": "company",
        }.get(fine)
        if method:
            return self._faker_value(ctx, "LOCATION", text, method)
        if fine in ("HOSPITAL", "DEPARTMENT") or _FACILITY_RE.search(text):
            if not _FACILITY_RE.search(text):  # "VORNAK" in "VORNAK hospital": a bare name
                return self._faker_value(ctx, "LOCATION", text, "last_name")
            fk = _faker(self.locale)
            kinds = ("General Hospital", "Medical Center", "Memorial Hospital", "Clinic")

            def make(seed: int) -> str:
                fk.seed_instance(seed)
                return f"{fk.last_name()} {fk.random_element(kinds)}"

            return _match_case(text, self._draw(ctx, "LOCATION", text, make))
        return self._faker_value(ctx, "LOCATION", text, "city")

    def _contact(self, ctx: _Ctx, fine: str, text: str) -> str:
        if "@" in text:
            if re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", text) is None:
                raise _NoSurrogate
            return self._faker_value(ctx, "CONTACT", text, "email", _WEB_WORDS)
        if fine == "URL" or text.casefold().startswith(("http", "www.")):
            if re.fullmatch(r"(?:https?://|www\.)?[^\s/]+\.[^\s/]+(?:/\S*)?", text, re.I) is None:
                raise _NoSurrogate
            return self._faker_value(ctx, "CONTACT", text, "url", _WEB_WORDS)
        if fine == "EMAIL":
            raise _NoSurrogate  # an "email" without an @
        if fine == "IPADDR":
            if not _code_like(text, 4):
                raise _NoSurrogate
            return self._scrambled(ctx, "CONTACT", text)
        if not _is_phone(text):  # "120/80" or "7.47" flagged as a phone number
            raise _NoSurrogate
        return self._scrambled(ctx, "CONTACT", text)

    def surrogate(self, ctx: _Ctx, span: Span, text: str) -> str:
        """The replacement for one span's (whitespace-stripped) text.

        Raises :class:`_NoSurrogate` when ``text`` does not parse as the span's category (a
        fraction of vitals is no date, a number after a slash no age): the caller masks it.
        """
        category = category_of(span.label)
        fine = fine_of(span.label)
        if category == "NAME":
            if fine == "USERNAME":
                if not _code_like(text, 2):
                    raise _NoSurrogate
                return self._scrambled(ctx, "NAME", text)
            return self._name(ctx, text)
        if category == "DATE":
            return self._date(ctx, text)
        if category == "AGE":
            return self._age(text)
        if category == "LOCATION":
            return self._location(ctx, fine, text)
        if category == "CONTACT":
            return self._contact(ctx, fine, text)
        if category == "PROFESSION":
            if not any(c.isalpha() for c in text):
                raise _NoSurrogate
            return self._faker_value(ctx, "PROFESSION", text, "job")
        # ID, OTHER: the format is kept, so the value must look like one (not like "7.47")
        if not _code_like(text, 3 if category == "ID" else 1):
            raise _NoSurrogate
        return self._scrambled(ctx, category, text)

    def render(self, note: Note, spans: Sequence[Span]) -> str:
        patient = note.effective_patient_id
        merged = prepare_spans(note, spans)
        forbidden = {
            _normalize(w)
            for s in merged
            for w in [*_WORD_RE.findall(normalized_text(note.span_text(s))),
                      normalized_text(note.span_text(s))]
        }
        forbidden.discard("")
        ctx = _Ctx(patient, date_offset_days(self._key, patient), frozenset(forbidden))

        # a surrogate depends only on (label, text) within one note (draws are seeded by key,
        # patient, category and value): repeated mentions reuse it instead of re-seeding Faker,
        # which dominated long notes (one draw per mention, ~1 ms each)
        memo: dict[tuple[str, str], str] = {}
        norm = normalize(note.text) if merged else None  # None: the text reads as written

        def replacement(span: Span) -> str:
            # the value as members read it: no invisible characters, fullwidth digits as ASCII
            raw = normalized_text(note.span_text(span))
            core = raw.strip()
            if not core:
                return raw
            lead = raw[: len(raw) - len(raw.lstrip())]
            trail = raw[len(raw.rstrip()) :]
            if _span_in_a_measurement(note.text, norm, span):
                return lead + _mask(span.label) + trail
            k = (span.label, core)
            if k not in memo:
                try:
                    memo[k] = self.surrogate(ctx, span, core)
                except _NoSurrogate:
                    memo[k] = _mask(span.label)
            return lead + memo[k] + trail

        return _replace_spans(note, merged, replacement)


#: mode name -> renderer class; ``render`` instantiates it with the caller's options.
RENDERERS: dict[str, type[Renderer]] = {
    cls.name: cls
    for cls in (TagRenderer, RedactRenderer, SurrogateRenderer, SpansRenderer, BratRenderer)
}


def render(note: Note, spans: Sequence[Span], mode: str, **options: Any) -> str:
    """Render one note in ``mode`` (a key of :data:`RENDERERS`) with the renderer's options.

    For many notes build the renderer once (``RENDERERS[mode](**options)``) and call its
    ``render``; this helper is for one-offs.
    """
    try:
        cls = RENDERERS[mode]
    except KeyError:
        raise ConfigError(
            f"unknown render mode {mode!r}; available: {', '.join(RENDERERS)}"
        ) from None
    try:
        renderer = cls(**options)
    except TypeError:
        raise ConfigError(
            f"invalid options for render mode {mode!r}: {', '.join(sorted(options)) or 'none'}"
        ) from None
    return renderer.render(note, spans)
