"""The 1080p refiner's recipe and schedulers: Sand AI's ``magi2_refiner.json`` settings (bundled)
and upstream's flow UniPC schedulers set up from them. The refiner DiT itself is in
:mod:`.block_window`; :class:`~.driver.EmbeddedDriver` runs the stage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

SANDAI_REFINER_JSON = Path(__file__).resolve().parents[2] / "data" / "sandai" / "magi2_refiner.json"


@dataclass(frozen=True)
class RefinerRecipe:
    """Sand AI's refiner settings, read from their ``magi2_refiner.json`` (bundled)."""

    noise_value: float
    shift: float
    video_cfg: float
    audio_cfg: float
    steps: int


@cache
def refiner_recipe() -> RefinerRecipe:
    config = json.loads(SANDAI_REFINER_JSON.read_text(encoding="utf-8"))["evaluation_config"]
    return RefinerRecipe(noise_value=float(config["magi2_refiner_noise_value"]),
                         shift=float(config["magi2_refiner_shift"]),
                         video_cfg=float(config["magi2_refiner_video_txt_guidance_scale"]),
                         audio_cfg=float(config["magi2_refiner_audio_txt_guidance_scale"]),
                         steps=int(config["magi2_refiner_num_inference_steps"]))


def refiner_schedulers(steps: int, recipe: RefinerRecipe, device: torch.device):
    """Upstream's flow UniPC schedulers, shifted by the recipe's shift, starting at its noise value.

    ``set_timesteps(sigmas=s)`` shifts ``s`` as ``shift*s / (1 + (shift-1)*s)``; the start is
    the inverse of that at ``noise_value / 1000``, so the first timestep is the noise value
    and the ``steps`` timesteps span it down to 0 on the shifted curve.
    """

    from vllm_omni.diffusion.models.schedulers import FlowUniPCMultistepScheduler

    sigma = recipe.noise_value / 1000.0
    start = sigma / (recipe.shift - (recipe.shift - 1.0) * sigma)
    schedulers = []
    for _ in range(2):
        scheduler = FlowUniPCMultistepScheduler()
        base = np.linspace(start, scheduler.sigma_min, steps + 1)[:-1].copy()
        scheduler.set_timesteps(device=device, sigmas=base, shift=recipe.shift)
        schedulers.append(scheduler)
    return sigma, schedulers[0], schedulers[1]
