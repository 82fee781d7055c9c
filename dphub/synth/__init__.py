"""Synthetic labelled clinical notes for demos, tests and public warm starts.

Real PHI-annotated notes cannot be shared, so every demo, test and public pre-training run needs
notes whose PHI is fake but looks like the real thing. This module writes two kinds:

* ``nursing`` -- short telegraphic nursing progress notes, mostly ALL CAPS like the nursing notes
  of the PhysioNet deid corpus (age, sex, admission route, then system-by-system findings),
  sometimes mixed case;
* ``discharge`` -- longer, sectioned, mixed-case discharge summaries with headers, addresses,
  contact details and identifiers.

Design choices that matter for the models trained on them:

* Text and spans are built **together**, piece by piece (:class:`NoteBuilder`); nothing is ever
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

The package (cut from one 1.5k-line module by issue 30) has one module per concern, and this
``__init__`` re-exports the public names so that ``dphub.synth.generate`` and friends stay where
they were:

* :mod:`~dphub.synth.corpus` -- the public API: kinds, patients and seeds to a note stream;
* :mod:`~dphub.synth.phi_sources` -- one fake identity per patient and the lists it draws from;
* :mod:`~dphub.synth.writer` -- text and spans built together; the ``{SLOT}`` vocabulary;
* one module per note kind: :mod:`~dphub.synth.nursing`, :mod:`~dphub.synth.discharge`,
  :mod:`~dphub.synth.realistic_nursing`, :mod:`~dphub.synth.realistic_discharge` (with the
  realistic kinds' shared writer in :mod:`~dphub.synth.realistic`).
"""

from __future__ import annotations

from dphub.synth.corpus import ALL_KINDS, KINDS, REALISTIC_KINDS, generate, iter_notes
from dphub.synth.phi_sources import Hospital, Identity, Person, Relative

__all__ = ["ALL_KINDS", "KINDS", "REALISTIC_KINDS", "Hospital", "Identity", "Person", "Relative",
           "generate", "iter_notes"]
