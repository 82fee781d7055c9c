"""The ``nursing`` kind: short telegraphic nursing progress notes, mostly in capitals.

Why a module of its own: one module per note kind, so a kind's templates and layout can be read
and changed without the others. Like the nursing notes of the PhysioNet deid corpus: age, sex,
admission route, then system-by-system findings (O/A/P paragraphs or section per system).
"""

from __future__ import annotations

from dphub.synth.writer import NoteWriter

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


def nursing_note(w: NoteWriter) -> None:
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
