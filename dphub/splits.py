"""Train/test splits that keep every patient on one side.

A patient's notes repeat their name, relatives, doctors and dates. If some of those notes land in
training and others in test, a model that memorised them looks better than it is, and patient-level
DP accounting (one patient = one unit) no longer matches what was held out. So the default unit of
a split is the patient (``Note.effective_patient_id``); ``by="note"`` is there for corpora that
have no patients.

Assignment is a pure function of the units, their sizes and the seed: units are sorted, shuffled
with a seeded ``random.Random``, then each goes to the split furthest below its target number of
notes. That hits note ratios closely even when patients have very different numbers of notes.

:func:`split_corpus` streams: it reads the corpus once to count notes per unit and once more per
output file, so a corpus larger than memory can be split.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dphub import formats
from dphub.errors import ConfigError, InputError
from dphub.notes import Note

UNITS: tuple[str, ...] = ("patient", "note")


def parse_ratios(text: str) -> list[float]:
    """Parse ``"0.8,0.2"``: at least two positive numbers summing to 1."""
    try:
        ratios = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"ratios must be comma-separated numbers like 0.8,0.2, got {text!r}"
                          ) from None
    check_ratios(ratios)
    return ratios


def check_ratios(ratios: Sequence[float]) -> None:
    if len(ratios) < 2:
        raise ConfigError("a split needs at least two ratios (e.g. 0.8,0.2)")
    if any(not math.isfinite(r) or r <= 0 for r in ratios):
        raise ConfigError("every split ratio must be a positive number")
    if abs(sum(ratios) - 1.0) > 1e-6:
        raise ConfigError(f"split ratios must sum to 1, they sum to {sum(ratios):g}")


def unit_of(note: Note, by: str) -> str:
    """The unit a note is assigned with: its patient (or itself when it has none), or itself."""
    if by == "patient":
        return note.effective_patient_id
    if by == "note":
        return note.id
    raise ConfigError(f"unknown split unit {by!r}; choose one of {', '.join(UNITS)}")


def assign_units(unit_sizes: Mapping[str, int], ratios: Sequence[float], seed: int = 0
                 ) -> dict[str, int]:
    """Map each unit to a split index so that note counts follow ``ratios`` closely.

    Raises :class:`InputError` when there are fewer units than splits or a split stays empty
    (an empty test set is almost always a mistake, and silently writing one hides it).
    """
    check_ratios(ratios)
    units = sorted(unit_sizes)
    if len(units) < len(ratios):
        raise InputError(f"cannot split {len(units)} unit(s) into {len(ratios)} parts")
    random.Random(f"dphub-split:{seed}").shuffle(units)
    total = sum(unit_sizes.values())
    targets = [r * total for r in ratios]
    filled = [0] * len(ratios)
    out: dict[str, int] = {}
    for u in units:
        # the split furthest below its target (relative to its size), ties to the lower index
        i = max(range(len(ratios)), key=lambda k: ((targets[k] - filled[k]) / targets[k], -k))
        out[u] = i
        filled[i] += unit_sizes[u]
    empty = [i for i, f in enumerate(filled) if f == 0]
    if empty:
        raise InputError(
            f"split {empty[0]} would be empty: {len(units)} unit(s) cannot fill {len(ratios)} "
            "parts with these ratios"
        )
    return out


def split_notes(notes: Iterable[Note], ratios: Sequence[float], *, by: str = "patient",
                seed: int = 0) -> list[list[Note]]:
    """Split notes held in memory; the notes keep their input order inside each part."""
    notes = list(notes)
    sizes = Counter(unit_of(n, by) for n in notes)
    assignment = assign_units(sizes, ratios, seed)
    parts: list[list[Note]] = [[] for _ in ratios]
    for n in notes:
        parts[assignment[unit_of(n, by)]].append(n)
    return parts


@dataclass(frozen=True)
class SplitPart:
    """One written part: where it went and how many notes and units it holds."""

    name: str
    path: Path
    notes: int
    units: int


def output_names(n_parts: int, names: Sequence[str] | None) -> list[str]:
    """``split-0`` ... or the given names (validated: one per ratio, plain and distinct)."""
    if names is None:
        return [f"split-{i}" for i in range(n_parts)]
    names = [s.strip() for s in names]
    if len(names) != n_parts:
        raise ConfigError(f"{len(names)} name(s) given for {n_parts} ratios")
    for s in names:
        if not s or s.startswith(".") or "/" in s or "\\" in s:
            raise ConfigError(f"split name {s!r} is not a plain file name")
    if len(set(names)) != len(names):
        raise ConfigError("split names must be distinct")
    return names


def split_corpus(
    path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    ratios: Sequence[float],
    *,
    by: str = "patient",
    seed: int = 0,
    names: Sequence[str] | None = None,
    format: str | None = None,
    force: bool = False,
) -> list[SplitPart]:
    """Split a corpus file/directory into ``out_dir/<name>.jsonl`` files, streaming.

    Every part is first written under a hidden temporary name and all are renamed into place only
    when every part succeeded, so a failure leaves no partial split behind. Existing outputs are
    refused unless ``force``.
    """
    check_ratios(ratios)
    if by not in UNITS:
        raise ConfigError(f"unknown split unit {by!r}; choose one of {', '.join(UNITS)}")
    out_dir = Path(out_dir)
    part_names = output_names(len(ratios), names)
    targets = [out_dir / f"{name}.jsonl" for name in part_names]
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{out_dir}: exists and is not a directory")
    existing = [t for t in targets if t.exists()]
    if existing and not force:
        raise ConfigError(f"{existing[0]} already exists (use --force to overwrite)")

    sizes = Counter(unit_of(n, by) for n in formats.read(path, format=format))
    if not sizes:
        raise InputError(f"{path}: no notes to split")
    assignment = assign_units(sizes, ratios, seed)

    out_dir.mkdir(parents=True, exist_ok=True)
    temps = [out_dir / f".{t.name}.{os.getpid()}.partial" for t in targets]
    parts: list[SplitPart] = []
    try:
        for i, (name, tmp) in enumerate(zip(part_names, temps, strict=True)):
            chosen = (n for n in formats.read(path, format=format)
                      if assignment[unit_of(n, by)] == i)
            written = formats.write(chosen, tmp, "jsonl")
            units = sum(1 for v in assignment.values() if v == i)
            parts.append(SplitPart(name, targets[i], int(written), units))
        for tmp, target in zip(temps, targets, strict=True):
            os.replace(tmp, target)
    except BaseException:
        for tmp in temps:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    return parts
