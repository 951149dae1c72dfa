"""The one engine slot every browser session and API client shares, with a bounded FIFO queue.

A single worker thread owns the engine: jobs run one at a time in submission order, each
reporting through its own event queue (queued position, the engine's progress events, then
exactly one terminal event). Real engines run their workers in other processes, so progress
comes from the engine's per-step events, never from a console progress bar.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .. import runs
from ..engines.base import Engine, Plan, Progress
from ..errors import Cancelled, InputError, describe_os_error
from ..layouts import Layout
from ..request import Request

log = logging.getLogger(__name__)

TERMINAL = ("done", "refused", "cancelled", "failed")


@dataclass
class Job:
    """One submitted plan (checked at the door); ``ticket`` numbers jobs in submission order."""

    ticket: int
    owner: str
    plan: Plan
    submitted: float = field(default_factory=time.time)
    cancel: threading.Event = field(default_factory=threading.Event)
    events: queue.Queue = field(default_factory=queue.Queue)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)  # unguessable: cancel_job needs no session

    @property
    def request(self) -> Request:
        return self.plan.request

    @property
    def layout(self) -> Layout:
        return self.plan.layout


@dataclass(frozen=True)
class Update:
    """What a follower sees: ``queued`` (position), ``progress``, or a terminal kind.

    Terminal payloads: ``done`` a RunFolder, ``refused`` an InputError, ``cancelled`` a
    message, ``failed`` one readable line (the traceback goes to the log).
    """

    kind: str
    position: int = 0
    progress: Progress | None = None
    run: runs.RunFolder | None = None
    error: InputError | None = None
    message: str = ""


class EngineSlot:
    """Serialises generation on one engine; ``max_waiting`` bounds the queue."""

    def __init__(self, engine: Engine, outputs_root: Path, *, max_waiting: int = 32,
                 preload: Layout | None = None) -> None:
        self.engine = engine
        self.outputs_root = Path(outputs_root)
        self.max_waiting = max_waiting
        self.preload = preload
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._tickets = itertools.count(1)
        self._state = "loading" if preload is not None else "idle"
        self._closed = False
        self._thread = threading.Thread(target=self._serve, args=(preload,), name="engine-slot", daemon=True)
        self._thread.start()

    # -- what the page shows -------------------------------------------------------------
    @property
    def state(self) -> str:
        """idle (engine not started yet), loading, ready or busy."""
        return self._state

    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)

    def position(self, job: Job) -> int:
        """0 while running or finished, else 1 for the next job to run, 2 after it, ..."""
        with self._cond:
            for index, queued in enumerate(self._waiting):
                if queued is job:
                    return index + 1
            return 0

    def status_line(self) -> str:
        layout = self.engine.layout
        with self._cond:
            waiting = len(self._waiting)
        where = f"layout {layout.name}" if layout is not None else "not started (starts on the first run)"
        return f"{self._state} · {where} · {waiting} waiting"

    # -- submitting and following ----------------------------------------------------------
    def submit(self, plan: Plan, owner: str) -> Job:
        """Queue a plan (``engine.plan`` checked it), or refuse when the queue is full."""
        with self._cond:
            if self._closed:
                raise InputError("queue", "the studio is shutting down", "try again after it restarts")
            if len(self._waiting) >= self.max_waiting:
                raise InputError(
                    "queue", f"{len(self._waiting)} runs are already waiting (the limit)",
                    "try again when the queue is shorter",
                )
            job = Job(next(self._tickets), owner, plan)
            self._waiting.append(job)
            self._cond.notify_all()
        return job

    def cancel(self, owner: str) -> bool:
        """Cancel the owner's running or waiting jobs; the run stops at its next step boundary."""
        found = False
        with self._cond:
            for job in [*self._waiting, *([self._running] if self._running else [])]:
                if job.owner == owner:
                    job.cancel.set()
                    found = True
        return found

    def cancel_job(self, job_id: str) -> bool:
        """Cancel one running or waiting job by its id; the run stops at its next step boundary."""
        with self._cond:
            for job in [*self._waiting, *([self._running] if self._running else [])]:
                if job.id == job_id:
                    job.cancel.set()
                    return True
        return False

    def follow(self, job: Job, poll_s: float = 0.25) -> Iterator[Update]:
        """Yield the job's position while it waits, its progress, then its terminal update."""
        last_position = None
        while True:
            try:
                update = job.events.get(timeout=poll_s)
            except queue.Empty:
                position = self.position(job)
                if position and position != last_position:
                    last_position = position
                    yield Update("queued", position=position)
                continue
            yield update
            if update.kind in TERMINAL:
                return

    def close(self) -> None:
        """Refuse new jobs, cancel the waiting and the running one (its temp folder is removed), wait."""
        with self._cond:
            self._closed = True
            for job in [*self._waiting, *([self._running] if self._running else [])]:
                job.cancel.set()
            self._cond.notify_all()
        self._thread.join(timeout=30)

    # -- the worker ----------------------------------------------------------------------
    def _serve(self, preload: Layout | None) -> None:
        if preload is not None:
            try:
                self.engine.start(preload)
            except Exception:  # the first run reports the failure to its user
                log.exception("preloading the engine for %s failed", preload.name)
            self._state = "ready" if self.engine.layout is not None else "idle"
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed and not self._waiting:
                    return
                job = self._waiting.popleft()
                self._running = job
            try:
                self._run(job)
            finally:
                with self._cond:
                    self._running = None
                self._state = "ready" if self.engine.layout is not None else "idle"

    def _run(self, job: Job) -> None:
        put = job.events.put
        if job.cancel.is_set():
            put(Update("cancelled", message="cancelled while waiting; nothing was run"))
            return
        try:
            if self.engine.layout != job.layout:
                self._state = "loading"
                put(Update("progress", progress=Progress(
                    "load", message=f"restarting the engine for layout {job.layout.name}")))
                self.engine.start(job.layout)
            self._state = "busy"
            run = runs.execute_plan(
                self.engine, job.plan, self.outputs_root,
                on_progress=lambda event: put(Update("progress", progress=event)),
                cancel=job.cancel,
                extra={"studio": {"ticket": job.ticket, "queued_s": round(time.time() - job.submitted, 3)}},
            )
        except InputError as err:
            put(Update("refused", error=err, message=str(err)))
        except Cancelled as err:
            put(Update("cancelled", message=f"cancelled at a step boundary; no run folder was kept ({err})"))
        except OSError as err:  # the disk or the OS refused a write: the CLI's words, not a traceback
            log.warning("run %d could not be written: %s", job.ticket, err)
            put(Update("failed", message=describe_os_error(err)))
        except Exception as err:
            log.exception("run %d (%s) failed", job.ticket, job.request.mode)
            put(Update("failed", message=failure_line(err)))
        else:
            put(Update("done", run=run))


def failure_line(err: BaseException) -> str:
    """One readable line for an engine failure; the traceback stays in the log."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"the engine failed: {type(err).__name__}{': ' + first if first else ''} (details in the studio log)"


def describe_progress(event: Progress, seen: dict[str, tuple[float, int]],
                      now: float | None = None) -> tuple[str, float | None]:
    """One line for a progress event (stage, step i/N, ETA) and the fraction done, if known.

    ``seen`` keeps, per stage, when and at which step the follower first saw it; the ETA is
    the rate since then, so it needs two step events of a stage.
    """
    now = time.monotonic() if now is None else now
    if event.step is None or not event.total:
        return (f"{event.stage}: {event.message}" if event.message else event.stage), None
    done = event.step + 1
    first_time, first_done = seen.setdefault(event.stage, (now, done))
    line = f"{event.stage}: step {done}/{event.total}"
    if done > first_done:
        eta = (now - first_time) / (done - first_done) * (event.total - done)
        line += f" · ETA {eta:.0f} s"
    return line, done / event.total
