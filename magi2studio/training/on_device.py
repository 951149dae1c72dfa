"""Training the tiny DiT on a GPU: upstream's differentiable paths, and one batch moved to the device.

On CUDA, upstream's MAGI-2 picks its fused Triton MoE (``triton_mh_moe_forward``) and vLLM's
compiled FlashAttention (``vllm_flash_attn_varlen_with_lse``); neither has a backward, and the
latter is not on the lent GPU. :func:`differentiable_upstream_paths` routes both to upstream's own
pure-torch functions (``torch_mh_moe_forward``, ``torch_varlen_attention_with_sink``: the paths
the CPU takes), so the same model trains on either device. Batches are still drawn on the CPU
from the seed, exactly as a CPU run draws them, and only then moved.
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
        return mh_moe.torch_mh_moe_forward(x, gather_ids, probs, expert_offsets, w_gate, w_up, w_down)

    def packed(q, k, v, varlen, *, softcap=-1.0, sink=None):
        cu_q, cu_k, _, _ = varlen.resolved(q.shape[0], k.shape[0])
        return attention.torch_varlen_attention_with_sink(q, k, v, cu_seqlens_q=cu_q.cpu(), cu_seqlens_k=cu_k.cpu(),
                                                          softcap=softcap, sink=sink)

    saved = mh_moe.triton_mh_moe_forward, attention.packed_attention_with_sink
    mh_moe.triton_mh_moe_forward, attention.packed_attention_with_sink = moe, packed
    try:
        yield
    finally:
        mh_moe.triton_mh_moe_forward, attention.packed_attention_with_sink = saved


def batch_to(batch: tuple, device: torch.device) -> tuple:
    """``dit_batch``'s (model input, targets, weights) on ``device``; the CPU's batch is returned as is."""

    if device.type == "cpu":
        return batch
    model_input, *tensors = batch
    moved = {f.name: getattr(model_input, f.name).to(device) for f in fields(model_input)
             if isinstance(getattr(model_input, f.name), torch.Tensor)}
    return (replace(model_input, **moved), *(t.to(device) for t in tensors))
