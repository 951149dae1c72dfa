"""The training target is the convention upstream's sampler integrates (FlowUniPC, shift 7)."""

import numpy as np
import torch

from magi2studio.training.trainer import SHIFT, flow_pair, shifted_sigma


def _schedulers(steps):
    from vllm_omni.diffusion.models.magi2.sampler_magi2 import build_magi2_preview_schedulers

    return build_magi2_preview_schedulers(steps, device="cpu", shift=SHIFT)


def test_the_sampler_lands_on_x0_when_the_model_predicts_the_training_target():
    generator = torch.Generator().manual_seed(0)
    x0 = torch.rand(1, 48, 4, 4, 7, generator=generator) * 2 - 1
    noise = torch.randn(x0.shape, generator=generator)
    scheduler, _ = _schedulers(12)
    sample = noise.clone()
    for t in scheduler.timesteps:
        sigma = float(t) / 1000.0  # prepare_model_input hands the model t / 1000
        # The target trained at this sigma, for the noise that would put x0 at this sample.
        implied_noise = (sample - (1 - sigma) * x0) / sigma
        _, velocity = flow_pair(x0, implied_noise, sigma)
        sample = scheduler.step(velocity, t, sample, return_dict=False)[0]
    assert torch.allclose(sample, x0, atol=5e-3), float((sample - x0).abs().max())  # UniPC stops at sigma_min


def test_the_opposite_sign_does_not_land_on_x0():
    x0 = torch.full((1, 4, 1, 2, 2), 0.5)
    scheduler, _ = _schedulers(12)
    sample = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1))
    for t in scheduler.timesteps:
        sigma = float(t) / 1000.0
        _, velocity = flow_pair(x0, (sample - (1 - sigma) * x0) / sigma, sigma)
        sample = scheduler.step(-velocity, t, sample, return_dict=False)[0]
    assert (sample - x0).abs().max() > 0.1


def test_training_sigmas_follow_the_inference_shift():
    scheduler, _ = _schedulers(50)
    sigmas = scheduler.timesteps.double().numpy() / 1000.0
    grid = np.linspace(1.0, 0.0, 51)[:-1]
    np.testing.assert_allclose(sorted(shifted_sigma(u) for u in grid[1:]),
                               sorted(sigmas[1:]), atol=0.02)
    assert shifted_sigma(0.0) == 0.0 and abs(shifted_sigma(1.0) - 1.0) < 1e-12
