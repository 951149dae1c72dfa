"""How long a run will take, learned from the run folders already on this machine.

Every manifest records its stage times (``timing.stage_ms``) and the steps it ran; runs the
studio or ``queue run`` started also record how long the engine took to start
(``studio.engine_start_s``). An estimate for a plan takes, per stage, the median of the ten
newest runs of the same engine, tier and layout (any layout when none match); the preview
and refiner stages scale with the plan's step counts.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engines.base import Plan
from ..run_folder.runs import is_complete

RECENT = 10
PER_STEP_STAGES = {"preview": "steps", "refiner": "refiner_steps"}
MAX_MANIFEST_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class PastRun:
    """What a finished run tells about timing: its key, steps, stage seconds in the order they ran."""

    engine: str
    tier: str
    layout: str
    steps: dict[str, int]
    stage_s: tuple[tuple[str, float], ...]
    engine_start_s: float | None
    created: str


def _past_run(manifest: dict[str, Any]) -> PastRun | None:
    try:
        resolved = manifest.get("resolved", {})
        stage_ms = manifest["timing"]["stage_ms"]
        steps = {key: int(resolved[key]) for key in PER_STEP_STAGES.values() if resolved.get(key)}
        studio = manifest.get("studio") or {}
        start = studio.get("engine_start_s")
        return PastRun(str(manifest["engine"]["name"]), str(manifest["request"]["tier"]),
                       str(manifest["layout"]["name"]), steps,
                       tuple((str(stage), float(ms) / 1e3) for stage, ms in stage_ms.items()),
                       float(start) if isinstance(start, (int, float)) else None, str(manifest.get("created", "")))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


@dataclass(frozen=True)
class Estimate:
    """Expected seconds per stage, in run order (``load`` first when the engine must start)."""

    stages: tuple[tuple[str, float], ...]

    @property
    def total_s(self) -> float:
        return sum(seconds for _, seconds in self.stages)

    def stage_s(self, stage: str) -> float | None:
        return next((seconds for name, seconds in self.stages if name == stage), None)

    def after(self, stage: str) -> float:
        """Seconds of the stages after ``stage`` (all of them when ``stage`` is not in the estimate)."""
        names = [name for name, _ in self.stages]
        if stage not in names:
            return self.total_s
        return sum(seconds for _, seconds in self.stages[names.index(stage) + 1:])


class RunHistory:
    """The outputs root's run folders, each manifest read once (a run folder never changes)."""

    def __init__(self, outputs_root: Path) -> None:
        self.root = Path(outputs_root)
        self._seen: dict[str, PastRun | None] = {}

    def _runs(self) -> list[PastRun]:
        if not self.root.is_dir():
            return []
        for folder in self.root.iterdir():
            if folder.name in self._seen or folder.name.startswith(".") or not is_complete(folder):
                continue
            manifest_path = folder / "manifest.json"
            try:
                if manifest_path.stat().st_size > MAX_MANIFEST_BYTES:
                    raise ValueError("too large")
                self._seen[folder.name] = _past_run(json.loads(manifest_path.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                self._seen[folder.name] = None
        return sorted((run for run in self._seen.values() if run is not None), key=lambda run: run.created)

    def estimate(self, engine: str, plan: Plan, *, engine_starts: bool) -> Estimate | None:
        """Per-stage seconds for ``plan``, or None when no past run of this engine and tier exists."""
        same_tier = [run for run in self._runs() if run.engine == engine and run.tier == plan.tier.name]
        matching = [run for run in same_tier if run.layout == plan.layout.name] or same_tier
        recent = matching[-RECENT:]
        if not recent:
            return None
        order: list[str] = []
        samples: dict[str, list[float]] = {}
        for run in recent:
            for stage, seconds in run.stage_s:
                per = PER_STEP_STAGES.get(stage)
                if per is not None:
                    if not run.steps.get(per):
                        continue
                    seconds /= run.steps[per]
                if stage not in order:
                    order.append(stage)
                samples.setdefault(stage, []).append(seconds)
        stages = []
        if engine_starts:
            starts = [run.engine_start_s for run in recent if run.engine_start_s is not None]
            if starts:
                stages.append(("load", statistics.median(starts)))
        for stage in order:
            seconds = statistics.median(samples[stage])
            per = PER_STEP_STAGES.get(stage)
            if per is not None:
                count = plan.resolved.get(per)
                if not count:
                    continue
                seconds *= int(count)
            stages.append((stage, seconds))
        return Estimate(tuple(stages))
