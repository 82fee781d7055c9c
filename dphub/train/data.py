"""Training data: labelled notes -> windows with BIOES tag ids -> batches, and the per-window loss.

Windows come from :mod:`dphub.align` (nothing truncated); each window is keyed by its privacy unit
(:func:`dphub.privacy.units.unit_key`) so that the privacy layer can group them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dphub import align, formats
from dphub import rule_features as rf
from dphub.errors import ConfigError, InputError
from dphub.labels import get_schema
from dphub.notes import Note
from dphub.privacy.units import unit_key
from dphub.rule_features import pad_features
from dphub.train.options import TrainOptions


@dataclass
class Example:
    """One training window: word-piece ids with specials and tag ids (-100 at specials), and its
    rule features ``[len(input_ids), F]`` when the model takes them (a function of the window's
    own text, so part of the example like its ids)."""

    unit: str
    note_index: int
    input_ids: list[int]
    labels: list[int]
    features: np.ndarray | None = None
    #: soft labels: per position the probability taught for its tag (1.0 at specials)
    confidence: np.ndarray | None = None


def encode_notes(
    notes: Sequence[Note],
    tokenizer: Any,
    tags: Sequence[str],
    schema_name: str,
    *,
    max_length: int = 128,
    stride: int = 32,
    unit: str = "patient",
    rule_features: bool = False,
    soft_labels: bool = False,
) -> list[Example]:
    """Window every note (nothing truncated) and attach BIOES tag ids to each window's tokens.

    ``unit`` decides which id each window is grouped under: the patient, the note, or the window
    itself (``sequence``). ``rule_features`` attaches the rule member's per-piece features
    (:mod:`dphub.rule_features`), computed from each note's own text. ``soft_labels`` attaches
    each position's confidence in its tag (:func:`dphub.align.spans_to_confidence`: the span
    scores of pseudo-labels; gold spans carry none and count as certain).
    """
    schema = get_schema(schema_name)
    tag_id = {t: i for i, t in enumerate(tags)}
    toks = align.tokenize(tokenizer, [n.text for n in notes])
    note_tags: list[list[int]] = []
    note_conf = [align.spans_to_confidence(nt.offsets, n.spans) for n, nt in
                 zip(notes, toks, strict=True)] if soft_labels else None
    for n, nt in zip(notes, toks, strict=True):
        try:
            note_tags.append([tag_id[t] for t in align.spans_to_tags(nt.offsets, n.spans, schema)])
        except KeyError as e:  # a tag outside the model's tag set: schema mismatch
            raise InputError(f"note {n.id}: tag {e.args[0]} not in the model's tags") from None
    windows = align.make_windows(toks, tokenizer, max_length=max_length, stride=stride)
    feats: list[np.ndarray] | None = None
    if rule_features:
        feats = rf.window_features(windows, rf.notes_features(notes, toks))
    out: list[Example] = []
    for wi, w in enumerate(windows):
        n = notes[w.note_index]
        if w.n_tokens == 0:  # an empty note: nothing to learn from
            continue
        labels = [-100] * len(w.input_ids)
        labels[w.content_slice] = note_tags[w.note_index][w.token_start : w.token_end]
        conf = None
        if note_conf is not None:
            conf = np.ones(len(w.input_ids), dtype=np.float32)
            conf[w.content_slice] = note_conf[w.note_index][w.token_start : w.token_end]
        u = unit_key(unit, n.id, n.patient_id, wi)
        out.append(Example(u, w.note_index, list(w.input_ids), labels,
                           None if feats is None else feats[wi], conf))
    return out


def check_patient_ids(notes: Sequence[Note], unit: str) -> None:
    """Patient-level DP needs patient ids on every note; refuse rather than silently weaken it."""
    if unit != "patient":
        return
    missing = [n.id for n in notes if n.patient_id is None]
    if missing:
        raise ConfigError(
            f"--privacy-unit patient needs a patient id on every note; {len(missing)} note(s) "
            f"have none (first: note {missing[0]}); use --privacy-unit note for notes without "
            "patients (weaker: NOT patient-level protection)"
        )


def batch_from_examples(examples: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a list of windows into batch-shaped, contiguous tensors (plus ``labels``)."""
    n = len(examples)
    length = max((len(e.input_ids) for e in examples), default=2)
    ids = torch.full((n, length), pad_id, dtype=torch.long)
    mask = torch.zeros((n, length), dtype=torch.long)
    labels = torch.full((n, length), -100, dtype=torch.long)
    for i, e in enumerate(examples):
        k = len(e.input_ids)
        ids[i, :k] = torch.tensor(e.input_ids)
        mask[i, :k] = 1
        labels[i, :k] = torch.tensor(e.labels)
    out = {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": torch.zeros((n, length), dtype=torch.long),
        "position_ids": torch.arange(length).unsqueeze(0).expand(n, length).contiguous(),
        "labels": labels,
    }
    if examples and examples[0].features is not None:
        out["rule_features"] = pad_features([e.features for e in examples], length)  # type: ignore[misc]
    return out


def recall_weights(
    model: Any, batch: dict[str, torch.Tensor], labels: torch.Tensor, delta_p: float
) -> torch.Tensor | None:
    """ρ_i = 1 + δp · FNR_i per window, from the window's OWN predictions (detached).

    FNR_i is the share of the window's gold PHI tokens that its current prediction (argmax of the
    emissions) calls ``O``; windows without gold PHI get ρ = 1. The weights are constants of the
    backward pass, so they only rescale each sample's gradient before clipping.
    """
    if delta_p <= 0:
        return None
    with torch.no_grad():
        extra = {"rule_features": batch["rule_features"]} if "rule_features" in batch else {}
        em = model.emissions(
            batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
            batch["position_ids"], **extra,
        )
        pred = em.argmax(-1)
        gold_phi = (labels > 0) & (labels != -100)  # tag 0 is "O"
        missed = gold_phi & (pred == 0)
        n_gold = gold_phi.sum(-1)
        fnr = torch.where(n_gold > 0, missed.sum(-1) / n_gold.clamp(min=1), torch.zeros(()))
    return (1.0 + delta_p * fnr).detach().float()


def load_training_notes(opts: TrainOptions) -> list[Note]:
    """Read the training corpus; only labelled notes train."""
    path = Path(opts.data)  # type: ignore[arg-type]
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    notes = [n for n in formats.read(path, opts.format) if n.labelled]
    if not notes:
        raise InputError(f"{path}: no labelled notes to train on")
    return notes


def window_loss(model: Any, batch: dict[str, torch.Tensor], recall_weight: float) -> torch.Tensor:
    """Per-window loss (recall-weighted when asked), shape [B]."""
    labels = batch["tags"]
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids", "position_ids",
                                    "rule_features") if k in batch}
    weights = recall_weights(model, inputs, labels, recall_weight)
    return model.per_sample_loss(inputs, labels, weights=weights,
                                 confidence=batch.get("confidence"))
