"""Triton kernels behind :mod:`magi2_kernels.mhc` (imported only where Triton runs)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _reciprocal(x, FAST_RCP: tl.constexpr):
    if FAST_RCP:  # one MUFU rcp.approx (NVIDIA only; 1 ulp) in place of div.full's range checks
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.fdiv(1.0, x, ieee_rounding=False)


@triton.jit
def _normalised(a, b, c, d, epsilon, FAST_RCP: tl.constexpr):
    inverse = _reciprocal(a + b + c + d + epsilon, FAST_RCP)
    return a * inverse, b * inverse, c * inverse, d * inverse


@triton.jit
def _entry(rows, ok, alpha, bias_ptr, stride_ri, stride_rj, ROW: tl.constexpr, COL: tl.constexpr):
    return alpha * tl.load(rows + ROW * stride_ri + COL * stride_rj, mask=ok, other=0.0).to(tl.float32) \
        + tl.load(bias_ptr + ROW * 4 + COL)


@triton.jit
def _post_residual_kernel(
    post_ptr, res_ptr, alpha_post_ptr, bias_post_ptr, alpha_res_ptr, bias_res_ptr, post_out_ptr, res_out_ptr,
    tokens, stride_pt, stride_pn, stride_rt, stride_ri, stride_rj,
    scale, epsilon,
    ITERATIONS: tl.constexpr, BLOCK_T: tl.constexpr, FAST_RCP: tl.constexpr,
):
    """Each token's 4x4 matrix is sixteen [BLOCK_T] vectors, entry m_ij in its own registers: a row
    or column sum is three adds in one thread (a [BLOCK_T, 4] tile spread the 4 columns over threads,
    and every row sum was a warp shuffle), and a normalisation is one reciprocal and four multiplies."""

    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = t < tokens
    t64 = t.to(tl.int64)
    n = tl.arange(0, 4)
    post = tl.load(post_ptr + t64[:, None] * stride_pt + n[None, :] * stride_pn, mask=ok[:, None], other=0.0)
    post = 2.0 * tl.sigmoid(tl.load(alpha_post_ptr) * scale * post.to(tl.float32) + tl.load(bias_post_ptr + n)[None, :])
    tl.store(post_out_ptr + t64[:, None] * 4 + n[None, :], post.to(post_out_ptr.dtype.element_ty), mask=ok[:, None])

    alpha = tl.load(alpha_res_ptr) * scale
    rows = res_ptr + t64 * stride_rt
    m00 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 0, 0)
    m01 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 0, 1)
    m02 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 0, 2)
    m03 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 0, 3)
    m10 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 1, 0)
    m11 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 1, 1)
    m12 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 1, 2)
    m13 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 1, 3)
    m20 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 2, 0)
    m21 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 2, 1)
    m22 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 2, 2)
    m23 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 2, 3)
    m30 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 3, 0)
    m31 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 3, 1)
    m32 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 3, 2)
    m33 = _entry(rows, ok, alpha, bias_res_ptr, stride_ri, stride_rj, 3, 3)
    # The native amax spreads a NaN over its token's whole matrix; do the same (tl.maximum drops NaNs).
    has_nan = ((m00 != m00) | (m01 != m01) | (m02 != m02) | (m03 != m03) | (m10 != m10) | (m11 != m11)
               | (m12 != m12) | (m13 != m13) | (m20 != m20) | (m21 != m21) | (m22 != m22) | (m23 != m23)
               | (m30 != m30) | (m31 != m31) | (m32 != m32) | (m33 != m33))
    maximum = tl.maximum(tl.maximum(tl.maximum(tl.maximum(m00, m01), tl.maximum(m02, m03)),
                                    tl.maximum(tl.maximum(m10, m11), tl.maximum(m12, m13))),
                         tl.maximum(tl.maximum(tl.maximum(m20, m21), tl.maximum(m22, m23)),
                                    tl.maximum(tl.maximum(m30, m31), tl.maximum(m32, m33))))
    maximum = tl.where(has_nan, float("nan"), maximum)
    m00, m01, m02, m03 = tl.exp(m00 - maximum), tl.exp(m01 - maximum), tl.exp(m02 - maximum), tl.exp(m03 - maximum)
    m10, m11, m12, m13 = tl.exp(m10 - maximum), tl.exp(m11 - maximum), tl.exp(m12 - maximum), tl.exp(m13 - maximum)
    m20, m21, m22, m23 = tl.exp(m20 - maximum), tl.exp(m21 - maximum), tl.exp(m22 - maximum), tl.exp(m23 - maximum)
    m30, m31, m32, m33 = tl.exp(m30 - maximum), tl.exp(m31 - maximum), tl.exp(m32 - maximum), tl.exp(m33 - maximum)
    for _ in tl.static_range(ITERATIONS):
        m00, m10, m20, m30 = _normalised(m00, m10, m20, m30, epsilon, FAST_RCP)  # columns
        m01, m11, m21, m31 = _normalised(m01, m11, m21, m31, epsilon, FAST_RCP)
        m02, m12, m22, m32 = _normalised(m02, m12, m22, m32, epsilon, FAST_RCP)
        m03, m13, m23, m33 = _normalised(m03, m13, m23, m33, epsilon, FAST_RCP)
        m00, m01, m02, m03 = _normalised(m00, m01, m02, m03, epsilon, FAST_RCP)  # rows
        m10, m11, m12, m13 = _normalised(m10, m11, m12, m13, epsilon, FAST_RCP)
        m20, m21, m22, m23 = _normalised(m20, m21, m22, m23, epsilon, FAST_RCP)
        m30, m31, m32, m33 = _normalised(m30, m31, m32, m33, epsilon, FAST_RCP)
    out = res_out_ptr + t64 * 16
    dtype = res_out_ptr.dtype.element_ty
    tl.store(out + 0, m00.to(dtype), mask=ok)
    tl.store(out + 1, m01.to(dtype), mask=ok)
    tl.store(out + 2, m02.to(dtype), mask=ok)
    tl.store(out + 3, m03.to(dtype), mask=ok)
    tl.store(out + 4, m10.to(dtype), mask=ok)
    tl.store(out + 5, m11.to(dtype), mask=ok)
    tl.store(out + 6, m12.to(dtype), mask=ok)
    tl.store(out + 7, m13.to(dtype), mask=ok)
    tl.store(out + 8, m20.to(dtype), mask=ok)
    tl.store(out + 9, m21.to(dtype), mask=ok)
    tl.store(out + 10, m22.to(dtype), mask=ok)
    tl.store(out + 11, m23.to(dtype), mask=ok)
    tl.store(out + 12, m30.to(dtype), mask=ok)
    tl.store(out + 13, m31.to(dtype), mask=ok)
    tl.store(out + 14, m32.to(dtype), mask=ok)
    tl.store(out + 15, m33.to(dtype), mask=ok)


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
    alpha = tl.load(alpha_ptr) * scale
    out = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for n in tl.static_range(4):
        coeff = tl.sigmoid(alpha * tl.load(logits_ptr + token * stride_lt + n * stride_ln).to(tl.float32)
                           + tl.load(bias_ptr + n))
        out += coeff * tl.load(streams_ptr + token * stride_st + n * stride_sn + c, mask=c_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * hidden + c, out.to(out_ptr.dtype.element_ty), mask=c_ok)


@triton.jit
def _logits_partial_kernel(
    x_ptr, modality_ptr, phi_ptr, partial_ptr, sumsq_ptr,
    tokens, stride_xt, stride_phim, stride_phip,
    STREAM_WIDTH: tl.constexpr, N_PAD: tl.constexpr, MULTI_MODAL: tl.constexpr, NUM_MODALITIES: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr, PHI_PARTS: tl.constexpr,
    UPCAST_PARTS: tl.constexpr, TF32_PARTS: tl.constexpr,
):
    """Partial ``x[:, stream] @ phi_m[stream]`` and sum of squares for one (token block, stream).

    ``phi_m = (w_m + 1) * phi`` has the norm weight of modality m folded in. Tokens arrive grouped
    by modality, so a block usually needs one modality; a block across a boundary runs once per
    modality present and keeps each token's own result. ``PHI_PARTS`` 0: x in fp32 against the
    fp32 ``phi_m`` at ``DOT_PRECISION``; 3: bf16 x as it is against ``phi_m`` split into three
    bf16 terms (``phi_m = p1 + p2 + p3`` to fp32's 24 bits; each bf16 product is exact), three bf16
    MMAs in place of tf32x3's three tf32 ones and no conversion of x. The small terms go into their
    own accumulator: added into p1's, Hopper's MMA dropped their low bits (1.05e-5 against fp64
    on the H100 with one accumulator, fp32 dots 2.3e-7).
    ``TF32_PARTS`` (with ``PHI_PARTS`` 2): a 16-bit x is exact in tf32 (7 or 10 stored mantissa bits against tf32's 10),
    so tf32x3's split of x is wasted: ``phi_m`` comes as two fp32 terms, the first rounded to tf32, and two
    tf32 dots (the small term in its own accumulator) give tf32x3's error with no split in the loop.
    ``UPCAST_PARTS``: the same products as fp32 ``ieee`` dots (Triton's interpreter multiplies bf16
    tiles wrongly, so the CPU tests run the split this way).
    """

    t0 = tl.program_id(0) * BLOCK_T
    stream = tl.program_id(1)
    t = t0 + tl.arange(0, BLOCK_T)
    t_ok = t < tokens
    t64 = t.to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    n = tl.arange(0, N_PAD)
    if MULTI_MODAL:
        modality = tl.load(modality_ptr + t, mask=t_ok, other=0).to(tl.int32)
        first = tl.load(modality_ptr + t0).to(tl.int32)
        last = tl.load(modality_ptr + tl.minimum(t0 + BLOCK_T, tokens) - 1).to(tl.int32)
    else:
        modality = tl.zeros((BLOCK_T,), dtype=tl.int32)
        first = 0
        last = 0
    acc = tl.zeros((BLOCK_T, N_PAD), dtype=tl.float32)
    sumsq = tl.zeros((BLOCK_T,), dtype=tl.float32)
    x_rows = x_ptr + t64[:, None] * stride_xt + stream * STREAM_WIDTH + k[None, :]
    # Loop bounds are constexpr and the modality test a scalar branch: a loop bounded by loaded
    # values needs int() of a 1-element array in Triton <= 3.6's interpreter, which numpy 2.4
    # refuses ("only 0-dimensional arrays can be converted to Python scalars").
    for m in tl.static_range(NUM_MODALITIES):
        if (m >= first) & (m <= last):
            acc_m = tl.zeros((BLOCK_T, N_PAD), dtype=tl.float32)
            acc_lo = tl.zeros((BLOCK_T, N_PAD), dtype=tl.float32)  # the split's small terms, summed apart
            squares = tl.zeros((BLOCK_T, BLOCK_K), dtype=tl.float32)  # summed over k after the loop
            phi_rows = phi_ptr + m * stride_phim + stream * STREAM_WIDTH * N_PAD
            for k0 in tl.range(0, STREAM_WIDTH, BLOCK_K):
                x_in = tl.load(x_rows + k0, mask=t_ok[:, None], other=0.0)
                x = x_in.to(tl.float32)
                squares += x * x  # a row sum here, every step, was a third of the loop (warp shuffles)
                phi_k = phi_rows + (k0 + k)[:, None] * N_PAD + n[None, :]
                if PHI_PARTS == 0:
                    acc_m = tl.dot(x, tl.load(phi_k), acc_m, input_precision=DOT_PRECISION)
                elif TF32_PARTS:
                    acc_m = tl.dot(x, tl.load(phi_k), acc_m, input_precision="ieee" if UPCAST_PARTS else "tf32")
                    acc_lo = tl.dot(x, tl.load(phi_k + stride_phip), acc_lo,
                                    input_precision="ieee" if UPCAST_PARTS else "tf32")
                elif UPCAST_PARTS:
                    acc_m = tl.dot(x, tl.load(phi_k).to(tl.float32), acc_m, input_precision="ieee")
                    for part in tl.static_range(1, PHI_PARTS):
                        acc_lo = tl.dot(x, tl.load(phi_k + part * stride_phip).to(tl.float32), acc_lo,
                                        input_precision="ieee")
                else:
                    acc_m = tl.dot(x_in, tl.load(phi_k), acc_m)
                    for part in tl.static_range(1, PHI_PARTS):
                        acc_lo = tl.dot(x_in, tl.load(phi_k + part * stride_phip), acc_lo)
            acc_m += acc_lo
            acc = tl.where((modality == m)[:, None], acc_m, acc)
            sumsq = tl.sum(squares, axis=1)
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
                  iterations, epsilon, out_dtype, fast_reciprocal: bool = False, block_t: int | None = None,
                  num_warps: int = 4):
    tokens = post_logits.shape[0]
    # Enough programs to fill the GPU at model sizes (15k tokens), 256 tokens each at large T.
    block_t = block_t or max(32, min(256, triton.next_power_of_2(triton.cdiv(max(tokens, 1), 528))))
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
            float(scale), float(epsilon), ITERATIONS=int(iterations), BLOCK_T=block_t,
            FAST_RCP=fast_reciprocal, num_warps=num_warps,
        )
    return post_out, res_out


def _unit_last_stride(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def mix(streams, branch, post, residual, block_c: int = 512):
    tokens, streams_n, hidden = streams.shape
    if (streams_n != 4 or branch.shape != (tokens, hidden) or post.shape != (tokens, 4)
            or residual.shape != (tokens, 4, 4)):
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


def split_bf16(phi: torch.Tensor, parts: int = 3) -> torch.Tensor:
    """fp32 ``phi`` as ``parts`` bf16 terms stacked on a new dim -3, their sum ``phi`` to fp32's 24 bits."""

    terms, rest = [], phi.float()
    for _ in range(parts):
        term = rest.to(torch.bfloat16)
        terms.append(term)
        rest = rest - term.float()
    return torch.stack(terms, dim=-3)


def split_tf32(phi: torch.Tensor) -> torch.Tensor:
    """fp32 ``phi`` as two fp32 terms stacked on a new dim -3: ``phi`` rounded to tf32 (10 mantissa bits,
    ties away from zero) and the rest, which sum to ``phi`` exactly."""

    bits = phi.float().contiguous().view(torch.int32)
    high = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    return torch.stack([high, phi.float() - high], dim=-3)


def logits(flattened, norm_weight, modality_ids, eps, phi, *, num_streams, dot_precision,
           block_t: int = 64, block_k: int = 64, num_warps: int = 4, num_stages: int = 3,
           bf16_split: bool = False, tf32_split: bool = False):
    tokens, width = flattened.shape
    n_out = phi.shape[1]
    if phi.shape[0] != width or width % num_streams:
        raise ValueError(f"phi must be [{width}, n] and the width divisible by {num_streams}")
    stream_width = width // num_streams
    block_k = min(block_k, stream_width & -stream_width)  # largest power of two dividing the stream width
    if block_k < 16:
        raise ValueError(f"stream width {stream_width} must be a multiple of 16")
    flattened = _unit_last_stride(flattened)
    n_pad = max(16, triton.next_power_of_2(n_out))
    weight = norm_weight.reshape(-1, width).float()
    # Fold each modality's norm weight into its own copy of phi (padded to n_pad columns).
    phi_m = torch.zeros(weight.shape[0], width, n_pad, device=phi.device, dtype=torch.float32)
    phi_m[:, :, :n_out] = (weight + 1.0)[:, :, None] * phi.float()[None]
    tf32 = tf32_split and flattened.element_size() == 2  # fp16 and bf16 are exact in tf32
    parts = 3 if bf16_split and flattened.dtype == torch.bfloat16 else 2 if tf32 else 0
    if parts == 3:
        phi_m = split_bf16(phi_m, parts)  # [modalities, parts, width, n_pad]
    elif parts == 2:
        phi_m = split_tf32(phi_m)
    partial = torch.empty(num_streams, tokens, n_pad, device=flattened.device, dtype=torch.float32)
    sumsq = torch.empty(num_streams, tokens, device=flattened.device, dtype=torch.float32)
    out = torch.empty(tokens, n_out, device=flattened.device, dtype=torch.float32)
    if tokens == 0:
        return out
    multi = modality_ids is not None and weight.shape[0] > 1
    _logits_partial_kernel[(triton.cdiv(tokens, block_t), num_streams)](
        flattened, modality_ids if multi else phi_m, phi_m, partial, sumsq,
        tokens, flattened.stride(0), phi_m.stride(0), phi_m.stride(1) if parts else 0,
        STREAM_WIDTH=stream_width, N_PAD=n_pad, MULTI_MODAL=multi, NUM_MODALITIES=weight.shape[0] if multi else 1,
        BLOCK_T=block_t, BLOCK_K=block_k, DOT_PRECISION=dot_precision, PHI_PARTS=parts,
        UPCAST_PARTS=os.environ.get("TRITON_INTERPRET", "0") == "1", TF32_PARTS=parts == 2, num_warps=num_warps,
        num_stages=num_stages,
    )
    _logits_combine_kernel[(triton.cdiv(tokens, 128),)](
        partial, sumsq, out, tokens, 1.0 / width, float(eps),
        NUM_STREAMS=num_streams, N_OUT=n_out, N_PAD=n_pad, BLOCK_T=128, num_warps=4,
    )
    return out
