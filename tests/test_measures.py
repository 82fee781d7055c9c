"""Numbers the inverse rule may let back (issue 26): measurement contexts and their look-alikes."""

from __future__ import annotations

import pytest
from faker import Faker

from dphub.ensemble.measures import measurement_ranges


def released(text: str) -> list[str]:
    return [text[a:b] for a, b in measurement_ranges(text)]


@pytest.mark.parametrize(("text", "value"), [
    ("HR 80s", "80s"),                       # a decade after a vital sign
    ("SBP 90-100s", "90-100s"),              # a range
    ("RR 20's", "20's"),
    ("temp 99.1", "99.1"),
    ("BP 100-120/50-60s", "100-120/50-60s"),  # ranges joined by a slash
    ("HR in the low 80s", "80s"),            # a few words between name and value
    ("on 2L NC", "2L"),
    ("lasix 20 iv", "20 iv"),                # a route is a dose's unit
    ("at 10cc/hr", "10cc"),
    ("2-3 L", "2-3 L"),                      # a date-shaped range with a dose unit after it
    ("K 3.8 hct 28", "3.8"),
    ("2 units PRBC", "2 units"),
    ("SpO2 95%", "SpO2"),                    # a term that carries a digit
    ("given x2 today", "x2"),
    ("q4h prn", "q4h"),
    ("I/O +500 today", "+500"),              # a fluid balance
    ("pain 3/10", "3/10"),                   # the pain scale
    ("3/10 pain", "3/10"),
    ("ABG 7.35/40/90/24", "7.35/40/90/24"),
    ("ABG 7.42/38/105 on", "7.42/38/105"),   # a gas without its name: the pH leads
    ("vent 500/14/5/0.5", "500/14/5/0.5"),   # a chain with a decimal is no date
    ("at 0400 turned", "0400"),              # clock times are no identifier
    ("seen 4pm", "4pm"),
    ("14:30 ok", "14:30"),
    ("shift 7a-7p: ok", "7a-7p"),
    ("gcs 15", "15"),
    ("1 assist", "1"),
    ("running in the 80s", "80s"),           # a bare decade below the PHI ages
    ("sats in the 90s", "90s"),              # ... and any decade after its keyword                       # a lone digit: a count
    ("given 2.5 of", "2.5"),                 # a decimal that cannot be a month and day
    ("was 120/80 and", "120/80"),            # a pair that cannot be a date
    ("was 100-120 and", "100-120"),          # an ascending range that cannot be a date
    ("1/2 NS at", "1/2"),                    # a fraction before a dose
    ("for 3-4 days", "3-4 days"),            # an ascending range before a duration
    ("on no O2 now", "O2"),                  # "no" refuses numbers, not terms
    ("x2-3 today", "x2-3"),
    ("s/p CABGx2 today", "CABGx2"),          # a word of letters and a few digits (issue 36)
    ("AAOx3, MAEx4", "MAEx4"),
    ("on 5peep now", "5peep"),
    ("IABP 1:2 per", "1:2"),                # a ratio of two digits
    # issue 36, numbers outside the first contexts
    ("RR 12-20 today", "12-20"),             # an ascending range after a keyword
    ("CVP 9-13 now", "9-13"),
    ("gave .5 mg ativan", ".5 mg"),          # a value written from its point
    ("fio2 .40 now", ".40"),
    ("then .3 of sl ntg", ".3"),
    ("lasix 40mgs iv", "40mgs"),             # plural and shorthand dose units
    ("levo at 2 mics", "2 mics"),
    ("A/C 700/15/5/40% now", "700/15/5/40%"),  # a ventilator mode and its settings
    ("on AC 500x12/.50/5peep now", "500x12/.50/5peep"),
    ("PSV 20/5/40% now", "20/5/40%"),
    ("SIMV 700x12 now", "700x12"),
    ("SIMV 14 tv 450", "14"),
    ("VENT 35%/450/14 PEEP 8", "35%/450/14"),  # settings with a percent in the chain
    ("on 5/5/.40 w/ abg", "5/5/.40"),
    ("kept within 95-140/45-55 range", "95-140/45-55"),  # a pressure range over another
    ("at 150-160/80 pt", "150-160/80"),
    ("CO/CI 5.1/2.6 with", "5.1/2.6"),       # two decimals over each other
    ("arrived ~ 1745 alert", "1745"),        # a time after ~
    ("for 1900-0700 shift", "1900-0700"),    # a shift, one end no year
    ("Psv weaned from 16 to 14 due", "16 to 14"),  # a change of a keyword's value
    ("cvp has been 12 today", "12"),
    ("TM 101 today", "101"),
    ("gave 5\u200b mg", "5\u200b mg"),       # read as the members read it, in its own offsets
    ("gave \uff15 mg today", "\uff15 mg"),
])
def test_measurement_contexts_are_released(text: str, value: str) -> None:
    assert value in released(text), text


@pytest.mark.parametrize("text", [
    "on 3/4 days", "on 4-3 days",  # a date-shaped pair before a duration: slash or descending
    "room T4", "apt 3", "no. 5", "No 12",
])
def test_more_look_alikes_are_not_released(text: str) -> None:
    assert all(not any(c.isdigit() for c in r) for r in released(text)), (text, released(text))


@pytest.mark.parametrize("text", [
    "on 3/10", "seen 3-10 today", "in 3/98", "in 10/98 seen", "on 25/3", "was 3-98",
    "was 120-100 and",     # a descending range: no measurement shape, could be a code
    "1/2 seen",            # a fraction without a dose is a date (Jan 2)
    "on 3/14 5", "3-10-2026", "03/14/2026", "3/10/26", "on 3.10 seen",
    "RR 20-12",            # a descending date-shaped range after a keyword (could be 20/12)
    "R AC 11/17 placed", "R AC 11/17/05 placed",  # AC is also the antecubital fossa
    "ac 3-10 seen", "L AC 3/10", "started on CPAP 3/10", "PSV 15/5", "on bipap 12/25/05",
    "since ~2000 pt", "~ 1990 dx", "1990-2005", "2000-2015 shift",  # years, also as a shift
    "3.10/5.12 x",         # decimals that could be months and days
    "cvp increased on 3/10", "HR has been 3/10", "Dr T 12 Main",  # a date; an initial's address
    # an invisible character does not split a date into lone numbers (zero-width, soft hyphen)
    "started on CPAP 3\u200b/10 today", "on 3\u200b-10 seen", "on 3\u00ad/10 seen",
    "R AC 11\u2060/17 placed",
    "on 12/25-12/30 stay", "617/555-0143", "31/12 seen", "12/31-1/2 away",  # dates, a phone
    "seen 4/17.89 x", "seen 4.17.89 x",  # a year after a date's point
    "BP 3/10",             # a pair that could be a date, even after a keyword
    "K 3/10/26",
    "Jan 3", "3 Jan", "March 10",
    "in 2019", "HR 2019",  # years
    # ages of 90 and more (below 90 an age is no identifier: test_measures_clinician.py)
    "97 yo", "92 y/o", "90 year old", "3 months old", "aged 91", "age 100", "in her 90s",
    "his 80's", "pt in 90s", "Pt 91", "now 100s",  # a bare decade of 90 and over may be an age
    "617-555-0143", "(617) 555-0143", "call 617- 555- 1234", "HR 617 555 1234", "rate 55 1234", "call 555 1234 x12.", "call 555.0143", "+1 617 555 0143", "Ph 555-1234",
    "MRN 1234567", "id 4", "#2", "no. 3",
    "rm 12", "room 5", "bed 3", "unit 4", "floor 7", "apt 2",
    "Boston, CA 90210", "lives at 3 Main St", "Main St 12", "7 North",
    "'88",
    "the 3rd",             # ordinals stay hidden
    "at 2000",             # a time that could be a year
    # letters glued to digits that still hide an age, a date, a place or an ID (issue 36)
    "pt 92yo", "67yoM here", "a 92F with", "F92 here", "rm12 now", "MRN123", "bed12",
    "call 555-1234x123", "call 555 1234 x12", "Jan5", "5jan", "2nd", "apt 4B", "unit 7A",
    "3 Main St Apt. 4B", "400x10x30", "id A12", "pt2 now", "ext12",
    "on 1:2:3",            # a chain is no ratio
    "pt at WESTBROOK3 now", "to Westbrook3 today", "to Kent3 today",  # a place with a ward number
])
def test_look_alikes_are_not_released(text: str) -> None:
    assert all(not any(c.isdigit() for c in r) for r in released(text)), (text, released(text))


def test_faker_identifiers_in_plain_sentences_are_not_released() -> None:
    """Dates in the usual formats, phones, street addresses, SSNs, ZIP codes and record numbers
    from Faker, inside a plain sentence: no digit of theirs comes back."""
    fake = Faker("en_US")
    fake.seed_instance(26)
    formats = ("%m/%d/%Y", "%m/%d/%y", "%m-%d-%Y", "%m/%d", "%m-%d", "%d.%m.%Y", "%B %d, %Y",
               "%b %d", "%d %b", "%Y-%m-%d", "%m/%y", "%B %Y")
    values: list[str] = []
    for _ in range(60):
        day = fake.date_between("-30y", "+1y")
        values += [day.strftime(f) for f in formats]
        values += [fake.phone_number(), fake.street_address(), fake.ssn(), fake.zipcode(),
                   fake.numerify("MRN #######"), fake.numerify("Room ###"),
                   # ages over 89 (HIPAA Safe Harbor); younger ages come back (issue 57)
                   f"{fake.random_int(90, 104)} year old", f"{fake.random_int(90, 104)} yo"]
    for value in values:
        text = f"pt seen on {value} today"
        start = text.index(value)
        for a, b in measurement_ranges(text):
            assert b <= start or a >= start + len(value) or not any(
                c.isdigit() for c in text[max(a, start):min(b, start + len(value))]), value
