"""Batches in the studio: the Generate tab's "Batch and sweeps" form, and a batch's grid of posters.

The form takes the Generate form's request as its base and :mod:`..jobs.batches` expands it
(count × seed policy, a prompt per line, a grid over seed × steps × layout × deterministic).
Every run is planned before any is queued; the slot then queues them as one batch or none.
A run of a batch records the batch id and its label in its manifest's ``studio`` block, so
Results (the run shown) and History (the run picked) show the batch's finished runs as a grid of
posters with what varies under each; picking one opens it in Results.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from ..engines.base import Plan
from ..errors import InputError
from ..jobs.batches import SEED_POLICIES, expand, parse_spec
from ..run_folder.runs import is_complete, load_run
from ..vocabulary.layouts import parse_layout
from ..vocabulary.request import RANDOM_SEED, build_request
from . import form as F
from .context import StudioContext
from .served import cached

BATCH_FIELDS = ("count", "seed_policy", "prompts", "seeds", "steps", "layouts", "deterministic")


@dataclass(frozen=True)
class BatchRun:
    """One finished run of a batch, as its grid shows it."""

    path: Path
    ticket: int
    label: str


def plan_batch(form_values: dict[str, Any], batch_values: dict[str, Any],
               ctx: StudioContext) -> list[tuple[Plan, str]]:
    """The batch's (plan, label) pairs, every one planned; the first refusal is raised (nothing is queued then)."""
    spec = parse_spec(**batch_values)
    values = dict(form_values)
    if spec.prompts and not str(values.get("prompt") or "").strip():
        values["prompt"] = spec.prompts[0]  # the base request needs a prompt; each line replaces it
    base_plan = F.plan_from_form(values, ctx.capabilities, ctx.engine, ctx.uploads)
    base = base_plan.request.model_dump(mode="json")
    if base_plan.resolved.get("seed_asked") == RANDOM_SEED:
        base["seed"] = RANDOM_SEED  # expand draws it: once for fixed and increment, per run for random
    plans = []
    for item in expand(base, base_plan.layout.name, spec):
        plan = ctx.engine.plan(build_request(**item.fields), parse_layout(item.layout))
        plans.append((plan.with_seed_drawn() if item.seed_drawn else plan, item.label))
    return plans


def batch_of(path: str | Path | None) -> str | None:
    """The batch id a run folder's manifest records, or None."""
    try:
        studio = load_run(Path(path or "")).manifest.get("studio") or {}
    except InputError:
        return None
    batch = studio.get("batch")
    return batch if isinstance(batch, str) else None


def batch_runs(outputs_root: Path, batch: str) -> list[BatchRun]:
    """The batch's complete run folders under the outputs root, in ticket order (the order they were queued)."""
    found = []
    for folder in Path(outputs_root).iterdir():
        if folder.name.startswith(".") or not is_complete(folder):
            continue
        try:
            studio = json.loads((folder / "manifest.json").read_text(encoding="utf-8")).get("studio") or {}
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(studio, dict) and studio.get("batch") == batch:
            found.append(BatchRun(folder, int(studio.get("ticket") or 0), str(studio.get("label") or "")))
    return sorted(found, key=lambda run: run.ticket)


def build_form(ctx: StudioContext, panel) -> None:
    """The "Batch and sweeps" accordion (inside the Generate tab's form column); wired once the form exists.
    ``panel`` is the job list (:class:`.job_panel.JobPanel`): the batch's jobs belong to the page's browser."""
    with gr.Accordion("Batch and sweeps: several runs from this form", open=False, elem_id="batch-accordion"):
        gr.Markdown("The form above is the base run. Every combination below is queued as one batch, "
                    "all of it or none; blank fields keep the form's value.")
        with gr.Row():
            count = gr.Number(value=1, label="Runs of each combination", precision=0, minimum=1,
                              elem_id="batch-count", min_width=120)
            policy = gr.Radio(list(SEED_POLICIES), value="fixed", label="Seed policy",
                              info="fixed: the form's seed; increment: seed, seed+1, …; random: drawn per run",
                              elem_id="batch-seed-policy")
        prompts = gr.Textbox(label="Prompts, one per line (a run each; blank: the form's prompt)", lines=3,
                             elem_id="batch-prompts")
        with gr.Row():
            seeds = gr.Textbox(label="Grid: seeds", placeholder="e.g. 1,2,3", elem_id="batch-grid-seeds",
                               min_width=100)
            steps = gr.Textbox(label="Grid: steps", placeholder="e.g. 4,8", elem_id="batch-grid-steps",
                               min_width=100)
            layouts = gr.Textbox(label="Grid: layouts", placeholder="e.g. sp1-cfg1,sp2-cfg1",
                                 elem_id="batch-grid-layouts", min_width=100)
            deterministic = gr.Textbox(label="Grid: deterministic", placeholder="on,off",
                                       elem_id="batch-grid-deterministic", min_width=100)
        queue_batch = gr.Button("Queue batch", elem_id="batch-queue")
        notice = gr.Markdown(elem_id="batch-notice")
    batch_inputs = [count, policy, prompts, seeds, steps, layouts, deterministic]

    def queue_it(request: gr.Request, *values):
        form_values = dict(zip(F.FIELDS, values[:len(F.FIELDS)]))
        batch_values = dict(zip(BATCH_FIELDS, values[len(F.FIELDS):]))
        try:
            ctx.slot.check_room()
            jobs = ctx.slot.submit_batch(plan_batch(form_values, batch_values, ctx), panel.owner(request),
                                         source=panel.source(request))
        except InputError as err:
            return f"✗ {err}"
        return (f"queued {len(jobs)} run{'s' if len(jobs) > 1 else ''} as one batch: #{jobs[0].ticket}"
                + (f" to #{jobs[-1].ticket}" if len(jobs) > 1 else "") + " (the job list follows them)")

    ctx.defer(lambda: queue_batch.click(queue_it, [ctx.form.fields[name] for name in F.FIELDS] + batch_inputs,
                                        notice, api_visibility="private", show_progress="hidden"))


def build_grid(ctx: StudioContext, run_path: gr.State, elem_id: str) -> None:
    """A grid of the finished runs of the batch of the run in ``run_path`` (hidden for a single run); picking
    a poster opens that run in Results."""
    with gr.Column(visible=False, elem_id=elem_id) as column:
        caption = gr.Markdown(elem_id=f"{elem_id}-caption")
        grid = gr.Gallery(columns=6, height="auto", allow_preview=False, object_fit="cover", show_label=False,
                          elem_id=f"{elem_id}-gallery")
    shown = gr.State([])

    def refresh(path: str | None):
        batch = batch_of(path)
        if batch is None:
            return gr.Column(visible=False), "", [], []
        members = [(run, poster) for run in batch_runs(ctx.outputs_root, batch)
                   if (poster := cached(run.path / "poster.jpg", ctx.outputs_root))]
        queued = [job for job in ctx.slot.snapshot().jobs if job.batch == batch]
        pending = sum(job.pending for job in queued)
        waiting = f"; {pending} still waiting or running" if pending else ""
        return (gr.Column(visible=True), f"**Batch {batch}**: {len(members)} finished run"
                f"{'' if len(members) == 1 else 's'}{waiting}. Pick one to open it.",
                [(poster, run.label) for run, poster in members], [str(run.path) for run, _ in members])

    def open_picked(paths: list[str], event: gr.SelectData, request: gr.Request):
        try:
            run = load_run(Path(paths[event.index]))
        except (IndexError, InputError):
            raise gr.Error("run: that run folder is gone. Fix: pick another, or refresh History",
                           print_exception=False) from None
        ctx.results.opened(request)
        return {**ctx.results.values_for(run), ctx.tabs: gr.Tabs(selected="results")}

    run_path.change(refresh, run_path, [column, caption, grid, shown], api_visibility="private",
                    show_progress="hidden")
    ctx.defer(lambda: grid.select(open_picked, shown, [*ctx.results.components, ctx.tabs],
                                  api_visibility="private", show_progress="hidden"))

