"""Patient-disjoint splits: disjointness, ratios, determinism, bad options."""

from __future__ import annotations

from collections import Counter

import pytest

from dphub.errors import ConfigError, InputError
from dphub.notes import Note
from dphub.splits import assign_units, output_names, parse_ratios, split_notes


def _corpus(patients: int = 40, seed: int = 0) -> list[Note]:
    """Patients with 1..9 notes each (uneven, like real corpora); no text needed."""
    notes = []
    for p in range(patients):
        for k in range(1 + (p * 7 + seed) % 9):
            notes.append(Note(id=f"p{p}-{k}", text="x", patient_id=f"p{p}"))
    return notes


def test_patient_split_is_disjoint_complete_and_close_to_ratios() -> None:
    notes = _corpus()
    parts = split_notes(notes, [0.8, 0.2], by="patient", seed=0)
    pids = [{n.patient_id for n in part} for part in parts]
    assert not pids[0] & pids[1]
    assert sorted(n.id for part in parts for n in part) == sorted(n.id for n in notes)
    share = len(parts[0]) / len(notes)
    assert abs(share - 0.8) < 0.03, share


def test_three_way_split_ratios_and_input_order_kept() -> None:
    notes = _corpus(90)
    parts = split_notes(notes, [0.7, 0.2, 0.1], seed=5)
    for part, ratio in zip(parts, [0.7, 0.2, 0.1], strict=True):
        assert abs(len(part) / len(notes) - ratio) < 0.03
        order = [notes.index(n) for n in part]
        assert order == sorted(order)


def test_deterministic_by_seed_and_seed_matters() -> None:
    notes = _corpus()
    a = split_notes(notes, [0.5, 0.5], seed=1)
    b = split_notes(list(reversed(notes)), [0.5, 0.5], seed=1)
    assert {n.id for n in a[0]} == {n.id for n in b[0]}  # input order does not matter
    c = split_notes(notes, [0.5, 0.5], seed=2)
    assert {n.id for n in a[0]} != {n.id for n in c[0]}


def test_note_split_ignores_patients() -> None:
    notes = _corpus(3)
    parts = split_notes(notes, [0.5, 0.5], by="note", seed=0)
    assert abs(len(parts[0]) - len(parts[1])) <= 1
    assert {n.patient_id for n in parts[0]} & {n.patient_id for n in parts[1]}


def test_notes_without_patient_are_their_own_unit() -> None:
    notes = [Note(id=f"n{i}", text="x") for i in range(10)]
    parts = split_notes(notes, [0.8, 0.2])
    assert [len(p) for p in parts] == [8, 2]


def test_bad_ratios_and_too_few_units() -> None:
    assert parse_ratios("0.8,0.2") == [0.8, 0.2]
    for bad in ("0.8", "0.5,0.6", "1,-0", "a,b", "0.8,0.2,0"):
        with pytest.raises(ConfigError):
            parse_ratios(bad)
    with pytest.raises(InputError):
        assign_units(Counter({"p1": 3}), [0.5, 0.5])
    with pytest.raises(ConfigError):
        split_notes(_corpus(4), [0.5, 0.5], by="visit")


def test_output_names() -> None:
    assert output_names(2, None) == ["split-0", "split-1"]
    assert output_names(2, ["train", "test"]) == ["train", "test"]
    for bad in (["train"], ["a", "a"], ["../x", "y"], [".hidden", "y"]):
        with pytest.raises(ConfigError):
            output_names(2, bad)
