"""Transfer of public pretraining: a tagger trained on synthetic notes only, scored on real notes.

Usage (from the repository root; real notes are only read for scoring, nothing prints text)::

    # choose settings on the inner split of the 95 training patients (never the test patients)
    python benchmarks/pretrain_public.py --out /tmp/pt-a --notes 2000 --epochs 2 --eval inner
    # then report the chosen setting once on the 36 held-out test patients
    python benchmarks/pretrain_public.py --eval-only /tmp/pt-a --eval test

Trains with :func:`dphub.train.pretrain.pretrain` (what ``dphub pretrain`` runs: public
synthetic notes, no DP, no private data) and prints one JSON object: token-binary P/R/F1 and
phrase recall at the decoded output and a few thresholds, training and inference seconds.
``--eval inner`` scores the inner 20 % of the 95 training patients
(``split_notes(train, [0.8, 0.2], by="patient", seed=1)``); ``--eval test`` the 36 test patients.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_dev_corpus import CORPUS, _score, _split  # noqa: E402


def _eval_notes(which: str, corpus: Path) -> list:
    from dphub.splits import split_notes

    train, test = _split(0, corpus)
    if which == "test":
        return test
    _, inner = split_notes(train, [0.8, 0.2], by="patient", seed=1)
    return inner


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="model directory to write (pretraining)")
    ap.add_argument("--eval-only", type=Path, help="score this model directory, no training")
    ap.add_argument("--eval", choices=("inner", "test", "none"), default="inner")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--notes", type=int, default=None, help="synthetic notes (default: library)")
    ap.add_argument("--epochs", type=float, default=None)
    ap.add_argument("--train-layers", default=None, help="K or all")
    ap.add_argument("--discharge-share", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--thresholds", default="none,0.5,0.3")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    thresholds = [None if t == "none" else float(t) for t in args.thresholds.split(",")]
    report: dict = {}
    model_dir = args.eval_only
    if model_dir is None:
        from dphub.train.pretrain import PretrainConfig, pretrain

        cfg = PretrainConfig.from_options(notes=args.notes, epochs=args.epochs,
                                          train_layers=args.train_layers,
                                          discharge_share=args.discharge_share)
        last = [0.0]

        def progress(p) -> None:  # numbers only, to stderr
            now = time.monotonic()
            if now - last[0] > 30 or p.step == p.total_steps:
                last[0] = now
                loss = f" loss={p.loss:.3f}" if p.loss is not None else ""
                print(f"[{p.phase}] {p.step}/{p.total_steps}{loss}", file=sys.stderr, flush=True)

        t0 = time.monotonic()
        pretrain(args.out, cfg, seed=args.seed, force=True, on_progress=progress)
        report["train_seconds"] = round(time.monotonic() - t0, 1)
        report["config"] = cfg.card_block(seed=args.seed)
        model_dir = args.out
    report["model"] = str(model_dir)
    if args.eval != "none":
        notes = _eval_notes(args.eval, args.corpus)
        report["eval"] = args.eval
        report["eval_patients"] = len({n.patient_id for n in notes})
        report["eval_notes"] = len(notes)
        report.update(_score(model_dir, notes, thresholds))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
