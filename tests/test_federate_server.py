"""The federation's server against a rogue site (issue 37, items 4 and 5, server side).

Unit level (no Flower): real site reports and weights from two tiny synthetic sites (one DP round
each, on the tiny random base), then what a rogue or broken site could send instead. One
multi-process test: ``kill -9`` of ``dphub federate simulate`` leaves no Ray process."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from federate_fixtures import OPTIONS, one_thread  # noqa: F401 (an autouse fixture)

from dphub import formats, synth
from dphub.cli.main import main as cli_main
from dphub.federate import reports, robust
from dphub.federate.server import SERVER_STATE, FederationConfig, FederationServer
from dphub.federate.simulate import site_overlap
from dphub.federate.site import RoundOrder, Site
from dphub.privacy.federation import site_epsilon
from dphub.tagger import Tagger

pytestmark = pytest.mark.filterwarnings("ignore")

ROUNDS, LOCAL = 2, 2


def _write_site(root: Path, i: int, n: int, seed: int) -> Path:
    notes = synth.generate(n, kind="nursing", seed=seed, patients=max(2, n // 3))
    for note in notes:
        note.patient_id = f"site{i}-{note.patient_id}"
    path = root / f"site-{i}.jsonl"
    formats.write(notes, path, "jsonl")
    return path


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("sites")
    return [_write_site(root, i, n, seed) for i, (n, seed) in enumerate([(8, 2), (6, 3)])]


def _cfg(base: Path, out: Path, **kw) -> FederationConfig:
    return FederationConfig(out=out, options={**OPTIONS, "base_model": str(base)},
                            rounds=ROUNDS, local_steps=LOCAL, **kw)


@pytest.fixture(scope="module")
def round1(sites: list[Path], tiny_base_model: Path,
           tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list]:
    """The global weights of round 1 and two honest sites' replies to it."""
    root = tmp_path_factory.mktemp("round1")
    torch.set_num_threads(1)
    server = FederationServer(_cfg(tiny_base_model, root / "m"))
    order = RoundOrder(round=1, rounds=ROUNDS, local_steps=LOCAL, target_epsilon=8.0,
                       frozen_digest=server.frozen_digest)
    replies = []
    for i, path in enumerate(sites):
        site = Site(path, root / f"site-{i}", {**OPTIONS, "base_model": str(tiny_base_model)})
        replies.append(site.train_round(order, server.weights))
    return {k: v.clone() for k, v in server.weights.items()}, replies


def _server(base: Path, out: Path, weights: dict, options_delta: float | None = None,
            **kw) -> FederationServer:
    cfg = _cfg(base, out, **kw)
    if options_delta is not None:
        cfg.options = {**cfg.options, "delta": options_delta}
    server = FederationServer(cfg)
    server.weights = {k: v.clone() for k, v in weights.items()}  # the round's global weights
    return server


def _with(weights: dict, fill: float | None = None, **edits) -> dict:
    out = {k: v.clone() for k, v in weights.items()}
    name = next(iter(out))
    if fill is not None:
        out[name] = torch.full_like(out[name], fill)
    out.update(edits)
    return out


# ------------------------------------------------------------------ item 4: poisoned updates


def test_a_1e30_site_is_dropped_and_the_model_still_deidentifies(
        round1: tuple[dict, list], tiny_base_model: Path, tmp_path: Path) -> None:
    g, honest = round1
    rogue_report = {**honest[0][1], "site_id": "f" * 16}
    rogue = (_with(honest[0][0], fill=1e30), rogue_report)
    poisoned = _server(tiny_base_model, tmp_path / "p", g)
    assert poisoned.aggregate(1, [*honest, rogue]) == 2  # the rogue did not contribute
    assert len(poisoned.dropped) == 1 and "out of bounds" in poisoned.dropped[0]
    assert "f" * 16 not in poisoned.sites  # nor did its report
    clean = _server(tiny_base_model, tmp_path / "c", g)
    clean.aggregate(1, honest)
    for k, v in clean.weights.items():
        assert torch.equal(poisoned.weights[k], v)
    # the written models tag exactly alike: the rogue changed nothing
    poisoned.write()
    clean.write()
    notes = synth.generate(3, kind="discharge", seed=9)
    a = Tagger.load(tmp_path / "p").tag(notes, threshold=0.0)
    b = Tagger.load(tmp_path / "c").tag(notes, threshold=0.0)
    assert a == b and sum(map(len, a)) > 0  # threshold 0: every token is a span, all finite


@pytest.mark.parametrize("what", ["nan", "inf", "-inf", "1e30", "-1e30", "just-over",
                                  "mis-shaped", "missing", "extra", "no-weights"])
def test_a_broken_update_is_dropped_not_fatal(what: str, round1: tuple[dict, list],
                                             tiny_base_model: Path, tmp_path: Path) -> None:
    g, honest = round1
    w, rep = honest[1]
    name = next(iter(g))
    bound = reports.update_bound(name, lr=OPTIONS["lr"], rule_lr_scale=30.0,
                                 steps=rep["trained"])
    bad = {
        "nan": lambda: _with(w, fill=math.nan),
        "inf": lambda: _with(w, fill=math.inf),
        "-inf": lambda: _with(w, fill=-math.inf),
        "1e30": lambda: _with(w, fill=1e30),
        "-1e30": lambda: _with(w, fill=-1e30),
        "just-over": lambda: _with(w, **{name: g[name] + bound * 1.01}),
        "mis-shaped": lambda: _with(w, **{name: w[name].reshape(-1)[:-1]}),
        "missing": lambda: {k: v for k, v in w.items() if k != name},
        "extra": lambda: _with(w, **{"encoder.extra": torch.zeros(3)}),
        "no-weights": lambda: None,
    }[what]()
    server = _server(tiny_base_model, tmp_path / "m", g)
    assert server.aggregate(1, [honest[0], (bad, rep)]) == 1
    assert len(server.dropped) == 1 and rep["site_id"] not in server.sites
    for k, v in server.weights.items():  # the honest site alone
        assert torch.equal(v, honest[0][0][k].to(v.dtype))


def test_an_update_within_adams_reach_is_kept(round1: tuple[dict, list], tiny_base_model: Path,
                                             tmp_path: Path) -> None:
    """The bound does not drop honest sites: every honest update lies well inside it, and one
    just inside the bound is accepted."""
    g, honest = round1
    for w, rep in honest:
        for k in g:
            reach = reports.update_bound(k, lr=OPTIONS["lr"], rule_lr_scale=30.0,
                                         steps=rep["trained"])
            assert float((w[k] - g[k]).abs().max()) < reach / 2
            rms = float((w[k] - g[k]).double().pow(2).mean().sqrt())
            assert rms < reports.rms_update_bound(k, lr=OPTIONS["lr"], rule_lr_scale=30.0,
                                                  steps=rep["trained"]) / 2
    w, rep = honest[1]
    name = next(iter(g))
    bound = reports.update_bound(name, lr=OPTIONS["lr"], rule_lr_scale=30.0, steps=LOCAL)
    inside = _with(w, **{name: w[name].clone()})
    inside[name].view(-1)[0] = g[name].view(-1)[0] + bound * 0.99  # one coordinate at the reach
    server = _server(tiny_base_model, tmp_path / "m", g)
    assert server.aggregate(1, [honest[0], (inside, rep)]) == 2 and server.dropped == []


# ------------------------------------------------------------------ item 4: identities


def test_a_duplicated_site_id_is_refused(round1: tuple[dict, list], tiny_base_model: Path,
                                         tmp_path: Path) -> None:
    g, honest = round1
    (w0, r0), (w1, r1) = honest
    copy_of_0 = {**r1, "site_id": r0["site_id"]}
    # without node ids: one id twice in a round, both replies refused
    server = _server(tiny_base_model, tmp_path / "a", g)
    assert server.aggregate(1, [(w0, r0), (w1, copy_of_0)]) == 0
    assert server.sites == {} and len(server.dropped) == 2
    # with node ids: the id is bound to the node that first reported it
    server = _server(tiny_base_model, tmp_path / "b", g)
    assert server.aggregate(1, [(w0, r0, 10), (w1, r1, 11)]) == 2
    row = copy.deepcopy(server.sites[r0["site_id"]])
    assert server.aggregate(2, [(None, copy_of_0, 12)]) == 0  # another node, an honest id
    assert server.sites[r0["site_id"]] == row and "another node" in server.dropped[0]
    assert server.aggregate(2, [(None, {**r1, "trained": 0}, 10)]) == 0  # site 1's, node 10
    assert server.sites[r1["site_id"]]["steps"] == r1["steps"]
    assert "another node" in server.dropped[0]
    new_id = {**r1, "trained": 0, "site_id": "e" * 16}
    assert server.aggregate(2, [(None, new_id, 10)]) == 0  # node 10 as a second site
    assert "e" * 16 not in server.sites and "second site id" in server.dropped[0]
    # two replies with one id in one round: the bound node's is kept, the other refused
    server.aggregate(2, [(None, {**r0, "trained": 0}, 10), (None, copy_of_0, 12)])
    assert server.sites[r0["site_id"]] == row and len(server.dropped) == 1


def test_a_report_cannot_replace_a_known_sites_row(round1: tuple[dict, list],
                                                  tiny_base_model: Path,
                                                  tmp_path: Path) -> None:
    """Without node ids (a resumed server rebinds), a known site's row only continues: the same
    plan and never fewer steps, so no cheaper accounting can replace it."""
    g, honest = round1
    (w0, r0), _ = honest
    server = _server(tiny_base_model, tmp_path / "m", g)
    server.aggregate(1, [honest[0]])
    row = copy.deepcopy(server.sites[r0["site_id"]])
    more_noise = {**r0, "trained": 0, "noise_multiplier": r0["noise_multiplier"] * 2}
    more_noise["epsilon"] = site_epsilon(more_noise)
    fewer_steps = {**r0, "trained": 0, "steps": r0["steps"] - 1}
    fewer_steps["epsilon"] = site_epsilon(fewer_steps)
    other_data = {**r0, "trained": 0, "units": "5-9"}
    for rep in (more_noise, fewer_steps, other_data):
        assert server.aggregate(2, [(None, rep)]) == 0
        assert server.sites[r0["site_id"]] == row, rep
    assert server.aggregate(2, [(None, {**r0, "trained": 0})]) == 0 and server.dropped == []


# ------------------------------------------------------------------ item 4: reports


def _bad_reports(r: dict) -> dict[str, dict]:
    ds = json.loads(r["dataset"])
    million = {**ds, "patients": "1000000-1999999", "notes": "1000000-1999999"}
    return {
        "dataset not JSON": {**r, "dataset": "{not json"},
        "dataset with text": {**r, "dataset": json.dumps({**ds, "note": "Mr Smith"})},
        "dataset exact count": {**r, "dataset": json.dumps({**ds, "notes": "7"})},
        "dataset not 1-2-5": {**r, "dataset": json.dumps({**ds, "notes": "3-7"})},
        "a million patients": {**r, "units": "1000000-1999999",
                               "dataset": json.dumps(million, sort_keys=True)},
        "units not 1-2-5": {**r, "units": "3-7"},
        "units vs dataset": {**r, "units": "5-9"},
        "fewer notes than patients": {**r, "dataset": json.dumps({**ds, "notes": "1-1"})},
        "extra field": {**r, "text": "Mr Smith"},
        "missing field": {k: v for k, v in r.items() if k != "delta"},
        "epsilon nan": {**r, "epsilon": math.nan},
        "epsilon inf": {**r, "epsilon": math.inf},
        "epsilon too low": {**r, "epsilon": r["epsilon"] / 2},
        "sigma -1": {**r, "noise_multiplier": -1.0},
        "delta 5": {**r, "delta": 5.0},
        "delta above 1/N": {**r, "delta": 0.9},
        "q not 1/k": {**r, "sample_rate": 0.3},
        "steps beyond the federation": {**r, "steps": ROUNDS * LOCAL + 1},
        "steps negative": {**r, "steps": -1},
        "site id not hex": {**r, "site_id": "../../etc/passwd"},
        "other unit": {**r, "privacy_unit": "note"},
        "expected batch": {**r, "expected_batch": "500-999"},
    }


def test_a_malformed_report_is_dropped_and_never_checkpointed(
        round1: tuple[dict, list], tiny_base_model: Path, tmp_path: Path) -> None:
    g, honest = round1
    (w0, r0), (w1, r1) = honest
    server = _server(tiny_base_model, tmp_path / "m", g, state_dir=tmp_path / "state")
    assert server.aggregate(1, [(w0, r0)]) == 1
    for what, bad in _bad_reports(r1).items():
        n = server.aggregate(1, [(w1, bad)])
        assert n == 0 and len(server.dropped) == 1, what
        assert "Mr Smith" not in server.dropped[0] and "passwd" not in server.dropped[0]
        assert set(server.sites) == {r0["site_id"]}, what
    state = (tmp_path / "state" / SERVER_STATE).read_text()
    assert "not json" not in state and "Mr Smith" not in state and "1000000" not in state
    again = FederationServer(_cfg(tiny_base_model, tmp_path / "m",
                                  state_dir=tmp_path / "state"))  # the checkpoint resumes
    assert again.round == 1 and set(again.sites) == {r0["site_id"]}


def test_a_state_with_a_bad_row_is_refused_on_resume(round1: tuple[dict, list],
                                                     tiny_base_model: Path,
                                                     tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    """A checkpoint written before reports were checked: one line, not a broken resume."""
    g, honest = round1
    server = _server(tiny_base_model, tmp_path / "m", g, state_dir=tmp_path / "state")
    server.aggregate(1, [honest[0]])
    path = tmp_path / "state" / SERVER_STATE
    raw = json.loads(path.read_text())
    next(iter(raw["sites"].values()))["dataset"] = "{not json"
    path.write_text(json.dumps(raw))
    with pytest.raises(Exception, match="recorded report is invalid"):
        FederationServer(_cfg(tiny_base_model, tmp_path / "m", state_dir=tmp_path / "state"))


def test_robust_aggregates_of_two_sites_are_their_mean(round1: tuple[dict, list],
                                                      tiny_base_model: Path,
                                                      tmp_path: Path) -> None:
    g, honest = round1
    clipped, _ = robust.clip_to_median(robust.updates([w for w, _ in honest], g))
    for agg in ("median", "trimmed-mean"):
        server = _server(tiny_base_model, tmp_path / agg, g, aggregation=agg)
        assert server.aggregate(1, honest) == 2
        for k, v in server.weights.items():  # two sites: both are their (clipped) mean
            mean = g[k].double() + (clipped[0][k] + clipped[1][k]) / 2
            assert torch.allclose(v.double(), mean, atol=1e-6)


# ------------------------------------------------------------------ simulate: overlapping sites


def test_sites_that_share_notes_or_patients_are_refused(sites: list[Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    site_overlap(sites)  # disjoint: accepted
    notes = list(formats.read(sites[0]))
    for note in notes:  # the same notes under other ids, patients and spacing
        note.id = "copy-" + note.id
        note.patient_id = "other-" + str(note.patient_id)
        note.text = "  " + note.text.replace(" ", "  ").upper()
    renamed = tmp_path / "renamed.jsonl"
    formats.write(notes, renamed, "jsonl")
    one = list(formats.read(sites[1]))[:1]  # one note of site 1 inside another site's file
    other = synth.generate(4, kind="nursing", seed=77, patients=2)
    for note in other:
        note.patient_id = "fresh-" + str(note.patient_id)
    mixed = tmp_path / "mixed.jsonl"
    formats.write([*other, *one], mixed, "jsonl")
    shared_pid = tmp_path / "pid.jsonl"
    for note in other:
        note.patient_id = json.loads(sites[1].read_text().splitlines()[0])["patient_id"]
    formats.write(other, shared_pid, "jsonl")
    for bad in (renamed, mixed, shared_pid):
        with pytest.raises(Exception, match="disjoint patients"):
            site_overlap([sites[0], sites[1], bad])
    capsys.readouterr()
    rc = cli_main(["federate", "simulate", str(sites[0]), str(renamed), "--out",
                   str(tmp_path / "m"), "--base-model", "unused"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1
    assert "share" in err and notes[0].text.split()[0] not in err
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.federation").exists()


# ------------------------------------------------------------------ item 5: options


@pytest.mark.parametrize("args,expect", [
    (["--lr", "nan"], "--lr"), (["--lr", "0"], "--lr"), (["--noise", "-1"], "--noise"),
    (["--noise", "0"], "--noise"), (["--delta", "5"], "--delta"), (["--delta", "0"], "--delta"),
    (["--target-epsilon", "inf"], "--target-epsilon"), (["--accountant", "x"], "--accountant"),
    (["--aggregation", "max"], "--aggregation"), (["--root-certificates", "missing.pem"],
                                                  "certificate"),
    (["--control", "nohost"], "--control"),
])
def test_serve_validates_every_option_first(args: list[str], expect: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rc = cli_main(["federate", "serve", "--app-dir", "app", "--out", "m", *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error:") and expect in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "app").exists()


@pytest.mark.parametrize("args", [["--lr", "nan"], ["--noise", "-1"], ["--delta", "5"],
                                  ["--warm-start", "other"]])
def test_simulate_validates_before_ray(args: list[str], sites: list[Path], tmp_path: Path,
                                       capsys: pytest.CaptureFixture) -> None:
    t0 = time.monotonic()
    rc = cli_main(["federate", "simulate", *map(str, sites), "--out", str(tmp_path / "m"),
                   *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1, err
    assert time.monotonic() - t0 < 30  # Ray takes longer than that to start here


# ------------------------------------------------------------------ item 5: processes


@pytest.mark.slow
def test_kill_9_of_simulate_leaves_no_ray_process(sites: list[Path], tiny_base_model: Path,
                                                  tmp_path: Path) -> None:
    psutil = pytest.importorskip("psutil")
    pytest.importorskip("flwr")
    bindir = Path(sys.executable).parent
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false",
           "DPHUB_CACHE_DIR": str(tmp_path / "cache")}
    argv = [str(bindir / "dphub"), "federate", "simulate", *map(str, sites), "--out",
            str(tmp_path / "m"), "--base-model", str(tiny_base_model), "--warm-start", "none",
            "--accountant", "rdp", "--batch-size", "2", "--max-length", "48", "--stride", "8",
            "--no-rule-features", "--rounds", "50", "--local-steps", "1", "--cpus", "2"]
    with open(tmp_path / "sim.log", "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    seen: dict[int, psutil.Process] = {}
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            kids = psutil.Process(proc.pid).children(recursive=True)
            seen.update({p.pid: p for p in kids})
            names = " ".join(p.name() for p in kids if p.is_running())
            if "raylet" in names and "gcs_server" in names:
                time.sleep(3)  # its workers and agents too
                seen.update({p.pid: p for p in psutil.Process(proc.pid).children(True)})
                break
            time.sleep(0.5)
        assert proc.poll() is None and seen, (tmp_path / "sim.log").read_text()[-2000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            left = [p for p in seen.values()
                    if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            if not left:
                break
            time.sleep(0.5)
        assert not left, [p.name() for p in left]
    finally:
        for p in seen.values():
            with contextlib.suppress(psutil.Error):
                p.kill()


# ------------------------------------------------------------------ issue 53: the δ cap


def _lie(r: dict, **edits) -> dict:
    """A self-consistent lie: the edited report with its ε recomputed (it passes the
    "epsilon below its own accounting" check)."""
    out = {**r, **edits}
    out["epsilon"] = site_epsilon(out)
    return out


def test_a_report_above_the_federations_delta_cap_is_refused(
        round1: tuple[dict, list], tiny_base_model: Path, tmp_path: Path) -> None:
    """δ = 0.01 buys ε ≈ half for the same σ: a report whose δ is above min(1e-5, 1/(10 N))
    (no δ in the recipe) is dropped like ε above target, whatever its own accounting says."""
    g, honest = round1
    (w0, r0), _ = honest
    assert float(r0["delta"]) <= 1e-5
    server = _server(tiny_base_model, tmp_path / "m", g)
    for d in (0.01, 1e-3, 2e-5):
        lie = _lie(r0, delta=d)
        assert lie["epsilon"] < r0["epsilon"]  # what the lie buys
        assert server.aggregate(1, [(w0, lie)]) == 0, d
        assert "delta above the federation's cap" in server.dropped[0], (d, server.dropped)
    # the neighbours: δ = 0, NaN, above 1, a string
    for d in (0.0, math.nan, 1.5, "1e-5"):
        assert server.aggregate(1, [(w0, {**r0, "delta": d})]) == 0, d
    assert server.aggregate(1, [(w0, r0)]) == 1  # the honest report still passes


def test_the_delta_cap_is_the_recipes_when_it_sets_one(
        round1: tuple[dict, list], tiny_base_model: Path, tmp_path: Path) -> None:
    g, honest = round1
    (w0, r0), _ = honest
    strict = _server(tiny_base_model, tmp_path / "a", g, options_delta=1e-6)
    assert strict.aggregate(1, [(w0, r0)]) == 0  # the site's 1e-5 is above this recipe's δ
    assert "delta above the federation's cap" in strict.dropped[0]
    loose = _server(tiny_base_model, tmp_path / "b", g, options_delta=1e-4)
    assert loose.aggregate(1, [(w0, _lie(r0, delta=1e-4))]) == 1  # what the terms allow
    assert loose.aggregate(1, [(w0, _lie(r0, delta=2e-4))]) == 0


def test_a_recorded_report_above_the_delta_cap_is_refused_on_resume(
        round1: tuple[dict, list], tiny_base_model: Path, tmp_path: Path) -> None:
    g, honest = round1
    server = _server(tiny_base_model, tmp_path / "m", g, state_dir=tmp_path / "state")
    server.aggregate(1, [honest[0]])
    path = tmp_path / "state" / SERVER_STATE
    raw = json.loads(path.read_text())
    row = next(iter(raw["sites"].values()))
    row.update(_lie({**row, "site_id": "0" * 16}, delta=1e-3))
    row.pop("site_id")
    path.write_text(json.dumps(raw))
    with pytest.raises(Exception, match="delta above the federation's cap"):
        FederationServer(_cfg(tiny_base_model, tmp_path / "m", state_dir=tmp_path / "state"))


# ------------------------------------------------------------------ issue 53: the card's defences


def test_the_card_states_the_servers_defences_and_its_drops(
        round1: tuple[dict, list], tiny_base_model: Path, tmp_path: Path) -> None:
    """The federated card says which defences the server ran (bounds, median clipping, the
    probe check's margin, the trim) and how many replies it dropped per round; `card
    validate` requires it on a card of dphub 0.2.0 or later and checks it agrees with the
    block; an older card without it stays valid."""
    from dphub import card
    from dphub.federate.reports import ADAM_RMS_BOUND, ADAM_STEP_BOUND
    from dphub.hub.validate import validate_card
    from dphub.privacy.federation import federation_problems

    g, honest = round1
    (w0, r0), (w1, r1) = honest
    server = _server(tiny_base_model, tmp_path / "m", g, aggregation="trimmed-mean")
    assert server.aggregate(1, [(w0, r0), (w1, {**r1, "delta": 5.0})]) == 1
    meta = server.write()
    validate_card(tmp_path / "m")
    dp = meta["differential_privacy"]
    rob = dp["federation"]["robustness"]
    assert rob == {"update_bounds": {"per_coordinate": ADAM_STEP_BOUND, "rms": ADAM_RMS_BOUND},
                   "norm_clipping": "median",
                   "probe_check": {"margin": robust.PROBE_MARGIN,
                                   "min_sites": robust.PROBE_MIN_SITES},
                   "trim": {"proportion": robust.TRIM_PROPORTION, "at_least_one_from_sites": 3},
                   "dropped_per_round": [1]}
    assert "delta" not in json.dumps(rob)  # counts and settings only, no reason text

    def problems(edit) -> list[str]:
        bad = copy.deepcopy(meta)
        edit(bad["differential_privacy"])
        return card.meta_problems(bad)

    def without(release: str):
        def edit(d: dict) -> None:
            d["library_versions"]["dphub"] = release
            del d["federation"]["robustness"]
        return edit

    assert any("robustness" in p for p in problems(without("0.2.0")))
    assert any("robustness" in p for p in problems(without("1.0.0rc1")))
    assert problems(without("0.1.0")) == []  # a card written before it existed
    assert federation_problems({**dp, "federation": {**dp["federation"], "robustness": {
        **rob, "dropped_per_round": [0, 1]}}})  # rounds disagree
    assert problems(lambda d: d["federation"]["robustness"].pop("trim"))  # trimmed-mean
    assert problems(lambda d: d["federation"].update(aggregation="mean"))  # trim without it
    assert problems(lambda d: d["federation"]["robustness"].update(note="Mr Smith"))
    assert problems(lambda d: d["federation"]["robustness"].update(dropped_per_round=[-1]))
    assert problems(lambda d: d["federation"]["robustness"]["probe_check"].update(margin=2))


def test_drops_per_round_survive_a_resume(round1: tuple[dict, list], tiny_base_model: Path,
                                          tmp_path: Path) -> None:
    g, honest = round1
    (w0, r0), (w1, r1) = honest
    server = _server(tiny_base_model, tmp_path / "m", g, state_dir=tmp_path / "state")
    server.aggregate(1, [(w0, r0), (w1, {**r1, "delta": 5.0})])
    again = FederationServer(_cfg(tiny_base_model, tmp_path / "m", state_dir=tmp_path / "state"))
    assert again.dropped_per_round == [1]
    path = tmp_path / "state" / SERVER_STATE
    raw = json.loads(path.read_text())
    for bad in ([-1], "1", [True], [0, 0, 0]):
        path.write_text(json.dumps({**raw, "dropped_per_round": bad}))
        with pytest.raises(Exception, match="recorded drops are invalid"):
            FederationServer(_cfg(tiny_base_model, tmp_path / "m",
                                  state_dir=tmp_path / "state"))
    del raw["dropped_per_round"]  # a checkpoint written before this: not recorded
    path.write_text(json.dumps(raw))
    assert FederationServer(_cfg(tiny_base_model, tmp_path / "m", state_dir=tmp_path /
                                 "state")).dropped_per_round == [None]


def test_a_card_row_beyond_its_sites_own_policy_is_refused(
        round1: tuple[dict, list], tiny_base_model: Path, tmp_path: Path) -> None:
    """The card's neighbour of the report check: a row whose δ (or ε) its own recorded policy
    would have refused, recomputed so its accounting agrees, no longer validates."""
    from dphub.privacy.federation import federation_problems

    g, honest = round1
    server = _server(tiny_base_model, tmp_path / "m", g)
    assert server.aggregate(1, [honest[0]]) == 1
    dp = server.write()["differential_privacy"]
    row = dp["federation"]["site_accounting"][0]
    assert row["policy"]["delta"] is None and federation_problems(dp) == []

    def lied(**edits) -> dict:
        bad = copy.deepcopy(dp)
        r = bad["federation"]["site_accounting"][0]
        r.update(edits)
        r["epsilon"] = site_epsilon(r)
        bad["federation"]["epsilon_range"] = [r["epsilon"], r["epsilon"]]
        bad["epsilon"], bad["delta"] = r["epsilon"], max(bad["delta"], r["delta"])
        return bad

    assert any("above the site's own policy (1e-05)" in p
               for p in federation_problems(lied(delta=1e-3)))
    assert federation_problems(lied(delta=row["delta"])) == []  # the recomputation alone: fine
    many = lied(steps=ROUNDS * LOCAL, noise_multiplier=0.3)
    assert float(many["epsilon"]) > row["policy"]["max_epsilon"]
    assert any("epsilon: above the site's own policy" in p for p in federation_problems(many))
