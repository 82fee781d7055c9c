"""``dphub federate serve``: the Flower app directory of a deployment (Flower 1.42's way).

A Flower 1.42 deployment is three long-running processes and one submission: a SuperLink
(``flower-superlink``) on the server machine, one SuperNode per site (``flower-supernode``,
each with ``--node-config "data='NOTES' state='STATE_DIR'"``), and ``flwr run APP_DIR dphub``,
which bundles the app directory written here and starts its ServerApp on the SuperLink. The app
directory holds no code: its components are dphub's own ServerApp and ClientApp
(:mod:`dphub.federate.apps`), which every machine has installed; the federation's settings
travel in its run config. ``flwr-home/config.toml`` names the SuperLink connection (TLS with
``root-certificates``, else insecure: localhost only). Commands: docs/federated.md.
"""

from __future__ import annotations

from pathlib import Path

import tomli_w

from dphub.errors import ConfigError
from dphub.federate.server import FederationConfig
from dphub.io import atomic_write_text

CONNECTION = "dphub"


def _is_host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def write_app_dir(app_dir: Path, cfg: FederationConfig, *, control: str,
                  root_certificates: Path | None) -> None:
    """Write ``pyproject.toml`` (the Flower app) and ``flwr-home/config.toml`` (the connection)."""
    cfg.validate()  # every option before anything is written
    if root_certificates is not None and not Path(root_certificates).is_file():
        raise ConfigError(f"{root_certificates}: no such certificate file")
    if not _is_host_port(control):
        raise ConfigError(f"--control must be HOST:PORT, got {control!r}")
    app_dir = Path(app_dir)
    if app_dir.exists() and any(app_dir.iterdir()) and not (app_dir / "pyproject.toml").exists():
        raise ConfigError(f"{app_dir}: exists and is not a dphub federation app directory")
    project = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {"name": "dphub-federation", "version": "1.0.0",
                    "description": "dphub federated DP training (dphub federate serve)",
                    # no dependencies: every machine runs its installed dphub (start the
                    # SuperLink with --disable-runtime-dependency-installation)
                    "dependencies": []},
        "tool": {"flwr": {"app": {
            "publisher": "dphub",
            "components": {"serverapp": "dphub.federate.apps:server_app",
                           "clientapp": "dphub.federate.apps:client_app"},
            "config": {"federation": cfg.to_json()},
        }}},
    }
    conn: dict[str, object] = {"address": control}
    if root_certificates is not None:
        conn["root-certificates"] = str(Path(root_certificates).resolve())
    else:
        conn["insecure"] = True
    flwr_config = {"superlink": {"default": CONNECTION, CONNECTION: conn}}
    atomic_write_text(app_dir / "pyproject.toml", tomli_w.dumps(project))
    atomic_write_text(app_dir / "flwr-home" / "config.toml", tomli_w.dumps(flwr_config))
