"""Throughput of the Ray engine on synthetic notes: notes/s per worker and in total, driver memory.

Usage::

    python benchmarks/ray_deid.py --notes 10000 --workers 2 --threads 1 [--model DIR ...]
        [--no-rules | --rules-only] [--address HOST:PORT] [--compare-local] [--keep DIR]

Generates ``--notes`` synthetic nursing notes (:mod:`dphub.synth`, public data, no PHI) into a
JSONL file, builds an ensemble of the ``--model`` taggers (default: one untrained tagger on the
embedded all-MiniLM-L6-v2 base, which costs exactly what a trained one costs) plus
``rules:default``, and runs ``run_deid`` with the Ray engine (a local runtime unless
``--address``). It prints:

* wall time and notes/s including Ray start-up and model loading, and notes/s from the first
  written batch to the end (steady state), in total and per worker;
* the driver's peak RSS (``getrusage``; the Ray actors are other processes and hold one copy of the
  ensemble each).

``--compare-local`` also runs the single-process engine on the same notes and checks that both
output directories hold the same bytes. Nothing prints note text.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path


def _tree(root: Path) -> dict[str, bytes]:
    from dphub.runner import RUN_DIR

    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and RUN_DIR not in p.parts}


def _timed_run(src: Path, out: Path, ensemble: object, engine: object, batch_size: int
               ) -> tuple[float, float | None, int]:
    """(wall s, s from the first finished batch to the end, notes done)."""
    from dphub.runner import run_deid

    first: list[float] = []

    def progress(done: int, total: int) -> None:
        if not first and done:
            first.append(time.perf_counter())
            first.append(done)

    t0 = time.perf_counter()
    rep = run_deid(src, out, ensemble, mode="tag", batch_size=batch_size, engine=engine,
                   progress=progress)
    t1 = time.perf_counter()
    if rep.exit_code:
        sys.exit(f"error: {len(rep.failed)} note(s) failed")
    steady = None
    if first and rep.done > first[1]:
        steady = (rep.done - first[1]) / max(t1 - first[0], 1e-9)
    return t1 - t0, steady, rep.done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--notes", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=2, help="Ray actors")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per actor")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--model", action="append", type=Path, default=None)
    ap.add_argument("--no-rules", action="store_true")
    ap.add_argument("--rules-only", action="store_true", help="no model member (Ray overhead)")
    ap.add_argument("--address", default=None)
    ap.add_argument("--compare-local", action="store_true")
    ap.add_argument("--keep", type=Path, default=None, help="work directory to keep")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from dphub.ensemble.manifest import Manifest, entry_from_spec
    from dphub.ray_engine import RayOptions, ray_engine, recipe_from_manifest
    from dphub.synth import iter_notes

    work = args.keep or Path(tempfile.mkdtemp(prefix="ray-deid-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "notes.jsonl"
    t0 = time.perf_counter()
    with open(src, "w", encoding="utf-8") as fh:
        for n in iter_notes(args.notes, kind="nursing", seed=0):
            fh.write(json.dumps({"id": n.id, "text": n.text, "patient_id": n.patient_id}) + "\n")
    chars = src.stat().st_size
    print(f"generated {args.notes} synthetic notes ({chars / 1e6:.1f} MB JSONL) in "
          f"{time.perf_counter() - t0:.1f}s")

    models = [] if args.rules_only else args.model
    if models is None:
        from dphub.tagger import TaggerModel

        untrained = work / "minilm-untrained"
        if not untrained.exists():
            TaggerModel.from_base(None).save(untrained)
        models = [untrained]
    entries = [entry_from_spec(str(m), name=f"m{i}") for i, m in enumerate(models)]
    if not args.no_rules:
        entries.append(entry_from_spec("rules:default"))
    manifest = Manifest(entries)
    recipe = recipe_from_manifest(manifest, owner_model=None, aggregate_rule=None,
                                  batch_size=args.batch_size, int8=False)
    ensemble = recipe.build()
    members = ", ".join(e.name for e in entries)

    engine = ray_engine(recipe, RayOptions(address=args.address, workers=args.workers,
                                           threads=args.threads))
    out_ray = work / "out-ray"
    shutil.rmtree(out_ray, ignore_errors=True)
    wall, steady, done = _timed_run(src, out_ray, ensemble, engine, args.batch_size)
    total = done / wall
    print(f"ray engine: {done} notes, members [{members}], {args.workers} worker(s) x "
          f"{args.threads} thread(s), batch {args.batch_size}")
    print(f"  wall {wall:.1f}s (Ray start-up and model loading included): {total:.2f} notes/s "
          f"total, {total / args.workers:.2f} notes/s per worker")
    if steady is not None:
        print(f"  steady state (first batch written -> end): {steady:.2f} notes/s total, "
              f"{steady / args.workers:.2f} notes/s per worker")
    print(f"  driver peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")

    if args.compare_local:
        import torch

        torch.set_num_threads(args.threads * args.workers)
        out_local = work / "out-local"
        shutil.rmtree(out_local, ignore_errors=True)
        lwall, lsteady, ldone = _timed_run(src, out_local, ensemble, None, args.batch_size)
        print(f"single process ({args.threads * args.workers} threads): wall {lwall:.1f}s, "
              f"{ldone / lwall:.2f} notes/s")
        same = _tree(out_ray) == _tree(out_local)
        print(f"  outputs byte-identical to the Ray run: {same}")
        if not same:
            sys.exit(1)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
