"""World 1's engine start, run, close and restart; with a watchdog, a stopped run's report time.

In a fresh interpreter, as the studio or the CLI meets it (JSON on one line, ``RESULT {...}``):
    .venv/bin/python scripts/bench_world_one.py            # start, 2-step run, close, second start
    .venv/bin/python scripts/bench_world_one.py --stop 10  # and a run whose rank is SIGSTOPped, watchdog 10 s
docs/performance.md ("World 1 as a pool of one") ran it at a09b17a (world 1 in the engine's
process, without --stop) and after issue 32 (a pool of one spawned rank).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

STARTED = time.monotonic()
from magi2studio.engines.embedded.engine import EmbeddedEngine  # noqa: E402 - timed as the import
from magi2studio.vocabulary.layouts import parse_layout  # noqa: E402
from magi2studio.vocabulary.request import build_request  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stop", type=float, default=None, help="watchdog seconds; stop the rank of one more run")
    args = parser.parse_args()
    out = {"import_s": round(time.monotonic() - STARTED, 2), "load_average": os.getloadavg()[0]}
    layout = parse_layout("sp1-cfg1")
    request = build_request(prompt="a red kite over a windy beach", steps=2, seed=7)
    engine = EmbeddedEngine()

    def timed(name, action):
        began = time.monotonic()
        action()
        out[name] = round(time.monotonic() - began, 2)

    timed("start_s", lambda: engine.start(layout))
    timed("run_s", lambda: engine.generate(engine.plan(request, layout)))
    timed("close_s", engine.close)
    if args.stop:  # the second pool's watchdog; the first run's steps may be slow on a loaded machine
        engine.rank_timeout_s = args.stop
    timed("second_start_s", lambda: engine.start(layout))
    if args.stop:
        (pid,) = engine._pool.pids
        stopped: list[float] = []

        def stop_the_rank(progress) -> None:
            if not stopped:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(time.monotonic())

        try:
            engine.generate(engine.plan(request, layout), on_progress=stop_the_rank)
        except Exception as err:  # noqa: BLE001 - the watchdog's report is the measurement
            out["stopped_run_reported_after_s"] = round(time.monotonic() - stopped[0], 2)
            out["report"] = str(err)
    engine.close()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
