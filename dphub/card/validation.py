"""Validating card front matter: the JSON Schema (``cards/dp_metadata.schema.json``), ε recomputed
from the recorded accounting fields, lineage composition, an audit block's verdict.

Checks that need the files next to the card (weights digest, tensor layout, training config) are
the hub's: :func:`dphub.hub.validate.validate_card`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError, best_match

from dphub.card.audit import check_audit_block
from dphub.card.meta import (
    BASIC_COMPOSITION,
    composed_claim,
    composed_lineage,
    epsilon_independent,
    epsilon_opacus,
    is_public_model,
    run_delta,
)
from dphub.card.model import SAFE_KEY, ModelCard, schema
from dphub.card.parse import load_card
from dphub.errors import CardError, DphubError
from dphub.privacy import accounting
from dphub.privacy.composition import EXACT_METHODS
from dphub.privacy.federation import federation_problems  # issue 27: federated cards

# --------------------------------------------------------------------------- validation

#: At most this many problems are listed in one validation message (then "and N more").
MAX_PROBLEMS = 16
#: The pattern of coarsened counts (``dataset`` block, ``num_units``), as in the schema.
COUNT_RANGE_PATTERN = r"^(0|[1-9][0-9]*-[1-9][0-9]*)$"
#: Why fields that cards written before the hardened guarantee lack are required.
_LEGACY_REQUIRED = {
    "weights_sha256": "the card does not bind the weights (SHA-256 of model.safetensors, "
                      "recorded at training time)",
    "mechanism_rng": "the card does not say how the DP noise and sampling were drawn "
                     "(os-seeded or csprng)",
}
_LEGACY_HINT = ("this card predates the hardened guarantee format: retrain with this dphub "
                "version or re-card")
_COUNT_HINT = ("counts must be coarsened ranges such as '100-199' (retrain with this dphub "
               "version or re-card)")


@functools.lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(schema())
    return jsonschema.Draft202012Validator(schema())


@functools.lru_cache(maxsize=1)
def _schema_names() -> frozenset[str]:
    """Every property name the schema defines: the only keys an error path may show."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                names.update(props)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema())
    return frozenset(names)


def _error_path(err: ValidationError) -> str:
    # keys of free maps (phi_per_category, note_types) come from the data: never shown
    parts = [str(p) if isinstance(p, int) or p in _schema_names() else "<key>"
             for p in err.absolute_path]
    if err.validator == "required":
        missing = re.match(r"'([^']+)'", err.message)
        if missing:
            parts.append(missing.group(1))
    return ".".join(parts) or "<front matter>"


def _is_exact_count(err: ValidationError) -> bool:
    """An integer where the schema wants a coarsened count range."""
    inst = err.instance
    return (
        err.validator == "type"
        and isinstance(err.schema, Mapping)
        and err.schema.get("pattern") == COUNT_RANGE_PATTERN
        and isinstance(inst, int | float)
        and not isinstance(inst, bool)
    )


def _error_message(err: ValidationError) -> str:
    """The validator's message, without echoing string/container values (could be note text)."""
    inst = err.instance
    if err.validator == "required":
        missing = re.match(r"'([^']+)'", err.message)
        why = _LEGACY_REQUIRED.get(missing.group(1)) if missing else None
        return "required field is missing" + (f" ({why})" if why else "")
    if err.validator == "additionalProperties":
        extra = sorted(set(inst) - set(err.schema.get("properties", {}))) if isinstance(
            inst, dict) else []
        shown = ", ".join(k if SAFE_KEY.match(str(k)) else "<non-identifier key>" for k in extra)
        return f"field(s) not allowed here: {shown}"
    forbidden = err.validator_value if err.validator == "not" else None
    if isinstance(forbidden, Mapping) and set(forbidden) == {"required"}:
        # a field only another kind of card has (post_processing: a public student's)
        return f"field(s) not allowed here: {', '.join(map(str, forbidden['required']))}"
    if _is_exact_count(err):
        return "is an exact count, published outside the guarantee"
    if inst is None or isinstance(inst, (bool, int, float)):
        return err.message
    kind = type(inst).__name__
    if "propertyNames" in err.absolute_schema_path:
        return (
            "a key is not an allowed name (keys must be identifiers"
            + (f" matching {err.validator_value}" if err.validator == "pattern" else "")
            + "; value not shown)"
        )
    if err.validator == "pattern":
        return f"value does not match the pattern {err.validator_value} (value not shown)"
    if err.validator in ("enum", "const"):
        allowed = err.validator_value if err.validator == "enum" else [err.validator_value]
        return f"value is not one of {', '.join(map(str, allowed))}"
    if err.validator == "type":
        return f"expected {err.validator_value}, got {kind}"
    if err.validator == "contains":
        return f"must contain {err.validator_value.get('const', 'a required item')!r}"
    if err.validator == "maxLength":
        return f"text longer than {err.validator_value} characters (value not shown)"
    return f"{kind} value fails '{err.validator}' (value not shown)"


def _format_error(err: ValidationError) -> str:
    path, message = _error_path(err), _error_message(err)
    if _is_exact_count(err):
        return f"{path} {message}"
    return f"{path}: {message}"


def _schema_problems(meta: Any) -> list[str]:
    """Every schema violation as ``<path>: <message>``, the most relevant one first.

    An old card typically misses several things at once (weights hash, RNG mode, coarsened
    counts); listing them all tells its owner what to fix in one run instead of one per run.
    """
    validator = _validator()
    best = best_match(validator.iter_errors(meta))
    if best is None:
        return []
    problems = [_format_error(best)]
    for err in validator.iter_errors(meta):
        line = _format_error(best_match([err]) or err)
        if line not in problems:
            problems.append(line)
    exact = any(" is an exact count" in p for p in problems)
    legacy = exact or any(
        f"differential_privacy.{k}: required" in p for p in problems for k in _LEGACY_REQUIRED
    ) or any("expected_logical_batch" in p for p in problems)
    if exact:
        problems.append(_COUNT_HINT)
    elif legacy:
        problems.append(_LEGACY_HINT)
    return problems


def join_problems(problems: list[str]) -> str:
    shown = problems[:MAX_PROBLEMS]
    more = len(problems) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _pct(rtol: float) -> str:
    return f"{rtol * 100:g}%"


def accounting_problems(dp: Mapping[str, Any]) -> list[str]:
    """Recompute ε from the recorded fields; every way the card under-claims, as messages.

    * the claimed ε may lie at most ``accounting.CLAIM_RTOL`` (0.1 %) below Opacus's
      recomputation with the card's own accountant (an 8.0 -> 7.62 edit, or a 1 % scaling, fails);
    * the recorded dp-accounting ε must equal its recomputation within ``RECORD_RTOL``;
    * the claim may lie at most ``CROSS_CHECK_RTOL`` (1 %) below dp-accounting's ε (Opacus's
      PRV is never below PLD on the measured grid; RDP↔RDP within 0.83 % for ε ≲ 12, see
      ``accounting``);
    * with composed teachers in the lineage (:func:`composed_lineage`), the run's recomputed ε
      plus the teachers' recorded ε is the floor of the claim, and δ must cover the run's δ
      plus theirs (:func:`composition_problems`).
    """
    key = (
        str(dp["accountant"]),
        float(dp["sample_rate"]),
        float(dp["noise_multiplier"]),
        int(dp["steps"]),
        run_delta(dp),
    )
    cc = dp["cross_check"]
    try:
        run_primary = epsilon_opacus(*key)
        run_independent = epsilon_independent(str(cc["method"]), *key[1:])
    except DphubError as e:
        return [f"differential_privacy: accounting fields are inconsistent ({e})"]
    problems = composition_problems(dp)
    claimed = float(dp["epsilon"])
    fields = f"{key[0]}, q={key[1]:g}, sigma={key[2]:g}, steps={key[3]}, delta={key[4]:g}"
    primary, independent = run_primary, run_independent
    if composed_lineage(dp):
        # the claim covers this run composed with every composed lineage entry (one function,
        # dphub.privacy.composition): its floor is that composition of the recomputed run
        claim = composed_claim(dp, run_primary)
        fields += f", composed with the lineage ({claim.method})"
        primary = claim.epsilon
        # dp-accounting has no exact composition here: its floor is its basic sum, capped by
        # the Opacus composition (the run's own record is still checked against it below)
        independent = min(composed_claim(dp, run_independent).basic_epsilon, primary)
    if accounting.below(claimed, primary, accounting.CLAIM_RTOL):
        problems.append(
            f"differential_privacy.epsilon: claims {claimed:.6g} but the recorded accounting "
            f"({fields}) gives {primary:.6g} with Opacus; a claim more than "
            f"{_pct(accounting.CLAIM_RTOL)} below it is refused"
        )
    recorded = float(cc["epsilon"])
    if not accounting.agree(recorded, run_independent, accounting.RECORD_RTOL):
        problems.append(
            f"differential_privacy.cross_check.epsilon: records {recorded:.6g} but dp-accounting "
            f"({cc['method']}) gives {run_independent:.6g} for {fields} "
            f"(tolerance {_pct(accounting.RECORD_RTOL)})"
        )
    if accounting.below(claimed, independent, accounting.CROSS_CHECK_RTOL):
        problems.append(
            f"differential_privacy.epsilon: claims {claimed:.6g} but dp-accounting "
            f"({cc['method']}) gives {independent:.6g} for {fields} (cross-library tolerance "
            f"{_pct(accounting.CROSS_CHECK_RTOL)})"
        )
    return problems


def composition_problems(dp: Mapping[str, Any]) -> list[str]:
    """The claim against the composition its lineage records (the published rule).

    Composed teachers (lineage entries with ``role: teacher``, ``composed: true``) may have seen
    this model's units: the card's δ must cover the run's δ (``composition.run_delta``) plus
    theirs, and ``composition`` must say how (``basic``). Their ε is checked by
    :func:`accounting_problems` (the run's ε is recomputed there, never read from the card). A
    teacher of another privacy unit cannot be composed into a claim per this unit.
    """
    teachers = composed_lineage(dp)
    comp = dp.get("composition")
    if not teachers:
        if comp is not None:
            return ["differential_privacy.composition: recorded but the lineage lists no "
                    "composed teacher"]
        return []
    if not isinstance(comp, Mapping) or comp.get("method") not in (BASIC_COMPOSITION,
                                                                   *EXACT_METHODS):
        return ["differential_privacy.composition: the lineage lists composed teachers but the "
                f"card does not record their composition (method {BASIC_COMPOSITION!r})"]
    problems = []
    unit = dp.get("privacy_unit")
    other = [i for i, e in enumerate(dp.get("lineage") or [])
             if e in teachers and not unit_covers(str(e.get("privacy_unit")), str(unit))]
    if other:
        problems.append(f"differential_privacy.lineage.{other[0]}: a composed teacher protects "
                        f"a finer unit than {unit}; its epsilon does not bound a {unit}'s loss")
    need = run_delta(dp) + sum(float(e["delta"]) for e in teachers)
    if float(dp["delta"]) < need * (1 - 1e-9):
        problems.append(f"differential_privacy.delta: claims {float(dp['delta']):.6g} but this "
                        f"run's delta plus the composed teachers' is {need:.6g}")
    return problems


#: privacy units from the coarsest: a guarantee per patient bounds one per note or sequence
_UNIT_ORDER = ("patient", "note", "sequence")


def unit_covers(teacher_unit: str, unit: str) -> bool:
    """A guarantee per ``teacher_unit`` bounds the loss of one ``unit`` (same or coarser)."""
    if teacher_unit not in _UNIT_ORDER or unit not in _UNIT_ORDER:
        return False
    return _UNIT_ORDER.index(teacher_unit) <= _UNIT_ORDER.index(unit)


def meta_problems(
    meta: Mapping[str, Any], *, require_private: bool = False, check_accounting: bool = True
) -> list[str]:
    """Everything wrong with a front-matter dict (schema first, then the guarantee)."""
    problems = _schema_problems(meta)
    if problems:
        return problems
    dp = meta["differential_privacy"]
    if dp["private"] and not math.isfinite(dp["epsilon"]):
        return ["differential_privacy.epsilon: a private model needs a finite epsilon"]
    if require_private and not dp["private"] and not is_public_model(dp):
        return [
            "differential_privacy.private: the model was trained without differential privacy "
            "(private: false); only private models may be published"
        ]
    if dp["private"] and (dp.get("secure_rng") is True) != (dp.get("mechanism_rng") == "csprng"):
        return ["differential_privacy.mechanism_rng: secure_rng and mechanism_rng disagree "
                "(secure mode draws every noise sample from a CSPRNG: mechanism_rng csprng)"]
    if check_accounting and dp["private"]:
        problems = accounting_problems(dp)
        problems += federation_problems(dp)  # issue 27: each site's epsilon recomputed
        if problems:
            return problems
    if meta.get("empirical_audit") is not None:
        # what the schema cannot check: the audit's verdict agrees with this card's numbers
        try:
            check_audit_block(meta)
        except CardError as e:
            return [e.message]
    return []


def validate_meta(
    meta: Mapping[str, Any], *, require_private: bool = False, check_accounting: bool = True
) -> None:
    """Validate a front-matter dict; raise :class:`CardError` listing every problem
    (``<path>: <message>``, joined by ``; `` on one line)."""
    problems = meta_problems(meta, require_private=require_private,
                             check_accounting=check_accounting)
    if problems:
        raise CardError(join_problems(problems))


def load_valid_card(
    path: Path, *, require_private: bool = False, check_accounting: bool = True
) -> ModelCard:
    """Load the card of ``path`` (a model dir or README.md) and validate its front matter (schema,
    accounting recomputation); return it. Raises :class:`CardError` with every problem on one line.

    The files next to the card are not looked at: :func:`dphub.hub.validate.validate_card` adds
    the publish gate's directory checks.
    """
    card = load_card(path)
    problems = meta_problems(card.meta, require_private=require_private,
                             check_accounting=check_accounting)
    if problems:
        raise CardError(join_problems(problems))
    return card
