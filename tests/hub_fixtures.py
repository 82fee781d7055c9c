"""Builders of publishable (and deliberately broken) model directories for the hub tests.

``make_model_dir`` writes what ``dphub train`` would: a tiny random BertForTokenClassification in
safetensors with CRF transition tensors added, config.json with the BIOES labels and the ``dphub``
block, the embedded MiniLM tokenizer files byte for byte, an allow-listed training_config.json
(format 2) repeating the card's accounting fields, and a model card whose front matter follows
docs/architecture.md (weights_sha256 of the weights, mechanism_rng, coarsened counts). Refusal
tests then break exactly one thing.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
LABELS = ("O", "B-NAME", "I-NAME", "E-NAME", "S-NAME", "B-DATE", "I-DATE", "E-DATE", "S-DATE")
#: weights_sha256 of a card not yet bound to weights; ``write_card`` fills in the real hash.
UNBOUND_SHA = "0" * 64


def coarsen(n: int) -> str:
    """The card's 1-2-5 range of a count (``dphub.card.coarsen_count``)."""
    from dphub.card import coarsen_count

    return coarsen_count(n)


def coarse_dataset(dataset: dict[str, Any]) -> dict[str, Any]:
    """A dataset block with exact counts replaced by their coarsened ranges."""
    out = dict(dataset)
    for k in ("patients", "notes", "sequences", "phi_phrases"):
        if isinstance(out.get(k), int):
            out[k] = coarsen(out[k])
    for k in ("phi_per_category", "note_types"):
        if isinstance(out.get(k), dict):
            out[k] = {key: coarsen(v) if isinstance(v, int) else v for key, v in out[k].items()}
    return out


def private_dp_block(**fields: Any) -> dict[str, Any]:
    """``dphub.card.dp_block`` with test defaults: an unbound weights digest (a refusal test binds
    real weights where it matters) and OS-seeded randomness."""
    from dphub.card import dp_block

    fields.setdefault("weights_sha256", UNBOUND_SHA)
    fields.setdefault("mechanism_rng", "os-seeded")
    fields.setdefault("num_units", 100)
    return dp_block(**fields)


DATASET = {"patients": 131, "notes": 1913, "sequences": 4000, "phi_phrases": 42,
           "phi_per_category": {"NAME": 12, "DATE": 30}, "note_types": {"nursing": 1913},
           "language": "en", "label_schema": "hipaa"}


def card_meta(*, noise: float = 1.0, n_steps: int = 100, q: float = 0.12, unit: str = "patient",
              **dp_overrides: Any) -> dict[str, Any]:
    """Front matter of a valid private card built with dphub.card (ε computed from σ, T, q).

    The default (σ 1.0, 100 steps, q 0.12) gives ε ≈ 8.5, inside the default hub policy.
    ``dp_overrides`` then replace differential_privacy keys (a value of ``...`` deletes the key),
    which is how refusal tests break one thing.
    """
    from dphub.card import card_meta as build_meta

    dp = private_dp_block(
        accountant="prv", sample_rate=q, noise_multiplier=noise,
        steps=n_steps, delta=1e-5, privacy_unit=unit, max_grad_norm=1.0,
        epochs=n_steps * q, max_examples_per_unit=64,
        num_units=131, grad_sample_mode="ghost",
    )
    for k, v in dp_overrides.items():
        if v is ...:
            dp.pop(k, None)
        else:
            dp[k] = v
    return build_meta(dp, coarse_dataset(DATASET),
                      base_model="sentence-transformers/all-MiniLM-L6-v2")


def training_config(dp: dict[str, Any], **hyper: Any) -> dict[str, Any]:
    """``training_config.json`` of the new contract, repeating the card's accounting fields."""
    private = dp.get("private") is True
    return {
        "format_version": 2,
        "dphub_training": {"lr": 5e-4, "epochs": 3, "seed": 0, "head": "crf", **hyper},
        "base_model": "sentence-transformers/all-MiniLM-L6-v2",
        "base_model_sha256": embedded_digest(),
        "init_from": None,
        "no_dp": not private,
        "privacy_unit": dp.get("privacy_unit"),
        "accountant": dp.get("accountant"),
        "steps": dp.get("steps"),
        "sample_rate": dp.get("sample_rate"),
        "noise_multiplier": dp.get("noise_multiplier"),
        "delta": dp.get("delta"),
        "epsilon": dp.get("epsilon"),
    }


def embedded_digest() -> str:
    """The embedded base's encoder digest, as ``dphub train`` records the base it started from
    (``training_config.json`` ``base_model_sha256``; cached per process)."""
    from dphub.encoders import embedded_model_dir, encoder_digest

    return encoder_digest(embedded_model_dir())


def set_hyperparams(model_dir: Path, **hyper: Any) -> None:
    """Change allow-listed hyper-parameters of a model's training_config.json (a new revision)."""
    path = model_dir / "training_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["dphub_training"].update(hyper)
    path.write_text(json.dumps(cfg, indent=2), encoding="utf-8")


def write_card(model_dir: Path, meta: dict[str, Any], *, sync: bool = True) -> None:
    """README.md rendered by dphub.card.build_card (not validated: tests write bad cards too).

    With ``sync`` (default) the card is bound to the directory as ``dphub train`` would bind it:
    an unbound ``weights_sha256`` becomes model.safetensors' hash and training_config.json is
    rewritten to repeat the card's accounting fields (its hyper-parameters are kept), and a card
    without a ``gate_probe`` block gets the one the probe measures on these weights.
    """
    from dphub.card import build_card
    from dphub.io import file_sha256

    meta = copy.deepcopy(meta)
    dp = meta.get("differential_privacy")
    weights = model_dir / "model.safetensors"
    if sync and isinstance(dp, dict) and weights.is_file():
        if dp.get("weights_sha256") == UNBOUND_SHA:
            dp["weights_sha256"] = file_sha256(weights)
        cfg_path = model_dir / "training_config.json"
        hyper = {}
        if cfg_path.is_file():
            hyper = json.loads(cfg_path.read_text(encoding="utf-8")).get("dphub_training", {})
        cfg_path.write_text(json.dumps(training_config(dp, **hyper), indent=2), encoding="utf-8")
        block = probe_block_of(model_dir) if "gate_probe" not in meta else None
        if block is not None:
            meta["gate_probe"] = block  # as dphub train records it
    (model_dir / "README.md").write_text(build_card(meta), encoding="utf-8")


def probe_block_of(model_dir: Path) -> dict[str, Any] | None:
    """The card's ``gate_probe`` block of the weights in ``model_dir`` (cached by their hash:
    copies of one template share it); None when the model cannot run (a test's broken weights,
    which the gate refuses before it would probe)."""
    from dphub.errors import DphubError
    from dphub.io import file_sha256

    if not (model_dir / "config.json").is_file():
        return None
    key = file_sha256(model_dir / "model.safetensors")
    if key not in _PROBE_BLOCKS:
        from dphub.card.probe import probe_block

        try:
            _PROBE_BLOCKS[key] = probe_block(model_dir)
        except (DphubError, RuntimeError, ValueError, OSError, KeyError):
            _PROBE_BLOCKS[key] = None
    block = _PROBE_BLOCKS[key]
    return dict(block) if block is not None else None


_PROBE_BLOCKS: dict[str, dict[str, Any] | None] = {}


def make_model_dir(path: Path, *, seed: int = 0, card: dict[str, Any] | None = None,
                   **dp_overrides: Any) -> Path:
    """A valid publishable model directory at ``path`` (created)."""
    import torch
    from safetensors.torch import save_file
    from transformers import BertConfig, BertForTokenClassification

    from dphub.encoders import embedded_model_dir

    path.mkdir(parents=True, exist_ok=True)
    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=512, pad_token_id=0,
        id2label=dict(enumerate(LABELS)), label2id={lab: i for i, lab in enumerate(LABELS)},
        architectures=["BertForTokenClassification"],
    )
    torch.manual_seed(seed)
    model = BertForTokenClassification(config)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    n = len(LABELS)
    state["crf.start_transitions"] = torch.randn(n)
    state["crf.end_transitions"] = torch.randn(n)
    state["crf.transitions"] = torch.randn(n, n)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg.pop("_name_or_path", None)
    cfg["dphub"] = {"head": "crf", "label_schema": "hipaa", "max_length": 128, "stride": 32,
                    "format_version": 1}
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True), encoding="utf-8")
    src = embedded_model_dir()
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, path / name)
    (path / "training_config.json").write_text(
        json.dumps({"dphub_training": {"lr": 5e-4, "epochs": 3, "seed": seed, "head": "crf"}}),
        encoding="utf-8")
    write_card(path, card if card is not None else card_meta(**dp_overrides))
    return path


@pytest.fixture(scope="session")
def model_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One publishable model directory per session; tests copy it (see ``copy_model``)."""
    return make_model_dir(tmp_path_factory.mktemp("hub-template") / "model")


def copy_model(template: Path, dest: Path) -> Path:
    shutil.copytree(template, dest)
    return dest


@pytest.fixture
def hub_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A fresh local hub and dphub home under tmp_path, set as DPHUB_HUB / DPHUB_HOME."""
    hub, home = tmp_path / "hub", tmp_path / "home"
    # the test hub's owner accepts every unit (tests publish note- and sequence-level models);
    # the default policy itself is tested in test_hub_policy.py
    hub.mkdir()
    (hub / "dphub-policy.json").write_text('{"max_epsilon": 10, "min_unit": "sequence"}')
    monkeypatch.setenv("DPHUB_HUB", str(hub))
    monkeypatch.setenv("DPHUB_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    return {"hub": hub, "home": home, "tmp": tmp_path}


#: A "billion laughs" card: nine anchors, each nine aliases of the last (9**9 strings if expanded).
ALIAS_BOMB = """---
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
differential_privacy: {private: true, epsilon: 1.0}
---
body
"""
