"""Synthetic notes: determinism, coverage of every PHI category, exact spans, stable identities."""

from __future__ import annotations

import re
import time
from collections import defaultdict

import pytest

from dphub.errors import ConfigError
from dphub.labels import CATEGORIES, I2B2_SUBCATEGORIES, category_of
from dphub.notes import check_spans
from dphub.synth import KINDS, generate, iter_notes


@pytest.fixture(scope="module")
def corpora() -> dict[str, list]:
    return {kind: generate(200, kind=kind, seed=7) for kind in KINDS}


def _as_tuples(notes):
    return [(n.id, n.patient_id, n.text, n.metadata, [s.to_dict() for s in n.spans])
            for n in notes]


def test_same_seed_same_notes_and_iterator_agrees() -> None:
    a = generate(25, kind="nursing", seed=3)
    b = generate(25, kind="nursing", seed=3)
    assert _as_tuples(a) == _as_tuples(b)
    assert _as_tuples(list(iter_notes(25, kind="nursing", seed=3))) == _as_tuples(a)
    c = generate(25, kind="nursing", seed=4)
    assert [n.text for n in c] != [n.text for n in a]


@pytest.mark.parametrize("kind", KINDS)
def test_every_category_present_in_200_notes(corpora, kind: str) -> None:
    notes = corpora[kind]
    cats = {s.category for n in notes for s in n.spans}
    # OTHER is a catch-all that synth deliberately never produces
    assert cats == set(CATEGORIES) - {"OTHER"}
    labels = {s.label for n in notes for s in n.spans}
    assert labels <= set(I2B2_SUBCATEGORIES)
    assert {"PATIENT", "DOCTOR", "RELATIVE", "DATE", "AGE", "PHONE", "HOSPITAL", "CITY",
            "PROFESSION", "MEDICALRECORD"} <= labels


def test_discharge_covers_contact_id_and_address_labels(corpora) -> None:
    labels = {s.label for n in corpora["discharge"] for s in n.spans}
    assert {"FAX", "EMAIL", "URL", "IDNUM", "SSN", "HEALTHPLAN", "ACCOUNT", "STREET", "STATE",
            "ZIP", "COUNTRY", "LICENSE", "USERNAME", "DEPARTMENT"} <= labels


@pytest.mark.parametrize("kind", KINDS)
def test_spans_exact_sorted_and_non_overlapping(corpora, kind: str) -> None:
    for n in corpora[kind]:
        assert n.labelled and n.metadata == {"kind": kind} and n.patient_id
        checked = check_spans(n.spans, len(n.text), where=n.id)
        assert checked == n.spans  # already sorted
        for s in n.spans:
            piece = n.text[s.start : s.end]
            assert piece == piece.strip() and piece
            category_of(s.label)


def test_identities_are_consistent_within_a_patient(corpora) -> None:
    for notes in corpora.values():
        mrns: dict[str, set[str]] = defaultdict(set)
        names: dict[str, set[str]] = defaultdict(set)
        for n in notes:
            for s in n.spans:
                t = n.text[s.start : s.end]
                if s.label == "MEDICALRECORD":
                    mrns[n.patient_id].add(t)
                if s.label == "PATIENT":
                    names[n.patient_id].update(re.findall(r"[a-z]+", t.lower()))
        assert mrns and all(len(v) == 1 for v in mrns.values())
        # different patients have different record numbers
        assert len({next(iter(v)) for v in mrns.values()}) == len(mrns)
        # first name, last name, initials: never a fourth token for one patient
        assert names and all(len(v) <= 3 for v in names.values())
        assert len({frozenset(v) for v in names.values()}) > len(names) // 2


def test_several_notes_per_patient_and_patient_count() -> None:
    notes = generate(60, kind="nursing", seed=1, patients=12)
    assert len(notes) == 60
    assert len({n.patient_id for n in notes}) == 12
    assert len({n.id for n in notes}) == 60


def test_hard_forms_appear(corpora) -> None:
    nursing = corpora["nursing"]
    # ALL CAPS notes (lower-case names inside them are a deliberate hard form)
    upper = [n for n in nursing
             if sum(c.isupper() for c in n.text) > 0.9 * sum(c.isalpha() for c in n.text)]
    assert len(upper) > len(nursing) // 2  # nursing notes are mostly ALL CAPS
    spans = [(n, s, n.text[s.start : s.end]) for n in nursing + corpora["discharge"]
             for s in n.spans]
    names = {"PATIENT", "DOCTOR", "RELATIVE"}
    assert any(s.label in names and t.islower() and n in upper for n, s, t in spans)
    assert any(s.label == "PATIENT" and re.fullmatch(r"[A-Z]{2}", t) for _, s, t in spans)
    assert any(s.label == "DATE" and re.fullmatch(r"\d{1,2}/\d{1,2}", t) for _, s, t in spans)
    assert any(s.label == "DATE" and re.fullmatch(r"'\d\d", t) for _, s, t in spans)
    assert any(n.text[: s.start].rstrip().endswith(">") and t == "89"
               for n, s, t in spans if s.label == "AGE")
    assert any(n.text[s.end : s.end + 2].lower() == "yo" for n, s, _ in spans if s.label == "AGE")
    assert any(s.label == "HOSPITAL" and re.fullmatch(r"[A-Z]{2,5}", t) for _, s, t in spans)
    assert any(s.label == "ROOM" for _, s, _ in spans)


def test_non_phi_capitalised_words_are_not_labelled(corpora) -> None:
    for n in corpora["nursing"]:
        for s in n.spans:
            assert n.text[s.start : s.end].upper() not in {"FOLEY", "LASIX", "COUMADIN", "NEURO"}
    text = " ".join(n.text.upper() for n in corpora["nursing"])
    assert "FOLEY" in text or "LASIX" in text


def test_500_notes_under_5_seconds() -> None:
    t0 = time.perf_counter()
    notes = generate(500, kind="nursing", seed=2)
    assert len(notes) == 500
    assert time.perf_counter() - t0 < 5.0


def test_bad_arguments_raise_config_error() -> None:
    with pytest.raises(ConfigError):
        generate(5, kind="radiology")
    with pytest.raises(ConfigError):
        generate(3, patients=4)
    with pytest.raises(ConfigError):
        generate(-1)
    assert generate(0) == []
