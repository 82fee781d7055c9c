"""One huge note through ``dphub deid``: wall time and peak memory against the note's size.

Usage::

    python benchmarks/huge_note.py [--sizes-kb 64,256,1024] [--model rules:default]
        [--paths whole,chunked]

Why: issue 31 #15 measured one 1 MB note at 515 s and a 50 MB note (rules only) at 10 minutes and
4.3 GiB, with no progress line until the note was done: progress is counted in notes, and a note
is the unit of work. This measures how time and peak RSS grow with the size of one note, so that
the cost of a within-note progress report and memory bound can be judged.

Each size runs ``dphub deid DIR --model MODEL --out OUT`` in a child process (its peak RSS from
``wait4``, progress lines with ``DPHUB_PROGRESS=plain``) over a directory holding one ``.txt``
note: synthetic nursing notes (``dphub.synth``, no real data) concatenated until the size is
reached. ``--paths``: ``chunked`` is dphub as it is (a note over
``dphub.ensemble.chunks.CHUNK_CHARS`` read in chunks); ``whole`` lifts the chunk size out of
reach, the one-pass path of before. Prints one JSON line per size and path: bytes, seconds, peak
RSS in MiB, seconds per MB, how many stderr lines and when the first came. Nothing prints note
text (the child's stderr is counted, not kept).

Measured 2026-11-26 (rules:default, a 2-core machine shared with other jobs, ``nice``): 64 kB
2.0 s / 100 MiB; 256 kB 4.4 s / 106 MiB; 1 MB 16.1 s / 169 MiB; 4 MB 58.1 s / 416 MiB. Time is
linear (≈ 15 s per MB) and memory grows ≈ 80 MiB per MB of one note (the ensemble's own peak,
``tracemalloc``: ≈ 68 MiB for 1 MB): a 50 MB note needs ≈ 4 GiB and ≈ 12 minutes, as the
campaign found. No progress is shown inside a note.

After the chunks (2026-11-26, same machine, loaded; ``--sizes-kb 1000,8000``, rules:default):

=======  =======================  ========================  ===================
size     whole (before)           chunked (after)           first progress line
=======  =======================  ========================  ===================
1 MB     7.5 s / 165 MiB          8.1 s / 106 MiB           7.2 s -> 3.4 s
8 MB     86.4 s / 727 MiB         69.1 s / 226 MiB          80.5 s -> 4.7 s
16 MB    (not run)                61.3 s / 367 MiB          3.3 s
=======  =======================  ========================  ===================

The members' own working memory no longer grows with the note (``tracemalloc``: 1.2 MiB for a
150 kB note in 8 kB chunks against 11.5 MiB in one pass, tests/test_huge_notes.py); what still
grows, ≈ 17 MiB of RSS per MB, is the note's text, its output and its spans (≈ 12,000 entities
per MB of these notes, each a member span, a merged span and an audit record): a 50 MB note
needs ≈ 1 GiB instead of 4.3 GiB. Times vary ±20 % with the machine's load.
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


#: the child for ``--path whole``: the one-pass path of before the chunks (a note of any size
#: read at once), for the before/after comparison; ``chunked`` runs ``dphub`` as it is
_WHOLE = ("import sys; import dphub.ensemble.core as c; c.Ensemble.chunk_chars = 1 << 62; "
          "from dphub.cli.main import main; sys.argv[0] = 'dphub'; main()")


def _run(size: int, model: str, work: Path, path: str) -> dict[str, float | str | None]:
    src = work / f"in-{size}"
    if not src.is_dir():
        src.mkdir()
        (src / "note.txt").write_text(_note_of(size), encoding="utf-8")
    out = work / f"out-{size}-{path}"
    head = ["-c", _WHOLE] if path == "whole" else ["-m", "dphub.cli.main"]
    cmd = [sys.executable, *head, "deid", str(src), "--model", model, "--out", str(out)]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "DPHUB_PROGRESS": "plain"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    assert proc.stderr is not None
    first_line: float | None = None
    lines = 0
    for _ in proc.stderr:  # progress lines (numbers only); their text is not kept
        lines += 1
        if first_line is None:
            first_line = time.perf_counter() - t0
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"dphub deid failed for size {size} (exit "
                         f"{os.waitstatus_to_exitcode(status)})")
    nbytes = (src / "note.txt").stat().st_size
    rss_mib = usage.ru_maxrss / 1024  # kB on Linux
    return {"path": path, "bytes": nbytes, "seconds": round(seconds, 2),
            "peak_rss_mib": round(rss_mib, 1), "seconds_per_mb": round(seconds / (nbytes / 1e6), 1),
            "stderr_lines": lines,
            "first_line_s": None if first_line is None else round(first_line, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes-kb", default="64,256,1024",
                    help="comma-separated note sizes in kB (1000 bytes)")
    ap.add_argument("--model", default="rules:default", help="what `dphub deid --model` takes")
    ap.add_argument("--paths", default="whole,chunked",
                    help="which paths to run per size: whole (before: one pass over the note), "
                         "chunked (dphub as it is)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dphub-huge-note-") as tmp:
        for kb in (int(x) for x in args.sizes_kb.split(",")):
            for path in args.paths.split(","):
                row = _run(kb * 1000, args.model, Path(tmp), path)
                print(json.dumps({"model": args.model, **row}), flush=True)


if __name__ == "__main__":
    main()
