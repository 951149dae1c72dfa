"""The fixed scene codes: what the tiny decoders invert and the DiT learns (no model needed)."""

import numpy as np
import pytest
import torch

from magi2studio.engines.embedded.components import TinyImageEncoder
from magi2studio.semantic.scenes import HELD_OUT, PITCHES, make_scene
from magi2studio.training import latents as codes
from magi2studio.vocabulary.tiers import TIERS

STRIDE = codes.CELL


@pytest.fixture(scope="module")
def scene():
    return make_scene(HELD_OUT[7], TIERS["272p"], 3)  # a red square, top to bottom, grey, high beeps


def test_decoded_frames_span_the_clip_16_a_latent_frame():
    times = codes.decoded_frame_times(125, 4)
    assert len(times) == 49 == codes.decoded_frames(4) and times[0] == 0 and times[-1] == 124
    assert np.all(np.diff(times) > 0) and np.diff(times).max() <= 3  # under 3 scene frames apart


def test_video_code_is_each_cell_s_centre_pixel_16_frames_a_latent_frame(scene):
    frames = codes.scene_frames(scene, codes.decoded_frame_times(125, 4))
    latent = codes.encode_frames(frames, STRIDE)
    assert latent.shape == (48, 4, 256 // STRIDE, 448 // STRIDE)
    centres = frames[:, STRIDE // 2::STRIDE, STRIDE // 2::STRIDE].astype(np.float64) / 127.5 - 1.0  # [49, 16, 28, 3]
    np.testing.assert_allclose(codes.decode_exact(latent).permute(0, 2, 3, 1).numpy(), centres, atol=1e-6)
    # Channel = colour * 16 + slot; latent frame 2's slot 5 is decoded frame 16 + 1 + 5.
    np.testing.assert_allclose(latent[16 + 5, 2].numpy(), centres[22, :, :, 1], atol=1e-6)
    assert torch.equal(latent[:, 0], latent[[c * 16 for c in range(3) for _ in range(16)], 0])  # frame 0 in every slot
    assert abs(float(latent[:, 0].median())) < 0.01  # the grey background is 0
    assert not torch.equal(latent[:16, 1], latent[:16, 1].flip(0)), "the object moves within a latent frame"
    with pytest.raises(ValueError, match="spatial_stride 32.*Fix"):
        codes.encode_frames(frames, 32)


def test_the_2026_12_04_checkpoint_s_code_stays_the_sub_cell_means(scene):
    """The shipped checkpoint (64-pixel cells) is still judged on its own code (its preview map's test)."""
    latent, first = codes.encode_scene(scene, 64, 4)
    at = np.round(np.arange(7) * 124 / 6).astype(np.int64)[::2]
    frames = codes.scene_frames(scene, at)
    assert latent.shape == (48, 4, 4, 7) and np.array_equal(first, frames[0])
    back = torch.nn.functional.pixel_shuffle(latent.permute(1, 0, 2, 3), 4)  # [T, 3, 16, 28]
    pooled = frames.astype(np.float64).reshape(4, 16, 16, 28, 16, 3).mean(axis=(2, 4)) / 127.5 - 1.0
    np.testing.assert_allclose(back.permute(0, 2, 3, 1).numpy(), pooled, atol=1e-5)


def test_image_encoder_stand_in_computes_the_first_latent_frame(scene):
    frame = codes.scene_frames(scene, np.array([0]))
    encoder = TinyImageEncoder(STRIDE)
    encoder.load_state_dict(codes.image_encoder_state(STRIDE))
    pixels = torch.from_numpy(frame[0].astype(np.float32) / 127.5 - 1.0).permute(2, 0, 1)[None, :, None]
    encoded = encoder.encode_video(pixels)[0, :, 0]
    np.testing.assert_allclose(encoded.numpy(), codes.encode_frames(frame, STRIDE)[:, 0].numpy(), atol=1e-4)


def test_audio_code_holds_the_beeps_in_the_half_of_their_pitch(scene):
    code = codes.encode_audio(scene, 5.0)
    assert code.shape == (50, 64)
    high, low = code[:, 32:], code[:, :32]
    assert torch.all(low == -1.0), "a high-beep scene leaves the low half silent"
    loud = (high.reshape(-1) > 0).nonzero().flatten().numpy() / (5.0 * codes.AUDIO_SUBSTEPS)  # seconds
    for bounce in scene.bounce_times:  # every beep starts at its bounce and lasts about 0.12 s
        near = loud[(loud >= bounce - 0.01) & (loud <= bounce + 0.15)]
        assert len(near) and near.min() <= bounce + 0.01
    assert len(loud) <= len(scene.bounce_times) * 0.13 * 160 + 1


def test_audio_target_keeps_the_pitch_below_the_decoder_rate(scene):
    rate = 5.0 * 1024
    pcm = codes.audio_target(scene, rate)
    assert pcm.shape == (2, 51200)
    spectrum = np.abs(np.fft.rfft(pcm[0].numpy()))
    peak = np.fft.rfftfreq(pcm.shape[1], 1 / rate)[np.argmax(spectrum)]
    assert abs(peak - PITCHES["high"]) < 20


def test_the_set_video_decoder_is_the_code_s_exact_inverse():
    """Upstream's TurboVAE layers with :func:`latents.video_decoder_state`, on a random code: each
    32 x 32 block of the output is its cell's colour at that decoded frame, 16 frames a latent frame
    (the seeded decoder is nowhere near); too narrow a decoder is refused."""
    from vllm_omni.diffusion.models.magi2.turbo_vae import _WAN22_LATENT_MEAN, _WAN22_LATENT_STD

    from magi2studio.engines.embedded.checkpoint import turbo_config, turbo_decoder
    from magi2studio.training.trainer import trained_config

    mean, std = torch.tensor(_WAN22_LATENT_MEAN), torch.tensor(_WAN22_LATENT_STD)
    spec = turbo_config(trained_config())
    assert spec["temporal_compression_ratio"] == 16 and spec["spatial_compression_ratio"] == 32
    decoder = turbo_decoder(spec)
    decoder.load_state_dict(codes.video_decoder_state(decoder, mean, std))
    code = torch.rand(48, 4, 2, 3, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        out = decoder(code[None] * std.view(1, -1, 1, 1, 1) + mean.view(1, -1, 1, 1, 1), is_first_chunk=True)[0]
    frames = codes.decode_exact(code).transpose(0, 1)  # [3, 49, h, w]
    stride = codes.VIDEO_DECODER_STRIDE
    torch.testing.assert_close(out, frames.repeat_interleave(stride, -1).repeat_interleave(stride, -2),
                               atol=2e-4, rtol=0)
    with pytest.raises(ValueError, match="up block 1 carries 25 channels"):
        codes.video_decoder_state(turbo_decoder({**spec, "decoder_block_out_channels": [8, 16, 16, 64]}), mean, std)
