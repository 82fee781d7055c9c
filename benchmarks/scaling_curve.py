"""Scaling curve: the default DP recipe at patient-level ε 8 trained on 12, 25, 50 and 95 patients.

Usage (from the repository root; real data stays on this machine, nothing prints note text)::

    python benchmarks/scaling_curve.py --work /tmp/scaling [--sizes 12,25,50,95] \
        [--target-epsilon 8] [--repeats 2] [--plot docs/scaling.png]

The dev corpus is split 80/20 by patient (seed 0, as ``train_dev_corpus.py``); each size draws
that many patients from the 80 % (``--repeats`` seeded draws below the full size), trains the
default ``dphub train`` recipe at the target ε, and scores token-binary P/R/F1 on the same 36
held-out patients. Trained models are reused when their directory exists (resumable).

The fit: the error ``1 - F1`` (and ``1 - R``) against the number of patients n as a power law,
``log(1 - F1) = a - b·log n`` (least squares over every run); the prediction for 1,000 and
10,000 patients is printed with a jackknife range (the fit redone leaving out one size at a
time), which says how much the extrapolation rests on any single point. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_dev_corpus import CORPUS, _coerce, _score, _split  # noqa: E402

PREDICT_AT = (1000, 10000)


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares line through (log n, log(1 - score)); returns (a, b) of a - b·log n."""
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(max(1e-6, 1.0 - s)) for _, s in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - slope * mx, -slope


def _predict(a: float, b: float, n: int) -> float:
    return 1.0 - math.exp(a - b * math.log(n))


def fit_report(points: list[tuple[int, float]]) -> dict:
    """Fit, predictions at :data:`PREDICT_AT`, and the jackknife range over sizes."""
    a, b = _fit(points)
    sizes = sorted({n for n, _ in points})
    out: dict = {"a": round(a, 4), "b": round(b, 4)}
    for n in PREDICT_AT:
        est = _predict(a, b, n)
        loo = []
        for leave in sizes:
            rest = [p for p in points if p[0] != leave]
            if len({m for m, _ in rest}) >= 2:
                loo.append(_predict(*_fit(rest), n))
        out[str(n)] = {"estimate": round(est, 4),
                       "jackknife_min": round(min(loo), 4) if loo else None,
                       "jackknife_max": round(max(loo), 4) if loo else None}
    return out


def _plot(rows: list[dict], fits: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dphub.io import atomic_open

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    grid = [10 ** (1 + 3 * i / 60) for i in range(61)]
    for key, label, color in (("f1", "token F1", "tab:blue"), ("recall", "token recall",
                                                                "tab:orange")):
        ax.plot([r["patients"] for r in rows], [100 * r[key] for r in rows], "o", color=color,
                label=f"{label} (ε 8, held-out patients)")
        a, b = fits[key]["a"], fits[key]["b"]
        ax.plot(grid, [100 * _predict(a, b, int(n)) for n in grid], "--", color=color,
                alpha=0.6, label=f"{label}: fit 1 − {label.split()[-1]} ∝ n^({-b:+.2f})")
    ax.set_xscale("log")
    ax.set_xlabel("training patients (patient-level ε 8)")
    ax.set_ylabel("% on 36 held-out patients")
    ax.set_title("Default DP recipe: utility against number of patients")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    with atomic_open(path, "wb", encoding=None) as fh:
        fig.savefig(fh, format="png")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="directory for the model dirs")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--sizes", default="12,25,50,95")
    ap.add_argument("--repeats", type=int, default=2,
                    help="seeded patient draws per size below the full training split")
    ap.add_argument("--target-epsilon", type=float, default=8.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plot", type=Path, default=None, help="write the plot here (PNG)")
    args, rest = ap.parse_known_args(argv)
    torch.set_num_threads(args.threads)
    extra = {rest[i].lstrip("-").replace("-", "_"): _coerce(rest[i + 1])
             for i in range(0, len(rest), 2)}
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    from dphub import formats
    from dphub import train as T

    train_notes, test_notes = _split(0, args.corpus)
    patients = sorted({n.patient_id for n in train_notes})
    args.work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for size in sizes:
        size = min(size, len(patients))
        draws = 1 if size == len(patients) else args.repeats
        for rep in range(draws):
            keep = set(random.Random(1000 * size + rep).sample(patients, size))
            part = [n for n in train_notes if n.patient_id in keep]
            out = args.work / f"n{size}-r{rep}"
            t0 = time.monotonic()
            res = None
            if not (out / "model.safetensors").is_file():
                with tempfile.TemporaryDirectory(prefix="dphub-scaling-") as tmp:
                    os.chmod(tmp, 0o700)
                    data = Path(tmp) / "train.jsonl"
                    formats.write(part, data, "jsonl")
                    opts = T.TrainOptions(data=data, out=out, force=True,
                                          target_epsilon=args.target_epsilon, **extra)
                    res = T.train(opts)
            secs = round(time.monotonic() - t0, 1)
            head = _score(out, test_notes, [None])["decoded"]
            row = {"patients": size, "draw": rep, "notes": len(part), "train_seconds": secs,
                   "epsilon": None if res is None else round(res.epsilon, 3), **head}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    fits = {key: fit_report([(r["patients"], r[key]) for r in rows]) for key in ("f1", "recall")}
    report = {"test_patients": len({n.patient_id for n in test_notes}),
              "target_epsilon": args.target_epsilon, "options": {k: str(v) for k, v in
                                                                 extra.items()},
              "rows": rows, "fit": fits}
    if args.plot:
        _plot(rows, fits, args.plot)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
