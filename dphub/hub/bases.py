"""``dphub train --base-model org/name``: pull a public base model from the hub when needed.

It is training's only use of the hub, so it lives here, above training: training itself only
reads the local registry of pulled models (:mod:`dphub.registry`).
"""

from __future__ import annotations

from pathlib import Path

from dphub.encoders import DEFAULT_BASE_MODEL_ID
from dphub.errors import ConfigError, HubError
from dphub.hub.ops import info, pull
from dphub.registry import Registry
from dphub.repo_ids import parse_repo_spec
from dphub.train.sources import REPO_ID, is_public_base


def pull_base_model(spec: str | None, *, hub: str | None = None) -> Path | None:
    """Pull ``--base-model org/name[@rev]`` from the hub when it names a hub repo not pulled yet.

    Why: a consortium builds its public base once (``dphub pretrain`` + ``dphub publish``); each
    site's ``dphub train --base-model org/name`` then starts from it without a separate
    ``dphub pull`` and without building the embedded warm start. The download is the ordinary
    verified pull (hashes, card, gate, ε policy), so a tampered base is refused exactly as
    ``dphub pull`` refuses it. Returns the pulled directory, or None when ``spec`` is not a repo
    id held by the hub (a directory, ``default``, an encoder id): those resolve as before. A
    pulled model that is not a public base is refused with the pointer to ``--init-from``.
    """
    if not spec or spec == "default" or Path(spec).expanduser().is_dir():
        return None
    repo_part = spec.partition("@")[0]
    if "/" not in spec or not REPO_ID.fullmatch(repo_part) or repo_part == DEFAULT_BASE_MODEL_ID:
        return None
    repo_id, revision = parse_repo_spec(spec)
    try:
        Registry().get(repo_id, revision)
        return None  # pulled already: _public_base_dir takes it from the registry
    except HubError:
        pass
    try:
        info(repo_id, hub=hub)
    except HubError:
        return None  # the hub does not hold it: an encoder id, resolved (or refused) as before
    entry = pull(spec, hub=hub)
    if not is_public_base(entry.path):
        raise ConfigError(
            f"--base-model {spec}: pulled, but its card does not say training_data: "
            "public-synthetic; fine-tune a DP model with --init-from"
        )
    return entry.path
