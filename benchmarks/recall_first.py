"""Recall first (issue 26): forward ``any`` against the inverse rule on the PhysioNet dev corpus.

Usage (from the repository root; real data stays on this machine, nothing prints note text)::

    python benchmarks/recall_first.py --model /work/models/dev-dp              # inner split
    python benchmarks/recall_first.py --model /work/models/dev-dp --sweep      # the grid
    python benchmarks/recall_first.py --model DIR --split test --rule inverse:0.05,0.2  # lead, once

``--split inner`` (default) scores the inner tuning split: 20 % of the dev split's 95 training
patients (``train_dev_corpus._split(0, inner=True)``, split seed 1). Choose LOW/HIGH there only.
A model trained on all 95 training patients (the default dev-dp) has *seen* those patients, so
its inner-split scores are optimistic; say so wherever they are quoted. ``--split test`` scores the
36 held-out patients: run it once, at the end, with the thresholds chosen on the inner split.

Rows (one JSON object per line, numbers and category names only):

* ``forward any (rules + model)``: today's union;
* ``inverse rules only``: the rule member and the safe vocabulary (no model P);
* ``inverse model + rules``: the rule member, the model(s) and the vocabulary;

each with token-binary recall/precision, phrase recall (any overlap, full cover),
``non_phi_tokens_kept``, per-category phrase recall (full cover) and the count of gold phrases not
fully covered per category. ``--sweep`` prints, for the inverse model + rules ensemble, one line
per setting calibration scores (:func:`dphub.ensemble.inverse_calibrate.grid_rules`) with
recall, precision, full-cover phrase recall and non-PHI tokens kept: the recall-precision curve. Every model scores each note once (P down to the lowest value any setting reads); all
settings reuse those scores.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_dev_corpus import CORPUS, _split  # noqa: E402

from dphub.ensemble import inverse as inverse_module  # noqa: E402
from dphub.ensemble.aggregation import parse_rule  # noqa: E402
from dphub.ensemble.core import Ensemble, Slot  # noqa: E402
from dphub.ensemble.inverse import InverseRule, WordTable, hidden_spans, word_table  # noqa: E402
from dphub.ensemble.inverse_calibrate import (  # noqa: E402
    GRID_FLOOR,
    _gold_flags,
    grid_rules,
)
from dphub.ensemble.members import ModelMember  # noqa: E402
from dphub.evaluate import evaluate_spans  # noqa: E402
from dphub.rules.engine import RULES_DEFAULT, RuleMember, RuleOptions  # noqa: E402
from dphub.safe_vocab import load  # noqa: E402


def _summary(name: str, res) -> dict:
    pr = res.phrase_recall
    return {
        "row": name,
        "token_recall": round(res.token["recall"], 4),
        "token_precision": round(res.token["precision"], 4),
        "phrase_recall_any": round(pr["any_overlap"], 4),
        "phrase_recall_full": round(pr["full_cover"], 4),
        "non_phi_tokens_kept": round(res.utility["non_phi_tokens_kept"], 4),
        "per_category_full_cover": {c: round(v["full_cover"], 4)
                                    for c, v in pr["per_category"].items()},
        "misses_by_category": dict(Counter(leak.category for leak in res.leaks).most_common()),
    }


def _tables(ensemble: Ensemble, notes, rule: InverseRule, batch: int = 32):
    """Word tables of every note (models score every word down to the lowest value the grid
    or ``rule`` reads)."""
    lowest = min(v for v in (GRID_FLOOR, rule.floor(1.0)) if v > 0)
    probe = copy.copy(ensemble)
    probe.rule = InverseRule(lowest, lowest)
    models = {s.name: s.tag_threshold for s in ensemble.slots if isinstance(s.member, ModelMember)}
    out = []
    for i in range(0, len(notes), batch):
        part = notes[i:i + batch]
        for note, by_member in zip(part, probe.member_spans(part), strict=True):
            out.append(word_table(note.text, by_member, ensemble.vocabulary, models=models))
    return out


def hidden_kinds(notes, tables, rule: InverseRule, vocab) -> dict:
    """What ``rule`` hides of the non-PHI words (words of :data:`WORD_RE`, gold by overlap), by
    kind, as shares of all non-PHI words (issue 57's table): numbers (a digit), single letters,
    context words (:meth:`SafeVocabulary.is_context`), out-of-vocabulary words, and vocabulary
    words held back (a model's doubt, a sign of a name, a blocked phrase). Counts only."""
    counts: Counter[str] = Counter()
    total = 0
    for note, t in zip(notes, tables, strict=True):
        gold = _gold_flags(note, t)
        hidden = ~t.kept(rule.low, rule.high, rule.named, rule.sure) | t.flagged
        total += int((~gold).sum())
        for i in np.flatnonzero(hidden & ~gold):
            w = note.text[int(t.start[i]):int(t.end[i])]
            if any(c.isdigit() for c in w):
                kind = "numbers"
            elif len(w) == 1:
                kind = "single letters"
            elif vocab.is_context(w):
                kind = "context words"
            elif vocab.contains(w):
                kind = "vocabulary held back"
            else:
                kind = "out of vocabulary"
            counts[kind] += 1
    return {"row": "hidden non-PHI words by kind (share of all non-PHI words)",
            "non_phi_words": total,
            **{k: round(counts[k] / max(total, 1), 5)
               for k in ("numbers", "out of vocabulary", "vocabulary held back",
                         "context words", "single letters")},
            "all hidden": round(sum(counts.values()) / max(total, 1), 5)}


def _inverse_pred(notes, tables, rule: InverseRule) -> dict:
    return {n.id: [m.to_span() for m in hidden_spans(n.text, t, rule)]
            for n, t in zip(notes, tables, strict=True)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=[], type=Path,
                    help="model directory (repeatable: several model members)")
    ap.add_argument("--threshold", type=float, default=None,
                    help="the model members' own threshold (default: joint decoding)")
    ap.add_argument("--rule", default="inverse", help="inverse rule of the inverse rows")
    ap.add_argument("--safe-words", action="append", default=[], type=Path)
    ap.add_argument("--split", choices=("inner", "fold0", "fold1", "test"), default="inner",
                    help="inner, fold0, fold1: tuning parts (each scored by a model that did not "
                         "see it: train_dev_corpus.py --inner / --fold K); test: held-out, once")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--sweep", action="store_true", help="print the LOW/HIGH/NAMED grid too")
    ap.add_argument("--sweep-min-recall", type=float, default=0.99,
                    help="print only the sweep's settings reaching this token recall")
    ap.add_argument("--across-clauses", action="store_true",
                    help="release context words across clause punctuation too (issue 36's "
                         "measured variant; off in the product)")
    a = ap.parse_args(argv)
    inverse_module.CONTEXT_ACROSS_CLAUSES = a.across_clauses
    rule = parse_rule(a.rule)
    if not isinstance(rule, InverseRule):
        ap.error("--rule must be inverse or inverse:LOW,HIGH[,NAMED[,SURE]]")
    fold = int(a.split[4:]) if a.split.startswith("fold") else None
    _, notes = _split(0, a.corpus, inner=a.split == "inner", fold=fold)
    vocab = load(extra=a.safe_words)
    rules = Slot(RuleMember(RULES_DEFAULT, RuleOptions()), None, 0.0)
    models = [Slot(ModelMember.load(p, p.name), a.threshold) for p in a.model]
    print(json.dumps({"split": a.split, "notes": len(notes),
                      "patients": len({n.effective_patient_id for n in notes}),
                      "rule": str(rule), "across_clauses": a.across_clauses,
                      "safe_vocab_sha256": vocab.digest,
                      "safe_vocab_size": vocab.size, "models": [p.name for p in a.model]}))
    if models:
        fwd = Ensemble([rules, *models], "any")
        pred = {n.id: r.spans for n, r in zip(notes, fwd.deid(notes), strict=True)}
        print(json.dumps(_summary("forward any (rules + model)", evaluate_spans(notes, pred))))
    only = Ensemble([rules], rule, safe_vocab=vocab)
    t_rules = _tables(only, notes, rule)
    print(json.dumps(_summary("inverse rules only",
                              evaluate_spans(notes, _inverse_pred(notes, t_rules, rule)))))
    print(json.dumps({"members": "rules only", **hidden_kinds(notes, t_rules, rule, vocab)}))
    if not models:
        return 0
    both = Ensemble([rules, *models], rule, safe_vocab=vocab)
    t_both = _tables(both, notes, rule)
    print(json.dumps(_summary("inverse model + rules",
                              evaluate_spans(notes, _inverse_pred(notes, t_both, rule)))))
    print(json.dumps({"members": "model + rules", **hidden_kinds(notes, t_both, rule, vocab)}))
    if a.sweep:
        joined = WordTable.joined(t_both)
        gold = np.concatenate([_gold_flags(n, t) for n, t in zip(notes, t_both, strict=True)])
        n_gold = int(gold.sum())
        for r in grid_rules():
            found = int((~joined.kept(r.low, r.high, r.named, r.sure) & gold).sum())
            if found < a.sweep_min_recall * n_gold:  # token recall below the floor: skip
                continue
            res = evaluate_spans(notes, _inverse_pred(notes, t_both, r))
            print(json.dumps({"low": r.low, "high": r.high, "named": r.named, "sure": r.sure,
                              "token_recall": round(res.token["recall"], 4),
                              "token_precision": round(res.token["precision"], 4),
                              "phrase_recall_full": round(res.phrase_recall["full_cover"], 4),
                              "non_phi_tokens_kept":
                                  round(res.utility["non_phi_tokens_kept"], 4)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
