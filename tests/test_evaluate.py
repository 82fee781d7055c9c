"""Hand-checked metrics for dphub.evaluate."""

from __future__ import annotations

import pytest

from dphub.errors import InputError
from dphub.evaluate import evaluate, evaluate_spans, render_markers
from dphub.notes import Note, Span

TEXT = "Pt John Smith seen 7/22 by Dr Adams at GH."
#       0123456789012345678901234567890123456789012
# John 3-7, Smith 8-13, 7/22 19-23, Adams 30-35, GH 39-41


def gold_note() -> Note:
    return Note(
        id="n1",
        text=TEXT,
        patient_id="p1",
        spans=[
            Span(3, 13, "PATIENT"),
            Span(19, 23, "DATE"),
            Span(30, 35, "DOCTOR"),
            Span(39, 41, "HOSPITAL"),
        ],
        labelled=True,
    )


def test_perfect_prediction_scores_one():
    g = gold_note()
    r = evaluate([g], {"n1": list(g.spans)})
    assert r.token["precision"] == r.token["recall"] == r.token["f1"] == 1.0
    assert r.entity_strict["micro"]["f1"] == 1.0
    assert r.phrase_recall["any_overlap"] == r.phrase_recall["full_cover"] == 1.0
    assert r.utility["bleu"] == pytest.approx(100.0)
    assert r.utility["non_phi_tokens_kept"] == 1.0
    assert r.leaks == []


def test_empty_prediction():
    r = evaluate([gold_note()], {"n1": []})
    # gold tokens: John Smith 7 22 Adams GH = 6
    assert r.token["tp"] == 0 and r.token["fn"] == 6 and r.token["fp"] == 0
    assert r.token["recall"] == 0.0
    assert r.phrase_recall["any_overlap"] == 0.0
    assert len(r.leaks) == 4
    assert all(leak.text is None for leak in r.leaks)


def test_hand_checked_partial_prediction():
    pred = [
        Span(3, 7, "NAME"),  # only "John": phrase hit (any) but not fully covered
        Span(19, 23, "DATE"),  # strict match
        Span(26, 29, "NAME"),  # "Dr " -> false positive token "Dr"
        Span(39, 41, "DATE"),  # GH caught with the wrong category
    ]
    r = evaluate([gold_note()], {"n1": pred})
    # gold PHI tokens: John Smith 7 22 Adams GH (6); predicted tokens: John 7 22 Dr GH (5)
    assert (r.token["tp"], r.token["fp"], r.token["fn"]) == (4, 1, 2)
    assert r.token["precision"] == pytest.approx(4 / 5)
    assert r.token["recall"] == pytest.approx(4 / 6)
    # phrases: PATIENT any-hit, not full; DATE full; DOCTOR missed; HOSPITAL full (label-agnostic)
    assert r.phrase_recall["any_overlap"] == pytest.approx(3 / 4)
    assert r.phrase_recall["full_cover"] == pytest.approx(2 / 4)
    # strict per category: DATE tp=1 (7/22) fp=1 (GH as DATE); NAME fp=2 fn=2
    s = r.entity_strict["per_category"]
    assert (s["DATE"]["tp"], s["DATE"]["fp"], s["DATE"]["fn"]) == (1, 1, 0)
    assert (s["NAME"]["tp"], s["NAME"]["fp"], s["NAME"]["fn"]) == (0, 2, 2)
    # relaxed NAME: John overlaps the PATIENT phrase -> gold hit 1 of 2, pred hit 1 of 2
    rel = r.entity_relaxed["per_category"]["NAME"]
    assert (rel["tp"], rel["fp"], rel["fn"]) == (1, 1, 1)
    # binary relaxed: gold phrases overlapped 3 of 4; predictions overlapping no gold: "Dr"
    b = r.entity_binary["relaxed"]
    assert (b["tp"], b["fp"], b["fn"]) == (3, 1, 1)
    leaks = {(leak.start, leak.end): leak for leak in r.leaks}
    assert set(leaks) == {(3, 13), (30, 35)}
    assert leaks[(3, 13)].covered == pytest.approx(4 / 9)
    # non-PHI tokens: Pt seen by Dr at = 5, one (Dr) flagged
    assert r.utility["non_phi_tokens_kept"] == pytest.approx(4 / 5)
    assert r.utility["bleu"] < 100


def test_leak_text_only_when_asked():
    r = evaluate([gold_note()], {"n1": []}, show_leaks=True)
    assert {leak.text for leak in r.leaks} == {"John Smith", "7/22", "Adams", "GH"}
    d = evaluate([gold_note()], {"n1": []}).to_dict()
    assert "John" not in str(d)


def test_missing_and_extra_notes():
    r = evaluate_spans([gold_note()], {})
    assert r.missing_predictions == 1 and r.token["recall"] == 0.0
    with pytest.raises(InputError, match="no gold counterpart"):
        evaluate_spans([gold_note()], {"n1": [], "other": []})
    r = evaluate_spans([gold_note()], {"n1": [], "other": []}, ignore_extra=True)
    assert r.notes == 1


def test_unlabelled_gold_is_an_error():
    n = Note(id="x", text="abc")
    with pytest.raises(InputError, match="labelled"):
        evaluate_spans([n], {"x": []})


def test_render_markers():
    assert render_markers("Hi John!", [Span(3, 7, "PATIENT")]) == "Hi [**NAME**]!"
    assert render_markers("abcdef", [Span(0, 3, "DATE"), Span(2, 5, "DATE")]) == "[**DATE**]f"


def test_unicode_tokens():
    n = Note(id="u", text="Señor Müller 12", spans=[Span(6, 12, "PATIENT")], labelled=True)
    r = evaluate([n], {"u": [Span(6, 12, "NAME")]})
    assert r.token["tp"] == 1 and r.token["fp"] == 0
    assert r.utility["non_phi_tokens_kept"] == 1.0
