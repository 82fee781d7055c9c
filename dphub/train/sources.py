"""Where a run's initial weights come from: the public base (+ synthetic warm start) or a pulled
DP model (``--init-from``), and what the card says about them (public pretraining, lineage)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError, PrivacyError
from dphub.train.options import TrainOptions
from dphub.train.results import ProgressFn


@dataclass
class ModelSource:
    """Where the initial weights come from and what the card says about them."""

    model: Any
    base_public_id: str
    tokenizer_dir: Path
    public_pretraining: dict[str, Any] | None
    lineage: list[dict[str, Any]]


def initial_model(opts: TrainOptions, on_progress: ProgressFn | None) -> ModelSource:
    from dphub.encoders import resolve_base_model
    from dphub.tagger import TaggerModel

    if opts.init_from:
        return _from_pulled_model(opts)
    loadable, public_id = resolve_base_model(opts.base_model)
    if isinstance(loadable, str):
        raise ConfigError(
            f"base model {public_id!r} is not a local directory and nothing can be downloaded; "
            "pass --base-model PATH"
        )
    if opts.warm_start == "synth":
        from dphub.train import warmstart

        ws = warmstart.WarmStartConfig(max_length=opts.max_length, stride=opts.stride,
                                       rule_features=opts.rule_features)
        wdir = warmstart.warm_start(
            Path(loadable), public_id, opts.label_schema, opts.head, ws, seed=opts.seed,
            on_progress=on_progress,
        )
        model = TaggerModel.load(wdir)
        return ModelSource(model, public_id, Path(loadable), ws.card_block(seed=opts.seed), [])
    model = TaggerModel.from_base(loadable, schema=opts.label_schema, head=opts.head,
                                  rule_features=opts.rule_features)
    return ModelSource(model, public_id, Path(loadable), None, [])


def _from_pulled_model(opts: TrainOptions) -> ModelSource:
    """Fine-tune a pulled DP model: its weights start, its card gives the lineage."""
    from dphub.tagger import TaggerModel

    p = Path(str(opts.init_from)).expanduser()
    if p.is_dir():
        src = p
    else:
        from dphub.hub.registry import resolve_model

        src = Path(resolve_model(str(opts.init_from)))
    model = TaggerModel.load(src)
    if model.head != opts.head:
        raise ConfigError(f"--init-from model has head {model.head!r}, not {opts.head!r}")
    if (model.rule_features is not None) != opts.rule_features:
        has = "takes" if model.rule_features is not None else "does not take"
        flag = "--rule-features" if model.rule_features is not None else "--no-rule-features"
        raise ConfigError(f"--init-from model {has} rule features: train it with {flag}")
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    schema = cfg.get("dphub", {}).get("label_schema", opts.label_schema)
    if schema != opts.label_schema:
        raise ConfigError(f"--init-from model uses label schema {schema!r}, not {opts.label_schema!r}")
    base_id = str(cfg.get("_name_or_path") or src.name)
    from dphub.card import load_card

    meta = load_card(src).meta
    dp = meta.get("differential_privacy", {}) or {}
    base_id = str(meta.get("base_model") or base_id)
    pretraining = dp.get("public_pretraining")
    lineage: list[dict[str, Any]] = list(dp.get("lineage") or [])
    if not dp.get("private") or dp.get("epsilon") is None:
        raise PrivacyError(
            f"--init-from {opts.init_from}: the source model is not private (its card says "
            "private: false); fine-tuning it cannot produce a private model"
        )
    repo, rev = _source_repo_revision(str(opts.init_from), src, p.is_dir())
    lineage.append({
        "repo": repo,
        "revision": rev,
        "epsilon": dp.get("epsilon"),
        "delta": dp.get("delta"),
        "privacy_unit": dp.get("privacy_unit"),
    })
    return ModelSource(model, base_id, src, pretraining, lineage)


def _source_repo_revision(spec: str, src: Path, is_dir: bool) -> tuple[str, str]:
    """Public (repo, revision) of an ``--init-from`` source: hub id and pulled revision, or the
    directory name and ``local`` for a directory (never its path)."""
    if is_dir:
        return src.name, "local"
    repo, _, requested = spec.partition("@")
    rev = ""
    with contextlib.suppress(Exception):
        from dphub.hub.registry import Registry

        rev = str(Registry().get(repo, requested or None).revision or "")
    return repo, rev or requested or "unknown"
