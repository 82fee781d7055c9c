"""Token precision/recall of one model per encoder runtime (torch fp32, onnx, onnx-int8).

Usage (from the repository root; nothing prints note text)::

    python benchmarks/runtime_accuracy.py --model models/dp8            # held-out test
    python benchmarks/runtime_accuracy.py --model models/dp8 --inner    # tuning split

The dev corpus is split by patient as ``benchmarks/train_dev_corpus.py`` does
(``split_notes(notes, [0.8, 0.2], by="patient", seed=0)``): the default scores the 36 held-out
test patients; ``--inner`` scores the inner validation part of the 95 training patients
(``split_notes(train, [0.8, 0.2], by="patient", seed=1)``), the split on which runtime choices
(int8 recipe, stride) are made. Decoded (Viterbi) tags and ``--thresholds`` on the CRF marginals
are scored token-binary; each runtime's row shows its change against torch fp32 in points.
``--stride N`` overrides the model's window overlap (word pieces) for every runtime.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    import torch
    from train_dev_corpus import CORPUS, _split

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--inner", action="store_true", help="score the inner validation split")
    ap.add_argument("--runtimes", default="torch,onnx,onnx-int8")
    ap.add_argument("--thresholds", default="none,0.5,0.3")
    ap.add_argument("--stride", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--int8-exclude", default="",
                    help="comma-separated node-name substrings kept fp32 in the int8 graph "
                         "(an int8 recipe to try; use its own DPHUB_CACHE_DIR)")
    ap.add_argument("--int8-per-tensor", action="store_true",
                    help="per-tensor int8 weight scales (an int8 recipe to try)")
    args = ap.parse_args(argv)
    from dphub import runtime

    if args.int8_exclude or args.int8_per_tensor:
        runtime.INT8_RECIPE = {**runtime.INT8_RECIPE,
                               "exclude": [x for x in args.int8_exclude.split(",") if x],
                               "per_channel": not args.int8_per_tensor}
    torch.set_num_threads(args.threads)
    from dphub.evaluate import evaluate_spans
    from dphub.scores import spans_from_scores
    from dphub.splits import split_notes
    from dphub.tagger import Tagger

    train, test = _split(0, args.corpus)
    notes = split_notes(train, [0.8, 0.2], by="patient", seed=1)[1] if args.inner else test
    thresholds = [None if t == "none" else float(t) for t in args.thresholds.split(",")]
    rows: dict[str, dict] = {}
    for rt in args.runtimes.split(","):
        tagger = Tagger.load(args.model)
        if args.stride is not None:
            tagger.model.stride = args.stride
        tagger.use_runtime(rt, threads=args.threads)
        t0 = time.process_time()
        scores = tagger.token_scores(notes, batch_size=32)
        row: dict = {"cpu_s": round(time.process_time() - t0, 1)}
        for t in thresholds:
            pred = {n.id: spans_from_scores(ts, t) for n, ts in zip(notes, scores, strict=True)}
            h = evaluate_spans(notes, pred).headline()
            row["decoded" if t is None else f"t={t}"] = {
                k: round(h[k], 4) for k in ("precision", "recall", "f1", "phrase_recall_any")}
        rows[rt] = row
    ref = rows.get("torch")
    if ref:
        for row in rows.values():
            for k, v in row.items():
                if isinstance(v, dict) and k in ref:
                    v["recall_delta_points"] = round(100 * (v["recall"] - ref[k]["recall"]), 2)
    print(json.dumps({"split": "inner" if args.inner else "test", "notes": len(notes),
                      "stride": args.stride, "int8_recipe": runtime.INT8_RECIPE,
                      "runtimes": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
