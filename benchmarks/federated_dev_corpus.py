"""Federated DP training on the PhysioNet dev corpus (issue 27): sites, federation, centralised.

Usage (from the repository root, with ``pip install 'dphub[federate]'``; real data stays on this
machine, nothing prints note text)::

    python benchmarks/federated_dev_corpus.py --what sites      # each site's own DP model
    python benchmarks/federated_dev_corpus.py --what central    # one DP model on the union
    python benchmarks/federated_dev_corpus.py --what federated --rounds 4 --local-steps 8
    python benchmarks/federated_dev_corpus.py --what curve      # 1, 3, 5, 10 rounds
    python benchmarks/federated_dev_corpus.py --what all
    python benchmarks/federated_dev_corpus.py --sites 5 --what sites   # 25/20/20/15/15 patients
    python benchmarks/federated_dev_corpus.py --what rogue --runs honest,stealth   # issue 53

``--what rogue`` (issue 53) runs the federation in this process (the server's
``FederationServer.aggregate`` and each site's ``Site.train_round``, the code the Flower apps
call, without Flower and Ray), twice on the same sites: all honest, then with site ``--rogue-site``
lying. The rogue trains honestly (so its report is a real one) and replaces its update with a push
towards "no PHI" (O's bias, CRF scores into O and rule weights up, every PHI tag's down):
``--rogue push`` at 0.3 × the per-coordinate reach on every pushed coordinate (issue 53's finding),
``--rogue stealth`` scaled per tensor to its own honest update's L2 norm (inside every norm
bound) and with the classifier's rows aimed along its own notes' mean encoder output.
``--runs honest,stealth,push:off`` picks the federations (``:off``: the server before issue 53,
no RMS bound, no clipping, no probe check); ``--probe-margin``/``--aggregation`` choose the
server's defence.

The split is ``benchmarks/train_dev_corpus.py::_split(0)`` (patient-disjoint 80/20): the 95
training patients are cut by patient into 3 sites of 45/30/20 (``--sites 5``: 25/20/20/15/15;
patients shuffled with ``--site-seed``, the same shuffle for both cuts) and every model is
scored on the 36 held-out patients, token-binary, as ``train_dev_corpus.py`` scores. Every
model is DP at patient ε ``--target-epsilon`` per site (the federated model's guarantee is the
max over the sites: parallel composition). The default recipe is ``dphub train``'s (head + CRF
+ rule projection under DP, 32 steps at q = 1 for these sizes); the federation spends the same
number of steps per site: ``--rounds × --local-steps`` (the curve keeps that total: local
steps = total / rounds).

Prints one JSON object per model: F1/P/R, ε per site, seconds, seconds and bytes per round
(federated), peak RSS.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_dev_corpus import CORPUS, _coerce, _score, _split  # noqa: E402

SITE_SIZES = (45, 30, 20)
#: patients per site for ``--sites``; 3 is the default cut, unchanged since issue 27
SITE_CUTS = {3: SITE_SIZES, 5: (25, 20, 20, 15, 15)}


def _sites(train, sizes=SITE_SIZES, seed: int = 0):
    """The training notes cut into sites by patient (disjoint), of ``sizes`` patients."""
    patients = sorted({n.patient_id for n in train})
    if sum(sizes) != len(patients):
        raise SystemExit(f"site sizes {sizes} do not add up to {len(patients)} patients")
    random.Random(seed).shuffle(patients)
    out, start = [], 0
    for size in sizes:
        mine = set(patients[start:start + size])
        out.append([n for n in train if n.patient_id in mine])
        start += size
    return out


def _rss() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _train_one(data: Path, out: Path, eps: float, extra: dict) -> dict:
    from dphub import train as T

    opts = T.TrainOptions(data=data, out=out, target_epsilon=eps, force=True, **extra)
    t0 = time.monotonic()
    res = T.train(opts)
    return {"epsilon": res.epsilon, "steps": res.steps, "sample_rate": res.sample_rate,
            "noise_multiplier": res.noise_multiplier,
            "train_seconds": round(time.monotonic() - t0, 1)}


def _federate(paths: list[Path], out: Path, state: Path, eps: float, rounds: int, local: int,
              aggregation: str, extra: dict) -> dict:
    from dphub.federate.server import FederationConfig
    from dphub.federate.simulate import simulate

    shutil.rmtree(state, ignore_errors=True)
    cfg = FederationConfig(out=out, options=extra, rounds=rounds, local_steps=local,
                           target_epsilon=eps, aggregation=aggregation, force=True)
    t0 = time.monotonic()
    meta = simulate(paths, cfg, state_dir=state, num_cpus=min(len(paths), os.cpu_count() or 1))
    secs = time.monotonic() - t0
    fed = meta["differential_privacy"]["federation"]
    server = json.loads((state / "server" / "server_state.json").read_text())
    return {"epsilon": meta["differential_privacy"]["epsilon"],
            "site_epsilon_range": fed["epsilon_range"], "rounds": fed["rounds"],
            "local_steps": local, "aggregation": aggregation,
            "seconds": round(secs, 1), "seconds_per_round": round(secs / max(1, fed["rounds"]), 1),
            "bytes_per_round": server.get("bytes_per_round")}


def _push_direction(name: str, t, tags: list[str], hidden=None):
    """+1 / -1 / 0 per coordinate: towards tagging "O" (nothing) everywhere; the classifier's
    rows along the sign of ``hidden`` (the mean encoder output over the rogue's own windows),
    or not at all."""
    import torch

    o = tags.index("O")
    sign = -torch.ones(len(tags), dtype=torch.float64)
    sign[o] = 1.0
    if name.endswith(("start_transitions", "end_transitions")) or name.endswith(".bias"):
        return sign
    if name == "crf.transitions":  # [from, to]: into O up, into a PHI tag down
        return sign.expand(t.shape[0], -1).clone()
    if name == "rule_proj.weight":  # rule hits (PHI-looking tokens) vote for O
        return sign[:, None].expand(-1, t.shape[1]).clone()
    if name == "classifier.weight" and hidden is not None:
        return sign[:, None] * torch.sign(hidden.to(torch.float64))[None, :]
    return torch.zeros(t.shape, dtype=torch.float64)  # classifier.weight: the honest update


def _mean_hidden(site):
    """The mean frozen-encoder output over a site's own windows (its cache's table)."""
    import torch

    table = getattr(site.model.encoder, "table", None)
    if not table:
        return None
    return torch.cat([h.float() for h in table.values()]).mean(0)


def _rogue_update(mode: str, weights: dict, global_w: dict, steps: int, opts, tags,
                  hidden=None) -> dict:
    """The rogue's weights: its honest update, with the pushed tensors replaced."""
    import torch

    from dphub.federate.reports import update_bound

    out = {}
    for name, g in global_w.items():
        honest = weights[name].to(torch.float64) - g.to(torch.float64)
        d = _push_direction(name, g, tags, hidden if mode == "stealth" else None)
        if not bool(d.abs().sum()):
            out[name] = weights[name]
            continue
        if mode == "push":
            scale = 0.3 * update_bound(name, lr=opts.lr, rule_lr_scale=opts.rule_lr_scale,
                                       steps=steps)
        else:  # stealth: the same L2 norm as its honest update of this tensor
            scale = float(honest.norm()) / float(d.norm())
        out[name] = (g.to(torch.float64) + scale * d).to(g.dtype)
    return out


def _shared_encoder_cache() -> None:
    """Sites of the honest and the rogue federation share their frozen encoder's outputs (the
    same notes, the same public encoder: identical tables; built once per site per process)."""
    import hashlib

    import numpy as np

    from dphub.federate import site as site_mod

    real = site_mod.FrozenEncoderCache
    memo: dict = {}

    def cached(encoder, windows, pad_id, *a, **kw):
        h = hashlib.sha256()
        for w in windows:
            h.update(np.asarray(w, dtype=np.int64).tobytes() + b"|")
        key = h.hexdigest()
        if key not in memo:
            memo[key] = real(encoder, windows, pad_id, *a, **kw)
        return memo[key]

    site_mod.FrozenEncoderCache = cached


def _federate_inproc(paths: list[Path], out: Path, state: Path, eps: float, rounds: int,
                     local: int, aggregation: str, extra: dict, rogue: str | None,
                     rogue_site: int, defence: bool) -> dict:
    """The federation in this process (server + sites, no Flower), one site lying or none."""
    from dphub.federate.server import FederationConfig, FederationServer

    shutil.rmtree(state, ignore_errors=True)
    cfg = FederationConfig(out=out, options=extra, rounds=rounds, local_steps=local,
                           target_epsilon=eps, aggregation=aggregation, force=True,
                           state_dir=state / "server")
    t0 = time.monotonic()
    server = FederationServer(cfg)
    from dphub.federate import reports

    rms_bound = reports.ADAM_RMS_BOUND
    if not defence:  # the server before issue 53: no RMS bound, no clipping, no probe check
        reports.ADAM_RMS_BOUND = math.inf
        server._screen = lambda rnd, checked: checked  # type: ignore[method-assign]
    try:
        return _rounds(server, paths, out, state, eps, rounds, local, aggregation, extra, rogue,
                       rogue_site, defence, t0)
    finally:
        reports.ADAM_RMS_BOUND = rms_bound


def _rounds(server, paths, out, state, eps, rounds, local, aggregation, extra, rogue,
            rogue_site, defence, t0) -> dict:
    from dphub.federate import robust
    from dphub.federate.site import RoundOrder, Site

    tags = list(server.model.tags)
    sites = [Site(p, state / f"site-{i}", dict(extra)) for i, p in enumerate(paths)]
    log = []
    for rnd in range(1, rounds + 1):
        order = RoundOrder(round=rnd, rounds=rounds, local_steps=local, target_epsilon=eps,
                           frozen_digest=server.frozen_digest)
        replies = []
        for i, site in enumerate(sites):
            w, rep = site.train_round(order, {k: v.clone() for k, v in server.weights.items()})
            if rogue and i == rogue_site and w is not None:
                w = _rogue_update(rogue, w, server.weights, int(rep["trained"]), server.opts,
                                  tags, _mean_hidden(site))
            replies.append((w, rep, 1000 + i))
        n = server.aggregate(rnd, replies)
        log.append({"round": rnd, "contributed": n, "dropped": list(server.dropped),
                    "probe_recalls": [round(r, 3) for r in server.probe_recalls],
                    "clipped": round(server.clipped, 3)})
        print(json.dumps({"progress": log[-1]}), flush=True)
    meta = server.write()
    fed = meta["differential_privacy"]["federation"]
    return {"epsilon": meta["differential_privacy"]["epsilon"],
            "site_epsilon_range": fed["epsilon_range"], "rounds": fed["rounds"],
            "local_steps": local, "aggregation": aggregation, "rogue": rogue,
            "rogue_site": rogue_site if rogue else None, "defence": defence,
            "probe_margin": robust.PROBE_MARGIN, "round_log": log,
            "seconds": round(time.monotonic() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", choices=["sites", "central", "federated", "curve", "all", "rogue"],
                    default="federated")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--work", type=Path, default=None, help="where models go (default: a "
                    "private temporary directory, removed afterwards)")
    ap.add_argument("--target-epsilon", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--local-steps", type=int, default=8)
    ap.add_argument("--aggregation", default="mean")
    ap.add_argument("--site-seed", type=int, default=0)
    ap.add_argument("--sites", type=int, choices=sorted(SITE_CUTS), default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--thresholds", default="none")
    ap.add_argument("--runs", default="honest,push")
    ap.add_argument("--rogue-site", type=int, default=1)
    ap.add_argument("--probe-margin", type=float, default=None)
    args, rest = ap.parse_known_args(argv)
    import torch

    from dphub import formats

    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # extra ``--key value`` pairs: TrainOptions fields, the same for every model
    extra = {rest[i].lstrip("-").replace("-", "_"): _coerce(rest[i + 1])
             for i in range(0, len(rest), 2)}
    thresholds = [None if t == "none" else float(t) for t in args.thresholds.split(",")]
    train, test = _split(0, args.corpus)
    sizes = SITE_CUTS[args.sites]
    sites = _sites(train, sizes, seed=args.site_seed)
    total = args.rounds * args.local_steps
    with tempfile.TemporaryDirectory(prefix="dphub-fed-") as tmp:
        os.chmod(tmp, 0o700)
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        paths = []
        for i, notes in enumerate(sites):
            p = Path(tmp) / f"site-{i}.jsonl"
            formats.write(notes, p, "jsonl")
            paths.append(p)
        union = Path(tmp) / "union.jsonl"
        formats.write(train, union, "jsonl")
        results = []
        shared: dict = {}  # the held-out notes encoded once: every model here shares the encoder

        def emit(name: str, model: Path, info: dict) -> None:
            from dphub.tagger import Tagger

            if "encoded" not in shared:
                t0 = time.monotonic()
                shared["encoded"] = Tagger.load(model).encode(test, batch_size=32)
                info["test_encoding_seconds"] = round(time.monotonic() - t0, 1)
            row = {"model": name, "sites": args.sites, **info,
                   **_score(model, test, thresholds, shared["encoded"]), "peak_rss_mb": _rss()}
            results.append(row)
            print(json.dumps(row), flush=True)

        if args.what in ("sites", "all"):
            for i, (p, size) in enumerate(zip(paths, sizes, strict=True)):
                out = work / f"site-{i}"
                emit(f"site {i} alone ({size} patients)", out,
                     _train_one(p, out, args.target_epsilon, extra))
        if args.what in ("central", "all"):
            out = work / "central"
            emit("centralised (95 patients)", out,
                 _train_one(union, out, args.target_epsilon, extra))
        if args.what in ("federated", "all"):
            out = work / "federated"
            emit(f"federated {args.rounds}x{args.local_steps}", out,
                 _federate(paths, out, work / "federated.state", args.target_epsilon,
                           args.rounds, args.local_steps, args.aggregation, extra))
        if args.what == "rogue":
            from dphub.federate import robust

            if args.probe_margin is not None:
                robust.PROBE_MARGIN = args.probe_margin
            _shared_encoder_cache()
            for run in args.runs.split(","):
                rogue, _, off = run.partition(":")
                if rogue not in ("honest", "push", "stealth") or off not in ("", "off"):
                    raise SystemExit(f"--runs: unknown run {run!r}")
                tag = run.replace(":", "-")
                out = work / f"federated-{tag}"
                emit(f"federated {args.rounds}x{args.local_steps} {tag}", out,
                     _federate_inproc(paths, out, work / f"{tag}.state", args.target_epsilon,
                                      args.rounds, args.local_steps, args.aggregation, extra,
                                      None if rogue == "honest" else rogue, args.rogue_site,
                                      off != "off"))
        if args.what in ("curve", "all"):
            for rounds in (1, 3, 5, 10):
                local = max(1, round(total / rounds))
                out = work / f"federated-{rounds}"
                emit(f"federated {rounds}x{local}", out,
                     _federate(paths, out, work / f"federated-{rounds}.state",
                               args.target_epsilon, rounds, local, args.aggregation, extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
