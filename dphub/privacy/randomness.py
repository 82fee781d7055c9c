"""Where DP-SGD's randomness comes from: noise and Poisson sampling nobody can replay.

The guarantee of DP-SGD holds only if the Gaussian noise and the Poisson draws of units are
unknown to whoever sees the weights. A generator seeded from a published (or guessable) seed lets
an attacker who knows the other patients replay training with and without a target patient and
compare — the effective ε is then infinite. So the *mechanism* never draws from ``--seed``:

* ``os-seeded`` (default): a NumPy ``PCG64DXSM`` generator seeded with 256 bits from the operating
  system's CSPRNG (``os.urandom``) on every run, and re-seeded from it on resume. Nothing of that
  seed is kept, logged or published. Fast (NumPy's ziggurat sampler), and unpredictable as long as
  the weights do not expose the generator's raw output (they expose only sums of clipped
  gradients and noise).
* ``csprng`` (``--secure-rng``): every uniform is read from ``os.urandom`` (the kernel's ChaCha20
  CSPRNG) and turned into Gaussians by the Box–Muller transform; each noise coordinate is the sum of
  four such draws divided by two (same variance), the defence against floating-point attacks on
  Gaussian samplers (Holohan & Braghin 2021) that Opacus's own secure mode uses. Slower (see
  ``benchmarks/noise_rng.py``), and needs no extra package (Opacus's secure mode needs
  ``torchcsprng``, which does not install here).
* ``seeded``: only for ``--no-dp`` baselines, whose data order follows ``--seed`` so that two
  baseline runs are comparable; there is no guarantee to protect.

:func:`install_noise_source` makes an Opacus ``DPOptimizer`` draw its noise from a source, and
:class:`PoissonUnitSampler` draws the units of each step from the same source.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from opacus.utils.uniform_sampler import UniformWithReplacementSampler

from dphub.errors import PrivacyError

#: Modes recorded in the card's ``differential_privacy.mechanism_rng``.
MECHANISM_MODES: tuple[str, ...] = ("os-seeded", "csprng")

_TWO_PI = 2.0 * math.pi
_U53 = 1.0 / (1 << 53)


def dp_mode(secure: bool) -> str:
    """The mode a DP run draws from (what its card records as ``mechanism_rng``)."""
    return "csprng" if secure else "os-seeded"


class MechanismRandomness:
    """One source of uniforms and Gaussians for a training run (see the module docstring).

    ``state()`` is only available in ``seeded`` mode: a DP run's randomness must not be written
    anywhere, checkpoints included (a resumed DP run draws fresh randomness, which is as private as
    the uninterrupted run: each step's noise is independent of every other step's).
    """

    def __init__(self, mode: str, seed: int | None = None) -> None:
        if mode not in (*MECHANISM_MODES, "seeded"):
            raise PrivacyError(f"unknown mechanism randomness {mode!r}")
        if mode == "seeded" and seed is None:
            raise PrivacyError("seeded randomness needs a seed (only for --no-dp baselines)")
        self.mode = mode
        self._gen: np.random.Generator | None = None
        if mode == "os-seeded":
            entropy = int.from_bytes(os.urandom(32), "little")
            self._gen = np.random.Generator(np.random.PCG64DXSM(np.random.SeedSequence(entropy)))
        elif mode == "seeded":
            self._gen = np.random.Generator(np.random.PCG64DXSM(np.random.SeedSequence(seed)))

    @classmethod
    def for_run(cls, *, private: bool, secure: bool, seed: int) -> MechanismRandomness:
        """The source a run uses: OS-seeded or CSPRNG under DP, ``seed`` only without DP."""
        if not private:
            return cls("seeded", seed)
        return cls(dp_mode(secure))

    # ------------------------------------------------------------------ draws

    def uniform(self, n: int) -> np.ndarray:
        """``n`` independent uniforms in [0, 1) as float64."""
        if self._gen is not None:
            return self._gen.random(n)
        words = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
        return (words >> np.uint64(11)).astype(np.float64) * _U53

    def _csprng_normal(self, n: int) -> np.ndarray:
        """``n`` standard normals by Box–Muller from CSPRNG uniforms (u1 in (0, 1])."""
        m = (n + 1) // 2
        u1 = 1.0 - self.uniform(m)  # (0, 1]: log is finite
        u2 = self.uniform(m)
        r = np.sqrt(-2.0 * np.log(u1))
        z = np.concatenate([r * np.cos(_TWO_PI * u2), r * np.sin(_TWO_PI * u2)])
        return z[:n]

    def normal(self, shape: tuple[int, ...] | torch.Size, std: float,
               dtype: torch.dtype = torch.float32, device: Any = "cpu") -> torch.Tensor:
        """Gaussian noise N(0, std²) of ``shape``."""
        n = int(np.prod(shape)) if len(shape) else 1
        if std == 0 or n == 0:
            return torch.zeros(shape, dtype=dtype, device=device)
        if self._gen is not None:
            z = self._gen.standard_normal(n, dtype=np.float64)
        else:
            # sum of 4 draws / 2: same variance; the defence Opacus's secure mode uses
            z = (self._csprng_normal(n) + self._csprng_normal(n) + self._csprng_normal(n)
                 + self._csprng_normal(n)) / 2.0
        return torch.from_numpy(z * std).to(dtype=dtype, device=device).reshape(shape)

    # ------------------------------------------------------------------ state (seeded only)

    def state(self) -> dict[str, Any] | None:
        """The generator's state for checkpoints: ``None`` for DP modes (never stored)."""
        if self.mode != "seeded" or self._gen is None:
            return None
        return dict(self._gen.bit_generator.state)

    def set_state(self, state: dict[str, Any] | None) -> None:
        if self.mode == "seeded" and self._gen is not None and state:
            self._gen.bit_generator.state = state


class PoissonUnitSampler(UniformWithReplacementSampler):
    """Opacus's Poisson sampler over units, drawing from a :class:`MechanismRandomness`.

    Each step includes every unit independently with probability ``sample_rate``; empty steps are
    yielded as empty lists (the training loop takes a noise-only step). ``len()`` is the number of
    steps per epoch, which Opacus turns into the accountant's sample rate (``1 / len(loader)``).
    """

    def __init__(self, *, num_samples: int, sample_rate: float, source: MechanismRandomness,
                 steps: int | None = None) -> None:
        super().__init__(num_samples=num_samples, sample_rate=sample_rate, steps=steps)
        self.source = source

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            mask = self.source.uniform(self.num_samples) < self.sample_rate
            yield np.flatnonzero(mask).tolist()


def install_noise_source(optimizer: Any, source: MechanismRandomness) -> None:
    """Make an Opacus ``DPOptimizer`` add noise drawn from ``source`` (not from torch's RNG).

    Same computation as ``DPOptimizer.add_noise`` — ``p.grad = summed_grad + N(0, (σC)²)`` for
    every parameter — with only the random source replaced. Opacus's own generator is cleared so
    nothing can fall back to it silently.
    """
    from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

    def add_noise() -> None:
        std = optimizer.noise_multiplier * optimizer.max_grad_norm
        for p in optimizer.params:
            _check_processed_flag(p.summed_grad)
            noise = source.normal(p.summed_grad.shape, std, p.summed_grad.dtype,
                                  p.summed_grad.device)
            p.grad = (p.summed_grad + noise).view_as(p)
            _mark_as_processed(p.summed_grad)

    optimizer.generator = None
    optimizer.secure_mode = False
    optimizer.add_noise = add_noise
    optimizer.dphub_noise_source = source
