"""A crowd at the studio's door, and clients that leave: a studio in its own process on 127.0.0.1.

Every client of a crowd past the queue's bound gets its ticket or the queue's refusal (no client
timeout), and the jobs of API clients that disconnected are cancelled before they run, while a
job added with ``magi2studio queue add`` (no client) is left alone. The timings of 64 clients are
in docs/studio.md (scripts/bench_studio_load.py); here only a guard bounds the wait.
"""

from __future__ import annotations

import collections
import re
import time

import pytest

from magi2studio.jobs.jobqueue import JobQueue
from magi2studio.vocabulary.request import build_request
from studio_support import crowd, studio_process

QUEUE_SIZE = 8
CLIENTS = 32
FULL = re.compile(rf"^queue: {QUEUE_SIZE} runs are already waiting \(the limit is {QUEUE_SIZE}\)\. Fix: .+")


def wait_until(check, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not true within {timeout_s} s")


@pytest.mark.slow
def test_a_crowd_gets_tickets_or_refusals_and_the_jobs_of_clients_gone_never_run(tmp_path):
    outputs = tmp_path / "outputs"
    with studio_process(outputs, queue_size=QUEUE_SIZE) as studio:
        queue = JobQueue(outputs)
        headless = queue.add(build_request(prompt="A lighthouse at night", seed=1, steps=1000).model_dump(mode="json"),
                             "sp1-cfg1", owner="cli", source="cli")
        wait_until(lambda: queue.read().find(headless.id).state == "running", 120)

        answers = crowd(studio.url, CLIENTS, guard_s=60, steps=3)

        kinds = collections.Counter(answer.kind for answer in answers)
        assert kinds == {"ticket": QUEUE_SIZE, "refused": CLIENTS - QUEUE_SIZE}, (kinds, answers)
        assert all(FULL.match(answer.text) for answer in answers if answer.kind == "refused"), answers
        # Every client has gone: their jobs are cancelled before they start; the headless job runs on.
        api_jobs = lambda: [job for job in queue.read().jobs if job.source == "api"]  # noqa: E731
        wait_until(lambda: not any(job.pending for job in api_jobs()), 60)
        assert len(api_jobs()) == QUEUE_SIZE
        assert all(job.state == "cancelled" and job.started is None for job in api_jobs()), api_jobs()
        assert queue.read().find(headless.id).state == "running"
        assert not [path for path in outputs.iterdir() if not path.name.startswith(".")
                    and path.name != "queue.json"], "a job of a client that had gone left a run folder"
