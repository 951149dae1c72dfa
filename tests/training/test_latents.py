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
