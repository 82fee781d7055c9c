"""The publish gate's behavioural check: the model is run on dphub's public probe notes
(:mod:`dphub.card.probe`) and refused when its token recall there is below the floor its card
states (never below :data:`~dphub.card.probe.MIN_PROBE_FLOOR`), or when any activation is
non-finite or absurdly large.

Why: the other checks read what a model *is*; a model whose weights are finite and well formed
can still find nothing (issue 38: 1e30 in the head passed ``card validate``, ``publish`` and
``pull``, and ``deid`` then flagged no span). Every model the gate accepts is a tagger whose
output decides what leaves a hospital unredacted: DP models, federated models, public students
and public bases alike, so the probe applies to all of them.

The floor is also set by public facts (issue 53, :mod:`dphub.card.probe_floor`): a model of a
base and schema whose public warm start dphub has measured must reach, in every category of the
probe notes, a share of that warm start's recall there, and leave unflagged a share of the
non-PHI words it leaves; the card's own figures are never read for this. A poisoned or broken
model can lower the floor its card states, not this one.

A card written before the probe existed has no ``gate_probe`` block: publish refuses it (retrain
with this dphub, which records the block), pull and ``card validate`` run the probe with the
dphub-wide minimum floor, so a model published earlier stays usable if it still finds PHI.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dphub.errors import DphubError
from dphub.hub.gate_common import refuse, safe_name

#: why publish refuses a card without the block
MISSING_PROBE = (
    "the card states no gate_probe (the model's recall on dphub's public probe notes and the "
    "floor the hub holds it to; written by dphub train, pretrain, federate and distill-public "
    "since this version): retrain or re-distill the model with this dphub version"
)


def probe_problems(model_dir: Path, meta: dict[str, Any], *, require_block: bool) -> list[str]:
    """Run the probe on ``model_dir``; one message per way it fails (empty: it passes).

    ``require_block``: publish's rule (a card without ``gate_probe`` is refused); otherwise
    (pull, ``card validate``) such a card is probed against the dphub-wide minimum floor.
    """
    # heavy: loads torch and the tagger; only the probe needs them (a card alone stays light)
    from dphub.card.probe import (
        MAX_ABS_ACTIVATION,
        MIN_PROBE_FLOOR,
        run_probe,
        stated_floor,
    )
    from dphub.tagger import Tagger

    block = meta.get("gate_probe") if isinstance(meta, dict) else None
    floor = stated_floor(block)
    if floor is None:
        if require_block:
            return [MISSING_PROBE]
        floor = MIN_PROBE_FLOOR
    try:
        tagger = Tagger.load(model_dir)
        result = run_probe(tagger)
    except DphubError as e:
        return [f"the model cannot be run on dphub's probe notes ({e.message})"]
    except (RuntimeError, ValueError, OverflowError) as e:
        return [f"the model cannot be run on dphub's probe notes ({type(e).__name__})"]
    if result.nonfinite:
        return ["the model's activations on dphub's public probe notes are not finite (inf or "
                "NaN): it would tag nothing reliably"]
    if result.max_abs_activation > MAX_ABS_ACTIVATION:
        return [f"the model's activations on dphub's public probe notes reach "
                f"{result.max_abs_activation:.3g} in magnitude (an honest tagger stays below "
                f"{MAX_ABS_ACTIVATION:g}): the weights are broken or tampered with"]
    if not math.isfinite(result.recall) or result.recall < floor:
        return [f"the model finds {result.recall:.0%} of the PHI tokens in dphub's public probe "
                f"notes, below the floor of {floor:.0%} (the card's gate_probe.floor, at least "
                f"{MIN_PROBE_FLOOR:.0%}): a model that misses the PHI of public synthetic notes "
                "would leave patients' notes unredacted"]
    return public_floor_problems(tagger.model, meta, result, tagger=tagger)


def public_floor_problems(model: Any, meta: dict[str, Any], result: Any, *,
                          tagger: Any = None) -> list[str]:
    """The floors the model's public warm start sets (:mod:`dphub.card.probe_floor`), checked
    on the probe figures just measured (``result``) and, for the categories too sparse there,
    on the category probe (run here with ``tagger``, only when the warm start has figures for
    it); empty when it passes or dphub has no figures for a model of this kind."""
    from dphub.card.probe import run_category_probe
    from dphub.card.probe_floor import floor_shortfalls, public_base

    cfg = getattr(getattr(model, "encoder", None), "config", None)
    base = public_base(meta.get("base_model") if isinstance(meta, dict) else None,
                       getattr(model, "schema", None), getattr(model, "head", None),
                       getattr(model, "rule_features", None) is not None,
                       getattr(cfg, "hidden_size", None), getattr(cfg, "num_hidden_layers", None))
    if base is None:
        return []
    sparse = run_category_probe(tagger) if tagger is not None and base.sparse_recall else None
    short = floor_shortfalls(result.per_category, result.kept, base, sparse)
    if not short:
        return []
    return [f"on dphub's public probe notes the model is far below the public warm start of its "
            f"base ({safe_name(base.base_model)}, which finds PHI there with no patient seen): "
            f"{'; '.join(short)}. A model that finds less PHI than public data alone gives is "
            "broken or poisoned"]


def check_probe(model_dir: Path, meta: dict[str, Any], *, require_block: bool) -> None:
    """Raise :class:`~dphub.hub.gate_common.GateViolation` on the first probe problem."""
    problems = probe_problems(model_dir, meta, require_block=require_block)
    if problems:
        raise refuse(model_dir, problems[0])
