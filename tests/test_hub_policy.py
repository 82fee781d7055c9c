"""The ε policy: a conservative default (ε ≤ 10 per patient) on publish and pull, changeable by
the hub owner (publish) or the puller (pull), never failing open on NaN/inf."""

from __future__ import annotations

import json
import math

import pytest
from hub_fixtures import card_meta, copy_model, write_card

from dphub.cli.main import main
from dphub.errors import ConfigError, PublishRefused, PullRefused
from dphub.hub import ops
from dphub.hub.policy import (
    DEFAULT_POLICY,
    POLICY_FILE,
    Policy,
    load_hub_policy,
    policy_violation,
    save_hub_policy,
)
from dphub.registry import Registry

pytest_plugins = ("hub_fixtures",)


@pytest.fixture
def model(model_template, hub_env):
    return copy_model(model_template, hub_env["tmp"] / "model")


@pytest.fixture
def weak(model):
    """The model re-carded with σ 0.8 over 300 steps: ε ≈ 23.6 per patient."""
    write_card(model, card_meta(noise=0.8, n_steps=300))
    return model


@pytest.fixture
def bare_hub(hub_env):
    """A hub with no policy file: the default applies."""
    (hub_env["hub"] / POLICY_FILE).unlink()
    return hub_env["hub"]


def test_default_policy_and_violations():
    assert Policy(max_epsilon=10.0, min_unit="patient") == DEFAULT_POLICY
    assert policy_violation(8.5, "patient") is None
    assert policy_violation(10.0, "patient") is None
    assert "epsilon 23.6 exceeds the policy's maximum 10" in policy_violation(23.6, "patient")
    assert "privacy unit note is weaker than the policy's minimum patient" in policy_violation(
        3.0, "note")
    assert "no finite epsilon" in policy_violation(None, "patient")
    assert "no finite epsilon" in policy_violation(math.inf, "patient")
    assert policy_violation(3.0, "sequence", Policy(20, "sequence")) is None
    assert policy_violation(3.0, "patient", Policy(20, "note")) is None  # patient covers note


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 0.0, "10", True])
def test_non_finite_or_odd_policy_values_are_refused(bad):
    with pytest.raises(ConfigError, match="max_epsilon must be"):
        Policy(max_epsilon=bad)


def test_unknown_unit_is_refused():
    with pytest.raises(ConfigError, match="min_unit must be one of patient, note, sequence"):
        Policy(min_unit="hospital")


def test_publish_refuses_above_the_default_policy_in_one_line(weak, bare_hub, capsys):
    code = main(["publish", str(weak), "--repo", "acme/weak", "--hub", str(bare_hub)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: refusing to publish")
    assert "epsilon 23.6 exceeds the policy's maximum 10" in err  # rounded up (issue 56)
    assert "dphub hub policy --max-epsilon E --min-unit U" in err
    assert not (bare_hub / "models" / "acme" / "weak").exists()


def test_publish_refuses_a_weaker_unit_by_default(model, bare_hub):
    write_card(model, card_meta(unit="note"))
    with pytest.raises(PublishRefused, match="privacy unit note is weaker than the policy's "
                                             "minimum patient"):
        ops.publish(model, "acme/note", hub=str(bare_hub))


def test_hub_owner_changes_the_policy(weak, bare_hub, capsys):
    assert main(["hub", "policy", "--hub", str(bare_hub)]) == 0
    assert "epsilon <= 10, privacy unit patient or stronger" in capsys.readouterr().out
    assert main(["hub", "policy", "--max-epsilon", "30", "--min-unit", "note",
                 "--hub", str(bare_hub)]) == 0
    assert "epsilon <= 30, privacy unit note" in capsys.readouterr().out
    assert json.loads((bare_hub / POLICY_FILE).read_text()) == {"max_epsilon": 30.0,
                                                                "min_unit": "note"}
    _, summary = ops.publish(weak, "acme/weak", hub=str(bare_hub))
    assert summary.epsilon == pytest.approx(23.6, abs=0.05)
    assert main(["hub", "policy", "--reset", "--hub", str(bare_hub)]) == 0
    assert load_hub_policy(str(bare_hub)) == DEFAULT_POLICY


@pytest.mark.parametrize("value", ["nan", "inf", "-3"])
def test_cli_refuses_non_finite_policy_values(bare_hub, capsys, value):
    assert main(["hub", "policy", "--max-epsilon", value, "--hub", str(bare_hub)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "max_epsilon must be a finite number > 0" in err
    assert not (bare_hub / POLICY_FILE).exists()


def test_policy_file_with_nan_or_typo_is_refused(model, bare_hub):
    (bare_hub / POLICY_FILE).write_text('{"max_epsilon": NaN}')
    with pytest.raises(ConfigError, match="finite numbers"):
        ops.publish(model, "acme/x", hub=str(bare_hub))
    (bare_hub / POLICY_FILE).write_text('{"max_epsilom": 50}')
    with pytest.raises(ConfigError, match="unknown policy key.s.: max_epsilom"):
        ops.publish(model, "acme/x", hub=str(bare_hub))


def _policy_cmd_in_thread(hub, argv_tail=()):
    """``dphub hub policy --hub HUB`` in a thread: a FIFO used to block it forever."""
    import threading

    result = {}
    t = threading.Thread(target=lambda: result.setdefault(
        "rc", main(["hub", "policy", "--hub", str(hub), *argv_tail])), daemon=True)
    t.start()
    t.join(30)
    return t, result


@pytest.mark.parametrize("kind", ["fifo", "device", "huge", "400 digits", "5000 digits"])
def test_policy_file_that_is_no_small_json_file_is_one_error_line(bare_hub, capsys, kind):
    """Issue 31 #13: a FIFO hung `hub policy`, a link to /dev/zero was read until MemoryError
    (the 64 kB cap was checked after reading), a 400-digit max_epsilon was an OverflowError."""
    import os

    path = bare_hub / POLICY_FILE
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":  # /dev/null, not /dev/zero: the old code would fill the memory
        os.symlink("/dev/null", path)
    elif kind == "huge":
        path.write_text('{"max_epsilon": 5' + " " * 70000 + "}")
    else:
        path.write_text('{"max_epsilon": ' + "9" * int(kind.split()[0]) + "}")
    t, result = _policy_cmd_in_thread(bare_hub)
    if t.is_alive():  # release the reader blocked on the FIFO, then fail
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("hub policy blocked on the policy file")
    assert result["rc"] == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and POLICY_FILE in err[0], err
    expected = {"fifo": "not a named pipe (FIFO)", "device": "not a device",
                "huge": "larger than 64 kB", "400 digits": "integer of 400 digits",
                "5000 digits": "not valid JSON"}[kind]
    assert expected in err[0]


def test_read_small_file_never_reads_past_its_cap(tmp_path):
    from dphub.io import read_small_file

    os_link = tmp_path / "zero"
    os_link.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="must be a regular file, not a device"):
        read_small_file(os_link, 10, what="x")
    (tmp_path / "ok").write_bytes(b"0123456789")
    assert read_small_file(tmp_path / "ok", 10, what="x") == b"0123456789"
    with pytest.raises(ConfigError, match="larger than 9 bytes"):
        read_small_file(tmp_path / "ok", 9, what="x")


def test_policy_before_the_first_publish(tmp_path):
    save_hub_policy(str(tmp_path / "new-hub"), Policy(max_epsilon=5))
    assert load_hub_policy(str(tmp_path / "new-hub")) == Policy(max_epsilon=5)
    with pytest.raises(ConfigError, match="cannot be created"):
        save_hub_policy(str(tmp_path / "typo" / "hub"), DEFAULT_POLICY)


def test_http_hub_policy_is_a_client_side_setting(weak, hub_env):
    from test_hub_hf import RecordingHfApi

    url = "https://hub.example.org"
    assert load_hub_policy(url) == DEFAULT_POLICY
    api = RecordingHfApi()
    with pytest.raises(PublishRefused, match="exceeds the policy's maximum 10"):
        ops.publish(weak, "acme/weak", hub=url, api=api)
    assert api.calls == []
    path = save_hub_policy(url + "/", Policy(max_epsilon=25))
    assert path.parent == hub_env["home"]
    assert load_hub_policy(url) == Policy(max_epsilon=25)
    ops.publish(weak, "acme/weak", hub=url, api=api)
    assert [c[0] for c in api.calls] == ["create_repo", "upload_folder"]


# --------------------------------------------------------------------------- pull


@pytest.fixture
def weak_on_hub(weak, hub_env):
    """ε ≈ 23.6 published to a hub whose owner allows ε ≤ 50."""
    save_hub_policy(str(hub_env["hub"]), Policy(max_epsilon=50, min_unit="sequence"))
    ops.publish(weak, "acme/weak")
    return "acme/weak"


def test_pull_applies_the_default_policy(weak_on_hub, hub_env, capsys):
    with pytest.raises(PullRefused, match=r"epsilon 23.6 exceeds --max-epsilon 10 \(the default "
                                          r"pull policy"):
        ops.pull(weak_on_hub)
    assert Registry().list() == []
    assert main(["pull", weak_on_hub]) == 2
    err = capsys.readouterr().err
    assert "exceeds --max-epsilon 10" in err and err.count("\n") == 1
    assert main(["pull", weak_on_hub, "--max-epsilon", "30"]) == 0


def test_pull_policy_from_dphub_toml(weak_on_hub, hub_env, capsys):
    (hub_env["tmp"] / "dphub.toml").write_text("[hub]\nmax_epsilon = 30\n", encoding="utf-8")
    assert main(["pull", weak_on_hub]) == 0, capsys.readouterr().err
    (hub_env["tmp"] / "dphub.toml").write_text('[hub]\nmax_epsilon = 30\nrequire_unit = "x"\n',
                                               encoding="utf-8")
    assert main(["pull", weak_on_hub]) == 2
    err = capsys.readouterr().err  # dphub.toml is checked against its schema when read
    assert "require_unit" in err and "patient, note, sequence" in err


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_pull_refuses_non_finite_max_epsilon(weak_on_hub, capsys, value):
    """Issue 16, fault 11: `pull --max-epsilon nan` accepted any model (the policy failed open)."""
    assert main(["pull", weak_on_hub, "--max-epsilon", value]) == 2
    err = capsys.readouterr().err  # refused while the options are parsed
    assert "--max-epsilon" in err and "not a finite number" in err
    assert Registry().list() == []


def test_search_refuses_nan_max_epsilon(weak_on_hub, capsys):
    assert main(["search", "--max-epsilon", "nan"]) == 2
    err = capsys.readouterr().err
    assert "--max-epsilon" in err and "not a finite number" in err


def test_pull_unit_override(model, hub_env):
    write_card(model, card_meta(unit="note"))
    ops.publish(model, "acme/note")
    with pytest.raises(PullRefused, match="privacy unit note is weaker than the required patient"):
        ops.pull("acme/note")
    assert ops.pull("acme/note", require_unit="note").unit == "note"
