"""The refiner's parts without a full 1080p run: recipe, schedule, DiT structure, layout rules, sizes."""

from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
import torch

from magi2studio.errors import InputError
from magi2studio.vocabulary.layouts import Layout
from magi2studio.vocabulary.request import build_request, output_size
from magi2studio.vocabulary.tiers import get_tier
from magi2studio.engines.timing import StepTimer, active, stage

SHARED = Path("/work/shared/sandai-assets/magi2_refiner.json")


def test_the_recipe_is_sand_ais_and_the_bundled_json_is_theirs():
    from magi2studio.engines.embedded.refiner import SANDAI_REFINER_JSON, refiner_recipe

    from magi2studio.engines.embedded.tiny import TinyConfig

    recipe = refiner_recipe()
    assert ((recipe.noise_value, recipe.shift, recipe.video_cfg, recipe.audio_cfg, recipe.steps)
            == (220, 5.0, 2.0, 5.0, 5))
    assert get_tier("1080p").refiner_steps == TinyConfig().default_refiner_steps == recipe.steps
    if SHARED.is_file():
        assert SANDAI_REFINER_JSON.read_bytes() == SHARED.read_bytes()


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_the_schedule_starts_at_the_noise_value_on_the_shifted_curve(steps):
    from magi2studio.engines.embedded.refiner import refiner_recipe, refiner_schedulers

    recipe = refiner_recipe()
    sigma, video, audio = refiner_schedulers(steps, recipe, torch.device("cpu"))
    assert sigma == pytest.approx(0.22)
    assert len(video.timesteps) == steps and torch.equal(video.timesteps, audio.timesteps)
    assert int(video.timesteps[0]) == 220 and video.sigmas[0].item() == pytest.approx(0.22, abs=1e-6)
    assert (video.timesteps[1:] < video.timesteps[:-1]).all() and video.sigmas[-1] == 0


@pytest.fixture(scope="module")
def components():
    """The embedded engine's components loaded in this process as its rank loads them, on world-1 groups."""

    from magi2studio.engines.embedded import upstream_patches
    from magi2studio.engines.embedded.components import load_components
    from magi2studio.engines.embedded.engine import EmbeddedEngine

    upstream_patches.init_world_of_one()
    try:
        yield load_components(EmbeddedEngine().checkpoint())
    finally:
        upstream_patches.destroy_parallel()


def test_the_refiner_dit_is_dense_gqa_with_multimodal_ends_and_windowed_layers(components):
    from vllm_omni.diffusion.models.magi2.modeling_magi2 import Magi2MLP, Magi2PreviewTransformer

    from magi2studio.engines.embedded.block_window import BlockWindowAttentionKernel

    config, refiner = components.config, components.refiner
    assert isinstance(refiner, Magi2PreviewTransformer) and len(refiner.block.layers) == config.refiner_num_layers
    for index, layer in enumerate(refiner.block.layers):
        assert isinstance(layer.mlp, Magi2MLP)  # dense: no multi-head MoE anywhere
        assert layer.attention.num_modality == (3 if index in config.refiner_multimodal_layers else 1)
        assert layer.attention.num_heads_q == 8 and layer.attention.num_heads_kv == 2
        kernel = layer.attention.packed_attention.attention
        assert isinstance(kernel, BlockWindowAttentionKernel) == (index in config.refiner_local_attn_layers)
    assert components.loaded_weights == len(components.transformer.state_dict())


def test_the_refiner_forward_equals_one_with_the_explicit_mask(components, monkeypatch):
    """The whole DiT, its layout built from upstream's packing, against the dense masked oracle."""

    from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler

    from magi2studio.engines.embedded import block_window

    refiner = components.refiner
    sampler = Magi2PreviewSampler(refiner)
    generator = torch.Generator().manual_seed(3)
    model_input = sampler.prepare_model_input(
        torch.randn(1, 48, 5, 6, 7, generator=generator), torch.randn(1, 10, 64, generator=generator),
        torch.randn(1, 9, 128, generator=generator), torch.randn(1, 4, 128, generator=generator), t=torch.tensor(220.0))
    packed = sampler.data_proxy.process_input(model_input)
    with torch.inference_mode():
        windowed = refiner(*packed.model_args)
        mask = block_window.reference_mask(packed.coords_mapping, packed.modality_mapping,
                                           packed.varlen_handler.cu_seqlens_q, refiner.window)
        assert not mask.all()
        monkeypatch.setattr(block_window, "block_window_attention",
                            lambda q, k, v, layout, sink: block_window.masked_dense_attention(q, k, v, mask, sink))
        reference = refiner(*packed.model_args)
        sample = torch.bucketize(torch.arange(mask.shape[0]), packed.varlen_handler.cu_seqlens_q[1:].long(), right=True)
        full = sample[:, None] == sample[None, :]
        monkeypatch.setattr(block_window, "block_window_attention",
                            lambda q, k, v, layout, sink: block_window.masked_dense_attention(q, k, v, full, sink))
        unwindowed = refiner(*packed.model_args)
    torch.testing.assert_close(windowed, reference, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(windowed, unwindowed, atol=1e-3)


def test_refined_video_decodes_in_chunks_to_the_delivered_size(components):
    from magi2studio.engines.embedded.driver import EmbeddedDriver

    driver = EmbeddedDriver(components)
    latent = torch.randn(1, 48, components.config.refiner_latent_frames, 17, 30,
                         generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        frames = driver.decode_refined_video(latent, 1920, 1080, 249)
    assert frames.shape == (249, 1080, 1920, 3) and frames.dtype == np.uint8
    # 249 frames sample the decoder's frames evenly: runs of equal frames, more than one distinct.
    distinct = 1 + int(np.count_nonzero(np.any(frames[1:] != frames[:-1], axis=(1, 2, 3))))
    assert 1 < distinct < 249


def test_1080p_layout_rules_in_the_embedded_engine():
    from magi2studio.engines.embedded.engine import EmbeddedEngine

    engine = EmbeddedEngine()
    tier = get_tier("1080p")
    assert engine.capabilities().tiers["1080p"] is None
    engine.check_layout(Layout(2, 1), tier)
    refusal = r"^layout: the tiny config's 2 refiner KV groups do not divide by sp4\. Fix: use sp1, sp2$"
    with pytest.raises(InputError, match=refusal):
        engine.check_layout(Layout(4, 1), tier)
    engine.check_layout(Layout(4, 1), get_tier("540p"))  # the preview alone has 4 KV groups
    with pytest.raises(InputError, match="VAE patch-parallel = world size"):
        engine.check_layout(Layout(1, 2, vae_pp=1), tier)


def test_output_size_is_the_generated_one_or_a_listed_resize():
    assert output_size(build_request(prompt="p", tier="1080p"), get_tier("1080p")) == (1920, 1088)
    assert output_size(build_request(prompt="p", tier="1080p", output_height=1080), get_tier("1080p")) == (1920, 1080)
    for fields, message in [
        ({"tier": "1080p", "output_height": 1000},
         "output_height: 1000 is not an output size of the 1080p tier. Fix: "),
        ({"tier": "1080p", "output_width": 1280}, "output_width: 1280 is not an output size of the 1080p tier. Fix: "),
        ({"tier": "272p", "output_height": 1080}, "output_height: 1080 is not an output size of the 272p tier. Fix: "),
        ({"tier": "1080p", "output_height": True}, "output_height: "),
    ]:
        with pytest.raises(InputError) as caught:
            build_request(prompt="p", **fields)
        assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_stage_relabels_the_active_timers_steps_for_the_block():
    timer = StepTimer(stage="preview")
    with active(timer):
        for name in ("preview", "refiner", "preview"):
            with stage(name) if name == "refiner" else nullcontext():
                timer.begin_sample(torch.zeros(1), 1)
                timer.step_start()
                timer.step_end()
                timer.end_sample()
    assert [r.stage for r in timer.records] == ["preview", "refiner", "preview"]


def test_cli_output_size_and_refiner_steps_flags_reach_the_request():
    import argparse

    from magi2studio.commands.generate import add_request_arguments, request_from_args

    parser = argparse.ArgumentParser()
    add_request_arguments(parser)
    request = request_from_args(parser.parse_args(["--prompt", "p", "--tier", "1080p", "--refiner-steps", "3",
                                                   "--output-height", "1080"]))
    assert (request.refiner_steps, output_size(request, get_tier("1080p"))) == (3, (1920, 1080))
    with pytest.raises(InputError, match="^output_height: 1000 is not an output size of the 1080p tier"):
        request_from_args(parser.parse_args(["--prompt", "p", "--tier", "1080p", "--output-height", "1000"]))


def test_the_studio_form_passes_refiner_steps_for_1080p():
    from magi2studio.engines.embedded.engine import EmbeddedEngine
    from magi2studio.studio.form import plan_from_form

    engine = EmbeddedEngine()
    plan = plan_from_form({"prompt": "p", "tier": "1080p", "refiner_steps": "3", "video_cfg": 5.0,
                           "audio_cfg": 7.0, "layout_preset": "sp1-cfg1"}, engine.capabilities(), engine)
    request, layout = plan.request, plan.layout
    assert (request.tier, request.refiner_steps, layout.name) == ("1080p", 3, "sp1-cfg1")
    assert plan.resolved["refiner_steps"] == 3

    def planned_refiner_steps(request):
        return engine.plan(request, layout).resolved["refiner_steps"]

    assert planned_refiner_steps(build_request(prompt="p", tier="1080p")) == engine.config.default_refiner_steps
    assert planned_refiner_steps(build_request(prompt="p", tier="540p", refiner_steps=3)) is None


def test_the_tiny_tree_passes_the_1080p_weights_check(components):
    from magi2studio.weights import check_weights

    report = check_weights(components.root, tier="1080p")
    assert report.problems == [] and (components.root / "refiner" / "model.safetensors.index.json").is_file()
