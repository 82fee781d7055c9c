"""Cost of the mechanism's randomness per DP-SGD step: torch's RNG vs os-seeded vs csprng.

A DP step draws one Gaussian per trainable parameter. This times exactly that draw for the
parameter counts of dphub's recipes (head + CRF over a frozen MiniLM; the top layer + head; all
of MiniLM) with each source, and prints seconds per step::

    python benchmarks/noise_rng.py [--repeats 5] [--threads 2]

``torch.normal`` (seeded torch generator) is the old, replayable default, shown for reference.
"""

from __future__ import annotations

import argparse
import time

import torch

from dphub.privacy.randomness import MechanismRandomness

#: trainable parameters per recipe (MiniLM-L6: hidden 384, 6 layers, 22.7 M in all; 29 BIOES tags)
RECIPES = {
    "head + CRF (default)": 384 * 29 + 29 + 29 * 29 + 2 * 29,
    "top layer + head": 1_774_464 + 384 * 29 + 29 + 29 * 29 + 2 * 29,
    "all of MiniLM + head": 22_713_216 + 384 * 29 + 29 + 29 * 29 + 2 * 29,
}


def _time(fn, repeats: int) -> float:
    fn()  # warm up
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    os_seeded = MechanismRandomness("os-seeded")
    csprng = MechanismRandomness("csprng")
    print(f"{'recipe':<24} {'params':>11} {'torch (s)':>10} {'os-seeded (s)':>14} "
          f"{'csprng (s)':>11} {'csprng/os':>9}")
    for name, n in RECIPES.items():
        t_torch = _time(lambda n=n: torch.normal(0.0, 1.0, (n,), generator=gen), args.repeats)
        t_os = _time(lambda n=n: os_seeded.normal((n,), 1.0), args.repeats)
        t_cs = _time(lambda n=n: csprng.normal((n,), 1.0), args.repeats)
        print(f"{name:<24} {n:>11,} {t_torch:>10.4f} {t_os:>14.4f} {t_cs:>11.4f} "
              f"{t_cs / t_os:>8.1f}x")


if __name__ == "__main__":
    main()
