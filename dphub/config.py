"""The project file ``dphub.toml`` and the little state dphub keeps next to it.

A data owner works in a project directory: ``dphub init`` writes a commented ``dphub.toml``;
``dphub train`` and ``dphub publish`` read it when run without arguments, and every flag overrides
its key. Sections and keys::

    [data]     path, format
    [model]    base_model, head, label_schema
    [privacy]  noise, target_epsilon, delta, privacy_unit, accountant, max_grad_norm,
               max_examples_per_unit, max_epsilon, secure_rng
    [train]    epochs, batch_size, max_physical_batch, lr, train_layers, lora_rank,
               recall_weight, seed, warm_start
    [output]   dir
    [hub]      url, repo

``.dphub/state.json`` records what the last ``dphub train`` wrote (``last_model``), so that a bare
``dphub publish`` publishes it.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError
from dphub.io import atomic_write_text

PROJECT_FILE = "dphub.toml"
STATE_DIR = ".dphub"


def find_project_file(start: Path | None = None) -> Path | None:
    """``dphub.toml`` in ``start`` (default: cwd) or its parents, or None."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        f = d / PROJECT_FILE
        if f.is_file():
            return f
    return None


def load_project_config(path: Path | None = None) -> dict[str, Any]:
    """Parse ``dphub.toml`` (found from cwd when ``path`` is None); {} when there is none.

    Relative paths inside are resolved against the file's directory by the callers that use them
    (see :func:`project_path`).
    """
    f = path or find_project_file()
    if f is None:
        return {}
    try:
        with open(f, "rb") as fh:
            cfg = tomllib.load(fh)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{f}: not valid TOML ({e})") from None
    cfg["_file"] = str(f)
    return cfg


def project_path(cfg: dict[str, Any], value: str | None) -> Path | None:
    """Resolve a path from the config relative to the config file's directory."""
    if value is None:
        return None
    p = Path(value).expanduser()
    if not p.is_absolute() and "_file" in cfg:
        p = Path(cfg["_file"]).parent / p
    return p


def get(cfg: dict[str, Any], section: str, key: str, default: Any = None) -> Any:
    return cfg.get(section, {}).get(key, default)


def _state_file(root: Path | None = None) -> Path:
    f = find_project_file(root)
    base = f.parent if f else (root or Path.cwd())
    return base / STATE_DIR / "state.json"


def record_last_model(model_dir: Path, root: Path | None = None) -> None:
    """Remember the model directory ``dphub train`` just wrote (for a bare ``dphub publish``)."""
    sf = _state_file(root)
    state = read_state(root)
    state["last_model"] = str(Path(model_dir).resolve())
    atomic_write_text(sf, json.dumps(state, indent=2))


def read_state(root: Path | None = None) -> dict[str, Any]:
    sf = _state_file(root)
    if not sf.is_file():
        return {}
    try:
        return json.loads(sf.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def last_trained_model(root: Path | None = None) -> Path | None:
    v = read_state(root).get("last_model")
    return Path(v) if v else None
