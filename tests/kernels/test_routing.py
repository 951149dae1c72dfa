"""Device routing (Triton, interpreter) against an fp64 reference and vLLM-Omni's routing.

Bounds: expert ids equal; probabilities ||out - ref|| / ||ref|| <= 1e-6 (fp32 logits vs fp64).
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import rel_err

from magi2_kernels import routing


def inputs(gen, tokens, heads, experts, d_head, dtype=torch.float32, bias_scale=0.05):
    x = torch.randn(tokens, heads, d_head, generator=gen).to(dtype)
    gate = torch.randn(heads, experts, d_head, generator=gen) / d_head**0.5
    bias = torch.randn(heads, experts, generator=gen) * bias_scale
    return x, gate, bias


@pytest.mark.parametrize(
    "tokens,heads,experts,d_head,top_k,route_norm,scale",
    [
        pytest.param(45, 3, 16, 64, 3, True, 1.0, id="ep-local-3-heads"),
        pytest.param(1, 2, 32, 32, 6, True, 2.5, id="single-token-scaled"),
        pytest.param(70, 1, 16, 32, 2, False, 1.0, id="no-norm"),
    ],
)
def test_topk_and_csr_match_fp64(gen, poison, tokens, heads, experts, d_head, top_k, route_norm, scale):
    x, gate, bias = inputs(gen, tokens, heads, experts, d_head)
    got = routing.route(x, gate, bias, top_k, route_norm=route_norm, route_scale=scale)
    probs64, ids64 = routing.reference_topk(x.double(), gate.double(), bias.double(), top_k, route_norm=route_norm,
                                            route_scale=scale)
    assert torch.equal(got.topk_ids.long(), ids64)
    assert rel_err(got.topk_probs, probs64) <= 1e-6
    ref = routing.reference_csr(probs64.float(), ids64, experts)
    assert got.offsets.dtype == torch.int32 and torch.equal(got.offsets, ref.offsets)
    assert torch.equal(got.gather_ids, ref.gather_ids)
    assert torch.equal(got.slots, ref.slots)
    assert rel_err(got.probs, ref.probs) <= 1e-6
    # Every route row is some (head, token, k)'s slot exactly once.
    assert torch.equal(got.slots.flatten().sort().values, torch.arange(heads * tokens * top_k, dtype=torch.int32))


def test_bias_selects_but_does_not_weigh(gen):
    x, gate, _ = inputs(gen, 33, 2, 16, 32)
    bias = torch.zeros(2, 16)
    bias[:, 5] = 10.0  # expert 5 always selected
    got = routing.route(x, gate, bias, 2, route_norm=False)
    assert (got.topk_ids[..., 0] == 5).all()
    scores = torch.sigmoid(torch.einsum("thd,hed->hte", x, gate))
    assert rel_err(got.topk_probs[..., 0], scores[..., 5]) <= 1e-6
    counts = torch.diff(got.offsets)
    assert (counts == 0).any()  # uneven: some experts get nothing


def test_matches_vllm_omni_routing(gen):
    mh_moe = pytest.importorskip("vllm_omni.diffusion.models.magi2.mh_moe")
    x, gate, bias = inputs(gen, 57, 3, 16, 64, dtype=torch.float16)
    got = routing.route(x, gate, bias, 4)
    logits = torch.einsum("shd,hed->hse", x.float(), gate)
    probs, ids = mh_moe.compute_topk_probs_and_indices(logits, 4, expert_bias=bias)
    up_ids, up_probs, up_offsets = mh_moe.global_sort_routes(probs, ids, 16)
    assert torch.equal(got.topk_ids.long(), ids)
    assert torch.equal(got.offsets.long(), up_offsets)
    assert torch.equal(got.gather_ids, up_ids)
    assert rel_err(got.probs, up_probs) <= 1e-6
    slots = routing.slots_from_csr(up_ids, up_offsets, 3, 57, 4)
    assert torch.equal(up_ids[slots.long()], torch.arange(57, dtype=torch.int32).view(1, -1, 1).expand(3, 57, 4))
