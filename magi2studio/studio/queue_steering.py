"""Steering the queue from the job list: pause and resume the runner, and edit a waiting job's request.

Pause is the queue file's (``magi2studio queue pause`` sees the same flag, and it survives a
restart): no waiting job starts; the running one finishes. It steers the one runner every page
shares, so any page may pause or resume it; a job's own actions (move, edit, cancel) stay its
owner's (:meth:`.job_panel.JobPanel.owns`). "edit" fills the Generate form with the waiting job's
request and shows a bar: "Save to #N" plans the form again at the door and replaces the job's
request in the file (refused once the job has started), "Stop editing" leaves the job as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from ..errors import InputError
from ..jobs.jobqueue import JobRecord
from ..vocabulary.layouts import parse_layout
from ..vocabulary.request import RANDOM_SEED
from . import form as F
from .context import StudioContext


def edit_values(record: JobRecord) -> list[Any]:
    """The Generate form's values (in :data:`form.FIELDS` order) for a waiting job's stored request."""
    request = dict(record.request)
    if record.seed_drawn:
        request["seed"] = RANDOM_SEED  # the form shows what was asked; saving draws again
    return F.values_from_manifest({"request": request, "layout": parse_layout(record.layout).as_dict()})


@dataclass
class Steering:
    """The pause and resume buttons, and the edit bar with the id of the job being edited."""

    pause: gr.Button
    resume: gr.Button
    edit_bar: gr.Row
    edit_text: gr.Markdown
    editing: gr.State

    @property
    def edit_outputs(self) -> list[Any]:
        return [self.edit_bar, self.edit_text, self.editing]

    def start_edit(self, ctx: StudioContext, record: JobRecord) -> dict[Any, Any]:
        """The updates that load a waiting job into the form and show the edit bar."""
        fields = [ctx.form.fields[name] for name in F.FIELDS]
        return {**dict(zip(fields, edit_values(record))), self.edit_bar: gr.Row(visible=True),
                self.edit_text: f"Editing waiting job **#{record.ticket}**: change the form, then save.",
                self.editing: record.id}


def build(ctx: StudioContext, panel) -> Steering:
    """Inside the job list's group: the buttons and the bar; the events are wired once the form exists."""
    with gr.Row():
        pause = gr.Button("Pause queue", size="sm", elem_id="queue-pause", min_width=120)
        resume = gr.Button("Resume queue", size="sm", elem_id="queue-resume", min_width=120)
    with gr.Row(visible=False, elem_id="job-edit-bar") as edit_bar:
        edit_text = gr.Markdown(elem_id="job-edit-text")
        save = gr.Button("Save to the job", variant="primary", size="sm", elem_id="job-edit-save", scale=0,
                         min_width=150)
        stop = gr.Button("Stop editing", size="sm", elem_id="job-edit-stop", scale=0, min_width=120)
    steering = Steering(pause, resume, edit_bar, edit_text, gr.State(None))

    def set_paused(paused: bool, request: gr.Request):
        try:
            ctx.slot.steer("set_paused", paused)
        except InputError as err:
            return panel.render(request), f"✗ {err}"
        return panel.render(request), ("paused: no waiting job starts; the running one finishes" if paused
                                       else "resumed: waiting jobs start in order")

    def save_edit(request: gr.Request, job_id: str | None, *values):
        try:
            record = ctx.slot.snapshot().find(job_id or "")
            if not panel.owns(record, request):
                raise InputError("job", f"#{record.ticket} was queued by another browser or client",
                                 "edit your own jobs (the rows with buttons)")
            plan = F.plan_from_form(dict(zip(F.FIELDS, values)), ctx.capabilities, ctx.engine, ctx.uploads)
            ctx.slot.steer("edit", record.id, plan.request.model_dump(mode="json"), plan.layout.name,
                           plan.resolved.get("seed_asked") == RANDOM_SEED)
            ctx.slot.replan(record.id, plan)
            panel.forget_estimate(record.id)
        except InputError as err:
            return panel.render(request), f"✗ {err}", gr.Row(), job_id
        return (panel.render(request), f"#{record.ticket} edited: it runs as the form says now",
                gr.Row(visible=False), None)

    def wire() -> None:
        def pause_clicked(request: gr.Request):
            return set_paused(True, request)

        def resume_clicked(request: gr.Request):
            return set_paused(False, request)

        pause.click(pause_clicked, None, [panel.table, panel.notice], api_visibility="private", show_progress="hidden")
        resume.click(resume_clicked, None, [panel.table, panel.notice], api_visibility="private",
                     show_progress="hidden")
        save.click(save_edit, [steering.editing, *[ctx.form.fields[name] for name in F.FIELDS]],
                   [panel.table, panel.notice, edit_bar, steering.editing], api_visibility="private",
                   show_progress="hidden")
        stop.click(lambda: (gr.Row(visible=False), None), None, [edit_bar, steering.editing],
                   api_visibility="private", show_progress="hidden")

    ctx.defer(wire)
    return steering
