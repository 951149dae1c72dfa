"""Fixed scene <-> latent codes for the tiny model: what its decoders decode and its DiT learns.

The real model's latents come from a trained VAE encoder; the tiny one has none (upstream's
Wan2.2 VAE cannot be built small, see ``components.STAND_INS``). So the latent of a scene is
a fixed, deterministic code of the scene, and the tiny decoders' weights are set to invert it
(:func:`video_decoder_state`, :func:`audio_decoder_state`):

* **video**: one value per colour per 16-pixel latent cell per decoded frame: the scene's colour
  at the cell's centre pixel, in [-1, 1] (a point sample: no colour blended with the background,
  so the object's shape is a staircase of whole cells). A latent frame holds 16 decoded frames
  in its channels (channel = colour * 16 + slot): latent frame ``k >= 1`` holds decoded frames
  ``16 (k - 1) + 1 ... 16 k``, latent frame 0 holds decoded frame 0 in every slot (the I2VA
  reference's place; the TinyImageEncoder stand-in computes exactly that code of an image, its
  weights set, not trained). TurboVAE with four time-doubling up blocks unpacks them: ``T``
  latents give ``16 (T - 1) + 1`` frames (49 for 4), so the object moves at most a few percent
  of the frame between decoded frames, at no cost in DiT tokens.
* **audio**: each 64-channel audio latent frame holds the beep envelope over 32 sub-steps, in
  channels 0-31 for a low beep and 32-63 for a high one, scaled to [-1, 1] (-1 is silence).

Decoded frames stand for scene frames evenly spaced from the first to the last (the driver then
shows frame ``j`` over the ``j``-th equal share of the clip).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..semantic.scenes import BEEP_AMPLITUDE, Scene

AUDIO_SUBSTEPS = 32  # envelope samples per audio latent frame, per pitch half
AUDIO_CHANNELS = 64
VIDEO_CHANNELS = 48
COLOURS = 3
TIME_SLOTS = VIDEO_CHANNELS // COLOURS  # decoded frames per latent frame (after the first)
TIME_UPSAMPLINGS = 4  # TurboVAE up blocks that double time: 2 ** 4 = TIME_SLOTS
CELL = 16  # pixels per latent cell (the config's spatial_stride) at which the code samples the scene
DIT_PATCH = 2  # the DiT takes 2 x 2 cells (32 x 32 pixels) a token: the config's dit_patch
VIDEO_DECODER_STRIDE = 2 ** TIME_UPSAMPLINGS * 2  # each up block doubles space too; then the 2 x 2 unpatchify
SUB_CELL_STRIDE, SUB_CELLS = 64, 4  # the 2026-12-04 checkpoint's code: 4 x 4 sub-cell means per 64-pixel cell
IMAGE_ENCODER_GAIN = 1e-2  # the encoder's tanh sees values this small, so it is linear to ~1e-5


def check_geometry(spatial_stride: int, turbo_time_upsamplings: int) -> None:
    """This code is for one geometry; a checkpoint of another (the 2026-12-04 one: 64-pixel cells,
    4 x 4 sub-cells, one time doubling) was trained on an older code (docs/training.md)."""

    if spatial_stride != CELL or turbo_time_upsamplings != TIME_UPSAMPLINGS:
        raise ValueError(f"spatial_stride {spatial_stride}, turbo_time_upsamplings {turbo_time_upsamplings}: the "
                         f"video code is for {CELL}-pixel cells and {TIME_UPSAMPLINGS} time doublings. Fix: use "
                         "trainer.trained_config() (a checkpoint of another geometry was trained on an older code)")


def decoded_frames(latent_frames: int) -> int:
    return TIME_SLOTS * (latent_frames - 1) + 1


def decoded_frame_times(scene_frames: int, latent_frames: int) -> np.ndarray:
    """The scene frame each decoded frame stands for: evenly from the first to the last, so
    latent frame 0 is the clip's first frame (the I2VA reference image's place). These are the
    frames :func:`encode_frames` codes."""

    count = decoded_frames(latent_frames)
    return np.round(np.arange(count) * (scene_frames - 1) / (count - 1)).astype(np.int64)


def encode_frames(frames: np.ndarray, spatial_stride: int = CELL) -> torch.Tensor:
    """uint8 [16 (T - 1) + 1, H, W, 3] (the decoded frames' scene frames) -> the video latent
    code [48, T, H/16, W/16]: each cell's centre pixel, 16 decoded frames per latent frame."""

    check_geometry(spatial_stride, TIME_UPSAMPLINGS)
    if (len(frames) - 1) % TIME_SLOTS:
        raise ValueError(f"{len(frames)} frames: the code takes {TIME_SLOTS} (T - 1) + 1 decoded frames")
    centre = torch.from_numpy(np.ascontiguousarray(frames[:, CELL // 2::CELL, CELL // 2::CELL]))
    values = centre.float().div_(127.5).sub_(1.0).permute(3, 0, 1, 2)  # [3, N, h, w]
    later = values[:, 1:].unflatten(1, (-1, TIME_SLOTS)).transpose(1, 2)  # [3, 16, T - 1, h, w]
    first = values[:, :1, None].expand(-1, TIME_SLOTS, -1, -1, -1)  # latent frame 0: frame 0 in every slot
    return torch.cat([first, later], dim=2).flatten(0, 1).contiguous()


def decode_exact(code: torch.Tensor) -> torch.Tensor:
    """The code's exact inverse: [48, T, h, w] -> the decoded frames' cell colours [16 (T - 1) + 1, 3, h, w]."""

    slots = code.unflatten(0, (COLOURS, TIME_SLOTS))  # [3, 16, T, h, w]
    later = slots[:, :, 1:].transpose(1, 2).flatten(1, 2)  # [3, 16 (T - 1), h, w], in time order
    return torch.cat([slots[:, -1, :1], later], dim=1).transpose(0, 1).contiguous()


def encode_scene(scene: Scene, spatial_stride: int, latent_frames: int) -> tuple[torch.Tensor, np.ndarray]:
    """A scene's video code at a checkpoint's geometry and the first frame (the I2VA reference).

    16-pixel cells: this code. 64-pixel cells: the 2026-12-04 checkpoint's (``magi2studio/data/
    tiny-trained``), 4 x 4 sub-cell means, latent frame ``k`` the scene at decoded frame ``2k`` of
    ``2T - 1``; kept so that checkpoint's decoder and preview map can still be judged on its code."""

    if spatial_stride == CELL:
        frames = scene_frames(scene, decoded_frame_times(scene.tier.frames, latent_frames))
        return encode_frames(frames, spatial_stride), frames[0]
    if spatial_stride != SUB_CELL_STRIDE:
        raise ValueError(f"spatial_stride {spatial_stride}: the codes are for {CELL} (today's) or "
                         f"{SUB_CELL_STRIDE} (the 2026-12-04 checkpoint's). Fix: use trainer.trained_config()")
    count = 2 * latent_frames - 1
    at = np.round(np.arange(count) * (scene.tier.frames - 1) / (count - 1)).astype(np.int64)[::2]
    frames = scene_frames(scene, at)
    pixels = torch.from_numpy(np.ascontiguousarray(frames)).float().div_(127.5).sub_(1.0).permute(0, 3, 1, 2)
    pooled = torch.nn.functional.avg_pool2d(pixels, SUB_CELL_STRIDE // SUB_CELLS)  # [T, 3, 4h, 4w]
    return torch.nn.functional.pixel_unshuffle(pooled, SUB_CELLS).permute(1, 0, 2, 3).contiguous(), frames[0]


def scene_frames(scene: Scene, indices: np.ndarray) -> np.ndarray:
    """Only the frames at ``indices`` (rendering a whole clip is the slow part)."""

    wanted = set(int(i) for i in indices)
    picked = {i: frame for i, frame in enumerate(scene.iter_frames()) if i in wanted}
    return np.stack([picked[int(i)] for i in indices])


def image_encoder_state(spatial_stride: int = CELL) -> dict[str, torch.Tensor]:
    """TinyImageEncoder weights that compute :func:`encode_frames` of one image (latent frame 0).

    ``patch`` picks each cell's centre pixel into all 16 slots of its colour (scaled by a small
    gain so the ``tanh`` is linear) and ``mix`` undoes the gain."""

    check_geometry(spatial_stride, TIME_UPSAMPLINGS)
    weight = torch.zeros(VIDEO_CHANNELS, COLOURS, CELL, CELL)
    for colour in range(COLOURS):
        weight[colour * TIME_SLOTS:(colour + 1) * TIME_SLOTS, colour, CELL // 2, CELL // 2] = IMAGE_ENCODER_GAIN
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


# -- the video decoder, set as the code's inverse --------------------------------------------------
# Upstream's TurboVAE upsamples space with nearest-neighbour copies followed by stride-1 convs, so
# no TurboVAE can put sub-cells of one latent cell back in their places (docs/training.md): the
# code has none, one value per cell. Its time conv, though, turns each channel group into one of
# two frames: each time-doubling up block hands the first half of a frame's slots to the earlier
# frame and the second half to the later one, so four of them unpack 16 slots into 16 frames.
# TURBO_CHANNELS are the up blocks' widths (upstream lists them last block first): 64 at the latent
# carry its 48 values and a carrier channel, then 32, 16 and 8 carry 24, 12 and 6 (3 pairs).
TURBO_CHANNELS = (8, 16, 32, 64)
VIDEO_CARRIER = 1.0  # a constant channel, so every RMS norm divides by a fixed length
VIDEO_SIGNAL = 1e-3  # a carried value's scale on it: the norms are fixed to ~1e-5, SiLU linear to ~1e-6


def video_decoder_state(decoder: torch.nn.Module, latent_mean: torch.Tensor,
                        latent_std: torch.Tensor) -> dict[str, torch.Tensor]:
    """The state dict of upstream's ``_TurboDecoder3d`` set to decode :func:`encode_frames`'s code
    into each cell's colour at every decoded frame (:func:`decode_exact`, to ~1e-4).

    Linear up to the end: ``conv_in`` undoes the decoder's ``z * std + mean`` and carries each of
    the 48 values at ``signal * value`` beside a carrier channel; every residual unit adds zero;
    a width change's shortcut (after an RMS norm, fixed by the carrier) scales back; the spatial
    convs pass their input; each time conv gives its earlier frame the first half of the slots and
    its later frame the second half; the last one writes each colour as a pair ``carrier +-
    signal * value`` (a pair's squares sum to a constant for the final RMS norm, SiLU's even terms
    cancel in its difference), and ``conv_out`` turns the pair's difference back into the colour
    in all four pixels of its 2 x 2 patch.
    """

    state = {key: torch.zeros_like(value) for key, value in decoder.state_dict().items()}
    blocks = [key for key in state if key.endswith("time_conv.conv.weight")]
    widths = [state["conv_in.conv.bias"].numel()] + [state[key].shape[0] // 2 for key in blocks]
    if len(blocks) != TIME_UPSAMPLINGS or len(decoder.up_blocks) != TIME_UPSAMPLINGS:
        raise ValueError(f"the set video decoder unpacks {TIME_SLOTS} slots by {TIME_UPSAMPLINGS} time-doubling up "
                         f"blocks, not {len(blocks)} of {len(decoder.up_blocks)}")
    for stage, width in enumerate(widths[1:]):  # each carries its values and the carrier into its time conv
        if min(width, widths[0]) < VIDEO_CHANNELS // 2 ** stage + 1:
            raise ValueError(f"TurboVAE widths {widths}: up block {stage} carries "
                             f"{VIDEO_CHANNELS // 2 ** stage + 1} channels (use {TURBO_CHANNELS})")
    carrier, signal = VIDEO_CARRIER, VIDEO_SIGNAL
    conv_in = state["conv_in.conv.weight"]  # [width, 48, 3, 3, 3]; value channel 1 + c is code channel c
    scale = signal / latent_std
    conv_in[1 + torch.arange(VIDEO_CHANNELS), torch.arange(VIDEO_CHANNELS), 1, 1, 1] = scale
    state["conv_in.conv.bias"][1:1 + VIDEO_CHANNELS] = -scale * latent_mean
    state["conv_in.conv.bias"][0] = carrier
    for key in state:
        if key.endswith("resample.1.weight"):
            state[key][:, :, 1, 1] = torch.eye(state[key].shape[0])
        elif key.endswith("conv_shortcut.conv.weight"):  # after norm3: x / sqrt(carrier^2 / width + eps)
            inner, outer = state[key].shape[1], state[key].shape[0]
            kept = min(inner, outer)
            back = math.sqrt(carrier * carrier / inner + 1e-6)
            state[key][torch.arange(kept), torch.arange(kept), 0, 0, 0] = back
    for stage, key in enumerate(blocks):
        width = widths[stage + 1]
        per_colour = TIME_SLOTS // 2 ** stage  # slots a frame carries into this time conv
        half = per_colour // 2
        weight, bias = state[key], state[key.replace(".weight", ".bias")]  # [2 * width, width, 3, 1, 1]
        for split in range(2):  # split 0: the earlier frame (first half of the slots), 1: the later
            out = split * width
            for colour in range(COLOURS):
                for slot in range(half):
                    source = 1 + colour * per_colour + split * half + slot
                    if stage == TIME_UPSAMPLINGS - 1:  # the last: one slot per colour, as a pair
                        weight[out + colour, source, 1, 0, 0] = 1.0
                        weight[out + colour + COLOURS, source, 1, 0, 0] = -1.0
                    else:
                        weight[out + 1 + colour * half + slot, source, 1, 0, 0] = 1.0
            if stage == TIME_UPSAMPLINGS - 1:
                bias[out:out + 2 * COLOURS] = carrier
            else:
                bias[out] = carrier
    # After the final RMS norm a pair is (c +- s v) / r with r = sqrt(6 / width) c (to second order in s v);
    # SiLU(u + d) - SiLU(u - d) = 2 SiLU'(u) d + O(d^3).
    normed = 1.0 / math.sqrt(2 * COLOURS / widths[-1])
    sigmoid = 1.0 / (1.0 + math.exp(-normed))
    slope = sigmoid * (1.0 + normed * (1.0 - sigmoid))
    gain = 1.0 / (2.0 * slope * normed * signal / carrier)
    conv_out = state["conv_out.conv.weight"]  # [3 * 4, width, 3, 3, 3]: colour * 4 + patch position
    for colour in range(COLOURS):
        conv_out[colour * 4:(colour + 1) * 4, colour, 1, 1, 1] = gain
        conv_out[colour * 4:(colour + 1) * 4, colour + COLOURS, 1, 1, 1] = -gain
    return state
