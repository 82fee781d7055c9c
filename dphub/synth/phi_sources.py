"""PHI sources of the synthetic notes: one fake identity per patient, and the lists it draws from.

Why a module of its own: everything a note may reveal about a patient (name, relatives, care
team, hospital, address, phone, identifiers ...) is decided once per patient here, by
:func:`make_identity`, from a seeded ``random.Random`` and a seeded Faker; the note writers
(:mod:`dphub.synth.writer` and the per-kind layouts) only choose *how* to write it. Keeping the
sources apart from the templates means a new kind of note reuses the same identities, and a new
kind of PHI is added in one place. The draw order below is part of the corpus: changing it
changes every synthetic corpus and the ``synth_sha256`` digests cards record.

Place and job lists are small curated ones: real US places make the notes look real (Faker's
invented town names alone would teach models that only odd words are cities).
"""

from __future__ import annotations

import datetime as dt
import random
import re
from dataclasses import dataclass

from faker import Faker

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

_MALE_RELATIONS = ("husband", "son", "brother", "father", "nephew", "grandson", "friend")
_FEMALE_RELATIONS = ("wife", "daughter", "sister", "mother", "niece", "granddaughter", "friend")


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


def phone_number(rng: random.Random) -> str:
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


def make_identity(fake: Faker, rng: random.Random) -> Identity:
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
        phone=phone_number(rng),
        relative_phone=phone_number(rng),
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
