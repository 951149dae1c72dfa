"""The one runner of an outputs root's queue (the studio, or ``magi2studio queue run``): its lock, and one job run.

:class:`RunnerLock` is held for the runner's lifetime; :func:`execute_job` runs one claimed job's plan into a
run folder and tells how it ended; :func:`plan_record` plans a stored job again.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from .jobqueue import RUNNER_LOCK_FILE, JobRecord

PROGRESS_FILE = ".queue-progress.json"  # the running job's last stage and step, for ``magi2studio queue watch``
PROGRESS_EVERY_S = 0.5

class RunnerLock:
    """Held by the one process that runs the queue's jobs; the OS lets go of it if that process dies
    (the file stays then, unlocked, and the next runner takes it). A clean release removes the file."""

    def __init__(self, outputs_root: Path) -> None:
        root = Path(outputs_root)
        root.mkdir(parents=True, exist_ok=True)
        self._path = root / RUNNER_LOCK_FILE
        while True:
            self._file = open(self._path, "a+", encoding="utf-8")
            try:
                fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._file.seek(0)
                holder = self._file.read().strip() or "another process"
                self._file.close()
                raise InputError("out", f"{root} is already served by {holder}",
                                 "stop that studio or queue runner, or give this one another --out folder "
                                 "(magi2studio queue add still works beside it)") from None
            if self._is_the_file_at_path():
                break
            self._file.close()  # a runner that released meanwhile removed this file: lock the one there now
        self._file.truncate(0)
        self._file.write(f"pid {os.getpid()}\n")
        self._file.flush()

    def _is_the_file_at_path(self) -> bool:
        try:
            return os.stat(self._path).st_ino == os.fstat(self._file.fileno()).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        if not self._file.closed:
            if self._is_the_file_at_path():
                self._path.unlink()  # still locked: no other runner can hold this file now
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()


def runner_alive(outputs_root: Path) -> bool:
    """Whether a process holds the root's :class:`RunnerLock` now (a ``running`` job is only running then)."""
    path = Path(outputs_root) / RUNNER_LOCK_FILE
    if not path.is_file():
        return False
    with open(path, encoding="utf-8") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(file, fcntl.LOCK_UN)
        return False


@dataclass(frozen=True)
class Outcome:
    """How one job ended: ``state`` is done, refused, cancelled or failed; ``run`` the folder when done."""

    state: str
    run: Any = None  # runs.RunFolder
    error: InputError | None = None
    message: str = ""
    where: str = ""  # cancelled: where it landed (Cancelled.where), e.g. "while the engine started"


def execute_job(engine, plan, outputs_root: Path, record: JobRecord, *, on_progress=None,
                cancel: threading.Event | None = None) -> Outcome:
    """Start the engine for the plan's layout (timed: the ETA learns it), run the plan into a run folder.

    The manifest's ``studio`` block records the ticket, job id, seconds queued, the engine
    start and, for a batch's run, the batch id and its label; every failure becomes an Outcome
    with one readable line (tracebacks go to the log).
    """
    import logging

    from ..run_folder import runs
    from ..engines.base import Progress
    from ..errors import Cancelled, describe_os_error

    log = logging.getLogger(__name__)
    on_progress = _published(on_progress, Path(outputs_root), record)
    studio = {"ticket": record.ticket, "job": record.id, "queued_s": round(time.time() - record.submitted, 3)}
    if record.batch is not None:  # History and Results find a batch's runs (and what varies) by these
        studio.update(batch=record.batch, label=record.label)
    try:
        if engine.layout != plan.layout:
            if on_progress is not None:
                on_progress(Progress("load", message=f"starting the engine for layout {plan.layout.name}"))
            began = time.monotonic()
            engine.start(plan.layout, cancel=cancel)
            studio["engine_start_s"] = round(time.monotonic() - began, 3)
        run = runs.execute_plan(engine, plan, outputs_root, on_progress=on_progress, cancel=cancel,
                                extra={"studio": studio})
    except InputError as err:
        return Outcome("refused", error=err, message=str(err))
    except Cancelled as err:
        return Outcome("cancelled", message=f"cancelled {err.where}; no run folder was kept ({err})", where=err.where)
    except OSError as err:  # the disk or the OS refused a write: the CLI's words, not a traceback
        log.warning("job %d could not be written: %s", record.ticket, err)
        return Outcome("failed", message=describe_os_error(err))
    except Exception as err:
        log.exception("job %d (%s) failed", record.ticket, plan.request.mode)
        return Outcome("failed", message=failure_line(err))
    return Outcome("done", run=run, message=f"run folder {run.path.name}")


def _published(on_progress, outputs_root: Path, record: JobRecord):
    """``on_progress`` that also writes the event to the root's progress file (a stage at once, steps at most
    every ``PROGRESS_EVERY_S``), so a terminal elsewhere can watch; a failed write never stops the run."""
    import json

    from ..run_folder.atomic import write_atomic

    last = [0.0]

    def publish(event) -> None:
        now = time.monotonic()
        if event.step is None or event.step + 1 == event.total or now - last[0] >= PROGRESS_EVERY_S:
            last[0] = now
            try:
                write_atomic(outputs_root / PROGRESS_FILE, json.dumps({
                    "job": record.id, "ticket": record.ticket, "stage": event.stage, "step": event.step,
                    "total": event.total, "message": event.message, "written": time.time()}))
            except OSError:
                pass
        if on_progress is not None:
            on_progress(event)

    return publish


def read_progress(outputs_root: Path) -> dict[str, Any] | None:
    """The last progress the runner published, or None (none yet, or a partial or foreign file)."""
    import json

    try:
        data = json.loads((Path(outputs_root) / PROGRESS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("job"), str) else None


def failure_line(err: BaseException) -> str:
    """One readable line for an engine failure; the traceback stays in the log."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"the engine failed: {type(err).__name__}{': ' + first if first else ''} (details in the log)"


def plan_record(engine, record: JobRecord):
    """The record's request and layout checked again by ``engine.plan`` (a queue file may be old); raises InputError."""
    from ..vocabulary.layouts import parse_layout
    from ..vocabulary.request import build_request

    plan = engine.plan(build_request(**record.request), parse_layout(record.layout))
    return plan.with_seed_drawn() if record.seed_drawn else plan
