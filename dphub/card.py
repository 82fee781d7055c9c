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
import logging
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
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


def _evaluation_section(meta: Mapping[str, Any]) -> str:
    index = meta.get("model-index") or []
    rows = []
    for entry in index:
        for result in entry.get("results", []) if isinstance(entry, dict) else []:
            ds = (result.get("dataset") or {}).get("name", "?")
            for m in result.get("metrics", []):
                rows.append(f"| {_fmt(ds)} | {_fmt(m.get('type'))} | {_fmt(m.get('value'))} |")
    if not rows:
        return ""
    return (
        "\n## Evaluation\n\nToken-level binary (PHI vs not) precision/recall/F1 and gold-phrase "
        "recall, as computed by `dphub evaluate`.\n\n| dataset | metric | value |\n|---|---|---|\n"
        + "\n".join(rows)
        + "\n"
    )


def _body(meta: Mapping[str, Any]) -> str:
    dp = meta.get("differential_privacy") or {}
    data = meta.get("dataset") or {}
    labels = _labels_of(data.get("label_schema")) or list(data.get("phi_per_category") or [])
    if dp.get("private"):
        headline = (
            f", with differential privacy at ε = {_fmt(dp.get('epsilon'))}, "
            f"δ = {_fmt(dp.get('delta'))} per *{dp.get('privacy_unit', '?')}*"
        )
    else:
        headline = " — **NOT PRIVATE: trained without differential privacy**"
    template = Template(asset(TEMPLATE_FILE).read_text(encoding="utf-8"))
    return template.substitute(
        title=str(meta.get("model_name") or "dphub PHI tagger"),
        label_schema=_fmt(data.get("label_schema")),
        labels=", ".join(labels) or "—",
        base_model=_fmt(meta.get("base_model")),
        dp_headline=headline,
        statement=privacy_statement(dp),
        dp_table=_table((title, dp.get(key)) for key, title in _DP_ROWS if key in dp)
        + _lineage_rows(dp),
        data_table=_table((title, data.get(key)) for key, title in _DATA_ROWS if key in data),
        evaluation=_evaluation_section(meta) + _audit_section(meta),
    )


def _audit_section(meta: Mapping[str, Any]) -> str:
    """The ``empirical_audit`` block in words (:mod:`dphub.audit`); '' when there is none."""
    from dphub.audit import audit_section

    return audit_section(meta)


def _lineage_rows(dp: Mapping[str, Any]) -> str:
    rows = [
        f"| initialised from | {_fmt(e.get('repo'))}@{_fmt(e.get('revision'))} "
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


def _card_path(path: Path) -> Path:
    path = Path(path)
    return path / CARD_FILE if path.is_dir() else path


def parse_card(text: str, *, where: str = "model card") -> ModelCard:
    """Split README text into front matter (via ``huggingface_hub.ModelCard``) and body."""
    from huggingface_hub import ModelCard as HfModelCard

    if not re.match(r"\s*---(\r\n|\r|\n)", text):
        raise CardError(f"{where}: no YAML front matter (the card must start with '---')")
    try:
        hf = HfModelCard(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 2}, column {mark.column + 1}" if mark else ""
        raise CardError(f"{where}: front matter is not valid YAML{at}") from None
    except (ValueError, TypeError) as e:
        raise CardError(
            f"{where}: front matter cannot be read ({type(e).__name__}: malformed "
            "model-index or a non-mapping block)"
        ) from None
    meta = _plain(hf.data.to_dict())
    return ModelCard(meta=meta, body=hf.text)


def load_card(path: Path) -> ModelCard:
    """Load a card from a model directory or a README.md path."""
    card_path = _card_path(Path(path))
    if not card_path.is_file():
        raise CardError(f"{card_path}: no model card found")
    try:
        text = card_path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise CardError(f"{card_path}: model card is not UTF-8 text") from None
    card = parse_card(text, where=str(card_path))
    card.path = card_path
    return card


# --------------------------------------------------------------------------- validation


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) for card front matter."""
    return json.loads(asset(SCHEMA_FILE).read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(schema())
    return jsonschema.Draft202012Validator(schema())


def _error_path(err: ValidationError) -> str:
    parts = [str(p) for p in err.absolute_path]
    if err.validator == "required":
        missing = re.match(r"'([^']+)'", err.message)
        if missing:
            parts.append(missing.group(1))
    return ".".join(parts) or "<front matter>"


def _error_message(err: ValidationError) -> str:
    """The validator's message, without echoing string/container values (could be note text)."""
    inst = err.instance
    if err.validator == "required":
        return "required field is missing"
    if err.validator == "additionalProperties":
        extra = sorted(set(inst) - set(err.schema.get("properties", {}))) if isinstance(
            inst, dict) else []
        shown = ", ".join(k if _SAFE_KEY.match(str(k)) else "<non-identifier key>" for k in extra)
        return f"field(s) not allowed here: {shown}"
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
    return f"{kind} value fails '{err.validator}' (value not shown)"


def _schema_error(meta: Any) -> str | None:
    err = best_match(_validator().iter_errors(meta))
    if err is None:
        return None
    return f"{_error_path(err)}: {_error_message(err)}"


@functools.lru_cache(maxsize=256)
def _epsilon_opacus(accountant: str, q: float, sigma: float, steps: int, delta: float) -> float:
    return accounting.epsilon_for(accountant, q, sigma, steps, delta)


@functools.lru_cache(maxsize=256)
def _epsilon_independent(method: str, q: float, sigma: float, steps: int, delta: float) -> float:
    absl = logging.getLogger("absl")  # dp-accounting logs one warning per skipped RDP order
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        return accounting.epsilon_dp_accounting(method, q, sigma, steps, delta)
    finally:
        absl.setLevel(level)


def _too_small(claimed: float, reference: float) -> bool:
    if math.isinf(reference):
        return not math.isinf(claimed)
    return (reference - claimed) > accounting.CROSS_CHECK_RTOL * max(reference, 1e-12)


def verify_accounting(dp: Mapping[str, Any]) -> None:
    """Recompute ε from the recorded fields; raise :class:`CardError` on a smaller claim.

    The claimed ε must not be below the Opacus recomputation nor below the dp-accounting one by
    more than ``accounting.CROSS_CHECK_RTOL`` (relative); the recorded cross-check ε must agree
    with its recomputation within the same tolerance.
    """
    key = (
        str(dp["accountant"]),
        float(dp["sample_rate"]),
        float(dp["noise_multiplier"]),
        int(dp["steps"]),
        float(dp["delta"]),
    )
    cc = dp["cross_check"]
    try:
        primary = _epsilon_opacus(*key)
        independent = _epsilon_independent(str(cc["method"]), *key[1:])
    except DphubError as e:
        raise CardError(f"differential_privacy: accounting fields are inconsistent ({e})") from None
    claimed = float(dp["epsilon"])
    fields = (
        f"{key[0]}, q={key[1]:g}, sigma={key[2]:g}, steps={key[3]}, delta={key[4]:g}"
    )
    rtol = f"{accounting.CROSS_CHECK_RTOL:.0%}"
    if _too_small(claimed, primary):
        raise CardError(
            f"differential_privacy.epsilon: claims {claimed:.4g} but the recorded accounting "
            f"({fields}) gives {primary:.4g} (tolerance {rtol})"
        )
    recorded = float(cc["epsilon"])
    if math.isinf(independent) != math.isinf(recorded) or (
        not math.isinf(independent)
        and abs(recorded - independent) > accounting.CROSS_CHECK_RTOL * max(independent, 1e-12)
    ):
        raise CardError(
            f"differential_privacy.cross_check.epsilon: records {recorded:.4g} but dp-accounting "
            f"({cc['method']}) gives {independent:.4g} for {fields} (tolerance {rtol})"
        )
    if _too_small(claimed, independent):
        raise CardError(
            f"differential_privacy.epsilon: claims {claimed:.4g} but dp-accounting "
            f"({cc['method']}) gives {independent:.4g} for {fields} (tolerance {rtol})"
        )


def validate_meta(
    meta: Mapping[str, Any], *, require_private: bool = False, check_accounting: bool = True
) -> None:
    """Validate a front-matter dict; raise :class:`CardError` with ``<path>: <message>``."""
    problem = _schema_error(meta)
    if problem:
        raise CardError(problem)
    dp = meta["differential_privacy"]
    if dp["private"] and not math.isfinite(dp["epsilon"]):
        raise CardError("differential_privacy.epsilon: a private model needs a finite epsilon")
    if require_private and not dp["private"]:
        raise CardError(
            "differential_privacy.private: the model was trained without differential privacy "
            "(private: false); only private models may be published"
        )
    if check_accounting and dp["private"]:
        verify_accounting(dp)


def validate_card(
    path: Path, *, require_private: bool = False, check_accounting: bool = True
) -> ModelCard:
    """Load and validate the card of ``path`` (a model dir or README.md); return it.

    Raises :class:`CardError` with a one-line ``<schema path>: <message>``.
    """
    card = load_card(path)
    validate_meta(card.meta, require_private=require_private, check_accounting=check_accounting)
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
    model_name = meta.get("model_name")
    if model_name is None:
        index = meta.get("model-index") or []
        model_name = index[0].get("name") if index else None
    if model_name is None and card.path is not None:
        model_name = card.path.resolve().parent.name
    return {
        "name": model_name,
        "private": bool(dp.get("private")),
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
        "init_from": lineage[0] if lineage else None,
        "lineage": lineage,
    }
