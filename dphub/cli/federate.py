"""`dphub federate`: several sites train one patient-level DP model with Flower (issue 27).

Flower is optional (``pip install 'dphub[federate]'``): this module imports neither Flower nor
the training stack at import time (``dphub --help`` must work without them); the commands say
clearly when Flower is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dphub.cli.options import apply_threads, threads_option
from dphub.errors import ConfigError
from dphub.federate.terms import (  # light: no Flower, no torch
    TERMS_FILE,
    FederationTerms,
    size_problem,
)

if TYPE_CHECKING:
    from dphub.federate.server import FederationConfig

federate_app = typer.Typer(
    help="Train one DP model across sites without sharing notes (Flower; docs/federated.md).",
    no_args_is_help=True,
)

MISSING_FLWR = ("dphub federate needs Flower: pip install 'dphub[federate]' "
                "(flwr[simulation]==1.42.0)")


def _need_flwr() -> None:
    if importlib.util.find_spec("flwr") is None:
        raise ConfigError(MISSING_FLWR)


def _options(base_model: str | None, warm_start: str, accountant: str, batch_size: int,
             lr: float, max_length: int, stride: int, rule_features: bool,
             noise: float | None, delta: float | None) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "warm_start": warm_start, "accountant": accountant, "batch_size": batch_size, "lr": lr,
        "max_length": max_length, "stride": stride, "rule_features": rule_features,
    }
    for k, v in (("base_model", base_model), ("noise", noise), ("delta", delta)):
        if v is not None:
            opts[k] = v
    return opts


OUT = typer.Option(..., "--out", "-o", help="Model directory the server writes.")
TARGET = typer.Option(8.0, "--target-epsilon", min=0.01,
                      help="Each site's patient-level epsilon budget over all rounds.")
ROUNDS = typer.Option(3, "--rounds", min=1, help="Federated rounds.")
LOCAL = typer.Option(8, "--local-steps", min=1, help="DP-SGD steps per site per round.")
AGG = typer.Option("mean", "--aggregation", help="mean; coarse-batch (weights by the lower "
                   "bound of each site's coarse expected batch); median or trimmed-mean "
                   "(coordinate-wise, against a lying site; trimmed-mean cuts one site per "
                   "end from 3 sites on). Every aggregation clips updates to the median norm "
                   "and drops a site far below the others on the public probe notes.")
BASE = typer.Option(None, "--base-model", show_default="embedded all-MiniLM-L6-v2", help="Public base model (the same on every site).")
WARM = typer.Option("synth", "--warm-start", help="synth or none (as dphub train).")
ACC = typer.Option("prv", "--accountant", help="prv or rdp.")
BATCH = typer.Option(96, "--batch-size", min=1, help="Expected patients per DP step per site.")
LR = typer.Option(5e-3, "--lr", help="Learning rate of each site's local steps.")
MAXLEN = typer.Option(128, "--max-length", min=8, help="Window length (word pieces).")
STRIDE = typer.Option(32, "--stride", min=0, help="Window overlap.")
RULES = typer.Option(True, "--rule-features/--no-rule-features", help="Rule flags as inputs.")
NOISE = typer.Option(None, "--noise", show_default="planned for the target", help="Fix σ instead of planning it for the target.")
DELTA = typer.Option(None, "--delta", show_default="min(1e-5, 1/(10 N)) per site", help="δ per site (default: from each site's size).")
FORCE = typer.Option(False, "--force", help="Replace an existing model directory.")


def simulate(
    sites: list[Path] = typer.Argument(..., help="One notes file per site (disjoint patients)."),
    out: Path = OUT, target_epsilon: float = TARGET, rounds: int = ROUNDS,
    local_steps: int = LOCAL, aggregation: str = AGG, base_model: str | None = BASE,
    warm_start: str = WARM, accountant: str = ACC, batch_size: int = BATCH, lr: float = LR,
    max_length: int = MAXLEN, stride: int = STRIDE, rule_features: bool = RULES,
    noise: float | None = NOISE, delta: float | None = DELTA,
    state_dir: Path | None = typer.Option(
        None, "--state-dir", show_default="OUT.federation", help="Where the sites' accountants and the server's last round are "
        "kept (default: OUT.federation next to OUT); rerunning continues them."),
    cpus: int | None = typer.Option(None, "--cpus", min=1, show_default="one per site, at most the CPUs", help="CPUs for Flower's engine."),
    force: bool = FORCE, threads: int | None = threads_option(),
) -> None:
    """Run every site on this machine with Flower's simulation engine."""
    _need_flwr()
    apply_threads(threads)
    from dphub.federate.server import FederationConfig  # heavy: torch, the training stack
    from dphub.federate.simulate import simulate as run  # imports Flower

    cfg = FederationConfig(
        out=out, rounds=rounds, local_steps=local_steps, target_epsilon=target_epsilon,
        aggregation=aggregation, force=force,
        options=_options(base_model, warm_start, accountant, batch_size, lr, max_length,
                         stride, rule_features, noise, delta))
    state = state_dir or out.with_name(out.name + ".federation")
    meta = run(sites, cfg, state_dir=state, num_cpus=cpus)
    dp = meta["differential_privacy"]
    fed = dp["federation"]
    lo, hi = fed["epsilon_range"]
    typer.echo(f"wrote {out}: {fed['rounds']} rounds, sites {fed['sites']}, per-site epsilon "
               f"{lo:.3g}..{hi:.3g}; patient-level epsilon {dp['epsilon']:.3g} "
               f"(delta {dp['delta']:.3g}, max over sites)")


def serve(
    app_dir: Path = typer.Option(..., "--app-dir", help="Where to write the Flower app "
                                 "directory that `flwr run` starts."),
    out: Path = OUT, target_epsilon: float = TARGET, rounds: int = ROUNDS,
    local_steps: int = LOCAL, aggregation: str = AGG, base_model: str | None = BASE,
    warm_start: str = WARM, accountant: str = ACC, batch_size: int = BATCH, lr: float = LR,
    max_length: int = MAXLEN, stride: int = STRIDE, rule_features: bool = RULES,
    noise: float | None = NOISE, delta: float | None = DELTA,
    min_sites: int = typer.Option(2, "--min-sites", min=1, help="Sites to wait for."),
    state_dir: Path | None = typer.Option(None, "--state-dir", show_default="OUT.federation",
                                          help="The server's last round "
                                          "(a killed server resumes from it)."),
    control: str = typer.Option("127.0.0.1:8000", "--control", help="The server's address "
                                "as flwr reaches it, HOST:PORT (`dphub federate superlink "
                                "--address`, the name its certificate carries)."),
    root_certificates: Path | None = typer.Option(
        None, "--root-certificates", show_default="insecure", help="CA certificate of the SuperLink (TLS); without it "
        "the app talks to the SuperLink insecurely (localhost only)."),
    server_dir: Path | None = typer.Option(
        None, "--server-dir", show_default="none: no operator token",
        help="The directory of `dphub federate superlink --dir`: its operator token goes "
        "into APP_DIR/flwr-home (0600, never into the app bundle), so flwr may use the "
        "SuperLink's Control API."),
    force: bool = FORCE,
) -> None:
    """Write the Flower app directory of this federation (then `flwr run` it; the SuperLink:
    `dphub federate superlink`, docs/federated.md)."""
    _need_flwr()
    from dphub.federate.deploy import (  # heavy: the training stack
        app_bundle_hash,
        split_address,
        write_app_dir,
    )
    from dphub.federate.server import FederationConfig
    from dphub.federate.superlink import pin_app, read_operator_token

    token = read_operator_token(server_dir) if server_dir is not None else None

    cfg = FederationConfig(
        out=out.resolve(), rounds=rounds, local_steps=local_steps,
        target_epsilon=target_epsilon, aggregation=aggregation, force=force,
        min_sites=min_sites,
        state_dir=(state_dir or out.with_name(out.name + ".federation")).resolve(),
        options=_options(base_model, warm_start, accountant, batch_size, lr, max_length,
                         stride, rule_features, noise, delta))
    cfg.validate()  # every option, then the terms (caps, the base's digest), then files
    if root_certificates is not None and not Path(root_certificates).is_file():
        raise ConfigError(f"{root_certificates}: no such certificate file")
    split_address(control, "--control")
    terms = _terms(cfg, root_certificates)
    write_app_dir(app_dir, cfg, control=control, root_certificates=root_certificates,
                  operator_token=token)
    terms.write(app_dir / TERMS_FILE)
    digest = app_bundle_hash(app_dir)  # after every file of the bundle is written
    if server_dir is not None:
        pin_app(server_dir, digest)
    typer.echo(json.dumps({"app_dir": str(app_dir), "run": f"flwr run {app_dir} dphub",
                           "app_hash": digest, "federation": str(app_dir / TERMS_FILE),
                           "federation_id": terms.federation_id()}))


def _terms(cfg: FederationConfig, root_certificates: Path | None) -> FederationTerms:
    """The federation's terms (written to ``APP_DIR/federation.json``): what each site agrees
    to with ``join --federation`` (the frozen base's digest needs the base model here too)."""
    from dphub.federate.site import recipe_frozen_digest
    from dphub.io import file_sha256

    problem = size_problem(cfg.rounds, cfg.local_steps, cfg.target_epsilon)
    if problem is not None:  # before the base model is built
        raise ConfigError(f"federation: {problem}")
    terms = FederationTerms(
        rounds=cfg.rounds, local_steps=cfg.local_steps,
        target_epsilon=float(cfg.target_epsilon), aggregation=cfg.aggregation,
        options=dict(cfg.options), frozen_digest=recipe_frozen_digest(cfg.options),
        server_ca_sha256=(file_sha256(Path(root_certificates))
                          if root_certificates is not None else None))
    return terms


def superlink(
    server_dir: Path = typer.Option(..., "--dir", help="The server's private directory "
                                    "(0700): the operator's token, the SuperExec secret, the "
                                    "loopback certificate. Keep it like the TLS key."),
    address: str = typer.Option("0.0.0.0:8000", "--address", help="The public address, "
                                "HOST:PORT, that sites and the operator's flwr reach."),
    certfile: Path = typer.Option(..., "--ssl-certfile", help="The server's TLS "
                                  "certificate (signed by the CA the sites trust)."),
    keyfile: Path = typer.Option(..., "--ssl-keyfile", help="The server's TLS key."),
    app_hash: str | None = typer.Option(
        None, "--app-hash", show_default="none: any dphub app without code",
        help="Run only the app bundle with this SHA-256 (default: the one `dphub federate "
        "serve --server-dir` wrote last)."),
) -> None:
    """Run the server: Flower's SuperLink on a Unix socket only this user can open, behind a
    gate that serves SuperNodes and, with the operator's token, flwr; only dphub's installed
    ServerApp runs, until stopped."""
    _need_flwr()
    from dphub.federate.superlink import plan_superlink, run_superlink

    exe = _flower_command("flower-superlink")
    plan = plan_superlink(server_dir, address=address, certfile=certfile, keyfile=keyfile,
                          app_hash=app_hash)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(exe).parent), env.get("PATH", "")])
    typer.echo(f"superlink: gate on {address} (Fleet API; Control API with the operator "
               f"token in {plan.server_dir}); Flower's SuperLink on {plan.internal} (this "
               "user only)", err=True)
    run_superlink(plan, env=env)
    typer.echo("stopped", err=True)


def _flower_command(name: str) -> str:
    """A Flower console script of this environment (beside this Python first)."""
    import sys

    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise ConfigError(f"{name} not found: {MISSING_FLWR}")
    return found


def join(
    data: Path = typer.Argument(..., help="This site's labelled notes (never leave the site)."),
    server: str = typer.Option(..., "--server", help="The SuperLink's HTTP API, HOST:PORT "
                               "(flower-superlink's --host/--port, default port 8000)."),
    state: Path = typer.Option(..., "--state", help="This site's state directory: its "
                               "accountant over all rounds and its node key (keep it: a "
                               "restarted site continues from it; a lost one is a new site)."),
    root_certificates: Path | None = typer.Option(
        None, "--root-certificates", show_default="none: required unless --insecure",
        help="CA certificate of the SuperLink (TLS; required unless --insecure)."),
    insecure: bool = typer.Option(False, "--insecure", help="No TLS and no node key: only "
                                  "towards a loopback SuperLink (a test on one machine)."),
    port: int = typer.Option(9094, "--port", help="This SuperNode's local Runtime API port "
                             "(loopback; distinct per site on one machine)."),
    policy_file: Path | None = typer.Option(
        None, "--policy", show_default="none: the defaults below", help="The site's privacy policy, TOML or JSON (max_epsilon, "
        "min_noise, delta, unit); the flags below override it."),
    max_epsilon: float | None = typer.Option(
        None, "--max-epsilon", show_default="8", help="Most epsilon this site spends over "
        "all rounds (a round asking for more is refused)."),
    min_noise: float | None = typer.Option(
        None, "--min-noise", show_default="0.5", help="Least noise multiplier (sigma) this "
        "site trains with."),
    delta: float | None = typer.Option(
        None, "--max-delta", show_default="min(1e-5, 1/(10 N))", help="Largest delta this "
        "site accepts."),
    unit: str | None = typer.Option(None, "--unit", show_default="patient",
                                    help="The only privacy unit this site trains at."),
    federation: Path = typer.Option(
        ..., "--federation", help="The federation this site agrees to: the terms file "
        "`dphub federate serve` writes (APP_DIR/federation.json; rounds, local steps, "
        "epsilon, the recipe with its delta, unit and base, the server's CA). Any run or "
        "round that differs is refused."),
    app_hash: str | None = typer.Option(
        None, "--app-hash", show_default="none: any dphub app without code",
        help="Accept only the app bundle with this SHA-256 (agreed "
        "with the server's operator; a refused bundle's hash is in the site's log); "
        "otherwise any dphub app without code."),
) -> None:
    """Run one site: a Flower SuperNode whose tasks run dphub's installed ClientApp on DATA
    (never code the server sends), under the site's own privacy policy, until stopped."""
    _need_flwr()
    from dataclasses import replace

    from dphub.federate.deploy import plan_join, run_join  # heavy: the training stack
    from dphub.federate.site import SitePolicy

    policy = SitePolicy.from_file(policy_file) if policy_file is not None else SitePolicy()
    flags = {"max_epsilon": max_epsilon, "min_noise": min_noise, "delta": delta, "unit": unit}
    policy = replace(policy, **{k: v for k, v in flags.items() if v is not None})
    plan = plan_join(data, state, server, port=port, root_certificates=root_certificates,
                     insecure=insecure, policy=policy, federation=federation,
                     app_hash=app_hash)
    supernode = _flower_command("flower-supernode")
    if plan.insecure:
        typer.echo("warning: --insecure: no TLS and no node authentication (loopback only)",
                   err=True)
    if plan.key_created:
        typer.echo(f"new node key: register it at the SuperLink before this site can join: "
                   f"flwr supernode register {plan.key.with_suffix('.pub')}", err=True)
    typer.echo(f"site policy: {json.dumps(policy.to_dict(), sort_keys=True)}", err=True)
    assert plan.terms is not None
    typer.echo(f"federation: {plan.terms.federation_id()} ({plan.terms.rounds} rounds x "
               f"{plan.terms.local_steps} local steps, epsilon {plan.terms.target_epsilon:g})",
               err=True)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(supernode).parent), env.get("PATH", "")])
    run_join(plan, supernode, env=env)
    typer.echo("stopped", err=True)


def register(app: typer.Typer) -> None:
    """Add ``federate`` to the root app."""
    federate_app.command("simulate")(simulate)
    federate_app.command("serve")(serve)
    federate_app.command("superlink")(superlink)
    federate_app.command("join")(join)
    app.add_typer(federate_app, name="federate")
