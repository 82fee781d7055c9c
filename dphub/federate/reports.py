"""What the server accepts from a site: its report (schema + consistency) and its update (bounds).

A site is not trusted. Everything it sends is checked here *before* it touches the server's
state (the accounting rows it checkpoints, the global weights), and a site that fails a check is
dropped from that round with a reason that names fields and numbers only (never a value a site
chose as text, which could carry anything):

* the report is validated against :data:`REPORT_SCHEMA` (JSON Schema; its ``dataset`` string is
  parsed and validated against the card schema's own ``dataset`` definition, so nothing the
  server keeps can later break a resume or a card);
* every coarse count is one of the 1-2-5 ranges :func:`dphub.card.coarsen_count` produces, and
  the counts agree with each other and with the accounting: ``units`` is the patient (or note)
  range, ``q = 1 / round(N / batch_size)`` admits the reported ``N``, ``δ <= 1/N``, the expected
  batch is ``q·N``. A site cannot claim a million patients with ``q = 1``;
* ε recomputes from (accountant, q, σ, T, δ), never exceeds the federation's target ε (a site
  stops there), steps never exceed ``rounds × local_steps``, a site holds at most
  :data:`MAX_SITE_UNITS` units, and a known site's row only moves forward (same plan, more
  steps): a report cannot replace another site's accounting with a cheaper one;
* the update (new weights minus the global weights) has exactly the federation's parameters and
  shapes, is finite, and moves no coordinate further than Adam can in the steps the site says it
  took (:data:`ADAM_STEP_BOUND` × lr per step; Kingma & Ba 2015, §2.1: Adam's step is bounded by
  ≈ (1-β1)/√(1-β2) · lr ≈ 3.2 · lr with the default betas), nor any tensor further in root mean
  square than :data:`ADAM_RMS_BOUND` × lr per step (issue 53: a site pushing every coordinate at
  a share of the first bound fails this one). What passes is then clipped and checked on the
  public probe notes (:mod:`dphub.federate.robust`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import jsonschema
import torch
from jsonschema.exceptions import best_match

from dphub import card
from dphub.errors import DphubError
from dphub.privacy import accounting
from dphub.privacy.federation import site_epsilon
from dphub.train.options import default_delta

#: Adam moves a coordinate by at most ≈ 3.2 × lr per step (default betas); 10 leaves margin for
#: bias correction's first steps, and still bounds what one site can do to the average.
ADAM_STEP_BOUND = 10.0
#: ... and moves a whole tensor, in root mean square over its coordinates, by about lr per step
#: at most (its bias-corrected step m/sqrt(v) is exactly ±1 on the first step and about 1 in
#: magnitude or less after, for gradients of steady size; noisy DP gradients give less). 2 leaves
#: margin and is far below what a site pushing every coordinate towards a target sends.
ADAM_RMS_BOUND = 2.0
#: the most privacy units (patients) one site may report: a larger site is outside what this
#: server accepts (a lie of "1000000-1999999" patients, consistent with its own q, is refused)
MAX_SITE_UNITS = 999_999

#: The fields a report carries (``dphub.federate.site.Site.report``).
REPORT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["site_id", "trained", "budget_spent", "accountant", "sample_rate",
                 "noise_multiplier", "steps", "delta", "epsilon", "privacy_unit", "units",
                 "exact_units", "expected_batch", "dataset"],
    "properties": {
        "site_id": {"type": "string", "pattern": "^[0-9a-f]{16}$"},
        "trained": {"type": "integer", "minimum": 0},
        "budget_spent": {"type": "boolean"},
        "accountant": {"enum": list(accounting.ACCOUNTANTS)},
        "sample_rate": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "noise_multiplier": {"type": "number", "exclusiveMinimum": 0, "maximum": 1e6},
        "steps": {"type": "integer", "minimum": 0},
        "delta": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "epsilon": {"type": "number", "minimum": 0},
        "privacy_unit": {"type": "string", "pattern": "^[a-z]{1,16}$"},
        "units": {"type": "string", "pattern": "^[1-9][0-9]{0,11}-[1-9][0-9]{0,11}$"},
        "exact_units": {"type": "boolean"},
        "expected_batch": {"type": "string", "pattern": "^[1-9][0-9]{0,11}-[1-9][0-9]{0,11}$"},
        "dataset": {"type": "string", "maxLength": 20000},
        # the site's own privacy policy (JSON; fedsite): recorded on its card row when valid
        "policy": {"type": "string", "maxLength": 1000},
    },
}


class Rejected(DphubError):
    """A site's reply the server drops from the round (the message names fields, no values)."""


def _validator(schema: Mapping[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema)


_REPORT = _validator(REPORT_SCHEMA)
_DATASET = _validator({"$ref": "#/$defs/dataset", "$defs": card.schema()["$defs"]})


def _schema_error(validator: jsonschema.Draft202012Validator, instance: Any, what: str) -> None:
    err = best_match(validator.iter_errors(instance))
    if err is not None:
        where = ".".join(str(p) for p in err.absolute_path) or what
        raise Rejected(f"{what}: {where} fails the schema ({err.validator})")


def _range(r: str) -> tuple[int, int]:
    """A 1-2-5 range's bounds; anything :func:`card.coarsen_count` would not write is refused."""
    if r == "0":
        return 0, 0
    lo, _, hi = r.partition("-")
    if not (lo.isdigit() and hi.isdigit()) or card.coarsen_count(int(lo)) != r:
        raise Rejected("a count is not a 1-2-5 range")
    return int(lo), int(hi)


def delta_cap(units_low: int, recipe_delta: float | None) -> float:
    """The largest δ a site of the federation trains at: the recipe's δ when it sets one (a
    site trains at no more), else ``min(1e-5, 1/(10 N))`` (:func:`default_delta`) at the
    fewest units the site's range admits (the loosest δ of any N in it)."""
    if recipe_delta is not None:
        return float(recipe_delta)
    return default_delta(max(1, units_low))


def check_report(rep: Mapping[str, Any], *, privacy_unit: str, accountant: str,
                 label_schema: str, batch_size: int, max_steps: int,
                 local_steps: int, target_epsilon: float | None = None,
                 recipe_delta: float | None = None) -> dict[str, Any]:
    """The report as a plain dict once every check passes (raises :class:`Rejected`).

    ``target_epsilon``: the federation's; a site never spends past it (it stops), so a report
    above it is a lie that would reach the card. ``recipe_delta``: the federation's δ (None:
    the default); a report with a larger δ is refused the same way (:func:`delta_cap`): a
    larger δ buys a smaller ε for the same noise, and the card would carry both."""
    rep = dict(rep)
    _schema_error(_REPORT, rep, "report")
    for k in ("sample_rate", "noise_multiplier", "delta", "epsilon"):
        if not math.isfinite(float(rep[k])):
            raise Rejected(f"report: {k} is not finite")
    if rep["privacy_unit"] != privacy_unit or rep["accountant"] != accountant:
        raise Rejected("report: privacy_unit or accountant differs from the federation's")
    if rep["trained"] > local_steps or rep["steps"] > max_steps or rep["trained"] > rep["steps"]:
        raise Rejected("report: more steps than the federation ran")
    try:
        dataset = json.loads(rep["dataset"])
    except ValueError:
        raise Rejected("report: dataset is not JSON") from None
    _schema_error(_DATASET, dataset, "report.dataset")
    if dataset.get("label_schema") != label_schema or "name" in dataset:
        raise Rejected("report.dataset: label_schema differs from the federation's")
    counts = [dataset[k] for k in ("patients", "notes", "sequences", "phi_phrases")
              if k in dataset]
    counts += [*dataset["phi_per_category"].values(), *dataset["note_types"].values()]
    for r in counts:
        _range(r)
    lo, hi = _range(rep["units"])
    if hi > MAX_SITE_UNITS:
        raise Rejected(f"report: units above the server's cap ({MAX_SITE_UNITS} per site)")
    unit_count = {"patient": "patients", "note": "notes", "sequence": "sequences"}[privacy_unit]
    if dataset[unit_count] != rep["units"]:
        raise Rejected(f"report: units disagree with dataset.{unit_count}")
    if _range(dataset["notes"])[1] < _range(dataset["patients"])[0]:
        raise Rejected("report.dataset: fewer notes than patients")
    # q = 1 / max(1, round(N / batch_size)) (the site's plan): the N it admits
    q = float(rep["sample_rate"])
    k = round(1 / q)
    if not math.isclose(q, 1 / k, rel_tol=1e-9):
        raise Rejected("report: sample_rate is not 1 / k")
    n_lo = 1 if k == 1 else math.ceil((k - 0.5) * batch_size)
    n_hi = math.floor((k + 0.5) * batch_size)
    if n_hi < lo or n_lo > hi:
        raise Rejected("report: units disagree with sample_rate and the batch size")
    if float(rep["delta"]) > (1 / lo) * (1 + 1e-9):
        raise Rejected("report: delta exceeds 1/N")
    if float(rep["delta"]) > delta_cap(lo, recipe_delta) * (1 + 1e-9):
        raise Rejected("report: delta above the federation's cap (its recipe's delta, else "
                       "min(1e-5, 1/(10 N)))")
    b_lo, b_hi = _range(rep["expected_batch"])
    if max(1, round(q * max(lo, n_lo))) > b_hi or max(1, round(q * min(hi, n_hi))) < b_lo:
        raise Rejected("report: expected_batch disagrees with sample_rate and units")
    try:
        eps = site_epsilon(rep)
    except DphubError:
        raise Rejected("report: its accounting does not recompute") from None
    if not math.isfinite(eps) or accounting.below(float(rep["epsilon"]), eps,
                                                  accounting.CLAIM_RTOL):
        raise Rejected("report: epsilon below its own accounting")
    if target_epsilon is not None and accounting.below(
            target_epsilon, float(rep["epsilon"]), accounting.CLAIM_RTOL):
        raise Rejected("report: epsilon above the federation's target")
    return rep


#: What a site's accounting plan is: a known site never changes it (its data and plan are fixed).
PLAN_FIELDS = ("accountant", "sample_rate", "noise_multiplier", "delta", "privacy_unit", "units",
               "exact_units", "dataset")


def check_continuity(rep: Mapping[str, Any], prev: Mapping[str, Any] | None) -> None:
    """A known site's new report continues its row: same plan, never fewer steps."""
    if prev is None:
        return
    if any(rep[k] != prev[k] for k in PLAN_FIELDS):
        raise Rejected("report: changes a known site's accounting plan")
    if int(rep["steps"]) < int(prev["steps"]) + int(rep["trained"]):
        raise Rejected("report: fewer steps than the site's accountant already recorded")


def update_bound(name: str, *, lr: float, rule_lr_scale: float, steps: int) -> float:
    """How far ``steps`` Adam steps can move one coordinate of parameter ``name``."""
    rate = lr * rule_lr_scale if name.startswith("rule_proj.") else lr
    return ADAM_STEP_BOUND * rate * max(1, steps)


def rms_update_bound(name: str, *, lr: float, rule_lr_scale: float, steps: int) -> float:
    """How far ``steps`` Adam steps can move parameter ``name`` in root mean square."""
    rate = lr * rule_lr_scale if name.startswith("rule_proj.") else lr
    return ADAM_RMS_BOUND * rate * max(1, steps)


def check_update(weights: Mapping[str, Any] | None, global_weights: Mapping[str, torch.Tensor],
                 *, lr: float, rule_lr_scale: float, steps: int) -> None:
    """The site's new weights: the federation's parameters, finite, within Adam's reach."""
    if weights is None:
        if steps > 0:
            raise Rejected("update: trained but sent no weights")
        return
    if steps == 0:
        raise Rejected("update: weights without a trained step")
    if set(weights) != set(global_weights):
        raise Rejected("update: other parameters than the federation's")
    for name, old in global_weights.items():
        w = weights[name]
        if not isinstance(w, torch.Tensor) or tuple(w.shape) != tuple(old.shape):
            raise Rejected(f"update: {name} is mis-shaped")
        if not bool(torch.isfinite(w).all()):
            raise Rejected(f"update: {name} is not finite")
        change = float((w.to(torch.float64) - old.to(torch.float64)).abs().max()) \
            if w.numel() else 0.0
        bound = update_bound(name, lr=lr, rule_lr_scale=rule_lr_scale, steps=steps)
        if not change <= bound:
            raise Rejected(f"update: {name} moved {change:.3g}, out of bounds "
                           f"(at most {bound:.3g} in {steps} step(s))")
        rms = float((w.to(torch.float64) - old.to(torch.float64)).pow(2).mean().sqrt()) \
            if w.numel() else 0.0
        rms_bound = rms_update_bound(name, lr=lr, rule_lr_scale=rule_lr_scale, steps=steps)
        if not rms <= rms_bound:
            raise Rejected(f"update: {name} moved {rms:.3g} in root mean square, out of bounds "
                           f"(at most {rms_bound:.3g} in {steps} step(s))")
