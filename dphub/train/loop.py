"""The step loop, DP (Opacus) or not, with its resumable state.

Privacy mechanics (why the code looks the way it does):

* The privacy *unit* (patient by default) is what the guarantee protects, so sampling and clipping
  work on units, not windows: the Poisson sampler draws units with probability ``q``; after the
  backward pass every parameter's per-window ``grad_sample`` rows are summed per unit
  (``aggregate_grad_sample_by_unit``) and Opacus's ``DPOptimizer`` clips each unit's gradient to
  ``max_grad_norm`` and adds Gaussian noise; every physical batch is checked to hand the optimizer
  exactly one row per sampled unit. ``BatchMemoryManager`` splits a logical batch by dataset
  items, i.e. by whole units, so one unit never straddles two physical batches.
* The noise and the Poisson draws come from :mod:`dphub.privacy.randomness`: seeded from the OS on
  every run, never from ``--seed``.
* An empty Poisson batch still takes a step (noise only): skipping it would change the mechanism
  the accountant assumes.
* Recall weighting multiplies sample ``i``'s loss by ``rho_i = 1 + delta_p * FNR_i`` where
  ``FNR_i`` comes from sample ``i``'s own detached predictions; it only rescales that sample's
  gradient before per-unit clipping, so the sensitivity bound (and ε) is unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dphub.errors import ConfigError, PrivacyError
from dphub.privacy import units  # aggregate/check called through it: tests replace them
from dphub.privacy.randomness import (
    MechanismRandomness,
    PoissonUnitSampler,
    install_noise_source,
)
from dphub.privacy.units import batch_num_units, unit_collate
from dphub.train.checkpoints import save_checkpoint
from dphub.train.data import window_loss
from dphub.train.options import TrainOptions
from dphub.train.plan import PrivacyPlan
from dphub.train.results import Progress, ProgressFn

log = logging.getLogger(__name__)


class TrainingDiverged(ConfigError):
    """A loss, gradient or weight became inf or NaN: the run stops, nothing is written.

    Why stop instead of going on: with ``--lr 1e308`` every head and CRF tensor became ±inf, the
    run finished, and the model "de-identified" notes by removing nothing. Under DP a non-finite
    per-unit gradient also defeats clipping (the noisy sum becomes NaN whatever the others
    contributed), so no guarantee could be stated for what follows either.
    """


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def param_groups(model: torch.nn.Module, params: list[torch.nn.Parameter],
                 opts: TrainOptions) -> list[dict[str, Any]]:
    """Optimizer groups: the rule features' projection at ``lr * rule_lr_scale``, the rest at ``lr``.

    Why: ``rule_proj`` is a handful of weights per tag with a strong, consistent gradient (how far
    to trust each rule flag); at the head's learning rate the recipe's few noisy steps cannot move
    them far from the public warm start. The step size is a post-processing choice of the noisy
    gradients, so the guarantee is unchanged.
    """
    rule = {id(p) for name, p in model.named_parameters() if name.startswith("rule_proj.")}
    rest = [p for p in params if id(p) not in rule]
    groups: list[dict[str, Any]] = [{"params": rest, "lr": opts.lr}] if rest else []
    mine = [p for p in params if id(p) in rule]
    if mine:
        groups.append({"params": mine, "lr": opts.lr * opts.rule_lr_scale})
    return groups


#: Fewest seconds between two recomputations of the ε shown on progress lines.
EPSILON_REFRESH_S = 5.0


def quiet_epsilon(accountant: Any, delta: float) -> float:
    """The accountant's ε, without numpy's edge-case warnings (q = 1) reaching the terminal."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return float(accountant.get_epsilon(delta))


class TrainLoop:
    """The step loop, DP (Opacus) or not, with its resumable state.

    Both modes draw units by Poisson sampling (:class:`~dphub.privacy.randomness.PoissonUnitSampler`)
    so ``--no-dp`` is an ablation of clipping and noise only. Under DP the sampler and the noise
    draw from a :class:`~dphub.privacy.randomness.MechanismRandomness` seeded from the OS on every
    run (never from ``--seed``); without DP the data order follows ``--seed``.
    """

    def __init__(self, opts: TrainOptions, plan: PrivacyPlan, model: Any, dataset: Any,
                 tokenizer: Any, on_progress: ProgressFn | None) -> None:
        self.opts, self.plan, self.model, self.on_progress = opts, plan, model, on_progress
        self.params = trainable_parameters(model)
        self.optimizer: Any = torch.optim.Adam(param_groups(model, self.params, opts), lr=opts.lr)
        self.source = MechanismRandomness.for_run(
            private=not opts.no_dp, secure=opts.secure_rng, seed=opts.seed
        )
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.sampler = PoissonUnitSampler(
            num_samples=len(dataset), sample_rate=plan.sample_rate, source=self.source,
            steps=plan.steps_per_epoch,
        )
        loader: Any = torch.utils.data.DataLoader(
            dataset, batch_sampler=self.sampler,
            collate_fn=functools.partial(unit_collate, pad_id=pad_id),
        )
        self.engine: Any = None
        if not opts.no_dp:
            from opacus import PrivacyEngine

            from dphub.tagger_model import register_grad_sampler

            register_grad_sampler()  # the CRF's exact per-sample gradient, before the wrap
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.engine = PrivacyEngine(accountant=opts.accountant)
                # poisson_sampling=False: the loader's batch sampler already *is* a Poisson
                # sampler (ours, drawing from the mechanism's randomness); Opacus would replace
                # it by one drawing from torch's seeded global generator
                gsm, self.optimizer, loader = self.engine.make_private(
                    module=model, optimizer=self.optimizer, data_loader=loader,
                    noise_multiplier=plan.noise_multiplier, max_grad_norm=opts.max_grad_norm,
                    loss_reduction="mean", poisson_sampling=False, grad_sample_mode="hooks",
                )
            gsm.forbid_grad_accumulation()
            install_noise_source(self.optimizer, self.source)
            # Opacus sets int(N * q), which is 0 when N * q rounds below 1 in floating point
            self.optimizer.expected_batch_size = plan.expected_batch_units
            if abs(1.0 / len(loader) - plan.sample_rate) > 1e-12:  # pragma: no cover
                raise PrivacyError("internal: sampler rate differs from the accounted rate")
            account = self.optimizer.step_hook

            def _hook(opt: Any) -> None:
                account(opt)
                self.step += 1

            self.optimizer.step_hook = _hook
        self.loader = loader
        self.step = 0
        self.losses: list[float] = []
        self.rng_state: dict[str, Any] | None = None
        self._eps: float | None = None
        self._eps_step: int | None = None
        self._eps_at = -math.inf  # when it was computed (monotonic) ...
        self._eps_cost = 0.0  # ... and what that cost, in seconds
        self._t0 = time.monotonic()
        self._done = 0

    def restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.engine is not None:
            self.engine.accountant.load_state_dict(state["accountant"])
        self.step = int(state["step"])
        self.losses = [float("nan") if v is None else float(v) for v in state.get("losses", [])]
        self.rng_state = state["rng"]

    def checkpoint(self, path: Path, fingerprint: str) -> None:
        save_checkpoint(path, {
            "fingerprint": fingerprint,
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "accountant": self.engine.accountant.state_dict() if self.engine else None,
            # DP runs: the mechanism's generator is never stored (fresh OS entropy on resume)
            "rng": {"torch": torch.get_rng_state(), "data_order": self.source.state()},
            "losses": [None if math.isnan(v) else v for v in self.losses],
        })

    def _report(self, loss: float) -> None:
        if self.on_progress is None:
            return
        n = self.step
        now = time.monotonic()
        # ε is recomputed at checkpoints, at the end, and otherwise as often as keeps its cost
        # under ~5% of the run (an accountant call measured 0.2 s for RDP, 0.6-1.1 s for PRV on
        # 2 busy cores); the line says the step it belongs to (issue 56: it was stale, unsaid)
        due = (n % self.opts.checkpoint_every == 0 or n == self.plan.steps or self._eps is None
               or now - self._eps_at >= max(EPSILON_REFRESH_S, 20 * self._eps_cost))
        if self.engine is not None and due:
            with contextlib.suppress(Exception):
                self._eps = quiet_epsilon(self.engine.accountant, self.plan.delta)
                self._eps_step = n
            self._eps_at = time.monotonic()
            self._eps_cost = self._eps_at - now
        el = time.monotonic() - self._t0
        phase = "train" if self.engine is not None else "train-nodp"  # say which it is
        self.on_progress(Progress(phase, n, self.plan.steps, loss, self._eps,
                                  self._done / el if el > 0 else None,
                                  None if self._eps_step in (None, n) else self._eps_step))

    def _diverged(self, what: str, step: int) -> TrainingDiverged:
        scale = (f" (x{self.opts.rule_lr_scale:g} for the rule projection)"
                 if self.opts.rule_features else "")
        return TrainingDiverged(
            f"training stopped at step {step} of {self.plan.steps}: {what} became non-finite "
            f"(inf or NaN), so the model would be broken; nothing was written. Most likely the "
            f"learning rate {self.opts.lr:g}{scale} is too large: train again with a smaller "
            f"--lr (default {TrainOptions.lr:g})"
        )

    def _check_loss(self, per: torch.Tensor) -> None:
        """Before the backward pass: a non-finite loss gives non-finite gradients."""
        if not bool(torch.isfinite(per.detach()).all()):
            raise self._diverged("the loss", self.step + 1)

    def _check_step(self) -> None:
        """After an optimizer step, before its gradients are cleared: the gradient it applied
        (under DP the noisy one) and the weights it produced are finite."""
        for what, tensors in (("a gradient", [p.grad for p in self.params]),
                              ("the weights", list(self.params))):
            if any(t is not None and not bool(torch.isfinite(t).all()) for t in tensors):
                raise self._diverged(what, self.step)

    def _after_step(self, loss: float, ckpt: Path, fingerprint: str) -> bool:
        """Bookkeeping after a logical step; True when the loop must stop (test kill)."""
        self.losses.append(loss)
        self._done += 1
        if self.step % self.opts.checkpoint_every == 0 and self.step < self.plan.steps:
            self.checkpoint(ckpt, fingerprint)
        self._report(loss)
        return self.opts._stop_after is not None and self.step >= self.opts._stop_after

    def run(self, ckpt: Path, fingerprint: str) -> None:
        remaining = self.plan.steps - self.step
        if remaining <= 0:
            return
        self.loader.batch_sampler.steps = remaining
        if self.engine is not None:
            from opacus.utils.batch_memory_manager import BatchMemoryManager

            ctx: Any = BatchMemoryManager(
                data_loader=self.loader, max_physical_batch_size=self.opts.max_physical_batch,
                optimizer=self.optimizer,
            )
        else:
            ctx = contextlib.nullcontext(self.loader)
        with ctx as phys_loader:
            it = iter(phys_loader)
            # creating the iterator may draw from the sampler's generator: restore afterwards,
            # so a resumed run draws exactly the batches the uninterrupted run would have drawn
            if self.rng_state is not None:
                torch.set_rng_state(self.rng_state["torch"])
                self.source.set_state(self.rng_state.get("data_order"))
            with warnings.catch_warnings():
                # frozen embeddings: torch notes that backward hooks fire on outputs only
                warnings.filterwarnings("ignore", message="Full backward hook")
                if self.engine is not None:
                    self._run_dp(it, ckpt, fingerprint)
                else:
                    self._run_plain(it, ckpt, fingerprint)

    def _run_dp(self, it: Iterator[Any], ckpt: Path, fingerprint: str) -> None:
        step_loss: list[float] = []
        for batch in it:
            before = self.step
            n_units = batch_num_units(batch) if isinstance(batch, dict) else 0
            if n_units == 0:  # empty Poisson batch: a noise-only step
                units.aggregate_grad_sample_by_unit(self.model, torch.zeros(0, dtype=torch.long), 0)
            else:
                per = window_loss(self.model, batch, self.opts.recall_weight)
                self._check_loss(per)
                per.mean().backward()
                step_loss.append(float(per.detach().mean()))
                units.aggregate_grad_sample_by_unit(self.model, batch["unit_index"], n_units)
            # the guarantee's invariant, checked on every physical batch: the optimizer is about
            # to clip exactly one gradient per sampled unit
            units.check_one_gradient_per_unit(self.model, n_units)
            self.optimizer.step()
            if self.step > before:
                self._check_step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.step > before:
                loss = float(np.mean(step_loss)) if step_loss else float("nan")
                step_loss = []
                if self._after_step(loss, ckpt, fingerprint):
                    return

    def _run_plain(self, it: Iterator[Any], ckpt: Path, fingerprint: str) -> None:
        for batch in it:
            n_units = batch_num_units(batch) if isinstance(batch, dict) else 0
            loss = float("nan")
            if n_units:
                total = int(batch["input_ids"].shape[0])
                acc = 0.0
                for chunk in _physical_chunks(batch, self.opts.max_physical_batch):
                    per = window_loss(self.model, chunk, self.opts.recall_weight)
                    self._check_loss(per)
                    (per.sum() / total).backward()
                    acc += float(per.detach().sum())
                self.optimizer.step()
            self.step += 1
            if n_units:
                self._check_step()
                self.optimizer.zero_grad(set_to_none=True)
                loss = acc / total
            if self._after_step(loss, ckpt, fingerprint):
                return


def _physical_chunks(batch: dict[str, torch.Tensor], max_units: int) -> list[dict[str, torch.Tensor]]:
    """Split a non-private logical batch into chunks of at most ``max_units`` whole units."""
    ui = batch["unit_index"]
    n_units = int(batch["unit_sizes"].numel())
    out = []
    for start in range(0, n_units, max_units):
        sel = (ui >= start) & (ui < start + max_units)
        out.append({k: v[sel] for k, v in batch.items() if k != "unit_sizes"})
    return out
