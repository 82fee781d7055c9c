"""Start-up of ``dphub ensemble deid``, phase by phase (issue 55): what a one-shot run pays before
its first note, apart from the per-note cost.

Usage::

    python benchmarks/startup.py -e MANIFEST [--runtime auto|torch|torch-bf16|onnx-int8]
        [--repeats 3]

Each repeat is a fresh process (a warm file cache, as a second run of the day has): interpreter
and ``dphub.cli`` imports, the ensemble modules (torch, transformers), building the ensemble
(model weights, tokenizer, rules, safe vocabulary, the runtime: an ONNX session is built or
loaded from the cache), the first note (kernels made on first use) and a second one. Prints
wall and CPU seconds per phase (min and max over the repeats) and which heavy packages were
loaded. Synthetic notes; nothing prints note text.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, time
w0, c0 = time.perf_counter(), time.process_time()
out = {}
def mark(k):
    global w0, c0
    w, c = time.perf_counter(), time.process_time()
    out[k] = [round(w - w0, 3), round(c - c0, 3)]
    w0, c0 = w, c
import dphub.cli.main
mark("cli imports")
from dphub.ensemble.core import build_ensemble
from dphub.ensemble.manifest import Manifest
mark("ensemble modules (torch, transformers)")
from pathlib import Path
ens = build_ensemble(Manifest.load(Path(sys.argv[1])), runtime=sys.argv[2] or None)
mark("build: weights, tokenizer, rules, vocabulary, runtime")
from dphub.synth import generate
notes = generate(2, kind="realistic-discharge", seed=55)
ens.deid(notes[:1])
mark("first note")
ens.deid(notes[1:])
mark("second note")
out["runtime"] = ens.runtime
out["loaded"] = sorted(m for m in ("opacus", "scipy", "onnxruntime", "ray", "sympy")
                       if m in sys.modules)
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-e", "--manifest", required=True)
    ap.add_argument("--runtime", default="")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    runs = []
    for _ in range(args.repeats):
        got = subprocess.run([sys.executable, "-c", CHILD, args.manifest, args.runtime],
                             capture_output=True, text=True, check=True)
        runs.append(json.loads(got.stdout.strip().splitlines()[-1]))
    print(f"runtime {runs[0]['runtime']}; heavy packages loaded: {runs[0]['loaded']}")
    print("| phase | wall s (min-max) | CPU s (min-max) |")
    print("|---|---|---|")
    for k in runs[0]:
        if k in ("runtime", "loaded"):
            continue
        w = [r[k][0] for r in runs]
        c = [r[k][1] for r in runs]
        print(f"| {k} | {min(w):.2f}-{max(w):.2f} | {min(c):.2f}-{max(c):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
