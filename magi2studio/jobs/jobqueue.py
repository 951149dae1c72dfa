"""The job queue file: what is pending for one outputs root, shared by the studio and ``magi2studio queue``.

``<outputs>/queue.json`` lists jobs (request, layout, state, the run folder once done). It is
the record of what waits and runs; the run folders stay the record of results. Every change
is a read-modify-write under ``.queue.lock`` (``flock``), written whole (temp + rename), so
the studio, ``queue add`` and ``queue cancel`` in other processes never lose each other's
changes. ``paused`` in the same file stops the runner from starting a waiting job (the running
one finishes), so a pause survives a restart; the waiting jobs' order in the file is the order
they run in (``move``). One process at a time runs jobs (the studio, or ``queue run``): it holds
``.queue-runner.lock`` for its lifetime; a job it finds ``running`` when it starts was
running when the previous runner died, and is marked ``interrupted``.

Over 300 lines on purpose: every change to the file (add, a batch, cancel, pause, move, edit,
the runner's claims) is a method of :class:`JobQueue` under its one lock (``_changing``).
"""

from __future__ import annotations

import fcntl
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..run_folder.atomic import write_atomic
from ..errors import InputError

QUEUE_FILE = "queue.json"
LOCK_FILE = ".queue.lock"
RUNNER_LOCK_FILE = ".queue-runner.lock"
QUEUE_VERSION = 1
DEFAULT_MAX_WAITING = 32
KEEP_FINISHED = 50  # finished jobs kept in the file for the job list; their run folders stay regardless
MAX_QUEUE_BYTES = 16 * 1024 * 1024

PENDING = ("waiting", "running")
FINISHED = ("done", "cancelled", "failed", "refused", "interrupted")
STATES = PENDING + FINISHED


@dataclass(frozen=True)
class JobRecord:
    """One job as the queue file holds it; ``request`` is the request's JSON form, ``layout`` its name."""

    id: str
    ticket: int
    state: str
    request: dict[str, Any]
    layout: str
    owner: str
    source: str  # studio, api or cli: who added it
    submitted: float
    started: float | None = None
    finished: float | None = None
    run: str | None = None  # the run folder's name once done
    message: str = ""
    cancel_requested: bool = False
    batch: str | None = None  # the batch id its runs share (jobs.batches), None for a single run
    label: str = ""  # within a batch: what sets this run apart ("seed 43", "steps 8 · sp2-cfg1")
    seed_drawn: bool = False  # seed -1 was asked: the run records seed_asked -1 (plan_record)
    # The embedded weights it was queued for (``queue add --weights``, else the enqueuing side's engine's):
    # trained, random or a folder, and that tree's sha256; a runner on other weights fails it
    # (runner.check_weights). None: another engine, or a record from before jobs kept their weights.
    weights: str | None = None
    weights_sha256: str | None = None

    @property
    def pending(self) -> bool:
        return self.state in PENDING

    def summary(self) -> str:
        """mode tier seed layout, and the prompt's start: how a person recognises the job."""
        request = self.request
        prompt = " ".join(str(request.get("prompt", "")).split())
        prompt = prompt if len(prompt) <= 60 else prompt[:59] + "…"
        return (f"{str(request.get('mode', '')).upper()} {request.get('tier')} seed {request.get('seed')} "
                f"{self.layout}: {prompt}")

    def weights_text(self) -> str:
        """The weights it was queued for, as ``queue list`` shows them: trained, random, or a folder and the start
        of its tree sha256; "not recorded" for a record from before jobs kept them (or of another engine)."""
        if self.weights is None:
            return "not recorded"
        folder = self.weights_sha256 and self.weights not in ("trained", "random")
        return f"{self.weights} ({self.weights_sha256[:12]})" if folder else self.weights


_FIELD_TYPES = {f.name: f.type for f in fields(JobRecord)}


def _record_from(data: Any, where: Path) -> JobRecord:
    def bad(problem: str) -> InputError:
        return InputError("queue", f"{where} {problem}", f"move {where.name} away (the run folders are kept) "
                          "and add the jobs again")

    if not isinstance(data, dict) or set(data) - set(_FIELD_TYPES):
        raise bad("holds a job that is not a magi2studio job record")
    required = ("id", "ticket", "state", "request", "layout", "owner", "source", "submitted")
    if any(key not in data for key in required):
        raise bad("holds a job with fields missing")
    if (not isinstance(data["id"], str) or not isinstance(data["ticket"], int) or data["state"] not in STATES
            or not isinstance(data["request"], dict) or not isinstance(data["layout"], str)
            or not all(isinstance(data.get(key), (str, type(None))) for key in ("weights", "weights_sha256"))):
        raise bad("holds a job whose fields have the wrong types")
    return JobRecord(**data)


@dataclass
class QueueState:
    """The whole file: the bound the runner set, the next ticket, whether the runner is paused, the jobs
    (waiting ones in the order they run)."""

    max_waiting: int = DEFAULT_MAX_WAITING
    next_ticket: int = 1
    jobs: list[JobRecord] = field(default_factory=list)
    paused: bool = False

    def waiting(self) -> list[JobRecord]:
        return [job for job in self.jobs if job.state == "waiting"]

    def running(self) -> JobRecord | None:
        return next((job for job in self.jobs if job.state == "running"), None)

    def position(self, job_id: str) -> int:
        """1 for the next job to run, 2 after it, ...; 0 when the job is not waiting."""
        for index, job in enumerate(self.waiting()):
            if job.id == job_id:
                return index + 1
        return 0

    def find(self, job_id: str) -> JobRecord:
        """The job with this id, or with this unique id prefix (at least 4 characters, as ``queue list`` shows)."""
        text = job_id.strip().lower() if isinstance(job_id, str) else ""
        matches = [job for job in self.jobs if job.id == text] or (
            [job for job in self.jobs if job.id.startswith(text)] if len(text) >= 4 else [])
        if len(matches) != 1:
            problem = "matches several jobs" if matches else "is not a job in the queue"
            raise InputError("job", f"{str(job_id)[:40]!r} {problem}",
                             "use an id (or its first 8 characters) from magi2studio queue list")
        return matches[0]

    def to_json(self) -> str:
        return json.dumps({"version": QUEUE_VERSION, "max_waiting": self.max_waiting, "next_ticket": self.next_ticket,
                           "paused": self.paused, "jobs": [asdict(job) for job in self.jobs]}, indent=1)


class JobQueue:
    """The queue file of one outputs root; every method is one locked read-modify-write (or a plain read)."""

    def __init__(self, outputs_root: Path) -> None:
        self.root = Path(outputs_root)
        self.path = self.root / QUEUE_FILE
        self._thread_lock = threading.Lock()  # flock serialises processes; this, the studio's threads

    # -- reading ----------------------------------------------------------------------------
    def read(self) -> QueueState:
        """The file's state (empty when there is no file yet); a damaged file is refused, never overwritten."""
        try:
            info = self.path.stat()
        except FileNotFoundError:
            return QueueState()
        if info.st_size > MAX_QUEUE_BYTES:
            raise InputError("queue", f"{self.path} is {info.st_size} bytes",
                             f"move {self.path.name} away (the run folders are kept)")
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise InputError("queue", f"{self.path} is not valid JSON ({type(err).__name__})",
                             f"move {self.path.name} away (the run folders are kept) and add the jobs again") from None
        if not isinstance(data, dict) or data.get("version") != QUEUE_VERSION or not isinstance(data.get("jobs"), list):
            raise InputError("queue", f"{self.path} is not a queue file of version {QUEUE_VERSION}",
                             f"move {self.path.name} away (the run folders are kept) and add the jobs again")
        max_waiting, next_ticket = data.get("max_waiting"), data.get("next_ticket")
        paused = data.get("paused", False)
        if not isinstance(max_waiting, int) or max_waiting < 1 or not isinstance(next_ticket, int) \
                or not isinstance(paused, bool):
            raise InputError("queue", f"{self.path} has no valid max_waiting / next_ticket / paused",
                             f"move {self.path.name} away (the run folders are kept)")
        return QueueState(max_waiting, next_ticket, [_record_from(job, self.path) for job in data["jobs"]], paused)

    def signature(self) -> tuple[int, int] | None:
        """Changes whenever the file is replaced: a runner re-reads it when this differs."""
        try:
            info = self.path.stat()
        except FileNotFoundError:
            return None
        return info.st_mtime_ns, info.st_ino

    # -- changing ---------------------------------------------------------------------------
    @contextmanager
    def _changing(self, *, creates: bool = False) -> Iterator[QueueState]:
        """The state under both locks; written back whole when the block ends without an error.
        Only a change that ``creates`` (adding a job, a runner's bound) makes the folder: with no
        queue file yet, the others meet an empty state, whose ``find`` refuses before anything is written."""
        if not creates and not self.path.exists():
            yield QueueState()
            return
        with self._thread_lock:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.root / LOCK_FILE, "a", encoding="utf-8") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                state = self.read()
                yield state
                _trim_finished(state)
                write_atomic(self.path, state.to_json())

    def add(self, request: dict[str, Any], layout: str, *, owner: str, source: str,
            seed_drawn: bool = False, weights: tuple[str | None, str | None] = (None, None)) -> JobRecord:
        """Append a waiting job, or refuse when ``max_waiting`` jobs already wait (nothing written then)."""
        return self.add_batch([(request, layout, "", seed_drawn)], owner=owner, source=source, weights=weights)[0]

    def add_batch(self, runs: list[tuple[dict[str, Any], str, str, bool]], *, owner: str, source: str,
                  weights: tuple[str | None, str | None] = (None, None)) -> list[JobRecord]:
        """Append (request, layout, label, seed_drawn) runs as waiting jobs sharing one batch id (none for one run),
        all of them or, past ``max_waiting``, none (one refusal, nothing written). ``weights``: the embedded
        weights (name, tree sha256) they are queued for (``runner.engine_weights`` of the enqueuing engine)."""
        with self._changing(creates=True) as state:
            waiting = len(state.waiting())
            if waiting + len(runs) > state.max_waiting:
                raise queue_full(waiting, state.max_waiting, adding=len(runs))
            batch = uuid.uuid4().hex[:12] if len(runs) > 1 else None
            now, jobs = time.time(), []
            for request, layout, label, seed_drawn in runs:
                jobs.append(JobRecord(id=uuid.uuid4().hex, ticket=state.next_ticket, state="waiting", request=request,
                                      layout=layout, owner=owner, source=source, submitted=now, batch=batch,
                                      label=label, seed_drawn=seed_drawn, weights=weights[0],
                                      weights_sha256=weights[1]))
                state.next_ticket += 1
            state.jobs.extend(jobs)
        return jobs

    def set_paused(self, paused: bool) -> QueueState:
        """Pause (no waiting job starts; the running one finishes) or resume the runner; kept in the file."""
        with self._changing(creates=True) as state:
            state.paused = paused
        return state

    def move(self, job_id: str, places: int) -> int:
        """Move a waiting job ``places`` up (negative) or down among the waiting jobs; returns its new position."""
        with self._changing() as state:
            job = _waiting_job(state, job_id, "moved")
            waiting = state.waiting()
            target = min(max(waiting.index(job) + places, 0), len(waiting) - 1)
            order = [other for other in waiting if other.id != job.id]
            order.insert(target, job)
            slots = iter(order)  # the waiting jobs' places in the file stay; who sits in them changes
            state.jobs = [next(slots) if other.state == "waiting" else other for other in state.jobs]
        return target + 1

    def edit(self, job_id: str, request: dict[str, Any], layout: str, seed_drawn: bool = False) -> JobRecord:
        """Replace a waiting job's request and layout (the caller planned them); refused once it has started."""
        with self._changing() as state:
            updated = replace(_waiting_job(state, job_id, "edited"), request=request, layout=layout,
                              seed_drawn=seed_drawn)
            _put(state, updated)
        return updated

    def cancel(self, job_id: str) -> JobRecord:
        """A waiting job becomes cancelled; a running one is asked to stop (its runner stops it at a step)."""
        with self._changing() as state:
            job = state.find(job_id)
            if job.state == "waiting":
                updated = replace(job, state="cancelled", finished=time.time(),
                                  message="cancelled while waiting; nothing was run")
            elif job.state == "running":
                updated = replace(job, cancel_requested=True)
            else:
                raise InputError("job", f"{job.id[:8]} is {job.state}, not waiting or running",
                                 "only a waiting or running job can be cancelled; remove it instead")
            _put(state, updated)
        return updated

    def remove(self, job_id: str) -> JobRecord:
        """Take a finished job off the list (its run folder stays); a pending one must be cancelled first."""
        with self._changing() as state:
            job = state.find(job_id)
            if job.pending:
                raise InputError("job", f"{job.id[:8]} is {job.state}", "cancel it first, then remove it")
            state.jobs.remove(job)
        return job

    def update(self, job_id: str, **changes: Any) -> JobRecord:
        """The runner's changes to one job (claimed, finished, refused at load)."""
        with self._changing() as state:
            updated = replace(state.find(job_id), **changes)
            _put(state, updated)
        return updated

    def claim_next(self, accept: Callable[[JobRecord], bool] = lambda job: True) -> JobRecord | None:
        """Mark the first waiting job running and return it (None when nothing waits or the queue is paused)."""
        with self._changing() as state:
            if state.paused:
                return None
            job = next((job for job in state.waiting() if accept(job)), None)
            if job is None:
                return None
            claimed = replace(job, state="running", started=time.time())
            _put(state, claimed)
        return claimed

    def open_for_runner(self, max_waiting: int | None = None) -> list[JobRecord]:
        """At a runner's start: jobs left ``running`` become ``interrupted``; set the bound. Returns those jobs."""
        interrupted = []
        with self._changing(creates=True) as state:
            if max_waiting is not None:
                state.max_waiting = max_waiting
            for job in list(state.jobs):
                if job.state == "running":
                    marked = replace(job, state="interrupted", finished=time.time(),
                                     message="the studio or queue runner stopped while this ran; no run folder was "
                                             "kept. Fix: add it again (the request is in the job list)")
                    _put(state, marked)
                    interrupted.append(marked)
        return interrupted


def queue_full(waiting: int, limit: int, adding: int = 1) -> InputError:
    """The refusal of a job (or a batch) past the bound (the studio also says it at its door, before planning)."""
    if adding > 1:
        return InputError("queue", f"a batch of {adding} runs does not fit: {waiting} wait and the limit is {limit}",
                          f"queue at most {max(limit - waiting, 0)} runs now, or wait until some have run")
    return InputError("queue", f"{waiting} runs are already waiting (the limit is {limit})",
                      "wait until some have run, or cancel one (magi2studio queue cancel ID)")


def _waiting_job(state: QueueState, job_id: str, done: str) -> JobRecord:
    job = state.find(job_id)
    if job.state != "waiting":
        raise InputError("job", f"#{job.ticket} is {job.state}, not waiting", f"only a waiting job can be {done}")
    return job


def _put(state: QueueState, job: JobRecord) -> None:
    state.jobs = [job if old.id == job.id else old for old in state.jobs]


def _trim_finished(state: QueueState) -> None:
    finished = [job for job in state.jobs if not job.pending]
    drop = {job.id for job in finished[:max(0, len(finished) - KEEP_FINISHED)]}
    if drop:
        state.jobs = [job for job in state.jobs if job.id not in drop]
