"""Device-only substitution for vLLM's compiled FlashAttention, loaded in every diffusion worker.

Only vLLM's Python files travel to the lent GPU; ``vllm.vllm_flash_attn`` is a compiled extension
built for vLLM's own torch and cannot be carried. MAGI-2's attention (upstream's and ours) calls
``attention.vllm_flash_attn_varlen_with_lse`` by module attribute, so this replaces that one name
with torch's own FlashAttention-2 varlen kernel (``aten._flash_attention_forward``), which returns the
same (out, lse) pair. Declared as a ``vllm.general_plugins`` entry point only by the device carry
(scripts/device-omni-carry); never installed by the product. Every run that used it says so.
"""

from __future__ import annotations

import os

_installed: dict | None = None


def torch_flash_varlen_with_lse(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                softmax_scale=None, softcap=0.0, causal=False, deterministic=False,
                                fa_version=None):
    import torch

    if softcap and softcap > 0:
        raise NotImplementedError("softcap is not supported by the torch FlashAttention substitute")
    if k.shape[1] != q.shape[1]:  # GQA: torch's varlen FA2 entry takes equal head counts
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    out, lse, *_ = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens_q.to(torch.int32), cu_seqlens_k.to(torch.int32), int(max_seqlen_q), int(max_seqlen_k),
        0.0, bool(causal), False, scale=softmax_scale)
    if lse.dim() == 2 and lse.shape[0] != q.shape[1]:
        lse = lse.transpose(0, 1)
    return out, lse.contiguous()


def self_check() -> float:
    """Relative error of the substitute against float64 softmax attention on two packed sequences."""

    import torch

    torch.manual_seed(0)
    lengths = [37, 91]
    q = torch.randn(sum(lengths), 4, 128, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    cu = torch.tensor([0, lengths[0], sum(lengths)], device="cuda", dtype=torch.int32)
    out, lse = torch_flash_varlen_with_lse(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lengths),
                                           max_seqlen_k=max(lengths))
    errors = []
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qs, ks, vs = (t[start:end].double().transpose(0, 1) for t in (q, k, v))
        scores = qs @ ks.transpose(1, 2) / 128 ** 0.5
        ref = torch.softmax(scores, -1) @ vs
        ref_lse = torch.logsumexp(scores, -1)
        errors.append(((out[start:end].double().transpose(0, 1) - ref).norm() / ref.norm()).item())
        errors.append(((lse[:, start:end].double() - ref_lse).norm() / ref_lse.norm()).item())
    return max(errors)


def register() -> dict:
    """The entry point: replace the compiled FlashAttention call in MAGI-2's attention module."""

    global _installed
    if _installed is not None:
        return _installed
    from vllm_omni.diffusion.models.magi2 import attention

    attention.vllm_flash_attn_varlen_with_lse = torch_flash_varlen_with_lse
    attention._resolve_flash_attn_version = lambda: 0  # recorded as "torch FA2 substitute", no vLLM FA version
    _installed = {"flash_attention": "torch aten._flash_attention_forward (FA2) in place of vllm.vllm_flash_attn",
                  "pid": os.getpid()}
    return _installed
