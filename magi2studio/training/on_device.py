"""Training the tiny DiT on a GPU: differentiable paths for upstream's two kernels, and one batch moved there.

On CUDA, upstream's MAGI-2 picks its fused Triton MoE (``triton_mh_moe_forward``) and vLLM's
compiled FlashAttention (``vllm_flash_attn_varlen_with_lse``); neither has a backward, and the
latter is not on the lent GPU. :func:`differentiable_upstream_paths` routes both to differentiable
torch. On the CPU that is upstream's own pure-torch functions (``torch_mh_moe_forward``,
``torch_varlen_attention_with_sink``), so a CPU run is what it always was, bit for bit. On a GPU
those two loop in Python (one expert, one sample at a time, with a host sync per expert), and at the
tiny model's size a step is kernel launches and syncs, not arithmetic: there the same two functions
run batched, with no host sync (:func:`dense_mh_moe`, :func:`padded_attention_with_sink`), equal to
upstream's up to float rounding (tests/training/test_on_device.py). Batches are still drawn on the
CPU from the seed, exactly as a CPU run draws them, and only then moved.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields, replace

import torch


@contextmanager
def differentiable_upstream_paths() -> Iterator[None]:
    from vllm_omni.diffusion.models.magi2 import attention, mh_moe

    def moe(x, gather_ids, probs, expert_offsets, w_gate, w_up, w_down, *, deterministic=False):
        forward = dense_mh_moe if x.is_cuda else mh_moe.torch_mh_moe_forward
        return forward(x, gather_ids, probs, expert_offsets, w_gate, w_up, w_down)

    def packed(q, k, v, varlen, *, softcap=-1.0, sink=None):
        cu_q, cu_k, _, _ = varlen.resolved(q.shape[0], k.shape[0])
        forward = padded_attention_with_sink if q.is_cuda else attention.torch_varlen_attention_with_sink
        return forward(q, k, v, cu_seqlens_q=cu_q.cpu(), cu_seqlens_k=cu_k.cpu(), softcap=softcap, sink=sink)

    saved = mh_moe.triton_mh_moe_forward, attention.packed_attention_with_sink
    mh_moe.triton_mh_moe_forward, attention.packed_attention_with_sink = moe, packed
    try:
        yield
    finally:
        mh_moe.triton_mh_moe_forward, attention.packed_attention_with_sink = saved


def dense_mh_moe(x: torch.Tensor, gather_ids: torch.Tensor, probs: torch.Tensor, expert_offsets: torch.Tensor,
                 w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """``torch_mh_moe_forward``'s result with every token through every expert of its head, weighted by its
    routing probability (zero where it was not routed): no host sync and a few large kernels instead of
    one small loop body per expert. Top-k of 8 experts computes 4 times the routed FLOPs, which the tiny
    model's GPU step does not notice."""

    from vllm_omni.diffusion.models.magi2.mh_moe import swiglu7_pair

    tokens, heads, _ = x.shape
    experts = (expert_offsets.numel() - 1) // heads
    slots = torch.arange(gather_ids.numel(), device=x.device)
    flat_expert = torch.searchsorted(expert_offsets[1:], slots, right=True)  # each routed slot's expert
    routing = torch.zeros(tokens, heads, experts, device=x.device, dtype=probs.dtype)
    routing = routing.index_put((gather_ids.long(), flat_expert // experts, flat_expert % experts), probs)
    w_gate, w_up, w_down = (w.view(heads, experts, *w.shape[1:]) for w in (w_gate, w_up, w_down))
    gate = torch.einsum("thd,hedf->thef", x, w_gate)
    up = torch.einsum("thd,hedf->thef", x, w_up)
    expert_outputs = torch.einsum("thef,hefd->thed", swiglu7_pair(gate, up), w_down)
    return (expert_outputs * routing.to(expert_outputs.dtype)[..., None]).sum(dim=2).to(x.dtype)


def padded_attention_with_sink(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, cu_seqlens_q: torch.Tensor,
                               cu_seqlens_k: torch.Tensor, softcap: float = -1.0,
                               sink: torch.Tensor | None = None) -> torch.Tensor:
    """``torch_varlen_attention_with_sink`` for all sequences at once: each padded to the longest, the padded
    keys masked out, one softmax over [keys, sink]. ``cu_seqlens_*`` are on the CPU (the index is built there)."""

    from vllm_omni.diffusion.models.magi2.attention import _repeat_kv_heads

    def padded(cu: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = (cu[1:] - cu[:-1]).long()
        width = int(lengths.max())
        valid = torch.arange(width)[None, :] < lengths[:, None]
        index = (cu[:-1].long()[:, None] + torch.arange(width)[None, :]).clamp(max=max(int(cu[-1]) - 1, 0))
        return tokens[index.to(tokens.device)], valid.to(tokens.device)

    query, query_valid = padded(cu_seqlens_q, q.float())
    key, key_valid = padded(cu_seqlens_k, _repeat_kv_heads(k, q.shape[1]).float())
    value, _ = padded(cu_seqlens_k, _repeat_kv_heads(v, q.shape[1]).float())
    scores = torch.einsum("bqhd,bkhd->bhqk", query, key) * q.shape[-1] ** -0.5
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~key_valid[:, None, None, :], float("-inf"))
    keys = key.shape[1]
    if sink is not None and sink.numel() > 0:
        sink_scores = sink.float().transpose(0, 1)[None, :, None, :].expand(*scores.shape[:3], -1)
        scores = torch.cat((scores, sink_scores), dim=-1)
    probabilities = torch.softmax(scores, dim=-1)[..., :keys]
    output = torch.einsum("bhqk,bkhd->bqhd", probabilities, value)
    return output[query_valid].to(q.dtype)


def batch_to(batch: tuple, device: torch.device) -> tuple:
    """``dit_batch``'s (model input, targets, weights) on ``device``; the CPU's batch is returned as is."""

    if device.type == "cpu":
        return batch
    model_input, *tensors = batch
    moved = {f.name: getattr(model_input, f.name).to(device) for f in fields(model_input)
             if isinstance(getattr(model_input, f.name), torch.Tensor)}
    return (replace(model_input, **moved), *(t.to(device) for t in tensors))
