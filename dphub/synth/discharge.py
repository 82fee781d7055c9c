"""The ``discharge`` kind: long, sectioned, mixed-case discharge summaries.

Why a module of its own: one module per note kind. Discharge summaries carry the densest PHI:
headers with identifiers, addresses, contact details, follow-up appointments, signatures.
"""

from __future__ import annotations

from dphub.synth.writer import NoteWriter


def discharge_note(w: NoteWriter) -> None:
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
