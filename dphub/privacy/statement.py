"""The plain-language privacy statement of a model card, rendered from the card's own fields.

The statement is derived from the same ``differential_privacy`` block the schema validates and the
accounting check recomputes, so the words a reader sees can never drift from the numbers a
machine checks. It says who is protected (the privacy unit, in words), how strongly (ε, δ), and
what the guarantee does not cover; a model trained without DP gets a loud NOT PRIVATE statement,
and unit-level protection weaker than patient level says so explicitly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal
from typing import Any

#: What a dphub DP guarantee never covers (recorded in every card's ``not_covered``).
NOT_COVERED: tuple[str, ...] = (
    "pretraining data of the base model",
    "hyperparameter search",
    "public tokenizer",
    "dataset counts in this card (patients, notes, sequences, PHI per category), published "
    "as coarse ranges",
    "the sample rate q = 1/k and the steps, with k = round(N / batch size): they locate the "
    "number of units N to within half a batch",
)

#: ``not_covered`` of a model whose inputs or labels come from the rule member (rule features,
#: or a student of an ensemble with it): its design was tuned on a private development corpus.
RULES_NOT_COVERED = ("the rule member's patterns and word lists (rule features, rule-made "
                     "labels), designed while reading the notes of the PhysioNet deid "
                     "development corpus")

#: ``not_covered`` of a run whose expected batch is one unit: then k = N and q = 1/N exactly.
EXACT_UNITS_NOT_COVERED = ("the exact number of units: with a batch size of 1 the sample rate "
                           "is q = 1/N")

#: ``differential_privacy.training_data`` of a public student (:mod:`dphub.card.post_processing`):
#: trained without noise on public synthetic notes labelled by one DP model, whose guarantee
#: (post-processing) is the claim.
DP_POST_PROCESSING = "dp-post-processing"
#: the ``not_covered`` line a public student adds to its teacher's
POST_PROCESSING_NOT_COVERED = (
    "the student's own training, which adds no noise: it saw only public synthetic notes "
    "labelled by the teacher (post-processing), so the teacher's ε is the whole claim"
)

#: Above this ε the statement says the formal guarantee is weak (e^10 ≈ 22,000).
WEAK_EPSILON = 10.0

_UNIT_WORDS: dict[str, str] = {
    "patient": (
        "protects each *patient*: everything one patient contributed to the training data "
        "(all of their notes and every sequence cut from them) is protected together"
    ),
    "note": (
        "protects each *note*: the sequences cut from one clinical note are protected together"
    ),
    "sequence": (
        "protects each *sequence*: one training window of word pieces cut from a note"
    ),
}

_WEAK_UNIT_WARNING: dict[str, str] = {
    "note": (
        "WARNING: this is NOT patient-level protection. A patient with several notes in the "
        "training data is protected only by group privacy, which degrades with the number of "
        "their notes (roughly k times epsilon for k notes)."
    ),
    "sequence": (
        "WARNING: this is NOT patient-level protection. A note is cut into several sequences and "
        "a patient has several notes; a patient's protection degrades with the number of "
        "sequences they contributed (roughly k times epsilon for k sequences)."
    ),
}


#: Significant digits an ε is shown with, everywhere (cards, publish, search, pull, train, ledger).
EPSILON_DIGITS = 3


def format_epsilon(eps: Any) -> str:
    """ε as people read it: :data:`EPSILON_DIGITS` significant digits, rounded *up* (never down:
    a shown ε below the true one would overstate the guarantee), trailing zeros dropped.

    Why one function: ``publish`` and ``search`` showed 8 where the card said 7.999 for the same
    model (issue 56). 7.9993 -> "8", 8.5087 -> "8.51", 0.12301 -> "0.124". The exact value stays
    in the card's front matter; this is only how it is written for a reader.
    """
    if eps is None:
        return "none"
    if isinstance(eps, bool) or not isinstance(eps, int | float):
        return str(eps)
    if math.isnan(eps):
        return "nan"
    if math.isinf(eps):
        return "infinity"
    if eps == 0:
        return "0"
    d = Decimal(repr(float(eps)))
    exp = d.adjusted() - (EPSILON_DIGITS - 1)
    up = d.quantize(Decimal(1).scaleb(exp), rounding=ROUND_CEILING)
    text = format(up, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _fmt(x: float | None) -> str:
    if x is None:
        return "none"
    if isinstance(x, float) and math.isinf(x):
        return "infinity"
    return f"{x:.4g}"


def unit_description(unit: str) -> str:
    """One clause saying what the privacy unit means (``protects each *patient*: ...``)."""
    return _UNIT_WORDS.get(unit, f"protects each unit of type {unit!r}")


def privacy_statement(dp: Mapping[str, Any], *, markdown: bool = True) -> str:
    """The plain-language statement for a ``differential_privacy`` block.

    ``markdown=False`` strips the emphasis markers for terminals. Paragraphs are separated by a
    blank line. Only field values from the block appear; nothing from the data.
    """
    if dp.get("training_data") == "public-synthetic" and not dp.get("private"):
        paras = _public(dp)
    else:
        paras = _non_private(dp) if not dp.get("private") else _private(dp)
    text = "\n\n".join(paras)
    return text if markdown else text.replace("**", "").replace("*", "")


def _public(dp: Mapping[str, Any]) -> list[str]:
    """A public base model (``dphub pretrain``): nothing private went in, so nothing to protect."""
    return [
        "**PUBLIC DATA ONLY.** This model was trained only on public synthetic notes generated "
        "by dphub (no real patient, no private data), without differential privacy: no epsilon "
        "was spent (epsilon = 0) and there is no private training data for it to reveal.",
        "It is a public base for DP fine-tuning (`dphub train --base-model`) or a weak member on "
        "its own; evaluate it on your own labelled notes before relying on it.",
    ]


def _non_private(dp: Mapping[str, Any]) -> list[str]:
    return [
        "**NOT PRIVATE.** This model was trained WITHOUT differential privacy (a non-private "
        "baseline). It gives the patients in its training data no formal protection: it may "
        "have memorised and may reveal their PHI.",
        "Do not publish or share it outside the environment that holds the training data; "
        "dphub's publish gate refuses it.",
    ]


def _private(dp: Mapping[str, Any]) -> list[str]:
    unit = str(dp.get("privacy_unit", "patient"))
    eps = dp.get("epsilon")
    delta = dp.get("delta")
    paras: list[str] = []
    weak = _weak_words(eps, unit)
    if weak:
        paras.append(weak)  # the weakness first: a reader may stop after one sentence
    paras.append(summary(dp))
    student = dp.get("training_data") == DP_POST_PROCESSING
    first = (
        ("This model carries the guarantee of the model it was distilled from, which was "
         "trained with differential privacy (DP-SGD) at " if student else
         "This model was trained with differential privacy (DP-SGD) at ")
        + f"**epsilon = {format_epsilon(eps)}**, **delta = {_fmt(delta)}** with the privacy unit "
        f"*{unit}*. The guarantee {unit_description(unit)}."
    )
    cap = dp.get("max_examples_per_unit")
    if unit != "sequence" and cap:
        first += (f" Each {unit} contributed at most {cap} training sequences"
                  + (" to the teacher." if student else "."))
    paras.append(first)
    if unit in _WEAK_UNIT_WARNING:
        paras.append(f"**{_WEAK_UNIT_WARNING[unit]}**")
    if dp.get("training_data") == DP_POST_PROCESSING:
        paras.append(_post_processing_words(dp))
    if isinstance(eps, (int, float)) and math.isfinite(eps):
        if eps <= WEAK_EPSILON:
            meaning = (
                f"What it means: whether or not any one {unit}'s data was used, the trained "
                f"weights (and anything computed from them) are almost equally likely: the "
                f"odds of telling the two cases apart grow by a factor of at most e^epsilon "
                f"(about {math.exp(eps):,.0f}), except with probability delta. Smaller epsilon "
                "is stronger protection."
            )
        else:  # "almost equally likely" would be false comfort at this epsilon
            meaning = (
                f"What it means: the odds of telling apart whether any one {unit}'s data was "
                f"used may grow by a factor of up to e^epsilon, astronomically large at "
                f"epsilon = {format_epsilon(eps)}, except with probability delta: the formal bound does "
                f"not keep the two cases hard to tell apart. An epsilon above {WEAK_EPSILON:g} "
                "is a weak formal guarantee: treat this model's protection as limited. Smaller "
                "epsilon is stronger protection."
            )
        paras.append(meaning)
    paras.append(
        f"Accounting: {dp.get('accountant', '?')} accountant (Opacus) with Poisson sampling at "
        f"rate {_fmt(dp.get('sample_rate'))}, noise multiplier {_fmt(dp.get('noise_multiplier'))},"
        f" {dp.get('steps', '?')} steps, {dp.get('adjacency', 'add/remove')} adjacency; "
        + _cross_check_words(dp)
    )
    pre = dp.get("public_pretraining") or {}
    if pre.get("enabled"):
        paras.append(
            ("The student's own training started from a warm start on public synthetic notes."
             if student else
             "Before private training the model was warm-started on public synthetic notes.")
            + " That step uses no private data and costs no epsilon."
        )
    lineage = [e for e in dp.get("lineage") or [] if e.get("role") != "teacher"]
    teachers = [e for e in dp.get("lineage") or [] if e.get("role") == "teacher"]
    if lineage:
        parts = [
            f"{e.get('repo')}@{e.get('revision')} (epsilon = {format_epsilon(e.get('epsilon'))}, "
            f"delta = {_fmt(e.get('delta'))}, unit {e.get('privacy_unit')})"
            for e in lineage
        ]
        comp = dp.get("composition") or {}
        if any(e.get("composed") is True for e in lineage):  # issue 38: --init-from composes
            how = ("by basic composition (epsilons and deltas add up)"
                   if comp.get("method") in (None, "basic") else
                   f"by composing both DP-SGD runs' noise histories in one {comp.get('method')} "
                   "accountant (tighter than adding the epsilons, never looser)")
            paras.append(
                "This model was fine-tuned from " + "; ".join(parts) + ", which may have been "
                "trained on the same units. The epsilon and delta above cover both: this "
                f"training run's own (epsilon = {format_epsilon(comp.get('run_epsilon'))}, delta = "
                f"{_fmt(comp.get('run_delta'))}) composed with the source model's, {how}."
            )
        else:
            paras.append(
                "This model was fine-tuned from " + "; ".join(parts) + ". The epsilon above "
                "covers only the data of this training round (the trainer declared the source "
                "model's units disjoint from these, or its card predates composition); data "
                "used by the source model is covered by its own guarantee, and a unit present "
                "in both datasets adds the epsilons up."
            )
    if teachers:
        paras.append(_teacher_words(dp, teachers))
    paras.append(_randomness_words(dp))
    not_covered = dp.get("not_covered") or list(NOT_COVERED)
    paras.append("Not covered by this guarantee: " + "; ".join(not_covered) + ".")
    return paras


def _weak_words(eps: Any, unit: str) -> str | None:
    """The opening sentence of a statement whose ε is above :data:`WEAK_EPSILON`, else None.

    Why first: "protects each patient with epsilon = 95.93" reads as protection to anyone who
    does not know what 95.93 means; the weakness must be the first thing a reader sees.
    """
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps) \
            or eps <= WEAK_EPSILON:
        return None
    return (
        f"**Weak guarantee: epsilon = {eps:.3g} is {'far ' if eps >= 2 * WEAK_EPSILON else ''}"
        f"above {WEAK_EPSILON:g}**, the largest "
        f"epsilon dphub calls meaningful protection (and the default hub policy's maximum). At "
        f"this epsilon the formal bound says almost nothing about what the weights reveal about "
        f"any one {unit}; do not rely on it to protect the training data."
    )


def _teacher_words(dp: Mapping[str, Any], teachers: list[Any]) -> str:
    """The teachers of a distilled model: which ones the claim composes, and how."""
    def part(e: Mapping[str, Any]) -> str:
        return (f"{e.get('repo')}@{e.get('revision')} (epsilon = {format_epsilon(e.get('epsilon'))}, "
                f"delta = {_fmt(e.get('delta'))}, unit {e.get('privacy_unit')})")

    composed = [part(e) for e in teachers if e.get("composed") is True]
    declared = [part(e) for e in teachers if e.get("composed") is not True]
    words = "This model learnt labels made by an ensemble of models."
    comp = dp.get("composition") or {}
    if composed:
        words += (
            " Teachers that may have been trained on the same units: " + "; ".join(composed)
            + ". The epsilon and delta above are this training run's own (epsilon = "
            f"{format_epsilon(comp.get('run_epsilon'))}, delta = {_fmt(comp.get('run_delta'))}) plus "
            "theirs, by basic composition (epsilons and deltas add up): a valid upper bound "
            "whichever of these datasets a unit was in."
        )
    if declared:
        words += (
            " Teachers declared by the trainer to share no unit with this model's training "
            "data, so not composed (each protects its own units by its own guarantee): "
            + "; ".join(declared) + "."
        )
    return words


def _post_processing_words(dp: Mapping[str, Any]) -> str:
    """A public student: why the teacher's guarantee is its own (post-processing)."""
    pp = dp.get("post_processing") or {}
    t = pp.get("teacher") or {}
    rules = " and dphub's rule member (public code)" if pp.get("rules") else ""
    return (
        "**This model is a public student.** It was trained without noise, only on "
        f"{pp.get('notes', '?')} public synthetic notes generated by dphub, labelled by the DP "
        f"model {t.get('repo', '?')}@{t.get('revision', '?')}{rules}; it never saw the "
        "teacher's private data. Anything computed from a DP model's outputs on public inputs "
        "is post-processing and keeps that model's guarantee, so the epsilon, delta, privacy "
        "unit and accounting in this card are the teacher's, and the student's training spends "
        "none of its own."
    )


def _cross_check_words(dp: Mapping[str, Any]) -> str:
    cc = dp.get("cross_check") or {}
    if not cc:
        return "no independent cross-check recorded."
    return (
        f"independently recomputed with {cc.get('library', '?')} ({cc.get('method', '?')}) as "
        f"epsilon = {format_epsilon(cc.get('epsilon'))}."
    )


def summary(dp: Mapping[str, Any]) -> str:
    """The guarantee in two sentences: what is protected, how, and what is published outside it."""
    unit = str(dp.get("privacy_unit", "patient"))
    source = {
        "csprng": "the operating system's cryptographically secure generator",
        "os-seeded": "a generator seeded afresh from the operating system for this run",
    }.get(str(dp.get("mechanism_rng")), "an unrecorded random source")
    whose = "its teacher's" if dp.get("training_data") == DP_POST_PROCESSING else "its"
    return (
        f"**In short:** the weights of this model protect each *{unit}* of {whose} training data "
        f"with epsilon = {format_epsilon(dp.get('epsilon'))}, delta = {_fmt(dp.get('delta'))} "
        f"(DP-SGD: per-{unit} clipping, Gaussian noise and Poisson sampling drawn from {source}). "
        "Outside that guarantee the card publishes only coarse ranges of the dataset's counts, "
        "the sample rate, and evaluation results if the trainer added them."
    )


#: The one seed a DP model publishes (``training_config.json`` ``dphub_training.seed``, ``--seed``)
#: and why it is harmless: DP-SGD's guarantee holds for any fixed value of randomness that does not
#: depend on the data (the initial weights, dropout masks), so publishing it costs nothing.
_INIT_SEED_WORDS = (
    "The seed published in training_config.json (--seed) is another one: it seeds only "
    "randomness that does not depend on the data (the initial weights of the new layers, the "
    "public warm start, dropout), never the noise or the sampling; the guarantee holds whatever "
    "its value."
)


def _randomness_words(dp: Mapping[str, Any]) -> str:
    """Where the mechanism's noise and sampling came from (``mechanism_rng``)."""
    mode = dp.get("mechanism_rng")
    if mode == "csprng":
        return (
            "Randomness: every noise and sampling draw came from the operating system's "
            "cryptographically secure generator (secure mode); the mechanism has no seed to "
            "publish. " + _INIT_SEED_WORDS
        )
    if mode == "os-seeded":
        return (
            "Randomness: noise and sampling came from a generator seeded afresh from the "
            "operating system's cryptographically secure generator for this run; that seed was "
            "never stored or published, so training cannot be replayed. " + _INIT_SEED_WORDS
        )
    return (
        "Randomness: this card does not say where the noise came from (trained before dphub "
        "recorded it); the guarantee assumes the noise cannot be predicted or replayed."
    )
