"""What a note costs through the Python API against the CLI's batch path (issue 56; seconds).

Usage (from the repository root)::

    python benchmarks/api_overhead.py                          # rules:default, 400 notes
    python benchmarks/api_overhead.py --member models/x --notes 200 --repeats 3

On synthetic notes (:mod:`dphub.synth`, nothing private): the load time of
:func:`dphub.load`, the time per note of :meth:`Deidentifier.deid` over a list (batches of 16)
and of one call per string, and the time per note of a directory run
(:func:`dphub.runner.run_deid` in this process, ``--mode tag``, JSONL input, the ensemble built
once) on the same notes. Best of ``--repeats``; one thread. The API must cost what the run costs
per note (it is the run's batch path without the journal and files).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--member", action="append", default=[],
                    help="member spec (repeatable; default rules:default)")
    ap.add_argument("--notes", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    import dphub
    from dphub import synth
    from dphub.runner import run_deid

    members = args.member or ["rules:default"]
    notes = synth.generate(args.notes, seed=7)
    t0 = time.perf_counter()
    deid = dphub.load(members=members)
    load_s = time.perf_counter() - t0

    def best(fn) -> float:
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    api_batch = best(lambda: list(deid.render(notes, "tag"))) / len(notes)
    api_single = best(lambda: [deid(n).render("tag") for n in notes]) / len(notes)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.jsonl"
        src.write_text("".join(json.dumps({"id": n.id, "text": n.text}) + "\n" for n in notes),
                       encoding="utf-8")
        runs = iter(range(10**6))

        def cli_run() -> None:
            run_deid(src, Path(tmp) / f"out{next(runs)}", deid.ensemble, mode="tag",
                     batch_size=16)

        cli = best(cli_run) / len(notes)
    print(f"members: {', '.join(members)}; {len(notes)} synthetic notes; best of "
          f"{args.repeats}; 1 thread")
    print(f"dphub.load: {load_s:.2f} s")
    print(f"API deid+render, a list (batches of 16): {1000 * api_batch:.2f} ms/note")
    print(f"API one call per string:                 {1000 * api_single:.2f} ms/note")
    print(f"CLI batch path (run_deid, --mode tag):   {1000 * cli:.2f} ms/note")


if __name__ == "__main__":
    main()
