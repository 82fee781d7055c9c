"""`dphub publish`, `pull`, `search` and `dphub hub info|list|serve`: parse, call dphub.hub, print.

``--hub`` defaults to ``[hub] url`` of dphub.toml, then ``$DPHUB_HUB``, then the per-user local hub.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from dphub import config
from dphub.errors import ConfigError
from dphub.hub.common import RepoRevision

HUB_HELP = "Hub: a local directory, http(s)://endpoint (HF protocol), or hf:// (default $DPHUB_HUB)."


def _hub(hub: str | None) -> str | None:
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


def _table(rows: list[RepoRevision], title: str) -> Table:
    t = Table(title=title)
    for col in ("repo", "revision", "ε", "δ", "unit", "base model", "labels", "patients", "notes",
                "eval F1"):
        t.add_column(col, overflow="fold")
    for r in rows:
        s = r.summary
        rev = r.revision[:12] + (f" ({', '.join(r.tags)})" if r.tags else "")
        t.add_row(r.repo, rev, _fmt(s.epsilon), _fmt(s.delta), s.unit or "—", s.base_model or "—",
                  ",".join(s.labels) or "—", _fmt(s.patients, "d"), _fmt(s.notes, "d"),
                  _fmt(s.f1, ".3f"))
    return t


def _console() -> Console:
    return Console(width=200, soft_wrap=False)


def publish_cmd(
    model_dir: Path | None = typer.Argument(None, help="Model directory (default: last trained)."),
    repo: str | None = typer.Option(None, "--repo", help="org/name (default: dphub.toml [hub] repo)."),
    hub: str | None = typer.Option(None, "--hub", help=HUB_HELP),
    message: str | None = typer.Option(None, "--message", "-m", help="Commit message."),
    tag: str | None = typer.Option(None, "--tag", help="Also tag this revision (e.g. v1)."),
) -> None:
    """Check a model directory against the publish gate and push it as a new revision."""
    from dphub.hub.ops import publish

    if model_dir is None:
        model_dir = config.last_trained_model()
        if model_dir is None:
            raise ConfigError("no model directory given and no `dphub train` run recorded here")
    if repo is None:
        repo = config.get(config.load_project_config(), "hub", "repo")
        if not repo:
            raise ConfigError("no --repo given and no [hub] repo in dphub.toml")
    sha, s = publish(model_dir, repo, hub=_hub(hub), message=message, tag=tag)
    typer.echo(f"published {repo}@{sha} (epsilon={s.epsilon:.3g}, delta={s.delta:g}, "
               f"unit={s.unit})" + (f" tagged {tag}" if tag else ""))


def pull_cmd(
    spec: str = typer.Argument(..., help="org/name[@revision]"),
    hub: str | None = typer.Option(None, "--hub", help=HUB_HELP),
    max_epsilon: float | None = typer.Option(
        None, "--max-epsilon", help="Refuse larger ε (default: max_epsilon of the hub section "
                                    "of dphub.toml, else 10)."),
    require_unit: str | None = typer.Option(
        None, "--require-unit", help="Require a privacy unit at least this coarse "
                                     "(sequence < note < patient; default: require_unit of "
                                     "the hub section of dphub.toml, else patient)."),
) -> None:
    """Download a model, verify hashes, card, weights and ε policy, and register it locally."""
    from dphub.hub.ops import pull

    cfg = config.load_project_config()
    if max_epsilon is None:
        max_epsilon = config.get(cfg, "hub", "max_epsilon")
    if require_unit is None:
        require_unit = config.get(cfg, "hub", "require_unit")
    e = pull(spec, hub=_hub(hub), max_epsilon=max_epsilon, require_unit=require_unit)
    typer.echo(f"pulled {e.name}@{e.revision} (epsilon={_fmt(e.epsilon)}, delta={_fmt(e.delta)}, "
               f"unit={e.unit}) -> {e.path}")


def search_cmd(
    hub: str | None = typer.Option(None, "--hub", help=HUB_HELP),
    max_epsilon: float | None = typer.Option(None, "--max-epsilon"),
    unit: str | None = typer.Option(None, "--unit", help="patient | note | sequence"),
    label: str | None = typer.Option(None, "--label", help="A PHI label the model was trained on."),
    language: str | None = typer.Option(None, "--language"),
) -> None:
    """List the latest revision of each DP model on the hub matching the filters."""
    from dphub.hub.ops import search

    rows = search(hub=_hub(hub), max_epsilon=max_epsilon, unit=unit, label=label,
                  language=language)
    if not rows:
        typer.echo("no matching models")
        return
    _console().print(_table(rows, "DP models"))


hub_app = typer.Typer(help="Inspect and serve a hub.", no_args_is_help=True)


@hub_app.command("info")
def info_cmd(
    repo: str = typer.Argument(..., help="org/name"),
    hub: str | None = typer.Option(None, "--hub", help=HUB_HELP),
) -> None:
    """All revisions of a repo (newest first) with their DP guarantees."""
    from dphub.hub.ops import info

    _console().print(_table(info(repo, hub=_hub(hub)), f"{repo} revisions"))


@hub_app.command("list")
def list_cmd(
    hub: str | None = typer.Option(None, "--hub", help=HUB_HELP),
    pulled: bool = typer.Option(False, "--pulled", help="List the local registry instead."),
) -> None:
    """Every repo on the hub (latest revision), or with --pulled the models pulled here."""
    if pulled:
        from dphub.hub.registry import Registry

        t = Table(title="pulled models")
        for col in ("repo", "revision", "ε", "δ", "unit", "hub", "path"):
            t.add_column(col, overflow="fold")
        for e in Registry().list():
            t.add_row(e.name, e.revision[:12], _fmt(e.epsilon), _fmt(e.delta), e.unit or "—",
                      e.hub, str(e.path))
        _console().print(t)
        return
    from dphub.hub.ops import list_models

    _console().print(_table(list_models(hub=_hub(hub)), "hub models"))


@hub_app.command("policy")
def policy_cmd(
    max_epsilon: float | None = typer.Option(
        None, "--max-epsilon", help="Largest ε the hub accepts (default policy: 10)."),
    min_unit: str | None = typer.Option(
        None, "--min-unit", help="Weakest privacy unit the hub accepts: patient, note or "
                                 "sequence (patient > note > sequence; default: patient)."),
    reset: bool = typer.Option(False, "--reset", help="Back to the default policy."),
    hub: str | None = typer.Option(None, "--hub", help=HUB_HELP),
) -> None:
    """Show or set the hub's ε policy, which `dphub publish` enforces.

    A local hub keeps it in dphub-policy.json in its root; for an http(s):// or hf:// hub it is a
    client-side setting of this machine.
    """
    from dphub.hub.common import default_hub
    from dphub.hub.policy import DEFAULT_POLICY, load_hub_policy, save_hub_policy

    where = _hub(hub) or default_hub()
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
    hub_dir: Path = typer.Argument(..., help="Local hub directory to serve."),
    port: int = typer.Option(8090, "--port"),
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
