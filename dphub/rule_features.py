"""Rule features: the zero-ε rule member's flags, given to a tagger as per-word-piece inputs.

Why: ``rules:default`` alone is far more precise and recall-rich on real notes than a small DP
model (it saw no patient, so it costs no ε). Given to the tagger as an input, the rules' flags
let DP-SGD learn only *when to trust them* (a few weights per tag in ``rule_proj``) instead of
learning PHI from ~100 patients under patient-level noise.

Features are a deterministic function of the note text (and of the rule member's fixed lists and
options), so they are part of the example, exactly like the word pieces: DP accounting is
unchanged. Per word piece the vector is (see :data:`FEATURE_NAMES`):

* one-hot of the HIPAA category of the rule span covering the piece (8 values; all zero outside
  rule spans) — the label is what a CRF over BIOES tags needs to pick ``B-NAME`` vs ``B-DATE``;
* the span's score (1.0 pattern, 0.6 dictionary hit): patterns are near-certain, dictionary hits
  are the ones DP has to learn to doubt;
* "first piece of the span" and "last piece of the span": a linear projection cannot derive the
  B/I/E/S position from the one-hot alone, and word pieces split one rule span into several.

A model records :func:`feature_spec` in its ``config.json``; :func:`rules_digest` covers the rule
member's options, its code version, the content of every word list it reads and the versions of
the packages that ship the other lists, so a model run with different rules is detected
(:func:`check_spec`) instead of silently getting features it was not trained on.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache
from importlib import metadata, resources
from typing import Any

import numpy as np

from dphub.errors import ModelError
from dphub.labels import CATEGORIES, category_of
from dphub.notes import Note, Span
from dphub.rules.engine import RULES_DEFAULT, RuleMember, RuleOptions

#: Version of the feature layout below (bump when the vector changes meaning).
FEATURES_VERSION = 1
FEATURE_NAMES: tuple[str, ...] = (
    *(f"rule_{c.lower()}" for c in CATEGORIES), "rule_score", "rule_first", "rule_last",
)
NUM_FEATURES = len(FEATURE_NAMES)
_CAT_INDEX = {c: i for i, c in enumerate(CATEGORIES)}
_SCORE, _FIRST, _LAST = len(CATEGORIES), len(CATEGORIES) + 1, len(CATEGORIES) + 2

#: the rule member's source files: their bytes stand for its patterns and context rules in
#: :func:`rules_digest` (the member in ``dphub/rules/engine.py``, its word lists and vocabulary in
#: ``lexicon.py``, its structured patterns in ``patterns.py``)
RULE_SOURCES: tuple[str, ...] = ("engine.py", "lexicon.py", "patterns.py")

#: Rule members whose outputs are byte-identical to a later one although their sources differ:
#: old digest -> the digest it equals. The source hash changes with any edit, also one that only
#: moves code; an entry here says a move was checked to change no output, so models trained
#: before it still load. An entry applies only while this dphub's digest is its target: the
#: first real change to the rules ends it. (0.1.0's member, cut into three modules in issue 30:
#: identical spans on 120 synthetic notes under four option sets, with and without a threshold;
#: issue 39 moved the three modules to ``dphub/rules/`` (imports and docstrings only): both
#: earlier digests equalled the moved member's, ``9657da16426dbbba``.) Issue 38 changed the
#: rules' output (decimal ages, years after 2029): those three digests give other features for
#: such notes, so models trained before it are refused, and the map is empty again.
RULES_DIGEST_EQUIVALENT: dict[str, str] = {}


@lru_cache(maxsize=1)
def rules_digest() -> str:
    """SHA-256 (first 16 hex digits) of everything the default rule member's output depends on.

    The rule module's source stands for its patterns (any change there may change features);
    the word lists are hashed by content; the Census and Webster lists by their package
    versions (they are installed files, pinned by version).
    """
    h = hashlib.sha256()
    h.update(f"features={FEATURES_VERSION};{','.join(FEATURE_NAMES)}\n".encode())
    h.update(json.dumps(RuleOptions().to_dict(), sort_keys=True).encode())
    for name in RULE_SOURCES:  # issue 30 cut the member into three modules: hash all three
        h.update(resources.files("dphub.rules").joinpath(name).read_bytes())
    folder = resources.files("dphub").joinpath("resources", "rules")
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".txt"):
            h.update(entry.name.encode())
            h.update(entry.read_bytes())
    for dist in ("names", "english-words"):
        try:
            h.update(f"{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=absent".encode())
    return h.hexdigest()[:16]


def feature_spec() -> dict[str, Any]:
    """What ``config.json`` records under ``dphub.rule_features`` for a model that needs them."""
    return {
        "version": FEATURES_VERSION,
        "member": RULES_DEFAULT,
        "options": RuleOptions().to_dict(),
        "features": list(FEATURE_NAMES),
        "rules_digest": rules_digest(),
    }


def check_spec(spec: Any, where: str) -> int:
    """Refuse a model whose rule features this dphub cannot reproduce; return their number."""
    if not isinstance(spec, dict) or not isinstance(spec.get("features"), list):
        raise ModelError(f"{where}: config.json has an invalid dphub.rule_features block")
    if spec.get("version") != FEATURES_VERSION or list(spec["features"]) != list(FEATURE_NAMES):
        raise ModelError(
            f"{where}: the model needs rule features of layout version {spec.get('version')!r}; "
            f"this dphub computes version {FEATURES_VERSION}: use the dphub release that trained it"
        )
    recorded = spec.get("rules_digest")
    current = rules_digest()
    if recorded != current and RULES_DIGEST_EQUIVALENT.get(str(recorded)) != current:
        raise ModelError(
            f"{where}: the model was trained with rule features from rules "
            f"{str(spec.get('rules_digest'))[:16]!r}, but this dphub's rule member (patterns, "
            f"word lists or options) is {rules_digest()!r}; its inputs would differ from "
            "training. Use the dphub release that trained it, or retrain the model"
        )
    return len(FEATURE_NAMES)


#: texts whose rule spans the shared member remembers: more than the notes of one batch, so
#: the features (computed when a batch is encoded) and the rule member (tagging the same batch)
#: scan each note once
SCAN_MEMO_NOTES = 256


@lru_cache(maxsize=1)
def shared_rule_member() -> Any:
    """The process's default ``rules:default`` member, its last scans memoized.

    Why: a model with rule features and the ensemble's rule member both run the default rules
    over every note (about a tenth of a three-model ensemble's time with a 3-block encoder,
    docs/speed.md). Both use this one instance (:func:`dphub.ensemble.core.member_from_entry`
    gives it to a manifest's default rule member), so each note is scanned once. The memo
    subclasses the rule member rather than changing it: the rule module's bytes are part of
    :func:`rules_digest`, which every rule-feature model pins.
    """
    class _MemoizedRuleMember(RuleMember):
        def __init__(self) -> None:
            super().__init__()
            self._memo: OrderedDict[str, tuple[Span, ...]] = OrderedDict()

        def spans(self, text: str) -> list[Span]:
            hit = self._memo.get(text)
            if hit is None:
                hit = self._memo[text] = tuple(super().spans(text))
                if len(self._memo) > SCAN_MEMO_NOTES:
                    self._memo.popitem(last=False)
            else:
                self._memo.move_to_end(text)
            return list(hit)

    return _MemoizedRuleMember()


def note_features(text: str, offsets: np.ndarray) -> np.ndarray:
    """``[n pieces, NUM_FEATURES]`` float32 rule features of one note's word pieces.

    ``offsets`` are the pieces' character ``[start, end)`` (``dphub.align.NoteTokens.offsets``,
    in text order). A piece overlapping a rule span gets that span's features; spans from the
    rule member never overlap each other.
    """
    n = int(offsets.shape[0])
    out = np.zeros((n, NUM_FEATURES), dtype=np.float32)
    if n == 0 or not text:
        return out
    starts = offsets[:, 0]
    ends = offsets[:, 1]
    for s in shared_rule_member().spans(text):
        # pieces with start < span end and end > span start; starts are in text order, and a
        # piece starting before the span overlaps it only if it is one of the last two before
        lo = max(0, int(np.searchsorted(starts, s.start, side="left")) - 2)
        hi = int(np.searchsorted(starts, s.end, side="left"))
        idx = [i for i in range(lo, hi) if ends[i] > s.start]
        if not idx:
            continue
        cat = category_of(s.label) if s.label else "OTHER"
        out[idx, _CAT_INDEX.get(cat, _CAT_INDEX["OTHER"])] = 1.0
        out[idx, _SCORE] = float(s.score if s.score is not None else 1.0)
        out[idx[0], _FIRST] = 1.0
        out[idx[-1], _LAST] = 1.0
    return out


def notes_features(notes: Sequence[Note], tokens: Sequence[Any]) -> list[np.ndarray]:
    """Rule features of each note's pieces (``tokens`` from ``dphub.align.tokenize``)."""
    return [note_features(n.text, nt.offsets) for n, nt in zip(notes, tokens, strict=True)]


def window_features(windows: Sequence[Any], per_note: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``[len(input_ids), NUM_FEATURES]`` per window: the note's features at the window's real
    pieces, zeros at special tokens."""
    out = []
    for w in windows:
        f = np.zeros((len(w.input_ids), NUM_FEATURES), dtype=np.float32)
        f[w.content_slice] = per_note[w.note_index][w.token_start : w.token_end]
        out.append(f)
    return out


def pad_features(rows: Sequence[np.ndarray], width: int) -> Any:
    """Stack per-window features into a ``[B, width, F]`` float tensor (zeros past each end)."""
    import torch

    out = torch.zeros((len(rows), width, NUM_FEATURES), dtype=torch.float32)
    for b, r in enumerate(rows):
        out[b, : r.shape[0]] = torch.from_numpy(r)
    return out
