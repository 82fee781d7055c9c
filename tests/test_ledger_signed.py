"""Issue 53 item 5: the ledger is the figure a privacy officer signs.

A dataset is recognised by its notes' content as well as its ids; ``--init-from`` validates the
parent's card and hashes its weights; the policy check (train, publish) reads the ledger total
of the patients involved; every DP release made here is recorded (surrogates included) with its
unit; a missing key with existing records is an error, not a new ledger.

Tiny random BERT, synthetic notes, RDP with an explicit σ (the pattern of tests/test_ledger.py):
each training takes a second or two.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest
import torch

from dphub import formats, synth
from dphub import train as T
from dphub.card import load_card
from dphub.cli.main import main
from dphub.errors import ConfigError, PrivacyError
from dphub.notes import Note
from dphub.privacy import ledger as L
from dphub.privacy.composition import GaussianSteps, Part, history_epsilon
from dphub.privacy.policy import Policy
from dphub.privacy.statement import format_epsilon


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DPHUB_HOME", str(tmp_path / "home"))


def _write(notes: list[Note], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    formats.write(notes, path, "jsonl")
    return path


def _renamed(n: Note, prefix: str = "MRN-") -> Note:
    return Note(f"{prefix}{n.id}", n.text, f"{prefix}{n.patient_id}", n.metadata, n.spans,
                n.labelled)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``same``: 16 notes of 6 patients; ``renamed``: the same notes, every note and patient id
    renamed ``MRN-<id>``; ``renamed_most``: the renamed notes but two, plus two new notes;
    ``other``: 10 notes of 4 other patients (other texts, other ids)."""
    root = tmp_path_factory.mktemp("signed")
    base = synth.generate(16, kind="nursing", seed=3, patients=6)
    fresh = [Note(f"new-{n.id}", n.text, f"new-{n.patient_id}", n.metadata, n.spans, n.labelled)
             for n in synth.generate(2, kind="nursing", seed=11, patients=1)]
    other = [Note(f"o-{n.id}", n.text, f"o-{n.patient_id}", n.metadata, n.spans, n.labelled)
             for n in synth.generate(10, kind="nursing", seed=5, patients=4)]
    renamed = [_renamed(n) for n in base]
    return {"same": _write(base, root / "a" / "train.jsonl"),
            "renamed": _write(renamed, root / "b" / "renamed.jsonl"),
            "renamed_most": _write([*renamed[2:], *fresh], root / "c" / "train.jsonl"),
            "other": _write(other, root / "d" / "train.jsonl")}


def _opts(data: Path, base: Path, out: Path, **kw) -> T.TrainOptions:
    o = dict(data=data, out=out, base_model=str(base), warm_start="none", epochs=1.0,
             batch_size=2, max_physical_batch=4, noise=1.0, accountant="rdp", max_length=64,
             stride=16, checkpoint_every=50)
    o.update(kw)
    return T.TrainOptions(**o)


def _steps(r: T.TrainResult) -> GaussianSteps:
    return GaussianSteps("rdp", r.sample_rate, r.noise_multiplier, r.steps)


# ---- a dataset is recognised by its notes' content


def test_renamed_ids_are_the_same_dataset(corpora, tiny_base_model: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The same notes with every id renamed: the ledger links the earlier release, refuses a
    --disjoint-teacher declaration, and the independent run's ledger total composes both."""
    first = tmp_path / "first"
    r1 = T.train(_opts(corpora["same"], tiny_base_model, first))
    assert main(["ledger", "show", str(corpora["renamed"])]) == 0
    out = capsys.readouterr().out
    assert "no release used these patients" not in out
    assert "0 of these 6 patients, 16 of these 16 notes" in out
    # --disjoint-teacher on the same notes renamed is contradicted by the ledger
    with pytest.raises(ConfigError, match="--disjoint-teacher: the privacy ledger"):
        T.train(_opts(corpora["renamed"], tiny_base_model, tmp_path / "child",
                      init_from=str(first), disjoint_teacher=True))
    assert not (tmp_path / "child").exists()
    # a second, independent run on the renamed notes: the policy sees both (one fits, two not)
    tight = Policy(max_epsilon=r1.epsilon * 1.2)
    with pytest.raises(PrivacyError, match=r"for these patients .* privacy ledger records.*"
                                           r"exceeds the maximum .*nothing was trained"):
        T.train(_opts(corpora["renamed"], tiny_base_model, tmp_path / "second", policy=tight))
    assert not (tmp_path / "second").exists()
    # a dataset differing by a few notes is linked too (a shared note is a shared patient)
    with pytest.raises(PrivacyError, match="privacy ledger records"):
        T.train(_opts(corpora["renamed_most"], tiny_base_model, tmp_path / "most",
                      policy=tight))
    # notes that share nothing with it are not
    T.train(_opts(corpora["other"], tiny_base_model, tmp_path / "other", policy=tight))
    r2 = T.train(_opts(corpora["renamed"], tiny_base_model, tmp_path / "second", policy=tight,
                       allow_above_policy=True))
    spend = L.dataset_spend(L.load_ledger(), L.footprint(list(formats.read(corpora["same"]))))
    exact = history_epsilon("rdp", [_steps(r1), _steps(r2)], r1.delta + r2.delta)
    assert spend.total is not None and spend.total.epsilon == pytest.approx(exact, rel=1e-9)
    assert len(spend.releases) == 2  # "other" is not linked


def test_note_digests_are_keyed_normalised_and_private(corpora, tmp_path: Path) -> None:
    notes = list(formats.read(corpora["same"]))
    a = L.note_digests(notes)
    assert a == L.note_digests(list(formats.read(corpora["renamed"]))) and len(a) == 16
    # whitespace and case do not make another note
    respaced = [Note(n.id, "  " + n.text.upper().replace(" ", "\n "), n.patient_id) for n in notes]
    assert L.note_digests(respaced) == a
    # keyed: another key gives other digests, and no plain SHA-256 of a note is stored
    assert L.note_digests(notes, key=b"k" * 32).isdisjoint(a)
    import hashlib

    plain = {hashlib.sha256(L.note_text_key(n.text).encode()).hexdigest() for n in notes}
    L.record_release(L.Release("a" * 64, "train", 2.0, 1e-5, "patient",
                               L.patient_digests(notes), notes=a))
    raw = (L.ledger_dir() / L.LEDGER_FILE).read_text(encoding="utf-8")
    assert not any(p in raw for p in plain) and not any(n.text[:30] in raw for n in notes)
    assert stat.S_IMODE(os.stat(L.ledger_dir() / L.LEDGER_FILE).st_mode) == 0o600


# ---- --init-from validates the parent's card and hashes its weights


def _forge(model_dir: Path, dest: Path, pattern: str, repl: str) -> Path:
    shutil.copytree(model_dir, dest)
    card = dest / "README.md"
    text = card.read_text(encoding="utf-8")
    new, n = re.subn(pattern, repl, text, count=1, flags=re.M)
    assert n == 1
    card.write_text(new, encoding="utf-8")
    return dest


def test_init_from_refuses_a_forged_parent_card(corpora, tiny_base_model: Path,
                                                tmp_path: Path) -> None:
    first = tmp_path / "first"
    T.train(_opts(corpora["same"], tiny_base_model, first))
    dp = load_card(first).dp
    # the claim edited down: the card no longer validates, so it cannot be composed
    low = _forge(first, tmp_path / "low", r"^(\s*)epsilon: .*$", r"\g<1>epsilon: 0.5")
    assert load_card(low).dp["epsilon"] == 0.5
    with pytest.raises(PrivacyError, match="its card does not validate"):
        T.train(_opts(corpora["same"], tiny_base_model, tmp_path / "c1", init_from=str(low)))
    assert not (tmp_path / "c1").exists()
    # a card naming other weights: refused (the ledger finds a parent by its weights' hash)
    other = _forge(first, tmp_path / "other", r"^(\s*)weights_sha256: .*$",
                   r"\g<1>weights_sha256: " + "ab" * 32)
    for kw in ({}, {"disjoint_teacher": True}):
        with pytest.raises(PrivacyError, match="weights_sha256 is not the SHA-256"):
            T.train(_opts(corpora["same"], tiny_base_model, tmp_path / "c2",
                          init_from=str(other), **kw))
    assert not (tmp_path / "c2").exists()
    # the ledger's record of these weights: a card claiming less than it is refused (a card
    # whose accounting was forged consistently still carries the weights the ledger knows)
    L.record_release(L.Release(dp["weights_sha256"], "train", dp["epsilon"] * 3, dp["delta"],
                               "patient", frozenset({"x"})))
    with pytest.raises(PrivacyError, match="the privacy ledger recorded"):
        T.train(_opts(corpora["other"], tiny_base_model, tmp_path / "c3", init_from=str(first)))


# ---- the policy reads the ledger total


def test_four_independent_trainings_compose_and_the_policy_refuses_the_crossing(
        corpora, tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Independent `dphub train` runs on the same notes (no --init-from): each card claims its
    own ε, the ledger composes them, and the run that takes the total above the hub's policy
    is refused before training, in one line; --allow-above-policy trains with a warning."""
    monkeypatch.chdir(tmp_path)
    common = ["--base-model", str(tiny_base_model), "--warm-start", "none", "--epochs", "1",
              "--batch-size", "2", "--noise", "1.0", "--accountant", "rdp"]
    assert main(["train", str(corpora["same"]), "--out", "m1", *common]) == 0
    card1 = load_card(tmp_path / "m1").dp
    one = GaussianSteps("rdp", card1["sample_rate"], card1["noise_multiplier"], card1["steps"])
    three = history_epsilon("rdp", [one] * 3, 3 * card1["delta"])
    four = history_epsilon("rdp", [one] * 4, 4 * card1["delta"])
    hub = tmp_path / "hub"
    hub.mkdir()
    (hub / "dphub-policy.json").write_text(json.dumps({"max_epsilon": (three + four) / 2,
                                                       "min_unit": "patient"}))
    (tmp_path / "dphub.toml").write_text(f'[hub]\nurl = "{hub}"\n')
    for i in (2, 3):
        assert main(["train", str(corpora["same"]), "--out", f"m{i}", *common]) == 0
        assert load_card(tmp_path / f"m{i}").dp["epsilon"] == pytest.approx(card1["epsilon"])
    capsys.readouterr()
    assert main(["train", str(corpora["renamed"]), "--out", "m4", *common]) == 2
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and f"projected ε = {four:.4g} for these patients" in line[0]
    assert "exceeds the maximum" in line[0] and "Traceback" not in err
    assert not (tmp_path / "m4").exists()
    assert main(["ledger", "show", str(corpora["renamed"])]) == 0
    assert f"spent: ε = {format_epsilon(three)}" in capsys.readouterr().out
    assert main(["train", str(corpora["renamed"]), "--out", "m4", *common,
                 "--allow-above-policy"]) == 0
    assert "training anyway (--allow-above-policy)" in capsys.readouterr().err
    assert main(["ledger", "show", str(corpora["same"])]) == 0
    out = capsys.readouterr().out
    assert f"spent: ε = {format_epsilon(four)}" in out and "rdp composition of 4 release(s)" in out
    # publish: the model's patients lost more than the hub's policy allows
    from dphub.hub.ops import ledger_problem
    from dphub.hub.policy import load_hub_policy

    why = ledger_problem(tmp_path / "m4", load_hub_policy(str(hub)))
    assert why is not None and f"lost ε = {four:.4g}" in why
    assert ledger_problem(tmp_path / "m4", Policy(max_epsilon=four * 1.01)) is None


def test_publish_refuses_above_the_ledger_total_unless_allowed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`dphub publish` (ops.publish past its gate): refused on the ledger total, allowed with
    the flag; a model the ledger does not know is not affected."""
    from dphub.errors import PublishRefused
    from dphub.hub import ops
    from dphub.hub.common import CardSummary

    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    from dphub.io import file_sha256

    sha = file_sha256(model / "model.safetensors")
    summary = CardSummary(6.0, 1e-5, "patient", True, "x/y", (), 6, 10, ("en",), None)
    monkeypatch.setattr(ops, "check_publishable", lambda _d: summary)
    published: list[str] = []

    class Hub:
        def publish(self, *_a, **_k) -> str:
            published.append("yes")
            return "abc"

    monkeypatch.setattr(ops, "open_hub", lambda *_a, **_k: Hub())
    hub = tmp_path / "hub"
    hub.mkdir()
    (hub / "dphub-policy.json").write_text(json.dumps({"max_epsilon": 10}))
    pats = frozenset({"p1", "p2"})
    L.record_release(L.Release("e" * 64, "train", 6.0, 1e-5, "patient", pats))
    L.record_release(L.Release(sha, "train", 6.0, 1e-5, "patient", pats))
    with pytest.raises(PublishRefused, match=r"lost ε = 12 over the 2 release\(s\)"):
        ops.publish(model, "acme/m", hub=str(hub))
    assert not published
    ops.publish(model, "acme/m", hub=str(hub), allow_above_policy=True)
    assert published == ["yes"]
    (model / "model.safetensors").write_bytes(b"other weights")  # not recorded here
    ops.publish(model, "acme/m", hub=str(hub))
    assert published == ["yes", "yes"]


# ---- units, group size, records only added, the key


def test_finer_units_are_never_summed_as_patient_epsilon(tmp_path: Path) -> None:
    pats = frozenset({"p"})
    book = L.Ledger([L.Release("a" * 64, "train", 2.0, 1e-6, "patient", pats),
                     L.Release("b" * 64, "train", 1.0, 1e-6, "note", pats)])
    s = book.spend(pats)  # group size unknown: no patient-level figure
    assert not s.bounded and [r.release for r in s.unbounded] == ["b" * 64]
    assert s.total is not None and s.total.epsilon == pytest.approx(2.0)
    assert L.policy_problem(s, 100.0) is not None  # no bound: never "within the policy"
    # known group size: group privacy (kε, k e^((k-1)ε) δ)
    book.releases[1] = L.Release("b" * 64, "train", 1.0, 1e-6, "note", pats, group_size=3)
    s = book.spend(pats)
    assert s.bounded and s.total is not None
    assert s.total.epsilon == pytest.approx(2.0 + 3.0)
    assert s.total.delta == pytest.approx(1e-6 + 3 * 2.718281828 ** 2 * 1e-6)
    # one note per patient: note level is patient level (exact composition keeps working)
    assert L.Release("c", "train", 1.0, 1e-6, "note", pats, group_size=1).patient_part() \
        == Part(1.0, 1e-6)
    # δ of the group beyond 1: no bound; sequence level: no bound
    assert L.Release("d", "train", 9.0, 1e-5, "note", pats, group_size=5).patient_part() is None
    assert L.Release("e", "train", 1.0, 1e-6, "sequence", pats, group_size=None
                     ).patient_part() is None


def test_a_note_level_run_records_its_group_size_and_show_says_not_bounded(
        corpora, tiny_base_model: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    T.train(_opts(corpora["same"], tiny_base_model, tmp_path / "n", privacy_unit="note"))
    [rec] = L.load_ledger().releases
    per = {}
    for n in formats.read(corpora["same"]):
        per[n.patient_id] = per.get(n.patient_id, 0) + 1
    assert rec.privacy_unit == "note" and rec.group_size == max(per.values())
    T.train(_opts(corpora["same"], tiny_base_model, tmp_path / "s", privacy_unit="sequence",
                  allow_above_policy=True))
    assert main(["ledger", "show", str(corpora["same"])]) == 0
    out = capsys.readouterr().out
    assert "NOT BOUNDED" in out and "sequence-level" in out
    # the policy: no patient-level figure holds, so a patient-level run is refused
    with pytest.raises(PrivacyError, match="no patient-level ε holds"):
        T.train(_opts(corpora["same"], tiny_base_model, tmp_path / "p"))


def test_a_missing_key_with_records_is_an_error_not_a_new_ledger(tmp_path: Path) -> None:
    L.record_release(L.Release("a" * 64, "train", 2.0, 1e-5, "patient",
                               L.patient_digests([Note("n1", "x", "p1")])))
    before = (L.ledger_dir() / L.LEDGER_FILE).read_bytes()
    (L.ledger_dir() / L.KEY_FILE).unlink()
    with pytest.raises(ConfigError, match="is missing but .* holds 1 record"):
        L.ledger_key()
    with pytest.raises(ConfigError, match="restore the key from a backup"):
        L.footprint([Note("n1", "x", "p1")])
    assert not (L.ledger_dir() / L.KEY_FILE).exists()
    assert (L.ledger_dir() / L.LEDGER_FILE).read_bytes() == before
    data = _write([Note("n1", "x", "p1")], tmp_path / "d.jsonl")
    assert main(["ledger", "show", str(data)]) == 2  # one line, no new key
    assert not (L.ledger_dir() / L.KEY_FILE).exists()


def test_a_format_1_ledger_is_read_and_kept(tmp_path: Path) -> None:
    """Records written before note digests existed are read (linked by patients only) and
    kept when a release is added."""
    pats = L.patient_digests([Note("n1", "x", "p1")])
    old = {"format": 1, "releases": [{
        "release": "a" * 64, "kind": "train", "epsilon": 2.0, "delta": 1e-5,
        "privacy_unit": "patient", "history": [], "parents": [], "dataset": "d",
        "patients": sorted(pats), "created": 1.0}]}
    (L.ledger_dir() / L.LEDGER_FILE).write_text(json.dumps(old))
    L.record_release(L.Release("b" * 64, "train", 3.0, 1e-5, "patient", pats))
    book = L.load_ledger()
    assert [r.release[0] for r in book.releases] == ["a", "b"]
    spend = book.spend(L.footprint([Note("n1", "x", "p1")]))
    assert spend.total is not None and spend.total.epsilon == pytest.approx(5.0)


def test_a_reset_federated_site_adds_a_record(tmp_path: Path) -> None:
    """A site whose state file was deleted (its key, so its id, kept) restarts its accountant:
    the ledger adds the new run beside the old one; the old spend stays."""
    fp = L.Footprint(frozenset({"p1", "p2"}), frozenset({"n1"}))
    kw = dict(delta=1e-5, privacy_unit="patient", patients=fp)
    L.record_federated_round("site-a", GaussianSteps("rdp", 0.5, 1.0, 4), epsilon=3.0, **kw)
    L.record_federated_round("site-a", GaussianSteps("rdp", 0.5, 1.0, 8), epsilon=5.0, **kw)
    [rec] = L.load_ledger().releases  # the same run: its record grows
    assert rec.history[0].steps == 8 and rec.epsilon == 5.0
    L.record_federated_round("site-a", GaussianSteps("rdp", 0.5, 1.0, 4), epsilon=3.0, **kw)
    recs = L.load_ledger().releases
    assert len(recs) == 2 and {r.epsilon for r in recs} == {5.0, 3.0}
    L.record_federated_round("site-a", GaussianSteps("rdp", 0.5, 1.0, 6), epsilon=4.0, **kw)
    assert sorted(r.epsilon for r in L.load_ledger().releases) == [4.0, 5.0]
    spend = L.load_ledger().spend(fp)
    assert spend.total is not None and spend.total.epsilon > 5.0


def test_a_disjoint_teacher_parent_counts_in_the_total(corpora, tiny_base_model: Path,
                                                       tmp_path: Path) -> None:
    """A child of a parent declared disjoint does not compose it in its claim; when the two
    share patients in the ledger (the parent on other notes, the child on these plus the
    parent's), `ledger show` must count both."""
    pats = frozenset({"p1"})
    book = L.Ledger([
        L.Release("p" * 64, "train", 3.0, 1e-5, "patient", pats),
        L.Release("c" * 64, "init_from", 2.0, 1e-5, "patient", pats, parents=("p" * 64,),
                  composes_parents=False),
    ])
    s = book.spend(pats)
    assert s.total is not None and s.total.epsilon == pytest.approx(5.0)
    book.releases[1] = L.Release("c" * 64, "init_from", 4.0, 2e-5, "patient", pats,
                                 parents=("p" * 64,))
    s = book.spend(pats)
    assert s.total is not None and s.total.epsilon == pytest.approx(4.0)  # inside its claim
    # a real run declared disjoint records that its claim does not compose the parent
    first = tmp_path / "first"
    T.train(_opts(corpora["other"], tiny_base_model, first))
    T.train(_opts(corpora["same"], tiny_base_model, tmp_path / "child", init_from=str(first),
                  disjoint_teacher=True))
    child = L.load_ledger().find(load_card(tmp_path / "child").dp["weights_sha256"])
    assert child is not None and child.composes_parents is False


def test_init_from_plan_line_names_the_parents_claim(
        corpora, tiny_base_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    common = ["--base-model", str(tiny_base_model), "--warm-start", "none", "--epochs", "1",
              "--batch-size", "2", "--noise", "1.0", "--accountant", "rdp"]
    assert main(["train", str(corpora["other"]), "--out", "m1", *common]) == 0
    eps1 = load_card(tmp_path / "m1").dp["epsilon"]
    capsys.readouterr()
    assert main(["train", str(corpora["same"]), "--out", "m2", "--init-from", "m1",
                 *common]) == 0
    err = capsys.readouterr().err
    claim = load_card(tmp_path / "m2").dp["epsilon"]
    assert f"claiming ε {eps1:.4g}, the card claims ε = {claim:.4g}" in err


# ---- DP surrogates reach the ledger


def test_dp_surrogates_are_recorded_with_their_unit(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from dphub.ensemble.core import Ensemble, Slot
    from dphub.ensemble.members import FixedMember
    from dphub.notes import Span
    from dphub.runner import run_deid

    src = tmp_path / "in.jsonl"
    fixed, lines, notes = {}, [], []
    for i in range(6):
        text = f"seen 7/{10 + i}/2094, age {40 + i}."
        spans = [Span(5, 5 + len(f"7/{10 + i}/2094"), "DATE")]
        start = text.index(f"{40 + i}")
        spans.append(Span(start, start + 2, "AGE"))
        n = Note(f"n{i}", text, f"p{i % 3}", spans=spans)
        fixed[n.id] = spans
        notes.append(n)
        lines.append(json.dumps({"id": n.id, "text": text, "patient_id": n.patient_id}))
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ens = Ensemble([Slot(FixedMember("gold", fixed))])
    rep = run_deid(src, tmp_path / "out", ens, mode="surrogate", key=b"k" * 32,
                   render_options={"dates": "dp", "date_epsilon": 0.5, "date_unit": "note",
                                   "ages": "dp"}, batch_size=4)
    assert rep.exit_code == 0
    recs = L.load_ledger().releases
    assert sorted((r.kind, r.privacy_unit, r.epsilon) for r in recs) == [
        ("surrogate", "ages per year", 0.5), ("surrogate", "dates per interval band unit", 0.5)]
    assert all(r.patients == L.patient_digests(notes) and r.notes == L.note_digests(notes)
               for r in recs)
    # the default surrogates (no DP) record nothing
    run_deid(src, tmp_path / "plain", ens, mode="surrogate", key=b"k" * 32)
    assert len(L.load_ledger().releases) == 2
    spend = L.load_ledger().spend(L.footprint(notes))
    assert spend.total is None and len(spend.metric) == 2 and spend.bounded
    assert main(["ledger", "show", str(src)]) == 0
    out = capsys.readouterr().out
    assert "not composed: 2 DP surrogate release(s)" in out and "ages per year" in out


@pytest.mark.filterwarnings("ignore")
def test_a_federated_site_reset_keeps_its_spend_and_its_policy_reads_the_ledger(
        corpora, tiny_base_model: Path, tmp_path: Path) -> None:
    """A deployed site (its node key's id kept) whose state file is deleted: the ledger adds
    the restarted accountant beside the old one, and the site's policy, which reads the ledger
    total of its patients, refuses the new run's round before any step."""
    from dphub.federate.site import PolicyRefused, RoundOrder, Site

    opts = dict(warm_start="none", batch_size=2, max_physical_batch=8, accountant="rdp",
                max_length=48, stride=8, lr=1e-2, rule_features=False,
                base_model=str(tiny_base_model))
    site = Site(corpora["same"], tmp_path / "site", opts, site_id="node-a")
    weights = {n: p.detach().clone() for n, p in site.model.named_parameters()
               if p.requires_grad}
    for rnd in (1, 2):
        order = RoundOrder(round=rnd, rounds=2, local_steps=2, target_epsilon=4.0,
                           frozen_digest=site.frozen_digest)
        weights, report = site.train_round(order, weights)
    spent = report["epsilon"]
    site.state_path.unlink()
    again = Site(corpora["renamed"], tmp_path / "site", opts, site_id="node-a")
    order = RoundOrder(round=1, rounds=2, local_steps=2, target_epsilon=8.0,
                       frozen_digest=again.frozen_digest)
    with pytest.raises(PolicyRefused, match="privacy ledger records"):
        again.train_round(order, weights)
    [rec] = L.load_ledger().releases  # nothing spent, nothing replaced
    assert rec.epsilon == pytest.approx(spent, rel=1e-9)
    # within its policy with what is left: trains, and the ledger adds a second record
    again.state_path.unlink()  # the refused round's state (no step) holds its target
    order = RoundOrder(round=1, rounds=2, local_steps=2, target_epsilon=2.0,
                       frozen_digest=again.frozen_digest)
    again.train_round(order, weights)
    recs = L.load_ledger().releases
    assert len(recs) == 2 and max(r.epsilon for r in recs) == pytest.approx(spent, rel=1e-9)


def test_a_dp_students_composed_teacher_counts_once(tiny_base_model: Path,
                                                    tmp_path: Path) -> None:
    """A DP student composes its teacher (trained here on the same notes) in its claim: the
    ledger's figure is that claim, not the claim plus the teacher again."""
    from dphub.ensemble.core import Ensemble, Slot
    from dphub.ensemble.members import ModelMember
    from dphub.owner.distill import distill, local_options
    from dphub.rules.engine import RuleMember, RuleOptions

    notes = synth.generate(8, kind="nursing", seed=5, patients=3)
    teacher = tmp_path / "teacher"
    T.train(_opts(_write(notes, tmp_path / "n.jsonl"), tiny_base_model, teacher, noise=3.0))
    dp = load_card(teacher).dp
    ens = Ensemble([Slot(RuleMember("rules:default", RuleOptions()), None, 0.0),
                    Slot(ModelMember.load(teacher, "t"), None, dp["epsilon"],
                         dp["privacy_unit"], None, None, dp["delta"])])
    opts = local_options(T.TrainOptions(out=tmp_path / "s", base_model=str(tiny_base_model),
                                        warm_start="none", noise=3.0, accountant="rdp",
                                        epochs=1.0, max_length=64, stride=16, batch_size=2),
                         dp=True)
    res = distill(ens, notes, opts)
    student = L.load_ledger().find(load_card(tmp_path / "s").dp["weights_sha256"])
    assert student is not None and student.parents == (dp["weights_sha256"],)
    spend = L.load_ledger().spend(L.footprint(notes))
    assert spend.total is not None and spend.total.epsilon == pytest.approx(res.epsilon)
