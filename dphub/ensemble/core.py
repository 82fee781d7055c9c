"""An ensemble: members with their thresholds plus an aggregation rule, applied to notes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dphub.ensemble.aggregate import MergedSpan
from dphub.ensemble.aggregation import AggregationRule, parse_rule
from dphub.ensemble.chunks import (
    CHUNK_CHARS,
    CHUNK_OVERLAP,
    chunk_bounds,
    chunk_note,
    merge_chunk_spans,
)
from dphub.ensemble.inverse import model_word_spans
from dphub.ensemble.kinds import member_kind
from dphub.ensemble.manifest import (
    Manifest,
    MemberEntry,
    card_privacy,
    run_rule,
    weights_digest,
)
from dphub.ensemble.members import Member, ModelMember
from dphub.ensemble.release_paths import Explanation
from dphub.ensemble.words import snap_to_words, trim_spans, word_runs
from dphub.errors import ConfigError
from dphub.notes import Note, Span
from dphub.runtime import (
    AUTO,
    DEFAULT_RUNTIME,
    check_runtime,
    check_runtime_choice,
    choose_runtime,
    inference_device,
)
from dphub.safe_vocab import SafeVocabulary
from dphub.safe_vocab import load as load_safe_vocab
from dphub.scores import LabelThresholds
from dphub.textnorm import normalize


@dataclass
class Slot:
    """A member in the ensemble, with its threshold and provenance (for listings and audits).

    ``label_thresholds`` (model members, from ``ensemble calibrate``) overrides ``threshold`` for
    the labels it lists; the other labels keep ``threshold``.
    """

    member: Member
    threshold: float | None = None
    epsilon: float | None = None
    unit: str | None = None
    revision: str | None = None
    label_thresholds: dict[str, float] | None = None
    delta: float | None = None

    @property
    def name(self) -> str:
        return self.member.name

    @property
    def tag_threshold(self) -> float | LabelThresholds | None:
        """What ``member.tag`` receives: per-label thresholds only for model members."""
        if self.label_thresholds and isinstance(self.member, ModelMember):
            return LabelThresholds(self.threshold, dict(self.label_thresholds))
        return self.threshold


@dataclass
class NoteResult:
    """Per note: the merged spans, and each member's own spans (for evaluation and audits)."""

    merged: list[MergedSpan]
    by_member: dict[str, list[Span]] = field(default_factory=dict)
    #: under a rule that explains itself (inverse): each kept word's release path and the words
    #: the rule hid alone (:mod:`dphub.ensemble.release_paths`); None otherwise
    why: Explanation | None = None

    @property
    def spans(self) -> list[Span]:
        return [m.to_span() for m in self.merged]


class Ensemble:
    """Members + rule. ``deid(notes)`` runs every member once per batch and merges on characters."""

    #: the encoder runtime of its model members (:mod:`dphub.runtime`); part of a run's settings
    runtime: str = "torch"
    #: a note longer than this many characters is read in chunks of about this size, each with
    #: ``chunk_overlap`` characters of context on each side (:mod:`dphub.ensemble.chunks`)
    chunk_chars: int = CHUNK_CHARS
    chunk_overlap: int = CHUNK_OVERLAP

    def __init__(self, slots: Sequence[Slot], rule: AggregationRule | str = "any",
                 *, safe_vocab: SafeVocabulary | None = None) -> None:
        if not slots:
            raise ConfigError("the ensemble has no members (add one with `dphub ensemble add`)")
        names = [s.name for s in slots]
        if len(set(names)) != len(names):
            raise ConfigError("ensemble member names must be unique")
        self.slots = list(slots)
        self.rule = parse_rule(rule) if isinstance(rule, str) else rule
        self.rule.check(names)
        #: the inverse rule's safe words (default: the shipped vocabulary, loaded on first use)
        self.safe_vocab = safe_vocab

    @property
    def vocabulary(self) -> SafeVocabulary:
        """The safe vocabulary of the inverse rule (the shipped one unless one was given)."""
        if self.safe_vocab is None:
            self.safe_vocab = load_safe_vocab()
        return self.safe_vocab

    def combine(self, note: Note, by_member: dict[str, list[Span]]) -> list[MergedSpan]:
        """One note's merged spans from its members' spans, by the ensemble's rule."""
        models = {s.name: s.tag_threshold for s in self.slots if isinstance(s.member, ModelMember)}
        return self.rule.merge(note.text, by_member, models=models, vocabulary=self.vocabulary
                               if self.rule.uses_safe_vocabulary else None)

    def combine_explained(self, note: Note, by_member: dict[str, list[Span]]
                          ) -> tuple[list[MergedSpan], Explanation | None]:
        """:meth:`combine` and, under a rule that explains itself (inverse), why each word was
        kept or hidden (one pass: the same word table)."""
        explain = getattr(self.rule, "explain", None)
        if explain is None:
            return self.combine(note, by_member), None
        models = {s.name: s.tag_threshold for s in self.slots if isinstance(s.member, ModelMember)}
        return explain(note.text, by_member, models=models, vocabulary=self.vocabulary)

    def member_spans(self, notes: Sequence[Note], *,
                     on_chunk: Callable[[int, int], None] | None = None
                     ) -> list[dict[str, list[Span]]]:
        """Each member's spans per note, snapped to whole words and trimmed to the entity.

        A note longer than :attr:`chunk_chars` is read chunk by chunk (:meth:`_chunked_spans`):
        ``on_chunk(done, total)`` hears how many of its chunks are done (numbers only). Shorter
        notes take the one-pass path (:meth:`_note_spans`) as they always did.
        """
        long = {i for i, n in enumerate(notes) if len(n.text) > self.chunk_chars}
        if not long:
            return self._note_spans(notes)
        per_note: list[dict[str, list[Span]]] = [{} for _ in notes]
        short = [i for i in range(len(notes)) if i not in long]
        if short:
            got = self._note_spans([notes[i] for i in short])
            for i, spans in zip(short, got, strict=True):
                per_note[i] = spans
        for i in sorted(long):
            per_note[i] = self._chunked_spans(notes[i], on_chunk)
        return per_note

    def _chunked_spans(self, note: Note, on_chunk: Callable[[int, int], None] | None
                       ) -> dict[str, list[Span]]:
        """One long note's member spans, read one chunk at a time (:mod:`dphub.ensemble.chunks`).

        Each chunk goes through the one-pass path as a note of its own (normalised, snapped and
        trimmed there); a span is kept from the chunk that owns its first character, shifted to
        the note's offsets, and same-label spans that overlap across a cut are joined. Only one
        chunk's working memory is alive at a time.
        """
        chunks = chunk_bounds(note.text, self.chunk_chars, self.chunk_overlap)
        found: dict[str, list[tuple[int, Span]]] = {s.name: [] for s in self.slots}
        if on_chunk is not None:
            on_chunk(0, len(chunks))
        for k, c in enumerate(chunks):
            (by_member,) = self._note_spans([chunk_note(note, c, k)])
            for name, spans in by_member.items():
                found[name].extend(
                    (k, replace(s, start=s.start + c.start, end=s.end + c.start))
                    for s in spans if c.own_start <= s.start + c.start < c.own_end)
            if on_chunk is not None:
                on_chunk(k + 1, len(chunks))
        return {name: merge_chunk_spans(kept) for name, kept in found.items()}

    def _note_spans(self, notes: Sequence[Note]) -> list[dict[str, list[Span]]]:
        """Each member's spans per note in one pass over the whole texts (see
        :meth:`member_spans`).

        The one place every member's output passes through before aggregation, rendering and
        evaluation, so no output mode can cut a word in two or keep a title's period inside a
        name (:mod:`dphub.ensemble.words`). Members read each note with invisible and look-alike
        characters normalised (:mod:`dphub.textnorm`); their spans come back in the note's own
        offsets. A member with ``reads_raw_text`` (spans given in original offsets, such as
        :class:`~dphub.ensemble.members.FixedMember`) reads the note as it is.
        """
        per_note: list[dict[str, list[Span]]] = [{} for _ in notes]
        norms = [normalize(n.text) for n in notes]
        seen = [n if m is None else replace(n, text=m.text) for n, m in zip(notes, norms,
                                                                            strict=True)]
        runs = [word_runs(n.text) for n in seen]
        raw_runs: dict[int, tuple[list[int], list[int]]] = {}
        shared = shared_encoder_groups(self.slots)
        encoded: dict[Any, Any] = {}
        for slot in self.slots:
            raw = bool(getattr(slot.member, "reads_raw_text", False))
            given = notes if raw else seen
            key = shared.get(slot.name)
            floor = (self.rule.floor(slot.tag_threshold)
                     if isinstance(slot.member, ModelMember) else None)
            if floor is not None:
                # the rule (inverse) reads every word's P(PHI), down to its lowest threshold
                if key is not None and key not in encoded:
                    encoded[key] = slot.member.encode(given)
                tagged = model_word_spans(slot.member, given, floor,
                                          encoded=None if key is None else encoded[key])
            elif key is None:
                tagged = slot.member.tag(given, threshold=slot.tag_threshold)
            else:  # members on one encoder: its pass runs once, each applies its own head + CRF
                if key not in encoded:
                    encoded[key] = slot.member.encode(given)
                tagged = slot.member.tag(given, threshold=slot.tag_threshold,
                                         encoded=encoded[key])
            for i, spans in enumerate(tagged):
                norm = norms[i]
                if raw and norm is not None:
                    if i not in raw_runs:
                        raw_runs[i] = word_runs(notes[i].text)
                    text, note_runs = notes[i].text, raw_runs[i]
                else:
                    text, note_runs = given[i].text, runs[i]
                spans = trim_spans(text, snap_to_words(text, spans, note_runs))
                if norm is not None and not raw:
                    # back to the note's offsets; a character NFKC expanded can join two spans
                    spans = snap_to_words(notes[i].text, norm.spans_to_original(spans), ([], []))
                per_note[i][slot.name] = spans
        return per_note

    def deid(self, notes: Sequence[Note], *,
             on_chunk: Callable[[int, int], None] | None = None) -> list[NoteResult]:
        """Merged spans per note; ``on_chunk`` as in :meth:`member_spans` (long notes)."""
        out = []
        for note, by_member in zip(notes, self.member_spans(notes, on_chunk=on_chunk),
                                   strict=True):
            merged, why = self.combine_explained(note, by_member)
            out.append(NoteResult(merged, by_member, why))
        return out


def shared_encoder_groups(slots: Sequence[Slot]) -> dict[str, Any]:
    """Slot name -> encoder key, for model members whose encoder another member shares.

    Members trained head-only on one public base (the default recipe) have byte-identical
    encoders (same SHA-256 of the weights), tokenizers and windowing: their encoder pass is the
    same computation, so the ensemble runs it once. Members alone on their encoder keep their own
    path (nothing stored between calls).
    """
    keys: dict[str, Any] = {}
    for slot in slots:
        m = slot.member
        if isinstance(m, ModelMember) and type(m).token_scores is ModelMember.token_scores:
            key = m.encoder_key
            if key is not None:
                keys[slot.name] = key
    counts = Counter(keys.values())
    return {name: key for name, key in keys.items() if counts[key] > 1}


#: taggers loaded while building one ensemble, by (resolved model directory, pin): entries on
#: the same weights share one :class:`~dphub.tagger.Tagger` (see :func:`load_model_member`)
TaggerCache = dict[tuple[str, str | None], Any]


def load_model_member(path: Path, name: str, *, pin: str | None, int8: bool = False,
                      taggers: TaggerCache | None = None, **meta: Any) -> ModelMember:
    """A :class:`ModelMember` on the model in ``path``, its tagger shared through ``taggers``.

    Why share: the low-threshold recipe of ``docs/owner.md`` lists one model twice (its own
    name and threshold each); loading it twice doubled the memory and load time for the same
    weights. Members with the same resolved directory and the same ``pin`` (manifest revision,
    or weights digest) get one tagger, quantized (``int8``) once when it is first loaded; each
    keeps its own name, threshold and label thresholds in its slot. A tagger holds no state
    that depends on the member: thresholds are applied to the scores it returns.
    """
    key = (str(Path(path).resolve()), pin)
    tagger = None if taggers is None else taggers.get(key)
    if tagger is None:
        member = ModelMember.load(path, name, **meta)
        if int8:
            member.quantize_int8()
        if taggers is not None:
            taggers[key] = member.tagger
        return member
    member = ModelMember(tagger, name, **meta)
    member.path = Path(path)
    return member


def member_from_entry(entry: MemberEntry, *, batch_size: int = 16, int8: bool = False,
                      taggers: TaggerCache | None = None) -> Slot:
    """Instantiate a manifest entry through its kind (:mod:`dphub.ensemble.kinds`: loads
    models; verifies pins; ``int8``: quantize models; ``taggers``: share one tagger between
    entries on the same pinned directory)."""
    slot: Slot = member_kind(entry.kind).load(entry, batch_size=batch_size, int8=int8,
                                              taggers=taggers)
    return slot


def owner_slot(model_dir: Path, *, threshold: float | None = None, batch_size: int = 16,
               int8: bool = False, taggers: TaggerCache | None = None) -> Slot:
    """Scenario B: the data owner's own model, added for this run only (not in the manifest).

    Pinned by its weights digest, as ``ensemble add DIR`` pins a directory: with ``taggers``, a
    manifest entry on the same directory and weights shares its tagger."""
    p = Path(model_dir)
    priv = card_privacy(p)
    # the weights digest as revision: a resumed run refuses a retrained model (outputs would mix)
    # (no weights file: the load below says what is wrong, as it always did)
    digest = weights_digest(p) if (p / "model.safetensors").is_file() else None
    member = load_model_member(p, f"owner:{p.resolve().name}", pin=digest, int8=int8,
                               taggers=taggers, epsilon=priv.get("epsilon"),
                               unit=priv.get("privacy_unit"), batch_size=batch_size)
    return Slot(member, threshold, priv.get("epsilon"), priv.get("privacy_unit"),
                digest or weights_digest(p), delta=priv.get("delta"))


def build_ensemble(
    manifest: Manifest | None,
    *,
    owner_model: Path | None = None,
    aggregate_rule: str | None = None,
    batch_size: int = 16,
    int8: bool = False,
    runtime: str | None = None,
    progress: Callable[[str], None] | None = None,
    safe_words: Sequence[Path] = (),
) -> Ensemble:
    """The ensemble of a manifest (Scenario A), plus the owner's model when given (Scenario B).

    ``runtime`` (``torch``, ``torch-bf16``, ``onnx``, ``onnx-int8`` or ``auto``; default: the
    manifest's, else ``auto``, see :func:`pick_runtime`) runs every model member's encoder there;
    ONNX graphs are built on first use (``progress`` gets a line first) and cached by encoder
    digest. An automatic choice is said once through ``progress`` ("runtime: torch-bf16 (native
    bf16)").
    ``safe_words``: the owner's safe words files, added to the shipped vocabulary of the inverse
    rule (refused with another rule: they would change nothing).
    """
    runtime, why = pick_runtime(manifest, runtime, owner_model=owner_model is not None, int8=int8)
    if int8 and runtime != "torch":
        raise ConfigError(f"--int8 (torch dynamic quantization) and --runtime {runtime} exclude "
                          "each other; use --runtime onnx-int8")
    taggers: TaggerCache = {}  # entries on one pinned model directory share its tagger
    slots = [member_from_entry(e, batch_size=batch_size, int8=int8, taggers=taggers)
             for e in (manifest.members if manifest else [])]
    if owner_model is not None:
        slots.append(owner_slot(owner_model, batch_size=batch_size, int8=int8, taggers=taggers))
    parsed = parse_rule(run_rule(manifest, aggregate_rule))
    if safe_words and not parsed.uses_safe_vocabulary:
        raise ConfigError(f"--safe-words applies to the inverse rule only (the rule is {parsed}); "
                          "add --aggregate inverse")
    vocab = load_safe_vocab(extra=list(safe_words)) if parsed.uses_safe_vocabulary else None
    ensemble = Ensemble(slots, parsed, safe_vocab=vocab)
    apply_runtime(ensemble, runtime, progress=progress)
    if why is not None and progress is not None:  # once the ensemble stands (no line before an error)
        progress(f"runtime: {runtime} ({why}); --runtime overrides")
    return ensemble


def pick_runtime(manifest: Manifest | None, runtime: str | None = None, *,
                 owner_model: bool = False, int8: bool = False,
                 device: str | None = None) -> tuple[str, str | None]:
    """The concrete runtime of a run, and why when it was chosen automatically (else None).

    ``runtime`` (the flag) wins, then the manifest's, then ``auto``:
    :func:`dphub.runtime.choose_runtime` for the inference device (``torch-bf16`` where
    bfloat16 is native, else ``torch``). ``auto`` means ``torch`` when no member is a model
    (nothing to run there, and a rules-only run's settings stay as they were) or with ``--int8``
    (torch's own int8, which excludes the other runtimes). Decided once by the driver, which
    hands the concrete name to Ray workers, so every worker computes what the run describes.
    """
    chosen = check_runtime_choice(runtime or (manifest.runtime if manifest else None)
                                  or DEFAULT_RUNTIME)
    if chosen != AUTO:
        return chosen, None
    models = owner_model or any(member_kind(e.kind).model
                                for e in (manifest.members if manifest else []))
    if not models or int8:
        return "torch", None
    return choose_runtime(device or inference_device())


def apply_runtime(ensemble: Ensemble, runtime: str, *,
                  progress: Callable[[str], None] | None = None) -> None:
    """Switch every model member of ``ensemble`` to ``runtime`` (members on one encoder share
    one ONNX session; members sharing one tagger switch it once)."""
    check_runtime(runtime)
    done: set[int] = set()
    for slot in ensemble.slots:
        if isinstance(slot.member, ModelMember) and id(slot.member.tagger) not in done:
            done.add(id(slot.member.tagger))
            slot.member.use_runtime(runtime, progress=progress)
    ensemble.runtime = runtime


def prepare_runtime(entries: Sequence[MemberEntry], runtime: str, *,
                    progress: Callable[[str], None] | None = None) -> int:
    """Ready ``runtime`` for the model members among ``entries`` now, not at the first run.

    ONNX runtimes export (and quantize) each distinct encoder into the digest-keyed cache, or
    verify the cached graph (:mod:`dphub.runtime`); ``torch-bf16`` checks that this machine has
    native bfloat16. Why at ``ensemble add`` / ``ensemble runtime`` time: a failure (no
    onnxruntime, a graph that does not reproduce the encoder, a CPU without bfloat16) is then
    one error where the user chose the runtime, and the first ``deid`` starts at full speed.
    Returns the number of distinct encoders readied.
    """
    check_runtime(runtime)
    done: set[str] = set()
    taggers: TaggerCache = {}
    for entry in entries:
        if not member_kind(entry.kind).model:
            continue
        member = member_from_entry(entry, taggers=taggers).member
        assert isinstance(member, ModelMember)
        digest = member.tagger.encoder_digest
        if digest not in done:  # members on one public base share one graph
            member.use_runtime(runtime, progress=progress)
            done.add(digest)
    return len(done)


def describe(slots: Sequence[Slot]) -> list[dict[str, Any]]:
    return [
        {"name": s.name, "threshold": s.threshold, "epsilon": s.epsilon, "unit": s.unit,
         "revision": s.revision, **({"label_thresholds": s.label_thresholds}
                                    if s.label_thresholds else {})}
        for s in slots
    ]
