"""Encoder runtimes for inference: PyTorch fp32 or bfloat16, ONNX Runtime fp32 or int8.

Why: on CPU the encoder is ~97 % of de-identification time, and ONNX Runtime runs the same
BERT graph faster than eager PyTorch (fused attention/GELU/LayerNorm kernels; int8 matmuls with
VNNI). Only the *encoder* is exported; each member's head and CRF stay in PyTorch, so members
that share an encoder (:attr:`dphub.tagger.Tagger.encoder_key`) still share one ONNX pass.

``torch-bf16`` runs the same PyTorch encoder under ``torch.autocast(dtype=torch.bfloat16)``:
on a CPU with native bfloat16 matmuls (AVX512-BF16 or AMX; CUDA GPUs) it halves the encoder's
time while every hidden vector keeps its direction (cosine ≥ 0.9998 on a 32 × 128 batch, against
0.97 for int8; docs/speed.md), because bfloat16 keeps fp32's exponent and drops mantissa bits
only. On a CPU without them PyTorch emulates bfloat16 and is *slower* than fp32, so
:func:`check_bf16` refuses it there instead of letting a run silently crawl. Nothing is cached.

Cache: ``<cache>/onnx/<encoder digest>/`` (``$DPHUB_CACHE_DIR`` or the platform's user cache
directory, 0700), keyed by :attr:`~dphub.tagger.Tagger.encoder_digest` (SHA-256 of the encoder
weights), so every member on one public base shares one file, and the model directory itself
(pinned by digest in the registry and the manifest) is never touched. A graph is code that sees
every note, and the cache key and the probe batch are public, so a file that anyone else wrote
is never run: (1) the cache directories must belong to the user and be writable by nobody else
(else one :class:`~dphub.errors.ModelError`); (2) ``meta.json`` records, for each ``.onnx``
file, an HMAC-SHA256 under a per-user secret key (:func:`cache_key_path`, 0600, kept in the
dphub home directory, not in the cache, so a cache copied or planted from elsewhere does not
verify), bound to the encoder digest and the runtime; a cached session is built from the very
bytes that were verified (an int8 graph is quantized from the fp32 file just after that file's
MAC verified, inside the user's private 0700 directory); (3) the session must reproduce the PyTorch encoder on a fixed probe batch
(fp32: max abs difference; int8: cosine similarity). A file that fails (1)-(3), is unreadable or
is corrupt is rebuilt, with a warning naming its path; if a fresh build still fails the probe
the load is refused with a :class:`~dphub.errors.ModelError`. ONNX files are protobuf, nothing is
unpickled. Builds are atomic and serialised by a lock file.

Threads: ONNX Runtime gets ``intra_op_num_threads`` = the thread count given (default: torch's
``get_num_threads()``, i.e. ``--threads``), ``inter_op_num_threads = 1``, sequential
execution and no spin-waiting: a BERT layer is a chain of ops, so parallelism *inside* each
matmul is what uses the cores; inter-op threads would only compete with them, and spinning
threads burn the CPU that the other thread (and the other work of the process) needs.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import stat
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dphub.errors import ConfigError, ModelError
from dphub.io import (
    atomic_write_bytes,
    atomic_write_text,
    cache_root,
    dphub_home,
    private_key,
)

RUNTIMES: tuple[str, ...] = ("torch", "torch-bf16", "onnx", "onnx-int8")
#: runtimes that run the PyTorch encoder itself (no ONNX graph)
TORCH_RUNTIMES: tuple[str, ...] = ("torch", "torch-bf16")
#: what `dphub ensemble deid/evaluate` use when neither the flag nor the manifest names one:
#: :func:`choose_runtime` picks a concrete runtime for the device (issue 55)
AUTO = "auto"
DEFAULT_RUNTIME = AUTO
#: /proc/cpuinfo flags of native bfloat16 dot products (AVX512-BF16, AMX); without one oneDNN
#: emulates bfloat16 on AVX-512 cores, slower than fp32
BF16_CPU_FLAGS: tuple[str, ...] = ("avx512_bf16", "amx_bf16")
#: 2: files are authenticated by an HMAC under the user's key (format 1 caches are rebuilt)
CACHE_FORMAT = 2
OPSET = 17
#: probe acceptance: fp32 graphs must match PyTorch closely; int8 ones keep the direction of
#: every hidden vector (quantization noise is measured as cosine similarity, not abs error).
#: Measured per-token minimum: 0.97-0.98 for a model's own int8 graph, 0.65 for another
#: MiniLM-based encoder's graph.
FP32_MAX_ABS = 1e-3
INT8_MIN_COSINE = 0.9
_FILES = {"onnx": "encoder.onnx", "onnx-int8": "encoder-int8.onnx"}
#: the per-user key of the cache's HMACs, in the dphub home directory
CACHE_KEY_FILE = "onnx-cache.key"
_KEY_BYTES = 32
_MAC_CONTEXT = b"dphub-onnx-cache-v2"

log = logging.getLogger(__name__)


#: oneDNN's cache of compiled kernels (bfloat16 matmuls on CPU): one entry per input shape, 1024
#: by default. Windows of every length make a long run fill it, so the process grew by hundreds
#: of MiB over thousands of notes; a small cache removes that part of the growth at no measured
#: cost in speed (docs/speed.md, "Memory of directory runs").
ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_CAPACITY = 64

#: Inference batches are padded to a multiple of this many word pieces (the attention mask hides
#: the padding; heads and CRF see the original length). Why: besides its kernel cache, oneDNN keeps
#: per-shape state that the cache bound does not reach, so a bfloat16 run still grew by 170 MiB
#: between 1,000 and 10,000 notes while every batch length from 3 to 128 pieces was a new shape.
#: With lengths on a grid of 16 there are at most 8 per batch size, and the same 3,000-note run
#: stays flat at no measured cost in speed (docs/speed.md, "Memory of directory runs"). 128, the
#: default window, is on the grid.
SHAPE_MULTIPLE = 16


def bound_kernel_cache() -> None:
    """Cap oneDNN's kernel cache at :data:`ONEDNN_CACHE_CAPACITY` unless the user set one.

    oneDNN reads the variable once, when the process creates its first kernel, so this runs when
    :mod:`dphub.tagger` is imported, before any model does.
    """
    os.environ.setdefault(ONEDNN_CACHE_ENV, str(ONEDNN_CACHE_CAPACITY))


def check_runtime(name: str) -> str:
    """``name`` if it is a known runtime, else a :class:`ConfigError` listing them."""
    if name not in RUNTIMES:
        raise ConfigError(f"unknown runtime {name!r}; choose one of {', '.join(RUNTIMES)}")
    return name


def check_runtime_choice(name: str) -> str:
    """``name`` if it is a runtime or ``auto`` (:func:`choose_runtime`), else a ConfigError."""
    if name == AUTO:
        return name
    if name not in RUNTIMES:
        raise ConfigError(f"unknown runtime {name!r}; choose one of "
                          f"{', '.join((AUTO, *RUNTIMES))}")
    return name


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str] | None:
    """The CPU's feature flags from ``/proc/cpuinfo`` (Linux), or None where it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[-1].split())
    except OSError:
        return None
    return None


def choose_runtime(device: torch.device | str = "cpu", *,
                   flags: frozenset[str] | None = None) -> tuple[str, str]:
    """The runtime ``auto`` means on ``device``, and why (printed once by the CLI).

    ``torch-bf16`` where bfloat16 dot products are native: it kept every recall figure of the
    held-out and inner splits (docs/speed.md) at 1.6-1.7x fp32's speed. On a CPU, native means
    a flag of :data:`BF16_CPU_FLAGS` in ``/proc/cpuinfo`` (``flags``: given by tests) *and*
    PyTorch's own oneDNN check; PyTorch alone also says yes on AVX-512 cores that emulate it.
    Elsewhere fp32 ``torch``: ``onnx-int8`` is faster but lost up to 0.54 recall points at the
    thresholds the recall-first rule reads, beyond the 0.3-point bar, so it stays a choice the
    user makes (``--runtime onnx-int8``).
    """
    kind = torch.device(device).type
    if kind == "cuda":
        if native_bf16("cuda"):
            return "torch-bf16", "native bf16 on this GPU"
        return "torch", "this GPU has no native bf16"
    if kind != "cpu":
        return "torch", f"no tuned runtime for a {kind} device"
    if flags is None:
        flags = cpu_flags()
    has_flag = flags is None or any(f in flags for f in BF16_CPU_FLAGS)  # None: not Linux
    if has_flag and native_bf16("cpu"):
        return "torch-bf16", "native bf16"
    return "torch", "no native bf16 on this CPU; --runtime onnx-int8 is faster but lost recall"


#: the device model members run on unless a caller names one (:func:`set_inference_device`)
_DEVICE: list[str] = []


def choose_device(requested: str | None = None) -> str:
    """The inference device: ``requested`` (``cpu``, ``cuda``, ``cuda:N``) or, for None or
    ``auto``, ``cuda`` when PyTorch sees a GPU, else ``cpu``. A GPU asked for and absent is one
    ConfigError (not a silent fall-back to a CPU twenty times slower)."""
    name = (requested or AUTO).strip().lower()
    if name == AUTO:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"unknown device {requested!r}; choose auto, cpu or cuda[:N]") from None
    if dev.type == "cpu":
        return "cpu"
    if dev.type != "cuda":
        raise ConfigError(f"unknown device {requested!r}; choose auto, cpu or cuda[:N]")
    if not torch.cuda.is_available():
        raise ConfigError(f"device {requested!r}: PyTorch sees no CUDA GPU here; use --device cpu")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"device {requested!r}: only {torch.cuda.device_count()} CUDA GPU(s)")
    return str(dev)


def set_inference_device(requested: str | None) -> str:
    """Make :func:`choose_device` of ``requested`` the device of taggers loaded from now on in
    this process (the CLI's ``--device``); returns it."""
    dev = choose_device(requested)
    _DEVICE[:] = [dev]
    return dev


def inference_device() -> str:
    """The device of taggers loaded without one: :func:`set_inference_device`'s, else auto."""
    return _DEVICE[0] if _DEVICE else choose_device(None)


def native_bf16(kind: str) -> bool:
    """Does a ``kind`` device (``cpu``, ``cuda``) run bfloat16 matmuls natively?"""
    if kind == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if kind == "cpu":
        try:  # PyTorch's own test of oneDNN's native bfloat16 kernels (AVX512-BF16 / AMX)
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False
    return False


def check_bf16(device: torch.device | str = "cpu") -> None:
    """Refuse ``torch-bf16`` where bfloat16 matmuls are emulated (slower than fp32, not faster)."""
    kind = torch.device(device).type
    if not native_bf16(kind):
        raise ConfigError(f"runtime torch-bf16 needs native bfloat16 matmuls, which this {kind} "
                          "lacks (it would run slower than fp32); use torch or onnx-int8")


def bf16_autocast(device: torch.device | str = "cpu") -> Any:
    """The autocast context of ``torch-bf16`` (matmuls and linear layers in bfloat16)."""
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def _check_private_dir(path: Path, *, group_writable_ok: bool = False) -> None:
    """Refuse a cache directory that is not the user's own or that others may write to.

    Why: a graph planted there would run on every note. ``group_writable_ok`` is for the cache
    root only (shared with the warm start; created under the user's umask, 002 on many systems):
    a group member there can only replace the ``onnx`` directory, which is then not the user's
    and refused.
    """
    try:
        st = os.stat(path)
    except OSError as e:
        raise ModelError(f"ONNX cache directory {path} cannot be used "
                         f"({e.strerror or type(e).__name__})") from None
    hint = "set DPHUB_CACHE_DIR to a directory of your own, or use --runtime torch"
    if not stat.S_ISDIR(st.st_mode):
        raise ModelError(f"ONNX cache directory {path} is not a directory; {hint}")
    if st.st_uid != os.geteuid():
        raise ModelError(f"ONNX cache directory {path} belongs to another user (uid "
                         f"{st.st_uid}); graphs are only loaded from your own cache: {hint}")
    if st.st_mode & (0o002 if group_writable_ok else 0o022):
        raise ModelError(f"ONNX cache directory {path} is writable by other users (mode "
                         f"{stat.S_IMODE(st.st_mode):o}); graphs are only loaded from a "
                         f"private cache: {hint}")


def _private_dir(path: Path) -> None:
    """Create ``path`` 0700 (or tighten it to 0700 when it is the user's), then check it."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    with contextlib.suppress(OSError):
        if path.stat().st_uid == os.geteuid():
            os.chmod(path, 0o700)
    _check_private_dir(path)


def _cache_dir(digest: str) -> Path:
    """``<cache>/onnx/<digest>``, every level checked (:func:`_check_private_dir`)."""
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelError(f"cannot create the cache directory {root} "
                         f"({e.strerror or type(e).__name__})") from None
    _check_private_dir(root, group_writable_ok=True)
    _private_dir(root / "onnx")
    d = root / "onnx" / digest
    _private_dir(d)
    return d


def cache_key_path() -> Path:
    """Where the per-user key of the ONNX cache's HMACs lives (the dphub home directory)."""
    return dphub_home() / CACHE_KEY_FILE


def cache_key() -> bytes:
    """The per-user HMAC key, created (random, 0600) on first use.

    Created whole or not at all: written to a private temporary file, then hard-linked to its
    name, which fails if another process made it first (that key is then used). A key file that
    is not a regular 0600 file of this user with the right size is refused, not replaced: the
    user should see why.
    """
    path = cache_key_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return private_key(path, _KEY_BYTES)
    except OSError as e:
        raise ModelError(f"cannot read or create the ONNX cache key {path} "
                         f"({e.strerror or type(e).__name__})") from None
    except ValueError:
        raise ModelError(f"the ONNX cache key {path} is not a private key file of yours "
                         f"({_KEY_BYTES} bytes, mode 600); remove it and a new one is made "
                         "(cached ONNX graphs are then rebuilt)") from None


def file_mac(key: bytes, digest: str, runtime: str, data: bytes) -> str:
    """HMAC-SHA256 of an ONNX file's bytes, bound to the encoder digest and the runtime (a
    genuine graph of another encoder or runtime does not verify in this place)."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    mac.update(b"\0".join((_MAC_CONTEXT, digest.encode(), runtime.encode(), b"")))
    mac.update(data)
    return mac.hexdigest()


def _verified_bytes(path: Path, key: bytes, digest: str, runtime: str,
                    macs: dict[str, Any]) -> tuple[bytes | None, str]:
    """The bytes of ``path`` if their HMAC is the recorded one, else (None, why)."""
    want = macs.get(runtime)
    if not isinstance(want, str):
        return None, "no authentication code is recorded for it"
    try:
        data = path.read_bytes()
    except OSError as e:
        return None, f"it cannot be read ({e.strerror or type(e).__name__})"
    if not hmac.compare_digest(file_mac(key, digest, runtime, data), want):
        return None, "it does not match its authentication code (changed or not built here)"
    return data, ""


class _EncoderGraph(nn.Module):
    """What is exported: ``(input_ids, attention_mask) -> last hidden states``.

    ``token_type_ids`` are zeros and ``position_ids`` ``0..L-1`` on every row, exactly what
    :func:`dphub.align.collate` builds, so they are constants of the graph, not inputs.
    """

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                           token_type_ids=torch.zeros_like(input_ids))
        return out[0] if isinstance(out, tuple) else out.last_hidden_state


def _probe_batch(vocab_size: int) -> dict[str, np.ndarray]:
    """A fixed two-row batch (no text: token ids from a fixed generator), one row padded."""
    rng = np.random.default_rng(20261123)
    ids = rng.integers(1000, min(vocab_size, 20000), size=(2, 48), dtype=np.int64)
    ids[:, 0], ids[0, -1], ids[1, 30] = 101, 102, 102  # [CLS] ... [SEP] (BERT vocabularies)
    mask = np.ones_like(ids)
    mask[1, 31:] = 0
    ids[1, 31:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def export_encoder(encoder: nn.Module, path: Path) -> bytes:
    """Export ``encoder`` (fp32, eval) to ONNX at ``path`` (dynamic batch and length), atomically;
    returns the bytes written (what the cache authenticates and loads).

    Uses the TorchScript-based exporter (``dynamo=False``): it handles transformers' BERT without
    extra packages and gives one static graph with dynamic axes.
    """
    graph = _EncoderGraph(encoder).eval()
    probe = _probe_batch(int(getattr(getattr(encoder, "config", None), "vocab_size", 30522)))
    args = (torch.from_numpy(probe["input_ids"]), torch.from_numpy(probe["attention_mask"]))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.export")
    try:
        with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer and deprecation chatter, not our problem
            torch.onnx.export(
                graph, args, str(tmp), input_names=["input_ids", "attention_mask"],
                output_names=["hidden"], opset_version=OPSET, do_constant_folding=True,
                dynamic_axes={"input_ids": {0: "batch", 1: "length"},
                              "attention_mask": {0: "batch", 1: "length"},
                              "hidden": {0: "batch", 1: "length"}},
                dynamo=False,
            )
        data = tmp.read_bytes()
        atomic_write_bytes(path, data)
        return data
    except ModelError:
        raise
    except Exception as e:  # the exporter raises many types; say which step failed
        raise ModelError(f"cannot export the encoder to ONNX ({type(e).__name__})") from None
    finally:
        tmp.unlink(missing_ok=True)


#: how the int8 graph is made (recorded in the cache's meta.json: a change rebuilds the file).
#: Per-channel weight scales: per-tensor scales lost too much on MiniLM's outlier channels
#: (probe cosine min 0.83 per tensor vs 0.97 per channel); see docs/results.md for recall.
INT8_RECIPE: dict[str, Any] = {"weight_type": "QInt8", "per_channel": True,
                               "op_types": ["MatMul"], "exclude": []}


def quantize_int8(src: Path, dst: Path) -> bytes:
    """Dynamic int8 quantization of the fp32 graph's MatMuls (int8 weights, uint8 activations
    quantized at run time; :data:`INT8_RECIPE`'s ``exclude`` names substrings of nodes kept in
    fp32), written atomically to ``dst``; returns the bytes written."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    recipe = INT8_RECIPE
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.quant")
    try:
        import onnx

        names = [n.name for n in onnx.load(str(src), load_external_data=False).graph.node]
        exclude = [n for n in names if any(x in n for x in recipe.get("exclude", []))]
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # the quantizer logs advice at WARNING on the root logger
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                quantize_dynamic(str(src), str(tmp),
                                 weight_type=getattr(QuantType, recipe["weight_type"]),
                                 per_channel=bool(recipe["per_channel"]),
                                 op_types_to_quantize=list(recipe["op_types"]),
                                 nodes_to_exclude=exclude)
        finally:
            root.setLevel(level)
        data = tmp.read_bytes()
        atomic_write_bytes(dst, data)
        return data
    except Exception as e:
        raise ModelError(f"cannot quantize the ONNX encoder ({type(e).__name__})") from None
    finally:
        tmp.unlink(missing_ok=True)


def _session(model: bytes, threads: int, name: str) -> Any:
    """An ONNX Runtime session of the serialized graph ``model`` (the bytes that were verified,
    not the path, so the file cannot change between the check and the load)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, int(threads))
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3  # errors only: ORT's warnings go to stderr otherwise
    # idle intra-op threads sleep instead of spinning: with 2 threads on a loaded 2-core machine
    # spinning cost 27 % more CPU and 22 % more wall time per batch (docs/speed.md)
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # a corrupt protobuf raises ORT's own exception types
        raise ModelError(f"{name}: not a loadable ONNX file ({type(e).__name__})") from None


def _probe_ok(runtime: str, sess: Any, encoder: nn.Module) -> bool:
    """Does ``sess`` compute what ``encoder`` computes on the fixed probe batch?"""
    probe = _probe_batch(int(getattr(getattr(encoder, "config", None), "vocab_size", 30522)))
    try:
        got = sess.run(None, probe)[0]
    except Exception:
        return False
    with torch.inference_mode():
        ref = _EncoderGraph(encoder).eval()(torch.from_numpy(probe["input_ids"]),
                                            torch.from_numpy(probe["attention_mask"])).numpy()
    if got.shape != ref.shape:
        return False
    real = probe["attention_mask"].astype(bool)
    a, b = got[real].astype(np.float64), ref[real].astype(np.float64)
    if not np.all(np.isfinite(a)):
        return False
    if runtime == "onnx":
        return float(np.abs(a - b).max()) <= FP32_MAX_ABS
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)
    return float(cos.min()) >= INT8_MIN_COSINE


@dataclass
class CacheStatus:
    """How :func:`load_encoder` got its session: ``cached`` (verified file), ``built`` (none
    yet) or ``rebuilt`` (a file failed its authentication code, could not be loaded or failed
    the probe, and was replaced)."""

    runtime: str
    path: Path
    status: str


@contextlib.contextmanager
def _build_lock(d: Path) -> Iterator[None]:
    from filelock import FileLock, Timeout

    lock = FileLock(str(d / ".build.lock"), timeout=1800, mode=0o600)
    try:
        lock.acquire()
    except Timeout:
        raise ModelError(f"{d}: another process has been building this ONNX encoder for "
                         "30 minutes; remove the lock file if it died") from None
    try:
        yield
    finally:
        lock.release()


def _read_meta(d: Path) -> dict[str, Any]:
    try:
        meta = json.loads((d / "meta.json").read_text(encoding="utf-8"))
        return meta if isinstance(meta, dict) else {}
    except (OSError, ValueError):
        return {}


def load_encoder(runtime: str, encoder: nn.Module, digest: str, *, threads: int | None = None,
                 progress: Callable[[str], None] | None = None) -> tuple[OnnxEncoder, CacheStatus]:
    """An ONNX Runtime session computing ``encoder`` (digest ``digest``), from the cache or built.

    ``progress`` receives short status lines (no note text) before slow steps (export, int8
    quantization). Raises :class:`ModelError` when onnxruntime is missing, the cache directory is
    not private to the user, or a fresh build does not reproduce the encoder.
    """
    check_runtime(runtime)
    if runtime in TORCH_RUNTIMES:
        raise ConfigError(f"internal: the {runtime} runtime has no ONNX encoder")
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise ModelError("the ONNX runtimes need the onnxruntime package "
                         "(pip install 'dphub[onnx]')") from None
    if not isinstance(digest, str) or len(digest) != 64 or not all(
            c in "0123456789abcdef" for c in digest):
        raise ModelError("internal: an encoder digest must be 64 hex characters")
    threads = threads or torch.get_num_threads()
    d = _cache_dir(digest)  # checked on every call: a refused directory is never trusted
    memo = (str(d), runtime, threads)
    hit = _LOADED.get(memo)
    if hit is not None and hit[0] == _stat_sig(hit[1][1].path):
        return hit[1]  # members on one encoder share one verified session (file unchanged)
    loaded = _load(runtime, encoder, digest, d, threads, progress)
    _LOADED[memo] = (_stat_sig(loaded[1].path), loaded)
    return loaded


def _stat_sig(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


#: sessions loaded in this process: (cache dir, runtime, threads) -> (file signature, result)
_LOADED: dict[tuple[str, str, int], tuple[Any, tuple[OnnxEncoder, CacheStatus]]] = {}


def _load(runtime: str, encoder: nn.Module, digest: str, d: Path, threads: int,
          progress: Callable[[str], None] | None) -> tuple[OnnxEncoder, CacheStatus]:
    target = d / _FILES[runtime]
    say = progress or (lambda _msg: None)
    key = cache_key()
    with _build_lock(d):
        meta = _read_meta(d)
        macs = meta.get("macs") if (meta.get("encoder_digest") == digest
                                    and meta.get("format") == CACHE_FORMAT) else None
        macs = dict(macs) if isinstance(macs, dict) else {}
        if meta.get("int8_recipe") != INT8_RECIPE:  # made another way: not this runtime's file
            macs.pop("onnx-int8", None)
        status = "built"
        if target.exists():
            data, why = _verified_bytes(target, key, digest, runtime, macs)
            if data is not None:
                try:
                    sess = _session(data, threads, target.name)
                except ModelError:
                    sess, why = None, "ONNX Runtime cannot load it"
                if sess is not None:
                    if _probe_ok(runtime, sess, encoder):
                        return OnnxEncoder(sess, runtime), CacheStatus(runtime, target, "cached")
                    why = "it does not reproduce the encoder on the probe batch"
            log.warning("rebuilding the ONNX encoder %s: %s", target, why)
            status = "rebuilt"
        fp32 = d / _FILES["onnx"]
        if runtime == "onnx" or _verified_bytes(fp32, key, digest, "onnx", macs)[0] is None:
            say(f"exporting encoder {digest[:12]} to ONNX (once per encoder)")
            data = export_encoder(encoder, fp32)
            macs["onnx"] = file_mac(key, digest, "onnx", data)
        if runtime == "onnx-int8":
            say(f"quantizing ONNX encoder {digest[:12]} to int8 (once per encoder)")
            data = quantize_int8(fp32, target)
            macs["onnx-int8"] = file_mac(key, digest, "onnx-int8", data)
        import onnxruntime

        atomic_write_text(d / "meta.json", json.dumps({
            "format": CACHE_FORMAT, "encoder_digest": digest, "macs": macs, "opset": OPSET,
            "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
            "int8_recipe": INT8_RECIPE,
        }, indent=2, sort_keys=True) + "\n")
        sess = _session(data, threads, target.name)
        if not _probe_ok(runtime, sess, encoder):
            raise ModelError(f"the {runtime} encoder built in {d} does not reproduce the PyTorch "
                             "encoder on the probe batch; use --runtime torch")
        return OnnxEncoder(sess, runtime), CacheStatus(runtime, target, status)


class OnnxEncoder:
    """Callable like :meth:`dphub.tagger.TaggerModel.encode`: a collated batch in, ``[B, L, H]``
    float32 hidden states out (a torch tensor sharing the session's output buffer)."""

    def __init__(self, session: Any, runtime: str) -> None:
        self.session = session
        self.runtime = runtime

    def __call__(self, batch: dict[str, Tensor]) -> Tensor:
        feeds = {"input_ids": batch["input_ids"].cpu().numpy().astype(np.int64, copy=False),
                 "attention_mask": batch["attention_mask"].cpu().numpy().astype(np.int64,
                                                                                copy=False)}
        return torch.from_numpy(self.session.run(None, feeds)[0])
