"""Peak memory of a directory run against the number of notes (issue 15: constant memory).

Usage::

    python benchmarks/runner_memory.py --n 1000,10000 [--layout txt|jsonl] [--member digits]
    python benchmarks/runner_memory.py --n 1000 --member models/dp8 --runtime onnx-int8

Each N runs in its own child process (peak RSS from ``wait4``): synthetic discharge notes
(:func:`dphub.synth.iter_notes`, written one at a time) into a temporary directory of ``.txt``
files or one JSONL file, then :func:`dphub.runner.run_deid` in tag mode into a fresh OUT.
``--member digits`` is a trivial member (flags digit runs) that isolates the runner's own memory;
``rules:default`` or a model directory measure a real ensemble (the model adds a constant).
Prints N, layout, seconds and peak RSS in MiB. Synthetic notes only; no text is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class _Digits:
    """A member that flags runs of digits: costs nothing, so RSS is the runner's."""

    name = "digits"
    epsilon = 0.0
    unit = None
    revision = None

    def tag(self, notes, threshold=None):  # noqa: ANN001, ANN201 (member protocol)
        from dphub.notes import Span

        return [[Span(m.start(), m.end(), "ID", 1.0, self.name)
                 for m in re.finditer(r"\d+", n.text)] for n in notes]


def _child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    from dphub import synth
    from dphub.ensemble.core import Ensemble, Slot, apply_runtime
    from dphub.runner import run_deid

    with tempfile.TemporaryDirectory(prefix="dphub-mem-") as tmp_s:
        tmp = Path(tmp_s)
        if args.layout == "txt":
            src = tmp / "notes"
            src.mkdir()
            for i, n in enumerate(synth.iter_notes(args.child, kind="discharge", seed=1)):
                (src / f"{i:07d}.txt").write_text(n.text, encoding="utf-8")
        else:
            src = tmp / "notes.jsonl"
            with open(src, "w", encoding="utf-8") as fh:
                for n in synth.iter_notes(args.child, kind="discharge", seed=1):
                    fh.write(json.dumps({"id": n.id, "text": n.text}) + "\n")
        if args.member == "digits":
            slots = [Slot(_Digits())]
        elif args.member.startswith("rules:"):
            from dphub.rules.engine import RuleMember

            slots = [Slot(RuleMember())]
        else:
            from dphub.ensemble.members import ModelMember

            slots = [Slot(ModelMember.load(Path(args.member), batch_size=32))]
        ens = Ensemble(slots)
        apply_runtime(ens, args.runtime)
        t0 = time.perf_counter()
        report = run_deid(src, tmp / "out", ens, mode="tag", batch_size=args.batch_size)
        print(json.dumps({"seconds": time.perf_counter() - t0, "done": report.done}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="1000,10000", help="numbers of notes (comma-separated)")
    ap.add_argument("--layout", choices=("txt", "jsonl"), default="txt")
    ap.add_argument("--member", default="digits",
                    help="digits (runner only) | rules:default | a model directory")
    ap.add_argument("--runtime", default="torch")
    ap.add_argument("--batch-size", type=int, default=16, help="notes per batch (the CLI's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        _child(args)
        return
    print(f"member {args.member}, runtime {args.runtime}, layout {args.layout}")
    for n in [int(x) for x in args.n.split(",")]:
        cmd = [sys.executable, __file__, "--child", str(n), "--layout", args.layout, "--member",
               args.member, "--runtime", args.runtime, "--batch-size", str(args.batch_size),
               "--threads", str(args.threads)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
        out = proc.stdout.read() if proc.stdout else b""
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"child for N={n} failed")
        res = json.loads(out.decode().strip().splitlines()[-1])
        print(f"N={n:>7}  done={res['done']:>7}  {res['seconds']:8.1f} s  "
              f"peak RSS {usage.ru_maxrss / 1024:8.0f} MiB")


if __name__ == "__main__":
    main()
