"""The privacy ledger (issue 38, item 1), exact composition of DP-SGD histories, and the refusal of
calibrated thresholds in a DP distillation (item 3).

Tiny random BERT, synthetic notes, RDP accountant with an explicit σ and a few steps: each
training takes a second or two. Each test fails on the code before the ledger: ``--init-from``
was never composed (the card claimed the second run's ε alone and passed the policy).
"""

from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path

import pytest
import torch

from dphub import formats, synth
from dphub import train as T
from dphub.card import load_card, validate_meta
from dphub.cli.main import main
from dphub.errors import ConfigError, DphubError
from dphub.hub import gate
from dphub.hub.policy import load_hub_policy, policy_violation
from dphub.hub.validate import validate_card
from dphub.privacy import accounting
from dphub.privacy import ledger as L
from dphub.privacy.composition import GaussianSteps, Part, compose, history_epsilon


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "home"))


def _write(notes, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    formats.write(notes, path, "jsonl")
    return path


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``same``: 6 patients; ``copy``: the same notes at another path; ``superset``: those plus
    notes of 3 more patients; ``disjoint``: 4 other patients (ids that share nothing)."""
    root = tmp_path_factory.mktemp("corpora")
    base = synth.generate(16, kind="nursing", seed=3, patients=6)
    more = [n.__class__(f"x-{n.id}", n.text, f"x-{n.patient_id}", n.metadata, n.spans,
                        n.labelled)
            for n in synth.generate(6, kind="nursing", seed=4, patients=3)]
    other = [n.__class__(f"o-{n.id}", n.text, f"o-{n.patient_id}", n.metadata, n.spans,
                         n.labelled)
             for n in synth.generate(10, kind="nursing", seed=5, patients=4)]
    return {"same": _write(base, root / "a" / "train.jsonl"),
            "copy": _write(base, root / "b" / "elsewhere.jsonl"),
            "superset": _write([*base, *more], root / "c" / "train.jsonl"),
            "disjoint": _write(other, root / "d" / "train.jsonl")}


def _opts(data: Path, base: Path, out: Path, **kw) -> T.TrainOptions:
    o = dict(data=data, out=out, base_model=str(base), warm_start="none", epochs=1.0,
             batch_size=2, max_physical_batch=4, noise=1.0, accountant="rdp", max_length=64,
             stride=16, checkpoint_every=50)
    o.update(kw)
    return T.TrainOptions(**o)


def _hub_with_policy(tmp_path: Path, max_epsilon: float) -> Path:
    hub = tmp_path / "hub"
    hub.mkdir()
    (hub / "dphub-policy.json").write_text(json.dumps({"max_epsilon": max_epsilon,
                                                       "min_unit": "patient"}))
    return hub


def _two_trainings(corpora, tiny_base_model, tmp_path, second: str, **kw):
    first = tmp_path / "first"
    r1 = T.train(_opts(corpora["same"], tiny_base_model, first))
    out = tmp_path / "second"
    r2 = T.train(_opts(corpora[second], tiny_base_model, out, init_from=str(first), **kw))
    return r1, r2, out


@pytest.mark.parametrize("second", ["copy", "superset"])
def test_init_from_on_the_same_patients_composes_and_the_policy_sees_the_total(
        corpora, tiny_base_model: Path, tmp_path: Path, second: str) -> None:
    """Two DP trainings on the same notes (written at another path), or on a superset:
    the second's card claims both runs composed, `card validate` holds it to that, and a hub
    whose policy lies between either run's ε and the total refuses it."""
    r1, r2, out = _two_trainings(corpora, tiny_base_model, tmp_path, second)
    validate_card(out, require_private=True)
    dp = load_card(out).dp
    [entry] = dp["lineage"]
    assert entry["role"] == "init_from" and entry["composed"] is True
    assert entry["weights_sha256"] == load_card(tmp_path / "first").dp["weights_sha256"]
    # both runs are plain Gaussian DP-SGD: their histories compose in one RDP accountant
    exact = history_epsilon("rdp", [
        GaussianSteps("rdp", r1.sample_rate, r1.noise_multiplier, r1.steps),
        GaussianSteps("rdp", r2.sample_rate, r2.noise_multiplier, r2.steps)],
        r1.delta + r2.delta)
    assert dp["composition"]["method"] == "rdp"
    assert dp["epsilon"] == pytest.approx(exact, rel=1e-9)
    assert max(r1.epsilon, r2.epsilon) < dp["epsilon"] <= r1.epsilon + r2.epsilon
    assert dp["delta"] == pytest.approx(r1.delta + r2.delta)
    body = load_card(out).body  # the words say so too (they used to say "this round only")
    assert "may have been trained on the same units" in body
    assert "covers only the data of this training round" not in body
    # the keyed patient digests stay local: nothing of the ledger on the published card
    text = (out / "README.md").read_text(encoding="utf-8")
    for rec in L.load_ledger().releases:
        assert not any(d in text for d in rec.patients) and rec.dataset not in text
    # the policy applies to the composed total
    # (what `dphub publish` checks; a tiny test base has no public tokenizer to resolve, so
    # publish itself stops earlier for an unrelated reason)
    hub = _hub_with_policy(tmp_path, (max(r1.epsilon, r2.epsilon) + dp["epsilon"]) / 2)
    summary = gate.CardSummary.from_meta(gate.check_card(out))
    assert summary.epsilon == pytest.approx(dp["epsilon"])
    why = policy_violation(summary.epsilon, summary.unit, load_hub_policy(str(hub)))
    assert why is not None and "exceeds the policy's maximum" in why
    assert policy_violation(r2.epsilon, summary.unit, load_hub_policy(str(hub))) is None
    # a card edited back to the second run's ε alone is an under-claim
    forged = copy.deepcopy(load_card(out).meta)
    forged["differential_privacy"]["epsilon"] = r2.epsilon
    with pytest.raises(DphubError, match="differential_privacy.epsilon"):
        validate_meta(forged)
    # the ledger knows both releases share the dataset's patients
    spend = L.dataset_spend(L.load_ledger(), L.patient_digests(formats.read(corpora[second])))
    assert [r.kind for r, _ in spend.releases] == ["train", "init_from"]
    assert spend.total is not None and spend.total.epsilon == pytest.approx(dp["epsilon"])


def test_disjoint_parent_declared_does_not_add_and_a_false_declaration_is_refused(
        corpora, tiny_base_model: Path, tmp_path: Path) -> None:
    r1, r2, out = _two_trainings(corpora, tiny_base_model, tmp_path, "disjoint",
                                 disjoint_teacher=True)
    validate_card(out, require_private=True)
    dp = load_card(out).dp
    assert dp["lineage"][0]["composed"] is False and "composition" not in dp
    assert dp["epsilon"] == pytest.approx(r2.epsilon, rel=1e-9)
    # the ledger recorded the parent's patients: declaring this corpus disjoint is refused
    for name in ("same", "superset"):
        with pytest.raises(ConfigError, match="--disjoint-teacher: the privacy ledger"):
            T.train(_opts(corpora[name], tiny_base_model, tmp_path / f"bad-{name}",
                          init_from=str(tmp_path / "first"), disjoint_teacher=True))
        assert not (tmp_path / f"bad-{name}").exists()
    # not declared: composed even on disjoint notes (the trainer has said nothing)
    out3 = tmp_path / "third"
    T.train(_opts(corpora["disjoint"], tiny_base_model, out3, init_from=str(tmp_path / "first")))
    assert load_card(out3).dp["epsilon"] > r2.epsilon * 1.01
    with pytest.raises(ConfigError, match="give --init-from"):
        T.train(_opts(corpora["same"], tiny_base_model, tmp_path / "x", disjoint_teacher=True))


def test_the_ledger_is_private_keyed_and_recognises_a_dataset_anywhere(
        corpora, tmp_path: Path) -> None:
    notes = list(formats.read(corpora["same"]))
    a, b = L.patient_digests(notes), L.patient_digests(formats.read(corpora["copy"]))
    assert a == b and len(a) == 6
    sup = L.patient_digests(formats.read(corpora["superset"]))
    assert a < sup and a.isdisjoint(L.patient_digests(formats.read(corpora["disjoint"])))
    d = L.ledger_dir()
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(d / L.KEY_FILE).st_mode) == 0o600
    # another key (another site): other digests, so nothing links the two ledgers
    assert L.patient_digests(notes, key=b"k" * 32).isdisjoint(a)
    L.record_release(L.Release("a" * 64, "train", 2.0, 1e-5, "patient", a))
    L.record_release(L.Release("b" * 64, "train", 3.0, 1e-5, "patient", sup))
    assert stat.S_IMODE(os.stat(d / L.LEDGER_FILE).st_mode) == 0o600
    raw = (d / L.LEDGER_FILE).read_text(encoding="utf-8")
    for n in notes:  # neither patient ids nor note text
        assert f'"{n.patient_id}"' not in raw and n.text[:20] not in raw
    spend = L.dataset_spend(L.load_ledger(), a)
    assert spend.total is not None and spend.total.epsilon == pytest.approx(5.0)  # basic
    assert L.dataset_spend(L.load_ledger(), frozenset({"z"})).total is None
    with pytest.raises(ConfigError, match="unknown release kind"):
        L.record_release(L.Release("c" * 64, "guess", 1.0, 1e-5, "patient", a))


def test_a_broken_or_shared_ledger_is_one_error_and_left_alone(tmp_path: Path) -> None:
    d = L.ledger_dir()
    L.ledger_key()
    L.record_release(L.Release("a" * 64, "train", 2.0, 1e-5, "patient", frozenset({"x"})))
    (d / L.LEDGER_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="not a dphub ledger"):
        L.record_release(L.Release("b" * 64, "train", 2.0, 1e-5, "patient", frozenset({"x"})))
    assert (d / L.LEDGER_FILE).read_text() == "{not json"
    os.chmod(d / L.KEY_FILE, 0o644)
    with pytest.raises(ConfigError, match="not a private key file"):
        L.ledger_key()
    os.chmod(d / L.KEY_FILE, 0o600)
    os.chmod(d, 0o755)
    with pytest.raises(ConfigError, match="not a private directory"):
        L.ledger_key()


def test_exact_composition_is_one_accountant_over_both_histories() -> None:
    """RDP composition of two runs equals one run of all their steps; basic when one part has
    no history; never above the basic sum."""
    q, sigma, steps, delta = 0.25, 1.1, 8, 1e-5
    one = accounting.epsilon_for("rdp", q, sigma, steps, delta / 2)
    h = (GaussianSteps("rdp", q, sigma, steps),)
    c = compose([Part(one, delta / 2, h), Part(one, delta / 2, h)])
    assert c.method == "rdp"
    assert c.epsilon == pytest.approx(accounting.epsilon_for("rdp", q, sigma, 2 * steps, delta))
    assert c.epsilon < c.basic_epsilon == pytest.approx(2 * one)
    b = compose([Part(one, delta / 2, h), Part(one, delta / 2)])
    assert b.method == "basic" and b.epsilon == pytest.approx(2 * one)
    assert compose([Part(1.0, 1e-6, h)]).epsilon == 1.0
    p = compose([Part(one, delta / 2, (GaussianSteps("prv", q, sigma, steps),))] * 2)
    assert p.method == "prv" and p.epsilon <= 2 * one


def test_cli_init_from_refuses_above_the_policy_before_training_and_ledger_show(
        corpora, tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    common = ["--base-model", str(tiny_base_model), "--warm-start", "none", "--epochs", "1",
              "--batch-size", "2", "--noise", "1.0", "--accountant", "rdp"]
    assert main(["train", str(corpora["same"]), "--out", "m1", *common]) == 0
    eps1 = load_card(tmp_path / "m1").dp["epsilon"]
    hub = _hub_with_policy(tmp_path, eps1 * 1.1)  # one run fits, two composed do not
    monkeypatch.setenv("DPHUB_HUB", str(hub))
    (tmp_path / "dphub.toml").write_text(f'[hub]\nurl = "{hub}"\n')
    capsys.readouterr()
    assert main(["train", str(corpora["same"]), "--out", "m2", "--init-from", "m1",
                 *common]) == 2
    err = capsys.readouterr().err
    assert "exceeds the maximum" in err and "nothing was trained" in err
    assert "Traceback" not in err and not (tmp_path / "m2").exists()
    assert main(["ledger", "show", str(corpora["copy"])]) == 0
    out = capsys.readouterr().out
    assert "6 patients" in out and "train" in out and "spent: ε =" in out
    assert main(["ledger", "show"]) == 0
    assert "dataset " in capsys.readouterr().out


def test_dp_distillation_refuses_calibrated_thresholds(tiny_base_model: Path,
                                                       tmp_path: Path) -> None:
    """Item 3: thresholds fitted on the owner's notes make every label depend on other
    patients; a DP student refuses them in one message, before any labelling."""
    from dphub.ensemble.core import Ensemble, Slot
    from dphub.ensemble.members import ModelMember
    from dphub.owner.distill import distill, local_options
    from dphub.rules.engine import RuleMember, RuleOptions

    notes = synth.generate(8, kind="nursing", seed=5, patients=3)
    teacher = tmp_path / "teacher"
    T.train(_opts(_write(notes, tmp_path / "n.jsonl"), tiny_base_model, teacher))
    dp = load_card(teacher).dp
    rules = Slot(RuleMember("rules:default", RuleOptions()), None, 0.0)

    def slot(**kw) -> Slot:
        return Slot(ModelMember.load(teacher, "t"), kw.get("threshold"), dp["epsilon"],
                    dp["privacy_unit"], None, kw.get("label_thresholds"), dp["delta"])

    opts = local_options(T.TrainOptions(out=tmp_path / "s", base_model=str(tiny_base_model),
                                        warm_start="none", noise=1.0, accountant="rdp",
                                        epochs=1.0, max_length=64, stride=16), dp=True)
    for kw in ({"threshold": 0.4}, {"label_thresholds": {"NAME": 0.2}}):
        with pytest.raises(ConfigError, match="thresholds fitted on your notes"):
            distill(Ensemble([rules, slot(**kw)]), notes, opts)
        assert not (tmp_path / "s").exists()
    # a local (non-DP) student may use them: it claims no guarantee
    local = local_options(T.TrainOptions(out=tmp_path / "loc", base_model=str(tiny_base_model),
                                         warm_start="none", epochs=1.0, max_length=64,
                                         stride=16), dp=False)
    distill(Ensemble([rules, slot(threshold=0.4)]), notes, local)
    assert load_card(tmp_path / "loc").dp.get("local_only") is True


@pytest.mark.filterwarnings("ignore")
def test_a_federated_site_records_its_spend_over_all_rounds(
        corpora, tiny_base_model: Path, tmp_path: Path) -> None:
    """The site hook: one ledger record per site, its accountant over every round so far."""
    from dphub.federate.site import RoundOrder, Site

    opts = dict(warm_start="none", batch_size=2, max_physical_batch=8, accountant="rdp",
                max_length=48, stride=8, lr=1e-2, rule_features=False,
                base_model=str(tiny_base_model))
    site = Site(corpora["same"], tmp_path / "site", opts)
    weights = {n: p.detach().clone() for n, p in site.model.named_parameters()
               if p.requires_grad}
    for rnd in (1, 2):
        order = RoundOrder(round=rnd, rounds=2, local_steps=2, target_epsilon=8.0,
                           frozen_digest=site.frozen_digest)
        weights, report = site.train_round(order, weights)
        [rec] = L.load_ledger().releases
        assert rec.kind == "federated_round" and rec.history[0].steps == 2 * rnd
        assert rec.epsilon == pytest.approx(report["epsilon"], rel=1e-9)
    assert rec.patients == L.patient_digests(formats.read(corpora["copy"]))


def test_a_dp_student_and_its_public_student_are_recorded(tiny_base_model: Path,
                                                          tmp_path: Path) -> None:
    """distill --dp re-records its run as a distillation with the final claim; a public student
    of it spends nothing but carries its patients and its claim."""
    from dphub.ensemble.core import Ensemble, Slot
    from dphub.owner.distill import distill, local_options
    from dphub.owner.public_student import PublicInputs, Teacher, distill_public
    from dphub.rules.engine import RuleMember, RuleOptions

    notes = synth.generate(8, kind="nursing", seed=5, patients=3)
    rules = Ensemble([Slot(RuleMember("rules:default", RuleOptions()), None, 0.0)])

    def opts(out: Path) -> T.TrainOptions:
        return T.TrainOptions(out=out, base_model=str(tiny_base_model), warm_start="none",
                              epochs=1.0, max_length=64, stride=16, accountant="rdp",
                              noise=1.0, checkpoint_every=50, batch_size=2)

    teacher = tmp_path / "teacher"
    distill(rules, notes, local_options(opts(teacher), dp=True))
    tdp = load_card(teacher).dp
    [rec] = L.load_ledger().releases
    assert rec.kind == "distill" and rec.release == tdp["weights_sha256"]
    assert rec.epsilon == pytest.approx(tdp["epsilon"])
    assert rec.patients == L.patient_digests(notes)
    student = tmp_path / "student"
    distill_public(Teacher.load(teacher, "acme/dp-teacher", "abc123"),
                   local_options(opts(student), dp=False), PublicInputs(notes=5, synth_seed=7))
    pub = L.load_ledger().find(load_card(student).dp["weights_sha256"])
    assert pub is not None and pub.kind == "public_student" and pub.parents == (rec.release,)
    assert pub.patients == rec.patients and pub.epsilon == rec.epsilon
    # the dataset's spend counts the teacher once (the student is its post-processing)
    spend = L.dataset_spend(L.load_ledger(), rec.patients)
    assert spend.total is not None and spend.total.epsilon == pytest.approx(rec.epsilon)


def test_train_refuses_above_the_policy_by_itself(corpora, tiny_base_model: Path,
                                                  tmp_path: Path) -> None:
    """Issue 39 item 6: a library caller of train() gets the policy check before the first step
    (the default policy, or its own), on the composed claim; allow_above_policy overrides."""
    from dphub.errors import PrivacyError
    from dphub.privacy.policy import Policy

    first = tmp_path / "first"
    r1 = T.train(_opts(corpora["same"], tiny_base_model, first))
    second = tmp_path / "second"
    tight = Policy(max_epsilon=r1.epsilon * 1.05)  # one run fits, the composition does not
    with pytest.raises(PrivacyError, match=r"exceeds the maximum .* of the policy .*"
                                           r"nothing was trained"):
        T.train(_opts(corpora["same"], tiny_base_model, second, init_from=str(first),
                      policy=tight))
    assert not second.exists()
    with pytest.raises(PrivacyError, match="of the default policy"):  # ε ≈ 60 at σ = 0.3
        T.train(_opts(corpora["same"], tiny_base_model, second, noise=0.3, epochs=4.0))
    assert not second.exists()
    T.train(_opts(corpora["disjoint"], tiny_base_model, second, init_from=str(first),
                  policy=tight, allow_above_policy=True))
    assert load_card(second).dp["epsilon"] > tight.max_epsilon
