"""Seconds per training step, DP (Opacus hooks, per-unit clipping) vs non-private, and peak RSS.

Usage::

    python benchmarks/train_speed.py                      # MiniLM-L6 + CRF, 16 x 128 pieces
    python benchmarks/train_speed.py --layers 0 2 6 --windows 16 --length 128 --steps 3

One step = forward + backward over ``--windows`` windows of ``--length`` pieces (one unit each,
random ids and tags) + optimizer step; the DP step also aggregates per-unit grad samples, clips
and adds noise exactly like ``dphub.train``. The first step of each configuration is a warm-up and
is not timed. Prints one line per configuration and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import warnings


def _batch(windows: int, length: int, n_tags: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30000, (windows, length), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    tags = torch.randint(0, n_tags, (windows, length), generator=g)
    tags[:, 0] = tags[:, -1] = -100
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": torch.zeros_like(ids),
        "position_ids": torch.arange(length).expand(windows, length).contiguous(),
    }, tags


def time_steps(layers: int | None, dp: bool, windows: int, length: int, steps: int,
               head: str = "crf", lora_rank: int | None = None, cached: bool = False) -> float:
    """Mean seconds per (timed) step for one configuration.

    ``cached`` (head-only runs): the frozen encoder is replaced by its precomputed outputs, as
    ``dphub.train`` does for ``train_layers=0``; the one-time cache build is not timed.
    """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from dphub.privacy.units import aggregate_grad_sample_by_unit
    from dphub.tagger import TaggerModel

    torch.manual_seed(0)
    model = TaggerModel.from_base(None, head=head)
    model.set_trainable(train_layers=layers, lora_rank=lora_rank)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-4)
    batch, tags = _batch(windows, length, len(model.tags), 0)
    if cached:
        from dphub.train import FrozenEncoderCache

        model.encoder = FrozenEncoderCache(model.encoder, batch["input_ids"].tolist(), pad_id=0)
    if dp:
        from opacus import PrivacyEngine

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine = PrivacyEngine(accountant="prv")
            loader = DataLoader(TensorDataset(torch.zeros(windows)), batch_size=windows)
            _, opt, _ = engine.make_private(module=model, optimizer=opt, data_loader=loader,
                                            noise_multiplier=1.0, max_grad_norm=1.0,
                                            poisson_sampling=False)
    unit_index = torch.arange(windows)
    times = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook")
        for i in range(steps + 1):
            t0 = time.perf_counter()
            loss = model.per_sample_loss(batch, tags)
            loss.mean().backward()
            if dp:
                aggregate_grad_sample_by_unit(model, unit_index, windows)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i:
                times.append(time.perf_counter() - t0)
    return sum(times) / len(times)


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", nargs="+", default=["0", "2", "all"],
                    help="trainable top layers per configuration ('all' = whole encoder)")
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lora-rank", type=int, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    specs = list(args.layers)
    if "0" in specs and args.lora_rank is None:
        specs.insert(specs.index("0") + 1, "0-cached")
    for spec in specs:
        cached = spec == "0-cached"
        layers = None if spec == "all" else int(spec.split("-")[0])
        plain = time_steps(layers, False, args.windows, args.length, args.steps,
                           lora_rank=args.lora_rank, cached=cached)
        private = time_steps(layers, True, args.windows, args.length, args.steps,
                             lora_rank=args.lora_rank, cached=cached)
        row = {"train_layers": spec, "lora_rank": args.lora_rank,
               "non_dp_s_per_step": round(plain, 3), "dp_s_per_step": round(private, 3),
               "dp_over_non_dp": round(private / plain, 2)}
        rows.append(row)
        print(f"layers={spec:>8}  non-DP {plain:6.2f} s/step  DP {private:6.2f} s/step  "
              f"ratio {private / plain:4.2f}", flush=True)
    summary = {
        "windows_per_step": args.windows, "length": args.length, "threads": args.threads,
        "configs": rows,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
