"""Assembling a synthetic corpus: kinds, patients, seeds, and the note stream.

Why a module of its own: this is the one place that turns ``(n, kind, seed, patients)`` into
notes, and so the one place that makes the output a pure function of them: notes are spread over
patients by a seeded draw, every patient draws from its own seeded ``random.Random`` and seeded
Faker instance (:mod:`dphub.synth.phi_sources`), and each note is written by its kind's layout
(:mod:`dphub.synth.nursing`, :mod:`dphub.synth.discharge`, :mod:`dphub.synth.realistic_nursing`,
:mod:`dphub.synth.realistic_discharge`). Cards record the digest of corpora generated here
(``synth_sha256``): a change in the seeding or in the order of draws changes them.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Iterator

from faker import Faker

from dphub.errors import ConfigError
from dphub.notes import Note
from dphub.synth.discharge import discharge_note
from dphub.synth.nursing import nursing_note
from dphub.synth.phi_sources import make_identity
from dphub.synth.realistic import RealisticWriter
from dphub.synth.realistic_discharge import realistic_discharge_note
from dphub.synth.realistic_nursing import realistic_nursing_note
from dphub.synth.writer import NoteBuilder, NoteWriter

KINDS: tuple[str, ...] = ("nursing", "discharge")
#: the realistic kinds (low PHI density, heavy shorthand, many non-PHI look-alikes): public
#: pretraining (:mod:`dphub.synth.realistic`)
REALISTIC_KINDS: tuple[str, ...] = ("realistic-nursing", "realistic-discharge")
ALL_KINDS: tuple[str, ...] = KINDS + REALISTIC_KINDS

#: Average notes per patient when ``patients`` is not given (the PhysioNet nursing corpus has ~15;
#: fewer keeps small demo sets patient-diverse).
_NOTES_PER_PATIENT: dict[str, int] = {"nursing": 5, "discharge": 2, "realistic-nursing": 8,
                                      "realistic-discharge": 2}
#: share of notes written all in capitals (realistic nursing: a minority, as in the notes users have)
_UPPER_SHARE: dict[str, float] = {"nursing": 0.75, "realistic-nursing": 0.35}

#: the most notes (and patients) one corpus may have: 10 million notes stream for hours; more is
#: a typo or an attack (``--n 10**19`` allocated a list per patient and ran out of memory)
MAX_NOTES = 10_000_000

_LAYOUTS: dict[str, Callable[[NoteWriter], None]] = {
    "nursing": nursing_note,
    "discharge": discharge_note,
    "realistic-nursing": realistic_nursing_note,
    "realistic-discharge": realistic_discharge_note,
}


def _check_args(n: int, kind: str, patients: int | None) -> int:
    if kind not in ALL_KINDS:
        raise ConfigError(f"unknown synthetic note kind {kind!r}; choose one of "
                          f"{', '.join(ALL_KINDS)}")
    if not isinstance(n, int) or n < 0:
        raise ConfigError(f"number of notes must be a non-negative integer, got {n!r}")
    if n > MAX_NOTES:
        raise ConfigError(f"number of notes must be at most {MAX_NOTES:,}")
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
    same notes. The arguments are checked at the call, before the first note is asked for.
    """
    n_patients = _check_args(n, kind, patients)
    return _notes(n, kind, seed, n_patients)


def _notes(n: int, kind: str, seed: int, n_patients: int) -> Iterator[Note]:
    """The note stream of :func:`iter_notes` (arguments checked)."""
    if n == 0:
        return
    counts = _notes_per_patient(n, n_patients, seed, kind)
    fake = Faker("en_US")
    layout = _LAYOUTS[kind]
    writer = RealisticWriter if kind in REALISTIC_KINDS else NoteWriter
    upper_share = _UPPER_SHARE.get(kind, 0.03)
    width = len(str(n_patients))
    for p, count in enumerate(counts):
        rng = random.Random(f"dphub-synth:{seed}:{kind}:{p}")
        fake.seed_instance(rng.getrandbits(64))
        ident = make_identity(fake, rng)
        patient_id = f"synth-{kind}-s{seed}-p{p + 1:0{width}d}"
        day = ident.admit
        for k in range(count):
            upper = rng.random() < upper_share
            b = NoteBuilder(upper)
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
