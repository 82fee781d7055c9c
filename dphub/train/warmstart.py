"""Public warm start: non-private pre-training on synthetic labelled notes, cached on disk.

Plain DP-SGD of a generic sentence encoder on a few hundred patients collapses to "no PHI": PHI is
~2 % of tokens and the noise needed for patient-level ε ≈ 8 drowns the few rare-token gradients.
The fix is to learn the task first on *public* data — Faker-generated notes from
:mod:`dphub.synth`, which contain no real patient — without DP (it costs no ε), and let DP-SGD only
adapt the top of the network to the private notes. The card records this step under
``public_pretraining``.

With rule features (``rule_features=True``) the warm start has a second, cheap stage: the plain
warm start (built once, shared with models without features) gets the rule-feature projection and
its head (emissions, CRF, ``rule_proj``) is trained on the same synthetic notes with the rule
member's flags as inputs, over the frozen encoder's cached outputs. So a rule-feature model
starts out knowing how far the rules can be trusted on public notes, and the first-use cost is
minutes of head training rather than a second full warm start.

Warm-started weights depend only on (base model, label schema, head, synthetic-data config, seed),
so they are cached in the user cache directory (``platformdirs``; ``DPHUB_CACHE_DIR`` overrides)
and reused by every training with the same key. A file lock makes concurrent trainings build it
once; a training that finds the lock held reports that it waits (``on_progress`` events of phase
:data:`WAIT_PHASE`) and gives up after ``DPHUB_WARMSTART_TIMEOUT`` seconds (default one hour)
instead of waiting silently forever. Building it reports progress events of :data:`PHASE`, then
(rule-feature models) :data:`RULES_PHASE`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dphub import synth
from dphub.card import SYNTH_DATASET
from dphub.errors import ConfigError, DphubError
from dphub.io import atomic_directory, cache_root, hash_file
from dphub.rule_features import rules_digest
from dphub.tagger import TaggerModel
from dphub.train.data import batch_from_examples, encode_notes
from dphub.train.encoder_cache import FrozenEncoderCache
from dphub.train.results import Progress

#: The seed of the public warm start a training builds on, whatever its ``--seed``. Why: the
#: warm start sees public synthetic notes only, and a second seed rebuilt it from scratch (25
#: minutes on a loaded machine) for no privacy or utility reason; ``--seed`` acts on the private
#: stage (initialisation of what the warm start lacks, dropout, --no-dp data order).
WARM_START_SEED = 0

#: 2: the realistic synthetic kinds (``dphub.synth.REALISTIC_KINDS``); older caches are rebuilt
FORMAT_VERSION = 2

#: Phases of the progress events of building it: the encoder on synthetic notes (minutes), then,
#: for rule-feature models, the rule-feature head over the frozen encoder (the shorter second part
#: of the same one-time build; a phase of its own so that it is not announced as a second build)
PHASE = "warm-start"
RULES_PHASE = "warm-start-rules"

#: Phase of the progress events sent while another process holds the warm-start lock: ``step`` is
#: the seconds waited so far, ``total_steps`` the seconds before giving up (same value as
#: :data:`dphub.progress.WAIT_PHASE`; repeated here so the library does not import the display).
WAIT_PHASE = "warm-start-wait"
#: Environment variable: seconds to wait for another process's warm start before giving up.
TIMEOUT_ENV = "DPHUB_WARMSTART_TIMEOUT"
DEFAULT_TIMEOUT = 3600.0
#: How often a waiting process re-tries the lock (and reports that it still waits).
POLL_SECONDS = 2.0


@dataclass(frozen=True)
class WarmStartConfig:
    """How the public warm start is built (all of it goes into the cache key)."""

    #: (kind, number of notes): nursing notes dominate because the target corpora are nursing
    #: notes; discharge summaries add long, mixed-case, sectioned text. The realistic kinds
    #: (low PHI density, non-PHI look-alikes) transfer to real notes far better than the
    #: label-rich ones (docs/results.md, "Public pretraining")
    notes: tuple[tuple[str, int], ...] = (("realistic-nursing", 450), ("realistic-discharge", 50))
    synth_seed: int = 0
    #: top encoder layers trained (None: all). All layers: inner-split F1 0.77 vs 0.68 with the
    #: top 3 (docs/results.md, "Public pretraining"), at 1.5x the compute per step (about five
    #: minutes of one core for the default notes and epochs)
    train_layers: int | None = None
    epochs: float = 2.0
    batch_size: int = 16
    lr_encoder: float = 5e-5
    lr_head: float = 2e-3
    max_length: int = 128
    stride: int = 32
    #: the tagger takes the rule member's flags as input features (``dphub.rule_features``);
    #: a head stage then learns, on public notes, how far to trust them
    #: (``dphub train`` sets it from ``TrainOptions.rule_features``, default on; the dataclass
    #: default stays off so a bare config names the plain warm start the rule stage builds on)
    rule_features: bool = False
    #: epochs and learning rate of that head stage (frozen encoder, cached: cheap)
    rule_epochs: float = 4.0
    rule_lr: float = 5e-3
    #: keep only the base's first N transformer layers (None: all; ``--encoder-layers``)
    encoder_layers: int | None = None

    def card_block(self, steps: int | None = None, seed: int = 0) -> dict[str, Any]:
        """What the card records under ``differential_privacy.public_pretraining``."""
        block: dict[str, Any] = {
            "enabled": True,
            "data": SYNTH_DATASET,
            "kinds": [k for k, _ in self.notes],
            "notes": sum(n for _, n in self.notes),
            "epochs": self.epochs,
            "seed": seed,
            "epsilon_cost": 0,
        }
        if steps is not None:
            block["steps"] = steps
        if self.encoder_layers is not None:
            block["encoder_layers"] = self.encoder_layers
        return block


def _base_fingerprint(base_dir: Path) -> str:
    """Hash of the base model's config and weights, so a changed base never hits a stale cache."""
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        f = base_dir / name
        if f.is_file():
            h.update(name.encode())
            hash_file(h, f)
    return h.hexdigest()


def cache_key(
    base_dir: Path, base_public_id: str, schema: str, head: str, cfg: WarmStartConfig, seed: int
) -> str:
    """Key of a warm start: everything its weights depend on."""
    synth_cfg = asdict(cfg)
    rule_cfg = {k: synth_cfg.pop(k) for k in ("rule_features", "rule_epochs", "rule_lr")}
    if synth_cfg.get("encoder_layers") is None:  # the full base: keys stay as they were
        synth_cfg.pop("encoder_layers", None)
    payload = {
        "v": FORMAT_VERSION,
        "base": base_public_id,
        "base_sha256": _base_fingerprint(base_dir),
        "schema": schema,
        "head": head,
        "synth": synth_cfg,  # without the rule stage's fields: plain keys stay as they were
        "seed": seed,
    }
    if cfg.rule_features:  # a change of the rules changes the inputs: a new warm start

        payload["rule_stage"] = rule_cfg
        payload["rules"] = rules_digest()
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def wait_timeout() -> float:
    """Seconds to wait for another process's warm start: ``$DPHUB_WARMSTART_TIMEOUT`` or 1 h."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value != float("inf")):
        raise ConfigError(f"{TIMEOUT_ENV}={raw!r}: must be a positive number of seconds")
    return value


def _acquire(lock: Any, lock_path: Path, on_progress: Callable[[Any], None] | None) -> None:
    """Take the warm-start lock; while another process holds it, say so and give up in time.

    Why: the first training on a machine spends minutes building the warm start; a second
    training started meanwhile used to block on this lock without a word and without end.
    """
    from filelock import Timeout

    limit = wait_timeout()
    t0 = time.monotonic()
    while True:
        waited = time.monotonic() - t0
        try:
            lock.acquire(timeout=max(0.0, min(POLL_SECONDS, limit - waited)))
            return
        except Timeout:
            waited = time.monotonic() - t0
            if waited >= limit:
                raise DphubError(
                    f"gave up after {waited:.0f} s waiting for another dphub process to build "
                    f"the public warm start (lock {lock_path}); run again when it has finished, "
                    f"or set {TIMEOUT_ENV} (seconds) to wait longer"
                ) from None
            if on_progress is not None:
                on_progress(Progress(WAIT_PHASE, int(waited), int(limit), None, None, None))


def warm_start(
    base_dir: Path,
    base_public_id: str,
    schema: str,
    head: str,
    cfg: WarmStartConfig | None = None,
    *,
    seed: int = 0,
    cache_dir: Path | None = None,
    on_progress: Callable[[Any], None] | None = None,
) -> Path:
    """Directory of the warm-started tagger for this key, training it first if not cached."""
    from filelock import FileLock

    cfg = cfg or WarmStartConfig()
    plain_dir: Path | None = None
    if cfg.rule_features:  # the rule stage starts from the plain warm start (built once, shared)
        plain_dir = warm_start(base_dir, base_public_id, schema, head,
                               replace(cfg, rule_features=False), seed=seed,
                               cache_dir=cache_dir, on_progress=on_progress)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    target = root / "warmstart" / cache_key(base_dir, base_public_id, schema, head, cfg, seed)
    target.parent.mkdir(parents=True, exist_ok=True)
    if (target / "model.safetensors").is_file():
        return target  # cached: no need to queue behind a process building another key
    lock_path = Path(str(target) + ".lock")
    lock = FileLock(str(lock_path))
    _acquire(lock, lock_path, on_progress)
    try:
        if (target / "model.safetensors").is_file():
            return target
        if plain_dir is not None:
            model = train_rule_stage(plain_dir, base_dir, schema, cfg, seed=seed,
                                     on_progress=on_progress)
        else:
            model = train_public(base_dir, schema, head, cfg, seed=seed, on_progress=on_progress)
        with atomic_directory(target, overwrite=True) as tmp:
            model.save(tmp, base_public_id=base_public_id, tokenizer_source=base_dir)
    finally:
        lock.release()
    return target


def train_public(
    base_dir: Path,
    schema: str,
    head: str,
    cfg: WarmStartConfig,
    *,
    seed: int = 0,
    on_progress: Callable[[Any], None] | None = None,
) -> Any:
    """Non-private training of a fresh tagger on synthetic notes (top ``cfg.train_layers``)."""
    from transformers import AutoTokenizer

    torch.manual_seed(seed)
    notes = []
    for i, (kind, n) in enumerate(cfg.notes):
        notes.extend(synth.generate(n, kind=kind, seed=cfg.synth_seed + i))
    model = TaggerModel.from_base(base_dir, schema=schema, head=head,
                                  rule_features=cfg.rule_features,
                                  encoder_layers=cfg.encoder_layers)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    examples = encode_notes(notes, tokenizer, model.tags, schema, max_length=cfg.max_length,
                            stride=cfg.stride, unit="sequence", rule_features=cfg.rule_features)
    n_layers = int(getattr(model.encoder.config, "num_hidden_layers", 0) or 0)
    layers = cfg.train_layers
    if layers is not None and n_layers:
        layers = min(layers, n_layers)  # small bases (tests) have fewer layers
    model.set_trainable(train_layers=layers)
    model.train()
    head_names = ("classifier", "crf", "rule_proj")
    groups = [
        {"params": [p for n, p in model.named_parameters()
                    if p.requires_grad and not n.startswith(head_names)], "lr": cfg.lr_encoder},
        {"params": [p for n, p in model.named_parameters()
                    if p.requires_grad and n.startswith(head_names)], "lr": cfg.lr_head},
    ]
    groups = [g for g in groups if g["params"]]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    _fit(model, examples, groups, pad_id, cfg.batch_size, cfg.epochs, seed, on_progress)
    model.eval()
    return model


def train_rule_stage(
    plain_dir: Path,
    base_dir: Path,
    schema: str,
    cfg: WarmStartConfig,
    *,
    seed: int = 0,
    on_progress: Callable[[Any], None] | None = None,
) -> Any:
    """The plain warm start plus a rule-feature head trained on the same synthetic notes.

    Only the head trains (emissions, CRF, ``rule_proj``, which starts at zero, i.e. exactly the
    plain warm start's predictions), over the frozen encoder's cached outputs: one encoder pass
    per window, then cheap steps.
    """
    from transformers import AutoTokenizer

    torch.manual_seed(seed)
    notes = []
    for i, (kind, n) in enumerate(cfg.notes):
        notes.extend(synth.generate(n, kind=kind, seed=cfg.synth_seed + i))
    model = TaggerModel.load(plain_dir)
    model.add_rule_features()
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    examples = encode_notes(notes, tokenizer, model.tags, schema, max_length=cfg.max_length,
                            stride=cfg.stride, unit="sequence", rule_features=True)
    model.set_trainable(train_layers=0)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    real = model.encoder
    model.encoder = FrozenEncoderCache(real, [e.input_ids for e in examples], pad_id)
    try:
        model.train()
        groups = [{"params": [p for p in model.parameters() if p.requires_grad],
                   "lr": cfg.rule_lr}]
        _fit(model, examples, groups, pad_id, cfg.batch_size, cfg.rule_epochs, seed, on_progress,
             phase=RULES_PHASE)
    finally:
        model.encoder = real
    model.eval()
    return model


def _fit(model: Any, examples: list[Any], groups: list[dict[str, Any]], pad_id: int,
         batch_size: int, epochs: float, seed: int,
         on_progress: Callable[[Any], None] | None, *, phase: str = PHASE) -> None:
    """Plain (non-private) AdamW with warm-up and linear decay over length-bucketed batches."""
    optimizer = torch.optim.AdamW(groups, weight_decay=0.01)
    rng = np.random.default_rng(seed)
    per_epoch = max(1, len(examples) // batch_size)
    total = max(1, round(epochs * per_epoch))
    sched = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(1, total // 10)) * max(0.0, 1 - s / total)
    )
    # length bucketing: sort a shuffled order by length inside chunks, batches of similar length
    step = 0
    t0 = time.monotonic()
    if on_progress is not None:  # the set-up above takes a while: say what is coming
        on_progress(Progress(phase, 0, total, None, None, None))
    while step < total:
        order = rng.permutation(len(examples))
        chunk = batch_size * 20
        batches = []
        for s in range(0, len(order), chunk):
            part = sorted(order[s : s + chunk], key=lambda i: len(examples[i].input_ids))
            batches.extend(part[j : j + batch_size] for j in range(0, len(part), batch_size))
        for bi in rng.permutation(len(batches)):
            if step >= total:
                break
            batch = batch_from_examples([examples[i] for i in batches[bi]], pad_id)
            labels = batch.pop("labels")
            loss = model.per_sample_loss(batch, labels).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            sched.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if on_progress is not None:
                el = time.monotonic() - t0
                on_progress(Progress(phase, step, total, float(loss.detach()), None,
                                     step / el if el > 0 else None))
