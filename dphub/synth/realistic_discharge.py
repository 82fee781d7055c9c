"""The ``realistic-discharge`` kind: sectioned discharge summaries, PHI mostly in the header.

Why a module of its own: one module per note kind. Identifiers sit in the header and follow-up
section; the long clinical body is PHI-free but full of look-alikes
(:mod:`dphub.synth.realistic`).
"""

from __future__ import annotations

from dphub.synth.writer import NoteWriter


def realistic_discharge_note(w: NoteWriter) -> None:
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
