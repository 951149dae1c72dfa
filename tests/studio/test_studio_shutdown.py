"""The studio's end: SIGTERM during a run, the runner lock and Gradio's file cache left behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from magi2studio.jobs.jobqueue import RUNNER_LOCK_FILE, JobQueue
from magi2studio.jobs.runner import RunnerLock, runner_alive
from studio_support import generate_args, studio_process, wait_for_output

INTERRUPTED = re.compile(r"^studio: shutting down; job #1 stopped at a step boundary and is marked interrupted, "
                         r"no run folder was kept\. Fix: .+$")


@pytest.mark.slow
def test_sigterm_during_a_run_tells_the_client_in_one_line_and_leaves_nothing_behind(tmp_path):
    outputs = tmp_path / "outputs"
    with studio_process(outputs, queue_size=4) as studio:
        assert studio.cache is not None and studio.cache.is_dir()
        assert studio.cache.parent == Path(tempfile.gettempdir())
        client = Client(studio.url, verbose=False)
        job = client.submit(**generate_args(seed=3, steps=400), api_name="/generate")
        wait_for_output(job, "preview: step 2/400", timeout_s=180)
        studio.process.send_signal(signal.SIGTERM)
        with pytest.raises(AppError) as caught:
            job.result(timeout=120)
        assert INTERRUPTED.match(str(caught.value)), str(caught.value)
        assert studio.process.wait(timeout=120) == 0
    assert [(job.ticket, job.state) for job in JobQueue(outputs).read().jobs] == [(1, "interrupted")]
    assert not (outputs / RUNNER_LOCK_FILE).exists()
    assert not studio.cache.exists(), "the studio's Gradio cache outlived it"
    assert sorted(path.name for path in outputs.iterdir() if not path.name.startswith(".")) == ["queue.json"]


def test_a_clean_release_removes_the_runner_lock_and_a_killed_runners_lock_is_taken_over(tmp_path):
    lock = RunnerLock(tmp_path)
    assert runner_alive(tmp_path)
    lock.release()
    assert not (tmp_path / RUNNER_LOCK_FILE).exists() and not runner_alive(tmp_path)

    hold = ("import sys, time; from magi2studio.jobs.runner import RunnerLock; "
            "held = RunnerLock(sys.argv[1]); print('held', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert runner_alive(tmp_path)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert (tmp_path / RUNNER_LOCK_FILE).is_file() and not runner_alive(tmp_path)  # left by the killed runner
    again = RunnerLock(tmp_path)
    assert (tmp_path / RUNNER_LOCK_FILE).read_text() == f"pid {os.getpid()}\n"
    again.release()
    assert not (tmp_path / RUNNER_LOCK_FILE).exists()
