"""Numbers that are measurements: the only numbers the inverse rule may let back.

Numbers are never safe words (:mod:`dphub.safe_vocab`): a date, an age, an MRN, a phone number
or a room is a number. Under the inverse rule (:mod:`dphub.ensemble.inverse`) a number comes back
only when :func:`measurement_ranges` finds it in a measurement context, and the models are
confident it is no PHI. The contexts are deliberately few and literal:

* a number directly followed by a unit of dose, volume, mass, vital sign, lab value or duration
  (``5 mg``, ``0.9 mg/dl``, ``98.6 °F``, ``140 mmHg``, ``95%``, ``2 L``, ``3 days``), the
  duration units not followed by ``old`` / ``of age`` (``3 days old`` is an age);
* a number of at most three digits before the point, or a pair ``N/N``, after the name of a
  vital sign or common lab value (``BP 120/80``, ``HR: 88``, ``Na 140``, ``WBC 12.3``).

Never a measurement, whatever follows or precedes it: a number that is part of a date, time,
range of digits or code (preceded by ``/``, ``-``, ``:``, ``.``, ``#`` or a letter), a number of
more than five digits before the decimal point (IDs, phones), and a four-digit 19xx/20xx number
(a year) unless a dose unit follows it directly. Ages are never released: no context here reads
``yo``, ``year(s) old`` or ``age``.

Offsets are those of the text given (the ensemble gives it the note's text).
"""

from __future__ import annotations

import re

#: a number of at most five digits before the point, not preceded by what makes it part of a
#: date, time, code or longer number
_NUM_BODY = r"\d{1,5}(?:\.\d{1,3})?(?![\d])"
_NUM = r"(?<![\w.,/:#-])" + _NUM_BODY
#: after a vital sign's or lab value's name: at most three digits before the point (a ZIP code
#: after a state, ``CA 90210``, or a phone after ``Ph`` is no lab value)
_VALUE_BODY = r"\d{1,3}(?:\.\d{1,3})?(?![\d])"
_VALUE = r"(?<![\w.,/:#-])" + _VALUE_BODY
_DOSE = (r"mg|mcg|µg|ug|g|gm|gr|kg|lbs?|oz|ml|cc|l|dl|units?|iu|u|meq|mmol|mol|ng|pg|nmol|"
         r"mg/dl|mg/kg|mcg/kg|mcg/kg/min|mg/kg/day|g/dl|mmol/l|meq/l|u/l|iu/l|ml/hr?|cc/hr?|"
         r"ml/min|l/min|lpm|tabs?|tablets?|caps?|capsules?|puffs?|drops?|sprays?|patch(?:es)?")
_VITAL = r"mm\s?hg|bpm|breaths?/min|beats?/min|/min|%|°\s?[fc]|degrees?|kcal|cal|cm|mm"
_DURATION = r"days?|weeks?|wks?|hours?|hrs?|minutes?|mins?|months?"
_UNIT_AFTER = re.compile(
    rf"({_NUM})\s?(?:(?:{_DOSE}|{_VITAL})(?![a-z])|(?:{_DURATION})(?![a-z])"
    r"(?![\s-]*(?:old|of\s+age)\b))", re.IGNORECASE)
_KEYWORDS = (r"bp|blood\s+pressure|hr|heart\s+rate|pulse|rr|resp(?:iratory)?\s+rate|temp|"
             r"temperature|tmax|tc|spo2|sao2|o2\s*sats?|sats?|wt|weight|ht|height|bmi|glucose|"
             r"fsbs|fs|bg|na|k|cl|hco3|co2|bun|cr|creat(?:inine)?|hgb|hb|hct|wbc|plt|platelets|"
             r"inr|ptt|ph|pco2|po2|lactate|trop(?:onin)?|ast|alt|alk\s+phos|tbili|albumin|"
             r"mg|phos|ca|ldl|hdl|a1c|hba1c|tsh|bnp|ck|ef|cvp|map|fio2|peep|tv|vt")
_AFTER_KEYWORD = re.compile(
    rf"(?<![\w])(?:{_KEYWORDS})\s*(?:of|was|is|=|:)?\s*({_VALUE}(?:/{_VALUE_BODY})?)(?![/\d.-]\d)",
    re.IGNORECASE)
_YEAR = re.compile(r"(?:19|20)\d\d")


def measurement_ranges(text: str) -> list[tuple[int, int]]:
    """Character ranges ``[start, end)`` of the numbers of ``text`` read as measurements."""
    out: list[tuple[int, int]] = []
    for m in _UNIT_AFTER.finditer(text):
        num = m.group(1)
        if _YEAR.fullmatch(num) and not re.match(rf"\s?(?:{_DOSE})(?![a-z])", text[m.end(1):],
                                                 re.IGNORECASE):
            continue
        out.append((m.start(1), m.end()))
    for m in _AFTER_KEYWORD.finditer(text):
        if _YEAR.fullmatch(m.group(1)):
            continue
        out.append((m.start(1), m.end(1)))
    out.sort()
    merged: list[tuple[int, int]] = []
    for a, b in out:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged
