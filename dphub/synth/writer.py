"""Writing one synthetic note: text and spans built together, and the slot vocabulary.

Why a module of its own: this is the machinery every note kind shares. :class:`NoteBuilder`
appends filler and PHI pieces and records each PHI piece's exact offsets as it goes (nothing is
ever found by searching the text afterwards, so spans are exact even when a name is also a
common word). :class:`NoteWriter` renders ``{SLOT}`` templates: upper-case slots write the
patient's PHI (:mod:`dphub.synth.phi_sources`) in one of its real-world forms, lower-case slots
write clinical filler from the lists below. The per-kind layouts (:mod:`dphub.synth.nursing`,
:mod:`dphub.synth.discharge`, :mod:`dphub.synth.realistic` ...) only choose templates.

One concern, over 500 lines: the slot methods are one vocabulary (one method per slot name,
looked up by name from the templates), and splitting them would scatter what a template may use.
"""

from __future__ import annotations

import datetime as dt
import random
import re
from functools import lru_cache

from dphub.notes import Span
from dphub.synth.phi_sources import Identity, phone_number

# --------------------------------------------------------------------------------------------
# Clinical filler vocabulary (never PHI)
# --------------------------------------------------------------------------------------------

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

RHYTHMS = ("SR", "NSR", "ST", "SB", "AF", "afib", "V-paced", "A-paced", "1st degree AVB")

_UNITS = ("MICU", "CCU", "CSRU", "SICU", "TSICU", "ER", "EW", "floor", "OR", "cath lab", "PACU")

_SIGNS = (
    "Murphy's sign negative", "Babinski negative bilat", "no Kussmaul resp",
    "Cheyne-Stokes resp pattern noted", "Trendelenburg for line placement",
    "Wenckebach noted on tele", "Mobitz I on tele", "Glasgow Coma Scale 11",
    "Braden score 14", "positive Homan's sign",
)

_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)


def _ordinal(day: int) -> str:
    if 10 <= day % 100 <= 20:
        return f"{day}th"
    return f"{day}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(day % 10, 'th')}"


# --------------------------------------------------------------------------------------------
# Building text and spans together
# --------------------------------------------------------------------------------------------


class NoteBuilder:
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


class NoteWriter:
    """Renders templates for one note of one patient: slots become PHI or clinical filler."""

    def __init__(self, ident: Identity, rng: random.Random, b: NoteBuilder, kind: str,
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
        self.b.phi(self.ident.phone if self.chance(0.5) else phone_number(self.rng), "PHONE")

    def slot_REL_PHONE(self) -> None:
        self.b.phi(self.ident.relative_phone, "PHONE")

    def slot_PAGER(self) -> None:
        self.b.phi(f"{self.rng.randint(10000, 99999)}" if self.chance(0.5)
                   else f"{self.rng.randint(1000, 9999)}", "PHONE")

    def slot_FAX(self) -> None:
        self.b.phi(phone_number(self.rng), "FAX")

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
        self.b.text(self.rng.choice(RHYTHMS))

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
