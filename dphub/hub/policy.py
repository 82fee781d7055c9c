"""The ε policy of a hub: the weakest guarantee a hub accepts and a puller takes by default.

A formal guarantee is only useful if someone refuses the weak ones: ``dphub train --noise 0.55``
gives ε ≈ 96 per patient, which publish and pull used to take without a word. A policy has two
parts, a maximum ε and a minimum privacy unit (patient > note > sequence: a patient-level
guarantee also protects each of the patient's notes and sequences). The default is conservative:
ε ≤ 10 at patient level, the value above which the card itself calls the guarantee weak.

Where a policy lives:

* a **local hub** keeps it in ``<hub>/dphub-policy.json``, written by ``dphub hub policy`` (the
  hub owner is whoever can write the hub directory);
* a **Hugging Face protocol hub** has no place dphub controls, so its policy is a client-side
  setting in ``<dphub home>/hub-policies.json`` keyed by endpoint, or the default;
* **pull** applies :data:`DEFAULT_POLICY` unless the puller overrides it (``--max-epsilon``,
  ``--require-unit``, ``[hub] max_epsilon`` / ``require_unit`` in ``dphub.toml``): what a puller
  accepts is the puller's decision, not the hub's.

Non-finite values are refused everywhere: ``--max-epsilon nan`` compares false with every ε and
would make the policy fail open.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError
from dphub.hub.common import PRIVACY_UNITS, dphub_home
from dphub.io import atomic_write_text, read_small_file

#: Strength of each privacy unit: a larger number protects more (a patient covers their notes).
UNIT_STRENGTH: dict[str, int] = {"sequence": 0, "note": 1, "patient": 2}
#: File in a local hub's root that holds its policy.
POLICY_FILE = "dphub-policy.json"
#: File in the dphub home holding client-side policies of Hugging Face protocol hubs.
CLIENT_POLICY_FILE = "hub-policies.json"
#: Largest policy file read (a policy is two keys; the client-side file one entry per endpoint).
POLICY_MAX_BYTES = 65536


def check_max_epsilon(value: Any, *, what: str = "max_epsilon") -> float:
    """``value`` as a finite positive float, else :class:`ConfigError` (NaN would fail open)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{what} must be a number (got {type(value).__name__})")
    try:  # a 400-digit integer overflows a float: OverflowError, which used to crash
        x = float(value)
    except OverflowError:
        raise ConfigError(f"{what} must be a finite number > 0 (got an integer of "
                          f"{len(str(abs(value)))} digits)") from None
    if not math.isfinite(x) or x <= 0:
        raise ConfigError(f"{what} must be a finite number > 0 (got {value!r})")
    return x


def check_unit(value: Any, *, what: str = "min_unit") -> str:
    """``value`` if it is a privacy unit name, else :class:`ConfigError`."""
    if value not in UNIT_STRENGTH:
        raise ConfigError(f"{what} must be one of {', '.join(PRIVACY_UNITS)} (got {value!r})")
    return str(value)


@dataclass(frozen=True)
class Policy:
    """Largest ε and weakest privacy unit accepted. Construction validates both."""

    max_epsilon: float = 10.0
    min_unit: str = "patient"

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_epsilon", check_max_epsilon(self.max_epsilon))
        check_unit(self.min_unit)

    def with_overrides(self, *, max_epsilon: float | None = None,
                       min_unit: str | None = None) -> Policy:
        """A copy with the given (validated) values replaced; ``None`` keeps a value."""
        return replace(
            self,
            max_epsilon=self.max_epsilon if max_epsilon is None else max_epsilon,
            min_unit=self.min_unit if min_unit is None else min_unit,
        )

    def to_json(self) -> dict[str, Any]:
        return {"max_epsilon": self.max_epsilon, "min_unit": self.min_unit}

    @classmethod
    def from_json(cls, data: Any, *, where: str) -> Policy:
        """Parse a policy object; unknown keys are refused (a typo would silently loosen it)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: a policy must be a JSON object")
        unknown = sorted(set(data) - {"max_epsilon", "min_unit"})
        if unknown:
            shown = ", ".join(k if str(k).isidentifier() else "<key>" for k in map(str, unknown))
            raise ConfigError(f"{where}: unknown policy key(s): {shown}")
        try:
            return cls(max_epsilon=data.get("max_epsilon", DEFAULT_POLICY.max_epsilon),
                       min_unit=data.get("min_unit", DEFAULT_POLICY.min_unit))
        except ConfigError as e:
            raise ConfigError(f"{where}: {e.message}") from None

    def describe(self) -> str:
        return f"epsilon <= {self.max_epsilon:g}, privacy unit {self.min_unit} or stronger"


#: ε ≤ 10 per patient: the card calls anything above 10 a weak formal guarantee.
DEFAULT_POLICY = Policy()


def policy_violation(epsilon: float | None, unit: str | None,
                     policy: Policy = DEFAULT_POLICY, *, public: bool = False) -> str | None:
    """Why a model with this guarantee exceeds ``policy`` (one phrase), or None if it complies.

    ``epsilon`` None or non-finite means no DP guarantee at all. Used by publish, pull and (as a
    warning) at the end of ``dphub train``; the caller adds how to change the policy.
    ``public``: a public base model (public synthetic notes only, ε 0, checked by the gate) has
    no private data and no privacy unit to compare, so every policy accepts it.
    """
    if public and epsilon == 0:
        return None
    if epsilon is None or isinstance(epsilon, bool) or not isinstance(epsilon, int | float) \
            or not math.isfinite(epsilon):
        return f"the model has no finite epsilon (the policy requires {policy.describe()})"
    if epsilon > policy.max_epsilon:
        return f"epsilon {epsilon:.4g} exceeds the policy's maximum {policy.max_epsilon:g}"
    if UNIT_STRENGTH.get(unit or "", -1) < UNIT_STRENGTH[policy.min_unit]:
        return (f"privacy unit {unit} is weaker than the policy's minimum {policy.min_unit} "
                "(patient > note > sequence)")
    return None


# --------------------------------------------------------------------------- where policies live


def _is_remote(hub: str) -> bool:
    return hub.startswith(("http://", "https://", "hf://"))


def local_hub_root(hub: str) -> Path:
    return Path(hub[len("file://"):] if hub.startswith("file://") else hub).expanduser()


def _read_json(path: Path, where: str) -> Any:
    """A policy file's JSON (None when there is none); read through
    :func:`~dphub.io.read_small_file` (a FIFO or a link to ``/dev/zero`` is refused, not read)."""
    try:
        raw = read_small_file(path, POLICY_MAX_BYTES, what="the policy file")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"{where}: cannot read the policy ({e.strerror})") from None
    try:
        # NaN/Infinity literals raise ConfigError from _refuse_constant (not a ValueError)
        return json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError):
        raise ConfigError(f"{where}: policy file is not valid JSON") from None


def _refuse_constant(name: str) -> Any:
    raise ConfigError(f"policy values must be finite numbers (found {name})")


def load_hub_policy(hub: str) -> Policy:
    """The policy ``hub`` publishes under (its file, the client-side setting, or the default)."""
    if _is_remote(hub):
        path = dphub_home() / CLIENT_POLICY_FILE
        data = _read_json(path, str(path))
        if data is None:
            return DEFAULT_POLICY
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a JSON object of endpoint -> policy")
        entry = data.get(_endpoint_key(hub))
        return DEFAULT_POLICY if entry is None else Policy.from_json(entry, where=str(path))
    root = local_hub_root(hub)
    if not root.is_dir():  # missing, or a file: the hub's own check names that properly
        return DEFAULT_POLICY
    path = root / POLICY_FILE
    data = _read_json(path, str(path))
    return DEFAULT_POLICY if data is None else Policy.from_json(data, where=str(path))


def _endpoint_key(hub: str) -> str:
    return hub.rstrip("/")


def _text(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def save_hub_policy(hub: str, policy: Policy) -> Path:
    """Record ``policy`` for ``hub``; returns the file written (atomically).

    A local hub directory is created if its parent exists (a hub owner may set the policy before
    the first publish); a missing parent is refused (a typo must not create a tree of folders).
    """
    if _is_remote(hub):
        path = dphub_home() / CLIENT_POLICY_FILE
        data = _read_json(path, str(path)) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a JSON object of endpoint -> policy")
        data[_endpoint_key(hub)] = policy.to_json()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, _text(data))
        return path
    root = local_hub_root(hub)
    if not root.is_dir():
        if root.exists() or not root.parent.is_dir():
            raise ConfigError(f"hub {root} is not a directory and cannot be created (check --hub)")
        root.mkdir()
    path = root / POLICY_FILE
    atomic_write_text(path, _text(policy.to_json()))
    return path


def policy_hint(hub: str | None = None) -> str:
    """How a hub owner changes the policy (one clause, for refusal messages)."""
    where = f" --hub {hub}" if hub else ""
    return (f"a hub owner can change the policy with `dphub hub policy --max-epsilon E "
            f"--min-unit U{where}`")


__all__ = ["DEFAULT_POLICY", "POLICY_FILE", "UNIT_STRENGTH", "Policy", "check_max_epsilon",
           "check_unit", "load_hub_policy", "policy_hint", "policy_violation", "save_hub_policy"]
