"""``magi2studio queue watch``: the queue's progress in a terminal, live, until nothing waits or runs.

It only reads: the queue file, and the progress file the runner (studio or ``queue run``) writes
(:data:`..jobs.runner.PROGRESS_FILE`). On a terminal it redraws one line; piped, it prints a line per change.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..errors import InputError
from ..jobs.jobqueue import JobQueue
from ..jobs.runner import read_progress, runner_alive


def watch_queue(args: argparse.Namespace) -> int:
    """One line, redrawn, until no job waits or runs: the running job's stage and step, the waiting count.
    Ctrl+C ends it with one line (the jobs go on)."""
    if not args.interval > 0:
        raise InputError("interval", f"{args.interval} is not above 0", "give --interval 0.5 or more")
    root = Path(args.out)
    queue = JobQueue(root)
    interactive = sys.stdout.isatty()
    last, reported = "", {job.id for job in queue.read().jobs if not job.pending}
    try:
        while True:
            state = queue.read()
            for job in state.jobs:
                if not job.pending and job.id not in reported:
                    reported.add(job.id)
                    print(("\r\033[K" if interactive else "") + f"#{job.ticket} {job.id[:8]} {job.state}: "
                          f"{job.run or job.message}", flush=True)
            running, waiting = state.running(), len(state.waiting())
            if running is None and (waiting == 0 or not runner_alive(root)):
                note = "" if waiting == 0 else f" ({waiting} waiting, but no studio or queue run serves {root})"
                print(("\r\033[K" if interactive else "") + f"queue idle{note}", flush=True)
                return 0
            line = _watch_line(state, running, read_progress(root))
            if line != last:
                print(("\r\033[K" + line) if interactive else line, end="" if interactive else "\n", flush=True)
                last = line
            time.sleep(args.interval)
    except KeyboardInterrupt:
        print(("\r\033[K" if interactive else "") + "stopped watching; the queue goes on", flush=True)
        return 0


def _watch_line(state, running, progress) -> str:
    paused = " · paused" if state.paused else ""
    tail = f" · {len(state.waiting())} waiting{paused}"
    if running is None:
        return f"nothing running{tail}"
    where = "starting"
    if progress is not None and progress.get("job") == running.id:
        step, total = progress.get("step"), progress.get("total")
        where = (f"{progress.get('stage')} step {step + 1}/{total}" if isinstance(step, int) and total
                 else f"{progress.get('stage')} {progress.get('message') or ''}".rstrip())
    return f"#{running.ticket} {running.id[:8]} {where} · {time.time() - (running.started or time.time()):.0f} s{tail}"
