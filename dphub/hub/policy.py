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
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError
from dphub.io import atomic_write_text, dphub_home, read_small_file

# the policy itself lives below training (train() refuses by itself, issue 39 item 6); these
# names are this module's public API as before
from dphub.privacy.policy import (
    DEFAULT_POLICY,
    UNIT_STRENGTH,
    Policy,
    check_max_epsilon,
    check_unit,
    policy_violation,
)

#: File in a local hub's root that holds its policy.
POLICY_FILE = "dphub-policy.json"
#: File in the dphub home holding client-side policies of Hugging Face protocol hubs.
CLIENT_POLICY_FILE = "hub-policies.json"
#: Largest policy file read (a policy is two keys; the client-side file one entry per endpoint).
POLICY_MAX_BYTES = 65536


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
