"""The progress line under Generate: the line, its bar, and the running job's stages with their state and time."""

from __future__ import annotations

import html
from collections.abc import Sequence

from ..jobs.stage_clock import StageRow


def progress_html(line: str, fraction: float | None = None, *, busy: bool = False, state: str = "",
                   stages: Sequence[StageRow] = ()) -> str:
    """The line under Generate; ``busy`` without a fraction draws a moving bar (a stage of unknown length);
    ``state`` (done, cancelled) is the line's ``data-state``, which the Results switch reads; ``stages`` the
    running job's stages, listed under the line."""
    bar = (f'<progress value="{fraction:.3f}" max="1"></progress>' if fraction is not None
           else '<progress max="1"></progress>' if busy else "")
    return (f'<div class="m2s-progress" data-state="{state}">{bar}<span>{html.escape(line)}</span>'
            f'{stage_list(stages)}</div>')


STAGE_MARKS = {"done": "✓", "running": "▶", "next": "○"}


def stage_seconds(seconds: float) -> str:
    if seconds < 0.05:
        return "<0.1 s"
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def stage_list(stages: Sequence[StageRow]) -> str:
    """Each stage with its state and time: done (took), running (so far), next (the learned time)."""
    items = []
    for row in stages:
        when = stage_seconds(row.seconds)
        when = f"~{when}" if row.state == "next" and not when.startswith("<") else when
        items.append(f'<li data-stage="{html.escape(row.stage)}" data-state="{row.state}">'
                     f'{STAGE_MARKS[row.state]} {html.escape(row.name)} · {when}</li>')
    return f'<ol class="m2s-stages" aria-label="stages">{"".join(items)}</ol>' if items else ""
