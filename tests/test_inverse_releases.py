"""Shape releases of the inverse rule (issue 36, :mod:`dphub.ensemble.releases`).

Each release is tested twice on synthetic notes, rule member alone: the non-PHI shape now comes
back, and a PHI look-alike of the same shape stays hidden ("what else does the same hole
admit?"): an age of 90 or more, an initial, a name after a cue, a capitalised or lower-case
name, a date, a phone.
"""

from __future__ import annotations

import re

import pytest

from dphub.ensemble.core import Ensemble, Slot
from dphub.ensemble.inverse import InverseRule
from dphub.notes import Note
from dphub.rules.engine import RULES_DEFAULT, RuleMember, RuleOptions
from dphub.safe_vocab import SafeVocabulary, load


@pytest.fixture(scope="module")
def vocab() -> SafeVocabulary:
    return load()


@pytest.fixture(scope="module")
def ens(vocab: SafeVocabulary) -> Ensemble:
    return Ensemble([Slot(RuleMember(RULES_DEFAULT, RuleOptions()), None, 0.0)], InverseRule.default(),
                    safe_vocab=vocab)


def shown_words(ens: Ensemble, text: str, part: str, nth: int = 0) -> list[str]:
    """The words of the ``nth`` occurrence of ``part`` in ``text`` that the rule lets back."""
    (res,) = ens.deid([Note("n", text)])
    start = [m.start() for m in re.finditer(re.escape(part), text)][nth]
    hidden = [(m.start, m.end) for m in res.merged]
    out = []
    for m in re.finditer(r"[^\W_]+", part):
        a, b = start + m.start(), start + m.end()
        if not any(s < b and e > a for s, e in hidden):
            out.append(m.group())
    return out


# ------------------------------------------------------------------ the s of a decade


def test_decade_s_comes_back_below_90_only(ens: Ensemble) -> None:
    assert "s" in shown_words(ens, "pt is stable with pressures in the 80's today.", "80's")
    text = "pt is a woman in her 90's who lives alone."
    assert shown_words(ens, text, "90's") == []
    assert shown_words(ens, "pt is in his 100's now.", "100's") == []


# ------------------------------------------------------------------ section letters


def test_section_letters_come_back_initials_do_not(ens: Ensemble) -> None:
    text = "S: pt stable overnight.\nO: afebrile\nA: stable\nP- continue plan\n"
    for part in ("S:", "O:", "A:", "P-"):
        assert shown_words(ens, text, part) == [part[0]], part
    text = "Called family.\nJ. Smith aware of plan.\nK Jones aware too.\n"
    assert shown_words(ens, text, "J. Smith") == []
    assert shown_words(ens, text, "K Jones") == []


# ------------------------------------------------------------------ a letter between safe words


def test_letter_between_safe_words_comes_back_initials_do_not(ens: Ensemble) -> None:
    assert shown_words(ens, "pt has r arm swelling today.", "r arm") == ["r", "arm"]
    assert shown_words(ens, "PT HAS R ARM SWELLING TODAY.", "R ARM") == ["R", "ARM"]
    # a middle initial sits between names (no safe words), a capital among lower-case words is
    # an initial's case, and a letter after a name cue ("dr", "by") may start a name
    assert "J" not in shown_words(ens, "pt has J stone in kidney.", "J stone")
    assert "r" not in shown_words(ens, "son john r smith visited today.", "john r smith")
    assert "r" not in shown_words(ens, "pt seen by r team today.", "by r team")
    assert "J" not in shown_words(ens, "Pt has J Rose as health care proxy.", "J Rose")


# ------------------------------------------------------------------ a letter joined by a slash


def test_slash_letters_come_back_initials_dates_phones_do_not(ens: Ensemble) -> None:
    assert shown_words(ens, "pt w/pain overnight, n/v/d resolved.", "w/pain") == ["w", "pain"]
    assert shown_words(ens, "pt w/pain overnight, n/v/d resolved.", "n/v/d") == ["n", "v", "d"]
    text = "Discussed with K/Smith and family on 3/14 call 617-555-0199."
    assert shown_words(ens, text, "K/Smith") == []
    assert shown_words(ens, "pt seen by j/ jones today.", "j/ jones") == []
    assert shown_words(ens, text, "3/14") == []
    assert shown_words(ens, text, "617-555-0199") == []


# ------------------------------------------------------------------ context words across clauses


def test_context_word_between_clauses_comes_back_names_do_not(ens: Ensemble,
                                                                vocab: SafeVocabulary) -> None:
    assert vocab.is_context("good") and vocab.is_context("clear")
    assert "good" in shown_words(ens, "pt afebrile. good urine output.", "good urine")
    assert "clear" in shown_words(ens, "breath sounds clear, faint on the left.", "sounds clear")
    assert "GOOD" in shown_words(ens, "PT AFEBRILE. GOOD URINE OUTPUT.", "GOOD URINE")
    assert vocab.is_context("will") and vocab.is_context("grace")
    # after a cue, capitalised, beside another name, or before a cue after a name
    assert "will" not in shown_words(ens, "pt spoke with will, son aware.", "with will")
    assert "Will" not in shown_words(ens, "pt stable. Will visited today.", "Will visited")
    assert "grace" not in shown_words(ens, "plan discussed. grace smith aware.", "grace smith")
    assert "will" not in shown_words(ens, "pt stable. will md aware.", "will md")
    # an institution of ordinary words stays blocked whatever its neighbours
    assert shown_words(ens, "pt stable. grace hospital, transfer.", "grace hospital") == []
