"""Generate: the request form, the layout check, engine status, the queue and progress.

The Generate button's event is also the public API endpoint ``/generate``: page and
gradio_client go through the same function, so they get the same validation.

About 400 lines on purpose: :func:`build` makes the form's components and wires their events
inside one Gradio Blocks context; the endpoint's shape is :mod:`.endpoint`, the form's values
:mod:`.form`, the layout control :mod:`.layout_picker`, the job list :mod:`.job_panel`.
"""

from __future__ import annotations

import html
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from ..errors import InputError
from ..run_folder.runs import load_run
from ..vocabulary.request import RANDOM_SEED, draw_seed
from ..vocabulary.tiers import TIERS
from . import form as F
from . import batch_panel, job_panel, live_preview, session_state
from . import layout_picker as LP
from .context import StudioContext
from .endpoint import one_parameter_per_field, uploads_only
from .number_field import optional_whole_number
from .progress_line import progress_html

log = logging.getLogger(__name__)

TAB_ID = "generate"
CANCELLING = "cancelling: the run stops at its next step or stage boundary"
REFUSED = "refused: the marked field says why and how to fix it"


@dataclass
class GenerateForm:
    """The form's components: ``fields`` in :data:`form.FIELDS` order, ``errors`` per box."""

    fields: dict[str, gr.components.Component]
    errors: dict[str, gr.Markdown]
    progress: gr.HTML

    def values_from_manifest(self, manifest: dict[str, Any]) -> list[Any]:
        """Form values (in ``fields`` order) that repeat a run: the replay path."""
        return F.values_from_manifest(manifest)


def _fixed(line: str):
    """A field changed: its box's refusal goes, and the progress line's "refused" with it."""
    return _error_line(""), _error_line(""), progress_html("idle") if REFUSED in (line or "") else gr.HTML()


def _ended_line(record, in_results: bool = False) -> str:
    """The tick's last line for the job it followed after a reload: how it ended. The tab is not switched;
    the run is in Results (``in_results``) unless the person opened another since, then *open* shows it."""
    if record is None:
        return progress_html("idle")
    took = f" in {record.finished - record.started:.1f} s" if record.finished and record.started else ""
    if record.state == "done":
        where = "in Results" if in_results else "'open' in the job list shows it"
        return progress_html(f"#{record.ticket} done{took}: {record.run} ({where})", 1.0, state="done-kept")
    return progress_html(f"#{record.ticket} {record.state}" + (f": {record.message}" if record.message else ""),
                         state="cancelled" if record.state == "cancelled" else record.state)


def _results_if_done(line: str) -> gr.Tabs:
    """After a page's run: to Results when it made one; a cancel ends the handler too, and stays here."""
    return gr.Tabs(selected="results") if 'data-state="done"' in (line or "") else gr.Tabs()


def _error_line(text: str, box: str | None = None) -> gr.Markdown:
    """An error line's value; with ``box``, the line itself (built once, next to its fields).
    A refusal (``✗ ...``) is marked as one (red, ``role=alert``); a note (a prompt file loaded) stays plain."""
    where = {"elem_id": f"error-{box}", "elem_classes": ["m2s-error"]} if box else {}
    if text.startswith("✗"):
        text = f'<span class="m2s-refusal" role="alert">{html.escape(text)}</span>'
    return gr.Markdown(value=text, visible=bool(text), **where)


def _whole_field(name: str, placeholder: str, value: int | None = None, **options: Any) -> gr.Number:
    """An optional whole number of the request: blank means the engine's default (shown as the placeholder)."""
    return optional_whole_number(value, label=F.label(name), placeholder=placeholder, **options)


def build(ctx: StudioContext) -> None:
    caps = ctx.capabilities
    first_tier = _first_runnable_tier(caps)
    with gr.Tab("Generate", id=TAB_ID):
        status = gr.Markdown(_status_text(ctx), elem_id="engine-status")
        with gr.Row():
            with gr.Column(scale=3):
                mode = gr.Radio([("T2VA: text to video + audio", "t2va"), ("I2VA: first frame + text", "i2va")],
                                value=F.default("mode"), label=F.label("mode"), elem_id="mode")
                image = uploads_only(gr.File(label=f"{F.label('image')} ({F.help_text('image')})", visible=False,
                                             elem_id="image-file"), "image")
                image_preview = gr.Image(label="First frame", visible=False, interactive=False, height=160)
                errors = {"image": _error_line("", "image")}
                prompt = gr.Textbox(label=F.label("prompt"), lines=8, max_lines=24, elem_id="prompt",
                                    placeholder="Describe the clip, or load one of the published prompt files "
                                                "(Ctrl+Enter generates)")
                errors["prompt"] = _error_line("", "prompt")  # under the prompt: an empty prompt is its error
                prompt_file = uploads_only(gr.File(label=f"Load a {F.label('prompt_file').lower()} "
                                                         f"({F.help_text('prompt_file')})",
                                                   elem_id="prompt-file", height=170), "prompt_file")
                # Under the prompt, so it stays above the fold at 1440x900 with the layout's verdict.
                with gr.Row():
                    generate = gr.Button("Generate", variant="primary", elem_id="generate")
                    cancel = gr.Button("Cancel", variant="stop", elem_id="cancel", interactive=False)
                errors["general"] = _error_line("", "general")
                progress = gr.HTML(progress_html("idle"), elem_id="progress")
                live_preview.build(ctx.slot)
                with gr.Accordion(F.label("negative_prompt"), open=False, elem_id="negative-accordion"):
                    negative = gr.Textbox(label=F.label("negative_prompt"), lines=2, elem_id="negative-prompt",
                                          placeholder=F.help_text("negative_prompt"))
                panel = job_panel.build(ctx)  # the job list fills the column's free space
                batch_panel.build_form(ctx, panel)
            with gr.Column(scale=2):
                with gr.Row(equal_height=True):
                    seed = gr.Number(value=F.default("seed"), label=f"{F.label('seed')} (-1: random)",
                                     precision=None, elem_id="seed", scale=2, min_width=120)
                    with gr.Column(scale=1, min_width=150):
                        new_seed = gr.Checkbox(value=False, label="new seed every run", elem_id="new-seed",
                                               container=False)
                        random_seed = gr.Button("random seed", size="sm")
                with gr.Row():
                    steps = _whole_field("steps", f"blank: engine default, {caps.default_steps}", caps.demo_steps,
                                         elem_id="steps")
                    refiner_steps = _whole_field("refiner_steps",
                                                 f"blank: engine default, {caps.default_refiner_steps}",
                                                 elem_id="refiner-steps")
                    preview_every = _whole_field("preview_every", "blank: about 10 a run; 0: off",
                                                elem_id="preview-every")
                errors["sampling"] = _error_line("", "sampling")
                tier = gr.Radio([(_tier_label(name, caps.tiers.get(name)), name) for name in TIERS],
                                value=first_tier, label=F.label("tier"), elem_id="tier")
                unavailable = [f"{name}: {reason}" for name, reason in caps.tiers.items() if reason]
                gr.Markdown("\n\n".join(f"⊘ {line}" for line in unavailable), visible=bool(unavailable))
                errors["tier"] = _error_line("", "tier")
                # The layout's one verdict: the live check, and a Generate refusal of the layout.
                layout = LP.build_control(ctx, tier, first_tier)
                preset, sp, cfg, ep, layout_line = *layout.fields, layout.verdict
                errors["layout"] = layout_line
                if caps.demo_steps is not None:  # below the layout's verdict, which stays above the fold
                    gr.Markdown(_demo_line(caps), elem_id="demo-defaults")
                with gr.Accordion("Advanced: guidance, compile mode, determinism, output size", open=False,
                                  elem_id="advanced"):
                    with gr.Row():
                        video_cfg = gr.Number(value=F.default("video_cfg"), label=F.label("video_cfg"),
                                              info=F.help_text("video_cfg"), elem_id="video-cfg")
                        audio_cfg = gr.Number(value=F.default("audio_cfg"), label=F.label("audio_cfg"),
                                              info=F.help_text("audio_cfg"), elem_id="audio-cfg")
                    with gr.Row():
                        compile_label = f"{F.label('compile')} (engine default: {caps.default_compile})"
                        compile_mode = gr.Dropdown([F.ENGINE_DEFAULT, *caps.compile_modes], value=F.ENGINE_DEFAULT,
                                                   label=compile_label, info=F.help_text("compile"), elem_id="compile")
                        deterministic = gr.Checkbox(value=F.default("deterministic"), label=F.label("deterministic"),
                                                    info=F.help_text("deterministic"), elem_id="deterministic")
                    with gr.Row():
                        output_width = _whole_field("output_width", "the tier's generated size",
                                                   elem_id="output-width")
                        output_height = _whole_field("output_height", "the tier's generated size",
                                                    elem_id="output-height")
                errors["advanced"] = _error_line("", "advanced")
        session_state.build(ctx, panel)
        # Inside the Tab: a component between two tabs shifts the later tabs' order in Gradio 6.
        timer = gr.Timer(2.0)
        # Hidden: the /cancel_job endpoint's input (a component outside a Tab relabels the tabs).
        cancel_job_box = gr.Textbox(visible=False)

    fields = {"mode": mode, "prompt": prompt, "prompt_file": prompt_file, "image": image, "negative_prompt": negative,
              "seed": seed, "tier": tier, "steps": steps, "refiner_steps": refiner_steps,
              "preview_every": preview_every, "video_cfg": video_cfg,
              "audio_cfg": audio_cfg, "compile": compile_mode, "deterministic": deterministic,
              "output_width": output_width, "output_height": output_height,
              "layout_preset": preset, "sp": sp, "cfg": cfg, "ep": ep}
    if set(fields) != set(F.FIELDS):
        raise RuntimeError(f"the Generate form and the request model disagree: no widget for "
                           f"{sorted(set(F.FIELDS) - set(fields))}, no field for {sorted(set(fields) - set(F.FIELDS))}")
    ctx.form = GenerateForm(fields=fields, errors=errors, progress=progress)
    inputs = [fields[name] for name in F.FIELDS]
    error_boxes = [errors[name] for name in F.BOXES]

    # An old refusal goes when its field changes: only the live verdicts stay.
    for name, component in fields.items():
        box = F.box_for(name)
        if box != "layout" and hasattr(component, "input"):
            component.input(_fixed, progress, [errors[box], errors["general"], progress],
                            queue=False, api_visibility="private")

    mode.change(lambda m: [gr.File(visible=m == "i2va"), gr.Image(visible=False) if m != "i2va" else gr.Image()],
                mode, [image, image_preview], queue=False, api_visibility="private")

    def image_uploaded(value):
        path = F.file_path(value)
        try:
            line = F.check_image_upload(path)
        except InputError as err:
            return gr.Image(value=None, visible=False), _error_line(str(err))
        return gr.Image(value=path, visible=path is not None), _error_line(line)

    image.change(image_uploaded, image, [image_preview, errors["image"]], api_visibility="private")

    def prompt_file_loaded(value):
        path = F.file_path(value)
        if path is None:
            return gr.Textbox(), _error_line("")
        try:
            text = F.read_uploaded_prompt(path)
        except InputError as err:
            return gr.Textbox(), _error_line(str(err))
        return gr.Textbox(value=text), _error_line(f"loaded {len(text):,} characters from {Path(path).name}")

    prompt_file.upload(prompt_file_loaded, prompt_file, [prompt, errors["prompt"]], api_visibility="private")
    random_seed.click(draw_seed, None, seed, queue=False, api_visibility="private")
    # "new seed every run" is seed -1 (each run draws one and records it); the box follows the field.
    new_seed.input(lambda on, value: RANDOM_SEED if on else (F.default("seed") if value == RANDOM_SEED else value),
                   [new_seed, seed], seed, queue=False, api_visibility="private")
    seed.change(lambda value: value == RANDOM_SEED, seed, new_seed, queue=False, api_visibility="private")

    streamed: set[str] = set()  # jobs whose Generate stream is open: their page's line is the stream's
    followed: dict[str, str] = {}  # page (session) -> the job its tick line follows (after a reload)

    @one_parameter_per_field
    def generate_run(form_values: dict[str, Any], request: gr.Request):
        """Validate, queue, follow: position while waiting, progress while running, then results."""
        source = panel.source(request)
        # The error lines are the page's: an API client reads the progress line and the refusal. Each line
        # is a component update that Gradio rebuilds on its event loop; for a crowd of API clients those
        # took most of the studio's time (issue 32), so they go to pages only.
        page = source == "studio"
        cleared = {box: _error_line("") for box in error_boxes} if page else {}
        try:
            ctx.slot.check_room()  # a full queue refuses before any planning: fast, also for a crowd
            plan = F.plan_from_form(form_values, caps, ctx.engine, ctx.uploads)
            job = ctx.slot.submit(plan, panel.owner(request), source=source)
        except InputError as err:
            marked = {errors[F.box_for(err.field)]: _error_line(f"✗ {err}")} if page else {}
            yield {**cleared, **marked, progress: progress_html(REFUSED)}
            # For API clients; the page shows the refusal once, next to its field (no toast).
            raise gr.Error(str(err), visible=False, print_exception=False) from None
        yield {**cleared, progress: progress_html(f"queued (ticket {job.ticket}, job {job.id}: "
                                                   f"/cancel_job with this id stops it)")}
        with ctx.slot.following():
            streamed.add(job.id)  # the tick leaves this job's progress line to this stream
            try:
                yield from job_outputs(job, source, request)
            except GeneratorExit:
                # Gradio closes this handler when its client's stream has gone. A page's job stays (its
                # browser finds it again after a reload); an API client's job would run for nobody.
                if source == "api":
                    ctx.slot.client_gone(job)
                raise
            finally:
                streamed.discard(job.id)

    def job_outputs(job, source: str, request: gr.Request):
        """The form's outputs for each of the job's updates, until its terminal one (raised as gr.Error unless
        done; a cancel the page asked for ends quietly, an API client gets it as an error). A done job shows in
        Results, unless the person on the page opened a run since queuing it: that run stays."""
        started = time.monotonic()
        for update in ctx.slot.follow(job):
            if update.kind == "queued":
                yield {progress: progress_html(
                    f"waiting: position {update.position} in the queue ({ctx.slot.waiting()} waiting)")}
            elif update.kind in ("progress", "tick") and job.cancel.is_set():
                yield {progress: progress_html(CANCELLING, busy=True, state="cancelling")}
            elif update.kind in ("progress", "tick") and job.clock is not None:
                now = time.monotonic()
                yield {progress: progress_html(f"#{job.ticket} " + job.clock.line(now), job.clock.fraction(now),
                                                busy=True, stages=job.clock.stages(now))}
            elif update.kind == "done":
                line = f"done in {time.monotonic() - started:.1f} s: {update.run.path.name}"
                stages = job.clock.stages(over=True) if job.clock is not None else ()
                if source == "studio" and ctx.results.opened_since(request, job.submitted):
                    yield {progress: progress_html(f"{line} (Results keeps the run you opened; 'open' in the "
                                                    "job list shows this one)", 1.0, state="done-kept", stages=stages)}
                else:
                    yield {**ctx.results.values_for(update.run),
                           progress: progress_html(line, 1.0, state="done", stages=stages)}
            elif update.kind == "refused":
                yield {errors[F.box_for(update.error.field)]: _error_line(f"✗ {update.error}"),
                       progress: progress_html("refused by the engine")}
                raise gr.Error(update.message, visible=False, print_exception=False)
            elif update.kind == "cancelled":
                yield {progress: progress_html(update.message, state="cancelled")}
                if source == "api":
                    raise gr.Error(update.message, title="Cancelled", print_exception=False)
                return
            else:
                yield {errors["general"]: _error_line(f"✗ {update.message}"),
                       progress: progress_html("failed")}
                raise gr.Error(update.message, print_exception=False)

    def cancel_mine(request: gr.Request) -> str:
        if ctx.slot.cancel(panel.owner(request)):
            return progress_html(CANCELLING, busy=True, state="cancelling")
        return progress_html("nothing of yours is running or waiting")

    def cancel_job(job_id: str, request: gr.Request) -> str:
        """Cancel one of the caller's jobs by id (shown when it is queued): a client that submits from several
        sessions (raw HTTP calls) cancels from the one that queued it (the same ``session_hash``)."""
        try:
            record = ctx.slot.snapshot().find(job_id if isinstance(job_id, str) else "")
        except InputError:
            record = None
        if record is not None and not panel.owns(record, request):
            return (f"job_id: {str(job_id)[:40]!r} was queued by another client. Fix: cancel from the session that "
                    "queued it (the same gradio_client Client, or the same session_hash in raw /call requests)")
        if record is not None and ctx.slot.cancel_job(record.id):
            return "cancelling: the run stops at its next step or stage boundary"
        return f"job_id: {str(job_id)[:40]!r} is not a waiting or running job. Fix: use the id from the queued line"

    def wire() -> None:
        outputs = [*ctx.results.components, progress, *error_boxes, layout_line]
        # preprocess=False: raw payloads reach generate_run, which refuses bad ones in the CLI's words
        # (Gradio's component checks would answer in theirs, or with no message at all).
        # trigger_mode="multiple": a click while a run goes queues another job (Gradio drops it by default).
        generate.click(generate_run, inputs, outputs, api_name="generate", concurrency_limit=None,
                       show_progress="hidden", preprocess=False, trigger_mode="multiple").success(
            _results_if_done, progress, ctx.tabs, queue=False, api_visibility="private")
        cancel.click(cancel_mine, None, progress, api_name="cancel", queue=False)
        cancel_job_box.submit(cancel_job, cancel_job_box, cancel_job_box, api_name="cancel_job", queue=False)

    ctx.defer(wire)
    def page_tick(request: gr.Request):
        """Every 2 s: the engine status; Cancel only while this page has a job waiting or running; the progress
        line follows this page's job when no Generate stream does (after a reload)."""
        state = ctx.slot.snapshot()
        mine = [record for record in state.jobs if record.pending and panel.owns(record, request)]
        page = getattr(request, "session_hash", None) or ""
        if any(record.id in streamed for record in mine):
            followed.pop(page, None)  # the stream's own last line must stay
            return {status: _status_text(ctx), cancel: gr.Button(interactive=True)}
        running = ctx.slot.running_clock()
        line, shown = None, {}
        for record in mine:
            if running is not None and record.id == running[0]:
                now, clock = time.monotonic(), running[1]
                line = (progress_html(CANCELLING, busy=True, state="cancelling") if record.cancel_requested
                        else progress_html(f"#{record.ticket} " + clock.line(now), clock.fraction(now), busy=True,
                                            stages=clock.stages(now)))
                followed[page] = record.id
                break
        else:
            if mine:
                line = progress_html(f"waiting: position {state.position(mine[0].id)} in the queue "
                                      f"({ctx.slot.waiting()} waiting)")
                followed[page] = mine[0].id
            elif page in followed:
                ended = followed.pop(page)
                record = next((record for record in state.jobs if record.id == ended), None)
                shown = _finished_run(record, request)
                line = _ended_line(record, in_results=bool(shown))
        # A dict: Results is only touched when the followed job's run goes there.
        return {status: _status_text(ctx), cancel: gr.Button(interactive=bool(mine)),
                **({} if line is None else {progress: line}), **shown}

    def _finished_run(record, request: gr.Request) -> dict:
        """Results' values for the page's job that finished while no stream followed it (after a reload; the
        audit: it was missing from Results until a second reload), unless the person opened a run since."""
        if record is None or record.state != "done" or not record.run:
            return {}
        if ctx.results.opened_since(request, record.submitted):
            return {}
        try:
            run = load_run(ctx.outputs_root / record.run)
        except InputError:  # deleted meanwhile: the line still says how the job ended
            return {}
        return ctx.results.values_for(run)

    ctx.defer(lambda: timer.tick(page_tick, None, [status, cancel, progress, *ctx.results.components], queue=False,
                                 show_progress="hidden", api_visibility="private"))


def _status_text(ctx: StudioContext) -> str:
    caps = ctx.capabilities
    devices = ", ".join(caps.devices) or "none"
    return (f"**Engine** {caps.engine} · **platform** {caps.platform} · **devices** {devices} · "
            f"**{ctx.slot.status_line()}**")


def _demo_line(caps) -> str:
    """Why Steps and Layout start where they do on a demo engine, and what blank Steps means instead."""
    layout = f" on one rank ({caps.demo_layout})" if caps.demo_layout else ""
    return (f"<small>Demo defaults for the {caps.engine} engine: {caps.demo_steps} steps{layout}, for a first "
            f"result in about 20 s on 2 CPU cores. Blank Steps runs the engine default, {caps.default_steps} "
            f"(the real model's).</small>")


def _tier_label(name: str, reason: str | None) -> str:
    tier = TIERS[name]
    text = f"{name} ({tier.size}, {tier.seconds:.0f} s" + (", with refiner)" if tier.refined else ")")
    return text if not reason else f"{text}: unavailable"


def _first_runnable_tier(caps) -> str:
    return next((name for name in TIERS if not caps.tiers.get(name)), "272p")
