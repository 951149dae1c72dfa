"""Triton kernels behind :func:`magi2_kernels.moe.moe_experts` (imported only where Triton runs)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from .platform import GemmConfig


@triton.jit
def _find_expert(prefix_ptr, tile, NUM_EXPERTS: tl.constexpr, SEARCH_STEPS: tl.constexpr):
    """Largest expert e with prefix[e] <= tile: the expert owning this row tile."""

    lo = 0
    hi = NUM_EXPERTS - 1
    for _ in tl.static_range(SEARCH_STEPS):
        mid = (lo + hi + 1) // 2
        owns = tl.load(prefix_ptr + mid) <= tile
        lo = tl.where(owns, mid, lo)
        hi = tl.where(owns, hi, mid - 1)
    return lo


@triton.jit
def _tile_rows(offsets_ptr, prefix_ptr, tile, NUM_EXPERTS: tl.constexpr, SEARCH_STEPS: tl.constexpr,
               BLOCK_M: tl.constexpr):
    expert = _find_expert(prefix_ptr, tile, NUM_EXPERTS, SEARCH_STEPS)
    row0 = tl.load(offsets_ptr + expert) + (tile - tl.load(prefix_ptr + expert)) * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)
    row_ok = rows < tl.load(offsets_ptr + expert + 1)
    return expert, row0, rows, row_ok


@triton.jit
def _w13_swiglu_kernel(
    x_ptr, w13_ptr, w13_desc, hidden_ptr, gather_ptr, offsets_ptr, prefix_ptr,
    stride_xt, stride_xh, stride_xd,
    stride_we, stride_wk, stride_wn, up_offset,
    experts_per_head,
    NUM_EXPERTS: tl.constexpr, SEARCH_STEPS: tl.constexpr,
    D_HEAD: tl.constexpr, D_EXPERT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, N_PER_PROGRAM: tl.constexpr,
    USE_TMA: tl.constexpr, FAST_SIGMOID: tl.constexpr, PAIR_DOT: tl.constexpr,
):
    """W13 + SwiGLU7 of one row tile over ``N_PER_PROGRAM`` n-blocks.

    ``USE_TMA`` (Hopper): the weight blocks come through ``w13_desc``, a descriptor over W13 seen
    as ``[experts * d_head, 2 * d_expert]`` (gate columns first, up columns after); otherwise
    through pointers. Both branches are constexpr, so Triton without descriptors never sees one.
    ``PAIR_DOT`` (resident x only): gate and up of a block in one dot, the descriptor then 3-D,
    ``[experts * d_head, 2, d_expert]``; swept on the H200 without a gain, off by default.
    """

    N_GROUPS: tl.constexpr = D_EXPERT // (BLOCK_N * N_PER_PROGRAM)
    K_STEPS: tl.constexpr = D_HEAD // BLOCK_K
    pid = tl.program_id(0)
    tile = pid // N_GROUPS
    group = pid % N_GROUPS
    if tile >= tl.load(prefix_ptr + NUM_EXPERTS):
        return
    expert, _, rows, row_ok = _tile_rows(offsets_ptr, prefix_ptr, tile, NUM_EXPERTS, SEARCH_STEPS, BLOCK_M)
    head = expert // experts_per_head
    tokens = tl.load(gather_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    x_rows = x_ptr + tokens * stride_xt + head * stride_xh
    w_base = w13_ptr + expert.to(tl.int64) * stride_we
    w_row0 = expert * D_HEAD
    offs_k = tl.arange(0, BLOCK_K)
    offs_n = tl.arange(0, BLOCK_N)
    rows64 = rows.to(tl.int64)
    if K_STEPS == 1:
        # BLOCK_K == d_head: the x tile is loaded once and stays resident while the weight
        # n-blocks stream through the pipelined loop.
        a = tl.load(x_rows[:, None] + offs_k[None, :] * stride_xd, mask=row_ok[:, None], other=0.0)
        for j in tl.range(0, N_PER_PROGRAM):
            n0 = (group * N_PER_PROGRAM + j) * BLOCK_N
            if PAIR_DOT:
                # Gate and up of these BLOCK_N columns as one [BLOCK_K, 2, BLOCK_N] block and one
                # 2*BLOCK_N-wide dot: the resident x tile is read once per step, not twice.
                if USE_TMA:
                    w_pair = w13_desc.load([w_row0, 0, n0])
                else:
                    offs_two = tl.arange(0, 2)
                    w_pair = tl.load(w_base + offs_k[:, None, None] * stride_wk + offs_two[None, :, None] * up_offset
                                     + (n0 + offs_n)[None, None, :] * stride_wn)
                both = tl.dot(a, tl.reshape(w_pair, (BLOCK_K, 2 * BLOCK_N)))
                gate, up = tl.split(tl.permute(tl.reshape(both, (BLOCK_M, 2, BLOCK_N)), (0, 2, 1)))
            else:
                if USE_TMA:
                    w_gate = w13_desc.load([w_row0, n0])
                    w_up = w13_desc.load([w_row0, D_EXPERT + n0])
                else:
                    w_ptrs = w_base + offs_k[:, None] * stride_wk + (n0 + offs_n)[None, :] * stride_wn
                    w_gate = tl.load(w_ptrs)
                    w_up = tl.load(w_ptrs + up_offset)
                gate = tl.dot(a, w_gate)
                up = tl.dot(a, w_up)
            _swiglu7_store(gate, up, hidden_ptr, rows64, row_ok, n0 + offs_n, D_EXPERT, FAST_SIGMOID)
    else:
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # One flattened (n-block, k-step) loop so loads stay in flight across n-block boundaries
        # (K is only 256); the epilogue runs on the last k-step of each n-block.
        for step in tl.range(0, N_PER_PROGRAM * K_STEPS):
            k0 = (step % K_STEPS) * BLOCK_K
            n0 = (group * N_PER_PROGRAM + step // K_STEPS) * BLOCK_N
            a = tl.load(x_rows[:, None] + (k0 + offs_k)[None, :] * stride_xd, mask=row_ok[:, None], other=0.0)
            if USE_TMA:
                w_gate = w13_desc.load([w_row0 + k0, n0])
                w_up = w13_desc.load([w_row0 + k0, D_EXPERT + n0])
            else:
                w_ptrs = w_base + (k0 + offs_k)[:, None] * stride_wk + (n0 + offs_n)[None, :] * stride_wn
                w_gate = tl.load(w_ptrs)
                w_up = tl.load(w_ptrs + up_offset)
            gate = tl.dot(a, w_gate, gate)
            up = tl.dot(a, w_up, up)
            if step % K_STEPS == K_STEPS - 1:
                _swiglu7_store(gate, up, hidden_ptr, rows64, row_ok, n0 + offs_n, D_EXPERT, FAST_SIGMOID)
                gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


@triton.jit
def _swiglu7_store(gate, up, hidden_ptr, rows64, row_ok, cols, D_EXPERT: tl.constexpr, FAST_SIGMOID: tl.constexpr):
    """Clamped SwiGLU7 on the two fp32 accumulators, in registers; stores the hidden tile."""

    g = tl.minimum(gate, 7.0)
    u = tl.minimum(tl.maximum(up, -7.0), 7.0)
    if FAST_SIGMOID:
        # sigmoid(1.702 g) = (1 + tanh(0.851 g)) / 2 through one MUFU tanh.approx (NVIDIA only):
        # one SFU op instead of exp + divide; its ~2^-11 relative error is under bf16's rounding.
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [0.851 * g], dtype=tl.float32,
                                      is_pure=True, pack=1)
        h = 0.5 * g * (u + 1.0) * (1.0 + t)
    else:
        # sigmoid via the approximate divide (div.full.f32, 2 ulp): the result is rounded to bf16
        # next, and the IEEE divide is the epilogue's most expensive instruction.
        h = tl.fdiv(g * (u + 1.0), 1.0 + tl.exp(-1.702 * g), ieee_rounding=False)
    tl.store(hidden_ptr + rows64[:, None] * D_EXPERT + cols[None, :], h.to(hidden_ptr.dtype.element_ty),
             mask=row_ok[:, None])


@triton.jit
def _w2_scatter_kernel(
    hidden_ptr, hidden_desc, w2_ptr, w2_desc, out_ptr, gather_ptr, probs_ptr, offsets_ptr, prefix_ptr,
    stride_we, stride_wk, stride_wn,
    stride_ot, stride_oh,
    experts_per_head,
    NUM_EXPERTS: tl.constexpr, SEARCH_STEPS: tl.constexpr,
    D_HEAD: tl.constexpr, D_EXPERT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ATOMIC: tl.constexpr, USE_TMA: tl.constexpr,
):
    """W2 of one row tile, scaled by the routing probability; atomic scatter or per-route rows.

    ``USE_TMA`` (Hopper): hidden rows and W2 blocks come through descriptors. A tile's last rows
    may belong to the next expert (or lie past the end, zero-filled); the stores mask them.
    """

    N_BLOCKS: tl.constexpr = D_HEAD // BLOCK_N
    pid = tl.program_id(0)
    tile = pid // N_BLOCKS
    n0 = (pid % N_BLOCKS) * BLOCK_N
    if tile >= tl.load(prefix_ptr + NUM_EXPERTS):
        return
    expert, row0, rows, row_ok = _tile_rows(offsets_ptr, prefix_ptr, tile, NUM_EXPERTS, SEARCH_STEPS, BLOCK_M)
    rows64 = rows.to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    a_rows = hidden_ptr + rows64 * D_EXPERT
    w_base = w2_ptr + expert.to(tl.int64) * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(0, D_EXPERT, BLOCK_K):
        if USE_TMA:
            a = hidden_desc.load([row0.to(tl.int32), k0])  # descriptors take int32 offsets
            b = w2_desc.load([expert * D_EXPERT + k0, n0])
        else:
            a = tl.load(a_rows[:, None] + (k0 + offs_k)[None, :], mask=row_ok[:, None], other=0.0)
            b = tl.load(w_base + (k0 + offs_k)[:, None] * stride_wk + offs_n[None, :] * stride_wn)
        acc = tl.dot(a, b, acc)
    acc = acc * tl.load(probs_ptr + rows, mask=row_ok, other=0.0)[:, None]
    if ATOMIC:
        head = expert // experts_per_head
        tokens = tl.load(gather_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        ptrs = out_ptr + tokens[:, None] * stride_ot + head * stride_oh + offs_n[None, :]
        tl.atomic_add(ptrs, acc, mask=row_ok[:, None], sem="relaxed")
    else:
        ptrs = out_ptr + rows64[:, None] * D_HEAD + offs_n[None, :]
        tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _combine_kernel(
    routed_ptr, slots_ptr, out_ptr,
    tokens, stride_ot, stride_oh,
    TOP_K: tl.constexpr, D_HEAD: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """out[t, h] = sum over k (in slot order) of routed[slots[h, t, k]]: fixed order, no atomics."""

    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1)
    t_ok = t < tokens
    cols = tl.arange(0, D_HEAD)
    acc = tl.zeros((BLOCK_T, D_HEAD), dtype=tl.float32)
    slot_base = slots_ptr + (head * tokens + t).to(tl.int64) * TOP_K
    for k in tl.static_range(TOP_K):
        slot = tl.load(slot_base + k, mask=t_ok, other=0).to(tl.int64)
        acc += tl.load(routed_ptr + slot[:, None] * D_HEAD + cols[None, :], mask=t_ok[:, None], other=0.0).to(
            tl.float32
        )
    ptrs = out_ptr + t.to(tl.int64)[:, None] * stride_ot + head * stride_oh + cols[None, :]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=t_ok[:, None])


def _descriptor(tensor: torch.Tensor, block_shape: list[int]):
    """A host-side TMA descriptor (Triton >= 3.4; only reached where ``Platform.tma`` is true)."""

    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(tensor, block_shape)


def _search_steps(num_experts: int) -> int:
    return max(1, math.ceil(math.log2(max(num_experts, 2)))) + 1


def _w13_n_per_program(d_expert: int, config: GemmConfig) -> int:
    """The config's n-blocks per program, reduced to the largest count that divides the n-blocks."""

    blocks = d_expert // config.block_n
    return max(c for c in range(1, min(config.n_per_program, blocks) + 1) if blocks % c == 0)


def launch(
    x: torch.Tensor,
    gather_ids: torch.Tensor,
    probs: torch.Tensor,
    offsets: torch.Tensor,
    slots: torch.Tensor,
    w13: torch.Tensor,
    w_down: torch.Tensor,
    *,
    deterministic: bool,
    w13_config: GemmConfig,
    w2_config: GemmConfig,
    tile_prefix: Callable[[torch.Tensor, int], torch.Tensor],
    tma: bool,
    fast_sigmoid: bool,
) -> torch.Tensor:
    tokens, heads, d_head = x.shape
    flat_experts = offsets.numel() - 1
    d_expert = w_down.shape[1]
    routes = gather_ids.numel()
    if w13.shape != (flat_experts, d_head, 2, d_expert) or w13.stride(3) != 1:
        raise ValueError(f"w13 must be [experts, d_head, 2, d_expert] with unit last stride, got {tuple(w13.shape)}")
    if w_down.shape != (flat_experts, d_expert, d_head):
        raise ValueError(f"w_down must be [experts, d_expert, d_head], got {tuple(w_down.shape)}")
    for dim, block, name in (
        (d_head, w13_config.block_k, "d_head % w13.block_k"),
        (d_expert, w13_config.block_n, "d_expert % w13.block_n"),
        (d_expert, w2_config.block_k, "d_expert % w2.block_k"),
        (d_head, w2_config.block_n, "d_head % w2.block_n"),
    ):
        if dim % block:
            raise ValueError(f"unsupported MoE shape: {name} != 0 ({dim} % {block})")
    if routes == 0:
        return torch.zeros_like(x)
    experts_per_head = flat_experts // heads
    steps = _search_steps(flat_experts)
    hidden = torch.empty(routes, d_expert, device=x.device, dtype=w_down.dtype)
    tma = tma and w13.is_contiguous() and w_down.is_contiguous()

    cfg = w13_config
    prefix = tile_prefix(offsets, cfg.block_m)
    n_per_program = _w13_n_per_program(d_expert, cfg)
    groups = d_expert // (cfg.block_n * n_per_program)
    # Launch bound without a host read: every expert adds at most one partial tile.
    grid13 = ((triton.cdiv(routes, cfg.block_m) + flat_experts) * groups,)
    if cfg.pair_dot and cfg.block_k != d_head:
        raise ValueError(f"w13.pair_dot needs block_k == d_head (the resident x tile), got {cfg.block_k} != {d_head}")
    if not tma:
        w13_desc = w13
    elif cfg.pair_dot:
        w13_desc = _descriptor(w13.view(flat_experts * d_head, 2, d_expert), [cfg.block_k, 2, cfg.block_n])
    else:
        w13_desc = _descriptor(w13.view(flat_experts * d_head, 2 * d_expert), [cfg.block_k, cfg.block_n])
    _w13_swiglu_kernel[grid13](
        x, w13, w13_desc, hidden, gather_ids, offsets, prefix,
        x.stride(0), x.stride(1), x.stride(2),
        w13.stride(0), w13.stride(1), w13.stride(3), w13.stride(2),
        experts_per_head,
        NUM_EXPERTS=flat_experts, SEARCH_STEPS=steps, D_HEAD=d_head, D_EXPERT=d_expert,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, N_PER_PROGRAM=n_per_program,
        USE_TMA=tma, FAST_SIGMOID=fast_sigmoid, PAIR_DOT=cfg.pair_dot,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )

    cfg = w2_config
    if cfg.block_m != w13_config.block_m:
        prefix = tile_prefix(offsets, cfg.block_m)
    n_blocks = d_head // cfg.block_n
    grid2 = ((triton.cdiv(routes, cfg.block_m) + flat_experts) * n_blocks,)
    if deterministic:
        routed = torch.empty(routes, d_head, device=x.device, dtype=x.dtype)
        out_stride_t, out_stride_h = d_head, 0
    else:
        routed = torch.zeros(tokens, heads, d_head, device=x.device, dtype=torch.float32)
        out_stride_t, out_stride_h = routed.stride(0), routed.stride(1)
    if tma:
        hidden_desc = _descriptor(hidden, [cfg.block_m, cfg.block_k])
        w2_desc = _descriptor(w_down.view(flat_experts * d_expert, d_head), [cfg.block_k, cfg.block_n])
    else:
        hidden_desc, w2_desc = hidden, w_down
    _w2_scatter_kernel[grid2](
        hidden, hidden_desc, w_down, w2_desc, routed, gather_ids, probs, offsets, prefix,
        w_down.stride(0), w_down.stride(1), w_down.stride(2),
        out_stride_t, out_stride_h,
        experts_per_head,
        NUM_EXPERTS=flat_experts, SEARCH_STEPS=steps, D_HEAD=d_head, D_EXPERT=d_expert,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, ATOMIC=not deterministic, USE_TMA=tma,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if not deterministic:
        return routed.to(x.dtype)
    out = torch.empty(tokens, heads, d_head, device=x.device, dtype=x.dtype)
    top_k = slots.shape[-1]
    if slots.shape != (heads, tokens, top_k) or not slots.is_contiguous():
        raise ValueError(f"slots must be a contiguous [heads, tokens, top_k] tensor, got {tuple(slots.shape)}")
    block_t = 8 if d_head >= 256 else 16
    _combine_kernel[(triton.cdiv(tokens, block_t), heads)](
        routed, slots, out, tokens, out.stride(0), out.stride(1),
        TOP_K=top_k, D_HEAD=d_head, BLOCK_T=block_t, num_warps=4,
    )
    return out
