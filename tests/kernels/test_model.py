"""Model level: upstream's own Magi2PreviewTransformer (tiny config, CPU) with and without our kernels.

Inputs are built the real way (``Magi2PreviewSampler.prepare_model_input`` then
``Magi2DataProxy().process_input``). With ``install_overrides("on")`` every kernel runs under the
Triton interpreter; the output must match upstream's torch path within
||ours - upstream|| / ||upstream|| <= 1e-4 (fp32 model; the kernels change summation orders and
round once where upstream rounds twice), and the deterministic path must hash identically twice.
"""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
from kernel_testing import rel_err

from magi2_kernels import overrides

pytest.importorskip("vllm_omni.diffusion.models.magi2.modeling_magi2")
from vllm_omni.diffusion.models.magi2.configuration_magi2 import Magi2MoEConfig, Magi2PreviewConfig  # noqa: E402
from vllm_omni.diffusion.models.magi2.modeling_magi2 import Magi2PreviewTransformer  # noqa: E402
from vllm_omni.diffusion.models.magi2.preview_data_proxy import Magi2DataProxy  # noqa: E402
from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler  # noqa: E402


def tiny_model(seed: int) -> Magi2PreviewTransformer:
    config = Magi2PreviewConfig(
        num_layers=3, hidden_size=256, head_dim=64, num_query_groups=2, text_in_channels=128,
        multimodal_layers=(0, 2), params_dtype=torch.float32, attention_sink_tokens=2,
        moe=Magi2MoEConfig(num_heads=4, num_experts=8, top_k=2, expert_intermediate_size=64,
                           shared_expert_intermediate_size=64, modality_shared_expert_intermediate_size=64,
                           layers=(1,)),
    )
    model = Magi2PreviewTransformer(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # upstream allocates parameters with torch.empty
        for _, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if not tensor.is_floating_point():
                continue
            if tensor.dim() >= 2:
                tensor.copy_(torch.randn(tensor.shape, generator=generator) / math.sqrt(tensor[0].numel()))
            else:
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.3)
    return model.eval()


def model_args(model: Magi2PreviewTransformer, seed: int):
    generator = torch.Generator().manual_seed(seed)
    sampler = Magi2PreviewSampler(model)
    model_input = sampler.prepare_model_input(
        torch.randn(1, 48, 2, 2, 4, generator=generator), torch.randn(1, 8, 64, generator=generator),
        torch.randn(1, 6, 128, generator=generator), torch.randn(1, 5, 128, generator=generator), t=600.0,
    )
    return Magi2DataProxy().process_input(model_input).model_args


@pytest.fixture
def restore_upstream():
    yield
    overrides.install_overrides("off")


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().contiguous().numpy().tobytes()).hexdigest()


@pytest.mark.slow
def test_overrides_match_upstream_and_are_deterministic(restore_upstream, monkeypatch, gen):
    from magi2_kernels import moe_triton

    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    model = tiny_model(seed)
    args = model_args(model, seed + 1)
    with torch.no_grad():
        overrides.install_overrides("off")
        expected = model(*args)
        report = overrides.install_overrides("on")
        assert set(report) - {"platform"} == set(overrides.KERNELS)
        assert all(v == "ours:triton" for k, v in report.items() if k != "platform"), report
        launches = []
        real_launch = moe_triton.launch
        monkeypatch.setattr(moe_triton, "launch", lambda *a, **k: launches.append(k["deterministic"]) or
                            real_launch(*a, **k))
        monkeypatch.setenv("MAGI2_MOE_ATOMIC", "1")
        ours = model(*args)
        monkeypatch.delenv("MAGI2_MOE_ATOMIC")
        first, second = model(*args), model(*args)  # the default: deterministic
    assert launches == [False, True, True]  # the MoE layer went through our kernel, both variants
    assert torch.isfinite(expected).all() and expected.abs().max() > 0
    assert rel_err(ours, expected) <= 1e-4
    assert rel_err(first, expected) <= 1e-4
    assert digest(first) == digest(second)


def test_reference_paths_match_upstream(restore_upstream, monkeypatch, gen):
    """CPU without TRITON_INTERPRET: "on" installs our PyTorch references (the embedded engine's case)."""

    from dataclasses import replace

    from magi2_kernels import moe
    from magi2_kernels.platform import current_platform

    calls = []
    real_reference = moe.reference_moe
    monkeypatch.setattr(moe, "reference_moe", lambda *a, **k: calls.append(1) or real_reference(*a, **k))
    cpu = replace(current_platform(), name="cpu", triton=False, interpreter=False)
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    model = tiny_model(seed)
    args = model_args(model, seed + 1)
    with torch.no_grad():
        overrides.install_overrides("off")
        expected = model(*args)
        report = overrides.install_overrides("on", platform=cpu)
        assert all(v == "ours:reference" for k, v in report.items() if k != "platform"), report
        ours = model(*args)
    assert calls == [1]
    assert rel_err(ours, expected) <= 1e-4
