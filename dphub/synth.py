"""Synthetic labelled clinical notes for demos, tests and public warm starts.

Real PHI-annotated notes cannot be shared, so every demo, test and public pre-training run needs
notes whose PHI is fake but looks like the real thing. This module writes two kinds:

* ``nursing`` -- short telegraphic nursing progress notes, mostly ALL CAPS like the nursing notes
  of the PhysioNet deid corpus (age, sex, admission route, then system-by-system findings),
  sometimes mixed case;
* ``discharge`` -- longer, sectioned, mixed-case discharge summaries with headers, addresses,
  contact details and identifiers.

Design choices that matter for the models trained on them:

* Text and spans are built **together**, piece by piece (:class:`_NoteBuilder`); nothing is ever
  found by searching the text afterwards, so spans are exact even when a name also occurs as a
  common word.
* Each patient has one identity (:class:`Identity`: name, relatives, care team, hospital,
  address, identifiers ...) shared by all of that patient's notes, so patient-level splits and
  patient-level DP see realistic repetition.
* PHI appears in hard forms too (lower-case names, initials, first names only, "Dr. X", "7/22",
  "Jan 3rd", "'92", "58yo", "> 89", hospital abbreviations, room numbers) and the filler is full
  of capitalised non-PHI words (drug names, eponyms, section headers, "WILL", "MAY") so models
  learn precision as well as recall.
* Labels are i2b2-2014 subcategories (PATIENT, DOCTOR, RELATIVE, DATE, ...), which
  :mod:`dphub.labels` maps to HIPAA categories. ``OTHER`` is never generated: it is a catch-all
  without a definition that could be synthesised faithfully.
* Output is a pure function of ``(n, kind, seed, patients)``: every patient draws from its own
  seeded ``random.Random`` and seeded Faker instance, so the list and the iterator agree and the
  same seed gives byte-identical files (for a given Faker version).
"""

from __future__ import annotations

import datetime as dt
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache

from faker import Faker

from dphub.errors import ConfigError
from dphub.notes import Note, Span

KINDS: tuple[str, ...] = ("nursing", "discharge")

#: Average notes per patient when ``patients`` is not given (the PhysioNet nursing corpus has ~15;
#: fewer keeps small demo sets patient-diverse).
_NOTES_PER_PATIENT: dict[str, int] = {"nursing": 5, "discharge": 2}

# --------------------------------------------------------------------------------------------
# Vocabularies. Small curated lists: real US places and clinical words make the notes look real
# (Faker's invented town names alone would teach models that only odd words are cities).
# --------------------------------------------------------------------------------------------

_REAL_CITIES = (
    "Boston", "Worcester", "Springfield", "Lowell", "Cambridge", "Brockton", "Quincy", "Lynn",
    "Newton", "Somerville", "Framingham", "Waltham", "Salem", "Revere", "Peabody", "Medford",
    "Malden", "Taunton", "Chelsea", "Everett", "Baltimore", "Annapolis", "Providence", "Hartford",
    "New Haven", "Portland", "Manchester", "Nashua", "Burlington", "Albany", "Buffalo",
    "Rochester", "Syracuse", "Philadelphia", "Pittsburgh", "Newark", "Trenton", "Richmond",
    "Norfolk", "Columbus", "Cleveland", "Detroit", "Chicago", "Milwaukee", "Minneapolis",
    "St. Louis", "Kansas City", "Denver", "Phoenix", "Tucson", "Dallas", "Houston", "Austin",
    "San Antonio", "Atlanta", "Miami", "Tampa", "Orlando", "Charlotte", "Raleigh", "Nashville",
    "Memphis", "Louisville", "Seattle", "Spokane", "San Diego", "Sacramento", "Fresno",
    "Las Vegas", "Salt Lake City", "New Orleans", "Brookline", "Dorchester", "Fall River",
    "New Bedford", "Plymouth", "Hyannis", "Gloucester", "Marblehead",
)

_COUNTRIES = (
    "Portugal", "Ireland", "Italy", "Haiti", "Brazil", "China", "Vietnam", "India", "Russia",
    "Greece", "Poland", "Jamaica", "Mexico", "Canada", "Cambodia", "Dominican Republic",
    "Cape Verde", "Puerto Rico", "Germany", "Lebanon", "Korea", "Colombia", "Nigeria", "Ukraine",
)

_PROFESSIONS = (
    "carpenter", "teacher", "nurse", "electrician", "plumber", "accountant", "truck driver",
    "police officer", "firefighter", "lawyer", "engineer", "secretary", "bus driver", "cook",
    "mechanic", "postal worker", "librarian", "pharmacist", "farmer", "fisherman", "painter",
    "bartender", "social worker", "professor", "dentist", "architect", "machinist", "welder",
    "cashier", "janitor", "real estate agent", "banker", "chef", "musician", "pilot",
    "longshoreman", "construction worker", "hairdresser", "insurance salesman", "physician",
)

_HOSPITAL_SUFFIXES = (
    "Hospital", "General Hospital", "Health Center", "Medical Center", "Memorial Hospital",
    "Regional Hospital", "Community Hospital",
)

_REHAB_WORDS = ("Rehab", "Rehabilitation Hospital", "Nursing Home", "Manor", "Care Center")

_DEPT_WORDS = ("Cardiology", "Oncology", "Renal Clinic", "Heart Center", "Liver Center")

_DX = (
    "CAD", "CHF", "COPD", "HTN", "NIDDM", "IDDM", "afib", "PVD", "CRI", "ESRD on HD",
    "pulm HTN", "hypothyroidism", "GERD", "CVA", "TIA", "DVT", "PE", "pneumonia", "urosepsis",
    "Parkinson's disease", "Alzheimer's dementia", "Crohn's disease", "Hodgkin's lymphoma",
    "Barrett's esophagus", "Graves' disease", "Cushing's syndrome", "Guillain-Barre syndrome",
    "Wernicke's encephalopathy", "Mallory-Weiss tear", "Bell's palsy", "MRSA", "C diff",
    "ETOH abuse", "hyperlipidemia", "anemia", "GI bleed", "UTI", "cellulitis", "AAA",
    "aortic stenosis", "mitral regurgitation", "SBO", "pancreatitis", "cirrhosis",
)

_PROCS = (
    "CABG", "3V CABG", "MVR", "AVR", "PTCA", "cath", "ex lap", "Whipple", "Nissen fundoplication",
    "Roux-en-Y gastric bypass", "TURP", "R TKR", "L THR", "ORIF", "thoracentesis", "EGD",
    "colonoscopy", "pacer placement", "AV node ablation", "Hartmann's procedure",
)

_MEDS = (
    "Lasix", "Lopressor", "Coumadin", "heparin", "Levophed", "dopamine", "propofol", "fentanyl",
    "Ativan", "Haldol", "vanco", "Zosyn", "Flagyl", "levofloxacin", "Protonix", "insulin",
    "Norvasc", "captopril", "Zofran", "Reglan", "Colace", "senna", "Dulcolax", "Tylenol",
    "Percocet", "Dilaudid", "morphine", "Seroquel", "Zyprexa", "digoxin", "amiodarone",
    "nitro", "KCL", "mag sulfate", "albuterol", "Atrovent", "prednisone", "Solu-Medrol",
    "aspirin", "Plavix", "Lipitor", "metformin", "Synthroid", "Kayexalate", "vitamin K",
)

_ROUTES = ("PO", "IV", "SC", "IM", "via NGT", "PR", "SL")

_FREQ = ("daily", "BID", "TID", "QID", "q4h", "q6h", "q8h", "PRN", "qhs")

_DEVICES = (
    "Foley", "Swan-Ganz", "Hickman", "Groshong", "Dobhoff", "PICC", "A-line", "JP drain",
    "Jackson-Pratt drain", "Penrose", "Pleur-evac", "Bair Hugger", "NGT", "ETT", "trach",
)

_TUBE_FEEDS = ("Jevity", "Nepro", "Promote", "Ensure", "Boost", "Impact")

_RHYTHMS = ("SR", "NSR", "ST", "SB", "AF", "afib", "V-paced", "A-paced", "1st degree AVB")

_UNITS = ("MICU", "CCU", "CSRU", "SICU", "TSICU", "ER", "EW", "floor", "OR", "cath lab", "PACU")

_SIGNS = (
    "Murphy's sign negative", "Babinski negative bilat", "no Kussmaul resp",
    "Cheyne-Stokes resp pattern noted", "Trendelenburg for line placement",
    "Wenckebach noted on tele", "Mobitz I on tele", "Glasgow Coma Scale 11",
    "Braden score 14", "positive Homan's sign",
)

_MALE_RELATIONS = ("husband", "son", "brother", "father", "nephew", "grandson", "friend")
_FEMALE_RELATIONS = ("wife", "daughter", "sister", "mother", "niece", "granddaughter", "friend")

_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)


def _ordinal(day: int) -> str:
    if 10 <= day % 100 <= 20:
        return f"{day}th"
    return f"{day}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(day % 10, 'th')}"


# --------------------------------------------------------------------------------------------
# Identities
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Person:
    """A named person: first and last name, and sex (for pronouns and relation words)."""

    first: str
    last: str
    sex: str  # "F" | "M"

    @property
    def full(self) -> str:
        return f"{self.first} {self.last}"

    @property
    def initials(self) -> str:
        return f"{self.first[0]}{self.last[0]}".upper()


@dataclass(frozen=True)
class Relative:
    person: Person
    relation: str  # "wife", "son" ... (filler, never PHI)


@dataclass(frozen=True)
class Hospital:
    name: str
    abbreviation: str


@dataclass
class Identity:
    """Everything that is constant about one synthetic patient across their notes."""

    person: Person
    age: int
    admit: dt.date
    relatives: list[Relative]
    care_team: list[Person]
    nurses: list[Person]
    hospital: Hospital
    other_hospital: Hospital
    rehab: str
    department: str
    street: str
    city: str
    state: str
    state_abbr: str
    zip: str
    country: str
    profession: str
    employer: str
    phone: str
    relative_phone: str
    email: str
    mrn: str
    idnum: str
    ssn: str
    healthplan: str
    account: str
    room: str
    device_serial: str

    @property
    def dob(self) -> dt.date:
        try:
            return self.admit.replace(year=self.admit.year - self.age) - dt.timedelta(days=40)
        except ValueError:  # Feb 29
            return self.admit.replace(day=28, year=self.admit.year - self.age)


def _phone(rng: random.Random) -> str:
    area = rng.choice(("617", "508", "781", "978", "413", "410", "301", "212", "401", "603"))
    mid = f"{rng.randint(200, 989)}"
    last = f"{rng.randint(0, 9999):04d}"
    style = rng.random()
    if style < 0.4:
        return f"{area}-{mid}-{last}"
    if style < 0.7:
        return f"({area}) {mid}-{last}"
    if style < 0.85:
        return f"{area}.{mid}.{last}"
    return f"{mid}-{last}"


def _hospital(fake: Faker, rng: random.Random, city: str) -> Hospital:
    r = rng.random()
    if r < 0.35:
        base = fake.last_name()
        suffix = rng.choice(_HOSPITAL_SUFFIXES)
        name = f"{base} {suffix}"
    elif r < 0.6:
        base = city
        suffix = rng.choice(("General Hospital", "Hospital", "Medical Center"))
        name = f"{base} {suffix}"
    elif r < 0.8:
        saint = fake.first_name_female() if rng.random() < 0.6 else fake.first_name_male()
        name = f"St. {saint}'s Hospital"
    else:
        name = f"{fake.last_name()} {fake.last_name()} {rng.choice(_HOSPITAL_SUFFIXES)}"
    words = [w for w in re.split(r"[\s\-]+", name.replace("St.", "Saint")) if w]
    abbreviation = "".join(w[0] for w in words if w[0].isalpha()).upper()
    if len(abbreviation) < 2:
        abbreviation = (words[0][:2]).upper()
    return Hospital(name, abbreviation)


def _person(fake: Faker, rng: random.Random, sex: str | None = None, last: str | None = None
            ) -> Person:
    sex = sex or rng.choice("FM")
    first = fake.first_name_female() if sex == "F" else fake.first_name_male()
    return Person(first, last or fake.last_name(), sex)


def _make_identity(fake: Faker, rng: random.Random) -> Identity:
    person = _person(fake, rng)
    # ages: mostly elderly ICU patients, with a real share over 89 (HIPAA's special case)
    age = rng.randint(90, 103) if rng.random() < 0.15 else rng.randint(18, 89)
    year = rng.randint(1988, 2024) if rng.random() < 0.5 else rng.randint(2080, 2199)
    admit = dt.date(year, 1, 1) + dt.timedelta(days=rng.randint(0, 364))
    relatives: list[Relative] = []
    spouse_sex = "M" if person.sex == "F" else "F"
    if rng.random() < 0.7:
        relatives.append(Relative(_person(fake, rng, spouse_sex, person.last),
                                  "husband" if spouse_sex == "M" else "wife"))
    for _ in range(rng.randint(1, 3)):
        sex = rng.choice("FM")
        relation = rng.choice(_FEMALE_RELATIONS if sex == "F" else _MALE_RELATIONS)
        same_last = relation in ("son", "daughter", "brother", "sister") and rng.random() < 0.6
        relatives.append(Relative(_person(fake, rng, sex, person.last if same_last else None),
                                  relation))
    city = rng.choice(_REAL_CITIES) if rng.random() < 0.7 else fake.city()
    hospital = _hospital(fake, rng, rng.choice(_REAL_CITIES))
    other_hospital = _hospital(fake, rng, city)
    state_name = fake.state()
    return Identity(
        person=person,
        age=age,
        admit=admit,
        relatives=relatives,
        care_team=[_person(fake, rng) for _ in range(rng.randint(2, 4))],
        nurses=[_person(fake, rng, "F" if rng.random() < 0.8 else "M") for _ in range(3)],
        hospital=hospital,
        other_hospital=other_hospital,
        rehab=f"{fake.last_name()} {rng.choice(_REHAB_WORDS)}",
        department=f"{fake.last_name()} {rng.choice(_DEPT_WORDS)}"
        if rng.random() < 0.5 else f"{fake.last_name()} {rng.randint(2, 14)}",
        street=fake.street_address(),
        city=city,
        state=state_name,
        state_abbr=fake.state_abbr(),
        zip=fake.zipcode(),
        country=rng.choice(_COUNTRIES),
        profession=rng.choice(_PROFESSIONS),
        employer=fake.company(),
        phone=_phone(rng),
        relative_phone=_phone(rng),
        email=f"{person.first[0].lower()}{person.last.lower()}{rng.randint(1, 99)}@"
        f"{fake.free_email_domain()}",
        mrn=f"{rng.randint(1000000, 9999999)}",
        idnum=f"{rng.randint(10, 99)}-{rng.randint(100000, 999999)}",
        ssn=fake.ssn(),
        healthplan=f"{rng.choice('ABCHMW')}{rng.randint(100000000, 999999999)}",
        account=f"{rng.randint(10000000, 99999999)}",
        room=f"{rng.randint(1, 9)}{rng.randint(0, 3)}{rng.randint(1, 9)}",
        device_serial=f"{rng.choice(('PJN', 'RNB', 'BTR', 'SN'))}{rng.randint(100000, 999999)}",
    )


# --------------------------------------------------------------------------------------------
# Building text and spans together
# --------------------------------------------------------------------------------------------


class _NoteBuilder:
    """Appends filler and PHI pieces, recording each PHI piece's exact offsets as it goes."""

    def __init__(self, upper: bool) -> None:
        self.upper = upper
        self.parts: list[str] = []
        self.spans: list[Span] = []
        self.pos = 0

    def _case(self, s: str) -> str:
        if not self.upper:
            return s
        u = s.upper()
        return u if len(u) == len(s) else s  # never let case mapping move offsets

    def text(self, s: str) -> None:
        if s:
            s = self._case(s)
            self.parts.append(s)
            self.pos += len(s)

    def phi(self, s: str, label: str, *, keep_case: bool = False) -> None:
        s = s.strip()
        if not s:
            return
        if not keep_case:
            s = self._case(s)
        start = self.pos
        self.parts.append(s)
        self.pos += len(s)
        self.spans.append(Span(start, self.pos, label))

    def build(self) -> tuple[str, list[Span]]:
        return "".join(self.parts), list(self.spans)


_SLOT_RE = re.compile(r"\{([A-Za-z_]+)\}")


@lru_cache(maxsize=1024)
def _parse(template: str) -> tuple[tuple[bool, str], ...]:
    """Split a template into (is_slot, text) pieces once; templates are reused many times."""
    out: list[tuple[bool, str]] = []
    pos = 0
    for m in _SLOT_RE.finditer(template):
        if m.start() > pos:
            out.append((False, template[pos : m.start()]))
        out.append((True, m.group(1)))
        pos = m.end()
    if pos < len(template):
        out.append((False, template[pos:]))
    return tuple(out)


class _NoteWriter:
    """Renders templates for one note of one patient: slots become PHI or clinical filler."""

    def __init__(self, ident: Identity, rng: random.Random, b: _NoteBuilder, kind: str,
                 day: dt.date) -> None:
        self.ident = ident
        self.rng = rng
        self.b = b
        self.kind = kind
        self.day = day  # the date this note is written on

    def render(self, template: str) -> None:
        for is_slot, piece in _parse(template):
            if is_slot:
                getattr(self, f"slot_{piece}")()
            else:
                self.b.text(piece)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    # -- names ---------------------------------------------------------------------------------

    def _name_lower(self) -> bool:
        """Lower-case names inside upper-case text are a real, hard form in nursing notes."""
        return self.chance(0.12)

    def slot_PT(self) -> None:
        """The patient in a random form: title + last, first only, initials, full, lower-case."""
        p, r = self.ident.person, self.rng.random()
        if r < 0.35:
            self.b.text("Mr. " if p.sex == "M" else self.rng.choice(("Mrs. ", "Ms. ")))
            self._name(p.last, "PATIENT")
        elif r < 0.55:
            self._name(p.first, "PATIENT")
        elif r < 0.7:
            self.b.text("pt ")
            self.b.phi(p.initials, "PATIENT")
        else:
            self._name(p.full, "PATIENT")

    def slot_PT_FULL(self) -> None:
        p = self.ident.person
        if self.chance(0.3):
            self.b.phi(p.last, "PATIENT")
            self.b.text(", ")
            self.b.phi(p.first, "PATIENT")
        else:
            self.b.phi(p.full, "PATIENT")

    def slot_PT_FIRST(self) -> None:
        self._name(self.ident.person.first, "PATIENT")

    def _name(self, name: str, label: str) -> None:
        if self._name_lower():
            self.b.phi(name.lower(), label, keep_case=True)
        else:
            self.b.phi(name, label)

    def slot_DR(self) -> None:
        """A doctor of the care team, after a "Dr." the template provides or not."""
        d, r = self.rng.choice(self.ident.care_team), self.rng.random()
        if r < 0.6:
            self._name(d.last, "DOCTOR")
        elif r < 0.8:
            self._name(d.full, "DOCTOR")
        else:
            self.b.phi(f"{d.first[0]}. {d.last}", "DOCTOR")

    def slot_DR_FULL(self) -> None:
        self.b.phi(self.rng.choice(self.ident.care_team).full, "DOCTOR")

    def slot_RN(self) -> None:
        """A nurse or other clinician, usually by first name (PhysioNet labels them HCPName)."""
        n = self.rng.choice(self.ident.nurses)
        self._name(n.first if self.chance(0.7) else n.full, "DOCTOR")

    def slot_REL(self) -> None:
        """Relation word (filler) and the relative's name, e.g. "WIFE MARY", "son (bob)"."""
        rel = self.rng.choice(self.ident.relatives)
        r = self.rng.random()
        name = rel.person.first if self.chance(0.75) else rel.person.full
        if r < 0.6:
            self.b.text(f"{rel.relation} ")
            self._name(name, "RELATIVE")
        elif r < 0.85:
            self.b.text(f"{rel.relation} (")
            self._name(name, "RELATIVE")
            self.b.text(")")
        else:
            self._name(name, "RELATIVE")
            self.b.text(f" ({rel.relation})")

    def slot_REL_NAME(self) -> None:
        self._name(self.rng.choice(self.ident.relatives).person.first, "RELATIVE")

    # -- dates and ages -------------------------------------------------------------------------

    def _date_text(self, d: dt.date, styles: str) -> str:
        style = self.rng.choice(styles)
        m, day, y = d.month, d.day, d.year
        mon = _MONTHS[m - 1]
        return {
            "a": f"{m}/{day}",
            "b": f"{m:02d}/{day:02d}",
            "c": f"{m}/{day}/{y}",
            "d": f"{m:02d}/{day:02d}/{y % 100:02d}",
            "e": f"{y}-{m:02d}-{day:02d}",
            "f": f"{mon[:3]} {_ordinal(day)}",
            "g": f"{mon} {day}, {y}",
            "h": f"{day} {mon[:3]} {y}",
            "i": f"{mon[:3]} {day}",
            "j": f"{mon} {y}",
            "k": f"{m:02d}/{day:02d}/{y}",
            "l": f"{m}-{day}",
        }[style]

    def _date_styles(self) -> str:
        return "aaaabclfi" if self.kind == "nursing" else "ceekkgghfjab"

    def slot_DATE(self) -> None:
        d = self.day + dt.timedelta(days=self.rng.randint(-20, 10))
        self.b.phi(self._date_text(d, self._date_styles()), "DATE")

    def slot_DATE_SHORT(self) -> None:
        d = self.day + dt.timedelta(days=self.rng.randint(-10, 5))
        self.b.phi(self._date_text(d, "aaabl"), "DATE")

    def slot_TODAY(self) -> None:
        self.b.phi(self._date_text(self.day, self._date_styles()), "DATE")

    def slot_ADMIT(self) -> None:
        self.b.phi(self._date_text(self.ident.admit, self._date_styles()), "DATE")

    def slot_DISCH(self) -> None:
        d = self.ident.admit + dt.timedelta(days=self.rng.randint(3, 20))
        self.b.phi(self._date_text(d, self._date_styles()), "DATE")

    def slot_DOB(self) -> None:
        self.b.phi(self._date_text(self.ident.dob, "cekg"), "DATE")

    def slot_FUTURE(self) -> None:
        d = self.day + dt.timedelta(days=self.rng.randint(5, 60))
        self.b.phi(self._date_text(d, self._date_styles()), "DATE")

    def slot_YEAR(self) -> None:
        """A past year: "1992", "'92" or "92" (only the digits are PHI... and the apostrophe)."""
        y = self.ident.admit.year - self.rng.randint(1, 25)
        r = self.rng.random()
        if r < 0.5:
            self.b.phi(str(y), "DATE")
        elif r < 0.8:
            self.b.phi(f"'{y % 100:02d}", "DATE")
        else:
            self.b.phi(f"{y % 100:02d}", "DATE")

    def slot_AGE(self) -> None:
        self.b.phi(str(self.ident.age), "AGE")

    def slot_AGE_PHRASE(self) -> None:
        """Age with its unit in the many ways notes write it; only the number is PHI."""
        age = self.ident.age
        if age > 89 and self.chance(0.35):
            self.b.text(self.rng.choice(("> ", ">", "over ")))
            self.b.phi("89", "AGE")
            self.b.text(self.rng.choice((" yo", " y/o", " years old", " YO")))
            return
        self.b.phi(str(age), "AGE")
        self.b.text(self.rng.choice((" YO", "yo", " yo", " y/o", " YR OLD", "-year-old",
                                     " year old", " y.o.")))

    # -- contact --------------------------------------------------------------------------------

    def slot_PHONE(self) -> None:
        self.b.phi(self.ident.phone if self.chance(0.5) else _phone(self.rng), "PHONE")

    def slot_REL_PHONE(self) -> None:
        self.b.phi(self.ident.relative_phone, "PHONE")

    def slot_PAGER(self) -> None:
        self.b.phi(f"{self.rng.randint(10000, 99999)}" if self.chance(0.5)
                   else f"{self.rng.randint(1000, 9999)}", "PHONE")

    def slot_FAX(self) -> None:
        self.b.phi(_phone(self.rng), "FAX")

    def slot_EMAIL(self) -> None:
        self.b.phi(self.ident.email, "EMAIL", keep_case=True)

    def slot_URL(self) -> None:
        h = re.sub(r"[^a-z]", "", self.ident.hospital.name.lower())[:16] or "hospital"
        path = self.rng.choice(("", "/portal", "/patients/login", "/myrecord", "/careteam"))
        scheme = self.rng.choice(("https://www.", "http://", "www.", "https://portal."))
        self.b.phi(f"{scheme}{h}.org{path}", "URL", keep_case=True)

    def slot_IP(self) -> None:
        r = self.rng
        self.b.phi(f"10.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(1, 254)}", "IPADDR")

    def slot_USERNAME(self) -> None:
        n = self.rng.choice(self.ident.nurses + self.ident.care_team)
        self.b.phi(f"{n.first[0].lower()}{n.last.lower()[:7]}", "USERNAME", keep_case=True)

    # -- identifiers ----------------------------------------------------------------------------

    def slot_MRN(self) -> None:
        self.b.phi(self.ident.mrn, "MEDICALRECORD")

    def slot_IDNUM(self) -> None:
        self.b.phi(self.ident.idnum, "IDNUM")

    def slot_SSN(self) -> None:
        self.b.phi(self.ident.ssn, "SSN")

    def slot_HEALTHPLAN(self) -> None:
        self.b.phi(self.ident.healthplan, "HEALTHPLAN")

    def slot_ACCOUNT(self) -> None:
        self.b.phi(self.ident.account, "ACCOUNT")

    def slot_LICENSE(self) -> None:
        r = self.rng
        self.b.phi(f"{r.choice('ABFM')}{r.choice('ABCDEFGHJKLMNPRSTW')}{r.randint(1000000, 9999999)}",
                   "LICENSE")

    def slot_DEVICE(self) -> None:
        self.b.phi(self.ident.device_serial, "DEVICE")

    # -- locations ------------------------------------------------------------------------------

    def slot_HOSP(self) -> None:
        h = self.ident.hospital
        self.b.phi(h.abbreviation if self.chance(0.4) else h.name, "HOSPITAL")

    def slot_OHOSP(self) -> None:
        h = self.ident.other_hospital
        if self.chance(0.25):
            self.b.phi(h.abbreviation, "HOSPITAL")
        elif self.chance(0.1):
            self.b.phi(h.name.lower(), "HOSPITAL", keep_case=True)
        else:
            self.b.phi(h.name, "HOSPITAL")

    def slot_REHAB(self) -> None:
        self.b.phi(self.ident.rehab, "HOSPITAL")

    def slot_ROOM(self) -> None:
        self.b.phi(self.ident.room if self.chance(0.7) else f"{self.ident.room}{'AB'[self.rng.randint(0, 1)]}",
                   "ROOM")

    def slot_DEPT(self) -> None:
        self.b.phi(self.ident.department, "DEPARTMENT")

    def slot_ORG(self) -> None:
        self.b.phi(self.ident.employer, "ORGANIZATION")

    def slot_STREET(self) -> None:
        self.b.phi(self.ident.street, "STREET")

    def slot_CITY(self) -> None:
        self.b.phi(self.ident.city, "CITY")

    def slot_STATE(self) -> None:
        if self.chance(0.5):
            self.b.phi(self.ident.state_abbr, "STATE")
        else:
            self.b.phi(self.ident.state, "STATE")

    def slot_ZIP(self) -> None:
        self.b.phi(self.ident.zip, "ZIP")

    def slot_ADDRESS(self) -> None:
        self.slot_STREET()
        self.b.text(", ")
        self.slot_CITY()
        self.b.text(", ")
        self.b.phi(self.ident.state_abbr, "STATE")
        self.b.text(" ")
        self.slot_ZIP()

    def slot_COUNTRY(self) -> None:
        self.b.phi(self.ident.country, "COUNTRY")

    def slot_PROF(self) -> None:
        self.b.phi(self.ident.profession, "PROFESSION")

    # -- filler (never PHI) ---------------------------------------------------------------------

    def slot_dx(self) -> None:
        self.b.text(self.rng.choice(_DX))

    def slot_proc(self) -> None:
        self.b.text(self.rng.choice(_PROCS))

    def slot_med(self) -> None:
        self.b.text(self.rng.choice(_MEDS))

    def slot_dose(self) -> None:
        r = self.rng
        self.b.text(f"{r.choice(_MEDS)} {r.choice((5, 10, 20, 25, 40, 50, 100, 250, 500))} "
                    f"{r.choice(('mg', 'mcg', 'units', 'meq'))} {r.choice(_ROUTES)} "
                    f"{r.choice(_FREQ)}")

    def slot_device(self) -> None:
        self.b.text(self.rng.choice(_DEVICES))

    def slot_tf(self) -> None:
        self.b.text(self.rng.choice(_TUBE_FEEDS))

    def slot_sign(self) -> None:
        self.b.text(self.rng.choice(_SIGNS))

    def slot_unit(self) -> None:
        self.b.text(self.rng.choice(_UNITS))

    def slot_rhythm(self) -> None:
        self.b.text(self.rng.choice(_RHYTHMS))

    def slot_hr(self) -> None:
        self.b.text(str(self.rng.randint(48, 135)))

    def slot_bp(self) -> None:
        self.b.text(f"{self.rng.randint(78, 180)}/{self.rng.randint(38, 100)}")

    def slot_rr(self) -> None:
        self.b.text(str(self.rng.randint(10, 34)))

    def slot_sat(self) -> None:
        self.b.text(str(self.rng.randint(88, 100)))

    def slot_temp(self) -> None:
        self.b.text(f"{self.rng.uniform(96.5, 102.5):.1f}")

    def slot_num(self) -> None:
        self.b.text(str(self.rng.choice((1, 2, 3, 4, 5, 6, 8, 10, 12, 20, 30, 40, 50, 60, 80, 100,
                                          120, 150, 200, 250, 500))))

    def slot_time(self) -> None:
        self.b.text(f"{self.rng.randint(0, 23):02d}{self.rng.choice(('00', '15', '30', '45'))}")

    def slot_lab(self) -> None:
        r = self.rng
        self.b.text(r.choice((
            f"K {r.uniform(2.9, 5.9):.1f}", f"BUN {r.randint(8, 90)}", f"CR {r.uniform(0.6, 4.5):.1f}",
            f"HCT {r.uniform(21, 42):.1f}", f"WBC {r.uniform(2, 25):.1f}", f"INR {r.uniform(1, 7):.1f}",
            f"PTT {r.uniform(22, 110):.1f}", f"NA {r.randint(126, 150)}", f"GLU {r.randint(60, 400)}",
            f"LACTATE {r.uniform(0.6, 8):.1f}", f"MG {r.uniform(1.2, 2.8):.1f}",
            f"ABG {r.uniform(7.1, 7.5):.2f}/{r.randint(28, 70)}/{r.randint(55, 300)}",
        )))

    def slot_sex(self) -> None:
        self.b.text(("female" if self.ident.person.sex == "F" else "male") if self.chance(0.6)
                    else self.ident.person.sex)

    def slot_he(self) -> None:
        self.b.text("she" if self.ident.person.sex == "F" else "he")

    def slot_He(self) -> None:
        self.b.text("She" if self.ident.person.sex == "F" else "He")

    def slot_his(self) -> None:
        self.b.text("her" if self.ident.person.sex == "F" else "his")


# --------------------------------------------------------------------------------------------
# Note layouts
# --------------------------------------------------------------------------------------------

_NURSING_OPENERS = (
    "{AGE_PHRASE} {sex} sent over from {OHOSP} for {dx} after a fall at home. ",
    "{AGE_PHRASE} {sex} with hx {dx}, {dx}, s/p MI {YEAR}, admitted {DATE_SHORT} with {dx}. ",
    "Pt is a {AGE_PHRASE} {sex} s/p {proc} on {DATE_SHORT}, transferred from {OHOSP} ER. ",
    "{PT} is a {AGE_PHRASE} {sex} admitted to {HOSP} {unit} on {ADMIT} after being found down. ",
    "{AGE_PHRASE} {sex} from {CITY} admitted with {dx}; PMH {dx}, {proc} {YEAR}. ",
    "Pt {AGE_PHRASE} {sex} transferred from {OHOSP} to {unit} for further mgmt of {dx}. ",
)

_NURSING_SECTIONS: dict[str, tuple[str, ...]] = {
    "NEURO": (
        "fully oriented, moving all limbs, PERRL. ", "sedated on propofol {num} mcg/kg/min, arousable to voice. ",
        "{sign}. ", "lethargic but follows simple commands. ", "Ativan {num} mg IV for agitation. ",
        "pt calm, sleeping in naps overnight. ", "{PT_FIRST} oriented x2, confused to time. ",
        "c/o pain, {med} given, pain relieved. ",
    ),
    "CV": (
        "HR {hr} {rhythm}, BP {bp}, no ectopy noted. ", "{med} gtt adjusted for SBP goal > {num}. ",
        "{lab}, repleted with {num} meq KCL. ", "{device} in place, CVP {num}. ",
        "HR {hr}-{hr} {rhythm}, {sign}. ", "BP {bp} on {med} {num} mcg/min. ",
        "pulses palp, extremities warm. ", "pacer DDD, serial # {DEVICE} checked by EP. ",
        "NBP {bp}-{bp}, MAPs > 60. ", "{med} gtt off since {time}, BP stable. ",
        "heparin gtt at {num} units/hr, PTT {lab}. ",
    ),
    "RESP": (
        "LS rhonchorous throughout, suctioned for tan secretions. ", "{num}L nasal cannula, SpO2 {sat}%. ",
        "vent settings AC {num}/500/40%/5, RR {rr}. ", "LS clear upper, diminished bases. ",
        "{lab}. ", "weaned to CPAP {num}/5, tolerating well. ",
        "RR {rr}, sats {sat}% via face tent at 40%. ", "nebs given by RT, {med} q4h. ",
        "CXR with ? LLL infiltrate. ",
    ),
    "GI": (
        "abdomen soft with active BS; {tf} infusing at {num} cc/hr. ", "NPO except meds. ",
        "no stool today, {med} given. ", "OGT on low intermittent suction, bilious output. ",
        "guaiac positive stool x1, {lab}. ", "FS {num}, SS insulin coverage given. ",
        "abd distended, firm, hypoactive BS. ",
    ),
    "GU": (
        "{device} patent, output yellow and clear, {num}-{num} cc/hr. ", "{lab}, {lab}. ",
        "lasix {num} mg IV, diuresed well. ", "UO marginal, MD aware. ",
    ),
    "ID": (
        "Tmax {temp}, on {med} and {med}. ", "cultures sent {DATE_SHORT}, pending. ",
        "{lab}, afebrile. ", "MRSA precautions maintained. ",
    ),
    "SKIN": (
        "coccyx with stage II decub, duoderm applied. ", "skin intact, turned q2h. ",
        "{device} site without redness or drainage. ", "incision C/D/I, staples intact. ",
    ),
    "SOCIAL": (
        "{REL} visited; Dr. {DR} gave an update. ", "{REL} called, will be in tomorrow. ",
        "{REL} reachable by phone at {REL_PHONE}. ", "family meeting with {REL} and {REL}, pt now DNR/DNI. ",
        "pt lives with {REL} in {CITY}. ", "pt is a retired {PROF}. ", "pt works as a {PROF} at {ORG}. ",
        "{REL} visited, very supportive; {REL_NAME} is HCP. ", "pt emigrated from {COUNTRY} in {YEAR}. ",
        "{REL} here from {CITY}, {STATE}, staying at hotel. ", "no family contact this shift. ",
        "case mgmt spoke with {REL} re dispo to {REHAB}. ",
    ),
}

_NURSING_PLANS = (
    "Dr. {DR} aware. ", "per Dr. {DR}, cath planned for am. ", "f/u {lab} in am. ",
    "possible transfer back to {OHOSP} {DATE_SHORT}. ", "to go for MRI {DATE_SHORT}. ",
    "MD paged {PAGER} re low UO. ", "will keep monitoring, may need {med}. ",
    "wean vent as tol, cont {med}. ", "call Dr. {DR} at {PHONE} with any changes. ",
    "continue plan of care, supportive care to pt and family. ", "screen for {REHAB}. ",
    "D/C {device} {DATE_SHORT}. ", "{RN} RN to follow. ",
)

_NURSING_EXTRAS = (
    "PMH: {dx}, s/p MI {YEAR}; {proc} {YEAR}; {dx}; {dx}. ",
    "{DATE_SHORT} found by {REL} on floor, awake but confused. ",
    "pt moved to room {ROOM} {time}. ", "bed {ROOM}. ",
    "ID band checked, MRN {MRN}. ", "insurance {HEALTHPLAN} verified by case mgmt. ",
    "{RN} RN covering for break. ", "pt states name is {PT_FIRST}, calls self {PT_FIRST}. ",
    "Hx obtained from {REL} and old records from {OHOSP}. ",
    "pt seen in {HOSP} clinic {DATE}. ", "last admission {HOSP} {DATE} for {dx}. ",
    "{sign}. ", "given {dose}. ", "recent trip to {COUNTRY}. ",
    "records faxed to {OHOSP}, fax {FAX}. ", "family asks updates be emailed to {EMAIL}. ",
    "pt asking to return home to {CITY}. ", "pt enrolled in study, id {IDNUM}. ",
)


def _nursing_note(w: _NoteWriter) -> None:
    rng = w.rng
    if rng.random() < 0.35:
        w.render(rng.choice(("Nursing note, day shift\n", "NPN 7P-7A\n", "MICU NSG NOTE\n",
                             "Nursing note {TODAY}\n", "CCU RN admit note\n")))
    if rng.random() < 0.5:
        w.render("O: " if rng.random() < 0.5 else "")
        w.render(rng.choice(_NURSING_OPENERS))
    layout = rng.random()
    if layout < 0.4:
        # O/A/P telegraphic paragraph
        for t in rng.sample(_NURSING_EXTRAS, k=rng.randint(1, 3)):
            w.render(t)
        keys = rng.sample(list(_NURSING_SECTIONS), k=3)
        for key in keys:
            w.render(rng.choice(_NURSING_SECTIONS[key]))
        w.render("A: " + rng.choice(("stable, ", "no hemodynamic compromise, ", "cont {dx}, ")))
        w.render("P: " + rng.choice(_NURSING_PLANS))
    else:
        keys = list(_NURSING_SECTIONS)
        chosen = [k for k in keys if rng.random() < 0.7] or ["NEURO"]
        for key in chosen:
            w.render(f"\n{key}: ")
            for t in rng.sample(_NURSING_SECTIONS[key], k=min(len(_NURSING_SECTIONS[key]),
                                                             rng.randint(2, 4))):
                w.render(t)
        for t in rng.sample(_NURSING_EXTRAS, k=rng.randint(0, 2)):
            w.render(t)
        w.render("\nPLAN: ")
        for t in rng.sample(_NURSING_PLANS, k=rng.randint(1, 3)):
            w.render(t)
    w.b.text("\n")


def _discharge_note(w: _NoteWriter) -> None:
    rng = w.rng
    r = w.render
    r("Name: {PT_FULL}    Unit No: {MRN}\n\n")
    r("Admission Date: {ADMIT}    Discharge Date: {DISCH}\n\n")
    r("Date of Birth: {DOB}    Sex: " + w.ident.person.sex + "\n\n")
    r("Service: " + rng.choice(("MEDICINE", "CARDIOTHORACIC", "SURGERY", "NEUROLOGY")) + "\n\n")
    if rng.random() < 0.5:
        r("Account: {ACCOUNT}    SSN: {SSN}\n\n")
    r("Attending: Dr. {DR_FULL}\n\n")
    r("Chief Complaint:\n" + rng.choice(("shortness of breath", "chest pain", "fall", "fever",
                                         "altered mental status", "abdominal pain")) + "\n\n")
    r("History of Present Illness:\n")
    r(rng.choice((
        "{PT} is a {AGE_PHRASE} {sex} with a history of {dx} and {dx} who presented to {OHOSP} "
        "on {ADMIT} with {dx}. ",
        "This is a {AGE}-year-old {sex} with {dx}, s/p {proc} in {YEAR}, transferred from "
        "{OHOSP} for management of {dx}. ",
        "Pt is a {AGE_PHRASE} {sex} who was in {his} usual state of health until {DATE}, when "
        "{he} developed {dx}. ",
    )))
    r(rng.choice((
        "At the outside hospital, {he} received {med} and {med}. ",
        "In the ED, vitals were T {temp} HR {hr} BP {bp} RR {rr} O2 sat {sat}% on RA. ",
        "{He} was seen by Dr. {DR} in clinic on {DATE}, who noted {sign}. ",
    )))
    r("{He} was then moved to the {unit} for further care.\n\n")
    r("Past Medical History:\n- {dx}\n- {dx}, diagnosed {YEAR}\n- s/p {proc} ({YEAR})\n- {dx}\n\n")
    r("Social History:\n")
    r(rng.choice((
        "Lives with {REL} at {ADDRESS}. ",
        "Lives alone in {CITY}, {STATE}; {REL} nearby. ",
        "Lives with {REL} in {CITY}. ",
    )))
    r(rng.choice(("Works as a {PROF} at {ORG}. ", "Retired {PROF}. ", "Former {PROF}. ",
                  "Born in {COUNTRY}, moved to {CITY} in {YEAR}; works as a {PROF}. ")))
    r(rng.choice(("Quit tobacco in {YEAR}. ", "Denies ETOH or drug use. ", "Drinks 2 beers/day. ")))
    r("HCP is {REL}, phone {REL_PHONE}.\n\n")
    r("Family History:\n" + rng.choice(("Mother with {dx}. Father died of {dx}. ",
                                        "Noncontributory. ", "Brother with {dx}. ")) + "\n\n")
    r("Physical Exam:\nVS: T {temp} HR {hr} BP {bp} RR {rr} {sat}% {num}L NC\n"
      "Gen: NAD, A+Ox3\nCV: RRR, no m/r/g\nLungs: CTAB\nAbd: soft, NT/ND, {sign}\n"
      "Ext: no edema\n\n")
    r("Pertinent Results:\n{DATE} {time} {lab} {lab} {lab}\n{DATE} CXR: no acute process.\n\n")
    r("Brief Hospital Course:\n")
    for _ in range(rng.randint(2, 4)):
        r(rng.choice((
            "# {dx}: treated with {med} and {med}, improved. Seen by Dr. {DR} from cardiology. ",
            "# {dx}: {med} was held on {DATE} and restarted on {DATE}. ",
            "# {dx}: {device} placed on {DATE}, removed prior to discharge. ",
            "# {dx}: followed by {DEPT}; pacemaker ({DEVICE}) interrogated, functioning. ",
            "# {dx}: continued home {med}. {sign}. ",
            "# Code: full, discussed with {REL}. ",
        )))
        r("\n")
    r("\nMedications on Admission:\n1. {dose}\n2. {dose}\n3. {dose}\n\n")
    r("Discharge Medications:\n1. {dose}\n2. {dose}\n\n")
    r("Discharge Disposition:\n" + rng.choice(("Home", "Home With Service",
                                               "Extended Care")) + "\n")
    if rng.random() < 0.6:
        r("Facility: {REHAB}\n")
    r("\nDischarge Diagnosis:\n{dx}\n{dx}\n\n")
    r("Discharge Instructions:\n")
    r(rng.choice((
        "Please call Dr. {DR} at {PHONE} or return to the ED if you have chest pain. ",
        "Call {PHONE} with fever > 101. Records can be faxed to {FAX}. ",
        "You can view results at {URL}. Questions: {EMAIL}. ",
    )))
    r(rng.choice(("Weigh yourself daily. ", "Take all medications as prescribed. ")))
    r("\n\nFollowup Instructions:\n")
    r("Provider: Dr. {DR_FULL}, {DEPT} Phone: {PHONE} Date/Time: {FUTURE} 10:00\n")
    if rng.random() < 0.5:
        r("Provider: {HOSP} {unit} clinic Phone: {PHONE} Fax: {FAX}\n")
    if rng.random() < 0.3:
        r("Health plan: {HEALTHPLAN}; study id {IDNUM}\n")
    r("\nCompleted by: {USERNAME} {DISCH}" if rng.random() < 0.6 else "\n{DR_FULL} MD {LICENSE}")
    if rng.random() < 0.15:
        r(" from workstation {IP}")
    r("\n")


_LAYOUTS: dict[str, Callable[[_NoteWriter], None]] = {
    "nursing": _nursing_note,
    "discharge": _discharge_note,
}

# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def _check_args(n: int, kind: str, patients: int | None) -> int:
    if kind not in ALL_KINDS:
        raise ConfigError(f"unknown synthetic note kind {kind!r}; choose one of "
                          f"{', '.join(ALL_KINDS)}")
    if not isinstance(n, int) or n < 0:
        raise ConfigError(f"number of notes must be a non-negative integer, got {n!r}")
    if patients is None:
        return max(1, round(n / _NOTES_PER_PATIENT[kind])) if n else 0
    if not isinstance(patients, int) or patients < 1:
        raise ConfigError(f"number of patients must be a positive integer, got {patients!r}")
    if patients > n:
        raise ConfigError(f"cannot spread {n} notes over {patients} patients (need n >= patients)")
    return patients


def _notes_per_patient(n: int, patients: int, seed: int, kind: str) -> list[int]:
    """Every patient gets one note, the rest fall at random (a skewed, realistic distribution)."""
    counts = [1] * patients
    rng = random.Random(f"dphub-synth-alloc:{seed}:{kind}:{n}:{patients}")
    for _ in range(n - patients):
        counts[rng.randrange(patients)] += 1
    return counts


def iter_notes(n: int, kind: str = "nursing", seed: int = 0, patients: int | None = None
               ) -> Iterator[Note]:
    """Yield ``n`` synthetic labelled notes one at a time (constant memory for large ``n``).

    Notes come grouped by patient, in order; ``generate`` with the same arguments returns the
    same notes.
    """
    n_patients = _check_args(n, kind, patients)
    if n == 0:
        return
    counts = _notes_per_patient(n, n_patients, seed, kind)
    fake = Faker("en_US")
    layout = _LAYOUTS[kind]
    writer = _RealisticWriter if kind in REALISTIC_KINDS else _NoteWriter
    upper_share = _UPPER_SHARE.get(kind, 0.03)
    width = len(str(n_patients))
    for p, count in enumerate(counts):
        rng = random.Random(f"dphub-synth:{seed}:{kind}:{p}")
        fake.seed_instance(rng.getrandbits(64))
        ident = _make_identity(fake, rng)
        patient_id = f"synth-{kind}-s{seed}-p{p + 1:0{width}d}"
        day = ident.admit
        for k in range(count):
            upper = rng.random() < upper_share
            b = _NoteBuilder(upper)
            layout(writer(ident, rng, b, kind, day))
            text, spans = b.build()
            yield Note(
                id=f"{patient_id}-n{k + 1}",
                text=text,
                patient_id=patient_id,
                metadata={"kind": kind},
                spans=spans,
                labelled=True,
            )
            day += dt.timedelta(days=rng.choice((0, 0, 1, 1, 2, 7)))


def generate(n: int, kind: str = "nursing", seed: int = 0, patients: int | None = None
             ) -> list[Note]:
    """Return ``n`` synthetic labelled notes of ``kind`` (``nursing`` or ``discharge``).

    ``patients`` sets how many distinct patients the notes belong to (default: about 5 nursing
    notes or 2 discharge summaries per patient). Same arguments, same notes.
    """
    return list(iter_notes(n, kind=kind, seed=seed, patients=patients))


# ============================================================================================
# Realistic kinds: low PHI density, heavy shorthand, many non-PHI look-alikes (public pretraining)
# ============================================================================================
#
# Why a second family of kinds: a tagger pre-trained on the label-rich ``nursing``/``discharge``
# notes (one PHI span every ~80 characters, every age labelled) flags far too much on real notes,
# where PHI is about half a percent of the characters and most capitalised words, numbers,
# fractions and times are clinical. These kinds write long telegraphic notes in which most
# sentences carry no PHI but plenty of look-alikes (drug names and doses, lab and vital values,
# "5/5" strengths, "120/60" pressures, clock times, eponyms, equipment brand names, ward
# abbreviations), and PHI sits in the contexts where notes really carry it: signatures and
# initials, family visits and phone calls, transfers, consultants and covering doctors, dates in
# many shapes next to times, ages over 89 (HIPAA: younger ages are not PHI and are not labelled).
# Every template below was written for this module from general clinical-writing knowledge.

REALISTIC_KINDS: tuple[str, ...] = ("realistic-nursing", "realistic-discharge")
ALL_KINDS: tuple[str, ...] = KINDS + REALISTIC_KINDS
_NOTES_PER_PATIENT.update({"realistic-nursing": 8, "realistic-discharge": 2})
#: share of notes written all in capitals (realistic nursing: a minority, as in the notes users have)
_UPPER_SHARE: dict[str, float] = {"nursing": 0.75, "realistic-nursing": 0.35}

_R_MEDS = (
    "Lopressor", "metoprolol", "Lasix", "furosemide", "Levophed", "levophed", "Neo",
    "neosynephrine", "vasopressin", "dopamine", "dobutamine", "milrinone", "Propofol", "propofol",
    "Fentanyl", "fentanyl", "Versed", "midazolam", "Precedex", "Ativan", "lorazepam", "Haldol",
    "Vanco", "vancomycin", "Zosyn", "Flagyl", "Cipro", "Levaquin", "ceftriaxone", "Unasyn",
    "Bactrim", "fluconazole", "Protonix", "pantoprazole", "Pepcid", "Reglan", "Zofran", "Colace",
    "Senna", "Dulcolax", "lactulose", "Kayexalate", "Heparin", "heparin", "Coumadin", "Lovenox",
    "Plavix", "ASA", "Lipitor", "Captopril", "Hydralazine", "Nitro", "NTG", "Diltiazem",
    "Amiodarone", "Digoxin", "Insulin", "NPH", "Lantus", "Humalog", "Solumedrol", "Prednisone",
    "Morphine", "MSO4", "Dilaudid", "Percocet", "Tylenol", "Oxycodone", "Seroquel", "Zyprexa",
    "Albuterol", "Atrovent", "Combivent", "Xopenex", "Mag", "KCL", "K-Phos", "Calcium gluconate",
    "NaBicarb", "Bumex", "Diamox", "Mucomyst", "Narcan", "Thiamine", "Folate", "MVI", "Epogen",
)

_R_LOOKALIKE_WORDS = (
    "Foley", "Swan", "Swan-Ganz", "Cordis", "Hickman", "PICC", "A-line", "Aline", "Dobhoff",
    "Pleur-evac", "Hemovac", "JP", "Jackson-Pratt", "Penrose", "Bair Hugger", "Kinair bed",
    "Roho cushion", "Posey vest", "Miami J collar", "Aspen collar", "Waffle boots",
    "Tegaderm", "Duoderm", "Mepilex", "Allevyn", "Xeroform", "Aquacel", "Kerlix", "Ace wrap",
    "Kangaroo pump", "Pneumoboots", "Venodynes", "TEDs", "Yankauer", "Ambu bag", "Passy-Muir valve",
    "Shiley trach", "Guedel airway", "Cook catheter", "Flexiseal", "Rectal tube", "IABP",
    "Impella", "Quinton catheter", "Trialysis line", "CVVH", "CRRT", "Bird", "Servo vent",
)

_R_EPONYMS = (
    "Cheyne-Stokes", "Kussmaul", "Babinski", "Glasgow", "Trendelenburg", "reverse Trendelenburg",
    "Fowler's", "semi-Fowler's", "Homan's", "Murphy's", "Chvostek's", "Trousseau's",
    "Parkinson's", "Alzheimer's", "Crohn's", "Hodgkin's", "Graves'", "Cushing's",
    "Guillain-Barre", "Wernicke's", "Korsakoff", "Mallory-Weiss", "Bell's palsy",
    "Wenckebach", "Mobitz", "Barrett's", "Whipple", "Nissen", "Hartmann's", "Roux-en-Y",
    "Tylenol", "Lou Gehrig's", "Addison's", "Hashimoto's", "Raynaud's", "Sjogren's",
)

_R_UNITS = (
    "MICU", "SICU", "CCU", "CSRU", "TSICU", "NICU", "PACU", "ED", "EW", "ER", "OR", "floor",
    "step down", "tele floor", "cath lab", "IR", "CT", "MRI", "rehab", "OSH", "the unit",
)

_R_TEAMS = (
    "MICU team", "CT surgery", "ortho", "neurosurg", "GI", "renal", "ID", "heme/onc", "EP",
    "cards", "palliative care", "PT", "OT", "speech and swallow", "nutrition", "SW", "case mgmt",
    "RT", "pharmacy", "wound care RN", "IV team", "night float", "covering resident", "house officer",
)

_R_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

_R_WARD_WORDS = ("Building", "Pavilion", "Tower", "Wing", "House")


class _RealisticWriter(_NoteWriter):
    """Slots for the realistic kinds: clinical look-alikes (never PHI) and PHI in real contexts."""

    # -- non-PHI look-alikes -------------------------------------------------------------------

    def slot_rmed(self) -> None:
        self.b.text(self.rng.choice(_R_MEDS))

    def slot_rdose(self) -> None:
        r = self.rng
        amount = r.choice((f"{r.choice((0.5, 1, 2, 2.5, 4, 5, 10, 12.5, 20, 25, 40, 50, 80, 100))}",
                           f"{r.randint(1, 20) * 5}", f"{r.randint(1, 9)}.{r.randint(0, 9)}"))
        unit = r.choice(("mg", "mg", "mcg", "units", "meq", "gm", "cc", "ml", "mcg/kg/min",
                         "mg/hr", "units/hr", "mcg/min"))
        sep = r.choice(("", " "))
        route = r.choice(("", " IV", " PO", " SC", " IVP", " IVPB", " PR", " SL", " via NGT", " GT"))
        freq = r.choice(("", "", " x1", " x2", " q6h", " q4h prn", " BID", " TID", " QD", " qhs",
                         " q8", " q12"))
        self.b.text(f"{r.choice(_R_MEDS)} {amount}{sep}{unit}{route}{freq}")

    def slot_look(self) -> None:
        self.b.text(self.rng.choice(_R_LOOKALIKE_WORDS))

    def slot_epo(self) -> None:
        self.b.text(self.rng.choice(_R_EPONYMS))

    def slot_runit(self) -> None:
        self.b.text(self.rng.choice(_R_UNITS))

    def slot_team(self) -> None:
        self.b.text(self.rng.choice(_R_TEAMS))

    def slot_dow(self) -> None:
        self.b.text(self.rng.choice(_R_DAYS))

    def slot_clock(self) -> None:
        """A clock time in note styles: 0300, 3am, 15:30, @2200 (times are not PHI)."""
        r = self.rng
        h, m = r.randint(0, 23), r.choice((0, 0, 0, 15, 30, 45, 5, 20, 40))
        self.b.text(r.choice((f"{h:02d}{m:02d}", f"{h:02d}:{m:02d}", f"{h % 12 or 12}{'am' if h < 12 else 'pm'}",
                              f"{h % 12 or 12}:{m:02d}", f"{h % 12 or 12} {'AM' if h < 12 else 'PM'}",
                              f"{h:02d}00")))

    def slot_frac(self) -> None:
        """Slash numbers that are not dates: strengths, pain scores, murmurs, vent settings."""
        r = self.rng
        self.b.text(r.choice((
            f"{r.randint(3, 5)}/5", f"{r.randint(0, 10)}/10", f"{r.randint(1, 4)}/6",
            f"{r.randint(5, 20)}/5", f"{r.randint(90, 180)}/{r.randint(40, 100)}",
            f"{r.randint(400, 2500)}/{r.randint(200, 2000)}", "1/2", "1/4", "3/4", "2/3",
            f"{r.randint(1, 3)}+/{r.randint(1, 3)}+", f"+{r.randint(1, 3)}/+{r.randint(1, 3)}",
            f"{r.randint(7, 7)}.{r.randint(20, 48)}/{r.randint(28, 60)}/{r.randint(60, 200)}",
        )))

    def slot_val(self) -> None:
        """A bare number as notes write them: 45, 1.2, 100.4, x3, 2L, +1.5L."""
        r = self.rng
        self.b.text(r.choice((str(r.randint(1, 200)), f"{r.uniform(0, 10):.1f}",
                              f"{r.uniform(96, 103):.1f}", f"x{r.randint(2, 4)}",
                              f"{r.randint(1, 6)}L", f"+{r.uniform(0.2, 3):.1f}L",
                              f"-{r.randint(100, 900)}cc", f"{r.randint(10, 95)}%")))

    def slot_n(self) -> None:
        """A small count or setting: 1-20, now and then larger."""
        r = self.rng
        self.b.text(str(r.randint(1, 20) if r.random() < 0.8 else r.randint(21, 120)))

    def slot_frac2(self) -> None:
        """A plain fraction ("3/4", "1/2"): shaped like a partial date, never PHI."""
        self.b.text(self.rng.choice(("1/2", "1/4", "3/4", "2/3", "1/3")))

    def slot_rlab(self) -> None:
        r = self.rng
        self.b.text(r.choice((
            f"K {r.uniform(2.9, 5.9):.1f}", f"K+ {r.uniform(2.9, 5.9):.1f}", f"Bun/Cr {r.randint(8, 90)}/{r.uniform(0.6, 4.5):.1f}",
            f"Hct {r.uniform(21, 42):.1f}", f"HCT {r.uniform(21, 42):.1f}->{r.uniform(21, 42):.1f}",
            f"WBC {r.uniform(2, 25):.1f}", f"INR {r.uniform(1, 7):.1f}", f"PTT {r.uniform(22, 110):.1f}",
            f"Na {r.randint(126, 150)}", f"BS {r.randint(60, 400)}", f"FSBS {r.randint(60, 400)}",
            f"lactate {r.uniform(0.6, 8):.1f}", f"Mg {r.uniform(1.2, 2.8):.1f}", f"Ca {r.uniform(7, 10.5):.1f}",
            f"ABG {r.uniform(7.1, 7.5):.2f}/{r.randint(28, 70)}/{r.randint(55, 300)}/{r.randint(15, 35)}",
            f"CK {r.randint(40, 2000)}", f"trop {r.uniform(0.01, 9):.2f}", f"plt {r.randint(20, 450)}",
            f"SvO2 {r.randint(50, 80)}", f"CI {r.uniform(1.5, 4):.1f}", f"CVP {r.randint(2, 20)}",
            f"PAP {r.randint(20, 60)}/{r.randint(8, 30)}", f"wedge {r.randint(8, 30)}",
        )))

    def slot_vitals(self) -> None:
        r = self.rng
        parts = [f"HR {r.randint(55, 130)}{r.choice(('', 's', '-' + str(r.randint(70, 140))))} "
                 f"{r.choice(_RHYTHMS)}",
                 f"BP {r.randint(85, 180)}/{r.randint(40, 95)}{r.choice(('', 's', ' (' + str(r.randint(55, 110)) + ')'))}",
                 f"RR {r.randint(10, 32)}", f"SpO2 {r.randint(88, 100)}%",
                 f"T {r.uniform(96, 103):.1f}", f"CVP {r.randint(2, 20)}"]
        r.shuffle(parts)
        self.b.text(r.choice((", ", " ", "  ")).join(parts[: r.randint(3, 6)]))

    def slot_io(self) -> None:
        r = self.rng
        self.b.text(r.choice((
            f"I/O {r.randint(800, 3500)}/{r.randint(300, 3000)}", f"UO {r.randint(10, 200)}cc/hr",
            f"u/o {r.randint(15, 150)}-{r.randint(20, 300)}cc/hr", f"LOS {r.choice('+-')}{r.uniform(0.1, 9):.1f}L",
            f"24hr {r.choice('+-')}{r.randint(100, 4000)}cc", f"neg {r.randint(200, 2000)}cc so far",
        )))

    def slot_ryear(self) -> None:
        """A non-PHI number that looks like a year-ish token: pack-years, doses, counts."""
        r = self.rng
        self.b.text(r.choice((f"{r.randint(10, 80)} pack-year", f"{r.randint(1000, 2400)} kcal",
                              f"{r.randint(1000, 3000)} cc", f"{r.randint(1200, 2200)} ml fluid restriction")))

    def slot_young_age(self) -> None:
        """Ages under 90 are not PHI under HIPAA's Safe Harbor: written, never labelled."""
        age = self.ident.age if self.ident.age < 90 else self.rng.randint(30, 89)
        self.b.text(f"{age}{self.rng.choice((' yo', 'yo', ' y/o', ' YO', ' year old', 'M', 'F', ' yr old'))}")

    # -- PHI in real contexts ----------------------------------------------------------------------

    def slot_RAGE(self) -> None:
        """The patient's age: PHI (AGE) only over 89, as HIPAA defines it."""
        age = self.ident.age
        if age <= 89:
            self.slot_young_age()
            return
        if self.chance(0.3):
            self.b.text(self.rng.choice(("> ", ">", "over ")))
            self.b.phi("89", "AGE")
        else:
            self.b.phi(str(age), "AGE")
        self.b.text(self.rng.choice((" yo", " y/o", " year old", " YO", "yo")))

    def slot_SIG(self) -> None:
        """A nurse's signature: full name, first name + initial, initials, with or without RN."""
        n, r = self.rng.choice(self.ident.nurses), self.rng.random()
        if r < 0.3:
            self.b.phi(n.full, "DOCTOR")
        elif r < 0.5:
            self.b.phi(f"{n.first[0]}. {n.last}", "DOCTOR")
        elif r < 0.7:
            self.b.phi(f"{n.first} {n.last[0]}.", "DOCTOR")
        elif r < 0.85:
            self.b.phi(n.initials, "DOCTOR")
        else:
            self.b.phi(n.first, "DOCTOR")
        self.b.text(self.rng.choice((" RN", ", RN", " RN", "", " R.N.", " SN", " RN BSN")))

    def slot_DRN(self) -> None:
        """A doctor or NP by last name, sometimes full or with an initial."""
        d, r = self.rng.choice(self.ident.care_team), self.rng.random()
        if r < 0.65:
            self._name(d.last, "DOCTOR")
        elif r < 0.85:
            self.b.phi(d.full, "DOCTOR")
        else:
            self.b.phi(f"{d.first[0]}. {d.last}", "DOCTOR")

    def slot_REL_REL(self) -> None:
        self.b.text(self.rng.choice(self.ident.relatives).relation)

    def slot_FAMN(self) -> None:
        """A family member's name only (the template says who)."""
        rel = self.rng.choice(self.ident.relatives)
        self._name(rel.person.first if self.chance(0.7) else rel.person.full, "RELATIVE")

    def slot_WARD(self) -> None:
        """A named ward or building (PHI as a location): "<Name> 4", "<Name> Building"."""
        r = self.rng
        name = self.ident.department.split()[0]
        self.b.phi(r.choice((f"{name} {r.randint(2, 12)}", f"{name} {r.randint(2, 9)}{r.choice(('N', 'S', ' North', ' East'))}",
                             f"{name} {r.choice(_R_WARD_WORDS)}", name)), "HOSPITAL")

    def slot_RDATE(self) -> None:
        """A date near the note's day in nursing shapes: 3/4, 03/04, 3-4, 3/4/2091, Jan 3."""
        d = self.day + dt.timedelta(days=self.rng.randint(-6, 3))
        self.b.phi(self._date_text(d, "aaaaabblcdfi"), "DATE")


#: per-note probability that a sentence slot takes its PHI variant: notes differ a lot in how much
#: PHI they carry, and most real nursing notes carry one or two PHI phrases or none
_PHI_RATES: tuple[float, ...] = (0.0, 0.0, 0.03, 0.06, 0.1, 0.15)

_RN_HEADERS = (
    "Nursing Progress Note", "NPN 7a-7p", "NPN 7p-7a", "Nursing note 0700-1900", "Nsg Note",
    "NSG PROG NOTE 1900-0700", "Nursing Admission Note", "MICU RN note",
    "CCU NPN", "CSRU nursing note", "Resp Care note", "RN transfer summary", "Late entry:",
    "Events:", "NURSING NOTE: {RDATE}", "Nursing progress note {RDATE} {clock}-{clock}",
)

#: system -> (PHI-free sentences, sentences with PHI)
_RN_SYSTEMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "Neuro": ((
        "awake, A&Ox3, obeys commands, moving all extremities. ", "alert, oriented x{n}, PERRL 3mm brisk. ",
        "sedated on {rmed} at {val} mcg/kg/min, RASS -{n}. ", "lethargic, opens eyes to voice. ",
        "moves all ext, strength {frac} upper, {frac} lower. ", "no seizure activity noted. ",
        "c/o pain {frac}, given {rdose} with relief. ", "{rdose} given for agitation at {clock}. ",
        "CIWA {n}, {rdose} given per scale. ", "{epo} sign neg. ", "GCS {n}. ",
        "pupils equal, sluggish. ", "pt restless overnight, reoriented frequently. ",
        "intermittently confused, pulling at lines, {look} on. ", "sleeping in naps. ",
    ), (
        "oriented to person only; knows wife {FAMN} by name. ",
        "Dr. {DRN} (neuro) in to eval at {clock}, no new recs. ",
        "neuro checks q1h per Dr. {DRN}. ",
    )),
    "CV": ((
        "{vitals}. ", "HR {hr} {rhythm}, ectopy none seen. ", "BP labile {frac} to {frac}, {rmed} gtt titrated. ",
        "{rmed} weaned off at {clock}, MAP > 60. ", "{rdose} given for HR > 110. ",
        "{rlab}, repleted with {rdose}. ", "{look} in place, site benign. ",
        "pedal pulses palp, extremities warm and dry. ", "+{n} pitting edema bilat LE. ",
        "{rmed} gtt @ {n}00 units/hr, next PTT at {clock}. ", "{epo} block on tele. ",
        "{rlab}, {rlab}. ", "K repleted, recheck with am labs. ", "{look} dsg changed, site clean. ",
        "murmur {frac} at LSB. ", "pt in {rhythm} with rate {hr}, {rmed} started. ",
    ), (
        "Dr. {DRN} aware of BP {bp}, no new orders. ",
        "cards fellow Dr. {DRN} saw pt, echo planned for {RDATE}. ",
        "EP (Dr. {DRN}) to interrogate pacer {RDATE}. ",
    )),
    "Resp": ((
        "coarse LS on both sides, dim at bases. ", "LS clear, sats {sat}% on {n} NC. ",
        "on AC {n}/{n}0/{n}0%/PEEP {n}, RR {n}. ", "weaned to PS {frac}, tol well. ",
        "sx for sm amt thick tan sputum. ", "{rlab}. ", "CXR this am with ? LLL infiltrate. ",
        "nebs by RT, {rmed} q4h. ", "face tent 40%, sats {sat}%. ", "trach care done, {look} in place. ",
        "RR {n}, even and unlabored. ", "{epo} resp pattern while sleeping. ", "IS x{n} with coaching. ",
        "cough strong, non-productive. ", "remains intubated, ETT 22 at lip. ",
    ), (
        "RT {SIG} changed vent circuit. ", "extubation discussed with Dr. {DRN}, plan for am. ",
    )),
    "GI": ((
        "abd soft, NT/ND, +BS. ", "tolerating {tf} at {n}0 cc/hr via {look}, residuals < {n}0. ",
        "NPO except meds. ", "no stool overnight, {rdose} given. ", "BM x{n}, guaiac neg. ",
        "{look} in place, draining liquid brown stool. ", "FSBS {n}0, covered with {rdose} per SS. ",
        "taking sips, {frac2} of tray. ", "abd distended, firm, hypoactive BS. ", "{rlab}, {rlab}. ",
        "OGT to LCWS, {n}0 cc bilious out. ", "{rmed} given for nausea, effective. ",
    ), (
        "GI fellow Dr. {DRN} to scope {RDATE}. ",
    )),
    "GU": ((
        "{look} patent, urine clear and yellow, {io}. ", "{io}. ", "{rdose} given with good response. ",
        "UO marginal, MD aware, {n}00 cc bolus given. ", "{rlab}, {rlab}. ", "voiding qs. ",
        "CVVH running, {io}, no clotting. ", "urine cloudy, UA/UCx sent. ",
    ), (
        "renal (Dr. {DRN}) following, HD {RDATE}. ",
    )),
    "ID": ((
        "Tmax {temp}, on {rmed} and {rmed}. ", "afebrile, {rlab}. ", "cultures pending. ",
        "contact precautions for MRSA/VRE. ", "{rmed} level at {clock}. ", "BC x2 sent at {clock}. ",
    ), (
        "ID consult called, Dr. {DRN} to see. ", "cultures from {RDATE} with GPC in clusters. ",
    )),
    "Endo": ((
        "FSBS {n}0-{n}0, {rdose}. ", "on {rmed} gtt per protocol. ", "{rlab}. ",
    ), ()),
    "Skin": ((
        "skin intact, turned q2h, {look} on. ", "coccyx stage II, {look} applied. ",
        "incision C/D/I, staples intact. ", "{look} site w/o redness. ", "heels boggy, {look} on. ",
        "bruising to bilat arms. ", "wound care RN saw pt, dsg per recs. ",
    ), ()),
    "Activity": ((
        "up to chair, assist x{n}. ", "bedrest, {epo} position for line. ",
        "PT worked with pt, amb {n}0 ft with walker. ", "repositioned q2h. ",
    ), ()),
    "Social": ((
        "no family contact this shift. ", "family updated by team. ", "code status: full. ",
        "DNR/DNI per pt wishes. ", "SW following. ", "lives alone, has VNA at home. ",
        "pt and family offered emotional support. ", "case mgmt aware. ",
    ), (
        "wife {FAMN} visited, RN gave update. ", "daughter {FAMN} called x{n}, updated. ",
        "son ({FAMN}) in this evening, questions answered. ", "pt's HCP is niece {FAMN}. ",
        "{REL} called at {clock}, will visit tomorrow. ", "{REL} reachable at {REL_PHONE}. ",
        "family mtg with Dr. {DRN} and {REL} {RDATE} at {clock}. ",
        "spoke with {REL} by phone, aware of transfer. ", "husband {FAMN} at bedside all afternoon. ",
        "{FAMN} ({REL_REL}) requests call if any change, # {REL_PHONE}. ",
    )),
    "Dispo": ((
        "cont ICU care. ", "ok to transfer out once a bed opens. ", "screening for rehab. ",
        "called out, awaiting floor bed. ", "plan per team. ",
    ), (
        "transfer to {WARD} when bed ready. ", "to return to {OHOSP} {RDATE}. ",
        "screened for {REHAB}, accepted for {RDATE}. ", "came from {WARD} {RDATE} with {dx}. ",
        "transferred from {OHOSP} ED {RDATE}, records with pt. ",
    )),
}

_RN_PLAN = (
    ("cont to monitor. ", "wean {rmed} as tol. ", "f/u am labs. ", "follow {rlab}. ",
     "cont current plan. ", "family support given. ", "pain control. ", "check lytes at {clock}. ",
     "keep K > 4, Mg > 2. ", "MD to reassess in am. ", "up in chair {dow}. ", "{rmed} to start {dow}. "),
    ("Dr. {DRN} aware. ", "f/u with Dr. {DRN} re: {dx}. ", "MRI {RDATE}. ",
     "paged Dr. {DRN} at {clock}, awaiting call back. ", "page covering MD at {PAGER} with changes. ",
     "team to call {REL} {RDATE}. ", "possible transfer to {OHOSP}. ", "cath planned {RDATE} {clock}. "),
)

_RN_EVENT_NOTES = (
    ("pt had {n} runs of NSVT at {clock}, asymptomatic. {rlab}, repleted. ",
     "{rdose} given at {clock} for SBP {bp}, monitoring closely. ",
     "pt to {runit} for CT at {clock}, returned w/o incident. ",
     "rapid response called at {clock} for sats {sat}%, placed on NRB, improved. ",
     "line change over wire by {team}, {look} placed, CXR confirms. "),
    ("Dr. {DRN} notified of HR {hr} at {clock}, {rdose} ordered. ",
     "pt arrived from {OHOSP} at {clock} via med flight. ",
     "{REL} called at {clock} and updated on plan. "),
)


def _sentence(w: _NoteWriter, pair: tuple[tuple[str, ...], tuple[str, ...]], phi_rate: float) -> None:
    clean, with_phi = pair
    if with_phi and w.rng.random() < phi_rate:
        w.render(w.rng.choice(with_phi))
    else:
        w.render(w.rng.choice(clean))


def _realistic_nursing_note(w: _NoteWriter) -> None:
    """A long telegraphic nursing note; most sentences carry no PHI but many look-alikes."""
    rng = w.rng
    phi_rate = rng.choice(_PHI_RATES)  # notes differ a lot in how much PHI
    nl = rng.choice(("\n", "\n", " ", "\n\n"))
    if rng.random() < 0.55:
        w.render(rng.choice(_RN_HEADERS) + nl)
    if rng.random() < 0.3:
        opener = rng.choice((
            "{RAGE} {sex} w/ hx {dx}, {dx} admitted with {dx}. ",
            "Pt is a {RAGE} {sex} s/p {proc} {RDATE}, hx {dx}. ",
            "{RAGE} {sex} transferred from {OHOSP} for mgmt of {dx}. ",
            "{young_age} {sex} with {dx}, here for {proc}. ", "{young_age} admitted with {dx}. ",
            "Pt admitted to {runit} from {runit} with {dx}, {dx}. ",
        ))
        w.render(opener)
        w.b.text(nl)
    layout = rng.random()
    if layout < 0.2:  # short event note
        for _ in range(rng.randint(1, 3)):
            _sentence(w, _RN_EVENT_NOTES, phi_rate * 2)
    elif layout < 0.45:  # D/A/R or O/A/P paragraphs
        w.render(rng.choice(("O: ", "D: ", "Data: ", "S/O: ")))
        for key in rng.sample(list(_RN_SYSTEMS), k=rng.randint(3, 6)):
            for _ in range(rng.randint(1, 3)):
                _sentence(w, _RN_SYSTEMS[key], phi_rate)
        w.b.text(nl)
        w.render(rng.choice(("A: ", "Assessment: ", "A/P: ")) + rng.choice((
            "stable. ", "hemodynamically stable. ", "cont {dx}, improving. ", "tenuous. ")))
        w.b.text(nl)
        w.render(rng.choice(("P: ", "Plan: ", "R: ")))
        for _ in range(rng.randint(1, 3)):
            _sentence(w, _RN_PLAN, phi_rate * 1.5)
    else:  # system by system
        keys = [k for k in _RN_SYSTEMS if rng.random() < 0.65] or ["Neuro", "CV"]
        for key in keys:
            label = key.upper() if rng.random() < 0.3 else key
            label = {"CV": rng.choice(("CV", "C/V", "Cardiac", "CARDIAC")),
                     "Resp": rng.choice(("Resp", "RESP", "Pulm", "Respiratory")),
                     "Social": rng.choice(("Social", "Soc", "Family", "SOCIAL")),
                     "Dispo": rng.choice(("Dispo", "Dispo", "Plan")),
                     }.get(key, label)
            w.render(f"{nl if nl != ' ' else ' '}{label}{rng.choice((': ', ': ', '- ', ' '))}")
            for _ in range(rng.randint(1, 5)):
                _sentence(w, _RN_SYSTEMS[key], phi_rate)
        if rng.random() < 0.5:
            w.render(f"{nl}Plan: ")
            for _ in range(rng.randint(1, 3)):
                _sentence(w, _RN_PLAN, phi_rate)
    if rng.random() < 0.35:  # signature
        w.b.text(rng.choice((nl, " ", "\n")))
        w.render(rng.choice(("{SIG}", "-{SIG}", "{SIG} {RDATE}", "Signed: {SIG}", "{SIG} {clock}")))
    w.b.text("\n")


def _realistic_discharge_note(w: _NoteWriter) -> None:
    """A sectioned discharge summary; identifiers in the header, long PHI-free clinical body."""
    rng = w.rng
    r = w.render
    r(rng.choice(("Admission Date: {ADMIT}     Discharge Date: {DISCH}\n\n",
                  "Admission Date:  [{ADMIT}]   Discharge Date: [{DISCH}]\n\n")))
    if rng.random() < 0.5:
        r("Date of Birth: {DOB}     Sex: " + w.ident.person.sex + "\n\n")
    r("Service: " + rng.choice(("MEDICINE", "CSURG", "NEUROLOGY", "MICU", "CARDIOLOGY")) + "\n\n")
    r("Allergies:\n" + rng.choice(("Patient recorded as having No Known Allergies to Drugs",
                                   "Penicillins / Sulfa", "Codeine", "NKDA")) + "\n\n")
    r("Attending: Dr. {DRN}\n\n")
    r("Chief Complaint:\n" + rng.choice(("dyspnea", "chest pain", "s/p fall", "fever, hypotension",
                                         "altered mental status", "GI bleed")) + "\n\n")
    r("History of Present Illness:\n")
    r(rng.choice(("{RAGE} {sex} with {dx}, {dx} and {dx} who presents with {dx}. ",
                  "This is a {RAGE} {sex} with hx of {dx} s/p {proc} who was transferred from "
                  "{OHOSP} with {dx}. ")))
    for _ in range(rng.randint(2, 5)):
        r(rng.choice((
            "In the ED, initial vitals were {vitals}. ", "{He} received {rdose} and {rdose}. ",
            "{rlab}, {rlab}, {rlab}. ", "CXR showed {dx}. ", "{rmed} and {rmed} were begun. ",
            "ECG with {rhythm} at {hr}, {epo} noted. ", "{He} denies chest pain, {epo} sign neg. ",
            "Of note, {he} was recently seen by Dr. {DRN} in clinic. ",
            "Admitted to {runit} for further care and monitoring. ",
        )))
    r("\n\nPast Medical History:\n")
    for _ in range(rng.randint(3, 6)):
        r(rng.choice(("- {dx}\n", "- {dx}, on {rmed}\n", "- s/p {proc}\n", "- {epo} disease\n",
                      "- {dx} dx'd {YEAR}\n")))
    r("\nSocial History:\n" + rng.choice((
        "Lives with {REL}. Former smoker, {ryear} history. ", "Lives alone, no ETOH. ",
        "Lives at {REHAB}. ", "Married, lives with wife. Denies tobacco. ")) + "\n\n")
    r("Physical Exam:\nVS: {vitals}\nGen: NAD\nHEENT: PERRL, EOMI\nCV: RRR, {frac} SEM\n"
      "Lungs: CTAB\nAbd: soft, NT/ND, +BS\nExt: {n}+ edema\nNeuro: A&Ox3, strength {frac}\n\n")
    r("Pertinent Results:\n")
    for _ in range(rng.randint(2, 4)):
        r(rng.choice(("{RDATE} {clock} {rlab} {rlab} {rlab}\n", "{rlab} {rlab} {rlab}\n",
                      "{RDATE} CXR: {dx}.\n", "ECHO: EF {n}5%, {frac} MR.\n")))
    r("\nBrief Hospital Course:\n")
    for _ in range(rng.randint(3, 6)):
        r(rng.choice((
            "# {dx}: treated with {rmed} and {rmed}, improved. ",
            "# {dx}: {rmed} held, restarted at {rdose}. ", "# {dx}: {look} placed, {rlab}. ",
            "# {dx}: continued home {rmed}. ", "# {dx}: {team} consulted, recs followed. ",
            "# {dx}: Dr. {DRN} from {team} saw pt. ", "# Code: full, confirmed with {REL}. ",
            "# {dx}: {rmed} changed to {rdose} on {RDATE}. ",
        )))
        r("\n")
    r("\nDischarge Medications:\n")
    for i in range(rng.randint(3, 8)):
        r(f"{i + 1}. " + "{rdose}\n")
    r("\nDischarge Disposition:\n" + rng.choice(("Home", "Home With Service", "Extended Care")) + "\n")
    if rng.random() < 0.5:
        r("Facility:\n{REHAB}\n")
    r("\nDischarge Diagnosis:\n{dx}\n{dx}\n\nDischarge Condition:\nstable\n\n")
    r("Followup Instructions:\n" + rng.choice((
        "Follow up with Dr. {DRN} in {n} weeks. Call {PHONE} for appt.\n",
        "Provider: Dr. {DRN} Date/Time: {FUTURE} {clock}\n", "Follow up with PCP in 1-2 weeks.\n")))
    if rng.random() < 0.5:
        r("\n{DR_FULL} MD {n}\n\nCompleted by: {DR_FULL} MD {TODAY} {clock}\n")
    r("\n")


_REALISTIC_LAYOUTS: dict[str, Callable[[_NoteWriter], None]] = {
    "realistic-nursing": _realistic_nursing_note,
    "realistic-discharge": _realistic_discharge_note,
}
_LAYOUTS.update(_REALISTIC_LAYOUTS)
