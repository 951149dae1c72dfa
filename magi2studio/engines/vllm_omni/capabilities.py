"""What the installed vLLM-Omni's MAGI-2 pipeline accepts, read from the package itself.

Every answer comes from upstream's own objects: the resolution presets the pipeline
resolves, its topology validator run on real ``OmniDiffusionConfig`` objects (expert
parallel, worker counts; asked through :mod:`magi2studio.vocabulary.topology`), the pipeline's modules
(a refiner), and the signature of the preview evaluation (whether guidance scales and the
negative prompt can be passed per request). The studio greys out, and ``doctor`` explains, whatever is refused here.
"""

from __future__ import annotations

import functools
import inspect
import pkgutil
from dataclasses import asdict, dataclass
from importlib.metadata import version
from typing import Any

from ...vocabulary.topology import probe, upstream_rules


@dataclass(frozen=True)
class UpstreamCapabilities:
    vllm_omni_version: str
    resolutions: dict[str, tuple[int, int]]  # name -> (width, height)
    expert_parallel: bool
    expert_parallel_refusal: str | None
    refiner: bool
    qualified_world_sizes: tuple[int, ...]
    offload_world_size: int | None  # the single-worker layerwise-offload path
    guidance_per_request: bool
    fixed_video_guidance: float
    fixed_audio_guidance: float
    negative_prompt_per_request: bool
    negative_prompt_env: str
    fps: float
    frames: int
    seconds: float
    default_steps: int
    audio_sample_rate: int
    required_checkpoint_paths: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@functools.cache
def detect() -> UpstreamCapabilities:
    from vllm_omni.diffusion.models import magi2
    from vllm_omni.diffusion.models.magi2 import pipeline_magi2
    from vllm_omni.diffusion.models.magi2.configuration_magi2 import MAGI2_GENERATION_CONFIG as gen

    resolutions = dict(pipeline_magi2._RESOLUTION_PRESETS)
    ep_refusal = probe(4, expert_parallel=True)
    rules = upstream_rules()
    modules = [info.name for info in pkgutil.iter_modules(magi2.__path__)]
    evaluate = inspect.signature(pipeline_magi2.Magi2Pipeline._evaluate_preview).parameters
    return UpstreamCapabilities(
        vllm_omni_version=version("vllm-omni"),
        resolutions=resolutions,
        expert_parallel=ep_refusal is None,
        expert_parallel_refusal=ep_refusal,
        refiner=any("refiner" in name for name in modules) or any("1080" in name for name in resolutions),
        qualified_world_sizes=rules.qualified_world_sizes,
        offload_world_size=rules.offload_world_size,
        guidance_per_request=any("guidance" in name for name in evaluate),
        fixed_video_guidance=float(gen.video_guidance_scale),
        fixed_audio_guidance=float(gen.audio_guidance_scale),
        negative_prompt_per_request="negative_prompt" in evaluate,
        negative_prompt_env="MAGI2_NEGATIVE_PROMPT",
        fps=float(gen.fps),
        frames=int(gen.output_frames),
        seconds=float(gen.duration_seconds),
        default_steps=int(gen.preview_steps),
        audio_sample_rate=int(gen.audio_sample_rate),
        required_checkpoint_paths=tuple(pipeline_magi2._REQUIRED_CHECKPOINT_PATHS),
    )


def tier_refusal(caps: UpstreamCapabilities, tier) -> str | None:
    """Why the installed pipeline cannot produce ``tier``, or None."""

    if tier.refined:
        if not caps.refiner:
            return (f"vLLM-Omni {caps.vllm_omni_version} has no MAGI-2 refiner (the 1080p stage, vLLM-Omni "
                    "#8915); it serves the Preview stage only")
        return None
    if tier.name not in caps.resolutions or caps.resolutions[tier.name] != (tier.width, tier.height):
        return f"vLLM-Omni {caps.vllm_omni_version} accepts {', '.join(caps.resolutions)} only"
    if (tier.fps, tier.frames, tier.seconds) != (caps.fps, caps.frames, caps.seconds):
        return (f"the pipeline's output is fixed at {caps.frames} frames, {caps.fps} fps, {caps.seconds:g} s; "
                f"{tier.name} is {tier.frames} frames at {tier.fps} fps")
    return None
