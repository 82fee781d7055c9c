"""The privacy ledger: a site-local record of every release computed from a dataset.

Why: each release spends ε on its patients, and what a patient loses is the composition over
every release that used them, not one card's ε. The ledger lets a new release find the earlier
ones it depends on (an ``--init-from`` parent, a distillation's teachers) and check a trainer's
declaration that a parent saw none of these patients; ``dphub ledger show`` lists a dataset's
spend.

What it holds, in ``<dphub home>/ledger/`` (directory 0700, files 0600, never published):

* ``patient.key``: a per-user random secret (created on first use);
* ``ledger.json``: one record per release: its weights digest, kind, (ε, δ, unit), its Gaussian
  history when it is one DP-SGD run, the weights digests of its parents (and whether its claim
  composes them), the largest number of units one patient had in it (the group size), and two
  sets of keyed digests: of its patients (HMAC-SHA256 of each patient id under the key) and of
  its notes' normalised text (HMAC-SHA256 under the same key); and (format 3) each note's
  keyed near-duplicate sketch (:mod:`dphub.privacy.note_sketch`: keyed digests of MinHash
  bands). Never a patient id, a note, a path, a note text or a plain hash of one (a plain hash
  would let anyone holding the file test a guessed note). A keyed digest means nothing outside
  this home, so it never goes on a card.

A dataset is recognised by its patients **or** its notes: two runs on the same notes, on a
superset, on a subset, on the same notes with the patient ids renamed, or on the same notes
edited (a character changed, words added: a near-duplicate by its sketch) share digests
whatever the paths. Any shared patient or note (or near-duplicate note) links a release to a
dataset (a note seen by both is a patient seen by both); the figure composes every linked
release (an upper bound for each patient involved). Records of formats 1 and 2 have no sketch:
they link by exact digests only (their notes' texts are not in the ledger to sketch them); a
ledger of an older format is read and written back as format 3 at its next record.

Records are only added, never replaced: what was spent stays spent (a federated site's record
grows with its rounds; a site whose state was reset starts a new record). A ledger with records
and no key is an error, never a new ledger: its digests could no longer be matched.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import math
import os
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError
from dphub.io import atomic_write_text, dphub_home, private_key, read_small_file
from dphub.notes import Note
from dphub.privacy import note_sketch
from dphub.privacy.composition import Composed, GaussianSteps, Part, compose
from dphub.textnorm import normalize

LEDGER_DIR = "ledger"
KEY_FILE = "patient.key"
LEDGER_FILE = "ledger.json"
LOCK_FILE = ".lock"
LEDGER_FORMAT = 3
#: formats read (format 1: no note digests, no group size; its parents always composed;
#: format 2: no near-duplicate sketches)
READ_FORMATS = (1, 2, 3)
#: Largest ledger file read (a record per release; a million patients' digests is ~70 MB)
MAX_LEDGER_BYTES = 512 * 1024 * 1024
_KEY_BYTES = 32
#: release kinds: what produced the release
KINDS = ("train", "init_from", "distill", "public_student", "federated_round", "surrogate")
#: units whose ε is an ε per patient
PATIENT_UNIT = "patient"


def ledger_dir() -> Path:
    """``<dphub home>/ledger``: where the key and the records live."""
    return dphub_home() / LEDGER_DIR


def _private_dir() -> Path:
    d = ledger_dir()
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.stat(d, follow_symlinks=False)
    except OSError as e:
        raise ConfigError(f"cannot create the privacy ledger {d} "
                          f"({e.strerror or type(e).__name__})") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ConfigError(f"the privacy ledger {d} is not a private directory of yours "
                          "(mode 700): fix its owner and mode")
    return d


def ledger_key() -> bytes:
    """The per-user secret of the keyed patient digests, created (random, 0600) on first use
    (:func:`dphub.io.private_key`: two processes end with one key)."""
    d = _private_dir()
    path = d / KEY_FILE
    if not path.exists() and not os.path.islink(path):
        _no_new_key_over_records(d)
    try:
        return private_key(path, _KEY_BYTES)
    except OSError as e:
        raise ConfigError(f"cannot read or create the ledger key {path} "
                          f"({e.strerror or type(e).__name__})") from None
    except ValueError:
        raise ConfigError(f"the ledger key {path} is not a private key file of yours "
                          f"({_KEY_BYTES} bytes, mode 600)") from None


def _no_new_key_over_records(d: Path) -> None:
    """Refuse to create a key when the ledger already holds records: a new key would make every
    recorded digest unmatchable, silently starting a new ledger (and a new total) over them."""
    with _locked() as path:
        held = len(_read(path).releases)
    if held:
        raise ConfigError(
            f"the ledger key {d / KEY_FILE} is missing but {path} holds {held} record(s): restore "
            "the key from a backup; dphub does not start a new ledger over recorded releases "
            "(their patients could no longer be recognised, so their ε would be forgotten)")


def patient_digests(notes: Iterable[Note], key: bytes | None = None) -> frozenset[str]:
    """The keyed digests of the notes' patients (a note without a patient id is its own
    patient, digested from its note id): HMAC-SHA256 under :func:`ledger_key`."""
    key = ledger_key() if key is None else key
    ids = {f"p:{n.patient_id}" if n.patient_id else f"n:{n.id}" for n in notes}
    return frozenset(hmac.new(key, i.encode("utf-8"), hashlib.sha256).hexdigest() for i in ids)


def note_text_key(text: str) -> str:
    """A note's text as the ledger compares it: normalised as members read it, case-folded,
    whitespace collapsed (what ``federate simulate``'s site overlap compares)."""
    norm = normalize(text)
    return " ".join((norm.text if norm is not None else text).casefold().split())


def note_digests(notes: Iterable[Note], key: bytes | None = None) -> frozenset[str]:
    """The keyed digests of the notes' normalised texts (HMAC-SHA256 under :func:`ledger_key`;
    empty notes have none): a dataset is recognised by its notes even when its ids change."""
    key = ledger_key() if key is None else key
    texts = {t for t in (note_text_key(n.text) for n in notes) if t}
    return frozenset(hmac.new(key, b"t:" + t.encode("utf-8"), hashlib.sha256).hexdigest()
                     for t in texts)


def note_sketches(notes: Iterable[Note], key: bytes | None = None) -> frozenset[str]:
    """The keyed near-duplicate sketches of the notes' normalised texts (empty notes have
    none; :mod:`dphub.privacy.note_sketch`)."""
    key = ledger_key() if key is None else key
    texts = {t for t in (note_text_key(n.text) for n in notes) if t}
    return frozenset(s for s in (note_sketch.sketch(t, key) for t in texts) if s)


@dataclass(frozen=True)
class Footprint:
    """What the ledger knows of a dataset: the keyed digests of its patients and of its notes,
    the largest number of notes one patient has in it, and its notes' near-duplicate
    sketches."""

    patients: frozenset[str]
    notes: frozenset[str] = frozenset()
    notes_per_patient: int | None = None
    sketches: frozenset[str] = frozenset()

    def group_size(self, unit: str) -> int | None:
        """Units per patient at most (the group of group privacy): 1 for patient-level; the
        notes of the busiest patient for note-level; unknown for sequence-level."""
        if unit == PATIENT_UNIT:
            return 1
        return self.notes_per_patient if unit == "note" else None


def footprint(notes: Sequence[Note], key: bytes | None = None) -> Footprint:
    """The :class:`Footprint` of ``notes`` (patient and note digests under one key)."""
    key = ledger_key() if key is None else key
    per: dict[str, int] = {}
    for n in notes:
        pid = f"p:{n.patient_id}" if n.patient_id else f"n:{n.id}"
        per[pid] = per.get(pid, 0) + 1
    return Footprint(patient_digests(notes, key), note_digests(notes, key),
                     max(per.values()) if per else None, note_sketches(notes, key))


def shared_notes(a: Footprint | Release, b: Footprint | Release) -> int:
    """How many of ``b``'s notes ``a`` also holds: the same text (exact digest) or a
    near-duplicate (sketch), whichever finds more."""
    exact = len(a.notes & b.notes)
    if not (a.sketches and b.sketches):
        return exact
    return max(exact, note_sketch.near_duplicates(b.sketches, a.sketches))


def links(a: Footprint | Release, b: Footprint | Release) -> bool:
    """Whether ``a`` and ``b`` share a patient or a note (exact or near-duplicate)."""
    return bool(a.patients & b.patients) or shared_notes(a, b) > 0


def dataset_digest(digests: Iterable[str]) -> str:
    """One name for a set of keyed patient digests (local: it means nothing without the key)."""
    h = hashlib.sha256()
    for d in sorted(digests):
        h.update(d.encode("ascii") + b"\n")
    return h.hexdigest()


@dataclass(frozen=True)
class Release:
    """One release computed from a dataset (see the module docstring for what is kept)."""

    release: str  # weights SHA-256 of the model released (or a record id: a site, a surrogate)
    kind: str
    epsilon: float  # the release's card claim (already composed with what it depends on)
    delta: float
    privacy_unit: str
    patients: frozenset[str]
    history: tuple[GaussianSteps, ...] = ()
    parents: tuple[str, ...] = ()
    created: float = field(default_factory=time.time)
    notes: frozenset[str] = frozenset()
    #: units of one patient at most in this release (group privacy); None: not known
    group_size: int | None = None
    #: whether the claim composes ``parents`` (False: a parent declared disjoint)
    composes_parents: bool = True
    #: the notes' near-duplicate sketches (format 3; empty in older records)
    sketches: frozenset[str] = frozenset()

    @property
    def footprint(self) -> Footprint:
        return Footprint(self.patients, self.notes, sketches=self.sketches)

    @property
    def dataset(self) -> str:
        return dataset_digest(self.patients)

    def to_json(self) -> dict[str, Any]:
        return {"release": self.release, "kind": self.kind, "epsilon": float(self.epsilon),
                "delta": float(self.delta), "privacy_unit": self.privacy_unit,
                "history": [s.to_json() for s in self.history], "parents": list(self.parents),
                "dataset": self.dataset, "patients": sorted(self.patients),
                "notes": sorted(self.notes), "group_size": self.group_size,
                "composes_parents": self.composes_parents,
                "sketches": sorted(self.sketches),
                "created": round(float(self.created), 3)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Release:
        group = d.get("group_size")
        return cls(str(d["release"]), str(d["kind"]), float(d["epsilon"]), float(d["delta"]),
                   str(d["privacy_unit"]), frozenset(map(str, d["patients"])),
                   tuple(GaussianSteps.from_json(s) for s in d.get("history") or []),
                   tuple(map(str, d.get("parents") or [])), float(d.get("created") or 0.0),
                   frozenset(map(str, d.get("notes") or [])),
                   None if group is None else int(group),
                   bool(d.get("composes_parents", True)), _sketches(d.get("sketches")))

    def part(self) -> Part:
        return Part(self.epsilon, self.delta, self.history)

    @property
    def metric(self) -> bool:
        """A metric guarantee (ε per day, year or km: DP surrogates), not an ε per unit."""
        return self.kind == "surrogate"

    def patient_part(self) -> Part | None:
        """This release's guarantee per patient, or None when it bounds none.

        Patient-level: its claim. A unit finer than a patient (a note, a sequence) protects one
        unit; a patient with ``k`` of them is a group of ``k``, and (ε, δ)-DP gives the group
        (kε, k·e^((k-1)ε)·δ) (Dwork & Roth, Theorem 2.2 and its approximate form), valid when
        that δ stays below 1. Unknown group size (sequences), a larger δ or a metric guarantee:
        None (no patient-level bound).
        """
        if self.metric:
            return None
        k = 1 if self.privacy_unit == PATIENT_UNIT else self.group_size
        if k is None or k < 1:
            return None
        if k == 1:
            return self.part()
        exponent = (k - 1) * float(self.epsilon)
        delta = k * math.exp(exponent) * float(self.delta) if exponent < 700 else math.inf
        if not delta < 1.0:
            return None
        return Part(k * float(self.epsilon), delta)


@dataclass(frozen=True)
class Overlap:
    """How much of a dataset a release used: its patients and its notes in common."""

    patients: int
    notes: int

    def describe(self, fp: Footprint) -> str:
        if fp.notes:
            return (f"{self.patients} of these {len(fp.patients)} patients, {self.notes} of "
                    f"these {len(fp.notes)} notes")
        return f"{self.patients} of these patients"


@dataclass(frozen=True)
class Spend:
    """What a dataset's patients lost over the releases linked to it.

    ``total`` composes the releases with a patient-level bound (None: none); ``unbounded`` are
    releases with no patient-level bound (a unit finer than a patient, group size unknown), so
    no patient-level figure holds while they are there; ``metric`` are DP surrogates (ε per
    day, year or km), listed, not composed."""

    total: Composed | None
    unbounded: tuple[Release, ...] = ()
    metric: tuple[Release, ...] = ()
    #: the patient-level parts ``total`` composes (a new run composes with them exactly)
    parts: tuple[Part, ...] = ()

    @property
    def releases(self) -> int:
        """How many linked releases are not already inside another's claim."""
        return len(self.parts) + len(self.unbounded) + len(self.metric)

    @property
    def bounded(self) -> bool:
        return not self.unbounded


def _as_footprint(fp: Footprint | frozenset[str]) -> Footprint:
    return fp if isinstance(fp, Footprint) else Footprint(frozenset(fp))


@dataclass
class Ledger:
    releases: list[Release]

    def find(self, release: str | None) -> Release | None:
        """The record of the release with these weights (None: not released here)."""
        return next((r for r in self.releases if release and r.release == release), None)

    def overlapping(self, fp: Footprint | frozenset[str]) -> list[tuple[Release, Overlap]]:
        """Every release sharing a patient or a note with ``fp``, with how many it shares."""
        fp = _as_footprint(fp)
        out = []
        for r in self.releases:
            o = Overlap(len(r.patients & fp.patients), shared_notes(r, fp))
            if o.patients or o.notes:
                out.append((r, o))
        return out

    def composed_in(self, releases: Iterable[str]) -> set[str]:
        """``releases`` and every recorded ancestor their claims compose (a claim that composes
        its parents includes theirs)."""
        out: set[str] = set()
        todo = list(releases)
        while todo:
            sha = todo.pop()
            if sha in out:
                continue
            out.add(sha)
            rec = self.find(sha)
            if rec is not None and rec.composes_parents:
                todo.extend(rec.parents)
        return out

    def spend(self, fp: Footprint | frozenset[str], *, exclude: Iterable[str] = ()) -> Spend:
        """What the patients of ``fp`` lost over every release linked to them (a shared patient
        or note): the composition of those releases, an upper bound for each such patient.
        Releases that a linked release's claim composes (its parents) are already in it, and so
        are ``exclude`` and what they compose (a new run's own lineage, in its claim)."""
        rel = [r for r, _ in self.overlapping(fp)]
        inside = self.composed_in(exclude)
        inside |= {p for r in rel if r.composes_parents for p in r.parents}
        inside |= self.composed_in({p for r in rel if r.composes_parents for p in r.parents})
        tops = [r for r in rel if r.release not in inside]
        parts, unbounded, metric = [], [], []
        for r in tops:
            if r.metric:
                metric.append(r)
                continue
            part = r.patient_part()
            if part is None:
                unbounded.append(r)
            else:
                parts.append(part)
        return Spend(compose(parts) if parts else None, tuple(unbounded), tuple(metric),
                     tuple(parts))


def _sketches(value: Any) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(
            isinstance(v, str) and note_sketch.is_sketch(v) for v in value):
        raise ValueError("sketches")
    return frozenset(value)


def _read(path: Path) -> Ledger:
    try:
        raw = read_small_file(path, MAX_LEDGER_BYTES, what="the privacy ledger")
    except FileNotFoundError:
        return Ledger([])
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the privacy ledger ({e.strerror})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
        if data.get("format") not in READ_FORMATS:
            raise ValueError
        return Ledger([Release.from_json(r) for r in data["releases"]])
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(f"{path}: the privacy ledger is not a dphub ledger (format "
                          f"{LEDGER_FORMAT}); it was not changed") from None


def _write(path: Path, releases: Sequence[Release]) -> None:
    text = json.dumps({"format": LEDGER_FORMAT, "releases": [r.to_json() for r in releases]},
                      sort_keys=True) + "\n"
    atomic_write_text(path, text)  # mkstemp: 0600


@contextlib.contextmanager
def _locked() -> Iterator[Path]:
    d = _private_dir()
    fd = os.open(d / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield d / LEDGER_FILE
    finally:
        os.close(fd)


def load_ledger() -> Ledger:
    """The ledger of this user (empty when nothing was recorded yet)."""
    with _locked() as path:
        return _read(path)


def _merged(old: Release | None, new: Release) -> Release:
    """``new`` as it is recorded over ``old``, the record of the same release (the same weights
    recorded twice, or amended): it keeps every patient and note either saw, and its date."""
    if old is None:
        return new
    return replace(new, patients=old.patients | new.patients, notes=old.notes | new.notes,
                   sketches=old.sketches | new.sketches, created=old.created)


def _add(path: Path, release: Release) -> None:
    if release.kind not in KINDS:
        raise ConfigError(f"internal: unknown release kind {release.kind!r}")
    ledger = _read(path)
    old = ledger.find(release.release)
    kept = [r for r in ledger.releases if r.release != release.release]
    _write(path, [*kept, _merged(old, release)])


def record_release(release: Release) -> None:
    """Add ``release``, atomically, 0600. The same release (weights) recorded again keeps one
    record holding every patient and note either record saw; nothing else is ever removed."""
    with _locked() as path:
        _add(path, release)


def amend_release(release: str, *, kind: str, epsilon: float, delta: float,
                  composed: bool, composes: Sequence[str] = ()) -> None:
    """Re-record a release under its final kind and claim (a distillation amends the card of
    the student its training recorded); ``composed``: the claim is a composition, so its
    Gaussian history alone no longer describes it; ``composes``: the weights digests of the
    releases the claim now includes (a DP student's composed teachers), so they count once.
    Nothing recorded: nothing to amend."""
    with _locked() as path:
        rec = _read(path).find(release)
        if rec is None:
            return
        if composes and not rec.composes_parents:
            raise ConfigError("internal: a release with a parent it does not compose cannot "
                              "compose teachers")
        parents = tuple(dict.fromkeys([*rec.parents, *composes]))
        _add(path, replace(rec, kind=kind, epsilon=max(epsilon, rec.epsilon), delta=delta,
                           history=() if composed else rec.history, parents=parents))


def record_inherited(release: str, parent: str) -> None:
    """Record a release that spends nothing itself but carries ``parent``'s guarantee (a public
    student: post-processing of its teacher), with the parent's patients and claim. A parent
    this ledger does not know (trained elsewhere) leaves nothing to record."""
    with _locked() as path:
        ledger = _read(path)
        rec = ledger.find(parent)
        if rec is None:
            return
        fp = ancestry_footprint(ledger, [parent])
        _add(path, Release(release, "public_student", rec.epsilon, rec.delta, rec.privacy_unit,
                           fp.patients, rec.history, (parent,), notes=fp.notes,
                           group_size=rec.group_size, sketches=fp.sketches))


def _site_record_id(site_id: str, run: int) -> str:
    tail = "" if run == 0 else f":{run}"  # run 0: the id records made before runs were counted
    return hashlib.sha256(f"federated-site:{site_id}{tail}".encode()).hexdigest()


def _continues(rec: Release, steps: GaussianSteps, fp: Footprint) -> bool:
    """Whether ``steps`` is the same site accountant as ``rec`` grown by more rounds (same
    accountant, q and σ, more steps, same patients): then the record grows; anything else (a
    state reset: fewer or as many steps) is another run, added beside it."""
    if len(rec.history) != 1:
        return False
    h = rec.history[0]
    return (h.accountant == steps.accountant and h.steps < steps.steps
            and math.isclose(h.sample_rate, steps.sample_rate, rel_tol=1e-9)
            and math.isclose(h.noise_multiplier, steps.noise_multiplier, rel_tol=1e-9)
            and rec.patients == fp.patients)


def federated_release_id(site_id: str) -> str:
    """The ledger record of a federated site's spend (one per site and federation: ``site_id``
    is ``SITE:FEDERATION``), its first run's (a reset adds runs beside it)."""
    return _site_record_id(site_id, 0)


def record_federated_round(site_id: str, steps: GaussianSteps, *, epsilon: float,
                           delta: float, privacy_unit: str,
                           patients: Footprint | frozenset[str]) -> None:
    """Record a federated site's spend: one record per run of the site, its one accountant over
    all that run's rounds so far (the server's model is post-processing of the sites' updates).
    A site whose state was reset (its accountant restarts) adds a record: never replaces one."""
    fp = _as_footprint(patients)
    with _locked() as path:
        ledger = _read(path)
        run, latest = 0, None
        while (rec := ledger.find(_site_record_id(site_id, run))) is not None:
            latest, run = rec, run + 1
        rid = latest.release if latest is not None and _continues(latest, steps, fp) \
            else _site_record_id(site_id, run)
        _add(path, Release(rid, "federated_round", epsilon, delta, privacy_unit, fp.patients,
                           (steps,), notes=fp.notes,
                           group_size=fp.group_size(privacy_unit), sketches=fp.sketches))


def site_round_problem(site_id: str, so_far: GaussianSteps, target: Part,
                       patients: Footprint | frozenset[str], max_epsilon: float,
                       composed: Sequence[str] = ()) -> str | None:
    """Why a federated site's run, at its ``target`` over all rounds, would take its patients
    beyond ``max_epsilon`` once composed with every other release the ledger links to them (its
    own earlier runs included: a reset state starts a new accountant, not a new budget); None:
    within it, or nothing else recorded. ``so_far``: the site accountant's steps until now
    (the record they match is this run's own, inside ``target``). ``composed``: the record
    keys (``SITE:FEDERATION``) of the site's other federations that ``target`` already composes
    exactly (the site's one accountant over all its federations): their records are not
    counted twice."""
    fp = _as_footprint(patients)
    ledger = load_ledger()
    own = []
    for key in composed:
        run = 0
        while (rec := ledger.find(_site_record_id(key, run))) is not None:
            own.append(rec.release)
            run += 1
    run = 0
    while (rec := ledger.find(_site_record_id(site_id, run))) is not None:
        h = rec.history[0] if len(rec.history) == 1 else None
        if (so_far.steps > 0 and h is not None and h.steps == so_far.steps
                and h.accountant == so_far.accountant
                and math.isclose(h.sample_rate, so_far.sample_rate, rel_tol=1e-9)
                and math.isclose(h.noise_multiplier, so_far.noise_multiplier, rel_tol=1e-9)):
            own.append(rec.release)
        run += 1
    spend = ledger.spend(fp, exclude=own)
    if not (spend.parts or spend.unbounded):
        return None
    if spend.unbounded:
        return policy_problem(spend, max_epsilon)
    total = compose([target, *spend.parts])
    if total.epsilon <= max_epsilon:
        return None
    return (f"this site's patients would lose ε = {total.epsilon:.4g} (its target "
            f"{target.epsilon:g} composed with {spend.releases - len(spend.metric)} earlier "
            f"release(s) on them that its privacy ledger records); its policy is at most "
            f"{max_epsilon:g}")


def record_surrogates(run_id: str, mechanisms: Sequence[tuple[str, float, str]],
                      fp: Footprint) -> None:
    """Record a de-identification run's DP surrogates (``--dates dp``, ``--ages dp``, ``--places
    geo``): one record per mechanism, ``(name, ε, unit)`` with its metric unit (an interval's
    band unit, a year, a km). ``run_id`` names the run (a resumed run adds its notes to it)."""
    key = ledger_key()
    with _locked() as path:
        for name, eps, unit in mechanisms:  # keyed: the run's name (a path) stays unguessable
            rid = hmac.new(key, f"surrogate:{run_id}:{name}".encode(), hashlib.sha256).hexdigest()
            _add(path, Release(rid, "surrogate", float(eps), 0.0, f"{name} per {unit}",
                               fp.patients, notes=fp.notes, sketches=fp.sketches))


def release_spend(release: str) -> tuple[Release, Spend] | None:
    """The record of the release with these weights and what its patients (and the patients of
    its notes) lost over every release linked to them; None when it was not recorded here (no
    ledger is created by asking)."""
    if not (ledger_dir() / LEDGER_FILE).exists():
        return None
    ledger = load_ledger()
    rec = ledger.find(release)
    if rec is None:
        return None
    return rec, ledger.spend(rec.footprint)


def policy_problem(spend: Spend, max_epsilon: float) -> str | None:
    """Why ``spend`` breaks a policy of ``max_epsilon`` per patient (None: it does not): its
    patient-level composition above it, or no patient-level bound at all."""
    n = spend.releases - len(spend.metric)
    if spend.unbounded:
        units = "/".join(sorted({r.privacy_unit for r in spend.unbounded}))
        return (f"its patients' ε over the {n} release(s) the privacy ledger links to them is "
                f"not bounded (a {units}-level release: group size unknown, or too large for "
                "group privacy)")
    if spend.total is not None and spend.total.epsilon > max_epsilon:
        return (f"its patients have lost ε = {spend.total.epsilon:.4g} over the {n} release(s) "
                f"the privacy ledger links to them ({spend.total.method} composition), above "
                f"the maximum {max_epsilon:g}")
    return None


@dataclass(frozen=True)
class DatasetSpend:
    """One dataset's entry in ``dphub ledger show``: the releases linked to it (with how many
    of its patients and notes each used) and what they compose to (:class:`Spend`)."""

    dataset: str
    patients: int
    releases: tuple[tuple[Release, Overlap], ...]
    spend: Spend
    footprint: Footprint = field(default_factory=lambda: Footprint(frozenset()))

    @property
    def total(self) -> Composed | None:
        return self.spend.total


def dataset_spend(ledger: Ledger, fp: Footprint | frozenset[str]) -> DatasetSpend:
    """What the releases recorded here spent on ``fp``'s patients (see :meth:`Ledger.spend`)."""
    fp = _as_footprint(fp)
    rel = tuple(sorted(ledger.overlapping(fp), key=lambda x: x[0].created))
    return DatasetSpend(dataset_digest(fp.patients), len(fp.patients), rel, ledger.spend(fp),
                        fp)


def all_datasets(ledger: Ledger) -> list[DatasetSpend]:
    """Every dataset released from here (one per distinct patient set), oldest first."""
    seen: dict[str, Footprint] = {}
    for r in sorted(ledger.releases, key=lambda r: r.created):
        seen.setdefault(r.dataset, r.footprint)
    return [dataset_spend(ledger, fp) for fp in seen.values()]


def ancestry_footprint(ledger: Ledger, parents: Sequence[str]) -> Footprint:
    """The patients and notes of the recorded parents and their recorded ancestors."""
    pats: set[str] = set()
    notes: set[str] = set()
    sketches: set[str] = set()
    todo, seen = list(parents), set()
    while todo:
        sha = todo.pop()
        if sha in seen:
            continue
        seen.add(sha)
        rec = ledger.find(sha)
        if rec is not None:
            pats |= rec.patients
            notes |= rec.notes
            sketches |= rec.sketches
            todo.extend(rec.parents)
    return Footprint(frozenset(pats), frozenset(notes), sketches=frozenset(sketches))


def ancestry(ledger: Ledger, parents: Sequence[str]) -> frozenset[str]:
    """The patients of the recorded parents and their recorded ancestors."""
    return ancestry_footprint(ledger, parents).patients


__all__ = ["KINDS", "DatasetSpend", "Footprint", "Ledger", "Overlap", "Release", "Spend",
           "all_datasets", "amend_release", "ancestry", "ancestry_footprint", "dataset_digest",
           "dataset_spend", "footprint", "ledger_dir", "ledger_key", "links", "load_ledger",
           "note_digests", "note_sketches", "note_text_key", "shared_notes", "patient_digests", "policy_problem",
           "record_federated_round", "record_inherited", "record_release", "record_surrogates",
           "release_spend", "site_round_problem"]
