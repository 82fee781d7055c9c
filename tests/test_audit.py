"""The empirical privacy audit: the one-run bound's arithmetic, canaries, and three training runs.

The end-to-end tests train the session's tiny BERT head-only (cached encoder) on 4 synthetic
notes plus 32 short canary patients. Head-only training of a 32-wide model still memorises the
canaries' one-piece name words within ~40 full-batch steps at lr 0.1 without DP, which is what
makes the attack strong enough to tell a broken mechanism from a working one.

The statistical assertions hold with high probability, not always: the canaries and inclusion
bits come from the OS on purpose. The DP assertions run at σ = 100 (proven ε ≈ 0.3, actual
leakage ≈ 0), where a spurious bound above the proven ε needs an event of probability well below
1%.
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dphub import audit as A
from dphub import formats, synth
from dphub import train as T
from dphub.card import audit as card_audit
from dphub.errors import CardError, ConfigError
from dphub.privacy import audit_bound as B

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # the CLI records the last model in ./.dphub/


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    notes = synth.generate(4, kind="nursing", seed=3, patients=2)
    path = tmp_path_factory.mktemp("corpus") / "train.jsonl"
    formats.write(notes, path, "jsonl")
    return path


class _SeededSecrets:
    """The audit's OS randomness (canaries, secrets, inclusion bits) from a seeded generator.

    The end-to-end tests below assert that an attack *works* on a tiny model; with fresh OS
    randomness they were a lottery (about 1 run in 7 drew canaries the tiny model did not
    memorise). Seeding them makes each test one fixed, checked draw; that the audit really draws
    from the OS is tested separately (``test_inclusion_bits_come_from_secrets``).
    """

    def __init__(self, seed: int) -> None:
        self._r = random.Random(seed)

    def SystemRandom(self) -> random.Random:  # noqa: N802 - mirrors secrets.SystemRandom
        return random.Random(self._r.getrandbits(64))

    def token_hex(self, nbytes: int = 32) -> str:
        return self._r.getrandbits(8 * nbytes).to_bytes(nbytes, "big").hex()

    def randbits(self, k: int) -> int:
        return self._r.getrandbits(k)


@pytest.fixture
def seeded_canaries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(A, "secrets", _SeededSecrets(20261123))


def _opts(corpus: Path, base: Path, out: Path, **kw) -> T.TrainOptions:
    o = dict(data=corpus, out=out, base_model=str(base), warm_start="none", epochs=40.0,
             batch_size=1000, max_physical_batch=64, accountant="rdp", max_length=48, stride=8,
             lr=0.1, train_layers=0, recall_weight=0.0, noise=100.0)
    o.update(kw)
    return T.TrainOptions(**o)


AUDIT = A.AuditOptions(canaries=32, notes_per_canary=2, candidates=15, max_note_chars=200,
                       method="patients")


# ---------------------------------------------------------------- the bound's arithmetic


def test_p_value_matches_hand_computed_cases() -> None:
    # ε = 0: q = 1/2. r = v = 10, δ = 0: P[Bin(10, 1/2) >= 10] = 2^-10
    assert B.p_value(20, 10, 10, 0.0, 0.0) == pytest.approx(2.0 ** -10)
    # r = 4, v = 3, ε = ln 3 (q = 3/4): P[B >= 3] = 4 (3/4)^3 (1/4) + (3/4)^4 = 189/256
    assert B.p_value(4, 4, 3, math.log(3), 0.0) == pytest.approx(189 / 256)
    # with δ: m = 10, r = v = 2, ε = 0, δ = 0.01. P[B = 2] = 1/4; alpha = max(P[B = 1] / 1,
    # P[0 <= B < 2] / 2) = max(1/2, 3/8) = 1/2; p = 1/4 + 2 * 10 * 0.01 * 1/2 = 0.35
    assert B.p_value(10, 2, 2, 0.0, 0.01) == pytest.approx(0.35)
    # no guesses, nothing to reject
    assert B.p_value(10, 0, 0, 1.0, 1e-5) == 1.0
    with pytest.raises(ConfigError):
        B.p_value(5, 6, 1, 1.0, 0.0)


def test_epsilon_lower_bound_solves_the_tail_equation() -> None:
    # r = v = 10, δ = 0, 95%: q^10 = 0.05 -> q = 0.05^(1/10), ε = ln(q / (1 - q))
    q = 0.05 ** 0.1
    assert B.epsilon_lower_bound(10, 10, 10, 0.0, 0.95) == pytest.approx(math.log(q / (1 - q)),
                                                                         abs=1e-6)
    # half right is what ε = 0 predicts: no bound
    assert B.epsilon_lower_bound(100, 100, 50, 1e-5, 0.95) == 0.0
    # more correct guesses, higher bound; more confidence, lower bound; δ only lowers it
    assert B.epsilon_lower_bound(64, 32, 32, 0, 0.95) > B.epsilon_lower_bound(64, 32, 30, 0, 0.95)
    assert B.epsilon_lower_bound(64, 32, 32, 0, 0.99) < B.epsilon_lower_bound(64, 32, 32, 0, 0.95)
    assert B.epsilon_lower_bound(64, 32, 32, 1e-3, 0.95) < B.epsilon_lower_bound(64, 32, 32, 0,
                                                                                 0.95)


def test_one_run_bound_uses_scores_not_bits_and_pays_for_its_choices() -> None:
    m = 32
    included = [i % 2 == 0 for i in range(m)]
    perfect = [1.0 if b else -1.0 for b in included]
    best = B.one_run_bound(perfect, included, 0.0, 0.95)
    assert best.correct == best.guesses == m
    # the best of three guess counts is valid at 95% only because each was run at 1 - 0.05/3
    assert best.epsilon == pytest.approx(B.epsilon_lower_bound(m, m, m, 0.0, 1 - 0.05 / 3))
    assert best.epsilon < B.epsilon_lower_bound(m, m, m, 0.0, 0.95)
    assert B.max_possible_bound(m, 0.0, 0.95) == pytest.approx(best.epsilon)
    assert 2.5 < B.max_possible_bound(64, 1e-5, 0.95) < 3.0  # why ε = 8 cannot fail an audit
    # scores unrelated to membership: no bound
    rng = np.random.default_rng(0)
    assert B.one_run_bound(list(rng.normal(size=m)), included, 1e-5, 0.95).epsilon < 0.5
    # guessing exactly wrong: no bound
    assert B.one_run_bound([-s for s in perfect], included, 1e-5, 0.95).epsilon == 0.0


def test_score_rank_and_exposure() -> None:
    s = A.score([1.0, 2.0, 4.0, 3.0])  # the true secret has the lowest loss of 4 candidates
    assert s.rank == 1 and s.exposure == pytest.approx(2.0)
    assert s.score == pytest.approx(math.log(3.0))
    s = A.score([5.0, 2.0, 4.0, 3.0])  # the highest: no exposure
    assert s.rank == 4 and s.exposure == pytest.approx(0.0) and s.score < 0


# ---------------------------------------------------------------- canaries


def test_canaries_carry_their_secret_and_are_drawn_from_the_os(tiny_base_model: Path) -> None:
    from transformers import AutoTokenizer

    pool = A.name_pool(AutoTokenizer.from_pretrained(tiny_base_model))
    a = A.make_canaries(8, pool, notes_per_canary=2, alternatives=3, max_note_chars=200)
    b = A.make_canaries(8, pool, notes_per_canary=2, alternatives=3, max_note_chars=200)
    # fresh secrets every call (no seed can replay them)
    assert {c.secret for c in a}.isdisjoint({c.secret for c in b})
    words = [w for c in a for s in (c.secret, *c.alternatives) for w in (s.first, s.last)]
    assert len(words) == len(set(words)), "an alternative must never be another canary's secret"
    for c in a:
        notes = c.notes()
        assert len(notes) == 2 and all(n.patient_id == c.patient_id for n in notes)
        for n in notes:
            labels = {(n.text[s.start:s.end], s.label) for s in n.spans}
            assert (f"{c.secret.first} {c.secret.last}", "PATIENT") in labels
            assert (c.secret.mrn, "MEDICALRECORD") in labels and (c.secret.dob, "DATE") in labels
        # an alternative changes only the secret
        alt = c.notes(c.alternatives[0])[0]
        assert c.secret.first not in alt.text and len(alt.spans) == len(notes[0].spans)


def test_inclusion_bits_come_from_secrets(monkeypatch: pytest.MonkeyPatch,
                                          tiny_base_model: Path) -> None:
    from transformers import AutoTokenizer

    pool = A.name_pool(AutoTokenizer.from_pretrained(tiny_base_model))
    calls = []
    real = A.secrets.randbits

    def spy(k: int) -> int:
        calls.append(k)
        return real(k)

    monkeypatch.setattr(A.secrets, "randbits", spy)
    A.make_canaries(6, pool, notes_per_canary=1, alternatives=2)
    assert calls.count(1) == 6


def test_audit_refuses_note_level_units(corpus: Path, tiny_base_model: Path,
                                        tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="patient-level"):
        A.run_audit(_opts(corpus, tiny_base_model, tmp_path / "m", privacy_unit="note"), AUDIT)
    assert not (tmp_path / "m").exists()


def test_schema_refuses_a_failed_or_malformed_block() -> None:
    from dphub.card import validate_meta

    meta = {"tags": ["token-classification", "de-identification", "phi", "differential-privacy",
                     "dp-sgd"], "library_name": "transformers",
            "pipeline_tag": "token-classification", "base_model": "org/base", "language": ["en"],
            "license": "apache-2.0", "differential_privacy": {"private": False, "epsilon": None},
            "dataset": {"patients": "2-4", "notes": "2-4", "sequences": "5-9",
                        "phi_per_category": {}, "note_types": {}, "language": "en",
                        "label_schema": "hipaa"}}
    canaries = [A.Canary(f"c{i}", [], A.Secret("A", "B", "1", "2"), [], i % 2 == 0)
                for i in range(4)]
    scores = [A.CanaryScore(1.0 if c.included else -1.0, 1.0, 1.0, 1.0) for c in canaries]
    block = A.audit_block(scores, canaries, delta=1e-5, proven_epsilon=None,
                          audit=A.AuditOptions(canaries=4))
    validate_meta({**meta, "empirical_audit": block})
    for bad in ({"verdict": "failed"}, {"secret": "Piano Kettle"}, {"date": "yesterday"},
                {"epsilon_lower_bound": -1}):
        with pytest.raises(CardError, match="empirical_audit"):
            validate_meta({**meta, "empirical_audit": {**block, **bad}})
    # a verdict the card's own numbers contradict (schema-valid): card validation refuses it
    with pytest.raises(CardError, match="empirical_audit.verdict"):
        validate_meta({**meta, "empirical_audit": {**block, "verdict": "passed"}})


def test_check_audit_block_refuses_failed_or_inconsistent_blocks() -> None:
    block = {"epsilon_lower_bound": 1.0, "max_possible_bound": 3.0, "proven_epsilon": 0.5,
             "verdict": "failed"}
    meta = {"differential_privacy": {"private": True, "epsilon": 0.5}, "empirical_audit": block}
    with pytest.raises(CardError, match="FAILED"):
        card_audit.check_audit_block(meta)
    block["verdict"] = "passed"
    with pytest.raises(CardError, match="verdict"):
        card_audit.check_audit_block(meta)
    block["epsilon_lower_bound"] = 0.1
    card_audit.check_audit_block(meta)
    card_audit.check_audit_block({"differential_privacy": {"private": True, "epsilon": 0.5}})


# ---------------------------------------------------------------- end to end


@pytest.mark.slow
def test_non_private_run_beats_a_high_noise_dp_run(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    seeded_canaries: None,
) -> None:
    from dphub.card import load_card
    from dphub.cli.main import main
    from dphub.hub.validate import validate_card

    base = A.run_audit(_opts(corpus, tiny_base_model, tmp_path / "nodp", no_dp=True,
                             noise=None), AUDIT)
    dp = A.run_audit(_opts(corpus, tiny_base_model, tmp_path / "dp"), AUDIT)

    assert base.verdict == "not-private" and dp.verdict == "passed"
    assert base.epsilon_lower_bound > 0.3, base.block  # the attack works without DP
    assert base.epsilon_lower_bound > dp.epsilon_lower_bound
    # the proven ε of a correct DP run is never beaten
    assert dp.block["proven_epsilon"] == pytest.approx(dp.train.epsilon, abs=1e-3)
    assert dp.epsilon_lower_bound <= dp.train.epsilon
    # without DP the included canaries' secrets are exposed, the excluded ones are not
    assert base.block["exposure"]["mean_included"] > base.block["exposure"]["mean_excluded"] + 1

    # the card carries the block, validated by the schema and the gate's check
    card = validate_card(tmp_path / "dp", require_private=True)
    assert card.meta["empirical_audit"] == dp.block
    card_audit.check_audit_block(card.meta)
    assert "## Empirical privacy audit" in card.body and "lower bound, not a proof" in card.body
    assert "proven ε still holds for every real patient" in card.body
    assert dp.block["max_possible_bound"] > dp.train.epsilon  # this audit could have failed
    # the dataset block describes the real corpus, not the canaries
    assert card.meta["dataset"]["patients"] == "2-4"
    assert not any(p.name.startswith(".dp.audit") for p in tmp_path.iterdir())
    assert load_card(tmp_path / "nodp").meta["empirical_audit"]["proven_epsilon"] is None

    # the publish gate validates the block when present (through the card schema)
    from dphub.card import CARD_FILE, build_card
    from dphub.hub.gate import GateViolation, check_card

    check_card(tmp_path / "dp")
    bad = tmp_path / "dp-bad"
    shutil.copytree(tmp_path / "dp", bad)
    meta = load_card(bad).meta
    meta["empirical_audit"]["verdict"] = "failed"
    (bad / CARD_FILE).write_text(build_card(meta), encoding="utf-8")
    with pytest.raises(GateViolation, match="empirical_audit.verdict"):
        check_card(bad)

    capsys.readouterr()
    assert main(["card", "show", str(tmp_path / "dp")]) == 0
    shown = capsys.readouterr().out
    assert "EMPIRICAL AUDIT (a lower bound, not a proof)" in shown
    assert f"ε ≥ {dp.epsilon_lower_bound:.4g}" in shown and "proven ε = " in shown
    assert main(["card", "show", "--json", str(tmp_path / "dp")]) == 0
    assert json.loads(capsys.readouterr().out)["empirical_audit"] == dp.block


@pytest.mark.slow
def test_broken_mechanism_is_caught(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], seeded_canaries: None,
) -> None:
    """Noise off while the card reports σ = 100: the audit's bound beats the claimed ε."""
    from dphub.cli.main import main
    from dphub.privacy import randomness as R

    def no_noise(self, shape, std, dtype=torch.float32, device="cpu"):  # noqa: ANN001
        return torch.zeros(shape, dtype=dtype, device=device)

    monkeypatch.setattr(R.MechanismRandomness, "normal", no_noise)
    out = tmp_path / "broken"
    code = main([
        "audit", str(corpus), "--out", str(out), "--base-model", str(tiny_base_model),
        "--warm-start", "none", "--epochs", "40", "--batch-size", "1000",
        "--max-physical-batch", "64", "--accountant", "rdp", "--lr", "0.1",
        "--train-layers", "0", "--recall-weight", "0", "--noise", "100",
        "--method", "patients", "--canaries", "32", "--canary-notes", "2",
        # 400 characters: enough of each reworded synthetic template to hold its name slots
        # (at 200 the seeded draw of this test kept too few secrets to beat σ = 100's tiny ε)
        "--canary-note-chars", "400",
    ])
    err = capsys.readouterr().err
    assert code == 2, err
    # the privacy plan (and its q = 1 note) before the first step, then one error line
    plan, *notes, failed = err.splitlines()
    assert plan.startswith("privacy plan: ") and failed.startswith("error: audit FAILED")
    assert all(n.startswith("note: ") for n in notes)
    assert "Traceback" not in err
    bound, proven = (float(x) for x in re.findall(r"ε(?: lower bound)? ([0-9.]+)", err)[:2])
    assert bound > proven
    # a card claiming an ε the model demonstrably lacks is never written
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if ".audit-" in p.name]


def test_weak_non_private_audit_says_so(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One step at a tiny learning rate memorises nothing: the command says the audit is weak."""
    from dphub.cli.main import main

    code = main([
        "audit", str(corpus), "--out", str(tmp_path / "weak"), "--base-model",
        str(tiny_base_model), "--warm-start", "none", "--epochs", "1", "--batch-size", "1000",
        "--lr", "1e-7", "--train-layers", "0", "--no-dp", "--method", "patients",
        "--canaries", "8",
        "--canary-notes", "1", "--canary-note-chars", "80", "--candidates", "3",
    ])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "audit too weak to mean anything" in captured.err
    assert "lower bound, not a proof" in captured.out


def test_describe_says_when_an_audit_could_not_have_failed() -> None:
    """64 canary patients at ε 8: the issue's "passed" that could not fail is inconclusive."""
    canaries = [A.Canary(f"c{i}", [], A.Secret("A", "B", "1", "2"), [], i % 2 == 0)
                for i in range(64)]
    scores = [A.CanaryScore(0.0, 1.0, 8.0, 1.0) for _ in canaries]
    block = A.audit_block(scores, canaries, delta=1e-5, proven_epsilon=8.0,
                          audit=A.AuditOptions(method="patients"))
    assert block["verdict"] == "inconclusive" and block["max_possible_bound"] < 4
    assert "could not have failed" in block["verdict_reason"]
    text = card_audit.describe(block, markdown=False)
    assert "INCONCLUSIVE" in text and "passed" not in text
    assert "lower bound, not a proof" in text
    low = A.audit_block(scores, canaries, delta=1e-5, proven_epsilon=1.0,
                        audit=A.AuditOptions(method="patients"))
    assert low["verdict"] == "passed" and "Verdict: passed" in card_audit.describe(low)


@pytest.mark.parametrize(("args", "match"), [
    (["--canaries", "1"], "--canaries must be at least 2"),
    (["--confidence", "1.5"], "--confidence must be in"),
    (["--canary-kind", "poem"], "--canary-kind must be"),
    (["--abstain", "0.99"], "--abstain must be auto or in [0, 0.95]"),
    (["--abstain", "most"], "--abstain must be auto or in [0, 0.95]"),
])
def test_bad_audit_options_are_one_line_errors(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    args: list[str], match: str,
) -> None:
    from dphub.cli.main import main

    code = main(["audit", str(corpus), "--out", str(tmp_path / "m"), "--base-model",
                 str(tiny_base_model), "--warm-start", "none", *args])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and match in err and err.count("\n") == 1
    assert not (tmp_path / "m").exists()


def test_missing_data_is_refused_and_leaves_nothing(
    tiny_base_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dphub.cli.main import main

    code = main(["audit", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "m"),
                 "--base-model", str(tiny_base_model), "--warm-start", "none"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "no such file" in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == []


@pytest.mark.parametrize("command", [["audit"], ["audit", "--method", "patients"],
                                     ["train", "--audit"]])
def test_audit_projected_epsilon_above_the_policy_refuses_to_start(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, command: list[str],
) -> None:
    """Issue 31 item 21 for the audited runs: the projected ε (canaries included) is checked
    against the hub policy before the first step, as `dphub train` does."""
    import dphub.train.run as run
    from dphub.cli.main import main
    from dphub.errors import DphubError

    monkeypatch.setenv("DPHUB_HUB", str(tmp_path / "hub"))

    def first_step(*a, **k):
        raise DphubError("reached the first step")

    monkeypatch.setattr(run, "TrainLoop", first_step)
    args = [*command, str(corpus), "--out", str(tmp_path / "m"), "--base-model",
            str(tiny_base_model), "--warm-start", "none", "--noise", "0.55"]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("privacy plan: ") and "projected ε = " in lines[0]
    assert lines[-1].startswith("error: projected ε = ") and "exceeds the maximum 10" in lines[-1]
    for way in ("--noise ", "--epochs ", "--allow-above-policy"):
        assert way in lines[-1], way
    assert "reached the first step" not in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name not in ("cache", "hub")) == []

    # with the flag it starts (and stops at the stand-in first step)
    assert main([*args, "--allow-above-policy"]) == 2
    err = capsys.readouterr().err
    assert "training anyway (--allow-above-policy)" in err
    assert err.endswith("error: reached the first step\n")


@pytest.mark.slow
def test_train_with_audit_writes_the_block(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dphub train --audit`: the model's card carries the audit block, which validates."""
    from dphub.cli.main import main
    from dphub.hub.validate import validate_card

    out = tmp_path / "m"
    code = main(["train", str(corpus), "--out", str(out), "--base-model", str(tiny_base_model),
                 "--warm-start", "none", "--epochs", "1", "--noise", "1.0", "--accountant",
                 "rdp", "--audit"])
    assert code == 0, capsys.readouterr().err
    card = validate_card(out, require_private=True)
    assert card.meta["empirical_audit"]["verdict"] == "passed"
    assert "lower bound, not a proof" in capsys.readouterr().out


# ---------------------------------------------------------------- verdicts and the ceiling


def test_verdict_is_inconclusive_when_the_audit_could_not_have_failed() -> None:
    """The issue's case: 64 canaries at ε 8 cannot fail, so "passed" would say nothing."""
    assert B.judge(0.0, 2.71, 8.0) == "inconclusive"
    assert B.judge(0.0, 8.24, 8.0) == "passed"
    assert B.judge(8.24, 8.24, 8.0) == "failed"
    assert B.judge(0.5, 2.71, None) == "not-private"
    # the card's own numbers: a "passed" block whose ceiling is below its proven ε is refused
    block = {"epsilon_lower_bound": 0.0, "max_possible_bound": 2.71, "proven_epsilon": 8.0,
             "verdict": "passed"}
    meta = {"differential_privacy": {"private": True, "epsilon": 8.0}, "empirical_audit": block}
    with pytest.raises(CardError, match="'inconclusive'"):
        card_audit.check_audit_block(meta)
    block["verdict"] = "inconclusive"
    card_audit.check_audit_block(meta)


def test_gradient_canary_count_maximises_the_ceiling_above_eps_8() -> None:
    m = B.gradient_canary_count(1e-5, 0.95)
    ceiling = B.epsilon_lower_bound(m, m, m, 1e-5, 0.95)
    assert ceiling > 8.0  # the default claim (ε 8, δ 1e-5) can fail this audit
    for other in B.GRADIENT_COUNTS[:8]:
        assert B.epsilon_lower_bound(other, other, other, 1e-5, 0.95) <= ceiling + 1e-9


def _default_recipe_audit(corpus: Path, base: Path, out: Path, *extra: str) -> list[str]:
    """`dphub audit` with the default recipe and the default audit (tiny base, no warm start)."""
    return ["audit", str(corpus), "--out", str(out), "--base-model", str(base),
            "--warm-start", "none", *extra]


def test_gradient_audit_fails_a_noise_free_mechanism_at_the_default_recipe(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Noise off (the issue's reproduction), default recipe (ε 8) and default audit: FAILED."""
    from dphub.cli.main import main
    from dphub.privacy import randomness as R

    def no_noise(self, shape, std, dtype=torch.float32, device="cpu"):  # noqa: ANN001
        return torch.zeros(shape, dtype=dtype, device=device)

    monkeypatch.setattr(R.MechanismRandomness, "normal", no_noise)
    out = tmp_path / "broken"
    code = main(_default_recipe_audit(corpus, tiny_base_model, out))
    err = capsys.readouterr().err
    assert code == 2, err
    # the privacy plan (and its q = 1 note) before the first step, then one error line
    plan, *notes, failed = err.splitlines()
    assert plan.startswith("privacy plan: ") and failed.startswith("error: audit FAILED")
    assert all(n.startswith("note: ") for n in notes)
    bound, proven = (float(x) for x in re.findall(r"ε(?: lower bound)? ([0-9.]+)", err)[:2])
    assert proven == pytest.approx(8.0, abs=0.01) and bound > proven
    right = re.search(r"(\d+) of (\d+) membership guesses right on 30000 canaries", err)
    assert right and right[1] == right[2], err  # every guess right (abstentions not counted)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".audit-" in p.name]


def test_gradient_audit_passes_a_working_mechanism_at_the_default_recipe(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from dphub.cli.main import main
    from dphub.hub.validate import validate_card

    out = tmp_path / "m"
    code = main(_default_recipe_audit(corpus, tiny_base_model, out))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    block = validate_card(out, require_private=True).meta["empirical_audit"]
    assert block["verdict"] == "passed" and block["setting"] == "white-box-gradient-canaries"
    assert block["canaries"]["count"] == 30000 and block["gradient"]["steps"] == 32
    assert block["max_possible_bound"] > block["proven_epsilon"] > block["epsilon_lower_bound"]
    # the noise is real: far from a perfect score, and a bound well under the claim
    assert block["correct"] < 0.95 * block["guesses"] and block["epsilon_lower_bound"] < 4
    assert "could have shown up to" in block["verdict_reason"]
    assert "Verdict: passed" in captured.out and "not a proof" in captured.out
    # the simulated audit reproduces this real run's bound, and gives the detection limit
    det = block["detection"]
    assert abs(det["simulated_bound_at_recipe"] - block["epsilon_lower_bound"]) < 0.1, block
    assert 0.25 < det["noise_factor"] < 0.5
    assert "this audit would flag noise ≤" in captured.out and "Outside what" in captured.out


def test_gradient_canaries_never_reach_the_model(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the noise off, the audited model equals the model `dphub train` writes."""
    from safetensors.torch import load_file

    from dphub.card import audit as card_audit
    from dphub.privacy import randomness as R

    def no_noise(self, shape, std, dtype=torch.float32, device="cpu"):  # noqa: ANN001
        return torch.zeros(shape, dtype=dtype, device=device)

    monkeypatch.setattr(R.MechanismRandomness, "normal", no_noise)
    # full batches (q = 1): with the noise off, training is deterministic given the seed
    kw = dict(epochs=3.0, batch_size=1000, noise=1.0, max_length=48, stride=8)
    T.train(_opts(corpus, tiny_base_model, tmp_path / "plain", **kw))
    # a noise-free run fails its audit and writes nothing: force the verdict to compare weights
    monkeypatch.setattr(A, "judge", lambda *a: "passed")
    monkeypatch.setattr(card_audit, "judge", lambda *a: "passed")  # the card's check of it
    # the same patients twice: their ledger total is above the default policy (issue 53)
    res = A.run_audit(_opts(corpus, tiny_base_model, tmp_path / "audited",
                            allow_above_policy=True, **kw), A.AuditOptions(canaries=2000))
    assert res.block["correct"] == res.block["guesses"]  # every canary was in the sum
    assert res.block["guesses"] + res.block["abstained"] == 2000
    a = load_file(tmp_path / "plain" / "model.safetensors")
    b = load_file(tmp_path / "audited" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_inconclusive_audit_writes_the_model_says_why_and_exits_3(
    corpus: Path, tiny_base_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """64 canaries at the default ε 8: the ceiling (≈ 2.7) is below the claim."""
    from dphub.cli.main import main
    from dphub.hub.validate import validate_card

    out = tmp_path / "m"
    code = main(_default_recipe_audit(corpus, tiny_base_model, out, "--canaries", "64",
                                      "--epochs", "2"))
    captured = capsys.readouterr()
    assert code == 3, captured.err
    assert "warning: audit inconclusive: with 64 canaries" in captured.err
    block = validate_card(out, require_private=True).meta["empirical_audit"]
    assert block["verdict"] == "inconclusive" and block["max_possible_bound"] < 4
    assert "could not have failed" in block["verdict_reason"]
    assert "INCONCLUSIVE" in captured.out and "Verdict: passed" not in captured.out
    assert main(["card", "show", str(out)]) == 0
    assert "EMPIRICAL AUDIT: INCONCLUSIVE" in capsys.readouterr().out


def test_gradient_audit_refuses_no_dp(corpus: Path, tiny_base_model: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from dphub.cli.main import main

    code = main(_default_recipe_audit(corpus, tiny_base_model, tmp_path / "m", "--no-dp"))
    err = capsys.readouterr().err
    assert code == 2 and "--method patients" in err and err.count("\n") == 1
    assert not (tmp_path / "m").exists()


# ---------------------------------------------------------------- detection limit (issue 38)

#: `dphub train`'s default recipe: q = 1, 32 steps, the σ the PRV accountant gives ε 8 at δ 1e-5.
RECIPE = dict(sample_rate=1.0, steps=32, noise_multiplier=3.3995, delta=1e-5, confidence=0.95)


def _simulated_canaries(m: int, factor: float, seed: int) -> A.GradientCanaries:
    """Gradient canaries whose released sums are drawn as a run with noise × ``factor`` would."""
    rng = np.random.default_rng(seed)
    g = A.GradientCanaries(m)
    g.included = rng.random(m) < 0.5
    g.norm, g.sample_rate, g.steps, g.noise_multiplier = 1.0, 1.0, 32, RECIPE["noise_multiplier"]
    g.sums = 32.0 * g.included + rng.standard_normal(m) * (math.sqrt(32) * 3.3995 * factor)
    return g


def _schema_check(block: dict) -> None:
    import jsonschema

    schema = json.loads((Path(A.__file__).parent.parent / "cards" / "dp_metadata.schema.json")
                        .read_text())
    jsonschema.validate(block, {"$defs": schema["$defs"], "$ref": "#/$defs/empirical_audit"})


def test_gradient_report_carries_the_detection_limit_and_what_is_outside() -> None:
    g = _simulated_canaries(30000, 1.0, seed=1)
    block = A.gradient_block(g, delta=1e-5, proven_epsilon=7.9987, confidence=0.95,
                             abstain=0.05, rng=np.random.default_rng(2))
    _schema_check(block)
    det = block["detection"]
    assert det["measured"] == "simulated-released-sums" and det["statistic"] == "share-flagging"
    assert det["power"] == 0.95 and det["repetitions"] == B.DETECTION_REPETITIONS
    # the issue: noise × 0.25 passed the old audit; the limit is now above it, and below 1
    assert 0.25 < det["noise_factor"] < 0.5
    assert det["noise_multiplier"] == pytest.approx(det["noise_factor"] * 3.3995, abs=1e-3)
    assert block["abstained"] == 1500 and block["guesses"] == 28500
    assert det["abstain_fraction"] == 0.05 and det["abstain_chosen"] is False
    text = card_audit.describe(block, markdown=False)
    assert f"this audit would flag noise ≤ {det['noise_factor']:.3g} × the recipe's" in text
    assert f"at least 95% of {B.DETECTION_REPETITIONS} simulated audits" in text
    outside = text.split("Outside what this audit tests:")[1]
    for word in ("sampling", "clipping", "federated", "--init-from", "distill"):
        assert word in outside


def _flag_rate(k: float, *, abstain: float, runs: int, seed: int) -> float:
    """The share of fresh simulated audits at noise × ``k`` whose bound exceeds the claim."""
    flagged = 0
    for i in range(runs):
        g = _simulated_canaries(30000, k, seed=seed + i)
        r, v = B.gradient_correct(g.sums, g.included, g.threshold, abstain)
        flagged += B.epsilon_lower_bound(30000, r, v, 1e-5, 0.95) > 7.9987
    return flagged / runs


def test_the_stated_detection_limit_is_flagged_at_the_stated_power() -> None:
    """Issue 53: "would flag noise ≤ k" was the median of 9 simulations, so at k an audit flagged
    only about half the time. Fresh runs at the reported k flag at the stated 95 % (up to the
    spread of 60 runs), and the old median's k is flagged far less often."""
    limit = B.detection_limit(30000, claimed_epsilon=7.9987, abstain=0.05,
                              rng=np.random.default_rng(21), **RECIPE)
    assert limit.power == 0.95
    assert _flag_rate(limit.noise_factor, abstain=0.05, runs=60, seed=1000) >= 0.85
    median = B.detection_limit(30000, claimed_epsilon=7.9987, abstain=0.05, power=0.5,
                               rng=np.random.default_rng(21), **RECIPE)
    assert median.noise_factor > limit.noise_factor
    assert _flag_rate(median.noise_factor, abstain=0.05, runs=60, seed=2000) < 0.8


def test_a_pre_power_card_block_still_reads_as_a_median() -> None:
    g = _simulated_canaries(30000, 1.0, seed=1)
    block = A.gradient_block(g, delta=1e-5, proven_epsilon=7.9987, confidence=0.95,
                             abstain=0.05, rng=np.random.default_rng(2))
    block["detection"]["statistic"] = "median"
    del block["detection"]["power"]
    _schema_check(block)
    assert "the median (about half) of" in card_audit.describe(block, markdown=False)


def test_simulation_reproduces_the_bound_of_the_released_sums() -> None:
    """The simulated median bound at factor 1 sits within noise of bounds of independent draws
    (the end-to-end run: test_gradient_audit_passes_a_working_mechanism_at_the_default_recipe)."""
    limit = B.detection_limit(30000, claimed_epsilon=7.9987, rng=np.random.default_rng(3),
                              **RECIPE)
    bounds = []
    for seed in (10, 11, 12):
        g = _simulated_canaries(30000, 1.0, seed)
        r, v = B.gradient_correct(g.sums, g.included, g.threshold, B.GRADIENT_ABSTAIN)
        bounds.append(B.epsilon_lower_bound(30000, r, v, 1e-5, 0.95))
    assert all(abs(b - limit.bound_at_recipe) < 0.1 for b in bounds), (bounds, limit)


def test_detection_limit_moves_the_right_way_with_canaries_and_steps() -> None:
    def k(m: int, **kw: float) -> float:
        args = {**RECIPE, **kw}
        return B.detection_limit(m, claimed_epsilon=4.0, rng=np.random.default_rng(4),
                                 **args).noise_factor

    base = k(2000)
    assert 0 < base < 1
    assert k(30000) > base  # more canaries: more guesses must be right by chance
    assert k(2000, steps=128) > base  # more steps at the same σ: a stronger canary signal
    assert k(64) == 0.0  # 64 canaries cannot show ε 4 at all: they flag nothing


def test_abstention_raises_the_detection_limit_at_the_default_recipe() -> None:
    before = B.detection_limit(30000, claimed_epsilon=7.9987, abstain=0.0,
                               rng=np.random.default_rng(5), **RECIPE)
    after = B.detection_limit(30000, claimed_epsilon=7.9987, abstain=0.05,
                              rng=np.random.default_rng(5), **RECIPE)
    assert 0.15 < before.noise_factor < 0.25 < 0.28 < after.noise_factor


def test_auto_abstention_picks_the_best_fraction_from_public_settings() -> None:
    """The default (auto) picks a larger abstention at ε 1 than at ε 8, each raising the limit
    over guessing every canary; the chosen rule's limit is measured again (fresh draws)."""
    g = _simulated_canaries(30000, 1.0, seed=6)
    block = A.gradient_block(g, delta=1e-5, proven_epsilon=7.9987, confidence=0.95,
                             rng=np.random.default_rng(7))
    _schema_check(block)
    det = block["detection"]
    assert det["abstain_chosen"] is True and 0 < det["abstain_fraction"] <= 0.3
    assert block["abstained"] == round(det["abstain_fraction"] * 30000)
    assert det["noise_factor"] > 0.28 and block["max_possible_bound"] > 7.9987
    low = dict(RECIPE, noise_multiplier=21.3345)  # the same recipe at ε 1
    frac, limit = B.choose_abstain(30000, claimed_epsilon=0.9982, rng=np.random.default_rng(8),
                                   **low)
    none = B.detection_limit(30000, claimed_epsilon=0.9982, abstain=0.0,
                             rng=np.random.default_rng(8), **low)
    assert frac >= 0.5 and limit.noise_factor > none.noise_factor + 0.1


@pytest.mark.parametrize("abstain", [0.05, 0.5, 0.95])
def test_abstention_bound_is_valid_with_the_correct_noise(abstain: float) -> None:
    """A Gaussian mechanism that is exactly (2, 1e-5)-DP: the abstaining audit's bound stays at
    or below 2 in at least 95 % of seeded simulated runs (Theorem 5.2 with r guesses)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    eps, delta, m = 2.0, 1e-5, 4000

    def gauss_delta(mu: float) -> float:  # the Gaussian mechanism's exact δ(ε)
        return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))

    mu = brentq(lambda u: gauss_delta(u) - delta, 1e-3, 20)
    bounds = []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        included = rng.random(m) < 0.5
        sums = included + rng.standard_normal(m) / mu
        r, v = B.gradient_correct(sums, included, 0.5, abstain)
        assert r == m - round(abstain * m)
        bounds.append(B.epsilon_lower_bound(m, r, v, delta, 0.95))
    assert sum(b <= eps for b in bounds) >= 0.95 * len(bounds)
    assert max(bounds) > 0.1  # the audit does see the mechanism


def test_patient_audit_says_its_limit_is_not_measured() -> None:
    canaries = [A.Canary(f"c{i}", [], A.Secret("A", "B", "1", "2"), [], i % 2 == 0)
                for i in range(64)]
    scores = [A.CanaryScore(0.0, 1.0, 8.0, 1.0) for _ in canaries]
    for proven, factor, words in ((1.0, None, "not measured"), (8.0, 0.0, "flag no noise")):
        block = A.audit_block(scores, canaries, delta=1e-5, proven_epsilon=proven,
                              audit=A.AuditOptions(method="patients"))
        _schema_check(block)
        assert block["detection"]["noise_factor"] == factor
        text = card_audit.describe(block, markdown=False)
        assert f"Detection limit: this audit would {words}" in text or words in text
        assert "composition across releases" in text.split("Outside what this audit tests:")[1]
