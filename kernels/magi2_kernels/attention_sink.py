"""Attention sink + sigmoid output gate, and a reference varlen attention for CPU.

MAGI-2 attention has learnable fp32 sink logits ``sink[S, H]`` whose values are zero vectors, so
adding them to a finished softmax only rescales the output row: with ``lse`` the row's
log-sum-exp and ``lse_sink[h] = logsumexp(sink[:, h])``,
``out *= exp(lse - logaddexp(lse, lse_sink)) = sigmoid(lse - lse_sink)``.
:func:`sink_gate` applies that factor, optionally gathers rows (the modality permutation the gate
is applied in), multiplies by ``sigmoid(gate[t, h])`` and casts, in one pass with fp32 math.
"""

from __future__ import annotations

import torch

from .platform import Platform, current_platform


def reference_varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    *, softcap: float = -1.0, out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed bidirectional attention (GQA, optional softcap) in fp32: ``(out[T, H, D], lse[H, T])``.

    ``out`` is in ``out_dtype`` (default ``q.dtype``); ask for fp32 to round once, after the sink.
    """

    tokens, heads, dim = q.shape
    compute = torch.promote_types(q.dtype, torch.float32)
    out = torch.empty(q.shape, dtype=out_dtype or q.dtype, device=q.device)
    lse = torch.empty(heads, tokens, dtype=compute, device=q.device)
    scale = dim**-0.5
    groups = heads // k.shape[1]
    bounds_q = cu_seqlens_q.tolist()
    bounds_k = cu_seqlens_k.tolist()
    for (q0, q1), (k0, k1) in zip(zip(bounds_q[:-1], bounds_q[1:]), zip(bounds_k[:-1], bounds_k[1:])):
        qs = q[q0:q1].to(compute)
        ks = k[k0:k1].to(compute).repeat_interleave(groups, dim=1)
        vs = v[k0:k1].to(compute).repeat_interleave(groups, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        row_lse = torch.logsumexp(scores, dim=-1)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", torch.exp(scores - row_lse[..., None]), vs).to(out.dtype)
        lse[:, q0:q1] = row_lse
    return out, lse


def reference_sink_gate(
    out: torch.Tensor, lse: torch.Tensor | None, sink: torch.Tensor | None, gates: torch.Tensor | None,
    rows: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """PyTorch reference of :func:`sink_gate`."""

    compute = torch.promote_types(out.dtype, torch.float32)
    result = out.to(compute)
    if sink is not None and sink.numel():
        sink_lse = torch.logsumexp(sink.to(compute), dim=0)
        row_lse = lse.to(compute).transpose(0, 1)
        factor = torch.where(torch.isneginf(row_lse), torch.zeros_like(row_lse), torch.sigmoid(row_lse - sink_lse))
        result = result * factor[..., None]
    if rows is not None:
        result = result.index_select(0, rows)
    if gates is not None:
        result = result * torch.sigmoid(gates.to(compute).reshape(result.shape[0], result.shape[1], 1))
    return result.to(out_dtype or out.dtype)


def sink_gate(
    out: torch.Tensor, lse: torch.Tensor | None, sink: torch.Tensor | None, gates: torch.Tensor | None,
    rows: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None, platform: Platform | None = None,
) -> torch.Tensor:
    """``result[r] = out[rows[r]] * sigmoid(lse - lse_sink) * sigmoid(gates[r])``, each factor optional.

    ``out[T, H, D]``, ``lse[H, T]`` (FlashAttention's layout), ``sink[S, H]``, ``gates[T, H]`` (any
    shape with T*H elements), ``rows[T]`` int.
    """

    platform = platform or current_platform()
    if not platform.triton:
        return reference_sink_gate(out, lse, sink, gates, rows, out_dtype=out_dtype)
    from . import attention_sink_triton

    return attention_sink_triton.sink_gate(out, lse, sink, gates, rows, out_dtype=out_dtype or out.dtype)
