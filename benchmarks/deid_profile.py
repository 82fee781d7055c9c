"""Where a de-identification run's time goes: encoder, rule scans, heads, Viterbi, the rest.

Usage::

    python benchmarks/deid_profile.py --notes ../shared/corpora/physionet-deid-dev --limit 200 \\
        --model DIR [--models 3] [--rules] [--runtime torch-bf16] [--threads 2]
    python benchmarks/deid_profile.py --notes synth:200 --rules --aggregate inverse [--model DIR]

``--notes synth:N``: N synthetic discharge summaries (``realistic-discharge``, seed 55; no real
data); ``--model`` may then be left out (the rules and the aggregation rule alone).
``--aggregate inverse`` profiles the recall-first rule: its stages (word table, name signs,
measurements, released shapes, word normalisation) are listed as well (issue 55).

Runs one ensemble (``--models`` copies of ``--model`` sharing its encoder, plus ``rules:default``
as the manifest gives it with ``--rules``) over the notes in batches of 16 under ``cProfile``,
after one warm-up batch, and prints the wall time and the cumulative seconds and share of each
stage. Shares are of the profiled time (cProfile adds a little overhead to Python-heavy stages).
Run it on an otherwise idle machine: a second multi-threaded process on the same cores makes the
many small tensor operations of the Viterbi loop wait on each other and distorts every share.
Prints figures only, never note text.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path

#: (stage, module path suffix, function name) as cProfile names them; cumulative times
STAGES: tuple[tuple[str, str, str], ...] = (
    ("encoder forward (transformers)", "models/bert/modeling_bert.py", "forward"),
    ("rule features (rule scan)", "dphub/rule_features.py", "notes_features"),
    ("rule member (tag)", "dphub/rules/engine.py", "tag"),
    ("heads (emissions)", "dphub/tagger_model.py", "head_emissions"),
    ("Viterbi (pytorch-crf)", "torchcrf/__init__.py", "_viterbi_decode"),
    ("aggregation", "dphub/ensemble/aggregate.py", "aggregate"),
    ("whole-word snapping", "dphub/ensemble/words.py", "snap_to_words"),
    ("inverse rule (all)", "dphub/ensemble/inverse.py", "inverse_aggregate"),
    ("  its word table", "dphub/ensemble/inverse.py", "word_table"),
    ("  name signs", "dphub/ensemble/inverse.py", "_signs"),
    ("  measurements", "dphub/ensemble/measures.py", "measurement_ranges"),
    ("  released shapes", "dphub/ensemble/releases.py", "shape_released"),
    ("  word normalisation", "dphub/safe_vocab.py", "normalize_word"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--notes", type=Path, required=True,
                    help="PhysioNet-format dir, a directory of .txt, or any dphub input file")
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--aggregate", default="any", help="the rule, e.g. inverse")
    ap.add_argument("--models", type=int, default=1, help="members on the model's encoder")
    ap.add_argument("--rules", action="store_true", help="add rules:default")
    ap.add_argument("--runtime", default="torch")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from dphub import formats
    from dphub.ensemble.core import Ensemble, Slot, apply_runtime, member_from_entry
    from dphub.ensemble.manifest import MemberEntry
    from dphub.ensemble.members import ModelMember

    if str(args.notes).startswith("synth:"):
        from dphub.synth import generate

        notes = generate(int(str(args.notes)[6:]), kind="realistic-discharge", seed=55)
    else:
        fmt = "physionet" if args.notes.is_dir() and any(args.notes.glob("*.text")) else None
        notes = list(formats.read(args.notes, format=fmt))[: args.limit]
    slots = [Slot(ModelMember.load(args.model, f"model{i}", batch_size=32))
             for i in range(args.models if args.model is not None else 0)]
    if args.rules:
        slots.append(member_from_entry(MemberEntry("rules:default", "rules")))
    ens = Ensemble(slots, args.aggregate)
    apply_runtime(ens, args.runtime)
    ens.deid(notes[:16])  # warm-up: kernels, caches
    c0, t0 = time.process_time(), time.perf_counter()  # first without the profiler
    for i in range(0, len(notes), 16):
        ens.deid(notes[i : i + 16])
    print(f"unprofiled: wall {time.perf_counter() - t0:.2f} s, CPU {time.process_time() - c0:.2f} s "
          f"({1000 * (time.process_time() - c0) / len(notes):.1f} CPU-ms/note)")
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for i in range(0, len(notes), 16):
        ens.deid(notes[i : i + 16])
    prof.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    total = sum(tt for (_, _, _), (_, _, tt, _, _) in stats.items())
    print(f"{len(notes)} notes, {len(slots) - args.rules} model(s)"
          f"{' + rules' if args.rules else ''}, rule {args.aggregate}, "
          f"runtime {args.runtime}, {args.threads} thread(s): wall {wall:.2f} s "
          f"({len(notes) / wall:.1f} notes/s; profiled {total:.2f} s)")
    print(f"| {'stage':<32} | {'seconds':>8} | {'share':>6} |")
    print(f"|{'-' * 34}|{'-' * 10}|{'-' * 8}|")
    for label, path, func in STAGES:
        # the outermost call of each stage: the largest cumulative time among its entries
        cum = max((ct for (f, _, fn), (_, _, _, ct, _) in stats.items()
                   if f.endswith(path) and fn == func), default=0.0)
        print(f"| {label:<32} | {cum:8.2f} | {100 * cum / total:5.1f}% |")


if __name__ == "__main__":
    main()
