"""The surrogate secret: reading the key file, and the keyed (HMAC-SHA256) draws every surrogate
is seeded from, so nobody without the key can recompute a mapping."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from dphub.errors import ConfigError

#: Shortest secret accepted for surrogate seeding (bytes after stripping whitespace).
MIN_KEY_BYTES = 16

def key_recipe(path: str | os.PathLike[str] = "FILE") -> str:
    """How to make a surrogate key file: private from its first byte (``umask 077`` in a
    subshell), not made readable and then tightened by a later ``chmod``."""
    return f"create one with `(umask 077; openssl rand -hex 32 > {path})`"


def load_key(path: str | os.PathLike[str]) -> bytes:
    """Read the surrogate secret from ``path`` (surrounding whitespace stripped).

    A missing, unreadable or short key file is a :class:`ConfigError`: silently falling back to
    a default key would make every surrogate mapping recomputable by anyone.
    """
    p = Path(path)
    try:
        key = p.read_bytes().strip()
    except FileNotFoundError:
        raise ConfigError(
            f"key file {p} does not exist; {key_recipe(p)}"
        ) from None
    except OSError as exc:
        raise ConfigError(f"key file {p} cannot be read ({exc.strerror})") from None
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"key file {p} holds {len(key)} bytes; use at least {MIN_KEY_BYTES}: "
                          f"{key_recipe(p)}")
    return key


def hmac_int(key: bytes, *parts: str) -> int:
    msg = "\x1f".join(parts).encode("utf-8")
    return int.from_bytes(hmac.new(key, msg, hashlib.sha256).digest(), "big")


def date_offset_days(key: bytes, patient_id: str) -> int:
    """The patient's date shift in days: in ``[-365, -1] U [1, 365]``, from HMAC(key, patient)."""
    v = hmac_int(key, "date-offset", patient_id) % 730
    return v - 365 if v < 365 else v - 364

