"""Per-step timing around upstream's MAGI-2 sampler, and the MUSA report's per-step metric.

One piece of instrumentation serves both engines: :func:`install_step_hooks` wraps
``Magi2PreviewSampler``'s per-step calls (``prepare_model_input`` opens a step; ``step`` or,
under CFG-parallel, ``_step_guided`` closes it) at class level, and the :class:`StepTimer`
active in the process receives them. The embedded engine activates a timer per run; the
real engine's vLLM worker plugin installs the same hooks in every worker.

On a device, steps are bracketed with device events and read once after sampling: no host
synchronization is added inside the loop. On CPU a monotonic host clock is used.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

EXCLUDED_STEPS = (0, 1)  # warm-up steps the MUSA report's metric drops
_HOOKED = "_magi2studio_step_hook"
HOOKED_METHODS = ("sample", "prepare_model_input", "step", "_step_guided")


@dataclass(frozen=True)
class StepRecord:
    rank: int
    stage: str
    step: int
    ms: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class StepTimer:
    """Collects one rank's step times for the samples run while it is active.

    ``on_step(stage, index, total)`` is called on the host at each step end (progress,
    cancellation: it may raise to stop at the step boundary). ``on_sample(records)`` gets
    the records of a finished sample.
    """

    def __init__(
        self,
        *,
        stage: str = "preview",
        rank: int = 0,
        on_step: Callable[[str, int, int], None] | None = None,
        on_sample: Callable[[list[StepRecord]], None] | None = None,
    ) -> None:
        self.stage = stage
        self.rank = rank
        self.on_step = on_step
        self.on_sample = on_sample
        self.records: list[StepRecord] = []
        self._marks: list[tuple[Any, Any]] = []
        self._open: Any = None
        self._total = 0
        self._device = False
        self.preview = None  # a live_preview.LivePreview: the x0 estimate every few steps

    # The clock: device events where the latent lives on a device, else the host clock.
    def _mark(self) -> Any:
        if self._device:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter_ns()

    def _elapsed_ms(self, start: Any, end: Any) -> float:
        if self._device:
            return float(start.elapsed_time(end))
        return (end - start) / 1e6

    def begin_sample(self, latent: Any, total_steps: int) -> None:
        self._device = bool(getattr(latent, "is_cuda", False))
        self._marks = []
        self._open = None
        self._total = total_steps

    def step_start(self) -> None:
        self._open = self._mark()

    def step_end(self, video_scheduler: Any = None) -> None:
        if self._open is None:
            return
        self._marks.append((self._open, self._mark()))
        self._open = None
        if self.preview is not None and video_scheduler is not None:
            self.preview.after_step(self.stage, len(self._marks) - 1, self._total, video_scheduler)
        if self.on_step is not None:
            self.on_step(self.stage, len(self._marks) - 1, self._total)

    def end_sample(self) -> list[StepRecord]:
        if self._device and self._marks:
            self._marks[-1][1].synchronize()  # the one sync, after the loop
        if self.preview is not None:
            self.preview.flush()
        records = [
            StepRecord(self.rank, self.stage, index, self._elapsed_ms(start, end))
            for index, (start, end) in enumerate(self._marks)
        ]
        self._marks = []
        self.records.extend(records)
        if self.on_sample is not None:
            self.on_sample(records)
        return records


_active: StepTimer | None = None
_boundary_check: Callable[[], None] | None = None


def set_step_boundary_check(check: Callable[[], None] | None) -> None:
    """Call ``check`` at every step end after the timer (the plugin's cooperative cancellation; it may raise)."""

    global _boundary_check
    _boundary_check = check


@contextmanager
def active(timer: StepTimer):
    """Route the installed hooks to ``timer`` for the duration of the block."""

    global _active
    previous, _active = _active, timer
    try:
        yield timer
    finally:
        _active = previous


@contextmanager
def stage(name: str):
    """Label the active timer's steps ``name`` for the block (the 1080p refiner's own stage)."""

    timer = _active
    if timer is None:
        yield
        return
    previous, timer.stage = timer.stage, name
    try:
        yield
    finally:
        timer.stage = previous


def set_process_timer(timer: StepTimer | None) -> None:
    """Make ``timer`` the process-wide default (a worker plugin keeps one for its lifetime)."""

    global _active
    _active = timer


def install_step_hooks(sampler_cls: type | None = None) -> type:
    """Wrap the sampler's per-step methods once; raise if upstream renamed one of them."""

    if sampler_cls is None:
        from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler as sampler_cls
    missing = [name for name in HOOKED_METHODS if not hasattr(sampler_cls, name)]
    if missing:
        raise RuntimeError(
            f"{sampler_cls.__module__}.{sampler_cls.__qualname__} has no {', '.join(missing)}: the pinned "
            "vLLM-Omni sampler changed, so per-step timing cannot be installed. Pin vllm-omni==0.30.0 "
            "or update magi2studio.engines.timing.HOOKED_METHODS."
        )
    if getattr(sampler_cls.sample, _HOOKED, False):
        return sampler_cls

    original_sample = sampler_cls.sample
    original_prepare = sampler_cls.prepare_model_input
    original_step = sampler_cls.step
    original_guided = sampler_cls.__dict__["_step_guided"].__func__

    @functools.wraps(original_sample)
    def sample(self, sampler_input, *args, **kwargs):
        timer = _active
        if timer is None:
            return original_sample(self, sampler_input, *args, **kwargs)
        timer.begin_sample(sampler_input.latent, len(sampler_input.video_t_list))
        result = original_sample(self, sampler_input, *args, **kwargs)
        timer.end_sample()
        return result

    @functools.wraps(original_prepare)
    def prepare_model_input(self, *args, **kwargs):
        if _active is not None:
            _active.step_start()
        return original_prepare(self, *args, **kwargs)

    @functools.wraps(original_step)
    def step(self, *args, **kwargs):
        result = original_step(self, *args, **kwargs)
        if _active is not None:
            _active.step_end(kwargs.get("video_scheduler", args[5] if len(args) > 5 else None))
        if _boundary_check is not None:
            _boundary_check()
        return result

    @functools.wraps(original_guided)
    def step_guided(*args, **kwargs):
        result = original_guided(*args, **kwargs)
        if _active is not None:
            _active.step_end(kwargs.get("video_scheduler", args[3] if len(args) > 3 else None))
        if _boundary_check is not None:
            _boundary_check()
        return result

    for wrapper in (sample, prepare_model_input, step, step_guided):
        setattr(wrapper, _HOOKED, True)
    sampler_cls.sample = sample
    sampler_cls.prepare_model_input = prepare_model_input
    sampler_cls.step = step
    sampler_cls._step_guided = staticmethod(step_guided)
    return sampler_cls


def write_jsonl(records: Iterable[StepRecord | dict], path) -> None:
    with open(path, "a", encoding="utf-8") as file:
        for record in records:
            row = record.as_dict() if isinstance(record, StepRecord) else record
            file.write(json.dumps(row, sort_keys=True) + "\n")


def read_jsonl(path) -> list[dict]:
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]


def slowest_rank_per_step(records: Sequence[dict | StepRecord], stage: str = "preview") -> dict[int, float]:
    per_step: dict[int, float] = {}
    for record in records:
        row = record.as_dict() if isinstance(record, StepRecord) else record
        if row["stage"] != stage:
            continue
        per_step[row["step"]] = max(per_step.get(row["step"], 0.0), float(row["ms"]))
    return dict(sorted(per_step.items()))


def gate_summary(records: Sequence[dict | StepRecord], stage: str = "preview") -> dict[str, Any]:
    """The MUSA report's metric: per step the slowest rank, drop steps 0 and 1, average the rest."""

    per_step = slowest_rank_per_step(records, stage)
    kept = [ms for step, ms in per_step.items() if step not in EXCLUDED_STEPS]
    ranks = sorted({(r.as_dict() if isinstance(r, StepRecord) else r)["rank"] for r in records})
    summary: dict[str, Any] = {
        "stage": stage,
        "steps": len(per_step),
        "ranks": ranks,
        "excluded_steps": [s for s in EXCLUDED_STEPS if s in per_step],
        "total_ms": sum(per_step.values()),
    }
    if kept:
        summary.update(
            gate_ms=statistics.fmean(kept),
            median_ms=statistics.median(kept),
            min_ms=min(kept),
            max_ms=max(kept),
        )
    else:
        summary.update(gate_ms=None, median_ms=None, min_ms=None, max_ms=None,
                       note=f"{len(per_step)} steps: the metric needs a step after steps 0 and 1")
    return summary
