"""Builders of publishable (and deliberately broken) model directories for the hub tests.

``make_model_dir`` writes what ``dphub train`` would: a tiny random BertForTokenClassification in
safetensors with CRF transition tensors added, config.json with the BIOES labels and the ``dphub``
block, the embedded MiniLM tokenizer files byte for byte, training_config.json and a model card
whose front matter follows docs/architecture.md. Refusal tests then break exactly one thing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
LABELS = ("O", "B-NAME", "I-NAME", "E-NAME", "S-NAME", "B-DATE", "I-DATE", "E-DATE", "S-DATE")


def card_meta(*, noise: float = 0.8, n_steps: int = 300, q: float = 0.12, unit: str = "patient",
              **dp_overrides: Any) -> dict[str, Any]:
    """Front matter of a valid private card built with dphub.card (ε computed from σ, T, q).

    ``dp_overrides`` then replace differential_privacy keys (a value of ``...`` deletes the key),
    which is how refusal tests break one thing.
    """
    from dphub.card import card_meta as build_meta
    from dphub.card import dp_block

    dp = dp_block(
        accountant="prv", sample_rate=q, noise_multiplier=noise,
        steps=n_steps, delta=1e-5, privacy_unit=unit, max_grad_norm=1.0,
        epochs=n_steps * q, expected_logical_batch=16, max_examples_per_unit=64,
        num_units=131, grad_sample_mode="ghost",
    )
    for k, v in dp_overrides.items():
        if v is ...:
            dp.pop(k, None)
        else:
            dp[k] = v
    dataset = {"patients": 131, "notes": 1913, "sequences": 4000, "phi_phrases": 42,
               "phi_per_category": {"NAME": 12, "DATE": 30}, "note_types": {"nursing": 1913},
               "language": "en", "label_schema": "hipaa"}
    return build_meta(dp, dataset, base_model="sentence-transformers/all-MiniLM-L6-v2")


def write_card(model_dir: Path, meta: dict[str, Any]) -> None:
    """README.md rendered by dphub.card.build_card (not validated: tests write bad cards too)."""
    from dphub.card import build_card

    (model_dir / "README.md").write_text(build_card(meta), encoding="utf-8")


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
        json.dumps({"lr": 5e-4, "epochs": 3, "seed": seed, "head": "crf"}, indent=2),
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
    monkeypatch.setenv("DPHUB_HUB", str(hub))
    monkeypatch.setenv("DPHUB_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    return {"hub": hub, "home": home, "tmp": tmp_path}
