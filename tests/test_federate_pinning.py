"""What a site agrees to (issue 53): a run pinned whole (bundle AND federation settings), δ capped
by the default policy, absurd orders refused before any plan, one plan per federation with the
site's ε composed over all of them, a lost or rolled-back accountant refused, a lock that a
deleted file does not open.

Sites are driven in process (``Site`` and the ClientApp function with Flower's own Message and
Context objects): no Flower process is started here."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from federate_fixtures import OPTIONS, one_thread  # noqa: F401 (an autouse fixture)

from dphub import formats, synth
from dphub.cli.main import main as cli_main
from dphub.errors import ConfigError
from dphub.federate.site import (
    NODE_KEY,
    STATE_FILE,
    PolicyRefused,
    RoundOrder,
    Site,
    SiteAccounts,
    SitePolicy,
    init_state,
    recipe_frozen_digest,
)
from dphub.federate.terms import (
    MAX_PLANNED_STEPS,
    FederationRefused,
    FederationTerms,
)
from dphub.privacy import accounting

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def notes_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    notes = synth.generate(8, kind="nursing", seed=7, patients=3)
    path = tmp_path_factory.mktemp("pin") / "notes.jsonl"
    formats.write(notes, path, "jsonl")
    return path


@pytest.fixture(scope="module")
def opts(tiny_base_model: Path) -> dict[str, Any]:
    return {**OPTIONS, "base_model": str(tiny_base_model)}


@pytest.fixture(scope="module")
def terms(opts: dict[str, Any]) -> FederationTerms:
    return FederationTerms(rounds=2, local_steps=2, target_epsilon=4.0, aggregation="mean",
                           options=opts, frozen_digest=recipe_frozen_digest(opts))


def _weights(site: Site) -> dict:
    return {n: p.detach().clone() for n, p in site.model.named_parameters() if p.requires_grad}


def _order(t: FederationTerms, rnd: int = 1, **change: Any) -> RoundOrder:
    values = dict(round=rnd, rounds=t.rounds, local_steps=t.local_steps,
                  target_epsilon=t.target_epsilon, frozen_digest=t.frozen_digest)
    return RoundOrder(**{**values, **change})


def _accounts(state: Path) -> SiteAccounts:
    acc = SiteAccounts.load(state / STATE_FILE)
    assert acc is not None
    return acc


# ------------------------------------------------------------------ the ClientApp, in process


def _run_config(t: FederationTerms, **change: Any) -> dict[str, str]:
    """The run config `serve` writes (a FederationConfig's JSON), with ``change`` applied."""
    fed = {"out": "/srv/m", "state_dir": "/srv/m.federation", "min_sites": 2,
           "round_timeout": 3600.0, "force": False, "rounds": t.rounds,
           "local_steps": t.local_steps, "target_epsilon": t.target_epsilon,
           "aggregation": t.aggregation, "options": dict(t.options)}
    for k, v in change.items():
        if k.startswith("options."):
            fed["options"][k.split(".", 1)[1]] = v
        else:
            fed[k] = v
    return {"federation": json.dumps(fed, sort_keys=True)}


def _message(t: FederationTerms, arrays: dict | None = None, **order: Any) -> Any:
    from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

    cfg = {"round": 1, "rounds": t.rounds, "local_steps": t.local_steps,
           "target_epsilon": t.target_epsilon, "frozen_digest": t.frozen_digest,
           "options": json.dumps(t.options, sort_keys=True), **order}
    content = RecordDict({"config": ConfigRecord(cfg)})
    if arrays is not None:
        content["arrays"] = ArrayRecord(arrays)
    msg = Message(content, dst_node_id=1, message_type=MessageType.TRAIN)
    msg.metadata.__dict__["_message_id"] = msg.object_id
    return msg


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - the apps module, reset after
    pytest.importorskip("flwr")
    from flwr.supercore.task_identity import TaskIdentity

    from dphub.federate import apps

    for name in ("_run_id", "_node_id", "_task_id"):  # as inside a Flower task
        monkeypatch.setattr(TaskIdentity, name, 1, raising=False)
    yield apps
    apps._LOCAL.clear()
    apps._SITES.clear()


def _train(apps: Any, msg: Any, run_config: dict[str, str]) -> Any:
    from flwr.app import Context, RecordDict

    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                  run_config=run_config)
    return apps.site_train(msg, ctx)


def _category(reply: Any) -> str | None:
    return reply.error.reason.split(":", 1)[0] if reply.has_error() else None


@pytest.mark.parametrize("change", [
    {"rounds": 50}, {"local_steps": 9}, {"target_epsilon": 40.0},
    {"options.delta": 1e-6}, {"options.privacy_unit": "note"},
    {"options.base_model": "sentence-transformers/all-MiniLM-L6-v2"},
    {"options.noise": 0.6}, {"options.lr": 0.5}, {"aggregation": "median"},
])
def test_a_run_config_of_another_federation_is_refused_before_a_step(
        change: dict, client: Any, terms: FederationTerms, notes_file: Path,
        tmp_path: Path) -> None:
    """The finding: `flwr run --run-config` with another federation block keeps the bundle's
    hash. A pinned site compares the run config itself: any setting it agreed to that differs
    (rounds, local steps, ε, δ, unit, base, σ, recipe, aggregation) is refused with the
    category `federation`; nothing is built and the accountant is never created."""
    state = tmp_path / "st"
    client.use_local_site(notes_file, state, SitePolicy(max_epsilon=50), terms=terms)
    reply = _train(client, _message(terms), _run_config(terms, **change))
    assert _category(reply) == "federation"
    assert reply.error.reason == client.SITE_ERRORS["federation"]
    assert client._error_category(reply) == "refused: federation"  # what the server logs
    assert not (state / STATE_FILE).exists() and not client._SITES


@pytest.mark.parametrize("order", [
    {"rounds": 50}, {"local_steps": 9}, {"target_epsilon": 40.0}, {"frozen_digest": "0" * 64},
    {"options": json.dumps({**OPTIONS, "delta": 1e-6})},
])
def test_an_order_of_another_federation_is_refused_under_the_agreed_run_config(
        order: dict, client: Any, terms: FederationTerms, notes_file: Path,
        tmp_path: Path) -> None:
    """The order itself is compared too (a run config that matches is not enough: the order
    is what the site would act on)."""
    state = tmp_path / "st"
    client.use_local_site(notes_file, state, SitePolicy(max_epsilon=50), terms=terms)
    reply = _train(client, _message(terms, **order), _run_config(terms))
    assert _category(reply) == "federation"
    assert not (state / STATE_FILE).exists() and not client._SITES


def test_the_agreed_run_trains_and_a_stranger_run_then_spends_nothing(
        client: Any, terms: FederationTerms, notes_file: Path, opts: dict,
        tmp_path: Path) -> None:
    state = tmp_path / "st"
    client.use_local_site(notes_file, state, SitePolicy(), terms=terms)
    from dphub.federate.site import options_for, prepare_model, trainable_state

    _, model = prepare_model(options_for(opts, data=notes_file, out=tmp_path / "x"))
    reply = _train(client, _message(terms, arrays=trainable_state(model)), _run_config(terms))
    assert not reply.has_error()
    assert reply.content.config_records["report"]["trained"] == terms.local_steps
    before = (state / STATE_FILE).read_bytes()
    [plan] = _accounts(state).plans
    assert plan == terms.federation_id()  # the plan is the federation's
    for change in ({"rounds": 2000}, {"target_epsilon": 8.0}, {"options.delta": 1e-5}):
        reply = _train(client, _message(terms, arrays=trainable_state(model), round=2),
                       _run_config(terms, **change))
        assert _category(reply) == "federation"
        assert (state / STATE_FILE).read_bytes() == before


def test_run_config_without_a_federation_block_is_refused(terms: FederationTerms) -> None:
    for cfg in ({}, None, {"federation": "not json"}, {"federation": "[1]"},
                {"out": "x"}):
        with pytest.raises(FederationRefused, match="no dphub federation block"):
            terms.check_run_config(cfg)
    bad = json.loads(_run_config(terms)["federation"])
    for value in (True, float("nan"), "4.0"):  # ε as a bool, NaN, a string: never equal
        bad["target_epsilon"] = value
        with pytest.raises(FederationRefused, match="target_epsilon"):
            terms.check_run_config({"federation": json.dumps(bad)})


# ------------------------------------------------------------------ the Site itself


def test_a_pinned_site_refuses_another_federation_before_the_lock(
        terms: FederationTerms, notes_file: Path, opts: dict, tmp_path: Path) -> None:
    state = tmp_path / "st"
    site = Site(notes_file, state, opts, terms=terms)
    w, rep = site.train_round(_order(terms), _weights(site))
    assert rep["trained"] == terms.local_steps
    before = (state / STATE_FILE).read_bytes()
    for change in ({"rounds": 3}, {"local_steps": 1}, {"target_epsilon": 3.0},
                   {"frozen_digest": "1" * 64}):
        with pytest.raises(FederationRefused, match="not the federation"):
            site.train_round(_order(terms, 2, **change), w)
        assert (state / STATE_FILE).read_bytes() == before
    # a recipe that is not the agreed one: refused before anything is built
    with pytest.raises(FederationRefused, match=r"options\.delta"):
        Site(notes_file, state, {**opts, "delta": 1e-6}, terms=terms)


def test_default_policy_caps_delta(notes_file: Path, opts: dict, tmp_path: Path) -> None:
    """The finding: a server asking δ = 0.01 got σ 0.68 under the default policy. The default
    cap is min(1e-5, 1/(10 N)), as documented: a larger δ is refused before any state."""
    for delta in (0.01, 1e-3, 2e-5, 1.0000001e-5):
        with pytest.raises(PolicyRefused, match="delta"):
            Site(notes_file, tmp_path / f"d{delta}", {**opts, "delta": delta})
        assert not (tmp_path / f"d{delta}" / STATE_FILE).exists()
    # the cap itself: 1/(10 N) below 1e-5 for N > 10,000 (on the 1-2-5 grid, rounded down)
    assert SitePolicy().delta_cap(3) == 1e-5
    assert SitePolicy().delta_cap(20_000) == 5e-6
    assert SitePolicy().delta_cap(30_000) <= 1 / (10 * 30_000)
    assert SitePolicy(delta=1e-3).delta_cap(30_000) == 1e-3  # the site's own choice
    # within the cap: trained at that δ; none asked: at the default
    for asked, want in ((1e-6, 1e-6), (None, 1e-5)):
        extra = {} if asked is None else {"delta": asked}
        site = Site(notes_file, tmp_path / f"ok{asked}", {**opts, **extra})
        st = site.state(RoundOrder(1, 2, 2, 4.0, site.frozen_digest))
        assert st is not None and st.delta == want


def test_a_restored_plan_above_the_default_cap_is_refused(notes_file: Path, opts: dict,
                                                          tmp_path: Path) -> None:
    """A plan written under an older dphub (no default cap) is held to the cap every round."""
    state = tmp_path / "st"
    site = Site(notes_file, state, opts)
    order = RoundOrder(1, 2, 2, 4.0, site.frozen_digest)
    site.state(order)
    acc = _accounts(state)
    [st] = acc.plans.values()
    st.delta = 0.01
    acc.save(state / STATE_FILE)
    with pytest.raises(PolicyRefused, match="delta"):
        site.train_round(order, _weights(site))
    assert _accounts(state).plans[st.federation].steps == 0


@pytest.mark.parametrize("cfg", [
    {"local_steps": 10**7}, {"rounds": 10**6}, {"rounds": 0}, {"local_steps": -1},
    {"rounds": 200, "local_steps": 200}, {"target_epsilon": float("nan")},
    {"target_epsilon": float("inf")}, {"target_epsilon": -1.0}, {"target_epsilon": 0.0},
    {"rounds": float("nan")}, {"rounds": 2.5}, {"round": 0}, {"rounds": True},
])
def test_absurd_orders_are_refused_before_any_plan(cfg: dict, client: Any, notes_file: Path,
                                                   terms: FederationTerms,
                                                   tmp_path: Path) -> None:
    """The finding: `local_steps = 10**7` hung a site, `rounds = 10**6` planned σ 213. An
    order above the caps (or not a number) gets the category `policy` (malformed: `policy`
    too) before any Site is built or any plan saved; unpinned too (simulate's sites)."""
    state = tmp_path / "st"
    client.use_local_site(notes_file, state, SitePolicy())  # no terms: the caps still hold
    reply = _train(client, _message(terms, **cfg), {})
    assert _category(reply) == "policy", reply.error.reason if reply.has_error() else None
    assert not (state / STATE_FILE).exists() and not client._SITES


def test_caps_and_the_noise_bound(notes_file: Path, opts: dict, tmp_path: Path) -> None:
    with pytest.raises(PolicyRefused, match=str(MAX_PLANNED_STEPS)):
        RoundOrder(1, 101, 100, 4.0, "0" * 64)
    RoundOrder(1, 100, 100, 4.0, "0" * 64)  # exactly the cap: accepted
    with pytest.raises(ConfigError, match="rounds"):
        FederationTerms(rounds=10**6, local_steps=1, target_epsilon=8.0, aggregation="mean",
                        options={}, frozen_digest="0" * 64)
    # an order within the caps whose σ would drown the update: refused, nothing saved
    site = Site(notes_file, tmp_path / "st", opts, SitePolicy(max_epsilon=8))
    with pytest.raises(PolicyRefused, match="noise"):
        site.train_round(RoundOrder(1, 100, 100, 0.05, site.frozen_digest), _weights(site))
    assert not (tmp_path / "st" / STATE_FILE).exists()


# ------------------------------------------------------------------ one plan per federation


def test_a_plan_belongs_to_one_federation_and_the_site_composes_them(
        notes_file: Path, opts: dict, tmp_path: Path) -> None:
    """The finding: the first order froze the plan for every later federation. Now each
    federation has its own plan (its own σ for its own rounds x steps), and the site's ε over
    all of them is one accountant's composition, bounded by its policy: a second federation
    adds, it never restarts, and one that would take the total past the policy is refused."""
    state = tmp_path / "st"
    site = Site(notes_file, state, opts, SitePolicy(max_epsilon=5.0))
    w = _weights(site)
    first = RoundOrder(1, 2, 2, 3.0, site.frozen_digest)
    w, rep1 = site.train_round(first, w)
    acc = _accounts(state)
    [fid1] = acc.plans
    sigma1 = acc.plans[fid1].noise_multiplier
    # another federation (other rounds): its own plan, planned for ITS steps
    second = RoundOrder(1, 3, 2, 3.0, site.frozen_digest)
    w, rep2 = site.train_round(second, w)
    acc = _accounts(state)
    assert len(acc.plans) == 2 and fid1 in acc.plans
    fid2 = next(k for k in acc.plans if k != fid1)
    st2 = acc.plans[fid2]
    assert acc.plans[fid1].noise_multiplier == sigma1 and acc.plans[fid1].steps == 2
    assert st2.noise_multiplier > sigma1 and st2.planned_steps == 6 and st2.steps == 2
    assert rep2["steps"] == 2 and rep2["noise_multiplier"] == st2.noise_multiplier
    # the site's ε is the composition of both, at its δ, and within the policy
    total = acc.total_epsilon(st2.delta)
    both = accounting.epsilon_for("rdp", acc.plans[fid1].sample_rate, sigma1, 2, st2.delta)
    assert total > both and total <= 5.0 * (1 + accounting.CLAIM_RTOL)
    # a third federation (ε 4.9 alone) that would take the total past 5: refused, no change
    before = (state / STATE_FILE).read_bytes()
    with pytest.raises(PolicyRefused, match="over all its federations"):
        site.train_round(RoundOrder(1, 1, 2, 4.9, site.frozen_digest), w)
    assert (state / STATE_FILE).read_bytes() == before
    # the first federation continues its own plan, not the second's
    _, rep = site.train_round(RoundOrder(2, 2, 2, 3.0, site.frozen_digest), w)
    assert rep["noise_multiplier"] == sigma1 and rep["steps"] == 4


def test_the_site_budget_stops_a_federation_that_would_pass_it(
        notes_file: Path, opts: dict, tmp_path: Path) -> None:
    """Each round too: a federation trains only the steps that keep the site's total within its
    policy (a plan is checked against what was spent when it was made; the other federation
    may spend more after)."""
    state = tmp_path / "st"
    site = Site(notes_file, state, opts, SitePolicy(max_epsilon=5.0))
    w = _weights(site)
    w, _ = site.train_round(RoundOrder(1, 2, 2, 4.0, site.frozen_digest), w)  # A: 2 of 4
    for rnd in (1, 2, 3):  # B: all its 6 steps (planned against A's 2 spent: 4.85 <= 5)
        w, rep = site.train_round(RoundOrder(rnd, 3, 2, 4.0, site.frozen_digest), w)
        assert rep["trained"] == 2
    acc = _accounts(state)
    cap = SitePolicy().delta_cap(acc.num_units or 1)
    a, b = (acc.plans[k] for k in sorted(acc.plans, key=lambda k: acc.plans[k].planned_steps))
    assert acc.total_epsilon(cap, a, 4) > 5.0  # A's own plan would take the site past 5
    _, rep = site.train_round(RoundOrder(2, 2, 2, 4.0, site.frozen_digest), w)
    acc = _accounts(state)
    assert rep["trained"] < 2 and acc.total_epsilon(cap) <= 5.0 * (1 + accounting.CLAIM_RTOL)
    assert rep["budget_spent"] and acc.plans[a.federation].steps == 2 + rep["trained"]


# ------------------------------------------------------------------ a lost or rolled-back state


def test_a_key_without_its_state_is_a_lost_accountant(notes_file: Path, opts: dict,
                                                      tmp_path: Path) -> None:
    """The finding: deleting the state file (keeping the key) started a fresh accountant under
    the same id. Refused, with the fix in one line; with the state restored it continues."""
    pytest.importorskip("flwr")
    from dphub.federate.deploy import ensure_node_key, node_key_id

    state = tmp_path / "st"
    state.mkdir()
    key, _ = ensure_node_key(state)
    sid = node_key_id(key)
    init_state(state, sid, notes_file)
    site = Site(notes_file, state, opts, site_id=sid)
    order = RoundOrder(1, 2, 2, 4.0, site.frozen_digest)
    w, _ = site.train_round(order, _weights(site))
    saved = (state / STATE_FILE).read_bytes()
    (state / STATE_FILE).unlink()
    with pytest.raises(ConfigError, match="node key but not its accountant") as e:
        site.train_round(RoundOrder(2, 2, 2, 4.0, site.frozen_digest), w)
    assert "new --state" in e.value.message and "\n" not in e.value.message
    assert not (state / STATE_FILE).exists()
    (state / STATE_FILE).write_bytes(saved)
    _, rep = site.train_round(RoundOrder(2, 2, 2, 4.0, site.frozen_digest), w)
    assert rep["steps"] == 4


def test_a_state_file_replaced_by_an_older_copy_is_refused(notes_file: Path, opts: dict,
                                                           tmp_path: Path) -> None:
    """The site's privacy ledger (outside the state directory) records each federation's
    steps: a state file older than it (a restored backup) would forget spent steps."""
    state = tmp_path / "st"
    site = Site(notes_file, state, opts)
    w, _ = site.train_round(RoundOrder(1, 2, 2, 4.0, site.frozen_digest), _weights(site))
    old = tmp_path / "backup.json"
    shutil.copy(state / STATE_FILE, old)
    w, _ = site.train_round(RoundOrder(2, 2, 2, 4.0, site.frozen_digest), w)
    newest = (state / STATE_FILE).read_bytes()
    shutil.copy(old, state / STATE_FILE)
    with pytest.raises(ConfigError, match="older than this site's privacy ledger"):
        site.train_round(RoundOrder(3, 2, 2, 4.0, site.frozen_digest), w)
    # and a state file that lost a whole federation (the older copy of a two-federation site)
    (state / STATE_FILE).write_bytes(newest)
    acc = _accounts(state)
    acc.plans.clear()
    acc.save(state / STATE_FILE)
    with pytest.raises(ConfigError, match="older than this site's privacy ledger"):
        site.train_round(RoundOrder(3, 2, 2, 4.0, site.frozen_digest), w)


def test_a_format_1_state_counts_in_the_composition(notes_file: Path, opts: dict,
                                                    tmp_path: Path) -> None:
    """A state file of dphub before issue 53 (one plan, its federation unknown) is never
    continued, and never forgotten: its steps count in the site's total."""
    state = tmp_path / "st"
    state.mkdir()
    site = Site(notes_file, state, opts, SitePolicy(max_epsilon=8.0))
    from dphub.io import file_sha256

    n = len(site.dataset)
    old = {"format": 1, "site_id": "ab" * 8, "data_sha256": file_sha256(notes_file),
           "accountant": "rdp", "sample_rate": 1.0, "noise_multiplier": 1.0, "delta": 1e-5,
           "target_epsilon": 8.0, "num_units": n, "history": [[1.0, 1.0, 8]], "rounds": [1]}
    (state / STATE_FILE).write_text(json.dumps(old))
    spent = accounting.epsilon_for("rdp", 1.0, 1.0, 8, 1e-5)
    assert spent > 4  # so a federation asking ε 4 more would pass the policy's 8
    with pytest.raises(PolicyRefused, match="over all its federations"):
        site.train_round(RoundOrder(1, 2, 2, 4.0, site.frozen_digest), _weights(site))
    assert json.loads((state / STATE_FILE).read_text())["format"] == 1  # untouched


# ------------------------------------------------------------------ one process per state dir


def test_a_deleted_lock_file_does_not_let_a_second_process_in(notes_file: Path, opts: dict,
                                                              tmp_path: Path) -> None:
    """The finding: deleting STATE/.lock let a second process lock a new one. The lock is
    now on the directory itself: nothing inside it to delete."""
    import subprocess
    import sys

    state = tmp_path / "st"
    state.mkdir()
    code = ("import sys, time; from dphub.federate.site import hold_state_dir; "
            "hold_state_dir(sys.argv[1]); print('held', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(state)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for f in state.iterdir():  # whatever lock file there is: gone
            if f.name.startswith("."):
                f.unlink()
        with pytest.raises(ConfigError, match="in use by another dphub process"):
            Site(notes_file, state, opts)
    finally:
        holder.kill()
        holder.wait()
    Site(notes_file, state, opts)  # a killed holder releases it


# ------------------------------------------------------------------ join: the agreement


def _write_terms(path: Path, **change: Any) -> Path:
    values = dict(rounds=2, local_steps=2, target_epsilon=4.0, aggregation="mean",
                  options={"warm_start": "none", "accountant": "rdp"},
                  frozen_digest="a" * 64, server_ca_sha256=None)
    FederationTerms(**{**values, **change}).write(path)
    return path


def test_join_checks_the_federation_before_any_work(notes_file: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("flwr")
    from dphub.io import file_sha256

    ca = tmp_path / "ca.crt"
    ca.write_text("ca")
    other = tmp_path / "other.crt"
    other.write_text("other")
    ok = _write_terms(tmp_path / "ok.json")
    base = ["federate", "join", str(notes_file), "--state", str(tmp_path / "st"), "--server",
            "127.0.0.1:8000"]
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"format": 1, "rounds": 2}')
    nan = tmp_path / "nan.json"
    nan.write_text(json.dumps({**json.loads(ok.read_text()), "target_epsilon": math.inf}))
    cases = [
        (["--insecure"], "--federation"),  # required
        (["--insecure", "--federation", str(tmp_path / "none.json")], "cannot read"),
        (["--insecure", "--federation", str(bad_json)], "other settings"),
        (["--insecure", "--federation", str(nan)], "target epsilon"),
        (["--insecure", "--federation", str(_write_terms(tmp_path / "big.json",
                                                         target_epsilon=40.0))],
         "policy is at most 8"),
        (["--insecure", "--federation", str(_write_terms(
            tmp_path / "delta.json", options={"warm_start": "none", "delta": 0.01}))],
         "delta"),
        (["--insecure", "--federation", str(_write_terms(
            tmp_path / "unit.json", options={"warm_start": "none", "privacy_unit": "note"}))],
         "unit"),
        (["--insecure", "--federation", str(_write_terms(
            tmp_path / "tls.json", server_ca_sha256=file_sha256(ca)))], "--root-certificates"),
        (["--root-certificates", str(other), "--federation", str(_write_terms(
            tmp_path / "tls2.json", server_ca_sha256=file_sha256(ca)))], "server CA"),
        (["--root-certificates", str(ca), "--federation", str(ok)], "--insecure"),
    ]
    for extra, what in cases:
        assert cli_main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert what in err and "Traceback" not in err, (extra, err)
        if what != "--federation":  # typer's own usage message for the missing option
            assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "st" / NODE_KEY).exists()  # nothing made for a refused join


def test_join_refuses_a_key_without_its_state(notes_file: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("flwr")
    from dphub.federate.deploy import ensure_node_key

    ca = tmp_path / "ca.crt"
    ca.write_text("ca")
    from dphub.io import file_sha256

    terms = _write_terms(tmp_path / "t.json", server_ca_sha256=file_sha256(ca))
    state = tmp_path / "st"
    state.mkdir()
    ensure_node_key(state)
    rc = cli_main(["federate", "join", str(notes_file), "--state", str(state), "--server",
                   "127.0.0.1:8000", "--root-certificates", str(ca), "--federation",
                   str(terms)])
    err = capsys.readouterr().err
    assert rc == 2 and "node key but not its accountant" in err, err
    assert len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ join after a killed join


FAKE_SUPERNODE = """#!/bin/sh
# a SuperNode the SuperLink refuses: first as Flower 1.42 prints it, then for another reason
n=$(cat "$0.count" 2>/dev/null || echo 0); echo $((n + 1)) > "$0.count"
if [ "$n" = 0 ]; then
  echo "Failed to initialize the connection to the SuperLink."
  echo "[code: 2004] Failed to activate SuperNode."
else
  echo "Failed to initialize the connection to the SuperLink: unreachable"
fi
exit 1
"""


@pytest.mark.parametrize("killed_before", [False, True])
def test_join_says_why_its_supernode_stopped(killed_before: bool, notes_file: Path,
                                             tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The finding: after a killed `join` the SuperLink refuses the same key until it drops the
    old connection (about 90 s), and `join` blamed the key. Now a `join` that finds the last
    one killed (its running mark left behind) retries a refused activation; one that does not
    says the key may be unregistered, and any other stop says so."""
    pytest.importorskip("flwr")
    from dphub.federate import deploy

    fake = tmp_path / "flower-supernode"
    fake.write_text(FAKE_SUPERNODE)
    fake.chmod(0o755)
    state = tmp_path / "st"
    state.mkdir()
    if killed_before:
        (state / deploy.RUNNING_MARK).touch()
    plan = deploy.JoinPlan(data=notes_file, state=state, server="127.0.0.1:1",
                           port=_free_port(), policy=SitePolicy())
    said: list[str] = []
    monkeypatch.setattr(deploy, "RETRY_S", 0.1)
    with pytest.raises(ConfigError) as e:
        deploy.run_join(plan, str(fake), still_online_wait=60, echo=said.append)
    starts = int((tmp_path / "flower-supernode.count").read_text())
    if killed_before:
        assert starts == 2 and "last join here was killed" in said[0]
        assert "wrong certificate or an unreachable server" in e.value.message
    else:
        assert starts == 1 and not said
        assert "node key registered" in e.value.message
        assert e.value.message.startswith("the SuperNode stopped")
    assert not (state / deploy.RUNNING_MARK).exists()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("args", "what"), [
    (["--rounds", "1000000"], "rounds"), (["--local-steps", "10000000"], "local steps"),
    (["--rounds", "200", "--local-steps", "200"], "10000"),
])
def test_serve_refuses_absurd_federations_before_writing(args: list[str], what: str,
                                                         tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("flwr")
    rc = cli_main(["federate", "serve", "--app-dir", str(tmp_path / "app"), "--out",
                   str(tmp_path / "m"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and what in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "app").exists()


def test_serve_writes_the_terms_sites_join(tiny_base_model: Path, opts: dict, tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("flwr")
    ca = tmp_path / "ca.crt"
    ca.write_text("ca")
    assert cli_main(["federate", "serve", "--app-dir", str(tmp_path / "app"), "--out",
                     str(tmp_path / "m"), "--base-model", str(tiny_base_model),
                     "--warm-start", "none", "--accountant", "rdp", "--rounds", "3",
                     "--local-steps", "4", "--target-epsilon", "5", "--root-certificates",
                     str(ca)]) == 0
    out = json.loads(capsys.readouterr().out)
    terms = FederationTerms.load(tmp_path / "app" / "federation.json")
    assert out["federation_id"] == terms.federation_id()
    assert (terms.rounds, terms.local_steps, terms.target_epsilon) == (3, 4, 5.0)
    from dphub.io import file_sha256

    assert terms.server_ca_sha256 == file_sha256(ca)
    assert terms.frozen_digest == recipe_frozen_digest(terms.options)
    # the run config serve wrote is exactly these terms
    import tomllib

    project = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    terms.check_run_config(project["tool"]["flwr"]["app"]["config"])
