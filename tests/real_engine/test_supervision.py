"""Engine-process supervision: crash and hang are reported with the log tail and cleaned up."""

from __future__ import annotations

import os
import time

import pytest

from magi2studio.engines.vllm_omni.process import EngineProcess
from magi2studio.errors import EngineError

CHILDREN = "tests.real_engine.children"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as file:  # a zombie awaiting its reaper counts as gone
        return file.read().split()[2] == "Z"


def test_crash_at_start_is_reported_with_log_tail_then_next_start_works(tmp_path):
    crashing = EngineProcess(f"{CHILDREN}:crash_while_loading", {"message": "CUDA error: out of memory"},
                             tmp_path / "crash.log")
    with pytest.raises(EngineError) as raised:
        crashing.start(timeout_s=60)
    text = str(raised.value)
    assert "died during start (exit code 7)" in text
    assert "worker rank 3: CUDA error: out of memory" in text
    assert "loading MAGI-2 transformer shards" in text
    assert not crashing.alive

    working = EngineProcess(f"{CHILDREN}:square", {}, tmp_path / "ok.log")
    info = working.start(timeout_s=60)
    events = []
    assert working.call(12, timeout_s=30, on_event=events.append) == 144
    assert events == [{"stage": "preview", "step": 0}]
    working.stop()
    assert _gone(info["pid"])


def test_hang_is_killed_with_its_workers_and_reported(tmp_path):
    pid_file = tmp_path / "worker.pid"
    hanging = EngineProcess(f"{CHILDREN}:hang_on_call", {"worker_pid_file": str(pid_file)}, tmp_path / "hang.log")
    info = hanging.start(timeout_s=60)
    started = time.monotonic()
    with pytest.raises(EngineError) as raised:
        hanging.call("go", timeout_s=2)
    assert time.monotonic() - started < 10
    assert "gave no answer to a request within 2 s and was killed" in str(raised.value)
    assert "step 0 of 100 ..." in str(raised.value)
    worker_pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not (_gone(info["pid"]) and _gone(worker_pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(info["pid"]) and _gone(worker_pid)

    again = EngineProcess(f"{CHILDREN}:square", {}, tmp_path / "again.log")
    again.start(timeout_s=60)
    assert again.call(3, timeout_s=30) == 9
    again.stop()


def test_the_step_watchdog_kills_a_child_silent_between_events(tmp_path):
    pid_file = tmp_path / "worker.pid"
    hanging = EngineProcess(f"{CHILDREN}:hang_on_call", {"worker_pid_file": str(pid_file)}, tmp_path / "hang.log")
    info = hanging.start(timeout_s=60)
    started = time.monotonic()
    with pytest.raises(EngineError) as raised:
        hanging.call("go", timeout_s=600, idle_timeout_s=2)
    assert time.monotonic() - started < 10
    assert "no step boundary or stage event for 2 s (the step watchdog" in str(raised.value)
    assert not hanging.alive
    deadline = time.monotonic() + 10
    while not _gone(info["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(info["pid"])


def test_a_child_killed_mid_run_is_reported_as_killed_not_as_the_watchdog(tmp_path):
    """On the H100 (2026-12-06) a SIGKILLed engine child was reported with the watchdog's words after 5.7 s."""

    import signal
    import threading

    hanging = EngineProcess(f"{CHILDREN}:hang_on_call", {"worker_pid_file": str(tmp_path / "worker.pid")},
                            tmp_path / "hang.log")
    info = hanging.start(timeout_s=60)
    threading.Timer(1.0, os.kill, (info["pid"], signal.SIGKILL)).start()
    started = time.monotonic()
    with pytest.raises(EngineError) as raised:
        hanging.call("go", timeout_s=600, idle_timeout_s=30)
    assert time.monotonic() - started < 10
    assert "engine process died during a request (exit code -9)" in str(raised.value)
    assert "watchdog" not in str(raised.value)
