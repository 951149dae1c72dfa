"""A running job's clock: its stage, steps and timer line, and the ETA from what :mod:`.eta` learned.

The studio's job list and Generate tab read it while the slot's worker feeds it the engine's events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..engines.base import Progress
from .eta import Estimate

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
        self._first_step: tuple[float, int] | None = None
        self.finished: list[tuple[str, float]] = []  # the stages done, in order, with their seconds

    def on_event(self, event: Progress, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if event.stage != self.stage:
            if self.stage != "starting":
                self.finished.append((self.stage, now - self.stage_started))
            self.stage, self.stage_started, self._first_step = event.stage, now, None
            self.done = self.total = None
        self.message = event.message or self.message if event.step is None else ""
        if event.step is not None and event.total:
            self.done, self.total = event.step + 1, event.total
            if self._first_step is None:
                self._first_step = (now, self.done)

    def stage_remaining_s(self, now: float) -> float | None:
        """Seconds left in this stage: the rate of its steps so far, else the learned stage time."""
        in_stage = now - self.stage_started
        first = self._first_step
        if self.done is not None and first is not None and self.done > first[1]:
            return (now - first[0]) / (self.done - first[1]) * (self.total - self.done)
        learned = self.estimate.stage_s(self.stage) if self.estimate else None
        if learned is None:
            return None
        if self.done is not None and self.total:
            return learned * (self.total - self.done) / self.total
        return max(learned - in_stage, 0.0)

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
