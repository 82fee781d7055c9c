"""De-identification speed: dphub with 1 and 3 members vs deid.pl, same notes, same run.

Usage::

    python benchmarks/deid_speed.py --deidpl /work/shared/peers/physionet-deid \\
        --notes /work/shared/corpora/physionet-deid-dev [--limit 200] [--model DIR ...] [--int8]

``--notes`` is a PhysioNet-format directory (``*.text``) or a directory of ``.txt`` files. Each
configuration runs in its own child process so that its peak RSS (``wait4`` rusage) is its own:

* ``deid.pl``: the PhysioNet tool (GPL-2), copied to a temporary directory at run time (never into
  this repository), run in output mode (``deid-output.config``) on the same notes;
* ``1 member``: one tagger (``--model``, default: an untrained tagger on the embedded
  all-MiniLM-L6-v2 base, which costs exactly what a trained one costs);
* ``3 members``: two taggers plus ``rules:default``.

dphub's notes/s counts tagging, aggregation and rendering (tag mode) after the models are loaded;
load time is printed separately, and "with load" rates too. Nothing prints note text.

Speed levers (each can be switched for a before/after table): ``--int8`` (dynamic int8 Linear
layers), ``--marginals`` (force CRF forward-backward although decoding only needs Viterbi: the
pre-fast-path behaviour), ``--window N`` (inference window length in word pieces instead of the
model's own, e.g. 256; the stride stays the model's), ``--threads`` (default: all cores).
The summary prints each configuration's ratio to deid.pl next to the targets (1 member >= 5x,
3 members >= 2x).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _load_notes(path: Path, limit: int) -> list[tuple[str, str]]:
    if path.is_dir() and any(path.glob("*.text")):
        from dphub import formats

        notes = [(n.id, n.text) for n in formats.read(path, format="physionet")]
    else:
        notes = [(p.stem, p.read_text(encoding="utf-8")) for p in sorted(path.rglob("*.txt"))]
    return notes[:limit]


def _physionet_text(notes: list[tuple[str, str]]) -> str:
    out = []
    for i, (_, text) in enumerate(notes):
        out.append(f"START_OF_RECORD={i // 20 + 1}||||{i % 20 + 1}||||\n{text}\n||||END_OF_RECORD\n")
    return "".join(out)


def _child_rss(cmd: list[str], cwd: str | None = None) -> tuple[float, float, str]:
    """Run a child and return (wall s, its own peak RSS MiB, stdout) using wait4."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = proc.stdout.read() if proc.stdout else b""
    err = proc.stderr.read() if proc.stderr else b""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(err.decode("utf-8", "replace")[-3000:])
        raise SystemExit(f"child failed: {' '.join(cmd[:3])} (exit {proc.returncode})")
    return wall, usage.ru_maxrss / 1024.0, out.decode("utf-8", "replace")


def _worker(args: argparse.Namespace) -> None:
    """Child: load members, de-identify the notes, print timings as JSON."""
    import torch

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    from dphub.ensemble.core import Ensemble, Slot
    from dphub.ensemble.members import ModelMember
    from dphub.ensemble.rules import RuleMember
    from dphub.notes import Note
    from dphub.render import RENDERERS

    notes = [Note(i, t) for i, t in json.loads(Path(args.worker_notes).read_text())]
    slots = []
    for i, m in enumerate(args.worker_members):
        if m == "rules:default":
            slots.append(Slot(RuleMember()))
        else:
            member = ModelMember.load(Path(m), f"model{i}", batch_size=args.batch_size)
            if args.int8:
                member.quantize_int8()
            if args.window:
                member.tagger.model.max_length = args.window
            if args.marginals:  # the pre-fast-path behaviour: scores with marginals, then decode
                member.tag = (lambda mm: lambda notes, threshold=None: mm.spans_from(
                    mm.token_scores(notes), threshold))(member)
            slots.append(Slot(member))
    ens = Ensemble(slots)
    renderer = RENDERERS["tag"]()
    t1 = time.perf_counter()
    for b in range(0, len(notes), args.chunk):
        chunk = notes[b : b + args.chunk]
        for note, res in zip(chunk, ens.deid(chunk), strict=True):
            renderer.render(note, res.spans)
    t2 = time.perf_counter()
    print(json.dumps({"load_s": t1 - t0, "deid_s": t2 - t1}))


def _default_model(tmp: Path) -> Path:
    from dphub.tagger import TaggerModel

    out = tmp / "minilm-untrained"
    TaggerModel.from_base(None).save(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deidpl", type=Path, help="folder of deid.pl (PhysioNet deid 1.1)")
    ap.add_argument("--notes", type=Path, help="PhysioNet-format dir or dir of .txt")
    ap.add_argument("--limit", type=int, default=200, help="number of notes (default 200)")
    ap.add_argument("--model", type=Path, action="append", default=[],
                    help="tagger directory (repeat for the 3-member run; default: untrained MiniLM)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=64, help="notes per ensemble call")
    ap.add_argument("--int8", action="store_true", help="dynamic int8 quantization of Linear layers")
    ap.add_argument("--marginals", action="store_true",
                    help="compute CRF marginals even for Viterbi decoding (old behaviour)")
    ap.add_argument("--window", type=int, default=0,
                    help="inference window in word pieces (default: the model's, 128)")
    ap.add_argument("--worker-notes", help=argparse.SUPPRESS)
    ap.add_argument("--worker-members", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_notes:
        _worker(args)
        return
    if args.notes is None:
        ap.error("--notes is required")
    notes = _load_notes(args.notes, args.limit)
    n = len(notes)
    results: list[tuple[str, float, float, float | None]] = []
    with tempfile.TemporaryDirectory(prefix="dphub-bench-") as tmp_s:
        tmp = Path(tmp_s)
        if args.deidpl:
            d = tmp / "deidpl"
            shutil.copytree(args.deidpl, d)
            (d / "run.text").write_text(_physionet_text(notes), encoding="utf-8")
            wall, rss, _ = _child_rss(["perl", "-I.", "deid.pl", "run", "deid-output.config"],
                                      cwd=str(d))
            results.append(("deid.pl", n / wall, rss, None))
        models = [m.resolve() for m in args.model] or [_default_model(tmp)]
        while len(models) < 2:
            models.append(models[0])
        notes_file = tmp / "notes.json"
        notes_file.write_text(json.dumps(notes), encoding="utf-8")
        configs = {"1 member": [str(models[0])],
                   "3 members": [str(models[0]), str(models[1]), "rules:default"]}
        for label, members in configs.items():
            cmd = [sys.executable, __file__, "--worker-notes", str(notes_file), "--threads",
                   str(args.threads), "--batch-size", str(args.batch_size), "--chunk",
                   str(args.chunk), "--worker-members", *members]
            for flag, on in (("--int8", args.int8), ("--marginals", args.marginals)):
                if on:
                    cmd.insert(2, flag)
            if args.window:
                cmd[2:2] = ["--window", str(args.window)]
            wall, rss, out = _child_rss(cmd)
            t = json.loads(out.strip().splitlines()[-1])
            results.append((label, n / t["deid_s"], rss, n / wall))
    print(f"{n} notes, {args.threads} threads, int8={args.int8}, marginals={args.marginals}, "
          f"window={args.window or 'model'}, load average {os.getloadavg()[0]:.2f}")
    print(f"{'config':<12} {'notes/s':>9} {'notes/s incl. load':>19} {'peak RSS MiB':>13}")
    for label, rate, rss, with_load in results:
        wl = f"{with_load:.1f}" if with_load is not None else f"{rate:.1f}"
        print(f"{label:<12} {rate:>9.1f} {wl:>19} {rss:>13.0f}")
    base = next((r for r in results if r[0] == "deid.pl"), None)
    targets = {"1 member": 5.0, "3 members": 2.0}
    if base:
        for label, rate, _, with_load in results[1:]:
            ratio, target = rate / base[1], targets[label]
            verdict = "meets" if ratio >= target else "misses"
            print(f"{label}: {ratio:.2f}x deid.pl (incl. load {with_load / base[1]:.2f}x); "
                  f"target {target:.0f}x: {verdict}")


if __name__ == "__main__":
    main()
