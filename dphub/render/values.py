"""Value-level helpers of the surrogates: Faker, case, normalisation, scrambling, and the checks
that tell a clinical measurement (``7.47/32/151``, ``25 mg``, ``120/80``) from PHI."""

from __future__ import annotations

import functools
import random
import re
from typing import Any

from dphub.notes import Span
from dphub.textnorm import NormalizedText


@functools.lru_cache(maxsize=4)
def faker_for(locale: str) -> Any:
    from faker import Faker

    return Faker(locale)


@functools.lru_cache(maxsize=4)
def first_name_method(locale: str) -> dict[str, str]:
    """Casefolded first name -> the Faker method drawing a replacement of the same gender."""
    provider = faker_for(locale).provider("faker.providers.person")
    female = {n.casefold() for n in getattr(provider, "first_names_female", ()) or ()}
    male = {n.casefold() for n in getattr(provider, "first_names_male", ()) or ()}
    other = {n.casefold() for n in getattr(provider, "first_names", ()) or ()}
    methods = dict.fromkeys(other | female | male, "first_name")
    methods.update(dict.fromkeys(female - male, "first_name_female"))
    methods.update(dict.fromkeys(male - female, "first_name_male"))
    return methods


def match_case(original: str, surrogate: str) -> str:
    letters = [c for c in original if c.isalpha()]
    if not letters:
        return surrogate
    if all(c.isupper() for c in letters) and (len(letters) > 1 or len(original) == 1):
        return surrogate.upper()
    if all(c.islower() for c in letters):
        return surrogate.lower()
    return surrogate


def normalize_value(value: str) -> str:
    """What must match for two mentions to get the same surrogate: letters and digits, casefolded."""
    return "".join(c for c in value.casefold() if c.isalnum())


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def scramble(value: str, rng: random.Random) -> str:
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


def span_in_a_measurement(text: str, norm: NormalizedText | None, span: Span) -> bool:
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


def code_like(text: str, min_alnum: int) -> bool:
    """Whether ``text`` can be an identifier (ID, ZIP, room): enough letters or digits, and not
    a measurement (``7.47`` flagged as an ID is a lab value, not an ID to scramble)."""
    return sum(c.isalnum() for c in text) >= min_alnum and not _is_measurement(text)


def is_phone(text: str) -> bool:
    digits = sum(c.isdigit() for c in text)
    return (
        _PHONE_RE.fullmatch(text) is not None
        and 5 <= digits <= 15
        and re.fullmatch(r"\d+[.,]\d+", text) is None
    )
