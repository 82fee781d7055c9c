"""Issue 36 item 2: the models decide only the words that show no sign of a name.

A word that nothing vouches for (outside the vocabulary, no measurement) comes back when every
model is sure it is not PHI (P < LOW) *and* it shows no sign of a name: capitalised inside a
sentence, after a name cue, before a cue after a name, or in the name lists. A vouched word
with such a sign needs the stricter NAMED threshold when one is given. Each PHI shape the issue
names gets a test with a model that is wrongly sure (P = 0) under a generous rule.
"""

from __future__ import annotations

import re

import pytest

from dphub.ensemble.core import Ensemble
from dphub.ensemble.inverse import InverseRule, name_signs
from dphub.ensemble.inverse_calibrate import calibrate_inverse
from dphub.ensemble.words import WORD_RE
from dphub.errors import ConfigError
from dphub.notes import Note, Span
from dphub.safe_vocab import SafeVocabulary
from tests.test_inverse import fixed, hidden, model

WORDS = ("patient", "seen", "by", "dr", "with", "and", "today", "stable", "clinic", "went",
         "home", "the", "hospital", "shepherd", "transferred", "from", "spoke", "to", "effect",
         "arm", "swollen", "afebrile", "drains")
#: ordinary words that are also names (the shipped vocabulary keeps them apart the same way)
CONTEXT = ("good",)
#: a generous rule: anything a model gives P < 0.5 may come back
GENEROUS = "inverse:0.5,0.5"
#: the default LOW, HIGH and NAMED without SURE: the signs decide alone, however sure the model
#: (what SURE adds is in tests/test_inverse_sure.py)
THREE = "inverse:0.005,0.01,0.002"


def vocab() -> SafeVocabulary:
    return SafeVocabulary.from_words(WORDS, context=CONTEXT)


def sure(text: str, rule: str = GENEROUS) -> Ensemble:
    """Rules that flag nothing and a model wrongly sure that every word is not PHI."""
    probs = {w: 0.0 for w in re.findall(r"[^\W_]+", text)}
    return Ensemble([fixed("rules", "a", []), model(probs)], rule, safe_vocab=vocab())


def signs(text: str) -> list[str]:
    found = list(WORD_RE.finditer(text))
    return [found[i].group() for i in sorted(name_signs(text, found, vocab()))]


def test_signs_of_a_name() -> None:
    assert signs("patient Zorbak stable") == ["Zorbak"]  # a capital inside a sentence
    assert signs("Zorbak went home") == []  # a capital at the line's start
    assert signs("stable. Zorbak went home") == []  # ... or after a sentence's end
    assert "zorbak" in signs("spoke with zorbak today")  # after a cue
    assert "zorbak" in signs("zorbak md went home")  # before a cue after a name
    assert "john" in signs("patient john stable")  # in the first-name list
    # read as the vocabulary reads words: a fullwidth cue or a look-alike name is still one
    assert "zorbak" in signs("spoke \uff57\uff49\uff54\uff48 zorbak today")
    assert "\u0458ohn" in signs("patient \u0458ohn stable")  # Cyrillic je for the j
    assert signs("patient stable today") == []


@pytest.mark.parametrize("text, phi", [
    ("seen by dr Good today", "Good"),  # a surname that is an ordinary word
    ("seen by dr good today", "good"),  # ... in lower case
    ("patient Zorbak stable", "Zorbak"),  # a capitalised unknown word inside a sentence
    ("spoke with zorbak today", "zorbak"),  # a name written in lower case, after a cue
    ("patient john stable", "john"),  # a first name in lower case
    ("seen by J Zorbak today", "J"),  # an initial before a surname
    ("seen by J Zorbak today", "Zorbak"),
    ("transferred from Good Shepherd Hospital today", "Shepherd"),  # ordinary words
])
@pytest.mark.parametrize("rule", [GENEROUS, THREE])  # ... and the defaults without SURE
def test_phi_shapes_stay_hidden_when_the_model_is_wrongly_sure(text: str, phi: str,
                                                               rule: str) -> None:
    got = " ".join(t for t, _ in hidden(sure(text, rule), Note("a", text)))
    assert phi in got.split(), (text, got)


def test_a_word_without_a_sign_comes_back_when_the_model_is_sure() -> None:
    text = "patient stable, sob resolved today"
    assert hidden(sure(text), Note("a", text)) == []
    # with rules alone nothing vouches for the unknown words
    rules_only = Ensemble([fixed("rules", "a", [])], GENEROUS, safe_vocab=vocab())
    assert hidden(rules_only, Note("a", text)) == [("sob resolved", "PHI")]


def test_named_threshold_applies_only_to_vouched_words_with_a_sign() -> None:
    probs = {"Stable": 0.005, "stable": 0.005}
    ens = Ensemble([fixed("rules", "a", []), model({**probs, "patient": 0.0, "today": 0.0,
                                                    "went": 0.0, "home": 0.0})],
                   "inverse:0.01,0.01,0.002", safe_vocab=vocab())
    # capitalised inside the sentence: NAMED (0.002) applies, P 0.005 hides it
    assert hidden(ens, Note("a", "patient Stable today")) == [("Stable", "PHI")]
    # the same P without a sign: HIGH (0.01) applies
    assert hidden(ens, Note("a", "patient stable today")) == []
    # without a third value NAMED is HIGH: a rule stored before keeps its meaning
    ens.rule = InverseRule.parse("inverse:0.01,0.01")
    assert hidden(ens, Note("a", "patient Stable today")) == []


def test_signs_change_nothing_without_a_model() -> None:
    """Without a model member P says nothing: the vocabulary vouches alone, as before."""
    ens = Ensemble([fixed("rules", "a", [])], "inverse:0,0.002,0", safe_vocab=vocab())
    assert hidden(ens, Note("a", "seen by dr today")) == []


def test_parse_and_print_the_third_value() -> None:
    rule = InverseRule.parse("inverse:0.005,0.01,0.002")
    assert (rule.low, rule.high, rule.named) == (0.005, 0.01, 0.002)
    assert str(rule) == "inverse:0.005,0.01,0.002"
    assert str(InverseRule.parse("inverse:0.005,0.01")) == "inverse:0.005,0.01"
    for bad in ("inverse:0.1,0.2,1.5", "inverse:0.1,0.2,", "inverse:0.1,0.2,0.1,0.1,0.1",
                "inverse:0.1,0.2,0.1,2", "inverse:0.1,0.2,0.1,"):
        with pytest.raises(ConfigError, match="NAMED"):
            InverseRule.parse(bad)


def test_calibration_chooses_a_stricter_named_threshold() -> None:
    """A PHI vocabulary word with a sign of a name that the model half-suspects (P 0.05) while
    it is unsure of every other word (P 0.1): only NAMED below 0.05 keeps the other words and
    hides it."""
    text = "patient stable today Stable home"
    notes = [Note(f"n{i}", text, f"p{i}", spans=[Span(21, 27, "NAME")], labelled=True)
             for i in range(4)]
    probs = {"patient": 0.1, "stable": 0.1, "today": 0.1, "Stable": 0.05, "home": 0.1}
    ens = Ensemble([model(probs)], "inverse", safe_vocab=vocab())
    res = calibrate_inverse(ens, notes, 1.0)
    rule = InverseRule.parse(res.rule)
    assert res.recall == 1.0 and res.precision == 1.0
    assert rule.named is not None and rule.named <= 0.05 < 0.1 < rule.high


def test_a_clitic_is_no_initial() -> None:
    """``pt's good``: the ``s`` of a clitic signs nothing; an initial still does."""
    for text in ("patient's good uo", "patient\u2019s good uo", "don't good uo",
                 "patient`s good uo", "patient\uff07s good uo"):  # a backtick, a fullwidth one
        assert "good" not in signs(text), text
    assert "good" in signs("patient s good uo")  # a letter alone is still an initial
    assert "ZORBAK" in signs("SAID 'J ZORBAK' TODAY")  # ... and one after an opening quote
    assert "ZORBAK" in signs("PATIENT E\u200b ZORBAK TODAY")  # a zero-width space in the gap


def test_signs_after_an_initial() -> None:
    assert signs("patient j. zorbak today") == ["zorbak"]
    assert signs("PATIENT STABLE E ZORBAK TODAY") == ["ZORBAK"]
    # read as the vocabulary reads words: a no-break space, a fullwidth stop or initial
    assert signs("patient j\u00a0zorbak today") == ["zorbak"]
    assert signs("patient j\uff0e zorbak today") == ["zorbak"]
    assert signs("patient \uff4a zorbak today") == ["zorbak"]
    assert signs("patient \uff41 zorbak today") == []  # a fullwidth article is still one
    # no initial: an article, shorthand's letters, a unit after a number
    assert signs("patient a zorbak today") == []
    assert signs("patient s/p zorbak today") == []
    assert signs("given 2 l zorbak today") == []


def _context_ensemble(probs: dict[str, float], rule: str = THREE) -> Ensemble:
    return Ensemble([fixed("rules", "a", []), model(probs)], rule, safe_vocab=vocab())


@pytest.mark.parametrize("text, unknown", [
    ("good uo today", "uo"),  # lower case: written as a word; no neighbour releases it
    ("STABLE TODAY GOOD UO", "UO"),  # in capitals, in a line of capitals
])
def test_a_context_word_comes_back_when_the_model_is_sure_and_nothing_signs_it(
        text: str, unknown: str) -> None:
    probs = {w: 0.0 for w in re.findall(r"[^\W_]+", text)}
    probs[unknown] = 0.3  # the model is unsure of the unknown word: it stays hidden
    got = [t for t, _ in hidden(_context_ensemble(probs), Note("a", text))]
    assert got == [unknown], got
    # with rules alone only the neighbours can release it
    rules_only = Ensemble([fixed("rules", "a", [])], "inverse", safe_vocab=vocab())
    assert "good" in " ".join(t for t, _ in hidden(rules_only, Note("a", text))).lower()


@pytest.mark.parametrize("text, phi", [
    ("seen by good today", "good"),  # after a name cue
    ("Good went home", "Good"),  # capitalised: a sentence's start, or a name
    ("patient GOOD uo today", "GOOD"),  # capitals in a line that is not in capitals
    ("patient e good uo", "good"),  # after an initial
    ("good md today", "good"),  # before a cue after a name
])
def test_a_context_word_that_may_be_a_name_stays_hidden_when_the_model_is_sure(
        text: str, phi: str) -> None:
    probs = {w: 0.0 for w in re.findall(r"[^\W_]+", text)}
    got = " ".join(t for t, _ in hidden(_context_ensemble(probs), Note("a", text)))
    assert phi in got.split(), (text, got)


def test_a_context_word_needs_the_named_threshold() -> None:
    text = "good uo today"
    for p, rule, back in ((0.0015, "inverse", True),  # the default NAMED is 0.002
                          (0.005, "inverse", False),  # ... below the default HIGH (0.01)
                          (0.005, "inverse:0,0.01", True),  # no NAMED: HIGH applies
                          (0.005, "inverse:0,0.01,0.001", False),  # NAMED, not HIGH, applies
                          (0.0005, "inverse:0,0.01,0.001", True)):
        ens = _context_ensemble({"good": p, "uo": 0.0, "today": 0.0}, rule)
        got = [t for t, _ in hidden(ens, Note("a", text))]
        assert ("good" not in " ".join(got)) is back, (p, rule, got)


@pytest.mark.parametrize("text, phi", [
    ("Zorbak went home", "Zorbak"),  # capitalised at a line's start: no sign, still a capital
    ("stable. Zorbak went home", "Zorbak"),
    ("patient ZORBAK stable", "ZORBAK"),  # capitals in a line that is not in capitals
])
@pytest.mark.parametrize("rule", [GENEROUS, THREE])
def test_a_model_lets_back_only_unknown_words_in_lower_case(text: str, phi: str,
                                                            rule: str) -> None:
    got = " ".join(t for t, _ in hidden(sure(text, rule), Note("a", text)))
    assert phi in got.split(), (text, got)
    lower = text.lower()
    assert phi.lower() not in " ".join(t for t, _ in hidden(sure(lower, rule),
                                                            Note("a", lower)))


def test_an_unknown_word_in_a_line_of_capitals_needs_the_named_threshold_too() -> None:
    """In a note written in capitals a capital says nothing, so an unknown word there comes back
    only at P below both LOW and NAMED (default 0.005 and 0.002), and never with a sign."""
    for text, p, back in (("PATIENT STABLE ZORBAK", 0.001, True),
                          ("PATIENT STABLE ZORBAK", 0.003, False),  # below LOW, not NAMED
                          ("patient stable zorbak", 0.003, True),  # lower case: LOW alone
                          ("SEEN BY ZORBAK TODAY", 0.0, False),  # after a cue
                          ("PATIENT E ZORBAK", 0.0, False)):  # after an initial
        probs = {w: 0.0 for w in re.findall(r"[^\W_]+", text)}
        probs[text.split()[2]] = p
        ens = Ensemble([fixed("rules", "a", []), model(probs)], "inverse", safe_vocab=vocab())
        got = " ".join(t for t, _ in hidden(ens, Note("a", text)))
        assert ("zorbak" not in got.lower()) is back, (text, p, got)


@pytest.mark.parametrize("text, back", [
    ("stable to good effect", True),  # after a function word: the models decide (P < NAMED)
    ("stable and good today", True),
    ("stable good and today", True),  # ... before one
    ("good md today", False),  # before a cue after a name of a role
    ("spoke with good today", False),  # after a cue of a person's role: a sign
    ("seen by good today", False),
    ("stable to Good effect", False),  # capitalised inside a sentence: a sign
    ("STABLE TO GOOD EFFECT", False),  # in a line of capitals the function word still signs
    ("transferred to good shepherd hospital", False),  # part of an institution's name
    ("transferred to good\u00a0shepherd hospital", False),  # ... with a no-break space
    ("transferred to good\u200b shepherd hospital", False),  # ... or a zero-width one
])
def test_a_function_word_signs_no_lower_case_context_word(text: str, back: bool) -> None:
    probs = {w: 0.0 for w in re.findall(r"[^\W_]+", text)}
    got = " ".join(t for t, _ in hidden(_context_ensemble(probs), Note("a", text)))
    assert ("good" not in got.lower()) is back, (text, got)
    # the models must still be sure of it: P below NAMED (0.002), not HIGH (0.01)
    probs = {**probs, "good": 0.005, "Good": 0.005, "GOOD": 0.005}
    got = " ".join(t for t, _ in hidden(_context_ensemble(probs), Note("a", text)))
    assert "good" in got.lower(), (text, got)


@pytest.mark.parametrize("text, letter, back", [
    ("R arm swollen", "R", True),  # a side before a vocabulary word
    ("drains R 2 today", "R", True),  # a letter before a number
    ("stable O: afebrile", "O", True),  # a heading's letter before a vocabulary word
    ("J smith today", "J", False),  # an initial before a name of the name lists
    ("J zorbak today", "J", False),  # ... before an unknown word
    ("E good today", "E", False),  # ... before a context word
    ("J. arm today", "J", False),  # an initial's full stop
    ("seen by R arm", "R", False),  # after a name cue: a sign of a name itself
])
def test_a_single_capital_before_a_word_or_number_is_decided_as_lower_case(
        text: str, letter: str, back: bool) -> None:
    probs = {w: 0.0 for w in re.findall(r"[^\W_]+", text)}
    got = " ".join(t for t, _ in hidden(_context_ensemble(probs), Note("a", text)))
    assert (letter not in re.findall(r"[^\W_]+", got)) is back, (text, got)
    if back:  # a model that is not sure enough (P >= LOW, 0.005) hides it, as do rules alone
        got = " ".join(t for t, _ in hidden(_context_ensemble({**probs, letter: 0.005}),
                                            Note("a", text)))
        assert letter in re.findall(r"[^\W_]+", got), (text, got)
        rules_only = Ensemble([fixed("rules", "a", [])], "inverse", safe_vocab=vocab())
        got = " ".join(t for t, _ in hidden(rules_only, Note("a", text)))
        assert letter in re.findall(r"[^\W_]+", got), (text, got)
