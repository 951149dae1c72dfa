"""mHC (manifold-constrained hyper-connections, 4 residual streams) kernels with PyTorch references.

- :func:`post_residual`: post coefficients ``2 sigmoid(a s p + b)`` and the 20-iteration Sinkhorn
  normalisation of the 4x4 residual-mixing matrices for all tokens in one launch (the native
  path is 42 launches per call).
- :func:`mix`: ``out[t, i] = sum_j R[t, i, j] streams[t, j] + post[t, i] branch[t]`` and
  :func:`apply_pre`: ``out[t] = sum_n sigmoid(a s l[t, n] + b[n]) streams[t, n]`` as fp32
  elementwise contractions (the MUSA report's PR #8510) with one rounding at the store.
- :func:`logits`: the ``[T, 4C] x [4C, 24]`` fp32 coefficient projection with the mHC RMSNorm
  folded in, split by stream: one program per (token block, stream) reads that stream's ``[T, C]``
  slice once, accumulates its partial product and sum of squares, and a second launch sums the
  four partials in a fixed order and applies the RMS scale. The fp32 ``[T, 4C]`` normalised copy
  that the native path writes and reads back never exists.
"""

from __future__ import annotations

import torch

from .platform import Platform, current_platform


def reference_post_residual(
    post_logits: torch.Tensor,
    residual_logits: torch.Tensor,
    alpha_post: torch.Tensor,
    bias_post: torch.Tensor,
    alpha_residual: torch.Tensor,
    bias_residual: torch.Tensor,
    *,
    scale: float,
    iterations: int,
    epsilon: float,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch reference of :func:`post_residual` (computes in the inputs' float dtype, >= fp32)."""

    dtype = torch.promote_types(post_logits.dtype, torch.float32)
    post = 2.0 * torch.sigmoid(alpha_post.to(dtype) * scale * post_logits.to(dtype) + bias_post.to(dtype))
    matrix = alpha_residual.to(dtype) * scale * residual_logits.to(dtype) + bias_residual.to(dtype)
    matrix = torch.exp(matrix - matrix.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iterations):
        matrix = matrix / (matrix.sum(dim=-2, keepdim=True) + epsilon)
        matrix = matrix / (matrix.sum(dim=-1, keepdim=True) + epsilon)
    return post.to(out_dtype), matrix.to(out_dtype)


def reference_mix(
    streams: torch.Tensor, branch: torch.Tensor, post: torch.Tensor, residual: torch.Tensor
) -> torch.Tensor:
    """PyTorch reference of :func:`mix`, fp32 (or fp64 for fp64 inputs) with one final rounding."""

    dtype = torch.promote_types(streams.dtype, torch.float32)
    mixed = torch.einsum("tij,tjc->tic", residual.to(dtype), streams.to(dtype))
    return (mixed + post.to(dtype)[:, :, None] * branch.to(dtype)[:, None, :]).to(streams.dtype)


def reference_apply_pre(
    streams: torch.Tensor, alpha: torch.Tensor, bias: torch.Tensor, logits: torch.Tensor, *, scale: float,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    dtype = torch.promote_types(streams.dtype, torch.float32)
    coefficients = torch.sigmoid(alpha.to(dtype) * scale * logits.to(dtype) + bias.to(dtype))
    return torch.einsum("tn,tnc->tc", coefficients, streams.to(dtype)).to(out_dtype)


def reference_logits(
    flattened: torch.Tensor, norm_weight: torch.Tensor, modality_ids: torch.Tensor | None, eps: float,
    phi: torch.Tensor,
) -> torch.Tensor:
    """``rmsnorm(flattened) * (w[modality] + 1) @ phi`` in fp32 (fp64 for fp64 inputs)."""

    dtype = torch.promote_types(phi.dtype, torch.float32)
    x = flattened.to(dtype)
    x = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)
    weight = norm_weight.to(dtype) + 1.0
    x = x * (weight[0] if modality_ids is None else weight[modality_ids.long()])
    return x @ phi.to(dtype)


def post_residual(
    post_logits: torch.Tensor,
    residual_logits: torch.Tensor,
    alpha_post: torch.Tensor,
    bias_post: torch.Tensor,
    alpha_residual: torch.Tensor,
    bias_residual: torch.Tensor,
    *,
    scale: float,
    iterations: int,
    epsilon: float,
    out_dtype: torch.dtype,
    platform: Platform | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Post coefficients ``[T, 4]`` and Sinkhorn-normalised residual matrices ``[T, 4, 4]``."""

    platform = platform or current_platform()
    args = (post_logits, residual_logits, alpha_post, bias_post, alpha_residual, bias_residual)
    if not platform.triton:
        return reference_post_residual(*args, scale=scale, iterations=iterations, epsilon=epsilon, out_dtype=out_dtype)
    from . import mhc_triton

    return mhc_triton.post_residual(*args, scale=scale, iterations=iterations, epsilon=epsilon, out_dtype=out_dtype,
                                    fast_reciprocal=platform.fast_reciprocal)


def mix(
    streams: torch.Tensor, branch: torch.Tensor, post: torch.Tensor, residual: torch.Tensor,
    *, platform: Platform | None = None,
) -> torch.Tensor:
    """Hyper-connection update of ``streams[T, 4, C]`` with ``branch[T, C]``; returns ``streams.dtype``."""

    platform = platform or current_platform()
    if not platform.triton:
        return reference_mix(streams, branch, post, residual)
    from . import mhc_triton

    return mhc_triton.mix(streams, branch, post, residual)


def apply_pre(
    streams: torch.Tensor, alpha: torch.Tensor, bias: torch.Tensor, logits: torch.Tensor, *, scale: float,
    out_dtype: torch.dtype, platform: Platform | None = None,
) -> torch.Tensor:
    """Branch input ``sum_n sigmoid(alpha scale logits + bias)[t, n] streams[t, n]``: ``[T, C]``."""

    platform = platform or current_platform()
    if not platform.triton:
        return reference_apply_pre(streams, alpha, bias, logits, scale=scale, out_dtype=out_dtype)
    from . import mhc_triton

    return mhc_triton.apply_pre(streams, alpha, bias, logits, scale=scale, out_dtype=out_dtype)


def logits(
    flattened: torch.Tensor, norm_weight: torch.Tensor, modality_ids: torch.Tensor | None, eps: float,
    phi: torch.Tensor, *, num_streams: int = 4, platform: Platform | None = None, bf16_split: bool = False,
) -> torch.Tensor:
    """mHC coefficient logits ``[T, 2n + n^2]`` from ``flattened[T, n C]`` (norm weight ``[modalities, n C]``).

    ``bf16_split``: for bf16 ``flattened``, three bf16 MMAs against ``phi`` split in three bf16 terms in place of
    fp32 dots at the platform's precision (``mhc_triton.split_bf16``); the bench measures both."""

    platform = platform or current_platform()
    if not platform.triton:
        return reference_logits(flattened, norm_weight, modality_ids, eps, phi)
    from . import mhc_triton

    return mhc_triton.logits(
        flattened, norm_weight, modality_ids, eps, phi, num_streams=num_streams, dot_precision=platform.dot_precision,
        bf16_split=bf16_split,
    )
