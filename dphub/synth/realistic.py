"""The writer of the realistic kinds: clinical look-alikes and PHI in real contexts.

Why a second family of kinds: a tagger pre-trained on the label-rich ``nursing``/``discharge``
notes (one PHI span every ~80 characters, every age labelled) flags far too much on real notes,
where PHI is about half a percent of the characters and most capitalised words, numbers,
fractions and times are clinical. The realistic kinds (:mod:`dphub.synth.realistic_nursing`,
:mod:`dphub.synth.realistic_discharge`) write long telegraphic notes in which most sentences
carry no PHI but plenty of look-alikes (drug names and doses, lab and vital values, "5/5"
strengths, "120/60" pressures, clock times, eponyms, equipment brand names, ward abbreviations),
and PHI sits in the contexts where notes really carry it: signatures and initials, family visits
and phone calls, transfers, consultants and covering doctors, dates in many shapes next to
times, ages over 89 (HIPAA: younger ages are not PHI and are not labelled). This module holds
what both kinds share: the look-alike lists and :class:`RealisticWriter`'s slots.
Every template was written for this package from general clinical-writing knowledge.
"""

from __future__ import annotations

import datetime as dt

from dphub.synth.writer import RHYTHMS, NoteWriter

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


class RealisticWriter(NoteWriter):
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
                 f"{r.choice(RHYTHMS)}",
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

