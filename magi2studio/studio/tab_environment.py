"""Environment: what ``magi2studio doctor`` reports (platform, devices, versions, the
deterministic environment, the weights check when a checkpoint root is set), plus the
engine this studio is serving."""

from __future__ import annotations

import dataclasses
import html
import logging

import gradio as gr

from .. import doctor
from .context import StudioContext

log = logging.getLogger(__name__)
TAB_ID = "environment"


def build(ctx: StudioContext) -> None:
    with gr.Tab("Environment", id=TAB_ID) as tab:
        refresh = gr.Button("Refresh", size="sm", scale=0)
        serving = gr.Markdown(elem_id="environment-engine")
        lines = gr.HTML(elem_id="environment-lines")
        with gr.Accordion("The report as JSON", open=False):
            report = gr.JSON(label="magi2studio doctor --json", elem_id="environment-report")

    def load():
        caps = ctx.capabilities
        engine_line = (f"**Serving:** {caps.engine} on {caps.platform}, devices {', '.join(caps.devices) or 'none'}, "
                       f"layout {ctx.engine.layout.name if ctx.engine.layout else 'not started'}.\n\n"
                       + "\n\n".join(f"- {note}" for note in caps.notes))
        try:
            found = doctor.collect()
            rendered = doctor.render(found)
        except Exception as err:  # doctor's probes are defensive; this keeps the page up regardless
            log.exception("doctor failed")
            raise gr.Error(f"doctor failed: {type(err).__name__}: {err}", print_exception=False) from None
        text = "<pre class='m2s-doctor'>" + html.escape("\n".join(rendered)) + "</pre>"
        return engine_line, text, {"studio_engine": dataclasses.asdict(caps), **found}

    for trigger in (tab.select, refresh.click):
        trigger(load, None, [serving, lines, report], api_visibility="private")
