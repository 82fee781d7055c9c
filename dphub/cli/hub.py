"""`dphub publish`, `pull`, `search` and `dphub hub info|list|serve`: parse, call dphub.hub, print.

``--hub`` defaults to ``[hub] url`` of dphub.toml, then ``$DPHUB_HUB``, then the per-user local hub.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from dphub import config
from dphub.cli.options import FLOAT, positive_float
from dphub.errors import ConfigError, HubError

if TYPE_CHECKING:  # the hub package loads the card schema: not for `dphub --help`
    from dphub.hub.common import RepoRevision

HUB_HELP = "Hub: a local directory, an http(s):// endpoint (HF protocol), or hf://."
HUB_DEFAULT = "dphub.toml [hub] url, else $DPHUB_HUB, else the per-user hub"


def resolve_hub(hub: str | None) -> str | None:
    """Flag, else dphub.toml ``[hub] url`` (a relative path is relative to the file)."""
    if hub:
        return hub
    cfg = config.load_project_config()
    url = config.get(cfg, "hub", "url")
    if not url:
        return None
    if "://" in str(url):
        return str(url)
    return str(config.project_path(cfg, str(url)))


def _fmt(v: float | str | None, spec: str = ".3g") -> str:
    if isinstance(v, str):  # a coarsened count such as "100-199"
        return v
    return "—" if v is None else format(v, spec)


def _eps(v: float | None) -> str:
    """An ε as every command shows it (3 significant digits, rounded up)."""
    from dphub.privacy.statement import format_epsilon

    return "—" if v is None else format_epsilon(v)


UNVERIFIED = "unverified"


def _table(rows: list[RepoRevision], title: str, *, reasons: bool = False) -> Table:
    """One row per revision. ε, δ and unit are shown only when the card passed the gate's card
    checks on this machine (schema + ε recomputation); otherwise they read "unverified", since
    a repo can hold commits that never went through ``dphub publish``. ``reasons`` adds why."""
    t = Table(title=title)
    cols = ["repo", "revision", "ε", "δ", "unit", "base model", "labels", "patients", "notes",
            "eval F1"]
    if reasons:
        cols.append("card check")
    for col in cols:
        t.add_column(col, overflow="fold")
    for r in rows:
        s = r.summary
        rev = r.revision[:12] + (f" ({', '.join(r.tags)})" if r.tags else "")
        if s.verified:
            eps, delta, unit = _eps(s.epsilon), _fmt(s.delta), s.unit or "—"
        else:
            eps = delta = unit = UNVERIFIED
        cells = [r.repo, rev, eps, delta, unit, s.base_model or "—", ",".join(s.labels) or "—",
                 _fmt(s.patients, "d"), _fmt(s.notes, "d"), _fmt(s.f1, ".3f")]
        if reasons:
            cells.append("verified" if s.verified else f"{UNVERIFIED}: {s.problem or '?'}")
        t.add_row(*cells)
    if any(not r.summary.verified for r in rows):
        t.caption = ("unverified: the card fails the publish gate's checks (schema, ε "
                     "recomputation); its claims are not shown and `pull` refuses it"
                     + ("" if reasons else "; `dphub hub info REPO` says why"))
    return t


def _console() -> Console:
    return Console(width=200, soft_wrap=False)


def publish_cmd(
    model_dir: Path | None = typer.Argument(
        None, metavar="MODEL_DIR", show_default="the last `dphub train` output",
        help="Model directory to publish.",
    ),
    repo: str | None = typer.Option(
        None, "--repo", show_default="dphub.toml [hub] repo", help="Repository: org/name."
    ),
    hub: str | None = typer.Option(None, "--hub", help=HUB_HELP, show_default=HUB_DEFAULT),
    message: str | None = typer.Option(
        None, "--message", "-m", show_default="Publish <name> (epsilon, delta, unit)",
        help="Commit message.",
    ),
    tag: str | None = typer.Option(
        None, "--tag", show_default="none", help="Also tag this revision (e.g. v1)."
    ),
    allow_above_policy: bool = typer.Option(
        False, "--allow-above-policy",
        help="Publish even when the model's patients have lost more than the hub policy's "
        "maximum over every release the privacy ledger records (`dphub ledger show`); the "
        "card's own ε is still held to the policy.",
    ),
    force: bool = typer.Option(
        False, "--force", help="Publish a new revision even when the repo's latest revision "
        "already holds exactly these files (weights and card).",
    ),
) -> None:
    """Check a model directory against the publish gate and push it as a new revision."""
    from dphub.hub.common import default_hub
    from dphub.hub.ops import ledger_problem, publish, unchanged_head
    from dphub.hub.policy import load_hub_policy

    if model_dir is None:
        model_dir = config.last_trained_model()
        if model_dir is None:
            raise ConfigError("no model directory given and no `dphub train` run recorded here")
    if repo is None:
        repo = config.get(config.load_project_config(), "hub", "repo")
        if not repo:
            raise ConfigError("no --repo given and no [hub] repo in dphub.toml")
    hub = resolve_hub(hub)
    head = None if force else unchanged_head(model_dir, repo, hub=hub)
    if head is not None:  # issue 56: not a second, identical revision
        typer.echo(f"unchanged: {repo}@{head} already holds exactly these files (weights and "
                   "card); nothing published (--force publishes a new revision anyway)")
        return
    sha, s = publish(model_dir, repo, hub=hub, message=message, tag=tag,
                     allow_above_policy=allow_above_policy)
    spent = None if s.public or not allow_above_policy else ledger_problem(
        model_dir, load_hub_policy(hub or default_hub()))
    if spent:
        typer.echo(f"warning: {spent}; published anyway (--allow-above-policy)", err=True)
    what = ("public synthetic data only, epsilon=0" if s.public
            else f"epsilon={_eps(s.epsilon)}, delta={s.delta:g}, unit={s.unit}")
    typer.echo(f"published {repo}@{sha} ({what})" + (f" tagged {tag}" if tag else ""))


def pull_cmd(
    spec: str = typer.Argument(
        ..., metavar="SPEC", help="The model to pull: org/name[@revision] (a sha or a tag)."
    ),
    hub: str | None = typer.Option(None, "--hub", help=HUB_HELP, show_default=HUB_DEFAULT),
    max_epsilon: float | None = typer.Option(
        None, "--max-epsilon", parser=positive_float, metavar=FLOAT,
        show_default="dphub.toml [hub] max_epsilon, else the default policy's 10",
        help="Refuse a model whose ε is larger.",
    ),
    require_unit: str | None = typer.Option(
        None, "--require-unit", show_default="dphub.toml [hub] require_unit, else patient",
        help="Require a privacy unit at least this coarse (sequence < note < patient).",
    ),
) -> None:
    """Download a model, verify hashes, card, weights and ε policy, and register it locally."""
    from dphub.hub.ops import pull

    cfg = config.load_project_config()  # the project's ε policy for pulls
    if max_epsilon is None:
        max_epsilon = config.get(cfg, "hub", "max_epsilon")
    if require_unit is None:
        require_unit = config.get(cfg, "hub", "require_unit")
    try:
        e = pull(spec, hub=resolve_hub(hub), max_epsilon=max_epsilon, require_unit=require_unit)
    except HubError as err:
        if Path(spec).expanduser().is_dir():  # issue 56: a local model needs no pull
            raise HubError(f"{err.message}; {spec} is a local model directory: use it as it is "
                           f"(e.g. `dphub ensemble add {spec}`), no pull needed") from None
        raise
    typer.echo(f"pulled {e.name}@{e.revision} (epsilon={_eps(e.epsilon)}, delta={_fmt(e.delta)}, "
               f"unit={e.unit}) -> {e.path}")


def search_cmd(
    hub: str | None = typer.Option(None, "--hub", help=HUB_HELP, show_default=HUB_DEFAULT),
    max_epsilon: float | None = typer.Option(
        None, "--max-epsilon", parser=positive_float, metavar=FLOAT, show_default="no limit",
        help="Only models with ε at most this.",
    ),
    unit: str | None = typer.Option(
        None, "--unit", show_default="any", help="Only this privacy unit: patient | note | sequence."
    ),
    label: str | None = typer.Option(
        None, "--label", show_default="any", help="Only models trained on this PHI label."
    ),
    language: str | None = typer.Option(
        None, "--language", show_default="any", help="Only models for this language (e.g. en)."
    ),
) -> None:
    """List the latest revision of each DP model on the hub matching the filters."""
    from dphub.hub.ops import search

    rows = search(hub=resolve_hub(hub), max_epsilon=max_epsilon, unit=unit, label=label,
                  language=language)
    if not rows:
        typer.echo("no matching models")
        return
    _console().print(_table(rows, "DP models"))


hub_app = typer.Typer(help="Inspect and serve a hub.", no_args_is_help=True,
                      rich_markup_mode=None)  # plain help: keep literal brackets


@hub_app.command("info")
def info_cmd(
    repo: str = typer.Argument(..., metavar="REPO", help="Repository: org/name."),
    hub: str | None = typer.Option(None, "--hub", help=HUB_HELP, show_default=HUB_DEFAULT),
) -> None:
    """All revisions of a repo (newest first) with their DP guarantees."""
    from dphub.hub.ops import info

    _console().print(_table(info(repo, hub=resolve_hub(hub)), f"{repo} revisions", reasons=True))


@hub_app.command("list")
def list_cmd(
    hub: str | None = typer.Option(None, "--hub", help=HUB_HELP, show_default=HUB_DEFAULT),
    pulled: bool = typer.Option(False, "--pulled", help="List the local registry instead."),
) -> None:
    """Every repo on the hub (latest revision), or with --pulled the models pulled here."""
    if pulled:
        from dphub.registry import Registry

        t = Table(title="pulled models")
        for col in ("repo", "revision", "ε", "δ", "unit", "hub", "path"):
            t.add_column(col, overflow="fold")
        for e in Registry().list():
            t.add_row(e.name, e.revision[:12], _eps(e.epsilon), _fmt(e.delta), e.unit or "—",
                      e.hub, str(e.path))
        _console().print(t)
        return
    from dphub.hub.ops import list_models

    _console().print(_table(list_models(hub=resolve_hub(hub)), "hub models"))


@hub_app.command("policy")
def policy_cmd(
    max_epsilon: float | None = typer.Option(
        None, "--max-epsilon", show_default="unchanged",
        help="Largest ε the hub accepts (the default policy's is 10)."),
    min_unit: str | None = typer.Option(
        None, "--min-unit", show_default="unchanged",
        help="Weakest privacy unit the hub accepts: patient, note or sequence "
             "(patient > note > sequence; the default policy's is patient)."),
    reset: bool = typer.Option(False, "--reset", help="Back to the default policy."),
    hub: str | None = typer.Option(None, "--hub", help=HUB_HELP, show_default=HUB_DEFAULT),
) -> None:
    """Show or set the hub's ε policy, which `dphub publish` enforces.

    A local hub keeps it in dphub-policy.json in its root; for an http(s):// or hf:// hub it is a
    client-side setting of this machine.
    """
    from dphub.hub.common import default_hub
    from dphub.hub.policy import DEFAULT_POLICY, load_hub_policy, save_hub_policy

    where = resolve_hub(hub) or default_hub()
    current = load_hub_policy(where)
    if reset or max_epsilon is not None or min_unit is not None:
        base = DEFAULT_POLICY if reset else current
        current = base.with_overrides(max_epsilon=max_epsilon, min_unit=min_unit)
        path = save_hub_policy(where, current)
        typer.echo(f"policy of {where}: {current.describe()} (saved to {path})")
        return
    typer.echo(f"policy of {where}: {current.describe()}")


@hub_app.command("serve")
def serve_cmd(
    hub_dir: Path = typer.Argument(..., metavar="HUB_DIR", help="Local hub directory to serve."),
    port: int = typer.Option(8090, "--port", min=1, max=65535, help="TCP port to listen on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address (loopback by default)."),
) -> None:
    """Serve a local hub over the Hugging Face protocol with olah (offline mirror), until Ctrl-C."""
    import signal

    from dphub.hub.serve import start_olah, stop_olah

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # so that `finally` stops olah instead of orphaning it

    signal.signal(signal.SIGTERM, _terminate)
    with tempfile.TemporaryDirectory(prefix="dphub-olah-") as work:
        proc, url = start_olah(hub_dir, Path(work), port=port, host=host)
        typer.echo(f"serving {hub_dir} at {url} (use --hub {url}); Ctrl-C to stop")
        try:
            proc.wait()
        finally:
            stop_olah(proc)


def register(app: typer.Typer) -> None:
    """Add publish/pull/search and the `hub` group to the root app."""
    app.command("publish")(publish_cmd)
    app.command("pull")(pull_cmd)
    app.command("search")(search_cmd)
    app.add_typer(hub_app, name="hub")
