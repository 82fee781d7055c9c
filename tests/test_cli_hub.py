"""CLI of the hub: publish (explicit and from dphub.toml), search table, pull, hub info/list."""

from __future__ import annotations

import pytest
from hub_fixtures import copy_model
from rich.console import Console

from dphub import config
from dphub.cli import hub as hub_cli
from dphub.cli.main import main

pytest_plugins = ("hub_fixtures",)


@pytest.fixture
def model(model_template, hub_env):
    return copy_model(model_template, hub_env["tmp"] / "model")


def test_publish_search_pull_info_list(model, hub_env, capsys, monkeypatch):
    # tables fold a long path over lines (a test's temporary path, longer under pytest-xdist):
    # read them at a width that holds every cell whole
    monkeypatch.setattr(hub_cli, "_console", lambda: Console(width=1000, soft_wrap=False))
    assert main(["publish", str(model), "--repo", "acme/deid", "--tag", "v1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("published acme/deid@") and "tagged v1" in out and "unit=patient" in out
    sha = out.split("@")[1].split()[0]

    assert main(["search", "--unit", "patient"]) == 0
    table = capsys.readouterr().out
    assert "acme/deid" in table and sha[:12] in table and "(v1)" in table
    # ε 8.5113 shown rounded up, as on the card (issue 56: 3 significant digits, never down)
    assert "8.52" in table and "100-199" in table
    # the labels the card lists (its schema, OTHER included), not only those with examples
    assert "NAME,DATE,AGE,CONTACT,ID,LOCATION,PROFESSION,OTHER" in table

    assert main(["search", "--max-epsilon", "1"]) == 0
    assert capsys.readouterr().out.strip() == "no matching models"

    assert main(["pull", "acme/deid@v1", "--require-unit", "patient"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"pulled acme/deid@{sha}")

    assert main(["hub", "info", "acme/deid"]) == 0
    assert sha[:12] in capsys.readouterr().out
    assert main(["hub", "list"]) == 0
    assert "acme/deid" in capsys.readouterr().out
    assert main(["hub", "list", "--pulled"]) == 0
    assert str(hub_env["hub"]) in capsys.readouterr().out


def test_bare_publish_uses_project_config_and_last_model(model, hub_env, capsys):
    other_hub = hub_env["tmp"] / "project-hub"
    (hub_env["tmp"] / "dphub.toml").write_text(
        '[hub]\nrepo = "acme/from-toml"\nurl = "project-hub"\n', encoding="utf-8")
    config.record_last_model(model, hub_env["tmp"])
    assert main(["publish"]) == 0, capsys.readouterr().err
    assert "published acme/from-toml@" in capsys.readouterr().out
    assert (other_hub / "models" / "acme" / "from-toml" / "HEAD").is_file()


def test_pull_refusal_exits_2_with_one_line(model, hub_env, capsys):
    assert main(["publish", str(model), "--repo", "acme/deid"]) == 0
    capsys.readouterr()
    assert main(["pull", "acme/deid", "--max-epsilon", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: refusing acme/deid@") and "exceeds --max-epsilon 0.5" in err
    assert "nothing was registered" in err and err.count("\n") == 1


def test_publish_refusal_exits_2(model, hub_env, capsys):
    (model / "trainer_state.json").write_text("{}")
    assert main(["publish", str(model), "--repo", "acme/deid"]) == 2
    assert "trainer_state.json is optimizer/checkpoint state" in capsys.readouterr().err


def test_publish_without_repo_is_a_config_error(model, hub_env, capsys):
    assert main(["publish", str(model)]) == 2
    assert "no --repo given" in capsys.readouterr().err


def test_pull_unknown_repo_and_bad_spec(hub_env, capsys):
    hub_env["hub"].mkdir(exist_ok=True)  # an existing hub (its policy file at most)
    assert main(["pull", "acme/none"]) == 2
    assert "repo acme/none not found" in capsys.readouterr().err
    assert main(["pull", "../../etc"]) == 2
    assert "invalid repo id" in capsys.readouterr().err


def test_search_and_info_mark_a_bypassing_commit_unverified(model, hub_env, capsys):
    """Fault 16: a commit that bypassed the gate claims epsilon 1.0; listings must not show it."""
    from hub_fixtures import card_meta, write_card

    from dphub.hub.local import LocalHub

    assert main(["publish", str(model), "--repo", "acme/deid"]) == 0
    write_card(model, card_meta(epsilon=1.0))
    LocalHub(hub_env["hub"]).publish(model, "evil/model", "raw")
    capsys.readouterr()
    assert main(["search"]) == 0
    table = capsys.readouterr().out
    evil = next(line for line in table.splitlines() if "evil/model" in line)
    good = next(line for line in table.splitlines() if "acme/deid" in line)
    assert "unverified" in evil and "│ 1 " not in evil and "8.52" in good
    assert "unverified" not in good
    assert main(["search", "--max-epsilon", "30"]) == 0
    table = capsys.readouterr().out
    assert "acme/deid" in table and "evil/model" not in table
    assert main(["hub", "info", "evil/model"]) == 0
    out = capsys.readouterr().out
    assert "unverified:" in out and "claims" in out  # the reason (folded in the table)
    assert main(["pull", "evil/model"]) == 2


def test_publish_to_a_hub_that_is_a_file_exits_2(model, hub_env, capsys):
    """Fault 14: `publish --hub FILE` was an unexpected crash (exit 1)."""
    hub_file = hub_env["tmp"] / "hubfile"
    hub_file.write_text("x")
    assert main(["publish", str(model), "--repo", "acme/deid", "--hub", str(hub_file)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: hub ") and "is not a directory" in err and err.count("\n") == 1
    assert hub_file.read_text() == "x"


@pytest.mark.parametrize("argv", [["search"], ["hub", "list"], ["hub", "info", "acme/deid"],
                                  ["pull", "acme/deid"]])
def test_missing_hub_directory_exits_2(hub_env, capsys, argv):
    """Fault 17: a non-existent --hub said "no matching models" with exit 0."""
    missing = hub_env["tmp"] / "no-such-hub"
    assert main([*argv, "--hub", str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: hub {missing} does not exist")
    assert captured.err.count("\n") == 1 and "no matching models" not in captured.out
    assert not missing.exists()


@pytest.mark.parametrize("argv", [["search"], ["hub", "info", "acme/deid"],
                                  ["pull", "acme/deid"]])
def test_unreachable_http_hub_fails_fast_and_quietly(hub_env, capsys, caplog, argv):
    """Fault 15: 23 retry WARNING lines over 24 s before the error."""
    import logging
    import time

    from dphub.hub.serve import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    caplog.set_level(logging.DEBUG)
    start = time.monotonic()
    assert main([*argv, "--hub", url]) == 2
    assert time.monotonic() - start < 5
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: hub {url} is unreachable (")
    assert captured.err.count("\n") == 1 and captured.out == ""
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
