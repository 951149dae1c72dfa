"""The fixed scene codes: what the tiny decoders invert and the DiT learns (no model needed)."""

import numpy as np
import pytest
import torch

from magi2studio.engines.embedded.components import TinyImageEncoder
from magi2studio.semantic.scenes import HELD_OUT, PITCHES, make_scene
from magi2studio.training import latents as codes
from magi2studio.vocabulary.tiers import TIERS

STRIDE = 64


@pytest.fixture(scope="module")
def scene():
    return make_scene(HELD_OUT[7], TIERS["272p"], 3)  # a red square, top to bottom, grey, high beeps


def test_decoded_frames_span_the_clip_and_latents_are_every_other_one():
    times = codes.decoded_frame_times(125, 4)
    assert len(times) == 7 and times[0] == 0 and times[-1] == 124
    assert np.all(np.diff(times) > 0)
    assert list(codes.latent_frame_times(125, 4)) == list(times[::2])


def test_video_code_is_the_sub_cell_means_in_pixel_unshuffle_order(scene):
    frames = codes.scene_frames(scene, np.array([0, 60]))
    latent = codes.encode_frames(frames, STRIDE)
    assert latent.shape == (48, 2, 256 // STRIDE, 448 // STRIDE)
    back = torch.nn.functional.pixel_shuffle(latent.permute(1, 0, 2, 3), codes.SUB_CELLS)  # [T, 3, 16, 28]
    pooled = frames.astype(np.float64).reshape(2, 16, 16, 28, 16, 3).mean(axis=(2, 4)) / 127.5 - 1.0
    np.testing.assert_allclose(back.permute(0, 2, 3, 1).numpy(), pooled, atol=1e-5)
    # The grey background is 0 in the code, and the object moved between the two frames.
    assert abs(float(latent[:, 0].median())) < 0.01
    assert not torch.equal(latent[:, 0], latent[:, 1])


def test_image_encoder_stand_in_computes_the_video_code(scene):
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


def test_the_set_video_decoder_computes_cell_means_exactly_in_time():
    """Upstream's TurboVAE layers with :func:`latents.video_decoder_state`, on a random code: each
    8 x 8 block of the output is its latent cell's mean colour; decoded frame 2k is latent frame k
    and 2k - 1 the mean of latent frames k - 1 and k (the seeded decoder is nowhere near)."""
    from vllm_omni.diffusion.models.magi2.turbo_vae import _WAN22_LATENT_MEAN, _WAN22_LATENT_STD

    from magi2studio.engines.embedded.checkpoint import turbo_config, turbo_decoder
    from magi2studio.training.trainer import trained_config

    mean, std = torch.tensor(_WAN22_LATENT_MEAN), torch.tensor(_WAN22_LATENT_STD)
    decoder = turbo_decoder(turbo_config(trained_config()))
    decoder.load_state_dict(codes.video_decoder_state(decoder, mean, std))
    code = torch.rand(48, 4, 4, 7, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        out = decoder(code[None] * std.view(1, -1, 1, 1, 1) + mean.view(1, -1, 1, 1, 1), is_first_chunk=True)[0]
    cells = code.view(3, 16, 4, 4, 7).mean(dim=1)  # [3, T, h, w]: the 16 sub-cells of each colour
    frames = torch.stack([cells[:, 0], *[x for k in range(1, 4) for x in ((cells[:, k - 1] + cells[:, k]) / 2,
                                                                          cells[:, k])]], dim=1)
    stride = codes.VIDEO_DECODER_STRIDE
    torch.testing.assert_close(out, frames.repeat_interleave(stride, -1).repeat_interleave(stride, -2),
                               atol=2e-4, rtol=0)
    with pytest.raises(ValueError, match="widths must be >= 6"):
        codes.video_decoder_state(turbo_decoder({**turbo_config(trained_config()),
                                                 "decoder_block_out_channels": [4, 4]}), mean, std)
