"""Triton kernels behind :func:`magi2_kernels.routing.route` (imported only where Triton runs)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _topk_kernel(
    x_ptr, gate_ptr, bias_ptr, ids_ptr, probs_ptr, keys_ptr,
    tokens, stride_xt, stride_xh, stride_xd,
    route_scale, norm_eps,
    HAS_BIAS: tl.constexpr, ROUTE_NORM: tl.constexpr,
    D: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr, LOG2_E_PAD: tl.constexpr, TOP_K: tl.constexpr,
    K_PAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Logits, sigmoid, biased top-k, norm for one (token block, head).

    The expert axis is padded to ``E_PAD >= 16`` (Triton 3.2's ``tl.dot`` needs N >= 16; the
    model's E is 256); padded experts get -inf selection scores and are never picked.
    """

    head = tl.program_id(1)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < tokens
    e = tl.arange(0, E_PAD)
    e_ok = e < E
    d = tl.arange(0, BLOCK_D)
    x_rows = x_ptr + t.to(tl.int64) * stride_xt + head * stride_xh
    gate_rows = gate_ptr + (head * E + e).to(tl.int64) * D
    logits = tl.zeros((BLOCK_T, E_PAD), dtype=tl.float32)
    for d0 in tl.range(0, D, BLOCK_D):
        xd = tl.load(x_rows[:, None] + (d0 + d)[None, :] * stride_xd, mask=t_ok[:, None], other=0.0).to(tl.float32)
        w = tl.load(gate_rows[:, None] + (d0 + d)[None, :], mask=e_ok[:, None], other=0.0)  # [E, BLOCK_D]
        logits = tl.dot(xd, tl.trans(w), logits, input_precision=DOT_PRECISION)
    scores = tl.sigmoid(logits)
    selection = scores
    if HAS_BIAS:
        selection = selection + tl.load(bias_ptr + head * E + e, mask=e_ok, other=0.0)[None, :]
    if E_PAD != E:
        selection = tl.where(e_ok[None, :], selection, float("-inf"))
    # One max-reduction per pick: the selection score's bits, made order-preserving as an
    # integer, shifted above the complemented expert index (so ties pick the lowest index).
    bits = selection.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
    keys = (ordered << LOG2_E_PAD) | (E_PAD - 1 - e)[None, :]
    kk = tl.arange(0, K_PAD)
    top_ids = tl.zeros((BLOCK_T, K_PAD), dtype=tl.int32)
    top_probs = tl.zeros((BLOCK_T, K_PAD), dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        best = tl.max(keys, axis=1)
        pick = (E_PAD - 1 - (best & (E_PAD - 1))).to(tl.int32)
        value_bits = (best >> LOG2_E_PAD).to(tl.int32)
        value = tl.where(value_bits >= 0, value_bits, value_bits ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
        if HAS_BIAS:  # the bias only selects; the probability is the plain score
            value = value - tl.load(bias_ptr + head * E + pick)
        keys = tl.where(e[None, :] == pick[:, None], -(2**62), keys)
        top_ids = tl.where(kk[None, :] == k, pick[:, None], top_ids)
        top_probs = tl.where(kk[None, :] == k, value[:, None], top_probs)
    if ROUTE_NORM:
        top_probs = top_probs / tl.maximum(tl.sum(tl.abs(top_probs), axis=1), norm_eps)[:, None]
    top_probs = top_probs * route_scale
    out = (head * tokens + t).to(tl.int64)[:, None] * TOP_K + kk[None, :]
    ok = t_ok[:, None] & (kk[None, :] < TOP_K)
    tl.store(ids_ptr + out, top_ids, mask=ok)
    tl.store(probs_ptr + out, top_probs, mask=ok)
    # The CSR sort key, flat expert head * E + e, written here to save launches.
    tl.store(keys_ptr + out, (top_ids + head * E).to(keys_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _finalize_kernel(order_ptr, probs_ptr, gather_ptr, sorted_probs_ptr, slots_ptr, routes, tokens,
                     TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < routes
    source = tl.load(order_ptr + i, mask=ok, other=0)
    tl.store(gather_ptr + i, ((source // TOP_K) % tokens).to(tl.int32), mask=ok)
    tl.store(sorted_probs_ptr + i, tl.load(probs_ptr + source, mask=ok, other=0.0), mask=ok)
    tl.store(slots_ptr + source, i.to(tl.int32), mask=ok)


def topk(
    x_heads: torch.Tensor,
    gate: torch.Tensor,
    expert_bias: torch.Tensor | None,
    top_k: int,
    *,
    route_norm: bool,
    route_scale: float,
    norm_eps: float,
    dot_precision: str,
    block_t: int = 16,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k ids (int32) and probabilities (fp32) ``[H, T, K]``, and the flat-expert sort keys ``[H*T*K]``.

    The keys are int16 when ``H * E`` fits (half the radix-sort passes), else int32. Defaults
    (16 tokens, 4 warps) are the fastest of the H200 sweep in scripts/bench_kernels.py.
    """
    tokens, heads, d = x_heads.shape
    num_experts = gate.shape[1]
    if gate.shape != (heads, num_experts, d) or gate.dtype != torch.float32:
        raise ValueError(f"gate must be fp32 [heads, experts, d_head], got {tuple(gate.shape)} {gate.dtype}")
    if num_experts & (num_experts - 1) or d % 16:
        raise ValueError("routing kernel needs a power-of-two expert count and d_head % 16 == 0 "
                         f"(E={num_experts}, D={d})")
    gate = gate.contiguous()
    ids = torch.empty(heads, tokens, top_k, device=gate.device, dtype=torch.int32)
    probs = torch.empty(heads, tokens, top_k, device=gate.device, dtype=torch.float32)
    key_dtype = torch.int16 if heads * num_experts < torch.iinfo(torch.int16).max else torch.int32
    keys = torch.empty(heads * tokens * top_k, device=gate.device, dtype=key_dtype)
    bias = expert_bias.reshape(heads, num_experts).float().contiguous() if expert_bias is not None else gate
    e_pad = max(16, num_experts)
    _topk_kernel[(triton.cdiv(tokens, block_t), heads)](
        x_heads, gate, bias, ids, probs, keys,
        tokens, x_heads.stride(0), x_heads.stride(1), x_heads.stride(2),
        float(route_scale), float(norm_eps),
        HAS_BIAS=expert_bias is not None, ROUTE_NORM=route_norm,
        D=d, E=num_experts, E_PAD=e_pad, LOG2_E_PAD=e_pad.bit_length() - 1, TOP_K=top_k,
        K_PAD=triton.next_power_of_2(top_k),
        BLOCK_T=block_t, BLOCK_D=min(32, d), DOT_PRECISION=dot_precision,
        num_warps=num_warps,
    )
    return ids, probs, keys


def finalize(order: torch.Tensor, topk_probs: torch.Tensor, tokens: int, top_k: int,
             block: int = 1024) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    routes = order.numel()
    gather_ids = torch.empty(routes, device=order.device, dtype=torch.int32)
    probs = torch.empty(routes, device=order.device, dtype=torch.float32)
    slots = torch.empty(routes, device=order.device, dtype=torch.int32)
    if routes:
        _finalize_kernel[(triton.cdiv(routes, block),)](
            order, topk_probs, gather_ids, probs, slots, routes, tokens, TOP_K=top_k, BLOCK=block, num_warps=4
        )
    return gather_ids, probs, slots
