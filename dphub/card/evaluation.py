"""Adding evaluation results to a card (``model-index``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dphub.card.model import EVAL_TASK_NAME, SAFE_NAME
from dphub.card.parse import load_card
from dphub.card.render import write_card
from dphub.errors import CardError

# --------------------------------------------------------------------------- evaluation


def _metrics_from_results(results: Mapping[str, Any]) -> list[tuple[str, str, float]]:
    """(type, display name, value) of the headline metrics in an evaluation result dict.

    Accepts ``EvaluationResult.to_dict()`` (nested) or ``.headline()`` (flat). Only numbers are
    copied: leak listings and anything else in ``results`` never reach the card.
    """

    def pick(*path: str) -> float | None:
        cur: Any = results
        for p in path:
            if not isinstance(cur, Mapping) or p not in cur:
                return None
            cur = cur[p]
        if isinstance(cur, bool) or not isinstance(cur, (int, float)) or not math.isfinite(cur):
            return None
        return float(cur)

    wanted = (
        ("token_precision", "Token precision", (("token", "precision"), ("precision",))),
        ("token_recall", "Token recall", (("token", "recall"), ("recall",))),
        ("token_f1", "Token F1", (("token", "f1"), ("f1",))),
        ("phrase_recall", "Phrase recall (any overlap)",
         (("phrase_recall", "any_overlap"), ("phrase_recall_any",))),
        ("phrase_recall_full", "Phrase recall (full cover)",
         (("phrase_recall", "full_cover"), ("phrase_recall_full",))),
        ("entity_f1_strict", "Entity F1 (strict)", (("entity_strict", "micro", "f1"),)),
        ("entity_f1_relaxed", "Entity F1 (relaxed)", (("entity_relaxed", "micro", "f1"),)),
        ("bleu", "BLEU (de-identified vs gold)", (("utility", "bleu"),)),
    )
    out = []
    for mtype, name, paths in wanted:
        for path in paths:
            value = pick(*path)
            if value is not None:
                out.append((mtype, name, round(value, 4)))
                break
    return out


def add_evaluation(model_dir: Path, results: dict, dataset_name: str) -> None:
    """Record evaluation results in the card's ``model-index`` and rewrite it atomically.

    ``dataset_name`` is reduced to its last path component (cards never carry paths) and other
    characters than letters, digits, ``.``, ``_``, ``-`` become ``-``. A previous result for the
    same dataset name is replaced; the DP and dataset blocks are kept as they are. Only headline
    numbers are copied from ``results`` (never leak listings).
    """
    name = Path(str(dataset_name).replace("\\", "/")).name
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:100]
    if not SAFE_NAME.match(name):
        raise CardError(
            "dataset name must contain letters or digits (allowed: letters, digits, '.', '_', '-')"
        )
    metrics = _metrics_from_results(results)
    if not metrics:
        raise CardError("evaluation results hold no token precision/recall/F1 to record")
    card = load_card(model_dir)
    meta = dict(card.meta)
    model_name = str(meta.get("model_name") or Path(model_dir).resolve().name)
    if not SAFE_NAME.match(model_name):
        model_name = "dphub-phi-tagger"
    index = meta.get("model-index") or []
    old = [
        r
        for entry in index
        for r in entry.get("results", [])
        if (r.get("dataset") or {}).get("name") != name
    ]
    new = {
        "task": {"type": "token-classification", "name": EVAL_TASK_NAME},
        "dataset": {"name": name, "type": name},
        "metrics": [{"type": t, "value": v, "name": n} for t, n, v in metrics],
    }
    meta["model-index"] = [{"name": model_name, "results": [*old, new]}]
    meta.pop("model_name", None)
    write_card(Path(model_dir), meta)
