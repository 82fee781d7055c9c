"""Ensemble members: anything with a ``name`` and ``tag(notes, threshold=None)``.

* :class:`ModelMember` wraps a :class:`dphub.tagger.Tagger`; it also exposes ``token_scores`` so
  calibration runs each model once and applies many thresholds to the cached scores.
* :class:`~dphub.rules.engine.RuleMember` (``rules:default``) needs no data (ε = 0).
* :class:`FixedMember` returns given spans; it makes aggregation testable by hand.

Members read notes with invisible and look-alike characters normalised (:mod:`dphub.textnorm`)
and answer in offsets of the text they read; the ensemble maps them back. A member whose spans
are already in the original offsets says so with ``reads_raw_text = True``.

Each member tags with its own tokenizer and windows and answers in character spans, so members
with different tokenizers combine on characters (:mod:`dphub.ensemble.aggregate`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from dphub.ensemble.chunks import CHUNK_OF
from dphub.notes import Note, Span
from dphub.scores import TokenScores, spans_from_scores
from dphub.tagger import Tagger


@runtime_checkable
class Member(Protocol):
    """The member contract of ``docs/architecture.md``."""

    name: str

    def tag(self, notes: Sequence[Note], threshold: float | None = None) -> list[list[Span]]: ...


class ModelMember:
    """A trained tagger as an ensemble member.

    ``threshold=None`` uses the tagger's joint (Viterbi) decoding; a number flags every token whose
    P(not O) reaches it, via :func:`dphub.scores.spans_from_scores`.
    """

    def __init__(
        self,
        tagger: Any,
        name: str | None = None,
        *,
        epsilon: float | None = None,
        unit: str | None = None,
        revision: str | None = None,
        batch_size: int = 16,
    ) -> None:
        self.tagger = tagger
        self.name = name or getattr(tagger, "name", "model")
        self.epsilon = epsilon
        self.unit = unit
        self.revision = revision
        self.batch_size = batch_size
        #: the model directory it was loaded from (its card states the member's guarantee)
        self.path: Path | None = None

    @classmethod
    def load(cls, path: Path, name: str | None = None, **meta: Any) -> ModelMember:
        member = cls(Tagger.load(path), name or Path(path).name, **meta)
        member.path = Path(path)
        return member

    def quantize_int8(self) -> None:
        """Dynamic int8 quantization of the encoder's Linear layers (CPU inference speed-up).

        A lever for throughput; check recall on labelled notes before relying on it. The encoder
        digest is taken first (from the float weights), so quantized members that share an
        encoder still share its pass.
        """
        import warnings

        device = getattr(self.tagger, "device", None)
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            from dphub.errors import ConfigError

            raise ConfigError(f"--int8 (torch dynamic quantization) runs on the CPU, not on "
                              f"{device.type}; use --device cpu, or torch-bf16 on the GPU")
        _ = getattr(self.tagger, "encoder_digest", None)

        import torch

        with warnings.catch_warnings():  # torch.ao.quantization is deprecated but still works
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            from torch.ao.quantization import quantize_dynamic

            self.tagger.model = quantize_dynamic(self.tagger.model, {torch.nn.Linear},
                                                 dtype=torch.qint8)

    def use_runtime(self, runtime: str, *, threads: int | None = None,
                    progress: Any = None) -> Any:
        """Run this member's encoder with ``runtime`` (:mod:`dphub.runtime`); heads stay torch."""
        return self.tagger.use_runtime(runtime, threads=threads, progress=progress)

    @property
    def tokenizer_id(self) -> str | None:
        return getattr(self.tagger, "tokenizer_id", None)

    def token_scores(self, notes: Sequence[Note]) -> list[TokenScores]:
        return self.tagger.token_scores(notes, batch_size=self.batch_size)

    def spans_from(self, scores: Sequence[TokenScores], threshold: float | None) -> list[list[Span]]:
        return [spans_from_scores(ts, threshold, source=self.name) for ts in scores]

    @property
    def encoder_key(self) -> tuple[Any, ...] | None:
        """Members with equal keys (and batch sizes) can share one encoder pass
        (:meth:`dphub.tagger.Tagger.encode`); None when the tagger cannot say."""
        key = getattr(self.tagger, "encoder_key", None)
        return None if key is None else (*key, self.batch_size)

    def encode(self, notes: Sequence[Note]) -> Any:
        """The encoder outputs this member's tagger would compute, for members sharing them."""
        return self.tagger.encode(notes, batch_size=self.batch_size)

    def tag(self, notes: Sequence[Note], threshold: float | None = None, *,
            encoded: Any = None) -> list[list[Span]]:
        """Spans per note; ``encoded`` (from :meth:`encode` of a member with the same
        :attr:`encoder_key`) skips this member's own encoder pass."""
        # Viterbi decoding (threshold None) needs no CRF marginals: skip forward-backward, unless
        # a subclass overrides token_scores (e.g. a cache), whose scores must then be used
        if type(self).token_scores is ModelMember.token_scores:
            extra = {} if encoded is None else {"encoded": encoded}
            scores = self.tagger.token_scores(notes, batch_size=self.batch_size,
                                              marginals=threshold is not None, **extra)
        else:
            scores = self.token_scores(notes)
        return self.spans_from(scores, threshold)


class FixedMember:
    """Returns the spans given per note id (tests, or spans produced elsewhere)."""

    epsilon: float | None = None
    unit: str | None = None
    revision: str | None = None
    #: its spans are given in the note's own offsets: the ensemble hands it the note unnormalised
    reads_raw_text: bool = True

    def __init__(self, name: str, spans_by_id: Mapping[str, Sequence[Span]]) -> None:
        self.name = name
        self.spans_by_id = {k: list(v) for k, v in spans_by_id.items()}

    def tag(self, notes: Sequence[Note], threshold: float | None = None) -> list[list[Span]]:
        out = []
        for note in notes:
            spans = self.spans_by_id.get(note.id)
            if spans is None:
                spans = self._chunk_spans(note)
            if threshold is not None:
                spans = [s for s in spans if (1.0 if s.score is None else s.score) >= threshold]
            out.append([Span(s.start, s.end, s.label, s.score, self.name) for s in spans])
        return out

    def _chunk_spans(self, note: Note) -> list[Span]:
        """A chunk of a long note (:mod:`dphub.ensemble.chunks`): the note's spans that fall in
        it, clipped to it, in its offsets."""
        of = note.metadata.get(CHUNK_OF)
        if not isinstance(of, dict) or of.get("id") not in self.spans_by_id:
            return []
        a, b = of["start"], of["end"]
        return [Span(max(s.start, a) - a, min(s.end, b) - a, s.label, s.score, s.source)
                for s in self.spans_by_id[of["id"]] if s.start < b and s.end > a]
