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


def engine_weights(engine) -> tuple[str | None, str | None]:
    """The weights a job queued for ``engine`` records (``JobRecord.weights``, ``weights_sha256``): the embedded
    engine's choice and its tree sha256 (None for ``random``); (None, None) for an engine without a weights
    choice (vllm-omni runs whatever checkpoint is mounted)."""
    record = getattr(engine, "weights_record", None)
    return record() if callable(record) else (None, None)


class OtherWeights(InputError):
    """A job queued for other embedded weights than its runner's engine runs (:func:`check_weights`)."""


def _weights_text(name: str, digest: str | None) -> str:
    return name if digest is None or name == digest else f"{name} (tree sha256 {digest[:12]})"


def check_weights(engine, record: JobRecord) -> None:
    """Raise :class:`OtherWeights` when the job was queued for other weights than ``engine`` runs.

    Why refuse rather than run: a run is only worth keeping if its manifest proves what was asked
    for ran. ``queue add --weights random`` run by a studio on ``trained`` would give another
    video under the same request, and nothing but a careful reading of its manifest would tell;
    quietly switching the runner's engine instead would stall every other job behind a restart.
    So the job ends ``failed`` with one line naming it, both weights and the two fixes (run it
    where those weights run, or add it again). Weights are told apart by their tree sha256 where
    both sides have one (a folder holding the shipped tree is the shipped weights), else by name.
    A record from before jobs recorded weights (``weights`` None) runs as before, on the runner's
    weights; so does any job under an engine without a weights choice (vllm-omni).
    """
    runner_name, runner_digest = engine_weights(engine)
    if record.weights is None or runner_name is None:
        return
    if (record.weights_sha256 or record.weights) == (runner_digest or runner_name):
        return
    asked = _weights_text(record.weights, record.weights_sha256)
    raise OtherWeights(
        "weights", f"job #{record.ticket} ({record.id[:8]}) was queued for the embedded weights {asked}, but this "
        f"runner's engine runs {_weights_text(runner_name, runner_digest)}, which would give another result",
        f"run it with `magi2studio queue run --weights {record.weights}` (no studio serving this outputs folder), "
        f"or add it again to run it on {runner_name}")


def plan_record(engine, record: JobRecord):
    """The record's request and layout checked again by ``engine.plan`` (a queue file may be old), after its
    weights (:func:`check_weights`); raises InputError (:class:`OtherWeights` for the weights)."""
    from ..vocabulary.layouts import parse_layout
    from ..vocabulary.request import build_request

    check_weights(engine, record)
    plan = engine.plan(build_request(**record.request), parse_layout(record.layout))
    return plan.with_seed_drawn() if record.seed_drawn else plan
