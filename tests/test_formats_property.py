"""Property test: any text built from awkward pieces, with any disjoint spans, round-trips exactly
through the formats that carry text verbatim."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dphub import formats
from dphub.errors import FormatError
from dphub.notes import Note, Span

PIECES = ["a", "Zoë", " ", "  ", "\n", "\r\n", "\r", "\t", "]]>", "<b>", "&amp;", '"', "'",
          "😀", "|", "||||", "x1", "-", "START_OF_RECORD=1||||1||||"]
LABELS = ["PATIENT", "DATE", "HCPName", "Location", "PHONE", "NAME", "AGE"]


@st.composite
def notes(draw: st.DrawFn) -> list[Note]:
    out = []
    for k in range(draw(st.integers(1, 3))):
        text = "".join(draw(st.lists(st.sampled_from(PIECES), min_size=1, max_size=30)))
        cuts = sorted(draw(st.sets(st.integers(0, len(text)), max_size=8)))
        spans = [Span(a, b, draw(st.sampled_from(LABELS)))
                 for a, b in zip(cuts[::2], cuts[1::2], strict=False) if b > a]
        out.append(Note(f"7-{k}", text, "7", {}, spans, labelled=True))
    return out


TARGETS = {"jsonl": "n.jsonl", "brat": "brat", "i2b2": "xml", "physionet": "c/id.text"}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(notes())
def test_verbatim_formats_round_trip_any_text(sample: list[Note]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for fmt, target in TARGETS.items():
            out = Path(tmp, target)
            formats.write(sample, out, fmt)
            back = list(formats.read(out, fmt))
            assert [(n.id, n.text, n.patient_id, n.spans) for n in back] == [
                (n.id, n.text, n.patient_id, n.spans) for n in sample
            ], fmt


def test_empty_note_is_refused_by_brat_and_text_writers(tmp_path: Path) -> None:
    empty = Note("e", "", None, {}, [], labelled=True)
    for fmt in ("brat", "text"):
        with pytest.raises(FormatError, match="empty text"):
            formats.write([empty], tmp_path / fmt, fmt)
        assert not (tmp_path / fmt).exists()
    formats.write([empty], tmp_path / "e.jsonl", "jsonl")
    assert [n.text for n in formats.read(tmp_path / "e.jsonl")] == [""]
