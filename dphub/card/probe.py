"""The behavioural probe: what a model does on dphub's public synthetic probe notes.

Why: the publish gate checked what a model *is* (files, tensors, card) but not what it *does*.
Weights that are huge but finite (1e30 in the head) passed every check, and ``deid`` with that
model flagged nothing. The probe runs the tagger on a few public synthetic notes (fixed public
seed, :mod:`dphub.synth`; seconds on CPU) and measures its token recall there and the size of its
activations. Training records the result on the card (``gate_probe``: the recall and a floor);
publish, pull and ``dphub card validate`` run the probe again (:mod:`dphub.hub.gate_probe`) and
refuse a model below the floor. The probe notes are public, so measuring on them spends no
privacy budget.

Not imported by :mod:`dphub.card` itself: it loads torch (through :mod:`dphub.tagger`).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dphub.labels import category_of
from dphub.notes import Note
from dphub.scores import spans_from_scores
from dphub.synth import generate
from dphub.tagger import Tagger

#: version of the probe (notes, measure); a card's ``gate_probe.version`` names the one it used
PROBE_VERSION = 1
#: the probe notes' public seed and kinds: 6 nursing notes and 2 discharge summaries (about 7,600
#: characters, 124 PHI phrases, 237 PHI word tokens with this dphub and Faker)
PROBE_SEED = 38_001
PROBE_KINDS = (("nursing", 6), ("discharge", 2))
#: the category probe (issue 53): public notes for the categories the probe notes hold too few
#: words of to be held one by one (AGE 3, PROFESSION 2 there): 12 discharge summaries of the
#: next public seed (12 AGE and 12 PROFESSION word tokens with this dphub and Faker). Run by the
#: gate only for a model with shipped public figures for them (:mod:`dphub.card.probe_floor`)
CATEGORY_PROBE_SEED = PROBE_SEED + 1
CATEGORY_PROBE_KINDS = (("discharge", 12),)
#: dphub-wide minimum token recall on the probe notes: no card can state a lower floor. The tiny
#: random and DP-trained models of the test suite reach 0.92-1.0 there, the tiny public base of
#: tests/test_pretrain.py (a few steps on low-density realistic notes) 0.07 (docs/hub.md); a model
#: that flags nothing reaches 0.
MIN_PROBE_FLOOR = 0.02
#: a card's floor is this share of the recall measured at training (never below the minimum):
#: slack for another torch or Faker version, none for a model that stopped finding PHI
FLOOR_SHARE = 0.5
#: largest |activation| (encoder output, emission) an honest tagger produces on the probe notes;
#: trained heads give tens, and a DP-trained head from a public base cannot reach this
MAX_ABS_ACTIVATION = 1e5
GATE_PROBE_KEYS = ("version", "notes", "recall", "floor")


@dataclass(frozen=True)
class ProbeResult:
    """What the probe measured: token recall on the probe notes and the activations' size, and
    (issue 53) the recall per HIPAA category and the share of non-PHI words left unflagged."""

    recall: float
    tokens: int
    max_abs_activation: float
    nonfinite: bool
    #: category -> (PHI word tokens of that category a predicted span overlaps, all of them)
    per_category: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: share of the probe notes' non-PHI word tokens no predicted span overlaps (1.0: none
    #: flagged; a model that flags everything keeps none)
    kept: float = 1.0

    def category_recall(self) -> dict[str, float]:
        """Recall per category (categories with no gold token are absent)."""
        return {c: hit / total for c, (hit, total) in self.per_category.items() if total}


def probe_notes() -> list[Note]:
    """The public probe notes (same dphub and Faker version, same notes)."""
    return list(_generated(PROBE_KINDS, PROBE_SEED))


def category_probe_notes() -> list[Note]:
    """The public category-probe notes (same dphub and Faker version, same notes)."""
    return list(_generated(CATEGORY_PROBE_KINDS, CATEGORY_PROBE_SEED))


@functools.lru_cache(maxsize=2)
def _generated(kinds: tuple[tuple[str, int], ...], seed: int) -> tuple[Note, ...]:
    out: list[Note] = []
    for kind, n in kinds:
        out += generate(n, kind=kind, seed=seed)
    return tuple(out)


_WORD = re.compile(r"\w+")


def token_recall(notes: list[Note], predicted: list[list[Any]]) -> tuple[float, int]:
    """(share of gold PHI word tokens a predicted span overlaps, number of such tokens)."""
    hit = total = 0
    for note, pred in zip(notes, predicted, strict=True):
        for span in note.spans:
            for m in _WORD.finditer(note.text, span.start, span.end):
                total += 1
                hit += any(p.start < m.end() and m.start() < p.end for p in pred)
    return (hit / total if total else 0.0), total


def category_counts(notes: list[Note], predicted: list[list[Any]]
                    ) -> tuple[dict[str, tuple[int, int]], float]:
    """(category -> (gold PHI word tokens a predicted span overlaps, all of them), share of the
    non-PHI word tokens no predicted span overlaps).

    Any predicted label counts: ``deid`` hides a flagged word whatever its label, so a model
    whose schema lacks a category still protects it by flagging its words under another label.
    """
    counts: dict[str, list[int]] = {}
    other = kept = 0
    for note, pred in zip(notes, predicted, strict=True):
        gold = sorted((s.start, s.end, category_of(s.label)) for s in note.spans)
        for m in _WORD.finditer(note.text):
            flagged = any(p.start < m.end() and m.start() < p.end for p in pred)
            cats = {c for start, end, c in gold if start < m.end() and m.start() < end}
            if not cats:
                other += 1
                kept += not flagged
            for c in cats:
                row = counts.setdefault(c, [0, 0])
                row[0] += flagged
                row[1] += 1
    return {c: (h, t) for c, (h, t) in sorted(counts.items())}, (kept / other if other else 1.0)


def run_probe(tagger: Tagger) -> ProbeResult:
    """Tag the probe notes with ``tagger`` (decoded tags, as ``deid`` does) while watching the
    encoder's output and the emissions."""
    seen = {"max": 0.0, "nonfinite": False}

    def watch(_module: Any, inputs: Any, output: Any) -> None:
        for t in (*inputs, output):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                if not bool(torch.isfinite(t).all()):
                    seen["nonfinite"] = True
                else:
                    seen["max"] = max(seen["max"], float(t.abs().max()))

    model = tagger.model
    hooks = [m.register_forward_hook(watch)
             for m in (model.classifier, getattr(model, "rule_proj", None)) if m is not None]
    notes = probe_notes()
    try:
        scores = tagger.token_scores(notes, marginals=True)
    finally:
        for h in hooks:
            h.remove()
    for ts in scores:
        if not all(math.isfinite(float(x)) for x in ts.phi_prob):
            seen["nonfinite"] = True
    spans = [spans_from_scores(ts, None) for ts in scores]
    recall, tokens = token_recall(notes, spans)
    per_category, kept = category_counts(notes, spans)
    return ProbeResult(recall, tokens, float(seen["max"]), bool(seen["nonfinite"]),
                       per_category, kept)


def run_category_probe(tagger: Tagger) -> dict[str, tuple[int, int]]:
    """Tag the category-probe notes: category -> (gold word tokens flagged, all of them)."""
    notes = category_probe_notes()
    spans = [spans_from_scores(ts, None) for ts in tagger.token_scores(notes, marginals=True)]
    return category_counts(notes, spans)[0]


def floor_for(recall: float) -> float:
    """The floor a card states for a model of this probe recall (two decimals, rounded down)."""
    return max(MIN_PROBE_FLOOR, math.floor(FLOOR_SHARE * recall * 100) / 100)


def probe_block(model_dir: Path) -> dict[str, Any]:
    """The card's ``gate_probe`` block for the model saved in ``model_dir`` (run at training:
    public notes only, no privacy cost)."""
    result = run_probe(Tagger.load(model_dir))
    recall = round(result.recall, 4) if math.isfinite(result.recall) else 0.0
    return {"version": PROBE_VERSION, "notes": len(probe_notes()), "recall": recall,
            "floor": floor_for(recall)}


def with_probe(meta: dict[str, Any], model_dir: Path) -> dict[str, Any]:
    """``meta`` with the ``gate_probe`` block of the model in ``model_dir``."""
    return {**meta, "gate_probe": probe_block(model_dir)}


def stated_floor(block: Any) -> float | None:
    """The floor a ``gate_probe`` block states, raised to the dphub-wide minimum; None when the
    block is absent or malformed (the schema says which)."""
    if not isinstance(block, dict):
        return None
    floor = block.get("floor")
    if isinstance(floor, bool) or not isinstance(floor, int | float) or not math.isfinite(floor):
        return None
    return max(MIN_PROBE_FLOOR, float(floor))
