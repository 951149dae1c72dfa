"""A/B: the paired method from the page: two sides, a pair count, a live table and the verdict.

Each run is a fresh process (see :mod:`magi2studio.reproduction.ab`), so the side's env reaches the engine.
That needs the engine's devices free: with the real engine the studio's own engine holds the
GPUs, so the view says so and points to ``magi2studio ab`` from a shell.
"""

from __future__ import annotations

import html
import re
import time
from dataclasses import dataclass, replace

import gradio as gr

from ..reproduction.ab import BIT_IDENTICAL, SIDES, Side, check_pairs, parse_side, run_ab, side_request
from ..errors import Cancelled, InputError
from ..vocabulary.request import Request, build_request, whole_number
from . import layout_picker as LP
from .background import TERMINAL, BackgroundJobs
from .context import StudioContext, report_links
from .form import ENGINE_DEFAULT, layout_from_form
from .number_field import optional_whole_number

TAB_ID = "ab"
COLUMNS = ["#", "side", "pair", "status", "gate ms/step", "engine start ms", "frames sha256", "pcm sha256"]
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The command line's side settings (magi2studio ab --control ...); an older /ab call sends these in a side's box.
SETTING_PREFIXES = ("env.", "engine.", "request.", "layout=")


def env_settings(label: str, text: str | None) -> list[str]:
    """A side's Environment box as side settings: one ``KEY=VALUE`` a line is an environment variable.

    A line in the command line's form (``env.``, ``engine.``, ``request.``, ``layout=``) is passed on as it is,
    so an /ab call written before the side's fields keeps working."""
    settings = []
    for line in (line.strip() for line in (text or "").splitlines()):
        if not line:
            continue
        key, sep, _ = line.partition("=")
        if line.startswith(SETTING_PREFIXES):
            settings.append(line)
        elif sep and ENV_NAME.fullmatch(key):
            settings.append(f"env.{line}")
        else:
            raise InputError(f"{label}.environment", f"{line!r} is not KEY=VALUE",
                             "write one environment variable a line, e.g. MAGI2_KERNELS=on")
    return settings


class SideRefusal(InputError):
    """A refusal of one side's field (its layout), in the field's own words, with the side it belongs to."""

    def __init__(self, side: str, err: InputError) -> None:
        super().__init__(err.field, err.problem, err.fix)
        self.side = side


@dataclass(frozen=True)
class SideFields:
    """One side's controls: its layout, compile mode, deterministic, environment, and its error line."""

    layout: LP.LayoutControl
    compile: gr.Dropdown
    deterministic: gr.Checkbox
    environment: gr.Textbox
    error: gr.Markdown


def side_from_fields(label: str, base: Request, environment: str | None, layout_name: str, compile_value: str | None,
                     deterministic_value: bool | None) -> Side:
    """The side the fields describe: what differs from the request (compile, deterministic) becomes a request
    override; a ``request.`` line of the box (an older call's) wins over the fields."""
    side = parse_side(label, env_settings(label, environment), layout_name)
    overrides: dict = {}
    if compile_value not in (None, "", ENGINE_DEFAULT):
        overrides["compile"] = compile_value
    if deterministic_value is not None and bool(deterministic_value) != base.deterministic:
        overrides["deterministic"] = bool(deterministic_value)
    side = replace(side, request_overrides={**overrides, **side.request_overrides})
    side_request(base, side)  # refused here, at the door, not when its first run starts
    return side


def _error_line(text: str = "", box: str | None = None) -> gr.Markdown:
    """A refusal next to its field (red, ``role=alert``); empty: hidden."""
    where = {"elem_id": f"error-ab-{box}", "elem_classes": ["m2s-error"]} if box else {}
    value = f'<span class="m2s-refusal" role="alert">✗ {html.escape(text)}</span>' if text else ""
    return gr.Markdown(value=value, visible=bool(text), **where)


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
            prompt = gr.Textbox(label="Prompt", lines=3, scale=3, elem_id="ab-prompt")
            with gr.Column(scale=1):
                tier = gr.Dropdown([t for t, why in ctx.capabilities.tiers.items() if not why], value="272p",
                                   label="Tier")
                seed = gr.Number(42, precision=0, label="Seed")
                steps = optional_whole_number(label="Steps", placeholder="blank: engine default", elem_id="ab-steps")
                pairs = gr.Number(3, precision=0, label="Pairs")
        request_error = _error_line(box="request")
        sides = {}
        with gr.Row():
            for label in SIDES:
                with gr.Column():
                    gr.Markdown(f"**{label.capitalize()}**")
                    # Each run is a fresh process, so neither side restarts the studio's engine.
                    layout = LP.build_control(ctx, tier, "272p", elem_prefix=f"ab-{label}-layout", restart_notice=False,
                                              same_as=None if label == SIDES[0] else SIDES[0])
                    compile_mode = gr.Dropdown([ENGINE_DEFAULT, *ctx.capabilities.compile_modes],
                                               value=ENGINE_DEFAULT, label="Compile mode",
                                               elem_id=f"ab-{label}-compile")
                    deterministic = gr.Checkbox(True, label="Deterministic", elem_id=f"ab-{label}-deterministic")
                    environment = gr.Textbox(label="Environment variables", lines=2, elem_id=f"ab-{label}-env",
                                             placeholder="one KEY=VALUE a line, e.g. MAGI2_KERNELS=on",
                                             info="set in the side's process before anything is imported")
                    sides[label] = SideFields(layout, compile_mode, deterministic, environment,
                                              _error_line(box=label))
        with gr.Row():
            start = gr.Button("Run the pairs", variant="primary", interactive=in_process_engine, elem_id="ab-start")
            stop = gr.Button("Stop")
        status = gr.Markdown()
        table = gr.Dataframe(headers=COLUMNS, interactive=False, label="Runs")
        verdict = gr.Markdown()

    jobs = BackgroundJobs("ab", (Cancelled, InputError))
    control, candidate = sides[SIDES[0]], sides[SIDES[1]]
    error_lines = [request_error, control.error, candidate.error]

    def read_form(prompt_value, tier_value, seed_value, steps_value, pairs_value, control_env, candidate_env,
                  preset_value, sp_value, cfg_value, ep_value, candidate_preset, candidate_sp, candidate_cfg,
                  candidate_ep, control_compile, candidate_compile, control_deterministic, candidate_deterministic):
        """The pair count, the base request and the two sides; the first InputError names its field."""
        count = check_pairs(int(pairs_value) if pairs_value is not None else 0)
        base = build_request(prompt=prompt_value or "", tier=tier_value,
                             seed=int(seed_value if seed_value is not None else 42),
                             steps=whole_number(steps_value if steps_value not in ("", None) else None, "steps"))
        layouts = {}
        for label, preset, sp, cfg, ep in ((SIDES[0], preset_value, sp_value, cfg_value, ep_value),
                                           (SIDES[1], candidate_preset, candidate_sp, candidate_cfg, candidate_ep)):
            try:
                layouts[label] = (layouts[SIDES[0]] if preset == LP.SAME and label != SIDES[0]
                                  else layout_from_form(preset, sp, cfg, ep).name)
            except InputError as err:
                raise SideRefusal(label, err) from None
        built = (side_from_fields(SIDES[0], base, control_env, layouts[SIDES[0]], control_compile,
                                  control_deterministic),
                 side_from_fields(SIDES[1], base, candidate_env, layouts[SIDES[1]], candidate_compile,
                                  candidate_deterministic))
        return count, base, built

    def check_form(*values):
        """The page's door: each refusal on the line of its part of the form (the request, or a side)."""
        try:
            read_form(*values)
        except (InputError, ValueError) as err:
            side = getattr(err, "side", None) or next(
                (label for label in SIDES if getattr(err, "field", "").startswith(label)), None)
            box = {None: request_error, SIDES[0]: control.error, SIDES[1]: candidate.error}[side]
            yield {line: _error_line(str(err)) if line is box else _error_line() for line in error_lines}
            raise gr.Error(str(err), visible=False, print_exception=False) from None
        yield {line: _error_line() for line in error_lines}

    def run_pairs(prompt_value, tier_value, seed_value, steps_value, pairs_value, control_env, candidate_env,
                  preset_value, sp_value, cfg_value, ep_value, candidate_preset, candidate_sp, candidate_cfg,
                  candidate_ep, control_compile, candidate_compile, control_deterministic, candidate_deterministic,
                  request: gr.Request):
        owner = request.session_hash or "anonymous"
        try:
            count, base, both = read_form(
                prompt_value, tier_value, seed_value, steps_value, pairs_value, control_env, candidate_env,
                preset_value, sp_value, cfg_value, ep_value, candidate_preset, candidate_sp, candidate_cfg,
                candidate_ep, control_compile, candidate_compile, control_deterministic, candidate_deterministic)
        except (InputError, ValueError) as err:
            raise gr.Error(str(err), print_exception=False) from None
        out = ctx.outputs_root / "ab" / time.strftime("%Y%m%d-%H%M%S")
        runs_seen: dict[int, object] = {}
        events = jobs.start(owner, lambda cancel, emit: run_ab(base, both, count, engine_name=ctx.capabilities.engine,
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

    # /ab keeps the shape it had before the sides' fields: the side boxes, then the control's layout where the
    # both-sides layout stood (the candidate's starts as "same as the control"); the new fields follow, defaulted.
    inputs = [prompt, tier, seed, steps, pairs, control.environment, candidate.environment, *control.layout.fields,
              *candidate.layout.fields, control.compile, candidate.compile, control.deterministic,
              candidate.deterministic]
    # A refusal goes once its part of the form changes, as on Generate.
    for side in (control, candidate):
        for field in (*side.layout.fields, side.compile, side.deterministic, side.environment):
            field.change(_error_line, None, side.error, queue=False, api_visibility="private")
    for field in (prompt, tier, seed, steps, pairs):
        field.change(_error_line, None, request_error, queue=False, api_visibility="private")
    start.click(check_form, inputs, error_lines, api_visibility="private").success(
        run_pairs, inputs, [status, table, verdict], api_name="ab", concurrency_limit=1)
    stop.click(stop_pairs, None, status, api_name="ab_stop", queue=False)
