"""The one engine slot every browser session, API client and ``magi2studio queue add`` shares.

The jobs live in the outputs root's queue file (:mod:`magi2studio.jobs.jobqueue`), so they survive
a page reload and a studio restart, and jobs added from the command line join the same queue.
A single worker thread owns the engine: jobs run one at a time in ticket order. A job
submitted here reports through its own event queue (queued position, progress, ticks for the
timer, then exactly one terminal event); a job added elsewhere runs the same way, unfollowed.
Real engines run their workers in other processes, so progress comes from the engine's
per-step and per-stage events, never from a console progress bar.

Over 300 lines on purpose: :class:`EngineSlot` is one object whose callers' side (submit,
follow, cancel) and worker side (claim, run, finish) share one condition; split, that lock
would cross modules. The queue file, the runner and the job clock live in :mod:`..jobs`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..run_folder import runs
from ..engines.base import Engine, Plan, Progress
from ..errors import InputError
from ..jobs.eta import RunHistory
from ..jobs.jobqueue import JobQueue, JobRecord, QueueState, queue_full
from ..jobs.runner import OtherWeights, RunnerLock, engine_weights, execute_job, failure_line, plan_record
from ..jobs.stage_clock import StageClock
from ..vocabulary.layouts import Layout
from ..vocabulary.request import RANDOM_SEED, Request
from . import live_preview

log = logging.getLogger(__name__)

TERMINAL = ("done", "refused", "cancelled", "failed")
SYNC_S = 0.5  # how often the worker looks for changes other processes made to the queue file
TICK_S = 0.5  # how often a follower of a running job is sent a tick (the page's timer)
# How often a follower of a waiting job is sent its place again, also when it did not change: each
# update hands control back to Gradio, which then sees a client that has gone and closes the handler.
KEEPALIVE_S = 2.0
FOLLOWERS_GONE_S = 10.0  # at shutdown, how long the followers get to take their last update


@dataclass
class Job:
    """One plan submitted in this process (checked at the door); ``ticket`` numbers jobs in submission order."""

    ticket: int
    owner: str
    plan: Plan
    id: str  # unguessable: cancel_job needs no session
    submitted: float = field(default_factory=time.time)
    cancel: threading.Event = field(default_factory=threading.Event)
    events: queue.Queue = field(default_factory=queue.Queue)
    clock: StageClock | None = None  # set while it runs

    @property
    def request(self) -> Request:
        return self.plan.request

    @property
    def layout(self) -> Layout:
        return self.plan.layout


@dataclass(frozen=True)
class Update:
    """What a follower sees: ``queued`` (position), ``progress``, ``tick`` (time passed), or a terminal kind.

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
    """Serialises generation on one engine over the outputs root's queue file; ``max_waiting`` bounds it.

    Holds the root's runner lock: a second studio (or ``queue run``) on the same root is refused.
    """

    def __init__(self, engine: Engine, outputs_root: Path, *, max_waiting: int = 32,
                 preload: Layout | None = None) -> None:
        self.engine = engine
        self.outputs_root = Path(outputs_root)
        self.max_waiting = max_waiting
        self.preload = preload
        self.queue = JobQueue(self.outputs_root)
        self.history = RunHistory(self.outputs_root)
        self._runner = RunnerLock(self.outputs_root)
        try:
            self.interrupted = self.queue.open_for_runner(max_waiting)
            self._snapshot = self.queue.read()
        except BaseException:
            self._runner.release()
            raise
        self._signature = self.queue.signature()
        self._cond = threading.Condition()
        self._jobs: dict[str, Job] = {}  # submitted here and not finished
        self._running: Job | None = None
        self._state = "loading" if preload is not None else "idle"
        self._closed = False
        self._followers = 0  # handlers following a job now (see following())
        self.latest_preview: live_preview.LatestPreview | None = None  # the newest run's newest preview
        self._thread = threading.Thread(target=self._serve, args=(preload,), name="engine-slot", daemon=True)
        self._thread.start()
        self._watcher = threading.Thread(target=self._watch, name="engine-slot-queue-file", daemon=True)
        self._watcher.start()

    # -- what the page shows -------------------------------------------------------------
    @property
    def state(self) -> str:
        """idle (engine not started yet), loading, ready or busy."""
        return self._state

    @property
    def closed(self) -> bool:
        """True once ``close`` began: the slot takes no job (the studio's /health/ready says so)."""
        return self._closed

    @property
    def serving(self) -> bool:
        """True while the worker thread that runs every job lives (an error it did not expect ends it)."""
        return self._thread.is_alive()

    def snapshot(self) -> QueueState:
        """The queue as last read or written (the worker re-reads it when another process changes it)."""
        with self._cond:
            return self._snapshot

    def running_clock(self) -> tuple[str, StageClock] | None:
        """The running job's id and clock, for the job list's progress cell."""
        with self._cond:
            job = self._running
            return (job.id, job.clock) if job is not None and job.clock is not None else None

    def waiting(self) -> int:
        return len(self.snapshot().waiting())

    def position(self, job: Job) -> int:
        """0 while running or finished, else 1 for the next job to run, 2 after it, ..."""
        return self.snapshot().position(job.id)

    def status_line(self) -> str:
        layout = self.engine.layout
        waiting = self.waiting()
        if self._state == "loading":
            running = self._running
            target = running.layout if running is not None else self.preload
            where = "starting the engine" + (f" for layout {target.name}" if target is not None else "")
        else:
            where = f"layout {layout.name}" if layout is not None else "engine not started (starts on the first run)"
        paused = " · paused: no waiting job starts until resumed" if self.snapshot().paused else ""
        return f"{self._state} · {where} · {waiting} waiting{paused}"

    # -- submitting, following, cancelling ------------------------------------------------
    def check_room(self) -> None:
        """Refuse at once when the queue is full or the studio is closing: before any planning or file
        work, so a crowd of clients past the bound is answered fast. ``submit`` checks again under the lock."""
        with self._cond:
            if self._closed:
                raise InputError("queue", "the studio is shutting down", "try again after it restarts")
            state = self._snapshot
        waiting = len(state.waiting())
        if waiting >= state.max_waiting:
            raise queue_full(waiting, state.max_waiting)

    def submit(self, plan: Plan, owner: str, source: str = "studio") -> Job:
        """Queue a plan (``engine.plan`` checked it), or refuse when the queue is full or closing."""
        return self.submit_batch([(plan, "")], owner, source)[0]

    def submit_batch(self, plans: list[tuple[Plan, str]], owner: str, source: str = "studio") -> list[Job]:
        """Queue (plan, label) pairs as one batch: all of them, or none (queue full or closing); the jobs record
        the engine's weights (a runner on other ones fails them: ``runner.check_weights``)."""
        with self._cond:
            if self._closed:
                raise InputError("queue", "the studio is shutting down", "try again after it restarts")
        records = self.queue.add_batch([(plan.request.model_dump(mode="json"), plan.layout.name, label,
                                         plan.resolved.get("seed_asked") == RANDOM_SEED) for plan, label in plans],
                                       owner=owner, source=source, weights=engine_weights(self.engine))
        jobs = [Job(record.ticket, owner, plan, record.id, submitted=record.submitted)
                for record, (plan, _) in zip(records, plans)]
        with self._cond:
            self._jobs.update((job.id, job) for job in jobs)
            self._refresh()
            self._cond.notify_all()
        return jobs

    def steer(self, change: str, *args) -> object:
        """A queue-file change that steers the runner (``set_paused``, ``move``, ``edit``), seen at once here."""
        result = getattr(self.queue, change)(*args)
        with self._cond:
            self._refresh()
            self._cond.notify_all()
        return result

    def replan(self, job_id: str, plan: Plan) -> None:
        """A waiting job's plan after an edit: the file's record changed, so this process's plan must too."""
        with self._cond:
            job = self._jobs.get(job_id)
            if job is not None:
                job.plan = plan

    def cancel(self, owner: str) -> bool:
        """Cancel the owner's running or waiting jobs; the run stops at its next step or stage boundary."""
        ids = [record.id for record in self.snapshot().jobs if record.pending and record.owner == owner]
        return any([self.cancel_job(job_id) for job_id in ids])

    def cancel_job(self, job_id: str) -> bool:
        """Cancel one running or waiting job by its id; the run stops at its next step or stage boundary."""
        try:
            self.queue.cancel(job_id)
        except InputError:
            return False
        with self._cond:
            self._refresh()
            self._reconcile()
        return True

    def remove_job(self, job_id: str) -> JobRecord:
        """Take a finished job off the list (its run folder stays); raises InputError for a pending one."""
        record = self.queue.remove(job_id)
        with self._cond:
            self._refresh()
        return record

    def client_gone(self, job: Job) -> None:
        """The API client following ``job`` disconnected: nobody will take its result, so the job is
        cancelled (a waiting one never runs, a running one stops at its next step or stage boundary). Not
        while the studio shuts down: then the job is marked as the shutdown says."""
        if self._closed:
            return
        if self.cancel_job(job.id):
            log.info("job %d: its API client disconnected; cancelled", job.ticket)

    @contextmanager
    def following(self) -> Iterator[None]:
        """Around a handler's ``follow`` loop: shutdown waits until every follower has taken its last update."""
        with self._cond:
            self._followers += 1
        try:
            yield
        finally:
            with self._cond:
                self._followers -= 1
                self._cond.notify_all()

    def follow(self, job: Job, poll_s: float = 0.25) -> Iterator[Update]:
        """Yield the job's position while it waits (again every ``KEEPALIVE_S``), its progress and ticks
        while it runs, then its terminal update."""
        last_position, last_yield = None, time.monotonic()
        while True:
            try:
                update = job.events.get(timeout=poll_s)
            except queue.Empty:
                now = time.monotonic()
                position = self.position(job)
                if position and (position != last_position or now - last_yield >= KEEPALIVE_S):
                    last_position, last_yield = position, now
                    yield Update("queued", position=position)
                elif job.clock is not None and now - last_yield >= TICK_S:
                    last_yield = now
                    yield Update("tick")
                continue
            last_yield = time.monotonic()
            yield update
            if update.kind in TERMINAL:
                return

    def close(self) -> None:
        """Refuse new jobs, stop the running one at a step boundary (marked interrupted, its temp folder
        removed), tell every follower, and wait until they have taken that last update; waiting jobs stay queued."""
        with self._cond:
            self._closed = True
            if self._running is not None:
                self._running.cancel.set()
            for job in self._jobs.values():
                if job is not self._running:
                    job.events.put(Update("cancelled", message=f"studio: shutting down; job #{job.ticket} stays in "
                                                               "the queue and runs when the studio starts again"))
            self._cond.notify_all()
        self._thread.join(timeout=30)
        self._watcher.join(timeout=5)
        with self._cond:
            self._cond.wait_for(lambda: self._followers == 0, timeout=FOLLOWERS_GONE_S)
        self._runner.release()

    # -- the worker ----------------------------------------------------------------------
    def _refresh(self) -> None:
        """Re-read the file (caller holds ``_cond``)."""
        self._snapshot = self.queue.read()
        self._signature = self.queue.signature()

    def _refresh_or_log(self) -> None:
        """Re-read the file where the worker goes on either way: a damaged or unreadable file keeps the last
        view and is named in the log; the watcher reads it again once it changes or can be read (holds ``_cond``)."""
        try:
            self._refresh()
        except (InputError, OSError) as err:
            log.warning("queue: the queue file could not be read back (%s)", err)

    def _reconcile(self) -> None:
        """Tell followers of jobs cancelled elsewhere; pass a stop request to the running job (holds ``_cond``)."""
        for record in self._snapshot.jobs:
            job = self._jobs.get(record.id)
            if job is None:
                continue
            if record.state == "running" and record.cancel_requested:
                job.cancel.set()
            elif not record.pending and job is not self._running:
                self._jobs.pop(record.id)
                job.events.put(Update("cancelled", message=record.message or f"the job was {record.state}"))

    def _watch(self) -> None:
        """Re-read the file when another process changed it (a job added, a cancel asked), also while a job runs.
        A file that cannot be read for a while (a lost mount, its permissions) is read again at the next look."""
        unreadable = False
        with self._cond:
            while not self._closed:
                try:
                    if self.queue.signature() != self._signature:
                        try:
                            self._refresh()
                        except InputError as err:  # a damaged file: keep the last good view, say why in the log
                            log.warning("%s", err)
                            self._signature = self.queue.signature()
                        self._reconcile()
                        self._cond.notify_all()
                    unreadable = False
                except OSError as err:  # the last good view stays; logged once a spell, not every look
                    if not unreadable:
                        log.warning("queue: cannot read the queue file (%s: %s); trying again every %.1f s",
                                    type(err).__name__, err, SYNC_S)
                    unreadable = True
                self._cond.wait(timeout=SYNC_S)

    def _next(self) -> tuple[JobRecord, Job | None] | None:
        """Wait for a waiting job and claim it; None once closed."""
        with self._cond:
            while not self._closed:
                if self._snapshot.waiting() and not self._snapshot.paused:
                    try:
                        record = self.queue.claim_next()
                    except InputError as err:  # a damaged file: nothing runs until it is moved away
                        log.warning("%s", err)
                        record = None
                    except OSError as err:  # a full disk, a lost mount: the file is unchanged (written atomically)
                        log.warning("queue: could not claim the next job (%s: %s); trying again in %.1f s",
                                    type(err).__name__, err, SYNC_S)
                        record = None
                    if record is not None:  # claimed (running in the file): it runs even if the re-read fails
                        self._refresh_or_log()
                        return record, self._jobs.get(record.id)
                self._cond.wait(timeout=SYNC_S)
            return None

    def _serve(self, preload: Layout | None) -> None:
        if preload is not None:
            try:
                self.engine.start(preload)
            except Exception:  # the first run reports the failure to its user
                log.exception("preloading the engine for %s failed", preload.name)
            self._state = "ready" if self.engine.layout is not None else "idle"
        while True:
            claimed = self._next()
            if claimed is None:
                return
            record, job = claimed
            if job is None:  # added by another process, or before a restart: plan it now (its weights first)
                try:
                    plan = plan_record(self.engine, record)
                except OtherWeights as err:  # not the request's fault: it fails here, and may run elsewhere
                    self._finish(record, None, "failed", str(err))
                    continue
                except InputError as err:
                    self._finish(record, None, "refused", str(err))
                    continue
                except Exception as err:  # the engine, not the request: this job fails, the worker goes on
                    log.exception("job %d could not be planned", record.ticket)
                    self._finish(record, None, "failed", failure_line(err))
                    continue
                job = Job(record.ticket, record.owner, plan, record.id, submitted=record.submitted)
            with self._cond:
                self._running = job
                self._jobs[job.id] = job  # also a job from the file: a cancel asked elsewhere reaches it
            try:
                self._run(record, job)
            finally:
                with self._cond:
                    self._running = None
                    self._jobs.pop(job.id, None)
                self._state = "ready" if self.engine.layout is not None else "idle"

    def _run(self, record: JobRecord, job: Job) -> None:
        put = job.events.put
        if job.cancel.is_set() or record.cancel_requested:
            self._finish(record, job, "cancelled", "cancelled while waiting; nothing was run")
            return
        restarting = self.engine.layout != job.layout
        job.clock = StageClock(self.history.estimate(self.engine.name, job.plan, engine_starts=restarting))
        self._state = "loading" if restarting else "busy"

        def on_progress(event: Progress) -> None:
            if event.stage != "load":
                self._state = "busy"
            job.clock.on_event(event)
            self.latest_preview = live_preview.remember(record.id, event) or self.latest_preview
            put(Update("progress", progress=event))

        outcome = execute_job(self.engine, job.plan, self.outputs_root, record, on_progress=on_progress,
                              cancel=job.cancel)
        state, message = outcome.state, outcome.message
        if state == "cancelled" and self._closed:
            state = "interrupted"
            message = (f"studio: shutting down; job #{record.ticket} stopped {outcome.where} and is marked "
                       "interrupted, no run folder was kept. Fix: run it again once the studio is back")
        self._finish(record, job, state, message, outcome)

    def _finish(self, record: JobRecord, job: Job | None, state: str, message: str, outcome=None) -> None:
        run = outcome.run if outcome is not None else None
        try:
            self.queue.update(record.id, state=state, finished=time.time(), message=message,
                              run=run.path.name if run is not None else None)
        except (InputError, OSError) as err:  # the run folder is the record; the list just misses this line
            log.warning("job %d: the queue file could not be updated: %s", record.ticket, err)
        with self._cond:
            self._refresh_or_log()
        if job is not None:
            if state == "done":
                job.events.put(Update("done", run=run))
            elif state == "refused":
                job.events.put(Update("refused", error=outcome.error if outcome else None, message=message))
            elif state in ("cancelled", "interrupted"):
                job.events.put(Update("cancelled", message=message))
            else:
                job.events.put(Update("failed", message=message))
