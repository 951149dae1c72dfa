"""The studio's one Layout control (Generate, A/B, Reproduce): what this engine can run first, the rest marked.

The preset's SP / CFG / EP fill the fields below it from the first load on, and one live
verdict next to the control says whether this engine takes the layout; a Generate refusal of
the layout is written into that same line, so two contradictory verdicts never stand together.
Every tab builds it with :func:`build_control` and reads it with ``form.layout_from_form``, so the
choices, the default and the refusal (``layout: ... Fix: ...``) are the same everywhere.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any

import gradio as gr

from ..engines.base import Capabilities, Engine
from ..errors import InputError
from ..vocabulary.layouts import PRESETS, Layout, memory_fit_line, memory_per_gpu_gib
from ..vocabulary.tiers import TIERS, Tier, get_tier
from .context import StudioContext
from .form import CUSTOM, layout_from_form
from .number_field import BLANK, optional_whole_number

REFUSED_MARK = "⊘"
# A second control built with ``same_as`` (A/B's candidate) starts here: the first control's layout.
SAME = "same"
# Engines that run the real checkpoint check its memory fit themselves; for the others the
# fit line is advice for a GPU run, not part of this engine's verdict.
REAL_CHECKPOINT_ENGINES = ("vllm-omni", "vllm-omni-server")


@dataclass(frozen=True)
class PresetState:
    """One preset as this engine sees it for a tier: refused (with the reason) or runnable (with warnings)."""

    name: str
    layout: Layout
    why: str
    refusal: str | None
    warnings: tuple[str, ...]


def preset_states(engine: Engine, tier: Tier) -> list[PresetState]:
    states = []
    ranks_not_gpus = engine.name not in REAL_CHECKPOINT_ENGINES
    for name, (layout, why) in PRESETS.items():
        if ranks_not_gpus:  # the embedded engine runs CPU ranks: the preset's GPU count is its world size here
            why = re.sub(r"\b(\d+) GPUs?\b", lambda m: f"{m[1]} rank" + ("s" if m[1] != "1" else ""), why)
            why = why.replace("per GPU", "per rank")
        try:
            warnings, refusal = tuple(engine.check_layout(layout, tier)), None
        except InputError as err:
            warnings, refusal = (), err.problem
        states.append(PresetState(name, layout, why, refusal, warnings))
    return states


def choices(states: list[PresetState]) -> list[tuple[str, str]]:
    """The dropdown's (label, value) pairs: runnable presets, custom, then the refused ones with their reason."""
    runnable = [(f"{s.name}: {s.why}" + (" (with a warning)" if s.warnings else ""), s.name)
                for s in states if s.refusal is None]
    refused = [(f"{REFUSED_MARK} {s.name}: not on this engine: {s.refusal.removeprefix(f'{s.name} ')}", s.name)
               for s in states if s.refusal is not None]
    return [*runnable, ("custom SP / CFG / EP", CUSTOM), *refused]


def default_preset(engine: Engine, preload: Layout | None, states: list[PresetState], demo: str | None = None) -> str:
    """The layout the engine runs or preloads, else the engine's demo layout (the embedded engine's one
    rank), else the first preset it takes without warnings (PRESETS lists the MUSA report's fastest
    layouts first), else the first it takes at all."""
    layout = engine.layout or preload
    if layout is not None:
        return layout.name if layout.name in PRESETS else CUSTOM
    if demo in PRESETS and any(s.name == demo and s.refusal is None for s in states):
        return demo
    clean = [s.name for s in states if s.refusal is None and not s.warnings]
    runnable = [s.name for s in states if s.refusal is None]
    return (clean or runnable or [CUSTOM])[0]


def fields_for(preset: str, current: Layout | None = None) -> tuple[int, int, int | str]:
    """The SP / CFG / EP fields for a preset (for custom: the running layout's, else 1 / 1 / blank)."""
    layout = PRESETS[preset][0] if preset in PRESETS else (current or Layout())
    return layout.sp, layout.cfg, BLANK if layout.ep is None else layout.ep


def verdict(values: dict[str, Any], capabilities: Capabilities, engine: Engine, gpu_gib: float,
            restart_notice: bool = True) -> str:
    """The live verdict: this engine's check of the form's layout, its warnings, the restart notice
    (where the run uses the studio's engine), and the real checkpoint's memory fit (as advice where
    this engine does not run that checkpoint)."""
    tier_name = values.get("tier") or "272p"
    try:
        layout = layout_from_form(values.get("layout_preset"), values.get("sp"), values.get("cfg"), values.get("ep"))
        warnings = engine.check_layout(layout, get_tier(tier_name) if tier_name in TIERS else TIERS["272p"])
    except InputError as err:
        return f'<span class="m2s-refusal" role="alert">✗ {html.escape(str(err))}</span>'
    lines = [f"✓ **{layout.name} runs on {capabilities.engine}**: world size {layout.world_size}, "
             f"MoE heads split {layout.moe_shards} ways"]
    lines += [f"⚠ {html.escape(warning)}" for warning in warnings]
    current = engine.layout
    if restart_notice and current is not None and current != layout:
        lines.append(f"↻ Generating will restart the engine: it runs {current.name} now, this is {layout.name}.")
    if capabilities.engine in REAL_CHECKPOINT_ENGINES:
        lines.append(f"Per GPU: {memory_fit_line(layout, gpu_gib)}")
    else:  # advice about another engine: no fit verdict beside this engine's ✓
        need = memory_per_gpu_gib(layout)
        lines.append(f"<small>ⓘ Not this engine's limit: a GPU run of the real checkpoint on {layout.name} needs "
                     f"~{need:.0f} GiB per GPU ({gpu_gib:.0f} GiB assumed"
                     f"{'' if need <= gpu_gib else ': more GPUs or offload would be needed there'}).</small>")
    return "\n\n".join(lines)


@dataclass(frozen=True)
class LayoutControl:
    """The components of one Layout control: the preset dropdown, the custom SP / CFG / EP and the verdict line."""

    preset: gr.Dropdown
    sp: gr.Number
    cfg: gr.Number
    ep: gr.Number
    verdict: gr.Markdown

    @property
    def fields(self) -> list[gr.components.Component]:
        return [self.preset, self.sp, self.cfg, self.ep]


def build_control(ctx: StudioContext, tier: gr.components.Component, first_tier: str, *, elem_prefix: str = "layout",
                  restart_notice: bool = True, same_as: str | None = None) -> LayoutControl:
    """Build and wire the Layout control under the current Blocks context; ``tier`` is the tab's tier input.

    ``restart_notice`` is off where a run does not use the studio's engine (A/B runs each in a fresh process).
    ``same_as`` names another control on the tab: this one then offers (and starts at) :data:`SAME`, its layout."""
    caps = ctx.capabilities
    states = preset_states(ctx.engine, get_tier(first_tier))
    first_preset = default_preset(ctx.engine, ctx.slot.preload, states, caps.demo_layout)
    first_sp, first_cfg, first_ep = fields_for(first_preset, ctx.engine.layout or ctx.slot.preload)
    custom = first_preset == CUSTOM and not same_as

    def offered(tier_states: list[PresetState]) -> list[tuple[str, str]]:
        return [(f"same as the {same_as}", SAME), *choices(tier_states)] if same_as else choices(tier_states)

    with gr.Group():
        preset = gr.Dropdown(offered(states), value=SAME if same_as else first_preset, label="Layout",
                             elem_id=f"{elem_prefix}-preset",
                             info=f"{REFUSED_MARK} marks a layout this engine cannot run, with why")
        with gr.Row():
            sp = gr.Number(value=first_sp, label="SP (Ulysses)", precision=None, interactive=custom,
                           elem_id=f"{elem_prefix}-sp", min_width=90)
            cfg = gr.Number(value=first_cfg, label="CFG", precision=None, interactive=custom,
                            elem_id=f"{elem_prefix}-cfg", min_width=90)
            ep = optional_whole_number(first_ep, label="EP", placeholder="= SP",
                                       interactive=custom, elem_id=f"{elem_prefix}-ep", min_width=90)
    line = gr.Markdown(elem_id=f"{elem_prefix}-check")
    control = LayoutControl(preset, sp, cfg, ep, line)
    inputs = [*control.fields, tier]

    def check(preset_value, sp_value, cfg_value, ep_value, tier_value):
        if preset_value == SAME and same_as:
            return f"= the {same_as}'s layout"
        values = {"layout_preset": preset_value, "sp": sp_value, "cfg": cfg_value, "ep": ep_value, "tier": tier_value}
        return verdict(values, caps, ctx.engine, ctx.gpu_gib, restart_notice)

    def preset_changed(preset_value):
        if preset_value == SAME:  # the other control's: its own fields say nothing
            return gr.Number(interactive=False), gr.Number(interactive=False), gr.Number(interactive=False)
        if preset_value not in PRESETS:  # custom: the fields keep their values and open for editing
            return gr.Number(interactive=True), gr.Number(interactive=True), gr.Number(interactive=True)
        sp_value, cfg_value, ep_value = fields_for(preset_value)
        return (gr.Number(value=sp_value, interactive=False), gr.Number(value=cfg_value, interactive=False),
                gr.Number(value=ep_value, interactive=False))

    preset.change(preset_changed, preset, [sp, cfg, ep], queue=False, api_visibility="private").then(
        check, inputs, line, queue=False, api_visibility="private")
    for component in (sp, cfg, ep, tier):
        component.change(check, inputs, line, queue=False, api_visibility="private")
    # What this engine refuses can depend on the tier (1080p's refiner has its own head counts).
    tier.change(lambda t: gr.Dropdown(choices=offered(preset_states(ctx.engine, TIERS[t])))
                if t in TIERS else gr.Dropdown(), tier, preset, queue=False, api_visibility="private")
    ctx.defer(lambda: ctx.demo.load(check, inputs, line, queue=False, api_visibility="private"))
    return control
