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
Both, and ``dphub card validate``, run the model on dphub's public probe notes and refuse one that
finds too little PHI there or whose activations are absurd (:mod:`dphub.hub.gate_probe`).

The checks are cut by what they read: this module (files, card, tokenizer, training config, and
the entry points), :mod:`dphub.hub.gate_tensors` (weights and the base encoder),
:mod:`dphub.hub.gate_provenance` (a public base's data record), :mod:`dphub.hub.gate_probe`
(what the model does on public probe notes), :mod:`dphub.hub.gate_common` (what they share). Their public names are importable from here.
"""

from __future__ import annotations

import fnmatch
import getpass
import math
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dphub.card import (
    SYNTH_DATASET,
    TRAINING_CONFIG_FORMAT,
    body_is_rendered,
    is_post_processing,
    is_public_model,
    load_card,
    load_valid_card,
)
from dphub.errors import CardError, DphubError, PublishRefused
from dphub.hub.common import DP_TAG, PRIVACY_UNITS, CardSummary, read_card_meta
from dphub.hub.gate_common import (
    PUBLIC_DATA_KEYS,
    PUBLIC_SYNTHETIC,
    GateViolation,
    check_config,
    key_list,
    read_training_config,
    refuse,
    resolve_base_tokenizer_dir,
    safe_name,
)
from dphub.hub.gate_postprocessing import post_processing_problems  # issue 29
from dphub.hub.gate_probe import check_probe, probe_problems  # issue 38
from dphub.hub.gate_provenance import check_public_provenance, public_provenance_problems
from dphub.hub.gate_tensors import (
    base_unresolved,
    base_weights_problems,
    check_base_weights,
    weights_problems,
)
from dphub.io import file_sha256
from dphub.privacy.accounting import CLAIM_RTOL, below

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
#: Every key ``dphub_training`` may hold: the training options, and a pretraining's data record.
PUBLISHED_HYPERPARAM_KEYS = TRAINING_HYPERPARAM_KEYS | frozenset(PUBLIC_DATA_KEYS)
#: Card ``differential_privacy`` fields that ``training_config.json`` must repeat exactly.
BOUND_FIELDS = ("noise_multiplier", "sample_rate", "steps", "delta", "privacy_unit")

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


def _files(model_dir: Path) -> list[Path]:
    """All entries below ``model_dir``; symlinks refused (they can point anywhere)."""
    out = []
    for p in sorted(model_dir.rglob("*")):
        rel = p.relative_to(model_dir)
        if p.is_symlink():
            raise refuse(model_dir, f"{rel} is a symbolic link; publish regular files only")
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
            raise refuse(model_dir, f"{name} is missing")
    for f in files:
        rel = f.relative_to(model_dir).as_posix()
        low = f.name.lower()
        if any(fnmatch.fnmatch(low, pat) for pat in PICKLE_PATTERNS):
            raise refuse(model_dir, f"{rel} is a pickle-based file; only safetensors weights "
                                     "may be published")
        if any(fnmatch.fnmatch(low, pat) for pat in STATE_PATTERNS) or any(
            fnmatch.fnmatch(part.lower(), "checkpoint*") for part in Path(rel).parts[:-1]
        ):
            raise refuse(model_dir, f"{rel} is optimizer/checkpoint state, which the DP "
                                     "guarantee does not cover")
        if _looks_pickled(f):
            raise refuse(model_dir, f"{rel} contains pickled objects")
    problems = unlisted_file_problems(model_dir, files, allowed)
    if problems:
        raise refuse(model_dir, problems[0])


def unlisted_file_problems(model_dir: Path, files: list[Path],
                           allowed: tuple[str, ...] = PUBLISHED_FILES) -> list[str]:
    """One message per file outside ``allowed`` (anything else is unaccounted)."""
    out = []
    for f in files:
        rel = f.relative_to(model_dir).as_posix()
        if rel not in allowed:
            out.append(f"{safe_name(rel)} is not a file dphub publishes (allowed: weights, "
                       "config.json, tokenizer files, README.md, training_config.json); only "
                       "accounted outputs may leave")
    return out


def check_card(model_dir: Path, validate: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Schema validation (``dphub.card.load_valid_card``) plus the DP block checks of the gate."""
    try:
        meta = read_card_meta(model_dir)
    except CardError as e:
        raise refuse(model_dir, f"model card: {e.message}") from None
    dp = meta.get("differential_privacy")
    if not isinstance(dp, dict):
        raise refuse(model_dir, "the model card has no differential_privacy block")
    if dp.get("local_only") is True:  # first: the one reason that matters for such a model
        raise refuse(model_dir, "the model is LOCAL ONLY: it contains unprotected patient "
                                 "information (trained without differential privacy on the data "
                                 "owner's own notes) and never leaves this machine; train it "
                                 "with --dp to get a publishable model")
    if dp.get("training_data") == PUBLIC_SYNTHETIC:
        return _check_public_card(model_dir, meta, validate)
    missing = [k for k in ACCOUNTING_FIELDS if k not in dp or dp[k] is None and k != "epsilon"]
    if missing:
        raise refuse(model_dir, "the card's differential_privacy block lacks accounting "
                                 f"field(s): {', '.join(missing)}")
    if dp.get("private") is not True:
        raise refuse(model_dir, "the model is marked non-private (differential_privacy.private "
                                 "is not true); only DP-trained models can be published")
    eps = dp.get("epsilon")
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps) \
            or eps <= 0:
        raise refuse(model_dir, f"differential_privacy.epsilon must be a finite positive number "
                                 f"(got {eps!r})")
    delta = dp.get("delta")
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 <= delta < 1:
        raise refuse(model_dir, f"differential_privacy.delta must be in [0, 1) (got {delta!r})")
    if dp.get("privacy_unit") not in PRIVACY_UNITS:
        raise refuse(model_dir, "differential_privacy.privacy_unit must be one of "
                                 f"{', '.join(PRIVACY_UNITS)}")
    _check_tag_and_schema(model_dir, meta, validate)
    return meta


def _check_tag_and_schema(model_dir: Path, meta: dict[str, Any],
                          validate: Callable[..., Any] | None) -> None:
    """The dphub tag, then the card's full validation (schema + accounting), for every card the
    gate accepts (DP or public-synthetic)."""
    if DP_TAG not in (meta.get("tags") or []):
        raise refuse(model_dir, f"the card's tags must include {DP_TAG!r}")
    if validate is None:
        validate = _card_validator()
    if validate is not None:
        try:
            validate(model_dir, require_private=True)
        except DphubError as e:
            raise refuse(model_dir, f"model card fails validation: {e.message}") from None


def _check_public_card(model_dir: Path, meta: dict[str, Any],
                       validate: Callable[..., Any] | None) -> dict[str, Any]:
    """A public base model (``dphub pretrain``) is accepted on its provenance: public synthetic
    notes only, so no private data and no ε; the schema ties ``private: false`` and ``epsilon:
    0`` to that provenance, and the weights stay bound to the card by their hash."""
    dp = meta["differential_privacy"]
    if not is_public_model(dp):
        raise refuse(model_dir, "the card says training_data: public-synthetic but not "
                                 "private: false with epsilon 0")
    if dp.get("lineage"):
        raise refuse(model_dir, "a public-synthetic model cannot descend from a private model "
                                 "(lineage is set)")
    data = meta.get("dataset")
    if not isinstance(data, dict) or data.get("name") != SYNTH_DATASET:
        raise refuse(model_dir, "a public-synthetic card's dataset must be dphub-synth (the "
                                 "public generator), not anyone's notes")
    _check_tag_and_schema(model_dir, meta, validate)  # public-synthetic passes as shareable
    return meta


def check_card_body(model_dir: Path) -> None:
    """The README body must be dphub's rendering of the front matter (no free text leaves)."""
    try:
        card = load_card(model_dir)
    except CardError as e:
        raise refuse(model_dir, f"model card: {e.message}") from None
    if not body_is_rendered(card):
        raise refuse(model_dir, "README.md's body is not what dphub renders from the card's "
                                 "front matter; free text may not leave in the body (put the "
                                 "trainer's prose in card_text and re-render the card with "
                                 "dphub.card.write_card)")


def _card_validator() -> Callable[..., Any]:
    """:func:`dphub.card.load_valid_card` (schema + accounting recomputation); the directory
    checks :func:`dphub.hub.validate.validate_card` adds are the gate's own, run separately."""
    return load_valid_card


def check_tokenizer(model_dir: Path, meta: dict[str, Any]) -> None:
    """Tokenizer files must be byte-identical (sha256) to the declared public base model's."""
    base = meta.get("base_model")
    base_dir = resolve_base_tokenizer_dir(base if isinstance(base, str) else None)
    if base_dir is None:
        raise refuse(model_dir, f"cannot resolve the card's base_model {base!r} to verify the "
                                 "tokenizer files against it")
    present = [n for n in TOKENIZER_FILES if (model_dir / n).is_file()]
    if not present:
        raise refuse(model_dir, "no tokenizer files (tokenizer.json, vocab.txt ...)")
    for name in present:
        ref = base_dir / name
        if not ref.is_file():
            raise refuse(model_dir, f"{name} is not a file of the base model {base}; tokenizer "
                                     "files must be the public base model's")
        if file_sha256(model_dir / name) != file_sha256(ref):
            raise refuse(model_dir, f"{name} differs (sha256) from the base model {base}'s; a "
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
                raise refuse(model_dir, f"{rel} line {line} contains {label!r} (a local path "
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
        check_probe(model_dir, meta, require_block=True)  # last: it runs the model
    except GateViolation as e:
        raise PublishRefused(f"refusing to publish {model_dir}: {e.message}") from None
    return CardSummary.from_meta(meta)


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
    check_probe(model_dir, meta, require_block=False)  # an older card: the minimum floor
    return CardSummary.from_meta(meta)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float) or (
        isinstance(value, str) and len(value) <= 200)


def training_config_problems(model_dir: Path, dp: Any) -> list[str]:
    """Allow-listed keys, scalar hyper-parameters, and the card's accounting fields repeated.

    A loss curve, a unit count or any other statistic of the private data is not covered by the
    guarantee; the training config carries hyper-parameters and the accounting inputs only.
    """
    if is_post_processing(dp):
        # a public student: its record is a run on public notes, its card its teacher's claim
        return post_processing_problems(model_dir, dp)
    try:
        cfg = read_training_config(model_dir)
    except GateViolation as e:
        return [e.message]
    out: list[str] = []
    extra = set(cfg) - TRAINING_CONFIG_KEYS
    if extra:
        out.append(f"training_config.json holds key(s) outside the allow-list: "
                   f"{key_list(extra)} (only hyper-parameters and accounting inputs may be "
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
                   f"{key_list(extra)}")
    not_scalar = [k for k, v in [*cfg.items(), *hyper.items()]
                  if k != "dphub_training" and not _scalar(v)]
    if not_scalar:
        out.append(f"training_config.json value(s) of {key_list(set(not_scalar))} are not "
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


def check_weights(model_dir: Path, meta: dict[str, Any]) -> None:
    """Raise :class:`GateViolation` on the first weights problem (:func:`weights_problems`)."""
    problems = weights_problems(model_dir, meta.get("differential_privacy"))
    if problems:
        raise refuse(model_dir, problems[0])


def check_training_config(model_dir: Path, meta: dict[str, Any]) -> None:
    """Raise :class:`GateViolation` on the first training-config problem."""
    problems = training_config_problems(model_dir, meta.get("differential_privacy"))
    if problems:
        raise refuse(model_dir, problems[0])


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
        weights = weights_problems(model_dir, dp)
        out += weights
        if not weights:  # well-formed weights: now what the model does (as pull runs it)
            out += probe_problems(model_dir, meta, require_block=False)
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
