"""Corpus statistics, computed in one streaming pass.

Data owners need to know what they are about to train on (how many notes and patients, how much
PHI of each kind) and the numbers go into model cards (``dataset.phi_per_category``) and DP
accounting (the number of patients is the number of privacy units). Nothing here holds more than
one batch of notes: a corpus of gigabytes is counted with the memory of a few notes plus one id per
patient.

Word pieces are optional because tokenizing is the slow part; they tell how many training windows
(and so how much compute and how many examples per unit) a corpus will produce.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dphub import formats
from dphub.encoders import resolve_base_model
from dphub.errors import ModelError
from dphub.formats import _base
from dphub.labels import CATEGORIES
from dphub.notes import Note


@dataclass
class CorpusStats:
    """Counts over a corpus. ``word_pieces`` is None unless a tokenizer was given."""

    notes: int = 0
    labelled_notes: int = 0
    patients: int = 0
    notes_without_patient: int = 0
    characters: int = 0
    phi_phrases: int = 0
    phi_characters: int = 0
    phi_per_category: dict[str, int] = field(default_factory=dict)
    phi_per_label: dict[str, int] = field(default_factory=dict)
    word_pieces: int | None = None
    tokenizer: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (what ``dphub data stats --json`` prints)."""
        return {
            "notes": self.notes,
            "labelled_notes": self.labelled_notes,
            "patients": self.patients,
            "notes_without_patient": self.notes_without_patient,
            "characters": self.characters,
            "phi_phrases": self.phi_phrases,
            "phi_characters": self.phi_characters,
            "phi_per_category": dict(self.phi_per_category),
            "phi_per_label": dict(self.phi_per_label),
            "word_pieces": self.word_pieces,
            "tokenizer": self.tokenizer,
        }


def load_tokenizer(spec: str | None) -> Any:
    """A fast Hugging Face tokenizer: ``default``/None = the embedded base model's, or a path."""
    from transformers import AutoTokenizer

    loadable, _ = resolve_base_model(spec)
    if isinstance(loadable, str) and not Path(loadable).exists():
        # stats never downloads: a non-directory argument must be a local path
        raise ModelError(f"tokenizer {spec!r}: no such directory (stats loads local tokenizers)")
    try:
        tok = AutoTokenizer.from_pretrained(str(loadable), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load a tokenizer from {loadable}: {type(e).__name__}") from None
    if not getattr(tok, "is_fast", False):
        raise ModelError(f"tokenizer in {loadable} is not a fast (Rust) tokenizer")
    return tok


def _count_pieces(tokenizer: Any, texts: list[str]) -> int:
    enc = tokenizer(
        texts,
        add_special_tokens=False,
        truncation=False,
        padding=False,
        return_attention_mask=False,
        return_token_type_ids=False,
        verbose=False,
    )
    return sum(len(ids) for ids in enc["input_ids"])


def compute_stats(
    notes: Iterable[Note],
    *,
    tokenizer: Any | None = None,
    tokenizer_name: str | None = None,
    batch_size: int = 64,
) -> CorpusStats:
    """Count notes, patients, characters, PHI phrases (per HIPAA category and per source label)
    and, with a tokenizer, word pieces, in one pass over ``notes``.

    ``patients`` counts distinct ``patient_id`` values; notes without one are counted in
    ``notes_without_patient`` (each is its own privacy unit downstream).
    """
    st = CorpusStats(word_pieces=0 if tokenizer is not None else None,
                     tokenizer=tokenizer_name if tokenizer is not None else None)
    patients: set[str] = set()
    per_category: Counter[str] = Counter()
    per_label: Counter[str] = Counter()
    batch: list[str] = []
    for note in notes:
        st.notes += 1
        st.characters += len(note.text)
        if note.labelled:
            st.labelled_notes += 1
        if note.patient_id is None:
            st.notes_without_patient += 1
        else:
            patients.add(note.patient_id)
        for span in note.spans:
            st.phi_phrases += 1
            st.phi_characters += span.end - span.start
            per_category[span.category] += 1
            per_label[span.label] += 1  # readers already canonicalise spellings
        if tokenizer is not None:
            batch.append(note.text)
            if len(batch) >= batch_size:
                st.word_pieces += _count_pieces(tokenizer, batch)  # type: ignore[operator]
                batch = []
    if tokenizer is not None and batch:
        st.word_pieces += _count_pieces(tokenizer, batch)  # type: ignore[operator]
    st.patients = len(patients)
    # categories in the fixed schema order; labels by count, then name
    st.phi_per_category = {c: per_category[c] for c in CATEGORIES if per_category[c]}
    st.phi_per_label = dict(sorted(per_label.items(), key=lambda kv: (-kv[1], kv[0])))
    return st


def corpus_stats(
    path: str | Path,
    *,
    format: str | None = None,
    tokenizer: str | None = None,
    count_word_pieces: bool = False,
) -> CorpusStats:
    """Stream a corpus through :func:`dphub.formats.read` and count it.

    ``count_word_pieces`` loads ``tokenizer`` (default: the embedded base model's).
    """
    fmt = format or formats.detect_format(path)
    tok = load_tokenizer(tokenizer) if count_word_pieces or tokenizer is not None else None
    name = None
    if tok is not None:
        name = "default" if tokenizer in (None, "", "default") else str(tokenizer)
    notes = formats.read(path, format=fmt, **_keep_overlaps_option(fmt))
    return compute_stats(notes, tokenizer=tok, tokenizer_name=name)


def _keep_overlaps_option(fmt: str) -> dict[str, str]:
    """``{"overlaps": "keep"}`` where the reader offers it, else ``{}``.

    Stats count annotations as the corpus has them; the readers' default merges overlapping
    same-label spans (right for training, but one PhysioNet note has such a pair, so the merged
    count is one phrase short of the corpus's 1,367). Used only if the formats layer has a
    ``keep`` policy.
    """
    import inspect

    if "keep" not in getattr(_base, "OVERLAP_POLICIES", ()):
        return {}
    if "overlaps" not in inspect.signature(formats.get_format(fmt).read).parameters:
        return {}
    return {"overlaps": "keep"}
