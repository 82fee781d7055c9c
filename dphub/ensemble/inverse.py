"""The inverse rule (``--aggregate inverse[:LOW,HIGH[,NAMED[,SURE]]]``): keep only what is safe.

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
   lists lack, or a name) is kept only when the ensemble has at least one model member, it is
   written in lower case (names and places are capitalised far more often; a single capital
   written as shorthand, before a number or a lower-case vocabulary word, counts:
   :func:`single_capitals`) and ``P < LOW`` —
   or in capitals in a line of capitals, where a capital says nothing, and ``P`` is below
   both LOW and NAMED: the adaptive half of Meldau's rule — what the vocabulary vouches for needs a
   model that is merely unsure it is PHI (HIGH), what it does not vouch for needs a model that
   is sure it is not (LOW); without a model nothing vouches for it. A word with a sign of a
   name (:func:`name_signs`) never comes back this way, and a vouched one with such a sign
   needs ``P < NAMED`` when the rule gives a third value (issue 36 item 2);
6. a **context word** (an ordinary word that is also a name: "good", "will") that its
   neighbours did not release (:func:`context_released`) is, with a model member, a vouched
   word with a sign of a name by construction: it comes back at ``P < NAMED`` when it is
   written as words are (lower case, or in a line of capitals) and nothing else signs it (a
   function word before it, ``to``, ``and``, is no sign: :data:`WEAK_CUES`);
7. with a fourth value SURE (``inverse`` alone: :data:`DEFAULT_SURE`) and a model member, any
   word no member flags comes back when every model is very sure of it (``P < SURE``) — a
   capitalised or unknown word, a word with a weak sign of a name, a number outside every
   measurement — unless its shape alone refuses it (:func:`sure_refused`: a strong sign of a
   name, an initial, a number shaped like a date, an age, an ID or a phone) or it is blocked
   (:func:`blocked_words`); and a vouched word whose signs of a name are all weak needs only
   ``P`` below LOW (HIGH if lower, never stricter than NAMED) instead of NAMED. Below such P the
   models separate: no PHI word without a strong sign got it on the dev corpus's tuning parts
   (docs/recall_first.md, "Very sure");
8. with a fourth value SURE and a model member, a **closed-class word** (:data:`FUNCTION_WORDS`:
   a pronoun, an article, a preposition, a conjunction, an auxiliary) written as words are
   (lower case, or in a line of capitals) comes back whatever the models' P, unless it is
   blocked, shows a strong sign of a name (``Dr. an``) or is a context word of the vocabulary
   (``her``, ``do``): no person or place is named by ``the`` or ``his``, and a model's P on
   such a word measures only how close it stands to a name;
9. everything else is hidden.

So HIGH is the model confidence a vouched-for word (vocabulary word, measurement) may carry and
still come back, and LOW the one everything else may carry. Lower thresholds hide more: ``inverse:0,HIGH`` is the strict rule (only
vocabulary words come back, whatever the models say about the rest), ``inverse:0,0`` hides every
word a model gives any weight, ``inverse:1,1`` lets the vocabulary, the measurements and the
members' flags decide alone. The defaults (:data:`DEFAULT_LOW`, :data:`DEFAULT_HIGH`,
:data:`DEFAULT_NAMED`, :data:`DEFAULT_SURE`) are the one place they are set.

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
import dataclasses
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from dphub.ensemble.aggregate import MergedSpan, aggregate
from dphub.ensemble.measures import measurement_ranges, refused_numbers
from dphub.ensemble.members import ModelMember
from dphub.ensemble.release_paths import CODE as PATH_CODE
from dphub.ensemble.release_paths import (
    HIDDEN_CODE,
    PATHS,
    UNEXPLAINED,
    UNEXPLAINED_CODE,
    VOUCHES,
    Explanation,
    ReleasePath,
)
from dphub.ensemble.releases import shape_released
from dphub.ensemble.words import LETTER_RUN, WORD_RE, joined_by_apostrophe
from dphub.errors import ConfigError
from dphub.labels import UNTYPED, category_of
from dphub.notes import Note, Span
from dphub.rules.lexicon import dictionaries
from dphub.safe_vocab import SafeVocabulary, is_site_word, normalize_word
from dphub.scores import LabelThresholds, TokenScores
from dphub.textnorm import normalized_text

#: Default thresholds of ``--aggregate inverse`` (no ``:LOW,HIGH``), used until ``ensemble
#: calibrate`` chooses the owner's own: ``inverse:0.005,0.01,0.002,0.0005``. LOW: the P(PHI)
#: below which a word nothing vouches for comes back (with a model member, in lower case, and
#: never with a sign of a name: :func:`name_signs`); HIGH: the P(PHI) below which a vocabulary
#: word or a measurement number comes back; NAMED: the stricter HIGH of vouched words with a
#: sign of a name and of context words. Chosen on cross-fitted tuning parts of the dev corpus's
#: 95 training patients (each scored by a DP model that did not see it) as the most text kept
#: with no PHI token missed beyond the strict rule's on any part, then checked on the held-out
#: patients (docs/recall_first.md: recall 0.997 as the strict rule's in four DP draws of the
#: default model, 96.7 to 97.3 % of the other words kept with SURE); two draws' tuning parts put
#: each value at or one step inside the edge of what misses no PHI. All depend on the model's
#: calibration and runtime: calibrate on your own labels.
DEFAULT_LOW = 0.005
DEFAULT_HIGH = 0.01
DEFAULT_NAMED = 0.002
#: SURE: the P(PHI) below which any other word comes back (a word with a weak sign of a name,
#: a capitalised or unknown one, a single capital, a number outside every measurement) unless
#: its shape alone refuses it (:func:`sure_refused`). Chosen as LOW, HIGH and NAMED were, on
#: finer P than before (docs/recall_first.md, "Very sure").
DEFAULT_SURE = 0.0005

#: a model member without a threshold of its own flags at this P(PHI) under the inverse rule
#: (its joint decoding has no per-word probability to compare)
MODEL_FLAG_DEFAULT = 0.5

_VERTICAL = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")


@dataclass(frozen=True)
class InverseRule:
    """``inverse``, ``inverse:LOW,HIGH`` (0 <= LOW <= HIGH <= 1), ``inverse:LOW,HIGH,NAMED``
    or ``inverse:LOW,HIGH,NAMED,SURE`` (0 <= NAMED, SURE <= 1); see the module docstring."""

    #: no defaults: ``inverse`` alone is :meth:`default` (with NAMED and SURE), and an
    #: ``InverseRule()`` that silently differed from it would be a second default
    low: float
    high: float
    #: the P(PHI) below which a vouched word with a sign of a name or a context word comes back
    #: (None: HIGH, as for the other vouched words; the lower of this and HIGH applies).
    #: ``inverse:LOW,HIGH`` without a third value parses to None, so a stored rule keeps its
    #: meaning; ``inverse`` alone parses to :data:`DEFAULT_NAMED` (:meth:`default`)
    named: float | None = None
    #: the P(PHI) below which every word that no shape refuses comes back (a fourth value,
    #: ``inverse:LOW,HIGH,NAMED,SURE``; None: no such release, as before it existed, so a
    #: stored rule keeps its meaning; ``inverse`` alone parses to :data:`DEFAULT_SURE`)
    sure: float | None = None

    #: the forward rule's interface (calibration and listings read these): one flag hides
    k = 1
    alone: tuple[str, ...] = ()
    #: the rule reads the safe vocabulary (:mod:`dphub.ensemble.aggregation`)
    uses_safe_vocabulary: ClassVar[bool] = True
    #: ``ensemble calibrate`` chooses LOW and HIGH (:mod:`dphub.ensemble.inverse_calibrate`)
    own_thresholds: ClassVar[bool] = True
    #: words no member flagged are hidden untyped (``PHI``): no label a student could learn
    typed_spans: ClassVar[bool] = False

    @classmethod
    def default(cls) -> InverseRule:
        """``inverse`` alone: :data:`DEFAULT_LOW`, :data:`DEFAULT_HIGH`, :data:`DEFAULT_NAMED`,
        :data:`DEFAULT_SURE`."""
        return cls(DEFAULT_LOW, DEFAULT_HIGH, DEFAULT_NAMED, DEFAULT_SURE)

    @classmethod
    def parse(cls, text: str) -> InverseRule:
        t = text.strip().lower()
        shown = text if len(text) <= 80 else text[:60] + "..."
        usage = (f"aggregate rule {shown!r}: use 'inverse', 'inverse:LOW,HIGH', "
                 "'inverse:LOW,HIGH,NAMED' or 'inverse:LOW,HIGH,NAMED,SURE' with "
                 "0 <= LOW <= HIGH <= 1, 0 <= NAMED <= 1 and 0 <= SURE <= 1 (LOW: words nothing "
                 "vouches for, HIGH: vocabulary words and measurement numbers, NAMED: vouched "
                 "words with a sign of a name, SURE: any word no shape refuses)")
        if t == "inverse":
            return cls.default()
        num = r"\s*(\d*\.?\d+(?:e-?\d+)?)"
        m = re.fullmatch(rf"inverse:{num}\s*,{num}(?:\s*,{num}(?:\s*,{num})?)?", t)
        if not m:
            raise ConfigError(usage)
        low, high = float(m.group(1)), float(m.group(2))
        named = None if m.group(3) is None else float(m.group(3))
        sure = None if m.group(4) is None else float(m.group(4))
        if not (0.0 <= low <= high <= 1.0 and all(v is None or 0.0 <= v <= 1.0
                                                  for v in (named, sure))):
            raise ConfigError(usage)
        return cls(low, high, named, sure)

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
        return min(self.low, self.high if self.named is None else self.named,
                   self.low if self.sure is None else self.sure, lowest)

    def merge(self, text: str, member_spans: Mapping[str, Sequence[Span]], *,
              vocabulary: SafeVocabulary,
              models: Mapping[str, float | LabelThresholds | None]) -> list[MergedSpan]:
        """One note's merged spans (:func:`inverse_aggregate`)."""
        return inverse_aggregate(text, member_spans, self, vocabulary, models=models)

    def explain(self, text: str, member_spans: Mapping[str, Sequence[Span]], *,
                vocabulary: SafeVocabulary,
                models: Mapping[str, float | LabelThresholds | None]
                ) -> tuple[list[MergedSpan], Explanation]:
        """:meth:`merge`'s spans and why (each kept word's release path, the words the rule hid
        that no member flagged): one word table serves both."""
        table = word_table(text, member_spans, vocabulary, models=models)
        return hidden_spans(text, table, self), explanation(table, self)

    def __str__(self) -> str:
        tail = "" if self.named is None and self.sure is None else \
            f",{self.high if self.named is None else self.named:g}"
        if self.sure is not None:
            tail += f",{self.sure:g}"
        return f"inverse:{self.low:g},{self.high:g}{tail}"


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
    #: words hidden whatever the models say: parts of an institution or street name, of a number
    #: spelled out in words, of a word broken across a line (:func:`blocked_words`)
    blocked: np.ndarray | None = None
    #: words with a sign of a name (:func:`name_signs`): a vouched one needs P < NAMED, an
    #: unvouched one never comes back
    named: np.ndarray | None = None
    #: context words their neighbours did not release, written as words are (lower case, or in
    #: a line of capitals): with a model member they are vouched words with a sign of a name
    #: by construction, so they come back at P < NAMED when nothing else signs them
    context: np.ndarray | None = None
    #: words without a capital letter, and single capitals written as shorthand
    #: (:func:`single_capitals`): the unvouched words a model may let back at P < LOW (a name or
    #: a place is written capitalised far more often, and one in lower case mostly follows a
    #: name cue, which signs it)
    lower: np.ndarray | None = None
    #: words in capitals in a line of capitals (:func:`in_capitals`): there a capital says
    #: nothing, so an unvouched one needs P below both LOW and NAMED, as if it showed a sign
    capitals: np.ndarray | None = None
    #: words whose shape alone refuses them the SURE release (:func:`sure_refused`): a strong
    #: sign of a name, an initial, a number that could be a date, an age or an ID
    refused: np.ndarray | None = None
    #: words with a strong sign of a name (:func:`strong_name_signs`); with SURE given, a
    #: vouched word whose signs are all weak needs only P < LOW (HIGH if lower, never stricter
    #: than NAMED)
    strong: np.ndarray | None = None
    #: closed-class words written as words are, not blocked, without a strong sign of a name and
    #: no context word (:data:`FUNCTION_WORDS`): with SURE and a model member they come back
    #: whatever P
    function: np.ndarray | None = None
    #: which source vouched for a vouched word (an index into
    #: :data:`dphub.ensemble.release_paths.VOUCHES`; -1: none), so each kept word can name its
    #: release path (:meth:`release_paths`)
    vouch: np.ndarray | None = None

    def release_paths(self, low: float, high: float, named: float | None = None,
                      sure: float | None = None) -> np.ndarray:
        """Per word, the code of the path that let it back (an index into
        :data:`dphub.ensemble.release_paths.PATHS`), ``HIDDEN_CODE`` for a hidden word and
        ``UNEXPLAINED_CODE`` for a kept word no path accounts for (a bug the audit shows).

        The conditions are those of :meth:`kept`, one path at a time, in the order of ``PATHS``;
        which words are kept is :meth:`kept`'s answer, so the two never disagree on that.
        """
        keep = self.kept(low, high, named, sure)
        codes = np.where(keep, UNEXPLAINED_CODE, HIDDEN_CODE).astype(np.int8)
        other, capitals, context, strict, bar, ladder = self._classes(low, high, named, sure)
        vouch = np.full(len(self.safe), -1, dtype=np.int8) if self.vouch is None else self.vouch
        vouched = (self.safe | self.measure) & (self.p < bar)
        candidates: list[tuple[ReleasePath, np.ndarray]] = [
            (path, vouched & (vouch == k)) for k, path in enumerate(VOUCHES)]
        candidates += [
            (ReleasePath.CONTEXT_WORD, context & (self.p < strict)),
            (ReleasePath.UNKNOWN_LOWER, other & (self.p < low)),
            (ReleasePath.CAPITALS, capitals & (self.p < min(low, strict))),
        ]
        if ladder:
            if self.function is not None:
                candidates.append((ReleasePath.CLOSED_CLASS, self.function))
            candidates.append((ReleasePath.SURE, ~self.refused & (self.p < sure)))
        for path, mask in candidates:
            codes[keep & (codes == UNEXPLAINED_CODE) & mask] = PATH_CODE[path]
        return codes

    def _classes(self, low: float, high: float, named: float | None, sure: float | None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, np.ndarray, bool]:
        """What :meth:`kept` and :meth:`release_paths` both read: the unknown lower-case words,
        the words in capitals, the context words, the strict bar, each word's bar for vouched
        words, and whether SURE's ladder applies."""
        none = np.zeros_like(self.safe)
        signs = none if self.named is None or not self.model else self.named
        unknown = (self.letters & ~self.safe & ~signs) if self.model else none
        other = unknown if self.lower is None else unknown & self.lower
        capitals = none if self.capitals is None else unknown & self.capitals
        context = none if self.context is None or not self.model else self.context & ~signs
        strict = high if named is None else min(named, high)
        bar = np.where(signs, strict, high)
        ladder = sure is not None and self.model and self.refused is not None
        if ladder and self.strong is not None:
            bar = np.where(signs & ~self.strong, max(strict, min(low, high)), bar)
        return other, capitals, context, strict, bar, bool(ladder)

    def kept(self, low: float, high: float, named: float | None = None,
             sure: float | None = None) -> np.ndarray:
        """Which words come back under ``inverse:LOW,HIGH,NAMED,SURE`` (``named`` None: HIGH;
        the lower of NAMED and HIGH applies; ``sure`` None: no SURE release). Without a model
        member P says nothing, so a sign of a name changes nothing, a context word comes back
        only where its neighbours release it and SURE releases nothing: the vocabulary vouches
        alone, as before item 2."""
        other, capitals, context, strict, bar, ladder = self._classes(low, high, named, sure)
        vouched = self.safe | self.measure
        keep = ~self.flagged & ((vouched & (self.p < bar)) | (other & (self.p < low))
                                | (context & (self.p < strict))
                                | (capitals & (self.p < min(low, strict))))
        if ladder:
            keep |= ~self.flagged & ~self.refused & (self.p < sure)
            if self.function is not None:  # with SURE, as a stored rule keeps its meaning
                keep |= ~self.flagged & self.function
        return keep if self.blocked is None else keep & ~self.blocked

    @classmethod
    def joined(cls, tables: Sequence[WordTable]) -> WordTable:
        """The words of many notes as one table (offsets are per note, so only :meth:`kept`
        and the word columns mean anything): calibration and benchmarks score thousands of
        settings, one array operation each instead of one per note. The tables must agree on
        having a model member and on which optional columns they carry."""
        if not tables:
            raise ValueError("no tables to join")
        if len({t.model for t in tables}) > 1:
            raise ValueError("tables of ensembles with and without a model member")
        cols: dict[str, Any] = {"flags": [], "model": tables[0].model}
        for f in dataclasses.fields(cls):
            if f.name in cols:
                continue
            vals = [getattr(t, f.name) for t in tables]
            if all(v is None for v in vals):
                cols[f.name] = None
            elif any(v is None for v in vals):
                raise ValueError(f"tables disagree on the column {f.name!r}")
            else:
                cols[f.name] = np.concatenate(vals)
        return cls(**cols)


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
    found = list(WORD_RE.finditer(text))
    shorthand = shorthand_letters(text)
    signed, strong, placed = _signs(text, found, vocab)
    by_context = context_released(text, found, vocab)
    by_shape = shape_released(text, found, vocab, measures, NAME_CUES_BEFORE, NAME_CUES_AFTER)
    by_site = site_released(found, vocab, placed)
    vouch = np.full(len(found), -1, dtype=np.int8)  # which source vouched (release_paths.VOUCHES)
    for wi, m in enumerate(found):
        a, b = m.start(), m.end()
        while ci < len(cover) and cover[ci][1] <= a:
            ci += 1
        hit = ci < len(cover) and cover[ci][0] < b
        p = _max_p(word_p, p_starts, longest, a, b)
        word = m.group()
        if any(c.isdigit() for c in word):
            k = bisect.bisect_right(m_starts, a) - 1
            measure = k >= 0 and measures[k][0] <= a and b <= measures[k][1]
            if measure:
                vouch[wi] = PATH_CODE[ReleasePath.MEASUREMENT]
            rows.append((a, b, hit, p, False, measure, False))
        else:
            source = (ReleasePath.VOCABULARY if vocab.contains(word)
                      else ReleasePath.SHORTHAND if a in shorthand
                      else ReleasePath.CONTEXT if wi in by_context
                      else ReleasePath.SHAPE if wi in by_shape
                      else ReleasePath.SITE_WORD if wi in by_site
                      else ReleasePath.CLITIC if _clitic(text, found, wi, vocab)
                      else ReleasePath.VALUE_KEY if _value_key(text, found, wi, measures)
                      else None)
            if source is not None:
                vouch[wi] = PATH_CODE[source]
            rows.append((a, b, hit, p, source is not None, False, True))
    cols = list(zip(*rows, strict=True)) if rows else [()] * 7
    blocked = np.zeros(len(found), dtype=bool)
    blocked[sorted(blocked_words(text, found, vocab))] = True
    named = np.zeros(len(found), dtype=bool)
    named[sorted(signed)] = True
    strong_mask = np.zeros(len(found), dtype=bool)
    strong_mask[sorted(strong)] = True
    capitals = in_capitals(text, found)
    context = np.zeros(len(found), dtype=bool)
    context[sorted(i for i in _context_written_as_words(found, vocab, capitals)
                   if not rows[i][4])] = True
    lower = np.array([not any(c.isupper() for c in m.group()) for m in found], dtype=bool)
    function = np.array([normalize_word(m.group()) in FUNCTION_WORDS
                         and not vocab.is_context(m.group()) for m in found], dtype=bool)
    function &= (lower | capitals) & ~strong_mask
    lower[sorted(single_capitals(text, found, vocab, named))] = True
    return WordTable(np.array(cols[0], dtype=np.int64), np.array(cols[1], dtype=np.int64),
                     np.array(cols[2], dtype=bool), np.array(cols[3], dtype=float),
                     np.array(cols[4], dtype=bool), np.array(cols[5], dtype=bool), flagged,
                     np.array(cols[6], dtype=bool), bool(models), blocked, named, context,
                     lower, capitals, sure_refused(text, found, vocab, strong), strong_mask,
                     function, vouch)


def site_released(words: Sequence[re.Match[str]], vocab: SafeVocabulary,
                  placed: set[int]) -> set[int]:
    """Indices of the words a site-local safe word vouches for (issue 54;
    :attr:`dphub.safe_vocab.SafeVocabulary.site`): a vouched word then, released as a vocabulary
    word is (no member flags it, every model's P below HIGH, not blocked) — but only when this
    occurrence is written in lower-case letters as the file's word is
    (:func:`dphub.safe_vocab.is_site_word`: never capitalised, a single letter, digits or a
    shape), stands where no name stands (``placed``: every sign of :func:`name_signs` but the
    lists: after a name cue or an initial, before a cue after a name, the other half of a name),
    and the word is in neither the rule member's first-name and surname lists nor the
    vocabulary's context words (names that are also words: ``smith``, ``rose``). The wider
    census list of names-only-in-context (``monday``, a surname too) is left to the signs of
    place, as the rule member itself reads it. A reviewer's "not PHI" then never lets back a
    word written or placed as a name, nor one a model is sure of."""
    if not vocab.site:
        return set()
    names = dictionaries().names
    out: set[int] = set()
    for i, m in enumerate(words):
        w = m.group()
        if (i not in placed and is_site_word(w) and w in vocab.site and w not in names
                and not vocab.is_context(w)):
            out.add(i)
    return out


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
    out = ~table.kept(rule.low, rule.high, rule.named, rule.sure) & ~table.flagged  # flagged words are in the flags
    hidden = [MergedSpan(int(table.start[i]), int(table.end[i]), UNTYPED, float(table.p[i]), ())
              for i in np.flatnonzero(out)]
    return _join(text, sorted([*table.flags, *hidden], key=lambda s: (s.start, s.end)))


def explanation(table: WordTable, rule: InverseRule) -> Explanation:
    """Each kept word of ``table`` with its release path under ``rule``, and the words the
    rule hid that no member flagged (:mod:`dphub.ensemble.release_paths`)."""
    codes = table.release_paths(rule.low, rule.high, rule.named, rule.sure)
    kept = tuple((int(table.start[i]), int(table.end[i]),
                  UNEXPLAINED if codes[i] == UNEXPLAINED_CODE else PATHS[codes[i]].value)
                 for i in np.flatnonzero(codes != HIDDEN_CODE))
    hidden = tuple((int(table.start[i]), int(table.end[i]))
                   for i in np.flatnonzero((codes == HIDDEN_CODE) & ~table.flagged))
    return Explanation(kept, hidden)


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


#: letters around a slash (``s/p``, ``c/o``, ``d/c``, ``u/o``, ``w/o``, ``I/O``) and ``w/``,
#: ``c/`` before a space: clinical shorthand, whose single letters are no initials
_SHORTHAND = re.compile(
    r"(?<![\w/.])[^\W\d_]{1,2}/[^\W\d_]{1,2}(?![\w/])|(?<![\w/.])[wWcC]/(?=[ \t])")


def shorthand_letters(text: str) -> set[int]:
    """Start offsets of the letter words inside clinical shorthand (``s/p``, ``w/``)."""
    out: set[int] = set()
    for m in _SHORTHAND.finditer(text):
        out.update(m.start() + w.start() for w in LETTER_RUN.finditer(m.group()))
    return out


#: a word before which a context word may be a name or a place (titles, kin, contact verbs,
#: prepositions of place and company)
NAME_CUES_BEFORE = frozenset("""
dr doctor mr mrs ms miss mister prof professor sister brother father mother son daughter wife
husband friend aunt uncle cousin nephew niece grandson granddaughter grandmother grandfather
nurse rn md np pa attending resident fellow intern by with to from at named called call paged
page notified contacted spoke saw seen see per and or of in near lives living visited visit
st saint mt mount fort lake port new north south east west dear hi hello name contact signed
team cc thanks thank family
""".split())  # noqa: SIM905 - a readable word block
#: the cues of :data:`NAME_CUES_BEFORE` and :data:`NAME_CUES_AFTER` that are function words of
#: every sentence and name no person's or place's role (not ``by``, ``with``, ``per``, ``at``,
#: ``from``): beside one, a context word in lower case (``to good effect``, ``pleasant and``)
#: shows no sign of a name for :func:`name_signs`; it is still a context word, which the models
#: must be sure of (P < NAMED)
WEAK_CUES = frozenset(("to", "and", "or", "of", "in"))
#: a word after which a context word may be a name or a place (a phone's word too: ``Xyz
#: cell``)
NAME_CUES_AFTER = frozenset("""
md rn np pa phd do jr sr hospital clinic center centre church street st avenue ave road rd
county city university college school and or called said says reports reported stated states
notified aware family cell phone pager beeper tel telephone mobile
""".split())  # noqa: SIM905 - a readable word block
#: the cues of :data:`NAME_CUES_BEFORE` and :data:`NAME_CUES_AFTER` that are words of every
#: sentence (prepositions, conjunctions, verbs of seeing and saying): beside one, a word is a
#: name only sometimes, so a model that is very sure (P < SURE) may let it back. Every other
#: cue — a title, kin, a role, an agent's or a place's preposition (``by``, ``per``, ``at``,
#: ``from``), a place name's part, a professional suffix, a phone — is a *strong* sign
#: (:func:`strong_name_signs`), which no model lets back
COMMON_CUES = frozenset("""
with and or to of in see seen saw near visit visited call new said says reports reported
stated states
""".split())  # noqa: SIM905 - a readable word block
#: closed-class English words (pronouns, articles, prepositions, conjunctions, auxiliaries)
#: that name no person or place: with SURE and a model member they come back whatever its P
#: (step 8 of the module docstring; without SURE a stored rule keeps its meaning). Left out:
#: the two-letter codes of states and provinces (``in``, ``or``, ``on``, ``me``: ``SALEM,
#: OR``), words that are also given names or months (``will``, ``may``, ``can``), ``a`` and
#: ``i`` (initials) and ``us``; a word the vocabulary treats as a context word is decided by
#: the context-word rule instead.
FUNCTION_WORDS = frozenset("""
the an this that these those his hers him he she they them their theirs it its we our ours you
your yours my and but nor if than as of at by for with from to into onto upon over under about
after before is are was were be been being am has have had does did would shall should could
might must not no
""".split())  # noqa: SIM905 - a readable word block
_SPACES = frozenset(" \t")
#: between a context word and the word before it: spaces (the word before must be a safe word)
#: or a clause's punctuation on the same line (``.``, ``;``, ``/``: the word before is another
#: clause's and need only be no name cue)
_BEFORE_GAP = re.compile(r"[ \t]+")
_BEFORE_CLAUSE = re.compile(r"[ \t]*[,:;./(=][ \t]*")
#: after a context word: the end of a clause or of the line
_CLAUSE_END = re.compile(r"[ \t]*(?:[.,;:!?)/=]|\r?\n|$)")


#: release context words across a clause's punctuation and before numbers too (measured in
#: docs/recall_first.md: more text kept, less recall on the tuning split, so off by default)
CONTEXT_ACROSS_CLAUSES = False


def context_released(text: str, words: Sequence[re.Match[str]], vocab: SafeVocabulary,
                     across_clauses: bool | None = None) -> set[int]:
    """Indices of the context words (ordinary words that are also names or places: "will",
    "ward", "good") that the words around them show to be no name.

    Released: a context word in lower case (or in capitals between words in capitals: a note
    written in capitals) between two safe words of the same case on the same line, separated
    by spaces only, the one before no name cue ("Dr", "by", "with", "son"), the one after no
    cue after a name ("MD", "Hospital", "called"): a surname after a first name is no safe
    word. ``across_clauses`` (default :data:`CONTEXT_ACROSS_CLAUSES`) also releases it after
    the end of another clause (``stable. good``, ``bs/clear``) and before the end of a clause
    (``.``, ``,``, ``;``, ``)``, ``/``, the end of the line) or a number. A capitalised context word is never released ("Will" may be anyone), nor one
    next to another context word ("will ward")."""
    if across_clauses is None:
        across_clauses = CONTEXT_ACROSS_CLAUSES
    out: set[int] = set()
    for i, m in enumerate(words):
        w = m.group()
        if i == 0 or not vocab.is_context(w):
            continue
        caps = not w.islower()
        if caps and not (w.isupper() and len(w) > 1):
            continue
        prev = words[i - 1]
        pw = prev.group()
        if normalize_word(pw) in NAME_CUES_BEFORE:
            continue
        if _BEFORE_GAP.fullmatch(text, prev.end(), m.start()):
            if (not vocab.contains(pw) or (pw.isupper() and len(pw) > 1) != caps
                    or (not caps and not pw.islower())):
                continue
        elif not (across_clauses and _BEFORE_CLAUSE.fullmatch(text, prev.end(), m.start())):
            continue
        if across_clauses and _CLAUSE_END.match(text, m.end()):
            out.add(i)
            continue
        if i + 1 >= len(words):
            continue
        nxt = words[i + 1]
        nw = nxt.group()
        digits = across_clauses and any(c.isdigit() for c in nw)
        if (set(text[m.end():nxt.start()]) <= _SPACES and text[m.end():nxt.start()]
                and normalize_word(nw) not in NAME_CUES_AFTER and (digits or vocab.contains(nw))
                and (digits or ((nw.isupper() and len(nw) > 1) if caps else nw.islower()))):
            out.add(i)
    return out


#: words that head an institution's or a street's name: the words before them are its name
#: ("University Hospital", "Good Samaritan Medical Center", "Grace Church", "Main Street"), and
#: a company's suffix ("Acme Corp", issue 57; not "inc": in a note it says "increased")
INSTITUTION_HEADS = frozenset("""
hospital hospitals hosp clinic clinics center centre ctr cntr church chapel cathedral infirmary
institute college university univ school academy sanatorium hospice street avenue ave road
boulevard blvd lane parkway highway terrace
corp corporation incorporated llc ltd
""".split())  # noqa: SIM905 - a readable word block
#: words that end an institution's name going back: the name starts after them
_NAME_STOPS = frozenset("""
the a an of to from at in on and or for by with his her their our its this that these those
was is were are be been being per via into onto outside local another other same different
previous prior current which where who when while then than as if osh our your my
transferred transfer admitted discharged sent went go going seen followed follows
""".split())  # noqa: SIM905 - a readable word block
#: number words: three or more in a row spell a number (a phone, an ID, an address)
NUMBER_WORDS = frozenset("""
zero oh o one two three four five six seven eight nine ten eleven twelve thirteen fourteen
fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty
ninety hundred thousand double triple
""".split())  # noqa: SIM905 - a readable word block
#: titles: the word after one (spaces or ``. ``) is a name, whatever the vocabulary says
_TITLES = frozenset(("dr", "doctor", "mr", "mrs", "miss", "mister", "prof", "professor"))


def _after_title(word: str, vocab: SafeVocabulary) -> bool:
    """Whether the word after a title is written as a name: letters, and not a lower-case
    vocabulary word that is no context word (``dr aware``, ``dr notified``: the doctor)."""
    return word.isalpha() and not (word.islower() and vocab.contains(word)
                                   and not vocab.is_context(word))


def _title_ms(text: str, words: Sequence[re.Match[str]], i: int) -> bool:
    """Whether ``ms`` at word ``i`` is a title (``Ms. X``, ``Ms Xyz``), not morphine sulfate or
    multiple sclerosis (``MS contin``, ``ms 2 mg``): a full stop after it or a capitalised
    name after it."""
    nxt = words[i + 1].group()
    return text.startswith(".", words[i].end()) or (nxt[:1].isupper() and not nxt.isupper())


_HYPHEN_BREAK = re.compile(r"[ \t]*[-\u2010\u2011][ \t]*\r?\n[ \t]*")
_NUMBER_GAP = re.compile(r"[ \t,.\-]*")


def blocked_words(text: str, words: Sequence[re.Match[str]], vocab: SafeVocabulary) -> set[int]:
    """Indices of words hidden whatever the vocabulary and the models say (issue 36):

    - an institution's or street's name: up to four words before a head word ("hospital",
      "clinic", "church", "street"…) back to a function word — and across an ``of`` to the
      capitalised word before it ("University of Xyz Medical Center") —, the head itself, and
      up to three words after ``of`` following it, and a ``the`` before them ("University
      Hospital", "Hospital of Saint Raphael", "Church of the Xyz");
      and the capitalised word after ``St``/``Saint``/``Mt`` ("St. Luke's"), and ``holy`` or
      ``sacred`` with the word after it in any case ("Holy Cross", "sacred heart");
    - the word after a title (``Dr``, ``Mr``, ``Mrs``, ``Ms``, ``Prof``…: "Mr I", "Dr Good";
      not a lower-case vocabulary word, "dr aware");
    - three or more number words in a row ("five five five one two"): a number spelled out;
    - the two halves of a word broken across a line by a hyphen, unless joined they are a
      safe word ("fol-/low" → "follow"): "Wood-/ward" is a surname in two vocabulary words.
    """
    out: set[int] = set()
    lower = [normalize_word(m.group()) for m in words]
    n = len(words)

    def gap(i: int) -> str:  # the text between word i and word i + 1, read as members read it
        return normalized_text(text[words[i].end():words[i + 1].start()])  # NBSP, zero-width

    def joined(i: int) -> bool:  # word i and i + 1 on one line, spaces or a name's . ' between
        g = gap(i)
        return "\n" not in g and len(g) <= 3 and all(c in " \t.'’" for c in g)

    for i, w in enumerate(lower):
        if w in INSTITUTION_HEADS:
            j = i
            while j > 0 and i - j < 4 and joined(j - 1) and lower[j - 1] not in _NAME_STOPS \
                    and not any(c.isdigit() for c in lower[j - 1]):
                j -= 1
            # "University of Xyz Medical Center", "U of X Hospital": across one ``of``
            # to a capitalised word before it
            if (j >= 2 and j < i and lower[j - 1] == "of" and joined(j - 2) and joined(j - 1)
                    and words[j - 2].group()[:1].isupper()
                    and lower[j - 2] not in _NAME_STOPS):
                j -= 2
            if j < i:
                out.update(range(j, i + 1))
            if i + 2 < n and lower[i + 1] == "of" and joined(i) and joined(i + 1):
                k = i + 2
                out.update((i, i + 1))
                last = i + 4
                if lower[k] == "the" and k + 1 < n and joined(k):  # "Hospital of the Xyz"
                    out.add(k)
                    k, last = k + 1, last + 1
                while k < n and k <= last and lower[k] not in _NAME_STOPS:
                    out.add(k)
                    if k + 1 >= n or not joined(k):
                        break
                    k += 1
        if (i + 1 < n and (w in _TITLES or (w == "ms" and _title_ms(text, words, i)))
                and _INITIAL_GAP.fullmatch(gap(i)) and _after_title(words[i + 1].group(), vocab)):
            out.add(i + 1)  # "Mr I", "Dr Good": the word after a title is a name
        if w in ("holy", "sacred") and i + 1 < n and joined(i) and words[i + 1].group().isalpha():
            out.update((i, i + 1))  # "Holy Cross", "sacred heart": a church's or hospital's
        if w in ("st", "saint", "mt") and i + 1 < n and joined(i) and words[i + 1].group()[:1].isupper() \
                and not words[i + 1].group().isupper():
            out.update((i, i + 1))
    run: list[int] = []
    for i, w in enumerate(lower + [""]):
        if w in NUMBER_WORDS and (not run or _NUMBER_GAP.fullmatch(gap(run[-1]))):
            run.append(i)
            continue
        if len(run) >= 3:
            out.update(run)
        run = [i] if w in NUMBER_WORDS else []
    for i in range(n - 1):
        if _HYPHEN_BREAK.fullmatch(gap(i)) and not vocab.contains(lower[i] + lower[i + 1]):
            out.update((i, i + 1))
    return out


#: what ends a sentence or a heading before a capitalised word on its line: a capital after
#: these (or at the line's start) starts a sentence and is no sign of a name
_SENTENCE_END = frozenset(".:!?-*#>")


def name_signs(text: str, words: Sequence[re.Match[str]], vocab: SafeVocabulary) -> set[int]:
    """Indices of the words that show a sign of a name (issue 36 item 2): capitalised inside a
    sentence (``Xyz`` not at a line's start or after ``.``/``:``), after a name cue (``dr``,
    ``by``, ``with``, ``son``: :data:`NAME_CUES_BEFORE`) or an initial (``E SMITH``), before a
    cue after a name (``MD``, ``called``: :data:`NAME_CUES_AFTER`; a function word of
    :data:`WEAK_CUES` on either side is none for a context word in lower case), or — unless it
    is a context word, which is a name by construction and decided by
    :func:`context_released` — in the rule member's first-name, surname or context-name lists.

    The models are least to be trusted on exactly these: on the dev corpus's inner split the
    PHI words a DP model was sure of (P < 0.05) were almost all of this kind, and the words of
    this kind are a few percent of the others (docs/recall_first.md). So a word with a sign of a
    name that nothing vouches for comes back only when every model is very sure (P < SURE) and
    the sign is not a strong one (:func:`strong_name_signs`), and a vouched one needs the
    stricter NAMED threshold."""
    return _signs(text, words, vocab)[0]


def strong_name_signs(text: str, words: Sequence[re.Match[str]],
                      vocab: SafeVocabulary) -> set[int]:
    """Indices of the words with a *strong* sign of a name, which no model lets back (the SURE
    release refuses them, :func:`sure_refused`): capitalised inside a sentence, in the name
    lists, after an initial, beside a cue that is no common word (a title, kin, a role, a place
    name's part, a professional suffix, a phone: every cue but :data:`COMMON_CUES`), and a
    capitalised word joined to such a capitalised one by a hyphen, spaces or an initial's
    stop (``Xyz-Smith MD``, ``Xyz Zorbak`` after ``patient``): the other half of a name;
    issue 57: one in capitals beside such a capitalised one on a line that is not in capitals
    (``Dr. Xavier ZORBAK``), the lower-case half of a name split by a space (``Jo hnson``) and
    an unknown or capitalised word after ``works for`` / ``employed by`` / ``retired from``
    (:func:`_split_and_employer`).

    On the dev corpus's 95 training patients every PHI word a DP model gave P < 0.0005 with a
    sign of a name had a strong one (docs/recall_first.md)."""
    return _signs(text, words, vocab)[1]


#: between a name and a strong cue beside it: spaces, a title's stop, a suffix's comma
_CUE_GAP = re.compile(r"[ \t]*[.,]?[ \t]+|[ \t]*,")
#: between two halves of a name: a hyphen, spaces, or an initial's stop (``Xyz-Smith``,
#: ``Mary Smith``, ``J. Smith``), on one line
_NAME_JOIN = re.compile(r"[-\u2010\u2011]|[ \t]+|\.[ \t]+")


def _other_half(text: str, words: Sequence[re.Match[str]], i: int, j: int,
                vocab: SafeVocabulary) -> bool:
    """Whether word ``j``, beside word ``i``, is the other half of its name: both capitalised
    as names are, or one of them in capitals on a line that is not (``Dr. Xavier ZORBAK``,
    ``JOHN Zorbak, MD``, issue 57: in a line of capitals a capital says nothing), ``j`` a word
    of letters outside the vocabulary, joined by :data:`_NAME_JOIN`."""
    a, b = (j, i) if j < i else (i, j)
    wj, wi = words[j].group(), words[i].group()
    if not (wj.isalpha() and not vocab.contains(wj)
            and _NAME_JOIN.fullmatch(text, words[a].end(), words[b].start()) is not None):
        return False
    if all(w[:1].isupper() and not w.isupper() for w in (wi, wj)):
        return True
    shouting = [w for w in (wi, wj) if w.isupper() and len(w) > 1]
    return (len(shouting) == 1 and all(w[:1].isupper() for w in (wi, wj))
            and _mixed_line(text, words[a].start()))


def _mixed_line(text: str, at: int) -> bool:
    """Whether the line holding offset ``at`` has a lower-case letter (no line of capitals)."""
    start = text.rfind("\n", 0, at) + 1
    end = text.find("\n", at)
    return any(c.islower() for c in text[start:end if end >= 0 else len(text)])


#: a name broken by a space (issue 57, ``Jo hnson``): a capitalised word outside the vocabulary
#: (or in the name lists), one space or tab, then a lower-case word of letters outside it
_SPLIT_GAP = re.compile(r"[ \t]")
#: the verbs and nouns of employment: the word after ``works for``, ``employed by``, ``retired
#: from`` names an employer (issue 57: a company's name in lower case)
_EMPLOYER_VERBS = frozenset("""
work works worked working employed employee employer job retired retiring contractor
""".split())  # noqa: SIM905 - a readable word block
_EMPLOYER_LINKS = frozenset(("for", "at", "by", "with", "from"))


def _split_and_employer(text: str, words: Sequence[re.Match[str]], vocab: SafeVocabulary,
                        strong: set[int]) -> set[int]:
    """Strong signs of issue 57: the lower-case half of a name split by a space (``Jo
    hnson``: the capitalised half outside the vocabulary or in the name lists, the lower-case
    half outside the vocabulary; or the capitalised half with a strong sign: ``by Joh nson``)
    and a word outside the vocabulary, or a capitalised one,
    after ``works for`` / ``employed by`` / ``retired from`` (a company in lower case)."""
    names = dictionaries().all_names
    out: set[int] = set()
    for i in range(1, len(words)):
        w, prev = words[i].group(), words[i - 1].group()
        pw = normalize_word(prev)
        if (w.isalpha() and w.islower() and not vocab.contains(w)
                and prev.isalpha() and prev[:1].isupper() and not prev.isupper()
                and (not vocab.contains(prev) or pw in names or i - 1 in strong)
                and _SPLIT_GAP.fullmatch(text, words[i - 1].end(), words[i].start())):
            out.add(i)
        if (i >= 2 and pw in _EMPLOYER_LINKS
                and normalize_word(words[i - 2].group()) in _EMPLOYER_VERBS
                and w.isalpha() and (not vocab.contains(w) or not w.islower())):
            out.add(i)
    return out


def _signs(text: str, words: Sequence[re.Match[str]],
           vocab: SafeVocabulary) -> tuple[set[int], set[int], set[int]]:
    """(every sign of a name, the strong ones, the signs of its place: every sign but being in
    the name lists): :func:`name_signs`, :func:`strong_name_signs`, :func:`site_released`."""
    names = dictionaries().all_names
    out: set[int] = set()
    strong: set[int] = set()
    placed: set[int] = set()
    n = len(words)
    for i, m in enumerate(words):
        w = m.group()
        letters = w.isalpha()  # a strong sign is one of a word (numbers: refused_numbers)
        if w[:1].isupper() and not w.isupper():
            before = text[text.rfind("\n", 0, m.start()) + 1:m.start()].rstrip()
            if before and before[-1] not in _SENTENCE_END:
                out.add(i)
                placed.add(i)
                # strong inside a sentence, after a word or a comma (``patient Xyz``, ``Son,
                # Ed``); after a sign (``BUN & Crea``, ``+Flatus``, ``~ Tmax``) it is weak
                if letters and (before[-1].isalnum() or before[-1] in ",;"):
                    strong.add(i)
                continue
        cue = normalize_word(words[i - 1].group()) if i else ""
        after = normalize_word(words[i + 1].group()) if i + 1 < n else ""
        plain = w.islower() and vocab.is_context(w)  # a function word is no cue beside it
        cue_before = cue in NAME_CUES_BEFORE and not (plain and cue in WEAK_CUES)
        cue_after = after in NAME_CUES_AFTER and not (plain and after in WEAK_CUES)
        initial = bool(i) and _after_initial(text, words, i)
        listed = normalize_word(w) in names and not vocab.is_context(w)
        if cue_before or initial or cue_after or listed:
            out.add(i)
        # a site word in lower case is read as a lower-case context word is: a function word
        # beside it (``on monday and``) is no sign of a name (:data:`WEAK_CUES`)
        site = w.islower() and vocab.is_site(w)
        if (initial or (cue_before and not (site and cue in WEAK_CUES))
                or (cue_after and not (site and after in WEAK_CUES))):
            placed.add(i)
        # an initial is strong in a name's case (``E SMITH``, ``J. Smith``; ``w good`` is
        # shorthand); a cue after is none before a number (``PA 27-41``: a pressure)
        named_case = w[:1].isupper() and words[i - 1].group().isupper() if i else False
        # a strong cue is one beside the word on its line (``Dr. Xyz``, ``Xyz, MD``), not one
        # across a line break or a clause (``yellow. \n Family:``)
        near_before = bool(i) and _CUE_GAP.fullmatch(text, words[i - 1].end(), m.start())
        near_after = i + 1 < n and _CUE_GAP.fullmatch(text, m.end(), words[i + 1].start())
        keyword = i + 2 < n and words[i + 2].group()[:1].isdigit() and bool(
            _BEFORE_GAP.fullmatch(text, words[i + 1].end(), words[i + 2].start()))
        if letters and ((cue_before and cue not in COMMON_CUES and near_before)
                        or (initial and named_case)
                        or (cue_after and after not in COMMON_CUES and not keyword and near_after)
                        or listed):
            strong.add(i)
    # the other half of a name: a capitalised word outside the vocabulary joined to a
    # capitalised one with a strong sign (one step: a line in capitals is no chain of names)
    halves = {j for i in strong for j in (i - 1, i + 1)
              if 0 <= j < n and j not in strong and _other_half(text, words, i, j, vocab)}
    halves |= _split_and_employer(text, words, vocab, strong | halves)
    return out | halves, strong | halves, placed | halves


#: between a single capital and the lower-case word or number after it: spaces, or a colon, an
#: equals sign or a dash and spaces (``R arm``, ``O: afebrile``, ``K 3.8``, ``T= 99``); not a
#: full stop (``J. smith``)
_SINGLE_GAP = re.compile(r"[ \t]*[:=-]?[ \t]+|[ \t]*[:=-][ \t]*")


def single_capitals(text: str, words: Sequence[re.Match[str]], vocab: SafeVocabulary,
                    named: np.ndarray) -> set[int]:
    """Indices of the single capitals written as shorthand is, not as an initial: a capital
    other than ``A`` and ``I`` that shows no sign of a name itself (``named``:
    :func:`name_signs`), before a number or a lower-case vocabulary word that is no name on its
    line (``R arm``, ``O: afebrile``, ``K 3.8``). An initial is followed by a surname: written
    capitalised, unknown, in the name lists or a context word (``J smith``, ``e good``). These
    come back as lower-case unknown words do (P < LOW, with a model member)."""
    names = dictionaries().all_names
    out: set[int] = set()
    for i in range(len(words) - 1):
        w, nxt = words[i].group(), words[i + 1].group()
        if (len(w) != 1 or not w.isupper() or normalize_word(w) in ("a", "i") or named[i]
                or not _SINGLE_GAP.fullmatch(text, words[i].end(), words[i + 1].start())):
            continue
        if nxt[:1].isdigit() or (nxt.islower() and vocab.contains(nxt)
                                 and not vocab.is_context(nxt)
                                 and normalize_word(nxt) not in names):
            out.add(i)
    return out


#: between an initial and the name after it: spaces, or a full stop and spaces (``J. Smith``)
_INITIAL_GAP = re.compile(r"\.?[ \t]+")


def _after_initial(text: str, words: Sequence[re.Match[str]], i: int) -> bool:
    """Word ``i`` follows an initial: a single letter other than ``a`` and ``I`` that is no part
    of shorthand (no ``/`` beside it) nor a clitic (``pt's``, ``don't``: an apostrophe before
    it) and follows no number across spaces (``2 L``: a unit; ``4.2. K. SMITH`` is an initial
    after a sentence), with only spaces or ``. `` between them (``E SMITH``, ``j. doe``,
    ``john r smith``)."""
    prev = words[i - 1]
    pw = normalize_word(prev.group())
    gap = normalized_text(text[prev.end():words[i].start()])  # NBSP, fullwidth ., zero-width
    # ``pt's``: a clitic, not an initial (an opening quote is no clitic: ``'J Smith'``)
    clitic = i >= 2 and pw in _CLITICS and joined_by_apostrophe(text, words[i - 2], prev)
    if (len(pw) != 1 or not pw.isalpha() or pw in "ai" or not words[i].group().isalpha()
            or not _INITIAL_GAP.fullmatch(gap) or clitic
            or unicodedata.normalize("NFKC", text[prev.start() - 1:prev.start()]) == "/"):
        return False
    if i < 2 or not any(c.isdigit() for c in words[i - 2].group()):
        return True
    return not _BEFORE_GAP.fullmatch(text, words[i - 2].end(), prev.start())


def initial_letters(text: str, words: Sequence[re.Match[str]], vocab: SafeVocabulary) -> set[int]:
    """Indices of the letters in an initial's shape: a single letter that starts a word (after
    a space, a line's start, a bracket, a quote, a dash or a clause's punctuation:
    ``HEPARIN-K. ZORBAK AWARE``), before a name across spaces or a full stop
    (``J Smith``, ``E. BROWN``, ``U Xyz``) or before a full stop that ends its line (``--J.``);
    and the letters of a dotted group before a name (``J.R. Smith``). A name here is a
    capitalised word, a word in capitals that is no vocabulary word or a context word
    (``BROWN``), or a word in the name lists. Not an initial: a letter glued to what is before
    it (``80'S.``, ``P&T.``, ``R>L.``), a dotted abbreviation before an ordinary word (``N.G.
    PLACED``, ``C.I. 2.4``), a letter before an ordinary word (``T max``, ``R foot``)."""
    names = dictionaries().all_names

    def name_like(j: int) -> bool:
        w = words[j].group()
        return w.isalpha() and ((w[:1].isupper() and not w.isupper())
                                or (w.isupper() and len(w) > 1
                                    and (not vocab.contains(w) or vocab.is_context(w)))
                                or normalize_word(w) in names)

    out: set[int] = set()
    n = len(words)
    for i, m in enumerate(words):
        w = m.group()
        if len(w) != 1 or not w.isalpha():
            continue
        before = text[m.start() - 1:m.start()] if m.start() else ""
        if before and not (before.isspace() or before in "([{\"'-\u2013\u2014:;,"):
            # glued to what precedes it: the second letter of a dotted group, or shorthand
            if before == "." and m.start() >= 2 and text[m.start() - 2].isalpha():
                j = i
                while j + 1 < n and text.startswith(".", words[j].end()) \
                        and words[j + 1].start() == words[j].end() + 1 \
                        and len(words[j + 1].group()) == 1:
                    j += 1
                if j + 1 < n and _INITIAL_GAP.fullmatch(text, words[j].end() + 1
                                                        if text.startswith(".", words[j].end())
                                                        else words[j].end(),
                                                        words[j + 1].start()) and name_like(j + 1):
                    out.update(range(i - 1, j + 1))
            continue
        stop = text.startswith(".", m.end())
        if stop and i + 1 < n and words[i + 1].start() == m.end() + 1:
            continue  # the first letter of a dotted group: decided with its last letter
        if i + 1 >= n or "\n" in text[m.end():words[i + 1].start()]:
            if stop:
                out.add(i)  # "J." at a line's end: a signature's initial
            continue
        if _INITIAL_GAP.fullmatch(text, m.end(), words[i + 1].start()) and name_like(i + 1):
            out.add(i)
    return out


def sure_refused(text: str, words: Sequence[re.Match[str]], vocab: SafeVocabulary,
                 strong: set[int]) -> np.ndarray:
    """Which words the SURE release may never let back, whatever the models say: a strong sign
    of a name (``strong``: :func:`strong_name_signs`), a letter in an initial's shape
    (:func:`initial_letters`), a number that could be a date, a year, an age, an ID or a phone
    by its shape (:func:`dphub.ensemble.measures.refused_numbers`). Blocked words
    (:func:`blocked_words`) are refused by :meth:`WordTable.kept` itself."""
    out = np.zeros(len(words), dtype=bool)
    out[sorted(strong | initial_letters(text, words, vocab))] = True
    ranges = refused_numbers(text)
    starts = [a for a, _ in ranges]
    for i, m in enumerate(words):
        k = bisect.bisect_right(starts, m.start()) - 1
        if k >= 0 and ranges[k][0] <= m.start() < ranges[k][1]:
            out[i] = True
    return out


def _context_written_as_words(words: Sequence[re.Match[str]], vocab: SafeVocabulary,
                              capitals: np.ndarray) -> list[int]:
    """Indices of the context words written as words are: in lower case, or in capitals in a
    line of capitals (``capitals``: :func:`in_capitals`). A capitalised one ("Will", "Grace")
    is left out: at a sentence's start it shows no sign of a name, and it may be one."""
    return [i for i, m in enumerate(words)
            if vocab.is_context(m.group()) and (m.group().islower() or capitals[i])]


def in_capitals(text: str, words: Sequence[re.Match[str]]) -> np.ndarray:
    """Which words are of two or more capitals in a line without a lower-case letter (a note
    written in capitals, where a capital says nothing of a name). One pass over the text."""
    ends = [m.start() for m in re.finditer("\n", text)]  # line k ends at ends[k]
    mixed = {k for k, line in enumerate(text.split("\n")) if any(c.islower() for c in line)}
    out = np.zeros(len(words), dtype=bool)
    for i, m in enumerate(words):
        w = m.group()
        out[i] = (len(w) > 1 and w.isupper()
                  and bisect.bisect_left(ends, m.start()) not in mixed)
    return out


#: the endings of English contractions and possessives (``pt's``, ``don't``, ``we'll``)
_CLITICS = frozenset(("s", "t", "d", "m", "ll", "re", "ve"))
#: one-letter names of a value (potassium ``K 3.8``, ``x 2``, ``q 4``, pulse ``P 80``, temperature
#: ``T 37.2``): released only right before a number the measurement contexts released
_VALUE_KEYS = frozenset("kxqpt")


def _clitic(text: str, words: Sequence[re.Match[str]], i: int, vocab: SafeVocabulary) -> bool:
    """Whether word ``i`` ends a contraction or possessive of a safe word (``pt's``): never of
    a name (``Smith's``: "smith" is no safe word)."""
    m = words[i]
    if i == 0 or normalize_word(m.group()) not in _CLITICS:
        return False
    prev = words[i - 1]
    return joined_by_apostrophe(text, prev, m) and vocab.contains(prev.group())


def _value_key(text: str, words: Sequence[re.Match[str]], i: int,
               measures: Sequence[tuple[int, int]]) -> bool:
    """Whether word ``i`` is a one-letter value name right before a released measurement."""
    m = words[i]
    if normalize_word(m.group()) not in _VALUE_KEYS or i + 1 >= len(words):
        return False
    nxt = words[i + 1]
    if not set(text[m.end():nxt.start()]) <= _SPACES or nxt.start() - m.end() > 2:
        return False
    return any(a <= nxt.start() and nxt.end() <= b for a, b in measures)


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
