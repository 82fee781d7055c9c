"""Training checkpoints without pickle: tensors in safetensors, everything else in JSON.

A checkpoint directory is private (0700, files 0600): it holds optimizer state and, for
``--no-dp`` baselines, the data-order generator's state — nothing the DP guarantee covers. Reading
it must never run code, even if someone planted a file there, so nothing is unpickled
(``torch.load(weights_only=False)`` would execute a planted payload): nested state dicts are split
into a safetensors file (every tensor, by a path-like key) and a JSON document in which each tensor
is replaced by ``{"__tensor__": key}``. ``read_manifest`` reads only the JSON, so the caller can
check the run fingerprint *before* loading any tensor.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from dphub.errors import ConfigError
from dphub.io import atomic_open

STATE_FILE = "checkpoint.json"
TENSOR_FILE = "checkpoint.safetensors"
_TENSOR = "__tensor__"
_INT_KEYS = "__int_keys__"


def _flatten(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Replace tensors by references; dicts with int keys (optimizer state) keep their type."""
    if torch.is_tensor(obj):
        key = prefix or "root"
        tensors[key] = obj.detach().cpu().contiguous()
        return {_TENSOR: key}
    if isinstance(obj, dict):
        int_keys = bool(obj) and all(isinstance(k, int) for k in obj)
        out = {str(k): _flatten(v, f"{prefix}.{k}" if prefix else str(k), tensors)
               for k, v in obj.items()}
        if int_keys:
            out[_INT_KEYS] = True
        return out
    if isinstance(obj, (list, tuple)):
        return [_flatten(v, f"{prefix}.{i}" if prefix else str(i), tensors)
                for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"checkpoint state holds an unsupported {type(obj).__name__}")


def _unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {_TENSOR}:
            return tensors[obj[_TENSOR]]
        int_keys = obj.get(_INT_KEYS) is True
        items = ((k, v) for k, v in obj.items() if k != _INT_KEYS)
        return {(int(k) if int_keys else k): _unflatten(v, tensors) for k, v in items}
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    return obj


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def save(directory: Path, state: dict[str, Any]) -> None:
    """Write ``state`` (nested dicts/lists of tensors and JSON values) atomically, privately.

    The tensor file is written first and the JSON last: a checkpoint is complete once its JSON
    exists, and the JSON names the digest of the tensor file it belongs to.
    """
    from safetensors.torch import save

    directory = Path(directory)
    _private_dir(directory)
    tensors: dict[str, torch.Tensor] = {}
    doc = _flatten(state, "", tensors)
    blob = save(tensors) if tensors else save({"_empty": torch.zeros(0)})
    with atomic_open(directory / TENSOR_FILE, "wb") as fh:
        fh.write(blob)
    os.chmod(directory / TENSOR_FILE, 0o600)
    manifest = {"format": 1, "tensors_sha256": hashlib.sha256(blob).hexdigest(), "state": doc}
    with atomic_open(directory / STATE_FILE, "w") as fh:
        fh.write(json.dumps(manifest))
    os.chmod(directory / STATE_FILE, 0o600)


def exists(directory: Path) -> bool:
    return (Path(directory) / STATE_FILE).is_file()


def read_manifest(directory: Path) -> dict[str, Any]:
    """The JSON part only (no tensors loaded): check fingerprints here before :func:`load`."""
    path = Path(directory) / STATE_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(manifest, dict) or manifest.get("format") != 1:
            raise ValueError("unknown checkpoint format")
        state = manifest["state"]
        if not isinstance(state, dict):
            raise ValueError("no state")
        return manifest
    except (OSError, ValueError, KeyError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: unreadable checkpoint ({type(e).__name__})") from None


def load(directory: Path, manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """The full state; the tensor file must be the one the manifest names (sha256)."""
    from safetensors.torch import load as st_load

    directory = Path(directory)
    manifest = manifest if manifest is not None else read_manifest(directory)
    path = directory / TENSOR_FILE
    try:
        blob = path.read_bytes()
        if hashlib.sha256(blob).hexdigest() != manifest.get("tensors_sha256"):
            raise ValueError("tensor file does not match the checkpoint")
        tensors = st_load(blob)
    except Exception as e:  # noqa: BLE001 - OSError, ValueError, safetensors' own error types
        raise ConfigError(f"{path}: unreadable checkpoint ({type(e).__name__})") from None
    if any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in tensors.values()):
        # training stops before it could save such a state: this file was altered or damaged
        raise ConfigError(f"{path}: the checkpoint holds non-finite values (inf or NaN); delete "
                          f"{directory} to start over")
    try:
        return _unflatten(manifest["state"], tensors)
    except KeyError:
        raise ConfigError(f"{path}: checkpoint refers to a missing tensor") from None
