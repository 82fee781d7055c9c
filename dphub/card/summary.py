"""Flat summaries of a card for tables (search results, ensemble listings, ``dphub card show``).
"""

from __future__ import annotations

from typing import Any

from dphub.card.meta import LINEAGE_TEACHER
from dphub.card.model import ModelCard
from dphub.card.render import EVAL_PRIVACY_STATUS, card_texts, labels_of

# --------------------------------------------------------------------------- summaries


def dp_summary(card: ModelCard) -> dict[str, Any]:
    """Flat fields for tables (search results, ensemble listings, ``dphub card show``)."""
    dp, data, meta = card.dp, card.dataset, card.meta
    evals: dict[str, Any] = {}
    dataset_name = None
    for entry in meta.get("model-index") or []:
        for result in entry.get("results", []):
            dataset_name = (result.get("dataset") or {}).get("name")
            evals = {m.get("type"): m.get("value") for m in result.get("metrics", [])}
    lineage = [f"{e.get('repo')}@{e.get('revision')}" for e in dp.get("lineage") or []]
    init = [f"{e.get('repo')}@{e.get('revision')}" for e in dp.get("lineage") or []
            if isinstance(e, dict) and e.get("role") != LINEAGE_TEACHER]
    model_name = meta.get("model_name")
    if model_name is None:
        index = meta.get("model-index") or []
        model_name = index[0].get("name") if index else None
    if model_name is None and card.path is not None:
        model_name = card.path.resolve().parent.name
    return {
        "name": model_name,
        "private": bool(dp.get("private")),
        "local_only": bool(dp.get("local_only")),
        "training_labels": dp.get("training_labels"),
        "epsilon": dp.get("epsilon"),
        "delta": dp.get("delta"),
        "unit": dp.get("privacy_unit"),
        "accountant": dp.get("accountant"),
        "noise_multiplier": dp.get("noise_multiplier"),
        "sample_rate": dp.get("sample_rate"),
        "steps": dp.get("steps"),
        "base_model": meta.get("base_model"),
        "language": data.get("language"),
        "label_schema": data.get("label_schema"),
        "labels": labels_of(data.get("label_schema")) or list(data.get("phi_per_category") or []),
        "patients": data.get("patients"),
        "notes": data.get("notes"),
        "sequences": data.get("sequences"),
        "eval_dataset": dataset_name,
        "eval_precision": evals.get("token_precision"),
        "eval_recall": evals.get("token_recall"),
        "eval_f1": evals.get("token_f1"),
        "eval_phrase_recall": evals.get("phrase_recall"),
        # why a status next to the numbers: they come from the trainer's private held-out notes
        "eval_privacy": EVAL_PRIVACY_STATUS if dataset_name is not None else None,
        "card_text": sorted(card_texts(meta)),
        "init_from": init[0] if init else None,
        "lineage": lineage,
        # issue 29: a public student carries its teacher's claim (post-processing)
        "student_of": _student_of(dp),
    }


def _student_of(dp: dict[str, Any]) -> str | None:
    """``repo@revision`` of a public student's teacher (None for other models)."""
    pp = dp.get("post_processing")
    teacher = pp.get("teacher") if isinstance(pp, dict) else None
    if not isinstance(teacher, dict):
        return None
    return f"{teacher.get('repo')}@{teacher.get('revision')} (the teacher's ε: post-processing)"
