"""The rule member ``rules:default``: regular expressions and dictionaries, no training data (ε = 0).

Why a rule member at all: structured identifiers (dates, phone numbers, e-mail addresses, ids) are
matched more reliably by patterns than by a small DP model, and a member that saw no patient data
costs no privacy. The ensemble's union rule then lets the models cover names and free-text PHI.

Scores: a regex match on a structured pattern scores :data:`PATTERN_SCORE` (1.0: deterministic,
the format itself is the evidence); a dictionary match (names, places) scores
:data:`DICTIONARY_SCORE` (0.6: a list hit is weaker evidence). Scores matter for the ensemble's
label choice (the highest-scoring member names a merged span) and for a member threshold: a rule
member with threshold 0.7 keeps only the patterns.

Precision on ALL-CAPS nursing notes: capitalisation cannot tell "MAY" the month from "may" the
verb or "AMBER" the name from amber urine, so names that are also common English or clinical words
(``ambiguous_names.txt`` + ``common_words.txt`` + ``clinical_words.txt``) are flagged only with
context (a title such as ``DR.`` / ``MR.`` or an adjacent unambiguous name). In mixed-case text a
lowercase word is never a dictionary name. Times are not HIPAA identifiers (and PhysioNet gold
does not mark them), so the time patterns are off unless ``times = true``.

Words in no list ("Vornak") are names or places only right after strong context: a relative
word, an initial, a credential, an abbreviated role, a transfer verb. "In no list" means in none of
the word lists and not an English word (Webster's 2nd via ``english-words``, see
:func:`is_english`), so that the context rules do not turn "SON VISITED" into a name.

Where the parts live: this module holds the member (:class:`RuleMember`), its options and overlap
resolution; the word lists and context vocabulary are in :mod:`dphub.rules.lexicon`, the
structured patterns and their number checks in :mod:`dphub.rules.patterns`.

Dictionaries and their licenses: ``dphub/resources/rules/README.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dphub.errors import ConfigError
from dphub.labels import is_known
from dphub.notes import Note, Span
from dphub.rules.lexicon import (
    CENSUS_SURNAMES,
    CLINICIAN_WORDS,
    CREDENTIALS,
    DOSE_VERB,
    DRUG_SUFFIXES,
    HOSPITAL_ACRONYM,
    HOSPITAL_CONNECTORS,
    HOSPITAL_QUALIFIERS,
    INITIAL_GAP,
    NOT_HOSPITAL_ACRONYMS,
    NOT_NAMES,
    PLACE_CONTEXT,
    PLACE_PREPOSITION,
    RELATIVE_AFTER,
    RELATIVE_GAP,
    RELATIVE_WORDS,
    ROLE_ABBREVIATIONS,
    SAINT,
    SECTION_LETTERS,
    SIGNATURE_GAP,
    STRONG_TITLES,
    TITLE_CASE,
    UNIT_NUMBER,
    Dictionaries,
    WordToken,
    adjacent_tokens,
    dictionaries,
    is_english,
    word_tokens,
)
from dphub.rules.patterns import IGNORECASE, PATTERNS, TIME_PATTERNS, pattern_check_passes

#: the public names, including those that live in the two sibling modules since the cut of
#: issue 30 (``from dphub.rules.engine import is_english`` keeps working)
__all__ = [
    "CENSUS_SURNAMES", "DICTIONARY_SCORE", "PATTERN_SCORE", "RULES_DEFAULT", "Dictionaries",
    "RuleMember", "RuleOptions", "dictionaries", "is_english", "phrase_alternation",
    "resolve_overlaps",
]

PATTERN_SCORE = 1.0
DICTIONARY_SCORE = 0.6
RULES_DEFAULT = "rules:default"


@dataclass
class RuleOptions:
    """Options of a rule member, from the manifest (``[members.options]``).

    allow:  words/phrases never flagged (case-insensitive), e.g. a ward named after a person
    deny:   words/phrases always flagged; a table maps each to a label, a list uses ``OTHER``
    times:  also flag clock times (not HIPAA identifiers; off by default)
    min_age: ages below it are not flagged (0: every age, as i2b2-2014 annotates; 90: HIPAA Safe
             Harbor, as the PhysioNet corpus annotates)
    """

    allow: frozenset[str] = frozenset()
    deny: Mapping[str, str] = field(default_factory=dict)
    times: bool = False
    min_age: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> RuleOptions:
        d = dict(d or {})
        unknown = set(d) - {"allow", "deny", "times", "min_age"}
        if unknown:
            raise ConfigError(
                f"unknown rule option(s) {', '.join(sorted(unknown))}; known: allow, deny, times, "
                "min_age"
            )
        allow = d.get("allow", [])
        deny_raw = d.get("deny", {})
        if not isinstance(allow, list) or not all(isinstance(w, str) for w in allow):
            raise ConfigError("rule option 'allow' must be a list of strings")
        if isinstance(deny_raw, list):
            deny = {str(w): "OTHER" for w in deny_raw}
        elif isinstance(deny_raw, dict):
            deny = {str(k): str(v) for k, v in deny_raw.items()}
        else:
            raise ConfigError("rule option 'deny' must be a list of strings or a table")
        for w, lab in deny.items():
            if not is_known(lab):
                raise ConfigError(f"rule option 'deny': unknown label {lab!r} for entry #{list(deny).index(w) + 1}")
        return cls(
            allow=frozenset(w.lower() for w in allow),
            deny=deny,
            times=bool(d.get("times", False)),
            min_age=cls._int(d.get("min_age", 0), "min_age"),
        )

    @staticmethod
    def _int(v: Any, key: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"rule option {key!r} must be a non-negative integer")
        return v

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.allow:
            out["allow"] = sorted(self.allow)
        if self.deny:
            out["deny"] = dict(self.deny)
        if self.times:
            out["times"] = True
        if self.min_age:
            out["min_age"] = self.min_age
        return out


def phrase_alternation(words: Iterable[str]) -> str:
    """A regex alternation of ``words`` (spaces match any whitespace), factored as a prefix trie.

    Why a trie: the flat ``longest|...|shortest`` alternation of ~2,000 city names made the regex
    engine try every name at every position (80 % of the rule member's time). Greedy optional
    branches of the trie still try the longest continuation first and backtrack to shorter names,
    so the match at each position is the same as the flat longest-first alternation's.
    """
    trie: dict[str, Any] = {}
    for w in {w for w in words if w}:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}  # end of a word

    def piece(ch: str) -> str:
        return r"\s+" if ch == " " else re.escape(ch)

    def build(node: dict[str, Any]) -> str:
        ends = "" in node
        branches = [piece(ch) + build(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if ends:
            return "(?:" + body + ")?" if len(branches) > 1 or len(body) > 1 else body + "?"
        return body

    return build(trie) or "(?!)"


@dataclass
class _NoteReading:
    """One note as the dictionary passes read it: tokens, whether case tells names apart, and
    the spans found so far."""

    text: str
    toks: list[WordToken]
    d: Any
    names: Any
    source: str
    mixed_case: bool
    lower_case_note: bool
    tok_end: dict[int, int]
    tok_index: dict[int, int]
    out: list[Span] = field(default_factory=list)

    @classmethod
    def of(cls, text: str, d: Any, names: Any, source: str) -> _NoteReading:
        # case tells names apart only where the writer capitalises: a note in capitals, or one
        # written all in lower case (abbreviations aside), is read as case-less
        has_lower = any(c.islower() for c in text)
        mixed_case = has_lower and TITLE_CASE.search(text) is not None
        toks = word_tokens(text)
        return cls(text, toks, d, names, source, mixed_case, has_lower and not mixed_case,
                   {t.end: k for k, t in enumerate(toks)},
                   {t.start: k for k, t in enumerate(toks)})

    def span(self, a: int, b: int, label: str, score: float = DICTIONARY_SCORE) -> None:
        self.out.append(Span(a, b, label, score=score, source=self.source))

    def capitalised(self, t: WordToken) -> bool:
        return not self.mixed_case or t.word[0].isupper()

    def is_common(self, t: WordToken) -> bool:
        return t.low in self.d.common or t.low in self.d.ambiguous

    def named(self, t: WordToken) -> bool:
        """In a name list; a name that is also a word only when written "Rob" in mixed case."""
        return t.low in self.names or (self.mixed_case and t.low in self.d.word_names
                                       and t.word[0].isupper() and t.word[1:].islower())


class RuleMember:
    """Ensemble member ``rules:default``: patterns + dictionaries, ε = 0 (no training data)."""

    epsilon: float = 0.0
    unit: str | None = None
    revision: str | None = None

    def __init__(self, name: str = RULES_DEFAULT, options: RuleOptions | None = None) -> None:
        self.name = name
        self.options = options or RuleOptions()
        self.dicts = dictionaries()
        self._all_names = self.dicts.all_names
        self._phrase_res = self._compile_phrases()
        self._place_words = frozenset(
            w for phrase in (*self.dicts.cities, *self.dicts.place_words, *self.dicts.states,
                             *self.dicts.countries)
            for w in phrase.split())

    def _compile_phrases(self) -> dict[str, re.Pattern[str]]:
        d = self.dicts

        def alt(words: Iterable[str]) -> str:
            return phrase_alternation(words)

        out = {
            "CITY": re.compile(rf"\b(?:{alt(d.cities)})\b", IGNORECASE),
            "STATE": re.compile(rf"\b(?:{alt(d.states)})\b", IGNORECASE),
            "COUNTRY": re.compile(
                rf"\b(?:{alt(c for c in d.countries if c not in d.ambiguous and c not in d.common and len(c) > 3)})\b",
                IGNORECASE,
            ),
            "HOSPITAL": re.compile(rf"\b(?:{alt(d.hospital_words)})\b", IGNORECASE),
            "STATE_ABBR": re.compile(
                rf"\b([A-Z][A-Za-z.'-]+(?:\s[A-Z][A-Za-z.'-]+)?),\s*({alt(d.state_abbrs)})\b"
                r"(?:\.?\s+(\d{5}(?:-\d{4})?))?"
            ),
        }
        if self.options.deny:
            out["DENY"] = re.compile(rf"\b(?:{alt(w.lower() for w in self.options.deny)})\b", IGNORECASE)
        return out

    def _unknown(self, t: WordToken, capitalised: bool) -> bool:
        """A word that is in none of the word lists nor English: a name or place, given context.

        Used only right after strong context (a relative word, an initial, a credential, a
        transfer verb), where an unknown word is far more often PHI than a typo.
        """
        w = t.low
        return (capitalised and len(w) > 2 and w.isalpha() and w not in self.dicts.common
                and w not in self.dicts.ambiguous and not is_english(w))

    # ------------------------------------------------------------------ public
    def tag(self, notes: Sequence[Note], threshold: float | None = None) -> list[list[Span]]:
        """Spans per note; a threshold drops spans scoring below it (0.7 keeps patterns only)."""
        out = []
        for note in notes:
            spans = self.spans(note.text)
            if threshold is not None:
                spans = [s for s in spans if (s.score or 0.0) >= threshold]
            out.append(spans)
        return out

    def spans(self, text: str) -> list[Span]:
        """All rule spans of one text, overlaps resolved (longest, then highest score wins)."""
        found: list[Span] = []
        patterns = PATTERNS + (TIME_PATTERNS if self.options.times else ())
        for p in patterns:
            for m in p.regex.finditer(text):
                if not pattern_check_passes(p.check, m, text):
                    continue
                s, e = m.span(p.group)
                if p.label == "AGE" and self.options.min_age:
                    # the whole number, decimals included: "90.5 yo" is over 89 (issue 38)
                    number = re.search(r"\d*[.,]?\d+", text[s:e])
                    if (number and float(number.group(0).replace(",", ".")) < self.options.min_age
                            and ">" not in text[s:e]):
                        continue
                if e > s:
                    found.append(Span(s, e, p.label, score=PATTERN_SCORE, source=self.name))
        found.extend(self._dictionary_spans(text))
        return self._resolve(text, found)

    # ------------------------------------------------------------------ internals
    def _dictionary_spans(self, text: str) -> list[Span]:
        """Names, then places: each pass reads the note once through :class:`_NoteReading`."""
        n = _NoteReading.of(text, self.dicts, self._all_names, self.name)
        is_name = [False] * len(n.toks)
        label = ["NAME"] * len(n.toks)
        self._cued_names(n, is_name, label)
        self._role_names(n, is_name, label)
        self._signature_names(n, is_name, label)
        self._spread_names(n, is_name, label)
        self._place_spans(n)
        self._context_place_spans(n)
        return n.out

    def _cued_names(self, n: _NoteReading, is_name: list[bool], label: list[str]) -> None:
        """Unambiguous dictionary names, then the words after a title ("Dr", "Mr")."""
        text, toks, d = n.text, n.toks, n.d
        mixed_case, capitalised, is_common, named = n.mixed_case, n.capitalised, n.is_common, n.named
        # names: unambiguous dictionary hits, then titles, then adjacent ambiguous names
        for i, t in enumerate(toks):
            if capitalised(t) and t.low in d.names and not is_common(t) and len(t.low) > 1:
                is_name[i] = True
        for i, t in enumerate(toks):
            if t.low not in STRONG_TITLES:
                continue
            after = text[t.end : t.end + 1]
            if t.low == "ms" and after != "." and (not mixed_case or t.word == "MS"):
                continue  # "MS" in capitals is usually mental status / morphine sulfate
            j = i + 1
            taken = 0
            while j < len(toks) and taken < 3 and adjacent_tokens(text, toks[j - 1], toks[j]):
                tj = toks[j]
                initial = len(tj.word) == 1 and text[tj.end : tj.end + 1] == "."
                if taken and not capitalised(tj):
                    break  # the first word after a title may be lower case ("dr. smith")
                if tj.low in d.common and not named(tj) and not initial:
                    break
                if taken and not initial and not named(tj):
                    break  # after the first word only dictionary names continue a name
                is_name[j] = True
                label[j] = "DOCTOR" if t.low in ("dr", "doctor") else "NAME"
                taken += 1
                j += 1
            if taken and all(len(toks[x].word) == 1 for x in range(i + 1, j)):
                for x in range(i + 1, j):  # a lone initial after a title is too weak
                    is_name[x] = False

    def _role_names(self, n: _NoteReading, is_name: list[bool], label: list[str]) -> None:
        """Names after a clinician or relative word ("MD HO", "son Mark"), or before "(son)"."""
        text, toks = n.text, n.toks
        tok_end, capitalised, is_common, named = n.tok_end, n.capitalised, n.is_common, n.named
        for i, t in enumerate(toks):
            if t.low in CLINICIAN_WORDS:
                role = "DOCTOR"
            elif t.low in RELATIVE_WORDS:
                role = "RELATIVE"
            else:
                continue
            j = i + 1
            while j < len(toks) and j - i <= 2:
                tj = toks[j]
                if role == "RELATIVE":
                    # "SON MARK", "dtr zandrit", "DAUGHTER-ZANDRIT": a dictionary name, or a word
                    # that is no English word at all, right after a relative word
                    ok = (RELATIVE_GAP.fullmatch(text, toks[j - 1].end, tj.start) is not None
                          and len(tj.low) > 1
                          and (named(tj) or self._unknown(tj, capitalised(tj) or j == i + 1)))
                else:  # "MD HO" is a house officer: unambiguous dictionary names, or after
                    # an abbreviated role ("NP zandrit", "HO VORNAK") a word in no list at all
                    ok = (adjacent_tokens(text, toks[j - 1], tj) and len(tj.low) > 1
                          and ((named(tj) and not is_common(tj))
                               or (t.low in ROLE_ABBREVIATIONS and j == i + 1
                                   and len(tj.low) > 3 and self._unknown(tj, True))))
                if not ok:
                    break
                is_name[j] = True
                label[j] = role
                j += 1
        for m in RELATIVE_AFTER.finditer(text):  # "Quelpor Vornak (son)"
            k = tok_end.get(m.start())
            taken = 0
            while (k is not None and k >= 0 and taken < 3 and capitalised(toks[k])
                   and (named(toks[k]) or self._unknown(toks[k], True))
                   and (taken == 0 or adjacent_tokens(text, toks[k], toks[k + 1]))):
                is_name[k] = True
                label[k] = "RELATIVE"
                taken += 1
                k -= 1

    def _signature_names(self, n: _NoteReading, is_name: list[bool], label: list[str]) -> None:
        """An initial before a surname, and a signature before a credential ("Z. Smith, RN")."""
        text, toks, is_common, named = n.text, n.toks, n.is_common, n.named
        for i, t in enumerate(toks[:-1]):  # "Z. PRUITT", "k. pruitt": an initial and a surname
            nxt = toks[i + 1]
            if (len(t.word) != 1 or not INITIAL_GAP.fullmatch(text, t.end, nxt.start)
                    or (t.start and text[t.start - 1] not in " \t\n(")
                    or len(nxt.low) < 3 or text[nxt.end : nxt.end + 1].isalnum()):
                continue
            if (named(nxt) and not is_common(nxt)) or (
                    t.word.upper() not in SECTION_LETTERS and self._unknown(nxt, True)):
                is_name[i] = is_name[i + 1] = True
        for i, t in enumerate(toks):  # "ZANDRIT Q. VORNAK, RRT": a signature with a credential
            if t.low not in CREDENTIALS or i == 0:
                continue
            if not re.fullmatch(r",\s{0,3}|\s{1,3}", text[toks[i - 1].end : t.start]):
                continue
            k, found, strong = i - 1, [], False
            while k >= 0 and len(found) < 4:
                tk = toks[k]
                initial = len(tk.word) == 1 and text[tk.end : tk.end + 1] == "."
                name_like = (named(tk) and not is_common(tk)) or self._unknown(tk, True)
                if not (initial or name_like):
                    break
                found.append(k)
                strong = strong or name_like
                if k == 0 or not SIGNATURE_GAP.fullmatch(text, toks[k - 1].end, tk.start):
                    break
                k -= 1
            if strong and (len(found) > 1 or named(toks[found[0]])):
                for k in found:
                    is_name[k] = True
                    label[k] = "DOCTOR"

    def _spread_names(self, n: _NoteReading, is_name: list[bool], label: list[str]) -> None:
        """Grow found names (adjacent, hyphenated, repeated in the note), then emit them."""
        text, toks, capitalised = n.text, n.toks, n.capitalised
        is_common, named, span = n.is_common, n.named, n.span
        changed = True
        while changed:  # an ambiguous name next to a found name is part of it ("MARK SMITH")
            changed = False
            for i, t in enumerate(toks):
                if (is_name[i] or not capitalised(t) or not named(t)
                        or t.low in CLINICIAN_WORDS):
                    continue
                left = i > 0 and is_name[i - 1] and adjacent_tokens(text, toks[i - 1], t)
                right = i + 1 < len(toks) and is_name[i + 1] and adjacent_tokens(text, t, toks[i + 1])
                if left or right:
                    is_name[i] = True
                    label[i] = label[i - 1] if left else label[i + 1]
                    changed = True
        for i in range(len(toks) - 1):  # the second half of a hyphenated name ("VORNAK-QUELPOR")
            if (is_name[i] and not is_name[i + 1] and text[toks[i].end : toks[i + 1].start] == "-"
                    and capitalised(toks[i + 1]) and not is_common(toks[i + 1])):
                is_name[i + 1] = True
                label[i + 1] = label[i]
        # a name found once in a note is a name wherever else the note writes it ("Quelpor Vornak
        # (son)" ... "Quelpor agrees"): words of three letters or more that are no common word
        found_names = {t.low: label[i] for i, t in enumerate(toks)
                       if is_name[i] and len(t.low) > 2 and not is_common(t)
                       and t.low not in NOT_NAMES}
        if found_names:
            for i, t in enumerate(toks):
                if not is_name[i] and t.low in found_names and capitalised(t):
                    is_name[i] = True
                    label[i] = found_names[t.low]
        for i, t in enumerate(toks):
            if is_name[i]:
                span(t.start, t.end, label[i])

    def _place_spans(self, n: _NoteReading) -> None:
        """Cities, states, countries, "City, ST 12345" and institutions ("X Y Hospital", "St X")."""
        text, toks, d, names = n.text, n.toks, n.d, n.names
        mixed_case, lower_case_note, tok_index = n.mixed_case, n.lower_case_note, n.tok_index
        capitalised, span = n.capitalised, n.span
        # places: city / state / country names, "City, ST 12345", "X Y Hospital"
        for lab in ("CITY", "STATE", "COUNTRY"):
            for m in self._phrase_res[lab].finditer(text):
                if mixed_case and not m.group(0)[0].isupper():
                    continue
                span(m.start(), m.end(), lab)
        for m in self._phrase_res["STATE_ABBR"].finditer(text):
            first = m.group(1).split()[0].lower()
            if first in d.common or first in d.ambiguous:
                continue
            if not m.group(3) and m.group(1).lower() not in d.cities:
                continue  # "ABD SOFT, NT, ND": a state abbreviation needs a ZIP or a known city
            span(m.start(1), m.end(1), "CITY")
            span(m.start(2), m.end(2), "STATE", PATTERN_SCORE)
            if m.group(3):
                span(m.start(3), m.end(3), "ZIP", PATTERN_SCORE)
        for m in self._phrase_res["HOSPITAL"].finditer(text):
            k = tok_index.get(m.start())
            if k is None:
                continue
            start = m.start()
            specific = False
            j = k - 1
            while j >= 0 and k - j <= 5 and adjacent_tokens(text, toks[j], toks[j + 1]):
                tj = toks[j]
                if not capitalised(tj):
                    break
                if tj.low in HOSPITAL_CONNECTORS:
                    j -= 1
                    continue
                if tj.low in HOSPITAL_QUALIFIERS:  # "University of X", "X Memorial Hospital"
                    if specific:
                        start = tj.start
                    j -= 1
                    continue
                if tj.low in d.common and tj.low not in d.names:
                    break
                start = tj.start
                specific = True
                j -= 1
            if specific and not mixed_case:
                # without case every word looks like a name: keep the name from its first word
                # that is a name, a place or (in capitals) no English word ("BETH ISRAEL
                # DEACONESS MEDICAL CENTER"); none at all ("LENGTHY HOSPITAL STAY", "poss
                # rehab") is no institution
                words = [t for t in toks[j + 1 : k] if t.start >= start]
                strong = [x for x, t in enumerate(words)
                          if t.low not in HOSPITAL_QUALIFIERS and t.low not in HOSPITAL_CONNECTORS
                          and (t.low in names or t.low in self._place_words
                               or (not lower_case_note and not is_english(t.low)
                                   and len(t.low) > 1))]
                specific = bool(strong)
                if strong:
                    x = strong[0]
                    while x > 0 and words[x - 1].low in HOSPITAL_QUALIFIERS:  # "ST BRIGID"
                        x -= 1
                    start = words[x].start
            if specific:
                span(start, m.end(), "HOSPITAL")
        for m in SAINT.finditer(text):
            if m.group(1).lower() in d.first_names or m.group(1).lower() in d.context_names:
                span(m.start(), m.end(), "HOSPITAL")

    def _context_place_spans(self, n: _NoteReading) -> None:
        """Places after a cue ("transferred to X", "at BWH", a ward "to X 2"), and deny-listed words."""
        text, toks, mixed_case = n.text, n.toks, n.mixed_case
        tok_index, capitalised, is_common, span = n.tok_index, n.capitalised, n.is_common, n.span
        for m in PLACE_CONTEXT.finditer(text):  # "TRANSFERRED TO <place>", "LIVES IN <place>"
            j = tok_index.get(m.end())
            first = j
            while (j is not None and j < len(toks) and (first is None or j - first < 3)
                   and (len(toks[j].word) > 2 or toks[j].word.isupper() and len(toks[j].word) == 2)
                   and ((mixed_case and capitalised(toks[j])) or self._unknown(toks[j], True)
                        or (not mixed_case and toks[j].low in self._place_words)
                        or (len(toks[j].word) == 2 and toks[j].word.isupper()))  # "TO VH"
                   and not is_common(toks[j]) and toks[j].low not in STRONG_TITLES
                   and (j == first or adjacent_tokens(text, toks[j - 1], toks[j]))):
                j += 1
            if first is not None and j is not None and j > first:
                span(toks[first].start, toks[j - 1].end, "LOCATION-OTHER")

        for m in PLACE_PREPOSITION.finditer(text):
            k = tok_index.get(m.end())
            if k is None:
                continue
            t = toks[k]
            if (HOSPITAL_ACRONYM.fullmatch(t.word) and t.low not in NOT_HOSPITAL_ACRONYMS
                    and not is_common(t) and not is_english(t.low)):
                span(t.start, t.end, "HOSPITAL")  # "TO VH", "AT BWH", "FROM CPMC"
            elif (self._unknown(t, True) and not t.low.endswith(DRUG_SUFFIXES)
                  and UNIT_NUMBER.match(text, t.end)
                  and not DOSE_VERB.search(text, max(0, m.start() - 12), m.start() + 1)):
                span(t.start, t.end, "LOCATION-OTHER")  # a ward: "to quelpor 2", "ON QUELPOR 6"

        if "DENY" in self._phrase_res:
            lower_deny = {w.lower(): lab for w, lab in self.options.deny.items()}
            for m in self._phrase_res["DENY"].finditer(text):
                lab = lower_deny.get(re.sub(r"\s+", " ", m.group(0).lower()), "OTHER")
                span(m.start(), m.end(), lab, PATTERN_SCORE)

    def _resolve(self, text: str, spans: list[Span]) -> list[Span]:
        """Drop allowed words and overlaps: longer spans win, then higher scores."""
        if self.options.allow:
            spans = [s for s in spans if text[s.start : s.end].lower() not in self.options.allow]
        return resolve_overlaps(spans, len(text))


def resolve_overlaps(spans: list[Span], text_length: int) -> list[Span]:
    """Greedy overlap resolution: longer spans win, then higher scores, then earlier starts.

    Why not "compare with every span taken so far": that is quadratic in the number of spans, and
    a multi-megabyte note (a concatenated export) has hundreds of thousands of them. The spans
    taken are disjoint, so one occupancy byte per character answers "does this span overlap a
    taken one?" by scanning only the span's own characters: O(n log n) for the sort plus the total
    span length. A zero-length span overlaps a taken span only strictly inside it (the old pairwise
    test), which the owner of its two neighbouring characters tells.
    """
    spans = sorted(spans, key=lambda s: (-(s.end - s.start), -(s.score or 0.0), s.start))
    size = max([text_length, *(s.end for s in spans)]) if spans else text_length
    occupied = bytearray(size + 1)
    owner: dict[int, int] = {}  # first character of each taken span -> its end (zero-length test)
    taken: list[Span] = []
    for s in spans:
        a, b = max(s.start, 0), s.end
        if b > a:
            if occupied.find(1, a, b) != -1:
                continue
            occupied[a:b] = b"\x01" * (b - a)
            owner[a] = b
        elif b == a and 0 < a < size and occupied[a - 1] and occupied[a] and a not in owner:
            continue  # a - 1 and a lie in the same taken span: strictly inside it
        taken.append(s)
    return sorted(taken, key=lambda s: (s.start, s.end))
