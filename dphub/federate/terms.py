"""The federation a site agrees to: its terms, pinned whole (issue 53).

Why: pinning the app bundle (``join --app-hash``) pins no setting at all, because a Flower run's
settings travel in its run config, and ``flwr run APP --run-config ...`` replaces them under the
same bundle hash. So a site agrees to the *federation* instead: ``dphub federate serve`` writes
the terms its operator publishes (:data:`TERMS_FILE`: rounds, local steps, target ε, the shared
recipe with its δ, unit and base model id, the aggregation, the SHA-256 of the public base's
frozen weights and of the SuperLink's CA certificate) and each site joins with that file
(``join --federation``). Every order, and every run config, is compared with the terms before the
site builds anything or touches its accountant; any difference is refused (category
``federation``).

The terms' digest (:meth:`FederationTerms.federation_id`) names the federation: a site keys its
plan (σ for ``rounds × local_steps`` at the target ε) by it, so an order of another federation
can neither reuse nor freeze another federation's plan.

The size caps (:data:`MAX_ROUNDS`, :data:`MAX_LOCAL_STEPS`, :data:`MAX_PLANNED_STEPS`) refuse
absurd orders before any plan is made: a site planned for ``10**6`` rounds trains with σ in the
hundreds (a useless model), and ``10**7`` local steps never end.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dphub.errors import ConfigError
from dphub.io import atomic_write_text, file_sha256

TERMS_FILE = "federation.json"
TERMS_FORMAT = 1
#: an order (or terms) above these is refused before any plan: dphub train's default recipe is
#: 32 DP steps; 10,000 over all rounds is 300 times that
MAX_ROUNDS = 1000
MAX_LOCAL_STEPS = 1000
MAX_PLANNED_STEPS = 10_000
#: a plan whose σ exceeds this is refused: the update would be noise (σ·C on a sum of gradients)
MAX_PLANNED_NOISE = 100.0
_MAX_TERMS_BYTES = 64 * 1024
_FIELDS = ("rounds", "local_steps", "target_epsilon", "aggregation", "options",
           "frozen_digest", "server_ca_sha256")


class FederationRefused(ConfigError):
    """An order or run config that is not the federation this site agreed to."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def size_problem(rounds: Any, local_steps: Any, target_epsilon: Any) -> str | None:
    """Why an order of this size is refused (None: it is within the caps)."""
    if not (_is_int(rounds) and 1 <= rounds <= MAX_ROUNDS):
        return f"rounds {rounds!r}: must be an integer in 1..{MAX_ROUNDS}"
    if not (_is_int(local_steps) and 1 <= local_steps <= MAX_LOCAL_STEPS):
        return f"local steps {local_steps!r}: must be an integer in 1..{MAX_LOCAL_STEPS}"
    if rounds * local_steps > MAX_PLANNED_STEPS:
        return (f"rounds x local steps = {rounds * local_steps}: at most {MAX_PLANNED_STEPS} "
                "DP steps per federation")
    if isinstance(target_epsilon, bool) or not isinstance(target_epsilon, int | float) \
            or not (math.isfinite(target_epsilon) and target_epsilon > 0):
        return f"target epsilon {target_epsilon!r}: must be a finite number > 0"
    return None


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class FederationTerms:
    """What a site agrees to: the whole federation, as its server's operator published it."""

    rounds: int
    local_steps: int
    target_epsilon: float
    aggregation: str | None
    options: dict[str, Any]
    frozen_digest: str
    #: SHA-256 of the SuperLink's CA certificate (the server's identity); None: an insecure
    #: loopback test federation
    server_ca_sha256: str | None = None

    def __post_init__(self) -> None:
        problem = size_problem(self.rounds, self.local_steps, self.target_epsilon)
        if problem is not None:
            raise ConfigError(f"federation terms: {problem}")
        if self.aggregation is not None and not isinstance(self.aggregation, str):
            raise ConfigError("federation terms: aggregation must be a name")
        if not isinstance(self.options, dict):
            raise ConfigError("federation terms: options must be a table")
        for name in ("frozen_digest", "server_ca_sha256"):
            v = getattr(self, name)
            if v is None and name == "server_ca_sha256":
                continue
            if not (isinstance(v, str) and len(v) == 64
                    and all(c in "0123456789abcdef" for c in v)):
                raise ConfigError(f"federation terms: {name} must be a SHA-256 (64 hex digits)")
        try:
            _canonical(self.options)
        except (TypeError, ValueError):
            raise ConfigError("federation terms: options must be plain finite JSON") from None

    # ------------------------------------------------------------------ identity

    def to_dict(self) -> dict[str, Any]:
        return {"format": TERMS_FORMAT, **asdict(self)}

    def federation_id(self) -> str:
        """SHA-256 of the canonical terms: the federation's name at every site (its plan key)."""
        return hashlib.sha256(_canonical(self.to_dict()).encode()).hexdigest()

    @property
    def delta(self) -> float | None:
        return self.options.get("delta")

    @property
    def unit(self) -> str:
        return str(self.options.get("privacy_unit", "patient"))

    # ------------------------------------------------------------------ the file

    def write(self, path: Path) -> None:
        atomic_write_text(Path(path), json.dumps(self.to_dict(), indent=2, sort_keys=True,
                                                 allow_nan=False) + "\n")
        Path(path).chmod(0o644)  # published: no secret in it

    @classmethod
    def load(cls, path: Path) -> FederationTerms:
        path = Path(path)
        try:
            if path.stat().st_size > _MAX_TERMS_BYTES:
                raise ConfigError(f"{path}: larger than federation terms")
            raw = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the federation terms "
                              f"({e.strerror or type(e).__name__})") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not federation terms ({type(e).__name__})") from None
        if not isinstance(raw, dict) or raw.get("format") != TERMS_FORMAT:
            raise ConfigError(f"{path}: not federation terms (format {TERMS_FORMAT}: written "
                              "by dphub federate serve)")
        if set(raw) != {"format", *_FIELDS}:
            raise ConfigError(f"{path}: federation terms with other settings than "
                              f"{', '.join(_FIELDS)}")
        return cls(**{k: raw[k] for k in _FIELDS})

    @classmethod
    def for_order(cls, rounds: int, local_steps: int, target_epsilon: float,
                  options: dict[str, Any], frozen_digest: str) -> FederationTerms:
        """The terms an unpinned site (``simulate``) reads off its first order: what keys its
        plan (no aggregation, no server identity: they do not reach a site in an order)."""
        return cls(rounds=rounds, local_steps=local_steps, target_epsilon=float(target_epsilon),
                   aggregation=None, options=dict(options), frozen_digest=frozen_digest)

    # ------------------------------------------------------------------ checks

    def check_server_ca(self, root_certificates: Path | None) -> None:
        """The CA certificate ``join`` trusts is the federation's (or both are insecure)."""
        if self.server_ca_sha256 is None:
            if root_certificates is not None:
                raise ConfigError("the federation terms name no server CA (an insecure "
                                  "loopback federation); join it with --insecure")
            return
        if root_certificates is None:
            raise ConfigError("the federation terms name a server CA: join with "
                              "--root-certificates, not --insecure")
        got = file_sha256(Path(root_certificates))
        if got != self.server_ca_sha256:
            raise ConfigError(f"--root-certificates: SHA-256 {got[:16]}… is not the "
                              f"federation's server CA {self.server_ca_sha256[:16]}…")

    def check_order(self, *, rounds: int, local_steps: int, target_epsilon: float,
                    frozen_digest: str, options: dict[str, Any]) -> None:
        """An order of exactly this federation (before anything is built or spent)."""
        diffs = [name for name, got, want in (
            ("rounds", rounds, self.rounds), ("local_steps", local_steps, self.local_steps),
            ("target_epsilon", float(target_epsilon), float(self.target_epsilon)),
            ("frozen_digest", frozen_digest, self.frozen_digest))
            if got != want]
        diffs += self.option_diffs(options)
        if diffs:
            raise FederationRefused("the round is not the federation this site agreed to "
                                    f"(differs in {', '.join(diffs)})")

    def check_run_config(self, run_config: dict[str, Any] | None) -> None:
        """The run's own config (``flwr run --run-config`` may replace the bundle's): its
        ``federation`` block must be these terms (the server's local paths aside)."""
        text = (run_config or {}).get("federation")
        try:
            fed = json.loads(str(text)) if text is not None else None
        except ValueError:
            fed = None
        if not isinstance(fed, dict):
            raise FederationRefused("the run has no dphub federation block in its config")
        diffs = [k for k in ("rounds", "local_steps", "aggregation")
                 if fed.get(k) != getattr(self, k)]
        t = fed.get("target_epsilon")
        if isinstance(t, bool) or not isinstance(t, int | float) \
                or float(t) != float(self.target_epsilon):
            diffs.append("target_epsilon")
        opts = fed.get("options")
        diffs += self.option_diffs(opts) if isinstance(opts, dict) else ["options"]
        if diffs:
            raise FederationRefused("the run's config is not the federation this site agreed "
                                    f"to (differs in {', '.join(diffs)})")

    def option_diffs(self, options: dict[str, Any]) -> list[str]:
        keys = sorted(set(options) | set(self.options), key=str)
        out = []
        for k in keys:
            a, b = options.get(k), self.options.get(k)
            try:
                same = _canonical(a) == _canonical(b)
            except (TypeError, ValueError):
                same = False
            if not same:
                out.append(f"options.{str(k)[:40]}")
        return out
