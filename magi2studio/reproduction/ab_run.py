"""One A/B run: a new engine, the spec's request, the engine closed; ``python -m magi2studio.reproduction.ab_run SPEC``.

:mod:`.ab` starts this module in a fresh interpreter per run (``isolation: process``), with the
side's env set before anything is imported, or calls :func:`run_spec` in its own process.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..vocabulary.layouts import parse_layout
from ..vocabulary.request import build_request


def run_spec(spec: dict[str, Any], on_line: Callable[[dict], None], cancel: threading.Event | None) -> dict[str, Any]:
    """Start a new engine, run the spec's request, close the engine; return what the report needs."""

    from ..engines import get_engine
    from ..run_folder.runs import execute

    request = build_request(**spec["request"])
    layout = parse_layout(spec["layout"])

    def relay(progress) -> None:
        on_line({"event": "progress", "stage": progress.stage, "step": progress.step, "total": progress.total,
                 "message": progress.message})

    engine = get_engine(spec["engine"], **spec["engine_options"])
    try:
        t0 = time.perf_counter()
        engine.start(layout)  # timed here: the cost of a new engine per run
        start_ms = (time.perf_counter() - t0) * 1e3
        run = execute(engine, request, layout, Path(spec["out"]), on_progress=relay, cancel=cancel,
                      extra=spec["extra"])
    finally:
        engine.close()
    timing = run.manifest["timing"]
    return {"event": "done", "run": run.path.name, "hashes": run.manifest["hashes"],
            "gate_ms": timing["stages"].get("preview", {}).get("gate_ms"), "engine_start_ms": start_ms}


def child_main(spec_text: str) -> int:
    """In the fresh process: run the spec, printing progress and the result as JSON lines."""

    result = run_spec(json.loads(spec_text), lambda line: print(json.dumps(line), flush=True), None)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 2:
        try:
            sys.exit(child_main(sys.argv[1]))
        except Exception as err:  # the parent reads this line as the run's failure
            print(f"{err.__class__.__name__}: {err}", file=sys.stderr)
            sys.exit(1)
    print("usage: python -m magi2studio.reproduction.ab_run SPEC_JSON (used by magi2studio ab)", file=sys.stderr)
    sys.exit(2)
