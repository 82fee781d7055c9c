"""Producing a card's metadata: the ``differential_privacy`` block (ε and its cross-check from the
accounting fields), lineage and composition, the counts-only ``dataset`` block, the HF keys.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata as importlib_metadata
from typing import Any

from dphub.card.model import REQUIRED_TAGS
from dphub.encoders import L3_BASE_MODEL_ID  # issue 29
from dphub.encoders_l3 import L3_SOURCE  # issue 29
from dphub.labels import get_schema
from dphub.notes import Note
from dphub.privacy import accounting
from dphub.privacy.composition import Composed, Part, compose, lineage_part, run_history
from dphub.privacy.statement import NOT_COVERED

# --------------------------------------------------------------------------- producing meta


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries whose code the guarantee depends on."""
    out: dict[str, str] = {}
    for dist in ("dphub", "opacus", "torch", "transformers", "dp-accounting", "pytorch-crf"):
        try:
            out[dist.replace("-", "_")] = importlib_metadata.version(dist)
        except importlib_metadata.PackageNotFoundError:
            continue
    return out


def dp_block(
    *,
    accountant: str,
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    delta: float,
    privacy_unit: str,
    max_grad_norm: float,
    epochs: float,
    max_examples_per_unit: int | None,
    num_units: int,
    grad_sample_mode: str,
    secure_rng: bool = False,
    mechanism_rng: str = "os-seeded",
    weights_sha256: str | None = None,
    epsilon: float | None = None,
    recall_weighting: Mapping[str, Any] | None = None,
    public_pretraining: Mapping[str, Any] | None = None,
    lineage: list[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A complete private ``differential_privacy`` block.

    ``epsilon`` defaults to Opacus's recomputation for (accountant, q, σ, T, δ); pass the ε the
    training accountant reported to record that instead (validation refuses it if it is smaller
    than the recomputation beyond the tolerance). The dp-accounting cross-check is always
    computed here. Results are cached, so validating right after costs nothing.

    ``num_units`` is recorded coarsened (:func:`coarsen_count`): the exact number of patients is
    not protected by ε. ``weights_sha256`` binds the card to the weights it describes;
    ``mechanism_rng`` says where the noise and the sampling came from
    (:mod:`dphub.privacy.randomness`).
    """
    recomputed = epsilon_opacus(accountant, sample_rate, noise_multiplier, steps, delta)
    method = "pld" if accountant == "prv" else "rdp"
    independent = epsilon_independent(method, sample_rate, noise_multiplier, steps, delta)
    block: dict[str, Any] = {
        "private": True,
        "epsilon": float(recomputed if epsilon is None else epsilon),
        "delta": float(delta),
        "privacy_unit": privacy_unit,
        "adjacency": "add/remove",
        "accountant": accountant,
        "cross_check": {"library": "dp-accounting", "method": method, "epsilon": independent},
        "noise_multiplier": float(noise_multiplier),
        "max_grad_norm": float(max_grad_norm),
        "sample_rate": float(sample_rate),
        "steps": int(steps),
        "epochs": float(epochs),
        "max_examples_per_unit": max_examples_per_unit,
        "num_units": coarsen_count(int(num_units)),
        "grad_sample_mode": grad_sample_mode,
        "secure_rng": bool(secure_rng),
        "mechanism_rng": mechanism_rng,
        "recall_weighting": dict(recall_weighting) if recall_weighting else {"enabled": False},
        "public_pretraining": (
            dict(public_pretraining) if public_pretraining else {"enabled": False}
        ),
        "library_versions": library_versions(),
        "not_covered": list(NOT_COVERED),
    }
    if lineage:
        block["lineage"] = [dict(e) for e in lineage]
    if weights_sha256 is not None:
        block["weights_sha256"] = weights_sha256
    return block


#: ``lineage`` roles: ``init_from`` (``--init-from``: a model this one was fine-tuned from; entries
#: without a role are this, from cards written before the ledger) and ``teacher`` (``ensemble
#: distill``: a member whose labels this model learnt). ``composed`` entries may have seen this
#: model's units: their ε and δ are in the claim (:func:`composed_claim`).
LINEAGE_TEACHER = "teacher"
LINEAGE_INIT_FROM = "init_from"
#: ``composition.method``: basic sequential composition, ε and δ add up (a valid upper bound for
#: any mechanisms, whatever their accountants); ``prv`` / ``rdp`` name the accountant that
#: composed the Gaussian histories exactly (:mod:`dphub.privacy.composition`).
BASIC_COMPOSITION = "basic"


def composed_lineage(dp: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The lineage entries whose ε and δ the card's claim must include (composed teachers and a
    composed ``--init-from`` parent)."""
    return [e for e in dp.get("lineage") or []
            if isinstance(e, Mapping) and e.get("role") in (LINEAGE_TEACHER, LINEAGE_INIT_FROM)
            and e.get("composed") is True]


def run_delta(dp: Mapping[str, Any]) -> float:
    """δ of this training run's own accounting: ``composition.run_delta`` when the card composes
    teachers (its ``delta`` is then the sum), else ``delta``."""
    comp = dp.get("composition")
    if isinstance(comp, Mapping) and comp.get("run_delta") is not None:
        return float(comp["run_delta"])
    return float(dp["delta"])


def composed_claim(dp: Mapping[str, Any], run_epsilon: float) -> Composed:
    """This run (ε ``run_epsilon`` at :func:`run_delta`, its accounting fields as its Gaussian
    history) composed with the composed entries of its lineage: the card's claim, and with a
    recomputed ``run_epsilon`` the floor ``card validate`` checks it against."""
    run = Part(float(run_epsilon), run_delta(dp), run_history(dp))
    return compose([run, *(lineage_part(e) for e in composed_lineage(dp))])


def apply_composition(dp: Mapping[str, Any]) -> dict[str, Any]:
    """``dp`` with its claim composed over the composed entries of its lineage (unchanged when
    there are none); ``composition`` keeps this run's own ε and δ so that the accounting can
    still be recomputed."""
    out = dict(dp)
    if not composed_lineage(dp):
        return out
    comp = dp.get("composition")
    run_eps = float(comp["run_epsilon"]) if isinstance(comp, Mapping) else float(dp["epsilon"])
    claim = composed_claim(dp, run_eps)
    out["composition"] = {"method": claim.method, "run_epsilon": run_eps,
                          "run_delta": run_delta(dp)}
    out["epsilon"], out["delta"] = claim.epsilon, claim.delta
    return out


def compose_teachers(dp: Mapping[str, Any], teachers: Sequence[Mapping[str, Any]]
                     ) -> dict[str, Any]:
    """``dp`` (a run's private block) with ``teachers`` added to its lineage and composed.

    Each teacher is ``{repo, revision, epsilon, delta, privacy_unit, composed}``; those with
    ``composed`` true may have seen this run's units, so the claim becomes this run's (ε, δ)
    composed with theirs (:func:`apply_composition`). A teacher's ε is its card's claim, which
    already composes its own teachers.
    """
    out = dict(dp)
    lineage = [dict(e) for e in dp.get("lineage") or []]
    lineage += [{**dict(t), "role": LINEAGE_TEACHER, "composed": bool(t.get("composed"))}
                for t in teachers]
    if not lineage:
        return out
    out["lineage"] = lineage
    return apply_composition(out)


def coarsen_count(n: int) -> str:
    """A count as a range on a 1-2-5 log scale (``"0"``, ``"1-1"``, ``"2-4"``, ``"50-99"``, ...).

    Counts of the private data (patients, notes, PHI per category) are not protected by ε, so a
    card publishes only the range: enough to judge a model's breadth, too coarse to tell whether
    one patient was added or removed except at a range boundary. Docs and the card's
    ``not_covered`` say so.
    """
    n = int(n)
    if n <= 0:
        return "0"
    decade = 1
    while True:
        for lo, hi in ((1, 2), (2, 5), (5, 10)):
            if lo * decade <= n < hi * decade:
                return f"{lo * decade}-{hi * decade - 1}"
        decade *= 10


#: ``differential_privacy.training_data`` of a model trained on public synthetic notes only.
PUBLIC_SYNTHETIC = "public-synthetic"
#: the dataset name of dphub's public synthetic notes (:mod:`dphub.synth`) in cards: the only
#: data a public base model may have been trained on
SYNTH_DATASET = "dphub-synth"


def is_public_model(dp: Any) -> bool:
    """A card block of a public base model: public synthetic data only, not DP, ε exactly 0.

    Such a model holds nothing private, so the publish gate and pull accept it on this
    provenance (the JSON Schema ties the three fields together; this is the one predicate).
    """
    return (isinstance(dp, Mapping) and dp.get("training_data") == PUBLIC_SYNTHETIC
            and dp.get("private") is False and dp.get("epsilon") == 0
            and not isinstance(dp.get("epsilon"), bool))


def public_block(**fields: Any) -> dict[str, Any]:
    """The block of a public base model (``dphub pretrain``): ``private: false``,
    ``training_data: public-synthetic``, ``epsilon: 0``; extra fields recorded as given."""
    block: dict[str, Any] = {"private": False, "training_data": PUBLIC_SYNTHETIC, "epsilon": 0}
    block.update(fields)
    block.setdefault("library_versions", library_versions())
    return block


def non_private_block(**fields: Any) -> dict[str, Any]:
    """The block of a ``--no-dp`` baseline: ``private: false``, ``epsilon: null``.

    Extra fields (e.g. ``steps``, ``epochs``, ``library_versions``) are recorded as given.
    """
    block: dict[str, Any] = {"private": False, "epsilon": None}
    block.update(fields)
    block.setdefault("library_versions", library_versions())
    return block


def _note_type(note: Note) -> str:
    for key in ("note_type", "kind", "type"):
        value = note.metadata.get(key) if note.metadata else None
        if isinstance(value, str) and re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", value.lower()):
            return value.lower()
    return "unspecified"


def dataset_block(
    notes: Iterable[Note],
    *,
    label_schema: str = "hipaa",
    language: str = "en",
    sequences: int = 0,
    name: str | None = None,
) -> dict[str, Any]:
    """Coarsened-counts ``dataset`` block from a note stream (one pass; nothing else is kept).

    Every count is published as a range (:func:`coarsen_count`), never exactly.

    PHI is counted per label of ``label_schema`` (``hipaa``: categories). Note types come from a
    ``note_type``/``kind``/``type`` metadata value that looks like an identifier, else
    ``unspecified``. ``sequences`` is the number of training windows (the trainer knows it).
    """
    schema = get_schema(label_schema)
    patients: set[str] = set()
    n_notes = 0
    per_label: Counter[str] = Counter()
    types: Counter[str] = Counter()
    for note in notes:
        n_notes += 1
        patients.add(note.effective_patient_id)
        types[_note_type(note)] += 1
        for span in note.spans:
            per_label[schema.map(span.label)] += 1
    block: dict[str, Any] = {
        "patients": coarsen_count(len(patients)),
        "notes": coarsen_count(n_notes),
        "sequences": coarsen_count(int(sequences)),
        "phi_phrases": coarsen_count(sum(per_label.values())),
        "phi_per_category": {lab: coarsen_count(per_label[lab]) for lab in schema.labels
                             if per_label[lab]},
        "note_types": {k: coarsen_count(v) for k, v in sorted(types.items())},
        "language": language,
        "label_schema": label_schema,
    }
    if name is not None:
        block["name"] = name
    return block


def dataset_from_stats(
    stats: Any,
    *,
    sequences: int = 0,
    note_types: Mapping[str, int] | None = None,
    label_schema: str = "hipaa",
    language: str = "en",
    name: str | None = None,
) -> dict[str, Any]:
    """Coarsened-counts ``dataset`` block from :class:`dphub.stats.CorpusStats` (HIPAA categories).

    Notes without a patient id are their own privacy unit, so they count as patients here.
    """
    block: dict[str, Any] = {
        "patients": coarsen_count(
            int(stats.patients) + int(getattr(stats, "notes_without_patient", 0))),
        "notes": coarsen_count(int(stats.notes)),
        "sequences": coarsen_count(int(sequences)),
        "phi_phrases": coarsen_count(int(stats.phi_phrases)),
        "phi_per_category": {str(k): coarsen_count(int(v))
                             for k, v in stats.phi_per_category.items()},
        "note_types": {k: coarsen_count(int(v)) for k, v in (note_types or {}).items()},
        "language": language,
        "label_schema": label_schema,
    }
    if name is not None:
        block["name"] = name
    return block


def card_meta(
    differential_privacy: Mapping[str, Any],
    dataset: Mapping[str, Any],
    *,
    base_model: str,
    language: str | list[str] = "en",
    license: str = "apache-2.0",
    model_name: str | None = None,
    extra_tags: Iterable[str] = (),
) -> dict[str, Any]:
    """Front-matter dict with the HF keys dphub cards carry around the two DP/dataset blocks."""
    meta: dict[str, Any] = {
        "tags": list(dict.fromkeys([*REQUIRED_TAGS, *extra_tags])),
        "library_name": "transformers",
        "pipeline_tag": "token-classification",
        "base_model": base_model,
        "language": [language] if isinstance(language, str) else list(language),
        "license": license,
    }
    if model_name is not None:
        meta["model_name"] = model_name
    meta["differential_privacy"] = dict(differential_privacy)
    if base_model == L3_BASE_MODEL_ID:  # issue 29: say where the converted L3 base came from
        dp = meta["differential_privacy"]
        dp["public_pretraining"] = {**(dp.get("public_pretraining") or {"enabled": False}),
                                    "base_source": dict(L3_SOURCE)}
    meta["dataset"] = dict(dataset)
    return meta


@functools.lru_cache(maxsize=256)
def epsilon_opacus(accountant: str, q: float, sigma: float, steps: int, delta: float) -> float:
    return accounting.epsilon_for(accountant, q, sigma, steps, delta)


@functools.lru_cache(maxsize=256)
def epsilon_independent(method: str, q: float, sigma: float, steps: int, delta: float) -> float:
    return accounting.epsilon_dp_accounting(method, q, sigma, steps, delta)  # absl kept quiet
