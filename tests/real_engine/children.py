"""Engine children for the supervision tests: one crashes, one hangs, one works.

They run inside the real :mod:`magi2studio.engines.vllm_omni.process` machinery (spawned,
own process group, log redirected); only what they do once started differs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from magi2studio.engines.vllm_omni.process import serve


def crash_while_loading(conn, config):
    print("loading MAGI-2 transformer shards", flush=True)
    print(f"worker rank 3: {config['message']}", file=sys.stderr, flush=True)
    os._exit(7)  # a hard death: no error message on the pipe


def hang_on_call(conn, config):
    """Starts a grandchild (as Omni starts workers), then never answers a call."""

    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(config["worker_pid_file"], "w") as file:
        file.write(str(worker.pid))

    def handle(payload, emit):
        print("step 0 of 100 ...", flush=True)
        time.sleep(600)

    serve(conn, {"pid": os.getpid()}, handle)


def square(conn, config):
    def handle(payload, emit):
        emit({"stage": "preview", "step": 0})
        return payload * payload

    serve(conn, {"pid": os.getpid()}, handle)
