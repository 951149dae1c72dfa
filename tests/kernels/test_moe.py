"""Fused head-routed MoE (Triton, interpreter) against fp64 references and vLLM-Omni's torch oracle.

Bounds (||out - ref|| / ||ref||): fp32 inputs <= 1e-5, fp16 inputs <= 3e-3 (fp16 hidden rows).
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import rel_err

from magi2_kernels import moe, routing
from magi2_kernels.platform import current_platform


def make_problem(gen, tokens, heads, experts, d_head, d_expert, top_k, dtype, hot=0.0):
    x = torch.randn(tokens, heads, d_head, generator=gen).to(dtype)
    gate = torch.randn(heads, experts, d_head, generator=gen) / d_head**0.5
    # A large bias on a few experts skews the loads and leaves others empty.
    bias = torch.zeros(heads, experts)
    if hot:
        bias[:, : top_k + 1] = hot
    routes = routing.route(x, gate, bias, top_k)
    w_gate = (torch.randn(heads * experts, d_head, d_expert, generator=gen) / d_head**0.5).to(dtype)
    w_up = (torch.randn(heads * experts, d_head, d_expert, generator=gen) / d_head**0.5).to(dtype)
    w_down = (torch.randn(heads * experts, d_expert, d_head, generator=gen) / d_expert**0.5).to(dtype)
    return x, routes, moe.pack_w13(w_gate, w_up), w_down, (w_gate, w_up)


def fp64_reference(x, routes, w13, w_down):
    return moe.reference_moe(x.double(), routes.gather_ids, routes.probs.double(), routes.offsets, w13.double(),
                             w_down.double())


CASES = [
    # tokens, heads, experts, d_head, d_expert, top_k, hot-bias
    pytest.param(37, 3, 8, 64, 96, 2, 0.0, id="ep-local-3-heads"),
    pytest.param(1, 3, 8, 64, 96, 2, 0.0, id="single-token"),
    pytest.param(53, 2, 16, 32, 64, 3, 4.0, id="uneven-empty-experts"),
]


@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("tokens,heads,experts,d_head,d_expert,top_k,hot", CASES)
def test_moe_fp32_matches_fp64(gen, poison, tokens, heads, experts, d_head, d_expert, top_k, hot, atomic):
    assert current_platform().triton, "kernel tests must run the Triton interpreter"
    x, routes, w13, w_down, _ = make_problem(gen, tokens, heads, experts, d_head, d_expert, top_k, torch.float32, hot)
    if hot:
        counts = torch.diff(routes.offsets)
        assert (counts == 0).any() and counts.max() > 2 * counts.float().mean()
    out = moe.moe_experts(x, routes.gather_ids, routes.probs, routes.offsets, routes.slots, w13, w_down,
                          atomic=atomic)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert rel_err(out, fp64_reference(x, routes, w13, w_down)) <= 1e-5


def test_moe_fp16_both_variants(gen, poison):
    x, routes, w13, w_down, _ = make_problem(gen, 29, 3, 8, 64, 96, 2, torch.float16)
    ref = fp64_reference(x, routes, w13, w_down)
    for atomic in (True, False):
        out = moe.moe_experts(x, routes.gather_ids, routes.probs, routes.offsets, routes.slots, w13, w_down,
                              atomic=atomic)
        assert out.dtype == torch.float16
        assert rel_err(out, ref) <= 3e-3


def test_deterministic_is_bit_identical(gen):
    x, routes, w13, w_down, _ = make_problem(gen, 41, 3, 8, 64, 96, 3, torch.float32)
    args = (x, routes.gather_ids, routes.probs, routes.offsets, routes.slots, w13, w_down)
    first = moe.moe_experts(*args)  # the default path
    second = moe.moe_experts(*args)
    assert torch.equal(first, second)


def test_padded_head_is_zero(gen, poison):
    """An EP padding head (zero input, zero weights) yields exactly zero; the real heads stay right."""

    x, routes, w13, w_down, _ = make_problem(gen, 23, 4, 8, 64, 96, 2, torch.float32)
    x[:, 3] = 0
    w13.view(4, 8, *w13.shape[1:])[3] = 0
    w_down.view(4, 8, *w_down.shape[1:])[3] = 0
    for atomic in (True, False):
        out = moe.moe_experts(x, routes.gather_ids, routes.probs, routes.offsets, routes.slots, w13, w_down,
                              atomic=atomic)
        assert torch.equal(out[:, 3], torch.zeros_like(out[:, 3]))
        assert rel_err(out[:, :3], fp64_reference(x, routes, w13, w_down)[:, :3]) <= 1e-5


def test_matches_vllm_omni_torch_oracle(gen):
    """Same routes through vLLM-Omni 0.30.0's ``torch_mh_moe_forward`` (its own CSR) and ours."""

    mh_moe = pytest.importorskip("vllm_omni.diffusion.models.magi2.mh_moe")
    x, routes, w13, w_down, (w_gate, w_up) = make_problem(gen, 31, 3, 8, 64, 96, 2, torch.float32)
    up_ids, up_probs, up_offsets = mh_moe.global_sort_routes(routes.topk_probs, routes.topk_ids.long(), 8)
    expected = mh_moe.torch_mh_moe_forward(x, up_ids, up_probs, up_offsets, w_gate, w_up, w_down)
    slots = routing.slots_from_csr(up_ids, up_offsets, 3, 31, 2)
    for atomic in (True, False):
        out = moe.moe_experts(x, up_ids, up_probs, up_offsets, slots, w13, w_down, atomic=atomic)
        assert rel_err(out, expected) <= 1e-5


def test_rejects_shapes_off_the_block_grid(gen):
    x, routes, w13, w_down, _ = make_problem(gen, 8, 1, 4, 64, 72, 2, torch.float32)
    with pytest.raises(ValueError, match="d_expert"):
        moe.moe_experts(x, routes.gather_ids, routes.probs, routes.offsets, routes.slots, w13, w_down)


def test_tuned_blocks_shrink_to_a_small_head(gen, poison):
    """Hopper's blocks (W13 block_k 256, W2 block_n 256) fit the tiny MAGI-2's 64-wide heads.

    Found on the H200: the embedded engine's d_head 64 was refused with the tuned config.
    """

    from magi2_kernels.platform import HOPPER_W2, HOPPER_W13

    assert (HOPPER_W13.fitted(64, 128).block_k, HOPPER_W2.fitted(128, 64).block_n) == (64, 64)
    assert HOPPER_W13.fitted(1024, 512) == HOPPER_W13
    x, routes, w13, w_down, _ = make_problem(gen, 21, 2, 8, 64, 128, 2, torch.float32)
    out = moe.moe_experts(x, routes.gather_ids, routes.probs, routes.offsets, routes.slots, w13, w_down,
                          w13_config=HOPPER_W13, w2_config=HOPPER_W2)
    assert rel_err(out, fp64_reference(x, routes, w13, w_down)) <= 1e-5


@pytest.mark.parametrize("n_per_program", [1, 2, 4])
@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "deterministic"])
def test_resident_x_path_matches_fp64(gen, poison, atomic, n_per_program):
    """BLOCK_K == d_head takes the W13 path that loads the x tile once per program."""

    from magi2_kernels.platform import GemmConfig

    x, routes, w13, w_down, _ = make_problem(gen, 45, 3, 8, 64, 128, 2, torch.float32)
    out = moe.moe_experts(x, routes.gather_ids, routes.probs, routes.offsets, routes.slots, w13, w_down,
                          atomic=atomic, w13_config=GemmConfig(16, 32, 64, 4, 1, n_per_program))
    assert rel_err(out, fp64_reference(x, routes, w13, w_down)) <= 1e-5


def test_default_is_the_deterministic_combine(gen, monkeypatch):
    """Every platform's default MoE is the fixed-order combine; atomics only when asked."""

    from magi2_kernels import moe_triton

    x, routes, w13, w_down, _ = make_problem(gen, 19, 2, 8, 64, 96, 2, torch.float32)
    args = (x, routes.gather_ids, routes.probs, routes.offsets, routes.slots, w13, w_down)
    seen = []
    real_launch = moe_triton.launch
    monkeypatch.setattr(moe_triton, "launch", lambda *a, **k: seen.append(k["deterministic"]) or real_launch(*a, **k))
    moe.moe_experts(*args)
    moe.moe_experts(*args, atomic=True)
    assert seen == [True, False]


def test_musa_refuses_atomics(gen):
    from dataclasses import replace

    from magi2_kernels.platform import MUSA_W2, MUSA_W13

    musa = replace(current_platform(), name="musa", atomic_moe=False, w13=MUSA_W13, w2=MUSA_W2)
    x, routes, w13, w_down, _ = make_problem(gen, 5, 1, 4, 64, 128, 2, torch.float32)
    with pytest.raises(ValueError, match="^atomic: the musa platform"):
        moe.moe_experts(x, routes.gather_ids, routes.probs, routes.offsets, routes.slots, w13, w_down, atomic=True,
                        platform=musa)


@pytest.mark.parametrize("block_k,pair_dot", [(64, False), (32, False), (64, True)],
                         ids=["resident-x", "flattened-k", "resident-x-pair-dot"])
@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "deterministic"])
def test_tma_path_matches_fp64(gen, poison, atomic, block_k, pair_dot):
    """Hopper's descriptor loads (W13 weights, W2 hidden rows and weights) under the interpreter.

    A W2 tile's descriptor load reads past its expert's rows (and past the last route: zero
    fill); the masked stores must keep those rows out. Skips where Triton has no descriptors.
    """

    pytest.importorskip("triton.tools.tensor_descriptor")
    from dataclasses import replace

    from magi2_kernels.platform import GemmConfig

    tma = replace(current_platform(), tma=True)
    x, routes, w13, w_down, _ = make_problem(gen, 45, 3, 8, 64, 128, 2, torch.float32, hot=3.0)
    out = moe.moe_experts(x, routes.gather_ids, routes.probs, routes.offsets, routes.slots, w13, w_down,
                          atomic=atomic, platform=tma, w13_config=GemmConfig(16, 32, block_k, 4, 1, 2, pair_dot),
                          w2_config=GemmConfig(16, 32, 32, 4, 1))
    assert rel_err(out, fp64_reference(x, routes, w13, w_down)) <= 1e-5


def test_musa_portable_path_matches_fp64(gen, poison):
    """MUSA's launch configs (BLOCK_K 64, 16 warps, 1 stage; no TMA, no inline PTX, no atomics)."""

    from dataclasses import replace

    from magi2_kernels.platform import MUSA_W2, MUSA_W13

    musa = replace(current_platform(), name="musa", atomic_moe=False, w13=MUSA_W13, w2=MUSA_W2, tma=False,
                   fast_sigmoid=False)
    x, routes, w13, w_down, _ = make_problem(gen, 27, 2, 8, 64, 128, 2, torch.float32)
    out = moe.moe_experts(x, routes.gather_ids, routes.probs, routes.offsets, routes.slots, w13, w_down, platform=musa)
    assert rel_err(out, fp64_reference(x, routes, w13, w_down)) <= 1e-5


def test_pair_dot_matches_fp64(gen, poison):
    """W13 gate and up in one dot (pointer loads), and its refusal outside the resident-x path."""

    from magi2_kernels.platform import GemmConfig

    x, routes, w13, w_down, _ = make_problem(gen, 33, 2, 8, 64, 128, 2, torch.float32)
    args = (x, routes.gather_ids, routes.probs, routes.offsets, routes.slots, w13, w_down)
    out = moe.moe_experts(*args, w13_config=GemmConfig(16, 32, 64, 4, 1, 2, True))
    assert rel_err(out, fp64_reference(x, routes, w13, w_down)) <= 1e-5
    with pytest.raises(ValueError, match="pair_dot needs block_k == d_head"):
        moe.moe_experts(*args, w13_config=GemmConfig(16, 32, 32, 4, 1, 2, True))
