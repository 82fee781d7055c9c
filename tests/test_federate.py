"""Federated DP training (issue 27): one accountant per site over all rounds, the federated card's
guarantee recomputed per site, Flower's simulation engine end to end, a dropped site.

Tiny synthetic sites (Faker notes, disjoint patients) on the tiny random base: seconds of
training; most of the time is Ray starting Flower's simulation engine (two runs here)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from federate_fixtures import OPTIONS, one_thread  # noqa: F401 (an autouse fixture)

from dphub import card, formats, synth
from dphub.cli.main import main as cli_main
from dphub.federate.server import FederationConfig, FederationServer
from dphub.federate.site import STATE_FILE, RoundOrder, Site, SiteAccounts, SiteState
from dphub.hub.validate import validate_card
from dphub.privacy import accounting
from dphub.privacy.federation import federation_problems, site_epsilon

pytestmark = pytest.mark.filterwarnings("ignore")

ROUNDS, LOCAL = 2, 3


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three sites of unequal size, disjoint patients."""
    root = tmp_path_factory.mktemp("sites")
    out = []
    for i, (n, seed) in enumerate([(12, 1), (8, 2), (6, 3)]):
        notes = synth.generate(n, kind="nursing", seed=seed, patients=max(2, n // 3))
        for note in notes:
            note.patient_id = f"site{i}-{note.patient_id}"
        path = root / f"site-{i}.jsonl"
        formats.write(notes, path, "jsonl")
        out.append(path)
    return out


def _options(base: Path) -> dict:
    return {**OPTIONS, "base_model": str(base)}


def _order(rnd: int, digest: str, rounds: int = ROUNDS) -> RoundOrder:
    return RoundOrder(round=rnd, rounds=rounds, local_steps=LOCAL, target_epsilon=8.0,
                      frozen_digest=digest)


def _plan(path: Path) -> SiteState:
    """The one federation's plan of a site's state file."""
    acc = SiteAccounts.load(path)
    assert acc is not None
    [st] = acc.plans.values()
    return st


# ------------------------------------------------------------------ the site, without Flower


def test_site_accountant_spans_rounds_and_restarts(sites: list[Path], tiny_base_model: Path,
                                                   tmp_path: Path) -> None:
    """One accountant over all rounds, persisted: a restarted site continues it, and a site never
    takes a step past its budget (rounds x local steps at the target ε)."""
    state = tmp_path / "site"
    site = Site(sites[0], state, _options(tiny_base_model))
    weights = {n: p.detach().clone() for n, p in site.model.named_parameters()
               if p.requires_grad}
    w1, rep1 = site.train_round(_order(1, site.frozen_digest), weights)
    assert w1 is not None and rep1["steps"] == LOCAL and rep1["trained"] == LOCAL
    # a restarted site (new process): the accountant comes back from the state file
    again = Site(sites[0], state, _options(tiny_base_model))
    w2, rep2 = again.train_round(_order(2, again.frozen_digest), w1)
    assert rep2["steps"] == 2 * LOCAL  # the sum of its local steps over both rounds
    st = _plan(state / STATE_FILE)
    assert st is not None and st.steps == 2 * LOCAL and st.rounds == [1, 2]
    assert rep2["epsilon"] == pytest.approx(
        accounting.epsilon_for("rdp", st.sample_rate, st.noise_multiplier, 2 * LOCAL, st.delta),
        rel=1e-9)
    # the budget was planned for 2 rounds: it is spent, a third round trains nothing
    assert rep2["epsilon"] <= 8.0 * (1 + accounting.CLAIM_RTOL) and rep2["budget_spent"]
    w3, rep3 = again.train_round(_order(3, again.frozen_digest), w2)
    assert w3 is None and rep3["trained"] == 0 and rep3["steps"] == 2 * LOCAL
    assert (state / STATE_FILE).stat().st_mode & 0o077 == 0  # no one else reads it


def test_site_refuses_another_base(sites: list[Path], tiny_base_model: Path,
                                   tmp_path: Path) -> None:
    site = Site(sites[1], tmp_path / "s", _options(tiny_base_model))
    with pytest.raises(Exception, match="public base differs"):
        site.train_round(_order(1, "0" * 64), {})
    assert not (tmp_path / "s" / STATE_FILE).exists()  # nothing spent


def test_site_state_of_other_data_is_refused(sites: list[Path], tiny_base_model: Path,
                                             tmp_path: Path) -> None:
    state = tmp_path / "s"
    site = Site(sites[1], state, _options(tiny_base_model))
    site.state(_order(1, site.frozen_digest))
    other = Site(sites[2], state, _options(tiny_base_model))
    with pytest.raises(Exception, match="other data"):
        other.train_round(_order(1, other.frozen_digest), {})


# ------------------------------------------------------------------ the card's federation block


def _fed_meta(sites: list[Path], base: Path, tmp_path: Path) -> dict:
    """A federated card built by the server from real site reports (no Flower)."""
    cfg = FederationConfig(out=tmp_path / "m", options=_options(base), rounds=ROUNDS,
                           local_steps=LOCAL)
    server = FederationServer(cfg)
    for rnd in (1, 2):
        replies = []
        for i, path in enumerate(sites):
            s = Site(path, tmp_path / f"site-{i}", _options(base))
            replies.append(s.train_round(_order(rnd, server.frozen_digest), server.weights))
        assert server.aggregate(rnd, replies) == len(sites)
    return server.write()


def test_federated_card_recomputes_every_site(sites: list[Path], tiny_base_model: Path,
                                              tmp_path: Path) -> None:
    meta = _fed_meta(sites, tiny_base_model, tmp_path)
    validate_card(tmp_path / "m")  # schema, accounting, files: an ordinary model dir
    dp = meta["differential_privacy"]
    fed = dp["federation"]
    assert fed["sites"] == "2-4" and fed["rounds"] == ROUNDS and fed["local_steps"] == LOCAL
    assert all(s["steps"] == ROUNDS * LOCAL for s in fed["site_accounting"])
    assert dp["epsilon"] == pytest.approx(max(site_epsilon(s) for s in fed["site_accounting"]))
    assert federation_problems(dp) == []
    # every way a card can under-claim is refused
    cases = {
        "a site's epsilon lowered": lambda f: f["site_accounting"][0].update(epsilon=0.5),
        "steps beyond rounds x local": lambda f: f["site_accounting"][0].update(
            steps=ROUNDS * LOCAL + 1),
        "more noise claimed": lambda f: f["site_accounting"][-1].update(noise_multiplier=50.0),
        "range edited": lambda f: f.update(epsilon_range=[0.1, 0.2]),
        "sequential composition": lambda f: f.update(composition="basic"),
    }
    for what, edit in cases.items():
        bad = copy.deepcopy(dp)
        edit(bad["federation"])
        assert federation_problems(bad), what
    low = copy.deepcopy(meta)
    low["differential_privacy"]["federation"]["site_accounting"][-1].update(
        steps=ROUNDS * LOCAL, noise_multiplier=0.5)  # the worst site spent more than the claim
    assert card.meta_problems(low)  # the hook in card.meta_problems: validate and the gate


def test_killed_server_resumes_from_its_last_round(sites: list[Path], tiny_base_model: Path,
                                                   tmp_path: Path) -> None:
    cfg = FederationConfig(out=tmp_path / "m", options=_options(tiny_base_model), rounds=ROUNDS,
                           local_steps=LOCAL, state_dir=tmp_path / "server")
    server = FederationServer(cfg)
    site = Site(sites[2], tmp_path / "site", _options(tiny_base_model))
    server.aggregate(1, [site.train_round(_order(1, server.frozen_digest), server.weights)])
    again = FederationServer(cfg)  # a new process after a kill
    assert again.round == 1 and set(again.sites) == set(server.sites)
    assert all(torch.equal(again.weights[k], v) for k, v in server.weights.items())
    other = FederationConfig(out=tmp_path / "m", options=_options(tiny_base_model),
                             rounds=ROUNDS + 1, local_steps=LOCAL, state_dir=tmp_path / "server")
    with pytest.raises(Exception, match="another federation"):
        FederationServer(other)


# ------------------------------------------------------------------ Flower, end to end


def _cli_options(base: Path) -> list[str]:
    return ["--base-model", str(base), "--warm-start", "none", "--accountant", "rdp",
            "--batch-size", "2", "--lr", "0.01", "--max-length", "48", "--stride", "8",
            "--no-rule-features", "--rounds", str(ROUNDS), "--local-steps", str(LOCAL)]


@pytest.mark.slow
def test_simulate_three_sites_two_rounds_one_drops(sites: list[Path], tiny_base_model: Path,
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture) -> None:
    """3 sites x 2 rounds on Flower's simulation engine, site 2 failing in round 2 (one engine
    start for both checks: Ray's start dominates the time): the run goes on, and the result is
    an ordinary model directory whose card recomputes every site."""
    pytest.importorskip("flwr")  # before dphub.federate.apps, which imports Flower
    from dphub.federate import apps

    monkeypatch.setenv(apps.DROP_ENV, "2:2")  # site 2 drops out from round 2 on
    rc = cli_main(["federate", "simulate", *map(str, sites), "--out", str(tmp_path / "m"),
                   "--target-epsilon", "8", "--state-dir", str(tmp_path / "state"),
                   "--cpus", "2", *_cli_options(tiny_base_model)])
    assert rc == 0
    assert "per-site epsilon" in capsys.readouterr().out
    assert cli_main(["card", "validate", str(tmp_path / "m")]) == 0
    meta = card.load_card(tmp_path / "m").meta
    fed = meta["differential_privacy"]["federation"]
    assert fed["flwr_version"] == "1.42.0" and fed["rounds"] == ROUNDS
    # every site's accountant spans the rounds it took part in: its steps are the sum of its
    # local steps and its ε the recomputation for all of them (a per-round accountant would
    # record LOCAL for every site)
    for i, rounds in enumerate([[1, 2], [1, 2], [1]]):
        st = _plan(tmp_path / "state" / f"site-{i}" / STATE_FILE)
        assert st is not None and st.steps == LOCAL * len(rounds) and st.rounds == rounds
    assert sorted(r["steps"] for r in fed["site_accounting"]) == [LOCAL, 2 * LOCAL, 2 * LOCAL]
    for row in fed["site_accounting"]:
        assert row["epsilon"] == pytest.approx(site_epsilon(row), rel=1e-6)
        if row["steps"] == 2 * LOCAL:
            one_round = accounting.epsilon_for("rdp", row["sample_rate"],
                                               row["noise_multiplier"], LOCAL, row["delta"])
            assert row["epsilon"] > one_round * 1.05
    cfg = json.loads((tmp_path / "m" / "training_config.json").read_text())
    assert cfg["steps"] == ROUNDS * LOCAL  # the worst site's accounting
    # the server never saw a note: nothing of the notes' text is in what it kept
    server_state = (tmp_path / "state" / "server" / "server_state.json").read_text()
    first = json.loads(sites[0].read_text().splitlines()[0])["text"].split()[:3]
    assert " ".join(first) not in server_state


def test_cli_without_flower_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                    capsys: pytest.CaptureFixture) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "flwr" else real(name, *a))
    rc = cli_main(["federate", "simulate", str(tmp_path / "a.jsonl"), "--out",
                   str(tmp_path / "m")])
    assert rc == 2
    assert "pip install 'dphub[federate]'" in capsys.readouterr().err


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_deployment_superlink_and_three_sites_as_processes(sites: list[Path],
                                                           tiny_base_model: Path,
                                                           tmp_path: Path) -> None:
    """Flower's deployment on localhost as docs/federated.md runs it: `dphub federate
    superlink` (TLS, node keys, the gate), three `dphub federate join` sites whose keys the
    operator registered, and `flwr run` of the app directory `dphub federate serve
    --server-dir` writes, all separate processes; the server's ServerApp (dphub's installed
    one) writes the same kind of model directory. Each round's ClientApp is a fresh process
    there, so the sites' accountants can only span the rounds through their state files."""
    pytest.importorskip("flwr")
    import subprocess
    import sys
    import time

    from test_federate_site import _procs, start_superlink

    from dphub.federate.deploy import ensure_node_key, node_key_id
    from dphub.federate.site import init_state

    bindir = Path(sys.executable).parent
    out = tmp_path / "m"
    opts = _cli_options(tiny_base_model)
    ca = str(tmp_path / "ca.crt")
    with _procs(tmp_path) as procs:
        server, server_dir = start_superlink(procs, tmp_path)
        assert cli_main(["federate", "serve", "--app-dir", str(tmp_path / "app"), "--out",
                         str(out), "--min-sites", "3", "--control", server,
                         "--root-certificates", ca, "--server-dir", str(server_dir),
                         "--state-dir", str(tmp_path / "server-state"), *opts]) == 0
        run_env = {**procs.env, "FLWR_HOME": str(tmp_path / "app" / "flwr-home")}
        for i, data in enumerate(sites):
            # the site's key (as `join` makes it), registered by the operator, then `join`
            key, _ = ensure_node_key(tmp_path / f"site-{i}")
            init_state(tmp_path / f"site-{i}", node_key_id(key), data)  # as join does
            r = subprocess.run([str(bindir / "flwr"), "supernode", "register",
                                str(key.with_suffix(".pub")), "dphub"], env=run_env,
                               capture_output=True, text=True, timeout=120)
            assert "registered successfully" in r.stdout, r.stdout + r.stderr
            procs.start([str(bindir / "dphub"), "federate", "join", str(data), "--server",
                         server, "--state", str(tmp_path / f"site-{i}"), "--port",
                         str(_free_port()), "--root-certificates", ca, "--federation",
                         str(tmp_path / "app" / "federation.json")], f"site-{i}.log")
        r = subprocess.run([str(bindir / "flwr"), "run", str(tmp_path / "app"), "dphub"],
                           env=run_env, capture_output=True, text=True, timeout=120)
        assert "Successfully started run" in r.stdout, r.stdout[-500:] + r.stderr[-500:]
        deadline = time.monotonic() + 480
        while not (out / "README.md").exists() and time.monotonic() < deadline:
            time.sleep(2)
        assert (out / "README.md").exists(), procs.log("superlink.log")[-3000:]
    validate_card(out)
    fed = card.load_card(out).meta["differential_privacy"]["federation"]
    assert [r["steps"] for r in fed["site_accounting"]] == [ROUNDS * LOCAL] * 3
    for i in range(3):
        st = _plan(tmp_path / f"site-{i}" / STATE_FILE)
        assert st is not None and st.steps == ROUNDS * LOCAL and st.rounds == [1, 2]
