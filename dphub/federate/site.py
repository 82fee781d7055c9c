"""One federated site: dphub's own DP-SGD on the site's patients, one accountant over all rounds.

No Flower here: the ClientApp (:mod:`dphub.federate.apps`) hands a round's order and the global
weights to :meth:`Site.train_round` and sends back what it returns. Why the pieces are what they
are:

* the step loop is :class:`dphub.train.loop.TrainLoop` itself (Poisson sampling of patients from
  the mechanism's OS-seeded randomness, per-patient clipping, Opacus noise), so a federated step
  is exactly a ``dphub train`` step;
* ONE accountant per site over every local step of every round of every federation: each
  federation's history (σ, q, steps) is persisted in the site's state file (atomically, 0600)
  after each round and restored before the next, so a restarted site continues its accounting
  instead of starting from zero; a key without its state file, or a state file older than the
  site's privacy ledger, is refused (a lost accountant, never a fresh start);
* σ is planned per federation (keyed by its id, :mod:`dphub.federate.terms`), once, for its
  ``rounds × local_steps`` steps at its target ε; the site's ε over ALL its federations is the
  composition of every plan's history, bounded by its policy: a new federation adds, it never
  restarts. A site never takes a step that would take a federation's ε past its target or the
  site's total past its policy (it trains fewer steps, then answers "budget spent"); absurd
  orders (above the caps of :mod:`dphub.federate.terms`) are refused before any plan;
* only the parameters trained under DP travel (the head, the CRF, the rule projection: the
  frozen public base never leaves), and the site refuses a round whose frozen base differs from
  its own (same digest on every site);
* the site owns its guarantee (:class:`SitePolicy`): the server's target ε, σ, δ and unit are
  requests, and a round asking for more than the site's policy (δ capped at
  ``min(1e-5, 1/(10 N))`` by default) is refused before the accountant is touched; a pinned
  site (``join --federation``) refuses any order of another federation before anything;
* one process per state directory (``flock`` on the directory itself: :func:`hold_state_dir` for ``join``'s life,
  :func:`locked_state_dir` around each round elsewhere): two processes on one accountant
  would each count only their own steps.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import secrets
import tomllib
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dphub import card
from dphub.errors import ConfigError, PrivacyError
from dphub.federate.terms import (
    MAX_PLANNED_NOISE,
    FederationRefused,
    FederationTerms,
    size_problem,
)
from dphub.io import atomic_write_text, file_sha256
from dphub.privacy import accounting
from dphub.privacy.composition import GaussianSteps, Part, history_epsilon
from dphub.privacy.ledger import (
    federated_release_id,
    footprint,
    load_ledger,
    record_federated_round,
    site_round_problem,
)
from dphub.privacy.units import PRIVACY_UNITS, UnitDataset
from dphub.train.data import check_patient_ids, encode_notes, load_training_notes
from dphub.train.encoder_cache import FrozenEncoderCache
from dphub.train.loop import TrainLoop, quiet_epsilon
from dphub.train.options import TrainOptions, default_delta
from dphub.train.plan import PrivacyPlan
from dphub.train.sources import initial_model

log = logging.getLogger(__name__)

STATE_FILE = "site_state.json"
STATE_FORMAT = 2
#: the site's node key in its state directory (``join``; :mod:`dphub.federate.deploy`)
NODE_KEY = "node_key"

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


def recipe_frozen_digest(options: dict[str, Any]) -> str:
    """The frozen digest of the initial model this recipe builds (``serve``'s terms: every
    site must train over exactly this public base)."""
    _, model = prepare_model(options_for(options, data=Path("."), out=Path("unused")))
    return frozen_digest(model)


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
        # with no δ in the policy its cap is min(1e-5, 1/(10 N)): 1e-5 at most, whatever N
        cap = self.delta if self.delta is not None else 1e-5
        if opts.delta is not None and not float(opts.delta) <= cap:
            raise PolicyRefused(f"the round asks for delta {float(opts.delta):g}; this site's "
                                f"policy is at most {cap:g}")

    def delta_cap(self, num_units: int) -> float:
        """The largest δ this site accepts: its policy's, else ``min(1e-5, 1/(10 N))``."""
        return float(self.delta) if self.delta is not None else default_delta(num_units)

    def check_order(self, order: RoundOrder) -> None:
        """The round's requested ε over all rounds (a request: never above the policy's)."""
        if not order.target_epsilon <= self.max_epsilon * (1 + accounting.CLAIM_RTOL):
            raise PolicyRefused(f"the round asks for epsilon {order.target_epsilon:g} over all "
                                f"rounds; this site's policy is at most {self.max_epsilon:g}")

    def check_state(self, st: SiteState, num_units: int) -> None:
        """The accountant's own numbers, planned or restored, against the policy."""
        if not st.target_epsilon <= self.max_epsilon * (1 + accounting.CLAIM_RTOL):
            raise PolicyRefused(f"the round asks for epsilon {st.target_epsilon:g} over all "
                                f"rounds; this site's policy is at most {self.max_epsilon:g}")
        if not st.noise_multiplier >= self.min_noise:
            raise PolicyRefused(f"the round needs noise {st.noise_multiplier:.3g}; this site's "
                                f"policy is at least {self.min_noise:g}")
        if not st.delta <= self.delta_cap(num_units):
            raise PolicyRefused(f"the site's delta {st.delta:g} is above its policy's "
                                f"{self.delta_cap(num_units):g}")


_HELD: dict[Path, int] = {}


def _lock(state_dir: Path) -> tuple[Path, int]:
    """An exclusive ``flock`` on the state directory itself (its open descriptor).

    Not a lock file inside it (``filelock``): a deleted lock file lets a second process lock
    a new one beside the first holder's. The directory cannot be replaced without replacing
    the accountant and the key with it. The OS releases the lock when the process dies."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = state_dir.resolve()
    fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY)  # not inherited by children (PEP 446)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ConfigError(f"{state_dir}: in use by another dphub process (one accountant per "
                          "site: stop the other one first)") from None
    return key, fd


def hold_state_dir(state_dir: Path) -> None:
    """Lock ``state_dir`` for this process's life (``join``: one accountant, one process).

    A second process is refused at once with one line; the lock is the OS's (``flock`` on
    the directory), so a killed process releases it. Idempotent within one process.
    """
    if Path(state_dir).resolve() in _HELD:
        return
    key, fd = _lock(state_dir)
    _HELD[key] = fd


@contextlib.contextmanager
def locked_state_dir(state_dir: Path) -> Iterator[None]:
    """``state_dir`` locked for one round (or held already by this process, as ``join``
    does). Per round, not per process: Flower's simulation may run one site's rounds in
    different worker processes, one at a time."""
    if Path(state_dir).resolve() in _HELD:
        yield
        return
    _, fd = _lock(state_dir)
    try:
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the flock


def _order_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float) \
            or not (math.isfinite(v) and float(v).is_integer()):
        raise ValueError
    return int(v)


@dataclass
class RoundOrder:
    """What the server asks of a site in one round (refused at once when absurd)."""

    round: int
    rounds: int
    local_steps: int
    target_epsilon: float
    frozen_digest: str

    def __post_init__(self) -> None:
        problem = size_problem(self.rounds, self.local_steps, self.target_epsilon)
        if problem is None and not (isinstance(self.round, int) and self.round >= 1):
            problem = f"round {self.round!r}: must be an integer >= 1"
        if problem is not None:
            raise PolicyRefused(f"the round's order is refused: {problem}")

    @classmethod
    def from_config(cls, cfg: Any) -> RoundOrder:
        """An order from a message's config record: numbers checked, never coerced."""
        try:
            values = [_order_int(cfg[k]) for k in ("round", "rounds", "local_steps")]
            target = cfg["target_epsilon"]
            if isinstance(target, bool) or not isinstance(target, int | float):
                raise ValueError
            digest = cfg["frozen_digest"]
            if not isinstance(digest, str):
                raise ValueError
        except (KeyError, TypeError, ValueError, OverflowError):
            raise PolicyRefused("the round's order is malformed (round, rounds, local_steps, "
                                "target_epsilon, frozen_digest)") from None
        return cls(values[0], values[1], values[2], float(target), digest)


@dataclass
class SiteState:
    """One federation's plan at this site and its accountant's history (σ, q, steps)."""

    federation: str
    accountant: str
    sample_rate: float
    noise_multiplier: float
    delta: float
    target_epsilon: float
    planned_steps: int
    history: list[list[float]] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return int(sum(int(h[2]) for h in self.history))

    def epsilon(self, steps: int | None = None) -> float:
        t = self.steps if steps is None else steps
        return accounting.epsilon_for(self.accountant, self.sample_rate, self.noise_multiplier,
                                      t, self.delta)

    def gaussian(self, steps: int | None = None) -> GaussianSteps:
        return GaussianSteps(self.accountant, self.sample_rate, self.noise_multiplier,
                             self.steps if steps is None else steps)


#: the plan id of a format-1 state file (one plan, its federation unknown): it counts in the
#: site's composition and is never continued
FORMAT1_PLAN = "format-1"


@dataclass
class SiteAccounts:
    """The site's state file: ONE accountant over every federation it took part in.

    Each federation has its own plan (keyed by the federation's id), and the site's privacy
    loss is the composition of every plan's history: a new federation ADDS to it, it never
    restarts it (what keeps ε honest: the patients are the same)."""

    site_id: str
    data_sha256: str
    num_units: int | None = None
    plans: dict[str, SiteState] = field(default_factory=dict)

    def history(self, extra: SiteState | None = None, extra_steps: int = 0
                ) -> list[GaussianSteps]:
        skip = extra.federation if extra is not None else None
        out = [p.gaussian() for k, p in self.plans.items() if p.steps > 0 and k != skip]
        if extra is not None and extra_steps > 0:
            out.append(extra.gaussian(extra_steps))
        return out

    def total_epsilon(self, delta: float, extra: SiteState | None = None,
                      extra_steps: int = 0) -> float:
        """The site's ε over all its federations at ``delta`` (``extra``: one plan at
        ``extra_steps`` instead of its own steps), composed by one accountant."""
        steps = self.history(extra, extra_steps)
        if not steps:
            return 0.0
        method = "prv" if all(s.accountant == "prv" for s in steps) else "rdp"
        return history_epsilon(method, steps, delta)

    @classmethod
    def load(cls, path: Path) -> SiteAccounts | None:
        if not path.exists():
            return None
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            fmt = raw.pop("format")
            if fmt == 1:  # one plan of an unknown federation (dphub before issue 53)
                plan = SiteState(federation=FORMAT1_PLAN, accountant=raw["accountant"],
                                 sample_rate=raw["sample_rate"],
                                 noise_multiplier=raw["noise_multiplier"],
                                 delta=raw["delta"], target_epsilon=raw["target_epsilon"],
                                 planned_steps=0, history=raw["history"],
                                 rounds=raw["rounds"])
                return cls(raw["site_id"], raw["data_sha256"], raw["num_units"],
                           {FORMAT1_PLAN: plan})
            if fmt != STATE_FORMAT:
                raise ValueError("format")
            plans = {k: SiteState(**v) for k, v in raw.pop("plans").items()}
            if any(p.federation != k for k, p in plans.items()):
                raise ValueError("plans")
            return cls(**raw, plans=plans)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise ConfigError(f"{path}: not a dphub site state ({type(e).__name__}); it holds "
                              "the site's spent privacy budget, so it is never ignored") from None

    def save(self, path: Path) -> None:
        raw = {"format": STATE_FORMAT, "site_id": self.site_id,
               "data_sha256": self.data_sha256, "num_units": self.num_units,
               "plans": {k: asdict(v) for k, v in self.plans.items()}}
        atomic_write_text(path, json.dumps(raw, indent=2) + "\n")  # mkstemp: mode 0600


def init_state(state_dir: Path, site_id: str, data: Path) -> None:
    """The site's (empty) accountant, written with its node key (``join``): from then on a key
    without its state file is a lost accountant, never a fresh start."""
    path = Path(state_dir) / STATE_FILE
    if not path.exists():
        SiteAccounts(site_id, file_sha256(Path(data))).save(path)


def check_state_present(state_dir: Path) -> None:
    """A state directory holding the site's node key must hold its accountant too."""
    state_dir = Path(state_dir)
    if (state_dir / NODE_KEY).exists() and not (state_dir / STATE_FILE).exists():
        raise ConfigError(f"{state_dir}: holds this site's node key but not its accountant "
                          f"({STATE_FILE}): its spent budget is lost; restore {STATE_FILE} "
                          "from where it went, or join as a new site with a new --state "
                          "directory (a new key to register)")


class Site:
    """A site's model, patients and accountant, reused across rounds within one process.

    ``terms``: the federation this site agreed to (``join --federation``); every order is
    compared with it before anything is built or spent. Without terms (``simulate``, whose
    operator is every site's), the order itself names the federation its plan belongs to.
    """

    def __init__(self, data: Path, state_dir: Path, options: dict[str, Any],
                 policy: SitePolicy | None = None, *, site_id: str | None = None,
                 terms: FederationTerms | None = None) -> None:
        self.data, self.state_dir = Path(data), Path(state_dir)
        self.site_id = site_id  # a deployed site's: its node key's id (deploy.node_key_id)
        self.state_path = self.state_dir / STATE_FILE
        self.policy = policy or SitePolicy()
        self.terms = terms
        self.options = dict(options)
        if terms is not None and terms.option_diffs(self.options):
            raise FederationRefused("the round's recipe is not the federation this site "
                                    "agreed to (differs in "
                                    f"{', '.join(terms.option_diffs(self.options))})")
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
        self._check_delta()
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
        self._loop_plan: str | None = None
        del notes

    # ------------------------------------------------------------------ accounting state

    def _check_delta(self) -> float:
        """The δ this site trains at: the recipe's, else the default; never above the cap."""
        n = len(self.dataset)
        cap = self.policy.delta_cap(n)
        if self.opts.delta is not None and not float(self.opts.delta) <= cap:
            raise PolicyRefused(f"the round asks for delta {float(self.opts.delta):g}; this "
                                f"site's policy is at most {cap:g} (min(1e-5, 1/(10 N)) "
                                "unless the policy sets one)")
        delta = float(self.opts.delta) if self.opts.delta is not None else default_delta(n)
        delta = min(delta, cap)
        if delta > 1.0 / n:
            raise PrivacyError(f"delta {delta:g} exceeds 1/N for this site; choose delta <= 1/N")
        return delta

    def federation_id(self, order: RoundOrder) -> str:
        """The federation an order belongs to: the agreed terms', else the order's own."""
        if self.terms is not None:
            return self.terms.federation_id()
        return FederationTerms.for_order(order.rounds, order.local_steps, order.target_epsilon,
                                         self.options, order.frozen_digest).federation_id()

    def _new_plan(self, accounts: SiteAccounts, order: RoundOrder, fid: str) -> SiteState:
        """σ for this federation's ``rounds × local_steps`` at its target ε, checked against
        the policy and against what the site already spent in other federations."""
        n = len(self.dataset)
        k = max(1, round(n / self.opts.batch_size))
        q = 1.0 / k
        delta = self._check_delta()
        self.policy.check_order(order)
        planned = order.rounds * order.local_steps
        if self.opts.noise is not None:
            sigma = float(self.opts.noise)
        elif accounting.epsilon_for(self.opts.accountant, q, MAX_PLANNED_NOISE, planned,
                                    delta) > order.target_epsilon:
            sigma = math.inf  # the bound itself is not enough: no search (it could run long)
        else:
            sigma = accounting.noise_for_target_epsilon(
                self.opts.accountant, order.target_epsilon, q, planned, delta, 0.01)
        if not sigma <= MAX_PLANNED_NOISE:
            raise PolicyRefused(f"the federation needs noise above {MAX_PLANNED_NOISE:g} for "
                                f"epsilon {order.target_epsilon:g} over {planned} steps: its "
                                "updates would be noise")
        st = SiteState(federation=fid, accountant=self.opts.accountant, sample_rate=q,
                       noise_multiplier=float(sigma), delta=float(delta),
                       target_epsilon=float(order.target_epsilon), planned_steps=planned)
        self.policy.check_state(st, n)
        cap = self.policy.delta_cap(n)
        total = accounts.total_epsilon(cap, st, planned)
        if not total <= self.policy.max_epsilon * (1 + accounting.CLAIM_RTOL):
            raise PolicyRefused(f"the federation would take this site's epsilon over all its "
                                f"federations to {total:.3g} (delta {cap:g}); its policy is "
                                f"at most {self.policy.max_epsilon:g}")
        return st

    def _check_ledger(self, accounts: SiteAccounts, fid: str) -> None:
        """The state file is not older than the site's own privacy ledger (a restored copy
        would forget spent steps): every federation the ledger recorded for this site id
        is in the state, with at least the steps the ledger recorded."""
        ledger = load_ledger()
        for key in {fid, *accounts.plans}:
            rel = ledger.find(federated_release_id(f"{accounts.site_id}:{key}"))
            if rel is None:
                continue
            recorded = sum(s.steps for s in rel.history)
            plan = accounts.plans.get(key)
            if plan is None or plan.steps < recorded:
                raise ConfigError(f"{self.state_path}: is older than this site's privacy ledger "
                                  f"({recorded} steps recorded, {plan.steps if plan else 0} "
                                  "in the state file; a restored copy?): the accountant "
                                  "cannot go back; restore the newest state file")

    def accounts(self) -> SiteAccounts | None:
        """The site's state file, checked against this site (None: no accountant yet)."""
        check_state_present(self.state_dir)
        acc = SiteAccounts.load(self.state_path)
        if acc is None:
            return None
        n = len(self.dataset)
        if acc.data_sha256 != self.data_sha256 or acc.num_units not in (None, n):
            raise ConfigError(f"{self.state_path}: was written for other data; a site's "
                              "accountant covers one set of patients")
        if self.site_id is not None and acc.site_id != self.site_id:
            raise ConfigError(f"{self.state_path}: belongs to another site id than this "
                              "node key's (a replaced key or state directory)")
        return acc

    def state(self, order: RoundOrder | None = None) -> SiteState | None:
        """This order's federation's plan: restored, or planned now (saved before any step;
        a refused plan writes nothing)."""
        acc = self.accounts()
        if order is None:
            return None if acc is None else next(iter(acc.plans.values()), None)
        fid = self.federation_id(order)
        if acc is None:
            acc = SiteAccounts(self.site_id or secrets.token_hex(8), self.data_sha256)
        self._check_ledger(acc, fid)
        st = acc.plans.get(fid)
        if st is not None:
            if st.accountant != self.opts.accountant:
                raise ConfigError(f"{self.state_path}: accountant {st.accountant}, the "
                                  f"federation uses {self.opts.accountant}")
            return st
        st = self._new_plan(acc, order, fid)  # before the state exists: a refusal spends nothing
        acc.num_units = len(self.dataset)
        acc.plans[fid] = st
        acc.save(self.state_path)
        return st

    def _steps_this_round(self, acc: SiteAccounts, st: SiteState, k: int) -> int:
        """The most of ``k`` steps that keep this federation's ε within its target and the
        site's ε over all its federations within its policy (0: budget spent). ε grows with
        the steps, so a bisection (a few accountant calls, not ``k``)."""
        limit = st.target_epsilon * (1 + accounting.CLAIM_RTOL)
        site_limit = self.policy.max_epsilon * (1 + accounting.CLAIM_RTOL)
        cap = self.policy.delta_cap(len(self.dataset))

        def fits(take: int) -> bool:
            return (st.epsilon(st.steps + take) <= limit
                    and acc.total_epsilon(cap, st, st.steps + take) <= site_limit)

        lo, hi = 0, k
        if fits(hi):
            return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    def _ensure_loop(self, st: SiteState) -> TrainLoop:
        plan = PrivacyPlan(len(self.dataset), round(1 / st.sample_rate), st.sample_rate,
                           0, 0, st.noise_multiplier, st.delta, False)
        if self.loop is None:
            self.loop = TrainLoop(self.opts, plan, self.model, self.dataset, self.tokenizer,
                                  None)
        elif self._loop_plan != st.federation:
            # another federation's plan in this process (same recipe, so same data and q):
            # Opacus's optimizer noises with its noise_multiplier at every step, and the
            # accountant records it (checked after the round)
            if not np.isclose(self.loop.plan.sample_rate, st.sample_rate):
                raise PrivacyError("internal: another federation's plan with another q")
            self.loop.plan = plan
            self.loop.optimizer.noise_multiplier = float(st.noise_multiplier)
        self._loop_plan = st.federation
        return self.loop

    # ------------------------------------------------------------------ one round

    def train_round(self, order: RoundOrder, arrays: dict[str, torch.Tensor]
                    ) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
        """Train ``order.local_steps`` DP steps (fewer if the budget ends) from ``arrays``.

        Returns the new trainable weights (None when the budget is spent) and the site's
        report: its accounting over ALL this federation's rounds (never the round's alone)
        and coarse counts.
        """
        if self.terms is not None:  # before the lock, the state file, anything
            self.terms.check_order(rounds=order.rounds, local_steps=order.local_steps,
                                   target_epsilon=order.target_epsilon,
                                   frozen_digest=order.frozen_digest, options=self.options)
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
        acc = self.accounts()
        assert acc is not None
        self.policy.check_state(st, len(self.dataset))  # restored too (the policy may be stricter)
        full = max(st.planned_steps, st.steps)
        why = site_round_problem(  # issue 53: with what the ledger records on these patients
            f"{acc.site_id}:{st.federation}", st.gaussian(),
            # the site's one accountant over all its federations, this plan's steps in full;
            # the ledger adds the releases made elsewhere on these patients
            Part(acc.total_epsilon(st.delta, st, full), st.delta, tuple(acc.history(st, full))),
            self.patients, self.policy.max_epsilon,
            composed=[f"{acc.site_id}:{k}" for k in acc.plans if k != st.federation])
        if why:
            raise PolicyRefused(why)
        take = self._steps_this_round(acc, st, order.local_steps)
        if take == 0:
            return None, self.report(acc, st, trained=0)
        loop = self._ensure_loop(st)
        load_trainable(self.model, arrays)
        engine_acc = loop.engine.accountant
        # ONE accountant over all this federation's rounds: its history from the state file
        engine_acc.history = [(float(s), float(q), int(t)) for s, q, t in st.history]
        loop.step = st.steps
        loop.plan.steps = st.steps + take
        loop.rng_state = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loop.run(self.state_dir / "unused-checkpoint", "")
        if loop.step != st.steps + take:  # pragma: no cover - invariant
            raise PrivacyError(f"internal: took {loop.step - st.steps} steps, planned {take}")
        history = [[float(s), float(q), int(t)] for s, q, t in engine_acc.history]
        if len(history) != 1 or not np.isclose(history[0][1], st.sample_rate) \
                or not np.isclose(history[0][0], st.noise_multiplier):
            raise PrivacyError("internal: the site's accountant saw another (σ, q)")
        st.history = history
        st.rounds = [*st.rounds, int(order.round)]
        acc.plans[st.federation] = st
        acc.save(self.state_path)
        eps = quiet_epsilon(engine_acc, st.delta)
        record_federated_round(  # issue 38: this site's spend in this federation, its ledger
            f"{acc.site_id}:{st.federation}", st.gaussian(),
            epsilon=eps, delta=st.delta, privacy_unit=self.opts.privacy_unit,
            patients=self.patients)
        log.info("site: round %d, %d local steps, %d in all, epsilon %.3f (%.3f over all "
                 "federations)", order.round, take, st.steps, eps,
                 acc.total_epsilon(self.policy.delta_cap(len(self.dataset))))
        return trainable_state(self.model), self.report(acc, st, trained=take)

    def report(self, acc: SiteAccounts, st: SiteState, *, trained: int) -> dict[str, Any]:
        """What the server learns: this federation's accounting (as a card records it) and
        coarse counts only."""
        n = len(self.dataset)
        return {
            "site_id": acc.site_id,
            "trained": int(trained),
            "budget_spent": self._steps_this_round(acc, st, 1) == 0,
            "accountant": st.accountant,
            "sample_rate": float(st.sample_rate),
            "noise_multiplier": float(st.noise_multiplier),
            "steps": int(st.steps),
            "delta": float(st.delta),
            "epsilon": float(st.epsilon()),
            "privacy_unit": self.opts.privacy_unit,
            "units": card.coarsen_count(n),
            # q = 1/N publishes N itself (as for one site: the card then says so)
            "exact_units": bool(round(1 / st.sample_rate) == n > 1),
            "expected_batch": card.coarsen_count(max(1, round(st.sample_rate * n))),
            "dataset": json.dumps(self.dataset_meta, sort_keys=True),
            "policy": json.dumps(self.policy.to_dict(), sort_keys=True),
        }
