"""mHC kernels (Triton, interpreter) against fp64 references and vLLM-Omni's native mHC.

Bounds (||out - ref|| / ||ref||, fp32 inputs): Sinkhorn/post <= 1e-6, mix/pre <= 1e-6,
projection <= 1e-5 (a 4C-long fp32 reduction).
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import rel_err

from magi2_kernels import mhc


def coefficients(gen, tokens):
    fused = torch.randn(tokens, 24, generator=gen) * 3
    params = (torch.rand(1, generator=gen) + 0.5, torch.randn(4, generator=gen), torch.rand(1, generator=gen) + 0.5,
              torch.randn(4, 4, generator=gen))
    return fused, params


def projection_inputs(gen, multimodal, dtype, tokens=45, hidden=48):
    """The mHC projection's inputs: flattened streams, the RMS weight per modality, sorted modalities, phi."""
    flat = torch.randn(tokens, 4 * hidden, generator=gen).to(dtype)
    weight = torch.randn(3 if multimodal else 1, 4 * hidden, generator=gen) * 0.2
    modality = torch.sort(torch.randint(0, 3, (tokens,), generator=gen)).values if multimodal else None
    phi = torch.randn(4 * hidden, 24, generator=gen) / (4 * hidden) ** 0.5
    return flat, weight, modality, phi


@pytest.mark.parametrize("tokens", [1, 67])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_post_residual_sinkhorn(gen, poison, tokens, out_dtype):
    fused, (ap, bp, ar, br) = coefficients(gen, tokens)
    post_logits, res_logits = fused[:, 4:8], fused[:, 8:].view(-1, 4, 4)  # strided views, as in the model
    post, res = mhc.post_residual(post_logits, res_logits, ap, bp, ar, br, scale=0.37, iterations=20,
                                  epsilon=1e-12, out_dtype=out_dtype)
    post64, res64 = mhc.reference_post_residual(post_logits.double(), res_logits.double(), ap.double(), bp.double(),
                                                ar.double(), br.double(), scale=0.37, iterations=20, epsilon=1e-12,
                                                out_dtype=torch.float64)
    bound = 1e-6 if out_dtype == torch.float32 else 1e-3
    assert post.dtype == out_dtype and res.dtype == out_dtype
    assert rel_err(post, post64) <= bound and rel_err(res, res64) <= bound
    # 20 iterations end on a row normalisation: rows sum to one.
    assert torch.allclose(res.double().sum(-1), torch.ones(tokens, 4, dtype=torch.float64), atol=2e-3)


def test_sinkhorn_nan_spreads_over_its_token_only(gen):
    fused, (ap, bp, ar, br) = coefficients(gen, 5)
    fused[2, 9] = float("nan")
    _, res = mhc.post_residual(fused[:, 4:8], fused[:, 8:].view(-1, 4, 4), ap, bp, ar, br, scale=0.5,
                               iterations=20, epsilon=1e-12, out_dtype=torch.float32)
    assert torch.isnan(res[2]).all() and torch.isfinite(res[[0, 1, 3, 4]]).all()


def test_matches_vllm_omni_native_mhc(gen):
    native = pytest.importorskip("vllm_omni.diffusion.layers.mhc")
    fused, (ap, bp, ar, br) = coefficients(gen, 19)
    args = (fused[:, 4:8], fused[:, 8:].view(-1, 4, 4), ap, bp, ar, br)
    theirs = native.MHCPostResidual.forward_native(*args, scale=0.2, iterations=20, epsilon=1e-12,
                                                   out_dtype=torch.float32)
    ours = mhc.post_residual(*args, scale=0.2, iterations=20, epsilon=1e-12, out_dtype=torch.float32)
    assert rel_err(ours[0], theirs[0]) <= 1e-6 and rel_err(ours[1], theirs[1]) <= 1e-6
    streams = torch.randn(19, 4, 80, generator=gen)
    branch = torch.randn(19, 80, generator=gen)
    mixed = native.MHCMix.forward_native(streams, branch, ours[0], ours[1])
    assert rel_err(mhc.mix(streams, branch, ours[0], ours[1]), mixed) <= 1e-6


@pytest.mark.parametrize("hidden", [80, 600])  # 600: several channel blocks, the last one partial
def test_mix_and_pre(gen, poison, hidden):
    tokens = 13
    streams = torch.randn(tokens, 4, hidden, generator=gen)
    branch = torch.randn(tokens, hidden, generator=gen)
    post = torch.rand(tokens, 4, generator=gen) * 2
    residual = torch.rand(tokens, 4, 4, generator=gen)
    out = mhc.mix(streams, branch, post, residual)
    assert rel_err(out, mhc.reference_mix(streams.double(), branch.double(), post.double(), residual.double())) <= 1e-6
    alpha, bias = torch.rand(1, generator=gen), torch.randn(4, generator=gen)
    logits = torch.randn(tokens, 4, generator=gen)
    pre = mhc.apply_pre(streams, alpha, bias, logits, scale=0.3, out_dtype=torch.float32)
    ref = mhc.reference_apply_pre(streams.double(), alpha.double(), bias.double(), logits.double(), scale=0.3,
                                  out_dtype=torch.float64)
    assert rel_err(pre, ref) <= 1e-6


@pytest.mark.parametrize("multimodal", [False, True])
def test_projection_with_folded_norm(gen, poison, multimodal):
    flat, weight, modality, phi = projection_inputs(gen, multimodal, torch.float16)
    out = mhc.logits(flat, weight, modality, 1e-6, phi)
    ref = mhc.reference_logits(flat.double(), weight.double(), modality, 1e-6, phi.double())
    assert out.shape == (45, 24) and out.dtype == torch.float32
    assert rel_err(out, ref) <= 1e-5


@pytest.mark.parametrize("multimodal", [False, True])
def test_projection_bf16_split_keeps_fp32_level_error(gen, poison, multimodal):
    """bf16 x against phi as three bf16 terms: fp32-level error (one term alone: bf16's ~1e-3)."""
    from magi2_kernels import mhc_triton

    flat, weight, modality, phi = projection_inputs(gen, multimodal, torch.bfloat16)
    ref = mhc.reference_logits(flat.double(), weight.double(), modality, 1e-6, phi.double())
    out = mhc_triton.logits(flat, weight, modality, 1e-6, phi, num_streams=4, dot_precision="ieee", block_k=16,
                            bf16_split=True)
    assert rel_err(out, ref) <= 1e-5
    parts = mhc_triton.split_bf16(phi)
    assert parts.dtype == torch.bfloat16 and torch.equal(parts.float().sum(dim=0), phi)
    assert rel_err(parts[0].double(), phi.double()) > 1e-4  # one bf16 term alone would not do


def test_the_fast_reciprocal_drops_the_divides_range_checks_in_hopper_sass():
    """scripts/kernel_sass.py compiles the Sinkhorn kernel for sm_90 here (no GPU; a process without the
    interpreter): with rcp.approx the 20 iterations' 160 reciprocals carry none of div.full's fix-ups."""

    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import triton

    if tuple(int(part) for part in triton.__version__.split(".")[:2]) < (3, 4):
        pytest.skip(f"Triton {triton.__version__}: the script compiles with Triton >= 3.4's API (the NVIDIA path's)")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root / "kernels")
    counts = {}
    for flag in ([], ["--no-fast-reciprocal"]):
        done = subprocess.run([sys.executable, str(root / "scripts" / "kernel_sass.py"), *flag], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        counts[bool(flag)] = json.loads(done.stdout)
    fast, full = counts[False], counts[True]
    assert fast["by_opcode"]["MUFU"] >= 160 and full["by_opcode"]["MUFU"] >= 160  # 8 reciprocals x 20 iterations
    assert fast["instructions_per_token"] < full["instructions_per_token"]
    assert full["by_opcode"]["FSETP"] - fast["by_opcode"]["FSETP"] >= 160  # one range check per divide, gone


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_projection_tf32_split_keeps_fp32_level_error(gen, poison, dtype):
    """A 16-bit x against phi as a tf32 term and its rest: fp32-level error; the terms sum to phi exactly."""
    from magi2_kernels import mhc_triton

    flat, weight, modality, phi = projection_inputs(gen, True, dtype)
    ref = mhc.reference_logits(flat.double(), weight.double(), modality, 1e-6, phi.double())
    out = mhc_triton.logits(flat, weight, modality, 1e-6, phi, num_streams=4, dot_precision="ieee", block_k=16,
                            tf32_split=True)
    assert rel_err(out, ref) <= 1e-5
    parts = mhc_triton.split_tf32(phi)
    assert torch.equal(parts[0] + parts[1], phi)
    assert not (parts[0].view(torch.int32) & 0x1FFF).any()  # tf32: the low 13 mantissa bits are zero
    assert (parts[1].abs() <= phi.abs() * 2.0 ** -11).all()
