"""Issue 57 items 2 and 4: the clinical vocabulary the lists lacked, the weekday option, and the
PHI the inverse rule still let through (a name split by a space, a company in lower case, one
word of a name in capitals), each with a model that is wrongly sure (P = 0 for every word), the
worst case, and its neighbours that must still come back. Every note is synthetic."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dphub.ensemble.core import Ensemble
from dphub.notes import Note
from dphub.safe_vocab import BUILTIN_LISTS, SafeVocabulary, load
from tests.test_inverse import fixed, hidden, model


@pytest.fixture(scope="module")
def vocab() -> SafeVocabulary:
    return load()


def hidden_words(vocab: SafeVocabulary, text: str, p: float = 0.0) -> list[str]:
    """Words hidden under the default ``inverse`` with rules that flag nothing and a model that
    gives every word P = ``p``."""
    probs = {w: p for w in re.findall(r"[^\W_]+", text)}
    ens = Ensemble([fixed("rules", "a", []), model(probs)], "inverse", safe_vocab=vocab)
    got = hidden(ens, Note("a", text))
    return re.findall(r"[^\W_]+", " ".join(t for t, _ in got))


# ------------------------------------------------------------------------------ item 4: leaks

@pytest.mark.parametrize(("text", "phi"), [
    ("patient Zorbak xyqlen seen today", "xyqlen"),   # a name split by a space
    ("patient Jo hnson seen today", "hnson"),
    ("seen by Joh nson today", "nson"),              # after a strong sign, the first half known
    ("Zorbak xyqlen", "xyqlen"),                      # at a line's start
    ("works for zorbaco as a clerk", "zorbaco"),      # a company in lower case
    ("employed by Qorvatek since", "Qorvatek"),
    ("retired from acme corp in", "acme"),            # a company's suffix heads its name
    ("retired from acme corp in", "corp"),
    ("works at zorbaco llc", "zorbaco"),
    ("seen by Dr. Xavier ZORBAK today", "ZORBAK"),    # one word of a name in capitals
    ("JOHN Zorbak, MD saw pt", "JOHN"),
    ("seen by Dr. Qxavier Zorbak QUELLAN today", "QUELLAN"),
])
def test_issue57_leaks_stay_hidden_with_a_wrongly_sure_model(vocab: SafeVocabulary, text: str,
                                                            phi: str) -> None:
    for p in (0.0, 0.0004, 0.001):
        assert phi in hidden_words(vocab, text, p), (text, p)


@pytest.mark.parametrize(("text", "word"), [
    ("Lasix gtt at 10", "gtt"),            # a capitalised drug before a lower-case word
    ("Levophed titrated up", "titrated"),
    ("works at night now", "night"),       # a vocabulary word after an employment verb
    ("pt works for the city", "city"),
    ("seen by Dr. Zorbak, plan OK today", "plan"),
    ("PLAN: seen by Dr. Zorbak", "PLAN"),  # capitals beside a name, not joined to it
    ("NEURO: alert today", "alert"),
    ("bp inc to 120 today", "inc"),       # "inc" says "increased", no company's suffix
])
def test_issue57_neighbours_still_come_back(vocab: SafeVocabulary, text: str, word: str) -> None:
    assert word not in hidden_words(vocab, text), text


# ------------------------------------------------------------------------- item 2: vocabulary

@pytest.mark.parametrize("word", [
    "carevue", "careview", "flowsheet", "permacath", "nepro", "jevity", "osmolite", "glucerna",
    "peptamen", "impella", "yankauer", "dobhoff", "flexiseal", "pleurx", "accucheck",
])
def test_charting_device_and_nutrition_words_are_safe(vocab: SafeVocabulary, word: str) -> None:
    assert vocab.contains(word) and vocab.contains(word.upper())


@pytest.mark.parametrize("word", ["hickman", "quinton", "ballard", "posey"])
def test_device_words_that_are_surnames_are_context_words(vocab: SafeVocabulary,
                                                         word: str) -> None:
    """An eponym that is also a listed surname is released only where no name stands."""
    assert not vocab.contains(word) and vocab.is_context(word)


@pytest.mark.parametrize("word", ["neice", "penrose"])
def test_misspellings_and_eponyms_are_not_added(vocab: SafeVocabulary, word: str) -> None:
    """Misspellings come back only where a model in context is sure (an unknown lower-case
    word below LOW); a device named after a surname no list holds is left out."""
    assert not vocab.contains(word)


def test_weekdays_stay_hidden_unless_the_guideline_says_otherwise(vocab: SafeVocabulary) -> None:
    text = "family visits on monday and Friday"
    days = ("monday", "Friday")
    assert all(not vocab.contains(d) for d in days)
    assert all(d in hidden_words(vocab, text, 0.001) for d in days)
    week = load(extra=["builtin:weekdays"])
    assert all(week.contains(d) for d in days) and week.digest != vocab.digest
    assert all(d not in hidden_words(week, text, 0.001) for d in days)
    # a path resolved against a working directory (the Ray engine's) names the same list
    assert load(extra=[Path("/elsewhere/builtin:weekdays")]).digest == week.digest
    # abbreviations stay out: they are words, units and names as often
    assert not any(week.contains(a) for a in ("mon", "wed", "sat", "sun", "fri"))
    assert set(BUILTIN_LISTS) == {"builtin:weekdays"}


@pytest.mark.parametrize("weekdays", [False, True])
def test_cli_deid_follows_the_weekday_guideline(tmp_path: Path, weekdays: bool) -> None:
    """``--safe-words builtin:weekdays`` through the CLI: the audit names the vocabulary used,
    and the weekday comes back only with it."""
    import json

    from dphub.cli.main import main

    src = tmp_path / "in"
    src.mkdir()
    (src / "a.txt").write_text("patient seen on monday and stable\n")
    path = tmp_path / "m.toml"
    assert main(["ensemble", "add", "rules:default", "-e", str(path)]) == 0
    out = tmp_path / "out"
    extra = ["--safe-words", "builtin:weekdays"] if weekdays else []
    assert main(["ensemble", "deid", str(src), "--out", str(out), "--aggregate", "inverse",
                 "--mode", "tag", "-e", str(path), *extra]) == 0
    (audit,) = [json.loads(x) for x in (out / "audit.jsonl").read_text().splitlines()]
    expected = load(extra=["builtin:weekdays"] if weekdays else []).digest
    assert audit["safe_vocab_sha256"] == expected
    written = (out / "a.txt").read_text()
    assert ("monday" in written) is weekdays
    assert "patient seen on" in written and "stable" in written
