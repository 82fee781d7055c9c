"""Stage 3 with the Python API: ensemble models and rules, de-identify, evaluate, calibrate.

Usage::

    python examples/api_ensemble.py [--model DIR ...] [--owner-model DIR] [--base-model PATH]

These are the calls behind `dphub ensemble add / deid / evaluate / calibrate`. Without
``--model`` a tiny DP model is trained first (``api_train.py``). Members are combined on
characters under the ``any`` rule (a character is PHI if any member flags it); ``rules:default``
adds a pattern/dictionary member that needs no training data (ε = 0).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, action="append", default=[],
                   help="Model directory (repeatable); default: train a tiny one.")
    p.add_argument("--owner-model", type=Path, default=None,
                   help="The owner's own model, added for this run only (Scenario B).")
    p.add_argument("--base-model", default=None, help="Base encoder dir for the tiny model.")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="dphub-api-ensemble-"))
    models = list(args.model)
    if not models:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import api_train

        models = [work / "model"]
        api_train.main(["--out", str(models[0])]
                       + (["--base-model", args.base_model] if args.base_model else []))

    import torch

    torch.set_num_threads(1)
    from dphub import formats, synth
    from dphub.ensemble.calibrate import calibrate
    from dphub.ensemble.core import build_ensemble
    from dphub.ensemble.evaluation import evaluate_ensemble
    from dphub.ensemble.manifest import Manifest, entry_from_spec
    from dphub.render import render
    from dphub.runner import run_deid

    # 1. the manifest pins every member (registry sha, or the weights' sha256 for a directory)
    manifest = Manifest()
    for m in models:
        manifest.add(entry_from_spec(str(m)))
    manifest.add(entry_from_spec("rules:default"))
    manifest_path = manifest.save(work / "dphub-ensemble.toml")
    for e in manifest.members:
        print(f"member {e.name}: kind {e.kind}, ε = {e.epsilon}, unit = {e.unit}")

    # 2. load it (pins verified) as an ensemble, plus the owner's model if given
    ensemble = build_ensemble(Manifest.load(manifest_path), owner_model=args.owner_model)

    # 3. de-identify notes in memory: merged spans per note, then a renderer
    notes = synth.generate(6, kind="nursing", seed=7)
    results = ensemble.deid(notes)
    first = results[0]
    print(f"{notes[0].id}: {len(first.merged)} merged spans; votes per member: "
          + ", ".join(f"{k} {len(v)}" for k, v in first.by_member.items()))
    tagged = render(notes[0], first.spans, "tag")
    print("synthetic note, tagged (first 160 characters):", tagged[:160].replace("\n", " "))

    # 4. or a whole corpus, resumably, into a directory (what `dphub ensemble deid` does)
    corpus = work / "owner-notes.jsonl"
    formats.write(notes, corpus, "jsonl")
    report = run_deid(corpus, work / "deid", ensemble, mode="redact")
    print(f"run_deid: {report.done} notes into {work / 'deid'} (audit.jsonl beside them)")

    # 5. evaluate each member and the union on labelled notes (synthetic notes carry gold spans)
    for row in evaluate_ensemble(ensemble, notes):
        eps = "-" if row["epsilon"] is None else f"{row['epsilon']:.2f}"
        print(f"  {row['name']:<28} P {100 * row['precision']:5.1f}  R {100 * row['recall']:5.1f}"
              f"  F1 {100 * row['f1']:5.1f}  ε {eps}")

    # 6. with owner labels: per-member thresholds for a target ensemble recall
    owner_labelled = synth.generate(6, kind="nursing", seed=8)
    cal = calibrate(ensemble, owner_labelled, target_recall=0.95)
    print(f"calibrated thresholds {cal.thresholds}: recall {cal.recall:.3f}, precision "
          f"{cal.precision:.3f} on the calibration notes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
