"""Holes of the inverse rule found from outside (issue 36), each a test with the rule member alone.

Every note here is synthetic and written in the test. A PHI string "leaks" when one of its
letter/digit words comes back under ``--aggregate inverse``: the rule member, the shipped
vocabulary, no model (what nothing vouches for stays hidden).
"""

from __future__ import annotations

import hashlib
import re

import pytest
from faker.providers.person.en_US import Provider as Person

from dphub import safe_vocab
from dphub.ensemble.core import Ensemble, Slot
from dphub.ensemble.inverse import InverseRule
from dphub.errors import ConfigError
from dphub.notes import Note
from dphub.rules.engine import RULES_DEFAULT, RuleMember, RuleOptions
from dphub.safe_vocab import SafeVocabulary, load


@pytest.fixture(scope="module")
def vocab() -> SafeVocabulary:
    return load()


@pytest.fixture(scope="module")
def rules_only(vocab: SafeVocabulary) -> Ensemble:
    return Ensemble([Slot(RuleMember(RULES_DEFAULT, RuleOptions()), None, 0.0)], InverseRule.default(),
                    safe_vocab=vocab)


def shown(ens: Ensemble, text: str) -> str:
    """What a reader sees: every hidden span replaced by ``#``."""
    (res,) = ens.deid([Note("n", text)])
    out = list(text)
    for m in res.merged:
        out[m.start:m.end] = "#" * (m.end - m.start)
    return "".join(out)


def leaked(ens: Ensemble, text: str, phi: str) -> list[str]:
    """The words of ``phi`` (found in ``text``) that come back."""
    start = text.index(phi)
    seen = shown(ens, text)
    return [m.group() for m in re.finditer(r"[^\W_]+", phi)
            if "#" not in seen[start + m.start():start + m.end()]]


# ------------------------------------------------------------------ names that are ordinary words

NAME_WORDS = ("Will", "Art", "Ward", "Pearl", "Hope", "Grant", "Rich", "Rose", "Hall", "Bill",
              "Good", "Grace", "Mercy", "Wood", "Black", "Fair", "Banks")


def test_shipped_safe_words_hold_no_english_first_name_or_surname(vocab: SafeVocabulary) -> None:
    """Systematic: no Faker en_US first name or surname of three letters or more is a safe
    word (the build used to protect "will", "art", "ward", "pearl" as clinical words)."""
    names = {w.lower() for w in (*Person.first_names_female, *Person.first_names_male,
                                 *Person.last_names) if w.isalpha() and len(w) >= 3}
    assert sorted(n for n in names if vocab.contains(n)) == []
    for w in ("will", "art", "ward", "pearl", "memorial", "university"):
        assert not vocab.contains(w), w
    # context words, not forgotten: they come back where the words around them allow it
    for w in ("will", "art", "ward", "pearl", "good", "hope"):
        assert vocab.is_context(w), w
    assert not vocab.is_context("memorial") and not vocab.is_context("university")


@pytest.mark.parametrize("name", NAME_WORDS)
@pytest.mark.parametrize("frame", ["Pt seen with {} today.", "family meeting with {} and wife",
                                   "spoke to {} about plan", "pt seen by dr {} in am",
                                   "J. {} aware of plan", "son {} visited", "{} called re: pt",
                                   "discussed with {} ward nurse"])
def test_name_that_is_a_word_stays_hidden(rules_only: Ensemble, name: str, frame: str) -> None:
    for form in (name, name.lower(), name.upper()):
        text = frame.format(form)
        assert leaked(rules_only, text, form) == [], text


def test_context_word_comes_back_in_prose(rules_only: Ensemble) -> None:
    """Where the words around it show it is no name, the context word is released."""
    seen = shown(rules_only, "pt will need more fluids overnight\n")
    assert seen.startswith("pt will need more fluids")


def test_initial_before_a_surname_that_is_a_word(rules_only: Ensemble) -> None:
    for text, phi in (("Seen by R. Ward in clinic", "R. Ward"), ("Seen by r ward in clinic",
                                                                "r ward")):
        assert leaked(rules_only, text, phi) == [], text


# ------------------------------------------------------------------ places and institutions

INSTITUTIONS = ("University Hospital", "Mercy Memorial Clinic", "Good Samaritan Hospital",
                "St. Mary's Church", "Grace Church", "Northeast Medical Center",
                "Valley Hospital", "Hospital of Saint Raphael", "Sacred Heart Hospital",
                "Hope Clinic", "Harbor View Medical Center", "Main Street")


@pytest.mark.parametrize("inst", INSTITUTIONS)
def test_institution_made_of_vocabulary_words_stays_hidden(rules_only: Ensemble, inst: str) -> None:
    for form in (inst, inst.lower()):
        for frame in ("pt transferred to {} for cath", "Followed at {}.", "lives near {}\n"):
            text = frame.format(form)
            assert leaked(rules_only, text, form) == [], text


@pytest.mark.parametrize("place", ["reading", "mobile", "florence", "phoenix", "independence",
                                   "orange", "temple"])
def test_place_name_in_lower_case_stays_hidden(rules_only: Ensemble, place: str) -> None:
    for frame in ("pt lives in {} with wife", "transferred from {} today", "home to {} tomorrow"):
        text = frame.format(place)
        assert leaked(rules_only, text, place) == [], text


# ------------------------------------------------------------------ numbers in words, line breaks

@pytest.mark.parametrize("phone", ["six one seven five five five one two one two",
                                   "six-one-seven, five five five, oh one four three",
                                   "two one two double five three four"])
def test_phone_number_spelled_out_stays_hidden(rules_only: Ensemble, phone: str) -> None:
    text = f"daughter asks to call back at {phone} tomorrow"
    assert leaked(rules_only, text, phone) == [], text


def test_two_number_words_are_no_phone(rules_only: Ensemble) -> None:
    assert "one or two" in shown(rules_only, "take one or two tabs prn\n")


@pytest.mark.parametrize("parts", [("Wood", "ward"), ("Black", "well"), ("Fair", "banks"),
                                   ("Chester", "field"), ("Hart", "well")])
def test_name_hyphenated_across_a_line_break_stays_hidden(rules_only: Ensemble,
                                                          parts: tuple[str, str]) -> None:
    for a, b in (parts, (parts[0].lower(), parts[1])):
        text = f"seen today by {a}-\n{b} in clinic"
        assert leaked(rules_only, text, f"{a}-\n{b}") == [], text


def test_word_hyphenated_across_a_line_break_comes_back(rules_only: Ensemble) -> None:
    seen = shown(rules_only, "will need follow-\nup in clinic\n")
    assert "follow-\nup" in seen


def test_clinical_shorthand_letters_come_back(rules_only: Ensemble) -> None:
    seen = shown(rules_only, "pt s/p fall, c/o pain w/ movement, d/c foley, u/o adequate\n")
    for s in ("s/p", "c/o", "w/", "d/c", "u/o"):
        assert s in seen, s


# ------------------------------------------------------------------ the shipped files' digests

def test_tampered_shipped_vocabulary_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = safe_vocab._resource

    def tampered(name: str) -> bytes:
        data = real(name)
        return data + b"smith\n" if name == "safe_words.txt" else data

    monkeypatch.setattr(safe_vocab, "_resource", tampered)
    with pytest.raises(ConfigError, match="does not match its documented sha256") as e:
        load()
    assert "smith" not in str(e.value)


def test_tampered_context_words_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    real = safe_vocab._resource
    monkeypatch.setattr(safe_vocab, "_resource",
                        lambda name: real(name)[:-4] if name == "context_words.txt" else real(name))
    with pytest.raises(ConfigError, match="context_words.txt"):
        load()


def test_empty_vocabulary_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    empty = b"# a header and no word\n"
    monkeypatch.setattr(safe_vocab, "_resource", lambda name: empty)
    monkeypatch.setitem(safe_vocab.SHIPPED_SHA256, "safe_words.txt",
                        hashlib.sha256(empty).hexdigest())
    with pytest.raises(ConfigError, match="holds no words"):
        load()
    path = tmp_path / "v.txt"
    for data in (b"", b"\n\n", empty):
        path.write_bytes(data)
        with pytest.raises(ConfigError, match="holds no words"):
            load(path)


def test_shipped_digests_are_the_documented_ones() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "safe_vocab.md").read_text()
    for name, digest in safe_vocab.SHIPPED_SHA256.items():
        assert hashlib.sha256(safe_vocab._resource(name)).hexdigest() == digest, name
        assert digest in doc, name


# ------------------------------------------------------------------ the new release paths

@pytest.mark.parametrize("text,phi", [
    ("seen by dr. will today", "will"),          # a cue before, across a period
    ("stable. will smith called", "will smith"),  # a surname after it is no safe word
    ("plan: will ward aware", "will ward"),        # two context words side by side
    ("bs/Art", "Art"),                             # capitalised: never released
    ("stable; good-\nwin called", "good-\nwin"),   # a surname broken across a line
])
@pytest.mark.parametrize("across", [False, True])
def test_context_word_after_a_clause_stays_hidden_next_to_a_name(
        rules_only: Ensemble, text: str, phi: str, across: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dphub.ensemble.inverse.CONTEXT_ACROSS_CLAUSES", across)
    assert leaked(rules_only, text, phi) == [], text


@pytest.mark.parametrize("across", [False, True])
def test_context_word_after_a_clause_comes_back_only_when_asked(
        rules_only: Ensemble, across: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dphub.ensemble.inverse.CONTEXT_ACROSS_CLAUSES", across)
    # after a word no list vouches for: a safe word before the period releases it by default
    # (dphub.ensemble.releases.quiet_context, tests/test_inverse_releases.py)
    seen = shown(rules_only, "qxz. good uo overnight\n")
    assert ("good uo" in seen) == across


@pytest.mark.parametrize("text,phi", [("Ward's plan reviewed", "Ward's"),
                                      ("per will's wife", "will's"),
                                      ("seen by Smith's team", "Smith's")])
def test_possessive_of_a_name_stays_hidden(rules_only: Ensemble, text: str, phi: str) -> None:
    assert leaked(rules_only, text, phi) == [], text


def test_contraction_of_a_safe_word_comes_back(rules_only: Ensemble) -> None:
    seen = shown(rules_only, "pt's wife says she doesn't know\n")
    assert "pt's" in seen and "doesn't" in seen


@pytest.mark.parametrize("text,phi", [("call x 5551234 re pt", "x 5551234"),
                                      ("rm J 12 today", "J"), ("seen at P 12 Main St", "P 12")])
def test_one_letter_before_a_number_that_is_no_measurement_stays_hidden(rules_only: Ensemble,
                                                                       text: str, phi: str) -> None:
    assert leaked(rules_only, text, phi) == [], text


def test_one_letter_value_name_comes_back(rules_only: Ensemble) -> None:
    seen = shown(rules_only, "K 3.8 repleted, pain x 2\n")
    assert seen.startswith("K 3.8") and "x 2" in seen


def test_cli_refuses_a_tampered_vocabulary_with_one_error_line(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from dphub.cli.main import main

    real = safe_vocab._resource
    monkeypatch.setattr(safe_vocab, "_resource",
                        lambda name: real(name).replace(b"\npatient\n", b"\n"))
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.txt").write_text("patient seen today\n")
    path = tmp_path / "m.toml"
    assert main(["ensemble", "add", "rules:default", "-e", str(path)]) == 0
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["ensemble", "deid", str(src), "--out", str(out), "--aggregate", "inverse",
                 "-e", str(path)]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "sha256" in lines[0]
    assert not out.exists() or not any(out.iterdir())


# ------------------------------------------------------------------ look-alike and fullwidth forms

def _fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


@pytest.mark.parametrize("text, phi", [
    # the vocabulary reads these words normalised, so every list of the rule must too
    (_fullwidth("six one seven five five five one two one two"), None),
    ("pt transferred to Valley " + _fullwidth("Hospital") + " for cath", "Valley"),
    ("seen by " + _fullwidth("dr") + " will today", "will"),
    ("seen by " + _fullwidth("DR") + " Ward today", "Ward"),
])
def test_fullwidth_forms_of_the_rules_words_still_hide(rules_only: Ensemble, text: str,
                                                       phi: str | None) -> None:
    target = phi if phi is not None else text
    assert leaked(rules_only, f"plan {text} tomorrow", target) == [], text
