"""Head-routed MoE expert computation (MAGI-2 Preview: 256 experts per head, SwiGLU7 256->1280->256).

Two launches, each a grouped GEMM over the CSR route layout from :mod:`magi2_kernels.routing`:

1. ``_w13_swiglu_kernel`` gathers the routed rows of one (head, expert) tile, runs W13 with the
   gate and up halves in two separate fp32 accumulators (the blog's #8855 split), and applies the
   clamped SwiGLU7 epilogue in registers; only the activated hidden row (bf16) is stored.
2. ``_w2_scatter_kernel`` runs W2 on those hidden rows, scales by the routing probability and
   either stores the per-route rows in route order for ``_combine_kernel`` to sum per (token,
   head) in a fixed order (the default, deterministic variant: no atomics, bit-identical run to
   run) or atomically adds into an fp32 ``[tokens, heads, 256]`` buffer (``atomic=True``).

Why two launches and not one: a single kernel must keep a ``[BLOCK_M, 256]`` fp32 W2 accumulator
live next to the W13 accumulators and serialises the two GEMMs inside every program, which is how
vLLM-Omni 0.30.0's fused kernel stays near 175 TFLOP/s on the H200. Split, each GEMM pipelines on
its own; the price is one write and one read of the bf16 hidden rows (accounted in
docs/performance.md).

W13 is laid out once as ``[experts, 256, 2, 1280]`` (gate and up rows side by side), see
:func:`pack_w13`; ``W_gate``/``W_up`` can be rebound as views of it so one copy exists.
"""

from __future__ import annotations

import torch

from .platform import GemmConfig, Platform, current_platform

SWIGLU7_ALPHA = 1.702
SWIGLU7_LIMIT = 7.0


def swiglu7_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Clamped SwiGLU7 in the inputs' dtype: gate <= 7, up in [-7, 7], gate*sigmoid(1.702 gate)*(up+1)."""

    gate = gate.clamp(max=SWIGLU7_LIMIT)
    up = up.clamp(min=-SWIGLU7_LIMIT, max=SWIGLU7_LIMIT)
    return gate * torch.sigmoid(SWIGLU7_ALPHA * gate) * (up + 1.0)


def pack_w13(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """One ``[experts, d_head, 2, d_expert]`` W13 tensor; ``[:, :, 0]`` is gate, ``[:, :, 1]`` up."""

    if w_gate.shape != w_up.shape or w_gate.ndim != 3:
        raise ValueError(f"W_gate/W_up must both be [experts, d_head, d_expert], got {w_gate.shape}, {w_up.shape}")
    return torch.stack((w_gate, w_up), dim=2).contiguous()


def reference_moe(
    x: torch.Tensor,
    gather_ids: torch.Tensor,
    probs: torch.Tensor,
    offsets: torch.Tensor,
    w13: torch.Tensor,
    w_down: torch.Tensor,
    *,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """PyTorch reference of :func:`moe_experts` (one host read of the offsets; CPU path and tests).

    Computes in ``compute_dtype`` (default: fp32 for 16-bit inputs, else the input dtype) and
    returns ``x.dtype``. Pass fp64 inputs for the fp64 oracle.
    """

    if compute_dtype is None:
        compute_dtype = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
    tokens, heads, d_head = x.shape
    flat_experts = offsets.numel() - 1
    experts_per_head = flat_experts // heads
    bounds = offsets.tolist()
    xc = x.to(compute_dtype)
    output = torch.zeros(tokens, heads, d_head, dtype=compute_dtype, device=x.device)
    for expert in range(flat_experts):
        begin, end = bounds[expert], bounds[expert + 1]
        if begin == end:
            continue
        head = expert // experts_per_head
        token_ids = gather_ids[begin:end].long()
        rows = xc[token_ids, head]
        gate = rows @ w13[expert, :, 0].to(compute_dtype)
        up = rows @ w13[expert, :, 1].to(compute_dtype)
        hidden = swiglu7_reference(gate, up)
        out = (hidden @ w_down[expert].to(compute_dtype)) * probs[begin:end, None].to(compute_dtype)
        output[:, head].index_add_(0, token_ids, out)
    return output.to(x.dtype)


def _tile_prefix(offsets: torch.Tensor, block_m: int) -> torch.Tensor:
    """Exclusive prefix sum of per-expert tile counts, int32, length experts + 1 (stays on device)."""

    counts = torch.diff(offsets.to(torch.int32))
    tiles = torch.div(counts + (block_m - 1), block_m, rounding_mode="floor")
    prefix = torch.zeros(offsets.numel(), dtype=torch.int32, device=offsets.device)
    torch.cumsum(tiles, 0, dtype=torch.int32, out=prefix[1:])
    return prefix


def moe_experts(
    x: torch.Tensor,
    gather_ids: torch.Tensor,
    probs: torch.Tensor,
    offsets: torch.Tensor,
    slots: torch.Tensor,
    w13: torch.Tensor,
    w_down: torch.Tensor,
    *,
    atomic: bool = False,
    platform: Platform | None = None,
    w13_config: GemmConfig | None = None,
    w2_config: GemmConfig | None = None,
) -> torch.Tensor:
    """Routed experts for ``x[tokens, heads, d_head]``; returns the same shape and dtype.

    ``gather_ids``/``probs``/``offsets`` are the CSR routes (rows sorted by flat expert
    ``head * experts + e``), ``slots[heads, tokens, top_k]`` each (head, token)'s route rows (used
    by the deterministic combine). ``w13`` comes from :func:`pack_w13`, ``w_down`` is
    ``[experts, d_expert, d_head]``. Nothing is read back to the host.

    The default is the deterministic path (per-route rows, fixed-order combine: bit-identical
    run to run, and faster than the atomic one on the H200). ``atomic=True`` asks for the fp32
    atomic scatter; a platform without it (MUSA: no bf16 atomics) refuses.
    """

    platform = platform or current_platform()
    if atomic and not platform.atomic_moe:
        raise ValueError(f"atomic: the {platform.name} platform has no atomic MoE scatter. Fix: leave atomic=False "
                         "(the deterministic combine)")
    if not platform.triton:
        return reference_moe(x, gather_ids, probs, offsets, w13, w_down)
    from . import moe_triton

    return moe_triton.launch(
        x,
        gather_ids,
        probs,
        offsets,
        slots,
        w13,
        w_down,
        deterministic=not atomic,
        w13_config=(w13_config or platform.w13).fitted(x.shape[-1], w_down.shape[1]),
        w2_config=(w2_config or platform.w2).fitted(w_down.shape[1], x.shape[-1]),
        tile_prefix=_tile_prefix,
        tma=platform.tma,
        fast_sigmoid=platform.fast_sigmoid,
    )


def moe_flops(routes: int, d_head: int, d_expert: int) -> int:
    """FLOPs of the routed experts: W13 (2 x d_head x 2 d_expert) and W2 (2 x d_expert x d_head) per route."""

    return routes * (2 * d_head * 2 * d_expert + 2 * d_expert * d_head)
