"""Progress display shared by every command: rich bars on a terminal, plain lines otherwise.

Why: the long steps of dphub (the public warm start on first use, DP training, directory
de-identification, evaluation with a model) run for minutes to hours, often with stderr going to
a file or a CI log where a rich bar is invisible. There a user must still see that the run is
alive, how far it is and when it will end, so :class:`ProgressReporter` writes one plain line per
phase every ``interval`` seconds or every ``percent`` % of the phase, whichever comes first:
phase, done/total, elapsed time, ETA and a few numbers (loss, ε, rate).

The library never prints: it reports numbers through callbacks (``dphub.train.Progress`` via
``on_progress``, ``progress(done, total)`` of :func:`dphub.runner.run_deid`); only the CLI creates
a reporter with a stream and renders them. A reporter receives phases, counts and numbers only —
never note text — so nothing it writes can leak PHI.

``DPHUB_PROGRESS`` chooses the display: ``auto`` (default: bars on a terminal, lines otherwise),
``bar``, ``plain`` or ``off``.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

#: Plain lines: at most every this many seconds ...
DEFAULT_INTERVAL = 30.0
#: ... or every this many percent of a phase, whichever comes first.
DEFAULT_PERCENT = 5.0
#: No plain line before the reporter has lived this long: a command that ends within a few
#: seconds needs no progress, and its stderr stays the one result or ``error:`` line.
DEFAULT_GRACE = 3.0

#: Phase names the library reports -> what a user reads.
PHASE_LABELS: dict[str, str] = {
    "warm-start": "public warm start (first use only; cached afterwards)",
    "warm-start-rules": "public warm start, rule-feature head (first use only; cached afterwards)",
    "pretrain": "public pretraining on synthetic notes (no private data, no ε)",
    "encoder-cache": "encoding the training windows once (frozen encoder)",
    "train": "DP training",
    "train-nodp": "training without DP",
    "deid": "de-identifying",
    "deid-chunks": "de-identifying a long note",
    "evaluate": "evaluating",
    "calibrate": "calibrating (members scored)",
}

#: What the first event of each part of building the public warm start announces (why: the first
#: training on a machine spends minutes there before its first DP step, and the rule-feature part
#: was announced as if the warm start were built a second time)
WARM_START_ANNOUNCEMENTS: dict[str, str] = {
    "warm-start": "building the public warm start, once per machine: the base encoder learns to "
                  "tag PHI on synthetic notes (no private data, no ε), {steps} steps; it is "
                  "cached, so every later training starts from it at once",
    "warm-start-rules": "then the warm start's rule-feature head, {steps} steps (the second, "
                        "shorter part of the same one-time build)",
}

#: Phase of ``dphub.train.Progress`` events that report the wait for another process's warm
#: start: ``step`` is the seconds waited so far, ``total_steps`` the seconds before giving up.
WAIT_PHASE = "warm-start-wait"


_command_start: float | None = None


def mark_command_start() -> None:
    """Note that a command starts now (``time.monotonic``); the CLI calls it first thing.

    Why: a deid run loads its models and finishes a first batch before it can count anything;
    its first line came after 43 s and said "elapsed 0s". Reporters made by the CLI count
    elapsed time (and the grace period) from here instead.
    """
    global _command_start
    _command_start = time.monotonic()


def command_start() -> float | None:
    """When the current command started (:func:`mark_command_start`), or None."""
    return _command_start


def format_duration(seconds: float | None) -> str:
    """``42s``, ``4m05s``, ``2h03m``; ``?`` when unknown (why: short, fixed shapes read well in
    logs and are easy to grep)."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


@dataclass
class _Phase:
    label: str
    unit: str
    total: int | None
    start: float
    start_done: int
    done: int = 0
    last_line: float | None = None
    last_bucket: int = -1
    finished: bool = False
    task: Any = None
    #: a phase that begins anew per item (:meth:`ProgressReporter.count_callback`'s ``restart``)
    restartable: bool = False
    #: when the previous run of a restartable phase last wrote a line
    previous_line: float | None = None


class ProgressReporter:
    """Renders progress events of any command on ``stream`` (default: stderr).

    Use as a context manager around the work; pass :meth:`train_callback` or
    :meth:`count_callback` to the library. ``mode`` is ``auto`` (rich bar when the stream is a
    terminal), ``bar``, ``plain`` or ``off``; ``None`` reads ``DPHUB_PROGRESS``. ``start`` (on the
    ``clock``) is when the command began, by default :func:`command_start` with the real clock,
    else now: lines say the elapsed time since then; an ETA uses the phase's own rate.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        mode: str | None = None,
        interval: float = DEFAULT_INTERVAL,
        percent: float = DEFAULT_PERCENT,
        grace: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        start: float | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        mode = (mode or os.environ.get("DPHUB_PROGRESS") or "auto").strip().lower()
        if mode not in ("auto", "bar", "plain", "off"):
            mode = "auto"
        if mode == "auto":
            isatty = getattr(self.stream, "isatty", None)
            mode = "bar" if callable(isatty) and isatty() else "plain"
        self.mode = mode
        self.interval, self.percent = interval, percent
        self.grace = DEFAULT_GRACE if grace is None else grace
        self.clock = clock
        if start is None and clock is time.monotonic:
            start = _command_start
        #: when the command started: elapsed time and the grace period count from here
        self.created = clock() if start is None else start
        self.phases: dict[str, _Phase] = {}
        self._bar: Any = None
        self._last_wait_line: float | None = None

    # ------------------------------------------------------------------ context
    def __enter__(self) -> ProgressReporter:
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}", markup=False),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
            self._bar = None

    # ------------------------------------------------------------------ events
    def update(self, phase: str, done: int, total: int | None = None, *, unit: str = "steps",
               info: str = "") -> None:
        """``done`` of ``total`` units of ``phase`` are finished; ``info``: short numbers only."""
        if self.mode == "off":
            return
        now = self.clock()
        ph = self.phases.get(phase)
        if ph is None:
            ph = _Phase(PHASE_LABELS.get(phase, phase), unit, total, now, done)
            self.phases[phase] = ph
        ph.done, ph.unit = done, unit
        if total is not None:
            ph.total = total
        if self._bar is not None:
            if ph.task is None:
                ph.task = self._bar.add_task(ph.label, total=ph.total, info=info)
            self._bar.update(ph.task, completed=done, total=ph.total, info=info)
            return
        self._maybe_line(ph, now, info)

    def message(self, text: str) -> None:
        """One line as is (status such as "waiting for ..."); callers pass no note text."""
        if self.mode == "off":
            return
        if self._bar is not None:
            from rich.text import Text

            self._bar.console.print(Text(text))
            return
        self.stream.write(f"{text}\n")
        self.stream.flush()

    def waiting(self, what: str, elapsed: float, timeout: float | None) -> None:
        """Still waiting for ``what``: a line now and then every ``interval`` seconds."""
        if self.mode == "off":
            return
        now = self.clock()
        if self._last_wait_line is not None and now - self._last_wait_line < self.interval:
            return
        self._last_wait_line = now
        limit = f" (gives up after {format_duration(timeout)})" if timeout else ""
        self.message(f"waiting for {what}: {format_duration(elapsed)} so far{limit}")

    # ------------------------------------------------------------------ adapters
    def train_callback(self) -> Callable[[Any], None]:
        """Callback for ``dphub.train.train(on_progress=...)`` and the warm start."""

        def on_progress(p: Any) -> None:
            if p.phase == WAIT_PHASE:
                self.waiting("another dphub process to build the public warm start",
                             float(p.step), float(p.total_steps) or None)
                return
            if p.step == 0 and p.phase in WARM_START_ANNOUNCEMENTS:
                # minutes of work before the first DP step: say what and why, even within the grace
                self.message(WARM_START_ANNOUNCEMENTS[p.phase].format(steps=p.total_steps))
            info = []
            if p.loss is not None and math.isfinite(p.loss):
                info.append(f"loss {p.loss:.3f}")
            if p.epsilon is not None:
                # rounded up, never down (the guarantee); the step it was computed at when that
                # is not this one (it is refreshed every few seconds, not every step)
                at = getattr(p, "epsilon_step", None)
                info.append(f"ε {math.ceil(p.epsilon * 100 - 1e-9) / 100:.2f}"
                            + (f" at step {at}" if at is not None else ""))
            if p.steps_per_second:
                info.append(f"{p.steps_per_second:.2f} steps/s")
            unit = "windows" if p.phase == "encoder-cache" else "steps"
            self.update(p.phase, p.step, p.total_steps, unit=unit, info=", ".join(info))

        return on_progress

    def count_callback(self, phase: str, unit: str = "notes", *, restart: bool = False
                       ) -> Callable[[int, int], None]:
        """Callback ``(done, total)`` for counted work (directory runs, evaluation).

        ``restart``: the count runs once per item (the chunks of each long note) and ``done == 0``
        begins it anew. Such a phase writes a line at most every ``interval`` seconds across its
        runs and no "done" line for a run it said nothing about, so many notes just over the
        chunk size add no line per note.
        """

        def on_count(done: int, total: int) -> None:
            if restart and done == 0:
                self._restart(phase)
            self.update(phase, done, total or None, unit=unit)
            if restart and phase in self.phases:
                self.phases[phase].restartable = True

        return on_count

    def _restart(self, phase: str) -> None:
        old = self.phases.pop(phase, None)
        if old is None:
            return
        if self._bar is not None and old.task is not None:
            self._bar.remove_task(old.task)
        last = old.last_line if old.last_line is not None else old.previous_line
        if self.mode != "off":
            now = self.clock()
            self.phases[phase] = _Phase(old.label, old.unit, None, now, 0, restartable=True,
                                        previous_line=last)

    # ------------------------------------------------------------------ plain lines
    def _maybe_line(self, ph: _Phase, now: float, info: str) -> None:
        if ph.finished:
            return
        done_all = ph.total is not None and ph.done >= ph.total
        bucket = -1
        if ph.total:
            bucket = int(100.0 * ph.done / ph.total // self.percent)
        if done_all:
            ph.finished = True
            if ph.last_line is None and (ph.restartable or now - self.created < self.grace):
                return  # ended within the grace period, or a quiet run of a restarted phase
        else:
            if now - self.created < self.grace:
                return
            if (ph.last_line is None and ph.previous_line is not None
                    and now - ph.previous_line < self.interval):
                return  # a restarted phase: no more often than its runs before it
            due = (ph.last_line is None or now - ph.last_line >= self.interval
                   or bucket > ph.last_bucket)
            if not due:
                return
        ph.last_line, ph.last_bucket = now, bucket
        self.stream.write(self.line(ph, now, info) + "\n")
        self.stream.flush()

    def line(self, ph: _Phase, now: float, info: str = "") -> str:
        """``<phase>: 40/200 steps (20%), elapsed 1m05s, ETA 4m20s, loss 0.532``; elapsed since
        the command started, the ETA from the phase's rate."""
        elapsed = now - self.created
        phase_elapsed = now - ph.start
        if ph.total:
            pct = 100.0 * ph.done / ph.total
            head = f"{ph.label}: {ph.done}/{ph.total} {ph.unit} ({pct:.0f}%)"
        else:
            head = f"{ph.label}: {ph.done} {ph.unit}"
        parts = [head, f"elapsed {format_duration(elapsed)}"]
        if ph.total is not None and ph.done >= ph.total:
            parts.append("done")
        else:
            eta = None
            progressed = ph.done - ph.start_done
            if ph.total and progressed > 0 and phase_elapsed > 0:
                eta = phase_elapsed / progressed * (ph.total - ph.done)
            parts.append(f"ETA {format_duration(eta)}")
        if info:
            parts.append(info)
        return ", ".join(parts)
