"""Numbers that are measurements: the only numbers the inverse rule may let back.

Numbers are never safe words (:mod:`dphub.safe_vocab`): a date, an age, an MRN, a phone number
or a room is a number. Under the inverse rule (:mod:`dphub.ensemble.inverse`) a number comes back
only when :func:`measurement_ranges` finds it in a measurement context, and the models are
confident it is no PHI. Nursing and ICU notes are full of numbers, about one word in nine, and
every one hidden for nothing costs precision; so the contexts cover the general shapes of
clinical measurement, each with a reason why it cannot be PHI:

* a value directly followed by a unit of dose, volume, mass, rate, vital sign, lab value or
  duration (``5 mg``, ``0.9 mg/dl``, ``10cc/hr``, ``98.6 °F``, ``140 mmHg``, ``95%``, ``2L``,
  ``3 days``, ``20 iv``), the duration units not followed by ``old`` / ``of age``;
* a value after the name of a vital sign, ventilator setting, lab value or clinical score
  (``BP 120/80``, ``HR: 88``, ``K 3.8``, ``SBP 90-100s``, ``RR 20's``, ``PEEP 5``, ``GCS 15``);
* a *value* there is a number of at most three digits before the point (five before a unit),
  a range ``N-N`` / ``N to N``, a pair ``N/N`` after a keyword, and a decade ``80s`` / ``80's``;
* medical terms that carry a digit (``SpO2``, ``FiO2``, ``HCO3``, ``O2``, ``B12``, ``D5W``,
  ``A1c``, ``S1``, spine levels ``L4``, ECG leads ``V1``) and frequencies (``x2``, ``2x``,
  ``q4h``, ``q 2 hrs``);
* fluid balances (``+500``, ``-200 cc``), the pain scale ``N/10`` after or before ``pain``;
* without a name: a pair or an ascending range that cannot be a date (``120/80``, ``100-120``), a
  chain of ``/``-joined numbers with a decimal in it (a blood gas ``7.35/40/90``, ventilator
  settings), a fraction before a dose (``1/2 tab``), a decade up to ``80s``, a decimal that cannot be
  a month and day (``2.5``, not ``3.10``) and a lone digit (``1 assist``) not followed by a
  capitalised word or a direction (``3 Main St``, ``7 North``). Bare whole numbers of two or
  more digits stay hidden: a day of the month, an age, a room or part of an ID look the same;
* clock times (``14:30``, ``4pm``, ``@ 0400``, ``~ 1745``) and shifts (``1900-0700``): a time is
  no HIPAA identifier unless it is part of a date, and a date's own digits stay hidden (a
  four-digit time that could be a year, 19xx/20xx, is refused, and a shift both of whose ends
  could be years);
* issue 36, the shapes of hand-written ICU notes: an ascending range after a vital sign's name
  (``RR 12-20``, ``CVP 9-13``: a range, not a month and day), a value written from its point
  (``.5 mg``, ``FiO2 .40``: nothing but a space, a bracket or a sign before it), dose shorthand
  (``40mgs``, ``2 mics``), a ventilator mode and its settings (``A/C 700/15/5/40%``,
  ``AC 500x12/.50/5peep``, ``PSV 20/5/40%``: a chain of settings is no date; a pair of a date's
  shape is still refused after every mode: ``on CPAP 3/10``, ``R AC 11/17``), a chain of settings with a
  percent or a point value in it (``40%/500/12``), a pressure or its range over another whose
  first value is above 31 (``126-148/55-65``: no month or day is), and two decimals over each
  other (``5.1/2.6``) unless one could be a month and a day; a keyword's value after a verb of
  change (``PS weaned from 16 to 14``, ``cvp has been 12``).

Never a measurement, whatever the context (the guards apply to every pattern):

* a number that is part of a date, code or longer number: preceded by ``/``, ``-``, ``:``,
  ``.``, ``#``, ``'`` or a letter, or followed by ``/``, ``-``, ``:`` or ``.`` and a digit, a
  dash with spaces (``617- 555- 0143``) or a phone-like digit group (``617 555 0143``), so
  ``3/10/2026``, ``617-555-0143``, ``'88`` never match;
* a pair or range of two whole numbers that could be a month and a day or a two-digit year (the
  first at most 12, or the first at most 31 and the second at most 12: ``3/10``, ``3-10``,
  ``10-12``, ``3/98``, ``25/3``) unless a dose or vital unit follows it directly
  (``2-3 L``, ``1-2 tabs``), a duration follows an ascending range with a dash (``3-4 days``),
  it is ``N/10`` in a pain context, or an ascending dash range follows a vital sign's name
  (``RR 12-20``); a slash pair is still refused after every name and ventilator mode
  (``BP 3/10``, ``on CPAP 3/10``);
* a number of more than five digits before the point (IDs, phones); a four-digit 19xx/20xx
  number (a year) unless a dose unit follows it directly;
* a value whose previous word names a place, an identifier or an age (``room``, ``rm``, ``bed``,
  ``unit``, ``floor``, ``apt``, ``#``, ``no``, ``mrn``, ``id``, ``ext``, ``pager``, ``phone``,
  ``age``, ``aged``, ``dob``, ``his``/``her`` as in ``in her 90s``), a month name (``Jan 3``)
  or a date-shaped pair (``3/14 5``: what follows a date may be part of it); before a term with
  letters (``no O2``, ``her FiO2``) only the place, identifier and month words refuse;
  a value followed by an age word (``yo``, ``y/o``, ``year(s)``, ``yr``, ``old``) or a month name.
  Ages of 90 or more are never released; an age below 90 is no identifier under HIPAA's Safe
  Harbor and comes back only through the age context of issue 57 (below).

Issue 57, measurements read as a clinician writes them (``_issue57_ranges``): blood gases in any
order and with any separator when a pH is in the chain (``7.38-33-169``, ``7.47,35,124,2,26,98%``;
never with a date-shaped pair, a year or a part of four digits), a ventilator mode joined by a
slash (``AC/800/10/40%``) or its setting before the next one's name (``psv 13/peep``), glued terms
after a comma (``ac8,tv800``), a volume by a rate (``500x10``), a keyword's change (``PS from 15
to 12``), a value after ``up to``/``down to`` that no day can be (above 31, or a decimal),
weaning indices and scores (``RSBI 64``, ``NIF -30``), a name glued to its value by a dash
(``HR- 75``, ``fio2-40%``) or a bracket (``Platelets low (55)``), pain scores after ``rated`` and
before ``cp``/``headache`` (never after a preposition of time: ``on 8/10 cp``), device sizes
(``#8 ett``), pulse grades (``3+/3+``), decades from 110 (``in 180s``), doses before their
frequency (``25 qhs``), orientation (``a+ox3``), an ordinal degree (``1st degree``), a line's
time stamp (``0730:``) and ages below 90 (``74 YR OLD``, ``83 yo``, ``age 67``). A ventilator
pair of a date's shape alone (``PSV 12/10``) stays hidden.

Ordinals (``2nd``, ``3rd``) stay hidden: ``the 3rd`` is a date as often as a step. Keywords that
are also common words or abbreviations of a person or place (``pt``, ``st``, ``in``) are left out.
``benchmarks/number_contexts.py`` counts what these contexts release on the dev corpus.

The inverse rule's fourth value SURE lets a number outside every context back when every model
is very sure of it, unless :func:`refused_numbers` refuses its shape: the guards above, a chain
that could be a date or a phone, a bare whole number below 100, a year, an ID's length, an
ordinal, a number before an age's, a sex's, a direction's or a capitalised word, and any number
in a section of past events.

Offsets are those of the text given (the ensemble gives it the note's text); the patterns read
it normalised as the members do (:mod:`dphub.textnorm`).
"""

from __future__ import annotations

import itertools
import re

from dphub.ensemble.words import LETTER_RUN
from dphub.textnorm import normalize

#: what may not precede a number: it would be part of a date, time, code, longer number or word
_NOT_BEFORE = r"(?<![\w.,/:#'+-])"
#: what may not follow a value: more digits, or a date/phone/code continuing
_NOT_AFTER = r"(?![\d/:]|[.-]\d|\w)"
#: a number of at most five digits before the point (a dose, a count)
_NUM_BODY = r"\d{1,5}(?:\.\d{1,3})?(?!\d)"
#: after a vital sign's or lab value's name: at most three digits before the point (a ZIP code
#: after a state, ``CA 90210``, or a phone after ``Ph`` is no lab value)
_VALUE_BODY = r"\d{1,3}(?:\.\d{1,3})?(?!\d)"
#: a range of two values (``90-100``, ``2 to 3``)
_RANGE_TAIL = rf"(?:\s?(?:-|to)\s?{_VALUE_BODY})?"
_DOSE = (r"mg|mcg|µg|ug|g|gm|gr|kg|lbs?|oz|ml|cc|l|dl|liters?|litres?|units?|iu|u|meq|mmol|mol|"
         r"ng|pg|nmol|mg/dl|mg/kg|mcg/kg|mcg/kg/min|mg/kg/day|mg/kg/hr?|g/dl|mmol/l|meq/l|u/l|"
         r"iu/l|ng/ml|pg/ml|ml/hr?|cc/hr?|ml/kg/hr?|cc/kg/hr?|ml/kg|cc/kg|units?/hr?|u/hr?|"
         r"mg/hr?|mcg/hr?|mcg/min|mg/min|meq/hr?|ml/min|l/min|lpm|l\s?nc|/hr?|tabs?|tablets?|caps?|"
         # plurals and the shorthand of hand-written doses (``40mgs``, ``2 mics``, ``5 mcq``)
         r"mgs|mcgs|mcq|mcqs|mics?|ugs|mls|ccs|grams?|meqs|"
         r"capsules?|puffs?|drops?|sprays?|patch(?:es)?|amps?|vials?|bags?|doses?|gtts?|fr|french|"
         r"gauge|ga|iv|ivp|po|pr|sq|sc|sl|im|ng|ngt|x|"
         # issue 57: a dose before its frequency (``25 qhs``, ``6.25 tid``), a rate per hour or
         # day written out (``20/hour``), a pressure's points (``5-15 points``)
         r"qhs|qd|qod|bid|tid|qid|qam|qpm|prn|/hours?|/day|points?")
_VITAL = (r"mm\s?hg|cm\s?h2o|bpm|breaths?/min|beats?/min|/min|%|°\s?[fc]?|degrees?|kcal|cal|cm|mm|"
          r"mm3|k/ul|secs?|seconds?")
_DURATION = r"days?|weeks?|wks?|hours?|hrs?|minutes?|mins?|months?"
#: a value directly followed by a unit
_UNIT_AFTER = re.compile(
    rf"{_NOT_BEFORE}({_NUM_BODY}{_RANGE_TAIL})(?:'?s)?\s?(?:({_DOSE}|{_VITAL})(?![a-z0-9])|"
    rf"(?:{_DURATION})(?![a-z])(?![\s-]*(?:old|of\s+age)\b))", re.IGNORECASE)
_KEYWORDS = (r"bp|blood\s+pressure|[sdm]?[an]?bp|sbp|dbp|abp|nbp|nibp|art\s+line|a-?line|"
             r"hr|heart\s+rate|pulse|rate|rr|resp(?:iratory)?(?:\s+rate)?|resps|"
             r"temp|temperature|tmax|tc|t\s?max|tm|spo2|sao2|svo2|o2\s*sats?|sats?|saturations?|"
             r"wt|weight|ht|height|bmi|glucose|fsbs|fsbg|fs|bg|bs|cbg|blood\s+sugars?|fingersticks?|"
             r"na|k|cl|hco3|co2|bicarb|bun|cr|creat(?:inine)?|hgb|hb|hct|wbc|plt|platelets|"
             r"inr|ptt|ph|pco2|po2|pao2|paco2|lactate|lactic\s+acid|trop(?:onin)?|ast|alt|"
             r"alk\s+phos|tbili|t\.?\s?bili|bili(?:rubin)?|albumin|lipase|amylase|ammonia|"
             r"mg|mag|magnesium|phos|ca|calcium|ionized\s+ca|ica|ldl|hdl|a1c|hba1c|tsh|bnp|ck|cpk|"
             r"mb|ef|cvp|map|pap|pas|pad|pcwp|wedge|ci|co|svr|icp|cpp|fio2|peep|ps|psv|tv|vt|"
             r"vte|mv|ve|pip|plateau|pplat|ipap|epap|cpap|etco2|uo|u/o|uop|urine\s+output|"
             r"i/o|intake|output|balance|los|gcs|rass|cam|braden|morse|"
             # issue 57: weaning indices and scores (``RSBI 64``, ``NIF -30``, ``CIWA 12``)
             r"rsbi|nif|mip|ciwa|nihss|sofa|apache(?:\s+ii)?|abgs?|vbgs?|"
             r"sr|sb|nsr|afib|af|paced|sinus\s+(?:rhythm|tach(?:ycardia)?|brady(?:cardia)?)")
#: a few words between a keyword and its value (``HR in the 80s``, ``SBP low 90s``)
_BETWEEN = (r"(?:\s*(?:of|was|is|are|were|=|:|~|>|<|>=|<=|approx\.?|about|around|at|in|the|"
            r"low|high|mid|upper|lower|down|up|to|from|range|ranging|between|remains?|"
            r"remained|stable|sustained|"
            # a change of the value (``PS weaned from 16 to 14``, ``cvp has been 12``)
            r"increased|decreased|inc|dec|increasing|decreasing|weaned|titrated|changed|"
            r"dropped|drifted|rose|fell|went|been|has|had|now|getting|initially|currently|still|"
            r"running)\b|\s*[=:~<>(]|"
            # issue 57: a dash glued to the name (``HR- 75``, ``peep-5``)
            r"(?<=[a-z2])-(?=\s?\d))*\s*")
#: a keyword's value: numbers, ranges of numbers, decades, joined by ``/`` (``120/80``,
#: ``100-120/50-60s``, an ABG ``7.35/40/90``)
_KW_NUM = rf"{_VALUE_BODY}(?:'?s)?"
#: month names (as :data:`_MONTHS`, which is defined with the guards below)
_MONTHS_AHEAD = (r"jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec|january|february|march|"
                 r"april|june|july|august|september|october|november|december")
_KW_RANGE = rf"{_KW_NUM}(?:\s?(?:-|to)\s?{_KW_NUM})?"
_AFTER_KEYWORD = re.compile(
    rf"(?<![\w])(?:{_KEYWORDS})(?:'?s)?{_BETWEEN}((?:(?<=[a-z2]-)|{_NOT_BEFORE}){_KW_RANGE}(?:/{_KW_RANGE}){{0,4}})"
    # issue 57: or the next value's name after a slash (``cr 1.9/bun 38``), never a month's
    rf"(?:{_NOT_AFTER}|(?=/(?!(?:{_MONTHS_AHEAD})\b)[a-z]{{2,}}\b))", re.IGNORECASE)
#: an arterial or venous blood gas without its name: a pH and two to four more values
#: or any chain of three to six numbers joined by ``/`` with a decimal in it (ventilator
#: settings ``500/14/5/0.5``): a date has no decimal point
_GAS = re.compile(r"(?<![\w.,/:#'+-])(?=[\d/.-]*\d\.\d)-?\d{1,4}(?:\.\d{1,3})?"
                  r"(?:/-?\d{1,4}(?:\.\d{1,3})?){2,5}(?![\d/:]|[.-]\d|\w)")
#: a chain of two to five settings joined by ``/`` (``40%/500/12``, ``5/5/.40``) with a percent
#: or a fraction written from its point in it: a date has neither
_SETTINGS = re.compile(r"(?<![\w.,/:#'+-])(?=[\d/.%]*(?:%|(?<![\d.])\.\d))"
                       r"(?:\d{1,4}%?|\.\d{1,3}%?)(?:/(?:\d{1,4}%?|\.\d{1,3}%?)){1,4}"
                       r"(?![\d/:]|[.-]\d|\w)")
#: a ventilator mode and its settings (``AC 500x12``, ``A/C 700/15/5/40%``, ``SIMV 12``,
#: ``PSV 20/5/40%``): a chain of settings is no date; a date's shape alone is (``started on CPAP
#: 3/10``; ``R AC 11/17``, a line placed in the antecubital fossa on a date), whatever the mode
_VENT = re.compile(
    r"(?<![\w/])(?P<mode>a/?c|simv|cmv|prvc|psv|cpap|bipap|ps|assist\s+control|(?:vent\s+)?settings?)"
    r"(?:\s+(?:mode|of|at|on|now|is|was|=|:)\b|\s*[=:]|/(?=\d))*\s*"
    r"(?P<num>(?:\d{1,4}|\.\d{1,3})%?(?:\s?[/x*]\s?(?:\d{1,4}|\.\d{1,3})(?:%|\s?(?:peep|ps|p)\b)?){0,4})"
    # issue 57: a setting before the next one's name (``psv 13/peep``)
    r"(?:(?=/(?:peep|ps|fio2|p)\b)|(?![\d/:]|[.-]\d|\w))", re.IGNORECASE)
#: a date's shape after a ventilator mode: ``11/17``, ``11/17/05``
_DATE_SHAPE = re.compile(r"\d{1,2}\s?[/-]\s?\d{1,2}(?:\s?[/-]\s?\d{2,4})?")
#: a pressure or its range over another (``126-148/55-65``, ``150-160/80``, ``110/60s``) whose
#: first value is above 31: no month or day is, so the pieces after it are no date either
_PRESSURE = re.compile(
    r"(?<![\w.,/:#'+-])(?P<first>\d{2,3})(?:'?s)?(?:\s?-\s?\d{2,3}(?:'?s)?)?/\d{1,3}(?:'?s)?"
    r"(?:\s?-\s?\d{1,3}(?:'?s)?)?(?![\w/:]|[.,-]\d)")
#: two decimals over each other (``5.1/2.6``: cardiac output and index): no date has both
_DECIMALS = re.compile(r"(?<![\w.,/:#'+-])\d{1,2}\.\d{1,2}/\d{1,2}\.\d{1,2}(?![\w/:]|[.,-]\d)")
#: a decimal's whole part and two-digit fraction (read by :func:`_dotted_date`)
_DECIMAL = re.compile(r"(?<![\d.])(\d{1,3})\.(\d{2})(?![\d.])")
#: a value written from its point (``.5 mg``, ``.25 mcg/kg``, ``FiO2 .40``): a fraction below
#: one, no date's or code's part, since nothing but a space, a bracket or a sign precedes it
_POINT = re.compile(r"(?:(?<=[\s(=~<>@])|(?<=[A-Za-z]:)|^)\.\d{1,3}"
                    rf"(?:\s?(?:{_DOSE}|{_VITAL})(?![a-z0-9]))?(?![\w/:]|[.,-]\d)",
                    re.IGNORECASE | re.MULTILINE)
#: a decade up to ``80s`` (``in 90s`` alone may be an age over 89, which HIPAA counts as PHI;
#: ``sats in the 90s`` comes back after its keyword, and ``in her 90s`` never), a decimal that cannot
#: be a month and day (``2.5``, ``7.35``; not ``3.10``), a lone digit not followed by a
#: capitalised word or a direction (``3 Main St``, ``7 North``): counts, steps, scores
_LONE = re.compile(
    r"(?<![\w.,/:#'+-])(?:[1-8]0'?s|\d{1,3}\.\d{1,2}|\d)(?![\w/:]|[.,-]\d)"
    r"(?!\s*(?:[A-Z][a-z]|(?:north|south|east|west|[nsew])\b))")
#: a pair or an ascending range without a name (``120/80``, ``100-120``): kept only when it
#: cannot be a month with a day or a year (see :func:`_date_pair`); a fraction before a dose
#: (``1/2 tab``, ``1/2 NS``)
_BARE = re.compile(
    r"(?<![\w.,/:#'+-])(\d{1,3})(?:'?s)?(\s?-\s?|/)(\d{1,3})(?:'?s)?(?![\w/:]|[.,-]\d)")
_FRACTION = re.compile(
    rf"(?<![\w.,/:#'+-])(?:1/2|1/3|1/4|2/3|3/4)(?=\s?(?:ns|strength|{_DOSE})(?![a-z0-9]))",
    re.IGNORECASE)
#: words that carry a digit and are no number: gases, vitamins, fluids, heart sounds, spine levels,
#: ECG leads, frequencies (``x2``, ``2x``, ``q4h``)
_TERMS = re.compile(
    r"(?<![\w/#-])(?:spo2|sao2|svo2|fio2|pco2|po2|pao2|paco2|etco2|hco3|co2|o2|h2o|cmh2o|h2|"
    r"b12|b6|b1|d5w|d5|d10|d50|d5ns|d5\s?1/2\s?ns|a1c|hba1c|t3|t4|s[1-4]|[ctls][1-9]|"
    r"[ctls]1[0-2]|v[1-6]|x\s?\d{1,2}(?:-\d{1,2})?|\d{1,2}\s?x|"
    r"q\s?\d{1,2}(?:-\d{1,2})?\s?(?:h|hr|hrs|hours?|min)?)"
    r"(?![\w/]|[.-]\d)", re.IGNORECASE)
#: a word of letters and at most three digits that is no number of its own (``CABGx2``,
#: ``AAOx3``, ``5peep``): checked by :func:`_glued_term` and guarded like a term (issue 36)
_GLUED = re.compile(r"(?<![\w/#.,:'+-])(?=[^\W_]*\d)(?=[^\W_]*[^\W\d_])[^\W_]+(?![\w/]|[.,:-]\d)")
#: a ratio of two digits (``IABP 1:1``, ``1:2``): no clock time has one digit after its colon
_RATIO = re.compile(r"(?<![\w.,/:#'+-])[1-9]:[1-9](?![\w/:]|[.,-]\d)")
#: a phone number's last digits before ``x12``: an extension, not a count
_EXTENSION = re.compile(r"\d{3,}\s*$")
#: a fluid balance: a sign and a number (``+500``, ``-1.2L`` is caught by the unit too)
_BALANCE = re.compile(r"(?:(?<=\s)|^)([+-]\s?\d{1,4}(?:\.\d{1,2})?)(?![\d/:.-]|\s*[\d(])",
                      re.MULTILINE)
#: the pain scale: ``pain 3/10``, ``3/10 pain``
_PAIN = re.compile(
    r"(?:(?:pain|rat(?:es|ed|ing))(?:\s+(?:score|scale|level))?\b[^\n\d]{0,12}?(?<![\w/#.-])(\d{1,2}(?:-\d{1,2})?/10)"
    r"(?![\d/]|[.-]\d))|(?:(?<![\w/#.-])(\d{1,2}(?:-\d{1,2})?/10)(?![\d/]|[.-]\d)"
    r"\s*(?:pain|on\s+(?:the\s+)?pain|c/?p|cpain|chest\s+pain|discomfort|h/?a|headache)\b)",
    re.IGNORECASE)
#: before a date: a preposition of time (``on 8/10 cp``)
_TIME_PREPOSITION = re.compile(r"\b(?:on|since|until|till|from|by|of|before|after)[ \t]*$",
                               re.IGNORECASE)
#: a clock time: ``14:30``, ``4:30pm``, ``4pm``, ``@ 0400``, ``~ 1745``, ``0400 hrs``, a shift
#: ``1900-0700`` (one end no year)
_TIME = re.compile(
    r"(?<![\w/#.:-])(?:(?:[01]?\d|2[0-3]):[0-5]\d(?::[0-5]\d)?(?:\s?[ap]\.?m?\.?)?"
    r"|(?:1[0-2]|0?\d)\s?(?:am|pm|a\.m\.|p\.m\.)|(?:1[0-2]|0?\d)[ap]\s?-\s?(?:1[0-2]|0?\d)[ap])"
    r"(?![\w/]|[.:-]\d)"
    r"|(?:(?<=@)|(?<=[@~]\s)|(?<=~)|(?<=\bat\s)|(?<=\bby\s)|(?<=\buntil\s))"
    r"(?:[01]\d|2[0-3])[0-5]\d(?![\w/:]|[.-]\d)"
    r"|(?<![\w/#.:-])(?:[01]\d|2[0-3])[0-5]\d(?=\s?(?:hrs?|hours)\b)"
    r"|(?<![\w/#.:-])(?:[01]\d|2[0-3])[0-5]\d\s?-\s?(?:[01]\d|2[0-3])[0-5]\d(?![\w/:]|[.-]\d)",
    re.IGNORECASE)
_YEAR = re.compile(r"(?:19|20)\d\d")
_MONTHS = (r"jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec|january|february|march|april|"
           r"june|july|august|september|october|november|december")
#: the previous word names a place, an identifier, an age or a month
_PLACE_ID_WORDS = (r"room|rm|bed|bd|unit|floor|fl|flr|apt|apartment|suite|ste|box|ward|pod|bay|num|"
                   r"number|mrn|id|acct|account|ext|extension|pager|beeper|page|phone|ph|tel|"
                   rf"telephone|fax|cell|zip|age|aged|dob|born|{_MONTHS}")
_GUARD_BEFORE = re.compile(
    rf"(?:\b(?:{_PLACE_ID_WORDS}|no|his|her|their)\.?\s*[:#]?\s*|#\s*|\d[/-]\d{{1,4}},?\s+)$",
    re.IGNORECASE)
#: before a term with a digit (``her O2``, ``no O2``) only places, IDs and months refuse
_GUARD_BEFORE_TERM = re.compile(
    rf"(?:\b(?:{_PLACE_ID_WORDS})\.?\s*[:#]?\s*|#\s*|\d[/-]\d{{1,4}},?\s+)$", re.IGNORECASE)
#: the next word is an age or a month
_GUARD_AFTER = re.compile(
    rf"^['\s-]*(?:(?:days?|weeks?|wks?|months?|mos?|hours?|hrs?)[\s-]+)?"
    rf"(?:yo|y/o|y\.o\.?|yrs?|years?|old|of\s+age|{_MONTHS})\b", re.IGNORECASE)
#: a number chained to this one by a dash, slash, colon or point, spaces allowed
#: (``617- 555- 0143``), or followed by a group of digits as a phone's are (``617 555 0143``):
#: part of a phone, date or code
_CHAIN_BEFORE = re.compile(r"\d\s?[-/:.]\s?$")
_CHAIN_AFTER = re.compile(r"\s?[-/:]\s?\d|[.,]\d|\s\d{3}[\s.-]\d|\s\d{4}(?!\d)"
                          # issue 57: an area code in brackets before a phone's digits
                          r"|\)\s?\d")
#: two whole numbers that could be a month and a day
_PAIR = re.compile(r"(?<![\d.])(?=(\d{1,2})'?s?\s?(?:/|-|to)\s?(\d{1,2})(?![\d.]))")
_UNIT_NOW = re.compile(rf"\s?(?:{_DOSE}|{_VITAL})(?![a-z0-9])", re.IGNORECASE)


#: letters a glued word must not carry: an ordinal, a decade (``90s``: an age), a month, an age
#: or a sex beside the number (``92yo``, ``F92``), a place or identifier word (``rm12``, ``MRN123``), an extension (``x123``)
_GLUED_REFUSE = re.compile(
    rf"\d+(?:st|nd|rd|th|s)|.*(?:{_MONTHS}).*|\d+(?:y|[mfwb]).*|[mfwb]\d+|x\d{{3,}}|"
    rf"(?:{_PLACE_ID_WORDS}|pt|bd)\d+.*|\d+(?:{_PLACE_ID_WORDS})", re.IGNORECASE)


def _glued_term(word: str) -> bool:
    """Whether a word of letters and digits is a term, not a number in disguise: at most three
    digits, none of the shapes of :data:`_GLUED_REFUSE`, and each run of letters an
    abbreviation: at most four letters besides a times or frequency ``x``/``q`` at its edge, and
    not capitalised like a name (``Kent3``; a place name glued to a ward number, ``NAME3``, has
    more letters)."""
    if sum(c.isdigit() for c in word) > 3 or _GLUED_REFUSE.fullmatch(word):
        return False
    for run in LETTER_RUN.findall(word):
        core = run[1:] if run[:1] in "xXqQ" and len(run) > 1 else run
        core = core[:-1] if core[-1:] in "xX" and len(core) > 1 else core
        if len(core) > 4 or (core[:1].isupper() and not core.isupper() and len(core) > 1):
            return False
    return True


def _date_pair(value: str) -> bool:
    """Whether ``value`` holds two whole numbers that could be a month and a day or a month and
    a two-digit year (``3/10``, ``10/3``, ``3/98``)."""
    for m in _PAIR.finditer(value):
        a, b = int(m.group(1)), int(m.group(2))
        if 1 <= a <= 12 or (1 <= a <= 31 and 1 <= b <= 12):
            return True
    return False


def _ascending(value: str) -> bool:
    """Whether ``value`` is one range of two whole numbers written with a dash or ``to``, the
    first below the second (``12-20``, ``9 to 13``): after a vital sign's name it is the sign's
    range, not a month and day."""
    m = re.fullmatch(r"(\d{1,3})\s?(?:-|to)\s?(\d{1,3})", value)
    return bool(m) and int(m.group(1)) < int(m.group(2))


def _dotted_date(value: str) -> bool:
    """Whether ``value`` holds a decimal that could be a month and a day (``3.10``, not ``2.5``
    nor ``7.35``)."""
    return any(1 <= int(a) <= 12 and 1 <= int(b) <= 31 for a, b in _DECIMAL.findall(value))


def _year(value: str, *, time: bool) -> bool:
    """Whether a match is a year (19xx/20xx) or, for a time, holds no end that is no year (a
    shift ``1900-0700`` comes back, ``1990-2005`` and ``at 2000`` do not)."""
    if not time:
        return bool(_YEAR.fullmatch(value))
    ends = re.findall(r"\d+", value)
    return all(_YEAR.fullmatch(e) for e in ends) or (len(ends) == 1 and bool(_YEAR.search(value)))


def _guarded(text: str, start: int, end: int, *, term: bool = False) -> bool:
    """Whether the words around ``[start, end)`` say it could be a place, ID, age or date
    (``term``: a word with letters and digits, which no person word makes an age)."""
    line_start = text.rfind("\n", 0, start) + 1
    before = text[max(line_start, start - 30):start]
    after = text[end:end + 20]
    return bool(_guard_words(text, start, end, term=term) or _CHAIN_BEFORE.search(before)
                or _CHAIN_AFTER.match(after))


def _guard_words(text: str, start: int, end: int, *, term: bool = False) -> bool:
    """The words of :func:`_guarded`: a place, ID, age or month word before ``[start, end)``,
    an age or month word after it."""
    line_start = text.rfind("\n", 0, start) + 1
    before = text[max(line_start, start - 30):start]
    guard = _GUARD_BEFORE_TERM if term else _GUARD_BEFORE
    return bool(guard.search(before) or _GUARD_AFTER.match(text[end:end + 20]))


# --- issue 57: measurements read as a clinician writes them -------------------------------------
#: a blood gas in any order and with any separator (``7.38-33-169``, ``169-33-7.38-20--4``,
#: ``abg 7.47,35,124,2,26,98%``): three to seven values joined by ``-``, ``/`` or ``,`` one of
#: which is a pH (6.80 to 7.79 with two decimals); the others of at most three digits (a
#: signed base excess ``--4``, a saturation ``98%``). No date has a two-decimal pH in it, no
#: phone or ID such short parts; a chain with a year, a part of four digits or more, a phone's
#: groups or two whole numbers that could be a month and a day is still refused
#: (:func:`_gas_refused`)
_GAS_VALUE = r"(?:-?\d{1,3}(?:\.\d{1,2})?%?)"
_GAS_SEP = r"(?:--?|/|,[ \t]?)"
_GAS_ANY = re.compile(
    rf"(?:(?<=[A-Za-z]-)|(?<![\w.,/:#'+-]))(?=[^\s]*?(?<![\d.])(?:7\.[0-7]\d|6\.[89]\d)(?![\d.]))"
    rf"{_GAS_VALUE}(?:{_GAS_SEP}{_GAS_VALUE}){{2,6}}(?![\w/:]|[.,-]\d)")
#: an age below 90 (HIPAA's Safe Harbor names only ages over 89): a whole number of one or two
#: digits before an age word (``74 YR OLD``, ``83 yo``, ``47yo``, ``78 y.o.``, ``47 y old``,
#: ``74-year-old``) or after ``age``/``aged``; a number of 90 or more never comes back
_AGE = re.compile(
    r"(?<![\w.,/:#'+-])(?P<n>\d{1,2})(?P<glued>yo\b)?(?(glued)|(?=[ \t-]*(?:yo\b|y/o\b|y\.o\b|"
    r"(?:yrs?|years?|y)[ \t-]*old\b)))", re.IGNORECASE)
_AGE_AFTER_WORD = re.compile(r"\bage[d]?[ \t]*[:=]?[ \t]*(?P<n>\d{1,2})(?![\w/:]|[.,-]\d)",
                             re.IGNORECASE)
#: below this an age is no identifier (HIPAA Safe Harbor: ages over 89 are)
AGE_PHI = 90
#: a device's size after ``#`` before the device (``#8 ett``, ``#18 angio``, ``# 7.5 trach``)
_DEVICE = re.compile(
    r"(?<![\w#])#[ \t]?(?P<n>\d{1,2}(?:\.\d)?)(?=[ \t]*(?:fr|french|g|ga|gauge|ett|et|tube|"
    r"trach|shiley|portex|ngt|ogt|foley|picc|iv|angio|cath|catheter|jp|ct|chest\s+tube|"
    r"mac|miller|oett|nett|oral|nasal)\b)", re.IGNORECASE)
#: a decade of values from 110 (``in 180s``, ``to 120's``): no age (``in her 100s`` is one),
#: no day, no year (a year's decade has four digits)
_HIGH_DECADE = re.compile(r"(?<![\w.,/:#'+-])(?:1[1-9]|2\d)0'?s(?![\w/:]|[.,-]\d)")
#: a pulse or edema grade (``2+``, ``3+/3+``, ``2-3+``): a sign glued to one digit up to 4
_GRADE = re.compile(r"(?<![\w.,/:#'+-])[0-4](?:-[0-4])?\+(?:/[0-4]\+)?(?![\w/:]|\d)")
#: a tidal volume by a rate (``500x10``, ``800 x 12``): no date, phone or ID has this shape
_TV_RATE = re.compile(r"(?<![\w.,/:#'+-])[2-9]\d\d[ \t]?[x*×][ \t]?\d{1,2}"
                      r"(?![\w/:]|[.-]\d)", re.IGNORECASE)
#: orientation (``a+ox3``, ``ox 4``) and an ordinal degree (``1st degree``, ``3rd deg``)
_ORIENTED = re.compile(r"(?<![\w/#-])ox[ \t]?[0-4](?![\w/]|[.-]\d)"
                       r"|(?<![\w.,/:#'+-])[1-3](?:st|nd|rd)(?=[ \t]+deg(?:ree)?s?\b)",
                       re.IGNORECASE)
#: a term of letters and digits after another and a comma (``ac8,tv800``)
_GLUED_AFTER_COMMA = re.compile(r"(?<=[^\W_][\d%],)(?=[^\W_]*\d)(?=[^\W_]*[^\W\d_])[^\W_]+"
                                r"(?![\w/]|[.,:-]\d)")
#: a clock time heading a line or an entry (``0730:``, ``1530 -``): hours and minutes; a year's
#: shape is refused (:func:`_year`)
_STAMP = re.compile(r"(?:(?<=\n)|^)[ \t]*(?P<t>(?:[01]\d|2[0-3])[0-5]\d)"
                    r"(?=[ \t]*:(?![ \t]?\d)|[ \t]+-[ \t]+\D)",
                    re.MULTILINE)
#: before a number: another number across a space, a dot, a bracket or a dash (a phone's groups)
_GROUP_BEFORE = re.compile(r"\d[ \t.)-]{1,2}$")
#: a fraction glued to its fluid (``1/2NS``)
_FRACTION_GLUED = re.compile(r"(?<![\w.,/:#'+-])(?:1/2|1/4|3/4)(?:ns|nss|nl)\b", re.IGNORECASE)
#: a change after a value's name (``PS from 15 to 12``, ``peep from 10 to 5``): a descending
#: pair there is the change, not a month and a day
_FROM_TO = re.compile(rf"(?<![\w])(?:{_KEYWORDS})(?:'?s)?[ \t]+(?:(?:was|were|is|been|has|had|"
                      r"weaned|titrated|changed|decreased|increased|dropped|went|down|up)[ \t]+)*"
                      rf"from[ \t]+(?P<a>{_VALUE_BODY})[ \t]+to[ \t]+(?P<b>{_VALUE_BODY})"
                      r"(?![\w/:]|[.,-]\d)", re.IGNORECASE)
#: a value after ``up to`` / ``down to`` / ``increased to``: only one that no day, month, age
#: or short year can be (above 31, or with a decimal below 10); a keyword's own value is read
#: by :data:`_AFTER_KEYWORD`
_UP_DOWN = re.compile(r"\b(?:up|down|increased|decreased|weaned|titrated|dropped|came)[ \t]+to"
                      r"[ \t]+(?P<n>\d{2,3}(?:'?s)?|\d\.\d{1,2})(?![\w/:]|[.,-]\d)", re.IGNORECASE)


def _gas_refused(chain: str) -> bool:
    """Whether a blood gas chain could still be a date, a phone or an ID: two whole numbers
    joined by ``-`` or ``/`` that could be a month and a day (``7.40-12-10``), a year, four
    digits or more."""
    parts = re.findall(r"\d+(?:\.\d+)?", chain)
    if any(len(p.split(".")[0]) >= 4 or _YEAR.fullmatch(p) for p in parts):
        return True
    wholes = re.findall(r"(?<![\d.])(\d{1,2})(?:-(?!-)|/)(\d{1,2})(?![\d.])", chain)
    return any(1 <= int(a) <= 12 or (1 <= int(a) <= 31 and 1 <= int(b) <= 12) for a, b in wholes)


def _issue57_ranges(text: str) -> list[tuple[int, int]]:
    """The measurements of issue 57 (each pattern above says why it is no PHI); every one is
    guarded as the others are (:func:`_guarded`: a place, ID, age or month word beside it, a
    chain to a date or a phone)."""
    out: list[tuple[int, int]] = []
    for m in _GAS_ANY.finditer(text):
        if not _gas_refused(m.group()) and not _guard_words(text, m.start(), m.end()):
            out.append(m.span())
    for pat in (_AGE, _AGE_AFTER_WORD):
        for m in pat.finditer(text):
            if int(m.group("n")) >= AGE_PHI or _CHAIN_BEFORE.search(
                    text, max(0, m.start() - 3), m.start()):
                continue
            before = text[max(text.rfind("\n", 0, m.start()) + 1, m.start() - 30):m.start()]
            if pat is _AGE and _GUARD_BEFORE_TERM.search(before):
                continue  # ``rm 12 yo`` never; a month or a date before: part of it
            out.append((m.start("n"), m.end() if pat is _AGE else m.end("n")))
    for m in _DEVICE.finditer(text):
        if not _guard_words(text, m.start(), m.end()):
            out.append(m.span("n"))
    for pat in (_HIGH_DECADE, _GRADE, _TV_RATE, _ORIENTED, _GLUED_AFTER_COMMA, _FRACTION_GLUED):
        for m in pat.finditer(text):
            if pat is _GLUED_AFTER_COMMA and not _glued_term(m.group()):
                continue
            if _GROUP_BEFORE.search(text, max(0, m.start() - 3), m.start()):
                continue  # ``555 800x12``: a phone's digit group before it
            if not _guarded(text, m.start(), m.end(), term=pat in (_ORIENTED, _GLUED_AFTER_COMMA)):
                out.append(m.span())
    for m in _STAMP.finditer(text):
        if not _YEAR.fullmatch(m.group("t")):
            out.append(m.span("t"))
    for m in _FROM_TO.finditer(text):
        if not _guarded(text, m.start("a"), m.end("b")):
            out.extend((m.span("a"), m.span("b")))
    for m in _UP_DOWN.finditer(text):
        n = re.sub(r"'?[sS]$", "", m.group("n"))
        if ("." in n or int(n) > 31) and not _guarded(text, m.start("n"), m.end("n")):
            out.append(m.span("n"))
    return out


def measurement_ranges(text: str) -> list[tuple[int, int]]:
    """Character ranges ``[start, end)`` of the numbers of ``text`` read as measurements, read as
    the members read the note (:mod:`dphub.textnorm`: a zero-width space or a soft hyphen inside
    ``3/10`` must not split a date into a lone ``3``), in ``text``'s own offsets."""
    norm = normalize(text)
    if norm is None:
        return _ranges(text)
    return _merged([norm.to_original(a, b) for a, b in _ranges(norm.text)])


def _ranges(text: str) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for m in _UNIT_AFTER.finditer(text):
        num = m.group(1)
        dose = bool(m.group(2)) and bool(_UNIT_NOW.match(text, m.end(1)))
        if not m.group(2) and "/" not in num:  # a duration: ``3-4 days`` is no date
            ends = re.findall(r"\d+(?:\.\d+)?", num)
            dose = len(ends) == 2 and float(ends[0]) < float(ends[1])
        if _YEAR.fullmatch(num) and not re.match(rf"\s?(?:{_DOSE})(?![a-z])", text[m.end(1):],
                                                 re.IGNORECASE):
            continue
        if (_date_pair(num) and not dose) or _guarded(text, m.start(1), m.end(1)):
            continue
        out.append((m.start(1), m.end()))
    for m in _AFTER_KEYWORD.finditer(text):
        num = m.group(1)
        # a name glued to its value by a dash (``fio2-40%``): the name's digit is no chain
        glued = re.fullmatch(r"[A-Za-z]+\d?-", text[m.start():m.start(1)]) is not None
        guarded = (_guard_words(text, m.start(1), m.end(1))
                   or _CHAIN_AFTER.match(text, m.end(1)) is not None) if glued else \
            _guarded(text, m.start(1), m.end(1))
        if _YEAR.fullmatch(num) or (_date_pair(num) and not _ascending(num)) or guarded:
            continue
        out.append((m.start(1), m.end(1)))
    for m in _VENT.finditer(text):
        num = m.group("num")
        if (_YEAR.fullmatch(num) or _guarded(text, m.start("num"), m.end("num"))
                or (_DATE_SHAPE.fullmatch(num) and _date_pair(num))):
            continue
        out.append((m.start("num"), m.end("num")))
    for m in _LONE.finditer(text):
        num = m.group()
        if not num.endswith("s") and _dotted_date(num):
            continue
        if _guarded(text, m.start(), m.end()):
            continue
        out.append((m.start(), m.end()))
    for m in _BARE.finditer(text):
        if (_date_pair(m.group()) or (m.group(2).strip() == "-" and int(m.group(1)) >= int(m.group(3)))
                or _guarded(text, m.start(), m.end())):
            continue
        out.append((m.start(), m.end()))
    for pattern in (_TERMS, _TIME, _GAS, _SETTINGS, _DECIMALS, _POINT, _FRACTION):
        for m in pattern.finditer(text):
            if (_year(m.group(), time=pattern is _TIME)
                    or _guarded(text, m.start(), m.end(), term=pattern is _TERMS)
                    or (pattern is _DECIMALS and _dotted_date(m.group()))):
                continue
            if m.group()[:1] in "xX" and _EXTENSION.search(text, max(0, m.start() - 12), m.start()):
                continue
            out.append((m.start(), m.end()))
    for m in _GLUED.finditer(text):
        if (_glued_term(m.group()) and not _guarded(text, m.start(), m.end(), term=True)
                and not (m.group()[:1] in "xX"
                         and _EXTENSION.search(text, max(0, m.start() - 12), m.start()))):
            out.append((m.start(), m.end()))
    for m in _PRESSURE.finditer(text):
        if int(m.group("first")) > 31 and not _guarded(text, m.start(), m.end()):
            out.append((m.start(), m.end()))
    for m in _RATIO.finditer(text):
        if not _guarded(text, m.start(), m.end()):
            out.append((m.start(), m.end()))
    for m in _BALANCE.finditer(text):
        if _guarded(text, m.start(1), m.end(1)):
            continue
        if re.search(r"\d[ \t]*$", text[max(0, m.start(1) - 4):m.start(1)]):
            continue  # ``555 - 1234``: a phone's or an ID's groups around a dash (issue 57)
        out.append((m.start(1), m.end(1)))
    for m in _PAIN.finditer(text):
        g = 1 if m.group(1) else 2
        if _TIME_PREPOSITION.search(text, max(0, m.start(g) - 8), m.start(g)):
            continue  # ``on 8/10 cp``: a date, then the pain
        out.append((m.start(g), m.end(g)))
    out.extend(_issue57_ranges(text))
    return _merged(out)


#: a section of past events (``PMH:``, ``PSH``, ``HPI:``, ``history``; at a line's start or after
#: a sentence) to the next blank line: the numbers there are the years and dates of past events
_HISTORY = re.compile(
    r"(?im)(?:^|[.;][ \t]+)[ \t]*(?:p?mhx?|pshx?|hpi|hx|(?:past\s+)?(?:medical|surgical|social)?\s*history)"
    r"\b[^\n]*(?:\n(?![ \t]*\r?$)[^\n]*)*")
#: a four-digit number that reads as a year by what precedes it: an apostrophe, or a
#: preposition of time (``since 1994``)
_YEAR_BEFORE = re.compile(r"(?:['\u2019\u2018`]|\b(?:in|since|until|till|of|from|by)\s+)$",
                          re.IGNORECASE)
#: a whole number below this, alone, could be a day of the month or a two-digit year
#: (``reports 17``, ``MI in 87 and 03``): its shape alone refuses it
_BARE_DATE = 100
_ORDINAL = re.compile(r"\d+(?:st|nd|rd|th)", re.IGNORECASE)
#: numbers joined by a dash, slash, colon or point (spaces allowed beside the sign): a date, a
#: phone, a code, or a measurement's range and settings (``89-100/50``, ``7.41/55``)
_CHAIN = re.compile(r"\d+(?:'?s)?(?:[ \t]?[-/:.][ \t]?\d+(?:'?s)?)+")
#: after a number: an age's or a sex's word (``67 male``, ``82 F``) or a direction (``7 North``)
_AGE_OR_WARD_AFTER = re.compile(
    r"[ \t-]*(?:male|female|man|woman|gentleman|gent|lady|boy|girl|[mf]|north|south|east|west"
    r"|[nsew])\b", re.IGNORECASE)
#: after a number: a capitalised word, as an address has (``12 Main St``; as :data:`_LONE`)
_CAPITAL_AFTER = re.compile(r"[ \t]*[A-Z][a-z]")
#: one number of a chain and the separator after it
_CHAIN_PART = re.compile(r"(\d+)(?:'?s)?([ \t]?[-/:.][ \t]?)?")
#: a phone's digit groups (``555-0143``, ``617 555 0143``)
_PHONE = re.compile(r"\d{3}[ \t.-]{1,2}\d{4}(?!\d)|\d{3}[ \t.)-]{1,2}\d{3}[ \t.-]{1,2}\d{4}")
#: :data:`_PHONE` as whole numbers (no digit glued before or after)
_PHONE_GROUPS = re.compile(rf"(?<!\d)(?:{_PHONE.pattern})(?!\d)")
#: after a number: a space and a phone's or code's digit group (``617 555 0143``)
_GROUP_AFTER = re.compile(r"[ \t]\d{3}[ \t.-]\d|[ \t]\d{4}(?!\d)")
_DIGIT_WORD = re.compile(r"(?=[^\W_]*\d)[^\W_]+")


def refused_numbers(text: str) -> list[tuple[int, int]]:
    """Character ranges of the words with a digit that no model may let back, whatever it
    says: the numbers whose own shape or neighbours say they could be a date, a year, an age,
    an ID, a phone or a room. The inverse rule lets a number outside every measurement context
    back only when every model is very sure of it (:mod:`dphub.ensemble.inverse`, ``SURE``)
    and it is none of these:

    * a number after a place, ID, age or month word, or before an age or month word (the
      guards of every measurement context);
    * a part of a chain of numbers that could be a date, a phone or a code (:func:`_date_chain`:
      ``3/10``, ``617-555-0143``, ``12.03``), or before a phone's digit group; the parts of a
      chain that can be none of these (``89-100/50``, ``7.41/55/134``) are decided by the models;
    * a whole number below 100 outside a chain, which alone could be a day of the month or a
      two-digit year (``reports 17``, ``in 87 and 03``), a year (19xx/20xx, or four digits after an apostrophe
      or a preposition of time: ``since 1994``), a number of five digits or more, an ordinal
      (``3rd``), a word of letters and digits of a refused shape (an age, a sex, a month or a
      room beside the number: ``92yo``, ``F67``, ``rm12``); before an age's or sex's word, a
      direction or a capitalised word (``67 male``, ``7 North``, ``12 Main St``);
    * any number in a section of past events (``PMH:``, ``HPI:`` at a line's start or after a
      sentence, to the next blank line), where numbers are years and dates (``MI 1992``).

    Read, as :func:`measurement_ranges`, as the members read the note."""
    norm = normalize(text)
    if norm is None:
        return _refused(text)
    return _merged([norm.to_original(a, b) for a, b in _refused(norm.text)])


def _date_chain(chain: str) -> bool:
    """Whether a chain of numbers (:data:`_CHAIN`) could be a date, a year, a phone or a code:
    two numbers across a slash or a dash that could be a month and a day or a month and a
    year, as :func:`_date_pair` reads them (``3/10``, ``25-3``, ``3/98``, ``4/17.89``: a
    decimal point after the day does not make it a measurement), a decimal
    that could be one (``3.10``), a year, a part of five digits or more, a phone's groups."""
    pieces = _CHAIN_PART.findall(chain)  # (number, the separator after it)
    for (a, sep), (b, _) in itertools.pairwise(pieces):
        x, y = int(a), int(b)
        if sep.strip() in ("/", "-") and (1 <= x <= 12 or (1 <= x <= 31 and 1 <= y <= 12)):
            return True
    parts = re.findall(r"\d+", chain)
    return (_dotted_date(chain) or _PHONE.search(chain) is not None
            or any(len(p) >= 5 or _YEAR.fullmatch(p) for p in parts))


def _refused(text: str) -> list[tuple[int, int]]:
    # zones where every number is refused: sections of past events and a phone's groups
    # (``617 555 0143``: the last group alone has no shape of its own)
    history = _merged(sorted([m.span() for m in _HISTORY.finditer(text)]
                             + [m.span() for m in _PHONE_GROUPS.finditer(text)]))
    chains = [(m.start(), m.end(), _date_chain(m.group())) for m in _CHAIN.finditer(text)]
    out: list[tuple[int, int]] = []
    k = c = 0
    for m in _DIGIT_WORD.finditer(text):
        a, b = m.span()
        w = m.group()
        while k < len(history) and history[k][1] <= a:
            k += 1
        while c < len(chains) and chains[c][1] <= a:
            c += 1
        whole = w.isdigit()
        line_start = text.rfind("\n", 0, a) + 1
        chained = c < len(chains) and chains[c][0] < b
        if ((k < len(history) and history[k][0] <= a)
                or (chained and chains[c][2])
                or _guard_words(text, a, b, term=not whole)
                or _GROUP_AFTER.match(text, b) is not None
                or _AGE_OR_WARD_AFTER.match(text, b) is not None
                or _CAPITAL_AFTER.match(text, b) is not None
                or (whole and (len(w) >= 5 or _YEAR.fullmatch(w)
                               or (int(w) < _BARE_DATE and not chained)))
                or (whole and len(w) == 4
                    and _YEAR_BEFORE.search(text, max(line_start, a - 8), a) is not None)
                or _ORDINAL.fullmatch(w) or (not whole and _GLUED_REFUSE.fullmatch(w))):
            out.append((a, b))
    return out


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged
