"""The project file ``dphub.toml`` and the little state dphub keeps next to it.

A data owner works in a project directory: ``dphub init`` writes a commented ``dphub.toml``;
``dphub train`` and ``dphub publish`` read it when run without arguments, and every flag overrides
its key. Sections and keys::

    [data]     path, format
    [model]    base_model, head, label_schema
    [privacy]  noise, target_epsilon, delta, privacy_unit, accountant, max_grad_norm,
               max_examples_per_unit, max_epsilon, secure_rng
    [train]    epochs, batch_size, max_physical_batch, lr, train_layers, encoder_layers, lora_rank,
               recall_weight, seed, warm_start, rule_features, rule_lr_scale
    [output]   dir
    [hub]      url, repo, max_epsilon, require_unit   (the last two: ε policy for ``dphub pull``)
    [card]     intended_use, out_of_scope, limitations, provenance   (free text for the card)

The file is validated against :data:`PROJECT_SCHEMA` when it is loaded: an unknown section or key
(``[trian]``, ``nosie``), a wrong type (``noise = "loud"``) or a non-finite number (TOML allows
``nan`` and ``inf``) is refused with a :class:`ConfigError` naming the section and key. Silently
ignoring such a mistake trained at the default ε instead of the one the owner wrote. So is an
integer beyond 64 bits (:func:`check_integer_sizes`): ``noise = 1000...0`` (400 digits) used to
crash with ``OverflowError`` where it was turned into a float, and more than 4,300 digits with a
``ValueError`` inside the TOML parser.

``.dphub/state.json`` records what the last ``dphub train`` wrote (``last_model``), so that a bare
``dphub publish`` publishes it.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError
from dphub.io import atomic_write_text

PROJECT_FILE = "dphub.toml"
STATE_DIR = ".dphub"

_POSITIVE: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0}
_COUNT: dict[str, Any] = {"type": "integer", "minimum": 1}
_STRING: dict[str, Any] = {"type": "string"}
_UNITS = ["patient", "note", "sequence"]
#: Largest integer (in magnitude) a dphub.toml or ensemble manifest may hold: int64. Every count,
#: seed and ε fits; beyond it ``float()`` overflows (above ~1e308) or arithmetic stalls.
MAX_INTEGER = 2**63 - 1


def _section(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "additionalProperties": False}


#: JSON Schema of ``dphub.toml``: every key some command reads, and nothing else. A command that
#: starts reading a new key adds it here (the schema test checks the init template against it).
PROJECT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "dphub.toml",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "data": _section({"path": _STRING, "format": _STRING}),
        "model": _section({
            "base_model": _STRING,
            "head": {"enum": ["crf", "softmax"]},
            "label_schema": _STRING,
        }),
        "privacy": _section({
            "noise": _POSITIVE,
            "target_epsilon": _POSITIVE,
            "delta": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "privacy_unit": {"enum": _UNITS},
            "accountant": {"enum": ["prv", "rdp"]},
            "max_grad_norm": _POSITIVE,
            "max_examples_per_unit": _COUNT,
            "max_epsilon": _POSITIVE,
            "secure_rng": {"type": "boolean"},
        }),
        "train": _section({
            "epochs": _POSITIVE,
            "batch_size": _COUNT,
            "max_physical_batch": _COUNT,
            "lr": _POSITIVE,
            "train_layers": {"type": "integer", "minimum": 0},
            "encoder_layers": _COUNT,
            "lora_rank": _COUNT,
            "recall_weight": {"type": "number", "minimum": 0},
            "rule_lr_scale": _POSITIVE,
            "seed": {"type": "integer"},
            "warm_start": {"enum": ["synth", "none"]},
            "rule_features": {"type": "boolean"},
        }),
        "output": _section({"dir": _STRING}),
        "hub": _section({
            "url": _STRING,
            "repo": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"},
            "max_epsilon": _POSITIVE,
            "require_unit": {"enum": _UNITS},
        }),
        "card": _section({
            "intended_use": _STRING,
            "out_of_scope": _STRING,
            "limitations": _STRING,
            "provenance": _STRING,
        }),
    },
}


def find_project_file(start: Path | None = None) -> Path | None:
    """``dphub.toml`` in ``start`` (default: cwd) or its parents, or None."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        f = d / PROJECT_FILE
        if f.is_file():
            return f
    return None


def load_project_config(path: Path | None = None) -> dict[str, Any]:
    """Parse ``dphub.toml`` (found from cwd when ``path`` is None); {} when there is none.

    Relative paths inside are resolved against the file's directory by the callers that use them
    (see :func:`project_path`).
    """
    f = path or find_project_file()
    if f is None:
        return {}
    try:
        with open(f, "rb") as fh:
            cfg = tomllib.load(fh)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{f}: not valid TOML ({e})") from None
    except ValueError:  # an integer of more than 4,300 digits (Python's int parsing limit)
        raise ConfigError(f"{f}: not valid TOML (an integer is too large)") from None
    except OSError as e:
        raise ConfigError(f"{f}: cannot read ({e.strerror})") from None
    validate_project_config(cfg, f)
    cfg["_file"] = str(f)
    return cfg


def check_integer_sizes(data: Any, source: str | Path, path: tuple[Any, ...] = ()) -> None:
    """Refuse any integer beyond :data:`MAX_INTEGER` in parsed TOML/JSON ``data`` (nested tables
    and arrays included), naming where it is; the one place such files' integers are bounded."""
    if isinstance(data, dict):
        for k, v in data.items():
            check_integer_sizes(v, source, (*path, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            check_integer_sizes(v, source, (*path, i))
    elif isinstance(data, int) and not isinstance(data, bool) and abs(data) > MAX_INTEGER:
        raise ConfigError(f"{source}: {_where(list(path))}: an integer of "
                          f"{len(str(abs(data)))} digits is out of range (at most "
                          f"{MAX_INTEGER:,} in magnitude)")


def _where(path: list[Any]) -> str:
    """``[privacy] noise`` for a (section, key) path; ``[trian]`` for a section."""
    if not path:
        return "the file"
    head = f"[{path[0]}]"
    return head if len(path) == 1 else f"{head} {'.'.join(map(str, path[1:]))}"


def _show(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= 40 else r[:37] + "..."


def validate_project_config(cfg: dict[str, Any], source: str | Path = PROJECT_FILE) -> None:
    """Refuse a project file with unknown sections/keys, wrong types or non-finite numbers.

    The message names the first problem by section and key, and the keys that are allowed there.
    """
    from jsonschema import Draft202012Validator

    check_integer_sizes(cfg, source)
    for section, keys in cfg.items():  # nan/inf first: the schema's bounds let NaN through
        for key, value in (keys.items() if isinstance(keys, dict) else ()):
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{source}: {_where([section, key])}: {value} is not a "
                                  "finite number")
    errors = sorted(Draft202012Validator(PROJECT_SCHEMA).iter_errors(cfg),
                    key=lambda e: [str(p) for p in e.absolute_path])
    if not errors:
        return
    e = errors[0]
    path = list(e.absolute_path)
    if e.validator == "additionalProperties":
        schema = PROJECT_SCHEMA if not path else PROJECT_SCHEMA["properties"][path[0]]
        known = sorted(schema["properties"])
        extra = sorted(k for k in e.instance if k not in schema["properties"])
        what = "section" if not path else "key"
        where = _where([*path, extra[0]]) if extra else _where(path)
        raise ConfigError(f"{source}: {where}: unknown {what} (known: {', '.join(known)})")
    if e.validator == "type":
        expected = e.validator_value
        if len(path) == 1:
            raise ConfigError(f"{source}: {_where(path)} must be a table (a [section])")
        raise ConfigError(f"{source}: {_where(path)}: {_show(e.instance)} is not "
                          f"{'an' if expected == 'integer' else 'a'} {expected}")
    if e.validator == "enum":
        raise ConfigError(f"{source}: {_where(path)}: {_show(e.instance)} is not one of "
                          f"{', '.join(map(str, e.validator_value))}")
    bounds = {"exclusiveMinimum": ">", "minimum": ">=", "exclusiveMaximum": "<", "maximum": "<="}
    if e.validator in bounds:
        raise ConfigError(f"{source}: {_where(path)}: {_show(e.instance)} must be "
                          f"{bounds[e.validator]} {e.validator_value}")
    if e.validator == "pattern":
        raise ConfigError(f"{source}: {_where(path)}: {_show(e.instance)} is not of the form "
                          "org/name")
    raise ConfigError(f"{source}: {_where(path)}: invalid value {_show(e.instance)}")


def project_path(cfg: dict[str, Any], value: str | None) -> Path | None:
    """Resolve a path from the config relative to the config file's directory."""
    if value is None:
        return None
    p = Path(value).expanduser()
    if not p.is_absolute() and "_file" in cfg:
        p = Path(cfg["_file"]).parent / p
    return p


def get(cfg: dict[str, Any], section: str, key: str, default: Any = None) -> Any:
    return cfg.get(section, {}).get(key, default)


def _state_file(root: Path | None = None) -> Path:
    f = find_project_file(root)
    base = f.parent if f else (root or Path.cwd())
    return base / STATE_DIR / "state.json"


def record_last_model(model_dir: Path, root: Path | None = None) -> None:
    """Remember the model directory ``dphub train`` just wrote (for a bare ``dphub publish``)."""
    sf = _state_file(root)
    state = read_state(root)
    state["last_model"] = str(Path(model_dir).resolve())
    atomic_write_text(sf, json.dumps(state, indent=2))


def read_state(root: Path | None = None) -> dict[str, Any]:
    sf = _state_file(root)
    if not sf.is_file():
        return {}
    try:
        return json.loads(sf.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def last_trained_model(root: Path | None = None) -> Path | None:
    v = read_state(root).get("last_model")
    return Path(v) if v else None
