"""One federated site: dphub's own DP-SGD on the site's patients, one accountant over all rounds.

No Flower here: the ClientApp (:mod:`dphub.federate.apps`) hands a round's order and the global
weights to :meth:`Site.train_round` and sends back what it returns. Why the pieces are what they
are:

* the step loop is :class:`dphub.train.loop.TrainLoop` itself (Poisson sampling of patients from
  the mechanism's OS-seeded randomness, per-patient clipping, Opacus noise), so a federated step
  is exactly a ``dphub train`` step;
* ONE accountant per site over every local step of every round: its history (σ, q, steps) is
  persisted in the site's state file (atomically, 0600) after each round and restored before the
  next, so a restarted site continues its accounting instead of starting from zero;
* σ is planned once, for ``rounds × local_steps`` steps at the site's target ε, and kept in the
  state file; a site never takes a step that would take its ε past the target (it trains fewer
  steps in its last round, then answers "budget spent");
* only the parameters trained under DP travel (the head, the CRF, the rule projection: the
  frozen public base never leaves), and the site refuses a round whose frozen base differs from
  its own (same digest on every site);
* the site owns its guarantee (:class:`SitePolicy`): the server's target ε, σ, δ and unit are
  requests, and a round asking for more than the site's policy is refused before the accountant
  is touched;
* one process per state directory (a file lock: :func:`hold_state_dir` for ``join``'s life,
  :func:`locked_state_dir` around each round elsewhere): two processes on one accountant
  would each count only their own steps.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import secrets
import tomllib
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock, Timeout

from dphub import card
from dphub.errors import ConfigError, PrivacyError
from dphub.io import atomic_write_text, file_sha256
from dphub.privacy import accounting
from dphub.privacy.composition import GaussianSteps, Part
from dphub.privacy.ledger import footprint, record_federated_round, site_round_problem
from dphub.privacy.units import PRIVACY_UNITS, UnitDataset
from dphub.train.data import check_patient_ids, encode_notes, load_training_notes
from dphub.train.encoder_cache import FrozenEncoderCache
from dphub.train.loop import TrainLoop, quiet_epsilon
from dphub.train.options import TrainOptions, default_delta
from dphub.train.plan import PrivacyPlan
from dphub.train.sources import initial_model

log = logging.getLogger(__name__)

STATE_FILE = "site_state.json"
STATE_FORMAT = 1
LOCK_FILE = ".lock"

#: TrainOptions fields the server sends every site (all sites train the same recipe).
FEDERATED_OPTIONS = (
    "base_model", "warm_start", "accountant", "batch_size", "max_physical_batch",
    "max_grad_norm", "lr", "privacy_unit", "max_examples_per_unit", "head", "train_layers",
    "recall_weight", "rule_features", "rule_lr_scale", "label_schema", "max_length", "stride",
    "seed", "secure_rng", "noise", "delta",
)


def options_for(options: dict[str, Any], **extra: Any) -> TrainOptions:
    """The site's (or the server's) TrainOptions from the federation's options."""
    unknown = set(options) - set(FEDERATED_OPTIONS)
    if unknown:
        raise ConfigError(f"federation options: unknown {', '.join(sorted(unknown))}")
    opts = TrainOptions(**{k: v for k, v in options.items() if v is not None}, **extra)
    opts.checkpoint_every = 10**9  # the site's state file is its checkpoint
    return opts


def prepare_model(opts: TrainOptions) -> tuple[Any, Any]:
    """The initial model as ``dphub train`` builds it (same source, rule features, trainable
    set): server and sites must start from identical frozen weights."""
    src = initial_model(opts, None)
    model = src.model
    if opts.rule_features and model.rule_features is None:
        model.add_rule_features()
    elif not opts.rule_features and model.rule_features is not None:
        raise ConfigError("the initial model takes rule features: train with rule_features")
    model.set_trainable(train_layers=opts.train_layers, lora_rank=opts.lora_rank)
    model.max_length, model.stride = opts.max_length, opts.stride
    return src, model


def trainable_names(model: torch.nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


def frozen_digest(model: torch.nn.Module) -> str:
    """SHA-256 over every tensor that does not train (the public base every site must share)."""
    trainable = set(trainable_names(model))
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        if name in trainable:
            continue
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable(model: torch.nn.Module, arrays: dict[str, torch.Tensor]) -> None:
    """Copy the global weights into the trainable parameters (exactly those, same shapes)."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if set(arrays) != set(params):
        raise ConfigError("the server's parameters are not this site's trainable parameters "
                          "(different recipe or base)")
    with torch.no_grad():
        for n, p in params.items():
            t = torch.as_tensor(arrays[n])
            if tuple(t.shape) != tuple(p.shape):
                raise ConfigError(f"the server's {n} has shape {tuple(t.shape)}, "
                                  f"expected {tuple(p.shape)}")
            if not bool(torch.isfinite(t).all()):
                raise ConfigError(f"the server's {n} is not finite")
            p.copy_(t.to(p.dtype))


class PolicyRefused(PrivacyError):
    """A round asked for more than the site's own privacy policy allows (nothing was spent)."""


@dataclass(frozen=True)
class SitePolicy:
    """The site's own guarantee: what it accepts whatever the server asks.

    The server's target ε, σ, δ and privacy unit are requests; a round asking for a larger ε
    over all rounds, less noise, a larger δ or another unit is refused. Defaults are safe: ε 8
    over all rounds (``dphub train``'s default target), σ at least 0.5, δ at most
    ``min(1e-5, 1/(10 N))`` (None: that default), patient-level.
    """

    max_epsilon: float = 8.0
    min_noise: float = 0.5
    delta: float | None = None
    unit: str = "patient"

    def __post_init__(self) -> None:
        def bad(name: str, value: Any, want: str) -> ConfigError:
            return ConfigError(f"site policy: {name} {value!r} must be {want}")

        for name in ("max_epsilon", "min_noise"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise bad(name, v, "a number")
        if not (math.isfinite(self.max_epsilon) and 0 < self.max_epsilon <= 100):
            raise bad("max_epsilon", self.max_epsilon, "finite, > 0 and <= 100")
        if not (math.isfinite(self.min_noise) and self.min_noise > 0):
            raise bad("min_noise", self.min_noise, "finite and > 0")
        if self.delta is not None and (isinstance(self.delta, bool)
                                       or not isinstance(self.delta, int | float)
                                       or not (math.isfinite(self.delta)
                                               and 0 < self.delta < 1e-2)):
            raise bad("delta", self.delta, "a number in (0, 0.01)")
        if self.unit not in PRIVACY_UNITS:
            raise bad("unit", self.unit, "one of " + ", ".join(PRIVACY_UNITS))

    @classmethod
    def from_file(cls, path: Path) -> SitePolicy:
        """A policy file: TOML (``.toml``) or JSON, keys as the fields (unknown keys refused)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
            raw = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the site policy ({e.strerror})") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not a site policy ({type(e).__name__})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: not a site policy (a table of settings)")
        unknown = set(raw) - {"max_epsilon", "min_noise", "delta", "unit"}
        if unknown:
            raise ConfigError(f"{path}: unknown site policy settings "
                              f"{', '.join(sorted(map(str, unknown)))}")
        return cls(**raw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check_options(self, opts: TrainOptions) -> None:
        """The recipe's requests: unit, fixed σ, fixed δ (before anything is built or spent)."""
        if opts.privacy_unit != self.unit:
            raise PolicyRefused(f"the round asks for privacy unit {opts.privacy_unit}; this "
                                f"site's policy is {self.unit}")
        if opts.noise is not None and not float(opts.noise) >= self.min_noise:
            raise PolicyRefused(f"the round asks for noise {float(opts.noise):g}; this site's "
                                f"policy is at least {self.min_noise:g}")
        if opts.delta is not None and self.delta is not None \
                and not float(opts.delta) <= self.delta:
            raise PolicyRefused(f"the round asks for delta {float(opts.delta):g}; this site's "
                                f"policy is at most {self.delta:g}")

    def check_order(self, order: RoundOrder) -> None:
        """The round's requested ε over all rounds (a request: never above the policy's)."""
        if not order.target_epsilon <= self.max_epsilon * (1 + accounting.CLAIM_RTOL):
            raise PolicyRefused(f"the round asks for epsilon {order.target_epsilon:g} over all "
                                f"rounds; this site's policy is at most {self.max_epsilon:g}")

    def check_state(self, st: SiteState) -> None:
        """The accountant's own numbers, planned or restored, against the policy."""
        if not st.target_epsilon <= self.max_epsilon * (1 + accounting.CLAIM_RTOL):
            raise PolicyRefused(f"the round asks for epsilon {st.target_epsilon:g} over all "
                                f"rounds; this site's policy is at most {self.max_epsilon:g}")
        if not st.noise_multiplier >= self.min_noise:
            raise PolicyRefused(f"the round needs noise {st.noise_multiplier:.3g}; this site's "
                                f"policy is at least {self.min_noise:g}")
        if self.delta is not None and not st.delta <= self.delta:
            raise PolicyRefused(f"the site's delta {st.delta:g} is above its policy's "
                                f"{self.delta:g}")


_HELD: dict[Path, FileLock] = {}


def _lock(state_dir: Path) -> tuple[Path, FileLock]:
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = state_dir.resolve()
    lock = FileLock(key / LOCK_FILE, thread_local=False, mode=0o600)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise ConfigError(f"{state_dir}: in use by another dphub process (one accountant per "
                          "site: stop the other one first)") from None
    return key, lock


def hold_state_dir(state_dir: Path) -> None:
    """Lock ``state_dir`` for this process's life (``join``: one accountant, one process).

    A second process is refused at once with one line; the lock is the OS's (``flock``), so
    a killed process releases it. Idempotent within one process.
    """
    if Path(state_dir).resolve() in _HELD:
        return
    key, lock = _lock(state_dir)
    _HELD[key] = lock


@contextlib.contextmanager
def locked_state_dir(state_dir: Path) -> Iterator[None]:
    """``state_dir`` locked for one round (or held already by this process, as ``join``
    does). Per round, not per process: Flower's simulation may run one site's rounds in
    different worker processes, one at a time."""
    if Path(state_dir).resolve() in _HELD:
        yield
        return
    _, lock = _lock(state_dir)
    try:
        yield
    finally:
        lock.release()


@dataclass
class RoundOrder:
    """What the server asks of a site in one round."""

    round: int
    rounds: int
    local_steps: int
    target_epsilon: float
    frozen_digest: str


@dataclass
class SiteState:
    """The site's persisted accounting: one accountant over all rounds."""

    site_id: str
    data_sha256: str
    accountant: str
    sample_rate: float
    noise_multiplier: float
    delta: float
    target_epsilon: float
    num_units: int
    history: list[list[float]] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return int(sum(int(h[2]) for h in self.history))

    def epsilon(self, steps: int | None = None) -> float:
        t = self.steps if steps is None else steps
        return accounting.epsilon_for(self.accountant, self.sample_rate, self.noise_multiplier,
                                      t, self.delta)

    @classmethod
    def load(cls, path: Path) -> SiteState | None:
        if not path.exists():
            return None
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if raw.pop("format") != STATE_FORMAT:
                raise ValueError("format")
            return cls(**raw)
        except (ValueError, TypeError, KeyError) as e:
            raise ConfigError(f"{path}: not a dphub site state ({type(e).__name__}); it holds "
                              "the site's spent privacy budget, so it is never ignored") from None

    def save(self, path: Path) -> None:
        raw = {"format": STATE_FORMAT, **self.__dict__}
        atomic_write_text(path, json.dumps(raw, indent=2) + "\n")  # mkstemp: mode 0600


class Site:
    """A site's model, patients and accountant, reused across rounds within one process."""

    def __init__(self, data: Path, state_dir: Path, options: dict[str, Any],
                 policy: SitePolicy | None = None, *, site_id: str | None = None) -> None:
        self.data, self.state_dir = Path(data), Path(state_dir)
        self.site_id = site_id  # a deployed site's: its node key's id (deploy.node_key_id)
        self.state_path = self.state_dir / STATE_FILE
        self.policy = policy or SitePolicy()
        self.opts = options_for(options, data=self.data, out=self.state_dir / "unused")
        self.policy.check_options(self.opts)
        with locked_state_dir(self.state_dir):  # refused at once while another process runs it
            pass
        self.data_sha256 = file_sha256(self.data)  # a state file of other data is refused
        notes = load_training_notes(self.opts)
        check_patient_ids(notes, self.opts.privacy_unit)
        self.src, model = prepare_model(self.opts)
        from transformers import AutoTokenizer  # heavy: only where a site is built

        self.tokenizer = AutoTokenizer.from_pretrained(self.src.tokenizer_dir)
        examples = encode_notes(
            notes, self.tokenizer, model.tags, self.opts.label_schema,
            max_length=self.opts.max_length, stride=self.opts.stride,
            unit=self.opts.privacy_unit, rule_features=self.opts.rule_features,
        )
        if not examples:
            raise ConfigError(f"{self.data}: the labelled notes contain no tokens")
        self.dataset = UnitDataset.from_windows(
            [e.input_ids for e in examples], [e.labels for e in examples],
            [e.unit for e in examples], max_examples_per_unit=self.opts.max_examples_per_unit,
            features=[e.features for e in examples] if self.opts.rule_features else None,
        )
        self.patients = footprint(notes)  # issues 38, 53: the ledger record (patients, notes)
        self.model = model
        self.names = trainable_names(model)
        self.frozen_digest = frozen_digest(model)
        self.dataset_meta = card.dataset_block(notes, label_schema=self.opts.label_schema,
                                               sequences=self.dataset.num_windows)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        if self.opts.train_layers == 0 and self.opts.lora_rank is None:
            # head-only: the frozen encoder's outputs once, for all rounds (as dphub train does)
            model.encoder = FrozenEncoderCache(model.encoder, [e.input_ids for e in examples],
                                               pad_id)
        model.train()
        self.loop: TrainLoop | None = None
        del notes

    # ------------------------------------------------------------------ accounting state

    def _new_state(self, order: RoundOrder) -> SiteState:
        n = len(self.dataset)
        k = max(1, round(n / self.opts.batch_size))
        q = 1.0 / k
        delta = self.opts.delta if self.opts.delta is not None else default_delta(n)
        if self.policy.delta is not None:
            delta = min(delta, self.policy.delta)
        self.policy.check_order(order)
        if delta > 1.0 / n:
            raise PrivacyError(f"delta {delta:g} exceeds 1/N for this site; choose delta <= 1/N")
        planned = order.rounds * order.local_steps
        if self.opts.noise is not None:
            sigma = float(self.opts.noise)
        else:
            sigma = accounting.noise_for_target_epsilon(
                self.opts.accountant, order.target_epsilon, q, planned, delta, 0.01)
        return SiteState(site_id=self.site_id or secrets.token_hex(8), data_sha256=self.data_sha256,
                         accountant=self.opts.accountant, sample_rate=q,
                         noise_multiplier=float(sigma), delta=float(delta),
                         target_epsilon=float(order.target_epsilon), num_units=n)

    def state(self, order: RoundOrder | None = None) -> SiteState | None:
        st = SiteState.load(self.state_path)
        if st is not None:
            if st.data_sha256 != self.data_sha256 or st.num_units != len(self.dataset):
                raise ConfigError(f"{self.state_path}: was written for other data; a site's "
                                  "accountant covers one set of patients")
            if self.site_id is not None and st.site_id != self.site_id:
                raise ConfigError(f"{self.state_path}: belongs to another site id than this "
                                  "node key's (a replaced key or state directory)")
            if st.accountant != self.opts.accountant:
                raise ConfigError(f"{self.state_path}: accountant {st.accountant}, the "
                                  f"federation uses {self.opts.accountant}")
            return st
        if order is None:
            return None
        st = self._new_state(order)
        self.policy.check_state(st)  # before the state exists: a refused round spends nothing
        st.save(self.state_path)
        return st

    def _steps_this_round(self, st: SiteState, k: int) -> int:
        """The most of ``k`` steps that keep ε within the site's target (0: budget spent)."""
        limit = st.target_epsilon * (1 + accounting.CLAIM_RTOL)
        for take in range(k, 0, -1):  # k is small (local steps per round)
            if st.epsilon(st.steps + take) <= limit:
                return take
        return 0

    def _ensure_loop(self, st: SiteState) -> TrainLoop:
        if self.loop is None:
            plan = PrivacyPlan(len(self.dataset), round(1 / st.sample_rate), st.sample_rate,
                               0, 0, st.noise_multiplier, st.delta, False)
            self.loop = TrainLoop(self.opts, plan, self.model, self.dataset, self.tokenizer,
                                  None)
        return self.loop

    # ------------------------------------------------------------------ one round

    def train_round(self, order: RoundOrder, arrays: dict[str, torch.Tensor]
                    ) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        """Train ``order.local_steps`` DP steps (fewer if the budget ends) from ``arrays``.

        Returns the new trainable weights (None when the budget is spent) and the site's
        report: its accounting over ALL its rounds (never the round's alone) and coarse counts.
        """
        with locked_state_dir(self.state_dir):
            return self._train_round(order, arrays)

    def _train_round(self, order: RoundOrder, arrays: dict[str, torch.Tensor]
                     ) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        if order.frozen_digest != self.frozen_digest:
            raise ConfigError("the server's public base differs from this site's (frozen "
                              "weights digest); pull the same base model")
        self.policy.check_options(self.opts)
        self.policy.check_order(order)
        st = self.state(order)
        assert st is not None
        self.policy.check_state(st)  # a restored accountant too (the policy may be stricter now)
        why = site_round_problem(  # issue 53: with what the ledger records on these patients
            st.site_id, GaussianSteps(st.accountant, st.sample_rate, st.noise_multiplier,
                                      st.steps), Part(st.target_epsilon, st.delta),
            self.patients, self.policy.max_epsilon)
        if why:
            raise PolicyRefused(why)
        take = self._steps_this_round(st, order.local_steps)
        if take == 0:
            return None, self.report(st, trained=0)
        loop = self._ensure_loop(st)
        load_trainable(self.model, arrays)
        acc = loop.engine.accountant
        # ONE accountant over all rounds: restore its history from the state file
        acc.history = [(float(s), float(q), int(t)) for s, q, t in st.history]
        loop.step = st.steps
        loop.plan.steps = st.steps + take
        loop.rng_state = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loop.run(self.state_dir / "unused-checkpoint", "")
        if loop.step != st.steps + take:  # pragma: no cover - invariant
            raise PrivacyError(f"internal: took {loop.step - st.steps} steps, planned {take}")
        history = [[float(s), float(q), int(t)] for s, q, t in acc.history]
        if len(history) != 1 or not np.isclose(history[0][1], st.sample_rate) \
                or not np.isclose(history[0][0], st.noise_multiplier):
            raise PrivacyError("internal: the site's accountant saw another (σ, q)")
        st.history = history
        st.rounds = [*st.rounds, int(order.round)]
        st.save(self.state_path)
        eps = quiet_epsilon(acc, st.delta)
        record_federated_round(  # issue 38: this site's spend, all its rounds, in its ledger
            st.site_id, GaussianSteps(st.accountant, st.sample_rate, st.noise_multiplier,
                                      st.steps),
            epsilon=eps, delta=st.delta, privacy_unit=self.opts.privacy_unit,
            patients=self.patients)
        log.info("site: round %d, %d local steps, %d in all, epsilon %.3f", order.round, take,
                 st.steps, eps)
        return trainable_state(self.model), self.report(st, trained=take)

    def report(self, st: SiteState, *, trained: int) -> dict[str, Any]:
        """What the server learns: accounting (as a card records it) and coarse counts only."""
        return {
            "site_id": st.site_id,
            "trained": int(trained),
            "budget_spent": self._steps_this_round(st, 1) == 0,
            "accountant": st.accountant,
            "sample_rate": float(st.sample_rate),
            "noise_multiplier": float(st.noise_multiplier),
            "steps": int(st.steps),
            "delta": float(st.delta),
            "epsilon": float(st.epsilon()),
            "privacy_unit": self.opts.privacy_unit,
            "units": card.coarsen_count(st.num_units),
            # q = 1/N publishes N itself (as for one site: the card then says so)
            "exact_units": bool(round(1 / st.sample_rate) == st.num_units > 1),
            "expected_batch": card.coarsen_count(max(1, round(st.sample_rate * st.num_units))),
            "dataset": json.dumps(self.dataset_meta, sort_keys=True),
            "policy": json.dumps(self.policy.to_dict(), sort_keys=True),
        }
