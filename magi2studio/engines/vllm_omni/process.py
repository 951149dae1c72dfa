"""The engine child process: one per started layout, supervised so it cannot take the studio down.

The child is spawned (never forked), becomes its own process-group leader (so the vLLM-Omni
workers it starts die with it), and writes its stdout/stderr, native libraries included,
to a log file. Parent and child speak over a pipe:

    child -> ("ready", info) once started
    parent -> ("call", payload)      child -> ("event", data)* then ("result", data)
                                     or ("error", kind, message)
    parent -> ("stop",)

A child that dies, or answers nothing within the timeout, is killed with its whole process
group and reported as an :class:`EngineError` carrying the tail of its log.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import Cancelled, EngineError, InputError

LOG_TAIL_LINES = 40
_ERRORS = {"InputError": InputError, "Cancelled": Cancelled}


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(empty log)"


def _child_main(target: str, conn, config: dict[str, Any], log_path: str, env: dict[str, str]) -> None:
    os.setsid()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.update(env)
    module, _, function = target.partition(":")
    try:
        getattr(importlib.import_module(module), function)(conn, config)
    except BaseException as err:  # report, then exit non-zero: the parent owns the decision
        traceback.print_exc()
        try:
            conn.send(("error", "EngineError", f"{type(err).__name__}: {err}"))
        except OSError:
            pass
        os._exit(1)


def serve(conn, ready_info: dict[str, Any], handle: Callable[[dict[str, Any], Callable[[Any], None]], Any]) -> None:
    """The child's loop: announce readiness, then answer calls until told to stop."""

    conn.send(("ready", ready_info))
    while True:
        message = conn.recv()
        if message[0] == "stop":
            return
        payload = message[1]
        try:
            result = handle(payload, lambda data: conn.send(("event", data)))
        except (InputError, Cancelled) as err:
            conn.send(("error", type(err).__name__, err.args[0] if isinstance(err, Cancelled) else
                       (err.field, err.problem, err.fix)))
            continue
        except Exception as err:
            traceback.print_exc()
            conn.send(("error", "EngineError", f"{type(err).__name__}: {err}"))
            continue
        conn.send(("result", result))


class EngineProcess:
    """Parent-side handle on one engine child."""

    def __init__(self, target: str, config: dict[str, Any], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.target = target
        self.config = config
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.info: dict[str, Any] = {}
        self._process: multiprocessing.Process | None = None
        self._conn = None

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def start(self, timeout_s: float) -> dict[str, Any]:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._process = context.Process(target=_child_main, name="magi2studio-engine",
                                        args=(self.target, child, self.config, str(self.log_path), self.env))
        self._process.start()
        child.close()
        self._conn = parent
        message = self._receive(timeout_s, "start")
        if message[0] != "ready":
            self._fail(f"engine child sent {message[0]!r} instead of ready")
        self.info = message[1]
        return self.info

    def call(self, payload: Any, timeout_s: float, on_event: Callable[[Any], None] | None = None,
             idle_timeout_s: float | None = None) -> Any:
        """Send one call; ``timeout_s`` bounds the whole call, ``idle_timeout_s`` the wait between
        two events (the step watchdog: each step end and stage sends one)."""

        if not self.alive:
            self._fail("engine process is not running")
        self._conn.send(("call", payload))
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if idle_timeout_s is not None and idle_timeout_s < left:
                message = self._receive(idle_timeout_s, "a request", silence=(
                    f"no step boundary or stage event for {idle_timeout_s:g} s (the step watchdog, "
                    "$MAGI2STUDIO_STEP_TIMEOUT_S)"))
            else:
                message = self._receive(left, "a request")
            if message[0] == "event":
                if on_event is not None:
                    on_event(message[1])
                continue
            if message[0] == "result":
                return message[1]
            self._fail(f"engine child sent {message[0]!r}")

    def _receive(self, timeout_s: float, what: str, silence: str | None = None) -> tuple:
        """The next message; a death is reported as a death, ``silence`` (the watchdog's words) only a timeout."""

        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            if self._conn.poll(min(0.2, max(deadline - time.monotonic(), 0.0))):
                try:
                    message = self._conn.recv()
                except EOFError:
                    self._crashed(what)
                if message[0] == "error":
                    self._raise_error(message)
                return message
            if not self.alive:
                if self._conn.poll(0):
                    continue
                self._crashed(what)
            if time.monotonic() >= deadline:
                self.kill()
                gave_no_answer = f"{what}: {silence}" if silence else f"{what} within {timeout_s:g} s"
                raise EngineError(f"engine process gave no answer to {gave_no_answer} and was killed "
                                  "with its workers (the next run starts a fresh one). "
                                  f"Log tail ({self.log_path}):\n{log_tail(self.log_path)}")

    def _raise_error(self, message: tuple) -> None:
        kind, detail = message[1], message[2]
        if kind == "InputError":
            raise InputError(*detail)
        if kind == "Cancelled":
            raise Cancelled(detail)
        self._process.join(1.0)  # a child failing at start exits right after sending this
        if not self._process.is_alive():
            self.kill()
        raise EngineError(f"{detail}\nLog tail ({self.log_path}):\n{log_tail(self.log_path)}")

    def _crashed(self, what: str) -> None:
        self._process.join(5.0)
        code = self._process.exitcode
        self.kill()
        raise EngineError(f"engine process died during {what} (exit code {code}). "
                          f"Log tail ({self.log_path}):\n{log_tail(self.log_path)}")

    def _fail(self, problem: str) -> None:
        self.kill()
        raise EngineError(f"{problem}. Log tail ({self.log_path}):\n{log_tail(self.log_path)}")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the child to stop; kill its process group if it does not."""

        if self.alive:
            try:
                self._conn.send(("stop",))
            except OSError:
                pass
            self._process.join(timeout_s)
        self.kill()

    def kill(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.pid is not None:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # the child and the workers it started
            except (ProcessLookupError, PermissionError):
                pass
        process.join(5.0)
        if self._conn is not None:
            self._conn.close()
            self._conn = None
