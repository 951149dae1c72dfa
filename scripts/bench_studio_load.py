#!/usr/bin/env python3
"""A crowd at the studio (issue 32): N clients call /generate at once while a run goes; who got what, how fast.

Starts ``magi2studio studio`` (embedded engine, its own process, 127.0.0.1) on a fresh outputs root,
adds one long headless job (``queue add``'s kind) so that the engine is busy, sends the crowd, and
prints JSON: each answer's kind and seconds (min / median / max), the studio process's CPU seconds
meanwhile, then, after every client has
gone, how many of their jobs ran and how long until none of them was pending. ``--gradio-client``
makes each client a ``gradio_client.Client`` (its config and API-info fetches included, as an
audit would; answers only: a Client's stream stays open while this process lives), else a
plain-HTTP client of ``/gradio_api/call/generate``.

    PYTHONPATH=$PWD:$PWD/kernels .venv/bin/python scripts/bench_studio_load.py --clients 64
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "studio"))


def gradio_client_crowd(url: str, clients: int, guard_s: float, **overrides) -> list:
    """Each client a gradio_client.Client (made in the crowd, as an audit's are), until its ticket or refusal."""
    from gradio_client import Client
    from studio_support import Answer, generate_args

    answers: list = [None] * clients
    everyone = threading.Event()

    def one(index: int) -> None:
        began = time.monotonic()
        try:
            job = Client(url, verbose=False).submit(**generate_args(**{"seed": 1000 + index, **overrides}),
                                                    api_name="/generate")
            while time.monotonic() - began < guard_s:
                if any("queued (ticket" in str(output) for output in job.outputs()):
                    answers[index] = Answer("ticket", time.monotonic() - began)
                    everyone.wait(guard_s)
                    return
                if job.done():
                    error = job.exception()
                    kind = "refused" if error is not None and str(error).startswith("queue:") else repr(error)[:60]
                    answers[index] = Answer(kind, time.monotonic() - began, str(error))
                    return
                time.sleep(0.05)
            answers[index] = Answer("no answer", time.monotonic() - began)
        except Exception as err:  # noqa: BLE001 - every way a client fails is counted
            answers[index] = Answer(type(err).__name__, time.monotonic() - began, str(err)[:200])

    threads = [threading.Thread(target=one, args=(index,), daemon=True) for index in range(clients)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + guard_s
    while sum(answer is not None for answer in answers) < clients and time.monotonic() < deadline:
        time.sleep(0.05)
    everyone.set()
    for thread in threads:
        thread.join(5)
    return [answer or Answer("no answer", guard_s) for answer in answers]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (Linux /proc): the studio's own, not its ranks'."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--queue-size", type=int, default=32, help="the studio's --queue-size (default 32)")
    parser.add_argument("--guard", type=float, default=60.0, help="seconds a client waits for its answer")
    parser.add_argument("--gradio-client", action="store_true", help="gradio_client clients, not plain HTTP")
    args = parser.parse_args()

    from magi2studio.jobs.jobqueue import JobQueue
    from magi2studio.vocabulary.request import build_request
    from studio_support import crowd, studio_process

    with tempfile.TemporaryDirectory(prefix="bench-studio-load-") as temp:
        outputs = Path(temp) / "outputs"
        with studio_process(outputs, queue_size=args.queue_size) as studio:
            queue = JobQueue(outputs)
            busy = queue.add(build_request(prompt="A lighthouse at night", seed=1, steps=1000).model_dump(mode="json"),
                             "sp1-cfg1", owner="cli", source="cli")
            while queue.read().find(busy.id).state != "running":
                time.sleep(0.2)
            send = gradio_client_crowd if args.gradio_client else crowd
            cpu_before, began = cpu_seconds(studio.process.pid), time.monotonic()
            answers = send(studio.url, args.clients, guard_s=args.guard, steps=3)
            studio_cpu_s, crowd_s = cpu_seconds(studio.process.pid) - cpu_before, time.monotonic() - began
            gone = time.monotonic()
            api = lambda: [job for job in queue.read().jobs if job.source == "api"]  # noqa: E731
            while not args.gradio_client and any(job.pending for job in api()) and time.monotonic() - gone < 120:
                time.sleep(0.2)
            settled_s = time.monotonic() - gone
            jobs = api()
    kinds = collections.defaultdict(list)
    for answer in answers:
        kinds[answer.kind].append(answer.seconds)
    report = {
        "clients": args.clients, "queue_size": args.queue_size,
        "client": "gradio_client" if args.gradio_client else "http",
        "answers": {kind: {"count": len(times), "min_s": round(min(times), 2),
                           "median_s": round(statistics.median(times), 2), "max_s": round(max(times), 2)}
                    for kind, times in sorted(kinds.items())},
        "api_jobs": len(jobs),
        # CPU the studio's process spent while the crowd was answered (over crowd_s, which includes the wait for
        # the slowest client): unlike the seconds above, barely changed by other work on the machine.
        "studio_cpu_s": round(studio_cpu_s, 2), "crowd_s": round(crowd_s, 2),
        "load_average": os.getloadavg()[0],
        **({} if args.gradio_client else {
            "api_jobs_that_ran": sum(job.started is not None for job in jobs),
            "api_jobs_pending_after_clients_left": sum(job.pending for job in jobs),
            "api_job_states": dict(collections.Counter(job.state for job in jobs)),
            "seconds_until_none_pending": round(settled_s, 2)}),
        "refusal": next((answer.text for answer in answers if answer.kind == "refused"), None),
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
