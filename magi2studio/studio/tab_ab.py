"""A/B: the paired method from the page: two sides, a pair count, a live table and the verdict.

Each run is a fresh process (see :mod:`magi2studio.reproduction.ab`), so the side's env reaches the engine.
That needs the engine's devices free: with the real engine the studio's own engine holds the
GPUs, so the view says so and points to ``magi2studio ab`` from a shell.
"""

from __future__ import annotations

import time

import gradio as gr

from ..reproduction.ab import BIT_IDENTICAL, check_pairs, parse_side, run_ab
from ..errors import Cancelled, InputError
from ..vocabulary.request import build_request, whole_number
from . import layout_picker as LP
from .background import TERMINAL, BackgroundJobs
from .context import StudioContext, report_links
from .form import layout_from_form

TAB_ID = "ab"
COLUMNS = ["#", "side", "pair", "status", "gate ms/step", "engine start ms", "frames sha256", "pcm sha256"]
SETTING_HELP = "one per line: env.KEY=VALUE, engine.KEY=VALUE, request.FIELD=VALUE or layout=NAME"


def setting_lines(text: str | None) -> list[str]:
    return [line.strip() for line in (text or "").splitlines() if line.strip()]


def run_rows(runs) -> list[list]:
    return [[r.order + 1, r.side, r.pair + 1, r.status, round(r.gate_ms, 1) if r.gate_ms is not None else None,
             round(r.engine_start_ms) if r.engine_start_ms is not None else None, (r.frames_sha256 or "")[:16],
             (r.pcm_sha256 or "")[:16]] for r in runs]


def verdict_text(report: dict) -> str:
    """The verdict as a block: outputs, then time (with a warning where one pair cannot show a spread)."""
    identity, timing = report["identity"], report["timing"]
    lines = ["### Verdict", f"**Outputs: {identity['verdict']}**"]
    if identity["verdict"] != BIT_IDENTICAL:
        lines += [f"- {group}: {', '.join(names)}" for group, names in identity.get("groups", {}).items()]
    lines.append("")
    if "median_ratio" in timing:
        lines += ["**Time, candidate / control**", "",
                  "| median | range | spread | pairs compared |", "| --- | --- | --- | --- |",
                  f"| {timing['median_ratio']:.4f} | {timing['min_ratio']:.4f} to {timing['max_ratio']:.4f} | "
                  f"{timing['spread_pct']:.2f}% | {timing['compared_pairs']} |"]
        if timing["compared_pairs"] < 2:
            lines += ["", "⚠ One pair only: its spread is 0% by construction and says nothing about noise. "
                          "Run 3 or more pairs before trusting the ratio."]
    else:
        lines.append(timing["note"])
    if timing["excluded"]:
        lines += ["", "**Excluded from the time comparison**"] + [f"- {text}" for text in timing["excluded"]]
    return "\n".join(lines)


def build(ctx: StudioContext) -> None:
    in_process_engine = ctx.capabilities.engine == "embedded"
    with gr.Tab("A/B", id=TAB_ID):
        gr.Markdown("Control and candidate alternate (C, K, C, K, ...) on one request; times are compared "
                    "only between runs with bit-identical outputs.")
        if not in_process_engine:
            gr.Markdown(f"The {ctx.capabilities.engine} engine of this studio holds the GPUs, and every A/B run "
                        "needs them in a fresh process: stop the studio and run `magi2studio ab` from a shell "
                        "(docs/reproduce.md).")
        with gr.Row():
            prompt = gr.Textbox(label="Prompt", lines=3, scale=3)
            with gr.Column(scale=1):
                tier = gr.Dropdown([t for t, why in ctx.capabilities.tiers.items() if not why], value="272p",
                                   label="Tier")
                seed = gr.Number(42, precision=0, label="Seed")
                steps = gr.Textbox("", label="Steps", placeholder="blank: engine default")
                pairs = gr.Number(3, precision=0, label="Pairs")
        with gr.Row():
            control = gr.Textbox(label="Control", lines=3, placeholder=SETTING_HELP)
            candidate = gr.Textbox(label="Candidate", lines=3, placeholder=SETTING_HELP)
            with gr.Column():  # both sides' layout (a side's layout=NAME overrides it); each run is a fresh process
                layout = LP.build_control(ctx, tier, "272p", elem_prefix="ab-layout", restart_notice=False)
        with gr.Row():
            start = gr.Button("Run the pairs", variant="primary", interactive=in_process_engine)
            stop = gr.Button("Stop")
        status = gr.Markdown()
        table = gr.Dataframe(headers=COLUMNS, interactive=False, label="Runs")
        verdict = gr.Markdown()

    jobs = BackgroundJobs("ab", (Cancelled, InputError))

    def run_pairs(prompt_value, tier_value, seed_value, steps_value, pairs_value, control_value, candidate_value,
                  preset_value, sp_value, cfg_value, ep_value, request: gr.Request):
        owner = request.session_hash or "anonymous"
        try:
            count = check_pairs(int(pairs_value) if pairs_value is not None else 0)
            base = build_request(prompt=prompt_value or "", tier=tier_value,
                                 seed=int(seed_value if seed_value is not None else 42),
                                 steps=whole_number(steps_value if steps_value not in ("", None) else None, "steps"))
            both = layout_from_form(preset_value, sp_value, cfg_value, ep_value).name
            sides = (parse_side("control", setting_lines(control_value), both),
                     parse_side("candidate", setting_lines(candidate_value), both))
        except (InputError, ValueError) as err:
            raise gr.Error(str(err), print_exception=False) from None
        out = ctx.outputs_root / "ab" / time.strftime("%Y%m%d-%H%M%S")
        runs_seen: dict[int, object] = {}
        events = jobs.start(owner, lambda cancel, emit: run_ab(base, sides, count, engine_name=ctx.capabilities.engine,
                                                                out=out, cancel=cancel, on_event=emit))
        yield f"{2 * count} runs, each in a fresh process", [], ""
        for kind, first, payload in events:
            if kind in TERMINAL:
                break
            runs_seen[first.order] = first
            which = f"run {first.order + 1}/{2 * count} ({first.side})"
            if kind == "progress" and payload.get("step") is not None:
                line = f"{which}: step {payload['step'] + 1}/{payload['total']}"
            elif kind in ("start", "done"):
                line = f"{which}: {first.status if kind == 'done' else 'starting'}"
            else:
                continue
            yield line, run_rows([runs_seen[k] for k in sorted(runs_seen)]), gr.skip()
        if kind != "finished":
            yield f"**{kind}**: {first}", gr.skip(), gr.skip()
            return
        yield f"**done**. Reports: {report_links(out, ('ab.md', 'ab.json'))}", gr.skip(), verdict_text(first)

    def stop_pairs(request: gr.Request):
        if not jobs.stop(request.session_hash or "anonymous"):
            return "nothing of yours is running"
        return "stopping: the running process is ended at its next progress line"

    # The layout's preset stands where the old free-text layout stood; the custom SP / CFG / EP follow at the end.
    start.click(run_pairs, [prompt, tier, seed, steps, pairs, control, candidate, *layout.fields],
                [status, table, verdict],
                api_name="ab", concurrency_limit=1)
    stop.click(stop_pairs, None, status, api_name="ab_stop", queue=False)
