"""The long tabs' background jobs (Reproduce, A/B): one per session, followed as events, stoppable.

A job runs in a worker thread and reports through ``emit(kind, item, payload)``; its follower
sees those events, then exactly one terminal event: ``("finished", result, None)``,
``("stopped", message, None)`` for the tab's stop exceptions, or ``("error", message, None)``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import describe_os_error

TERMINAL = ("finished", "stopped", "error")
Emit = Callable[[str, Any, Any], None]


class BackgroundJobs:
    """Each session's running job of one tab, by owner (the Gradio session hash)."""

    def __init__(self, name: str, stop_errors: tuple[type[BaseException], ...]) -> None:
        self.name = name
        self.stop_errors = stop_errors
        self._cancels: dict[str, threading.Event] = {}

    def start(self, owner: str, job: Callable[[threading.Event, Emit], Any],
              cleanup: Callable[[], None] | None = None) -> Iterator[tuple[str, Any, Any]]:
        """Run ``job(cancel, emit)`` in a thread; return the iterator of its events, terminal last."""
        events: queue.Queue = queue.Queue()
        cancel = threading.Event()
        self._cancels[owner] = cancel

        def work() -> None:
            try:
                events.put(("finished", job(cancel, lambda kind, item, payload: events.put((kind, item, payload))),
                            None))
            except self.stop_errors as err:
                events.put(("stopped", str(err), None))
            except OSError as err:
                events.put(("error", describe_os_error(err), None))
            except Exception as err:  # shown to the user; nothing else reads this thread
                events.put(("error", f"{err.__class__.__name__}: {err}", None))
            finally:
                if cleanup is not None:
                    cleanup()

        threading.Thread(target=work, name=f"{self.name}-{owner}", daemon=True).start()
        return self._follow(owner, events)

    def _follow(self, owner: str, events: queue.Queue) -> Iterator[tuple[str, Any, Any]]:
        while True:
            event = events.get()
            if event[0] in TERMINAL:
                self._cancels.pop(owner, None)
            yield event
            if event[0] in TERMINAL:
                return

    def stop(self, owner: str) -> bool:
        """Ask the owner's running job to stop; False when nothing of theirs runs."""
        cancel = self._cancels.get(owner)
        if cancel is None:
            return False
        cancel.set()
        return True
