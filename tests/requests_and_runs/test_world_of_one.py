"""World 1 is a pool of one spawned rank, like every layout (issue 32).

It used to run inside the engine's process on that process's world-1 groups: a hung step
stopped the studio itself (every HTTP request froze for as long as the step did) and no
watchdog saw it. Now the rank is a process of its own, the step watchdog reports it and the
next run gets a fresh one; the engine's process holds no torch.distributed world, so the
trainer's (CI's stop 21) never meets an engine's.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from magi2studio.run_folder import runs
from magi2studio.engines.base import DEFAULT_STEP_TIMEOUT_S
from magi2studio.engines.embedded.engine import EmbeddedEngine
from magi2studio.errors import EngineError
from magi2studio.vocabulary.layouts import parse_layout
from magi2studio.vocabulary.request import build_request

WATCHDOG_S = float(os.environ.get("MAGI2STUDIO_TEST_WATCHDOG_S", "15"))  # well above a tiny step
LAYOUT = parse_layout("sp1-cfg1")
pytestmark = pytest.mark.slow


def gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()


def test_a_stopped_world_one_run_is_reported_while_this_process_keeps_answering(tmp_path):
    """SIGSTOP of the one rank as its run starts (a hung kernel): the watchdog names it and kills
    it, the process that asked keeps running meanwhile, and the next request works."""

    engine = EmbeddedEngine(rank_timeout_s=WATCHDOG_S)
    try:
        engine.start(LAYOUT)
        (pid,) = engine._pool.pids
        assert pid != os.getpid()
        request = build_request(prompt="a red kite over a windy beach", steps=2, seed=7)
        stopped_at: list[float] = []
        outcome: list[BaseException] = []

        def stop_the_rank(event):  # at the first stage event: no step time before the stop to outlast
            if not stopped_at:
                os.kill(pid, signal.SIGSTOP)
                stopped_at.append(time.monotonic())

        def run() -> None:  # as the studio's slot runs a job: in a worker thread
            try:
                runs.execute(engine, request, LAYOUT, tmp_path, on_progress=stop_the_rank)
            except BaseException as err:  # noqa: BLE001 - handed to the test's thread
                outcome.append(err)

        worker = threading.Thread(target=run)
        worker.start()
        ticks = [time.monotonic()]
        while worker.is_alive():  # this process runs on while its run is stuck
            worker.join(0.05)
            ticks.append(time.monotonic())
        assert stopped_at, outcome
        reported_after = time.monotonic() - stopped_at[0]
        assert max(b - a for a, b in zip(ticks, ticks[1:])) < WATCHDOG_S / 3
        assert len(outcome) == 1 and isinstance(outcome[0], EngineError), outcome
        assert str(outcome[0]).startswith("rank 0 of layout sp1-cfg1 made no progress for "
                                          f"{WATCHDOG_S:g} s while running before finishing any preview step: "
                                          "stopped (state T); the ranks were killed"), outcome[0]
        assert WATCHDOG_S <= reported_after < WATCHDOG_S + 30
        assert gone(pid)
        assert not [p for p in tmp_path.iterdir() if not p.name.startswith(".probe")]
        engine.rank_timeout_s = DEFAULT_STEP_TIMEOUT_S  # the next pool's: a loaded machine's steps may be slow
        folder = runs.execute(engine, request, LAYOUT, tmp_path)
        assert runs.is_complete(folder.path) and engine._pool.pids != [pid]
    finally:
        engine.close()


BESIDE_THE_TRAINER = r"""
import torch.distributed as dist
from magi2studio.engines.embedded import EmbeddedEngine, upstream_patches
from magi2studio.vocabulary.layouts import parse_layout

engine = EmbeddedEngine()
engine.start(parse_layout("sp1-cfg1"))
assert not dist.is_initialized(), "a world-1 engine holds this process's torch.distributed world"
upstream_patches.init_world_of_one()  # the trainer, while the engine is up
engine.close()
assert dist.is_initialized(), "closing the engine released the trainer's world"
upstream_patches.destroy_parallel()
print("side by side ok")
"""


def test_the_trainer_s_world_and_a_world_one_engine_live_side_by_side():
    """CI's stop 21: an engine's world made the trainer's init_parallel raise 'initialize the default
    process group twice'. In a fresh interpreter: the suite's process may hold the trainer's world."""

    result = subprocess.run([sys.executable, "-c", BESIDE_THE_TRAINER], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "side by side ok" in result.stdout, result.stderr[-3000:]


KILLED_RANKS = r"""
import os, signal
from magi2studio.engines.embedded import EmbeddedEngine
from magi2studio.vocabulary.layouts import parse_layout

engine = EmbeddedEngine()
engine.start(parse_layout("sp1-cfg1"))
for pid in engine._pool.pids:  # as the watchdog, close() after its grace, or the parent's exit kill them
    os.kill(pid, signal.SIGKILL)
engine.close()
print("closed")
"""


def test_killed_ranks_leave_no_semaphore_behind():
    """A rank's tqdm lock was a named semaphore that only a clean exit unlinked: each killed rank
    made the parent's exit warn "resource_tracker: There appear to be N leaked semaphore objects"."""

    result = subprocess.run([sys.executable, "-c", KILLED_RANKS], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "closed" in result.stdout, result.stderr[-3000:]
    assert "leaked" not in result.stderr, result.stderr[-3000:]
