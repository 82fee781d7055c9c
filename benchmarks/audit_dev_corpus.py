"""Empirical privacy audit on the PhysioNet dev corpus: the default recipe at ε 8 and without DP.

Usage (from the repository root; real notes stay on this machine and are never printed)::

    python benchmarks/audit_dev_corpus.py --out /tmp/dev-audit            # both runs
    python benchmarks/audit_dev_corpus.py --out /tmp/dev-audit --only dp  # one of them
    python benchmarks/audit_dev_corpus.py --out /tmp/dev-audit --canaries 32 --epochs 16

Trains on the same patient-disjoint 80 % split as ``benchmarks/train_dev_corpus.py`` (seed 0),
with the black-box audit's defaults (64 canary patients, 2 notes each, 15 alternative secrets) and
``dphub train``'s default recipe, once at ``--target-epsilon 8`` and once with ``--no-dp``, and
prints one JSON object: per run the ε lower bound and its guesses, the ceiling, the proven ε, the
exposure summary, the detection limit (``empirical_audit.detection``), and the seconds spent training and auditing (the overhead over ``dphub train``).
``--method gradient`` runs the white-box gradient-canary audit (``dphub audit``'s default) on the
DP run only. Equivalent commands, for docs/privacy.md::

    dphub audit train.jsonl --out DIR/dp --target-epsilon 8 --method patients
    dphub audit train.jsonl --out DIR/nodp --no-dp --method patients
    dphub audit train.jsonl --out DIR/dp --target-epsilon 8            # gradient canaries

Expect about the training time of ``train_dev_corpus.py`` (≈ 20 min per run on 2 loaded cores)
plus the audit's scoring. Extra ``--key value`` pairs become TrainOptions fields.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_dev_corpus import CORPUS, _coerce, _split  # noqa: E402


def _progress(name: str):
    """A progress callback printing numbers only (never text) to stderr, every 30 s."""
    from dphub import train as T

    last = [0.0]

    def show(p: T.Progress) -> None:
        now = time.monotonic()
        if now - last[0] > 30 or p.step == p.total_steps:
            last[0] = now
            print(f"[{name} {p.phase}] {p.step}/{p.total_steps}", file=sys.stderr, flush=True)

    return show


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for the two model dirs")
    ap.add_argument("--corpus", type=Path, default=CORPUS,
                    help="PhysioNet-format corpus (default: ../shared/corpora/physionet-deid-dev)")
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=("dp", "nodp"), help="run one of the two audits")
    ap.add_argument("--target-epsilon", type=float, default=8.0)
    ap.add_argument("--method", choices=("patients", "gradient"), default="patients",
                    help="patients: black-box canary patients (the numbers in docs/privacy.md's "
                    "dev-corpus table); gradient: white-box gradient canaries (dp run only)")
    ap.add_argument("--canaries", type=int, default=None,
                    help="default: 64 canary patients; gradient: the ceiling-maximising count")
    ap.add_argument("--canary-notes", type=int, default=2)
    ap.add_argument("--candidates", type=int, default=15)
    ap.add_argument("--confidence", type=float, default=0.95)
    args, rest = ap.parse_known_args(argv)
    torch.set_num_threads(args.threads)
    extra = {}
    for i in range(0, len(rest), 2):
        key = rest[i].lstrip("-").replace("-", "_")
        # "none" is a value of --warm-start, not a null
        extra[key] = rest[i + 1] if key == "warm_start" else _coerce(rest[i + 1])

    from dphub import audit as A
    from dphub import formats
    from dphub import train as T

    train_notes, _ = _split(args.split_seed, args.corpus)
    report: dict = {"train_patients": len({n.patient_id for n in train_notes}),
                    "train_notes": len(train_notes), "runs": {}}
    aopts = A.AuditOptions(canaries=args.canaries, notes_per_canary=args.canary_notes,
                           candidates=args.candidates, confidence=args.confidence,
                           method=args.method)
    # gradient canaries audit the DP noise step: a --no-dp run has none
    runs = [args.only] if args.only else ["dp"] if args.method == "gradient" else ["dp", "nodp"]
    with tempfile.TemporaryDirectory(prefix="dphub-audit-dev-") as tmp:
        os.chmod(tmp, 0o700)
        data = Path(tmp) / "train.jsonl"
        formats.write(train_notes, data, "jsonl")
        for name in runs:
            kw = dict(extra)
            if name == "dp":
                kw.setdefault("target_epsilon", args.target_epsilon)
            opts = T.TrainOptions(data=data, out=args.out / name, no_dp=name == "nodp",
                                  force=True, **kw)
            progress = _progress(name)
            try:
                res = A.run_audit(opts, aopts, on_progress=progress)
            except A.AuditFailed as e:
                report["runs"][name] = {"verdict": "failed", "block": e.block}
                continue
            report["runs"][name] = {
                "verdict": res.verdict,
                "epsilon_lower_bound": res.epsilon_lower_bound,
                "proven_epsilon": res.block["proven_epsilon"],
                "guesses": res.block["guesses"], "correct": res.block["correct"],
                "max_possible_bound": res.block["max_possible_bound"],
                "verdict_reason": res.block.get("verdict_reason"),
                "exposure": res.block.get("exposure"),
                "detection": res.block.get("detection"),
                "attack_works": res.attack_works if res.verdict == "not-private" else None,
                "seconds": res.seconds, "steps": res.train.steps,
            }
    report["options"] = {k: str(v) for k, v in extra.items()}
    report["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
