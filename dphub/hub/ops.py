"""What the ``dphub publish / pull / search / hub`` commands do, backend-independent.

``open_hub`` maps a ``--hub`` value to a backend: ``http(s)://...`` is a Hugging Face protocol
endpoint (huggingface.co, an ``HF_ENDPOINT``, olah), ``hf://`` the default Hugging Face endpoint,
anything else (or ``file://``) a local git hub directory.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from dphub.errors import DphubError, HubError, PublishRefused, PullRefused
from dphub.hub.common import CardSummary, RepoRevision, default_hub
from dphub.hub.gate import GateViolation, check_publishable, check_shareable
from dphub.hub.hf import HFHub
from dphub.hub.local import LocalHub
from dphub.hub.policy import (
    DEFAULT_POLICY,
    Policy,
    check_max_epsilon,
    check_unit,
    load_hub_policy,
    policy_hint,
    policy_violation,
)
from dphub.io import file_sha256
from dphub.privacy.ledger import policy_problem, release_spend
from dphub.privacy.statement import format_epsilon
from dphub.registry import Entry, Registry
from dphub.repo_ids import check_repo_id, parse_repo_spec


class Backend(Protocol):
    name: str

    def publish(self, model_dir: Path, repo_id: str, message: str,
                tag: str | None = None) -> str: ...
    def resolve(self, repo_id: str, revision: str | None) -> str: ...
    def download_verified(self, repo_id: str, sha: str, dest: Path) -> dict[str, str]: ...
    def revisions(self, repo_id: str) -> list[RepoRevision]: ...
    def latest(self) -> list[RepoRevision]: ...
    def repo_ids(self) -> Iterable[str]: ...
    def card_summary(self, repo_id: str, sha: str) -> CardSummary: ...
    def same_as_head(self, model_dir: Path, repo_id: str) -> str | None: ...


def open_hub(hub: str | None = None, *, api: Any = None) -> Backend:
    """The backend for ``hub`` (None: ``$DPHUB_HUB`` or the per-user local hub)."""
    hub = hub or default_hub()
    if hub.startswith(("http://", "https://")):
        return HFHub(hub, api=api)
    if hub.startswith("hf://"):
        rest = hub[len("hf://"):].strip("/")
        return HFHub(f"https://{rest}" if rest else None, api=api)
    if hub.startswith("file://"):
        hub = hub[len("file://"):]
    return LocalHub(hub)


def ledger_problem(model_dir: str | Path, policy: Policy) -> str | None:
    """Why the patients of a model released here break ``policy`` over every release the
    privacy ledger links to them (None: within it, or the model was not recorded here)."""
    weights = Path(model_dir) / "model.safetensors"
    try:
        found = release_spend(file_sha256(weights))
    except OSError:
        return None  # the gate has already refused a directory without its weights
    return None if found is None else policy_problem(found[1], policy.max_epsilon)


def unchanged_head(model_dir: str | Path, repo_id: str, *, hub: str | None = None,
                   api: Any = None) -> str | None:
    """The head revision of ``repo_id`` when it already holds exactly ``model_dir``'s files
    (weights, card, everything), else None. Why: publishing an unchanged model again made a new
    revision silently (issue 56); ``dphub publish`` now says so unless ``--force``."""
    check_repo_id(repo_id)
    return open_hub(hub, api=api).same_as_head(Path(model_dir), repo_id)


def publish(model_dir: str | Path, repo_id: str, *, hub: str | None = None,
            message: str | None = None, tag: str | None = None,
            api: Any = None, allow_above_policy: bool = False) -> tuple[str, CardSummary]:
    """Gate, then the hub's ε policy, then commit ``model_dir`` as a new revision of ``repo_id``.

    Returns (sha, summary). The policy refusal is one line naming what exceeds it and how a hub
    owner changes it (:mod:`dphub.hub.policy`). The policy also applies to what the model's
    patients lost over every release recorded in the privacy ledger (:func:`ledger_problem`):
    refused unless ``allow_above_policy`` (which never lifts the card's own check).
    """
    check_repo_id(repo_id)
    summary = check_publishable(model_dir)
    hub = hub or default_hub()
    policy = load_hub_policy(hub)
    why = policy_violation(summary.epsilon, summary.unit, policy, public=summary.public)
    if why:
        raise PublishRefused(f"refusing to publish {model_dir}: {why} (hub policy: "
                             f"{policy.describe()}); {policy_hint(hub)}")
    spent = None if summary.public else ledger_problem(model_dir, policy)
    if spent and not allow_above_policy:
        raise PublishRefused(f"refusing to publish {model_dir}: {spent} (hub policy: "
                             f"{policy.describe()}); `dphub ledger show` lists them; pass "
                             "--allow-above-policy to publish anyway")
    backend = open_hub(hub, api=api)
    # the repo id, never the local directory's name (which may name a patient, a ward, a user)
    msg = message or (
        f"Publish {repo_id} (public synthetic data only, epsilon=0)" if summary.public
        else f"Publish {repo_id} (epsilon={format_epsilon(summary.epsilon)}, "
             f"delta={summary.delta:g}, unit={summary.unit})")
    sha = backend.publish(Path(model_dir), repo_id, msg, tag)
    return sha, summary


def pull_policy(*, max_epsilon: float | None = None, require_unit: str | None = None,
                policy: Policy | None = None) -> Policy:
    """The policy a pull applies: ``policy`` (default :data:`DEFAULT_POLICY`, ε ≤ 10 per patient)
    with the puller's overrides. NaN/inf and unknown units raise ConfigError (exit 2): a NaN cap
    compares false with every ε and would accept any model."""
    base = policy or DEFAULT_POLICY
    eps = None if max_epsilon is None else check_max_epsilon(max_epsilon, what="--max-epsilon")
    unit = None if require_unit is None else check_unit(require_unit, what="--require-unit")
    return base.with_overrides(max_epsilon=eps, min_unit=unit)


def check_policy(summary: CardSummary, *, max_epsilon: float | None = None,
                 require_unit: str | None = None, policy: Policy | None = None) -> None:
    """Puller policy: ε cap, and a privacy unit at least as coarse as required.

    Units are ordered sequence < note < patient: a patient-level guarantee also protects each
    note, so ``--require-unit note`` accepts a patient-level model.
    """
    eff = pull_policy(max_epsilon=max_epsilon, require_unit=require_unit, policy=policy)
    why = policy_violation(summary.epsilon, summary.unit, eff, public=summary.public)
    if why is None:
        return
    default = " (the default pull policy; override with --max-epsilon / --require-unit or " \
              "[hub] max_epsilon / require_unit in dphub.toml)"
    eps = summary.epsilon
    if eps is not None and math.isfinite(eps) and eps > eff.max_epsilon:
        raise GateViolation(f"epsilon {format_epsilon(eps)} exceeds --max-epsilon {eff.max_epsilon:g}"
                            + ("" if max_epsilon is not None else default))
    if eps is not None and math.isfinite(eps):
        raise GateViolation(f"privacy unit {summary.unit} is weaker than the required "
                            f"{eff.min_unit}" + ("" if require_unit is not None else default))
    raise GateViolation(why)


def pull(spec: str, *, hub: str | None = None, max_epsilon: float | None = None,
         require_unit: str | None = None, registry: Registry | None = None,
         api: Any = None, policy: Policy | None = None) -> Entry:
    """Download ``org/name[@rev]``, verify hashes, card, weights and policy, then register it.

    The policy is ``policy`` (default: :data:`~dphub.hub.policy.DEFAULT_POLICY`) with
    ``max_epsilon`` / ``require_unit`` overriding its fields. The download goes to a staging
    directory inside the registry root and is renamed into place only after every check passed,
    so an interrupted or refused pull leaves nothing registered.
    """
    repo_id, revision = parse_repo_spec(spec)
    pull_policy(max_epsilon=max_epsilon, require_unit=require_unit, policy=policy)  # fail early
    backend = open_hub(hub, api=api)
    reg = registry or Registry()
    try:
        sha = backend.resolve(repo_id, revision)
    except HubError as e:
        raise HubError(e.message + did_you_mean(repo_id, backend)) from None
    where = f"{repo_id}@{sha[:12]}"
    claim = _claimed_refusal(backend, repo_id, sha, max_epsilon=max_epsilon,
                             require_unit=require_unit, policy=policy)
    if claim is not None:  # issue 56: refused from the card alone, before any download
        raise PullRefused(f"refusing {where}: {claim} (read from its card before any "
                          "download); nothing was registered")
    stage = Path(tempfile.mkdtemp(prefix=".pull.", dir=reg.staging_dir()))
    try:
        files = stage / "files"
        files.mkdir()
        try:
            backend.download_verified(repo_id, sha, files)
        except PullRefused as e:
            raise PullRefused(f"{e.message}; nothing was registered") from None
        try:
            summary = check_shareable(files)
            check_policy(summary, max_epsilon=max_epsilon, require_unit=require_unit,
                         policy=policy)
        except GateViolation as e:
            raise PullRefused(f"refusing {where}: {e.message}; nothing was registered") from None
        target = reg.model_dir(repo_id, sha)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(files, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(files, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    entry = Entry(name=repo_id, hub=backend.name, revision=sha, epsilon=summary.epsilon,
                  delta=summary.delta, unit=summary.unit, path=target, requested=revision)
    return reg.add(entry)


def _claimed_refusal(backend: Backend, repo_id: str, sha: str, *, max_epsilon: float | None,
                     require_unit: str | None, policy: Policy | None) -> str | None:
    """Why the policy refuses what the card of ``sha`` claims, read before any download (None:
    the claim passes, or the card cannot be read without downloading).

    Only ever a refusal: a claimed ε that exceeds the cap (or a weaker unit) is refused at once,
    instead of after the whole download; a claim that passes proves nothing, and the card and the
    weights are checked in full after the download as before.
    """
    try:
        summary = backend.card_summary(repo_id, sha)
    except (DphubError, AttributeError, TypeError, ValueError):
        return None  # the download reports it, with the full checks (a server's odd card data)
    eps = summary.epsilon
    if summary.public or eps is None or not math.isfinite(eps):
        return None
    try:
        check_policy(summary, max_epsilon=max_epsilon, require_unit=require_unit, policy=policy)
    except GateViolation as e:
        return e.message
    return None


def did_you_mean(repo_id: str, backend: Backend | None = None, *,
                 local: list[str] | None = None) -> str:
    """``"; did you mean a/b?"`` naming the closest repo ids of the hub (and of ``local``, e.g.
    the local registry's), or ``""``. Best effort: a hub that cannot list adds nothing."""
    ids: list[str] = list(local or [])
    if backend is not None:
        with contextlib.suppress(DphubError, OSError):
            ids.extend(backend.repo_ids())
    close = difflib.get_close_matches(repo_id, sorted(set(ids) - {repo_id}), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def search(*, hub: str | None = None, max_epsilon: float | None = None, unit: str | None = None,
           label: str | None = None, language: str | None = None,
           api: Any = None) -> list[RepoRevision]:
    """Latest revision of each hub model whose card matches every given filter.

    A NaN ``max_epsilon`` would compare false with every ε and list everything: refused.
    """
    if max_epsilon is not None:
        check_max_epsilon(max_epsilon, what="--max-epsilon")
    rows = open_hub(hub, api=api).latest()
    return [r for r in rows if r.summary.matches(max_epsilon=max_epsilon, unit=unit, label=label,
                                                 language=language)]


def info(repo_id: str, *, hub: str | None = None, api: Any = None) -> list[RepoRevision]:
    """Every revision of ``repo_id``, newest first."""
    return open_hub(hub, api=api).revisions(check_repo_id(repo_id))


def list_models(*, hub: str | None = None, api: Any = None) -> list[RepoRevision]:
    return open_hub(hub, api=api).latest()


__all__ = ["Backend", "check_policy", "did_you_mean", "unchanged_head", "info", "list_models", "open_hub", "publish",
           "pull", "pull_policy", "search"]
