"""Head routing on the device, no host syncs: top-k per (head, token) and the per-expert CSR layout.

One Triton launch computes the fp32 gate logits ``x[t, h] . gate[h, e]``, sigmoid scores, adds the
expert bias for selection only, takes the top-k, L1-normalises and applies the routing scale. The
CSR layout comes from a stable sort of the int32 flat-expert keys plus ``searchsorted`` (int32
offsets), then one launch writes the gathered token ids, the sorted probabilities and each
(head, token, k)'s row ("slot", used by the deterministic MoE combine). Every buffer has a size
known on the host (``heads * tokens * top_k`` routes, ``heads * experts + 1`` offsets), so
nothing is read back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .platform import Platform, current_platform


@dataclass(frozen=True)
class Routes:
    """Routes of ``tokens`` tokens over ``heads`` heads, CSR-sorted by flat expert ``h * experts + e``."""

    gather_ids: torch.Tensor  # int32 [routes]: token of each sorted row
    probs: torch.Tensor  # fp32 [routes]: routing probability of each sorted row
    offsets: torch.Tensor  # int32 [heads * experts + 1]
    slots: torch.Tensor  # int32 [heads, tokens, top_k]: sorted row of each (head, token, k)
    topk_ids: torch.Tensor  # int32 [heads, tokens, top_k]: expert within the head, best first
    topk_probs: torch.Tensor  # fp32 [heads, tokens, top_k]


def reference_topk(
    x_heads: torch.Tensor,
    gate: torch.Tensor,
    expert_bias: torch.Tensor | None,
    top_k: int,
    *,
    route_norm: bool = True,
    route_scale: float = 1.0,
    norm_eps: float = 1e-12,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch top-k routing: returns (probs fp32 [H, T, K], expert ids int64 [H, T, K])."""

    logits = torch.einsum("thd,hed->hte", x_heads.to(gate.dtype), gate)
    scores = torch.sigmoid(logits)
    selection = scores if expert_bias is None else scores + expert_bias.view(gate.shape[0], 1, -1)
    ids = torch.topk(selection, top_k, dim=-1).indices
    probs = scores.gather(-1, ids)
    if route_norm:
        probs = F.normalize(probs, p=1, dim=-1, eps=norm_eps)
    return (probs * route_scale).float(), ids


def reference_csr(topk_probs: torch.Tensor, topk_ids: torch.Tensor, num_experts: int) -> Routes:
    """PyTorch CSR build from top-k routes (stable by token inside each expert)."""

    heads, tokens, top_k = topk_ids.shape
    device = topk_ids.device
    head_base = torch.arange(heads, device=device, dtype=torch.int32).view(-1, 1, 1) * num_experts
    keys = topk_ids.to(torch.int32) + head_base
    sorted_keys, order = torch.sort(keys.reshape(-1), stable=True)
    bounds = torch.arange(heads * num_experts + 1, device=device, dtype=torch.int32)
    offsets = torch.searchsorted(sorted_keys, bounds, out_int32=True)
    gather_ids = torch.div(order, top_k, rounding_mode="floor").remainder(tokens).to(torch.int32)
    probs = topk_probs.reshape(-1).float()[order]
    slots = torch.empty(order.numel(), device=device, dtype=torch.int32)
    slots[order] = torch.arange(order.numel(), device=device, dtype=torch.int32)
    return Routes(gather_ids, probs, offsets, slots.view(heads, tokens, top_k), topk_ids.to(torch.int32),
                  topk_probs.float())


def slots_from_csr(gather_ids: torch.Tensor, offsets: torch.Tensor, heads: int, tokens: int,
                   top_k: int) -> torch.Tensor:
    """Slots ``[heads, tokens, top_k]`` for a CSR layout built elsewhere (e.g. vLLM-Omni's routing)."""

    flat_experts = offsets.numel() - 1
    routes = gather_ids.numel()
    row_head = torch.repeat_interleave(
        torch.arange(flat_experts, device=offsets.device) // (flat_experts // heads),
        torch.diff(offsets.long()),
        output_size=routes,
    )
    keys = row_head * tokens + gather_ids.long()
    return torch.sort(keys, stable=True).indices.to(torch.int32).view(heads, tokens, top_k)


def route(
    x_heads: torch.Tensor,
    gate: torch.Tensor,
    expert_bias: torch.Tensor | None,
    top_k: int,
    *,
    route_norm: bool = True,
    route_scale: float = 1.0,
    norm_eps: float = 1e-12,
    platform: Platform | None = None,
) -> Routes:
    """Sigmoid head routing of ``x_heads[T, H, D]`` with ``gate[H, E, D]`` (fp32) and ``expert_bias[H, E]``."""

    platform = platform or current_platform()
    heads, num_experts, _ = gate.shape
    if not platform.triton:
        probs, ids = reference_topk(
            x_heads, gate, expert_bias, top_k, route_norm=route_norm, route_scale=route_scale, norm_eps=norm_eps
        )
        return reference_csr(probs, ids, num_experts)
    from . import routing_triton

    topk_ids, topk_probs, keys = routing_triton.topk(
        x_heads, gate, expert_bias, top_k, route_norm=route_norm, route_scale=route_scale, norm_eps=norm_eps,
        dot_precision=platform.dot_precision,
    )
    sorted_keys, order = torch.sort(keys, stable=True)
    bounds = torch.arange(heads * num_experts + 1, device=gate.device, dtype=sorted_keys.dtype)
    offsets = torch.searchsorted(sorted_keys, bounds, out_int32=True)
    gather_ids, probs, slots = routing_triton.finalize(order, topk_probs, x_heads.shape[0], top_k)
    return Routes(gather_ids, probs, offsets, slots.view(heads, x_heads.shape[0], top_k), topk_ids, topk_probs)
