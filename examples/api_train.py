"""Stage 1 with the Python API: train a DP PHI tagger on labelled notes (what `dphub train` does).

Usage::

    python examples/api_train.py [--out DIR] [--base-model PATH] [--notes 24] [--epochs 1]
        [--warm-start none|synth]

The defaults are tiny (synthetic nursing notes, one epoch, no warm start) so the example runs in
under a minute on a laptop CPU; a real model wants hundreds of patients, a few epochs and the
public warm start (``--warm-start synth``, cached after its first run). The model directory holds
safetensors weights, the public tokenizer files and the model card with the DP guarantee.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="Model directory (default: a temp dir).")
    p.add_argument("--base-model", default=None, help="Base encoder dir (default: embedded).")
    p.add_argument("--notes", type=int, default=24, help="Synthetic notes to train on.")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--warm-start", choices=("none", "synth"), default="none")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from dphub import formats, synth
    from dphub.card import dp_summary
    from dphub.hub.validate import validate_card
    from dphub.privacy.statement import privacy_statement
    from dphub.train import Progress, TrainOptions, train

    work = Path(tempfile.mkdtemp(prefix="dphub-api-train-"))
    out = args.out or work / "model"

    # 1. labelled notes with patient ids, in any format dphub reads (here: synthetic JSONL)
    notes = synth.generate(args.notes, kind="nursing", seed=0, patients=max(2, args.notes // 3))
    data = work / "train.jsonl"
    formats.write(notes, data, "jsonl")

    # 2. DP-SGD at patient level: every patient's notes are sampled, clipped and noised together
    opts = TrainOptions(
        data=data,
        out=out,
        base_model=args.base_model,   # None: the embedded all-MiniLM-L6-v2
        target_epsilon=8.0,           # σ is chosen so that ε(patient) <= 8 at δ = min(1e-5, 1/10N)
        privacy_unit="patient",
        epochs=args.epochs,
        batch_size=4,                 # expected patients per step (Poisson sampling)
        warm_start=args.warm_start,
    )

    def progress(pr: Progress) -> None:  # numbers only: progress never carries note text
        print(f"  {pr.phase} step {pr.step}/{pr.total_steps}", file=sys.stderr)

    result = train(opts, on_progress=progress)
    print(f"trained {result.out_dir}: {result.steps} steps, σ = {result.noise_multiplier:.3g}, "
          f"q = {result.sample_rate:.3g}, ε = {result.epsilon:.2f}, δ = {result.delta:g}")

    # 3. the card carries the guarantee; validate_card recomputes ε from (q, σ, steps, δ)
    card = validate_card(out, require_private=True)
    summary = dp_summary(card)
    print(f"card: ε = {summary['epsilon']:.3f}, unit = {summary['unit']}, patients = "
          f"{summary['patients']}, notes = {summary['notes']}")
    print(privacy_statement(card.dp, markdown=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
