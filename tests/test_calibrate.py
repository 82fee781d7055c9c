"""Calibration that says no (issue 14.5): thresholds per (member, label), a patient holdout that
checks them, and a refusal naming the best reachable (precision, recall) pair.

Members are stub taggers with known scores: every word's kind (its two-letter prefix) fixes its
gold label, the model's P(not O) and the model's most probable label, so the right answer is known.
"""

from __future__ import annotations

import json
import random
import re
import tomllib
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from dphub.cli.main import main
from dphub.ensemble.calibrate import CalibrationRefused, _holdout_split, calibrate
from dphub.ensemble.core import Ensemble, Slot, member_from_entry
from dphub.ensemble.evaluation import evaluate_ensemble
from dphub.ensemble.manifest import Manifest, MemberEntry
from dphub.ensemble.members import FixedMember, ModelMember
from dphub.errors import ConfigError, InputError
from dphub.notes import Note, Span
from dphub.scores import LabelThresholds, TokenScores, spans_from_scores

LABELS = ("NAME", "ID")
#: prefix -> (gold label or None, model P(not O), model label)
KINDS: dict[str, tuple[str | None, float, str]] = {
    "Nm": ("NAME", 0.9, "NAME"),   # names: confident
    "Fn": (None, 0.3, "NAME"),     # not PHI, looks a bit like a name
    "Id": ("ID", 0.05, "ID"),      # IDs: the model is unsure about every one
    "Fi": (None, 0.01, "ID"),      # not PHI, looks less like an ID
    "Hd": ("ID", 0.002, "ID"),     # hard IDs, only caught at the bottom of the grid
    "Pl": (None, 0.003, "ID"),     # plain words the model barely separates from hard IDs
    "Sp": (None, 0.99, "NAME"),    # confident false positives
    "Ww": (None, 0.0, "NAME"),     # ordinary words
    "Gh": ("ID", 0.0, "ID"),       # IDs no model scores (a fixed member's alone)
}


def make_note(note_id: str, patient: str, counts: dict[str, int], seed: int) -> Note:
    rng = random.Random(seed)
    words = [k + "".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 5)))
             for k, c in counts.items() for _ in range(c)]
    rng.shuffle(words)
    text, spans = "", []
    for w in words:
        if text:
            text += " "
        gold = KINDS[w[:2]][0]
        if gold:
            spans.append(Span(len(text), len(text) + len(w), gold))
        text += w
    return Note(note_id, text + ".\n", patient, spans=spans, labelled=True)


def make_notes(counts: dict[str, int], n: int = 10, patients: int = 5,
               extra: dict[str, dict[str, int]] | None = None) -> list[Note]:
    """``n`` notes of ``patients`` patients; ``extra`` adds word counts for some patients."""
    out = []
    for i in range(n):
        p = f"p{i % patients}"
        c = {**counts}
        for k, v in (extra or {}).get(p, {}).items():
            c[k] = c.get(k, 0) + v
        out.append(make_note(f"n{i}", p, c, seed=i))
    return out


class StubTagger:
    """``token_scores`` from the word kinds: one token per whitespace-separated word."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    def token_scores(self, notes: Sequence[Note], batch_size: int = 16,
                     marginals: bool = True) -> list[TokenScores]:
        self.calls += 1
        out = []
        for note in notes:
            words = [m for m in re.finditer(r"[^\s.]+", note.text)]
            offs = np.array([m.span() for m in words], dtype=np.int64).reshape(-1, 2)
            phi = np.array([KINDS[m.group()[:2]][1] for m in words])
            lp = np.array([[1.0 if lab == KINDS[m.group()[:2]][2] else 0.0 for lab in LABELS]
                           for m in words]).reshape(-1, len(LABELS)) * phi[:, None]
            out.append(TokenScores(offs, phi, lp, LABELS))
        return out


def stub_slot(name: str = "a") -> Slot:
    return Slot(ModelMember(StubTagger(name), name))


BASIC = {"Nm": 5, "Fn": 5, "Id": 5, "Fi": 5, "Ww": 10}
HARD = {"Nm": 5, "Id": 5, "Hd": 1, "Pl": 20, "Ww": 5}


def ensemble_pr(slots: Sequence[Slot], notes: Sequence[Note]) -> tuple[float, float]:
    row = evaluate_ensemble(Ensemble(list(slots)), notes)[-1]
    return row["precision"], row["recall"]


# ---------------------------------------------------------------------------- per label
def test_per_label_thresholds_beat_one_threshold_per_member() -> None:
    notes = make_notes(BASIC)
    slots = [stub_slot()]
    per_member = calibrate(Ensemble(slots), notes, 1.0, per_label=False)
    # one threshold must reach the IDs at 0.05 and so flags every name-like word at 0.3
    assert per_member.reached and per_member.label_thresholds == {}
    assert per_member.thresholds["a"] <= 0.05
    assert per_member.precision == pytest.approx(100 / 150)
    res = calibrate(Ensemble(slots), notes, 1.0)
    assert res.reached and res.recall == 1.0 and res.precision == 1.0
    lt = res.label_thresholds["a"]
    assert set(lt) == {"NAME", "ID"}
    assert 0.3 < lt["NAME"] <= 0.9 and 0.01 < lt["ID"] <= 0.05
    # what calibration measured is what the ensemble does with the thresholds at tag time
    assert ensemble_pr(res.apply(slots), notes) == pytest.approx((res.precision, res.recall))
    assert ensemble_pr(per_member.apply(slots), notes) == pytest.approx(
        (per_member.precision, per_member.recall))


def test_calibrated_figures_match_tag_time_with_a_fixed_member_and_rare_labels() -> None:
    notes = make_notes(BASIC)
    fixed = FixedMember("fixed", {n.id: [Span(0, 2, "OTHER")] for n in notes})
    slots = [stub_slot(), Slot(fixed)]
    # a support floor above both labels pools them: one shared threshold, no overrides
    pooled = calibrate(Ensemble(slots), notes, 1.0, min_label_tokens=1000)
    assert pooled.label_thresholds == {}
    res = calibrate(Ensemble(slots), notes, 0.95)
    for r in (pooled, res):
        assert ensemble_pr(r.apply(slots), notes) == pytest.approx((r.precision, r.recall))


def test_calibration_weighs_members_that_count_alone() -> None:
    """Under ``k-of-n:2+fixed`` the fixed member's flags hide words alone: calibration counts them
    so, as tag time does; counted as one vote they could never reach the K the rule asks."""
    notes = make_notes({**BASIC, "Gh": 2})
    ghosts = {n.id: [s for s in n.spans if n.text[s.start:s.start + 2] == "Gh"] for n in notes}
    slots = [stub_slot("a"), stub_slot("b"), Slot(FixedMember("fixed", ghosts))]
    rule = "k-of-n:2+fixed"
    res = calibrate(Ensemble(slots, rule), notes, 1.0)
    assert res.reached and res.recall == 1.0
    row = evaluate_ensemble(Ensemble(res.apply(slots), rule), notes)[-1]
    assert (row["precision"], row["recall"]) == pytest.approx((res.precision, res.recall))
    # one vote each: the ghost IDs, which no model scores, stay unreached
    plain = calibrate(Ensemble(slots, "k-of-n:2"), notes, 1.0)
    assert not plain.reached and plain.recall < 1.0


def test_label_thresholds_in_spans_from_scores() -> None:
    offs = np.array([[0, 2], [3, 5], [6, 8], [9, 11]])
    phi = np.array([0.4, 0.4, 0.1, 0.1])
    lp = np.array([[0.4, 0.0], [0.0, 0.4], [0.1, 0.0], [0.0, 0.1]])
    ts = TokenScores(offs, phi, lp, LABELS)
    got = spans_from_scores(ts, LabelThresholds(0.5, {"ID": 0.05}))
    assert [(s.start, s.end, s.label) for s in got] == [(3, 5, "ID"), (9, 11, "ID")]
    got = spans_from_scores(ts, LabelThresholds(0.3, {"ID": 0.3}))
    assert got == spans_from_scores(ts, 0.3)


def test_manifest_stores_label_thresholds_backward_compatibly(tmp_path: Path,
                                                               tiny_tagger_dir: Path) -> None:
    old = tmp_path / "old.toml"
    old.write_text('aggregate = "any"\n[[members]]\nname = "m"\nkind = "dir"\n'
                   f'path = "{tiny_tagger_dir}"\nthreshold = 0.3\n')
    m = Manifest.load(old)
    assert m.members[0].label_thresholds == {} and "label_thresholds" not in m.members[0].to_dict()
    slot = member_from_entry(m.members[0])
    assert slot.label_thresholds is None and slot.tag_threshold == 0.3
    m.members[0].label_thresholds = {"NAME": 0.2, "ID": 0.05}
    m.save(tmp_path / "new.toml")
    raw = tomllib.loads((tmp_path / "new.toml").read_text())
    assert raw["members"][0]["label_thresholds"] == {"NAME": 0.2, "ID": 0.05}
    entry = Manifest.load(tmp_path / "new.toml").members[0]
    slot = member_from_entry(entry)
    assert slot.tag_threshold == LabelThresholds(0.3, {"NAME": 0.2, "ID": 0.05})
    bad = tmp_path / "bad.toml"
    bad.write_text('[[members]]\nname = "m"\nkind = "dir"\n[members.label_thresholds]\nNAME = 2\n')
    with pytest.raises(ConfigError, match="label_thresholds"):
        Manifest.load(bad)


# ---------------------------------------------------------------------------- saying no
def test_refuses_when_the_target_costs_precision_below_the_floor() -> None:
    notes = make_notes(HARD)
    slots = [stub_slot()]
    # without a floor (the old behaviour) the target is met by flagging every plain word
    res = calibrate(Ensemble(slots), notes, 0.99)
    assert res.reached and res.precision == pytest.approx(110 / 310)
    with pytest.raises(CalibrationRefused) as e:
        calibrate(Ensemble(slots), notes, 0.99, min_precision=0.5)
    msg = str(e.value)
    assert e.value.exit_code == 2 and "\n" not in msg
    assert "costs precision 0.355 on the calibration notes" in msg
    assert "best reachable at precision >= 0.5: precision 1.000, recall 0.909" in msg
    forced = calibrate(Ensemble(slots), notes, 0.99, min_precision=0.5, force=True)
    assert forced.forced and forced.below_floor and forced.refusal() == msg
    # a target the floor allows is not refused
    ok = calibrate(Ensemble(slots), notes, 0.9, min_precision=0.5)
    assert not ok.below_floor and ok.precision == 1.0 and ok.best_reachable == (1.0, 100 / 110)


def test_holdout_reports_and_checks_the_chosen_thresholds() -> None:
    notes = make_notes(BASIC)
    cal_idx, held_idx = _holdout_split(notes, 0.3, seed=0)
    held_patients = {notes[i].patient_id for i in held_idx}
    cal_patients = {notes[i].patient_id for i in cal_idx}
    assert held_patients and not held_patients & cal_patients
    slots = [stub_slot()]
    res = calibrate(Ensemble(slots), notes, 1.0, holdout=0.3, min_precision=0.5)
    h = res.holdout
    assert h is not None and h.patients == len(held_patients) and h.notes == len(held_idx)
    assert res.notes == len(cal_idx) and res.patients == len(cal_patients)
    held = [notes[i] for i in held_idx]
    assert ensemble_pr(res.apply(slots), held) == pytest.approx((h.precision, h.recall))
    assert (h.precision, h.recall) == (1.0, 1.0)
    # the same thresholds on held-out patients full of confident false positives: refused
    bad = make_notes(BASIC, extra={p: {"Sp": 15} for p in held_patients})
    with pytest.raises(CalibrationRefused, match="on the held-out patients"):
        calibrate(Ensemble(slots), bad, 1.0, holdout=0.3, min_precision=0.5)
    with pytest.raises(InputError, match="at least 2 patients"):
        calibrate(Ensemble(slots), make_notes(BASIC, n=3, patients=1), 1.0, holdout=0.3)


# ---------------------------------------------------------------------------- CLI
def _cli_setup(tmp_path: Path, notes: list[Note], monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    src = tmp_path / "owner.jsonl"
    src.write_text("".join(json.dumps({"id": n.id, "text": n.text, "patient_id": n.patient_id,
                                       "spans": [s.to_dict() for s in n.spans]}) + "\n"
                           for n in notes))
    m = tmp_path / "ens.toml"
    Manifest([MemberEntry("a", "dir", path=str(tmp_path / "no-model"))]).save(m)
    import dphub.ensemble.core as core

    monkeypatch.setattr(core, "build_ensemble", lambda *a, **k: Ensemble([stub_slot()]))
    return str(src), m


def test_cli_refuses_with_one_line_and_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = make_notes(HARD)
    src, m = _cli_setup(tmp_path, notes, monkeypatch)
    before = m.read_bytes()
    capsys.readouterr()
    assert main(["ensemble", "calibrate", src, "--target-recall", "0.99", "--holdout", "0",
                 "--ensemble", str(m)]) == 2
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: target recall 0.99 costs precision")
    assert "best reachable at precision >= 0.5: precision 1.000, recall 0.909" in lines[0]
    assert "Traceback" not in cap.err and m.read_bytes() == before
    words = {w for n in notes for w in n.text.split()}
    assert not any(w in cap.err or w in cap.out for w in words)  # no note text
    # --force stores them, loudly
    assert main(["ensemble", "calibrate", src, "--target-recall", "0.99", "--holdout", "0",
                 "--force", "--ensemble", str(m)]) == 0
    cap = capsys.readouterr()
    assert "WARNING (--force)" in cap.err and "best reachable" in cap.err
    entry = tomllib.loads(m.read_text())["members"][0]
    assert entry["label_thresholds"]["ID"] <= 0.002


def test_cli_per_label_thresholds_and_holdout_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src, m = _cli_setup(tmp_path, make_notes(BASIC), monkeypatch)
    capsys.readouterr()
    assert main(["ensemble", "calibrate", src, "--target-recall", "1", "--ensemble", str(m)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"held-out check \(\d+ notes, \d+ patients\): token recall 1\.0000, "
                     r"precision 1\.0000", out)
    entry = tomllib.loads(m.read_text())["members"][0]
    assert set(entry["label_thresholds"]) == {"NAME", "ID"} and "threshold" in entry
    assert entry["label_thresholds"]["NAME"] > 0.3 and entry["label_thresholds"]["ID"] <= 0.05


class ScrambledTagger:
    """A real tiny tagger's word pieces (MiniLM WordPiece, windows merged) with seeded random
    scores and labels: multi-piece words, label changes inside runs, notes end to end."""

    def __init__(self, tagger_dir: Path) -> None:
        from dphub.tagger import Tagger

        self.tagger = Tagger.load(tagger_dir)
        self.name = "scrambled"
        self.cache: dict[str, TokenScores] = {}

    def token_scores(self, notes: Sequence[Note], batch_size: int = 16,
                     marginals: bool = True) -> list[TokenScores]:
        todo = [n for n in notes if n.id not in self.cache]
        for n, ts in zip(todo, self.tagger.token_scores(todo, marginals=False), strict=True):
            rng = np.random.default_rng(zlib.crc32(n.id.encode()))
            k = len(ts.labels)
            lp = rng.random((len(ts), k))
            self.cache[n.id] = TokenScores(ts.offsets, rng.random(len(ts)) ** 3, lp, ts.labels)
        return [self.cache[n.id] for n in notes]


def test_calibration_on_real_word_pieces_matches_tag_time(tiny_tagger_dir: Path) -> None:
    from dphub import synth
    from dphub.rules.engine import RuleMember

    notes = synth.generate(6, kind="nursing", seed=21, patients=3)
    slots = [Slot(ModelMember(ScrambledTagger(tiny_tagger_dir), "m")),
             Slot(RuleMember("rules:default"))]
    res = calibrate(Ensemble(slots), notes, 0.9, min_label_tokens=5, holdout=0.3)
    assert res.label_thresholds  # several labels got their own threshold
    cal_idx, held_idx = _holdout_split(notes, 0.3, seed=0)
    applied = res.apply(slots)
    assert ensemble_pr(applied, [notes[i] for i in cal_idx]) == pytest.approx(
        (res.precision, res.recall))
    h = res.holdout
    assert h is not None
    assert ensemble_pr(applied, [notes[i] for i in held_idx]) == pytest.approx(
        (h.precision, h.recall))


def test_members_on_one_tagger_score_the_notes_once() -> None:
    """One model listed twice (docs/owner.md's low-threshold recipe) shares one tagger: calibration
    runs it once, and finds what two separate copies of the model give."""
    notes = make_notes(BASIC)
    shared = StubTagger("m")
    res = calibrate(Ensemble([Slot(ModelMember(shared, "m")),
                              Slot(ModelMember(shared, "m-low"), 0.1)]), notes, 1.0)
    assert shared.calls == 1
    a, b = StubTagger("m"), StubTagger("m")
    want = calibrate(Ensemble([Slot(ModelMember(a, "m")), Slot(ModelMember(b, "m-low"), 0.1)]),
                     notes, 1.0)
    assert a.calls == b.calls == 1
    assert res == want
