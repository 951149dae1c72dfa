"""Request and layout -> vLLM-Omni's own argument objects, and every refusal before start.

Built with the real classes: ``DiffusionParallelConfig`` and ``OmniDiffusionSamplingParams``
(both import on CPU). ``Omni`` itself does not import here (its engine imports ``janus``,
then torchvision, a CUDA build), so the Omni keyword arguments are checked through the last
layer that does import: ``OmniDiffusionConfig.from_kwargs`` plus the pipeline's own
``_validate_native_topology``. Whatever upstream's pipeline would refuse (size, frames, fps,
seconds, guidance, topology) is refused here first as an :class:`InputError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import InputError
from ...vocabulary.layouts import Layout, check_shape
from ...vocabulary.request import Request, output_size
from ...vocabulary.tiers import Tier, get_tier
from ...vocabulary.topology import refusal as topology_refusal
from .capabilities import UpstreamCapabilities, tier_refusal

COMPILE_MODES = ("static", "dynamic", "eager")
DEFAULT_COMPILE = "dynamic"  # upstream's defaults: enforce_eager=False, diffusion_compile_dynamic=True
# compile mode -> (enforce_eager, diffusion_compile_dynamic)
COMPILE_FLAGS = {"static": (False, False), "dynamic": (False, True), "eager": (True, True)}


@dataclass(frozen=True)
class StartOptions:
    """Everything that is fixed when an ``Omni`` starts; a change means a restart."""

    layout: Layout
    vae_patch_parallel_size: int
    compile: str
    deterministic: bool
    platform: str  # "cuda", "musa", ...

    def as_dict(self) -> dict[str, Any]:
        return {"layout": self.layout.name, "vae_patch_parallel_size": self.vae_patch_parallel_size,
                "compile": self.compile, "deterministic": self.deterministic, "platform": self.platform}


def check_request(request: Request, caps: UpstreamCapabilities) -> Tier:
    """Refuse what the installed pipeline cannot honour; return the tier."""

    tier = get_tier(request.tier)
    reason = tier_refusal(caps, tier)
    if reason:
        raise InputError("tier", reason, f"use {' or '.join(caps.resolutions)}, or the embedded engine")
    if not caps.guidance_per_request:
        for name, fixed in (("video_cfg", caps.fixed_video_guidance), ("audio_cfg", caps.fixed_audio_guidance)):
            if getattr(request, name) != fixed:
                raise InputError(
                    name, f"vLLM-Omni {caps.vllm_omni_version} fixes this guidance scale at {fixed:g} (it "
                    "would be ignored, not applied)", f"set {name} to {fixed:g}, or use the embedded engine")
    if request.negative_prompt is not None and not caps.negative_prompt_per_request:
        raise InputError(
            "negative_prompt", f"vLLM-Omni {caps.vllm_omni_version} reads the negative prompt from env "
            f"{caps.negative_prompt_env} in its workers, not from the request",
            f"drop negative_prompt and export {caps.negative_prompt_env} before the engine starts")
    if request.refiner_steps is not None and not caps.refiner:
        raise InputError("refiner_steps", f"vLLM-Omni {caps.vllm_omni_version} has no refiner stage",
                         "drop refiner_steps")
    return tier


def check_layout(layout: Layout, tier: Tier, caps: UpstreamCapabilities) -> None:
    """The layout rules of the installed pipeline (the real-model rules are checked by the caller)."""

    check_shape(layout)
    if layout.ep is not None and not caps.expert_parallel:
        raise InputError(
            "layout", f"{layout.name}: vLLM-Omni {caps.vllm_omni_version} rejects enable_expert_parallel "
            "(the MUSA report's #8511 adds it)",
            f"drop -ep{layout.ep}: {caps.vllm_omni_version} shards the MoE heads over the Ulysses group "
            f"(sp{layout.sp} -> {layout.sp} shards)")
    if layout.ep is not None and layout.ep != layout.sp:
        raise InputError("layout", f"{layout.name}: only an EP degree equal to the Ulysses degree maps onto "
                         "enable_expert_parallel", f"use -ep{layout.sp} or drop -ep{layout.ep}")
    if layout.offload:
        if caps.offload_world_size != layout.world_size:
            raise InputError("layout", f"vLLM-Omni {caps.vllm_omni_version} has no layerwise-offload path for "
                             f"{layout.world_size} workers", "use sp1-cfg1-offload, or drop -offload")
    elif layout.world_size not in caps.qualified_world_sizes:
        raise InputError(
            "layout", f"{layout.name} has {layout.world_size} workers; vLLM-Omni {caps.vllm_omni_version} qualifies "
            f"MAGI-2 on {' or '.join(map(str, caps.qualified_world_sizes))} workers, or one with layerwise offload",
            "pick a qualified layout (e.g. sp4-cfg2, sp8-cfg1, sp4-cfg1, sp1-cfg1-offload)")
    refusal = topology_refusal(parallel_config(layout, tier), enable_layerwise_offload=layout.offload)
    if refusal:
        raise InputError("layout", f"{layout.name}: {refusal}", "pick a layout the pipeline accepts")


def start_options(request: Request, layout: Layout, tier: Tier, platform: str) -> StartOptions:
    compile_mode = request.compile or DEFAULT_COMPILE
    return StartOptions(layout, layout.vae_patch_parallel(tier), compile_mode, request.deterministic, platform)


def parallel_config(layout: Layout, tier: Tier):
    return _parallel_config(layout, layout.vae_patch_parallel(tier))


def _parallel_config(layout: Layout, vae_patch_parallel_size: int):
    from vllm_omni.diffusion.data import DiffusionParallelConfig

    return DiffusionParallelConfig(
        ulysses_degree=layout.sp,
        sequence_parallel_size=layout.sp,
        cfg_parallel_size=layout.cfg,
        vae_patch_parallel_size=vae_patch_parallel_size,
        enable_expert_parallel=layout.ep is not None,
    )


def omni_kwargs(options: StartOptions, checkpoint_root: str) -> dict[str, Any]:
    """Keyword arguments for ``Omni(**kwargs)`` (``model`` included)."""

    enforce_eager, compile_dynamic = COMPILE_FLAGS[options.compile]
    layout = options.layout
    return {
        "model": checkpoint_root,
        "parallel_config": _parallel_config(layout, options.vae_patch_parallel_size),
        "enforce_eager": enforce_eager,
        "diffusion_compile_dynamic": compile_dynamic,
        # MUSA: pinned host staging of the auxiliaries OOMs the host (MUSA report: --no-pin-cpu-memory).
        "pin_cpu_memory": options.platform != "musa",
        "enable_layerwise_offload": layout.offload,
        "custom_pipeline_args": {"magi2_deterministic": options.deterministic},
    }


def sampling_params(request: Request, tier: Tier, caps: UpstreamCapabilities):
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    extra = {"resolution": tier.name, "seconds": tier.seconds, "deterministic": request.deterministic}
    if request.output_width is not None or request.output_height is not None:
        # Upstream resizes the generated clip when given both (it refuses one alone).
        extra["output_width"], extra["output_height"] = output_size(request, tier)
    return OmniDiffusionSamplingParams(
        seed=request.seed,
        num_inference_steps=request.steps or caps.default_steps,
        height=tier.height,
        width=tier.width,
        num_frames=tier.frames,
        fps=tier.fps,
        extra_args=extra,
    )


def prompt(request: Request) -> str | dict[str, Any]:
    """The prompt as upstream takes it; I2VA carries the first frame as ``multi_modal_data.image``."""

    if request.mode != "i2va":
        return request.prompt
    from PIL import Image

    with Image.open(request.image) as image:
        first_frame = image.convert("RGB")
    return {"prompt": request.prompt, "multi_modal_data": {"image": first_frame}}
