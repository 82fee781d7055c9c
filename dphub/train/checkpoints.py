"""Checkpoints, the run fingerprint and the private run log.

Checkpoints hold what a resumed run needs: model and optimizer state, the accountant's history,
the global RNG (dropout) and, for ``--no-dp`` baselines only, the data-order generator. The DP
mechanism's randomness is never stored: a resumed DP run draws fresh OS entropy. They are written
without pickle (:mod:`dphub.checkpoint`) into a private directory outside the published one
(``<out>/../.<name>.ckpt/``) and removed after a successful run. The run log (loss curve, exact
counts) is private too and stays beside it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dphub import checkpoint
from dphub.errors import ConfigError
from dphub.io import atomic_open
from dphub.train.data import Example
from dphub.train.options import TrainOptions

#: A pickled checkpoint of dphub < 0.2: never loaded (it could run code), only detected.
LEGACY_CHECKPOINT_FILE = "checkpoint.pt"


def checkpoint_dir_for(out: Path, override: Path | None = None) -> Path:
    """``<out>/../.<name>.ckpt/``: next to, never inside, the published directory."""
    if override is not None:
        return Path(override)
    out = Path(out).resolve()
    return out.parent / f".{out.name}.ckpt"


def save_checkpoint(directory: Path, state: dict[str, Any]) -> None:
    """Write a private checkpoint (safetensors + JSON, no pickle) atomically into ``directory``."""
    checkpoint.save(directory, state)


def load_checkpoint(directory: Path, fingerprint: str) -> dict[str, Any]:
    """Load a checkpoint of *this* run: the fingerprint is checked before any tensor is read."""
    manifest = checkpoint.read_manifest(directory)
    if manifest["state"].get("fingerprint") != fingerprint:
        raise ConfigError(
            f"{directory}: checkpoint belongs to a different run (data or options changed)"
        )
    return checkpoint.load(directory, manifest)


def run_fingerprint(opts: TrainOptions, examples: Sequence[Example], base_id: str) -> str:
    """Hash of everything that must match for a resumed run to continue the same run."""
    h = hashlib.sha256()
    keep = {k: v for k, v in opts.public_dict().items() if k not in ("checkpoint_every",)}
    h.update(json.dumps(keep, sort_keys=True, default=str).encode())
    h.update(base_id.encode())
    h.update(str(opts.init_from).encode())
    for ex in examples:
        h.update(ex.unit.encode())
        h.update(np.asarray(ex.input_ids, dtype=np.int64).tobytes())
        h.update(np.asarray(ex.labels, dtype=np.int64).tobytes())
        if ex.features is not None:
            h.update(np.ascontiguousarray(ex.features, dtype=np.float32).tobytes())
        if ex.confidence is not None:
            h.update(np.ascontiguousarray(ex.confidence, dtype=np.float32).tobytes())
    return h.hexdigest()


def run_log_path(ckpt_dir: Path) -> Path:
    """The private run log (loss curve, exact counts) beside the checkpoint directory."""
    name = ckpt_dir.name.removesuffix(".ckpt")
    return ckpt_dir.parent / f"{name}.trainlog.json"


def write_run_log(path: Path, record: dict[str, Any]) -> None:
    """Write the run's private log (0600): values the accountant did not pay for stay here."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "w") as fh:
        fh.write(json.dumps(record, indent=2) + "\n")
    os.chmod(path, 0o600)
