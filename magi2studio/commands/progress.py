"""A console progress bar fed by the engine's Progress events (step i/N, stage, ETA)."""

from __future__ import annotations

import sys

from tqdm import tqdm

from ..engines.base import Progress


class ConsoleProgress:
    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stderr
        self._bar: tqdm | None = None
        self._stage: str | None = None

    def __enter__(self) -> ConsoleProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __call__(self, event: Progress) -> None:
        if event.step is None:
            if event.stage != self._stage:
                self.close()
                self._stage = event.stage
                print(f"[{event.stage}] {event.message}".rstrip(), file=self.stream)
            return
        if self._bar is None or self._stage != event.stage:
            self.close()
            self._stage = event.stage
            self._bar = tqdm(total=event.total, desc=event.stage, unit="step", file=self.stream,
                             dynamic_ncols=True)
        self._bar.update(event.step + 1 - self._bar.n)
