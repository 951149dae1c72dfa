"""The one error type for bad input: it names the field and the fix, never a traceback."""

from __future__ import annotations


class InputError(ValueError):
    """A request, layout or file the user gave is unusable.

    ``str(err)`` is one line: ``<field>: <problem>. Fix: <fix>``. The CLI prints it and
    exits 2; the studio shows it next to the field; nothing is written to disk.
    """

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}. Fix: {fix}")


class EngineError(RuntimeError):
    """The engine failed while running a valid request (CLI exit 1)."""


class Cancelled(RuntimeError):
    """The user stopped the run at a step boundary."""
