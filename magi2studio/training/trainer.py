"""Train the tiny MAGI-2 on captioned scenes, through upstream's own classes.

In order, from one seed:

1. the **video decoder** (upstream ``Magi2TurboVAEDecoder``) and the **audio decoder**
   (upstream ``Magi2AudioDecoder``, an Oobleck stack) are *set*, not fitted, to invert the fixed
   latent codes of :mod:`.latents` (the video one as far as TurboVAE's layers can: each latent
   cell's mean colour, exact in time);
2. the **DiT** (upstream ``Magi2PreviewTransformer``) learns flow matching on those codes,
   with the inputs built the way the sampler builds them at every step
   (``Magi2PreviewSampler.prepare_model_input`` then ``Magi2DataProxy.process_input``): the
   packed batch's first half is conditioned on the caption (I2VA: and the reference image),
   its second half on the encoded negative prompt with a zeroed reference, exactly the
   unconditional branch that the sampler's CFG subtracts. The target is the sampler's
   convention: ``x_t = (1 - s) x0 + s noise``, ``t = 1000 s``, velocity ``noise - x0``
   (FlowUniPC's ``flow_prediction``: ``x0 = x_t - s v``), with ``s`` drawn uniformly and
   shifted by 7 as the inference schedule is.

Not trained: the text encoder (upstream ``Magi2Qwen35TextEncoder`` over a seeded random
Qwen3.5) is kept frozen: its features already tell the captions apart (different tokens,
different vectors) and the DiT learns to read them; and the refiner DiT (1080p) is left at
its random weights. The image-encoder stand-in is set to compute the video code exactly.

Over 300 lines on purpose: the parts are made in this order over one set of examples, settings
and log, and the file reads in that order; the latent codes they learn are :mod:`.latents`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from ..engines.embedded.tiny import TinyConfig
from ..errors import InputError
from ..semantic.scenes import Scene, sample_scenes
from ..vocabulary.tiers import get_tier
from . import latents as codes

SHIFT = 7.0  # the preview schedule's shift (build_magi2_preview_schedulers)
LATENT_OBJECT_WEIGHT = 10.0  # the DiT loss's extra weight on the object's video cells and the beeps' audio


def trained_config(seed: int = 0) -> TinyConfig:
    """The tiny config the trained weights use: today's at half the DiT width and with prompts
    cut at 80 tokens (a caption with the I2VA figure line is at most 67), so that a CPU can
    train it, with the audio decoder that :func:`latents.audio_decoder_state` sets (5 strides
    of 4: 5 latents/s x 1024 = 5120 samples/s, widths 64 -> 16 -> 4 -> 2), and the video code's
    geometry (:mod:`.latents`): 16-pixel latent cells (16 x 28 at 272p) and a TurboVAE whose four
    up blocks all double time, so 4 latent frames decode to 49 frames; the DiT takes 2 x 2 cells a
    token (448 video tokens at 272p, 4 times the 64-pixel grid's 112)."""

    return replace(TinyConfig(seed=seed), hidden_size=128, text_max_length=80,
                   spatial_stride=codes.CELL, dit_patch=codes.DIT_PATCH, turbo_channels=codes.TURBO_CHANNELS,
                   turbo_time_upsamplings=codes.TIME_UPSAMPLINGS,
                   audio_strides=codes.AUDIO_DECODER_STRIDES, audio_decoder_channels=codes.AUDIO_DECODER_CHANNELS,
                   audio_decoder_multiples=codes.AUDIO_DECODER_MULTIPLES,
                   extra={"weights": "trained", "codes": "magi2studio.training.latents"})


@dataclass(frozen=True)
class TrainSettings:
    seed: int = 0
    tier: str = "272p"
    scenes: int = 256  # distinct training clips (held-out combinations never drawn)
    dit_steps: int = 900
    batch: int = 8
    lr: float = 1e-3
    i2va_share: float = 0.25  # of DiT batches, conditioned on the first frame
    log_every: int = 25
    # The training noise draw: sigma = shifted_sigma(u, noise_shift), u uniform. The sampler's shift (SHIFT) puts
    # only 5 % of the draws below s = 0.27, where the runs so far leave the noise in (docs/training.md); a smaller
    # shift draws low noise levels more often (1.0: sigma uniform).
    noise_shift: float = SHIFT

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Example:
    caption: str
    video: torch.Tensor  # [48, T, h, w] latent code
    audio: torch.Tensor  # [L, 64] latent code
    first_frame: np.ndarray  # uint8 [H, W, 3] (the I2VA reference)


@dataclass
class TrainLog:
    settings: dict
    config_digest: str
    phases: dict[str, list[dict]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, step: int, **values: float) -> None:
        self.phases.setdefault(phase, []).append({"step": step, **{k: round(float(v), 6) for k, v in values.items()}})

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def make_examples(config: TinyConfig, settings: TrainSettings,
                  scenes: Iterator[Scene] | None = None) -> list[Example]:
    tier = get_tier(settings.tier)
    stream = scenes or sample_scenes(settings.seed, tier, "train")
    examples = []
    for _ in range(settings.scenes):
        scene = next(stream)
        video, first_frame = codes.encode_scene(scene, config.spatial_stride, config.latent_frames)
        examples.append(Example(caption=scene.caption, video=video,
                                audio=codes.encode_audio(scene, config.audio_latent_fps), first_frame=first_frame))
    return examples


# -- decoders ---------------------------------------------------------------------------------
def set_video_decoder(decoder) -> None:
    """Upstream's TurboVAE decoder set to the part of the video code's inverse it can compute: each
    latent cell's mean colour, exact in time (not fitted: a 3000-step fit took 612 s and drew
    every shape as a round blur; docs/training.md, "The video decoder, set")."""

    decoder.decoder.load_state_dict(codes.video_decoder_state(decoder.decoder, decoder.latent_mean,
                                                              decoder.latent_std))
    decoder.decoder.eval().requires_grad_(False)


def set_audio_decoder(decoder) -> None:
    """Upstream's Oobleck decoder set to the audio code's exact inverse (not fitted: fits of 400 to
    1500 steps made one tone for both pitches, docs/training.md)."""

    decoder.decoder.load_state_dict(codes.audio_decoder_state(decoder.decoder))
    decoder.decoder.eval().requires_grad_(False)


# -- the DiT ----------------------------------------------------------------------------------
@dataclass
class Conditioning:
    """Encoded prompts, cached per caption, and I2VA references, per example (both encoders are fixed)."""

    text_encoder: object
    negative: torch.Tensor
    cache: dict[str, torch.Tensor] = field(default_factory=dict)
    references: dict[int, torch.Tensor] = field(default_factory=dict)

    def text(self, caption: str) -> torch.Tensor:
        if caption not in self.cache:
            self.cache[caption] = self.text_encoder.encode(caption).float()
        return self.cache[caption]

    def reference(self, index: int, example: Example, image_encoder) -> torch.Tensor:
        """The example's first frame through the image encoder (most of an I2VA batch's CPU time if redone)."""

        if index not in self.references:
            pixels = torch.from_numpy(example.first_frame.astype(np.float32) / 127.5 - 1.0)
            self.references[index] = image_encoder.encode_video(pixels.permute(2, 0, 1)[None, :, None])
        return self.references[index]


def flow_pair(x0: torch.Tensor, noise: torch.Tensor, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's convention: the noised input at ``sigma`` and the velocity to predict."""

    return (1.0 - sigma) * x0 + sigma * noise, noise - x0


def shifted_sigma(u: float, shift: float = SHIFT) -> float:
    return shift * u / (1.0 + (shift - 1.0) * u)


def _cat_inputs(inputs: list) -> object:
    """One packed batch from per-sample ``ModelInput``s (each already [cond, uncond])."""

    from vllm_omni.diffusion.models.magi2.preview_data_proxy import ModelInput

    merged = {}
    for name in ModelInput.__dataclass_fields__:
        values = [getattr(item, name) for item in inputs]
        if values[0] is None:
            merged[name] = None
        elif isinstance(values[0], torch.Tensor):
            merged[name] = torch.cat(values, dim=0)
        else:
            merged[name] = [v for value in values for v in value]
    return ModelInput(**merged)


def dit_batch(sampler, conditioning: Conditioning, image_encoder, text_encoder, examples: list[Example],
              pick: list[int], i2va: bool, generator: torch.Generator, uncond_share: float = 0.15,
              noise_shift: float = SHIFT):
    """The model input of one training batch and its velocity targets.

    Each sample's input is what the sampler builds for one step (``prepare_model_input``:
    [conditional, unconditional]); upstream's own CFG-parallel split then keeps one branch,
    the unconditional one for ``uncond_share`` of the samples (CFG's null branch)."""

    from vllm_omni.diffusion.models.magi2.pipeline_magi2 import Magi2Pipeline

    inputs, video_targets, audio_targets, video_weights, audio_weights = [], [], [], [], []
    for index in pick:
        example = examples[index]
        sigma = shifted_sigma(float(torch.rand((), generator=generator)), noise_shift)
        video_noise = torch.randn(example.video.shape, generator=generator)
        audio_noise = torch.randn(example.audio.shape, generator=generator)
        video_t, video_v = flow_pair(example.video, video_noise, sigma)
        audio_t, audio_v = flow_pair(example.audio, audio_noise, sigma)
        caption = example.caption
        reference = {}
        if i2va:
            caption = Magi2Pipeline._ensure_figure_token(caption)
            latent = conditioning.reference(index, example, image_encoder)
            patch = sampler.data_proxy.patch_size  # upstream counts the reference in tokens
            text = conditioning.text(caption)
            reference = {"ref_image_feat": latent.unsqueeze(1),
                         "ref_image_feat_len": torch.tensor([[[latent.shape[-2] // patch, latent.shape[-1] // patch]]]),
                         "ref_image_special_token_embedding":
                             text_encoder.pool_figure_tokens(caption, ["<Figure 1>"], text).unsqueeze(0)}
        both = sampler.prepare_model_input(
            latent=video_t.unsqueeze(0), audio_latent=audio_t.unsqueeze(0),
            txt_feat=conditioning.text(caption), null_txt_feat=conditioning.negative,
            t=torch.tensor(sigma * 1000.0), **reference)
        branch = int(torch.rand((), generator=generator) < uncond_share)
        inputs.append(sampler._split_cfg_model_input(both)[branch])
        video_targets.append(video_v)
        audio_targets.append(audio_v)
        video_weight, audio_weight = latent_weights(example)
        video_weights.append(video_weight)
        audio_weights.append(audio_weight)
    return (_cat_inputs(inputs), torch.stack(video_targets), torch.stack(audio_targets),
            torch.stack(video_weights), torch.stack(audio_weights))


def latent_weights(example: Example, weight: float = LATENT_OBJECT_WEIGHT) -> tuple[torch.Tensor, torch.Tensor]:
    """The DiT loss's weights of one sample's latents: ``1 + weight`` on the video cells off the
    background (the moving object, about a dozen cells of 448) and on the audio latents that hold a beep
    (~7% of them); elsewhere 1. A plain MSE learns the background and the silence first."""

    video = example.video  # [48, T, h, w]
    background = video.flatten(1).median(dim=1).values[:, None, None, None]
    off = ((video - background).abs().amax(dim=0, keepdim=True) > 0.1).float()
    loud = (example.audio.amax(dim=1, keepdim=True) > -0.9).float()  # [L, 1]
    return 1.0 + weight * off, 1.0 + weight * loud


def _weighted_mse(output: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    weight = weight.expand_as(target)
    return ((output - target) ** 2 * weight).sum() / weight.sum()


def dit_loss(transformer, data_proxy, model_input, video_target: torch.Tensor, audio_target: torch.Tensor,
             video_weight: torch.Tensor, audio_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream's packing, forward and unpacking, with gradients; weighted MSE per modality."""

    packed = data_proxy.process_input(model_input)
    output = transformer(*packed.model_args)
    video, audio = data_proxy.process_output(output, packed.output_layout)
    return _weighted_mse(video, video_target, video_weight), _weighted_mse(audio, audio_target, audio_weight)


def train_dit(components, examples: list[Example], settings: TrainSettings, log: TrainLog,
              generator: torch.Generator, on_step: Callable[[int, float, Callable[[], dict]], bool] | None = None,
              device: str = "cpu", resume: dict | None = None) -> int:
    """AdamW on upstream's forward; batches drawn on the CPU from ``generator`` on any ``device``
    (on a GPU through upstream's differentiable torch paths, :mod:`.on_device`).

    ``on_step(step, loss, snapshot)`` runs after each step; ``snapshot()`` gives the whole
    training state (:func:`resume_state`'s input) and a true return stops the run there.
    ``resume`` is such a state: the run goes on from its step with the model, optimizer,
    schedule and batch generator as they were, so a run stopped and resumed ends with the
    same weights, bit for bit, as one that was not. Returns the steps done."""

    from .on_device import differentiable_upstream_paths

    target = torch.device(device)
    components.transformer.to(target)
    try:
        with differentiable_upstream_paths():
            return _train_dit(components, examples, settings, log, generator, on_step, target, resume)
    finally:
        components.transformer.to("cpu")


RESIDUAL_MIX_LOGIT = 3.0  # the mHC residual mix's bias at the start: +3 on its diagonal, -3 off it


def open_residual_streams(transformer, logit: float = RESIDUAL_MIX_LOGIT) -> None:
    """Start each mHC residual mix (upstream's ``mhc_bias_res_*``; Sinkhorn makes it doubly stochastic) near
    the identity, so the 4 residual streams stay apart: the residual path is then 4 x hidden_size wide.

    Why: at the seeded draw (biases of N(0, 0.5)) each mix is near uniform, the 8 mixes of the 4 layers
    multiply to rank 1 and the streams collapse into one, ``hidden_size`` (128) wide. A 16-pixel video
    token is 192 values (2 x 2 cells x 48), and flow matching's target (noise - x0) needs every one of
    them carried from input to output: the 2500-step run of 2026-12-07 left the 64 dimensions it could not
    carry as noise in every decoded picture (docs/training.md, "The DiT's residual streams"). With +-3
    each mix's diagonal is about 0.99 and the product of the 8 keeps all 4 streams (singular values about
    0.9; ``tests/training/test_trainer.py``)."""

    with torch.no_grad():
        for name, parameter in transformer.named_parameters():
            if "mhc_bias_res_" in name:
                streams = parameter.shape[0]
                parameter.copy_(logit * (2.0 * torch.eye(streams, dtype=parameter.dtype) - 1.0))


def check_resumable(state: dict, settings: TrainSettings, config_digest: str) -> None:
    """A saved DiT state continues only the run it came from: same settings, same model config."""

    saved = state["log"]
    defaults = TrainSettings().as_dict()  # a setting added since the state was saved: it was trained at its default
    for name, value in settings.as_dict().items():
        was = saved["settings"].get(name, defaults[name])
        if was != value:
            raise InputError("--resume", f"the saved state was trained with {name}={was!r}, "
                             f"this run asks {value!r}", "pass the saved run's settings, or start afresh in "
                             "another --work folder")
    if saved["config_digest"] != config_digest:
        raise InputError("--resume", "the saved state is of another model config",
                         "start afresh in another --work folder")


def _train_dit(components, examples, settings, log, generator, on_step, target, resume) -> int:
    from .on_device import batch_to
    from vllm_omni.diffusion.models.magi2.pipeline_magi2 import DEFAULT_NEGATIVE_PROMPT
    from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler

    transformer = components.transformer
    proxy = components.config.data_proxy()  # the config's DiT patch
    sampler = Magi2PreviewSampler(transformer, proxy, device="cpu")
    negative = components.text_encoder.encode(DEFAULT_NEGATIVE_PROMPT).float()
    conditioning = Conditioning(components.text_encoder, negative)
    transformer.train()
    params = [p for p in transformer.parameters() if p.dtype.is_floating_point]
    for p in params:
        p.requires_grad_(True)
    for name, p in transformer.named_parameters():
        if "router.expert_bias" in name:
            p.requires_grad_(False)
    trainable = [p for p in params if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.lr, weight_decay=0.01, betas=(0.9, 0.99))
    schedule = _cosine(optimizer, settings.dit_steps, warmup=min(100, settings.dit_steps // 10))
    first = 0
    if resume is None:
        open_residual_streams(transformer)
    else:
        transformer.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        schedule.load_state_dict(resume["schedule"])
        generator.set_state(resume["generator"])
        log.phases, log.seconds = resume["log"]["phases"], resume["log"]["seconds"]
        first = resume["step"]
    started = time.perf_counter() - log.seconds.get("dit_train", 0.0)

    def snapshot(done: int) -> dict:
        log.seconds["dit_train"] = round(time.perf_counter() - started, 1)
        return {"step": done, "model": _on_cpu(transformer.state_dict()), "optimizer": _on_cpu(optimizer.state_dict()),
                "schedule": schedule.state_dict(), "generator": generator.get_state(), "log": asdict(log)}

    for step in range(first, settings.dit_steps):
        pick = torch.randint(len(examples), (settings.batch,), generator=generator).tolist()
        i2va = bool(torch.rand((), generator=generator) < settings.i2va_share)
        with torch.no_grad():
            batch = batch_to(dit_batch(sampler, conditioning, components.image_encoder, components.text_encoder,
                                       examples, pick, i2va, generator, noise_shift=settings.noise_shift), target)
        video_loss, audio_loss = dit_loss(transformer, proxy, *batch)
        loss = video_loss + audio_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad = torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        schedule.step()
        if step % settings.log_every == 0 or step == settings.dit_steps - 1:
            log.add("dit", step, video=video_loss.item(), audio=audio_loss.item(), grad_norm=float(grad),
                    seconds=time.perf_counter() - started)
        if on_step is not None and on_step(step, loss.item(), lambda done=step + 1: snapshot(done)):
            transformer.eval().requires_grad_(False)
            return step + 1
    transformer.eval().requires_grad_(False)
    return settings.dit_steps


def _on_cpu(tree):
    """A state dict (nested) with every tensor copied to the CPU, so it loads on any device."""

    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {key: _on_cpu(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_on_cpu(value) for value in tree)
    return tree


def _cosine(optimizer, steps: int, warmup: int = 0):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# -- the checkpoint ---------------------------------------------------------------------------
def turbo_state(decoder) -> dict[str, torch.Tensor]:
    """The TurboVAE checkpoint's ``ema_state_dict`` (the keys upstream's loader reads)."""

    return {f"module.decoder.{k}": v.detach().clone().contiguous() for k, v in decoder.decoder.state_dict().items()}


def oobleck_state(decoder) -> dict[str, torch.Tensor]:
    """The Oobleck decoder in the released Stable Audio key names (the inverse of upstream's)."""

    from ..engines.embedded.checkpoint import stable_audio_key

    state = {}
    for key, value in decoder.decoder.state_dict().items():
        value = value.detach().clone().contiguous()
        state[stable_audio_key(key)] = value.reshape(-1) if key.endswith((".alpha", ".beta")) else value
    return state


def write_trained_checkpoint(base: Path, dest: Path, config: TinyConfig, *, dit: dict[str, torch.Tensor],
                             turbo: dict[str, torch.Tensor], oobleck: dict[str, torch.Tensor]) -> Path:
    """The base (seeded) tree with the trained parts in place, written to a temp folder then
    renamed to ``dest``: the refiner and the text encoder stay the base's."""

    from safetensors.torch import save_file

    from ..engines.embedded.checkpoint import write_dit_state
    from ..engines.embedded.tiny import TINY_CONFIG_FILE

    dest.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        tree = temp / "tree"
        shutil.copytree(base, tree)
        shutil.rmtree(tree / "preview")
        write_dit_state(config, dit, tree / "preview")
        torch.save({"ema_state_dict": turbo}, tree / "turbo_vae" / "checkpoint.ckpt")
        save_file(oobleck, str(tree / "stable-audio-open-1.0" / "model.safetensors"), metadata={"format": "pt"})
        torch.save(codes.image_encoder_state(config.spatial_stride), tree / "vae" / "Wan2.2_VAE.pth")
        (tree / TINY_CONFIG_FILE).write_text(config.to_json(), encoding="utf-8")
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(tree, dest)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return dest

