"""Issue 36 item 2, the fourth value SURE: a model that is very sure decides the rest.

Under ``inverse:LOW,HIGH,NAMED,SURE`` (``inverse`` alone: SURE 0.0005) any word that no member
flags comes back when every model gives it P(PHI) < SURE — a capitalised or unknown word, a
word with a weak sign of a name, a number outside every measurement — unless its shape alone
refuses it: a strong sign of a name, an initial, a number that could be a date, an age, an ID
or a phone, an institution's or a title's name. Each refused shape gets a test with a model
that is wrongly sure (P = 0); each release a test at P just below SURE and at SURE itself.
"""

from __future__ import annotations

import re

import pytest

from dphub.ensemble.core import Ensemble
from dphub.ensemble.inverse import (
    DEFAULT_SURE,
    InverseRule,
    initial_letters,
    strong_name_signs,
)
from dphub.ensemble.measures import refused_numbers
from dphub.ensemble.words import WORD_RE
from dphub.errors import ConfigError
from dphub.notes import Note
from dphub.safe_vocab import SafeVocabulary
from tests.test_inverse import fixed, hidden, model

WORDS = ("patient", "seen", "by", "dr", "with", "and", "today", "stable", "went", "home",
         "spoke", "to", "aware", "transferred", "of", "med", "center", "heart", "cross", "hosp",
         "noted", "placed", "in", "follow", "up", "on", "male", "main", "st", "states", "reports", "mi", "mg", "given",
         "cell", "md", "pmh", "bp", "abg", "rr", "was", "ii", "since", "call", "notified")
CONTEXT = ("good",)
#: the defaults without SURE (what each release is measured against)
THREE = "inverse:0.005,0.01,0.002"


def vocab() -> SafeVocabulary:
    return SafeVocabulary.from_words(WORDS, context=CONTEXT)


def ensemble(text: str, rule: str = "inverse", p: dict[str, float] | None = None,
             *, with_model: bool = True) -> Ensemble:
    """Rules that flag nothing and (``with_model``) a model that gives every word P = 0 but
    those in ``p``."""
    probs = {w: 0.0 for w in re.findall(r"[^\W_]+", text)} | (p or {})
    members = [fixed("rules", "a", [])] + ([model(probs)] if with_model else [])
    return Ensemble(members, rule, safe_vocab=vocab())


def hidden_words(text: str, rule: str = "inverse", p: dict[str, float] | None = None,
                 *, with_model: bool = True) -> list[str]:
    got = hidden(ensemble(text, rule, p, with_model=with_model), Note("a", text))
    return re.findall(r"[^\W_]+", " ".join(t for t, _ in got))


@pytest.mark.parametrize("text, word", [
    ("Zorbak went home", "Zorbak"),  # capitalised at a line's start: a weak sign
    ("stable. Zorbak went home", "Zorbak"),  # ... after a sentence's end
    ("spoke with zorbak today", "zorbak"),  # after a common cue
    ("patient ZORBAK stable", "ZORBAK"),  # capitals in a line that is not in capitals
    ("Good went home", "Good"),  # a context word with a weak sign
    ("patient stable, 250 today", "250"),  # a number outside every measurement
])
def test_a_weak_sign_comes_back_only_below_sure(text: str, word: str) -> None:
    assert word in hidden_words(text, THREE), "the three-value rule hides it"
    assert word not in hidden_words(text), "P = 0 < SURE: it comes back"
    below = {word: DEFAULT_SURE * 0.99}
    at = {word: DEFAULT_SURE}
    assert word not in hidden_words(text, p=below)
    assert word in hidden_words(text, p=at), "P = SURE is not below SURE"
    # without a model member nothing is sure: SURE releases nothing
    assert word in hidden_words(text, with_model=False)


@pytest.mark.parametrize("text, phi", [
    ("seen by dr Good today", "Good"),  # after a title
    ("seen by dr good today", "good"),
    ("seen by Mr I today", "I"),  # a title's single letter
    ("patient Zorbak stable", "Zorbak"),  # a capital inside a sentence
    ("spoke to Zorbak, md today", "Zorbak"),
    ("patient john stable", "john"),  # in the name lists
    ("seen by J Zorbak today", "J"),  # an initial and the name after it
    ("seen by J Zorbak today", "Zorbak"),
    ("seen by J.R. Smith today", "J"),  # a dotted group before a name
    ("seen by J.R. Smith today", "R"),
    ("PATIENT SEEN. E. BROWN AWARE", "E"),  # an initial in a line of capitals
    ("PATIENT SEEN. E. BROWN AWARE", "BROWN"),
    ("U Xyz stable", "U"),  # an initial at a line's start
    ("U Xyz stable", "Xyz"),
    ("stable --J.", "J"),  # a signature's initial
    ("GIVEN HEPARIN-K. ZORBAK AWARE", "K"),  # an initial after a dash
    ("BP 4.2. K. ZORBAK AWARE", "K"),  # ... after a number that ends a sentence
    ("BP 4.2. K. ZORBAK AWARE", "ZORBAK"),
    ("Zorbak-Smith md went home", "Zorbak"),  # the other half of a name with a strong sign
    ("Zorbak Smith went home", "Zorbak"),
    ("spoke to zorbak cell today", "zorbak"),  # before a phone's word
    ("seen by zorbak today", "zorbak"),  # after an agent's preposition (no common cue)
    ("transferred to U of Xyz Med Center", "Xyz"),  # across "of" to an institution's head
    ("transferred to U of Xyz Med Center", "U"),
    ("transferred to sacred heart hosp", "sacred"),  # "holy", "sacred" and the word after
    ("transferred to Holy Cross today", "Cross"),
])
def test_a_strong_shape_stays_hidden_however_sure_the_model(text: str, phi: str) -> None:
    assert phi in hidden_words(text), (text, hidden_words(text))
    # ... and under any SURE, even 1 (a model would have to flag it itself)
    assert phi in hidden_words(text, "inverse:0.005,0.01,0.002,1"), text


@pytest.mark.parametrize("text, back", [
    ("dr aware", "aware"),  # a lower-case vocabulary word after a title: the doctor is
    ("dr notified", "notified"),
    ("patient a zorbak today", "a"),  # an article is no initial
    ("stable N.G. placed", "N"),  # a dotted abbreviation before an ordinary word
    ("given 80'S. stable", "S"),  # a letter glued to a number
])
def test_no_false_shape_refuses_an_ordinary_word(text: str, back: str) -> None:
    assert back not in hidden_words(text), (text, hidden_words(text))


def _covered(text: str) -> list[str]:
    ranges = refused_numbers(text)
    return [m.group() for m in WORD_RE.finditer(text)
            if any(a <= m.start() < b for a, b in ranges)]


@pytest.mark.parametrize("text, refused", [
    ("follow up 3/10", ["3", "10"]),  # a date
    ("follow up on 4/17.89", ["4", "17", "89"]),  # a date with a year after a point
    ("follow up 6.25", ["6", "25"]),  # a dotted date
    ("call 555-0143", ["555", "0143"]),  # a phone
    ("call 617 555 0143", ["617", "555", "0143"]),
    ("patient reports 17", ["17"]),  # alone below 100: a day or a two-digit year
    ("mi in 87 and 03", ["87", "03"]),
    ("patient was mi 1992 stable", ["1992"]),  # a year
    ("mi since 1870", ["1870"]),  # four digits after a preposition of time
    ("patient 67 male", ["67"]),  # before a sex's word
    ("patient 92yo", ["92yo"]),  # an age glued
    ("st 12 Main st", ["12"]),  # before a capitalised word: an address
    ("patient 123456 today", ["123456"]),  # five digits or more: an ID
    ("patient 3rd today", ["3rd"]),  # an ordinal
    ("PMH: mi 115/43 given", ["115", "43"]),  # anything in a section of past events
])
def test_numbers_whose_shape_refuses_them(text: str, refused: list[str]) -> None:
    assert _covered(text) == refused, (text, _covered(text))
    # SURE lets none of them back: what a measurement's context does not vouch for stays hidden
    numbers = [w for w in re.findall(r"[^\W_]+", text) if any(c.isdigit() for c in w)]
    assert [w for w in hidden_words(text) if w in numbers] == \
        [w for w in hidden_words(text, THREE) if w in numbers], text


def test_sure_refuses_what_it_would_otherwise_release() -> None:
    """The same number comes back at P = 0 where no shape refuses it, and not where one does:
    the test fails if SURE ignores the refusal."""
    assert "250" not in hidden_words("patient stable, 250 today")
    for text in ("patient stable, 250 Main today", "PMH: mi 250 today", "call 555 250 1234",
                 "patient stable, 250 male"):
        assert "250" in hidden_words(text), text
    # a section of past events ends at a blank line
    assert hidden_words("PMH: mi 250 given\n\nstable 250").count("250") == 1


@pytest.mark.parametrize("text", [
    "abg 89-100/50 today",  # a range and a setting: no month, no day
    "abg 7.41/55/134 today",
    "bp 115/43- 131/46 stable",
])
def test_numbers_no_shape_refuses_are_left_to_the_models(text: str) -> None:
    assert _covered(text) == [], (text, _covered(text))


@pytest.mark.parametrize("text", [
    "follow up 3\u200b/10",  # a zero-width space inside a date
    "follow up 3/\u00a010",  # a no-break space beside the slash
    "follow up \uff13/\uff11\uff10",  # fullwidth digits
    "follow up 3\u00ad/10",  # a soft hyphen
])
def test_numbers_are_read_as_the_members_read_them(text: str) -> None:
    assert len(_covered(text)) == 2, (text, _covered(text))
    assert len([w for w in hidden_words(text) if any(c.isdigit() for c in w)]) == 2, text


def test_the_shape_helpers_name_their_words() -> None:
    def at(fn, text: str) -> list[str]:  # type: ignore[no-untyped-def]
        words = list(WORD_RE.finditer(text))
        return [words[i].group() for i in sorted(fn(text, words, vocab()))]

    assert at(strong_name_signs, "patient Zorbak stable") == ["Zorbak"]
    assert at(strong_name_signs, "Zorbak went home") == []  # a line's start is weak
    assert "zorbak" not in at(strong_name_signs, "spoke with zorbak today")  # a common cue
    assert at(strong_name_signs, "bp 120 & Crea") == []  # after a sign, not a word
    assert at(initial_letters, "seen by J Zorbak today") == ["J"]
    assert at(initial_letters, "R arm swollen") == []  # a side before an ordinary word


def test_parse_print_and_floor_of_the_fourth_value() -> None:
    rule = InverseRule.parse("inverse:0.005,0.01,0.002,5e-4")
    assert rule.sure == 0.0005 and str(rule) == "inverse:0.005,0.01,0.002,0.0005"
    assert InverseRule.parse(str(rule)) == rule == InverseRule.default()
    assert InverseRule.parse("inverse:0.005,0.01,0.002").sure is None  # stored rules keep
    assert rule.floor(None) == DEFAULT_SURE  # a model member reports P down to SURE
    assert InverseRule.parse("inverse:0.005,0.01").floor(None) == 0.005
    for bad in ("inverse:0.005,0.01,,0.001", "inverse:0.005,0.01,0.002,-1",
                "inverse:0.005,0.01,0.002,1.5", "inverse:0.005,0.01,0.002,1e"):
        with pytest.raises(ConfigError, match="SURE"):
            InverseRule.parse(bad)


def _notes(n: int = 4) -> list[Note]:
    # "Zorbak" at a line's start is not PHI and the model is very sure of it: only SURE lets
    # it back; "hal" is a PHI word the model half-suspects (P 0.003)
    from dphub.notes import Span
    text = "Zorbak went home today\nhal stable"
    return [Note(f"n{i}", text, f"p{i}", spans=[Span(23, 26, "NAME")], labelled=True)
            for i in range(n)]


def test_calibration_chooses_a_sure_only_where_it_keeps_text() -> None:
    from dphub.ensemble.inverse_calibrate import calibrate_inverse
    probs = {"Zorbak": 0.0, "went": 0.0, "home": 0.0, "today": 0.0, "hal": 0.003,
             "stable": 0.0}
    ens = Ensemble([fixed("rules", "a", []), model(probs)], "inverse", safe_vocab=vocab())
    res = calibrate_inverse(ens, _notes(), 1.0)
    rule = InverseRule.parse(res.rule)
    assert res.recall == 1.0 and res.precision == 1.0 and res.kept == 1.0
    assert rule.sure is not None and rule.sure < 0.003, res.rule
    # the same notes with "Zorbak" in lower case: LOW lets it back, SURE changes nothing and
    # is not stored
    low = [Note(n.id, n.text.replace("Zorbak", "zorbak"), n.patient_id, spans=n.spans,
                labelled=True) for n in _notes()]
    res = calibrate_inverse(Ensemble([fixed("rules", "a", []),
                                      model({**probs, "zorbak": 0.0})], "inverse",
                                     safe_vocab=vocab()), low, 1.0)
    assert res.precision == 1.0 and InverseRule.parse(res.rule).sure is None, res.rule
    # asked for kept >= 1 at recall 1, the same choice
    res = calibrate_inverse(ens, _notes(), 1.0, min_kept=1.0)
    assert InverseRule.parse(res.rule).sure is not None, res.rule


def test_joined_tables_decide_as_the_notes_do() -> None:
    import itertools

    import numpy as np

    from dphub.ensemble.inverse import WordTable, word_table
    texts = ["seen by J Zorbak today", "Zorbak went home 250", "patient stable, 3/10 good",
             "PATIENT SEEN. E. BROWN AWARE"]
    rng = np.random.default_rng(0)
    tables = []
    for text in texts:
        ens = ensemble(text, p={w: float(rng.choice([0.0, 0.0003, 0.003, 0.3]))
                                for w in re.findall(r"[^\W_]+", text)})
        (spans,) = ens.member_spans([Note("a", text)])
        models = {s.name: s.tag_threshold for s in ens.slots if s.name == "m"}
        tables.append(word_table(text, spans, vocab(), models=models))
    joined = WordTable.joined(tables)
    assert joined.model and joined.refused is not None and joined.refused.any()
    for low, high, named, sure in itertools.product((0.0, 0.005), (0.01, 0.5), (None, 0.002),
                                                    (None, 0.0005, 0.005)):
        assert np.array_equal(joined.kept(low, high, named, sure),
                              np.concatenate([t.kept(low, high, named, sure) for t in tables]))
    with pytest.raises(ValueError):
        WordTable.joined([])
