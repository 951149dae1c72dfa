"""The live preview beside the progress: the running job's newest picture, refreshed by a timer.

The slot keeps the newest picture's bytes (:class:`LatestPreview`, a GIF of a few KB) when a
step's progress names one, so the engine may delete its folder and a reloaded page (which polls
the slot, not the event stream) shows it again. Shown inline as a data URI: no file is served.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from ..engines.base import Progress

POLL_S = 1.0


@dataclass(frozen=True)
class LatestPreview:
    job_id: str
    stage: str
    step: int
    total: int
    gif: bytes


def remember(job_id: str, event: Progress) -> LatestPreview | None:
    """The picture a step's progress names, read now (the engine removes it after the run)."""

    if not event.preview or event.step is None:
        return None
    try:
        data = Path(event.preview).read_bytes()
    except OSError:
        return None
    return LatestPreview(job_id, event.stage, event.step, event.total or 0, data)


def preview_html(latest: LatestPreview | None) -> str:
    if latest is None:
        return '<div class="m2s-live-preview" data-empty="1"></div>'
    source = "data:image/gif;base64," + base64.b64encode(latest.gif).decode("ascii")
    caption = f"job {latest.job_id}: {latest.stage} step {latest.step + 1}/{latest.total} (estimate)"
    return (f'<figure class="m2s-live-preview" data-job="{html.escape(latest.job_id)}" data-step="{latest.step}">'
            f'<img id="live-preview-image" src="{source}" alt="live preview, {html.escape(caption)}" '
            f'style="image-rendering: pixelated; max-width: 100%"><figcaption>{html.escape(caption)}</figcaption>'
            f'</figure>')


def build(slot) -> gr.HTML:
    """The preview's place (call it where it should sit) and its own timer."""

    view = gr.HTML(preview_html(slot.latest_preview), elem_id="live-preview")
    timer = gr.Timer(POLL_S)
    timer.tick(lambda: preview_html(slot.latest_preview), None, view, queue=False, show_progress="hidden")
    return view
