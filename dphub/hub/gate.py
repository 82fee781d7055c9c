"""The publish gate: what may leave the data owner's machine, checked with no override.

A model directory is published only if it carries a valid, private model card with its accounting
fields (or a public base model's card: public synthetic notes only, ε 0, ``dphub pretrain``), only safetensors weights (no pickles, no optimizer or trainer state that could memorise
more than the DP guarantee covers), tokenizer files identical to the public base model's (a
tokenizer trained on the notes would leak their vocabulary outside the DP guarantee), and no local
paths or user names. Each refusal is one :class:`~dphub.errors.PublishRefused` naming the file,
never quoting its content.

Only accounted outputs leave: the directory may hold nothing but the allow-listed files
(:data:`PUBLISHED_FILES`), ``training_config.json`` nothing but hyper-parameters
(:data:`TRAINING_CONFIG_KEYS`, :data:`TRAINING_HYPERPARAM_KEYS`: no loss curve, no unit count,
no mechanism seed), and the weights exactly the tensors ``config.json`` implies (a spare tensor is
a channel the DP guarantee does not cover). Weights and card are bound: the card's
``weights_sha256`` is the weights' hash and the training config repeats the card's accounting
fields, so a DP run's README copied next to ``--no-dp`` weights is refused. The encoder is the
declared base's by its weights, not its name (:func:`check_base_weights`), and a public-synthetic
claim comes with a record of data the gate regenerates (:func:`check_public_provenance`). Pull
repeats the checks that protect the puller (:func:`check_shareable`), and a public base's provenance.
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

from dphub.card import (
    TRAINING_CONFIG_FORMAT,
    body_is_rendered,
    dataset_block,
    is_public_model,
    load_card,
    load_valid_card,
)
from dphub.encoders import (
    DEFAULT_BASE_MODEL_ID,
    embedded_model_dir,
    encoder_digest,
    encoder_tensors,
    meta_encoder,
    tensor_bytes,
)
from dphub.errors import CardError, ConfigError, DphubError, ModelError, PublishRefused
from dphub.hub.common import (
    DP_TAG,
    PRIVACY_UNITS,
    SYNTH_DATASET,
    CardSummary,
    file_sha256,
    read_card_meta,
)
from dphub.io import cache_root
from dphub.privacy.accounting import CLAIM_RTOL, below
from dphub.registry import Registry

#: ``differential_privacy.training_data`` of a public base model (``dphub.card.PUBLIC_SYNTHETIC``;
#: repeated so the gate's module does not import the card module at import time).
PUBLIC_SYNTHETIC = "public-synthetic"

#: Top-level keys ``training_config.json`` may hold (format 2, written by ``dphub train``).
TRAINING_CONFIG_KEYS = frozenset({
    "format_version", "dphub_training", "base_model", "init_from", "no_dp", "privacy_unit",
    "accountant", "steps", "sample_rate", "noise_multiplier", "delta", "epsilon",
    "base_model_sha256",
})
#: Keys of its ``dphub_training`` block: hyper-parameters only. ``seed`` is the initialisation
#: seed; the mechanism's randomness never comes from it and is never written anywhere.
TRAINING_HYPERPARAM_KEYS = frozenset({
    "format", "noise", "target_epsilon", "delta", "epochs", "batch_size", "max_physical_batch",
    "max_grad_norm", "lr", "privacy_unit", "max_examples_per_unit", "accountant", "head",
    "train_layers", "lora_rank", "recall_weight", "label_schema", "max_epsilon", "seed",
    "secure_rng", "warm_start", "no_dp", "max_length", "stride", "checkpoint_every",
    "rule_features", "rule_lr_scale", "soft_labels", "encoder_layers",
})
#: The public data's record of a ``dphub pretrain`` run (:func:`public_provenance_problems`),
#: without which the claim "public synthetic notes" cannot be checked.
PUBLIC_DATA_KEYS = ("synth_notes", "synth_discharge_share", "synth_seed", "synth_sha256")
#: Every key ``dphub_training`` may hold: the training options, and a pretraining's data record.
PUBLISHED_HYPERPARAM_KEYS = TRAINING_HYPERPARAM_KEYS | frozenset(PUBLIC_DATA_KEYS)
#: Card ``differential_privacy`` fields that ``training_config.json`` must repeat exactly.
BOUND_FIELDS = ("noise_multiplier", "sample_rate", "steps", "delta", "privacy_unit")
MAX_TRAINING_CONFIG_BYTES = 65536
#: Largest encoder a config may describe before its skeleton is built (layers).
MAX_LAYERS = 64

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
REQUIRED_FILES = ("README.md", "config.json", "model.safetensors", "training_config.json")
#: Every file a published model directory may contain.
PUBLISHED_FILES = (
    "model.safetensors", "config.json", "README.md", "training_config.json", *TOKENIZER_FILES,
)
#: Files a pulled directory may hold besides: a Hugging Face hub adds ``.gitattributes`` to every
#: repo it creates (a publisher never needs to send one, so publish refuses it: free text).
PULLED_FILES = (*PUBLISHED_FILES, ".gitattributes")
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


def check_files(model_dir: Path, files: list[Path],
                allowed: tuple[str, ...] = PUBLISHED_FILES) -> None:
    """Refuse pickles and optimizer/checkpoint state and every file not in ``allowed``; require
    the files a model needs."""
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
    problems = unlisted_file_problems(model_dir, files, allowed)
    if problems:
        raise _refuse(model_dir, problems[0])


def unlisted_file_problems(model_dir: Path, files: list[Path],
                           allowed: tuple[str, ...] = PUBLISHED_FILES) -> list[str]:
    """One message per file outside ``allowed`` (anything else is unaccounted)."""
    out = []
    for f in files:
        rel = f.relative_to(model_dir).as_posix()
        if rel not in allowed:
            out.append(f"{_safe_name(rel)} is not a file dphub publishes (allowed: weights, "
                       "config.json, tokenizer files, README.md, training_config.json); only "
                       "accounted outputs may leave")
    return out


_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.@/+-]{1,200}$")


def _safe_name(name: str) -> str:
    """A file or tensor name fit for a message (hostile names could carry text)."""
    return name if _SAFE_NAME.match(name) else "<a name with unusual characters>"


def check_card(model_dir: Path, validate: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Schema validation (``dphub.card.validate_card``) plus the DP block checks of the gate."""
    try:
        meta = read_card_meta(model_dir)
    except CardError as e:
        raise _refuse(model_dir, f"model card: {e.message}") from None
    dp = meta.get("differential_privacy")
    if not isinstance(dp, dict):
        raise _refuse(model_dir, "the model card has no differential_privacy block")
    if dp.get("local_only") is True:  # first: the one reason that matters for such a model
        raise _refuse(model_dir, "the model is LOCAL ONLY: it contains unprotected patient "
                                 "information (trained without differential privacy on the data "
                                 "owner's own notes) and never leaves this machine; train it "
                                 "with --dp to get a publishable model")
    if dp.get("training_data") == PUBLIC_SYNTHETIC:
        return _check_public_card(model_dir, meta, validate)
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
    _check_tag_and_schema(model_dir, meta, validate)
    return meta


def _check_tag_and_schema(model_dir: Path, meta: dict[str, Any],
                          validate: Callable[..., Any] | None) -> None:
    """The dphub tag, then the card's full validation (schema + accounting), for every card the
    gate accepts (DP or public-synthetic)."""
    if DP_TAG not in (meta.get("tags") or []):
        raise _refuse(model_dir, f"the card's tags must include {DP_TAG!r}")
    if validate is None:
        validate = _card_validator()
    if validate is not None:
        try:
            validate(model_dir, require_private=True)
        except DphubError as e:
            raise _refuse(model_dir, f"model card fails validation: {e.message}") from None


def _check_public_card(model_dir: Path, meta: dict[str, Any],
                       validate: Callable[..., Any] | None) -> dict[str, Any]:
    """A public base model (``dphub pretrain``) is accepted on its provenance: public synthetic
    notes only, so no private data and no ε; the schema ties ``private: false`` and ``epsilon:
    0`` to that provenance, and the weights stay bound to the card by their hash."""
    dp = meta["differential_privacy"]
    if not is_public_model(dp):
        raise _refuse(model_dir, "the card says training_data: public-synthetic but not "
                                 "private: false with epsilon 0")
    if dp.get("lineage"):
        raise _refuse(model_dir, "a public-synthetic model cannot descend from a private model "
                                 "(lineage is set)")
    data = meta.get("dataset")
    if not isinstance(data, dict) or data.get("name") != SYNTH_DATASET:
        raise _refuse(model_dir, "a public-synthetic card's dataset must be dphub-synth (the "
                                 "public generator), not anyone's notes")
    _check_tag_and_schema(model_dir, meta, validate)  # public-synthetic passes as shareable
    return meta


def check_card_body(model_dir: Path) -> None:
    """The README body must be dphub's rendering of the front matter (no free text leaves)."""
    try:
        card = load_card(model_dir)
    except CardError as e:
        raise _refuse(model_dir, f"model card: {e.message}") from None
    if not body_is_rendered(card):
        raise _refuse(model_dir, "README.md's body is not what dphub renders from the card's "
                                 "front matter; free text may not leave in the body (put the "
                                 "trainer's prose in card_text and re-render the card with "
                                 "dphub.card.write_card)")


def _card_validator() -> Callable[..., Any]:
    """:func:`dphub.card.load_valid_card` (schema + accounting recomputation); the directory
    checks :func:`dphub.hub.validate.validate_card` adds are the gate's own, run separately."""
    return load_valid_card


def resolve_base_tokenizer_dir(base_model: str | None) -> Path | None:
    """Directory holding the public base model's tokenizer files, or None if unresolvable.

    The embedded default maps to its packaged files; an ``org/name`` pulled into the registry maps
    to its directory; otherwise the Hugging Face cache is consulted without network access.
    """
    if not base_model:
        return None
    if base_model == DEFAULT_BASE_MODEL_ID:  # the one public id; no directory name aliases it
        return embedded_model_dir()

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
        check_card_body(model_dir)
        check_training_config(model_dir, meta)
        check_tokenizer(model_dir, meta)
        check_base_weights(model_dir, meta)
        check_public_provenance(model_dir, meta)
        # Tokenizer files were just proven identical to public ones: their words are not ours.
        check_private_strings(model_dir, files, skip=set(TOKENIZER_FILES))
        check_weights(model_dir, meta)
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
    problems = config_problems(config)
    if problems:
        raise _refuse(model_dir, problems[0])
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
                       f"{_key_list(extra)}")
        if not all(_config_scalar(v) for k, v in block.items() if k != "rule_features"):
            out.append("config.json dphub block values must be numbers or short tokens")
        if "rule_features" in block:
            out += _rule_features_problems(block["rule_features"])
    return out


def check_shareable(model_dir: Path) -> CardSummary:
    """The checks a puller repeats on a downloaded model (raises :class:`GateViolation`).

    The tokenizer and private-string checks are the publisher's duty; the puller verifies what
    protects *it*: safetensors only, no code, a valid private card with its accounting fields,
    only allow-listed files and training-config keys, and weights that are exactly the tensors
    the config implies and the ones the card's hash names. A public base's provenance is
    checked again (:func:`check_public_provenance`): a hub that does not run this gate (any
    Hugging Face repository) could serve a "public synthetic" card on private weights, and a
    DP run built on it would count none of that exposure.
    """
    files = _files(model_dir)
    check_files(model_dir, files, PULLED_FILES)
    check_config(model_dir)
    meta = check_card(model_dir)
    check_training_config(model_dir, meta)
    check_public_provenance(model_dir, meta)
    check_weights(model_dir, meta)
    return CardSummary.from_meta(meta)


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
        raise _refuse(model_dir, "training_config.json cannot be read") from None
    if len(raw) > MAX_TRAINING_CONFIG_BYTES:
        raise _refuse(model_dir, "training_config.json is larger than 64 kB; it may hold "
                                 "hyper-parameters only")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError):
        raise _refuse(model_dir, "training_config.json is not valid JSON (finite numbers "
                                 "only)") from None
    if not isinstance(data, dict):
        raise _refuse(model_dir, "training_config.json is not a JSON object")
    return data


def _key_list(keys: Any) -> str:
    return ", ".join(k if _SAFE_NAME.match(str(k)) else "<unusual key>" for k in sorted(keys))


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float) or (
        isinstance(value, str) and len(value) <= 200)


def training_config_problems(model_dir: Path, dp: Any) -> list[str]:
    """Allow-listed keys, scalar hyper-parameters, and the card's accounting fields repeated.

    A loss curve, a unit count or any other statistic of the private data is not covered by the
    guarantee; the training config carries hyper-parameters and the accounting inputs only.
    """
    try:
        cfg = read_training_config(model_dir)
    except GateViolation as e:
        return [e.message]
    out: list[str] = []
    extra = set(cfg) - TRAINING_CONFIG_KEYS
    if extra:
        out.append(f"training_config.json holds key(s) outside the allow-list: "
                   f"{_key_list(extra)} (only hyper-parameters and accounting inputs may be "
                   "published; loss curves stay in the private run log)")
    legacy = cfg.get("format_version") != TRAINING_CONFIG_FORMAT
    if legacy:
        out.append(f"training_config.json format_version must be {TRAINING_CONFIG_FORMAT} "
                   "(written before the hardened guarantee: retrain with this dphub version)")
    hyper = cfg.get("dphub_training", {})
    if not isinstance(hyper, dict):
        out.append("training_config.json dphub_training must be an object of hyper-parameters")
        hyper = {}
    extra = set(hyper) - PUBLISHED_HYPERPARAM_KEYS
    if extra:
        out.append(f"training_config.json dphub_training holds key(s) outside the allow-list: "
                   f"{_key_list(extra)}")
    not_scalar = [k for k, v in [*cfg.items(), *hyper.items()]
                  if k != "dphub_training" and not _scalar(v)]
    if not_scalar:
        out.append(f"training_config.json value(s) of {_key_list(set(not_scalar))} are not "
                   "single numbers or short strings (hyper-parameters only)")
    if not isinstance(dp, dict) or legacy:
        return out  # an old config has no accounting fields to compare: its format is the news
    if dp.get("private") is not True:
        if cfg.get("no_dp") is not True:
            out.append("training_config.json does not say no_dp: true but the card is not "
                       "private: the card does not belong to this training run")
        return out  # a baseline has no accounting fields to bind (and is never published)
    if cfg.get("no_dp") is not False:
        what = "says no_dp: true (trained without DP)" if cfg.get("no_dp") is True else \
            "does not say no_dp: false"
        out.append(f"training_config.json {what} but the card claims a private model: "
                   "the card does not belong to these weights")
    # a card composing teachers claims their δ too; the run's own δ is composition.run_delta
    comp = dp.get("composition")
    bound = {**dp, "delta": comp.get("run_delta")} if isinstance(comp, dict) else dp
    differ = [key for key in BOUND_FIELDS if not _same(cfg.get(key), bound.get(key))]
    if differ:
        out.append(f"training_config.json {', '.join(differ)} "
                   f"differ{'s' if len(differ) == 1 else ''} from the card's differential_privacy "
                   "field(s): the card does not describe this training run")
    if "accountant" in cfg and cfg.get("accountant") != dp.get("accountant"):
        out.append("training_config.json accountant differs from the card's")
    eps_cfg, eps_card = cfg.get("epsilon"), dp.get("epsilon")
    if _number(eps_cfg) and _number(eps_card) and below(float(eps_card), float(eps_cfg), CLAIM_RTOL):
        out.append("the card's epsilon is below the epsilon training_config.json recorded")
    return out


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _same(a: Any, b: Any) -> bool:
    if _number(a) and _number(b):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b and a is not None


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
        raise _refuse(model_dir, "config.json has no valid 'dphub' block (head crf|softmax)")
    id2label = raw.get("id2label")
    if not isinstance(id2label, dict) or not id2label:
        raise _refuse(model_dir, "config.json has no id2label")
    layers = raw.get("num_hidden_layers", 0)
    if not isinstance(layers, int) or not 0 < layers <= MAX_LAYERS:
        raise _refuse(model_dir, f"config.json num_hidden_layers must be 1..{MAX_LAYERS}")
    n_tags = len(id2label)
    try:
        encoder = meta_encoder(model_dir)
    except Exception as e:  # noqa: BLE001 - any failure: the config describes no known model
        raise _refuse(model_dir, f"config.json does not describe a model transformers can build "
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
            raise _refuse(model_dir, "config.json has an invalid dphub.rule_features block")
        out["rule_proj.weight"] = ("F32", (n_tags, len(feats)))
        out["rule_proj.bias"] = ("F32", (n_tags,))
    return out


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "scalar"


def _names(names: list[str]) -> str:
    shown = ", ".join(_safe_name(n) for n in names[:3])
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
            out.append(f"model.safetensors tensor {_safe_name(name)} has shape {_shape(shape)}, "
                       f"config.json implies {_shape(want_shape)}")
        elif dtype != want_dtype:
            out.append(f"model.safetensors tensor {_safe_name(name)} is {dtype}, config.json "
                       f"implies {want_dtype}")
    if not out:  # a well-formed file: now its values
        out += nonfinite_problems(path)
    return out


def nonfinite_problems(path: Path) -> list[str]:
    """Floating-point tensors holding inf or NaN (one tensor in memory at a time).

    Why: a diverged run (``--lr 1e308``) wrote ±inf into every head and CRF tensor, and the
    gate, which checked names, shapes and dtypes only, published a model that tags nothing.
    """
    import torch
    from safetensors import SafetensorError, safe_open

    bad: list[str] = []
    try:
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 - safe_open is not iterable
                t = fh.get_tensor(name)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    bad.append(name)
    except (SafetensorError, OSError, ValueError):
        return ["model.safetensors is truncated or not a safetensors file"]
    if not bad:
        return []
    return [f"model.safetensors tensor(s) {_names(sorted(bad))} hold non-finite values (inf or "
            "NaN): the weights are broken (a diverged training run?) and would tag nothing"]


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


def check_weights(model_dir: Path, meta: dict[str, Any]) -> None:
    """Raise :class:`GateViolation` on the first weights problem (:func:`weights_problems`)."""
    problems = weights_problems(model_dir, meta.get("differential_privacy"))
    if problems:
        raise _refuse(model_dir, problems[0])


def check_training_config(model_dir: Path, meta: dict[str, Any]) -> None:
    """Raise :class:`GateViolation` on the first training-config problem."""
    problems = training_config_problems(model_dir, meta.get("differential_privacy"))
    if problems:
        raise _refuse(model_dir, problems[0])


def model_dir_problems(model_dir: Path, meta: dict[str, Any]) -> list[str]:
    """Every gate problem of the files next to a card (for ``dphub card validate``)."""
    model_dir = Path(model_dir)
    dp = meta.get("differential_privacy") if isinstance(meta, dict) else None
    try:
        files = _files(model_dir)
    except GateViolation as e:
        return [e.message]
    out = unlisted_file_problems(model_dir, files, PULLED_FILES)  # pulled dirs validate too
    if (model_dir / "training_config.json").is_file():
        out += training_config_problems(model_dir, dp)
    else:
        out.append("training_config.json is missing")
    if (model_dir / "config.json").is_file():
        out += weights_problems(model_dir, dp)
    else:
        out.append("config.json is missing")
    if isinstance(meta, dict):
        # what publish and pull check beyond the files: the public-synthetic claim's record,
        # and the encoder against the declared base where this machine has that base (where it
        # has not, `card validate` says so: base_unresolved)
        out += public_provenance_problems(model_dir, meta)
        if (model_dir / "training_config.json").is_file() and base_unresolved(meta) is None:
            out += base_weights_problems(model_dir, meta)
    return list(dict.fromkeys(out))


# --------------------------------------------------------------------------- base encoder

#: A transformer block's index in an encoder tensor name (``encoder.layer.3.``, ``layers.3.``).
_LAYER_INDEX = re.compile(r"(?:^|\.)layers?\.(\d+)\.")


def check_base_weights(model_dir: Path, meta: dict[str, Any]) -> None:
    """Raise :class:`GateViolation` on the first base-encoder problem
    (:func:`base_weights_problems`)."""
    problems = base_weights_problems(model_dir, meta)
    if problems:
        raise _refuse(model_dir, problems[0])


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
    name = _safe_name(base) if isinstance(base, str) else "(none)"
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
    return _unresolved_base(_safe_name(base) if isinstance(base, str) else "(none)")


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
                return [f"encoder tensor {_safe_name(tname)} has no counterpart in {what}"]
            if r.dtype != t.dtype or r.shape != t.shape or tensor_bytes(r) != tensor_bytes(t):
                return [f"encoder tensor {_safe_name(tname)} was frozen in training but differs "
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
    base = _safe_name(str(meta.get("base_model")))
    dp = meta.get("differential_privacy")
    pre = dp.get("public_pretraining") if isinstance(dp, dict) else None
    public = pre.get("model") if isinstance(pre, dict) else None
    if isinstance(public, str) and public:
        try:
            return Registry().get(public).path, f"the public base {_safe_name(public)}"
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


# --------------------------------------------------------------------------- public provenance

#: ``training_config.json`` keys of a public base (``dphub pretrain``): no privacy unit, no
#: accountant, no sampling rate: nothing of a run on someone's notes.
PUBLIC_TRAINING_CONFIG_KEYS = frozenset({
    "format_version", "dphub_training", "base_model", "base_model_sha256", "init_from", "no_dp",
    "steps",
})
#: Its ``dphub_training`` keys: the pretraining loop's settings and the public data's record.
PUBLIC_HYPERPARAM_KEYS = frozenset({
    "epochs", "batch_size", "lr", "head", "train_layers", "label_schema", "seed", "no_dp",
    "warm_start", "max_length", "stride", "rule_features", "synth_notes",
    "synth_discharge_share", "synth_seed", "synth_sha256",
})


def check_public_provenance(model_dir: Path, meta: dict[str, Any]) -> None:
    """Raise :class:`GateViolation` on the first problem of a public-synthetic claim
    (:func:`public_provenance_problems`); other cards pass untouched."""
    problems = public_provenance_problems(model_dir, meta)
    if problems:
        raise _refuse(model_dir, problems[0])


def public_provenance_problems(model_dir: Path, meta: dict[str, Any]) -> list[str]:
    """A card saying "public synthetic notes only" describes a ``dphub pretrain`` run, on data
    anyone can regenerate.

    Why: the card alone is text; dphub's own helpers write a valid public card for any weights,
    e.g. a local-only model trained on patients without DP. The claim becomes checkable through
    the training record: ``training_config.json`` must be a pretraining record (no privacy unit,
    accountant or sampling rate; ``no_dp``, no ``init_from``, started from the base itself) that
    names the generator's parameters (``synth_notes``, ``synth_discharge_share``,
    ``synth_seed``); the gate regenerates those notes with :mod:`dphub.synth`, compares their
    digest (``synth_sha256``), the card's ``dataset`` block and ``public_pretraining`` block with
    them, and the number of steps with what the recorded epochs and batch size give on them.

    What stays a trust assumption: that the weights were trained on that data. Only retraining
    could show it; a forger who copies a genuine pretraining record next to other weights is
    not caught here, as a forged DP record would not be either (docs/hub.md).
    """
    dp = meta.get("differential_privacy")
    if not isinstance(dp, dict) or dp.get("training_data") != PUBLIC_SYNTHETIC:
        return []
    try:
        cfg = read_training_config(model_dir)
    except GateViolation as e:
        return [e.message]
    what = "a public-synthetic card needs the training record of dphub pretrain"
    extra = set(cfg) - PUBLIC_TRAINING_CONFIG_KEYS
    hyper = cfg.get("dphub_training")
    if extra:
        return [f"training_config.json holds {_key_list(extra)}, which a run on public "
                f"synthetic notes does not record: {what}"]
    if not isinstance(hyper, dict):
        return [f"training_config.json has no dphub_training block: {what}"]
    extra = set(hyper) - PUBLIC_HYPERPARAM_KEYS
    if extra:
        return [f"training_config.json dphub_training holds {_key_list(extra)}, which a run on "
                f"public synthetic notes does not record: {what}"]
    if cfg.get("no_dp") is not True or hyper.get("no_dp") is not True or cfg.get("init_from") \
            or hyper.get("warm_start") != "none":
        return [f"training_config.json does not describe a pretraining run (no_dp, no "
                f"init_from, warm_start none): {what}"]
    missing = [k for k in (*PUBLIC_DATA_KEYS, "epochs", "batch_size", "seed", "label_schema")
               if k not in hyper]
    if missing:
        return [f"training_config.json does not record the public data it trained on "
                f"({', '.join(missing)}), so the claim cannot be checked: {what}"]
    if cfg.get("base_model") != meta.get("base_model"):
        return ["training_config.json base_model differs from the card's"]
    try:
        return _regenerated_data_problems(model_dir, meta, cfg, hyper)
    except DphubError as e:
        return [f"the public data training_config.json records cannot be regenerated "
                f"({e.message})"]


def _regenerated_data_problems(model_dir: Path, meta: dict[str, Any], cfg: dict[str, Any],
                               hyper: dict[str, Any]) -> list[str]:
    """Regenerate the recorded synthetic corpus; compare digest, card blocks and step count."""
    # heavy: the dphub.train package loads torch and opacus; only this provenance check needs it
    from dphub.train.pretrain import PretrainConfig, public_data_digest

    try:
        pc = PretrainConfig(notes=hyper["synth_notes"],
                            discharge_share=float(hyper["synth_discharge_share"]),
                            synth_seed=int(hyper["synth_seed"]))
        pc.validate()
    except (TypeError, ValueError):
        raise ConfigError("the generator's parameters are not numbers") from None
    notes = list(pc.iter_public_notes())
    if public_data_digest(notes) != hyper["synth_sha256"]:
        return ["the synthetic notes training_config.json records (synth_notes, "
                "synth_discharge_share, synth_seed) do not regenerate to its synth_sha256 with "
                "this dphub: the data is not the public generator's (or was made by another "
                "dphub or Faker version: publish with that one)"]
    dp = meta["differential_privacy"]
    pre = dp.get("public_pretraining")
    if not isinstance(pre, dict):
        return ["a public-synthetic card needs its public_pretraining block"]
    claims = {
        "public_pretraining.notes": (pre.get("notes"), pc.notes),
        "public_pretraining.kinds": (pre.get("kinds"), [k for k, _ in pc.kinds()]),
        "public_pretraining.epochs": (pre.get("epochs"), hyper.get("epochs")),
        "public_pretraining.seed": (pre.get("seed"), hyper.get("seed")),
        "public_pretraining.train_layers": (pre.get("train_layers"), hyper.get("train_layers")),
        "public_pretraining.steps": (pre.get("steps"), cfg.get("steps")),
        "steps": (dp.get("steps"), cfg.get("steps")),
    }
    differ = [k for k, (card_v, rec_v) in claims.items() if card_v != rec_v]
    if differ:
        return [f"the card's {', '.join(differ)} differ from training_config.json: the card "
                "does not describe this pretraining run"]
    schema = str(hyper["label_schema"])
    expected = dataset_block(notes, label_schema=schema, name=SYNTH_DATASET)
    card_data = meta.get("dataset") if isinstance(meta.get("dataset"), dict) else {}
    if any(card_data.get(k) != v for k, v in expected.items()):
        return ["the card's dataset block does not describe the regenerated synthetic notes: "
                "the card does not belong to this public data"]
    steps = _pretrain_steps(model_dir, notes, hyper)
    if steps is not None and steps != cfg.get("steps"):
        return [f"training_config.json steps ({_safe_name(str(cfg.get('steps')))}) is not what "
                f"its epochs and batch_size give on the regenerated notes ({steps}): the record "
                "does not describe a run on this data"]
    return []


def _pretrain_steps(model_dir: Path, notes: list[Any], hyper: dict[str, Any]) -> int | None:
    """Steps of the pretraining loop on these notes (``warmstart._fit``: epochs times windows
    per batch), tokenised with the model's (public, already checked) tokenizer."""
    from transformers import AutoTokenizer

    # heavy: the dphub.train package loads torch and opacus; only this provenance check needs it
    from dphub.train.data import encode_notes

    try:
        epochs, batch = float(hyper["epochs"]), int(hyper["batch_size"])
        max_length, stride = int(hyper.get("max_length", 128)), int(hyper.get("stride", 32))
        if batch < 1:
            return None
        id2label = check_config(model_dir)["id2label"]
        tags = [id2label[k] for k in sorted(id2label, key=int)]
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
        examples = encode_notes(notes, tokenizer, tags, str(hyper["label_schema"]),
                                max_length=max_length, stride=stride, unit="sequence")
    except (TypeError, ValueError, KeyError, OSError):
        return None
    return max(1, round(epochs * max(1, len(examples) // batch)))
