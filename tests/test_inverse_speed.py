"""Issue 55: the inverse rule's per-word lookups take a fast path for printable ASCII words; it
must give exactly the form the full normalisation gives, for every word."""

from __future__ import annotations

import string
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from dphub.safe_vocab import SafeVocabulary, normalize_word
from dphub.textnorm import normalized_text


def _slow(word: str) -> str:
    return unicodedata.normalize("NFC", normalized_text(word)).lower()


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=12))
def test_ascii_fast_path_is_the_full_normalisation(word: str) -> None:
    assert normalize_word(word) == _slow(word)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=8))
def test_any_word_is_normalised_as_before(word: str) -> None:
    assert normalize_word(word) == _slow(word)


def test_controls_and_lookalikes_still_take_the_full_path() -> None:
    for word in ("Smith", "SMITH", "O'Neil", "x\x00y", "a\tb", "\x7fab", "Ｓｍｉｔｈ", "Smіth",
                 "e\u0301", string.printable):
        assert normalize_word(word) == _slow(word)
    vocab = SafeVocabulary.from_words(["fever", "cough"], context=["rose"])
    assert "FEVER" in vocab and "ｆｅｖｅｒ" in vocab and vocab.is_context("Rose")
