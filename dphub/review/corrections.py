"""A reviewer's corrections become labelled notes (Scenario B's ``ensemble train``, or
``ensemble calibrate``).

Why labelled notes and not a diff: the file is then an ordinary JSONL corpus of dphub's
(:mod:`dphub.formats.jsonl`) that every command reads. A reviewed note's labels are the run's
hidden spans the reviewer did not reject, plus the spans the reviewer marked as missed; an
untyped span of the inverse rule (``PHI``) that the reviewer kept is written ``OTHER`` (HIPAA's
catch-all: a model learns to hide it without a made-up category). Only notes the reviewer
touched or marked reviewed are written: an unread note is not a label.

The file holds note text: it is written atomically (:mod:`dphub.io`, a temp file renamed into
place, 0600), never inside the run's output directory (which is what gets released), never over
the notes or the gold it was made from. Its default place is ``$DPHUB_HOME/review/``.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError, InputError
from dphub.formats import read as read_notes
from dphub.formats import write as write_notes
from dphub.io import dphub_home
from dphub.labels import CATEGORIES, UNTYPED
from dphub.notes import Note, Span
from dphub.review.run import Review, ReviewNote

#: the label an untyped span (the inverse rule's ``PHI``) is written with
UNTYPED_AS = "OTHER"


def default_corrections_path(run_dir: Path, run_id: str | None) -> Path:
    """``$DPHUB_HOME/review/<run name>-<identity>.corrections.jsonl``: private, away from the run.

    Why the identity (issue 54): keyed by the directory's name alone, two runs named ``out`` over
    the same notes shared one file, and the second review started from the first one's
    corrections. ``<identity>`` is a digest of the run directory's resolved path and its random
    ``run_id`` (``run.json``; a rerun into the same directory gets a new one).
    """
    resolved = Path(run_dir).resolve()
    ident = hashlib.sha256(f"{resolved}\x00{run_id or ''}".encode("utf-8", "surrogateescape"))
    return dphub_home() / "review" / f"{resolved.name}-{ident.hexdigest()[:12]}.corrections.jsonl"


class StaleRevision(InputError):
    """The corrections file changed since the page was loaded (another tab or reviewer saved)."""


#: the revision of a corrections file that does not exist (yet)
NO_REVISION = "none"


def corrections_revision(path: Path) -> str:
    """The revision a save must be based on: a digest of the file's bytes (``none``: no file).

    Why a digest of the bytes and not a counter in memory: two servers (or a server restarted
    between loading and saving) on one file still see each other's saves.
    """
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:32]
    except (FileNotFoundError, NotADirectoryError):  # no file (a file where a directory is
        # expected: the page then says it cannot save)
        return NO_REVISION


def remove_stale_temps(path: Path) -> int:
    """Delete temp files a killed save left beside ``path`` (``dphub.io`` names them
    ``.<name>.<random>.tmp``; they hold note text); how many were removed."""
    p = Path(path)
    n = 0
    if p.parent.is_dir():
        for t in p.parent.glob(f".{glob.escape(p.name)}.*.tmp"):
            if t.is_file() and not t.is_symlink():
                t.unlink(missing_ok=True)
                n += 1
    return n


def _inside(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def check_corrections_path(path: Path, run_dir: Path, inputs: Sequence[Path]) -> Path:
    """Refuse a corrections file inside the run's output or on one of its inputs."""
    p = Path(path).expanduser().resolve()
    if _inside(p, Path(run_dir).resolve()):
        raise ConfigError(f"{path}: corrections hold note text; write them outside the run's "
                          f"output {run_dir} (which is what gets released)")
    for inp in inputs:
        r = Path(inp).resolve()
        if p == r or (r.is_dir() and _inside(p, r)):
            raise ConfigError(f"{path}: would write into the input {inp}; choose another file")
    if p.suffix not in (".jsonl", ".ndjson"):
        raise ConfigError(f"{path}: corrections are written as JSON Lines; name it *.jsonl")
    if p.exists() and not p.is_file():
        raise ConfigError(f"{path}: not a regular file")
    return p


def unwritable(path: Path) -> str | None:
    """Why corrections cannot be saved to ``path`` (None: they can), said on the page before
    the reviewer starts, not after a review is lost.

    A save writes a temp file beside ``path`` and renames it (and makes missing directories),
    so what counts is the nearest existing directory above it, not the file's own mode.
    """
    p = Path(path)
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"no permission to write in {parent}"
    return None


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(f"{where}: offsets must be integers")
    return v


def _labels(note: ReviewNote, corr: Mapping[str, Any], where: str) -> list[Span]:
    rejected = set()
    for r in corr.get("rejected") or ():
        if not isinstance(r, list | tuple) or len(r) != 2:
            raise InputError(f"{where}: a rejected span is [start, end]")
        rejected.add((_int(r[0], where), _int(r[1], where)))
    run = {(s["start"], s["end"]): s for s in note.spans}
    unknown = rejected - run.keys()
    if unknown:
        raise InputError(f"{where}: rejects a span the run did not hide {sorted(unknown)[0]}")
    spans = [Span(a, b, UNTYPED_AS if s["label"] == UNTYPED else s["label"])
             for (a, b), s in run.items() if (a, b) not in rejected]
    retyped = {}
    for r in corr.get("retyped") or ():
        if not isinstance(r, Mapping):
            raise InputError(f"{where}: a retyped span is {{start, end, label}}")
        retyped[(_int(r.get("start"), where), _int(r.get("end"), where))] = r.get("label")
    for i, s in enumerate(spans):
        label = retyped.pop((s.start, s.end), None)
        if label is not None:
            if label not in CATEGORIES:
                raise InputError(f"{where}: unknown category {label!r}")
            spans[i] = Span(s.start, s.end, label)
    if retyped:
        raise InputError(f"{where}: retypes a span the run did not hide (or one rejected)")
    for a in corr.get("added") or ():
        if not isinstance(a, Mapping):
            raise InputError(f"{where}: an added span is {{start, end, label}}")
        start, end = _int(a.get("start"), where), _int(a.get("end"), where)
        label = a.get("label")
        if label not in CATEGORIES:
            raise InputError(f"{where}: unknown category {label!r}")
        if not 0 <= start < end <= len(note.text):
            raise InputError(f"{where}: an added span [{start}, {end}) is outside the note")
        if any(s.start < end and start < s.end for s in spans):
            raise InputError(f"{where}: an added span [{start}, {end}) overlaps a kept one; "
                             "reject that one first")
        spans.append(Span(start, end, label))
    return sorted(spans, key=lambda s: (s.start, s.end))


def labelled_notes(review: Review, payload: Any) -> list[Note]:
    """The reviewed notes of ``payload`` (``{"notes": {key: {"reviewed", "rejected", "retyped",
    "added"}}}``, what the page sends) as labelled notes, in the run's order of review."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("notes"), Mapping):
        raise InputError("corrections: expected {\"notes\": {key: corrections}}")
    corr = payload["notes"]
    known = {n.key for n in review.notes}
    extra = [k for k in corr if k not in known]
    if extra:
        raise InputError(f"corrections name a note that is not in the run ({extra[0]!r})")
    out = []
    for note in review.notes:
        c = corr.get(note.key)
        if not isinstance(c, Mapping):
            if c is not None:
                raise InputError(f"corrections of {note.key}: expected an object")
            continue
        touched = c.get("reviewed") or c.get("rejected") or c.get("added") or c.get("retyped")
        if not touched:
            continue
        spans = _labels(note, c, f"corrections of {note.key}")
        out.append(Note(note.id, note.text, note.patient_id, spans=spans, labelled=True))
    return out


def save_corrections(review: Review, payload: Any, path: Path, *,
                     revision: str | None = None) -> int:
    """Write the reviewed notes atomically as JSONL (0600); return how many were written.

    ``path`` must have passed :func:`check_corrections_path`. No reviewed note: nothing is
    written (and an earlier file stays). With ``revision`` (what the page was loaded with,
    :func:`corrections_revision`), a file that changed since is not overwritten:
    :class:`StaleRevision`.
    """
    notes = labelled_notes(review, payload)
    if not notes:
        raise InputError("no note is marked reviewed or corrected: nothing was written")
    if revision is not None and revision != corrections_revision(path):
        raise StaleRevision("the corrections were saved from another page (a second tab or "
                            "reviewer) since this one was loaded; nothing was written: reload "
                            "the page to see them, then redo your changes")
    path = Path(path)
    private = path.parent
    if not private.exists():
        private.mkdir(parents=True, mode=0o700)
    # atomic_open's temp file is mkstemp's (0600) and the rename keeps its mode
    n = write_notes(notes, path, "jsonl", overwrite=True)
    os.chmod(path, 0o600)
    return n


def load_corrections(review: Review, path: Path) -> dict[str, Any]:
    """An earlier corrections file as the page's corrections, so a review goes on where it
    stopped: the run's spans missing from a note are rejected, the others' labels retyped where
    they differ, spans the run did not hide are added."""
    if not Path(path).is_file():
        return {"notes": {}}
    by_id = {n.id: n for n in review.notes}
    out: dict[str, Any] = {}
    for saved in read_notes(path, format="jsonl"):
        note = by_id.get(saved.id)
        if note is None or saved.text != note.text:
            raise InputError(f"{path}: note {saved.id} is not a note of this run; give "
                             "another --corrections file")
        run = {(s["start"], s["end"]): s for s in note.spans}
        kept = {(s.start, s.end): s.label for s in saved.spans}
        rejected = [list(k) for k in run if k not in kept]
        retyped = [{"start": a, "end": b, "label": lab} for (a, b), lab in kept.items()
                   if (a, b) in run and lab != run[(a, b)]["label"]
                   and not (run[(a, b)]["label"] == UNTYPED and lab == UNTYPED_AS)]
        added = [{"start": a, "end": b, "label": lab} for (a, b), lab in kept.items()
                 if (a, b) not in run]
        out[note.key] = {"reviewed": True, "rejected": rejected, "retyped": retyped,
                         "added": added}
    return {"notes": out}
