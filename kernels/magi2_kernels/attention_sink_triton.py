"""Triton kernel behind :func:`magi2_kernels.attention_sink.sink_gate` (imported only where Triton runs)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _sink_gate_kernel(
    out_ptr, lse_ptr, sink_ptr, gate_ptr, rows_ptr, result_ptr,
    tokens, heads, num_sinks,
    stride_ot, stride_oh, stride_lh, stride_lt, stride_ss, stride_sh, stride_gt, stride_gh,
    HAS_SINK: tl.constexpr, HAS_GATE: tl.constexpr, HAS_ROWS: tl.constexpr,
    D: tl.constexpr, BLOCK_D: tl.constexpr, S_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1)
    r_ok = r < tokens
    r64 = r.to(tl.int64)
    src = tl.load(rows_ptr + r, mask=r_ok, other=0).to(tl.int64) if HAS_ROWS else r64
    factor = tl.full((BLOCK_T,), 1.0, dtype=tl.float32)
    if HAS_SINK:
        s = tl.arange(0, S_PAD)
        sink = tl.load(sink_ptr + s * stride_ss + head * stride_sh, mask=s < num_sinks, other=float("-inf"))
        sink_max = tl.max(sink, axis=0)
        sink_lse = sink_max + tl.log(tl.sum(tl.exp(sink - sink_max), axis=0))
        lse = tl.load(lse_ptr + head * stride_lh + src * stride_lt, mask=r_ok, other=0.0).to(tl.float32)
        factor = tl.where(lse == float("-inf"), 0.0, tl.sigmoid(lse - sink_lse))
    if HAS_GATE:
        factor = factor * tl.sigmoid(tl.load(gate_ptr + r64 * stride_gt + head * stride_gh, mask=r_ok, other=0.0)
                                     .to(tl.float32))
    for d0 in tl.static_range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        d_ok = d < D
        mask = r_ok[:, None] & d_ok[None, :]
        x = tl.load(out_ptr + src[:, None] * stride_ot + head * stride_oh + d[None, :], mask=mask, other=0.0)
        y = x.to(tl.float32) * factor[:, None]
        tl.store(result_ptr + (r64[:, None] * heads + head) * D + d[None, :], y.to(result_ptr.dtype.element_ty),
                 mask=mask)


def sink_gate(out, lse, sink, gates, rows, *, out_dtype, block_t: int = 32):
    tokens, heads, dim = out.shape
    if out.stride(2) != 1:
        out = out.contiguous()
    has_sink = sink is not None and sink.numel() > 0
    if has_sink and (lse is None or lse.shape != (heads, tokens) or sink.shape[1] != heads):
        raise ValueError("sink correction needs lse [H, T] and sink [S, H]")
    gate2d = gates.reshape(tokens, heads) if gates is not None else None
    result = torch.empty(tokens, heads, dim, device=out.device, dtype=out_dtype)
    if result.numel() == 0:
        return result
    dummy = out
    _sink_gate_kernel[(triton.cdiv(tokens, block_t), heads)](
        out, lse if has_sink else dummy, sink if has_sink else dummy, gate2d if gate2d is not None else dummy,
        rows if rows is not None else dummy, result,
        tokens, heads, sink.shape[0] if has_sink else 0,
        out.stride(0), out.stride(1),
        lse.stride(0) if has_sink else 0, lse.stride(1) if has_sink else 0,
        sink.stride(0) if has_sink else 0, sink.stride(1) if has_sink else 0,
        gate2d.stride(0) if gate2d is not None else 0, gate2d.stride(1) if gate2d is not None else 0,
        HAS_SINK=has_sink, HAS_GATE=gate2d is not None, HAS_ROWS=rows is not None,
        D=dim, BLOCK_D=min(128, triton.next_power_of_2(dim)),
        S_PAD=max(2, triton.next_power_of_2(sink.shape[0]) if has_sink else 2),
        BLOCK_T=block_t, num_warps=4,
    )
    return result
