"""A reviewer's "not PHI" becomes a site-local safe word for the inverse rule (issue 54 item 4).

Why: under the inverse rule most of what a reviewer sees hidden is ordinary words the shipped
vocabulary lacks (a ward's shorthand, a local system's name, a misspelling). Each rejection of
such a word is a label that only this site has; recorded here, it lets the next run keep that
word (``dphub ensemble deid --safe-words FILE``), measured in docs/review.md.

What is recorded, from one save of the page (the reviewed notes as labelled notes,
:func:`dphub.review.corrections.labelled_notes`):

* a **rejection**: a word inside a span the run hid that no kept or added label covers (and no
  gold span, when the review has gold), written in lower-case letters as the note has it
  (:func:`dphub.safe_vocab.is_site_word`: never capitalised, a single letter, digits or a
  shape), in neither the rule member's first-name and surname lists nor the vocabulary's context
  words (``smith``, ``rose``: never even written to the file), and not already a safe word;
* a **refusal**: every word inside a label the reviewer kept or added, and inside a gold miss:
  a word labelled PHI at the site, ever, never counts as a safe word again. The file keeps
  only its keyed digest (:func:`dphub.safe_vocab.site_entry_key`), never the word.

The file (:data:`dphub.safe_vocab.SITE_FORMAT`, JSON, 0600, written atomically) holds, per
word, its rejections: the run's identity, a keyed digest of the patient (the note, without a
patient id) and the date; never a note's text, id or patient id. A word counts only with
:data:`dphub.safe_vocab.MIN_REJECTIONS` different patients (one patient's lower-case nickname,
rejected in every one of that patient's notes, is still one), and the inverse rule releases it
only under its guard (:func:`dphub.ensemble.inverse.site_released`). A save replaces the
rejections of its own run (the page sends its whole state each time), so saving twice counts
once; refusals only grow.

Its default place is beside the ensemble manifest (``site-safe-words.json``), the site's own
configuration, never the run's output (what is released) and never a model directory (the
publish gate's allow-list refuses any file it does not know).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dphub.ensemble.words import WORD_RE
from dphub.errors import ConfigError
from dphub.io import atomic_write_text, read_small_file
from dphub.notes import Note
from dphub.review.run import Review, ReviewNote
from dphub.rules.lexicon import dictionaries
from dphub.safe_vocab import (
    MAX_BYTES,
    SITE_FORMAT,
    SITE_VERSION,
    SafeVocabulary,
    counted_site_words,
    is_site_word,
    normalize_word,
    parse_site_file,
    site_entry_key,
)

#: the file's name beside the ensemble manifest
DEFAULT_NAME = "site-safe-words.json"


def default_safe_words_path(manifest_path: Path) -> Path:
    """``site-safe-words.json`` beside the ensemble manifest."""
    return Path(manifest_path).expanduser().resolve().parent / DEFAULT_NAME


def check_safe_words_path(path: Path, run_dir: Path, inputs: Sequence[Path]) -> Path:
    """Refuse a safe words file inside the run's output (released) or on one of its inputs."""
    p = Path(path).expanduser().resolve()
    out = Path(run_dir).resolve()
    if p == out or out in p.parents:
        raise ConfigError(f"{path}: site-local safe words stay on this machine; keep them "
                          f"outside the run's output {run_dir} (which is what gets released)")
    for inp in inputs:
        r = Path(inp).resolve()
        if p == r or (r.is_dir() and r in p.parents):
            raise ConfigError(f"{path}: would write into the input {inp}; choose another file")
    if p.suffix != ".json":
        raise ConfigError(f"{path}: site-local safe words are JSON; name the file *.json")
    if Path(path).expanduser().is_symlink() or (p.exists() and not p.is_file()):
        raise ConfigError(f"{path}: not a regular file (a link is refused: the file would be "
                          "written where it points)")
    return p


def run_identity(review: Review) -> str:
    """The run a rejection came from: a digest of the run directory and its random run id (as
    the corrections file is keyed, :func:`dphub.review.corrections.default_corrections_path`)."""
    resolved = Path(review.run_dir).resolve()
    ident = f"{resolved}\x00{review.run_id or ''}".encode("utf-8", "surrogateescape")
    return hashlib.sha256(ident).hexdigest()[:16]


@dataclass(frozen=True)
class Harvest:
    """What one save says: word -> the sources (patients) that rejected it; words labelled PHI."""

    rejected: dict[str, set[str]]
    phi: set[str]


def _covered(spans: Iterable[tuple[int, int]], n: int) -> bytearray:
    mask = bytearray(n + 1)
    for a, b in spans:
        mask[a:b] = b"\x01" * (b - a)
    return mask


def harvest(review: Review, labelled: Sequence[Note], vocab: SafeVocabulary | None = None
            ) -> Harvest:
    """The rejections and the PHI words of the reviewed notes ``labelled`` (the run's notes as
    the reviewer left them); ``vocab``: words already safe are not recorded."""
    by_id: dict[str, ReviewNote] = {n.id: n for n in review.notes}
    names = dictionaries().names
    rejected: dict[str, set[str]] = {}
    phi: set[str] = set()
    for note in review.notes:  # a gold miss labels PHI in any note, reviewed or not
        for m in WORD_RE.finditer(note.text):
            if any(x["start"] < m.end() and m.start() < x["end"] for x in note.misses):
                phi.add(normalize_word(m.group()))
    for saved in labelled:
        note = by_id.get(saved.id)
        if note is None or saved.text != note.text:
            continue  # labelled_notes only gives the run's notes; nothing to learn otherwise
        n = len(note.text)
        hidden = _covered(((s["start"], s["end"]) for s in note.spans), n)
        kept = _covered(((s.start, s.end) for s in saved.spans), n)
        # a span gold calls PHI is never a rejection, whatever the reviewer did with it
        gold = _covered(((s["start"], s["end"]) for s in note.spans if s.get("gold") == "tp"), n)
        source = (f"patient\x00{note.patient_id}" if note.patient_id is not None
                  else f"note\x00{note.id}")
        for m in WORD_RE.finditer(note.text):
            a, b = m.start(), m.end()
            word = normalize_word(m.group())
            if any(kept[a:b]):
                phi.add(word)
                continue
            if not any(hidden[a:b]) or any(gold[a:b]):
                continue
            if (not is_site_word(m.group()) or word in names
                    or (vocab is not None and (vocab.contains(word) or vocab.is_context(word)))):
                continue
            rejected.setdefault(word, set()).add(source)
    return Harvest(rejected, phi)


def read_site_file(path: Path) -> dict[str, Any] | None:
    """The site file at ``path`` checked (None: there is none yet)."""
    try:
        data = read_small_file(path, MAX_BYTES, what="a site-local safe words file")
    except FileNotFoundError:
        return None
    return parse_site_file(data, str(path))


@dataclass(frozen=True)
class SiteSummary:
    """Numbers only: words that count now, words waiting for another rejection, refusals."""

    counted: int
    waiting: int
    refused: int


def summarize(doc: dict[str, Any] | None) -> SiteSummary:
    if doc is None:
        return SiteSummary(0, 0, 0)
    key = bytes.fromhex(doc["key"])
    refused = set(doc["refused"])
    live = [w for w in doc["words"] if site_entry_key(key, w) not in refused]
    counted = len(counted_site_words(doc))
    return SiteSummary(counted, len(live) - counted, len(refused))


def record_safe_words(review: Review, labelled: Sequence[Note], path: Path, *,
                      vocab: SafeVocabulary | None = None,
                      today: dt.date | None = None) -> SiteSummary:
    """Merge one save's rejections and refusals into the site file at ``path`` (created 0600)
    and return its summary. ``path`` must have passed :func:`check_safe_words_path`."""
    path = Path(path)
    doc = read_site_file(path) or {"format": SITE_FORMAT, "version": SITE_VERSION,
                                   "key": secrets.token_hex(32), "words": {}, "refused": []}
    key = bytes.fromhex(doc["key"])
    got = harvest(review, labelled, vocab)
    run = run_identity(review)
    date = (today or dt.datetime.now(dt.UTC).date()).isoformat()
    refused = set(doc["refused"]) | {site_entry_key(key, w) for w in got.phi}
    sources = {w: {site_entry_key(key, s) for s in ss} for w, ss in got.rejected.items()}
    words: dict[str, list[dict[str, str]]] = {}
    for w in sorted(set(doc["words"]) | set(sources)):
        old = doc["words"].get(w, [])
        # this run's earlier rejections are replaced by this save's (the page sends its state)
        dates = {r["source"]: r["date"] for r in old if r["run"] == run}
        recs = [r for r in old if r["run"] != run]
        recs += [{"run": run, "source": s, "date": dates.get(s, date)}
                 for s in sorted(sources.get(w, ()))]
        if recs and site_entry_key(key, w) not in refused:
            words[w] = recs
    doc = {"format": SITE_FORMAT, "version": SITE_VERSION,
           "about": "site-local safe words of the inverse rule: words reviewers said are no "
                    "PHI; keep on this machine, never publish or share (dphub review)",
           "key": doc["key"], "words": words, "refused": sorted(refused)}
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    # atomic_write_text's temp file is mkstemp's (0600) and the rename keeps its mode
    atomic_write_text(path, json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    os.chmod(path, 0o600)
    return summarize(doc)
