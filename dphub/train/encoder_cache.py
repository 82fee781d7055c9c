"""The frozen-encoder cache: head-only runs look up the encoder's outputs instead of recomputing them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from dphub.train.data import Example
from dphub.train.options import TrainOptions
from dphub.train.results import Progress, ProgressFn

#: Progress phase of the cache build (windows encoded so far of all distinct windows).
ENCODER_CACHE_PHASE = "encoder-cache"


class FrozenEncoderCache(torch.nn.Module):
    """Stands in for a fully frozen encoder: returns its precomputed outputs.

    With ``train_layers=0`` (and no LoRA) nothing in the encoder trains, so its output for a
    window is a fixed function of the window's token ids once dropout is off. Computing it once
    (eval mode) and looking it up by the ids makes every DP epoch cost only the head and the CRF —
    on two CPU cores the difference between minutes and an hour. Keys are the window's token ids
    (identical windows share an entry, which is exact since their outputs are identical).
    """

    def __init__(self, encoder: torch.nn.Module, windows: Sequence[Sequence[int]],
                 pad_id: int, batch_size: int = 32,
                 on_progress: ProgressFn | None = None) -> None:
        super().__init__()
        self.config = getattr(encoder, "config", None)
        self.table: dict[bytes, torch.Tensor] = {}
        was_training = encoder.training
        encoder.eval()
        uniq = list({np.asarray(w, dtype=np.int64).tobytes(): list(w) for w in windows}.items())
        uniq.sort(key=lambda kv: len(kv[1]))  # length bucketing: little padding
        with torch.inference_mode():
            for i in range(0, len(uniq), batch_size):
                chunk = uniq[i : i + batch_size]
                n, width = len(chunk), max(len(w) for _, w in chunk)
                ids = torch.full((n, width), pad_id, dtype=torch.long)
                mask = torch.zeros((n, width), dtype=torch.long)
                for r, (_, w) in enumerate(chunk):
                    ids[r, : len(w)] = torch.tensor(w)
                    mask[r, : len(w)] = 1
                out = encoder(input_ids=ids, attention_mask=mask,
                              token_type_ids=torch.zeros_like(ids),
                              position_ids=torch.arange(width).expand(n, width).contiguous())
                hidden = out[0] if isinstance(out, tuple) else out.last_hidden_state
                for r, (key, w) in enumerate(chunk):
                    self.table[key] = hidden[r, : len(w)].to(torch.float16).clone()
                if on_progress is not None:  # minutes on CPU for a real corpus: say so
                    on_progress(Progress(ENCODER_CACHE_PHASE, i + n, len(uniq), None, None, None))
        encoder.train(was_training)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor]:
        b, width = input_ids.shape
        if b == 0:
            return (torch.zeros((0, width, self._hidden()), dtype=torch.float32),)
        rows = []
        lengths = attention_mask.sum(-1).tolist()
        for r in range(b):
            key = input_ids[r, : int(lengths[r])].numpy().astype(np.int64).tobytes()
            h = self.table[key].float()
            rows.append(torch.nn.functional.pad(h, (0, 0, 0, width - h.shape[0])))
        return (torch.stack(rows),)

    def _hidden(self) -> int:
        return next(iter(self.table.values())).shape[-1]


@contextlib.contextmanager
def cached_encoder(model: Any, opts: TrainOptions, examples: Sequence[Example],
                   pad_id: int, on_progress: ProgressFn | None = None) -> Iterator[None]:
    """Swap a frozen encoder for its feature cache while training (head-only runs)."""
    if opts.train_layers != 0 or opts.lora_rank is not None:
        yield
        return
    real = model.encoder
    model.encoder = FrozenEncoderCache(real, [e.input_ids for e in examples], pad_id,
                                       on_progress=on_progress)
    try:
        yield
    finally:
        model.encoder = real
