"""Fixed scene <-> latent codes for the tiny model: what its decoders decode and its DiT learns.

The real model's latents come from a trained VAE encoder; the tiny one has none (upstream's
Wan2.2 VAE cannot be built small, see ``components.STAND_INS``). So the latent of a scene is
a fixed, deterministic code of the scene, and the tiny decoders' weights are set to invert it
(the video decoder as far as TurboVAE's layers can, :func:`video_decoder_state`):

* **video**: each latent frame is the scene frame at that latent's time, area-averaged to
  ``4 x 4`` sub-cells per latent cell, RGB in [-1, 1], stacked as the 48 channels
  (``pixel_unshuffle`` order: channel = colour * 16 + row * 4 + column). The TinyImageEncoder
  stand-in computes exactly this code for I2VA (its weights are set, not trained), so the
  reference image lands in the same space as the first latent frame.
* **audio**: each 64-channel audio latent frame holds the beep envelope over 32 sub-steps, in
  channels 0-31 for a low beep and 32-63 for a high one, scaled to [-1, 1] (-1 is silence).

Latent frame ``k`` is decoded frame ``2k`` (TurboVAE doubles time: ``T`` latents give
``2T - 1`` frames); decoded frames stand for scene frames evenly spaced from the first to the
last (the driver then shows frame ``j`` over the ``j``-th equal share of the clip).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..semantic.scenes import BEEP_AMPLITUDE, Scene

SUB_CELLS = 4  # per latent cell, per axis: 3 colours x 4 x 4 = the 48 latent channels
AUDIO_SUBSTEPS = 32  # envelope samples per audio latent frame, per pitch half
AUDIO_CHANNELS = 64
VIDEO_CHANNELS = 48
VIDEO_DECODER_STRIDE = 8  # TurboVAE at the tiny config: 8x spatially
IMAGE_ENCODER_GAIN = 1e-2  # the encoder's tanh sees values this small, so it is linear to ~1e-5


def decoded_frames(latent_frames: int) -> int:
    return 2 * latent_frames - 1


def decoded_frame_times(scene_frames: int, latent_frames: int) -> np.ndarray:
    """The scene frame each decoded frame stands for: evenly from the first to the last, so
    latent frame 0 is the clip's first frame (the I2VA reference image's place)."""

    count = decoded_frames(latent_frames)
    return np.round(np.arange(count) * (scene_frames - 1) / (count - 1)).astype(np.int64)


def latent_frame_times(scene_frames: int, latent_frames: int) -> np.ndarray:
    return decoded_frame_times(scene_frames, latent_frames)[::2]


def _area_pool(frames: np.ndarray, factor: int) -> torch.Tensor:
    """uint8 [F, H, W, 3] -> float [3, F, H/f, W/f] in [-1, 1], block means."""

    pixels = torch.from_numpy(np.ascontiguousarray(frames)).float().div_(127.5).sub_(1.0)
    pixels = pixels.permute(3, 0, 1, 2)  # [3, F, H, W]
    return torch.nn.functional.avg_pool3d(pixels.unsqueeze(0), (1, factor, factor)).squeeze(0)


def encode_frames(frames: np.ndarray, spatial_stride: int) -> torch.Tensor:
    """uint8 [T, H, W, 3] -> the video latent code [48, T, H/stride, W/stride]."""

    pooled = _area_pool(frames, spatial_stride // SUB_CELLS)  # [3, T, 4h, 4w]
    per_frame = pooled.permute(1, 0, 2, 3)  # [T, 3, 4h, 4w]
    return torch.nn.functional.pixel_unshuffle(per_frame, SUB_CELLS).permute(1, 0, 2, 3).contiguous()


def scene_frames(scene: Scene, indices: np.ndarray) -> np.ndarray:
    """Only the frames at ``indices`` (rendering a whole clip is the slow part)."""

    wanted = set(int(i) for i in indices)
    picked = {i: frame for i, frame in enumerate(scene.iter_frames()) if i in wanted}
    return np.stack([picked[int(i)] for i in indices])


def image_encoder_state(spatial_stride: int) -> dict[str, torch.Tensor]:
    """TinyImageEncoder weights that compute :func:`encode_frames` of one image.

    ``patch`` averages each sub-cell (scaled by a small gain so the ``tanh`` is linear) and
    ``mix`` undoes the gain; the channel order is ``pixel_unshuffle``'s."""

    pool = spatial_stride // SUB_CELLS
    weight = torch.zeros(VIDEO_CHANNELS, 3, spatial_stride, spatial_stride)
    for colour in range(3):
        for row in range(SUB_CELLS):
            for col in range(SUB_CELLS):
                channel = colour * SUB_CELLS * SUB_CELLS + row * SUB_CELLS + col
                weight[channel, colour, row * pool:(row + 1) * pool, col * pool:(col + 1) * pool] = (
                    IMAGE_ENCODER_GAIN / (pool * pool))
    return {"patch.weight": weight, "patch.bias": torch.zeros(VIDEO_CHANNELS),
            "mix.weight": torch.eye(VIDEO_CHANNELS).view(VIDEO_CHANNELS, VIDEO_CHANNELS, 1, 1) / IMAGE_ENCODER_GAIN,
            "mix.bias": torch.zeros(VIDEO_CHANNELS)}


def beep_envelope(scene: Scene, latent_fps: float) -> np.ndarray:
    """Beep loudness over the clip, [latents * 32] in [0, 1] (RMS per sub-step / the beep's)."""

    rate = scene.sample_rate
    latents = int(round(scene.tier.seconds * latent_fps))
    mono = scene.audio()[:, 0].astype(np.float64)
    edges = np.round(np.arange(latents * AUDIO_SUBSTEPS + 1) * rate / (latent_fps * AUDIO_SUBSTEPS)).astype(np.int64)
    energy = np.concatenate([[0.0], np.cumsum(mono * mono)])
    edges = np.clip(edges, 0, len(mono))
    width = np.maximum(np.diff(edges), 1)
    rms = np.sqrt(np.maximum(energy[edges[1:]] - energy[edges[:-1]], 0.0) / width)
    return np.clip(rms * math.sqrt(2.0) / BEEP_AMPLITUDE, 0.0, 1.0)


def encode_audio(scene: Scene, latent_fps: float) -> torch.Tensor:
    """The audio latent code [latents, 64]: the envelope in the half of the scene's pitch."""

    envelope = beep_envelope(scene, latent_fps).reshape(-1, AUDIO_SUBSTEPS)
    code = -np.ones((len(envelope), AUDIO_CHANNELS), dtype=np.float32)
    half = 0 if scene.facts.pitch == "low" else AUDIO_SUBSTEPS
    code[:, half:half + AUDIO_SUBSTEPS] = 2.0 * envelope - 1.0
    return torch.from_numpy(code)


def audio_target(scene: Scene, output_rate: float) -> torch.Tensor:
    """What the audio decoder should output: the scene's audio at its rate, [2, samples]."""

    from scipy.signal import resample_poly

    rate = scene.sample_rate
    ratio = math.gcd(int(round(output_rate)), rate)
    mono = resample_poly(scene.audio()[:, 0].astype(np.float64), int(round(output_rate)) // ratio, rate // ratio)
    samples = int(round(scene.tier.seconds * output_rate))
    mono = np.pad(mono, (0, max(0, samples - len(mono))))[:samples]
    return torch.from_numpy(np.stack([mono, mono]).astype(np.float32))



# -- the audio decoder, set as the code's inverse ---------------------------------------------------
# Oobleck's widths for it: channels 2, c_mults (1, 1, 2, 8, 32): 64 -> 16 -> 4 -> 2 -> 2 -> 2.
AUDIO_DECODER_CHANNELS = 2
AUDIO_DECODER_MULTIPLES = (1, 1, 2, 8, 32)
AUDIO_DECODER_STRIDES = (4, 4, 4, 4, 4)
SNAKE_OFF = 40.0  # log beta: Snake's sin^2 term is scaled by exp(-40), so it passes x through
_CARRIER = (math.sqrt(0.5), math.sqrt(0.5), -math.sqrt(0.5), -math.sqrt(0.5))  # sin(pi t / 2 + pi / 4)
_LINEAR = (0.125, 0.375, 0.625, 0.875, 0.875, 0.625, 0.375, 0.125)  # stride-4 linear interpolation


def audio_pitches(latent_fps: float, strides: tuple[int, ...] = AUDIO_DECODER_STRIDES) -> dict[str, float]:
    """The tones the set decoder sounds: a period-4 carrier at its last two stages' rates."""

    rate = latent_fps * math.prod(strides)
    return {"low": rate / 16, "high": rate / 4}


def audio_decoder_weights(gain: float = BEEP_AMPLITUDE / math.sqrt(0.5)) -> dict[str, torch.Tensor]:
    """Weights (plain, before weight norm) under which upstream's Oobleck decoder inverts :func:`encode_audio`.

    The decoder is linear here (Snake passes through, every residual unit adds zero). Its first
    conv turns the code's ``[-1, 1]`` into the envelope's ``[0, 1]``; the first three transposed
    convs move the 32 sub-steps from channels into time (8 x 4 x 2 positions, a pixel shuffle),
    leaving one envelope channel per pitch at 320 samples a latent; the fourth multiplies the low
    channel by a period-4 carrier (``rate / 16``) and holds the high one, the fifth interpolates
    the low one and multiplies the high one by the carrier (``rate / 4``); the output conv adds
    them into both audio channels at the beep's amplitude. A transposed conv of stride 4 and
    padding 2 puts input ``n``'s tap ``k`` at output ``4 n + k - 2``: position ``a`` is tap ``a + 2``.
    """

    half = AUDIO_SUBSTEPS
    conv1 = torch.zeros(2 * half, AUDIO_CHANNELS, 7)
    conv1[torch.arange(2 * half), torch.arange(2 * half), 3] = 0.5
    stage1 = torch.zeros(2 * half, 16, 8)  # substep j = 8a + r -> channel (p, r) at position a
    stage2 = torch.zeros(16, 4, 8)  # r = 2b + q -> channel (p, q) at position b
    stage3 = torch.zeros(4, 2, 8)  # q -> channel p at positions 2q, 2q + 1
    for p in range(2):
        for a in range(4):
            for r in range(8):
                stage1[p * half + 8 * a + r, p * 8 + r, a + 2] = 1.0
        for b in range(4):
            for q in range(2):
                stage2[p * 8 + 2 * b + q, p * 2 + q, b + 2] = 1.0
        for q in range(2):
            stage3[p * 2 + q, p, 2 * q + 2] = stage3[p * 2 + q, p, 2 * q + 3] = 1.0
    stage4 = torch.zeros(2, 2, 8)
    stage5 = torch.zeros(2, 2, 8)
    for a in range(4):
        stage4[0, 0, a + 2] = _CARRIER[a]  # low: carrier at 1280/4 of this stage's output rate
        stage4[1, 1, a + 2] = 1.0  # high: held
        stage5[1, 1, a + 2] = _CARRIER[a]
    stage5[0, 0] = torch.tensor(_LINEAR)
    conv2 = torch.zeros(2, 2, 7)
    conv2[:, :, 3] = gain
    return {"conv1.weight": conv1, "conv1.bias": torch.full((2 * half,), 0.5),
            **{f"block.{i}.conv_t1.weight": w for i, w in enumerate((stage1, stage2, stage3, stage4, stage5))},
            "conv2.weight": conv2}


def audio_decoder_state(decoder: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of upstream's (diffusers') Oobleck decoder module set to invert the audio code.

    Weight-normed convs get ``v`` = the weight and ``g`` = its norm; where a weight is zero
    (the residual units' last conv) ``g`` is 0 and ``v`` stays the module's (nonzero) own.
    """

    weights = audio_decoder_weights()
    state = {key: value.detach().clone() for key, value in decoder.state_dict().items()}
    for key in state:
        if key.endswith((".bias", ".alpha")):
            state[key] = torch.zeros_like(state[key])
        elif key.endswith(".beta"):
            state[key] = torch.full_like(state[key], SNAKE_OFF)
        elif key.endswith(".weight_g") and ".res_unit" in key and ".conv2." in key:
            state[key] = torch.zeros_like(state[key])
    for name, weight in weights.items():
        if name.endswith(".bias"):
            state[name] = weight
            continue
        stem = name[: -len(".weight")]
        state[f"{stem}.weight_v"] = weight
        state[f"{stem}.weight_g"] = weight.flatten(1).norm(dim=1).reshape(state[f"{stem}.weight_g"].shape)
    return state


# -- the video decoder, set to the part of the code's inverse that TurboVAE can compute ------------
# Upstream's TurboVAE upsamples space with nearest-neighbour copies followed by stride-1 convs,
# so every layer after ``conv_in`` sees the 4 x 4 sub-cell positions of one latent cell through
# the same weights: no linear TurboVAE can put a cell's 16 sub-cells back in their places (its
# output's spectrum vanishes at the sub-cell frequencies the copies null, docs/training.md). What
# it can compute exactly is each cell's mean colour, and time exactly: the time conv's two halves
# become decoded frames 2k (latent frame k) and 2k - 1 (the mean of latent frames k - 1 and k).
VIDEO_CARRIER = 1.0  # the constant each carried value rides on, so the final RMS norm sees a fixed length
VIDEO_SIGNAL = 1e-2  # a carried value's scale on it: SiLU there is linear to ~1e-5 (pairs cancel the even terms)


def video_decoder_state(decoder: torch.nn.Module, latent_mean: torch.Tensor,
                        latent_std: torch.Tensor) -> dict[str, torch.Tensor]:
    """The state dict of upstream's ``_TurboDecoder3d`` set to decode :func:`encode_frames`'s code
    into each latent cell's mean colour, interpolated in time between latent frames.

    Linear all through: ``conv_in`` undoes the decoder's ``z * std + mean`` and averages each
    colour's 16 sub-cells into a pair of channels ``carrier +- signal * mean`` (a pair's squares
    sum to a constant, so the last RMS norm divides by a fixed length, and SiLU's even terms
    cancel in the pair's difference); every residual unit adds zero; the upsampling convs pass
    their input; the time conv holds (frame ``2k``) or averages (frame ``2k - 1``); ``conv_out``
    turns the pair's difference back into the colour in all four pixels of its 2 x 2 patch.
    """

    state = {key: torch.zeros_like(value) for key, value in decoder.state_dict().items()}
    width = state["conv_in.conv.bias"].numel()
    if width < 6:
        raise ValueError(f"the set video decoder carries 3 colours as pairs: TurboVAE widths must be >= 6, not {width}")
    per_colour = SUB_CELLS * SUB_CELLS
    conv_in = state["conv_in.conv.weight"]  # [width, 48, 3, 3, 3]
    for colour in range(3):
        block = slice(colour * per_colour, (colour + 1) * per_colour)
        scale = VIDEO_SIGNAL / (per_colour * latent_std[block])  # code = (z - mean) / std
        offset = float((scale * latent_mean[block]).sum())
        for channel, sign in ((colour, 1.0), (colour + 3, -1.0)):
            conv_in[channel, block, 1, 1, 1] = sign * scale
            state["conv_in.conv.bias"][channel] = VIDEO_CARRIER - sign * offset
    identity = torch.eye(width)
    for key in state:
        if key.endswith("resample.1.weight"):
            state[key][:, :, 1, 1] = identity
    time_conv = state["up_blocks.1.upsamplers.0.time_conv.conv.weight"]  # [2 * width, width, 3, 1, 1]
    time_conv[:width, :, 0, 0, 0] = identity / 2  # split 0: frame 2k - 1, the mean of k - 1 and k
    time_conv[:width, :, 1, 0, 0] = identity / 2
    time_conv[width:, :, 1, 0, 0] = identity  # split 1: frame 2k, latent frame k
    # After the RMS norm a pair is (c +- s m) / r with r = sqrt(6 / width) c (to second order in s m);
    # SiLU(u + d) - SiLU(u - d) = 2 SiLU'(u) d + O(d^3).
    normed = VIDEO_CARRIER / math.sqrt(6.0 / width) / VIDEO_CARRIER
    sigmoid = 1.0 / (1.0 + math.exp(-normed))
    slope = sigmoid * (1.0 + normed * (1.0 - sigmoid))
    gain = 1.0 / (2.0 * slope * normed * VIDEO_SIGNAL / VIDEO_CARRIER)
    conv_out = state["conv_out.conv.weight"]  # [3 * 4, width, 3, 3, 3]: colour * 4 + patch position
    for colour in range(3):
        conv_out[colour * 4:(colour + 1) * 4, colour, 1, 1, 1] = gain
        conv_out[colour * 4:(colour + 1) * 4, colour + 3, 1, 1, 1] = -gain
    return state
