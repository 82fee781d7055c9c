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
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import torch

from dphub import card
from dphub.errors import ConfigError
from dphub.federate import reports
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

#: mean and coarse-batch average the (bounded) updates; median and trimmed-mean are Flower's
#: robust aggregates (coordinate-wise), for federations that expect a lying site
AGGREGATIONS = ("mean", "coarse-batch", "median", "trimmed-mean")
#: trimmed-mean: the share cut at each end, per coordinate (Flower's FedTrimmedAvg default)
TRIM_PROPORTION = 0.2
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
    #: site id -> the Flower node that first reported it (this server process; a resumed
    #: server rebinds, and a known site's row still only continues its own accounting)
    nodes: dict[str, int] = field(default_factory=dict)
    #: why replies of the last round were dropped (field names and numbers only)
    dropped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cfg.validate()
        check_output_dir(self.cfg.out, force=self.cfg.force)
        self.opts = options_for(self.cfg.options, out=self.cfg.out, force=self.cfg.force)
        self.src, self.model = prepare_model(self.opts)
        self.frozen_digest = frozen_digest(self.model)
        self.weights = trainable_state(self.model)
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
        raw = json.loads((d / SERVER_STATE).read_text(encoding="utf-8"))
        if raw.get("fingerprint") != self._fingerprint():
            raise ConfigError(f"{d}: holds the state of another federation (options differ); "
                              "choose another --state-dir or delete it")
        from safetensors.torch import load_file

        self.weights = load_file(str(d / SERVER_WEIGHTS))
        self.round = int(raw["round"])
        self.sites = raw["sites"]
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
                                     local_steps=self.cfg.local_steps)
            except reports.Rejected as e:
                raise ConfigError(f"{d}: a site's recorded report is invalid ({e.message}); "
                                  "delete this --state-dir to start the federation again") from None
        self.bytes_per_round = raw.get("bytes_per_round", [])
        log.info("server: resumed after round %d", self.round)

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
            "bytes_per_round": self.bytes_per_round}, indent=2) + "\n")

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
        logged reason (``self.dropped``), never the federation.
        """
        self.dropped = []
        ids = Counter(str(r[1].get("site_id")) if isinstance(r[1], Mapping) else None
                      for r in replies)
        accepted: list[tuple[dict[str, torch.Tensor] | None, dict[str, Any], int | None]] = []
        for reply in replies:
            weights, rep = reply[0], reply[1]
            node = reply[2] if len(reply) > 2 else None
            try:
                if not isinstance(rep, Mapping):
                    raise reports.Rejected("report: not a record")
                clean = reports.check_report(
                    rep, privacy_unit=self.opts.privacy_unit, accountant=self.opts.accountant,
                    label_schema=self.opts.label_schema, batch_size=self.opts.batch_size,
                    max_steps=self.cfg.rounds * self.cfg.local_steps,
                    local_steps=self.cfg.local_steps)
                sid = clean["site_id"]
                self._check_identity(sid, node, ids[sid])
                reports.check_continuity(clean, self.sites.get(sid))
                reports.check_update(weights, self.weights, lr=self.opts.lr,
                                     rule_lr_scale=self.opts.rule_lr_scale,
                                     steps=int(clean["trained"]))
            except reports.Rejected as e:
                self.dropped.append(e.message)
                log.warning("round %d: a site was dropped from the round (%s)", rnd, e.message)
                continue
            accepted.append((weights, clean, node))
        for _, rep, node in accepted:
            sid = rep["site_id"]
            if node is not None:
                self.nodes[sid] = node
            self.sites[sid] = {k: rep[k] for k in SITE_ROW}
            policy = site_policy_row(rep.get("policy"))  # the site's own policy (issue 37)
            if policy is not None:
                self.sites[sid]["policy"] = policy
        trained = [(w, r) for w, r, _ in accepted if w is not None]
        if trained:
            self.weights = self._combine(trained)
        self.round = rnd
        self.checkpoint()
        return len(trained)

    def _check_identity(self, sid: str, node: int | None, times: int) -> None:
        """One site id, one accountant, one node: refuse a second reply with a known id."""
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
        """The new global weights from the accepted sites' (bounded) weights."""
        agg = self.cfg.aggregation
        if agg in ("median", "trimmed-mean"):
            # Flower's robust aggregates (optional dependency: imported where used)
            from flwr.server.strategy.aggregate import aggregate_median, aggregate_trimmed_avg

            names = list(self.weights)
            arrays = [([w[n].to(torch.float64).numpy() for n in names], 1) for w, _ in trained]
            out = (aggregate_median(arrays) if agg == "median"
                   else aggregate_trimmed_avg(arrays, TRIM_PROPORTION))
            return {n: torch.as_tensor(a).to(self.weights[n].dtype)
                    for n, a in zip(names, out, strict=True)}
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
            }
            dataset = merge_dataset_blocks(datasets)
            meta = card.card_meta(dp, dataset, base_model=src.base_public_id)
            return card.with_card_text(meta, opts.card_text or {})

        return write_model_dir(self.cfg.out, self.model, src, opts, plan, plan.steps, eps,
                               make_meta)

