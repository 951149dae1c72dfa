"""One embedded job, and the one body every rank runs it with.

A :class:`Job` is a plan's request, tier and resolved settings. :func:`run_job` is the per-job
body (compile, deterministic, step timer, driver) that a rank of a :class:`~.pool.RankPool`
and the :class:`InProcessPool` (world 1: a pool of one, run in this process) both run.
The events are what a rank tells its parent while it runs; :meth:`InProcessPool.run` sends
the parent the same step and stage events a pool's rank 0 does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...errors import Cancelled
from ...request import Request, output_size
from ...tiers import Tier
from ...timing import StepTimer, active, install_step_hooks
from . import upstream_patches
from .components import load_components
from .driver import DriverOutput, EmbeddedDriver, prepare_compile


@dataclass(frozen=True)
class Job:
    request: Request
    tier: Tier
    steps: int
    compile_mode: str
    deterministic: bool
    refiner_steps: int | None = None  # refined tiers (1080p) only

    @classmethod
    def from_plan(cls, plan) -> Job:
        settings = plan.resolved
        return cls(plan.request, plan.tier, settings["steps"], settings["compile"], settings["deterministic"],
                   settings["refiner_steps"])


@dataclass(frozen=True)
class JobResult:
    """Rank 0's frames and audio, every rank's step records."""

    frames: Any
    audio: Any
    stage_ms: dict[str, float]
    negative_prompt_source: str
    step_records: list[dict]


# -- what a rank tells its parent ----------------------------------------------------------------
@dataclass(frozen=True)
class RankReady:
    rank: int
    loaded_weights: int


@dataclass(frozen=True)
class StageStarted:
    """Rank 0 began a stage (encode, preview, refiner, decode_video, decode_audio)."""

    name: str


@dataclass(frozen=True)
class StepFinished:
    """A rank finished step ``index`` (0-based) of ``total`` in ``stage``; it waits at the boundary."""

    rank: int
    stage: str
    index: int
    total: int


@dataclass(frozen=True)
class StepPassed:
    """A rank passed the boundary after step ``index`` (nobody cancelled): the step watchdog's mark."""

    rank: int
    index: int


@dataclass(frozen=True)
class RankDone:
    rank: int
    step_records: list[dict]
    output: DriverOutput | None = None  # rank 0 only


@dataclass(frozen=True)
class RankCancelled:
    rank: int
    message: str


@dataclass(frozen=True)
class RankFailed:
    rank: int
    step: int | None  # None: it failed while starting
    traceback: str


def stopped_at(stage: str, index: int, total: int) -> Cancelled:
    return Cancelled(f"stopped at the step boundary after {stage} step {index + 1}/{total}")


# -- the one per-job body ------------------------------------------------------------------------
def load_driver(checkpoint: Path, device: torch.device | str = "cpu") -> EmbeddedDriver:
    """A rank's driver: the step hooks in place, the checkpoint's components on ``device``."""

    install_step_hooks()
    return EmbeddedDriver(load_components(checkpoint), device=device)


def run_job(driver: EmbeddedDriver, job: Job, *, rank: int, world_size: int,
            on_step: Callable[[str, int, int], None],
            on_stage: Callable[[str], None] | None) -> tuple[DriverOutput, list[dict]]:
    """Run ``job`` on this rank; its output (frames on rank 0 only) and its step records."""

    prepare_compile(driver.c.transformer, job.compile_mode)
    if job.tier.refined:
        prepare_compile(driver.c.refiner, job.compile_mode)
    upstream_patches.set_deterministic(job.deterministic)
    # 1080p decodes patch-parallel over all ranks (the layout rule); rank 0 gets the video.
    driver.set_vae_patch_parallel(world_size if job.tier.refined else 1)
    timer = StepTimer(stage="preview", rank=rank, on_step=on_step)
    with active(timer):
        out = driver.run(job.request, job.tier, job.steps, job.refiner_steps, on_stage=on_stage,
                         output_size=output_size(job.request))
    return out, [record.as_dict() for record in timer.records]


class InProcessPool:
    """World 1: a pool of one rank, run in this process on the process's world-1 groups.

    It holds upstream's world-1 groups (:func:`upstream_patches.hold_world_of_one`) while open;
    an error in a run propagates as raised and leaves the pool usable.
    """

    def __init__(self, checkpoint: Path) -> None:
        upstream_patches.hold_world_of_one()
        try:
            self.driver = load_driver(checkpoint)
        except BaseException:
            upstream_patches.let_go_of_world_of_one()
            raise
        self.components = self.driver.c
        self.alive = True

    def health(self) -> str | None:
        return None

    def info(self) -> dict:
        return {"checkpoint": str(self.components.root), "loaded_weights": self.components.loaded_weights}

    def run_info(self) -> dict:
        """What a run records beyond :meth:`info`: nothing (no ranks, no process group of its own)."""

        return {}

    def run(self, job: Job, on_event: Callable[[StageStarted | StepFinished], None],
            cancel: threading.Event | None) -> JobResult:
        def on_step(stage: str, index: int, total: int) -> None:
            on_event(StepFinished(0, stage, index, total))
            if cancel is not None and cancel.is_set():
                raise stopped_at(stage, index, total)

        out, records = run_job(self.driver, job, rank=0, world_size=1, on_step=on_step,
                               on_stage=lambda name: on_event(StageStarted(name)))
        return JobResult(out.frames, out.audio, out.stage_ms, out.negative_prompt_source, records)

    def close(self) -> None:
        if self.alive:
            self.alive = False
            upstream_patches.let_go_of_world_of_one()  # the last holder releases the process's world
