"""Train on the PhysioNet dev corpus (patient-disjoint 80/20 split) and score the held-out 20 %.

Usage (from the repository root; real data stays on this machine, nothing prints note text)::

    python benchmarks/train_dev_corpus.py --out /tmp/dev-dp --target-epsilon 8
    python benchmarks/train_dev_corpus.py --out /tmp/dev-nodp --no-dp
    python benchmarks/train_dev_corpus.py --eval-only /tmp/dev-dp      # score an existing model
    python benchmarks/train_dev_corpus.py --out /tmp/in --inner --rule-features true  # tuning split
    python benchmarks/train_dev_corpus.py --warm-start-only --rule-features true  # public only

``--inner`` trains on 80 % of the 95 training patients and scores the other 20 % (split seed 1):
the split for choosing settings, so the 36 held-out test patients are scored only once.
``--warm-start-only`` scores the public warm start (synthetic notes, no private data) that the
given options would start from, building it if it is not cached.

Prints one JSON object: token-binary precision/recall/F1 and phrase recall on the test split,
ε/δ/steps, training seconds and peak RSS. Extra ``--key value`` pairs become TrainOptions fields
(e.g. ``--train-layers 1 --lr 3e-4 --recall-weight 2``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

#: default corpus: the shared dev corpus beside the checkout (``--corpus`` to use another)
CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpora" / "physionet-deid-dev"


def _split(seed: int, corpus: Path = CORPUS, inner: bool = False, fold: int | None = None):
    """(train, test) notes: the held-out split; with ``inner`` 80/20 of its training patients
    (split seed 1); with ``fold`` 0 or 1 one half (split seed 2) of the inner split's training
    patients as the test part and every other training patient as the train part, so the inner
    split and the two folds score all training patients with models that did not see them
    (cross-fitted tuning, issue 36)."""
    from dphub import formats
    from dphub.splits import split_notes

    notes = list(formats.read(corpus, "physionet"))
    train, test = split_notes(notes, [0.8, 0.2], by="patient", seed=seed)
    if inner or fold is not None:  # tuning: the held-out test split stays unseen
        inner_train, inner_test = split_notes(train, [0.8, 0.2], by="patient", seed=1)
        if fold is None:
            return inner_train, inner_test
        test = split_notes(inner_train, [0.5, 0.5], by="patient", seed=2)[fold]
        held = {n.effective_patient_id for n in test}
        train = [n for n in train if n.effective_patient_id not in held]
    return train, test


def _score(model_dir: Path, test, thresholds: list[float | None], encoded=None) -> dict:
    from dphub.evaluate import evaluate_spans
    from dphub.tagger import Tagger

    tagger = Tagger.load(model_dir)
    t0 = time.monotonic()
    if encoded is not None and encoded.key != tagger.encoder_key:
        encoded = None
    scores = tagger.token_scores(test, batch_size=32, encoded=encoded)
    infer_s = time.monotonic() - t0
    from dphub.scores import spans_from_scores

    out: dict = {"inference_seconds": round(infer_s, 1)}
    for t in thresholds:
        pred = {n.id: spans_from_scores(ts, t) for n, ts in zip(test, scores, strict=True)}
        h = evaluate_spans(test, pred).headline()
        out["decoded" if t is None else f"t={t}"] = {k: round(v, 4) for k, v in h.items()}
    return out


def _coerce(value: str):
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(value.lower(), value)


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="model directory to write")
    ap.add_argument("--eval-only", type=Path, help="score this model directory, no training")
    ap.add_argument("--corpus", type=Path, default=CORPUS,
                    help="PhysioNet-format corpus (default: ../shared/corpora/physionet-deid-dev)")
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--thresholds", default="none,0.5,0.3,0.2,0.1")
    ap.add_argument("--no-dp", action="store_true")
    ap.add_argument("--inner", action="store_true",
                    help="train on 80 %% of the training patients, score the other 20 %%")
    ap.add_argument("--fold", type=int, choices=(0, 1), default=None,
                    help="score one half of the inner split's training patients, training on "
                         "every other training patient (cross-fitted tuning)")
    ap.add_argument("--warm-start-only", action="store_true",
                    help="score the public warm start of these options (no private data)")
    args, rest = ap.parse_known_args(argv)
    torch.set_num_threads(args.threads)
    extra = {}
    for i in range(0, len(rest), 2):
        key = rest[i].lstrip("-").replace("-", "_")
        extra[key] = _coerce(rest[i + 1])
    thresholds = [None if t == "none" else float(t) for t in args.thresholds.split(",")]

    train_notes, test_notes = _split(args.split_seed, args.corpus, args.inner, args.fold)
    report: dict = {
        "split": f"tuning fold {args.fold}" if args.fold is not None
        else "inner (80/20 of the training patients, seed 1)" if args.inner
        else "held-out test patients",
        "train_patients": len({n.patient_id for n in train_notes}),
        "train_notes": len(train_notes),
        "test_patients": len({n.patient_id for n in test_notes}),
        "test_notes": len(test_notes),
    }
    if args.eval_only:
        report["model"] = str(args.eval_only)
        report.update(_score(args.eval_only, test_notes, thresholds))
        print(json.dumps(report, indent=2))
        return 0
    if args.warm_start_only:
        from dphub.encoders import resolve_base_model
        from dphub.train import TrainOptions, warmstart

        opts = TrainOptions(**extra)
        loadable, public_id = resolve_base_model(opts.base_model)
        ws = warmstart.WarmStartConfig(max_length=opts.max_length, stride=opts.stride,
                                       rule_features=opts.rule_features)
        t0 = time.monotonic()
        wdir = warmstart.warm_start(Path(loadable), public_id, opts.label_schema, opts.head, ws,
                                    seed=opts.seed)
        report["warm_start_seconds"] = round(time.monotonic() - t0, 1)
        report["model"] = "public warm start " + wdir.name
        report["options"] = {k: str(v) for k, v in extra.items()}
        if opts.rule_features:  # the plain warm start it was built on, one shared encoder pass
            from dataclasses import replace

            from dphub.tagger import Tagger

            plain = warmstart.warm_start(Path(loadable), public_id, opts.label_schema, opts.head,
                                         replace(ws, rule_features=False), seed=opts.seed)
            encoded = Tagger.load(plain).encode(test_notes, batch_size=32)
            report["plain_warm_start"] = _score(plain, test_notes, thresholds, encoded)
            report.update(_score(wdir, test_notes, thresholds, encoded))
        else:
            report.update(_score(wdir, test_notes, thresholds))
        print(json.dumps(report, indent=2))
        return 0

    from dphub import formats
    from dphub import train as T

    with tempfile.TemporaryDirectory(prefix="dphub-dev-") as tmp:
        os.chmod(tmp, 0o700)
        data = Path(tmp) / "train.jsonl"
        formats.write(train_notes, data, "jsonl")
        opts = T.TrainOptions(data=data, out=args.out, no_dp=args.no_dp, force=True, **extra)
        last = [0.0]

        def progress(p: T.Progress) -> None:  # numbers only, to stderr
            now = time.monotonic()
            if now - last[0] > 20 or p.step == p.total_steps:
                last[0] = now
                eps = f" eps={p.epsilon:.2f}" if p.epsilon is not None else ""
                loss = f" loss={p.loss:.2f}" if p.loss is not None else ""
                print(f"[{p.phase}] {p.step}/{p.total_steps}{loss}{eps}", file=sys.stderr,
                      flush=True)

        t0 = time.monotonic()
        res = T.train(opts, on_progress=progress)
        report["train_seconds"] = round(time.monotonic() - t0, 1)
    report.update({
        "epsilon": res.epsilon, "delta": res.delta, "steps": res.steps,
        "noise_multiplier": res.noise_multiplier, "sample_rate": res.sample_rate,
        "num_units": res.num_units, "options": {k: str(v) for k, v in extra.items()},
    })
    report.update(_score(args.out, test_notes, thresholds))
    report["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
