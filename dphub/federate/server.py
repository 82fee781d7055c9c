"""The server side without Flower: the global weights, aggregation, resume and the model directory.

The ServerApp (:mod:`dphub.federate.apps`) moves messages; what it does with them is here. The
server never sees notes, labels or gradients: only each site's DP-trained weights after its
local steps (post-processing of its noisy gradients), its accounting (the fields a card
publishes) and coarse counts.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import torch

from dphub import card
from dphub.errors import ConfigError
from dphub.federate import reports, robust
from dphub.federate.site import (
    SitePolicy,
    frozen_digest,
    options_for,
    prepare_model,
    trainable_state,
)
from dphub.io import atomic_write_bytes, atomic_write_text
from dphub.privacy.federation import FEDERATION_NOT_COVERED, PARALLEL_COMPOSITION
from dphub.privacy.randomness import dp_mode
from dphub.privacy.statement import EXACT_UNITS_NOT_COVERED, RULES_NOT_COVERED
from dphub.train.output import check_output_dir, write_model_dir
from dphub.train.plan import PrivacyPlan

log = logging.getLogger(__name__)

#: mean and coarse-batch average the (bounded, clipped, probe-checked) updates; median and
#: trimmed-mean are coordinate-wise robust aggregates (trimmed-mean cuts at least one site per
#: end from 3 sites on: :mod:`dphub.federate.robust`)
AGGREGATIONS = ("mean", "coarse-batch", "median", "trimmed-mean")
#: trimmed-mean: the share cut at each end, per coordinate (at least one from 3 sites on)
TRIM_PROPORTION = robust.TRIM_PROPORTION
#: the report fields the server keeps per site (its card's accounting row and coarse counts)
SITE_ROW = ("accountant", "sample_rate", "noise_multiplier", "steps", "delta", "epsilon",
            "privacy_unit", "units", "expected_batch", "dataset", "budget_spent", "exact_units")
#: one site's reply: (weights or None, report) or (weights or None, report, Flower node id)
Reply = tuple[Any, ...]
SERVER_STATE = "server_state.json"
SERVER_WEIGHTS = "server_weights.safetensors"
ASSUMPTION = "a patient treated at two sites composes: epsilon adds"


@dataclass
class FederationConfig:
    """Everything the server needs; sites get ``options`` and the round's order from it."""

    out: Path
    options: dict[str, Any]
    rounds: int = 3
    local_steps: int = 8
    target_epsilon: float = 8.0
    aggregation: str = "mean"
    min_sites: int = 2
    round_timeout: float = 3600.0
    state_dir: Path | None = None
    force: bool = False

    def validate(self) -> None:
        """Every option, before any work (one readable line; no model, no Flower, no Ray)."""
        if self.rounds < 1 or self.local_steps < 1:
            raise ConfigError("--rounds and --local-steps must be >= 1")
        if self.aggregation not in AGGREGATIONS:
            raise ConfigError(f"--aggregation must be one of {', '.join(AGGREGATIONS)}")
        if not (math.isfinite(self.target_epsilon) and self.target_epsilon > 0):
            raise ConfigError(f"--target-epsilon must be a finite number > 0, "
                              f"got {self.target_epsilon}")
        if self.min_sites < 1:
            raise ConfigError("--min-sites must be >= 1")
        if not (math.isfinite(self.round_timeout) and self.round_timeout > 0):
            raise ConfigError("the round timeout must be a finite number > 0")
        # the shared recipe as every site will read it (same checks as dphub train's)
        options_for(self.options, data=Path("."), out=self.out, force=self.force).validate()

    def to_json(self) -> str:
        d = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FederationConfig:
        d = json.loads(text)
        d["out"] = Path(d["out"])
        d["state_dir"] = Path(d["state_dir"]) if d.get("state_dir") else None
        return cls(**d)


def _range_low(r: str) -> int:
    return int(str(r).split("-")[0])


def merge_dataset_blocks(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """One coarse ``dataset`` block from the sites' coarse blocks: each count is the range of the
    sum of the sites' lower bounds (the server never learns exact counts, so it publishes at
    least what the sites hold, never more)."""
    out = dict(blocks[0])
    for key in ("patients", "notes", "sequences", "phi_phrases"):
        out[key] = card.coarsen_count(sum(_range_low(b[key]) for b in blocks))
    for key in ("phi_per_category", "note_types"):
        names = sorted({k for b in blocks for k in b.get(key, {})})
        out[key] = {k: card.coarsen_count(sum(_range_low(b.get(key, {}).get(k, "0"))
                                             for b in blocks)) for k in names}
    out.pop("name", None)
    return out


def site_policy_row(text: Any) -> dict[str, Any] | None:
    """A report's ``policy`` (the site's own, JSON) as the card's site row records it; None
    when absent or not a policy (the report's accounting is checked either way)."""
    if not isinstance(text, str) or len(text) > 1000:
        return None
    try:
        return SitePolicy(**json.loads(text)).to_dict()
    except (ValueError, TypeError, ConfigError):
        return None


@dataclass
class FederationServer:
    """Global weights and the sites' latest reports, resumable from ``state_dir``."""

    cfg: FederationConfig
    round: int = 0
    sites: dict[str, dict[str, Any]] = field(default_factory=dict)
    bytes_per_round: list[int] = field(default_factory=list)
    #: how many replies the server dropped in each round (None: resumed from a checkpoint that
    #: did not record it); the card states it (robust.card_block)
    dropped_per_round: list[int | None] = field(default_factory=list)
    #: site id -> the Flower node that first reported it, checkpointed: a resumed server keeps
    #: the bindings (a node cannot add a second id after a restart). Only when none of a
    #: resumed round's nodes is a known one (Flower numbered the nodes afresh: the simulation,
    #: a SuperLink without a database) are they rebuilt from that round
    nodes: dict[str, int] = field(default_factory=dict)
    #: why replies of the last round were dropped (field names and numbers only)
    dropped: list[str] = field(default_factory=list)
    #: the last round's probe recall per contributing candidate (site order of the replies) and
    #: the largest norm scale-down applied (public numbers, logged)
    probe_recalls: list[float] = field(default_factory=list)
    clipped: float = 1.0

    def __post_init__(self) -> None:
        self.cfg.validate()
        check_output_dir(self.cfg.out, force=self.cfg.force)
        self.opts = options_for(self.cfg.options, out=self.cfg.out, force=self.cfg.force)
        self.src, self.model = prepare_model(self.opts)
        self.frozen_digest = frozen_digest(self.model)
        self.weights = trainable_state(self.model)
        self.initial = {k: v.clone() for k, v in self.weights.items()}
        self._probe: robust.ProbeScreen | None = None
        self._resumed_nodes = False
        self._resume()

    # ------------------------------------------------------------------ resume

    def _state_dir(self) -> Path | None:
        return self.cfg.state_dir

    def _fingerprint(self) -> str:
        c = dict(json.loads(self.cfg.to_json()))
        for k in ("force", "round_timeout", "min_sites", "state_dir"):
            c.pop(k, None)
        return json.dumps({"cfg": c, "base": self.frozen_digest}, sort_keys=True)

    def _resume(self) -> None:
        d = self._state_dir()
        if d is None or not (d / SERVER_STATE).exists():
            return
        again = "delete this --state-dir to start the federation again"
        try:
            raw = json.loads((d / SERVER_STATE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(f"{d}: the server's state cannot be read ({type(e).__name__}); "
                              f"{again}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{d}: the server's state is not a record; {again}")
        if raw.get("fingerprint") != self._fingerprint():
            raise ConfigError(f"{d}: holds the state of another federation (options differ); "
                              "choose another --state-dir or delete it")
        rnd, sites = raw.get("round"), raw.get("sites")
        if (isinstance(rnd, bool) or not isinstance(rnd, int)
                or not 1 <= rnd <= self.cfg.rounds or not isinstance(sites, dict)
                or not all(isinstance(r, dict) for r in sites.values())):
            raise ConfigError(f"{d}: the server's state has no valid round or sites; {again}")
        self.round = rnd
        self.weights = self._load_weights(d / SERVER_WEIGHTS, self.round)
        nodes = raw.get("nodes", {})
        if not (isinstance(nodes, dict) and all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                for k, v in nodes.items())):
            raise ConfigError(f"{d}: the recorded site bindings are invalid; {again}")
        self.nodes = dict(nodes)
        self._resumed_nodes = bool(self.nodes)
        self.sites = sites
        for row in self.sites.values():  # a state written before reports were checked
            try:
                # the site's policy is kept as the checked object, not the report's JSON string
                if "policy" in row and site_policy_row(json.dumps(row["policy"])) is None:
                    raise reports.Rejected("report: policy is not a site policy")
                reports.check_report({**{k: v for k, v in row.items() if k != "policy"},
                                      "site_id": "0" * 16, "trained": 0},
                                     privacy_unit=self.opts.privacy_unit,
                                     accountant=self.opts.accountant,
                                     label_schema=self.opts.label_schema,
                                     batch_size=self.opts.batch_size,
                                     max_steps=self.cfg.rounds * self.cfg.local_steps,
                                     local_steps=self.cfg.local_steps,
                                     target_epsilon=self.cfg.target_epsilon,
                                     recipe_delta=self.opts.delta)
            except reports.Rejected as e:
                raise ConfigError(f"{d}: a site's recorded report is invalid ({e.message}); "
                                  "delete this --state-dir to start the federation again") from None
        self.bytes_per_round = raw.get("bytes_per_round", [])
        drops = raw.get("dropped_per_round", [])
        if not (isinstance(drops, list) and len(drops) <= rnd and all(
                d is None or (isinstance(d, int) and not isinstance(d, bool) and d >= 0)
                for d in drops)):
            raise ConfigError(f"{d}: the server's recorded drops are invalid; {again}")
        self.dropped_per_round = [*drops, *[None] * (rnd - len(drops))]
        log.info("server: resumed after round %d", self.round)

    def _load_weights(self, path: Path, rounds: int) -> dict[str, torch.Tensor]:
        """The checkpointed global weights, refused (one line) unless they are this
        federation's parameters, finite, and no larger than ``rounds`` rounds of Adam steps
        can have made them from the initial weights."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        where = f"{path.parent}: the checkpointed weights"
        try:
            weights = load_file(str(path))
        except (OSError, SafetensorError, ValueError) as e:
            raise ConfigError(f"{where} cannot be read ({type(e).__name__}); delete this "
                              "--state-dir to start the federation again") from None
        if set(weights) != set(self.initial):
            raise ConfigError(f"{where} are not this federation's parameters; delete this "
                              "--state-dir to start the federation again")
        steps = max(1, rounds) * self.cfg.local_steps
        for name, init in self.initial.items():
            w = weights[name]
            if tuple(w.shape) != tuple(init.shape) or not w.is_floating_point():
                raise ConfigError(f"{where}: {name} is mis-shaped; delete this --state-dir "
                                  "to start the federation again")
            if not bool(torch.isfinite(w).all()):
                raise ConfigError(f"{where}: {name} is not finite; delete this --state-dir "
                                  "to start the federation again")
            # the head's initial weights may be drawn afresh in each process (no warm start), so
            # the bound is on the size: at most the initial's largest plus the rounds' reach
            bound = reports.update_bound(name, lr=self.opts.lr,
                                         rule_lr_scale=self.opts.rule_lr_scale, steps=steps)
            bound += float(init.abs().max()) if init.numel() else 0.0
            size = float(w.to(torch.float64).abs().max()) if w.numel() else 0.0
            if not size <= bound:
                raise ConfigError(f"{where}: {name} is larger than {rounds} round(s) can make "
                                  f"it ({size:.3g} > {bound:.3g}); delete this --state-dir to "
                                  "start the federation again")
            weights[name] = w.to(init.dtype)
        return weights

    def checkpoint(self) -> None:
        d = self._state_dir()
        if d is None:
            return
        from safetensors.torch import save

        d.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(d / SERVER_WEIGHTS, save({k: v.contiguous()
                                                     for k, v in self.weights.items()}))
        atomic_write_text(d / SERVER_STATE, json.dumps({
            "fingerprint": self._fingerprint(), "round": self.round, "sites": self.sites,
            "nodes": self.nodes, "bytes_per_round": self.bytes_per_round,
            "dropped_per_round": self.dropped_per_round}, indent=2) + "\n")

    # ------------------------------------------------------------------ rounds

    def order(self, rnd: int) -> dict[str, Any]:
        return {"round": rnd, "rounds": self.cfg.rounds, "local_steps": self.cfg.local_steps,
                "target_epsilon": float(self.cfg.target_epsilon),
                "frozen_digest": self.frozen_digest,
                "options": json.dumps(self.cfg.options, sort_keys=True)}

    def aggregate(self, rnd: int, replies: Sequence[Reply]) -> int:
        """Fold one round's replies in; returns how many sites contributed weights.

        A reply is ``(weights, report)`` or ``(weights, report, node_id)`` (the Flower node it
        came from). Every reply is checked before it touches the server's state
        (:mod:`dphub.federate.reports`); one that fails is dropped from this round with a
        logged reason (``self.dropped``), never the federation. The updates that pass are
        clipped to the median norm and checked on the public probe notes
        (:mod:`dphub.federate.robust`) before they are combined.
        """
        self.dropped, self.probe_recalls, self.clipped = [], [], 1.0
        ids = Counter(str(r[1].get("site_id")) if isinstance(r[1], Mapping) else None
                      for r in replies)
        self._renumbered([r[2] for r in replies if len(r) > 2 and r[2] is not None])
        seen: set[int] = set()
        checked: list[tuple[dict[str, torch.Tensor] | None, dict[str, Any], int | None]] = []
        for reply in replies:
            weights, rep = reply[0], reply[1]
            node = reply[2] if len(reply) > 2 else None
            try:
                if not isinstance(rep, Mapping):
                    raise reports.Rejected("report: not a record")
                if node is not None and node in seen:
                    raise reports.Rejected("a node replied twice in one round")
                clean = reports.check_report(
                    rep, privacy_unit=self.opts.privacy_unit, accountant=self.opts.accountant,
                    label_schema=self.opts.label_schema, batch_size=self.opts.batch_size,
                    max_steps=self.cfg.rounds * self.cfg.local_steps,
                    local_steps=self.cfg.local_steps, target_epsilon=self.cfg.target_epsilon,
                    recipe_delta=self.opts.delta)
                sid = clean["site_id"]
                self._check_identity(sid, node, ids[sid])
                reports.check_continuity(clean, self.sites.get(sid))
                reports.check_update(weights, self.weights, lr=self.opts.lr,
                                     rule_lr_scale=self.opts.rule_lr_scale,
                                     steps=int(clean["trained"]))
            except reports.Rejected as e:
                self._drop(rnd, e.message)
                continue
            if node is not None:
                seen.add(node)
                self.nodes[clean["site_id"]] = node  # its id is its node's from now on
            checked.append((weights, clean, node))
        accepted = self._screen(rnd, checked)
        for _, rep, _ in accepted:
            sid = rep["site_id"]
            self.sites[sid] = {k: rep[k] for k in SITE_ROW}
            policy = site_policy_row(rep.get("policy"))  # the site's own policy (issue 37)
            if policy is not None:
                self.sites[sid]["policy"] = policy
        trained = [(w, r) for w, r, _ in accepted if w is not None]
        if trained:
            self.weights = self._combine(trained)
        self.round = rnd
        drops = self.dropped_per_round[:rnd - 1]
        self.dropped_per_round = [*drops, *[None] * (rnd - 1 - len(drops)), len(self.dropped)]
        self.checkpoint()
        return len(trained)

    def _drop(self, rnd: int, message: str) -> None:
        self.dropped.append(message)
        log.warning("round %d: a site was dropped from the round (%s)", rnd, message)

    def _screen(self, rnd: int, checked: list[tuple[Any, dict[str, Any], int | None]]
                ) -> list[tuple[Any, dict[str, Any], int | None]]:
        """The checked replies with their updates clipped to the median norm, less those whose
        candidate model falls far below the median site's on the public probe notes."""
        idx = [i for i, (w, _, _) in enumerate(checked) if w is not None]
        if not idx:
            return checked
        deltas = robust.updates([checked[i][0] for i in idx], self.weights)
        deltas, self.clipped = robust.clip_to_median(deltas)
        if self.clipped < 1.0:
            log.info("round %d: updates clipped to the median norm (largest scale-down %.3g)",
                     rnd, self.clipped)
        cands = {i: {n: (g.to(torch.float64) + d[n]).to(g.dtype)
                     for n, g in self.weights.items()}
                 for i, d in zip(idx, deltas, strict=True)}
        out = []
        if len(idx) >= robust.PROBE_MIN_SITES:
            if self._probe is None:
                self._probe = robust.ProbeScreen(self.model, self.src.tokenizer_dir)
            self.probe_recalls = [self._probe.recall(cands[i]) for i in idx]
            ref = statistics.median(self.probe_recalls)
            for j in robust.probe_outliers(self.probe_recalls):
                out.append(idx[j])
                self._drop(rnd, f"update: probe recall {self.probe_recalls[j]:.3f}, more than "
                                f"{robust.PROBE_MARGIN:g} below the median site's ({ref:.3f})")
            log.info("round %d: probe recall of each candidate %s", rnd,
                     ", ".join(f"{r:.3f}" for r in self.probe_recalls))
        return [(cands.get(i, w), r, n) for i, (w, r, n) in enumerate(checked) if i not in out]

    def _renumbered(self, present: list[int]) -> None:
        """After a resume: when none of the first round's nodes is a known one, Flower has
        numbered the nodes afresh (the simulation; a SuperLink without a database), so the
        recorded bindings name nodes that no longer exist and are rebuilt from this round.
        A known node keeps its id (and cannot add a second one) across restarts."""
        if not self._resumed_nodes or not present:
            return
        self._resumed_nodes = False
        if not set(present) & set(self.nodes.values()):
            log.info("server: every node is new after the resume: site bindings rebuilt")
            self.nodes = {}

    def _check_identity(self, sid: str, node: int | None, times: int) -> None:
        """One site id, one accountant, one node: a bound id answers only from its node (an
        echo from another node is refused, the bound site kept), a node never adds a second
        id, and an unbound id twice in one round is refused (the server cannot tell which
        is the site's: both wait for a round without the echo)."""
        bound = self.nodes.get(sid)
        if node is not None:
            if bound is not None and bound != node:
                raise reports.Rejected("a site id already bound to another node")
            if any(n == node and s != sid for s, n in self.nodes.items()):
                raise reports.Rejected("a node reported a second site id")
        if times > 1 and (node is None or bound is None):
            raise reports.Rejected("one site id twice in one round")

    def _combine(self, trained: list[tuple[dict[str, torch.Tensor], dict[str, Any]]]
                 ) -> dict[str, torch.Tensor]:
        """The new global weights from the accepted sites' (bounded, clipped) weights."""
        agg = self.cfg.aggregation
        if agg in ("median", "trimmed-mean"):
            fn = robust.coordinate_median if agg == "median" else robust.trimmed_mean
            return {n: fn(torch.stack([w[n].to(torch.float64) for w, _ in trained])).to(old.dtype)
                    for n, old in self.weights.items()}
        if agg == "mean":
            weights = [1.0] * len(trained)
        else:  # coarse-batch: the lower bound of the site's coarse expected batch
            weights = [float(max(1, _range_low(r["expected_batch"]))) for _, r in trained]
        total = sum(weights)
        new = {}
        for name, old in self.weights.items():
            acc = torch.zeros_like(old, dtype=torch.float64)
            for (w, _), a in zip(trained, weights, strict=True):
                acc += a * w[name].to(torch.float64)
            new[name] = (acc / total).to(old.dtype)
        return new

    def all_spent(self, expected: int) -> bool:
        return (len(self.sites) >= expected
                and all(s.get("budget_spent") for s in self.sites.values()))

    # ------------------------------------------------------------------ the model directory

    def write(self) -> dict[str, Any]:
        """The federated model as an ordinary dphub model directory (card with federation)."""
        sites = [s for s in self.sites.values() if int(s["steps"]) > 0]
        if not sites:
            raise ConfigError("no site trained: nothing to write")
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if name in self.weights:
                    p.copy_(self.weights[name].to(p.dtype))
        self.model.eval()
        worst = max(sites, key=lambda s: float(s["epsilon"]))
        delta = max(float(s["delta"]) for s in sites)
        eps = float(worst["epsilon"])
        opts = self.opts
        plan = PrivacyPlan(0, round(1 / float(worst["sample_rate"])), float(worst["sample_rate"]),
                           int(worst["steps"]), int(worst["steps"]),
                           float(worst["noise_multiplier"]), delta, False)
        accounting_rows = sorted(
            ({k: s[k] for k in ("accountant", "sample_rate", "noise_multiplier", "steps", "delta",
                                "epsilon", "privacy_unit", "policy") if k in s} for s in sites),
            key=lambda r: (r["epsilon"], r["sample_rate"], r["steps"]))
        eps_all = [float(s["epsilon"]) for s in sites]
        units = sum(_range_low(s["units"]) for s in sites)
        datasets = [json.loads(s["dataset"]) for s in sites]
        src = self.src
        try:
            flwr_version = importlib_metadata.version("flwr")
        except importlib_metadata.PackageNotFoundError:  # pragma: no cover
            flwr_version = "unknown"

        def make_meta(sha: str) -> dict[str, Any]:
            recall = ({"enabled": True, "delta_p": float(opts.recall_weight),
                       "rho": "1 + delta_p * FNR_i", "computed_from": "own-detached-predictions"}
                      if opts.recall_weight > 0 else {"enabled": False})
            common: dict[str, Any] = {"recall_weighting": recall,
                                      "public_pretraining": src.public_pretraining
                                      or {"enabled": False}}
            if src.lineage:
                common["lineage"] = src.lineage
            dp = card.dp_block(
                accountant=str(worst["accountant"]), sample_rate=plan.sample_rate,
                noise_multiplier=float(plan.noise_multiplier), steps=plan.steps, delta=delta,
                privacy_unit=opts.privacy_unit, max_grad_norm=opts.max_grad_norm,
                epochs=round(plan.steps * plan.sample_rate, 4),
                max_examples_per_unit=opts.max_examples_per_unit, num_units=units,
                grad_sample_mode="hooks", secure_rng=opts.secure_rng, epsilon=eps,
                mechanism_rng=dp_mode(opts.secure_rng), weights_sha256=sha, **common)
            extra = [RULES_NOT_COVERED] if opts.rule_features else []
            if any(s.get("exact_units") for s in sites):
                extra.append(EXACT_UNITS_NOT_COVERED)
            dp["not_covered"] = [*dp["not_covered"], *extra, *FEDERATION_NOT_COVERED]
            dp["federation"] = {
                "sites": card.coarsen_count(len(sites)),
                "rounds": int(self.round),
                "local_steps": int(self.cfg.local_steps),
                "epsilon_range": [min(eps_all), max(eps_all)],
                "aggregation": self.cfg.aggregation,
                "composition": PARALLEL_COMPOSITION,
                "assumption": ASSUMPTION,
                "flwr_version": flwr_version,
                "site_accounting": accounting_rows,
                "robustness": robust.card_block(self.cfg.aggregation,
                                                self.dropped_per_round[:self.round]),
            }
            dataset = merge_dataset_blocks(datasets)
            meta = card.card_meta(dp, dataset, base_model=src.base_public_id)
            return card.with_card_text(meta, opts.card_text or {})

        return write_model_dir(self.cfg.out, self.model, src, opts, plan, plan.steps, eps,
                               make_meta)

