"""Where a run's initial weights come from: the public base (+ synthetic warm start) or a pulled
DP model (``--init-from``), and what the card says about them (public pretraining, lineage)."""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dphub.card import (
    LINEAGE_INIT_FROM,
    SYNTH_DATASET,
    is_public_model,
    join_problems,
    load_card,
    meta_problems,
)
from dphub.encoders import encoder_digest, resolve_base_model
from dphub.errors import ConfigError, DphubError, ModelError, PrivacyError
from dphub.io import file_sha256
from dphub.privacy.composition import run_history
from dphub.registry import Registry, resolve_model
from dphub.tagger import TaggerModel
from dphub.train import warmstart
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
    #: :func:`dphub.encoders.encoder_digest` of the public base encoder the weights descend from
    #: (recorded as ``training_config.json`` ``base_model_sha256``; the publish gate compares it
    #: with the declared base's). None: not known (a source trained before it was recorded).
    base_sha256: str | None = None
    #: the ``--init-from`` model's weights digest (its card's ``weights_sha256``): how the privacy
    #: ledger finds its record
    parent_weights_sha256: str | None = None


def initial_model(opts: TrainOptions, on_progress: ProgressFn | None) -> ModelSource:
    if opts.init_from:
        _no_encoder_layers(opts, "--init-from starts from a trained model")
        return _from_pulled_model(opts)
    public_base = _from_public_base(opts)
    if public_base is not None:
        _no_encoder_layers(opts, f"--base-model {opts.base_model} is a public base model")
        return public_base
    loadable, public_id = resolve_base_model(opts.base_model)
    if isinstance(loadable, str):
        raise ConfigError(
            f"base model {public_id!r} is not a local directory and nothing can be downloaded; "
            "pass --base-model PATH"
        )
    digest = _base_digest(Path(loadable))
    if opts.warm_start == "synth":
        wdir, block = warm_start_dir(opts, on_progress)
        model = TaggerModel.load(wdir)
        return ModelSource(model, public_id, Path(loadable), block, [], digest)
    model = TaggerModel.from_base(loadable, schema=opts.label_schema, head=opts.head,
                                  rule_features=opts.rule_features,
                                  encoder_layers=opts.encoder_layers)
    return ModelSource(model, public_id, Path(loadable), None, [], digest)


def _base_digest(base_dir: Path) -> str:
    """What the base encoder's weights are (:func:`dphub.encoders.encoder_digest`), so the card's
    base name can be checked against them; an encoder that cannot be identified is refused."""
    try:
        return encoder_digest(base_dir)
    except ModelError as e:
        raise ConfigError(f"base model: {e.message}") from None


def recorded_base_digest(model_dir: Path) -> str | None:
    """The ``base_model_sha256`` a model directory's ``training_config.json`` records (None when
    absent or unreadable): a model trained from it descends from the same public encoder."""
    try:
        cfg = json.loads((model_dir / "training_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = cfg.get("base_model_sha256") if isinstance(cfg, dict) else None
    return value if isinstance(value, str) else None


def _no_encoder_layers(opts: TrainOptions, why: str) -> None:
    """A trained model keeps its encoder's depth: its head was trained on that depth's output."""
    if opts.encoder_layers is not None:
        raise ConfigError(f"--encoder-layers applies to a base encoder only; {why}, whose "
                          "encoder depth is fixed")


def warm_start_dir(opts: TrainOptions,
                   on_progress: ProgressFn | None = None) -> tuple[Path, dict[str, Any]]:
    """The public warm start these options train from (built and cached on first use) and its
    card block. It is itself a model directory: scoring it shows what public data alone gives."""
    loadable, public_id = resolve_base_model(opts.base_model)
    if isinstance(loadable, str):
        raise ConfigError(f"base model {public_id!r} is not a local directory")
    ws = warmstart.WarmStartConfig(max_length=opts.max_length, stride=opts.stride,
                                   rule_features=opts.rule_features,
                                   encoder_layers=opts.encoder_layers)
    # one public warm start for every --seed (WARM_START_SEED): the seed acts on the private stage
    wdir = warmstart.warm_start(Path(loadable), public_id, opts.label_schema, opts.head, ws,
                                seed=warmstart.WARM_START_SEED, on_progress=on_progress)
    return wdir, ws.card_block(seed=warmstart.WARM_START_SEED)


#: a hub-style model id (``name`` or ``org/name``), as cards record base models
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")


def _public_base_dir(spec: str | None) -> tuple[Path, str] | None:
    """(directory, public name) of a ``dphub pretrain`` model named by ``--base-model``, else None.

    A local directory is named by its directory name (never its path); ``org/name[@rev]`` is
    looked up among pulled models. Anything else is left to :func:`resolve_base_model` (a plain
    encoder). A DP model given as ``--base-model`` is refused: that is what ``--init-from`` is for.
    """
    if not spec or spec == "default":
        return None
    p = Path(spec).expanduser()
    if p.is_dir():
        if is_public_base(p):
            return p, p.name if REPO_ID.fullmatch(p.name) else "local-public-base"
        refuse_private_model_as_base(p)
        return None
    if not REPO_ID.fullmatch(spec.partition("@")[0]) or "/" not in spec:
        return None

    try:
        src = Path(resolve_model(spec))
    except DphubError:
        return None  # not pulled: a plain encoder name, resolved (or refused) as before
    return (src, spec.partition("@")[0]) if is_public_base(src) else None


def _from_public_base(opts: TrainOptions) -> ModelSource | None:
    """Start from a public base model (``dphub pretrain``): its weights, no warm start; the card
    records it under ``public_pretraining`` (``model``) and its encoder as ``base_model``."""
    found = _public_base_dir(opts.base_model)
    if found is None:
        return None
    src, name = found

    model = TaggerModel.load(src)
    if model.head != opts.head:
        raise ConfigError(f"--base-model {name} has head {model.head!r}, not {opts.head!r}")
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    schema = cfg.get("dphub", {}).get("label_schema", opts.label_schema)
    if schema != opts.label_schema:
        raise ConfigError(f"--base-model {name} uses label schema {schema!r}, not "
                          f"{opts.label_schema!r}")
    meta = load_card(src).meta
    block = dict(meta["differential_privacy"].get("public_pretraining") or {"enabled": True})
    block.update({"enabled": True, "data": SYNTH_DATASET, "model": name, "epsilon_cost": 0})
    return ModelSource(model, str(meta.get("base_model") or name), src, block, [],
                       recorded_base_digest(src))


def _from_pulled_model(opts: TrainOptions) -> ModelSource:
    """Fine-tune a pulled DP model: its weights start, its card gives the lineage."""
    p = Path(str(opts.init_from)).expanduser()
    src = p if p.is_dir() else Path(resolve_model(str(opts.init_from)))
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

    meta = load_card(src).meta
    dp = meta.get("differential_privacy", {}) or {}
    base_id = str(meta.get("base_model") or base_id)
    pretraining = dp.get("public_pretraining")
    if not dp.get("private") or dp.get("epsilon") is None:
        raise PrivacyError(
            f"--init-from {opts.init_from}: the source model is not private (its card says "
            "private: false); fine-tuning it cannot produce a private model"
        )
    sha = _checked_parent(opts, src, meta)
    repo, rev = _source_repo_revision(str(opts.init_from), src, p.is_dir())
    # one entry: the parent's claim already composes its own lineage. Composed unless the
    # trainer declares its patients disjoint (the ledger checks that in dphub.train.lineage)
    entry: dict[str, Any] = {
        "repo": repo,
        "revision": rev,
        "epsilon": dp.get("epsilon"),
        "delta": dp.get("delta"),
        "privacy_unit": dp.get("privacy_unit"),
        "role": LINEAGE_INIT_FROM,
        "composed": not opts.disjoint_teacher,
    }
    entry["weights_sha256"] = sha
    history = run_history(dp)
    if history and dp.get("composition") is None:  # one plain DP-SGD run: exact composition
        entry["accounting"] = history[0].to_json()
    return ModelSource(model, base_id, src, pretraining, [entry], recorded_base_digest(src), sha)


def _checked_parent(opts: TrainOptions, src: Path, meta: dict[str, Any]) -> str:
    """The SHA-256 of the ``--init-from`` model's weights, once its card is known to describe
    them: the card validates (its ε recomputed from its own accounting, as ``card validate``
    does) and binds these weights. Why: the child's claim composes the parent's card claim, and
    the ledger finds the parent by its weights; a card edited down, or naming other weights,
    would make the child under-claim or the ledger take the parent for one trained elsewhere."""
    problems = meta_problems(meta, require_private=True)
    if problems:
        raise PrivacyError(f"--init-from {opts.init_from}: its card does not validate "
                           f"({join_problems(problems)}); the composed claim would rest on it")
    weights = src / "model.safetensors"
    try:
        actual = file_sha256(weights)
    except OSError as e:
        raise ConfigError(f"--init-from {opts.init_from}: cannot read its weights "
                          f"({e.strerror or type(e).__name__})") from None
    if meta["differential_privacy"].get("weights_sha256") != actual:
        raise PrivacyError(f"--init-from {opts.init_from}: its card's weights_sha256 is not the "
                           "SHA-256 of its model.safetensors: the card does not describe these "
                           "weights")
    return actual


def _source_repo_revision(spec: str, src: Path, is_dir: bool) -> tuple[str, str]:
    """Public (repo, revision) of an ``--init-from`` source: hub id and pulled revision, or the
    directory name and ``local`` for a directory (never its path)."""
    if is_dir:
        return src.name, "local"
    repo, _, requested = spec.partition("@")
    rev = ""
    with contextlib.suppress(Exception):
        rev = str(Registry().get(repo, requested or None).revision or "")
    return repo, rev or requested or "unknown"


def refuse_private_model_as_base(base_dir: Path) -> None:
    """Refuse a dphub model directory that is not a public base as the encoder to build on.

    Why: its weights learned from patients (under DP, or local only without any guarantee). A
    public base built on them would claim "public data only, no ε" and a DP run would count only
    its own ε: either way the earlier patients' exposure goes unstated. A plain encoder (no
    ``dphub`` block in ``config.json``, no training config) and a public base pass.
    """
    if is_public_base(base_dir):
        return
    dphub_block = False
    with contextlib.suppress(OSError, ValueError):
        cfg = json.loads((base_dir / "config.json").read_text(encoding="utf-8"))
        dphub_block = isinstance(cfg, dict) and "dphub" in cfg
    if dphub_block or (base_dir / "training_config.json").is_file():
        raise ConfigError(
            f"--base-model {base_dir.name}: a dphub model that is not a public base (its card "
            "does not say training_data: public-synthetic); fine-tune a DP model with --init-from"
        )


def is_public_base(model_dir: Path) -> bool:
    """Whether ``model_dir`` holds a dphub model whose card says public synthetic data only."""
    if not (model_dir / "model.safetensors").is_file() or not (model_dir / "README.md").is_file():
        return False
    try:
        return is_public_model(load_card(model_dir).dp)
    except DphubError:
        return False
