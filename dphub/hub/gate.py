"""The publish gate: what may leave the data owner's machine, checked with no override.

A model directory is published only if it carries a valid, private model card with its accounting
fields, only safetensors weights (no pickles, no optimizer or trainer state that could memorise
more than the DP guarantee covers), tokenizer files identical to the public base model's (a
tokenizer trained on the notes would leak their vocabulary outside the DP guarantee), and no local
paths or user names. Each refusal is one :class:`~dphub.errors.PublishRefused` naming the file,
never quoting its content.
"""

from __future__ import annotations

import fnmatch
import getpass
import json
import math
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dphub.errors import CardError, DphubError, PublishRefused
from dphub.hub.common import DP_TAG, PRIVACY_UNITS, CardSummary, file_sha256, read_card_meta

#: Files that may hold pickled Python objects (arbitrary code on load).
PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle", "*.ckpt", "*.joblib")
#: Optimizer / trainer state: not covered by the DP guarantee of the released weights.
STATE_PATTERNS = (
    "optimizer*", "scheduler*", "rng_state*", "checkpoint*", "trainer_state.json",
    "training_args*", "*.ckpt",
)
#: Tokenizer files that must match the public base model byte for byte.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
    "tokenizer.model",
)
REQUIRED_FILES = ("README.md", "config.json", "model.safetensors")
#: DP block fields without which the guarantee cannot be recomputed or understood.
ACCOUNTING_FIELDS = (
    "private", "epsilon", "delta", "privacy_unit", "accountant", "noise_multiplier",
    "max_grad_norm", "sample_rate", "steps",
)
#: Substrings that betray local absolute paths.
PATH_MARKERS = ("/home/", "/Users/", "C:\\", "C:/", "/root/", "/tmp/", "/private/var/")
_PICKLE_MAGIC = re.compile(rb"\A\x80[\x02-\x05]")


class GateViolation(DphubError):
    """One reason a model directory may not be shared; wrapped by the publish or pull side."""


def _refuse(model_dir: Path, why: str) -> GateViolation:
    return GateViolation(why)


def _files(model_dir: Path) -> list[Path]:
    """All entries below ``model_dir``; symlinks refused (they can point anywhere)."""
    out = []
    for p in sorted(model_dir.rglob("*")):
        rel = p.relative_to(model_dir)
        if p.is_symlink():
            raise _refuse(model_dir, f"{rel} is a symbolic link; publish regular files only")
        if p.is_file():
            out.append(p)
    return out


def _looks_pickled(path: Path) -> bool:
    """Content sniffing for pickles hiding under innocent names (raw pickle, torch zip, npy)."""
    with open(path, "rb") as fh:
        head = fh.read(512)
    if _PICKLE_MAGIC.match(head):
        return True
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as zf:
                for name in zf.namelist():
                    if name.endswith(".pkl"):
                        return True
                    if name.endswith(".npy"):
                        with zf.open(name) as member:
                            if _npy_is_object(member.read(512)):
                                return True
            return False
        except zipfile.BadZipFile:
            return False
    return _npy_is_object(head)


def _npy_is_object(head: bytes) -> bool:
    """An ``.npy`` header declaring an object array (whose payload is a pickle)."""
    # An object array is stored pickled; its header dict says so in 'descr'.
    return head.startswith(b"\x93NUMPY") and (b"'|O'" in head or b"'O'" in head)


def check_files(model_dir: Path, files: list[Path]) -> None:
    """Refuse pickles and optimizer/checkpoint state; require the files a model needs."""
    for name in REQUIRED_FILES:
        if not (model_dir / name).is_file():
            raise _refuse(model_dir, f"{name} is missing")
    for f in files:
        rel = f.relative_to(model_dir).as_posix()
        low = f.name.lower()
        if any(fnmatch.fnmatch(low, pat) for pat in PICKLE_PATTERNS):
            raise _refuse(model_dir, f"{rel} is a pickle-based file; only safetensors weights "
                                     "may be published")
        if any(fnmatch.fnmatch(low, pat) for pat in STATE_PATTERNS) or any(
            fnmatch.fnmatch(part.lower(), "checkpoint*") for part in Path(rel).parts[:-1]
        ):
            raise _refuse(model_dir, f"{rel} is optimizer/checkpoint state, which the DP "
                                     "guarantee does not cover")
        if _looks_pickled(f):
            raise _refuse(model_dir, f"{rel} contains pickled objects")


def check_card(model_dir: Path, validate: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Schema validation (``dphub.card.validate_card``) plus the DP block checks of the gate."""
    try:
        meta = read_card_meta(model_dir)
    except CardError as e:
        raise _refuse(model_dir, f"model card: {e.message}") from None
    dp = meta.get("differential_privacy")
    if not isinstance(dp, dict):
        raise _refuse(model_dir, "the model card has no differential_privacy block")
    missing = [k for k in ACCOUNTING_FIELDS if k not in dp or dp[k] is None and k != "epsilon"]
    if missing:
        raise _refuse(model_dir, "the card's differential_privacy block lacks accounting "
                                 f"field(s): {', '.join(missing)}")
    if dp.get("private") is not True:
        raise _refuse(model_dir, "the model is marked non-private (differential_privacy.private "
                                 "is not true); only DP-trained models can be published")
    eps = dp.get("epsilon")
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps) \
            or eps <= 0:
        raise _refuse(model_dir, f"differential_privacy.epsilon must be a finite positive number "
                                 f"(got {eps!r})")
    delta = dp.get("delta")
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 <= delta < 1:
        raise _refuse(model_dir, f"differential_privacy.delta must be in [0, 1) (got {delta!r})")
    if dp.get("privacy_unit") not in PRIVACY_UNITS:
        raise _refuse(model_dir, "differential_privacy.privacy_unit must be one of "
                                 f"{', '.join(PRIVACY_UNITS)}")
    if DP_TAG not in (meta.get("tags") or []):
        raise _refuse(model_dir, f"the card's tags must include {DP_TAG!r}")
    if validate is None:
        validate = _card_validator()
    if validate is not None:
        try:
            validate(model_dir, require_private=True)
        except DphubError as e:
            raise _refuse(model_dir, f"model card fails validation: {e.message}") from None
    return meta


def _card_validator() -> Callable[..., Any] | None:
    """``dphub.card.validate_card`` (schema + accounting recomputation), if installed."""
    try:
        from dphub.card import validate_card
    except ImportError:
        return None
    return validate_card


def resolve_base_tokenizer_dir(base_model: str | None) -> Path | None:
    """Directory holding the public base model's tokenizer files, or None if unresolvable.

    The embedded default maps to its packaged files; an ``org/name`` pulled into the registry maps
    to its directory; otherwise the Hugging Face cache is consulted without network access.
    """
    from dphub.encoders import DEFAULT_BASE_MODEL_ID, embedded_model_dir

    if not base_model:
        return None
    if base_model in (DEFAULT_BASE_MODEL_ID, "all-MiniLM-L6-v2"):
        return embedded_model_dir()
    from dphub.hub.registry import Registry

    try:
        return Registry().get(base_model).path
    except DphubError:
        pass
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(base_model, local_files_only=True))
    except Exception:  # noqa: BLE001 - any failure means "not resolvable offline"
        return None


def check_tokenizer(model_dir: Path, meta: dict[str, Any]) -> None:
    """Tokenizer files must be byte-identical (sha256) to the declared public base model's."""
    base = meta.get("base_model")
    base_dir = resolve_base_tokenizer_dir(base if isinstance(base, str) else None)
    if base_dir is None:
        raise _refuse(model_dir, f"cannot resolve the card's base_model {base!r} to verify the "
                                 "tokenizer files against it")
    present = [n for n in TOKENIZER_FILES if (model_dir / n).is_file()]
    if not present:
        raise _refuse(model_dir, "no tokenizer files (tokenizer.json, vocab.txt ...)")
    for name in present:
        ref = base_dir / name
        if not ref.is_file():
            raise _refuse(model_dir, f"{name} is not a file of the base model {base}; tokenizer "
                                     "files must be the public base model's")
        if file_sha256(model_dir / name) != file_sha256(ref):
            raise _refuse(model_dir, f"{name} differs (sha256) from the base model {base}'s; a "
                                     "tokenizer fitted on private notes cannot be published")


def _private_markers() -> list[tuple[str, re.Pattern[str]]]:
    markers = [(m, re.compile(re.escape(m))) for m in PATH_MARKERS]
    home = str(Path.home())
    if home not in ("/", "") and len(home) > 1:
        markers.append(("the home directory", re.compile(re.escape(home) + r"(?![\w.-])")))
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name known: nothing to look for
        user = ""
    if len(user) >= 3:
        markers.append(("the current user name", re.compile(rf"(?<![\w]){re.escape(user)}(?!\w)")))
    return markers


def _safetensors_header(path: Path) -> str:
    """The JSON header of a safetensors file (where free-form metadata lives)."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            return ""
        n = int.from_bytes(raw, "little")
        if n > 100_000_000:
            return ""
        return fh.read(n).decode("utf-8", "replace")


def check_private_strings(model_dir: Path, files: list[Path], skip: set[str]) -> None:
    """No absolute local paths, home directory or user name in any text file or weight header."""
    markers = _private_markers()
    for f in files:
        rel = f.relative_to(model_dir).as_posix()
        if rel in skip:
            continue
        if f.suffix == ".safetensors":
            text = _safetensors_header(f)
        else:
            data = f.read_bytes()
            if b"\x00" in data[:8192]:
                continue  # binary, not a config
            text = data.decode("utf-8", "replace")
        for label, pat in markers:
            m = pat.search(text)
            if m:
                line = text.count("\n", 0, m.start()) + 1
                raise _refuse(model_dir, f"{rel} line {line} contains {label!r} (a local path "
                                         "or user name); remove it before publishing")


def check_publishable(model_dir: str | Path,
                      validate: Callable[..., Any] | None = None) -> CardSummary:
    """Run every gate check on ``model_dir``; return the card summary when it may be published."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise PublishRefused(f"refusing to publish {model_dir}: not a directory")
    try:
        files = _files(model_dir)
        check_files(model_dir, files)
        check_config(model_dir)
        meta = check_card(model_dir, validate)
        check_tokenizer(model_dir, meta)
        # Tokenizer files were just proven identical to public ones: their words are not ours.
        check_private_strings(model_dir, files, skip=set(TOKENIZER_FILES))
    except GateViolation as e:
        raise PublishRefused(f"refusing to publish {model_dir}: {e.message}") from None
    return CardSummary.from_meta(meta)


def check_config(model_dir: Path) -> dict[str, Any]:
    """config.json must parse and must not ask for remote code (``auto_map``)."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise _refuse(model_dir, "config.json is not valid JSON") from None
    if not isinstance(config, dict):
        raise _refuse(model_dir, "config.json is not a JSON object")
    if "auto_map" in config or any(p.suffix == ".py" for p in model_dir.rglob("*.py")):
        raise _refuse(model_dir, "the model ships custom code (auto_map / *.py); dphub never "
                                 "runs remote code")
    return config


def check_shareable(model_dir: Path) -> CardSummary:
    """The checks a puller repeats on a downloaded model (raises :class:`GateViolation`).

    The tokenizer and private-string checks are the publisher's duty; the puller verifies what
    protects *it*: safetensors only, no code, a valid private card with its accounting fields.
    """
    files = _files(model_dir)
    check_files(model_dir, files)
    check_config(model_dir)
    meta = check_card(model_dir)
    return CardSummary.from_meta(meta)
