"""The review loop measured (issue 40, item 3): labels from N notes read in the order of doubt vs
N notes read at random, and the recall of the Scenario B ensemble trained on them.

Usage (from the repository root; real data stays on this machine, nothing prints note text)::

    python benchmarks/review_loop.py --corpus ../shared/corpora/physionet-deid-dev \\
        --run-model demo-out/models/site-a --run-model demo-out/models/site-b \\
        --work /tmp/review-loop --settings 50:doubt,50:random:0 --baseline --threads 1

(``demo-out/models/site-*``: the DP site models ``scripts/demo.sh`` trains on synthetic notes.)

The pool is the notes of the dev split's 95 training patients (``train_dev_corpus._split(0)``).
A Scenario A run (the rule member plus the ``--run-model`` members, ``any``) de-identifies the
pool with dphub's runner; :func:`dphub.review.run.load_review` orders its notes by doubt. For
each setting ``N:doubt`` or ``N:random:SEED``, the simulated reviewer (the gold labels) corrects
the N chosen notes as the page would (:func:`dphub.review.corrections.save_corrections`: keeps a
run span that is a gold span, rejects the others, marks the missed gold spans), the saved file
trains the owner's model (``dphub ensemble train --dp`` with its defaults, or ``--local``: the
command's default, no DP), and the Scenario B ensemble (rules + that model, ``any``; with
``--inverse`` also the inverse rule) is scored on the held-out patients.

Prints one JSON object per line: the run's settings, then one row per setting (numbers only).
The reading is in docs/review.md.
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

from train_dev_corpus import CORPUS, _split  # noqa: E402

from dphub import formats  # noqa: E402
from dphub.ensemble.core import Ensemble, NoteResult, Slot, owner_slot  # noqa: E402
from dphub.ensemble.evaluation import read_labelled  # noqa: E402
from dphub.ensemble.members import ModelMember  # noqa: E402
from dphub.evaluate import evaluate_spans  # noqa: E402
from dphub.labels import category_of  # noqa: E402
from dphub.owner.distill import local_options, train_local  # noqa: E402
from dphub.review.corrections import check_corrections_path, save_corrections  # noqa: E402
from dphub.review.run import Review, load_review  # noqa: E402
from dphub.rule_features import shared_rule_member  # noqa: E402
from dphub.runner import run_deid  # noqa: E402
from dphub.train import TrainOptions  # noqa: E402


def _scores(res) -> dict:
    return {"token_recall": round(res.token["recall"], 4),
            "token_precision": round(res.token["precision"], 4),
            "phrase_recall_any": round(res.phrase_recall["any_overlap"], 4),
            "phrase_recall_full": round(res.phrase_recall["full_cover"], 4),
            "non_phi_tokens_kept": round(res.utility["non_phi_tokens_kept"], 4)}


def _rules() -> Slot:
    return Slot(shared_rule_member(), None, 0.0)


def _pool_run(pool, work: Path, models: list[Path], threshold: float | None) -> Review:
    """The Scenario A run over the pool (dphub's runner), read back in the order of doubt."""
    notes_path = work / "pool.jsonl"
    if not notes_path.is_file():
        formats.write(pool, notes_path, "jsonl")  # atomic, 0600
    tag = "-".join(p.name for p in models) or "rules"
    run_dir = work / f"run-{tag}-t{threshold}"
    if not (run_dir / "audit.jsonl").is_file():
        slots = [_rules(), *(Slot(ModelMember.load(p, p.name), threshold) for p in models)]
        t0 = time.monotonic()
        run_deid(notes_path, run_dir, Ensemble(slots, "any"), mode="spans", batch_size=16)
        print(json.dumps({"pool_run_seconds": round(time.monotonic() - t0, 1)}), flush=True)
    return load_review(run_dir, notes_path)


def _simulated_review(review: Review, keys: list[str], gold: dict) -> dict:
    """What the page sends for a reviewer who makes each chosen note match its gold labels."""
    out = {}
    for key in keys:
        note = review.note(key)
        want = {(s.start, s.end): category_of(s.label) for s in gold[note.id].spans}
        run = {(s["start"], s["end"]): s["label"] for s in note.spans}
        rejected = [list(k) for k in run if k not in want]
        retyped = [{"start": a, "end": b, "label": want[(a, b)]} for (a, b) in run
                   if (a, b) in want and run[(a, b)] != want[(a, b)]]
        added = [{"start": a, "end": b, "label": lab} for (a, b), lab in want.items()
                 if (a, b) not in run]
        out[key] = {"reviewed": True, "rejected": rejected, "retyped": retyped, "added": added}
    return {"notes": out}


def _choose(review: Review, n: int, order: str, seed: int | None) -> list[str]:
    if order == "doubt":
        return [note.key for note in review.notes[:n]]  # load_review's order: most doubtful first
    keys = sorted(note.key for note in review.notes)
    return random.Random(seed).sample(keys, n)


def _warm_start_dir() -> Path:
    """The public warm start (synthetic notes only) that the default recipe trains from."""
    from dphub.encoders import resolve_base_model
    from dphub.train import warmstart

    opts = TrainOptions()
    loadable, public_id = resolve_base_model(opts.base_model)
    cfg = warmstart.WarmStartConfig(max_length=opts.max_length, stride=opts.stride,
                                    rule_features=opts.rule_features)
    return warmstart.warm_start(Path(loadable), public_id, opts.label_schema, opts.head, cfg,
                                seed=warmstart.WARM_START_SEED)


def _evaluate(models: dict[str, Path], test, inverse: bool) -> dict[str, dict]:
    """Scores of rules + each model (and of the rules alone, key ``rules only``) on ``test``.

    Every owner model is trained head-only on one public warm start, so they share its
    encoder: one ensemble of all of them runs the encoder once per window (per rule), and each
    Scenario B ensemble (rules + one model) is combined from its two members' spans.
    """
    rules = _rules()
    slots = {name: owner_slot(d) if (d / "README.md").is_file()
             else Slot(ModelMember.load(d, name), None) for name, d in models.items()}
    out: dict[str, dict] = {name: {} for name in ["rules only", *models]}
    for rule in ("any", "inverse") if inverse else ("any",):
        every = Ensemble([rules, *slots.values()], rule).member_spans(test)
        for name in out:
            pair = [rules] + ([slots[name]] if name in slots else [])
            sub = Ensemble(pair, rule)
            pred = {n.id: NoteResult(sub.combine(n, {s.name: bm[s.name] for s in pair})).spans
                    for n, bm in zip(test, every, strict=True)}
            out[name][rule] = _scores(evaluate_spans(test, pred))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--work", type=Path, required=True,
                    help="private working directory (pool run, corrections, models; 0700)")
    ap.add_argument("--run-model", action="append", default=[], type=Path,
                    help="model member of the Scenario A run that is reviewed (repeatable)")
    ap.add_argument("--run-threshold", type=float, default=None,
                    help="the run's model members' threshold (default: joint decoding, as "
                         "`ensemble add` without --threshold)")
    ap.add_argument("--settings", default="50:doubt,50:random:0",
                    help="comma-separated N:doubt | N:doubt:REPEAT_TAG | N:random:SEED")
    ap.add_argument("--baseline", action="store_true",
                    help="also print the rules alone (Scenario A's rule member) on the held-out")
    ap.add_argument("--warm-start-row", action="store_true",
                    help="also score rules + the public warm start the recipe starts from (N = 0)")
    ap.add_argument("--local", action="store_true",
                    help="train without DP (`ensemble train`'s default) instead of with --dp")
    ap.add_argument("--inverse", action="store_true", help="also score the inverse rule")
    ap.add_argument("--heldout-patients", type=int, default=None,
                    help="score a random subset of this many held-out patients (seed 0)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", type=int, default=None,
                    help="a smoke run: only this many pool and held-out notes")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    a.work.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(a.work, 0o700)
    pool, test = _split(0, a.corpus)
    if a.heldout_patients is not None:
        pids = sorted({n.patient_id for n in test})
        keep = set(random.Random(0).sample(pids, a.heldout_patients))
        test = [n for n in test if n.patient_id in keep]
    if a.smoke is not None:
        pool, test = pool[:a.smoke], test[:a.smoke]
    gold = {n.id: n for n in pool}
    print(json.dumps({"pool_notes": len(pool), "pool_patients": len({n.patient_id for n in pool}),
                      "heldout_notes": len(test),
                      "heldout_patients": len({n.patient_id for n in test}),
                      "run_members": ["rules:default", *(p.name for p in a.run_model)],
                      "run_threshold": a.run_threshold, "dp": not a.local,
                      "threads": a.threads}), flush=True)
    review = _pool_run(pool, a.work, a.run_model, a.run_threshold)
    rows: dict[str, dict] = {}
    models: dict[str, Path] = {}
    for setting in filter(None, a.settings.split(",")):
        parts = setting.split(":")
        n, order = int(parts[0]), parts[1]
        # N:doubt:TAG repeats a doubt setting (DP noise is drawn from OS entropy, by design)
        seed = int(parts[2]) if order == "random" else None
        name = setting.replace(":", "-")
        keys = _choose(review, n, order, seed)
        corr = check_corrections_path(a.work / f"corrections-{name}.jsonl", review.run_dir,
                                      [a.work / "pool.jsonl"])
        save_corrections(review, _simulated_review(review, keys, gold), corr)
        labelled = read_labelled(corr)
        model_dir = a.work / f"model-{name}{'-local' if a.local else ''}"
        opts = local_options(TrainOptions(out=model_dir, force=True), dp=not a.local)
        t1 = time.monotonic()
        res = train_local(labelled, opts)
        chosen = [review.note(k) for k in keys]
        rows[name] = {"n": n, "order": order, "seed": seed, "dp": not a.local,
                      "notes_with_phi": sum(1 for x in labelled if x.spans),
                      "gold_spans": sum(len(x.spans) for x in labelled),
                      "patients": len({x.patient_id for x in labelled}),
                      "doubt_sum": round(sum(x.doubt.total for x in chosen), 2),
                      "epsilon": None if res.train.epsilon is None
                      else round(res.train.epsilon, 3),
                      "steps": res.train.steps,
                      "train_seconds": round(time.monotonic() - t1, 1)}
        print(json.dumps({"trained": rows[name]}), flush=True)
        models[name] = model_dir
    if a.warm_start_row:
        models["public warm start (N = 0)"] = _warm_start_dir()
    t2 = time.monotonic()
    scores = _evaluate(models, test, a.inverse)
    eval_s = round(time.monotonic() - t2, 1)
    for name, sc in scores.items():
        if name == "rules only" and not a.baseline:
            continue
        print(json.dumps({**rows.get(name, {"setting": name}), **sc,
                          "eval_seconds_all": eval_s}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
