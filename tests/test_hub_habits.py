"""Hub habits of issue 56: did-you-mean for model ids, ε refusals before any download, a local
path that does not exist is not sent to `dphub pull`, an unchanged model is not published twice."""

from __future__ import annotations

import pytest
from hub_fixtures import copy_model

from dphub.cli.main import main
from dphub.errors import HubError, PullRefused
from dphub.hub import ops
from dphub.hub.local import LocalHub
from dphub.registry import Registry

pytest_plugins = ("hub_fixtures",)


@pytest.fixture
def model(model_template, hub_env):
    return copy_model(model_template, hub_env["tmp"] / "model")


def test_pull_typo_gets_a_did_you_mean(model, hub_env):
    ops.publish(model, "acme/deid-nursing")
    with pytest.raises(HubError, match="did you mean acme/deid-nursing"):
        ops.pull("acme/deid-nurse")
    with pytest.raises(HubError) as e:
        ops.pull("zzz/unrelated")
    assert "did you mean" not in e.value.message


def test_pull_refuses_on_the_card_before_downloading(model, hub_env, monkeypatch):
    _, s = ops.publish(model, "acme/deid")

    def no_download(*args, **kwargs):
        raise AssertionError("downloaded before refusing")

    monkeypatch.setattr(LocalHub, "download_verified", no_download)
    with pytest.raises(PullRefused, match="exceeds --max-epsilon.*before any download"):
        ops.pull("acme/deid", max_epsilon=s.epsilon / 2)
    assert Registry().list() == []


def test_a_passing_claim_is_still_checked_after_the_download(model, hub_env, monkeypatch):
    """The early check only refuses: a card that passes it is checked in full as before."""
    ops.publish(model, "acme/deid")
    calls = []
    real = LocalHub.download_verified

    def counted(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LocalHub, "download_verified", counted)
    assert ops.pull("acme/deid").unit == "patient" and calls == [1]


def test_publish_unchanged_model_twice_says_so(model, hub_env, capsys):
    assert main(["publish", str(model), "--repo", "acme/deid"]) == 0
    first = capsys.readouterr().out.split("@")[1].split()[0]
    assert main(["publish", str(model), "--repo", "acme/deid"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"unchanged: acme/deid@{first}") and "nothing published" in out
    assert [r.revision for r in ops.info("acme/deid")] == [first]
    assert main(["publish", str(model), "--repo", "acme/deid", "--force"]) == 0
    assert capsys.readouterr().out.startswith("published acme/deid@")
    assert len(ops.info("acme/deid")) == 2
    (model / "extra.txt").write_text("a changed file list is a change\n")
    assert ops.unchanged_head(model, "acme/deid") is None


def test_ensemble_add_missing_local_path_is_not_sent_to_pull(model, hub_env, capsys,
                                                           monkeypatch):
    monkeypatch.chdir(hub_env["tmp"])
    (hub_env["tmp"] / "models").mkdir()
    copy_model(model, hub_env["tmp"] / "models" / "site-a")
    for spec, needle in (("models/nope", "models/nope: no such model directory"),
                         ("models/site-b", "did you mean models/site-a?"),
                         ("./elsewhere", "./elsewhere: no such model directory")):
        assert main(["ensemble", "add", spec]) == 2
        err = capsys.readouterr().err
        assert needle in err and "dphub pull" not in err, err
    (hub_env["tmp"] / "notes.txt").write_text("x")
    assert main(["ensemble", "add", "notes.txt"]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_ensemble_add_registry_typo_gets_a_did_you_mean(model, hub_env, capsys, monkeypatch):
    monkeypatch.chdir(hub_env["tmp"])
    ops.publish(model, "acme/deid")
    ops.pull("acme/deid")
    assert main(["ensemble", "add", "acme/dei"]) == 2
    err = capsys.readouterr().err
    assert "dphub pull acme/dei" in err and "did you mean acme/deid?" in err


def test_pull_of_a_local_directory_says_no_pull_is_needed(model, hub_env, capsys,
                                                          monkeypatch):
    monkeypatch.chdir(hub_env["tmp"])
    hub_env["hub"].mkdir(exist_ok=True)
    (hub_env["tmp"] / "models").mkdir()
    copy_model(model, hub_env["tmp"] / "models" / "site-a")
    assert main(["pull", "models/site-a"]) == 2
    assert "is a local model directory" in capsys.readouterr().err


@pytest.mark.parametrize(("eps", "shown"), [(7.9993, "8"), (8.0, "8"), (8.511264, "8.52"),
                                            (0.12301, "0.124"), (1234.5, "1240"),
                                            (1e-05, "0.00001"), (2.0000001, "2.01")])
def test_epsilon_is_shown_with_3_significant_digits_rounded_up(eps, shown):
    from dphub.privacy.statement import format_epsilon

    assert format_epsilon(eps) == shown
    assert float(shown) >= eps  # never below the guarantee


def test_publish_search_pull_and_the_card_show_the_same_epsilon(model, hub_env, capsys):
    """Issue 56: publish/search said 8 where the card said 7.999 for one model."""
    from dphub.card import load_card
    from dphub.privacy.statement import format_epsilon

    shown = format_epsilon(load_card(model).epsilon)
    assert main(["publish", str(model), "--repo", "acme/deid"]) == 0
    assert f"epsilon={shown}," in capsys.readouterr().out
    assert main(["search"]) == 0
    assert f" {shown} " in capsys.readouterr().out
    assert main(["pull", "acme/deid"]) == 0
    assert f"epsilon={shown}," in capsys.readouterr().out
    assert main(["card", "show", str(model)]) == 0
    out = capsys.readouterr().out
    assert f"epsilon = {shown}" in out and f"{load_card(model).epsilon:.4g}" not in out
    [rev] = ops.info("acme/deid")
    assert f"epsilon={shown}," in (rev.message or "")
