"""Surrogates (:class:`SurrogateRenderer`) are deterministic: every random choice is seeded with
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
  ``18 months``, ``80s``, ``45.5``, ``aged 45,5``): ``ninety``, ``153/98``, ``250``;
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
  digits or an apostrophe (``1980s``, ``'80s``); a year from 1800 to 2299 (``12/31/9999``, an
  end-of-time placeholder, would give the offset away). Anything else becomes ``[**DATE**]``.
* **Ages** above 89 become ``90+`` (HIPAA aggregates them); ages of 89 and below are kept, being
  no identifier under Safe Harbor and clinically meaningful (in whole years: ``89.5 yo`` is kept,
  ``90.5 yo`` becomes ``90+ yo``).
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

Differentially private options (issue 28, docs/surrogates.md): ``dates="dp"`` perturbs the
intervals between a unit's dates with the bounded Laplace mechanism instead of the one shift
(:mod:`dphub.render.dp_dates`; ``date_unit="patient"`` needs :meth:`SurrogateRenderer.observe`
of every note first), ``ages="dp"`` perturbs ages <= 89 (:mod:`dphub.render.ages`) and
``places="geo"`` moves known cities under geo-indistinguishability (:mod:`dphub.render.geo`).
Their noise comes from the same keyed HMAC stream, so determinism holds as above.

Determinism holds for a given Faker version (its name lists are data); record the version with
the output when byte-identical reruns matter.
"""

from __future__ import annotations

import math
import os
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from dphub.errors import ConfigError
from dphub.labels import UNTYPED, category_of, fine_of
from dphub.notes import Note, Span
from dphub.render.ages import AGE_MECHANISM, DEFAULT_AGE_EPSILON, MAX_KEPT_AGE, DpAges
from dphub.render.base import Renderer, prepare_spans, replace_spans
from dphub.render.dates import DatePoint, Shift, date_point, date_points, shift_date_text
from dphub.render.dp_dates import DATE_MECHANISM, DEFAULT_DATE_EPSILON, DpDates
from dphub.render.geo import DEFAULT_PLACE_EPSILON, GeoPlaces
from dphub.render.keys import MIN_KEY_BYTES, date_offset_days, hmac_int, load_key
from dphub.render.values import (
    code_like,
    faker_for,
    first_name_method,
    is_phone,
    match_case,
    normalize_value,
    scramble,
    span_in_a_measurement,
)
from dphub.textnorm import normalize, normalized_text

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
    r"(?P<pre>(?:aged?:?\s*)?)(?=[.,]?\d)(?P<n>\d{0,3})(?P<frac>[.,]\d+)?(?P<post>(?P<decade>'?s)|\+?(?:\s*-?\s*(?:"
    r"years?|yrs?|yo|y/o|y\.o\.?|y|months?|mos?|weeks?|wks?|days?)(?:[\s-]*old)?)?)",
    re.I,
)
_MAX_AGE = 120  # a bigger number is not an age (it falls back to the category tag)
#: what follows an age in years (``--ages dp`` perturbs only those): nothing, or a year unit
_IN_YEARS_RE = re.compile(r"\+?(?:\s*-?\s*(?:years?|yrs?|yo|y/o|y\.o\.?|y)(?:[\s-]*old)?)?", re.I)
#: the smallest ``--place-epsilon`` (per km): below it the planar Laplace radius overflows
MIN_PLACE_EPSILON = 1e-300
#: location labels ``--places geo`` may move (a city, or a place of unknown kind)
_GEO_FINE = frozenset(("CITY", "LOCATION-OTHER", "LOCATION"))
#: the options of surrogate mode's mechanisms, and their values
DATE_MODES = ("shift", "dp")
DATE_UNITS = ("note", "patient")
AGE_MODES = ("keep", "dp")
PLACE_MODES = ("faker", "geo")


def check_surrogate_options(**options: Any) -> None:
    """Check the DP options of :class:`SurrogateRenderer` (``dates``, ``date_epsilon`` ...)
    before a run starts: ConfigError as the renderer would raise it."""
    _mechanisms(b"\0" * MIN_KEY_BYTES, options.get("dates", "shift"),
                options.get("date_epsilon"), options.get("date_unit", "patient"),
                options.get("ages", "keep"), options.get("age_epsilon"),
                options.get("places", "faker"), options.get("place_epsilon"))


def _mechanisms(key: bytes, dates: str, date_epsilon: float | None, date_unit: str, ages: str,
                age_epsilon: float | None, places: str, place_epsilon: float | None
                ) -> tuple[DpDates | None, DpAges | None, GeoPlaces | None]:
    """The DP mechanisms the options ask for (None: the default surrogate); ConfigError on a
    value out of range, an ε without its mechanism, or a missing gazetteer."""
    for name, value, allowed in (("--dates", dates, DATE_MODES), ("--date-unit", date_unit,
                                 DATE_UNITS), ("--ages", ages, AGE_MODES),
                                 ("--places", places, PLACE_MODES)):
        if value not in allowed:
            raise ConfigError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")
    for flag, eps, on, needs in (("--date-epsilon", date_epsilon, dates == "dp", "--dates dp"),
                                 ("--age-epsilon", age_epsilon, ages == "dp", "--ages dp"),
                                 ("--place-epsilon", place_epsilon, places == "geo",
                                  "--places geo")):
        if eps is not None and not on:
            raise ConfigError(f"{flag} needs {needs}")
        if eps is not None and not (eps > 0 and math.isfinite(eps)):
            raise ConfigError(f"{flag} must be a positive number (got {eps})")
    if place_epsilon is not None and place_epsilon < MIN_PLACE_EPSILON:
        # a radius of -ln(u)/ε km overflows to infinity: no point on Earth to move to
        raise ConfigError(f"--place-epsilon must be at least {MIN_PLACE_EPSILON:g} per km "
                          f"(got {place_epsilon:g})")
    if date_unit != "patient" and dates != "dp":
        raise ConfigError("--date-unit needs --dates dp (the shift is always per patient)")
    return (
        DpDates(key, DEFAULT_DATE_EPSILON if date_epsilon is None else date_epsilon)
        if dates == "dp" else None,
        DpAges(key, DEFAULT_AGE_EPSILON if age_epsilon is None else age_epsilon)
        if ages == "dp" else None,
        GeoPlaces(key, DEFAULT_PLACE_EPSILON if place_epsilon is None else place_epsilon)
        if places == "geo" else None,
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



@dataclass(frozen=True)
class _Ctx:
    patient: str
    offset: int
    #: normalised words of every span of the note: no surrogate may reuse one
    forbidden: frozenset[str] = frozenset()
    #: ``--dates dp``: each date point's own shift (:mod:`dphub.render.dp_dates`)
    date_shifts: dict[tuple[str, int], Shift] | None = None


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
        dates: str = "shift",
        date_epsilon: float | None = None,
        date_unit: str = "patient",
        ages: str = "keep",
        age_epsilon: float | None = None,
        places: str = "faker",
        place_epsilon: float | None = None,
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
        self._dp_dates, self._dp_ages, self._geo = _mechanisms(
            self._key, dates, date_epsilon, date_unit, ages, age_epsilon, places, place_epsilon)
        self.date_unit = date_unit
        #: ``date_unit="patient"``: the date points of each patient, from :meth:`observe`
        self._observed: dict[str, set[DatePoint]] = {}

    @property
    def needs_prepass(self) -> bool:
        """Whether every note must go through :meth:`observe` before the first is rendered
        (``--dates dp --date-unit patient``: a patient's dates are one chain)."""
        return self._dp_dates is not None and self.date_unit == "patient"

    def describe(self) -> dict[str, Any]:
        """The mechanisms applied, for the run's audit log: names and ε, never values."""
        out: dict[str, Any] = {"dates": "per-patient-shift", "places": "faker",
                               "ages": "kept-below-90"}
        if self._dp_dates is not None:
            out["dates"] = {"mechanism": DATE_MECHANISM, "epsilon": self._dp_dates.epsilon,
                            "epsilon_per": "interval, per band unit (1 day / 30 days / 365 days)",
                            "unit": self.date_unit,
                            "per_patient": self._dp_dates.patient_total()}
        if self._dp_ages is not None:
            out["ages"] = {"mechanism": AGE_MECHANISM, "epsilon": self._dp_ages.epsilon,
                           "epsilon_per": "year", "domain": [0, MAX_KEPT_AGE]}
        if self._geo is not None:
            out["places"] = self._geo.describe()
        return out

    def date_points(self, note: Note, spans: Sequence[Span]) -> set[DatePoint]:
        """The points in time of the note's DATE spans that surrogates would rewrite."""
        norm = normalize(note.text) if spans else None
        points: set[DatePoint] = set()
        for span in spans:
            if category_of(span.label) != "DATE":
                continue
            core = normalized_text(note.span_text(span)).strip()
            if core and not span_in_a_measurement(note.text, norm, span):
                points.update(date_points(core))
        return points

    def observe(self, note: Note, spans: Sequence[Span]) -> None:
        """Pre-pass of ``date_unit="patient"``: remember the note's dates for its patient."""
        if self.needs_prepass:
            merged = prepare_spans(note, spans)
            self._observed.setdefault(note.effective_patient_id, set()).update(
                self.date_points(note, merged))

    # -- seeded randomness
    def _seed(self, ctx: _Ctx, kind: str, value: str, attempt: int) -> int:
        return hmac_int(self._key, "surrogate", ctx.patient, kind, normalize_value(value), str(attempt))

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
        norm = normalize_value(original)
        for attempt in range(self.MAX_REDRAWS):
            out = make(self._seed(ctx, kind, original, attempt))
            if not norm:
                return out
            words = ({normalize_value(w) for w in _WORD_RE.findall(out)} - common) | {normalize_value(out)}
            if norm not in words and not (words & ctx.forbidden):
                return out
        raise _NoSurrogate  # every draw collided (tiny value space): mask instead

    def _faker_value(
        self, ctx: _Ctx, kind: str, original: str, method: str,
        common: frozenset[str] = frozenset(),
    ) -> str:
        fk = faker_for(self.locale)

        def make(seed: int) -> str:
            fk.seed_instance(seed)
            return str(getattr(fk, method)())

        return match_case(original, self._draw(ctx, kind, original, make, common))

    def _scrambled(self, ctx: _Ctx, kind: str, original: str) -> str:
        return self._draw(ctx, kind, original, lambda seed: scramble(original, random.Random(seed)))

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
            method = first_name_method(self.locale).get(w.casefold(), "last_name")
            return self._faker_value(ctx, "NAME", w, method)

        return _WORD_RE.sub(word, text)

    def _date(self, ctx: _Ctx, text: str) -> str:
        table = ctx.date_shifts
        def own(kind: str, m: re.Match[str]) -> Shift | None:
            p = date_point(kind, m)
            return None if p is None or table is None else table.get(p[:2])

        try:
            shifted = shift_date_text(text, ctx.offset, None if table is None else own)
        except (ValueError, OverflowError):  # a shifted or noisy date outside the calendar
            shifted = None
        if shifted is None:  # "91/92", "7.4", "08:40", "-": not a date to move
            raise _NoSurrogate
        return shifted

    def _age(self, ctx: _Ctx, text: str) -> str:
        m = _AGE_RE.fullmatch(text)
        years = int(m["n"] or 0) if m is not None else 0  # whole years: 89.5 is 89, 90.5 is 90
        if m is None or years > _MAX_AGE or (m["frac"] and m["decade"]):
            raise _NoSurrogate  # "153/98", "ninety", "250": not a standalone age
        if years > 89:
            return f"{m['pre']}90+" if m["decade"] else f"{m['pre']}90+{m['post'].lstrip('+')}"
        if self._dp_ages is not None and not m["decade"] and _IN_YEARS_RE.fullmatch(m["post"]):
            # a noisy whole age: the exact fraction beside it would tell more than the noise hides
            return m["pre"] + str(self._dp_ages.age(ctx.patient, years)) + m["post"]
        return text

    def _location(self, ctx: _Ctx, fine: str, text: str) -> str:
        letters = [c for c in text if c.isalpha()]
        is_acronym = (
            " " not in text and 0 < len(letters) <= 4 and all(c.isupper() for c in letters)
        )
        if fine == "STATE" and len(text) == 2 and len(letters) == 2:
            return self._faker_value(ctx, "LOCATION", text, "state_abbr")
        if fine in ("ZIP", "ROOM") or not letters:
            if fine not in ("ZIP", "ROOM") or not code_like(text, 3 if fine == "ZIP" else 1):
                raise _NoSurrogate  # "32" as a city, "7.4" as a ZIP: not a place
            return self._scrambled(ctx, "LOCATION", text)
        if is_acronym:
            return self._scrambled(ctx, "LOCATION", text)
        if self._geo is not None and fine in _GEO_FINE and not _FACILITY_RE.search(text):
            moved = self._geo.place(ctx.patient, text)
            if moved is not None:  # else: not in the gazetteer, the Faker city below
                return match_case(text, moved)
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
            fk = faker_for(self.locale)
            kinds = ("General Hospital", "Medical Center", "Memorial Hospital", "Clinic")

            def make(seed: int) -> str:
                fk.seed_instance(seed)
                return f"{fk.last_name()} {fk.random_element(kinds)}"

            return match_case(text, self._draw(ctx, "LOCATION", text, make))
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
            if not code_like(text, 4):
                raise _NoSurrogate
            return self._scrambled(ctx, "CONTACT", text)
        if not is_phone(text):  # "120/80" or "7.47" flagged as a phone number
            raise _NoSurrogate
        return self._scrambled(ctx, "CONTACT", text)

    def surrogate(self, ctx: _Ctx, span: Span, text: str) -> str:
        """The replacement for one span's (whitespace-stripped) text.

        Raises :class:`_NoSurrogate` when ``text`` does not parse as the span's category (a
        fraction of vitals is no date, a number after a slash no age): the caller masks it.
        """
        category = category_of(span.label)
        fine = fine_of(span.label)
        if category == UNTYPED:  # hidden by the inverse rule, no member said what it is: masked
            raise _NoSurrogate
        if category == "NAME":
            if fine == "USERNAME":
                if not code_like(text, 2):
                    raise _NoSurrogate
                return self._scrambled(ctx, "NAME", text)
            return self._name(ctx, text)
        if category == "DATE":
            return self._date(ctx, text)
        if category == "AGE":
            return self._age(ctx, text)
        if category == "LOCATION":
            return self._location(ctx, fine, text)
        if category == "CONTACT":
            return self._contact(ctx, fine, text)
        if category == "PROFESSION":
            if not any(c.isalpha() for c in text):
                raise _NoSurrogate
            return self._faker_value(ctx, "PROFESSION", text, "job")
        # ID, OTHER: the format is kept, so the value must look like one (not like "7.47")
        if not code_like(text, 3 if category == "ID" else 1):
            raise _NoSurrogate
        return self._scrambled(ctx, category, text)

    def render(self, note: Note, spans: Sequence[Span]) -> str:
        patient = note.effective_patient_id
        merged = prepare_spans(note, spans)
        forbidden = {
            normalize_value(w)
            for s in merged
            for w in [*_WORD_RE.findall(normalized_text(note.span_text(s))),
                      normalized_text(note.span_text(s))]
        }
        forbidden.discard("")
        offset = date_offset_days(self._key, patient)
        shifts = None
        if self._dp_dates is not None:
            points = self.date_points(note, merged)
            if self.date_unit == "patient":
                if patient not in self._observed:
                    raise ConfigError(f"note {note.id}: --date-unit patient needs every note of "
                                      "the patient observed first (SurrogateRenderer.observe)")
                points |= self._observed[patient]
            shifts = self._dp_dates.shifts(patient, offset, points)
        ctx = _Ctx(patient, offset, frozenset(forbidden), shifts)

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
            if span_in_a_measurement(note.text, norm, span):
                return lead + _mask(span.label) + trail
            k = (span.label, core)
            if k not in memo:
                try:
                    memo[k] = self.surrogate(ctx, span, core)
                except _NoSurrogate:
                    memo[k] = _mask(span.label)
            return lead + memo[k] + trail

        return replace_spans(note, merged, replacement)
