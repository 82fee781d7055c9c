"""``dphub federate simulate``: every site on this machine, with Flower's simulation engine.

The same ServerApp and ClientApp as a deployment (:mod:`dphub.federate.apps`); each site is a
virtual SuperNode whose ClientApp runs in a Ray worker. A site's accountant lives in its own
state directory (``STATE_DIR/site-<i>``), so rerunning with the same state directory continues
every site's accounting (and stops a site whose budget is spent) instead of starting afresh.

Before Ray starts, everything that can be checked is: the options (one line, exit 2, instead of
Ray's tracebacks), the output directory, and that no two sites share a note or a patient by
*content* (:func:`site_overlap`: a copy of one site's notes under another name would make the
card claim parallel composition for patients who are in both). A watchdog
(:mod:`dphub.federate.reaper`) ends Ray's processes if this process is killed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dphub import formats
from dphub.card import load_card
from dphub.errors import ConfigError, InputError
from dphub.federate import apps, reaper
from dphub.federate.server import FederationConfig
from dphub.textnorm import normalize
from dphub.train.output import check_output_dir


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def simulate(sites: Sequence[Path], cfg: FederationConfig, *, state_dir: Path,
             num_cpus: int | None = None, verbose: bool = False) -> dict[str, Any]:
    """Run the federation over ``sites`` (one notes file each); returns the card's front matter."""
    from flwr.simulation import run_simulation  # optional dependency: imported where used

    if len(sites) < 1:
        raise ConfigError("federate simulate: give at least one site's notes")
    for p in sites:
        if not Path(p).is_file():
            raise InputError(f"{p}: no such file")
    if len({Path(p).resolve() for p in sites}) != len(sites):
        raise ConfigError("federate simulate: the same notes file twice (sites must hold "
                          "disjoint patients)")
    cfg.validate()
    check_output_dir(cfg.out, force=cfg.force)
    site_overlap(sites)
    cfg.min_sites = min(cfg.min_sites, len(sites))
    state_dir = Path(state_dir)
    if cfg.state_dir is None:
        cfg.state_dir = state_dir / "server"
    site_dirs = [[str(Path(p).resolve()), str((state_dir / f"site-{i}").resolve())]
                 for i, p in enumerate(sites)]
    cpus = num_cpus or max(1, min(len(sites), os.cpu_count() or 1))
    backend = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": cpus, "include_dashboard": False,
                      "logging_level": logging.ERROR, "log_to_driver": verbose},
    }
    env = {apps.SITES_ENV: json.dumps(site_dirs), apps.SERVER_ENV: cfg.to_json(),
           "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0"}
    watchdog = reaper.start()  # ends Ray's processes if this one is killed (kill -9)
    try:
        with _env(env), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_simulation(server_app=apps.server_app, client_app=apps.client_app,
                           num_supernodes=len(sites), backend_config=backend,
                           verbose_logging=verbose)
    finally:
        watchdog.terminate()
        watchdog.wait()
    if not (cfg.out / "README.md").exists():
        raise ConfigError("the federation ended without a model (see the log above)")
    return load_card(cfg.out).meta


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _site_digests(path: Path) -> tuple[set[str], set[str]]:
    """Digests of a site's normalised note texts and of its patient ids (nothing else kept)."""
    texts: set[str] = set()
    patients: set[str] = set()
    for note in formats.read(path):
        norm = normalize(note.text)
        text = norm.text if norm is not None else note.text
        texts.add(_digest(" ".join(text.casefold().split())))
        if note.patient_id:
            patients.add(_digest(str(note.patient_id)))
    return texts, patients


def site_overlap(sites: Sequence[Path]) -> None:
    """Refuse sites that share a note (same normalised text) or a patient id: the card's claim
    (parallel composition: ε is the max over sites) holds only for disjoint patients. The
    message gives site numbers and counts, never a note."""
    seen: list[tuple[set[str], set[str]]] = []
    for i, path in enumerate(sites):
        texts, patients = _site_digests(Path(path))
        for j, (t, p) in enumerate(seen):
            notes, pats = len(texts & t), len(patients & p)
            if notes or pats:
                raise ConfigError(
                    f"federate simulate: sites {j} and {i} share {notes} note(s) and {pats} "
                    "patient id(s); sites must hold disjoint patients (a patient at two sites "
                    "is not covered by the card's claim)")
        seen.append((texts, patients))
