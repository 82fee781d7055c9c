"""The card's ``empirical_audit`` block in words, and the check that its verdict agrees with the
card's own numbers (:mod:`dphub.privacy.audit_bound`); the audit itself is :mod:`dphub.audit`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dphub.errors import CardError
from dphub.privacy.audit_bound import GRADIENT_SIGNAL, judge

# --------------------------------------------------------------------------------------------
# card text and checks
# --------------------------------------------------------------------------------------------


def describe(block: Mapping[str, Any], *, markdown: bool = True) -> str:
    """Plain-language summary of an ``empirical_audit`` block (what the card body and
    ``dphub card show`` print)."""
    b = "**" if markdown else ""
    can = block.get("canaries") or {}
    exp = block.get("exposure")
    bound = block.get("epsilon_lower_bound")
    proven = block.get("proven_epsilon")
    conf = block.get("confidence")
    verdict = block.get("verdict")
    ceiling = block.get("max_possible_bound")
    head = (f"Empirical audit ({block.get('date')}): {b}ε ≥ {bound}{b} at {conf:.0%} confidence "
            f"(δ = {block.get('delta'):.2g}), from {block.get('correct')} correct of "
            f"{block.get('guesses')} membership guesses on {can.get('count')} ")
    if block.get("signal") == GRADIENT_SIGNAL:
        grad = block.get("gradient") or {}
        head += (f"white-box Dirac gradient canaries of norm C = {grad.get('norm')} inserted into "
                 f"the clipped sum of each of {grad.get('steps')} DP-SGD steps before the noise "
                 "(one-run method of Steinke, Nasr & Jagielski 2023; signal: the released noisy "
                 "sum on each canary's coordinate).")
    else:
        head += (f"synthetic canary patients (one-run method of Steinke, Nasr & Jagielski 2023; "
                 f"signal: loss of each canary's secret PHI against "
                 f"{(exp or {}).get('candidates', 1) - 1} random alternatives).")
    lines = [head]
    if ceiling is not None:
        lines.append(f"The most this audit could show (every guess right) is ε ≥ {ceiling}.")
    if verdict == "passed":
        lines.append(f"Verdict: passed. The audited lower bound does not exceed the proven "
                     f"ε = {proven}.")
    elif verdict == "inconclusive":
        lines.append(
            f"Verdict: {b}INCONCLUSIVE{b}. That ceiling is below the proven ε = {proven}, so no "
            "outcome of this audit could have contradicted the claim: it checks nothing about "
            "it (use more canaries, --method gradient, or audit the same recipe at a smaller "
            "--target-epsilon)."
        )
    elif verdict == "failed":  # only in messages: a failed audit is never written to a card
        lines.append(f"{b}AUDIT FAILED{b}: the audited lower bound exceeds the proven "
                     f"ε = {proven}; the training mechanism does not deliver its claimed "
                     "guarantee.")
    else:
        lines.append("The model is not private; the audit measures how much the attack "
                     "recovers without DP.")
    lines.extend(_detection_lines(block))
    if exp:
        lines.append(
            f"Exposure of the canaries' secrets (Secret Sharer, max {exp.get('max_bits')} bits): "
            f"mean {exp.get('mean_included')} bits for included canaries, "
            f"{exp.get('mean_excluded')} bits for excluded ones."
        )
    if block.get("signal") == GRADIENT_SIGNAL:
        lines.append(
            "An audit is a lower bound, not a proof: a passed audit is a sanity check that the "
            "noise is not missing or grossly too small; only the proven ε is a guarantee. It "
            "checks the noise step and the accounting, not the clipping of real gradients. The "
            "canaries never reach the model; the proven ε holds for every real patient."
        )
    else:
        lines.append(
            "An audit is a lower bound, not a proof: a small bound can mean a weak attack; only "
            "the proven ε is a guarantee. The canaries are public synthetic patients added to "
            "training; the proven ε still holds for every real patient."
        )
    return "\n".join(lines)


def _share_flagging(det: Mapping[str, Any]) -> str:
    """How many of the simulated audits flag the limit: "at least 95 %" (a power), or "the
    median" for blocks written before the power was stated (about half of them flag it)."""
    power = det.get("power")
    if det.get("statistic") == "share-flagging" and isinstance(power, int | float):
        return f"at least {power:.0%}"
    return "the median (about half)"


def _detection_lines(block: Mapping[str, Any]) -> list[str]:
    """The detection limit and what is outside the audit, in words (blocks before issue 38 have
    neither: nothing is said)."""
    det = block.get("detection")
    if not isinstance(det, Mapping):
        return []
    k = det.get("noise_factor")
    if det.get("measured") == "simulated-released-sums" and isinstance(k, int | float):
        if k > 0:
            lines = [
                f"Detection limit: this audit would flag noise ≤ {k:.3g} × the recipe's "
                f"(σ ≤ {det.get('noise_multiplier')} instead of "
                f"{det.get('recipe_noise_multiplier')}), measured as the largest factor at which "
                f"{_share_flagging(det)} of {det.get('repetitions')} simulated audits at these "
                "settings (same canaries, steps, sampling rate, δ and confidence) show a bound "
                "above the proven ε; a mechanism with more noise than that but less than the "
                "recipe's is likely to pass. At the recipe's noise the simulated median bound is "
                f"ε ≥ {det.get('simulated_bound_at_recipe')}."]
        else:
            lines = ["Detection limit: this audit would flag no noise level, not even none at "
                     "all (its ceiling is below the proven ε)."]
    elif k == 0:
        lines = ["Detection limit: this audit would flag no noise level, not even none at all "
                 "(its ceiling is below the proven ε)."]
    else:
        lines = ["Detection limit: not measured for this audit (its signal depends on the model "
                 "and the data)."]
    outside = [str(x) for x in det.get("outside") or []]
    if outside:
        lines.append("Outside what this audit tests: " + "; ".join(outside) + ".")
    return lines


def audit_section(meta: Mapping[str, Any]) -> str:
    """The card body's ``## Empirical privacy audit`` section ('' when the card has none)."""
    block = meta.get("empirical_audit")
    if not isinstance(block, Mapping):
        return ""
    return "\n## Empirical privacy audit\n\n" + describe(block).replace("\n", "\n\n") + "\n"


def check_audit_block(meta: Mapping[str, Any]) -> None:
    """Refuse a card whose audit failed or contradicts its own numbers (for the publish gate).

    The schema validates the block's shape (and has no ``failed`` verdict); this checks what a
    schema cannot: the verdict agrees with the bound, the ceiling and the proven ε of the same
    card (a "passed" audit that could not have failed is refused: it must say inconclusive).
    """
    block = meta.get("empirical_audit")
    if block is None:
        return
    dp = meta.get("differential_privacy") or {}
    proven = dp.get("epsilon") if dp.get("private") else None
    recorded = block.get("proven_epsilon")
    if (proven is None) != (recorded is None) or (
        proven is not None and abs(float(proven) - float(recorded)) > 1e-3 * max(1.0, proven)
    ):
        raise CardError("empirical_audit.proven_epsilon: does not match differential_privacy")
    if not isinstance(block.get("max_possible_bound"), int | float):
        raise CardError("empirical_audit.max_possible_bound: missing (an audit without its "
                        "ceiling cannot say whether it could have failed)")
    expected = judge(float(block["epsilon_lower_bound"]), float(block["max_possible_bound"]),
                     None if recorded is None else float(recorded))
    if block.get("verdict") != expected:
        raise CardError(f"empirical_audit.verdict: the numbers say {expected!r}")
    if expected == "failed":
        raise CardError(
            "empirical_audit: the audit FAILED (its ε lower bound exceeds the proven ε); "
            "the mechanism does not deliver its guarantee"
        )
