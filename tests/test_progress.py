"""Progress everywhere (issue 16, Deliver 3 and fault 18): plain lines when stderr is not a
terminal, the public warm start announced, the wait for another process's warm start shown and
bounded, and never a word of note text."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import torch

from dphub import formats, progress, synth
from dphub.cli.main import main
from dphub.errors import DphubError
from dphub.progress import ProgressReporter, format_duration
from dphub.train import Progress, warmstart

LINE = re.compile(r"^(?P<label>[^:]+): (?P<done>\d+)/(?P<total>\d+) (?P<unit>\w+) \(\d+%\), "
                  r"elapsed (?P<elapsed>[0-9hms]+), (ETA (?P<eta>[0-9hms?]+)|done)")


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class NotATerminal(io.StringIO):
    def isatty(self) -> bool:
        return False


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    monkeypatch.setenv("DPHUB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DPHUB_PROGRESS", raising=False)
    monkeypatch.delenv(warmstart.TIMEOUT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)


def test_duration_format() -> None:
    assert format_duration(0) == "0s"
    assert format_duration(42.4) == "42s"
    assert format_duration(245) == "4m05s"
    assert format_duration(7380) == "2h03m"
    assert format_duration(None) == "?" and format_duration(float("inf")) == "?"


def test_plain_lines_every_five_percent_with_eta() -> None:
    clock, out = FakeClock(), NotATerminal()
    rep = ProgressReporter(out, clock=clock, grace=0)
    assert rep.mode == "plain"
    for step in range(0, 201):
        rep.update("train", step, 200, info="loss 0.500")
        clock.t += 1.0  # 1 s per step: the 30 s interval never comes before the next 5 %
    lines = out.getvalue().splitlines()
    assert 20 <= len(lines) <= 22  # one per 5 % (+ the first)
    half = next(m for m in map(LINE.match, lines) if m and m["done"] == "100")
    assert half["label"] == "DP training" and half["unit"] == "steps"
    assert half["elapsed"] == "1m40s" and half["eta"] == "1m40s"  # 100 steps left at 1 step/s
    assert lines[-1].startswith("DP training: 200/200 steps (100%)") and "done" in lines[-1]
    assert all("loss 0.500" in x for x in lines)


def test_plain_lines_every_interval_when_percentages_are_slow() -> None:
    clock, out = FakeClock(), NotATerminal()
    rep = ProgressReporter(out, clock=clock, grace=0)
    for step in range(0, 301):
        rep.update("deid", step, 100_000, unit="notes")
        clock.t += 1.0
    lines = out.getvalue().splitlines()
    assert len(lines) == 11  # at 0 s and then every 30 s for 300 s
    m = LINE.match(lines[1])
    assert m and m["label"] == "de-identifying" and m["unit"] == "notes"
    assert m["eta"] == "27h46m"  # 99,970 notes left at 1 note/s


def test_short_runs_stay_quiet_and_modes_are_chosen() -> None:
    clock, out = FakeClock(), NotATerminal()
    rep = ProgressReporter(out, clock=clock)  # default grace: a few seconds
    for step in range(11):
        rep.update("deid", step, 10, unit="notes")
    assert out.getvalue() == ""  # ended within the grace period: nothing to report
    assert ProgressReporter(Terminal()).mode == "bar"
    off = NotATerminal()
    rep = ProgressReporter(off, mode="off", grace=0)
    rep.update("train", 1, 2)
    rep.message("hello")
    assert off.getvalue() == ""


def test_bar_mode_draws_on_a_terminal() -> None:
    out = Terminal()
    with ProgressReporter(out) as rep:
        rep.update("train", 5, 10, info="ε 1.00")
    assert "DP training" in out.getvalue()


def test_train_callback_announces_the_warm_start_and_the_wait() -> None:
    clock, out = FakeClock(), NotATerminal()
    rep = ProgressReporter(out, clock=clock)
    cb = rep.train_callback()
    cb(Progress("warm-start", 0, 120, None, None, None))
    cb(Progress(warmstart.WAIT_PHASE, 2, 3600, None, None, None))
    clock.t += 10
    cb(Progress(warmstart.WAIT_PHASE, 12, 3600, None, None, None))  # within 30 s: no new line
    clock.t += 30
    cb(Progress(warmstart.WAIT_PHASE, 42, 3600, None, None, None))
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("building the public warm start") and "120 steps" in lines[0]
    assert lines[1] == ("waiting for another dphub process to build the public warm start: "
                        "2s so far (gives up after 1h00m)")
    assert lines[2].endswith("42s so far (gives up after 1h00m)") and len(lines) == 3
    assert progress.WAIT_PHASE == warmstart.WAIT_PHASE


def test_the_warm_start_says_what_is_built_and_its_second_part_is_not_a_second_build() -> None:
    """Before: the rule-feature head (same phase) was announced as building the warm start
    again, and neither line said why it happens once."""
    out = NotATerminal()
    rep = ProgressReporter(out, clock=FakeClock())
    cb = rep.train_callback()
    cb(Progress(warmstart.PHASE, 0, 152, None, None, None))
    cb(Progress(warmstart.RULES_PHASE, 0, 304, None, None, None))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("building the public warm start, once per machine")
    assert "synthetic notes" in lines[0] and "152 steps" in lines[0] and "cached" in lines[0]
    assert lines[1].startswith("then the warm start's rule-feature head, 304 steps")
    assert "same one-time build" in lines[1] and "building" not in lines[1]
    assert progress.PHASE_LABELS[warmstart.RULES_PHASE].startswith("public warm start")


def test_building_a_rule_feature_warm_start_reports_its_two_parts(tiny_base_model: Path,
                                                                  tmp_path: Path) -> None:
    cfg = warmstart.WarmStartConfig(notes=(("nursing", 3),), epochs=1.0, batch_size=4,
                                    max_length=64, stride=16, rule_features=True, rule_epochs=1.0)
    events: list[Progress] = []
    warmstart.warm_start(tiny_base_model, "tiny-bert", "hipaa", "crf", cfg, cache_dir=tmp_path,
                         on_progress=events.append)
    phases = [e.phase for e in events]
    first_rules = phases.index(warmstart.RULES_PHASE)
    assert set(phases[:first_rules]) == {warmstart.PHASE}
    assert set(phases[first_rules:]) == {warmstart.RULES_PHASE}
    assert events[first_rules].step == 0


def _held_warm_start_lock(base: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    """Hold the lock a training with this base would take, as another process would."""
    from filelock import FileLock

    from dphub.encoders import resolve_base_model

    loadable, public_id = resolve_base_model(str(base))
    cfg = warmstart.WarmStartConfig(max_length=128, stride=32)
    key = warmstart.cache_key(Path(loadable), public_id, "hipaa", "crf", cfg, 0)
    target = warmstart.cache_root() / "warmstart" / key
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(target) + ".lock")
    lock.acquire()
    monkeypatch.setattr(warmstart, "POLL_SECONDS", 0.2)
    return lock


def test_waiting_for_another_warm_start_reports_and_gives_up(
    tiny_base_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = _held_warm_start_lock(tiny_base_model, monkeypatch)
    monkeypatch.setenv(warmstart.TIMEOUT_ENV, "1")
    events: list[Progress] = []
    try:
        with pytest.raises(DphubError, match=warmstart.TIMEOUT_ENV) as info:
            warmstart.warm_start(tiny_base_model, "tiny-bert", "hipaa", "crf",
                                 warmstart.WarmStartConfig(max_length=128, stride=32),
                                 on_progress=events.append)
    finally:
        lock.release()  # type: ignore[attr-defined]
    assert info.value.exit_code == 2 and "waiting" in info.value.message
    assert events and all(e.phase == warmstart.WAIT_PHASE for e in events)
    assert all(e.total_steps == 1 and 0 <= e.step <= 1 for e in events)


@pytest.mark.parametrize("bad", ["soon", "0", "-5", "nan", "inf"])
def test_bad_timeout_setting_is_refused(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv(warmstart.TIMEOUT_ENV, bad)
    with pytest.raises(DphubError, match=warmstart.TIMEOUT_ENV):
        warmstart.wait_timeout()


def test_cli_train_shows_the_wait_and_exits_2_after_the_timeout(
    tmp_path: Path, tiny_base_model: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    notes = synth.generate(4, kind="nursing", seed=3, patients=2)
    formats.write(notes, tmp_path / "n.jsonl", "jsonl")
    lock = _held_warm_start_lock(tiny_base_model, monkeypatch)
    monkeypatch.setenv(warmstart.TIMEOUT_ENV, "0.6")
    try:
        code = main(["train", "n.jsonl", "--out", "m", "--base-model", str(tiny_base_model),
                     "--noise", "1", "--epochs", "1"])
    finally:
        lock.release()  # type: ignore[attr-defined]
    err = capsys.readouterr().err
    assert code == 2
    assert "waiting for another dphub process to build the public warm start" in err
    assert err.strip().splitlines()[-1].startswith("error: gave up after")
    assert "Traceback" not in err and not (tmp_path / "m").exists()


def _texts(notes: list) -> list[str]:
    return [n.span_text(s) for n in notes for s in n.spans if len(n.span_text(s)) >= 4]


def test_cli_train_prints_plain_progress_lines_without_note_text(
    tmp_path: Path, tiny_base_model: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(progress, "DEFAULT_GRACE", 0.0)
    notes = synth.generate(8, kind="nursing", seed=5, patients=4)
    formats.write(notes, tmp_path / "n.jsonl", "jsonl")
    assert main(["train", "n.jsonl", "--out", "m", "--base-model", str(tiny_base_model),
                 "--warm-start", "none", "--noise", "1", "--epochs", "2", "--batch-size", "2",
                 "--accountant", "rdp"]) == 0
    err = capsys.readouterr().err
    lines = [m for m in map(LINE.match, err.splitlines()) if m]
    assert lines and all(m["label"] in ("DP training", progress.PHASE_LABELS["encoder-cache"])
                         for m in lines)
    assert any(m["label"] == "DP training" for m in lines)
    assert lines[-1]["done"] == lines[-1]["total"]
    assert "ε" in err and "ETA" in err
    for text in _texts(notes):
        assert text not in err


def test_cli_deid_prints_plain_progress_lines_without_note_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(progress, "DEFAULT_GRACE", 0.0)
    notes = synth.generate(6, kind="nursing", seed=7)
    src = tmp_path / "notes"
    src.mkdir()
    for n in notes:
        (src / f"{n.id}.txt").write_text(n.text, encoding="utf-8")
    assert main(["deid", str(src), "--model", "rules:default", "--out", "out",
                 "--batch-size", "2"]) == 0
    err = capsys.readouterr().err
    lines = [m for m in map(LINE.match, err.splitlines()) if m]
    assert lines and lines[-1]["done"] == "6" and lines[-1]["total"] == "6"
    assert all(m["label"] == "de-identifying" and m["unit"] == "notes" for m in lines)
    for text in _texts(notes):
        assert text not in err


def test_building_the_warm_start_reports_its_steps_from_zero(tiny_base_model: Path) -> None:
    """Before: the first event came after the first step, minutes into a first training."""
    cfg = warmstart.WarmStartConfig(notes=(("nursing", 3), ("discharge", 2)), epochs=1.0,
                                    batch_size=4, max_length=64, stride=16)
    events: list[Progress] = []
    target = warmstart.warm_start(tiny_base_model, "tiny-bert", "hipaa", "crf", cfg,
                                  on_progress=events.append)
    assert (target / "model.safetensors").is_file()
    assert events[0].phase == "warm-start" and events[0].step == 0
    total = events[0].total_steps
    assert total >= 1 and [e.step for e in events] == list(range(total + 1))
    events.clear()  # cached now: no work, no events, no lock wait
    assert warmstart.warm_start(tiny_base_model, "tiny-bert", "hipaa", "crf", cfg,
                                on_progress=events.append) == target
    assert events == []


def test_ensemble_evaluate_and_calibrate_report_progress(tiny_tagger_dir: Path) -> None:
    """The library calls back per chunk (evaluate) and per member (calibrate); same results."""
    from dphub.ensemble.calibrate import calibrate
    from dphub.ensemble.core import Ensemble, Slot
    from dphub.ensemble.evaluation import evaluate_ensemble
    from dphub.ensemble.members import ModelMember
    from dphub.rules.engine import RuleMember

    notes = synth.generate(5, kind="nursing", seed=8)
    ens = Ensemble([Slot(ModelMember.load(tiny_tagger_dir)), Slot(RuleMember())])
    seen: list[tuple[int, int]] = []
    rows = evaluate_ensemble(ens, notes, progress=lambda d, t: seen.append((d, t)), chunk=2)
    assert seen == [(2, 5), (4, 5), (5, 5)]
    assert rows == evaluate_ensemble(ens, notes)  # chunking changes no number
    seen.clear()
    calibrate(ens, notes, 0.5, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(1, 2), (2, 2)]


def test_elapsed_counts_from_the_command_start_and_deid_reports_before_its_first_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 item 24: a deid run's first line came after 43 s (models loaded, first batch
    done) and said "elapsed 0s"."""
    clock, out = FakeClock(), NotATerminal()
    rep = ProgressReporter(out, clock=clock, start=clock.t - 40.0)  # models took 40 s to load
    rep.update("deid", 0, 10, unit="notes")
    (first,) = out.getvalue().splitlines()
    m = LINE.match(first)
    assert m and m["done"] == "0" and m["elapsed"] == "40s" and m["eta"] == "?"
    clock.t += 10.0
    rep.update("deid", 5, 10, unit="notes")
    m = LINE.match(out.getvalue().splitlines()[-1])
    assert m and m["elapsed"] == "50s" and m["eta"] == "10s"  # the ETA from the phase's rate

    # the runner reports 0/N before the first batch is computed
    from dphub.ensemble.core import Ensemble, Slot
    from dphub.rules.engine import RuleMember
    from dphub.runner import run_deid

    calls: list[tuple[int, int]] = []
    ens = Ensemble([Slot(RuleMember())])
    real = ens.deid

    def deid(*a: object, **k: object) -> object:
        calls.append((-1, -1))  # a batch is computed
        return real(*a, **k)

    monkeypatch.setattr(ens, "deid", deid)
    src = tmp_path / "in"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.txt").write_text("Seen by Dr. Smith.\n")
    run_deid(src, tmp_path / "out", ens, batch_size=2,
             progress=lambda done, total: calls.append((done, total)))
    assert calls[0] == (0, 3) and (-1, -1) in calls[1:]
    # and the CLI's reporters start at the command's start
    assert main(["deid", str(src), "--model", "rules:default", "--out", str(tmp_path / "o2")]) == 0
    start = progress.command_start()
    assert start is not None and ProgressReporter(NotATerminal()).created == start


def test_progress_lines_say_which_step_their_epsilon_is_of(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """Issue 56: the ε on progress lines was recomputed only at checkpoints and shown as the
    current one. It is now refreshed every few seconds (its cost bounded) and, when it is not
    this step's, the line says which step it is of; it is rounded up, never down."""
    from types import SimpleNamespace

    from dphub.train import loop as loop_mod

    calls: list[int] = []
    now = [0.0]

    class Accountant:
        def get_epsilon(self, delta: float) -> float:
            calls.append(fake.step)
            return 0.5 + 0.001 * fake.step

    events: list[Progress] = []
    fake = SimpleNamespace(
        on_progress=events.append, step=0, engine=SimpleNamespace(accountant=Accountant()),
        opts=SimpleNamespace(checkpoint_every=1000), plan=SimpleNamespace(steps=5000,
                                                                          delta=1e-5),
        _eps=None, _eps_step=None, _eps_at=-float("inf"), _eps_cost=0.0, _t0=0.0, _done=0)
    monkeypatch.setattr(loop_mod.time, "monotonic", lambda: now[0])
    for step in range(1, 61):  # 60 steps, 0.5 s each: 30 s
        fake.step = step
        now[0] += 0.5
        loop_mod.TrainLoop._report(fake, 0.1)  # type: ignore[arg-type]
    # computed at the first step and then every EPSILON_REFRESH_S (5 s = 10 steps)
    assert calls == [1, 11, 21, 31, 41, 51]
    assert events[14].epsilon_step == 11 and events[10].epsilon_step is None
    out = NotATerminal()
    rep = ProgressReporter(out, clock=FakeClock(), grace=0)
    rep.train_callback()(events[14])
    assert "ε 0.52 at step 11" in out.getvalue()  # 0.511 rounded up
