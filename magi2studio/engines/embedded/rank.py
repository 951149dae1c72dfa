"""One rank of the embedded engine: the job it runs, what it tells its parent, and how.

A :class:`Job` is a plan's request, tier and resolved settings. :func:`run_job` is the one
per-job body (compile, deterministic, VAE patch-parallel, step timer, driver). It runs in
:func:`rank_main`, the process of each rank of a :class:`~.pool.RankPool` (world 1 too). The
events are what a rank tells its parent while it runs.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ...errors import Cancelled
from ...vocabulary.request import Request, output_size
from ...vocabulary.tiers import Tier
from ..live_preview import LinearPreviewMap, LivePreview
from ..timing import StepTimer, active, install_step_hooks
from . import upstream_patches
from .components import load_components
from .driver import DriverOutput, EmbeddedDriver, prepare_compile

# Test hook: "RANK:STEP[:exit|hang|raise]" makes that rank fail when it starts that step.
FAULT_ENV = "MAGI2STUDIO_EMBEDDED_FAULT"


@dataclass(frozen=True)
class Job:
    request: Request
    tier: Tier
    steps: int
    compile_mode: str
    deterministic: bool
    refiner_steps: int | None = None  # refined tiers (1080p) only
    preview_every: int = 0  # live preview every N steps on rank 0 (0: off)
    preview_map: str | None = None  # the fitted map's file (engines/live_preview)
    preview_dir: str | None = None  # where rank 0 writes the pictures

    @classmethod
    def from_plan(cls, plan, preview_map: str | None = None, preview_dir: str | None = None) -> Job:
        settings = plan.resolved
        every = settings.get("preview_every", 0) if preview_map and preview_dir else 0
        return cls(plan.request, plan.tier, settings["steps"], settings["compile"], settings["deterministic"],
                   settings["refiner_steps"], every, preview_map, preview_dir)


@dataclass(frozen=True)
class JobResult:
    """Rank 0's frames and audio, every rank's step records."""

    frames: Any
    audio: Any
    stage_ms: dict[str, float]
    negative_prompt_source: str
    step_records: list[dict]
    latents_sha256: str | None = None


# -- what a rank tells its parent ----------------------------------------------------------------
@dataclass(frozen=True)
class RankEvent:
    rank: int


@dataclass(frozen=True)
class RankReady(RankEvent):
    loaded_weights: int


@dataclass(frozen=True)
class StageStarted(RankEvent):
    """Rank 0 began a stage (encode, preview, refiner, decode_video, decode_audio); it waits for the parent's
    ack, then every rank votes on the cancel flag, as at a step boundary."""

    name: str


@dataclass(frozen=True)
class StepFinished(RankEvent):
    """The rank finished step ``index`` (0-based) of ``total`` in ``stage``; it waits at the boundary."""

    stage: str
    index: int
    total: int


@dataclass(frozen=True)
class StepPassed(RankEvent):
    """The rank passed the boundary after step ``index`` (nobody cancelled): the step watchdog's mark."""

    index: int


@dataclass(frozen=True)
class RankDone(RankEvent):
    step_records: list[dict]
    output: DriverOutput | None = None  # rank 0 only


@dataclass(frozen=True)
class RankCancelled(RankEvent):
    message: str
    where: str = "at a step boundary"  # Cancelled.where


@dataclass(frozen=True)
class RankFailed(RankEvent):
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
    if rank == 0 and job.preview_every > 0:
        timer.preview = LivePreview(job.preview_dir, job.preview_every, LinearPreviewMap.read(job.preview_map))
    with active(timer):
        out = driver.run(job.request, job.tier, job.steps, job.refiner_steps, on_stage=on_stage,
                         output_size=output_size(job.request, job.tier))
    return out, [record.as_dict() for record in timer.records]


# -- a pool's rank: one spawned process -----------------------------------------------------------
def _parse_fault(rank: int) -> tuple[int, str] | None:
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return None
    parts = spec.split(":")
    if int(parts[0]) != rank:
        return None
    return int(parts[1]), parts[2] if len(parts) > 2 else "exit"


def _watch_parent(parent_pid: int) -> None:
    """Exit if the parent goes away, so no rank outlives the engine."""

    while True:
        if os.getppid() != parent_pid:
            os._exit(3)
        time.sleep(1.0)


def _bars_with_a_thread_lock() -> None:
    """tqdm's bars (vLLM's weight loader draws one) share a multiprocessing lock, which in a
    spawned process is a named semaphore that only a clean exit unlinks. A rank killed by the
    watchdog, by ``close`` after its grace or at the parent's exit left it behind, and the
    parent's exit warned "N leaked semaphore objects". A rank's bars need only a thread lock."""

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def rank_main(rank: int, layout: tuple[int, int], port: int, backend: str, checkpoint: str, parent_pid: int,
              jobs, events, cancel_flag, acks) -> None:
    """One rank: set up upstream's groups and the components, then run jobs until told to stop."""

    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    _bars_with_a_thread_lock()
    try:
        sp, cfg = layout
        if backend == "nccl":
            torch.cuda.set_device(rank)
        upstream_patches.init_parallel(world_size=sp * cfg, rank=rank, port=port, ulysses_degree=sp,
                                       cfg_parallel_size=cfg, backend=backend)
        if backend == "gloo":
            upstream_patches.patch_gloo_uneven_gather()
        flag_device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        driver = load_driver(Path(checkpoint), device=flag_device)
        fault = _parse_fault(rank)
    except BaseException:
        events.put(RankFailed(rank, None, traceback.format_exc()))
        return
    events.put(RankReady(rank, driver.c.loaded_weights))

    while True:
        job = jobs.get()
        if job is None:
            break
        current_step = {"index": 0}

        def vote(stopped: Callable[[], Cancelled]) -> None:
            """Every rank together: stop if any has seen the cancel flag (MAX), so none waits on another."""
            flag = torch.tensor([1 if cancel_flag.is_set() else 0], dtype=torch.int32, device=flag_device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if int(flag.item()):
                raise stopped()

        def on_step(stage: str, index: int, total: int) -> None:
            events.put(StepFinished(rank, stage, index, total))
            current_step["index"] = index + 1
            if rank == 0:
                # Wait until the parent has handled this step's progress (which may cancel), so
                # a cancel raised by step i's event stops every rank at step i's boundary.
                acks.get()
            vote(lambda: stopped_at(stage, index, total))
            if fault is not None and index + 1 == fault[0]:
                _fail(fault[1], rank, index + 1)
            events.put(StepPassed(rank, index))

        def on_stage(name: str) -> None:
            # Every rank runs the same stages, so this is a boundary all of them reach: a cancel during
            # denoising's last step or a decode lands before the next stage, not after the run.
            if rank == 0:
                events.put(StageStarted(rank, name))
                acks.get()
            vote(lambda: Cancelled(f"stopped before {name}", where="at a stage boundary"))

        try:
            out, records = run_job(driver, job, rank=rank, world_size=sp * cfg, on_step=on_step, on_stage=on_stage)
            events.put(RankDone(rank, records, out if rank == 0 else None))
        except Cancelled as err:
            events.put(RankCancelled(rank, str(err), err.where))
        except BaseException:
            events.put(RankFailed(rank, current_step["index"], traceback.format_exc()))
            return
    upstream_patches.destroy_parallel()


def _fail(mode: str, rank: int, step: int) -> None:
    if mode == "hang":
        while True:
            time.sleep(60)
    if mode == "raise":
        raise RuntimeError(f"injected fault on rank {rank} at step {step} ({FAULT_ENV})")
    os._exit(17)

