"""``magi2studio queue``: the studio's job queue from the command line (list, add, cancel, remove, run).

The same queue file as the studio (``<out>/queue.json``): ``add`` while a studio serves that
outputs root and the studio runs the job; ``run`` works through the queue without a studio
(one runner per outputs root: it refuses while a studio serves it).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..errors import InputError
from .generate import (DEFAULT_OUT, add_request_arguments, add_server_arguments, engine_options, request_from_args,
                       seed_asked_random)


def register(sub) -> None:
    parser = sub.add_parser("queue", help="list, add, cancel or run the studio's queued jobs", description=__doc__)
    actions = parser.add_subparsers(dest="action", required=True)

    def with_out(action: argparse.ArgumentParser) -> argparse.ArgumentParser:
        action.add_argument("--out", default=str(DEFAULT_OUT), help="outputs root (default ./outputs)")
        return action

    listing = with_out(actions.add_parser("list", help="the jobs: waiting, running and recently finished"))
    listing.add_argument("--json", action="store_true", help="print the jobs as JSON")
    listing.set_defaults(func=list_jobs)

    add = with_out(actions.add_parser("add", help="queue one request (the flags of generate)"))
    add_request_arguments(add)
    add.add_argument("--layout", default="sp1-cfg1", help="spN-cfgM[-epK] or a preset")
    add.add_argument("--engine", default="embedded", help="the engine that checks the request now "
                     "(the runner checks it again with its own)")
    add.add_argument("--weights", default=None, help="embedded engine: random or a tiny checkpoint folder")
    add_server_arguments(add)
    add.set_defaults(func=add_job)

    for name, helptext, func in (("cancel", "cancel a waiting job, or stop a running one at its next step", cancel_job),
                                 ("remove", "take a finished job off the list (its run folder stays)", remove_job)):
        action = with_out(actions.add_parser(name, help=helptext))
        action.add_argument("job", help="a job id, or its first characters as queue list shows them")
        action.set_defaults(func=func)

    run = with_out(actions.add_parser("run", help="run the waiting jobs here, without a studio, until none wait"))
    run.add_argument("--engine", default="embedded", help="embedded, vllm-omni or vllm-omni-server")
    run.add_argument("--weights", default=None, help="embedded engine: random or a tiny checkpoint folder")
    run.add_argument("--queue-size", type=int, default=None, help="most jobs that may wait (default: keep the file's)")
    add_server_arguments(run)
    run.set_defaults(func=run_jobs)


def _queue(args: argparse.Namespace):
    from ..jobs.jobqueue import JobQueue

    return JobQueue(Path(args.out))


def list_jobs(args: argparse.Namespace) -> int:
    state = _queue(args).read()
    if args.json:
        from dataclasses import asdict

        print(json.dumps([{**asdict(job), "position": state.position(job.id)} for job in state.jobs], indent=1))
        return 0
    if not state.jobs:
        print(f"no jobs in {Path(args.out) / 'queue.json'}")
        return 0
    from ..jobs.runner import runner_alive

    orphaned = not runner_alive(Path(args.out))
    for job in state.jobs:
        position = state.position(job.id)
        where = f"position {position}" if position else (job.run or job.message or "")
        if job.state == "running" and orphaned:
            where = "its runner is gone: it is marked interrupted when a studio or queue run next serves this folder"
        print(f"#{job.ticket:<4} {job.id[:8]}  {job.state:<11} {job.summary()}  {where}")
    print(f"{len(state.waiting())} waiting of at most {state.max_waiting}")
    return 0


def add_job(args: argparse.Namespace) -> int:
    from ..engines import get_engine
    from ..vocabulary.layouts import parse_layout
    from ..run_folder.runs import check_outputs_root

    request = request_from_args(args)
    if request.image:  # the runner may start elsewhere: keep the path it can open
        request = request.model_copy(update={"image": str(Path(request.image).resolve())})
    plan = get_engine(args.engine, **engine_options(args)).plan(request, parse_layout(args.layout))
    check_outputs_root(Path(args.out))
    job = _queue(args).add(plan.request.model_dump(mode="json"), plan.layout.name, owner="cli", source="cli")
    state = _queue(args).read()
    if seed_asked_random(args):
        print(f"seed: -1 drew {plan.request.seed}")
    print(f"queued #{job.ticket} {job.id} at position {state.position(job.id)} in {Path(args.out) / 'queue.json'}")
    return 0


def cancel_job(args: argparse.Namespace) -> int:
    job = _queue(args).cancel(args.job)
    print(f"#{job.ticket} {job.id[:8]}: " + ("cancelled" if job.state == "cancelled" else
                                               "asked to stop; its runner stops it at the next step boundary"))
    return 0


def remove_job(args: argparse.Namespace) -> int:
    job = _queue(args).remove(args.job)
    print(f"#{job.ticket} {job.id[:8]} removed (state {job.state}{', run folder ' + job.run if job.run else ''})")
    return 0


def run_jobs(args: argparse.Namespace) -> int:
    """Claim the waiting jobs one by one and run them, like the studio's slot; exit 1 if any failed."""
    from ..engines import get_engine
    from ..jobs.jobqueue import JobQueue
    from ..jobs.runner import RunnerLock, execute_job, plan_record
    from .progress import ConsoleProgress
    from ..run_folder.runs import check_outputs_root

    if args.queue_size is not None and args.queue_size < 1:
        raise InputError("queue-size", f"{args.queue_size} is below 1", "use --queue-size 1 or more")
    root = check_outputs_root(Path(args.out))
    queue = JobQueue(root)
    queue.read()  # a damaged file is refused before the lock or the engine
    runner = RunnerLock(root)
    engine = get_engine(args.engine, **engine_options(args))
    failed = 0
    try:
        for job in queue.open_for_runner(args.queue_size):
            print(f"#{job.ticket} {job.id[:8]}: interrupted (it was running when the last runner stopped)")
        while (record := queue.claim_next()) is not None:
            print(f"#{record.ticket} {record.id[:8]}: {record.summary()}", flush=True)
            try:
                plan = plan_record(engine, record)
            except InputError as err:
                queue.update(record.id, state="refused", finished=time.time(), message=str(err))
                print(f"  refused: {err}")
                failed += 1
                continue
            cancel = _watch_cancel(queue, record.id)
            with ConsoleProgress() as progress:
                outcome = execute_job(engine, plan, root, record, on_progress=progress, cancel=cancel)
            queue.update(record.id, state=outcome.state, finished=time.time(), message=outcome.message,
                         run=outcome.run.path.name if outcome.run is not None else None)
            print(f"  {outcome.state}: {outcome.message}", flush=True)
            failed += outcome.state != "done"
    except BaseException:
        for record in queue.read().jobs:  # Ctrl+C or SIGTERM: the running job did not finish
            if record.state == "running":
                queue.update(record.id, state="interrupted", finished=time.time(),
                             message="queue run was stopped while this ran; no run folder was kept")
        raise
    finally:
        engine.close()
        runner.release()
    print(f"queue empty ({failed} of the jobs run here did not finish as done)" if failed else "queue empty")
    return 1 if failed else 0


def _watch_cancel(queue, job_id: str):
    """An Event set when ``queue cancel`` asks this job to stop (checked twice a second in a thread)."""
    import threading

    cancel = threading.Event()

    def watch() -> None:
        while not cancel.is_set():
            try:
                state = queue.read()
                record = state.find(job_id)
            except InputError:
                return
            if record.state != "running":
                return
            if record.cancel_requested:
                cancel.set()
                return
            time.sleep(0.5)

    threading.Thread(target=watch, name=f"cancel-watch-{job_id[:8]}", daemon=True).start()
    return cancel
