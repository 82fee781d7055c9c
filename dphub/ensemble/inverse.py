"""The inverse rule (``--aggregate inverse[:LOW,HIGH]``): keep only what is known to be safe.

Every aggregation before this one is *forward*: a word is hidden when some member flags it, so a
PHI word that no member flags leaks. The inverse rule (after Meldau, *Deep Neural Networks for
Inverse De-Identification of Medical Case Narratives*, Uppsala 2020) starts from a note in
which every word is hidden and lets a word back only when it is known to be safe.

The decision, per word (a letter/digit run, :data:`dphub.ensemble.words.WORD_RE`):

1. a word that a member **flags** (at the member's own threshold; a model member without one
   at P(PHI) >= 0.5) is hidden, as under ``any``;
2. ``P`` is the highest P(PHI) any model member gives the word (the highest over its word
   pieces; 0 without model members);
3. a word **without digits** is kept when it is in the safe vocabulary (:mod:`dphub.safe_vocab`)
   and ``P < HIGH``;
4. a word **with digits** is kept when it lies in a measurement context
   (:func:`dphub.ensemble.measures.measurement_ranges`: ``5 mg``, ``BP 120/80``) and ``P < HIGH``:
   numbers are never safe words (a number is where dates, ages, IDs, phones and rooms hide), so
   only a measurement's context vouches for one, as the vocabulary vouches for a word;
5. a word **without digits outside the vocabulary** (an abbreviation, a misspelling, a drug the
   lists lack, or a name) is kept only when the ensemble has at least one model member and
   ``P < LOW``: the adaptive half of Meldau's rule — what the vocabulary vouches for needs a
   model that is merely unsure it is PHI (HIGH), what it does not vouch for needs a model that
   is sure it is not (LOW); without a model nothing vouches for it;
6. everything else is hidden.

So HIGH is the model confidence a vouched-for word (vocabulary word, measurement) may carry and
still come back, and LOW the one everything else may carry. Lower thresholds hide more: ``inverse:0,HIGH`` is the strict rule (only
vocabulary words come back, whatever the models say about the rest), ``inverse:0,0`` hides every
word a model gives any weight, ``inverse:1,1`` lets the vocabulary, the measurements and the
members' flags decide alone. The defaults (:data:`DEFAULT_LOW`, :data:`DEFAULT_HIGH`) are the one
place they are set.

Hidden words merge into spans: the members' flags (merged as ``any`` merges them, their labels
and voters kept) plus each hidden word no member flagged (label ``PHI``,
:data:`dphub.labels.UNTYPED`: tag mode writes ``[**PHI**]``, surrogate mode masks it, no fake
value for an unknown category). Hidden pieces separated only by spaces or tabs join into one span
(no newline: a line break is layout a reader needs, and a span never crosses it), unless both
carry a different member label (``John Xyz`` flagged NAME + unflagged is one NAME span; a NAME
next to a DATE stays two spans, as under ``any``). Punctuation between hidden words stays visible
(``[**PHI**], [**PHI**]``), except inside a member's flag (a date ``03/14/2026``).

Model members: under the inverse rule each model member answers with one span per word whose
P(PHI) reaches the lowest threshold that matters (``min(LOW, its own threshold)``), scored with
that word's P (:func:`model_word_spans`); the rule reads both its flags (score >= its own
threshold) and ``P`` from them. So a member's own row in ``ensemble evaluate`` shows those
low-threshold spans under this rule.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dphub.ensemble.aggregate import MergedSpan, aggregate
from dphub.ensemble.measures import measurement_ranges
from dphub.ensemble.members import ModelMember
from dphub.ensemble.words import WORD_RE
from dphub.errors import ConfigError
from dphub.labels import UNTYPED, category_of
from dphub.notes import Note, Span
from dphub.safe_vocab import SafeVocabulary
from dphub.scores import LabelThresholds, TokenScores

#: Default thresholds of ``--aggregate inverse`` (no ``:LOW,HIGH``), used until ``ensemble
#: calibrate`` chooses the owner's own. Chosen on the dev corpus's inner tuning split (27 of its
#: 95 training patients, scored by a DP model trained on the other 68; benchmarks/recall_first.py
#: --sweep) by a rule fixed beforehand: the highest precision with token recall >= 0.995 and
#: full-cover phrase recall >= 0.99. That is the strict rule (LOW 0: nothing outside the
#: vocabulary comes back) with a model that must be very unsuspicious of a vocabulary word or a
#: measurement (HIGH 0.002); ``inverse:0.002,0.002`` gave recall 0.994 with far more text kept
#: (docs/recall_first.md). LOW: the P(PHI) below which a word outside the vocabulary comes back
#: (with a model member); HIGH: the P(PHI) below which a vocabulary word or a measurement number
#: comes back. Both depend on the model's calibration: calibrate on your own labels.
DEFAULT_LOW = 0.0
DEFAULT_HIGH = 0.002

#: a model member without a threshold of its own flags at this P(PHI) under the inverse rule
#: (its joint decoding has no per-word probability to compare)
MODEL_FLAG_DEFAULT = 0.5

_VERTICAL = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")


@dataclass(frozen=True)
class InverseRule:
    """``inverse`` or ``inverse:LOW,HIGH`` (0 <= LOW <= HIGH <= 1); see the module docstring."""

    low: float = DEFAULT_LOW
    high: float = DEFAULT_HIGH

    #: the forward rule's interface (calibration and listings read these): one flag hides
    k = 1
    alone: tuple[str, ...] = ()
    #: the rule reads the safe vocabulary (:mod:`dphub.ensemble.aggregation`)
    uses_safe_vocabulary: ClassVar[bool] = True

    @classmethod
    def parse(cls, text: str) -> InverseRule:
        t = text.strip().lower()
        shown = text if len(text) <= 80 else text[:60] + "..."
        usage = (f"aggregate rule {shown!r}: use 'inverse' or 'inverse:LOW,HIGH' with "
                 "0 <= LOW <= HIGH <= 1 (LOW: words outside the safe vocabulary, HIGH: "
                 "vocabulary words and measurement numbers)")
        if t == "inverse":
            return cls()
        m = re.fullmatch(r"inverse:\s*(\d*\.?\d+)\s*,\s*(\d*\.?\d+)", t)
        if not m:
            raise ConfigError(usage)
        low, high = float(m.group(1)), float(m.group(2))
        if not (0.0 <= low <= high <= 1.0):
            raise ConfigError(usage)
        return cls(low, high)

    def check(self, names: Sequence[str]) -> None:
        """Any ensemble fits (the rule names no member)."""

    def weight(self, name: str) -> int:
        return 1

    def floor(self, own: float | LabelThresholds | None) -> float:
        """The lowest P(PHI) a model member with threshold ``own`` must report under this rule."""
        if isinstance(own, LabelThresholds):
            lowest = min([own.for_label(lab) for lab in own.by_label] + [own.for_label("")])
        else:
            lowest = MODEL_FLAG_DEFAULT if own is None else float(own)
        return min(self.low, lowest)

    def __str__(self) -> str:
        return f"inverse:{self.low:g},{self.high:g}"


def word_spans(ts: TokenScores, floor: float, source: str | None) -> list[Span]:
    """One span per token whose P(PHI) reaches ``floor``, scored with it, labelled with its most
    probable label (the ensemble snaps them to whole words; pieces of one word then merge with
    the highest score, so a word's score is the highest P of its pieces)."""
    out: list[Span] = []
    for i in range(len(ts)):
        p = float(ts.phi_prob[i])
        if p >= floor:
            a, b = int(ts.offsets[i, 0]), int(ts.offsets[i, 1])
            if b > a:
                label = ts.labels[int(ts.label_probs[i].argmax())]
                out.append(Span(a, b, label, score=p, source=source))
    return out


def model_word_spans(member: ModelMember, notes: Sequence[Note], floor: float, *,
                     encoded: Any = None) -> list[list[Span]]:
    """A model member's per-word spans under the inverse rule (one scoring pass, marginals on)."""
    if type(member).token_scores is ModelMember.token_scores:
        extra = {} if encoded is None else {"encoded": encoded}
        scores = member.tagger.token_scores(notes, batch_size=member.batch_size, marginals=True,
                                            **extra)
    else:
        scores = member.token_scores(notes)
    return [word_spans(ts, floor, member.name) for ts in scores]


def _flags(s: Span, own: float | LabelThresholds | None) -> bool:
    score = 1.0 if s.score is None else float(s.score)
    if isinstance(own, LabelThresholds):
        return score >= own.for_label(s.label)
    return score >= (MODEL_FLAG_DEFAULT if own is None else float(own))


@dataclass
class WordTable:
    """One note's words and what the inverse rule needs to know of each (the run's decision and
    calibration's both read it, so calibration measures what a run does).

    ``flagged``: a member flags it (hidden whatever the thresholds); ``p``: the highest model
    P(PHI); ``safe``: a safe word (no digits, in the vocabulary); ``measure``: a number (any
    digit) inside a measurement context; ``letters``: a word without digits; ``model``: the
    ensemble has a model member (without one, P says nothing and only the vocabulary vouches).
    """

    start: np.ndarray
    end: np.ndarray
    flagged: np.ndarray
    p: np.ndarray
    safe: np.ndarray
    measure: np.ndarray
    #: the members' flags, merged as ``any`` merges them
    flags: list[MergedSpan]
    letters: np.ndarray
    model: bool

    def kept(self, low: float, high: float) -> np.ndarray:
        """Which words come back under ``inverse:LOW,HIGH``."""
        other = (self.letters & ~self.safe) if self.model else np.zeros_like(self.safe)
        vouched = self.safe | self.measure
        return ~self.flagged & ((vouched & (self.p < high)) | (other & (self.p < low)))


def word_table(
    text: str,
    member_spans: Mapping[str, Sequence[Span]],
    vocab: SafeVocabulary,
    *,
    models: Mapping[str, float | LabelThresholds | None] | None = None,
) -> WordTable:
    """The :class:`WordTable` of one note.

    ``member_spans``: each member's spans (whole words) in the note's offsets; ``models``: the
    model members among them with their own thresholds (their spans are per-word P(PHI) from
    :func:`model_word_spans`; the others' spans are flags).
    """
    models = dict(models or {})
    flags: dict[str, list[Span]] = {}
    word_p: list[tuple[int, int, float]] = []
    for name, spans in member_spans.items():
        if name in models:
            own = models[name]
            flags[name] = [s for s in spans if _flags(s, own)]
            word_p.extend((s.start, s.end, 1.0 if s.score is None else float(s.score))
                          for s in spans if s.end > s.start)
        else:
            flags[name] = list(spans)
    flagged = aggregate(flags, "any") if flags else []
    cover = sorted((m.start, m.end) for m in flagged)
    word_p.sort()
    p_starts = [a for a, _, _ in word_p]
    longest = max((e - s for s, e, _ in word_p), default=0)
    measures = measurement_ranges(text)
    m_starts = [a for a, _ in measures]
    rows: list[tuple[int, int, bool, float, bool, bool, bool]] = []
    ci = 0
    for m in WORD_RE.finditer(text):
        a, b = m.start(), m.end()
        while ci < len(cover) and cover[ci][1] <= a:
            ci += 1
        hit = ci < len(cover) and cover[ci][0] < b
        p = _max_p(word_p, p_starts, longest, a, b)
        word = m.group()
        if any(c.isdigit() for c in word):
            k = bisect.bisect_right(m_starts, a) - 1
            rows.append((a, b, hit, p, False,
                         k >= 0 and measures[k][0] <= a and b <= measures[k][1], False))
        else:
            rows.append((a, b, hit, p, vocab.contains(word), False, True))
    cols = list(zip(*rows, strict=True)) if rows else [()] * 7
    return WordTable(np.array(cols[0], dtype=np.int64), np.array(cols[1], dtype=np.int64),
                     np.array(cols[2], dtype=bool), np.array(cols[3], dtype=float),
                     np.array(cols[4], dtype=bool), np.array(cols[5], dtype=bool), flagged,
                     np.array(cols[6], dtype=bool), bool(models))


def inverse_aggregate(
    text: str,
    member_spans: Mapping[str, Sequence[Span]],
    rule: InverseRule,
    vocab: SafeVocabulary,
    *,
    models: Mapping[str, float | LabelThresholds | None] | None = None,
) -> list[MergedSpan]:
    """The inverse rule over one note: what is hidden, as merged spans (arguments as
    :func:`word_table`)."""
    return hidden_spans(text, word_table(text, member_spans, vocab, models=models), rule)


def hidden_spans(text: str, table: WordTable, rule: InverseRule) -> list[MergedSpan]:
    """What ``rule`` hides of a note whose :class:`WordTable` is ``table``, as merged spans (one
    table serves every LOW, HIGH: calibration and benchmarks score many from one model pass)."""
    out = ~table.kept(rule.low, rule.high) & ~table.flagged  # flagged words are in the flags
    hidden = [MergedSpan(int(table.start[i]), int(table.end[i]), UNTYPED, float(table.p[i]), ())
              for i in np.flatnonzero(out)]
    return _join(text, sorted([*table.flags, *hidden], key=lambda s: (s.start, s.end)))


def _max_p(word_p: Sequence[tuple[int, int, float]], starts: Sequence[int], longest: int,
           a: int, b: int) -> float:
    """The highest model P of the spans overlapping ``[a, b)`` (none is longer than
    ``longest``)."""
    best = 0.0
    i = bisect.bisect_left(starts, b) - 1
    # several members' spans overlap: look back while a span starting there can still reach
    while i >= 0 and word_p[i][0] > a - longest:
        s, e, p = word_p[i]
        if e > a:
            best = max(best, p)
        i -= 1
    return best


def _typed(label: str) -> bool:
    return category_of(label) != UNTYPED


def _join(text: str, pieces: Sequence[MergedSpan]) -> list[MergedSpan]:
    """Hidden pieces separated by spaces/tabs only (no line break) become one span, unless both
    sides carry different member labels."""
    out: list[MergedSpan] = []
    for s in pieces:
        if out:
            last = out[-1]
            gap = text[last.end:s.start]
            joinable = ((gap == "" or gap.isspace()) and not any(c in _VERTICAL for c in gap))
            same = not (_typed(last.label) and _typed(s.label)) or last.label == s.label
            if s.start < last.end or (joinable and same):
                label = last.label if _typed(last.label) else s.label
                voters = tuple(dict.fromkeys((*last.voters, *s.voters)))
                out[-1] = MergedSpan(last.start, max(last.end, s.end), label,
                                     max(last.score, s.score), voters)
                continue
        out.append(s)
    return out
