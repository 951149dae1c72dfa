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
    from vllm_omni.diffusion.models.magi2.preview_data_proxy import Magi2DataProxy
    from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler

    _, _, components, examples, _ = setup
    model = components.transformer
    state = {k: v.clone() for k, v in model.state_dict().items()}
    proxy = Magi2DataProxy()
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


def _object_seen(decoded, background):
    """The object in decoded frames [3, F, h, w] (in [-1, 1]) of a scene on ``background``: its
    colour from the frames' total difference to the background over the object's area, and its
    centroid per frame from where that difference lies (pixels of the clip)."""

    import numpy as np

    rgb = (decoded.double().numpy() + 1.0) * 127.5
    bg = np.array(background, dtype=np.float64)[:, None, None, None]
    difference = rgb - bg
    weight = np.abs(difference).sum(axis=0)  # [F, h, w]
    stride = codes.VIDEO_DECODER_STRIDE
    ys, xs = (np.arange(n) * stride + stride / 2 for n in weight.shape[1:])
    total = weight.sum(axis=(1, 2))
    centroids = np.stack([(weight * xs[None, None, :]).sum(axis=(1, 2)) / total,
                          (weight * ys[None, :, None]).sum(axis=(1, 2)) / total], axis=1)
    return difference.sum(axis=(2, 3)) * stride * stride, centroids  # [3, F] summed difference


def test_the_set_video_decoder_shows_each_held_out_scene_s_colour_and_path(setup):
    """Upstream's loaded TurboVAE decoder with the set weights decodes each held-out scene's own
    code to its cells' mean colours, exact in time: the object's colour (from the frames' total
    difference to the background, over its area) is the scene's; its centroid follows the scene's
    path within a quarter of a cell at every latent frame and between them; the code's red and blue
    channels swapped give the swapped colour."""
    import math

    import numpy as np

    from magi2studio.semantic.scenes import BACKGROUNDS, COLOURS, HELD_OUT, make_scene
    from magi2studio.semantic.score import _nearest

    config, _, components, _, _ = setup
    trainer.set_video_decoder(components.video_decoder)
    tier = TIERS["272p"]
    at = codes.latent_frame_times(tier.frames, config.latent_frames)
    swapped_colours = 0
    for index, facts in enumerate(HELD_OUT):
        scene = make_scene(facts, tier, 42 + index)
        code = codes.encode_frames(codes.scene_frames(scene, at), config.spatial_stride)
        background = BACKGROUNDS[facts.background]
        with torch.no_grad():
            decoded = components.video_decoder.decode(code[None])[0]
            swapped = components.video_decoder.decode(code[None, [*range(32, 48), *range(16, 32), *range(16)]])[0]
        area = math.pi * scene.half_size ** 2  # the three shapes' common area
        summed, centroids = _object_seen(decoded, background)
        seen = np.array(background) + summed[:, ::2].mean(axis=1) / area
        assert _nearest(seen, COLOURS) == facts.colour, (index, facts, seen)
        truth = scene.centres[at]
        cell = config.spatial_stride
        assert np.abs(centroids[::2] - truth).max() < cell / 4, (index, facts, centroids[::2], truth)
        assert np.abs(centroids[1::2] - (truth[:-1] + truth[1:]) / 2).max() < cell / 4, index
        mirrored = _nearest(np.array(COLOURS[facts.colour])[::-1], COLOURS)
        swapped_seen = np.array(background) + _object_seen(swapped, background)[0][:, ::2].mean(axis=1) / area
        assert _nearest(swapped_seen, COLOURS) == mirrored, (index, facts, swapped_seen)
        swapped_colours += mirrored != facts.colour
    assert swapped_colours >= 12  # the mutation changes the colour in most scenes
