"""Throughput and peak memory of ``dphub ensemble deid`` against the number of notes (issue 55).

Usage (from the repository root; synthetic notes only, nothing prints note text)::

    python benchmarks/scale.py --work /tmp/scale --sizes 500,5000,50000 --configs rules
    python benchmarks/scale.py --work /tmp/scale --sizes 500,5000 --configs model+rules \\
        --model MODEL_DIR [--engines local,ray] [--runtime torch-bf16]

For each size N, ``dphub data synth --n N --kind realistic-discharge`` writes one JSONL file
(cached in ``--work``); each configuration is an ensemble manifest there: ``rules`` is
``rules:default`` alone, ``model+rules`` the recall-first default (MODEL_DIR and
``rules:default`` under ``--aggregate inverse``). Each (configuration, engine, N) runs the CLI
end to end in a child process: ``local`` is one process with ``--threads T``; ``ray`` is
``--engine ray --ray-workers 2 --threads 1`` (two actors of one thread: the same two cores).

Reported per run (one JSON line, then a table): wall seconds; the CLI's own ``timing:`` line
(start-up, from process start to the first note, apart from the notes' part and its notes/s);
CPU seconds of the whole process tree (user + system; on a shared machine wall time measures
the other users too, CPU time much less so); peak RSS: of the driver alone (``wait4``, exact)
and of the whole process tree (sampled every 0.25 s with psutil: Ray's actors, raylet and object
store included, shared pages counted once per process, so an upper bound).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

DPHUB = [sys.executable, "-m", "dphub.cli.main"]
TIMING = re.compile(r"timing: start-up ([0-9.?]+)(?: s)?; (\d+) note\(s\) in ([0-9.]+) s "
                    r"\(([0-9.]+) notes/s")


def _sh(args: list[str], env: dict[str, str]) -> None:
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL)


def notes_file(work: Path, n: int, kind: str, env: dict[str, str]) -> Path:
    path = work / f"notes-{kind}-{n}.jsonl"
    if not path.exists():
        _sh([*DPHUB, "data", "synth", "--n", str(n), "--kind", kind, "--seed", "55", "--out",
             str(path)], env)
    return path


def manifest(work: Path, config: str, model: Path | None, env: dict[str, str]) -> Path:
    d = work / f"ens-{config}"
    m = d / "dphub-ensemble.toml"
    if m.exists():
        return m
    d.mkdir(parents=True, exist_ok=True)
    if config == "model+rules":
        if model is None:
            raise SystemExit("--configs model+rules needs --model DIR")
        _sh([*DPHUB, "ensemble", "add", str(model), "-e", str(m)], env)
    _sh([*DPHUB, "ensemble", "add", "rules:default", "-e", str(m)], env)
    _sh([*DPHUB, "ensemble", "aggregate", "inverse", "-e", str(m)], env)
    return m


def _tree_sample(pid: int) -> tuple[float, float]:
    """(RSS MiB, CPU s) of ``pid`` and its descendants now (psutil)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0, 0.0
    rss = cpu = 0.0
    for p in procs:
        try:
            rss += p.memory_info().rss
            t = p.cpu_times()
            cpu += t.user + t.system
        except psutil.Error:
            continue
    return rss / 2**20, cpu


def run_one(args: list[str], env: dict[str, str]) -> dict:
    t0 = time.monotonic()
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    import threading

    err_lines: list[str] = []
    reader = threading.Thread(target=lambda: err_lines.extend(proc.stderr), daemon=True)
    reader.start()
    peak_tree, tree_cpu = 0.0, 0.0
    while True:
        try:
            _, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            break
        if _ != 0:
            break
        rss, cpu = _tree_sample(proc.pid)
        peak_tree, tree_cpu = max(peak_tree, rss), max(tree_cpu, cpu)
        time.sleep(0.25)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    reader.join(timeout=5)
    timing = next((m for ln in err_lines if (m := TIMING.search(ln))), None)
    cpu_driver = usage.ru_utime + usage.ru_stime
    errors = [ln.strip()[:200] for ln in err_lines if ln.startswith("error:")]
    return {
        "rc": proc.returncode, "wall_s": round(wall, 1),
        "startup_s": None if timing is None or timing[1] == "?" else float(timing[1]),
        "notes": None if timing is None else int(timing[2]),
        "notes_part_s": None if timing is None else float(timing[3]),
        "notes_per_s": None if timing is None else float(timing[4]),
        "cpu_s_driver_and_children": round(cpu_driver, 1),
        "cpu_s_tree_sampled": round(tree_cpu, 1),
        "peak_rss_driver_mib": round(usage.ru_maxrss / 1024, 1),
        "peak_rss_tree_mib": round(peak_tree, 1),
        **({"errors": errors} if errors else {}),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--sizes", default="500,5000,50000")
    ap.add_argument("--configs", default="rules", help="rules, model+rules (comma-separated)")
    ap.add_argument("--engines", default="local,ray")
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--runtime", default=None, help="default: the CLI's (auto)")
    ap.add_argument("--kind", default="realistic-discharge")
    ap.add_argument("--threads", type=int, default=2, help="local engine's torch threads")
    ap.add_argument("--ray-workers", type=int, default=2)
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DPHUB_PROGRESS": "plain", "TOKENIZERS_PARALLELISM": "false"}
    env.setdefault("DPHUB_HOME", str(args.work / "home"))
    env.setdefault("DPHUB_CACHE_DIR", str(args.work / "cache"))
    rows = []
    for config in args.configs.split(","):
        m = manifest(args.work, config, args.model, env)
        for n in (int(x) for x in args.sizes.split(",")):
            src = notes_file(args.work, n, args.kind, env)
            for engine in args.engines.split(","):
                out = args.work / f"out-{config}-{engine}-{n}"
                if out.exists():
                    import shutil

                    shutil.rmtree(out)
                cmd = [*DPHUB, "ensemble", "deid", str(src), "--out", str(out), "-e", str(m)]
                if engine == "ray":
                    cmd += ["--engine", "ray", "--ray-workers", str(args.ray_workers),
                            "--threads", "1"]
                else:
                    cmd += ["--threads", str(args.threads)]
                if args.runtime:
                    cmd += ["--runtime", args.runtime]
                row = {"config": config, "engine": engine, "n": n, **run_one(cmd, env)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    print("| config | engine | notes | wall s | start-up s | notes/s (run) | CPU s (tree) "
          "| peak RSS driver / tree MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['engine']} | {r['n']} | {r['wall_s']} | {r['startup_s']} "
              f"| {r['notes_per_s']} | {r['cpu_s_tree_sampled']} | {r['peak_rss_driver_mib']} / "
              f"{r['peak_rss_tree_mib']} |")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
