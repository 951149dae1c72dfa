"""A running job's clock: its stage, steps and timer line, and the ETA from what :mod:`.eta` learned.

The studio's job list and Generate tab read it while the slot's worker feeds it the engine's events.
A stage's per-step time blends the learned one with the one measured in this run, the measurement
weighted by the steps it has seen and taken only after the warm-up steps the gate metric drops
(``EXCLUDED_STEPS``: compile and warm-up). Switching from the learned time to the rate of the first
steps made the ETA jump (issue 29's audit: 376 s to 899 s within one step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..engines.base import Progress
from ..engines.timing import EXCLUDED_STEPS
from .eta import Estimate

# The learned per-step time counts as this many measured steps: after that many the two weigh the same.
LEARNED_WEIGHT_STEPS = 4

STAGE_NAMES = {"load": "engine start", "decode_video": "decode video", "decode_audio": "decode audio"}


@dataclass(frozen=True)
class StageRow:
    """One stage of a running job as its list shows it: ``done`` (its seconds), ``running`` (seconds so far; its
    step is the timer line's) or ``next`` (the learned seconds)."""

    stage: str
    state: str
    seconds: float

    @property
    def name(self) -> str:
        return STAGE_NAMES.get(self.stage, self.stage)


class StageClock:
    """Where a running job is: its stage, since when, its steps; the timer line and ETA come from here."""

    def __init__(self, estimate: Estimate | None, now: float | None = None) -> None:
        self.estimate = estimate
        self.started = time.monotonic() if now is None else now
        self.stage, self.message = "starting", ""
        self.stage_started = self.started
        self.done: int | None = None
        self.total: int | None = None
        self._first_step: tuple[float, int] | None = None  # (when, steps done) at the stage's first step
        self._warm: tuple[float, int] | None = None  # the same once the warm-up steps are done
        self._last_step_at: float | None = None
        self.finished: list[tuple[str, float]] = []  # the stages done, in order, with their seconds

    def on_event(self, event: Progress, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if event.stage != self.stage:
            if self.stage != "starting":
                self.finished.append((self.stage, now - self.stage_started))
            self.stage, self.stage_started = event.stage, now
            self._first_step = self._warm = self._last_step_at = None
            self.done = self.total = None
        self.message = event.message or self.message if event.step is None else ""
        if event.step is not None and event.total:
            self.done, self.total, self._last_step_at = event.step + 1, event.total, now
            if self._first_step is None:
                self._first_step = (now, self.done)
            if self._warm is None and self.done >= len(EXCLUDED_STEPS):
                self._warm = (now, self.done)

    def _measured(self, mark: tuple[float, int] | None) -> tuple[float, int] | None:
        """(seconds per step, steps measured) since ``mark``, or None before a step after it."""
        if mark is None or self.done is None or self._last_step_at is None or self.done <= mark[1]:
            return None
        steps = self.done - mark[1]
        return (self._last_step_at - mark[0]) / steps, steps

    def stage_remaining_s(self, now: float) -> float | None:
        """Seconds left in this stage: the per-step time (learned, blended with the steps measured after the
        warm-up) for the steps left, less the time since the last step; a stage without steps: the learned time."""
        learned = self.estimate.stage_s(self.stage) if self.estimate else None
        if self.done is None or not self.total:
            return None if learned is None else max(learned - (now - self.stage_started), 0.0)
        warm = self._measured(self._warm)
        if learned is not None:
            per_step = learned / self.total
            if warm is not None:
                measured, steps = warm
                per_step = (LEARNED_WEIGHT_STEPS * per_step + steps * measured) / (LEARNED_WEIGHT_STEPS + steps)
        else:  # nothing learned: this run's own rate, with its warm-up steps until later ones are measured
            first = warm or self._measured(self._first_step)
            if first is None:
                return None
            per_step = first[0]
        return max(per_step * (self.total - self.done) - (now - self._last_step_at), 0.0)

    def remaining_s(self, now: float | None = None) -> float | None:
        """Seconds left in the whole job, when this stage's remainder is known."""
        now = time.monotonic() if now is None else now
        stage_left = self.stage_remaining_s(now)
        if stage_left is None:
            return None
        return stage_left + (self.estimate.after(self.stage) if self.estimate else 0.0)

    def fraction(self, now: float) -> float | None:
        """The stage's fraction done: steps, else the elapsed share of the learned stage time."""
        if self.done is not None and self.total:
            return self.done / self.total
        learned = self.estimate.stage_s(self.stage) if self.estimate else None
        if learned:
            return min((now - self.stage_started) / learned, 0.99)
        return None

    def line(self, now: float | None = None) -> str:
        """``preview: step 3/8 · 2 s in stage · job 14 s · ETA ~6 s``; stages without steps show their timer."""
        now = time.monotonic() if now is None else now
        name = STAGE_NAMES.get(self.stage, self.stage)
        text = f"{name}: step {self.done}/{self.total}" if self.done is not None else name
        if self.message and self.done is None:
            text += f": {self.message}"
        in_stage = now - self.stage_started
        learned = self.estimate.stage_s(self.stage) if self.estimate else None
        text += f" · {in_stage:.0f} s" + (f" of ~{learned:.0f} s" if learned is not None and self.done is None else "")
        text += f" · job {now - self.started:.0f} s"
        remaining = self.remaining_s(now)
        if remaining is not None:
            text += f" · ETA ~{remaining:.0f} s"
        return text

    def stages(self, now: float | None = None, *, over: bool = False) -> list[StageRow]:
        """Every stage in run order: the ones done, the running one (done too once the job is ``over``), then
        the ones the estimate says come next."""
        now = time.monotonic() if now is None else now
        rows = [StageRow(stage, "done", seconds) for stage, seconds in self.finished]
        if self.stage != "starting":
            rows.append(StageRow(self.stage, "done" if over else "running", now - self.stage_started))
        if not over and self.estimate is not None:
            names = [stage for stage, _ in self.estimate.stages]
            start = names.index(self.stage) + 1 if self.stage in names else 0
            seen = {row.stage for row in rows}
            rows += [StageRow(stage, "next", seconds) for stage, seconds in self.estimate.stages[start:]
                     if stage not in seen]
        return rows
