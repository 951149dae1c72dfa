"""Triton kernels behind :mod:`magi2_kernels.mhc` (imported only where Triton runs)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _post_residual_kernel(
    post_ptr, res_ptr, alpha_post_ptr, bias_post_ptr, alpha_res_ptr, bias_res_ptr, post_out_ptr, res_out_ptr,
    tokens, stride_pt, stride_pn, stride_rt, stride_ri, stride_rj,
    scale, epsilon,
    ITERATIONS: tl.constexpr, BLOCK_T: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < tokens
    t64 = t.to(tl.int64)
    n = tl.arange(0, 4)
    post = tl.load(post_ptr + t64[:, None] * stride_pt + n[None, :] * stride_pn, mask=t_ok[:, None], other=0.0)
    post = 2.0 * tl.sigmoid(tl.load(alpha_post_ptr) * scale * post.to(tl.float32) + tl.load(bias_post_ptr + n)[None, :])
    tl.store(post_out_ptr + t64[:, None] * 4 + n[None, :], post.to(post_out_ptr.dtype.element_ty), mask=t_ok[:, None])

    i3 = n[None, :, None]
    j3 = n[None, None, :]
    t3 = t64[:, None, None]
    ok3 = t_ok[:, None, None]
    matrix = tl.load(res_ptr + t3 * stride_rt + i3 * stride_ri + j3 * stride_rj, mask=ok3, other=0.0).to(tl.float32)
    matrix = tl.load(alpha_res_ptr) * scale * matrix + tl.load(bias_res_ptr + i3 * 4 + j3)
    # The native amax spreads a NaN over its token's whole matrix; do the same.
    nan_count = tl.sum(tl.sum((matrix != matrix).to(tl.int32), axis=2), axis=1)
    maximum = tl.max(tl.max(matrix, axis=2), axis=1)
    maximum = tl.where(nan_count > 0, float("nan"), maximum)
    matrix = tl.exp(matrix - maximum[:, None, None])
    for _ in tl.static_range(ITERATIONS):
        matrix = matrix / (tl.sum(matrix, axis=1)[:, None, :] + epsilon)
        matrix = matrix / (tl.sum(matrix, axis=2)[:, :, None] + epsilon)
    tl.store(res_out_ptr + t3 * 16 + i3 * 4 + j3, matrix.to(res_out_ptr.dtype.element_ty), mask=ok3)


@triton.jit
def _mix_kernel(
    streams_ptr, branch_ptr, post_ptr, res_ptr, out_ptr, hidden,
    stride_st, stride_sn, stride_bt, stride_pt, stride_rt,
    BLOCK_C: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < hidden
    i = tl.arange(0, 4)
    acc = tl.load(post_ptr + token * stride_pt + i).to(tl.float32)[:, None] * tl.load(
        branch_ptr + token * stride_bt + c, mask=c_ok, other=0.0
    ).to(tl.float32)[None, :]
    for j in tl.static_range(4):
        row = tl.load(streams_ptr + token * stride_st + j * stride_sn + c, mask=c_ok, other=0.0).to(tl.float32)
        acc += tl.load(res_ptr + token * stride_rt + i * 4 + j).to(tl.float32)[:, None] * row[None, :]
    tl.store(out_ptr + token * 4 * hidden + i[:, None] * hidden + c[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=c_ok[None, :])


@triton.jit
def _pre_kernel(
    streams_ptr, alpha_ptr, bias_ptr, logits_ptr, out_ptr, hidden,
    stride_st, stride_sn, stride_lt, stride_ln, scale,
    BLOCK_C: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < hidden
    n = tl.arange(0, 4)
    coeff = tl.sigmoid(
        tl.load(alpha_ptr) * scale * tl.load(logits_ptr + token * stride_lt + n * stride_ln).to(tl.float32)
        + tl.load(bias_ptr + n)
    )
    rows = tl.load(streams_ptr + token * stride_st + n[:, None] * stride_sn + c[None, :], mask=c_ok[None, :], other=0.0)
    out = tl.sum(coeff[:, None] * rows.to(tl.float32), axis=0)
    tl.store(out_ptr + token * hidden + c, out.to(out_ptr.dtype.element_ty), mask=c_ok)


@triton.jit
def _logits_partial_kernel(
    x_ptr, weight_ptr, modality_ptr, phi_ptr, partial_ptr, sumsq_ptr,
    tokens, stride_xt, stride_wm, stride_phik,
    STREAM_WIDTH: tl.constexpr, N_OUT: tl.constexpr, N_PAD: tl.constexpr, MULTI_MODAL: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    stream = tl.program_id(1)
    t_ok = t < tokens
    t64 = t.to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    n = tl.arange(0, N_PAD)
    if MULTI_MODAL:
        w_rows = weight_ptr + tl.load(modality_ptr + t, mask=t_ok, other=0).to(tl.int64) * stride_wm
    else:
        w_rows = weight_ptr + tl.zeros((BLOCK_T,), dtype=tl.int64)
    acc = tl.zeros((BLOCK_T, N_PAD), dtype=tl.float32)
    sumsq = tl.zeros((BLOCK_T,), dtype=tl.float32)
    for k0 in tl.range(stream * STREAM_WIDTH, (stream + 1) * STREAM_WIDTH, BLOCK_K):
        x = tl.load(x_ptr + t64[:, None] * stride_xt + (k0 + k)[None, :], mask=t_ok[:, None], other=0.0).to(tl.float32)
        w = tl.load(w_rows[:, None] + (k0 + k)[None, :]) + 1.0
        phi = tl.load(phi_ptr + (k0 + k)[:, None] * stride_phik + n[None, :], mask=(n < N_OUT)[None, :], other=0.0)
        sumsq += tl.sum(x * x, axis=1)
        acc = tl.dot(x * w, phi, acc, input_precision=DOT_PRECISION)
    out = (stream * tokens + t64)
    tl.store(partial_ptr + out[:, None] * N_PAD + n[None, :], acc, mask=t_ok[:, None])
    tl.store(sumsq_ptr + out, sumsq, mask=t_ok)


@triton.jit
def _logits_combine_kernel(
    partial_ptr, sumsq_ptr, out_ptr, tokens, inv_width, eps,
    NUM_STREAMS: tl.constexpr, N_OUT: tl.constexpr, N_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
):
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    t_ok = t < tokens
    n = tl.arange(0, N_PAD)
    acc = tl.zeros((BLOCK_T, N_PAD), dtype=tl.float32)
    sumsq = tl.zeros((BLOCK_T,), dtype=tl.float32)
    for s in tl.static_range(NUM_STREAMS):
        acc += tl.load(partial_ptr + (s * tokens + t)[:, None] * N_PAD + n[None, :], mask=t_ok[:, None], other=0.0)
        sumsq += tl.load(sumsq_ptr + s * tokens + t, mask=t_ok, other=0.0)
    acc = acc * tl.rsqrt(sumsq * inv_width + eps)[:, None]
    tl.store(out_ptr + t[:, None] * N_OUT + n[None, :], acc, mask=t_ok[:, None] & (n < N_OUT)[None, :])


def post_residual(post_logits, residual_logits, alpha_post, bias_post, alpha_residual, bias_residual, *, scale,
                  iterations, epsilon, out_dtype, block_t: int = 64):
    tokens = post_logits.shape[0]
    if post_logits.shape != (tokens, 4) or residual_logits.shape != (tokens, 4, 4):
        raise ValueError(f"expected post [T,4] and residual [T,4,4], got {tuple(post_logits.shape)}, "
                         f"{tuple(residual_logits.shape)}")
    post_out = torch.empty(tokens, 4, device=post_logits.device, dtype=out_dtype)
    res_out = torch.empty(tokens, 4, 4, device=post_logits.device, dtype=out_dtype)
    if tokens:
        _post_residual_kernel[(triton.cdiv(tokens, block_t),)](
            post_logits, residual_logits,
            alpha_post.float().contiguous(), bias_post.float().contiguous(),
            alpha_residual.float().contiguous(), bias_residual.float().contiguous(),
            post_out, res_out, tokens,
            post_logits.stride(0), post_logits.stride(1),
            residual_logits.stride(0), residual_logits.stride(1), residual_logits.stride(2),
            float(scale), float(epsilon), ITERATIONS=int(iterations), BLOCK_T=block_t, num_warps=4,
        )
    return post_out, res_out


def _unit_last_stride(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def mix(streams, branch, post, residual, block_c: int = 512):
    tokens, streams_n, hidden = streams.shape
    if streams_n != 4 or branch.shape != (tokens, hidden) or post.shape != (tokens, 4) or residual.shape != (tokens, 4, 4):
        raise ValueError("mix expects streams [T,4,C], branch [T,C], post [T,4], residual [T,4,4]")
    streams, branch = _unit_last_stride(streams), _unit_last_stride(branch)
    post, residual = post.contiguous(), residual.contiguous()
    out = torch.empty(tokens, 4, hidden, device=streams.device, dtype=streams.dtype)
    if out.numel():
        _mix_kernel[(tokens, triton.cdiv(hidden, block_c))](
            streams, branch, post, residual, out, hidden,
            streams.stride(0), streams.stride(1), branch.stride(0), post.stride(0), residual.stride(0),
            BLOCK_C=block_c, num_warps=4,
        )
    return out


def apply_pre(streams, alpha, bias, logits, *, scale, out_dtype, block_c: int = 512):
    tokens, streams_n, hidden = streams.shape
    if streams_n != 4 or logits.shape != (tokens, 4):
        raise ValueError("apply_pre expects streams [T,4,C] and logits [T,4]")
    streams = _unit_last_stride(streams)
    out = torch.empty(tokens, hidden, device=streams.device, dtype=out_dtype)
    if out.numel():
        _pre_kernel[(tokens, triton.cdiv(hidden, block_c))](
            streams, alpha.float().contiguous(), bias.float().contiguous(), logits, out, hidden,
            streams.stride(0), streams.stride(1), logits.stride(0), logits.stride(1), float(scale),
            BLOCK_C=block_c, num_warps=4,
        )
    return out


def logits(flattened, norm_weight, modality_ids, eps, phi, *, num_streams, dot_precision,
           block_t: int = 32, block_k: int = 128):
    tokens, width = flattened.shape
    n_out = phi.shape[1]
    if phi.shape[0] != width or width % num_streams:
        raise ValueError(f"phi must be [{width}, n] and the width divisible by {num_streams}")
    stream_width = width // num_streams
    block_k = min(block_k, stream_width & -stream_width)  # largest power of two dividing the stream width
    if block_k < 16:
        raise ValueError(f"stream width {stream_width} must be a multiple of 16")
    flattened = _unit_last_stride(flattened)
    weight = norm_weight.reshape(-1, width).float().contiguous()
    phi = phi.float().contiguous()
    n_pad = max(16, triton.next_power_of_2(n_out))
    partial = torch.empty(num_streams, tokens, n_pad, device=flattened.device, dtype=torch.float32)
    sumsq = torch.empty(num_streams, tokens, device=flattened.device, dtype=torch.float32)
    out = torch.empty(tokens, n_out, device=flattened.device, dtype=torch.float32)
    if tokens == 0:
        return out
    multi = modality_ids is not None
    _logits_partial_kernel[(triton.cdiv(tokens, block_t), num_streams)](
        flattened, weight, modality_ids if multi else weight, phi, partial, sumsq,
        tokens, flattened.stride(0), weight.stride(0), phi.stride(0),
        STREAM_WIDTH=stream_width, N_OUT=n_out, N_PAD=n_pad, MULTI_MODAL=multi,
        BLOCK_T=block_t, BLOCK_K=block_k, DOT_PRECISION=dot_precision, num_warps=4, num_stages=3,
    )
    _logits_combine_kernel[(triton.cdiv(tokens, 128),)](
        partial, sumsq, out, tokens, 1.0 / width, float(eps),
        NUM_STREAMS=num_streams, N_OUT=n_out, N_PAD=n_pad, BLOCK_T=128, num_warps=4,
    )
    return out
