"""Character spans <-> word-piece BIOES tags, and long notes <-> fixed-length windows.

Notes and spans speak in character offsets; an encoder speaks in word pieces of bounded length.
This module is the only translation between the two (see docs/architecture.md):

* :func:`tokenize` runs a Hugging Face *fast* tokenizer over whole notes and keeps each piece's
  character offsets. It never truncates: a clinical note is often longer than the encoder's
  context, and a silently dropped tail would be unredacted PHI.
* :func:`make_windows` cuts a note's pieces into overlapping windows that fit the encoder
  (``max_length`` counts the special tokens). Consecutive windows overlap by ``stride`` pieces so
  every piece near a cut still sees context on both sides; each piece is *owned* by exactly one
  window (the one in which it sits nearer the centre), and :func:`merge_windows` takes each
  piece's prediction from its owner, so merging is deterministic and never averages.
* :func:`spans_to_tags` / :func:`tags_to_spans` convert gold spans to BIOES training targets and
  predicted tags back to spans, tolerating the invalid sequences a softmax head can emit.
* :func:`collate` pads windows into batch-shaped tensors. ``position_ids`` and ``token_type_ids``
  are materialised per example (not broadcast buffers) because Opacus computes per-sample
  gradients of the embedding tables from per-example inputs.

Nothing here sees or logs note text beyond the tokenizer call itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dphub.errors import ConfigError, ModelError
from dphub.labels import LabelSchema
from dphub.notes import Span

__all__ = [
    "NoteTokens",
    "Window",
    "tokenize",
    "special_layout",
    "make_windows",
    "windows_by_note",
    "spans_to_tags",
    "tags_to_spans",
    "tags_to_ids",
    "merge_windows",
    "collate",
    "collate_labels",
    "bucket_by_length",
]


@dataclass
class NoteTokens:
    """The word pieces of one note.

    offsets: (n, 2) int64 char ``[start, end)`` of each piece in the note text, in text order,
             no special tokens and no zero-width pieces; consecutive pieces may share a
             character when normalisation splits it (Hangul syllables decompose into jamo)
    ids:     (n,) int64 token ids
    """

    offsets: np.ndarray
    ids: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.shape[0])


@dataclass
class Window:
    """One encoder input cut from a note.

    ``token_start``/``token_end`` index the note's :class:`NoteTokens` (``[start, end)``);
    ``input_ids`` wraps those pieces in the tokenizer's special tokens, with the first real piece
    at ``content_start``. ``owned`` is the ``[a, b)`` sub-range (same indexing as ``token_start``)
    whose predictions this window contributes when merging.
    """

    note_index: int
    token_start: int
    token_end: int
    input_ids: list[int]
    attention_mask: list[int]
    owned: tuple[int, int]
    content_start: int = 1

    @property
    def n_tokens(self) -> int:
        """Number of real (non-special) pieces in the window."""
        return self.token_end - self.token_start

    @property
    def content_slice(self) -> slice:
        """Where the real pieces sit in ``input_ids`` (to cut encoder outputs down to them)."""
        return slice(self.content_start, self.content_start + self.n_tokens)


def _require_fast(tokenizer: Any) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(
            "dphub needs a fast (Rust) Hugging Face tokenizer with offset mappings; "
            f"got {type(tokenizer).__name__} (is_fast is false)"
        )


def tokenize(tokenizer: Any, texts: Sequence[str]) -> list[NoteTokens]:
    """Tokenize whole notes in one batch call; keep char offsets, drop zero-width pieces.

    Pieces with an empty offset range (e.g. produced by normalisation of control characters)
    cannot be mapped to text and are dropped; nothing is ever truncated.
    """
    _require_fast(tokenizer)
    texts = list(texts)
    if not texts:
        return []
    enc = tokenizer(
        texts,
        add_special_tokens=False,
        return_offsets_mapping=True,
        return_attention_mask=False,
        return_token_type_ids=False,
        truncation=False,
        padding=False,
        verbose=False,
    )
    out: list[NoteTokens] = []
    for ids, offs in zip(enc["input_ids"], enc["offset_mapping"], strict=True):
        ids_arr = np.asarray(ids, dtype=np.int64).reshape(-1)
        off_arr = np.asarray(offs, dtype=np.int64).reshape(-1, 2)
        keep = off_arr[:, 1] > off_arr[:, 0]
        out.append(NoteTokens(offsets=off_arr[keep].copy(), ids=ids_arr[keep].copy()))
    return out


def special_layout(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special-token ids a tokenizer puts before and after a single sequence.

    transformers 5 has no ``build_inputs_with_special_tokens``; the layout is read off an encoding
    of one character, where special tokens are the pieces with empty offsets.
    """
    _require_fast(tokenizer)
    enc = tokenizer("a", add_special_tokens=True, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    offs = [tuple(o) for o in enc["offset_mapping"]]
    real = [i for i, (a, b) in enumerate(offs) if b > a]
    if not real:
        raise ModelError("cannot determine the special-token layout of the tokenizer")
    return ids[: real[0]], ids[real[-1] + 1 :]


def _split_points(starts: list[int], ends: list[int]) -> list[int]:
    """Ownership boundaries between consecutive windows: the middle of each overlap."""
    pairs = zip(starts[1:], ends[:-1], strict=True)
    return [s_next + (e_prev - s_next) // 2 for s_next, e_prev in pairs]


def make_windows(
    tokens: Sequence[NoteTokens],
    tokenizer: Any,
    max_length: int = 128,
    stride: int = 32,
) -> list[Window]:
    """Cut every note into windows of at most ``max_length`` ids (special tokens included).

    Consecutive windows of a note overlap by exactly ``stride`` pieces (the last one may be
    shorter). Within an overlap the first half is owned by the earlier window and the second half
    by the later one, so each piece is predicted by the window where it has the most context on
    its nearer side. An empty note still gets one window (only special tokens, owning nothing), so
    that every note has at least one window and per-note outputs keep their shape.
    """
    prefix, suffix = special_layout(tokenizer)
    content = max_length - len(prefix) - len(suffix)
    if content < 1:
        raise ConfigError(
            f"max_length {max_length} leaves no room for tokens after "
            f"{len(prefix) + len(suffix)} special tokens"
        )
    if stride < 0 or stride >= content:
        raise ConfigError(
            f"stride must be between 0 and {content - 1} for max_length {max_length} "
            f"(got {stride})"
        )
    step = content - stride
    windows: list[Window] = []
    for note_index, nt in enumerate(tokens):
        n = len(nt)
        starts = [0]
        while starts[-1] + content < n:
            starts.append(starts[-1] + step)
        ends = [min(s + content, n) for s in starts]
        cuts = _split_points(starts, ends)
        owned_from = [0, *cuts]
        owned_to = [*cuts, n]
        ids = nt.ids.tolist()
        for k, (s, e) in enumerate(zip(starts, ends, strict=True)):
            input_ids = [*prefix, *ids[s:e], *suffix]
            windows.append(
                Window(
                    note_index=note_index,
                    token_start=s,
                    token_end=e,
                    input_ids=input_ids,
                    attention_mask=[1] * len(input_ids),
                    owned=(owned_from[k], owned_to[k]),
                    content_start=len(prefix),
                )
            )
    return windows


def windows_by_note(windows: Sequence[Window]) -> dict[int, list[int]]:
    """Indices of ``windows`` grouped by ``note_index`` (in window order)."""
    groups: dict[int, list[int]] = {}
    for i, w in enumerate(windows):
        groups.setdefault(w.note_index, []).append(i)
    return groups


def spans_to_tags(offsets: np.ndarray, spans: Sequence[Span], schema: LabelSchema) -> list[str]:
    """BIOES tag per piece for character ``spans``.

    A piece overlapping a span belongs to it (so a span edge inside a piece widens the entity to
    the whole piece). A piece touching two spans goes to the earlier one; a span whose pieces were
    all taken, or that covers no piece (whitespace only), yields no tag. Labels are mapped with
    ``schema.map`` (``HCPName`` -> ``NAME`` for ``hipaa``).
    """
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    tags = ["O"] * offsets.shape[0]
    for sp, idx in _span_pieces(offsets, spans):
        label = schema.map(sp.label)
        if idx.size == 1:
            tags[idx[0]] = f"S-{label}"
            continue
        tags[idx[0]] = f"B-{label}"
        for k in idx[1:-1]:
            tags[k] = f"I-{label}"
        tags[idx[-1]] = f"E-{label}"
    return tags


def spans_to_confidence(offsets: np.ndarray, spans: Sequence[Span]) -> np.ndarray:
    """Per piece, how sure the labels are of its tag (float32): the score of the span that
    :func:`spans_to_tags` gives the piece (1.0 for a span without one, e.g. gold), 1.0 for ``O``.

    Soft labels (``dphub ensemble distill --soft-labels``): an ensemble's span scores become the
    probability the student is taught for the span's tag, the rest going to ``O``.
    """
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    out = np.ones(offsets.shape[0], dtype=np.float32)
    for sp, idx in _span_pieces(offsets, spans):
        if sp.score is not None:
            out[idx] = min(1.0, max(0.0, float(sp.score)))
    return out


def _span_pieces(offsets: np.ndarray, spans: Sequence[Span]) -> Iterator[tuple[Span, np.ndarray]]:
    """Each span with the pieces it gets: overlapping pieces not taken by an earlier span."""
    free = np.ones(offsets.shape[0], dtype=bool)
    for sp in sorted(spans, key=lambda s: (s.start, s.end)):
        idx = np.flatnonzero((offsets[:, 0] < sp.end) & (offsets[:, 1] > sp.start) & free)
        if idx.size:
            free[idx] = False
            yield sp, idx


def _split_tag(tag: str) -> tuple[str, str | None]:
    """``'B-NAME'`` -> ``('B', 'NAME')``; BILOU ``L``/``U`` read as ``E``/``S``; a bare label
    (IO scheme) reads as ``I``."""
    if tag in ("O", "", None):
        return "O", None
    if len(tag) > 2 and tag[1] == "-" and tag[0] in "BIESLU":
        prefix = {"L": "E", "U": "S"}.get(tag[0], tag[0])
        return prefix, tag[2:]
    return "I", tag


def tags_to_spans(offsets: np.ndarray, tags: Sequence[str]) -> list[Span]:
    """Character spans from one BIOES tag per piece, tolerating invalid sequences.

    ``B``/``S`` always start a new entity; ``I``/``E`` continue the open entity when its label
    matches and otherwise start one (so ``O I-NAME`` and ``B-DATE I-NAME`` still yield a NAME);
    ``E``/``S`` close it. A span runs from its first piece's start to its last piece's end.
    """
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    if len(tags) != offsets.shape[0]:
        raise ValueError(f"{len(tags)} tags for {offsets.shape[0]} pieces")
    spans: list[Span] = []
    cur_label: str | None = None
    cur_first = cur_last = -1

    def close() -> None:
        nonlocal cur_label
        if cur_label is not None:
            spans.append(
                Span(int(offsets[cur_first, 0]), int(offsets[cur_last, 1]), cur_label)
            )
        cur_label = None

    for k, tag in enumerate(tags):
        prefix, label = _split_tag(tag)
        if prefix == "O":
            close()
            continue
        if prefix in ("B", "S") or label != cur_label:
            close()
            cur_label, cur_first = label, k
        cur_last = k
        if prefix in ("E", "S"):
            close()
    close()
    return spans


def tags_to_ids(tags: Sequence[str], tag_to_id: dict[str, int]) -> np.ndarray:
    """Tag strings -> int64 ids (e.g. ``{t: i for i, t in enumerate(schema.bioes_tags())}``)."""
    try:
        return np.fromiter((tag_to_id[t] for t in tags), dtype=np.int64, count=len(tags))
    except KeyError as exc:
        raise ValueError(f"tag {exc.args[0]!r} is not in the tag vocabulary") from None


def merge_windows(
    windows: Sequence[Window], per_window: Sequence[np.ndarray], n_tokens: int
) -> np.ndarray:
    """Per-piece outputs of one note's windows -> one ``(n_tokens, ...)`` array.

    ``per_window[i]`` holds window ``i``'s rows for its real pieces (``windows[i].n_tokens`` rows,
    no special tokens). Each piece's row is copied from the window that owns it; raises
    ``ValueError`` when the windows are not one note's complete, non-overlapping ownership.
    """
    if len(windows) != len(per_window):
        raise ValueError(f"{len(windows)} windows but {len(per_window)} outputs")
    if not windows:
        if n_tokens:
            raise ValueError(f"no windows for {n_tokens} tokens")
        return np.empty((0,))
    if len({w.note_index for w in windows}) != 1:
        raise ValueError("merge_windows takes the windows of a single note")
    arrays = [np.asarray(a) for a in per_window]
    trailing = arrays[0].shape[1:]
    dtype = np.result_type(*arrays)
    out = np.empty((n_tokens, *trailing), dtype=dtype)
    seen = np.zeros(n_tokens, dtype=bool)
    for w, arr in zip(windows, arrays, strict=True):
        if arr.shape[0] != w.n_tokens or arr.shape[1:] != trailing:
            raise ValueError(
                f"window {w.token_start}-{w.token_end} output has shape {arr.shape}, "
                f"expected ({w.n_tokens}, *{trailing})"
            )
        a, b = w.owned
        if not (w.token_start <= a <= b <= w.token_end) or b > n_tokens:
            raise ValueError(f"window owns {a}-{b} outside its tokens or the note")
        if seen[a:b].any():
            raise ValueError(f"tokens {a}-{b} are owned by more than one window")
        seen[a:b] = True
        out[a:b] = arr[a - w.token_start : b - w.token_start]
    if not seen.all():
        raise ValueError(f"{int((~seen).sum())} tokens are owned by no window")
    return out


def collate(windows: Sequence[Window], pad_id: int, *, multiple: int = 1
            ) -> dict[str, torch.Tensor]:
    """Right-pad windows into ``[B, L]`` int64 tensors, all contiguous and batch-shaped.

    Keys: ``input_ids``, ``attention_mask``, ``token_type_ids`` (zeros), ``position_ids``
    (``0..L-1`` on every row, materialised rather than broadcast, for Opacus). ``L`` is the
    longest window rounded up to a multiple of ``multiple`` (inference: fewer distinct shapes,
    see :data:`dphub.runtime.SHAPE_MULTIPLE`).
    """
    if not windows:
        raise ValueError("collate needs at least one window")
    if multiple < 1:
        raise ValueError(f"collate's multiple must be >= 1, got {multiple}")
    batch = len(windows)
    length = -(-max(len(w.input_ids) for w in windows) // multiple) * multiple
    input_ids = torch.full((batch, length), int(pad_id), dtype=torch.long)
    attention_mask = torch.zeros((batch, length), dtype=torch.long)
    for i, w in enumerate(windows):
        n = len(w.input_ids)
        input_ids[i, :n] = torch.tensor(w.input_ids, dtype=torch.long)
        attention_mask[i, :n] = torch.tensor(w.attention_mask, dtype=torch.long)
    position_ids = torch.arange(length, dtype=torch.long).repeat(batch, 1).contiguous()
    token_type_ids = torch.zeros((batch, length), dtype=torch.long)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
        "position_ids": position_ids,
    }


def collate_labels(
    windows: Sequence[Window],
    note_label_ids: Sequence[np.ndarray],
    ignore_index: int = -100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position training targets aligned with :func:`collate`'s ``[B, L]`` layout.

    ``note_label_ids[w.note_index]`` holds the tag ids of every piece of that note. Returns
    ``(labels, content_mask)``: ``labels`` carries ``ignore_index`` at special and padding
    positions; ``content_mask`` is True exactly at the window's real pieces.
    """
    if not windows:
        raise ValueError("collate_labels needs at least one window")
    batch = len(windows)
    length = max(len(w.input_ids) for w in windows)
    labels = torch.full((batch, length), int(ignore_index), dtype=torch.long)
    mask = torch.zeros((batch, length), dtype=torch.bool)
    for i, w in enumerate(windows):
        ids = np.asarray(note_label_ids[w.note_index])[w.token_start : w.token_end]
        sl = w.content_slice
        labels[i, sl] = torch.as_tensor(ids, dtype=torch.long)
        mask[i, sl] = True
    return labels, mask


def bucket_by_length(windows: Sequence[Window], batch_size: int) -> list[list[int]]:
    """Deterministic batches of window indices with similar lengths (less padding at inference).

    Windows are ordered by length, longest first (ties by index), and cut into ``batch_size``
    chunks; callers put outputs back by index.
    """
    if batch_size < 1:
        raise ConfigError(f"batch size must be at least 1 (got {batch_size})")
    order = sorted(range(len(windows)), key=lambda i: (-len(windows[i].input_ids), i))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
