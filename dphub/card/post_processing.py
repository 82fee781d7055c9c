"""The card of a *public student*: a model distilled from one DP model on public inputs only.

Why the teacher's ε is the student's: a DP guarantee survives post-processing. Whatever is
computed from the DP model's weights without touching the private data again — its labels on
public synthetic notes (:mod:`dphub.synth`), dphub's rule member (public code) beside it, and a
student trained on those labels without noise — is a function of those weights, so it carries
exactly the teacher's (ε, δ, privacy unit). No ε is spent by the student's own training, and
none is added: the card's claim *is* the teacher's.

So the student's ``differential_privacy`` block is the teacher's block with what describes the
student itself replaced: its ``weights_sha256`` and ``public_pretraining`` (the student's own
public warm start on its own base), plus ``training_data: dp-post-processing`` and a
``post_processing`` block naming the teacher (by its weights' digest) and the public inputs.
The accounting fields stay the teacher's, so :func:`dphub.card.validate_meta` recomputes the
teacher's ε from them and refuses a smaller claim, as for any DP card; the publish gate checks
the student's training record against ``post_processing`` (the synthetic notes regenerate to the
recorded digest, the teacher digest and step count agree: :mod:`dphub.hub.gate_postprocessing`).
The ``dataset`` block stays the teacher's: it describes the private data the guarantee covers.

What this does not cover, and the card says so: thresholds or member settings chosen on private
notes (the public student labels with the teacher's own decoded tags and the rules' defaults
only), and the trust that the weights were trained on that record (as for every card).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dphub.card.meta import SYNTH_DATASET
from dphub.privacy.statement import DP_POST_PROCESSING, POST_PROCESSING_NOT_COVERED

#: ``post_processing.method``: the only one dphub produces
DISTILLATION = "distillation"
#: fields of the teacher's block that describe the teacher's own files or training record, not
#: its mechanism: replaced by the student's (or dropped) in the student's block
_STUDENT_OWN = ("weights_sha256", "public_pretraining", "training_labels", "training_data",
                "post_processing", "local_only")


def is_post_processing(dp: Any) -> bool:
    """A card block of a public student (``training_data: dp-post-processing``)."""
    return isinstance(dp, Mapping) and dp.get("training_data") == DP_POST_PROCESSING


def post_processing_block(
    teacher_dp: Mapping[str, Any],
    *,
    weights_sha256: str,
    public_pretraining: Mapping[str, Any] | None,
    teacher: Mapping[str, Any],
    notes: int,
    steps: int,
    soft_labels: bool,
    rules: bool,
) -> dict[str, Any]:
    """The student's ``differential_privacy`` block: the teacher's mechanism and claim, the
    student's weights digest and public warm start, and the ``post_processing`` record.

    ``teacher`` is ``{repo, revision, weights_sha256}`` (a public name; a local directory's
    name never reaches the card). ``notes`` public synthetic notes were labelled; the student
    took ``steps`` optimiser steps on them (no noise).
    """
    if teacher_dp.get("private") is not True:
        raise ValueError("a public student's teacher must be a DP model")
    dp = {k: v for k, v in teacher_dp.items() if k not in _STUDENT_OWN}
    dp["training_data"] = DP_POST_PROCESSING
    dp["weights_sha256"] = weights_sha256
    dp["public_pretraining"] = dict(public_pretraining) if public_pretraining else \
        {"enabled": False}
    dp["post_processing"] = {
        "method": DISTILLATION,
        "inputs": SYNTH_DATASET,
        "notes": int(notes),
        "labels": "soft" if soft_labels else "hard",
        "rules": bool(rules),
        "steps": int(steps),
        "teacher": {"repo": str(teacher["repo"]), "revision": str(teacher["revision"]),
                    "weights_sha256": str(teacher["weights_sha256"])},
    }
    not_covered = [c for c in dp.get("not_covered") or [] if c != POST_PROCESSING_NOT_COVERED]
    dp["not_covered"] = [*not_covered, POST_PROCESSING_NOT_COVERED]
    return dp
