"""De-identification speed: deid.pl, rules, one model per runtime, ensembles of 1/3/5 models.

Usage::

    python benchmarks/deid_speed.py --deidpl ../shared/peers/physionet-deid \\
        --notes ../shared/corpora/physionet-deid-dev [--limit 120] [--model DIR ...] \\
        [--threads 2] [--ensemble-runtime onnx-int8]

``--notes`` is a PhysioNet-format directory (``*.text``) or a directory of ``.txt`` files. Every
configuration runs in its own child process, on the same notes, so that its peak RSS (``wait4``
rusage) is its own. Rows:

* ``deid.pl``: the PhysioNet tool (GPL-2), copied to a temporary directory at run time (never into
  this repository), run in output mode (``deid-output.config``);
* ``rules``: ``rules:default`` alone;
* ``1 model torch`` / ``torch-bf16`` / ``onnx`` / ``onnx-int8``: one tagger per encoder runtime
  (:mod:`dphub.runtime`; ONNX graphs are built before timing, as ``ensemble deid`` builds them
  once per encoder and caches them);
* ``<name> <runtime>``: with ``--student DIR`` (repeatable), one more model alone, named by its
  directory: a student distilled by ``dphub ensemble distill[-public]`` (one model in place of
  the ensemble that taught it), or a model on another base (the 6-layer model beside L3 ones);
* ``N models + rules`` (N = 1, 3, 5) per ``--ensemble-runtime`` (comma-separated): the models given with
  ``--model``; missing ones are *head variants* of the first (a copy whose classifier and CRF are
  re-drawn, the encoder byte-identical): what members trained with the default recipe
  (head-only on the shared public base) are, so the ensemble runs one encoder pass for all.

``--model`` defaults to an untrained tagger on the embedded all-MiniLM-L6-v2 (it costs exactly
what a trained one costs). dphub's notes/s counts tagging, aggregation and rendering (tag mode)
after the models are loaded; "incl. load" divides by the child's whole wall time. Other levers:
``--int8`` (torch dynamic int8 on torch rows), ``--window N`` / ``--stride N`` (inference windows
in word pieces instead of the model's 128 / 32), ``--chunk`` (notes per ensemble call),
``--threads`` (torch intra-op threads and ONNX Runtime ``intra_op_num_threads``; default: all
cores). Nothing prints note text. The summary prints each row's ratio to deid.pl next to the
targets (issue 29: 1 model >= 3x, 3 models + rules >= 2.5x).
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


#: CPU seconds (user + system) of the last child (wait4)
_CPU = [0.0]


def _child_rss(cmd: list[str], cwd: str | None = None) -> tuple[float, float, str]:
    """Run a child and return (wall s, its own peak RSS MiB, stdout) using wait4.

    The parent never loads torch or a model (that happens in children too): Linux carries a
    forked parent's RSS high-water mark into the child's ``ru_maxrss``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = proc.stdout.read() if proc.stdout else b""
    err = proc.stderr.read() if proc.stderr else b""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    _CPU[0] = usage.ru_utime + usage.ru_stime
    if proc.returncode != 0:
        sys.stderr.write(err.decode("utf-8", "replace")[-3000:])
        raise SystemExit(f"child failed: {' '.join(cmd[:3])} (exit {proc.returncode})")
    return wall, usage.ru_maxrss / 1024.0, out.decode("utf-8", "replace")


def _worker(args: argparse.Namespace) -> None:
    """Child: load members, de-identify the notes, print timings as JSON."""
    import torch

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    from dphub.ensemble.core import Ensemble, Slot, apply_runtime, member_from_entry
    from dphub.ensemble.manifest import MemberEntry
    from dphub.ensemble.members import ModelMember
    from dphub.notes import Note
    from dphub.render import RENDERERS

    notes = [Note(i, t) for i, t in json.loads(Path(args.worker_notes).read_text())]
    slots = []
    for i, m in enumerate(args.worker_members):
        if m == "rules:default":  # as `dphub ensemble add rules:default` gives it
            slots.append(member_from_entry(MemberEntry(m, "rules")))
        else:
            member = ModelMember.load(Path(m), f"model{i}", batch_size=args.batch_size)
            if args.int8 and args.runtime == "torch":
                member.quantize_int8()
            if args.window:
                member.tagger.model.max_length = args.window
            if args.stride is not None:
                member.tagger.model.stride = args.stride
            if args.marginals:  # the pre-fast-path behaviour: scores with marginals, then decode
                member.tag = (lambda mm: lambda notes, threshold=None: mm.spans_from(
                    mm.token_scores(notes), threshold))(member)
            slots.append(Slot(member))
    ens = Ensemble(slots)
    apply_runtime(ens, args.runtime)
    renderer = RENDERERS["tag"]()
    t1, c1 = time.perf_counter(), time.process_time()
    for b in range(0, len(notes), args.chunk):
        chunk = notes[b : b + args.chunk]
        for note, res in zip(chunk, ens.deid(chunk), strict=True):
            renderer.render(note, res.spans)
    t2, c2 = time.perf_counter(), time.process_time()
    print(json.dumps({"load_s": t1 - t0, "deid_s": t2 - t1, "deid_cpu_s": c2 - c1}))


def _default_model(tmp: Path) -> Path:
    from dphub.tagger import TaggerModel

    out = tmp / "minilm-untrained"
    TaggerModel.from_base(None).save(out)
    return out


def _head_variant(src: Path, dst: Path, seed: int) -> Path:
    """A copy of ``src`` with a re-drawn classifier and CRF: same encoder bytes (the default
    recipe's members differ only there)."""
    import torch

    from dphub.tagger import TaggerModel

    shutil.copytree(src, dst)
    model = TaggerModel.load(dst)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.classifier.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
        if model.crf is not None:
            for p in model.crf.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=g))
    model.save(dst)
    return dst


def _prebuild(models: list[Path], runtimes: set[str]) -> None:
    """Build the ONNX caches before any timed child (``ensemble deid`` does it once per
    encoder, then reuses the cached file)."""
    from dphub.tagger import Tagger

    for rt in sorted(runtimes - {"torch", "torch-bf16"}):
        for m in {str(x) for x in models}:
            Tagger.load(m).use_runtime(rt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deidpl", type=Path, help="folder of deid.pl (PhysioNet deid 1.1)")
    ap.add_argument("--notes", type=Path, help="PhysioNet-format dir or dir of .txt")
    ap.add_argument("--limit", type=int, default=120, help="number of notes (default 120)")
    ap.add_argument("--model", type=Path, action="append", default=[],
                    help="tagger directory (repeat; missing ensemble members are head variants "
                         "of the first; default: untrained MiniLM)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--batch-size", type=int, default=32, help="windows per encoder batch")
    ap.add_argument("--chunk", type=int, default=64, help="notes per ensemble call")
    ap.add_argument("--runtimes", default="torch,torch-bf16,onnx,onnx-int8",
                    help="runtimes of the one-model rows (comma-separated)")
    ap.add_argument("--ensemble-runtime", default="onnx-int8",
                    help="runtime(s) of the ensemble rows, comma-separated (torch | torch-bf16 | "
                         "onnx | onnx-int8)")
    ap.add_argument("--student", type=Path, action="append", default=[],
                    help="a single model to time alone, e.g. a distilled student (dphub ensemble "
                         "distill[-public]) or another base's model: one row per --runtimes, "
                         "labelled with its directory's name (repeatable)")
    ap.add_argument("--sizes", default="1,3,5", help="ensemble sizes (models, plus rules)")
    ap.add_argument("--skip", default="", help="rows to skip: deidpl,rules,single,ensembles")
    ap.add_argument("--int8", action="store_true", help="torch dynamic int8 on torch rows")
    ap.add_argument("--marginals", action="store_true",
                    help="compute CRF marginals even for Viterbi decoding (old behaviour)")
    ap.add_argument("--window", type=int, default=0,
                    help="inference window in word pieces (default: the model's, 128)")
    ap.add_argument("--stride", type=int, default=None,
                    help="window overlap in word pieces (default: the model's, 32)")
    ap.add_argument("--runtime", default="torch", help=argparse.SUPPRESS)
    ap.add_argument("--worker-notes", help=argparse.SUPPRESS)
    ap.add_argument("--worker-members", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--worker-prepare", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_notes:
        _worker(args)
        return
    if args.worker_prepare:  # models, head variants and ONNX caches, in a child
        tmp = args.worker_prepare
        models = [m.resolve() for m in args.model] or [_default_model(tmp)]
        while len(models) < max([int(x) for x in args.sizes.split(",") if x] + [1]):
            models.append(_head_variant(models[0], tmp / f"variant{len(models)}", len(models)))
        _prebuild(models + [s.resolve() for s in args.student],
                  set(args.runtimes.split(",")))
        print(json.dumps([str(m) for m in models]))
        return
    if args.notes is None:
        ap.error("--notes is required")
    skip = set(filter(None, args.skip.split(",")))
    notes = _load_notes(args.notes, args.limit)
    n = len(notes)
    results: list[tuple[str, float, float, float | None, float]] = []
    with tempfile.TemporaryDirectory(prefix="dphub-bench-") as tmp_s:
        tmp = Path(tmp_s)
        if args.deidpl and "deidpl" not in skip:
            d = tmp / "deidpl"
            shutil.copytree(args.deidpl, d)
            (d / "run.text").write_text(_physionet_text(notes), encoding="utf-8")
            wall, rss, _ = _child_rss(["perl", "-I.", "deid.pl", "run", "deid-output.config"],
                                      cwd=str(d))
            results.append(("deid.pl", n / wall, rss, None, n / max(_CPU[0], 1e-9)))
        sizes = [int(x) for x in args.sizes.split(",") if x]
        runtimes = [r for r in args.runtimes.split(",") if r]
        ens_runtimes = [r for r in args.ensemble_runtime.split(",") if r]
        prep = [sys.executable, __file__, "--worker-prepare", str(tmp), "--sizes", args.sizes,
                "--runtimes", ",".join(sorted(set(runtimes) | set(ens_runtimes))),
                *(x for m in args.model for x in ("--model", str(m.resolve()))),
                *(x for m in args.student for x in ("--student", str(m.resolve())))]
        models = [Path(m) for m in json.loads(_child_rss(prep)[2].strip().splitlines()[-1])]
        notes_file = tmp / "notes.json"
        notes_file.write_text(json.dumps(notes), encoding="utf-8")
        configs: list[tuple[str, list[str], str]] = []
        if "rules" not in skip:
            configs.append(("rules", ["rules:default"], "torch"))
        if "single" not in skip:
            configs += [(f"1 model {rt}", [str(models[0])], rt) for rt in runtimes]
            configs += [(f"{m.name} {rt}", [str(m.resolve())], rt)
                        for m in args.student for rt in runtimes]
        if "ensembles" not in skip:
            configs += [(f"{k} model{'s' if k > 1 else ''} + rules ({rt})",
                         [*(str(m) for m in models[:k]), "rules:default"], rt)
                        for rt in ens_runtimes for k in sizes]
        for label, members, rt in configs:
            cmd = [sys.executable, __file__, "--worker-notes", str(notes_file), "--threads",
                   str(args.threads), "--batch-size", str(args.batch_size), "--chunk",
                   str(args.chunk), "--runtime", rt, "--worker-members", *members]
            for flag, on in (("--int8", args.int8), ("--marginals", args.marginals)):
                if on:
                    cmd.insert(2, flag)
            if args.window:
                cmd[2:2] = ["--window", str(args.window)]
            if args.stride is not None:
                cmd[2:2] = ["--stride", str(args.stride)]
            wall, rss, out = _child_rss(cmd)
            t = json.loads(out.strip().splitlines()[-1])
            results.append((label, n / t["deid_s"], rss, n / wall, n / t["deid_cpu_s"]))
    print(f"{n} notes, {args.threads} threads, batch {args.batch_size} windows, chunk "
          f"{args.chunk} notes, int8={args.int8}, window={args.window or 'model'}, "
          f"stride={'model' if args.stride is None else args.stride}, "
          f"load average {os.getloadavg()[0]:.2f}")
    base = next((r for r in results if r[0] == "deid.pl"), None)
    print(f"| {'configuration':<30} | {'notes/s':>8} | {'incl. load':>10} | {'peak RSS MiB':>12} "
          f"| {'vs deid.pl':>10} | {'notes/CPU-s':>11} | {'vs deid.pl':>10} |")
    print(f"|{'-' * 32}|{'-' * 10}|{'-' * 12}|{'-' * 14}|{'-' * 12}|{'-' * 13}|{'-' * 12}|")
    for label, rate, rss, with_load, per_cpu in results:
        wl = f"{with_load:.1f}" if with_load is not None else f"{rate:.1f}"
        ratio = f"{rate / base[1]:.2f}x" if base else "-"
        cratio = f"{per_cpu / base[4]:.2f}x" if base else "-"
        print(f"| {label:<30} | {rate:>8.1f} | {wl:>10} | {rss:>12.0f} | {ratio:>10} "
              f"| {per_cpu:>11.2f} | {cratio:>10} |")
    print("notes/CPU-s: notes per CPU second (user + system) of the timed phase; on a loaded "
          "machine it is the steadier comparison (with --threads 1 it approximates an idle "
          "core's rate)")
    if base:
        for label, rate, _, _, per_cpu in results:
            # issue 29's targets: one model >= 3x deid.pl, three models + rules >= 2.5x
            target = 3.0 if label.startswith("1 model ") else (
                2.5 if label.startswith("3 models") else None)
            if target:
                verdict = "meets" if rate / base[1] >= target else "misses"
                print(f"{label}: {rate / base[1]:.2f}x deid.pl wall, {per_cpu / base[4]:.2f}x "
                      f"per CPU second; target {target:g}x: {verdict} (wall)")


if __name__ == "__main__":
    main()
