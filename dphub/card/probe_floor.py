"""The probe floor set by public facts: what a model's public warm start does on the probe notes.

Why (issue 53): the gate's probe held a model to half the recall its *own* card recorded at
training, so a poisoned or broken model set its own floor (a model that flagged only ages and
contacts had probe recall 0.20 and floor 0.10, and passed). The public warm start a model of a
given base starts from is public and deterministic (:mod:`dphub.train.warmstart`: public
synthetic notes, fixed seed): what it does on dphub's public probe notes
(:mod:`dphub.card.probe`) is a fact nobody can lower. A model far below it in any category finds
less PHI than a model anyone can build from public data alone, with no patient seen.

The figures are measured once per warm start and shipped here (:data:`PUBLIC_WARM_STARTS`), so a
puller checks them without building the warm start (minutes of training);
``benchmarks/gate_floor.py`` rebuilds each warm start, recomputes its figures and fails when
they differ from these. A model is matched to its warm start by what the gate can read from the
model itself: the encoder's shape, the label schema, head and rule-feature input of its
``config.json`` (all bound to the weights' tensors), and the card's ``base_model``. Whether the
card says the run used the warm start (``--warm-start none``, ``--init-from``, a federated
model) does not matter: a model of that base and schema is held to what the public warm start
of that base and schema does.

A model with no entry here (another base, schema or head, a truncated encoder, the tiny models
of the test suite) is held to the floor its card states and the dphub-wide minimum
(:data:`~dphub.card.probe.MIN_PROBE_FLOOR`), as before.

Light: no torch (the gate reads it before it decides to run the model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: a model's recall in a category must reach this share of its public warm start's recall there
#: (measured, docs/hub.md "The public floor": the honest ε-8 DP model of the dev corpus is at or
#: above its warm start in every category; the pushed-to-O and one-category models fall far below)
RECALL_SHARE = 0.5
#: its share of the probe notes' non-PHI words left unflagged must reach this share of the warm
#: start's (a model that flags everything keeps none: recall 1.0, and useless)
KEPT_SHARE = 0.5
#: categories with fewer gold word tokens in the probe notes than this are not held one by one
#: there (probe version 1: AGE has 3, PROFESSION 2; a single word would swing their recall by a
#: third): they are held on the category probe (:func:`dphub.card.probe.run_category_probe`,
#: 12 of each) against the warm start's figures there (``sparse_recall``). PROFESSION cannot be
#: held: no public warm start flags a single profession word (0 of 12, floor 0); docs/hub.md
MIN_CATEGORY_TOKENS = 10
#: a category is held only where its floor is at least this many word tokens of the notes it is
#: measured on: below that a single word decides (the --no-rule-features warm start finds 2 of
#: the category probe's 12 AGE words: a floor of one word is noise, not a fact)
MIN_FLOOR_TOKENS = 3


@dataclass(frozen=True)
class PublicBaseFigures:
    """What one public warm start does on the probe notes (probe version 1)."""

    #: the card's ``base_model`` of every model trained from it
    base_model: str
    label_schema: str
    head: str
    rule_features: bool
    hidden_size: int
    num_hidden_layers: int
    #: category -> token recall on the probe notes
    recall: Mapping[str, float]
    #: share of the probe notes' non-PHI word tokens it leaves unflagged
    kept: float
    #: category -> token recall on the category-probe notes, for the categories too sparse in
    #: the probe notes (issue 53: AGE, PROFESSION)
    sparse_recall: Mapping[str, float] = field(default_factory=dict)

    def matches(self, base_model: object, label_schema: object, head: object,
                rule_features: bool, hidden_size: object, num_hidden_layers: object) -> bool:
        """Whether a model of this card base, config and encoder shape starts from this base."""
        return (base_model, label_schema, head, rule_features, hidden_size, num_hidden_layers) \
            == (self.base_model, self.label_schema, self.head, self.rule_features,
                self.hidden_size, self.num_hidden_layers)


_MINILM = "sentence-transformers/all-MiniLM-L6-v2"

#: The public warm starts dphub builds by default (``dphub train`` with no options: the embedded
#: MiniLM, schema hipaa, CRF head, rule features on; and ``--no-rule-features``, the plain stage
#: the default builds on), measured by ``benchmarks/gate_floor.py`` on probe version 1.
PUBLIC_WARM_STARTS: tuple[PublicBaseFigures, ...] = (
    PublicBaseFigures(
        _MINILM, "hipaa", "crf", rule_features=True, hidden_size=384, num_hidden_layers=6,
        recall={"AGE": 0.0, "CONTACT": 0.6857, "DATE": 0.8986, "ID": 0.8462, "LOCATION": 0.5,
                "NAME": 1.0, "PROFESSION": 0.0},
        kept=0.9969, sparse_recall={"AGE": 0.5, "PROFESSION": 0.0}),
    PublicBaseFigures(
        _MINILM, "hipaa", "crf", rule_features=False, hidden_size=384, num_hidden_layers=6,
        recall={"AGE": 0.6667, "CONTACT": 0.6, "DATE": 0.8841, "ID": 0.6923, "LOCATION": 0.5625,
                "NAME": 1.0, "PROFESSION": 0.0},
        kept=0.9938, sparse_recall={"AGE": 0.1667, "PROFESSION": 0.0}),
)


def public_base(base_model: object, label_schema: object, head: object, rule_features: bool,
                hidden_size: object, num_hidden_layers: object,
                table: tuple[PublicBaseFigures, ...] | None = None) -> PublicBaseFigures | None:
    """The figures of the public warm start a model of this kind starts from (None: unknown)."""
    for entry in PUBLIC_WARM_STARTS if table is None else table:
        if entry.matches(base_model, label_schema, head, rule_features, hidden_size,
                         num_hidden_layers):
            return entry
    return None


def floor_shortfalls(recall: Mapping[str, tuple[int, int]], kept: float,
                     base: PublicBaseFigures,
                     sparse: Mapping[str, tuple[int, int]] | None = None) -> list[str]:
    """What a model's probe figures miss of the floors ``base`` sets, each as words with the
    figures ("CONTACT 3% (floor 48%)"); empty: it passes. ``sparse``: the model's counts on
    the category probe, for the categories the probe notes hold too few words of."""
    out: list[str] = []
    for cat in sorted({*base.recall, *base.sparse_recall}):
        hit, total = recall.get(cat, (0, 0))
        base_recall = base.recall.get(cat, 0.0)
        if total < MIN_CATEGORY_TOKENS:
            if sparse is None or cat not in base.sparse_recall:
                continue
            hit, total = sparse.get(cat, (0, 0))
            base_recall = base.sparse_recall[cat]
            if total < MIN_CATEGORY_TOKENS:
                continue
        floor = RECALL_SHARE * base_recall
        if floor * total < MIN_FLOOR_TOKENS:
            continue
        if hit / total < floor:
            out.append(f"{cat} {hit / total:.0%} (floor {floor:.0%})")
    kept_floor = KEPT_SHARE * base.kept
    if not kept >= kept_floor:  # NaN fails too
        out.append(f"non-PHI words left unflagged {kept:.0%} (floor {kept_floor:.0%})")
    return out
