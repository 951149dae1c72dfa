"""Generate: the request form, the layout check, engine status, the queue and progress.

The Generate button's event is also the public API endpoint ``/generate``: page and
gradio_client go through the same function, so they get the same validation.
"""

from __future__ import annotations

import html
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from ..errors import InputError
from ..layouts import PRESETS
from ..request import MAX_SEED, read_prompt_file
from ..tiers import TIERS
from . import form as F
from . import job_panel, session_state
from .context import StudioContext

log = logging.getLogger(__name__)

TAB_ID = "generate"
RANDOM_SEED_MAX = 2**31 - 1


@dataclass
class GenerateForm:
    """The form's components: ``fields`` in :data:`form.FIELDS` order, ``errors`` per box."""

    fields: dict[str, gr.components.Component]
    errors: dict[str, gr.Markdown]
    progress: gr.HTML

    def values_from_manifest(self, manifest: dict[str, Any]) -> list[Any]:
        """Form values (in ``fields`` order) that repeat a run: the replay path."""
        request = manifest["request"]
        preset, sp, cfg, ep = F.layout_to_form(manifest["layout"])
        image = request.get("image")
        by_name = {
            "mode": request["mode"], "prompt": request["prompt"], "prompt_file": None,
            "image": image, "negative_prompt": request.get("negative_prompt") or "",
            "seed": request["seed"], "tier": request["tier"], "steps": _text(request.get("steps")),
            "refiner_steps": _text(request.get("refiner_steps")), "video_cfg": request["video_cfg"],
            "audio_cfg": request["audio_cfg"], "compile": request.get("compile") or F.ENGINE_DEFAULT,
            "deterministic": request["deterministic"], "layout_preset": preset, "sp": sp, "cfg": cfg, "ep": _text(ep),
        }
        return [by_name[name] for name in F.FIELDS]


def uploads_only(component: gr.File, field: str) -> gr.File:
    """Refuse a file value that is not an upload (e.g. a raw server path) in the project's words.

    Gradio validates a File input's payload against its data model before any handler runs,
    also with ``preprocess=False``; its own refusal reaches the client as no message at all.
    """
    base = component.data_model

    class UploadedFile(base):  # type: ignore[misc, valid-type]
        @classmethod
        def model_validate(cls, obj, *args, **kwargs):
            if not isinstance(obj, dict) or not isinstance(obj.get("path"), str):
                raise gr.Error(str(InputError(field, "is not an uploaded file",
                                              "upload it (gradio_client: handle_file(path)); a server path "
                                              "or plain text is not accepted")), print_exception=False)
            return base.model_validate(obj, *args, **kwargs)

    component.data_model = UploadedFile
    return component


def _text(value: int | None) -> str:
    return "" if value is None else str(value)


def _progress_html(line: str, fraction: float | None = None, *, busy: bool = False) -> str:
    """The line under Generate; ``busy`` without a fraction draws a moving bar (a stage of unknown length)."""
    bar = (f'<progress value="{fraction:.3f}" max="1"></progress>' if fraction is not None
           else '<progress max="1"></progress>' if busy else "")
    return f'<div class="m2s-progress">{bar}<span>{html.escape(line)}</span></div>'


def _error_line(text: str) -> gr.Markdown:
    return gr.Markdown(value=text, visible=bool(text))


def build(ctx: StudioContext) -> None:
    caps = ctx.capabilities
    with gr.Tab("Generate", id=TAB_ID):
        status = gr.Markdown(_status_text(ctx), elem_id="engine-status")
        with gr.Row():
            with gr.Column(scale=3):
                mode = gr.Radio([("T2VA: text to video + audio", "t2va"), ("I2VA: first frame + text", "i2va")],
                                value="t2va", label="Mode", elem_id="mode")
                image = uploads_only(gr.File(label="First-frame image (JPEG or PNG)", visible=False,
                                             elem_id="image-file"), "image")
                image_preview = gr.Image(label="First frame", visible=False, interactive=False, height=160)
                errors = {"image": _error_line("")}
                prompt = gr.Textbox(label="Prompt", lines=8, max_lines=24, elem_id="prompt",
                                    placeholder="Describe the clip, or load one of the published prompt files")
                prompt_file = uploads_only(gr.File(label="Load a prompt file (UTF-8 text or JSON)",
                                                   elem_id="prompt-file", height=90), "prompt_file")
                errors["prompt"] = _error_line("")
                with gr.Accordion("Advanced", open=False):
                    negative = gr.Textbox(label="Negative prompt", lines=2)
                panel = job_panel.build(ctx)  # fills the column's free space, above the fold at 1440x900
            with gr.Column(scale=2):
                with gr.Row():
                    seed = gr.Number(value=42, label="Seed", precision=None, minimum=0, maximum=MAX_SEED,
                                     elem_id="seed")
                    random_seed = gr.Button("random seed", size="sm", scale=0)
                with gr.Row():
                    steps = gr.Textbox(value="", label="Steps", placeholder=f"engine default: {caps.default_steps}",
                                       elem_id="steps")
                    refiner_steps = gr.Textbox(value="", label="Refiner steps (1080p)",
                                               placeholder=f"engine default: {caps.default_refiner_steps}")
                with gr.Row():
                    video_cfg = gr.Number(value=5.0, label="Video CFG scale")
                    audio_cfg = gr.Number(value=7.0, label="Audio CFG scale")
                with gr.Row():
                    compile_mode = gr.Dropdown([F.ENGINE_DEFAULT, *caps.compile_modes], value=F.ENGINE_DEFAULT,
                                               label=f"Compile mode (engine default: {caps.default_compile})")
                    deterministic = gr.Checkbox(value=True, label="Deterministic")
                errors["sampling"] = _error_line("")
                tier = gr.Radio([(_tier_label(name, caps.tiers.get(name)), name) for name in TIERS],
                                value=_first_runnable_tier(caps), label="Tier", elem_id="tier")
                unavailable = [f"{name}: {reason}" for name, reason in caps.tiers.items() if reason]
                gr.Markdown("\n\n".join(f"⊘ {line}" for line in unavailable), visible=bool(unavailable))
                errors["tier"] = _error_line("")
                with gr.Group():
                    preset = gr.Dropdown([(f"{name}: {why}", name) for name, (_, why) in PRESETS.items()]
                                         + [("custom SP / CFG / EP", F.CUSTOM)],
                                         value=_default_preset(ctx), label="Layout", elem_id="layout-preset")
                    with gr.Row():
                        sp = gr.Number(value=1, label="SP (Ulysses)", precision=None, interactive=False)
                        cfg = gr.Number(value=1, label="CFG", precision=None, interactive=False)
                        ep = gr.Textbox(value="", label="EP", placeholder="blank: heads follow SP",
                                        interactive=False)
                layout_line = gr.Markdown(elem_id="layout-check")
                errors["layout"] = _error_line("")
                with gr.Row():
                    generate = gr.Button("Generate", variant="primary", elem_id="generate")
                    cancel = gr.Button("Cancel", variant="stop", elem_id="cancel")
                errors["general"] = _error_line("")
                progress = gr.HTML(_progress_html("idle"), elem_id="progress")
        session_state.build(ctx, panel)
        # Inside the Tab: a component between two tabs shifts the later tabs' order in Gradio 6.
        timer = gr.Timer(2.0)
        # Hidden: the /cancel_job endpoint's input (a component outside a Tab relabels the tabs).
        cancel_job_box = gr.Textbox(visible=False)

    fields = {"mode": mode, "prompt": prompt, "prompt_file": prompt_file, "image": image, "negative_prompt": negative,
              "seed": seed, "tier": tier, "steps": steps, "refiner_steps": refiner_steps, "video_cfg": video_cfg,
              "audio_cfg": audio_cfg, "compile": compile_mode, "deterministic": deterministic,
              "layout_preset": preset, "sp": sp, "cfg": cfg, "ep": ep}
    ctx.form = GenerateForm(fields=fields, errors=errors, progress=progress)
    inputs = [fields[name] for name in F.FIELDS]
    error_boxes = [errors[name] for name in F.BOXES]
    layout_inputs = [preset, sp, cfg, ep, tier]

    def check_layout(preset_value, sp_value, cfg_value, ep_value, tier_value):
        values = {"layout_preset": preset_value, "sp": sp_value, "cfg": cfg_value, "ep": ep_value, "tier": tier_value}
        return F.layout_report(values, caps, ctx.engine, ctx.gpu_gib)

    def preset_changed(preset_value):
        custom = preset_value == F.CUSTOM
        if custom or preset_value not in PRESETS:
            return gr.Number(interactive=True), gr.Number(interactive=True), gr.Textbox(interactive=True)
        layout = PRESETS[preset_value][0]
        return (gr.Number(value=layout.sp, interactive=False), gr.Number(value=layout.cfg, interactive=False),
                gr.Textbox(value="" if layout.ep is None else str(layout.ep), interactive=False))

    preset.change(preset_changed, preset, [sp, cfg, ep], queue=False, api_visibility="private").then(
        check_layout, layout_inputs, layout_line, queue=False, api_visibility="private")
    for component in (sp, cfg, ep, tier):
        component.change(check_layout, layout_inputs, layout_line, queue=False, api_visibility="private")

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
            text = read_prompt_file(path)
        except InputError as err:
            return gr.Textbox(), _error_line(str(err))
        return gr.Textbox(value=text), _error_line(f"loaded {len(text):,} characters from {Path(path).name}")

    prompt_file.upload(prompt_file_loaded, prompt_file, [prompt, errors["prompt"]], api_visibility="private")
    random_seed.click(lambda: random.randint(0, RANDOM_SEED_MAX), None, seed, queue=False,
                      api_visibility="private")

    def generate_run(mode, prompt, prompt_file, image, negative_prompt, seed, tier, steps, refiner_steps,
                     video_cfg, audio_cfg, compile, deterministic, layout_preset, sp, cfg, ep,
                     request: gr.Request):
        """Validate, queue, follow: position while waiting, progress while running, then results."""
        arguments = locals()
        form_values = {name: arguments[name] for name in F.FIELDS}
        cleared = {box: _error_line("") for box in error_boxes}
        try:
            plan = F.plan_from_form(form_values, caps, ctx.engine, ctx.uploads)
            job = ctx.slot.submit(plan, panel.owner(request), source=panel.source(request))
        except InputError as err:
            yield {**cleared, errors[F.box_for(err.field)]: _error_line(f"✗ {err}"),
                   progress: _progress_html("refused: fix the field marked above")}
            raise gr.Error(str(err), print_exception=False) from None
        yield {**cleared, progress: _progress_html(f"queued (ticket {job.ticket}, job {job.id}: "
                                                   f"/cancel_job with this id stops it)")}
        started = time.monotonic()
        for update in ctx.slot.follow(job):
            if update.kind == "queued":
                yield {progress: _progress_html(
                    f"waiting: position {update.position} in the queue ({ctx.slot.waiting()} waiting)")}
            elif update.kind in ("progress", "tick") and job.clock is not None:
                now = time.monotonic()
                yield {progress: _progress_html(f"#{job.ticket} " + job.clock.line(now), job.clock.fraction(now),
                                                busy=True)}
            elif update.kind == "done":
                took = time.monotonic() - started
                yield {**ctx.results.values_for(update.run),
                       progress: _progress_html(f"done in {took:.1f} s: {update.run.path.name}", 1.0)}
            elif update.kind == "refused":
                yield {errors[F.box_for(update.error.field)]: _error_line(f"✗ {update.error}"),
                       progress: _progress_html("refused by the engine")}
                raise gr.Error(update.message, print_exception=False)
            elif update.kind == "cancelled":
                yield {progress: _progress_html(update.message)}
                raise gr.Error(update.message, title="Cancelled", print_exception=False)
            else:
                yield {errors["general"]: _error_line(f"✗ {update.message}"),
                       progress: _progress_html("failed")}
                raise gr.Error(update.message, print_exception=False)

    def cancel_mine(request: gr.Request) -> str:
        if ctx.slot.cancel(panel.owner(request)):
            return _progress_html("cancelling: the run stops at the next step boundary")
        return _progress_html("nothing of yours is running or waiting")

    def cancel_job(job_id: str) -> str:
        """Cancel by job id (shown when the run is queued): for HTTP clients, whose calls have no shared session."""
        if ctx.slot.cancel_job(job_id if isinstance(job_id, str) else ""):
            return "cancelling: the run stops at the next step boundary"
        return f"job_id: {str(job_id)[:40]!r} is not a waiting or running job. Fix: use the id from the queued line"

    def wire() -> None:
        outputs = [*ctx.results.components, progress, *error_boxes]
        # preprocess=False: raw payloads reach generate_run, which refuses bad ones in the CLI's words
        # (Gradio's component checks would answer in theirs, or with no message at all).
        # trigger_mode="multiple": a click while a run goes queues another job (Gradio drops it by default).
        generate.click(generate_run, inputs, outputs, api_name="generate", concurrency_limit=None,
                       show_progress="hidden", preprocess=False, trigger_mode="multiple").success(
            lambda: gr.Tabs(selected="results"), None, ctx.tabs, queue=False, api_visibility="private")
        cancel.click(cancel_mine, None, progress, api_name="cancel", queue=False)
        cancel_job_box.submit(cancel_job, cancel_job_box, cancel_job_box, api_name="cancel_job", queue=False)
        ctx.demo.load(check_layout, layout_inputs, layout_line, queue=False, api_visibility="private")

    ctx.defer(wire)
    timer.tick(lambda: _status_text(ctx), None, status, queue=False, show_progress="hidden",
               api_visibility="private")


def _status_text(ctx: StudioContext) -> str:
    caps = ctx.capabilities
    devices = ", ".join(caps.devices) or "none"
    return (f"**Engine** {caps.engine} · **platform** {caps.platform} · **devices** {devices} · "
            f"**{ctx.slot.status_line()}**")


def _tier_label(name: str, reason: str | None) -> str:
    tier = TIERS[name]
    text = f"{name} ({tier.size}, {tier.seconds:.0f} s" + (", with refiner)" if tier.refined else ")")
    return text if not reason else f"{text}: unavailable"


def _first_runnable_tier(caps) -> str:
    return next((name for name in TIERS if not caps.tiers.get(name)), "272p")


def _default_preset(ctx: StudioContext) -> str:
    """The layout the engine runs or preloads, else the first preset it takes without warnings
    (PRESETS lists the MUSA report's fastest layouts first)."""
    layout = ctx.engine.layout or ctx.slot.preload
    if layout is not None:
        return layout.name if layout.name in PRESETS else F.CUSTOM
    for name, (candidate, _) in PRESETS.items():
        try:
            if not ctx.engine.check_layout(candidate, TIERS["272p"]):
                return name
        except InputError:
            continue
    return F.CUSTOM
