"""Per-token PHI probabilities of a model over one note, and their conversion to char spans.

This is the contract between taggers and the ensemble: a tagger returns, per note, the character
offsets of its tokens (its own tokenizer's word pieces, windows already merged), the probability
that each token is PHI (1 - P(O); CRF marginals for a CRF head), the probability of each label, and
optionally the jointly decoded (Viterbi) BIOES tags. Thresholds (``ensemble calibrate``) are applied
here, once per threshold, without re-running the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from dphub.notes import Span


@dataclass
class TokenScores:
    """Scores of one note's tokens.

    offsets:     (n, 2) int, char ``[start, end)`` of each token, increasing, no special tokens
    phi_prob:    (n,) float, P(token is PHI)
    label_probs: (n, L) float, P(token belongs to label ``labels[j]``) summed over B/I/E/S
    labels:      the L labels (e.g. the HIPAA categories)
    decoded:     optional BIOES tag per token from joint decoding (CRF Viterbi)
    """

    offsets: np.ndarray
    phi_prob: np.ndarray
    label_probs: np.ndarray
    labels: tuple[str, ...]
    decoded: list[str] | None = None

    def __len__(self) -> int:
        return int(self.offsets.shape[0])


@dataclass(frozen=True)
class LabelThresholds:
    """A threshold per predicted label (``ensemble calibrate`` per (member, label)).

    Why per label: one threshold per member trades every category at the same rate, so a recall
    target that a rare, hard category needs drags the precise categories down with it. A token is
    flagged when ``phi_prob >= by_label[label]`` for its most probable label; labels not listed
    use ``default`` (0.5 when ``default`` is None).
    """

    default: float | None
    by_label: Mapping[str, float] = field(default_factory=dict)

    def for_label(self, label: str) -> float:
        t = self.by_label.get(label, self.default)
        return 0.5 if t is None else float(t)


def _runs_to_spans(
    ts: TokenScores,
    flags: np.ndarray,
    token_labels: list[str | None],
    source: str | None,
    breaks: np.ndarray | None = None,
) -> list[Span]:
    """Group flagged tokens into spans: a run continues while the label stays the same and no
    ``breaks[k]`` (a B-/S- tag) starts a new entity."""
    spans: list[Span] = []
    i, n = 0, len(ts)
    while i < n:
        if not flags[i]:
            i += 1
            continue
        j = i
        while (
            j + 1 < n
            and flags[j + 1]
            and token_labels[j + 1] == token_labels[i]
            and not (breaks is not None and breaks[j + 1])
        ):
            j += 1
        label = token_labels[i] or ts.labels[int(np.argmax(ts.label_probs[i : j + 1].sum(0)))]
        score = float(ts.phi_prob[i : j + 1].max())
        spans.append(
            Span(int(ts.offsets[i, 0]), int(ts.offsets[j, 1]), label, score=score, source=source)
        )
        i = j + 1
    return spans


def spans_from_scores(
    ts: TokenScores,
    threshold: float | LabelThresholds | None = None,
    *,
    source: str | None = None,
) -> list[Span]:
    """Character spans from token scores.

    ``threshold=None`` uses the decoded tags when present (a token is PHI when its tag is not
    ``O``; a run continues while the label stays the same), else ``phi_prob >= 0.5``. A number
    flags every token whose ``phi_prob`` reaches it: lower thresholds trade precision for recall.
    Consecutive flagged tokens with the same label form one span covering the text between them;
    the span score is the highest token ``phi_prob`` in it. A :class:`LabelThresholds` applies
    the threshold of each token's most probable label.
    """
    if len(ts) == 0:
        return []
    if isinstance(threshold, LabelThresholds):
        best = np.argmax(ts.label_probs, axis=1)
        per_label = np.array([threshold.for_label(lab) for lab in ts.labels], dtype=float)
        flags = ts.phi_prob >= per_label[best]
        labels_of: list[str | None] = [
            ts.labels[int(best[k])] if flags[k] else None for k in range(len(ts))
        ]
        return _runs_to_spans(ts, flags, labels_of, source)
    if threshold is None and ts.decoded is not None:
        flags = np.array([t != "O" for t in ts.decoded])
        token_labels: list[str | None] = [
            None if t == "O" else t.split("-", 1)[1] for t in ts.decoded
        ]
        breaks = np.array([t[:2] in ("B-", "S-") for t in ts.decoded])
        return _runs_to_spans(ts, flags, token_labels, source, breaks)
    t = 0.5 if threshold is None else threshold
    flags = ts.phi_prob >= t
    token_labels = [
        ts.labels[int(np.argmax(ts.label_probs[k]))] if flags[k] else None for k in range(len(ts))
    ]
    return _runs_to_spans(ts, flags, token_labels, source)
