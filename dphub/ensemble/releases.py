"""Shape releases of the inverse rule (issue 36): words no vocabulary lists, kept by their shape.

The inverse rule (:mod:`dphub.ensemble.inverse`) hides a word unless something vouches for it.
With the rule member alone, what vouches is the safe vocabulary, a measurement context, the
context-word rule and clinical shorthand. Measured on the dev corpus's tuning patients
(docs/recall_first.md), a large share of what stays hidden are single letters and context
words whose *position* shows they are no name: the ``s`` of ``80's``, the ``S:``/``O:`` of a
SOAP note, the ``r`` of ``r arm``, the ``w`` of ``w/pt``, ``good`` between two clauses of
ordinary words. Each release here is a general shape, never a list of corpus words, and each
names what a PHI look-alike of the same shape would need to get through, which is refused:

* :func:`number_clitic`: the ``s`` after ``80'``, only when the number is below 90 or a released
  measurement (an age of 90 or more is PHI: ``in her 90's`` keeps its ``s`` hidden);
* :func:`section_letters`: a single letter heading a line before ``:`` or ``-`` (``S:``,
  ``O:``, ``A:``, ``P:``, ``D:``, ``R:``); never before ``.`` (``J. Smith`` is an initial);
* :func:`letters_between_safe_words`: a single letter between two safe words on one line,
  separated by spaces, in the case of its neighbours (``r arm`` in lower case, ``R ARM`` in a
  note written in capitals), never after a name cue (``dr a``); an initial sits between names,
  which are no safe words;
* :func:`slash_letters`: a single letter joined by ``/`` to another letter word (``w/pt``,
  ``n/v/d``), in the case of that word;
* :func:`charge_letters`: a single capital written with a charge or a grade glued to it
  (``K+``, ``H+``, a blood group ``O+``, ``A++``); an initial is followed by a full stop, a
  space or a surname, never by ``+``;
* :func:`quiet_context`: a context word (``good``, ``clear``, ``will``) in lower case (or in
  capitals in a line of capitals) with a safe word of its case on either side on the same line,
  across a clause's punctuation too (``afebrile. good urine output``, ``lungs clear, diminished``),
  neither a name cue (the rule of :func:`dphub.ensemble.inverse.context_released`, which needs
  spaces on both sides, extended to clause punctuation; a name stays hidden because a name's
  neighbours are cues or names, which are no safe words).

Measured and *not* released (docs/recall_first.md): words derived from a safe word (a prefix, an
ending, two safe words run together, one letter off), which admit lower-case surnames and first
names; a context word after a preposition or conjunction cue; a context word before a number.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dphub.ensemble.words import joined_by_apostrophe
from dphub.safe_vocab import SafeVocabulary, normalize_word
from dphub.textnorm import normalized_text

_SPACES = re.compile(r"[ \t]+")
#: after a section letter: optional spaces, then ``:`` or ``-`` (never ``.``: an initial)
_SECTION_AFTER = re.compile(r"[ \t]*[:\-]")
#: a clause's punctuation between two words of one line (``. ``, ``, ``, ``; ``, ``: ``)
_CLAUSE_GAP = re.compile(r"[ \t]*[.,;:][ \t]*|[ \t]+-[ \t]+")
#: an age of 90 or more is PHI (HIPAA), so a decade from 90 up is released only as a measurement
_AGE_PHI = 90


def _case(word: str) -> str:
    """``l`` lower case, ``U`` capitals (two letters or more), ``C`` anything else."""
    if word.islower():
        return "l"
    if word.isupper() and len(word) > 1:
        return "U"
    return "C"


def _same_case(letter: str, word: str) -> bool:
    """A single letter written in the case of ``word`` (a lower-case word or one in capitals)."""
    c = _case(word)
    return (c == "l" and letter.islower()) or (c == "U" and letter.isupper())


def number_clitic(text: str, words: Sequence[re.Match[str]], i: int,
                  measures: Sequence[tuple[int, int]]) -> bool:
    """Whether word ``i`` is the ``s`` of a decade (``80's``) below 90 or of a released
    measurement."""
    m = words[i]
    if i == 0 or normalize_word(m.group()) != "s":
        return False
    prev = words[i - 1]
    pw = prev.group()
    if not (pw.isdigit() and joined_by_apostrophe(text, prev, m)):
        return False
    if m.end() < len(text) and (text[m.end()].isalnum()):
        return False
    if int(pw) < _AGE_PHI and len(pw) <= 2:
        return True
    return any(a <= prev.start() and prev.end() <= b for a, b in measures)


def section_letters(text: str, words: Sequence[re.Match[str]], i: int) -> bool:
    """Whether word ``i`` is a single letter heading a line before ``:`` or ``-``."""
    m = words[i]
    w = m.group()
    if len(w) != 1 or not w.isalpha():
        return False
    line_start = text.rfind("\n", 0, m.start()) + 1
    if text[line_start:m.start()].strip(" \t"):
        return False
    return bool(_SECTION_AFTER.match(text, m.end()))


def letters_between_safe_words(text: str, words: Sequence[re.Match[str]], i: int,
                               vocab: SafeVocabulary, cues: frozenset[str]) -> bool:
    """Whether word ``i`` is a single letter between two safe words of its case (spaces only)."""
    m = words[i]
    w = m.group()
    if len(w) != 1 or not w.isalpha() or i == 0 or i + 1 >= len(words):
        return False
    prev, nxt = words[i - 1], words[i + 1]
    pw, nw = prev.group(), nxt.group()
    if not (_SPACES.fullmatch(text, prev.end(), m.start())
            and _SPACES.fullmatch(text, m.end(), nxt.start())):
        return False
    if normalize_word(pw) in cues or not (vocab.contains(pw) and vocab.contains(nw)):
        return False
    return _same_case(w, pw) and _same_case(w, nw)


def _slash_partner(letter: str, other: str) -> bool:
    """Whether ``other``, joined to ``letter`` by a slash, is a letter word of its case."""
    if not other.isalpha():
        return False
    return _same_case(letter, other) if len(other) > 1 else other.islower() == letter.islower()


def slash_letters(text: str, words: Sequence[re.Match[str]], i: int) -> bool:
    """Whether word ``i`` is a single letter joined by ``/`` to a letter word of its case."""
    m = words[i]
    w = m.group()
    if len(w) != 1 or not w.isalpha():
        return False
    if (i > 0 and words[i - 1].end() == m.start() - 1 and text[m.start() - 1] == "/"
            and _slash_partner(w, words[i - 1].group())):
        return True
    if i + 1 < len(words) and words[i + 1].start() == m.end() + 1 and text[m.end()] == "/":
        return _slash_partner(w, words[i + 1].group())
    return False


def charge_letters(text: str, words: Sequence[re.Match[str]], i: int) -> bool:
    """Whether word ``i`` is a single capital with ``+`` glued after it and no word or stop
    glued before it (``K+``, ``O+``; not ``J.K+``, nor with an invisible or fullwidth character
    between: the gap is read as the members read it)."""
    m = words[i]
    w = m.group()
    if len(w) != 1 or not w.isalpha() or not w.isupper():
        return False
    before = normalized_text(text[words[i - 1].end():m.start()]) if i else " "
    if before[-1:] in ("", "."):
        return False
    return normalized_text(text[m.end():m.end() + 2])[:1] == "+"


def _neighbour_ok(text: str, words: Sequence[re.Match[str]], j: int, gap: tuple[int, int],
                  vocab: SafeVocabulary, case: str, cues: frozenset[str]) -> str:
    """``sp`` when word ``j`` is a safe word of ``case``, no cue, separated by spaces only;
    ``cl`` when separated by a clause's punctuation on the same line; ``""`` otherwise."""
    if not 0 <= j < len(words):
        return ""
    w = words[j].group()
    if normalize_word(w) in cues or not vocab.contains(w) or _case(w) != case:
        return ""
    if _SPACES.fullmatch(text, *gap):
        return "sp"
    return "cl" if _CLAUSE_GAP.fullmatch(text, *gap) else ""


def quiet_context(text: str, words: Sequence[re.Match[str]], i: int, vocab: SafeVocabulary,
                  cues_before: frozenset[str], cues_after: frozenset[str]) -> bool:
    """Whether word ``i``, in lower case (or in capitals between words in capitals), has a safe
    word of its case on either side on the same line (spaces or a clause's punctuation between),
    neither a name cue: the context in which a context word is no name."""
    m = words[i]
    c = _case(m.group())
    if c == "C":
        return False
    before = _neighbour_ok(text, words, i - 1, (words[i - 1].end(), m.start()) if i else (0, 0),
                           vocab, c, cues_before)
    if not before:
        return False
    after = _neighbour_ok(text, words, i + 1,
                          (m.end(), words[i + 1].start()) if i + 1 < len(words) else (0, 0),
                          vocab, c, cues_after)
    return bool(after)


def shape_released(text: str, words: Sequence[re.Match[str]], vocab: SafeVocabulary,
                   measures: Sequence[tuple[int, int]], cues_before: frozenset[str],
                   cues_after: frozenset[str]) -> set[int]:
    """Indices of the letter words these shapes release (the module docstring lists them)."""
    out: set[int] = set()
    for i, m in enumerate(words):
        w = m.group()
        if any(ch.isdigit() for ch in w):
            continue
        if (number_clitic(text, words, i, measures) or section_letters(text, words, i)
                or letters_between_safe_words(text, words, i, vocab, cues_before)
                or slash_letters(text, words, i) or charge_letters(text, words, i)
                or (vocab.is_context(w)
                    and quiet_context(text, words, i, vocab, cues_before, cues_after))):
            out.add(i)
    return out
