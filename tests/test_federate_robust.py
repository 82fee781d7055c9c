"""A rogue minority cannot steer the federated model (issue 53, the server's side).

Unit level (no Flower): three tiny synthetic sites train one honest DP round each on the tiny
random base (lr 0.1, so one round moves the model visibly), then one of them lies instead:
inside the per-coordinate reach, at an honest site's norm, with an honest site's id, after a
server restart; and a resumed server is handed broken weights."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from federate_fixtures import OPTIONS, one_thread  # noqa: F401 (an autouse fixture)

from dphub import formats, synth
from dphub.errors import ConfigError
from dphub.federate import reports, robust
from dphub.federate.server import (
    SERVER_STATE,
    SERVER_WEIGHTS,
    FederationConfig,
    FederationServer,
)
from dphub.federate.site import RoundOrder, Site
from dphub.privacy import randomness
from dphub.privacy.federation import site_epsilon

pytestmark = pytest.mark.filterwarnings("ignore")

ROUNDS, LOCAL, LR = 2, 2, 0.1
ROGUE = 1  # the index of the site that lies
#: the honest round's DP noise, drawn from a fixed seed (below)
NOISE_SEED = 20261208


class _SeededOS:
    """``os`` for :mod:`dphub.privacy.randomness` with a seeded ``urandom``.

    The tests below are about the rogue; with fresh OS noise the three tiny honest sites' probe
    recalls spread past the margin in about one draw in ten (an honest site dropped, the
    fixture's premise gone). One fixed, checked draw makes each test deterministic; that DP runs
    draw from the OS is tested in tests/test_train_guarantee.py."""

    def __init__(self, seed: int) -> None:
        self._r = random.Random(seed)

    def urandom(self, n: int) -> bytes:
        return self._r.getrandbits(8 * n).to_bytes(n, "little")


def _cfg(base: Path, out: Path, **kw) -> FederationConfig:
    return FederationConfig(out=out, options={**OPTIONS, "lr": LR, "base_model": str(base)},
                            rounds=ROUNDS, local_steps=LOCAL, **kw)


@pytest.fixture(scope="module")
def round1(tiny_base_model: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[dict, list]:
    """The global weights of round 1 and three honest sites' replies to it."""
    root = tmp_path_factory.mktemp("robust")
    torch.set_num_threads(1)
    server = FederationServer(_cfg(tiny_base_model, root / "m"))
    order = RoundOrder(round=1, rounds=ROUNDS, local_steps=LOCAL, target_epsilon=8.0,
                       frozen_digest=server.frozen_digest)
    replies = []
    with pytest.MonkeyPatch.context() as seeded:
        seeded.setattr(randomness, "os", _SeededOS(NOISE_SEED))
        for i, (n, seed) in enumerate([(8, 2), (6, 3), (7, 4)]):
            notes = synth.generate(n, kind="nursing", seed=seed, patients=max(2, n // 3))
            for note in notes:
                note.patient_id = f"site{i}-{note.patient_id}"
            path = root / f"site-{i}.jsonl"
            formats.write(notes, path, "jsonl")
            site = Site(path, root / f"site-{i}",
                        {**OPTIONS, "lr": LR, "base_model": str(tiny_base_model)})
            replies.append(site.train_round(order, server.weights))
    return {k: v.clone() for k, v in server.weights.items()}, replies


def _server(base: Path, out: Path, weights: dict, **kw) -> FederationServer:
    server = FederationServer(_cfg(base, out, **kw))
    server.weights = {k: v.clone() for k, v in weights.items()}
    return server


def _no_phi_direction(name: str, t: torch.Tensor, hidden: torch.Tensor | None = None
                      ) -> torch.Tensor:
    """+1/-1 per coordinate towards tagging O everywhere (tag 0 is O): O's scores up, every PHI
    tag's down; the classifier's rows along the sign of ``hidden`` (or not at all)."""
    tags = t.shape[0] if name == "classifier.weight" else t.shape[-1]
    sign = -torch.ones(tags, dtype=t.dtype)
    sign[0] = 1.0
    if name == "crf.transitions":
        return sign.expand(t.shape[0], -1).clone()
    if name == "classifier.weight":
        if hidden is None:
            return torch.zeros_like(t)
        return sign[:, None] * torch.sign(hidden)[None, :]
    return sign


def _pushing(g: dict, w: dict, scale_of: dict[str, float], hidden: torch.Tensor | None = None
             ) -> dict:
    out = dict(w)
    for name, t in g.items():
        d = _no_phi_direction(name, t, hidden)
        if bool(d.abs().sum()):
            out[name] = t + scale_of[name] * d
    return out


def _ids(replies: list) -> list[str]:
    return [r["site_id"] for _, r in replies]


def _same(a: dict, b: dict) -> bool:
    return all(torch.allclose(a[k].double(), b[k].double(), atol=1e-7) for k in a)


# ------------------------------------------------------------------ the finding: one rogue of 3


def test_honest_dp_updates_pass_at_three_sites(round1: tuple[dict, list], tiny_base_model: Path,
                                               tmp_path: Path) -> None:
    g, honest = round1
    for w, rep in honest:  # well inside both of Adam's bounds
        for k in g:
            rms = float((w[k] - g[k]).double().pow(2).mean().sqrt())
            assert rms < reports.rms_update_bound(k, lr=LR, rule_lr_scale=30.0,
                                                  steps=rep["trained"]) / 2, k
    server = _server(tiny_base_model, tmp_path / "m", g)
    assert server.aggregate(1, honest) == 3 and server.dropped == []
    assert len(server.probe_recalls) == 3 and set(server.sites) == set(_ids(honest))
    # the rule: none is more than the margin below the median site's (tiny DP models spread)
    median = sorted(server.probe_recalls)[1]
    assert min(server.probe_recalls) > median - robust.PROBE_MARGIN


def test_a_rogue_pushing_inside_the_reach_is_dropped_at_three_sites(
        round1: tuple[dict, list], tiny_base_model: Path, tmp_path: Path) -> None:
    """Issue 53's rogue: every pushed coordinate at 0.3 x the per-coordinate reach, towards
    "no PHI", with its own honest report. The old server took it (mean of three)."""
    g, honest = round1
    w, rep = honest[ROGUE]
    reach = {k: 0.3 * reports.update_bound(k, lr=LR, rule_lr_scale=30.0, steps=rep["trained"])
             for k in g}
    rogue = _pushing(g, w, reach)
    replies = [honest[0], (rogue, rep), honest[2]]
    server = _server(tiny_base_model, tmp_path / "m", g)
    assert server.aggregate(1, replies) == 2
    assert len(server.dropped) == 1 and "root mean square" in server.dropped[0]
    assert rep["site_id"] not in server.sites
    clean = _server(tiny_base_model, tmp_path / "c", g)
    clean.aggregate(1, [honest[0], honest[2]])
    assert _same(server.weights, clean.weights)  # as if the rogue had not been there


def _probe_hidden(server: FederationServer) -> torch.Tensor:
    """The mean encoder output on the public probe notes (what a white-box rogue can compute:
    the notes and the base are public)."""
    screen = robust.ProbeScreen(server.model, server.src.tokenizer_dir)
    screen.recall(server.weights)
    return torch.cat(list(screen._encoded.hidden)).mean(0)


def test_a_rogue_at_an_honest_norm_is_dropped_by_the_probe(
        round1: tuple[dict, list], tiny_base_model: Path, tmp_path: Path) -> None:
    """The rogue scales its push to the median honest norm of every tensor (nothing to clip,
    inside every bound) and aims it with the public probe's own encoder outputs: what it does
    on the public probe notes gives it away."""
    g, honest = round1
    w, rep = honest[ROGUE]
    server = _server(tiny_base_model, tmp_path / "m", g)
    hidden = _probe_hidden(server)
    deltas = robust.updates([h for h, _ in honest], g)
    scale = {}
    for k, t in g.items():
        d = _no_phi_direction(k, t, hidden)
        median = sorted(float(x[k].norm()) for x in deltas)[1]
        scale[k] = 0.999 * median / float(d.norm()) if bool(d.abs().sum()) else 0.0
    rogue = _pushing(g, w, scale, hidden)
    reports.check_update(rogue, g, lr=LR, rule_lr_scale=30.0, steps=rep["trained"])  # passes
    assert server.aggregate(1, [honest[0], (rogue, rep), honest[2]]) == 2
    assert len(server.dropped) == 1 and "probe recall" in server.dropped[0], server.dropped
    assert server.probe_recalls[ROGUE] < min(server.probe_recalls[0], server.probe_recalls[2])
    assert rep["site_id"] not in server.sites


def test_trimmed_mean_trims_at_three_sites(round1: tuple[dict, list], tiny_base_model: Path,
                                           tmp_path: Path) -> None:
    """Flower's trimmed mean cuts int(0.2 n) per end: nothing below five sites. Ours cuts one
    from three on, so at three it is the coordinate-wise median."""
    assert [robust.trim_count(n) for n in (1, 2, 3, 4, 5, 9, 10, 15)] == [0, 0, 1, 1, 1, 1, 2,
                                                                          3]
    g, honest = round1
    got = {}
    for agg in ("mean", "median", "trimmed-mean"):
        server = _server(tiny_base_model, tmp_path / agg, g, aggregation=agg)
        assert server.aggregate(1, honest) == 3
        got[agg] = server.weights
    assert _same(got["trimmed-mean"], got["median"])
    assert not _same(got["trimmed-mean"], got["mean"])
    stack = torch.tensor([[1.0, -5.0], [2.0, 0.0], [100.0, 1.0], [3.0, 2.0]])
    assert torch.equal(robust.trimmed_mean(stack), torch.tensor([2.5, 0.5]))


def test_clipping_scales_the_largest_update_to_the_median_norm() -> None:
    a, b, c = ({"w": torch.full((4,), x, dtype=torch.float64)} for x in (1.0, 2.0, 50.0))
    out, worst = robust.clip_to_median([a, b, c])
    assert [float(d["w"].norm()) for d in out] == [2.0, 4.0, 4.0]
    assert worst == pytest.approx(2 / 50)
    assert torch.allclose(out[2]["w"] / out[2]["w"].norm(), c["w"] / c["w"].norm())


# ------------------------------------------------------------------ identities across restarts


def _resumable(base: Path, tmp_path: Path, g: dict) -> FederationServer:
    return _server(base, tmp_path / "m", g, state_dir=tmp_path / "state", force=True)


def _resume(base: Path, tmp_path: Path) -> FederationServer:
    return FederationServer(_cfg(base, tmp_path / "m", state_dir=tmp_path / "state",
                                 force=True))


def _idle(rep: dict) -> dict:
    return {**rep, "trained": 0}


def test_an_echo_of_a_bound_id_keeps_the_site_also_after_a_restart(
        round1: tuple[dict, list], tiny_base_model: Path, tmp_path: Path) -> None:
    g, honest = round1
    (_, r0), (_, r1), (_, r2) = honest
    server = _resumable(tiny_base_model, tmp_path, g)
    assert server.aggregate(1, [(w, r, 10 + i) for i, (w, r) in enumerate(honest)]) == 3
    server = _resume(tiny_base_model, tmp_path)  # a restarted server
    assert server.nodes == {r0["site_id"]: 10, r1["site_id"]: 11, r2["site_id"]: 12}
    echo = {**_idle(r1), "site_id": r0["site_id"]}  # node 11 echoes site 0's id
    server.aggregate(2, [(None, _idle(r0), 10), (None, echo, 11), (None, _idle(r2), 12)])
    assert server.dropped == ["a site id already bound to another node"]
    # the honest site 0 is kept: its row continues, the echo added nothing
    assert set(server.sites) == set(_ids(honest))
    echo_new_node = {**_idle(r1), "site_id": r0["site_id"]}
    server.aggregate(2, [(None, _idle(r0), 10), (None, echo_new_node, 99)])
    assert server.dropped == ["a site id already bound to another node"]


def test_a_node_cannot_add_a_second_id_after_a_restart(
        round1: tuple[dict, list], tiny_base_model: Path, tmp_path: Path) -> None:
    g, honest = round1
    server = _resumable(tiny_base_model, tmp_path, g)
    assert server.aggregate(1, [(w, r, 10 + i) for i, (w, r) in enumerate(honest)]) == 3
    rows = json.loads((tmp_path / "state" / SERVER_STATE).read_text())["sites"]
    server = _resume(tiny_base_model, tmp_path)
    second = {**_idle(honest[1][1]), "site_id": "e" * 16}  # node 11 as a fourth site
    server.aggregate(2, [(None, _idle(honest[0][1]), 10), (None, second, 11)])
    assert server.dropped == ["a node reported a second site id"]
    assert "e" * 16 not in server.sites and len(server.sites) == len(rows) == 3
    # ... also when it is the only node of the resumed round that Flower kept
    server = _resume(tiny_base_model, tmp_path)
    server.aggregate(2, [(None, second, 11), (None, _idle(honest[2][1]), 77)])
    assert "a node reported a second site id" in server.dropped and "e" * 16 not in server.sites


def test_nodes_numbered_afresh_after_a_restart_rebind(
        round1: tuple[dict, list], tiny_base_model: Path, tmp_path: Path) -> None:
    """The simulation (and a SuperLink without a database) numbers nodes afresh: when no node
    of the resumed round is a known one, the sites continue under their new nodes."""
    g, honest = round1
    server = _resumable(tiny_base_model, tmp_path, g)
    server.aggregate(1, [(w, r, 10 + i) for i, (w, r) in enumerate(honest)])
    server = _resume(tiny_base_model, tmp_path)
    server.aggregate(2, [(None, _idle(r), 50 + i) for i, (_, r) in enumerate(honest)])
    assert server.dropped == [] and server.nodes[honest[0][1]["site_id"]] == 50
    # and from then on the new bindings hold
    server.aggregate(2, [(None, {**_idle(honest[1][1]), "site_id": "e" * 16}, 50)])
    assert server.dropped == ["a node reported a second site id"]


# ------------------------------------------------------------------ resume: the server's weights


@pytest.mark.parametrize("what", ["nan", "inf", "mis-shaped", "missing", "extra", "far",
                                  "not safetensors"])
def test_resume_refuses_broken_weights_with_one_line(
        what: str, round1: tuple[dict, list], tiny_base_model: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    g, honest = round1
    server = _resumable(tiny_base_model, tmp_path, g)
    server.aggregate(1, honest)
    FederationServer(_cfg(tiny_base_model, tmp_path / "m", state_dir=tmp_path / "state",
                          force=True))  # resumes
    path = tmp_path / "state" / SERVER_WEIGHTS
    w = dict(server.weights)
    name = "classifier.bias"
    bound = reports.update_bound(name, lr=LR, rule_lr_scale=30.0, steps=LOCAL)
    if what == "not safetensors":
        path.write_bytes(b"\x80\x04 not a safetensors file")
    else:
        w = {
            "nan": lambda: {**w, name: torch.full_like(w[name], math.nan)},
            "inf": lambda: {**w, name: torch.full_like(w[name], math.inf)},
            "mis-shaped": lambda: {**w, name: torch.zeros(3)},
            "missing": lambda: {k: v for k, v in w.items() if k != name},
            "extra": lambda: {**w, "encoder.extra": torch.zeros(2)},
            "far": lambda: {**w, name: torch.full_like(
                w[name], float(server.initial[name].abs().max()) + 1.01 * bound)},
        }[what]()
        save_file({k: v.contiguous() for k, v in w.items()}, str(path))
    with pytest.raises(ConfigError) as e:
        _resume(tiny_base_model, tmp_path)
    assert "\n" not in e.value.message and "--state-dir" in e.value.message


@pytest.mark.parametrize("what", ["not json", "a list", "round 0", "round past the rounds",
                                  "round a string", "sites a list", "nodes a list",
                                  "node a string"])
def test_resume_refuses_a_broken_state_with_one_line(
        what: str, round1: tuple[dict, list], tiny_base_model: Path, tmp_path: Path) -> None:
    g, honest = round1
    server = _resumable(tiny_base_model, tmp_path, g)
    server.aggregate(1, [(w, r, 10 + i) for i, (w, r) in enumerate(honest)])
    path = tmp_path / "state" / SERVER_STATE
    raw = json.loads(path.read_text())
    if what == "not json":
        path.write_text("{not json")
    else:
        edit = {"a list": lambda: [raw], "round 0": lambda: {**raw, "round": 0},
                "round past the rounds": lambda: {**raw, "round": ROUNDS + 1},
                "round a string": lambda: {**raw, "round": "1"},
                "sites a list": lambda: {**raw, "sites": []},
                "nodes a list": lambda: {**raw, "nodes": [10]},
                "node a string": lambda: {**raw, "nodes": {"a" * 16: "10"}}}[what]
        path.write_text(json.dumps(edit()))
    with pytest.raises(ConfigError) as e:
        _resume(tiny_base_model, tmp_path)
    assert "\n" not in e.value.message and "--state-dir" in e.value.message


def test_resume_takes_weights_within_reach(round1: tuple[dict, list], tiny_base_model: Path,
                                          tmp_path: Path) -> None:
    g, honest = round1
    server = _resumable(tiny_base_model, tmp_path, g)
    server.aggregate(1, honest)
    again = _resume(tiny_base_model, tmp_path)
    assert again.round == 1 and _same(again.weights, server.weights)


# ------------------------------------------------------------------ reports beyond sane bounds


def _consistent_million(r: dict) -> dict:
    """A rogue's self-consistent report of 1,000,000-1,999,999 patients: q, δ, the expected
    batch and ε all agree with that count (and with batch size 2)."""
    ds = json.loads(r["dataset"])
    million = {**ds, "patients": "1000000-1999999", "notes": "1000000-1999999",
               "sequences": "1000000-1999999"}
    rep = {**r, "units": "1000000-1999999", "sample_rate": 1 / 600_000, "delta": 1e-7,
           "expected_batch": "2-4", "dataset": json.dumps(million, sort_keys=True)}
    rep["epsilon"] = site_epsilon(rep)
    return rep


def _huge_epsilon(r: dict) -> dict:
    rep = {**r, "noise_multiplier": 0.3}
    rep["epsilon"] = site_epsilon(rep)
    assert rep["epsilon"] > 20  # the federation asks for 8
    return rep


@pytest.mark.parametrize("what", ["million", "epsilon"])
def test_a_self_consistent_lie_beyond_sane_bounds_is_refused(
        what: str, round1: tuple[dict, list], tiny_base_model: Path, tmp_path: Path) -> None:
    g, honest = round1
    w, r = honest[0]
    rep = _consistent_million(r) if what == "million" else _huge_epsilon(r)
    server = _server(tiny_base_model, tmp_path / "m", g)
    assert server.aggregate(1, [(w, rep)]) == 0 and server.sites == {}
    assert ("cap" if what == "million" else "above the federation's target") \
        in server.dropped[0]
    ok = _server(tiny_base_model, tmp_path / "ok", g)  # the honest report itself passes
    assert ok.aggregate(1, [(w, r)]) == 1


def test_the_caps_are_the_documented_ones() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "federated.md").read_text()
    assert f"{reports.MAX_SITE_UNITS:,}" in doc and f"{robust.PROBE_MARGIN:g}" in doc
