"""Corpus statistics on a tiny hand-made corpus (numbers checked by hand)."""

from __future__ import annotations

from dphub.notes import Note, Span
from dphub.stats import compute_stats


def _tiny() -> list[Note]:
    t1 = "Dr. Smith saw pt on 7/22."  # 25 chars
    t2 = "Wife Mary called 617-555-1234."  # 30 chars
    t3 = "No PHI here."  # 12 chars
    return [
        Note("a-1", t1, "a", spans=[Span(4, 9, "DOCTOR"), Span(20, 24, "DATE")], labelled=True),
        Note("a-2", t2, "a", spans=[Span(5, 9, "RelativeProxyName"), Span(17, 29, "PHONE")],
             labelled=True),
        Note("b-1", t3, "b", spans=[], labelled=True),
        Note("x", t3, None),
    ]


def test_counts_on_tiny_corpus() -> None:
    st = compute_stats(_tiny())
    assert st.notes == 4
    assert st.labelled_notes == 3
    assert st.patients == 2
    assert st.notes_without_patient == 1
    assert st.characters == 25 + 30 + 12 + 12
    assert st.phi_phrases == 4
    assert st.phi_characters == 5 + 4 + 4 + 12
    assert st.phi_per_category == {"NAME": 2, "DATE": 1, "CONTACT": 1}
    assert list(st.phi_per_category) == ["NAME", "DATE", "CONTACT"]  # schema order
    assert st.phi_per_label == {"DATE": 1, "DOCTOR": 1, "PHONE": 1, "RelativeProxyName": 1}
    assert st.word_pieces is None
    d = st.to_dict()
    assert d["phi_per_label"]["PHONE"] == 1 and d["tokenizer"] is None


def test_streams_a_generator_once() -> None:
    consumed = []

    def gen():
        for n in _tiny():
            consumed.append(n.id)
            yield n

    st = compute_stats(gen())
    assert st.notes == 4 and consumed == ["a-1", "a-2", "b-1", "x"]


def test_word_pieces_with_real_fast_tokenizer(tiny_base_model) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_base_model))
    notes = _tiny()
    expected = sum(len(tok.tokenize(n.text)) for n in notes)
    st = compute_stats(notes, tokenizer=tok, tokenizer_name="tiny", batch_size=3)
    assert st.word_pieces == expected > 20
    assert st.tokenizer == "tiny"


def test_overlapping_annotations_are_counted_as_they_are() -> None:
    text = "lives in North Andover Falls"
    notes = [Note("n", text, "p", spans=[Span(9, 22, "CITY"), Span(15, 28, "CITY")],
                  labelled=True)]
    st = compute_stats(notes)
    assert st.phi_phrases == 2 and st.phi_per_category == {"LOCATION": 2}
