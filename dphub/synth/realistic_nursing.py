"""The ``realistic-nursing`` kind: long telegraphic nursing notes with little PHI.

Why a module of its own: one module per note kind. Most sentences carry no PHI (each system has
PHI-free sentences and sentences with PHI, and a per-note rate picks between them), so a model
pre-trained on them learns the low PHI density of real nursing notes. The writer and look-alike
lists are in :mod:`dphub.synth.realistic`.
"""

from __future__ import annotations

from dphub.synth.writer import NoteWriter

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


def _sentence(w: NoteWriter, pair: tuple[tuple[str, ...], tuple[str, ...]], phi_rate: float) -> None:
    clean, with_phi = pair
    if with_phi and w.rng.random() < phi_rate:
        w.render(w.rng.choice(with_phi))
    else:
        w.render(w.rng.choice(clean))


def realistic_nursing_note(w: NoteWriter) -> None:
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
