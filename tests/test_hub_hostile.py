"""A hub is data: nothing planted in a hub's git repositories may run (issue 31, item 7).

Each test plants executables in a published repository (its hooks, a ``core.hooksPath``
directory, or repository config naming programs: ``gpg.program`` with ``log.showSignature`` and a
HEAD commit carrying a ``gpgsig`` header, ``commit.gpgSign``, ``core.fsmonitor``, a pager, an
external diff, filter and textconv drivers, ...) and then takes every path that runs git on the
hub: ``search``, ``hub info``, ``hub list``, ``pull``, a ``--base-model org/m --hub HUB`` pull and
``publish``. Every planted program appends to one marker file; the marker must never appear and
every operation must still do its job (or refuse cleanly, exit 2).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from hub_fixtures import card_meta, copy_model, write_card

from dphub.cli.main import main

pytest_plugins = ("hub_fixtures",)

#: Every hook name git (2.39 and later) runs, whichever command runs it.
HOOKS = (
    "applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
    "prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout",
    "post-merge", "pre-push", "pre-receive", "update", "proc-receive", "post-receive",
    "post-update", "reference-transaction", "push-to-checkout", "pre-auto-gc", "post-rewrite",
    "sendemail-validate", "fsmonitor-watchman", "post-index-change", "p4-changelist",
    "p4-prepare-changelist", "p4-post-changelist", "p4-pre-submit",
)

#: A syntactically valid (not verifiable) OpenPGP signature block for a commit's gpgsig header.
FAKE_SIGNATURE = (
    "-----BEGIN PGP SIGNATURE-----\n\n"
    "iQEzBAABCAAdFiEEAAAAAAAAAAAAAAAAAAAAAAAAAAAFAmAAAAAACgkQAAAAAAAA\n"
    "AAA=\n=AAAA\n-----END PGP SIGNATURE-----"
)


def _plain_git(repo: Path, *args: str, input: bytes | None = None) -> bytes:
    """git as the test's attacker runs it (hooks off, so planting does not trip the marker)."""
    return subprocess.run(
        ["git", f"--git-dir={repo}", "-c", "core.hooksPath=/dev/null", *args], input=input,
        check=True, capture_output=True,
        env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull},
    ).stdout


def _script(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "$0 $*" >> "{marker}"\nexit 0\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _sign_head(repo: Path) -> None:
    """Replace the branch head by the same commit with a ``gpgsig`` header (what a signed commit
    looks like), so that ``log.showSignature`` makes git call ``gpg.program`` on it."""
    raw = _plain_git(repo, "cat-file", "commit", "refs/heads/main").decode()
    header, body = raw.split("\n\n", 1)
    sig = "\n ".join(FAKE_SIGNATURE.split("\n"))
    signed = f"{header}\ngpgsig {sig}\n\n{body}"
    oid = _plain_git(repo, "hash-object", "-t", "commit", "-w", "--stdin",
                     input=signed.encode()).decode().strip()
    _plain_git(repo, "update-ref", "refs/heads/main", oid)


def plant(repo: Path, how: str, marker: Path) -> None:
    """Make ``repo`` hostile: ``hooks`` (its own hooks directory), ``hooks_path`` (a
    core.hooksPath directory named by its config) or ``config`` (programs named by its config,
    some through an included file, and a signed HEAD)."""
    if how == "hooks":
        for name in HOOKS:
            _script(repo / "hooks" / name, marker)
        return
    if how == "hooks_path":
        elsewhere = repo.parent / ".planted-hooks"
        for name in HOOKS:
            _script(elsewhere / name, marker)
        with (repo / "config").open("a") as f:
            f.write(f"[core]\n\thooksPath = {elsewhere}\n")
        return
    assert how == "config"
    _sign_head(repo)
    prog = _script(repo / "planted-program", marker)
    included = repo / "planted.config"
    included.write_text(
        f"[gpg]\n\tprogram = {prog}\n[gpg \"ssh\"]\n\tprogram = {prog}\n"
        f"\tdefaultKeyCommand = {prog}\n[gpg \"x509\"]\n\tprogram = {prog}\n"
    )
    with (repo / "config").open("a") as f:
        f.write(
            f"[include]\n\tpath = {included}\n"
            "[log]\n\tshowSignature = true\n"
            "[commit]\n\tgpgSign = true\n[tag]\n\tgpgSign = true\n[user]\n\tsigningKey = k\n"
            f"[core]\n\tfsmonitor = {prog}\n\tpager = {prog}\n\teditor = {prog}\n"
            f"\tsshCommand = {prog}\n\talternateRefsCommand = {prog}\n\taskPass = {prog}\n"
            f"[pager]\n\tlog = {prog}\n[diff]\n\texternal = {prog}\n"
            f"[diff \"x\"]\n\ttextconv = {prog}\n\tcommand = {prog}\n"
            f"[filter \"x\"]\n\tclean = {prog}\n\tsmudge = {prog}\n\tprocess = {prog}\n"
            "\trequired = true\n"
            f"[credential]\n\thelper = !{prog}\n[sequence]\n\teditor = {prog}\n"
            "[gc]\n\tauto = 1\n\tautoDetach = false\n[maintenance]\n\tauto = true\n"
        )
    (repo / "info").mkdir(exist_ok=True)
    (repo / "info" / "attributes").write_text("* filter=x diff=x\n")
    for name in HOOKS:  # with the planted config too, in case any of it re-enables hooks
        _script(repo / "hooks" / name, marker)


@pytest.fixture
def model(model_template, hub_env):
    return copy_model(model_template, hub_env["tmp"] / "model")


@pytest.mark.parametrize("how", ["hooks", "hooks_path", "config"])
def test_nothing_planted_in_a_hub_repository_runs(model, hub_env, capsys, how):
    hub, marker = hub_env["hub"], hub_env["tmp"] / "code-ran"
    assert main(["publish", str(model), "--repo", "acme/deid", "--tag", "v1"]) == 0
    repo = hub / "models" / "acme" / "deid"
    plant(repo, how, marker)
    head = _plain_git(repo, "rev-parse", "refs/heads/main").decode().strip()
    capsys.readouterr()

    assert main(["search"]) == 0
    assert "acme/deid" in capsys.readouterr().out
    assert main(["hub", "info", "acme/deid"]) == 0
    assert head[:12] in capsys.readouterr().out
    assert main(["hub", "list"]) == 0
    assert "acme/deid" in capsys.readouterr().out
    assert main(["pull", "acme/deid"]) == 0
    assert capsys.readouterr().out.startswith(f"pulled acme/deid@{head}")
    assert main(["pull", "acme/deid@v1"]) == 0
    capsys.readouterr()
    assert not marker.exists(), marker.read_text()

    write_card(model, card_meta(noise=1.5))
    assert main(["publish", str(model), "--repo", "acme/deid", "--tag", "v2"]) == 0, \
        capsys.readouterr().err
    assert capsys.readouterr().out.startswith("published acme/deid@")
    new = _plain_git(repo, "rev-parse", "refs/heads/main").decode().strip()
    assert new != head
    assert _plain_git(repo, "rev-parse", "refs/heads/main~1").decode().strip() == head
    assert "gpgsig" not in _plain_git(repo, "cat-file", "commit", new).decode()
    assert not marker.exists(), marker.read_text()


@pytest.mark.parametrize("how", ["hooks", "hooks_path", "config"])
def test_base_model_pull_from_a_hostile_hub_runs_nothing(model, hub_env, how):
    """``dphub train --base-model org/m --hub HUB``: the hub lookup (``info``) and the pull run no
    planted code; the pulled DP model is then refused as a base (not public), cleanly."""
    from dphub.errors import ConfigError
    from dphub.hub.bases import pull_base_model
    from dphub.hub.ops import publish

    hub, marker = hub_env["hub"], hub_env["tmp"] / "code-ran"
    publish(model, "acme/base", hub=str(hub))
    plant(hub / "models" / "acme" / "base", how, marker)
    with pytest.raises(ConfigError, match="--init-from"):
        pull_base_model("acme/base", hub=str(hub))
    assert not marker.exists(), marker.read_text()


def _plant_promisor(repo: Path, marker: Path, tmp: Path) -> None:
    """Declare a promisor remote whose ``uploadpack`` is a planted program (allowing the file
    transport in the repository's own config) and delete one blob: git then fetches the missing
    object lazily, which runs the program."""
    prog = _script(repo / "planted-program", marker)
    elsewhere = tmp / "elsewhere.git"
    subprocess.run(["git", "init", "--quiet", "--bare", str(elsewhere)], check=True,
                   env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull})
    with (repo / "config").open("a") as f:
        f.write(f"[remote \"x\"]\n\turl = {elsewhere}\n\tpromisor = true\n"
                f"\tuploadpack = {prog}\n[protocol \"file\"]\n\tallow = always\n"
                "[protocol]\n\tallow = always\n")
    oid = _plain_git(repo, "ls-tree", "refs/heads/main", "config.json").decode().split()[2]
    (repo / "objects" / oid[:2] / oid[2:]).unlink()


def test_a_missing_object_fetches_nothing_from_a_planted_promisor_remote(model, hub_env, capsys):
    """The pull of a repository with a missing object is refused, and nothing runs."""
    hub, marker = hub_env["hub"], hub_env["tmp"] / "code-ran"
    assert main(["publish", str(model), "--repo", "acme/deid"]) == 0
    _plant_promisor(hub / "models" / "acme" / "deid", marker, hub_env["tmp"])
    capsys.readouterr()

    assert main(["hub", "info", "acme/deid"]) == 0
    capsys.readouterr()
    assert main(["pull", "acme/deid"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "cannot be read" in err and "Traceback" not in err
    assert not marker.exists(), marker.read_text()


@pytest.mark.parametrize("how", ["promisor", "config"])
def test_hub_serve_runs_nothing_from_a_hostile_repository(model, hub_env, tmp_path, how):
    """``dphub hub serve``: olah reads the repositories with GitPython, i.e. git, under the same
    environment as the local backend."""
    from dphub.errors import DphubError
    from dphub.hub import ops
    from dphub.hub.serve import has_olah, start_olah, stop_olah

    if not has_olah():
        pytest.skip("olah is not installed (scripts/setup.sh: ./.venv-olah)")

    hub, marker = hub_env["hub"], tmp_path / "code-ran"
    ops.publish(model, "acme/deid")
    repo = hub / "models" / "acme" / "deid"
    if how == "promisor":
        _plant_promisor(repo, marker, tmp_path)
    else:
        plant(repo, how, marker)
    proc, url = start_olah(hub, tmp_path / "olah")
    try:
        if how == "promisor":
            with pytest.raises(DphubError):
                ops.pull("acme/deid", hub=url)
        else:
            assert ops.pull("acme/deid", hub=url).path.is_dir()
    finally:
        stop_olah(proc)
    assert not marker.exists(), marker.read_text()
