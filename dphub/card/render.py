"""Rendering: the Markdown body derived from the front matter (privacy statement, tables,
evaluation, the trainer's bounded ``card_text``), :func:`build_card` and :func:`write_card`.

One concern (the body's sections, each a few lines of prose built from the same dict) in one
module, so the prose cannot drift from the numbers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from string import Template
from typing import Any

from dphub.card.audit import audit_section
from dphub.card.front_matter import render_readme
from dphub.card.meta import LINEAGE_TEACHER, is_public_model, library_versions
from dphub.card.model import (
    CARD_FILE,
    LOCAL_ONLY_STATEMENT,
    REQUIRED_TAGS,
    SAFE_KEY,
    TEMPLATE_FILE,
    ModelCard,
    plain_meta,
)
from dphub.card.validation import validate_meta
from dphub.cards import asset
from dphub.errors import CardError
from dphub.io import atomic_write_text
from dphub.labels import SCHEMAS
from dphub.privacy.statement import NOT_COVERED, WEAK_EPSILON, format_epsilon, privacy_statement

# --------------------------------------------------------------------------- rendering


def _with_defaults(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Fill the keys every card has (HF keys, not_covered, library versions) when missing."""
    out = plain_meta(meta)
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
    ("post_processing", "public student of (post-processing: the teacher's ε, none spent)"),
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


def labels_of(schema_name: Any) -> list[str]:
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
            shown = key if isinstance(key, str) and SAFE_KEY.match(key) else "<non-identifier>"
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


def card_texts(meta: Mapping[str, Any]) -> dict[str, str]:
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
    labels = labels_of(data.get("label_schema")) or list(data.get("phi_per_category") or [])
    if dp.get("private"):
        headline = (
            f", with differential privacy at ε = {format_epsilon(dp.get('epsilon'))}, "
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
    texts = card_texts(meta)
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
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps) \
            or eps <= WEAK_EPSILON:
        return ""
    return f" — **a weak guarantee** (ε above {WEAK_EPSILON:g}: see Privacy)"


def _audit_section(meta: Mapping[str, Any]) -> str:
    """The ``empirical_audit`` block in words (:mod:`dphub.audit`); '' when there is none."""
    return audit_section(meta)


def _lineage_title(e: Mapping[str, Any]) -> str:
    if e.get("role") != LINEAGE_TEACHER:
        return ("initialised from (same units possible: composed)" if e.get("composed") is True
                else "initialised from")
    return ("teacher (same units possible: composed)" if e.get("composed") is True
            else "teacher (declared to share no unit: not composed)")


def _lineage_rows(dp: Mapping[str, Any]) -> str:
    rows = [
        f"| {_lineage_title(e)} | {_fmt(e.get('repo'))}@{_fmt(e.get('revision'))} "
        f"(ε = {format_epsilon(e.get('epsilon'))}, δ = {_fmt(e.get('delta'))}, "
        f"unit {_fmt(e.get('privacy_unit'))}) |"
        for e in dp.get("lineage") or []
        if isinstance(e, dict)
    ]
    return ("\n" + "\n".join(rows)) if rows else ""


def build_card(meta: dict) -> str:
    """The full README.md text (YAML front matter + Markdown body) for ``meta``.

    Missing HF keys, ``not_covered`` and ``library_versions`` are filled with dphub's defaults;
    nothing is validated here (``write_card`` validates).
    """
    full = _with_defaults(meta)
    return render_readme(full, _body(full))


def write_card(model_dir: Path, meta: dict, *, check_accounting: bool = True) -> Path:
    """Validate ``meta`` (schema + accounting) and write ``model_dir/README.md`` atomically.

    Nothing is written when validation fails. Returns the card path.
    """
    full = _with_defaults(meta)
    validate_meta(full, check_accounting=check_accounting)
    path = Path(model_dir) / CARD_FILE
    atomic_write_text(path, render_readme(full, _body(full)))
    return path


def body_is_rendered(card: ModelCard) -> bool:
    """The card's Markdown body is exactly what dphub renders from its front matter.

    The body is never hand-written: free text there would leave with the model outside every
    check (trainer prose belongs in the front matter's ``card_text``, which the schema bounds).
    Line endings and trailing whitespace do not count.
    """

    def norm(text: str) -> str:
        return text.replace("\r\n", "\n").replace("\r", "\n").rstrip()

    return norm(card.body) == norm(_body(_with_defaults(card.meta)))
