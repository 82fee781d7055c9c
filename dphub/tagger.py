"""The PHI tagger over notes: :class:`Tagger` runs a :class:`~dphub.tagger_model.TaggerModel` on
:class:`~dphub.notes.Note` objects: windows with stride (no truncation), ``torch.inference_mode``,
length bucketing, encoder runtimes (:mod:`dphub.runtime`), CRF marginals and Viterbi tags merged
back per token, returned as :class:`~dphub.scores.TokenScores`.

The network, its losses and its model directory are :mod:`dphub.tagger_model`; its public names
are importable from here too.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dphub import align
from dphub import rule_features as rf
from dphub.errors import ConfigError, ModelError
from dphub.notes import Note, Span
from dphub.rule_features import pad_features
from dphub.runtime import (
    SHAPE_MULTIPLE,
    TORCH_RUNTIMES,
    bf16_autocast,
    check_bf16,
    check_runtime,
    inference_device,
    load_encoder,
)
from dphub.scores import TokenScores, spans_from_scores
from dphub.tagger_model import TaggerModel

# ---------------------------------------------------------------------------------- inference


@dataclass
class EncodedNotes:
    """Notes tokenized, windowed and run through one encoder: what taggers with the same
    :attr:`Tagger.encoder_key` share, so that an ensemble of N head-only members costs about
    one encoder pass per window instead of N."""

    key: tuple[str, str, int, int, str]
    batch_size: int
    tokens: list[Any]
    windows: list[Any]
    hidden: list[Tensor | None]  # per window: [window length, hidden size]
    #: per window ``[window length, F]`` rule features, keyed by rules digest; filled by the
    #: first member that needs them (they belong to the heads, not to the shared encoder key)
    rule_features: dict[str, list[np.ndarray]] = field(default_factory=dict)


def _pad_hidden(rows: Sequence[Tensor | None], width: int) -> Tensor:
    """Stack per-window hidden states into ``[B, width, H]`` (zeros past each window's end)."""
    real = [r for r in rows if r is not None]
    out = torch.zeros((len(rows), width, real[0].shape[-1]), dtype=real[0].dtype,
                      device=real[0].device)
    for b, r in enumerate(rows):
        if r is not None:
            out[b, : r.shape[0]] = r
    return out


class Tagger:
    """Inference wrapper: notes in, per-token scores or character spans out.

    ``name`` (the directory name), ``labels`` (the schema's labels, e.g. HIPAA categories) and
    ``tokenizer_id`` (base model id + hash of ``tokenizer.json``: members with equal ids split
    text identically) describe it to the ensemble.
    """

    def __init__(self, model: TaggerModel, tokenizer: Any, model_dir: Path | None = None,
                 name: str | None = None, device: str | None = None) -> None:
        if device is None:  # a model handed in stays where it is (a server's model, a training run)
            device = str(next(model.parameters()).device)
        self.model = model.eval().to(device)
        self.tokenizer = tokenizer
        self.model_dir = Path(model_dir) if model_dir else None
        self.device = torch.device(device)
        self.name = name or (self.model_dir.name if self.model_dir else "tagger")
        labels: list[str] = []
        for t in model.tags:
            if t != "O" and t[2:] not in labels:
                labels.append(t[2:])
        self.labels: tuple[str, ...] = tuple(labels)
        # tag index -> label index (-1 for O): label_probs sum over B/I/E/S of each label
        self._tag_to_label = np.zeros((len(model.tags), len(labels)), dtype=np.float64)
        for i, t in enumerate(model.tags):
            if t != "O":
                self._tag_to_label[i, labels.index(t[2:])] = 1.0
        self._o_index = model.tags.index("O")
        tok_json = (self.model_dir / "tokenizer.json") if self.model_dir else None
        digest = (hashlib.sha256(tok_json.read_bytes()).hexdigest()[:16]
                  if tok_json is not None and tok_json.is_file() else "unknown")
        self.tokenizer_id = f"{model.base_public_id or 'unknown'}@{digest}"
        self._encoder_digest: str | None = None
        #: encoder runtime (:mod:`dphub.runtime`): "torch", or one set by use_runtime
        self.runtime = "torch"
        self._onnx: Any = None

    @property
    def encoder_digest(self) -> str:
        """SHA-256 of the encoder's weights (names and bytes), computed once.

        Members trained head-only on one public base share these weights exactly; the ensemble
        then runs that encoder once per window for all of them (:meth:`encode`).
        """
        if self._encoder_digest is None:
            h = hashlib.sha256()
            for name, t in sorted(self.model.encoder.state_dict().items()):
                h.update(name.encode())
                h.update(str(tuple(t.shape)).encode())
                h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
            self._encoder_digest = h.hexdigest()
        return self._encoder_digest

    @property
    def encoder_key(self) -> tuple[str, str, int, int, str]:
        """What must match for two taggers to share encoder outputs: tokenizer, encoder weights,
        the windowing (max length, stride) and the runtime (int8 outputs differ from fp32)."""
        return (self.tokenizer_id, self.encoder_digest, int(self.model.max_length),
                int(self.model.stride), self.runtime)

    def use_runtime(self, runtime: str, *, threads: int | None = None,
                    progress: Any = None) -> Any:
        """Run the encoder with ``runtime`` (``torch``, ``torch-bf16``, ``onnx``, ``onnx-int8``;
        see :mod:`dphub.runtime`). ONNX graphs come from the cache keyed by
        :attr:`encoder_digest`, built on first use (``progress`` gets a status line first).
        Returns the cache status (None for the torch runtimes). Heads and CRF always run in
        PyTorch fp32 (fp64 for the CRF's marginals)."""
        check_runtime(runtime)
        if runtime in TORCH_RUNTIMES:
            if runtime == "torch-bf16":
                check_bf16(self.device)
            self.runtime, self._onnx = runtime, None
            return None
        if self.device.type != "cpu":
            raise ConfigError(f"runtime {runtime} runs on the CPU (ONNX Runtime's CPU provider); "
                              f"on {self.device.type} use torch or torch-bf16, or --device cpu")
        digest = self.encoder_digest  # from the float weights, before anything else changes
        self._onnx, status = load_encoder(runtime, self.model.encoder, digest, threads=threads,
                                          progress=progress)
        self.runtime = runtime
        return status

    def _encode_batch(self, batch: dict[str, Tensor]) -> Tensor:
        """Hidden states of a collated batch with this tagger's runtime."""
        if self._onnx is not None:
            return self._onnx(batch)
        if self.runtime == "torch-bf16":
            with bf16_autocast(self.device):
                return self.model.encode(batch).float()
        return self.model.encode(batch)

    def encode(self, notes: Sequence[Note], batch_size: int = 16) -> EncodedNotes:
        """Windows of ``notes`` and the encoder's hidden states for each, to share between
        taggers with the same :attr:`encoder_key` (see :meth:`token_scores`)."""
        if batch_size < 1:
            raise ConfigError(f"batch size must be at least 1 (got {batch_size})")
        notes = list(notes)
        tokens = align.tokenize(self.tokenizer, [n.text for n in notes])
        windows = align.make_windows(tokens, self.tokenizer, self.model.max_length,
                                     self.model.stride)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        hidden: list[Tensor | None] = [None] * len(windows)
        with torch.inference_mode():
            for idx in align.bucket_by_length(windows, batch_size):
                chunk = [windows[i] for i in idx]
                batch = {k: v.to(self.device) for k, v in
                         align.collate(chunk, pad_id, multiple=SHAPE_MULTIPLE).items()}
                h = self._encode_batch(batch)
                for r, (i, w) in enumerate(zip(idx, chunk, strict=True)):
                    hidden[i] = h[r, : len(w.input_ids)].clone()
        encoded = EncodedNotes(self.encoder_key, batch_size, tokens, windows, hidden)
        if self.model.rule_features is not None:
            self._window_rule_features(notes, encoded.tokens, encoded.windows, encoded)
        return encoded

    def _window_rule_features(self, notes: Sequence[Note], tokens: Sequence[Any],
                              windows: Sequence[Any],
                              encoded: EncodedNotes | None = None) -> list[np.ndarray] | None:
        """Per-window rule features when this model takes them (None otherwise); shared through
        ``encoded`` between members that use the same rules."""
        spec = self.model.rule_features
        if spec is None:
            return None

        key = str(spec.get("rules_digest"))
        if encoded is not None and key in encoded.rule_features:
            return encoded.rule_features[key]
        feats = rf.window_features(windows, rf.notes_features(notes, tokens))
        if encoded is not None:
            encoded.rule_features[key] = feats
        return feats

    @classmethod
    def load(cls, model_dir: Path | str, device: str | None = None) -> Tagger:
        """Load a model directory (safetensors only, ``trust_remote_code=False``)."""
        from transformers import AutoTokenizer

        model_dir = Path(model_dir)
        model = TaggerModel.load(model_dir)
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
        except (OSError, ValueError) as e:
            raise ModelError(f"{model_dir}: cannot load the tokenizer ({type(e).__name__})") \
                from None
        if not getattr(tokenizer, "is_fast", False):
            raise ModelError(f"{model_dir}: dphub needs a fast tokenizer (tokenizer.json)")
        # a model read from disk goes to the inference device: a CUDA GPU when PyTorch sees one
        return cls(model, tokenizer, model_dir, device=device or inference_device())

    def save(self, model_dir: Path) -> None:
        """Write this tagger's model directory (tokenizer files copied from where it was loaded)."""
        src = self.model_dir
        self.model.save(Path(model_dir), tokenizer_source=src)
        if src is not None:
            for extra in ("training_config.json", "README.md"):
                if (src / extra).is_file() and src.resolve() != Path(model_dir).resolve():
                    shutil.copyfile(src / extra, Path(model_dir) / extra)

    def token_scores(self, notes: Sequence[Note], batch_size: int = 16,
                     marginals: bool = True,
                     encoded: EncodedNotes | None = None) -> list[TokenScores]:
        """Per-token PHI probabilities of each note (windows merged; nothing truncated).

        ``marginals=True`` (default): ``phi_prob``/``label_probs`` are CRF posterior marginals
        (forward-backward), the right scores for thresholds and calibration. ``marginals=False``
        is the fast path for callers that only use the Viterbi ``decoded`` tags
        (``threshold=None``): it skips forward-backward and ``phi_prob``/``label_probs`` are the
        per-token softmax of the emissions instead (same shape and meaning as probabilities, but
        without the CRF's transition context; they only serve as span scores then).

        ``encoded`` (from :meth:`encode` of a tagger with the same :attr:`encoder_key`, on the same
        notes and batch size) replaces tokenization and the encoder pass: only this tagger's head
        and CRF run. The scores are identical to a run without it.
        """
        if batch_size < 1:
            raise ConfigError(f"batch size must be at least 1 (got {batch_size})")
        notes = list(notes)
        if not notes:
            return []
        if encoded is not None and (encoded.key != self.encoder_key
                                    or encoded.batch_size != batch_size
                                    or len(encoded.tokens) != len(notes)):
            raise ModelError("internal: shared encoder outputs of another encoder or batch")
        if encoded is None and self.runtime != "torch":  # the runtime's encoder, then the heads
            encoded = self.encode(notes, batch_size=batch_size)
        if encoded is not None:
            tokens, windows = encoded.tokens, encoded.windows
        else:
            tokens = align.tokenize(self.tokenizer, [n.text for n in notes])
            windows = align.make_windows(tokens, self.tokenizer, self.model.max_length,
                                         self.model.stride)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        feats_w = self._window_rule_features(notes, tokens, windows, encoded)
        probs_w: list[np.ndarray | None] = [None] * len(windows)
        dec_w: list[np.ndarray | None] = [None] * len(windows)
        with torch.inference_mode():
            for idx in align.bucket_by_length(windows, batch_size):
                chunk = [windows[i] for i in idx]
                batch = {k: v.to(self.device) for k, v in
                         align.collate(chunk, pad_id, multiple=SHAPE_MULTIPLE).items()}
                padded = batch["input_ids"].shape[1]
                if feats_w is not None:
                    batch["rule_features"] = pad_features(
                        [feats_w[i] for i in idx], padded).to(self.device)
                if encoded is None:
                    em = self.model._batch_emissions(batch)
                else:
                    em = self.model.head_emissions(_pad_hidden(
                        [encoded.hidden[i] for i in idx], padded), batch.get("rule_features"))
                # the heads are per position, so the shape grid's padding is cut before the CRF;
                # float64 forward-backward: marginals over 128 pieces sum to 1 within 1e-12
                length = max(len(w.input_ids) for w in chunk)
                em = em[:, :length].double()
                valid = torch.zeros((len(chunk), length), dtype=torch.bool, device=self.device)
                for r, w in enumerate(chunk):
                    valid[r, w.content_slice] = True
                if marginals:
                    marg = self.model._marginals_from_emissions(em, valid).cpu().numpy()
                else:
                    marg = em.softmax(-1).cpu().numpy()
                paths = self.model._decode_from_emissions(em, valid)
                for r, (i, w) in enumerate(zip(idx, chunk, strict=True)):
                    probs_w[i] = marg[r, w.content_slice]
                    dec_w[i] = np.asarray(paths[r], dtype=np.int64)
        out: list[TokenScores] = []
        groups = align.windows_by_note(windows)
        n_labels = len(self.labels)
        for ni, nt in enumerate(tokens):
            ws = groups.get(ni, [])
            n = len(nt)
            if n == 0:
                out.append(TokenScores(np.zeros((0, 2), dtype=np.int64), np.zeros(0),
                                       np.zeros((0, n_labels)), self.labels, []))
                continue
            probs = align.merge_windows([windows[i] for i in ws], [probs_w[i] for i in ws], n)
            dec = align.merge_windows([windows[i] for i in ws], [dec_w[i] for i in ws], n)
            label_probs = probs.astype(np.float64) @ self._tag_to_label
            phi = np.clip(1.0 - probs[:, self._o_index], 0.0, 1.0)
            out.append(TokenScores(
                offsets=nt.offsets.copy(),
                phi_prob=phi.astype(np.float64),
                label_probs=label_probs,
                labels=self.labels,
                decoded=[self.model.tags[int(t)] for t in dec],
            ))
        return out

    def tag(self, notes: Sequence[Note], threshold: float | None = None,
            batch_size: int = 16) -> list[list[Span]]:
        """Predicted spans per note: decoded tags (``threshold=None``) or ``phi_prob >= t``.

        Decoded tags need no marginals, so ``threshold=None`` takes the fast path (span scores
        are then the emissions' softmax, see :meth:`token_scores`).
        """
        scores = self.token_scores(notes, batch_size=batch_size, marginals=threshold is not None)
        return [spans_from_scores(ts, threshold, source=self.name) for ts in scores]
