"""One huge note through ``dphub deid``: wall time and peak memory against the note's size.

Usage::

    python benchmarks/huge_note.py [--sizes-kb 64,256,1024] [--model rules:default]

Why: issue 31 #15 measured one 1 MB note at 515 s and a 50 MB note (rules only) at 10 minutes and
4.3 GiB, with no progress line until the note was done: progress is counted in notes, and a note
is the unit of work. This measures how time and peak RSS grow with the size of one note, so that
the cost of a within-note progress report and memory bound can be judged.

Each size runs ``dphub deid DIR --model MODEL --out OUT`` in a child process (its peak RSS from
``wait4``) over a directory holding one ``.txt`` note: synthetic nursing notes (``dphub.synth``,
no real data) concatenated until the size is reached. Prints one JSON line per size: bytes,
seconds, peak RSS in MiB, seconds per MB. Nothing prints note text.

Measured 2026-11-26 (rules:default, a 2-core machine shared with other jobs, ``nice``): 64 kB
2.0 s / 100 MiB; 256 kB 4.4 s / 106 MiB; 1 MB 16.1 s / 169 MiB; 4 MB 58.1 s / 416 MiB. Time is
linear (≈ 15 s per MB) and memory grows ≈ 80 MiB per MB of one note (the ensemble's own peak,
``tracemalloc``: ≈ 68 MiB for 1 MB): a 50 MB note needs ≈ 4 GiB and ≈ 12 minutes, as the
campaign found. No progress is shown inside a note.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _note_of(size: int) -> str:
    from dphub.synth import iter_notes

    parts: list[str] = []
    total = 0
    seed = 0
    while total < size:
        for note in iter_notes(50, seed=seed):
            parts.append(note.text)
            total += len(note.text.encode("utf-8")) + 1
            if total >= size:
                break
        seed += 1
    return "\n".join(parts)


def _run(size: int, model: str, work: Path) -> dict[str, float]:
    src = work / f"in-{size}"
    src.mkdir()
    (src / "note.txt").write_text(_note_of(size), encoding="utf-8")
    out = work / f"out-{size}"
    cmd = [sys.executable, "-m", "dphub.cli.main", "deid", str(src), "--model", model,
           "--out", str(out)]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"dphub deid failed for size {size} (exit "
                         f"{os.waitstatus_to_exitcode(status)})")
    nbytes = (src / "note.txt").stat().st_size
    rss_mib = usage.ru_maxrss / 1024  # kB on Linux
    return {"bytes": nbytes, "seconds": round(seconds, 2), "peak_rss_mib": round(rss_mib, 1),
            "seconds_per_mb": round(seconds / (nbytes / 1e6), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes-kb", default="64,256,1024",
                    help="comma-separated note sizes in kB (1000 bytes)")
    ap.add_argument("--model", default="rules:default", help="what `dphub deid --model` takes")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dphub-huge-note-") as tmp:
        for kb in (int(x) for x in args.sizes_kb.split(",")):
            row = _run(kb * 1000, args.model, Path(tmp))
            print(json.dumps({"model": args.model, **row}), flush=True)


if __name__ == "__main__":
    main()
