"""What training reports: progress events (numbers only, never text) and the final result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Progress:
    """What a progress display may show: numbers only, never text."""

    phase: str  # "warm-start" | "warm-start-rules" | "encoder-cache" | "train" | ...
    step: int
    total_steps: int
    loss: float | None
    epsilon: float | None
    steps_per_second: float | None
    #: the step ``epsilon`` was computed at (None: this one); it is recomputed every few seconds,
    #: not every step (one accountant call costs 0.2-1 s), so a line says which step it is of
    epsilon_step: int | None = None


@dataclass
class TrainResult:
    out_dir: Path
    steps: int
    planned_steps: int
    epsilon: float | None
    delta: float | None
    noise_multiplier: float | None
    sample_rate: float
    num_units: int
    seconds: float
    stopped_by_max_epsilon: bool
    meta: dict[str, Any]


ProgressFn = Callable[[Progress], None]
