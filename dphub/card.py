"""The model card: a Hugging Face README.md whose front matter carries the DP guarantee.

The card is the one place a model's privacy claim lives, so it is built from data and checked by
machines, never hand-written:

* ``build_card(meta)`` renders the README from a metadata dict (HF keys + ``differential_privacy``
  + ``dataset`` blocks, see docs/architecture.md "Model card front matter"); the body (privacy
  statement, tables, evaluation) is derived from the same dict, so the prose cannot disagree with
  the numbers. Front matter goes through ``huggingface_hub.ModelCardData`` so the Hub reads it.
* ``validate_card`` checks the front matter against ``cards/dp_metadata.schema.json`` (JSON Schema
  2020-12) and recomputes ε from the recorded accounting fields with Opacus and with dp-accounting;
  a card that claims a smaller ε than its own fields imply is refused.
* The ``dataset`` block holds counts only; the schema forbids free-text fields there and restricts
  strings to identifier patterns, so neither note text nor file paths can slip in. Error messages
  name the schema path and never echo string values (which could be note text).

Helpers for producers: :func:`dp_block` (computes ε and the cross-check from the accounting
fields), :func:`non_private_block`, :func:`dataset_block` (counts from a note stream) or
:func:`dataset_from_stats` (from ``dphub.stats.CorpusStats``) and :func:`card_meta` (adds the HF
keys)::

    meta = card_meta(dp_block(accountant="prv", sample_rate=q, noise_multiplier=sigma, steps=T,
                              delta=1e-5, privacy_unit="patient", max_grad_norm=1.0, epochs=3.0,
                              max_examples_per_unit=64, num_units=105,
                              grad_sample_mode="ghost", epsilon=eps_from_training),
                     dataset_block(train_notes, sequences=n_windows),
                     base_model=DEFAULT_BASE_MODEL_ID)
    write_card(out_dir, meta)
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path
from string import Template
from typing import Any

import jsonschema
import yaml
from jsonschema.exceptions import ValidationError, best_match

from dphub.cards import asset
from dphub.errors import CardError, DphubError
from dphub.io import atomic_write_text
from dphub.notes import Note
from dphub.privacy import accounting
from dphub.privacy.federation import federation_problems  # issue 27: federated cards
from dphub.privacy.statement import NOT_COVERED, privacy_statement

CARD_FILE = "README.md"
SCHEMA_FILE = "dp_metadata.schema.json"
TEMPLATE_FILE = "model_card.md"

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

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_SAFE_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")


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
        return _render(self.meta, self.body)


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
    recomputed = _epsilon_opacus(accountant, sample_rate, noise_multiplier, steps, delta)
    method = "pld" if accountant == "prv" else "rdp"
    independent = _epsilon_independent(method, sample_rate, noise_multiplier, steps, delta)
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
#: without a role are this) and ``teacher`` (``ensemble distill``: a member whose labels this model
#: learnt). ``composed`` teachers may have seen this model's units: their ε and δ are in the claim.
LINEAGE_TEACHER = "teacher"
#: ``composition.method``: basic sequential composition, ε and δ add up (a valid upper bound for
#: any mechanisms, whatever their accountants).
BASIC_COMPOSITION = "basic"


def composed_lineage(dp: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The lineage entries whose ε and δ the card's claim must include (composed teachers)."""
    return [e for e in dp.get("lineage") or []
            if isinstance(e, Mapping) and e.get("role") == LINEAGE_TEACHER
            and e.get("composed") is True]


def run_delta(dp: Mapping[str, Any]) -> float:
    """δ of this training run's own accounting: ``composition.run_delta`` when the card composes
    teachers (its ``delta`` is then the sum), else ``delta``."""
    comp = dp.get("composition")
    if isinstance(comp, Mapping) and comp.get("run_delta") is not None:
        return float(comp["run_delta"])
    return float(dp["delta"])


def compose_teachers(dp: Mapping[str, Any], teachers: Sequence[Mapping[str, Any]]
                     ) -> dict[str, Any]:
    """``dp`` (a run's private block) with ``teachers`` added to its lineage and composed.

    Each teacher is ``{repo, revision, epsilon, delta, privacy_unit, composed}``; those with
    ``composed`` true may have seen this run's units, so the claim becomes this run's (ε, δ) plus
    theirs (basic composition, :data:`BASIC_COMPOSITION`); ``composition`` keeps this run's own
    ε and δ so the accounting can still be recomputed. A teacher's ε is its card's claim, which
    already composes its own teachers.
    """
    out = dict(dp)
    lineage = [dict(e) for e in dp.get("lineage") or []]
    lineage += [{**dict(t), "role": LINEAGE_TEACHER, "composed": bool(t.get("composed"))}
                for t in teachers]
    if not lineage:
        return out
    out["lineage"] = lineage
    parts = [t for t in teachers if t.get("composed")]
    if parts:
        run_eps, run_d = float(dp["epsilon"]), run_delta(dp)
        out["composition"] = {"method": BASIC_COMPOSITION, "run_epsilon": run_eps,
                              "run_delta": run_d}
        out["epsilon"] = run_eps + sum(float(t["epsilon"]) for t in parts)
        out["delta"] = run_d + sum(float(t["delta"]) for t in parts)
    return out


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
    from dphub.labels import get_schema

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
    meta["dataset"] = dict(dataset)
    return meta


# --------------------------------------------------------------------------- rendering


def _plain(meta: Mapping[str, Any]) -> dict[str, Any]:
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


def _with_defaults(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Fill the keys every card has (HF keys, not_covered, library versions) when missing."""
    out = _plain(meta)
    out["tags"] = list(dict.fromkeys([*REQUIRED_TAGS, *(out.get("tags") or [])]))
    out.setdefault("library_name", "transformers")
    out.setdefault("pipeline_tag", "token-classification")
    out.setdefault("license", "apache-2.0")
    if "language" not in out:
        lang = (out.get("dataset") or {}).get("language")
        out["language"] = [lang] if isinstance(lang, str) else ["en"]
    elif isinstance(out["language"], str):
        out["language"] = [out["language"]]
    dp = out.get("differential_privacy")
    if isinstance(dp, dict):
        if dp.get("private"):
            dp.setdefault("not_covered", list(NOT_COVERED))
        dp.setdefault("library_versions", library_versions())
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "infinity" if math.isinf(value) else f"{value:.6g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) or "—"
    if isinstance(value, list):
        return ", ".join(_fmt(v) for v in value) or "—"
    return str(value).replace("|", "/")


def _table(rows: Iterable[tuple[str, Any]]) -> str:
    return "\n".join(f"| {k} | {_fmt(v)} |" for k, v in rows)


_DP_ROWS: tuple[tuple[str, str], ...] = (
    ("private", "private"),
    ("training_data", "training data"),
    ("local_only", "local only (never published)"),
    ("training_labels", "training labels"),
    ("epsilon", "ε"),
    ("delta", "δ"),
    ("privacy_unit", "privacy unit"),
    ("adjacency", "adjacency"),
    ("accountant", "accountant (Opacus)"),
    ("cross_check", "cross-check"),
    ("noise_multiplier", "noise multiplier σ"),
    ("max_grad_norm", "max grad norm C"),
    ("sample_rate", "sample rate q (Poisson)"),
    ("steps", "steps"),
    ("epochs", "epochs"),
    ("max_examples_per_unit", "max sequences per unit"),
    ("num_units", "number of units (range)"),
    ("grad_sample_mode", "grad-sample mode"),
    ("secure_rng", "secure RNG"),
    ("mechanism_rng", "noise and sampling randomness"),
    ("composition", "composition of this run with its teachers (ε and δ add up)"),
    ("weights_sha256", "weights SHA-256"),
    ("recall_weighting", "recall weighting"),
    ("public_pretraining", "public warm start (costs no ε)"),
    ("library_versions", "library versions"),
    ("not_covered", "not covered"),
)

_DATA_ROWS: tuple[tuple[str, str], ...] = (
    ("patients", "patients"),
    ("notes", "notes"),
    ("sequences", "training sequences"),
    ("phi_phrases", "PHI phrases"),
    ("phi_per_category", "PHI per category"),
    ("note_types", "note types"),
    ("language", "language"),
    ("label_schema", "label schema"),
)


def _labels_of(schema_name: Any) -> list[str]:
    from dphub.labels import SCHEMAS

    schema = SCHEMAS.get(schema_name) if isinstance(schema_name, str) else None
    return list(schema.labels) if schema else []


# ----------------------------------------------------------------- card text (owner's judgement)

#: Front-matter key of the trainer's free text (from ``[card]`` in dphub.toml or ``card edit``).
CARD_TEXT_KEY = "card_text"
#: The free-text fields a trainer may give; anything else is refused, so nothing unexpected can
#: ride along into a published card.
CARD_TEXT_FIELDS: tuple[str, ...] = ("intended_use", "out_of_scope", "limitations", "provenance")
#: Longest accepted text per field (characters): room for a paragraph or two, not for a corpus.
CARD_TEXT_MAX_CHARS = 4000
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def check_card_text(texts: Mapping[str, Any], *, where: str = "[card]") -> dict[str, str]:
    """The trainer's free texts, checked: known keys, plain strings, ≤ 4000 chars, no controls.

    Values are stripped; empty strings are kept as ``""`` (meaning "remove this text" for
    :func:`with_card_text`). Errors name the key, never the text (it could hold anything).
    ``where="--"`` names keys as command-line flags (``--intended-use``) instead of
    ``[card] intended_use``.
    """

    def name(key: str) -> str:
        return f"--{key.replace('_', '-')}" if where == "--" else f"{where} {key}"

    if not isinstance(texts, Mapping):
        raise CardError(f"{where}: expected a table of texts, got {type(texts).__name__}")
    out: dict[str, str] = {}
    for key, value in texts.items():
        if key not in CARD_TEXT_FIELDS:
            shown = key if isinstance(key, str) and _SAFE_KEY.match(key) else "<non-identifier>"
            raise CardError(
                f"{where}: unknown key {shown} (allowed: {', '.join(CARD_TEXT_FIELDS)})"
            )
        if value is None:
            continue
        if not isinstance(value, str):
            raise CardError(f"{name(key)}: expected a string, got {type(value).__name__}")
        value = value.replace("\r\n", "\n").strip()
        if len(value) > CARD_TEXT_MAX_CHARS:
            raise CardError(
                f"{name(key)}: {len(value)} characters, at most {CARD_TEXT_MAX_CHARS} allowed"
            )
        if _CONTROL.search(value):
            raise CardError(f"{name(key)}: contains control characters (text not shown)")
        out[key] = value
    return out


def with_card_text(meta: Mapping[str, Any], texts: Mapping[str, Any] | None, *,
                   where: str = "[card]") -> dict[str, Any]:
    """A copy of ``meta`` whose ``card_text`` holds the trainer's texts merged with ``texts``.

    Why a separate step: the DP and dataset blocks are computed, these are the trainer's own
    words (``[card]`` of dphub.toml at training time, ``dphub card edit`` later; ``where``
    names the source in errors, see :func:`check_card_text`). Given keys
    replace earlier ones, an empty string removes one, ``None`` leaves it as it is. The texts are
    stored in the front matter (so the body, always regenerated, can render them) and checked by
    the gate like every other card string.
    """
    out = dict(meta)
    current = out.get(CARD_TEXT_KEY)
    merged = dict(current) if isinstance(current, Mapping) else {}
    for key, value in check_card_text(texts or {}, where=where).items():
        if value:
            merged[key] = value
        else:
            merged.pop(key, None)
    merged = {k: merged[k] for k in CARD_TEXT_FIELDS if merged.get(k)}
    if merged:
        out[CARD_TEXT_KEY] = merged
    else:
        out.pop(CARD_TEXT_KEY, None)
    return out


def _card_texts(meta: Mapping[str, Any]) -> dict[str, str]:
    """The stored free texts (non-strings from a hand-edited card are ignored, not rendered)."""
    block = meta.get(CARD_TEXT_KEY)
    if not isinstance(block, Mapping):
        return {}
    return {k: block[k].strip() for k in CARD_TEXT_FIELDS
            if isinstance(block.get(k), str) and block[k].strip()}


#: Language codes the default texts spell out (anything else is shown as its code).
_LANGUAGES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "nl": "Dutch",
              "it": "Italian", "pt": "Portuguese", "sv": "Swedish", "da": "Danish"}


def _language_name(meta: Mapping[str, Any]) -> str:
    data = meta.get("dataset") or {}
    lang = data.get("language") if isinstance(data, Mapping) else None
    if not isinstance(lang, str):
        langs = meta.get("language")
        lang = langs[0] if isinstance(langs, list) and langs else langs
    if not isinstance(lang, str) or not lang:
        return "the training notes' language"
    return _LANGUAGES.get(lang.lower(), f"`{_fmt(lang)}`")


def _with_trainer(text: str | None, defaults: list[str]) -> str:
    """The trainer's paragraph (if any), then dphub's defaults, which a trainer cannot remove."""
    parts = []
    if text:
        parts.append(f"From the trainer:\n\n{text}\n\nAlways (written by dphub):")
    parts.append("\n".join(f"- {d}" for d in defaults))
    return "\n\n".join(parts)


def _intended_use_section(meta: Mapping[str, Any], texts: Mapping[str, str]) -> str:
    lang = _language_name(meta)
    defaults = [
        f"De-identification of {lang} clinical notes as **one member of a local ensemble** "
        "(`dphub ensemble deid`), together with other models and the zero-ε rule member, under "
        "\"any member flags it\" aggregation.",
        "Run where the notes are: the notes you tag never leave your machine.",
        "With human review of the output before de-identified notes are shared.",
    ]
    return _with_trainer(texts.get("intended_use"), defaults)


def _out_of_scope_section(meta: Mapping[str, Any], texts: Mapping[str, str]) -> str:
    lang = _language_name(meta)
    data = meta.get("dataset") or {}
    types = data.get("note_types") if isinstance(data, Mapping) else None
    kinds = f" (trained on: {_fmt(sorted(types))})" if isinstance(types, Mapping) and types else ""
    defaults = [
        "The **sole safeguard** before notes are released publicly: no model catches all PHI.",
        f"Notes in other languages than {lang}, and document kinds unlike the training "
        f"notes{kinds}, without evaluating the model on them first.",
        "Identifying people, or any use aimed at the patients of the training data.",
        "Clinical decisions: the model marks text spans, it does not interpret them.",
    ]
    dp = meta.get("differential_privacy") or {}
    if dp.get("local_only"):
        defaults.insert(0, "**Leaving this machine in any form** (publishing, copying, sending): "
                           f"{LOCAL_ONLY_STATEMENT}; it was trained without differential "
                           "privacy on the data owner's own notes.")
    elif not dp.get("private") and not is_public_model(dp):
        defaults.insert(0, "**Sharing the model at all**: it was trained without differential "
                           "privacy.")
    return _with_trainer(texts.get("out_of_scope"), defaults)


def _eval_datasets(meta: Mapping[str, Any]) -> list[str]:
    names = []
    for entry in meta.get("model-index") or []:
        for result in entry.get("results", []) if isinstance(entry, Mapping) else []:
            name = (result.get("dataset") or {}).get("name") if isinstance(result, Mapping) else None
            if isinstance(name, str):
                names.append(name)
    return names


def _limitations_section(meta: Mapping[str, Any], texts: Mapping[str, str]) -> str:
    dp = meta.get("differential_privacy") or {}
    data = meta.get("dataset") or {}
    evals = _eval_datasets(meta)
    measured = (
        f"Measured on: {', '.join(f'`{_fmt(n)}`' for n in evals)} (the trainer's held-out notes, "
        "see *Evaluation*); other institutions, note types and writing styles may do worse."
        if evals else
        "Not measured: no evaluation results are recorded in this card. Evaluate it on your own "
        "labelled notes (`dphub evaluate --model DIR --gold NOTES`) before relying on it."
    )
    defaults = [measured]
    if isinstance(data, Mapping) and data.get("patients") is not None:
        defaults.append(
            f"Trained on {_fmt(data.get('patients'))} patients / {_fmt(data.get('notes'))} notes: "
            "PHI shapes absent from them (rare name origins, local ID formats) are likely missed."
        )
    if dp.get("private"):
        defaults.append(
            "Differential privacy lowers recall: gradient clipping (C = "
            f"{_fmt(dp.get('max_grad_norm'))}) and noise (σ = {_fmt(dp.get('noise_multiplier'))}) "
            "cost accuracy, most on rare PHI, so expect more missed PHI than from a non-private "
            "model (the smaller ε, the more). Combine it with the rule member and other models."
        )
    elif is_public_model(dp):
        defaults.append("Trained on public synthetic notes only: it has seen no real note, so "
                        "expect it to miss PHI shapes and flag clinical words that real notes "
                        "use differently; fine-tune it with DP on your notes.")
    else:
        defaults.append("Trained without differential privacy: it may have memorised and may "
                        "reveal PHI of its training notes.")
    defaults += [
        "No de-identification system catches all PHI: review outputs before sharing "
        "de-identified notes.",
        "The privacy guarantee bounds what the *model* reveals about its training data; it says "
        "nothing about the notes you tag with it, and does not cover the evaluation numbers.",
        "`OTHER` (see the glossary) is rare in training data and the least reliably tagged label.",
    ]
    return _with_trainer(texts.get("limitations"), defaults)


def _provenance_section(texts: Mapping[str, str]) -> str:
    text = texts.get("provenance")
    if text:
        return f"From the trainer:\n\n{text}"
    return (
        "Not stated by the trainer. (Trainers: describe where the notes come from, in words that "
        "identify no patient, in a `[card]` section of dphub.toml (`provenance = \"...\"`) before "
        "`dphub train`, or with `dphub card edit MODEL_DIR --provenance \"...\"`.)"
    )


#: What each label covers (HIPAA categories, then i2b2-2014 subcategories). Every label of every
#: schema in :data:`dphub.labels.SCHEMAS` has an entry (a test checks), OTHER included, so a data
#: owner reading a card never meets an unexplained label.
LABEL_GLOSSARY: dict[str, str] = {
    "NAME": "Names of people: patients, relatives, clinicians and other staff, user names, "
            "initials.",
    "DATE": "Dates and parts of dates (day, month, year, weekday or holiday when it dates an "
            "event), and date ranges.",
    "AGE": "A person's age (HIPAA Safe Harbor requires removing ages over 89).",
    "CONTACT": "Phone, fax and pager numbers, e-mail addresses, URLs, IP addresses.",
    "ID": "Identifying numbers: medical record, social security, health plan, account, licence, "
          "vehicle, device and other ID numbers.",
    "LOCATION": "Hospitals, departments, rooms, organisations, street addresses, cities, states, "
                "countries, ZIP codes, other places.",
    "PROFESSION": "A person's job or occupation (PHI under i2b2-2014, not a HIPAA identifier).",
    "OTHER": "Identifying information that fits none of the other labels (PhysioNet's `Other`, "
             "i2b2-2014's `OTHER`), e.g. a unique characteristic or a named event that could "
             "point to a patient. Rare, so models tag it least reliably.",
    "PATIENT": "NAME: the patient's name or initials.",
    "DOCTOR": "NAME: a clinician's or other care provider's name.",
    "USERNAME": "NAME: a user name or login.",
    "RELATIVE": "NAME: a relative's or proxy's name.",
    "ROOM": "LOCATION: a room or bed number.",
    "DEPARTMENT": "LOCATION: a hospital department or ward.",
    "HOSPITAL": "LOCATION: a hospital, clinic or other care facility.",
    "ORGANIZATION": "LOCATION: a company or other organisation.",
    "STREET": "LOCATION: a street address.",
    "CITY": "LOCATION: a city or town.",
    "STATE": "LOCATION: a state or province.",
    "COUNTRY": "LOCATION: a country.",
    "ZIP": "LOCATION: a postal code.",
    "LOCATION-OTHER": "LOCATION: any other place.",
    "PHONE": "CONTACT: a phone or pager number.",
    "FAX": "CONTACT: a fax number.",
    "EMAIL": "CONTACT: an e-mail address.",
    "URL": "CONTACT: a web address.",
    "IPADDR": "CONTACT: an IP address.",
    "SSN": "ID: a social security number.",
    "MEDICALRECORD": "ID: a medical record number.",
    "HEALTHPLAN": "ID: a health plan number.",
    "ACCOUNT": "ID: an account number.",
    "LICENSE": "ID: a licence or certificate number.",
    "VEHICLE": "ID: a vehicle identifier or licence plate.",
    "DEVICE": "ID: a device identifier or serial number.",
    "BIOID": "ID: a biometric identifier.",
    "IDNUM": "ID: any other identifying number.",
}


def _glossary_section(labels: list[str]) -> str:
    if not labels:
        return "No label schema is recorded in this card."
    rows = "\n".join(
        f"| `{_fmt(lab)}` | {LABEL_GLOSSARY.get(str(lab).upper(), 'Not documented by dphub.')} |"
        for lab in labels
    )
    return (
        "The model marks each PHI span with one of these labels; everything else is not PHI "
        "(tag `O`).\n\n| label | what it covers |\n|---|---|\n" + rows
    )


#: The sentence every evaluation carries: the numbers come from the trainer's private notes.
EVAL_PRIVACY_STATUS = "Evaluated on private data; these numbers are not covered by ε."


def _evaluation_section(meta: Mapping[str, Any]) -> str:
    """Results of ``dphub evaluate --write-card`` as a metric × dataset table, or how to add them.

    The privacy status is stated first because it is easy to miss: the trainer scored the model
    on its own held-out notes outside DP training, so the guarantee does not bound the numbers.
    """
    index = meta.get("model-index") or []
    datasets: list[str] = []
    values: dict[tuple[str, str], Any] = {}
    names: dict[str, str] = {}
    for entry in index:
        for result in entry.get("results", []) if isinstance(entry, Mapping) else []:
            if not isinstance(result, Mapping):
                continue
            ds = _fmt((result.get("dataset") or {}).get("name", "?"))
            if ds not in datasets:
                datasets.append(ds)
            for m in result.get("metrics", []) or []:
                if not isinstance(m, Mapping):
                    continue
                mtype = _fmt(m.get("type"))
                names.setdefault(mtype, _fmt(m.get("name") or m.get("type")))
                values[(mtype, ds)] = m.get("value")
    if not datasets:
        return (
            "Not evaluated: no results are recorded in this card. The trainer adds them with "
            "`dphub evaluate --model MODEL_DIR --gold HELD_OUT_NOTES --write-card` (held-out "
            "notes of patients not used in training); they then appear here, marked as computed "
            "on private data and not covered by ε."
        )
    header = "| metric | " + " | ".join(f"`{d}`" for d in datasets) + " |"
    rule = "|---|" + "---|" * len(datasets)
    rows = [
        f"| {names[t]} | " + " | ".join(_fmt(values.get((t, d))) for d in datasets) + " |"
        for t in names
    ]
    return (
        f"**{EVAL_PRIVACY_STATUS}** The trainer computed them with `dphub evaluate --write-card` "
        "on its own held-out notes, outside DP training: the guarantee above does not bound what "
        "they reveal about those notes (they are aggregate rates; no note text is recorded). "
        "Token-level binary (PHI vs not) precision/recall/F1, gold-phrase recall and entity F1.\n\n"
        + "\n".join([header, rule, *rows])
    )


def _body(meta: Mapping[str, Any]) -> str:
    dp = meta.get("differential_privacy") or {}
    data = meta.get("dataset") or {}
    labels = _labels_of(data.get("label_schema")) or list(data.get("phi_per_category") or [])
    if dp.get("private"):
        headline = (
            f", with differential privacy at ε = {_fmt(dp.get('epsilon'))}, "
            f"δ = {_fmt(dp.get('delta'))} per *{dp.get('privacy_unit', '?')}*"
        ) + _weak_headline(dp.get("epsilon"))
    elif dp.get("local_only"):
        headline = (f" — **{LOCAL_ONLY_STATEMENT.upper()}**: trained without differential "
                    "privacy on the data owner's own notes; keep it on this machine")
    elif is_public_model(dp):
        headline = (" — **public data only**: trained on public synthetic notes, no private "
                    "data, no ε spent")
    else:
        headline = " — **NOT PRIVATE: trained without differential privacy**"
    texts = _card_texts(meta)
    template = Template(asset(TEMPLATE_FILE).read_text(encoding="utf-8"))
    return template.substitute(
        title=str(meta.get("model_name") or "dphub PHI tagger"),
        label_schema=_fmt(data.get("label_schema")),
        labels=", ".join(labels) or "—",
        base_model=_fmt(meta.get("base_model")),
        dp_headline=headline,
        statement=privacy_statement(dp),
        intended_use=_intended_use_section(meta, texts),
        out_of_scope=_out_of_scope_section(meta, texts),
        limitations=_limitations_section(meta, texts),
        provenance=_provenance_section(texts),
        dp_table=_table((title, dp.get(key)) for key, title in _DP_ROWS if key in dp)
        + _lineage_rows(dp),
        data_table=_table((title, data.get(key)) for key, title in _DATA_ROWS if key in data),
        evaluation=_evaluation_section(meta) + _audit_section(meta),
        glossary=_glossary_section(labels),
    )


def _weak_headline(eps: Any) -> str:
    """The headline's warning for an ε the statement calls weak ('' otherwise)."""
    from dphub.privacy.statement import WEAK_EPSILON

    if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps) \
            or eps <= WEAK_EPSILON:
        return ""
    return f" — **a weak guarantee** (ε above {WEAK_EPSILON:g}: see Privacy)"


def _audit_section(meta: Mapping[str, Any]) -> str:
    """The ``empirical_audit`` block in words (:mod:`dphub.audit`); '' when there is none."""
    from dphub.audit import audit_section

    return audit_section(meta)


def _lineage_title(e: Mapping[str, Any]) -> str:
    if e.get("role") != LINEAGE_TEACHER:
        return "initialised from"
    return ("teacher (same units possible: composed)" if e.get("composed") is True
            else "teacher (declared to share no unit: not composed)")


def _lineage_rows(dp: Mapping[str, Any]) -> str:
    rows = [
        f"| {_lineage_title(e)} | {_fmt(e.get('repo'))}@{_fmt(e.get('revision'))} "
        f"(ε = {_fmt(e.get('epsilon'))}, δ = {_fmt(e.get('delta'))}, "
        f"unit {_fmt(e.get('privacy_unit'))}) |"
        for e in dp.get("lineage") or []
        if isinstance(e, dict)
    ]
    return ("\n" + "\n".join(rows)) if rows else ""


def _render(meta: Mapping[str, Any], body: str) -> str:
    from huggingface_hub import ModelCardData

    try:
        data = ModelCardData(**dict(meta))
    except ValueError as e:  # malformed model-index
        raise CardError(f"model-index: cannot be represented ({type(e).__name__})") from None
    return f"---\n{data.to_yaml()}\n---\n{body}"


def build_card(meta: dict) -> str:
    """The full README.md text (YAML front matter + Markdown body) for ``meta``.

    Missing HF keys, ``not_covered`` and ``library_versions`` are filled with dphub's defaults;
    nothing is validated here (``write_card`` validates).
    """
    full = _with_defaults(meta)
    return _render(full, _body(full))


def write_card(model_dir: Path, meta: dict, *, check_accounting: bool = True) -> Path:
    """Validate ``meta`` (schema + accounting) and write ``model_dir/README.md`` atomically.

    Nothing is written when validation fails. Returns the card path.
    """
    full = _with_defaults(meta)
    validate_meta(full, check_accounting=check_accounting)
    path = Path(model_dir) / CARD_FILE
    atomic_write_text(path, _render(full, _body(full)))
    return path


# --------------------------------------------------------------------------- loading

#: A README larger than this is refused before it is parsed (cards are a few kB).
MAX_CARD_BYTES = 1_000_000
#: Front matter larger than this is refused before YAML sees it.
MAX_FRONT_MATTER_BYTES = 256_000
#: Deepest nesting of YAML collections a card may use (dphub's cards use 5).
MAX_YAML_DEPTH = 32
#: The front-matter block as Hugging Face's RepoCard finds it (``---`` lines around YAML).
_YAML_BLOCK = re.compile(r"^(\s*---(?:\r\n|\r|\n))([\S\s]*?)((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|$))")


class _YamlRefused(yaml.YAMLError):
    """A YAML construct cards may not use; ``mark`` says where."""

    def __init__(self, what: str, mark: Any) -> None:
        super().__init__(what)
        self.what = what
        self.problem_mark = mark


class _PlainYamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without anchors/aliases and with a nesting limit.

    Safe loading constructs no Python objects, but it still expands aliases: a 1 kB
    "billion laughs" card references one list 9 levels deep and grows to gigabytes in whatever
    walks it (ModelCardData, JSON Schema, ``_plain``). Cards are written by dphub and need
    neither anchors nor deep nesting, so both are refused while composing, before anything grows.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _YamlRefused("a YAML alias", event.start_mark)
        if getattr(event, "anchor", None) is not None:
            raise _YamlRefused("a YAML anchor", event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _YamlRefused(f"nesting deeper than {MAX_YAML_DEPTH} levels",
                                   event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_front_matter_yaml(block: str, *, where: str) -> dict[str, Any]:
    """Parse a card's YAML front matter with limits (size, no aliases/anchors, nesting depth).

    Every card reader goes through here (``card show|validate``, publish, pull, hub listings), so
    a hostile card costs at most a 256 kB parse. Error messages give a line, never content.
    """
    if len(block) > MAX_FRONT_MATTER_BYTES or len(block.encode("utf-8", "replace")) > \
            MAX_FRONT_MATTER_BYTES:
        raise CardError(f"{where}: front matter is larger than {MAX_FRONT_MATTER_BYTES // 1000} kB; "
                        "dphub cards are a few kB")
    try:
        data = yaml.load(block, Loader=_PlainYamlLoader)  # noqa: S506 - safe loader subclass
    except _YamlRefused as e:
        line = e.problem_mark.line + 2 if e.problem_mark is not None else None
        raise CardError(
            f"{where}: front matter uses {e.what}" + (f" at line {line}" if line else "")
            + "; cards must be plain YAML (aliases and anchors can expand without bound)"
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 2}, column {mark.column + 1}" if mark else ""
        raise CardError(f"{where}: front matter is not valid YAML{at}") from None
    except (ValueError, OverflowError, RecursionError, MemoryError) as e:
        raise CardError(f"{where}: front matter cannot be read ({type(e).__name__})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CardError(f"{where}: front matter is not a mapping")
    return data


def split_front_matter(text: str, *, where: str) -> tuple[dict[str, Any], str]:
    """(front-matter dict, Markdown body) of README text, parsed with the limits above."""
    if len(text) > MAX_CARD_BYTES:
        raise CardError(f"{where}: model card is larger than {MAX_CARD_BYTES // 1_000_000} MB")
    if not re.match(r"\s*---(\r\n|\r|\n)", text):
        raise CardError(f"{where}: no YAML front matter (the card must start with '---')")
    m = _YAML_BLOCK.search(text)
    if not m:
        raise CardError(f"{where}: front matter is not closed by a '---' line")
    return load_front_matter_yaml(m.group(2), where=where), text[m.end():]


def _card_path(path: Path) -> Path:
    path = Path(path)
    return path / CARD_FILE if path.is_dir() else path


def parse_card(text: str, *, where: str = "model card") -> ModelCard:
    """Split README text into front matter and body; the front matter goes through
    ``huggingface_hub.ModelCardData`` (as the Hub reads it) after the limited YAML parse."""
    from huggingface_hub import ModelCardData

    data, body = split_front_matter(text, where=where)
    try:
        hf = ModelCardData(**data)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise CardError(
            f"{where}: front matter cannot be read ({type(e).__name__}: malformed "
            "model-index or a non-mapping block)"
        ) from None
    meta = _plain(hf.to_dict())
    return ModelCard(meta=meta, body=body)


def read_card_text(card_path: Path) -> str:
    """The README's text, refused above :data:`MAX_CARD_BYTES` before it is read whole."""
    try:
        with open(card_path, "rb") as fh:
            raw = fh.read(MAX_CARD_BYTES + 1)
    except OSError as e:
        raise CardError(f"{card_path}: cannot read the model card ({e.strerror})") from None
    if len(raw) > MAX_CARD_BYTES:
        raise CardError(f"{card_path}: model card is larger than {MAX_CARD_BYTES // 1_000_000} MB")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise CardError(f"{card_path}: model card is not UTF-8 text") from None


def load_card(path: Path) -> ModelCard:
    """Load a card from a model directory or a README.md path."""
    card_path = _card_path(Path(path))
    if not card_path.is_file():
        raise CardError(f"{card_path}: no model card found")
    card = parse_card(read_card_text(card_path), where=str(card_path))
    card.path = card_path
    return card


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
def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) for card front matter."""
    return json.loads(asset(SCHEMA_FILE).read_text(encoding="utf-8"))


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
        shown = ", ".join(k if _SAFE_KEY.match(str(k)) else "<non-identifier key>" for k in extra)
        return f"field(s) not allowed here: {shown}"
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


def _join(problems: list[str]) -> str:
    shown = problems[:MAX_PROBLEMS]
    more = len(problems) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


@functools.lru_cache(maxsize=256)
def _epsilon_opacus(accountant: str, q: float, sigma: float, steps: int, delta: float) -> float:
    return accounting.epsilon_for(accountant, q, sigma, steps, delta)


@functools.lru_cache(maxsize=256)
def _epsilon_independent(method: str, q: float, sigma: float, steps: int, delta: float) -> float:
    return accounting.epsilon_dp_accounting(method, q, sigma, steps, delta)  # absl kept quiet


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
        run_primary = _epsilon_opacus(*key)
        run_independent = _epsilon_independent(str(cc["method"]), *key[1:])
    except DphubError as e:
        return [f"differential_privacy: accounting fields are inconsistent ({e})"]
    problems = composition_problems(dp)
    claimed = float(dp["epsilon"])
    fields = f"{key[0]}, q={key[1]:g}, sigma={key[2]:g}, steps={key[3]}, delta={key[4]:g}"
    # the claim covers this run plus every composed teacher (basic composition): its floor is
    # the sum; without teachers, spent is 0
    spent = sum(float(e["epsilon"]) for e in composed_lineage(dp))
    if spent:
        fields += f", plus composed teachers' epsilon {spent:g}"
    primary, independent = run_primary + spent, run_independent + spent
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
    if not isinstance(comp, Mapping) or comp.get("method") != BASIC_COMPOSITION:
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
        from dphub.audit import check_audit_block

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
        raise CardError(_join(problems))


def body_is_rendered(card: ModelCard) -> bool:
    """The card's Markdown body is exactly what dphub renders from its front matter.

    The body is never hand-written: free text there would leave with the model outside every
    check (trainer prose belongs in the front matter's ``card_text``, which the schema bounds).
    Line endings and trailing whitespace do not count.
    """

    def norm(text: str) -> str:
        return text.replace("\r\n", "\n").replace("\r", "\n").rstrip()

    return norm(card.body) == norm(_body(_with_defaults(card.meta)))


def validate_card(
    path: Path, *, require_private: bool = False, check_accounting: bool = True,
    check_files: bool = True,
) -> ModelCard:
    """Load and validate the card of ``path`` (a model dir or README.md); return it.

    When the card sits in a model directory (next to ``model.safetensors`` or
    ``training_config.json``) and ``check_files`` is true, the directory is checked against the
    card as the publish gate does: only allow-listed files and training-config keys, the weights'
    SHA-256 and tensor layout, the training config's accounting fields equal to the card's, a
    public-synthetic claim's record, and the encoder against the declared base where this machine
    has it (:func:`dphub.hub.gate.base_unresolved` says when it has not).
    Raises :class:`CardError` with every problem on one line.
    """
    card = load_card(path)
    problems = meta_problems(card.meta, require_private=require_private,
                             check_accounting=check_accounting)
    model_dir = card.path.parent if card.path is not None else None
    if check_files and model_dir is not None and any(
        (model_dir / n).is_file() for n in ("model.safetensors", "training_config.json")
    ):
        from dphub.hub.gate import model_dir_problems

        problems += [p for p in model_dir_problems(model_dir, card.meta) if p not in problems]
    if problems:
        raise CardError(_join(problems))
    return card


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
    if not _SAFE_NAME.match(name):
        raise CardError(
            "dataset name must contain letters or digits (allowed: letters, digits, '.', '_', '-')"
        )
    metrics = _metrics_from_results(results)
    if not metrics:
        raise CardError("evaluation results hold no token precision/recall/F1 to record")
    card = load_card(model_dir)
    meta = dict(card.meta)
    model_name = str(meta.get("model_name") or Path(model_dir).resolve().name)
    if not _SAFE_NAME.match(model_name):
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
        "labels": _labels_of(data.get("label_schema")) or list(data.get("phi_per_category") or []),
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
        "card_text": sorted(_card_texts(meta)),
        "init_from": init[0] if init else None,
        "lineage": lineage,
    }
