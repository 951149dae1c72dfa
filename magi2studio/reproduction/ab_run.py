"""One A/B run, in either isolation; ``python -m magi2studio.reproduction.ab_run SPEC`` is the fresh-process side.

:func:`run_one_in_child` starts this module in a fresh interpreter (``isolation: process``), with
the side's env set before anything is imported, and relays its lines; :func:`run_one_restarted`
calls :func:`run_spec` in this process with the side's env set (``isolation: restart``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import Cancelled, EngineError, InputError
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


def run_one_in_child(spec: dict[str, Any], env: dict[str, str], on_line: Callable[[dict], None],
                     cancel: threading.Event | None) -> dict[str, Any]:
    """Start a fresh interpreter for one run and relay its progress lines."""

    child_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "magi2studio.reproduction.ab_run", json.dumps(spec)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env)
    stderr_lines: list[str] = []
    drain = threading.Thread(target=lambda: stderr_lines.extend(process.stderr), daemon=True)
    drain.start()
    result: dict[str, Any] | None = None
    try:
        for line in process.stdout:
            if cancel is not None and cancel.is_set():
                process.terminate()
                raise Cancelled("A/B stopped by the user")
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("event") == "done":
                result = message
            else:
                on_line(message)
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        drain.join(timeout=5)
    if process.returncode != 0 or result is None:
        tail = "".join(stderr_lines).strip().splitlines()[-1:] or [f"exit status {process.returncode}"]
        raise EngineError(f"run process failed: {tail[0]}")
    return result


@contextmanager
def env_overrides(env: dict[str, str]):
    """Set ``env`` in this process for the block, then put every variable back as it was."""

    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_one_restarted(spec: dict[str, Any], env: dict[str, str], on_line: Callable[[dict], None],
                      cancel: threading.Event | None) -> dict[str, Any]:
    """In this process, with the side's env set, on a new engine (what an engine reads at start sees it)."""

    try:
        with env_overrides(env):
            return run_spec(spec, on_line, cancel)
    except (InputError, Cancelled):
        raise
    except Exception as err:  # reported as this run's failure; the other runs go on
        raise EngineError(f"{err.__class__.__name__}: {err}") from err


if __name__ == "__main__":
    if len(sys.argv) == 2:
        try:
            sys.exit(child_main(sys.argv[1]))
        except Exception as err:  # the parent reads this line as the run's failure
            print(f"{err.__class__.__name__}: {err}", file=sys.stderr)
            sys.exit(1)
    print("usage: python -m magi2studio.reproduction.ab_run SPEC_JSON (used by magi2studio ab)", file=sys.stderr)
    sys.exit(2)
