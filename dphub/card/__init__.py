"""The model card: a Hugging Face README.md whose front matter carries the DP guarantee.

The card is the one place a model's privacy claim lives, so it is built from data and checked by
machines, never hand-written:

* ``build_card(meta)`` renders the README from a metadata dict (HF keys + ``differential_privacy``
  + ``dataset`` blocks, see docs/architecture.md "Model card front matter"); the body (privacy
  statement, tables, evaluation) is derived from the same dict, so the prose cannot disagree with
  the numbers. Front matter goes through ``huggingface_hub.ModelCardData`` (``front_matter``)
  so the Hub reads it.
* ``validate_meta`` (:mod:`dphub.card.validation`) checks the front matter against ``cards/dp_metadata.schema.json`` (JSON Schema
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

Package layout (bottom-up; each module imports only those above it in this list):
``front_matter`` (the YAML as the Hub writes and reads it), ``model`` (:class:`ModelCard`,
file names, README text), ``meta`` (producing the blocks),
``post_processing`` (a public student's block: its teacher's guarantee),
``audit`` (the ``empirical_audit`` block in words and its verdict check), ``validation`` (schema,
accounting recomputation), ``render`` (the body, :func:`build_card`, :func:`write_card`),
``parse`` (loading), ``evaluation`` (``model-index``), ``summary`` (flat fields for tables).
The card layer needs nothing from training or the hub (docs/architecture.md); the checks that
need the files next to a card are :func:`dphub.hub.validate.validate_card`.
"""

from __future__ import annotations

from dphub.card.audit import (  # noqa: F401
    audit_section,
    check_audit_block,
    describe,
)
from dphub.card.evaluation import (  # noqa: F401
    add_evaluation,
)
from dphub.card.meta import (  # noqa: F401
    BASIC_COMPOSITION,
    LINEAGE_INIT_FROM,
    LINEAGE_TEACHER,
    PUBLIC_SYNTHETIC,
    SYNTH_DATASET,
    apply_composition,
    card_meta,
    coarsen_count,
    compose_teachers,
    composed_claim,
    composed_lineage,
    dataset_block,
    dataset_from_stats,
    dp_block,
    is_public_model,
    library_versions,
    non_private_block,
    public_block,
    run_delta,
)
from dphub.card.model import (  # noqa: F401
    CARD_FILE,
    EVAL_TASK_NAME,
    LOCAL_ONLY_STATEMENT,
    REQUIRED_TAGS,
    SCHEMA_FILE,
    TEMPLATE_FILE,
    TRAINING_CONFIG_FORMAT,
    ModelCard,
    schema,
)
from dphub.card.parse import (  # noqa: F401
    MAX_CARD_BYTES,
    MAX_FRONT_MATTER_BYTES,
    MAX_YAML_DEPTH,
    load_card,
    load_front_matter_yaml,
    parse_card,
    read_card_text,
    split_front_matter,
)
from dphub.card.post_processing import (  # noqa: F401
    DISTILLATION,
    DP_POST_PROCESSING,
    POST_PROCESSING_NOT_COVERED,
    is_post_processing,
    post_processing_block,
)
from dphub.card.render import (  # noqa: F401
    CARD_TEXT_FIELDS,
    CARD_TEXT_KEY,
    CARD_TEXT_MAX_CHARS,
    EVAL_PRIVACY_STATUS,
    LABEL_GLOSSARY,
    body_is_rendered,
    build_card,
    check_card_text,
    with_card_text,
    write_card,
)
from dphub.card.summary import (  # noqa: F401
    dp_summary,
)
from dphub.card.validation import (  # noqa: F401
    COUNT_RANGE_PATTERN,
    MAX_PROBLEMS,
    accounting_problems,
    composition_problems,
    join_problems,
    load_valid_card,
    meta_problems,
    unit_covers,
    validate_meta,
)

__all__ = [
    "BASIC_COMPOSITION",
    "CARD_FILE",
    "CARD_TEXT_FIELDS",
    "CARD_TEXT_KEY",
    "CARD_TEXT_MAX_CHARS",
    "COUNT_RANGE_PATTERN",
    "EVAL_PRIVACY_STATUS",
    "EVAL_TASK_NAME",
    "LABEL_GLOSSARY",
    "LINEAGE_TEACHER",
    "LOCAL_ONLY_STATEMENT",
    "MAX_CARD_BYTES",
    "MAX_FRONT_MATTER_BYTES",
    "MAX_PROBLEMS",
    "MAX_YAML_DEPTH",
    "ModelCard",
    "PUBLIC_SYNTHETIC",
    "REQUIRED_TAGS",
    "SCHEMA_FILE",
    "SYNTH_DATASET",
    "TEMPLATE_FILE",
    "TRAINING_CONFIG_FORMAT",
    "accounting_problems",
    "add_evaluation",
    "DISTILLATION",
    "DP_POST_PROCESSING",
    "POST_PROCESSING_NOT_COVERED",
    "audit_section",
    "body_is_rendered",
    "build_card",
    "card_meta",
    "check_audit_block",
    "check_card_text",
    "coarsen_count",
    "LINEAGE_INIT_FROM",
    "apply_composition",
    "compose_teachers",
    "composed_claim",
    "composed_lineage",
    "composition_problems",
    "dataset_block",
    "dataset_from_stats",
    "describe",
    "dp_block",
    "dp_summary",
    "is_post_processing",
    "is_public_model",
    "join_problems",
    "library_versions",
    "load_card",
    "load_front_matter_yaml",
    "load_valid_card",
    "meta_problems",
    "non_private_block",
    "parse_card",
    "post_processing_block",
    "public_block",
    "read_card_text",
    "run_delta",
    "schema",
    "split_front_matter",
    "unit_covers",
    "validate_meta",
    "with_card_text",
    "write_card",
]
