"""A persistent pool of ranks for one layout of the embedded engine, world 1 included.

Each rank is a spawned process that initializes upstream's distributed environment and
MAGI-2 groups (``upstream_patches.init_parallel``), loads the tiny checkpoint (the
transformer's ``load_weights`` keeps this rank's MoE heads), and runs each job with
:func:`.rank.run_job` (in :func:`.rank.rank_main`). Upstream's own code spreads the work: the
sequence dispatcher and Ulysses all-to-alls, head-sharded MoE, CFG-parallel. World 1 is a pool
of one such process, so that a hung run never stops the studio's process and the same
watchdog reports it.

Every rank reports each finished step to the parent (the events of :mod:`.rank`); rank 0 also
reports stages and returns the frames and audio. Cancellation is a collective: at each step boundary, and at
each stage's start (encode, preview, refiner, decode_video, decode_audio), every rank all-reduces (MAX) whether it
has seen the shared cancel flag, so all stop at the same step or stage. A cancel while the pool starts stops its
ranks at once (see :class:`RankPool`).
A rank that exits, raises or goes silent (the step watchdog: no step boundary for
``rank_timeout_s``, see :func:`magi2studio.engines.base.step_timeout_s`) ends the run with an
:class:`EngineError` naming the rank and the step, and the pool is torn down (the next run
starts a fresh one). The silent rank is the one that got least far (the others wait on it in a
collective), or one the OS shows stopped. :meth:`RankPool.health` checks idle ranks before a run.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ...errors import Cancelled, EngineError
from ...vocabulary.layouts import Layout
from ...platform import current_platform
from .rank import (
    Job,
    JobResult,
    RankCancelled,
    RankDone,
    RankEvent,
    RankFailed,
    RankReady,
    StageStarted,
    StepFinished,
    StepPassed,
    rank_main,
)

STARTUP_TIMEOUT_S = 300.0  # the start limit: every rank loaded and ready


class RankPool:
    """The ranks of one layout, started once and reused for every run on that layout.

    ``cancel`` set while the ranks start (spawn, import, rendezvous, load: 10-20 s on a 2-core machine)
    kills them within the 0.2 s poll and raises Cancelled: a half-started pool is of no use to a layout
    the user walked away from, and letting it finish would hold the engine and the CPU the next job needs.
    """

    def __init__(self, layout: Layout, checkpoint: Path, *, rank_timeout_s: float,
                 cancel: threading.Event | None = None) -> None:
        import torch.multiprocessing as mp

        from .upstream_patches import free_port

        self.layout = layout
        self.rank_timeout_s = rank_timeout_s
        # World 1 stays on the CPU, where it ran inside the engine's process before it had a
        # process of its own: its hashes are those of every earlier one-process run.
        self.backend = current_platform.dist_backend if layout.world_size > 1 else "gloo"
        context = mp.get_context("spawn")
        self._events = context.Queue()
        self._cancel = context.Event()
        self._acks = context.Queue()  # parent -> rank 0: "step i's progress was handled"
        self._jobs = [context.Queue() for _ in range(layout.world_size)]
        port = free_port()
        self._procs = [
            context.Process(target=rank_main, name=f"magi2studio-rank{rank}", daemon=True,
                            args=(rank, (layout.sp, layout.cfg), port, self.backend, str(checkpoint), os.getpid(),
                                  self._jobs[rank], self._events, self._cancel, self._acks))
            for rank in range(layout.world_size)
        ]
        for proc in self._procs:
            proc.start()
        self.alive = True
        self.checkpoint = checkpoint
        self.loaded_weights: dict[int, int] = {}
        began = time.monotonic()

        def stop_if_cancelled() -> None:
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"the {layout.name} ranks were stopped {time.monotonic() - began:.1f} s into their "
                                "start", where="while the engine started")

        try:
            ready = self.loaded_weights
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while len(ready) < layout.world_size:
                event = self._next_event(deadline, "starting", {}, stop_if_cancelled)
                if event is None:
                    waiting = [rank for rank in range(layout.world_size) if rank not in ready]
                    raise EngineError(f"{_ranks(waiting)} of layout {layout.name} did not start within the "
                                      f"{STARTUP_TIMEOUT_S:g} s start limit; the ranks were killed")
                if isinstance(event, RankReady):
                    ready[event.rank] = event.loaded_weights
                elif isinstance(event, RankFailed):
                    raise EngineError(f"rank {event.rank} failed to start layout {layout.name}:\n{event.traceback}")
        except BaseException:
            self.close(grace_s=0.0)
            raise

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def health(self) -> str | None:
        """None if every idle rank is alive and runnable; else what is wrong (exited, or stopped)."""

        for rank, proc in enumerate(self._procs):
            if proc.exitcode is not None:
                return f"rank {rank} exited (code {proc.exitcode}) while idle"
            state = _process_state(proc.pid)
            if state in ("T", "t", "Z", "X"):
                return f"rank {rank} is {'stopped' if state in 'Tt' else 'gone'} (state {state}) while idle"
        return None

    def _next_event(self, deadline: float, phase: str, last_step: dict[int, tuple[int, int, str]],
                    poll: Callable[[], None]) -> RankEvent | None:
        """The next event from any rank, or None past ``deadline``; raise EngineError on a dead rank.

        ``poll`` runs every 0.2 s of waiting (a cancel check), so a cancel needs no event to be seen."""

        while True:
            try:
                return self._events.get(timeout=0.2)
            except queue.Empty:
                pass
            poll()
            for rank, proc in enumerate(self._procs):
                if proc.exitcode is not None:
                    raise EngineError(
                        f"rank {rank} of layout {self.layout.name} exited (code {proc.exitcode}) while {phase}"
                        + _at_step(rank, last_step))
            if time.monotonic() > deadline:
                return None

    def _stalled(self, marks: dict[int, tuple[int, int]], last_step: dict[int, tuple[int, int, str]]) -> EngineError:
        """The step watchdog's report: the rank that stalled, which the others wait on.

        A rank the OS shows stopped is the one. Else it is the rank that got least far: the
        fewest step boundaries passed, then the fewest steps finished (``marks``, counted over
        every stage), since a rank that finished a step waits at its boundary for the others.
        """

        ranks = range(len(self._procs))
        stopped = [rank for rank in ranks if _process_state(self._procs[rank].pid) in ("T", "t")]
        if stopped:
            stalled, why = stopped, ": stopped (state T)"
        else:
            least = min(marks.get(rank, (0, 0)) for rank in ranks)
            stalled, why = [rank for rank in ranks if marks.get(rank, (0, 0)) == least], ""
        waiting = [rank for rank in ranks if rank not in stalled]
        if waiting:
            why += f", {_ranks(waiting)} waiting on it" if len(stalled) == 1 else f", {_ranks(waiting)} waiting"
        return EngineError(
            f"{_ranks(stalled)} of layout {self.layout.name} made no progress for {self.rank_timeout_s:g} s while "
            f"running" + _at_step(stalled[0], last_step) + why + "; the ranks were killed and the next run starts "
            "fresh ones (the step watchdog, $MAGI2STUDIO_STEP_TIMEOUT_S)")

    def _blame_dead_rank(self, failed: int, last_step: dict[int, tuple[int, int, str]], wait_s: float = 2.0) -> None:
        """A collective error on one rank is often another rank's death: name the dead one."""

        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            for rank, proc in enumerate(self._procs):
                if rank != failed and proc.exitcode is not None:
                    raise EngineError(f"rank {rank} of layout {self.layout.name} exited (code {proc.exitcode}) "
                                      f"while running" + _at_step(rank, last_step) + f"; rank {failed} then failed")
            time.sleep(0.1)

    def info(self) -> dict:
        return {"checkpoint": str(self.checkpoint),
                "loaded_weights": {f"rank{rank}": count for rank, count in sorted(self.loaded_weights.items())}}

    def run_info(self) -> dict:
        """What a run records beyond :meth:`info`: how many ranks, over which backend."""

        return {"ranks": self.layout.world_size, "backend": self.backend}

    def run(self, job: Job, on_event: Callable[[StageStarted | StepFinished], None],
            cancel: threading.Event | None) -> JobResult:
        """Run one job on every rank; raise Cancelled, or EngineError naming the failed rank and step."""

        if not self.alive:
            raise EngineError(f"the {self.layout.name} pool was stopped; start the engine again")
        self._cancel.clear()

        def forward_cancel() -> None:
            if cancel is not None and cancel.is_set():
                self._cancel.set()

        for jobs in self._jobs:
            jobs.put(job)
        done: dict[int, RankDone] = {}
        cancelled: dict[int, RankCancelled] = {}
        last_step: dict[int, tuple[int, int, str]] = {}
        marks: dict[int, tuple[int, int]] = {}  # per rank: step boundaries passed, steps finished
        try:
            deadline = time.monotonic() + self.rank_timeout_s
            while len(done) + len(cancelled) < len(self._procs):
                forward_cancel()
                event = self._next_event(deadline, "running", last_step, forward_cancel)
                if event is None:
                    raise self._stalled(marks, last_step)
                deadline = time.monotonic() + self.rank_timeout_s
                passed, finished = marks.get(event.rank, (0, 0))
                if isinstance(event, StepFinished):
                    marks[event.rank] = (passed, finished + 1)
                    last_step[event.rank] = (event.index, event.total, event.stage)
                    if event.rank == 0:
                        on_event(event)
                        forward_cancel()
                        self._acks.put(event.index)
                elif isinstance(event, StepPassed):
                    marks[event.rank] = (passed + 1, finished)
                elif isinstance(event, StageStarted):  # rank 0 waits for this ack, as for a step's
                    on_event(event)
                    forward_cancel()
                    self._acks.put(event.name)
                elif isinstance(event, RankDone):
                    done[event.rank] = event
                elif isinstance(event, RankCancelled):
                    cancelled[event.rank] = event
                elif isinstance(event, RankFailed):
                    self._blame_dead_rank(event.rank, last_step)
                    raise EngineError(f"rank {event.rank} of layout {self.layout.name} failed"
                                      + _at_step(event.rank, last_step) + f":\n{event.traceback}")
        except BaseException:
            self.close(grace_s=0.0)  # the ranks are dead, stuck or in a broken collective
            raise
        if cancelled:
            if done:  # some ranks finished while others stopped: the collective broke
                self.close(grace_s=0.0)
                raise EngineError(f"ranks {sorted(cancelled)} stopped but {sorted(done)} finished; "
                                  "the pool was stopped")
            first = cancelled[min(cancelled)]
            raise Cancelled(first.message, where=first.where)
        records = [record for rank in sorted(done) for record in done[rank].step_records]
        out = done[0].output
        return JobResult(out.frames, out.audio, out.stage_ms, out.negative_prompt_source, records,
                         out.latents_sha256)

    def close(self, grace_s: float = 5.0) -> None:
        """Stop every rank: ask, then terminate, then kill; leave no process behind."""

        if not self._procs:
            return
        self.alive = False
        for proc, jobs in zip(self._procs, self._jobs):
            if proc.exitcode is None:
                try:
                    jobs.put(None)
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + grace_s
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.exitcode is None and _process_state(proc.pid) not in ("T", "t"):  # stopped: only SIGKILL acts
                proc.terminate()
                proc.join(2.0)
            if proc.exitcode is None:
                proc.kill()
                proc.join(2.0)
        for handle in (self._events, self._acks, *self._jobs):
            handle.cancel_join_thread()
            handle.close()
        self._procs = []


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _process_state(pid: int) -> str | None:
    """The OS's one-letter state of a process (R, S, D, T, Z, ...), or None where /proc has none."""

    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as file:
            return file.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _at_step(rank: int, last_step: dict[int, tuple[int, int, str]]) -> str:
    """Where a failed rank was: its last finished step and that step's stage (preview or refiner)."""

    if rank not in last_step:
        return " before finishing any preview step"
    index, total, stage = last_step[rank]
    return f" after finishing {index + 1} of {total} {stage} steps (in step {index + 2})"
