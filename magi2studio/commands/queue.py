"""``magi2studio queue``: the studio's job queue from the command line (list, add, cancel, remove, run,
pause, resume, move, watch).

``add`` queues one run, or a batch: ``--count N`` runs under ``--seed-policy fixed|increment|random``,
``--prompts FILE`` (one prompt per line), and a grid: ``--grid-seeds 1,2 --grid-steps 4,8
--grid-layouts sp1-cfg1,sp2-cfg1 --grid-deterministic on,off`` (every combination). A batch is
checked and planned whole before any of it is queued, and queued whole or not at all.

The same queue file as the studio (``<out>/queue.json``): ``add`` while a studio serves that
outputs root and the studio runs the job; ``run`` works through the queue without a studio
(one runner per outputs root: it refuses while a studio serves it).

A job keeps the embedded weights it was queued for (``add --weights``, else ``$MAGI2_EMBEDDED_WEIGHTS``,
else the shipped trained ones); a runner on other weights fails it with one line saying how to run it
(``run --weights``), rather than run it on its own (jobs.runner.check_weights).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..errors import InputError
from ..jobs.batches import SEED_POLICIES
from .queue_watch import watch_queue
from .generate import (DEFAULT_OUT, WEIGHTS_HELP, add_request_arguments, add_server_arguments, engine_options,
                       request_from_args, seed_asked_random)


def register(sub) -> None:
    parser = sub.add_parser("queue", help="list, add, cancel or run the studio's queued jobs", description=__doc__)
    actions = parser.add_subparsers(dest="action", required=True)

    def with_out(action: argparse.ArgumentParser) -> argparse.ArgumentParser:
        action.add_argument("--out", default=str(DEFAULT_OUT), help="outputs root (default ./outputs)")
        return action

    listing = with_out(actions.add_parser("list", help="the jobs: waiting, running and recently finished"))
    listing.add_argument("--json", action="store_true", help="print the jobs as JSON")
    listing.set_defaults(func=list_jobs)

    add = with_out(actions.add_parser("add", help="queue one request (the flags of generate), or a batch of them"))
    add_request_arguments(add)
    batch = add.add_argument_group("batch", "several runs from one add, queued as one batch (all or none)")
    batch.add_argument("--count", default=None, help="runs of each combination (default 1)")
    batch.add_argument("--seed-policy", default="fixed", choices=SEED_POLICIES,
                       help="fixed: every run the seed; increment: seed, seed+1, ...; random: a seed drawn per run "
                            "(recorded as seed -1 is)")
    batch.add_argument("--prompts", default=None, metavar="FILE", help="a text file: one prompt per line, a run each")
    batch.add_argument("--grid-seeds", default=None, metavar="S1,S2", help="grid: these seeds")
    batch.add_argument("--grid-steps", default=None, metavar="N1,N2", help="grid: these step counts")
    batch.add_argument("--grid-layouts", default=None, metavar="L1,L2", help="grid: these layouts (spN-cfgM[-epK] "
                       "or presets)")
    batch.add_argument("--grid-deterministic", default=None, metavar="on,off", help="grid: deterministic on and/or off")
    add.add_argument("--layout", default="sp1-cfg1", help="spN-cfgM[-epK] or a preset")
    add.add_argument("--engine", default="embedded", help="the engine that checks the request now "
                     "(the runner checks it again with its own)")
    add.add_argument("--weights", default=None, help="the embedded weights the job is for: trained, random or a "
                     "tiny checkpoint folder (default: $MAGI2_EMBEDDED_WEIGHTS, else trained). The job records "
                     "them; a runner on other weights (queue run --weights, the studio's $MAGI2_EMBEDDED_WEIGHTS) "
                     "fails it rather than run it on its own")
    add_server_arguments(add)
    add.set_defaults(func=add_job)

    for name, helptext, func in (("cancel", "cancel a waiting job, or stop a running one at its next step", cancel_job),
                                 ("remove", "take a finished job off the list (its run folder stays)", remove_job)):
        action = with_out(actions.add_parser(name, help=helptext))
        action.add_argument("job", help="a job id, or its first characters as queue list shows them")
        action.set_defaults(func=func)

    for name, helptext, func in (
            ("pause", "stop the runner from starting waiting jobs (the running one finishes); kept across restarts",
             pause_queue),
            ("resume", "let the runner start waiting jobs again", resume_queue)):
        with_out(actions.add_parser(name, help=helptext)).set_defaults(func=func)
    move = with_out(actions.add_parser("move", help="move a waiting job up or down the queue"))
    move.add_argument("job", help="a job id, or its first characters as queue list shows them")
    move.add_argument("direction", choices=("up", "down"), help="up runs it sooner")
    move.add_argument("--by", type=int, default=1, help="places to move (default 1)")
    move.set_defaults(func=move_job)
    watch = with_out(actions.add_parser("watch", help="print the queue's progress live until it is idle "
                                                      "(Ctrl+C stops)"))
    watch.add_argument("--interval", type=float, default=0.5, help="seconds between looks (default 0.5)")
    watch.set_defaults(func=watch_queue)

    run = with_out(actions.add_parser("run", help="run the waiting jobs here, without a studio, until none wait"))
    run.add_argument("--engine", default="embedded", help="embedded, vllm-omni or vllm-omni-server")
    run.add_argument("--weights", default=None, help=WEIGHTS_HELP)
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
        batch = f"  batch {job.batch} {job.label}" if job.batch else ""
        weights = f"  weights {job.weights_text()}" if job.weights else ""
        print(f"#{job.ticket:<4} {job.id[:8]}  {job.state:<11} {job.summary()}  {where}{batch}{weights}")
    paused = " · paused (magi2studio queue resume)" if state.paused else ""
    print(f"{len(state.waiting())} waiting of at most {state.max_waiting}{paused}")
    return 0


def add_job(args: argparse.Namespace) -> int:
    """Queue one run, or a batch: every run checked and planned here first, then queued together or not at all."""
    from ..engines import get_engine
    from ..jobs.batches import expand, parse_spec, read_prompts
    from ..jobs.runner import engine_weights
    from ..run_folder.runs import check_outputs_root
    from ..vocabulary.layouts import parse_layout
    from ..vocabulary.request import RANDOM_SEED, build_request

    spec = parse_spec(count=args.count, seed_policy=args.seed_policy,
                      prompts=read_prompts(args.prompts) if args.prompts else None, seeds=args.grid_seeds,
                      steps=args.grid_steps, layouts=args.grid_layouts, deterministic=args.grid_deterministic)
    if spec.prompts and args.prompt is None and not args.prompt_file and not args.request:
        args.prompt = spec.prompts[0]  # the base request's other flags still apply to every line
    request = request_from_args(args)
    if request.image:  # the runner may start elsewhere: keep the path it can open
        request = request.model_copy(update={"image": str(Path(request.image).resolve())})
    base = request.model_dump(mode="json")
    if seed_asked_random(args):
        base["seed"] = RANDOM_SEED  # expand draws it: once for fixed and increment, per run for random
    layout = parse_layout(args.layout).name
    engine = get_engine(args.engine, **engine_options(args))
    runs = []
    for item in expand(base, layout, spec):
        plan = engine.plan(build_request(**item.fields), parse_layout(item.layout))
        runs.append((plan.request.model_dump(mode="json"), plan.layout.name, item.label, item.seed_drawn))
    check_outputs_root(Path(args.out))
    jobs = _queue(args).add_batch(runs, owner="cli", source="cli", weights=engine_weights(engine))
    state = _queue(args).read()
    where = Path(args.out) / "queue.json"
    if len(jobs) == 1:
        if jobs[0].seed_drawn:
            print(f"seed: -1 drew {jobs[0].request['seed']}")
        print(f"queued #{jobs[0].ticket} {jobs[0].id} at position {state.position(jobs[0].id)} in {where}"
              + _for_weights(jobs[0]))
        return 0
    print(f"queued batch {jobs[0].batch}: {len(jobs)} runs, #{jobs[0].ticket} to #{jobs[-1].ticket}, in {where}"
          + _for_weights(jobs[0]))
    for job in jobs:
        print(f"  #{job.ticket:<4} {job.id[:8]}  {job.label}")
    return 0


def _for_weights(job) -> str:
    return f" for the embedded weights {job.weights_text()}" if job.weights else ""


def cancel_job(args: argparse.Namespace) -> int:
    job = _queue(args).cancel(args.job)
    print(f"#{job.ticket} {job.id[:8]}: " + ("cancelled" if job.state == "cancelled" else
                                               "asked to stop; its runner stops it at the next step or stage boundary"))
    return 0


def remove_job(args: argparse.Namespace) -> int:
    job = _queue(args).remove(args.job)
    print(f"#{job.ticket} {job.id[:8]} removed (state {job.state}{', run folder ' + job.run if job.run else ''})")
    return 0


def pause_queue(args: argparse.Namespace) -> int:
    state = _queue(args).set_paused(True)
    running = state.running()
    print(f"paused: no waiting job starts ({len(state.waiting())} wait)"
          + (f"; #{running.ticket} runs on to its end" if running else ""))
    return 0


def resume_queue(args: argparse.Namespace) -> int:
    state = _queue(args).set_paused(False)
    print(f"resumed: {len(state.waiting())} waiting")
    return 0


def move_job(args: argparse.Namespace) -> int:
    if args.by < 1:
        raise InputError("by", f"{args.by} is below 1", "move by 1 or more places")
    position = _queue(args).move(args.job, -args.by if args.direction == "up" else args.by)
    print(f"{args.job[:8]}: now at position {position}")
    return 0


def run_jobs(args: argparse.Namespace) -> int:
    """Claim the waiting jobs one by one and run them, like the studio's slot; exit 1 if any failed."""
    from ..engines import get_engine
    from ..jobs.jobqueue import JobQueue
    from ..jobs.runner import OtherWeights, RunnerLock, execute_job, plan_record
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
        while (record := _next_job(queue)) is not None:
            print(f"#{record.ticket} {record.id[:8]}: {record.summary()}", flush=True)
            try:
                plan = plan_record(engine, record)
            except OtherWeights as err:  # not the request's fault: it failed here, and may run elsewhere
                queue.update(record.id, state="failed", finished=time.time(), message=str(err))
                print(f"  failed: {err}")
                failed += 1
                continue
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


def _next_job(queue):
    """The next waiting job, claimed; while the queue is paused and jobs wait, wait for a resume (reading only)."""
    said = False
    while True:
        state = queue.read()
        if not state.paused:
            record = queue.claim_next()
            if record is not None or not queue.read().paused:  # paused between the read and the claim: wait
                return record
        elif not state.waiting():
            return None
        if not said:
            print(f"paused: {len(state.waiting())} waiting; magi2studio queue resume starts them", flush=True)
            said = True
        time.sleep(0.5)


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
