"""The card's data: :class:`ModelCard`, the file names and fixed tags, and the README text of
front matter + body (:mod:`dphub.card.front_matter`, so the Hub reads it).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dphub.card.front_matter import render_readme
from dphub.cards import asset
from dphub.errors import CardError

CARD_FILE = "README.md"
SCHEMA_FILE = "dp_metadata.schema.json"
TEMPLATE_FILE = "model_card.md"
#: ``format_version`` of the ``training_config.json`` a card's numbers are bound to (written by
#: :mod:`dphub.train.output`, checked by the publish gate; here so the gate need not load training)
TRAINING_CONFIG_FORMAT = 2

#: Tags every dphub card carries (the Hub's filters and ``dphub search`` rely on them).
REQUIRED_TAGS: tuple[str, ...] = (
    "token-classification",
    "de-identification",
    "phi",
    "differential-privacy",
    "dp-sgd",
)

#: Metric types written into ``model-index`` by :func:`add_evaluation`.
EVAL_TASK_NAME = "PHI de-identification"

#: What a local-only card says (``differential_privacy.local_only``: an owner model trained
#: without DP on its own notes, ``dphub ensemble distill`` / ``ensemble train`` without ``--dp``).
LOCAL_ONLY_STATEMENT = "local only — contains unprotected patient information"

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
SAFE_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")


@dataclass
class ModelCard:
    """A parsed card: front-matter ``meta`` (plain dict) and the Markdown ``body``."""

    meta: dict[str, Any]
    body: str
    path: Path | None = field(default=None, compare=False)

    @property
    def dp(self) -> dict[str, Any]:
        """The ``differential_privacy`` block ({} when absent)."""
        return self.meta.get("differential_privacy") or {}

    @property
    def dataset(self) -> dict[str, Any]:
        """The ``dataset`` block ({} when absent)."""
        return self.meta.get("dataset") or {}

    @property
    def private(self) -> bool:
        return bool(self.dp.get("private"))

    @property
    def epsilon(self) -> float | None:
        return self.dp.get("epsilon")

    @property
    def local_only(self) -> bool:
        """Trained without DP on the owner's own notes: must never leave the machine."""
        return bool(self.dp.get("local_only"))

    def text(self) -> str:
        """The full README text (front matter + body) as it would be written."""
        return render_readme(self.meta, self.body)


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) for card front matter."""
    return json.loads(asset(SCHEMA_FILE).read_text(encoding="utf-8"))


def plain_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """JSON-compatible copy (tuples -> lists, numpy scalars -> Python), so YAML stays safe."""

    def default(o: Any) -> Any:
        if hasattr(o, "item"):
            return o.item()
        if isinstance(o, (set, frozenset)):
            return sorted(o)
        if isinstance(o, Path):
            return str(o)  # refused by the schema's patterns; never silently dropped
        raise CardError(f"card metadata holds a value of unsupported type {type(o).__name__}")

    return json.loads(json.dumps(dict(meta), default=default))
