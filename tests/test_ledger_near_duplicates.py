"""Issue 53 item 5 (rest): the ledger links near-duplicate notes.

Before: a note was known by a keyed digest of its normalised text, so the same patients' notes
with one character changed in each (and the ids renamed) looked like a new dataset, and a new
run on them did not compose with the recorded one. Now each note also carries a keyed MinHash
sketch (``dphub.privacy.note_sketch``) and a note with a near-duplicate among a release's
notes links that release. Synthetic notes only; the end-to-end test trains the tiny random BERT
(a second or two a run).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from dphub import formats, synth
from dphub import train as T
from dphub.cli.main import main
from dphub.errors import ConfigError, PrivacyError
from dphub.notes import Note
from dphub.privacy import ledger as L
from dphub.privacy import note_sketch
from dphub.privacy.policy import Policy


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "home"))


def _edit(n: Note, prefix: str = "MRN-") -> Note:
    """The note with one character changed in the middle (same length, spans kept) and every
    id renamed: nothing exact is left for the ledger to match."""
    i = len(n.text) // 2
    c = "q" if n.text[i] != "q" else "z"
    return Note(f"{prefix}{n.id}", n.text[:i] + c + n.text[i + 1:], f"{prefix}{n.patient_id}",
                n.metadata, n.spans, n.labelled)


def _renamed(n: Note, text: str, prefix: str = "R-") -> Note:
    return Note(f"{prefix}{n.id}", text, f"{prefix}{n.patient_id}", n.metadata, n.spans,
                n.labelled)


BASE = synth.generate(16, kind="nursing", seed=3, patients=6)
OTHER = [_renamed(n, n.text, "O-") for n in synth.generate(12, kind="nursing", seed=5,
                                                             patients=4)]


def _recorded() -> L.Footprint:
    fp = L.footprint(BASE)
    L.record_release(L.Release("a" * 64, "train", 2.0, 1e-5, "patient", fp.patients,
                               notes=fp.notes, sketches=fp.sketches))
    return fp


def _overlap(notes: list[Note]) -> L.Overlap | None:
    found = L.load_ledger().overlapping(L.footprint(notes))
    return found[0][1] if found else None


def test_trivial_edits_reordering_subsets_and_supersets_link(tmp_path: Path) -> None:
    _recorded()
    edited = [_edit(n) for n in BASE]
    assert L.note_digests(edited).isdisjoint(L.note_digests(BASE))  # no exact digest left
    assert L.patient_digests(edited).isdisjoint(L.patient_digests(BASE))
    word = [_renamed(n, re.sub(r"\b(\w+)\b", r"\1 also", n.text, count=1)) for n in BASE]
    spaced = [_renamed(n, "  " + n.text.upper().replace(" ", "\n  ")) for n in BASE]
    cases = {
        "one character changed": (edited, 16),
        "a word added": (word, 16),
        "whitespace and case": (spaced, 16),
        "reordered": (list(reversed(edited)), 16),
        "a subset": (edited[3:8], 5),
        "a superset": ([*edited, *OTHER], 16),
        "one edited note among others": ([edited[0], *OTHER], 1),
    }
    for what, (notes, shared) in cases.items():
        o = _overlap(notes)
        assert o is not None and o.notes == shared and o.patients == 0, (what, o)
        spend = L.dataset_spend(L.load_ledger(), L.footprint(notes))
        assert spend.total is not None and spend.total.epsilon == pytest.approx(2.0), what


def test_a_genuinely_different_corpus_does_not_link(tmp_path: Path) -> None:
    _recorded()
    for kind, seed in (("nursing", 5), ("nursing", 4), ("discharge", 3),
                       ("realistic-nursing", 3)):
        other = [_renamed(n, n.text, "O-") for n in synth.generate(20, kind=kind, seed=seed)]
        assert _overlap(other) is None, (kind, seed)
        assert L.dataset_spend(L.load_ledger(), L.footprint(other)).total is None


def test_the_sketch_is_keyed_and_holds_no_text(tmp_path: Path) -> None:
    fp = _recorded()
    assert len(fp.sketches) == 16 and all(note_sketch.is_sketch(s) for s in fp.sketches)
    assert L.note_sketches(BASE, key=b"k" * 32).isdisjoint(fp.sketches)  # another site's key
    raw = (L.ledger_dir() / L.LEDGER_FILE).read_text(encoding="utf-8")
    data = json.loads(raw)
    assert data["format"] == 3 and sorted(fp.sketches) == data["releases"][0]["sketches"]
    for n in BASE:  # no note text, no 5-gram of one
        key = L.note_text_key(n.text)
        assert n.text[:20] not in raw and not any(
            key[i:i + 12] in raw for i in range(0, len(key) - 12, 7))
    # without the key a sketch cannot be recomputed from a guessed note (keyed band digests)
    assert note_sketch.sketch(L.note_text_key(BASE[0].text), b"\0" * 32) not in raw


def test_an_older_ledger_is_read_migrated_and_a_broken_or_newer_one_refused(
        tmp_path: Path) -> None:
    fp = L.footprint(BASE)
    old = {"format": 2, "releases": [{
        "release": "a" * 64, "kind": "train", "epsilon": 2.0, "delta": 1e-5,
        "privacy_unit": "patient", "history": [], "parents": [], "dataset": "d",
        "patients": sorted(fp.patients), "notes": sorted(fp.notes), "group_size": 1,
        "composes_parents": True, "created": 1.0}]}
    path = L.ledger_dir() / L.LEDGER_FILE
    path.write_text(json.dumps(old))
    # a format-2 record has no sketch: it links by exact digests (renamed ids, same text)
    renamed = [_renamed(n, n.text) for n in BASE]
    assert _overlap(renamed) is not None and _overlap([_edit(n) for n in BASE]) is None
    L.record_release(L.Release("b" * 64, "train", 1.0, 1e-5, "patient", frozenset({"x"}),
                               sketches=fp.sketches))
    data = json.loads(path.read_text())
    assert data["format"] == 3 and [r["release"][0] for r in data["releases"]] == ["a", "b"]
    assert data["releases"][0]["sketches"] == [] and data["releases"][0]["notes"] == old[
        "releases"][0]["notes"]
    for bad in ({**data, "format": 4},
                {**data, "releases": [{**data["releases"][1], "sketches": ["Mr Smith"]}]}):
        path.write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match="not a dphub ledger"):
            L.load_ledger()


def test_training_again_on_edited_notes_composes(tiny_base_model: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """End to end: a run on the same patients' notes, each with one character changed and
    every id renamed, is linked to the first run; a policy that admits one run but not two
    refuses it before training; `ledger show` lists the first release."""
    data = tmp_path / "a.jsonl"
    formats.write(BASE, data, "jsonl")
    edited = tmp_path / "edited.jsonl"
    formats.write([_edit(n) for n in BASE], edited, "jsonl")

    def opts(d: Path, out: Path, **kw) -> T.TrainOptions:
        return T.TrainOptions(data=d, out=out, base_model=str(tiny_base_model),
                              warm_start="none", epochs=1.0, batch_size=2,
                              max_physical_batch=4, noise=1.0, accountant="rdp",
                              max_length=64, stride=16, checkpoint_every=50, **kw)

    r1 = T.train(opts(data, tmp_path / "first"))
    assert main(["ledger", "show", str(edited)]) == 0
    out = capsys.readouterr().out
    assert "no release used these patients" not in out
    assert "0 of these 6 patients, 16 of these 16 notes" in out
    with pytest.raises(PrivacyError, match="privacy ledger records"):
        T.train(opts(edited, tmp_path / "second", policy=Policy(max_epsilon=r1.epsilon * 1.2)))
    assert not (tmp_path / "second").exists()
