"""Training runs through upstream's classes and its checkpoint loads back into them (slow)."""

from dataclasses import replace

import pytest
import torch

from magi2studio.errors import InputError
from magi2studio.training import latents as codes
from magi2studio.training import trainer
from magi2studio.vocabulary.tiers import TIERS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from magi2studio.engines.embedded import upstream_patches
    from magi2studio.engines.embedded.checkpoint import ensure_checkpoint
    from magi2studio.engines.embedded.components import load_components

    config = trainer.trained_config()
    base = ensure_checkpoint(config, tmp_path_factory.mktemp("base"))
    upstream_patches.init_world_of_one()
    try:
        components = load_components(base)
        components.image_encoder.load_state_dict(codes.image_encoder_state(config.spatial_stride))
        settings = trainer.TrainSettings(scenes=3, dit_steps=1, batch=2)
        yield config, base, components, trainer.make_examples(config, settings), settings
    finally:
        upstream_patches.destroy_parallel()


@pytest.mark.parametrize("i2va", [False, True])
def test_dit_steps_on_one_batch_lower_its_loss(setup, i2va):
    from vllm_omni.diffusion.models.magi2.pipeline_magi2 import DEFAULT_NEGATIVE_PROMPT
    from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler

    _, _, components, examples, _ = setup
    model = components.transformer
    state = {k: v.clone() for k, v in model.state_dict().items()}
    proxy = components.config.data_proxy()
    sampler = Magi2PreviewSampler(model, proxy, device="cpu")
    text = components.text_encoder
    conditioning = trainer.Conditioning(text, text.encode(DEFAULT_NEGATIVE_PROMPT).float())
    with torch.no_grad():
        batch = trainer.dit_batch(sampler, conditioning, components.image_encoder, text, examples, [0, 1], i2va,
                                  torch.Generator().manual_seed(3), uncond_share=0.5)
    model_input = batch[0]
    assert (model_input.ref_image_feat is not None) == i2va
    assert model_input.x_t.shape[0] == 2  # one branch per sample, as the CFG-parallel split gives it
    trainable = [p for n, p in model.named_parameters() if "router.expert_bias" not in n]
    optimizer = torch.optim.Adam(trainable, lr=1e-3)
    model.train()
    for p in trainable:
        p.requires_grad_(True)
    losses = []
    try:
        for _ in range(4):
            video, audio = trainer.dit_loss(model, proxy, *batch)
            optimizer.zero_grad()
            (video + audio).backward()
            optimizer.step()
            losses.append(float((video + audio).detach()))
    finally:
        model.eval().requires_grad_(False)
        model.load_state_dict(state)
    assert losses[-1] < losses[0], losses


def _residual_path_singular_values(components, examples) -> torch.Tensor:
    """The product of every residual mix of one forward (the 4 layers' attention and MLP branches): per token,
    how much of each of the 4 mHC streams reaches the output through the residual path (median over tokens)."""

    from vllm_omni.diffusion.models.magi2 import layers
    from vllm_omni.diffusion.models.magi2.pipeline_magi2 import DEFAULT_NEGATIVE_PROMPT
    from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler

    proxy = components.config.data_proxy()
    sampler = Magi2PreviewSampler(components.transformer, proxy, device="cpu")
    text = components.text_encoder
    conditioning = trainer.Conditioning(text, text.encode(DEFAULT_NEGATIVE_PROMPT).float())
    mixes, original = [], layers.MHCHandler.compute_post_residual

    def recording(self, post, residual, *, out_dtype):
        coefficients, mix = original(self, post, residual, out_dtype=out_dtype)
        mixes.append(mix.float())
        return coefficients, mix

    layers.MHCHandler.compute_post_residual = recording
    try:
        with torch.no_grad():
            batch = trainer.dit_batch(sampler, conditioning, components.image_encoder, text, examples, [0], False,
                                      torch.Generator().manual_seed(3), uncond_share=0.0)
            components.transformer(*proxy.process_input(batch[0]).model_args)
    finally:
        layers.MHCHandler.compute_post_residual = original
    product = mixes[0]
    for mix in mixes[1:]:
        product = torch.bmm(mix, product)
    return torch.linalg.svdvals(product).median(dim=0).values


def test_a_fresh_dit_run_keeps_the_four_residual_streams_apart(setup):
    """A 16-pixel video token is 192 values: the residual path must carry all of them (the seeded mixes
    collapse the 4 streams into one 128 wide, and the 2500-step GPU run kept 64 dimensions of noise)."""

    config, _, components, examples, _ = setup
    model = components.transformer
    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        seeded = _residual_path_singular_values(components, examples)
        trainer.open_residual_streams(model)
        opened = _residual_path_singular_values(components, examples)
    finally:
        model.load_state_dict(state)
    assert config.video_token_channels == 192 > config.hidden_size
    assert seeded[0] > 0.99 and seeded[1:].max() < 0.01, seeded  # rank 1: one stream, hidden_size wide
    assert opened.min() > 0.8, opened  # all 4: 4 x 128 = 512 wide


def test_a_dit_run_stopped_and_resumed_ends_with_the_uninterrupted_runs_weights_bit_for_bit(setup):
    """A device call's time limit splits a long run; --resume must continue it exactly: model,
    AdamW moments, schedule and the batch generator all come back (any one left out changes the
    weights)."""
    config, _, components, examples, _ = setup
    settings = trainer.TrainSettings(scenes=3, dit_steps=4, batch=2, log_every=1)
    model = components.transformer
    initial = {k: v.clone() for k, v in model.state_dict().items()}

    def run(stop_after: int | None = None, resume: dict | None = None) -> tuple[dict, dict | None, trainer.TrainLog]:
        model.load_state_dict(initial)
        log = trainer.TrainLog(settings.as_dict(), config.digest)
        saved = {}

        def on_step(step, loss, snapshot):
            if stop_after is not None and step + 1 == stop_after:
                saved["state"] = snapshot()
                return True
            return False

        done = trainer.train_dit(components, examples, settings, log, torch.Generator().manual_seed(2),
                                 on_step=on_step, resume=resume)
        assert done == (stop_after or settings.dit_steps)
        return {k: v.clone() for k, v in model.state_dict().items()}, saved.get("state"), log

    try:
        straight, _, straight_log = run()
        _, state, _ = run(stop_after=2)
        assert state["step"] == 2
        trainer.check_resumable(state, settings, config.digest)
        resumed, _, resumed_log = run(resume=state)
    finally:
        model.load_state_dict(initial)
    changed = [k for k in straight if not torch.equal(straight[k], initial[k])]
    assert changed, "four steps changed no weight"
    assert all(torch.equal(straight[k], resumed[k]) for k in straight), \
        [k for k in straight if not torch.equal(straight[k], resumed[k])][:5]
    strip = lambda log: [{k: v for k, v in row.items() if k != "seconds"} for row in log.phases["dit"]]  # noqa: E731
    assert strip(resumed_log) == strip(straight_log)
    with pytest.raises(InputError, match="--resume: the saved state was trained with dit_steps=4"):
        trainer.check_resumable(state, replace(settings, dit_steps=8), config.digest)
    # a state saved before noise_shift existed was drawn at the sampler's shift: it resumes at that, and only that
    older = {**state, "log": {**state["log"], "settings": {k: v for k, v in state["log"]["settings"].items()
                                                          if k != "noise_shift"}}}
    trainer.check_resumable(older, settings, config.digest)
    with pytest.raises(InputError, match="--resume: the saved state was trained with noise_shift=7.0"):
        trainer.check_resumable(older, replace(settings, noise_shift=1.0), config.digest)


def test_the_noise_shift_setting_is_the_training_draws_shift(setup, monkeypatch):
    """``TrainSettings.noise_shift`` reaches each sample's noise level: sigma = shifted_sigma(u, shift) of the
    same uniform draws, so shift 1 gives u itself and the sampler's 7 gives the higher levels it gave before."""
    from vllm_omni.diffusion.models.magi2.pipeline_magi2 import DEFAULT_NEGATIVE_PROMPT
    from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler

    _, _, components, examples, _ = setup
    sampler = Magi2PreviewSampler(components.transformer, components.config.data_proxy(), device="cpu")
    text = components.text_encoder
    conditioning = trainer.Conditioning(text, text.encode(DEFAULT_NEGATIVE_PROMPT).float())
    drawn = []
    flow_pair = trainer.flow_pair
    monkeypatch.setattr(trainer, "flow_pair",
                        lambda x0, noise, sigma: drawn.append(sigma) or flow_pair(x0, noise, sigma))

    def sigmas(**shift) -> list[float]:
        drawn.clear()
        with torch.no_grad():
            trainer.dit_batch(sampler, conditioning, components.image_encoder, text, examples, [0, 1, 2], False,
                              torch.Generator().manual_seed(11), **shift)
        return drawn[::2]  # video's; the audio of each sample shares its sigma

    generator = torch.Generator().manual_seed(11)
    uniform = []
    for _ in range(3):  # dit_batch's draws per sample: u, the video noise, the audio noise, the branch
        uniform.append(float(torch.rand((), generator=generator)))
        torch.randn(examples[len(uniform) - 1].video.shape, generator=generator)
        torch.randn(examples[len(uniform) - 1].audio.shape, generator=generator)
        torch.rand((), generator=generator)
    assert sigmas(noise_shift=1.0) == pytest.approx(uniform, abs=0)
    assert sigmas() == sigmas(noise_shift=trainer.SHIFT) == [trainer.shifted_sigma(u, trainer.SHIFT) for u in uniform]
    assert trainer.TrainSettings().noise_shift == trainer.SHIFT


def test_the_trained_checkpoint_loads_back_into_upstreams_classes(setup, tmp_path):
    from magi2studio.engines.embedded import EmbeddedEngine
    from magi2studio.engines.embedded.components import load_components
    from magi2studio.engines.embedded.tiny_weights import tree_sha256

    config, base, components, _, _ = setup
    trainer.set_video_decoder(components.video_decoder)
    trainer.set_audio_decoder(components.audio_decoder)
    dit = {k: v + 0.01 for k, v in components.transformer.state_dict().items()}  # differs from the base
    out = trainer.write_trained_checkpoint(base, tmp_path / "trained", config, dit=dit,
                                           turbo=trainer.turbo_state(components.video_decoder),
                                           oobleck=trainer.oobleck_state(components.audio_decoder))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "the temp folder is gone"
    loaded = load_components(out)
    for name, tensor in loaded.transformer.state_dict().items():
        if "router.expert_bias" not in name:  # upstream's loader copies the EMA bias over it
            torch.testing.assert_close(tensor, dit[name])
    torch.testing.assert_close(loaded.video_decoder.decoder.state_dict(), components.video_decoder.decoder.state_dict())
    torch.testing.assert_close(loaded.audio_decoder.decoder.state_dict(), components.audio_decoder.decoder.state_dict())
    engine = EmbeddedEngine(weights=str(out))
    assert engine.config == config
    info = engine.info()
    assert info["weights"] == str(out) and info["weights_sha256"] == tree_sha256(out)


def test_the_set_audio_decoder_sounds_each_held_out_scene_s_pitch_at_its_bounces(setup):
    """Upstream's Oobleck decoder with the set weights inverts the code: the spectral peak is the
    scene's pitch and every beep starts within 10 ms of the scene's; the code's halves swapped
    give the other pitch."""
    import math

    from magi2studio.semantic.scenes import HELD_OUT, PITCHES, make_scene
    from magi2studio.semantic.score import analyse_audio

    config, _, components, _, _ = setup
    assert codes.audio_pitches(config.audio_latent_fps) == PITCHES
    trainer.set_audio_decoder(components.audio_decoder)
    rate = config.audio_latent_fps * math.prod(config.audio_strides)
    for facts in [f for f in HELD_OUT if f.pitch == "low"][:2] + [f for f in HELD_OUT if f.pitch == "high"][:2]:
        scene = make_scene(facts, TIERS["272p"], 0)
        code = codes.encode_audio(scene, config.audio_latent_fps)
        with torch.no_grad():
            heard = analyse_audio(components.audio_decoder.decoder(code.T[None])[0].numpy().T, rate)
            swapped = analyse_audio(components.audio_decoder.decoder(code.roll(32, dims=1).T[None])[0].numpy().T, rate)
        expected = analyse_audio(codes.audio_target(scene, rate).numpy().T, rate)
        assert heard.pitch == facts.pitch and swapped.pitch != facts.pitch
        assert len(heard.onsets) == len(expected.onsets) == len(scene.bounce_times)
        assert max(abs(a - b) for a, b in zip(heard.onsets, expected.onsets)) <= 0.010


def test_a_weights_folder_that_is_not_a_checkpoint_is_refused(tmp_path):
    from magi2studio.engines.embedded import EmbeddedEngine

    with pytest.raises(InputError) as err:
        EmbeddedEngine(weights=str(tmp_path))
    assert err.value.field == "weights"


def test_the_shipped_trained_weights_match_their_pin_and_a_changed_byte_is_refused(tmp_path, monkeypatch):
    import shutil

    from magi2studio.engines.embedded import tiny_weights

    assert tiny_weights.checkpoint_folder("trained") == tiny_weights.TRAINED_FOLDER
    copy = tmp_path / "tiny-trained"
    shutil.copytree(tiny_weights.TRAINED_FOLDER, copy)
    config = copy / "magi2studio-tiny.json"
    config.write_text(config.read_text() + " ")
    monkeypatch.setattr(tiny_weights, "TRAINED_FOLDER", copy)
    with pytest.raises(InputError, match=r"^weights: the shipped trained checkpoint .* not the pinned .*Fix: restore"):
        tiny_weights.checkpoint_folder("trained")


def test_a_replay_names_the_weights_its_run_recorded_and_refuses_a_changed_folder(tmp_path, monkeypatch):
    import shutil

    from magi2studio.commands.replay import engine_options_of_run
    from magi2studio.engines.embedded import tiny_weights

    monkeypatch.delenv(tiny_weights.WEIGHTS_ENV, raising=False)
    assert tiny_weights.requested_weights() == "trained"  # the default everywhere (CLI, studio, demo, queue)
    assert engine_options_of_run({"embedded": True, "weights": "random"}) == {"weights": "random"}
    moved = {"embedded": True, "weights": "/elsewhere/tiny-trained", "weights_sha256": tiny_weights.TRAINED_SHA256}
    assert engine_options_of_run(moved) == {"weights": "trained"}  # another install's path, the same pinned tree
    assert engine_options_of_run({"embedded": False, "name": "vllm-omni"}) == {}
    copy = tmp_path / "mine"
    shutil.copytree(tiny_weights.TRAINED_FOLDER, copy)
    config = copy / "magi2studio-tiny.json"
    config.write_text(config.read_text() + " ")  # a tree of its own
    run = {"embedded": True, "weights": str(copy), "weights_sha256": tiny_weights.tree_sha256(copy)}
    assert engine_options_of_run(run) == {"weights": str(copy)}
    config.write_text(config.read_text() + " ")  # changed since the run
    with pytest.raises(InputError, match=r"^weights: the run.s checkpoint folder .* now has .*Fix: restore"):
        engine_options_of_run(run)


def test_the_set_video_decoder_shows_each_held_out_scene_s_object(setup):
    """Upstream's loaded TurboVAE decoder with the set weights decodes held-out scenes' own codes to the
    code's exact inverse (every cell's colour at each of the 49 frames; checked on 4 of the 24 scenes, as
    each decode takes about 12 s of CI's 2 cores), and that inverse, shown as the driver shows it, lets the
    score find the caption's colour, shape and motion in all but at most one of the 24 scenes (the score
    tells a staircase triangle from a staircase circle by where its mass sits: docs/training.md).
    Mutations, on 6 of the scenes: the code's red and blue swapped give a colour mismatch wherever that
    changes the colour; each latent frame's 16 time slots reversed (a sawtooth path) break the motion in
    at least half."""
    import numpy as np
    from vllm_omni.diffusion.models.magi2.pipeline_magi2 import _resize_video

    from magi2studio.semantic.scenes import COLOURS, HELD_OUT, make_scene
    from magi2studio.semantic.score import score_clip

    config, _, components, _, _ = setup
    trainer.set_video_decoder(components.video_decoder)
    tier = TIERS["272p"]
    stride = codes.VIDEO_DECODER_STRIDE

    def exact_decoded(code):  # the code's exact inverse at the decoder's output size, [3, 49, H, W]
        return codes.decode_exact(code).transpose(0, 1).repeat_interleave(stride, -1).repeat_interleave(stride, -2)

    def shown(decoded):
        frames = decoded.float().mul(0.5).add(0.5).clamp(0, 1).mul(255).byte().permute(1, 2, 3, 0).numpy()
        index = np.floor(np.arange(tier.frames) * len(frames) / tier.frames).astype(np.int64)
        return np.ascontiguousarray(_resize_video(frames[index], tier.width, tier.height))

    silence = np.zeros((int(tier.seconds * 44100), 2), np.float32)
    matches = {"colour": 0, "shape": 0, "motion": 0}
    swapped_colours = colour_changes = reversed_motions = decoded_scenes = 0
    for index, facts in enumerate(HELD_OUT):
        scene = make_scene(facts, tier, 42 + index)
        code = codes.encode_scene(scene, config.spatial_stride, config.latent_frames)[0]
        exact = exact_decoded(code)
        if index % 6 == 0:
            with torch.no_grad():
                decoded = components.video_decoder.decode(code[None])[0]
            torch.testing.assert_close(decoded, exact, atol=2e-3, rtol=0)
            decoded_scenes += 1
        score = score_clip(facts, shown(exact), silence, tier.fps, 44100, caption=scene.caption)
        for attribute in matches:
            matches[attribute] += bool(score.verdict(attribute).match)
        if index % 4 == 0:  # the mutations, on 6 scenes
            mirrored = _nearest_colour(np.array(COLOURS[facts.colour])[::-1])
            swapped = shown(exact_decoded(code[[*range(32, 48), *range(16, 32), *range(16)]]))
            seen = score_clip(facts, swapped, silence, tier.fps, 44100, caption=scene.caption).verdict("colour")
            colour_changes += mirrored != facts.colour
            swapped_colours += mirrored != facts.colour and seen.match is False
            backwards = code.unflatten(0, (3, 16)).flip(1).flatten(0, 1)
            moved = score_clip(facts, shown(exact_decoded(backwards)), silence, tier.fps, 44100,
                               caption=scene.caption)
            reversed_motions += moved.verdict("motion").match is not True
    assert decoded_scenes == 4
    assert matches["colour"] >= 23 and matches["motion"] >= 23 and matches["shape"] >= 23, matches
    assert colour_changes >= 2 and swapped_colours == colour_changes, (swapped_colours, colour_changes)
    assert reversed_motions >= 3, reversed_motions  # 3 of 6 when measured


def _nearest_colour(rgb):
    from magi2studio.semantic.scenes import COLOURS
    from magi2studio.semantic.score import _nearest

    return _nearest(rgb, COLOURS)
