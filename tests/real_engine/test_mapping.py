"""Request/layout -> upstream's classes, refusals before upstream, and the output mapping.

``Omni`` does not import on CPU (``vllm_omni.entrypoints`` -> ``janus``, then torchvision,
a CUDA build), and ``Magi2Pipeline.__init__`` refuses without CUDA GPUs. So the mapping is
checked at the last layers that do import: the real ``DiffusionParallelConfig`` /
``OmniDiffusionSamplingParams`` / ``OmniDiffusionConfig``, upstream's
``_validate_native_topology``, and upstream's ``Magi2Pipeline.forward`` itself (all its
request checks), called unbound with only ``_evaluate_preview`` (text encoder + DiT + VAE:
GPU-only) replaced by a recorder that returns arrays shaped like the real decoders'. The
resulting ``DiffusionOutput`` goes through upstream's own output formatter into a real
``OmniRequestOutput``.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from magi2studio.engines.vllm_omni.capabilities import detect, tier_refusal
from magi2studio.engines.vllm_omni import params
from magi2studio.engines.vllm_omni.engine import VllmOmniEngine
from magi2studio.engines.vllm_omni.output import map_output
from magi2studio.errors import EngineError, InputError
from magi2studio.vocabulary.layouts import Layout, parse_layout
from magi2studio.vocabulary.request import build_request
from magi2studio.vocabulary.tiers import get_tier

pipeline_magi2 = pytest.importorskip("vllm_omni.diffusion.models.magi2.pipeline_magi2")
from vllm_omni.diffusion.data import DiffusionParallelConfig, OmniDiffusionConfig  # noqa: E402
from vllm_omni.diffusion.output_formatter import (  # noqa: E402
    format_diffusion_outputs,
    normalize_diffusion_postprocess_output,
)
from vllm_omni.diffusion.request import OmniDiffusionRequest  # noqa: E402
from vllm_omni.diffusion.worker.request_batch import DiffusionRequestBatch  # noqa: E402
from vllm_omni.errors import OmniClientError  # noqa: E402
from vllm_omni.inputs.data import OmniDiffusionSamplingParams  # noqa: E402

FRAMES_SHAPE = (125, 8, 14, 3)  # the real decoder's layout, at a small size
AUDIO_SAMPLES = 441_000


def upstream_forward(prompt, sampling, deterministic=True):
    """Run upstream's real ``Magi2Pipeline.forward`` checks; returns (evaluate kwargs, DiffusionOutput)."""

    calls = []
    rng = np.random.default_rng(0)

    def evaluate_preview(**kwargs):
        calls.append(kwargs)
        return (rng.integers(0, 256, FRAMES_SHAPE, dtype=np.uint8),
                rng.standard_normal((AUDIO_SAMPLES, 2)))  # scipy's resample returns float64

    pipeline = SimpleNamespace(deterministic=deterministic, _evaluate_preview=evaluate_preview)
    batch = DiffusionRequestBatch(requests=[OmniDiffusionRequest(prompt=prompt, sampling_params=sampling,
                                                                 request_id="r0")])
    output = pipeline_magi2.Magi2Pipeline.forward(pipeline, batch)
    return calls[0], output, batch.requests[0]


def as_request_output(diffusion_output, request):
    """Upstream's own path from a pipeline's DiffusionOutput to the OmniRequestOutput Omni returns."""

    raw = pipeline_magi2._magi2_post_process(diffusion_output.output)
    config = OmniDiffusionConfig.from_kwargs(model="sand-ai/MAGI-2-preview", model_class_name="Magi2Pipeline")
    (output,) = format_diffusion_outputs(request=request, od_config=config, diffusion_output=diffusion_output,
                                         output_data=raw,
                                         postprocess_output=normalize_diffusion_postprocess_output(raw))
    return output


@pytest.fixture(scope="module")
def caps():
    return detect()


@pytest.mark.parametrize("tier", ["272p", "540p"])
def test_t2va_sampling_params_pass_upstream_forward_and_map_back(caps, tier):
    request = build_request(prompt="a cat sings", tier=tier, seed=7, steps=3)
    tier_obj = params.check_request(request, caps)
    sampling = params.sampling_params(request, tier_obj, caps)
    assert isinstance(sampling, OmniDiffusionSamplingParams)
    assert (sampling.seed, sampling.num_inference_steps, sampling.num_frames, sampling.fps) == (7, 3, 125, 12.5)
    evaluated, diffusion_output, omni_request = upstream_forward(params.prompt(request), sampling)
    assert (evaluated["width"], evaluated["height"]) == (tier_obj.width, tier_obj.height)
    assert evaluated["num_inference_steps"] == 3 and evaluated["image"] is None
    assert evaluated["prompt"] == "a cat sings"

    output = as_request_output(diffusion_output, omni_request)
    assert type(output).__name__ == "OmniRequestOutput"
    mapped = map_output(output)
    assert mapped.frames.dtype == np.uint8 and mapped.frames.shape == FRAMES_SHAPE
    assert mapped.audio.dtype == np.float32 and mapped.audio.shape == (AUDIO_SAMPLES, 2)
    assert (mapped.fps, mapped.sample_rate) == (12.5, 44_100)
    np.testing.assert_array_equal(mapped.frames, diffusion_output.output["payload"]["video"])
    assert "magi2_preview_e2e" in mapped.stage_ms


def test_i2va_image_goes_in_as_multi_modal_data(caps, tmp_path):
    from PIL import Image

    path = tmp_path / "first.png"
    Image.new("RGB", (64, 40), (200, 30, 10)).save(path)
    request = build_request(mode="i2va", prompt="it moves", image=str(path), steps=2)
    tier = params.check_request(request, caps)
    prompt = params.prompt(request)
    assert set(prompt["multi_modal_data"]) == {"image"}
    evaluated, _, _ = upstream_forward(prompt, params.sampling_params(request, tier, caps))
    assert isinstance(evaluated["image"], Image.Image) and evaluated["image"].size == (64, 40)


def test_output_size_reaches_upstreams_resize_as_a_pair(caps):
    """A listed output size goes as both output_width and output_height (upstream refuses one)."""

    request = build_request(prompt="x", steps=1, output_width=448)
    sampling = params.sampling_params(request, params.check_request(request, caps), caps)
    assert (sampling.extra_args["output_width"], sampling.extra_args["output_height"]) == (448, 256)
    upstream_forward("x", sampling)
    plain = build_request(prompt="x", steps=1)
    assert "output_width" not in params.sampling_params(plain, params.check_request(plain, caps), caps).extra_args
    with pytest.raises(OmniClientError, match="requires output_width and output_height"):
        upstream_forward("x", OmniDiffusionSamplingParams(extra_args={"output_width": 448}))


def test_deterministic_flag_matches_what_upstream_fixes_at_start(caps):
    request = build_request(prompt="x", deterministic=False, steps=1)
    sampling = params.sampling_params(request, params.check_request(request, caps), caps)
    upstream_forward("x", sampling, deterministic=False)
    with pytest.raises(OmniClientError, match="fixed at worker startup"):
        upstream_forward("x", sampling, deterministic=True)  # hence a restart when it changes


def test_upstream_refusals_are_caught_first_with_our_message(caps):
    # 1080p: upstream raises on resolution; we refuse the tier.
    with pytest.raises(InputError, match=r"^tier: vLLM-Omni 0\.30\.0 has no MAGI-2 refiner"):
        params.check_request(build_request(prompt="x", tier="1080p"), caps)
    with pytest.raises(OmniClientError, match="Unsupported native MAGI-2 resolution"):
        upstream_forward("x", OmniDiffusionSamplingParams(extra_args={"resolution": "1080p"}))
    # Size, frames, fps, seconds: each one upstream refuses is refused by tier_refusal first.
    base = get_tier("272p")
    cases = {
        "size": (replace(base, width=640, height=360), dict(width=640, height=360),
                 "Unsupported native MAGI-2 size", "accepts 272p, 540p only"),
        "frames": (replace(base, frames=249), dict(num_frames=249), "fixed at 125 frames", "fixed at 125 frames"),
        "fps": (replace(base, fps=25.0), dict(fps=25.0), "fixed at 12.5 fps", "fixed at 125 frames, 12.5 fps"),
        "seconds": (replace(base, seconds=5.0), dict(extra_args={"seconds": 5.0}), "10-second clips only",
                    "10 s"),
    }
    for name, (tier, fields, upstream_message, our_message) in cases.items():
        with pytest.raises(OmniClientError, match=upstream_message):
            upstream_forward("x", OmniDiffusionSamplingParams(**fields))
        assert our_message in tier_refusal(caps, tier), name
    # Guidance: upstream would silently use 5.0/7.0, so other scales are refused by capability.
    with pytest.raises(InputError, match=r"^video_cfg: .*fixes this guidance scale at 5"):
        params.check_request(build_request(prompt="x", video_cfg=4.0), caps)
    with pytest.raises(InputError, match=r"^audio_cfg: .*fixes this guidance scale at 7"):
        params.check_request(build_request(prompt="x", audio_cfg=3.0), caps)
    with pytest.raises(InputError, match=r"^negative_prompt: .*MAGI2_NEGATIVE_PROMPT"):
        params.check_request(build_request(prompt="x", negative_prompt="blurry"), caps)


def test_layout_maps_to_real_parallel_config_and_omni_kwargs_that_upstream_accepts():
    layout, tier = parse_layout("sp4-cfg2"), get_tier("272p")
    parallel = params.parallel_config(layout, tier)
    assert isinstance(parallel, DiffusionParallelConfig)
    assert (parallel.ulysses_degree, parallel.sequence_parallel_size, parallel.cfg_parallel_size,
            parallel.vae_patch_parallel_size, parallel.enable_expert_parallel) == (4, 4, 2, 1, False)
    assert parallel.world_size == 8
    for platform, pinned in (("musa", False), ("cuda", True)):
        for compile_mode, flags in params.COMPILE_FLAGS.items():
            request = build_request(prompt="x", compile=compile_mode, deterministic=True)
            options = params.start_options(request, layout, tier, platform)
            kwargs = params.omni_kwargs(options, "/ckpt")
            assert kwargs["pin_cpu_memory"] is pinned
            assert (kwargs["enforce_eager"], kwargs["diffusion_compile_dynamic"]) == flags
            assert kwargs["custom_pipeline_args"] == {"magi2_deterministic": True}
            config = OmniDiffusionConfig.from_kwargs(model_class_name="Magi2Pipeline", **kwargs)
            pipeline_magi2._validate_native_topology(config)  # raises if upstream refuses
            assert config.pin_cpu_memory is pinned and config.parallel_config.cfg_parallel_size == 2
    offload = params.omni_kwargs(params.start_options(build_request(prompt="x"), parse_layout("sp1-cfg1-offload"),
                                                      tier, "cuda"), "/ckpt")
    config = OmniDiffusionConfig.from_kwargs(model_class_name="Magi2Pipeline", **offload)
    pipeline_magi2._validate_native_topology(config)
    assert config.enable_layerwise_offload


def test_layout_refusals(caps):
    tier = get_tier("272p")
    with pytest.raises(InputError, match=r"^layout: sp8-cfg1-ep4: vLLM-Omni 0\.30\.0 rejects enable_expert_parallel"):
        params.check_layout(parse_layout("sp8-cfg1-ep4"), tier, caps)
    with pytest.raises(InputError, match=r"has 2 workers; vLLM-Omni 0\.30\.0 qualifies MAGI-2 on 4 or 8"):
        params.check_layout(parse_layout("sp2-cfg1"), tier, caps)
    for name in ("sp4-cfg2", "sp8-cfg1", "sp4-cfg1", "sp2-cfg2", "sp1-cfg1-offload"):
        params.check_layout(parse_layout(name), tier, caps)
    # What upstream refuses and our own checks let through is still refused, in upstream's words.
    with pytest.raises(InputError, match="VAE patch parallelism"):
        params.check_layout(Layout(4, 1, vae_pp=2), tier, caps)


def test_capabilities_of_installed_vllm_omni_0_30_0(caps):
    assert caps.vllm_omni_version == "0.30.0"
    assert caps.resolutions == {"272p": (448, 256), "540p": (896, 512)}
    assert not caps.expert_parallel and "enable_expert_parallel" in caps.expert_parallel_refusal
    assert not caps.refiner and tier_refusal(caps, get_tier("1080p"))
    assert caps.qualified_world_sizes == (4, 8) and caps.offload_world_size == 1
    assert not caps.guidance_per_request and (caps.fixed_video_guidance, caps.fixed_audio_guidance) == (5.0, 7.0)
    assert not caps.negative_prompt_per_request
    assert "preview/model.safetensors.index.json" in caps.required_checkpoint_paths


def test_weights_are_checked_before_any_start(tmp_path):
    root = tmp_path / "MAGI-2-preview"
    (root / "preview").mkdir(parents=True)
    (root / "preview" / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    engine = VllmOmniEngine(checkpoint_root=str(root), work_dir=str(tmp_path / "work"))
    with pytest.raises(InputError) as raised:
        engine.start(parse_layout("sp4-cfg2"))
    text = str(raised.value)
    assert text.startswith("MAGI2_CKPT_ROOT: ") and "text_encoder/model.safetensors.index.json missing" in text
    assert "stable-audio-open-1.0/model.safetensors missing" in text
    assert engine.layout is None and not (tmp_path / "work").exists()  # nothing started, nothing written


def test_malformed_outputs_are_engine_errors():
    from vllm_omni.outputs import OmniRequestOutput

    with pytest.raises(EngineError, match="no video"):
        map_output(OmniRequestOutput.from_diffusion(request_id="r", images=[]))
    video = np.zeros((125, 8, 14, 3), np.uint8)
    with pytest.raises(EngineError, match="no audio"):
        map_output(OmniRequestOutput.from_diffusion(request_id="r", images=[video], multimodal_output={}))
    with pytest.raises(EngineError, match=r"expected audio \[samples, channels\]"):
        map_output(OmniRequestOutput.from_diffusion(request_id="r", images=[video], multimodal_output={
            "audio": np.zeros((2, 441_000), np.float32), "audio_sample_rate": 44_100, "fps": 12.5}))


def test_stage_durations_in_seconds_and_orchestrator_keys_in_ms_both_map_to_ms():
    """Measured on the H100 (2026-12-06): a 13.0 s generate came back with stage_0_gen_ms = 12954919."""

    from vllm_omni.outputs import OmniRequestOutput

    video = np.zeros((125, 8, 14, 3), np.uint8)
    output = OmniRequestOutput.from_diffusion(
        request_id="r", images=[video],
        multimodal_output={"audio": np.zeros((441_000, 2), np.float32), "audio_sample_rate": 44_100, "fps": 12.5},
        stage_durations={"magi2_preview_e2e": 12.947, "stage_0_gen_ms": 12954.9, "queue_wait_ms": 0.339})
    assert map_output(output).stage_ms == pytest.approx(
        {"magi2_preview_e2e": 12947.0, "stage_0_gen_ms": 12954.9, "queue_wait_ms": 0.339})
