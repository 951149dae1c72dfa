"""The embedded generation driver: what ``Magi2Pipeline._evaluate_preview`` does, by size.

Upstream's pipeline hard-codes the full-size config and CUDA, so this driver repeats its
order of operations with upstream's own pieces: encode the positive and negative prompts,
encode the reference image with the figure token for I2VA, draw noise video-then-audio from
the seed, run ``Magi2PreviewSampler.sample``, decode video (TurboVAE) and audio (Oobleck),
resample the audio to 44.1 kHz stereo over the clip, and resize to the tier's frame size.

A refined tier (1080p) runs its preview tier (540p) that way, decodes the audio there once,
then upsamples the video latent to the refiner's grid, re-noises it to Sand AI's noise value,
runs the dense block-window refiner DiT under upstream's sampler, and decodes the video in
chunks to the tier's size (see :meth:`EmbeddedDriver.refine`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ... import media
from ...errors import InputError
from ...vocabulary.request import Request
from ...vocabulary.tiers import AUDIO_SAMPLE_RATE, Tier
from ..timing import stage
from .components import Components
from .refiner import refiner_recipe, refiner_schedulers

AUDIO_LATENT_CHANNELS = 64
VIDEO_CHANNELS = 48
DECODE_CHUNK_FRAMES = 2  # decoded frames upsampled at once (fp32 2 x 1088 x 1920 x 3 = 50 MB)


@dataclass
class DriverOutput:
    frames: np.ndarray
    audio: np.ndarray
    stage_ms: dict[str, float]
    negative_prompt_source: str
    latents_sha256: str  # media.latents_sha256 of the sampler's final video and audio latents


class _Stages:
    def __init__(self, on_stage: Callable[[str], None] | None) -> None:
        self.ms: dict[str, float] = {}
        self._on_stage = on_stage

    def run(self, name: str, fn, *args, **kwargs):
        if self._on_stage is not None:
            self._on_stage(name)
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - start) * 1e3
        return result


def prepare_compile(transformer, mode: str) -> None:
    """Compile the transformer's regions once per process; switching back needs a restart."""

    current = getattr(transformer, "_magi2studio_compile", "eager")
    if mode == current:
        return
    if current != "eager":
        raise InputError("compile", f"this engine is already compiled {current}",
                         "restart the engine (change layout or restart the studio) to switch compile mode")
    transformer.compile_regions(fullgraph=True, dynamic=mode == "dynamic", options={"emulate_precision_casts": True})
    transformer._magi2studio_compile = mode


class EmbeddedDriver:
    """Runs requests on ``device`` (the CPU, or a rank's GPU under NCCL)."""

    def __init__(self, components: Components, device: torch.device | str = "cpu") -> None:
        from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler

        self.c = components
        self.device = torch.device(device)
        for module in (components.transformer, components.refiner, components.text_encoder,
                       components.image_encoder, components.video_decoder, components.audio_decoder):
            module.to(self.device)
        self.sampler = Magi2PreviewSampler(components.transformer, components.config.data_proxy(), device=self.device)
        self.refiner_sampler = Magi2PreviewSampler(components.refiner, components.config.data_proxy(),
                                                   device=self.device)

    # -- conditioning ----------------------------------------------------------------------
    def encode_prompts(self, prompt: str, negative: str) -> tuple[torch.Tensor, torch.Tensor]:
        encoder = self.c.text_encoder
        return encoder.encode(prompt).float(), encoder.encode(negative).float()

    def encode_reference_image(self, path: str, tier: Tier) -> tuple[torch.Tensor, torch.Tensor]:
        """Upstream's I2VA geometry: fit the longer side to the tier's, pad white, encode."""

        from PIL import Image
        from vllm_omni.diffusion.models.magi2.pipeline_magi2 import _resizepad

        stride = self.c.config.spatial_stride * self.c.config.dit_patch  # whole DiT tokens
        with Image.open(path) as image:
            image = image.convert("RGB")
            longest = max(tier.height, tier.width)
            if image.width > image.height:
                width, height = longest, int(image.height * longest / image.width)
            else:
                height, width = longest, int(image.width * longest / image.height)
            height, width = max(stride, height // stride * stride), max(stride, width // stride * stride)
            padded = _resizepad(image, height, width)
        pixels = torch.from_numpy(np.asarray(padded, dtype=np.float32) / 127.5 - 1.0)
        pixels = pixels.permute(2, 0, 1).unsqueeze(0).unsqueeze(2)  # [1, 3, 1, H, W]
        latent = self.c.image_encoder.encode_video(pixels.to(self.device), use_sample=False)
        lengths = torch.tensor([[self.c.config.reference_tokens(latent)]], dtype=torch.long, device=self.device)
        return latent.unsqueeze(1), lengths

    # -- decoding ---------------------------------------------------------------------------
    def decode_video(self, latent: torch.Tensor, tier: Tier) -> np.ndarray:
        from vllm_omni.diffusion.models.magi2.pipeline_magi2 import _resize_video

        decoded = self.c.video_decoder.decode(latent.float())
        video = decoded[0].float().mul_(0.5).add_(0.5).clamp_(0, 1)
        frames = video.permute(1, 2, 3, 0).mul_(255).byte().cpu().numpy()
        # The tiny decoder yields fewer frames than the tier; sample them evenly over the clip.
        index = np.floor(np.arange(tier.frames) * len(frames) / tier.frames).astype(np.int64)
        return np.ascontiguousarray(_resize_video(frames[index], tier.width, tier.height))

    def set_vae_patch_parallel(self, size: int) -> None:
        """Upstream's TurboVAE temporal-tile parallelism over the world group (1 = off)."""

        decoder = self.c.video_decoder
        decoder.use_tiling = size > 1
        decoder.set_parallel_size(size)

    def decode_refined_video(self, latent: torch.Tensor, width: int, height: int, frames: int) -> np.ndarray | None:
        """Decode the refiner latent, then upsample to ``width`` x ``height`` x ``frames`` in chunks.

        Under VAE patch-parallel every rank decodes some temporal tiles and rank 0 alone gets
        the merged result (upstream's executor); the other ranks return None.

        The tiny decoder's output is small; each decoded frame is resized once (a chunk at a
        time, in fp32) and written as uint8 to every output frame that samples it, so no
        full-resolution fp32 video ever exists (1088 x 1920 x 249 uint8 is 1.56 GB; fp32 6.2 GB).
        """

        from vllm_omni.diffusion.models.magi2.pipeline_magi2 import _resize_video

        decoded = self.c.video_decoder.decode(latent.float())
        if decoded.numel() == 0:  # a patch-parallel rank other than 0: rank 0 holds the merged video
            return None
        decoded = decoded[0]  # [3, F, h, w], small
        small = decoded.float().mul_(0.5).add_(0.5).clamp_(0, 1).mul_(255).byte().permute(1, 2, 3, 0).cpu().numpy()
        source = np.floor(np.arange(frames) * len(small) / frames).astype(np.int64)
        out = np.empty((frames, height, width, 3), dtype=np.uint8)
        for first in range(0, len(small), DECODE_CHUNK_FRAMES):
            chunk = _resize_video(small[first:first + DECODE_CHUNK_FRAMES], width, height)
            for offset, frame in enumerate(chunk):
                out[source == first + offset] = frame
        return out

    def refine(self, latent: torch.Tensor, audio_latent: torch.Tensor, context: torch.Tensor,
               context_null: torch.Tensor, steps: int, tier: Tier) -> torch.Tensor:
        """Upsample + re-noise the preview latent and run the refiner; returns the video latent.

        The preview's clean audio latent is the refiner's audio input (Sand AI's
        ``magi2_refiner_audio_noise_scale`` -1: not re-noised); the refiner's audio output is
        dropped, because the clip's audio is the preview's. No reference image is passed
        (``magi2_refiner_condition_input: none``).
        """

        config = self.c.config
        recipe = refiner_recipe()
        stride = config.spatial_stride
        size = (config.refiner_latent_frames, tier.height // stride, tier.width // stride)
        up = torch.nn.functional.interpolate(latent.float(), size=size, mode="trilinear", align_corners=False)
        sigma, video_scheduler, audio_scheduler = refiner_schedulers(steps, recipe, self.device)
        # Drawn from the CPU generator after the preview's video and audio noise.
        noise = torch.randn(up.shape, dtype=torch.float32).to(self.device)
        noised = (1.0 - sigma) * up + sigma * noise
        sampler_input = self._sampler_input(noised, audio_latent, context, context_null, video_scheduler,
                                            audio_scheduler, recipe.video_cfg, recipe.audio_cfg)
        with stage("refiner"):
            refined, _ = self.refiner_sampler.sample(sampler_input)
        return refined

    def _sampler_input(self, latent: torch.Tensor, audio_latent: torch.Tensor, context: torch.Tensor,
                       context_null: torch.Tensor, video_scheduler, audio_scheduler, video_cfg: float,
                       audio_cfg: float, **reference_image):
        """Upstream's sampler input for one stage (the preview passes the I2VA reference image)."""

        from vllm_omni.diffusion.models.magi2.sampler_magi2 import CFGConfig, SamplerInput

        return SamplerInput(
            video_t_list=video_scheduler.timesteps,
            audio_t_list=audio_scheduler.timesteps,
            latent=latent,
            audio_latent=audio_latent,
            txt_feat=context,
            null_txt_feat=context_null,
            ref_audio_feat=torch.zeros(1, 0, AUDIO_LATENT_CHANNELS, device=self.device),
            ref_video_feat=None,
            video_scheduler=video_scheduler,
            audio_scheduler=audio_scheduler,
            cfg_config=CFGConfig(video_txt_guidance_scale=video_cfg, audio_txt_guidance_scale=audio_cfg),
            **reference_image,
        )

    def decode_audio(self, audio_latent: torch.Tensor, seconds: float) -> np.ndarray:
        from scipy.signal import resample

        waveform = self.c.audio_decoder.decode(audio_latent.transpose(1, 2).float())
        audio = waveform.squeeze(0).transpose(0, 1).float().cpu().numpy()
        # Fourier resampling as upstream does, to exactly the clip's length at 44.1 kHz.
        return resample(audio, int(round(seconds * AUDIO_SAMPLE_RATE)), axis=0).astype(np.float32)

    # -- the run ----------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, request: Request, tier: Tier, steps: int, refiner_steps: int | None = None,
            on_stage: Callable[[str], None] | None = None,
            output_size: tuple[int, int] | None = None) -> DriverOutput:
        """One request. A refined tier runs its preview tier first; ``output_size`` (w, h) resizes."""

        from vllm_omni.diffusion.models.magi2.pipeline_magi2 import (
            DEFAULT_NEGATIVE_PROMPT,
            Magi2Pipeline,
            _seed_request,
        )
        from vllm_omni.diffusion.models.magi2.sampler_magi2 import build_magi2_preview_schedulers

        stages = _Stages(on_stage)
        preview_tier = tier.preview_tier
        _seed_request(request.seed)
        prompt = request.prompt
        ref_feat = ref_len = special = None
        if request.image:
            ref_feat, ref_len = stages.run("encode", self.encode_reference_image, request.image, preview_tier)
            prompt = Magi2Pipeline._ensure_figure_token(prompt)
        negative = request.negative_prompt or DEFAULT_NEGATIVE_PROMPT
        context, context_null = stages.run("encode", self.encode_prompts, prompt, negative)
        if ref_feat is not None:
            special = self.c.text_encoder.pool_figure_tokens(prompt, ["<Figure 1>"], context).unsqueeze(0)

        config = self.c.config
        stride = config.spatial_stride
        audio_length = int(round(tier.seconds * config.audio_latent_fps))
        # Draw order is parity-critical upstream: video noise precedes audio noise. Both are drawn
        # from the CPU generator, so every device and layout starts from the same noise.
        latent = torch.randn(1, VIDEO_CHANNELS, config.latent_frames, preview_tier.height // stride,
                             preview_tier.width // stride, dtype=torch.float32).to(self.device)
        audio_latent = torch.randn(1, audio_length, AUDIO_LATENT_CHANNELS, dtype=torch.float32).to(self.device)
        video_scheduler, audio_scheduler = build_magi2_preview_schedulers(steps, device=self.device, shift=7.0)
        sampler_input = self._sampler_input(latent, audio_latent, context, context_null, video_scheduler,
                                            audio_scheduler, request.video_cfg, request.audio_cfg,
                                            ref_image_feat=ref_feat, ref_image_feat_len=ref_len,
                                            ref_image_special_token_embedding=special)
        latent, audio_latent = stages.run("preview", self.sampler.sample, sampler_input)
        width, height = output_size or (tier.width, tier.height)
        if tier.refined:
            # The audio is the preview's, decoded once; the refiner only touches the video.
            audio = stages.run("decode_audio", self.decode_audio, audio_latent, tier.seconds)
            latent = stages.run("refiner", self.refine, latent, audio_latent, context, context_null,
                                refiner_steps or tier.refiner_steps, tier)
        latents = media.latents_sha256(latent.float().cpu().numpy(), audio_latent.float().cpu().numpy())
        if tier.refined:
            frames = stages.run("decode_video", self.decode_refined_video, latent, width, height, tier.frames)
        else:
            frames = stages.run("decode_video", self.decode_video, latent, tier)
            audio = stages.run("decode_audio", self.decode_audio, audio_latent, tier.seconds)
        return DriverOutput(frames, audio, stages.ms,
                            "request" if request.negative_prompt else "upstream DEFAULT_NEGATIVE_PROMPT", latents)
