"""The publish gate's tensor checks: the weights are exactly the tensors ``config.json`` implies,
finite, laid out as declared, and the encoder is the declared public base's by its weights.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from dphub.encoders import (
    encoder_digest,
    encoder_tensors,
    meta_encoder,
    tensor_bytes,
)
from dphub.errors import DphubError, ModelError
from dphub.hub.gate_common import (
    MAX_LAYERS,
    PUBLIC_SYNTHETIC,
    GateViolation,
    check_config,
    read_training_config,
    refuse,
    resolve_base_tokenizer_dir,
    safe_name,
)
from dphub.io import cache_root, file_sha256
from dphub.registry import Registry

# --------------------------------------------------------------------------- weights

_DTYPES = {
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
}
#: Buffers the tagger's loader tolerates being absent (transformers versions differ).
_OPTIONAL_SUFFIXES = ("position_ids", "token_type_ids")


def expected_tensors(model_dir: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (safetensors dtype, shape) of every tensor ``config.json`` implies.

    The skeleton is built the way :meth:`dphub.tagger.TaggerModel.load` builds it (the encoder
    from the config, pooler dropped, a linear emission layer over the BIOES tags, the CRF), on
    PyTorch's meta device: shapes and dtypes without allocating or reading any weight.
    """
    raw = check_config(model_dir)
    block = raw.get("dphub")
    if not isinstance(block, dict) or block.get("head") not in ("crf", "softmax"):
        raise refuse(model_dir, "config.json has no valid 'dphub' block (head crf|softmax)")
    id2label = raw.get("id2label")
    if not isinstance(id2label, dict) or not id2label:
        raise refuse(model_dir, "config.json has no id2label")
    layers = raw.get("num_hidden_layers", 0)
    if not isinstance(layers, int) or not 0 < layers <= MAX_LAYERS:
        raise refuse(model_dir, f"config.json num_hidden_layers must be 1..{MAX_LAYERS}")
    n_tags = len(id2label)
    try:
        encoder = meta_encoder(model_dir)
    except Exception as e:  # noqa: BLE001 - any failure: the config describes no known model
        raise refuse(model_dir, f"config.json does not describe a model transformers can build "
                                 f"({type(e).__name__})") from None
    prefix = getattr(encoder, "base_model_prefix", "bert") or "bert"
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, t in encoder.state_dict().items():
        if name.startswith("pooler."):
            continue
        out[f"{prefix}.{name}"] = (_DTYPES.get(str(t.dtype).removeprefix("torch."), "?"),
                                   tuple(t.shape))
    hidden = int(encoder.config.hidden_size)
    out["classifier.weight"] = ("F32", (n_tags, hidden))
    out["classifier.bias"] = ("F32", (n_tags,))
    if block["head"] == "crf":
        out["crf.start_transitions"] = ("F32", (n_tags,))
        out["crf.end_transitions"] = ("F32", (n_tags,))
        out["crf.transitions"] = ("F32", (n_tags, n_tags))
    spec = block.get("rule_features")
    if spec is not None:
        feats = spec.get("features") if isinstance(spec, dict) else None
        if not isinstance(feats, list) or not 0 < len(feats) <= 256:
            raise refuse(model_dir, "config.json has an invalid dphub.rule_features block")
        out["rule_proj.weight"] = ("F32", (n_tags, len(feats)))
        out["rule_proj.bias"] = ("F32", (n_tags,))
    return out


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "scalar"


def _names(names: list[str]) -> str:
    shown = ", ".join(safe_name(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def weights_problems(model_dir: Path, dp: Any = None) -> list[str]:
    """The weights file is a readable safetensors file holding exactly the tensors the config
    implies (names, shapes, dtypes), with no free-form header metadata, and its SHA-256 is the
    card's ``weights_sha256``. The header is read with ``safetensors.safe_open`` (never pickle).
    """
    from safetensors import SafetensorError, safe_open

    path = model_dir / "model.safetensors"
    if not path.is_file():
        return ["model.safetensors is missing"]
    out: list[str] = []
    if isinstance(dp, dict) and (dp.get("private") is True
                                 or dp.get("training_data") == PUBLIC_SYNTHETIC):
        want = dp.get("weights_sha256")
        if isinstance(want, str) and file_sha256(path) != want:
            out.append("model.safetensors does not match the card's weights_sha256: the card "
                       "was written for other weights")
    if path.stat().st_size < 8:
        return [*out, "model.safetensors is empty or truncated (not a safetensors file)"]
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            found = {k: (fh.get_slice(k).get_dtype(), tuple(fh.get_slice(k).get_shape()))
                     for k in fh.keys()}  # noqa: SIM118 - safe_open is not iterable
    except (SafetensorError, OSError, ValueError):
        return [*out, "model.safetensors is truncated or not a safetensors file"]
    if set(meta) - {"format"} or meta.get("format", "pt") != "pt":
        out.append("model.safetensors header metadata may only hold format: pt (free-form "
                   "metadata is not covered by the guarantee)")
    out += _header_layout_problems(path)
    try:
        want_tensors = expected_tensors(model_dir)
    except GateViolation as e:
        return [*out, e.message]
    extra = sorted(set(found) - set(want_tensors))
    missing = sorted(k for k in set(want_tensors) - set(found)
                     if not k.endswith(_OPTIONAL_SUFFIXES))
    if extra:
        out.append(f"model.safetensors holds tensor(s) config.json does not imply: "
                   f"{_names(extra)} (a tensor outside the model is outside the guarantee)")
    if missing:
        out.append(f"model.safetensors lacks tensor(s) config.json implies: {_names(missing)}")
    for name in sorted(set(found) & set(want_tensors)):
        (dtype, shape), (want_dtype, want_shape) = found[name], want_tensors[name]
        if shape != want_shape:
            out.append(f"model.safetensors tensor {safe_name(name)} has shape {_shape(shape)}, "
                       f"config.json implies {_shape(want_shape)}")
        elif dtype != want_dtype:
            out.append(f"model.safetensors tensor {safe_name(name)} is {dtype}, config.json "
                       f"implies {want_dtype}")
    if not out:  # a well-formed file: now its values
        out += nonfinite_problems(path)
    return out


#: Largest |weight| the gate accepts in any tensor. The embedded MiniLM base's largest is 7.9;
#: DP-SGD clips every per-unit gradient and trains a few thousand steps at small learning rates
#: from a public base, which moves a weight by tens at most. 1e4 is far beyond every honest model
#: and far below the 1e30 a rogue site sent (issue 37), which made the published model tag nothing.
MAX_ABS_WEIGHT = 1e4


def nonfinite_problems(path: Path) -> list[str]:
    """Floating-point tensors holding inf or NaN, then tensors with a value beyond
    :data:`MAX_ABS_WEIGHT` (one tensor in memory at a time).

    Why: a diverged run (``--lr 1e308``) wrote ±inf into every head and CRF tensor, and the
    gate, which checked names, shapes and dtypes only, published a model that tags nothing; a
    rogue federation site then sent finite but huge weights (1e30), which the NaN/inf check let
    through to the same effect.
    """
    import torch
    from safetensors import SafetensorError, safe_open

    bad: list[str] = []
    huge: list[str] = []
    try:
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 - safe_open is not iterable
                t = fh.get_tensor(name)
                if not t.is_floating_point() or not t.numel():
                    continue
                if not bool(torch.isfinite(t).all()):
                    bad.append(name)
                elif float(t.abs().max()) > MAX_ABS_WEIGHT:
                    huge.append(name)
    except (SafetensorError, OSError, ValueError):
        return ["model.safetensors is truncated or not a safetensors file"]
    if bad:
        return [f"model.safetensors tensor(s) {_names(sorted(bad))} hold non-finite values (inf "
                "or NaN): the weights are broken (a diverged training run?) and would tag nothing"]
    if huge:
        return [f"model.safetensors tensor(s) {_names(sorted(huge))} hold values beyond "
                f"{MAX_ABS_WEIGHT:g} in magnitude, far beyond anything DP-SGD with clipping "
                "produces from a public base: the weights are broken or tampered with"]
    return []


def _header_layout_problems(path: Path) -> list[str]:
    """The raw header holds nothing safetensors would ignore: per tensor exactly ``dtype``,
    ``shape``, ``data_offsets``, and at most the 7 spaces of alignment padding. ``safe_open``
    accepts extra fields and any padding, which could carry text past the layout check."""
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        if n > 100_000_000:
            return ["model.safetensors header is implausibly large"]
        raw = fh.read(n)
    try:
        text = raw.decode("utf-8")
        header = json.loads(text)
    except (UnicodeDecodeError, ValueError):
        return ["model.safetensors header is not valid JSON"]
    if len(text) - len(text.rstrip(" ")) > 7 or text.rstrip(" ") != text.strip():
        return ["model.safetensors header carries padding beyond the 8-byte alignment"]
    if not isinstance(header, dict):
        return ["model.safetensors header is not a JSON object"]
    odd = sorted(k for k, v in header.items() if k != "__metadata__" and (
        not isinstance(v, dict) or set(v) != {"dtype", "shape", "data_offsets"}))
    if odd:
        return [f"model.safetensors header entries of {_names(odd)} hold fields other than "
                "dtype, shape, data_offsets"]
    return []


# --------------------------------------------------------------------------- base encoder

#: A transformer block's index in an encoder tensor name (``encoder.layer.3.``, ``layers.3.``).
_LAYER_INDEX = re.compile(r"(?:^|\.)layers?\.(\d+)\.")


def check_base_weights(model_dir: Path, meta: dict[str, Any]) -> None:
    """Raise :class:`GateViolation` on the first base-encoder problem
    (:func:`base_weights_problems`)."""
    problems = base_weights_problems(model_dir, meta)
    if problems:
        raise refuse(model_dir, problems[0])


def base_weights_problems(model_dir: Path, meta: dict[str, Any]) -> list[str]:
    """The encoder the model descends from is the public base its card names.

    Why: the tokenizer check proves only that the vocabulary is public. A local encoder that was
    fine-tuned on patients without DP, saved under the public base's name, would otherwise be
    published as "public base + DP" while its weights carry the unprotected patients. So:

    * ``training_config.json`` must record ``base_model_sha256``, the digest of the encoder the
      run started from (:func:`dphub.encoders.encoder_digest`, written by ``dphub train`` and
      ``dphub pretrain``), and it must equal the digest of the declared base as this machine
      has it (the embedded package's tensors, or the pulled or cached hub model);
    * where the published encoder tensors that training kept frozen can be compared with their
      origin, they must be equal to it (:func:`frozen_tensor_problems`).
    """
    base = meta.get("base_model")
    name = safe_name(base) if isinstance(base, str) else "(none)"
    base_dir = resolve_base_tokenizer_dir(base if isinstance(base, str) else None)
    if base_dir is None:
        return [_unresolved_base(name)]
    try:
        cfg = read_training_config(model_dir)
    except GateViolation as e:
        return [e.message]
    recorded = cfg.get("base_model_sha256")
    if not isinstance(recorded, str) or not recorded:
        return ["training_config.json does not record the base encoder's weights "
                "(base_model_sha256), so the card's base_model cannot be checked against the "
                "encoder the model descends from; retrain with this dphub version"]
    try:
        actual = encoder_digest(base_dir)
    except ModelError as e:
        return [f"the declared base model {name} cannot be identified by its weights "
                f"({e.message})"]
    if recorded != actual:
        return [f"the model descends from an encoder whose weights are not {name}'s "
                "(training_config.json base_model_sha256 differs from the declared base's): a "
                "local encoder is not the public base, whatever its directory is called"]
    return frozen_tensor_problems(model_dir, meta, cfg, base_dir)


def _unresolved_base(name: str) -> str:
    return f"cannot resolve the card's base_model {name} to check the encoder against it"


def base_unresolved(meta: dict[str, Any]) -> str | None:
    """Why the encoder cannot be checked against the card's base on this machine (None: it
    can): the base is neither the embedded encoder nor a model in the registry or the Hugging
    Face cache. Publish refuses such a model with these words; ``dphub card validate`` reports
    the check as not done (it validates cards away from the hub, where the base may be absent).
    """
    base = meta.get("base_model")
    if resolve_base_tokenizer_dir(base if isinstance(base, str) else None) is not None:
        return None
    return _unresolved_base(safe_name(base) if isinstance(base, str) else "(none)")


def frozen_tensor_problems(model_dir: Path, meta: dict[str, Any], cfg: dict[str, Any],
                           base_dir: Path) -> list[str]:
    """The encoder tensors training kept frozen equal those of the weights it started from.

    The start is known and present here when the run started from the base itself
    (``warm_start: none``, and every ``dphub pretrain``), from a pulled public base
    (``public_pretraining.model``), or from the public warm start of the declared base found in
    this machine's warm-start cache. Frozen are the embeddings and every block below the top
    ``train_layers`` (``null``: all train, nothing to compare). A start that cannot be found here
    (a warm start built elsewhere, a local public base, ``--init-from``) is not compared: the
    recorded digest is then the only evidence.
    """
    hyper = cfg.get("dphub_training")
    if not isinstance(hyper, dict) or "train_layers" not in hyper:
        return []
    layers = hyper.get("train_layers")
    if layers is None:
        return []
    start = _training_start(meta, cfg, hyper, base_dir)
    if start is None:
        return []
    ref_dir, what = start
    try:
        depth = int(check_config(model_dir).get("num_hidden_layers", 0))
        first_trained = depth - int(layers)
        ref = dict(encoder_tensors(ref_dir))
        for tname, t in encoder_tensors(model_dir):
            m = _LAYER_INDEX.search(tname)
            if m and int(m.group(1)) >= first_trained:
                continue  # a block DP (or pretraining) trained
            r = ref.get(tname)
            if r is None:
                if tname.endswith(_OPTIONAL_SUFFIXES):
                    continue
                return [f"encoder tensor {safe_name(tname)} has no counterpart in {what}"]
            if r.dtype != t.dtype or r.shape != t.shape or tensor_bytes(r) != tensor_bytes(t):
                return [f"encoder tensor {safe_name(tname)} was frozen in training but differs "
                        f"from {what}: the encoder is not the one the card declares"]
    except (ModelError, GateViolation, TypeError, ValueError) as e:
        why = e.message if isinstance(e, DphubError) else type(e).__name__
        return [f"the frozen encoder tensors cannot be compared with {what} ({why})"]
    return []


def _training_start(meta: dict[str, Any], cfg: dict[str, Any], hyper: dict[str, Any],
                    base_dir: Path) -> tuple[Path, str] | None:
    """(directory, words) of the weights a run started from, when this machine has them."""
    if cfg.get("init_from"):
        return None  # a DP model's fine-tuning: that model was checked when it was published
    base = safe_name(str(meta.get("base_model")))
    dp = meta.get("differential_privacy")
    pre = dp.get("public_pretraining") if isinstance(dp, dict) else None
    public = pre.get("model") if isinstance(pre, dict) else None
    if isinstance(public, str) and public:
        try:
            return Registry().get(public).path, f"the public base {safe_name(public)}"
        except DphubError:
            return None
    if hyper.get("warm_start") == "none":
        return base_dir, f"the base model {base}"
    if hyper.get("warm_start") != "synth":
        return None
    # heavy: the dphub.train package loads torch and opacus; only this provenance check needs it
    from dphub.train.warmstart import WARM_START_SEED, WarmStartConfig, cache_key

    try:
        ws = WarmStartConfig(max_length=int(hyper["max_length"]), stride=int(hyper["stride"]),
                             rule_features=bool(hyper.get("rule_features")),
                             encoder_layers=hyper.get("encoder_layers"))
        key = cache_key(base_dir, str(meta.get("base_model")), str(hyper["label_schema"]),
                        str(hyper["head"]), ws, WARM_START_SEED)  # one warm start for every --seed
    except (KeyError, TypeError, ValueError):
        return None
    target = cache_root() / "warmstart" / key
    if not (target / "model.safetensors").is_file():
        return None
    return target, f"the public warm start of {base}"
