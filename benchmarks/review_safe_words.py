"""Corrections make the next run better (issue 54, item 4): site-local safe words from N
reviewed notes, read in the order of doubt vs at random, and what they keep on held-out patients.

Usage (from the repository root; real data stays on this machine, nothing prints note text)::

    nice -n 10 python benchmarks/review_safe_words.py --work /tmp/review-safe-words

The pool is the notes of the dev split's 95 training patients (``train_dev_corpus._split(0)``);
the held-out notes are its 36 other patients. The reviewed run is ``rules:default`` under
``--aggregate inverse`` (dphub's runner, mode ``spans``), read back by
:func:`dphub.review.run.load_review` (most doubtful first: under the inverse rule a note's doubt
counts the untyped words the rule hid). For each setting ``N:doubt`` or ``N:random:SEED`` the
simulated reviewer makes each of the N chosen notes match its gold labels, as the page would
save it (every hidden word that is no PHI rejected, every missed PHI added:
:func:`dphub.review.corrections.labelled_notes`), and the page's save hook records the rejected
words (:func:`dphub.review.safe_words.record_safe_words`, one file per setting). The held-out
notes are then de-identified by the same ensemble with that file (``--safe-words``:
:func:`dphub.safe_vocab.load`) and scored against their gold.

Rules only, by choice: a DP model on the dev corpus needs about 50 minutes of CPU here, and the
guard makes a model member only stricter (a site word also needs every model's P below HIGH).

Prints one JSON object per line (numbers only): the split, the baseline (no site words), one row
per setting. The reading is in docs/review.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from review_loop import _simulated_review  # noqa: E402 (the reviewer review_loop simulates)
from train_dev_corpus import CORPUS, _split  # noqa: E402

from dphub import formats, safe_vocab  # noqa: E402
from dphub.ensemble.core import Ensemble, Slot  # noqa: E402
from dphub.ensemble.inverse import InverseRule, hidden_spans, word_table  # noqa: E402
from dphub.evaluate import evaluate_spans  # noqa: E402
from dphub.review.corrections import labelled_notes  # noqa: E402
from dphub.review.run import Review, load_review  # noqa: E402
from dphub.review.safe_words import read_site_file, record_safe_words, summarize  # noqa: E402
from dphub.rule_features import shared_rule_member  # noqa: E402
from dphub.runner import run_deid  # noqa: E402
from dphub.safe_vocab import SafeVocabulary, load  # noqa: E402

RULE = "inverse"


def _rules() -> Slot:
    return Slot(shared_rule_member(), None, 0.0)


def _pool_run(pool, work: Path) -> Review:
    notes_path = work / "pool.jsonl"
    if not notes_path.is_file():
        formats.write(pool, notes_path, "jsonl")  # atomic, 0600
    run_dir = work / "run-rules-inverse"
    if not (run_dir / "audit.jsonl").is_file():
        t0 = time.monotonic()
        run_deid(notes_path, run_dir, Ensemble([_rules()], RULE), mode="spans", batch_size=16)
        print(json.dumps({"pool_run_seconds": round(time.monotonic() - t0, 1)}), flush=True)
    return load_review(run_dir, notes_path)


def _choose(review: Review, n: int, order: str, seed: int | None) -> list[str]:
    if order == "doubt":
        return [note.key for note in review.notes[:n]]  # load_review's order: most doubtful first
    keys = sorted(note.key for note in review.notes)
    return random.Random(seed).sample(keys, n)


def _score(test, member_spans, vocab: SafeVocabulary, rule: InverseRule) -> dict:
    pred = {}
    for note, by_member in zip(test, member_spans, strict=True):
        table = word_table(note.text, by_member, vocab, models={})
        pred[note.id] = [m.to_span() for m in hidden_spans(note.text, table, rule)]
    res = evaluate_spans(test, pred)
    return {"token_recall": round(res.token["recall"], 5),
            "token_precision": round(res.token["precision"], 4),
            "phrase_recall_full": round(res.phrase_recall["full_cover"], 5),
            "non_phi_tokens_kept": round(res.utility["non_phi_tokens_kept"], 5),
            "leaks": len(res.leaks)}


def _hidden_shapes(test, member_spans, vocab: SafeVocabulary, rule: InverseRule) -> dict:
    """The non-PHI words the baseline hides on the held-out notes, by shape: what a site word
    can reach (lower-case letters, no name in the lists) and what it never may."""
    from dphub.rules.lexicon import dictionaries
    from dphub.safe_vocab import is_site_word, normalize_word

    names = dictionaries().names
    out = {"lower_case_words": 0, "lower_case_names_or_context_words": 0, "capitalised": 0,
           "in_capitals": 0, "single_letters": 0, "with_digits": 0}
    for note, by_member in zip(test, member_spans, strict=True):
        table = word_table(note.text, by_member, vocab, models={})
        kept = table.kept(rule.low, rule.high, rule.named, rule.sure)
        for i in range(len(table.start)):
            a, b = int(table.start[i]), int(table.end[i])
            if kept[i] or any(g.start < b and a < g.end for g in note.spans):
                continue
            w = note.text[a:b]
            if any(c.isdigit() for c in w):
                out["with_digits"] += 1
            elif len(w) == 1:
                out["single_letters"] += 1
            elif is_site_word(w):
                bad = normalize_word(w) in names or vocab.is_context(w)
                out["lower_case_names_or_context_words" if bad else "lower_case_words"] += 1
            elif w.isupper():
                out["in_capitals"] += 1
            else:
                out["capitalised"] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--work", type=Path, required=True,
                    help="private working directory (pool run, safe words files; 0700)")
    ap.add_argument("--settings", default="10:doubt,10:random:0,10:random:1,10:random:2,"
                    "25:doubt,25:random:0,25:random:1,25:random:2,"
                    "50:doubt,50:random:0,50:random:1,50:random:2",
                    help="comma-separated N:doubt | N:random:SEED (N may be all: every pool note)")
    ap.add_argument("--min-rejections", type=int, default=None,
                    help="score with another number of independent rejections than the "
                         "product's (dphub.safe_vocab.MIN_REJECTIONS): what that guard costs")
    ap.add_argument("--smoke", type=int, default=None,
                    help="a smoke run: only this many pool and held-out notes")
    a = ap.parse_args(argv)
    if a.min_rejections is not None:
        safe_vocab.MIN_REJECTIONS = a.min_rejections
    a.work.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(a.work, 0o700)
    pool, test = _split(0, a.corpus)
    if a.smoke is not None:
        pool, test = pool[:a.smoke], test[:a.smoke]
    gold = {n.id: n for n in pool}
    rule = InverseRule.parse(RULE)
    print(json.dumps({"pool_notes": len(pool),
                      "pool_patients": len({n.effective_patient_id for n in pool}),
                      "heldout_notes": len(test),
                      "heldout_patients": len({n.effective_patient_id for n in test}),
                      "members": ["rules:default"], "rule": str(rule),
                      "min_rejections": safe_vocab.MIN_REJECTIONS}), flush=True)
    review = _pool_run(pool, a.work)
    t0 = time.monotonic()
    spans = Ensemble([_rules()], RULE).member_spans(test)
    base_vocab = load()
    base = _score(test, spans, base_vocab, rule)
    print(json.dumps({"setting": "no site words", "site_words": 0, **base,
                      "score_seconds": round(time.monotonic() - t0, 1)}), flush=True)
    print(json.dumps({"hidden_non_phi_words_by_shape": _hidden_shapes(test, spans, base_vocab,
                                                                       rule)}), flush=True)
    for setting in filter(None, a.settings.split(",")):
        parts = setting.split(":")
        n = len(review.notes) if parts[0] == "all" else int(parts[0])
        order = parts[1]
        seed = int(parts[2]) if order == "random" else None
        keys = _choose(review, n, order, seed)
        path = a.work / f"site-safe-words-{setting.replace(':', '-')}.json"
        path.unlink(missing_ok=True)
        labelled = labelled_notes(review, _simulated_review(review, keys, gold))
        record_safe_words(review, labelled, path, vocab=base_vocab)
        site = summarize(read_site_file(path))
        vocab = load(extra=[path])
        row = _score(test, spans, vocab, rule)
        chosen = [review.note(k) for k in keys]
        print(json.dumps({"setting": setting, "n": n, "order": order, "seed": seed,
                          "patients": len({x.patient_id for x in chosen}),
                          "hidden_untyped_words": sum(x.doubt.inverse for x in chosen),
                          "site_words": site.counted, "waiting": site.waiting,
                          "refused": site.refused, **row,
                          "kept_gain_points": round(100 * (row["non_phi_tokens_kept"]
                                                           - base["non_phi_tokens_kept"]), 3),
                          "recall_change": round(row["token_recall"] - base["token_recall"], 5)}),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
