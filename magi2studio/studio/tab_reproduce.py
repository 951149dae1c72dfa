"""Reproduce: run a sample set (the bundled Sand AI set or an upload) through the studio's engine.

Entries go through the shared engine slot one by one, so a reproduction queues behind other
users' runs and never competes with them for the engine. Results show per-sample progress, a
table with verdicts and the poster thumbnails; the reports land under ``outputs/reproduce/``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import gradio as gr

from ..errors import Cancelled, EngineError, InputError, describe_os_error
from ..reproduction.references import BUNDLED_REFERENCES, load_reference
from ..vocabulary.request import whole_number
from ..reproduction.reproduce import engine_weights, reproduce
from ..reproduction.samples import BUNDLED_ALIAS, SEED_POLICIES, load_sample_set
from ..engines.timing import EXCLUDED_STEPS
from . import layout_picker as LP
from .background import TERMINAL, BackgroundJobs
from .context import StudioContext, report_links
from .form import layout_from_form
from .job_panel import session_owner
from .number_field import optional_whole_number
from .served import cached

TAB_ID = "reproduce"
COLUMNS = ["sample", "status", "mode", "seed", "tier", "steps", "frames sha256", "pcm sha256", "gate ms/step",
           "verdict"]
BUNDLED_CHOICE = "Sand AI's demo_samples.json (bundled)"
UPLOAD_CHOICE = "Upload a set"


def stage_upload(files: list[str] | None, scratch: Path) -> Path:
    """Put an uploaded set and the files it names in ``<scratch>/<id>/assets/``, as Sand AI lays them out."""

    paths = [Path(f) for f in files or []]
    sets = [p for p in paths if p.suffix == ".json" and p.stat().st_size < 1024 * 1024]
    if not paths:
        raise InputError("samples", "no file was uploaded", "upload the sample set JSON and the files it names")
    folder = scratch / f"upload-{time.time_ns()}" / "assets"
    folder.mkdir(parents=True)
    try:
        for path in paths:
            shutil.copy(path, folder / path.name)
        named = [folder / p.name for p in sets
                 if p.read_text(encoding="utf-8", errors="replace").lstrip().startswith("[")]
        if len(named) != 1:
            raise InputError("samples", f"{len(named)} of the uploaded files are JSON arrays",
                             "upload exactly one sample set (a JSON array) plus its prompt and image files")
    except BaseException:
        shutil.rmtree(folder.parent, ignore_errors=True)
        raise
    return named[0]


def gate_cell(gate_ms: float | None, steps: int | None, status: str) -> float | str:
    """The gate column: ms/step, or why there is none (the metric drops steps 0 and 1)."""
    if gate_ms is not None:
        return round(gate_ms, 1)
    if steps is not None and steps <= len(EXCLUDED_STEPS):
        return f"n/a: {steps} steps (the metric needs a step after steps 0 and 1)"
    return f"n/a ({status})"


def rows_of(report: dict) -> list[list]:
    return [[r["name"], r["status"], r["mode"], r["seed"], r["tier"], r["steps"], (r["frames_sha256"] or "")[:16],
             (r["pcm_sha256"] or "")[:16], gate_cell(r["gate_ms"], r["steps"], r["status"]),
             r["verdict"] or ""] for r in report["samples"]]


def build(ctx: StudioContext) -> None:
    with gr.Tab("Reproduce", id=TAB_ID):
        gr.Markdown("Run a whole sample set as normal run folders; already finished entries are skipped. "
                    "Entries queue on the studio's engine like any other run.")
        with gr.Row():
            source = gr.Radio([BUNDLED_CHOICE, UPLOAD_CHOICE], value=BUNDLED_CHOICE, label="Sample set")
            upload = gr.File(label="Set JSON + its prompt and image files", file_count="multiple")
        with gr.Row():
            tier = gr.Dropdown([t for t, why in ctx.capabilities.tiers.items() if not why], value="272p", label="Tier")
            with gr.Column():
                layout = LP.build_control(ctx, tier, "272p", elem_prefix="reproduce-layout")
            seed = gr.Number(42, precision=0, label="Seed")
            policy = gr.Radio(list(SEED_POLICIES), value="fixed", label="Seed policy")
            steps = optional_whole_number(label="Steps", placeholder="blank: engine default",
                                          elem_id="reproduce-steps")
        with gr.Row():
            expect = gr.Dropdown(["none", *BUNDLED_REFERENCES], value="none", label="Reference")
            expect_file = gr.File(label="...or a reference file", file_count="single")
            skip_missing = gr.Checkbox(True, label="Skip entries whose files are missing "
                                                   "(Sand AI lists an unpublished sample_enhanced_t2v.json)")
        with gr.Row():
            start = gr.Button("Run the set", variant="primary")
            stop = gr.Button("Stop")
        status = gr.Markdown()
        table = gr.Dataframe(headers=COLUMNS, interactive=False, label="Results", wrap=True)
        posters = gr.Gallery(label="Posters", columns=4, height="auto", allow_preview=True)
        notes = gr.Markdown()

    jobs = BackgroundJobs("reproduce", (Cancelled,))

    def run_set(source_value, files, tier_value, preset_value, seed_value, policy_value, steps_value,
                expect_value, expect_path, skip_value, sp_value, cfg_value, ep_value, request: gr.Request):
        owner = session_owner(request)
        staged = None
        try:
            set_path = BUNDLED_ALIAS if source_value == BUNDLED_CHOICE else stage_upload(files, ctx.scratch)
            staged = None if set_path == BUNDLED_ALIAS else set_path.parent.parent
            steps_number = whole_number(steps_value if steps_value not in ("", None) else None, "steps")
            defaults = {"tier": tier_value, **({"steps": steps_number} if steps_number is not None else {})}
            sample_set = load_sample_set(set_path, seed=int(seed_value if seed_value is not None else 42),
                                         seed_policy=policy_value, defaults=defaults, skip_missing=skip_value,
                                         root=None if set_path == BUNDLED_ALIAS else set_path.parent.parent)
            chosen_layout = layout_from_form(preset_value, sp_value, cfg_value, ep_value)
            plans = {sample.name: ctx.engine.plan(sample.request, chosen_layout) for sample in sample_set.samples}
            reference_path = expect_path or (None if expect_value == "none" else expect_value)
            reference = load_reference(reference_path) if reference_path else None
        except (InputError, OSError) as err:
            if staged is not None:
                shutil.rmtree(staged, ignore_errors=True)
            message = describe_os_error(err) if isinstance(err, OSError) else str(err)
            raise gr.Error(message, print_exception=False) from None
        out = ctx.outputs_root / "reproduce" / time.strftime("%Y%m%d-%H%M%S")

        def work(cancel, emit):
            def through_slot(sample, extra, on_progress, cancel_event):
                job = ctx.slot.submit(plans[sample.name], owner)
                for update in ctx.slot.follow(job):
                    if cancel_event is not None and cancel_event.is_set():
                        ctx.slot.cancel(owner)
                    if update.kind == "progress" and update.progress is not None:
                        on_progress(update.progress)
                    elif update.kind == "queued":
                        emit("queued", sample.name, update.position)
                    elif update.kind == "done":
                        return update.run
                    elif update.kind == "refused":
                        raise update.error
                    elif update.kind == "cancelled":
                        raise Cancelled(update.message)
                    elif update.kind == "failed":
                        raise EngineError(update.message)
                raise EngineError("the engine slot stopped without a result")

            return reproduce(sample_set, engine_name=ctx.capabilities.engine, layout=chosen_layout, out=out,
                             runs_root=ctx.outputs_root, run_entry=through_slot, reference=reference,
                             reference_path=str(reference_path) if reference_path else None, cancel=cancel,
                             on_event=emit, weights=engine_weights(ctx.engine))

        def remove_staged():  # the staged upload is read; it goes with the run
            if staged is not None:
                shutil.rmtree(staged, ignore_errors=True)

        events = jobs.start(owner, work, cleanup=remove_staged)
        total = len(sample_set.samples)
        done = 0
        skipped = f", {len(sample_set.skipped)} skipped" if sample_set.skipped else ""
        line = f"{total} entries to run or resume{skipped}"
        yield line, None, None, ""
        for kind, first, payload in events:
            if kind == "start":
                line = f"[{first.index + 1}/{total + len(sample_set.skipped)}] {first.name}: starting"
            elif kind == "queued":
                line = f"{first}: waiting in the queue (position {payload})"
            elif kind == "progress" and payload.step is not None:
                line = f"{first.name}: {payload.stage} step {payload.step + 1}/{payload.total}"
            elif kind == "done":
                done += 1
                line = f"{first.name}: {first.status} ({done}/{total})"
            elif kind in TERMINAL:
                break
            else:
                continue
            yield line, gr.skip(), gr.skip(), gr.skip()
        if kind != "finished":
            yield f"**{kind}**: {first}", gr.skip(), gr.skip(), gr.skip()
            return
        report = first
        copies = [(cached(out / r["poster"], ctx.outputs_root), r) for r in report["samples"] if r["poster"]]
        gallery = [(poster, f"{r['name']}: {r['verdict'] or r['status']}") for poster, r in copies if poster]
        summary = ", ".join(f"{k} {v}" for k, v in report["summary"].items() if v)
        footer = "\n".join(f"- {n}" for n in report["cannot_check_here"])
        yield (f"**done**: {summary}. Reports: {report_links(out, ('report.html', 'report.md', 'report.json'))}",
               rows_of(report), gallery, footer)

    def stop_set(request: gr.Request):
        owner = session_owner(request)
        if not jobs.stop(owner):
            return "nothing of yours is running"
        ctx.slot.cancel(owner)
        return "stopping at the next step or stage boundary"

    # The layout's preset stands where the old free-text layout stood; the custom SP / CFG / EP follow at the end.
    start.click(run_set, [source, upload, tier, layout.preset, seed, policy, steps, expect, expect_file, skip_missing,
                          layout.sp, layout.cfg, layout.ep],
                [status, table, posters, notes], api_name="reproduce", concurrency_limit=None)
    stop.click(stop_set, None, status, api_name="reproduce_stop", queue=False)
