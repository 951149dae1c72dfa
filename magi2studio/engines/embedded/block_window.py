"""Block-window local attention for the MAGI-2 refiner, and the refiner DiT that uses it.

vLLM-Omni 0.30.0 has no refiner (upstream PR #8915), so this is our reading of Sand AI's
``magi2_refiner.json`` ``attn_config`` (the reading: docs/engines.md, "Block-window attention").
:func:`block_window_attention` gathers each query block's key box and computes only that;
:func:`reference_mask` + :func:`masked_dense_attention` are the explicit-mask oracle it is
tested against (``tests/refiner/test_block_window.py``).

Just over 300 lines on purpose: the gathered attention and the explicit-mask oracle it is
tested against stand side by side, and the refiner DiT that uses it is built here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

VIDEO = 0  # upstream's Modality.VIDEO
BLOCK_CHUNK = 64  # query blocks per batched gather (bounds the score buffer)


@dataclass(frozen=True)
class BlockWindow:
    """Block sizes and radii in latent tokens; defaults are Sand AI's refiner config."""

    block_t: int = 8
    block_h: int = 4
    block_w: int = 4
    radius_t: int = 2
    radius_h: int = 2
    radius_w: int = 2

    @classmethod
    def from_sandai(cls, attn_config: dict) -> BlockWindow:
        """Read ``magi2_refiner_data_proxy_config.attn_config``; refuse what we do not model."""

        window = attn_config["window"]
        expected = {"mode": attn_config.get("mode"), "level": window.get("level"),
                    "block_mode": window.get("block_mode"),
                    "frame_receptive_field": window.get("frame_receptive_field"),
                    "full_attn_layers": window.get("full_attn_layers")}
        if expected != {"mode": "window", "level": "block", "block_mode": "grid", "frame_receptive_field": -1,
                        "full_attn_layers": []}:
            raise ValueError(f"unsupported refiner attention config {expected}")
        return cls(attn_config["block_t_size"], attn_config["block_size"], attn_config["block_size"],
                   window["block_t_radius"], window["block_h_radius"], window["block_w_radius"])


@dataclass(frozen=True)
class _Sample:
    start: int
    end: int
    grid: tuple[int, int, int]  # (T, H, W) of the clip; its tokens are start .. start + T*H*W


@dataclass(frozen=True)
class _Chunk:
    """Query blocks of one sample: query/key indices padded to the chunk's longest (+ valid)."""

    q_idx: torch.Tensor  # [B, Qmax]
    q_ok: torch.Tensor
    k_idx: torch.Tensor  # [B, Kmax] grid keys in each block's window
    k_ok: torch.Tensor
    global_keys: tuple[int, int]  # the sample's text/audio tokens, a contiguous range

    def to(self, device: torch.device) -> _Chunk:
        return _Chunk(self.q_idx.to(device), self.q_ok.to(device), self.k_idx.to(device), self.k_ok.to(device),
                      self.global_keys)


@dataclass(frozen=True)
class WindowLayout:
    """Where the grid and global tokens of each packed sample are, and the block gathers."""

    samples: tuple[_Sample, ...]
    window: BlockWindow
    chunks: tuple[_Chunk, ...]
    global_queries: tuple[tuple[torch.Tensor, int, int], ...]  # (indices, sample start, sample end)

    @classmethod
    def build(cls, coords: torch.Tensor, modality: torch.Tensor, cu_seqlens: torch.Tensor,
              window: BlockWindow) -> WindowLayout:
        bounds = [int(v) for v in cu_seqlens.detach().cpu().tolist()]
        coords = coords.detach().cpu()
        modality = modality.detach().cpu()
        samples = []
        for start, end in zip(bounds[:-1], bounds[1:]):
            grid = tuple(int(v) for v in coords[start, 3:6].tolist())
            count = math.prod(grid)
            _check_grid(coords[start:start + count], modality[start:start + count], grid, start)
            samples.append(_Sample(start, end, grid))
        chunks = []
        global_queries = []
        for sample in samples:
            blocks = _sample_blocks(sample, window)
            grid_end = sample.start + math.prod(sample.grid)
            chunks.extend(_pad_chunk(blocks[i:i + BLOCK_CHUNK], (grid_end, sample.end))
                          for i in range(0, len(blocks), BLOCK_CHUNK))
            if grid_end < sample.end:
                global_queries.append((torch.arange(grid_end, sample.end), sample.start, sample.end))
        return cls(tuple(samples), window, tuple(chunks), tuple(global_queries))

    def to(self, device: torch.device) -> WindowLayout:
        queries = tuple((idx.to(device), s, e) for idx, s, e in self.global_queries)
        return WindowLayout(self.samples, self.window, tuple(c.to(device) for c in self.chunks), queries)


def _check_grid(coords: torch.Tensor, modality: torch.Tensor, grid: tuple[int, int, int], start: int) -> None:
    """The sample must open with its clip's video tokens in row-major (t, h, w) order."""

    t, h, w = grid
    expected = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"),
                           dim=-1).reshape(-1, 3).to(coords.dtype)
    if coords.shape[0] != expected.shape[0] or not torch.equal(coords[:, :3], expected) \
            or not bool((modality == VIDEO).all()):
        raise ValueError(f"packed sample at token {start} does not open with its {t}x{h}x{w} video grid")


def _axis_ranges(size: int, block: int, radius: int) -> list[tuple[int, int, int, int]]:
    """Per block along one axis: (query lo, query hi, key lo, key hi) token bounds."""

    count = -(-size // block)
    return [(i * block, min(size, (i + 1) * block),
             max(0, (i - radius) * block), min(size, (i + radius + 1) * block)) for i in range(count)]


def _sample_blocks(sample: _Sample, window: BlockWindow) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(query indices, windowed grid key indices) per query block of one sample."""

    t, h, w = sample.grid
    grid_index = torch.arange(t * h * w).reshape(t, h, w) + sample.start
    blocks = []
    for q_t0, q_t1, k_t0, k_t1 in _axis_ranges(t, window.block_t, window.radius_t):
        for q_h0, q_h1, k_h0, k_h1 in _axis_ranges(h, window.block_h, window.radius_h):
            for q_w0, q_w1, k_w0, k_w1 in _axis_ranges(w, window.block_w, window.radius_w):
                blocks.append((grid_index[q_t0:q_t1, q_h0:q_h1, q_w0:q_w1].reshape(-1),
                               grid_index[k_t0:k_t1, k_h0:k_h1, k_w0:k_w1].reshape(-1)))
    return blocks


def _pad_chunk(blocks: list[tuple[torch.Tensor, torch.Tensor]], global_keys: tuple[int, int]) -> _Chunk:
    q_max = max(q.numel() for q, _ in blocks)
    k_max = max(k.numel() for _, k in blocks)
    q_idx = torch.zeros(len(blocks), q_max, dtype=torch.long)
    k_idx = torch.zeros(len(blocks), k_max, dtype=torch.long)
    q_ok = torch.zeros(len(blocks), q_max, dtype=torch.bool)
    k_ok = torch.zeros(len(blocks), k_max, dtype=torch.bool)
    for row, (queries, keys) in enumerate(blocks):
        q_idx[row, :queries.numel()], q_ok[row, :queries.numel()] = queries, True
        k_idx[row, :keys.numel()], k_ok[row, :keys.numel()] = keys, True
    return _Chunk(q_idx, q_ok, k_idx, k_ok, global_keys)


def _softmax_with_sink(scores: torch.Tensor, sink: torch.Tensor | None) -> torch.Tensor:
    """Softmax over keys plus the zero-value sink logits (sink [S, H]; scores [..., H, Q, K])."""

    if sink is None or sink.numel() == 0:
        return torch.softmax(scores, dim=-1)
    sink_scores = sink.float().transpose(0, 1)[:, None, :].expand(*scores.shape[:-1], sink.shape[0])
    return torch.softmax(torch.cat((scores, sink_scores), dim=-1), dim=-1)[..., : scores.shape[-1]]


def block_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: WindowLayout,
                           sink: torch.Tensor | None = None) -> torch.Tensor:
    """q [N, H, D], k/v [N, Hkv, D] (GQA: query head i uses KV head i // (H / Hkv)).

    Per chunk of query blocks: gather each block's windowed grid keys, score them and the
    sample's global keys (a shared slice, not gathered), one softmax over both plus the
    sink, then both value products. Heads are the outer batch so every matmul is contiguous.
    """

    n, heads, dim = q.shape
    kv_heads = k.shape[1]
    rep = heads // kv_heads
    scale = dim ** -0.5
    qt = q.float().view(n, kv_heads, rep, dim).permute(1, 0, 2, 3).contiguous()  # [G, N, rep, D]
    kt = k.float().permute(1, 0, 2).contiguous()  # [G, N, D]
    vt = v.float().permute(1, 0, 2).contiguous()
    sinks = None
    if sink is not None and sink.numel():
        sinks = torch.logsumexp(sink.float(), dim=0).view(kv_heads, 1, 1, rep)  # one logit per query head
    output = torch.zeros_like(q)
    for chunk in layout.chunks:
        blocks, q_max = chunk.q_idx.shape
        g0, g1 = chunk.global_keys
        qb = qt[:, chunk.q_idx].reshape(kv_heads, blocks, q_max * rep, dim)  # rows are (query, rep)
        kb, vb = kt[:, chunk.k_idx], vt[:, chunk.k_idx]  # [G, B, K, D]
        windowed = torch.matmul(qb, kb.transpose(-1, -2)).mul_(scale)
        windowed.masked_fill_(~chunk.k_ok[None, :, None, :], float("-inf"))
        scores = torch.cat((windowed, torch.matmul(qb, kt[:, None, g0:g1].transpose(-1, -2)).mul_(scale)), dim=-1)
        top = scores.amax(dim=-1, keepdim=True)
        if sinks is not None:
            sink_rows = sinks.expand(kv_heads, 1, q_max, rep).reshape(kv_heads, 1, q_max * rep, 1)
            top = torch.maximum(top, sink_rows)
        scores.sub_(top).exp_()
        denom = scores.sum(dim=-1, keepdim=True)
        if sinks is not None:
            denom.add_((sink_rows - top).exp_())
        scores.div_(denom)
        kw = kb.shape[2]
        out = torch.matmul(scores[..., :kw], vb).add_(torch.matmul(scores[..., kw:], vt[:, None, g0:g1]))
        out = out.view(kv_heads, blocks, q_max, rep, dim).permute(1, 2, 0, 3, 4).reshape(blocks * q_max, heads, dim)
        valid = chunk.q_ok.reshape(-1)
        output.index_copy_(0, chunk.q_idx.reshape(-1)[valid], out[valid].to(output.dtype))
    if layout.global_queries:
        from vllm_omni.diffusion.models.magi2.attention import torch_varlen_attention_with_sink

        for idx, start, end in layout.global_queries:
            rows = torch_varlen_attention_with_sink(
                q[idx], k[start:end], v[start:end],
                cu_seqlens_q=torch.tensor([0, idx.numel()], dtype=torch.int32),
                cu_seqlens_k=torch.tensor([0, end - start], dtype=torch.int32), sink=sink)
            output.index_copy_(0, idx, rows)
    return output


# -- the oracle: an explicit boolean mask and dense softmax attention ------------------------
def reference_mask(coords: torch.Tensor, modality: torch.Tensor, cu_seqlens: torch.Tensor,
                   window: BlockWindow) -> torch.Tensor:
    """[N, N] bool, by definition from each token's own coordinates (no packing order used)."""

    n = coords.shape[0]
    bounds = cu_seqlens.detach().cpu().long()
    sample = torch.bucketize(torch.arange(n), bounds[1:], right=True)
    position, shape = coords[:, :3], coords[:, 3:6]
    on_grid = (modality == VIDEO) & (position >= 0).all(-1) & (position < shape).all(-1)
    block = torch.div(position, torch.tensor([window.block_t, window.block_h, window.block_w],
                                              dtype=position.dtype), rounding_mode="floor")
    radius = torch.tensor([window.radius_t, window.radius_h, window.radius_w], dtype=position.dtype)
    near = ((block[:, None, :] - block[None, :, :]).abs() <= radius).all(-1)
    same = sample[:, None] == sample[None, :]
    return same & (near | ~on_grid[:, None] | ~on_grid[None, :])


def masked_dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                           sink: torch.Tensor | None = None) -> torch.Tensor:
    heads = q.shape[1]
    k = k.repeat_interleave(heads // k.shape[1], dim=1).float()
    v = v.repeat_interleave(heads // v.shape[1], dim=1).float()
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", _softmax_with_sink(scores, sink), v).to(q.dtype)


# -- the refiner DiT -----------------------------------------------------------------------------
class _LayoutSlot:
    """The current forward's layout, shared by the local layers' kernels."""

    layout: WindowLayout | None = None


class BlockWindowAttentionKernel(nn.Module):
    """A custom kernel for upstream's ``Attention`` layer: Ulysses exchange, then the window."""

    def __init__(self, slot: _LayoutSlot) -> None:
        super().__init__()
        self.slot = slot

    def forward(self, query, key, value, attn_metadata=None):
        from vllm_omni.diffusion.models.magi2.parallel import (
            get_magi2_ulysses_group,
            scatter_heads_gather_seqlen,
            scatter_seqlen_gather_heads,
        )

        split_sizes = attn_metadata.extra["magi2_split_sizes"]
        sink = attn_metadata.extra.get("magi2_sink")
        if isinstance(split_sizes, torch.Tensor):
            split_sizes = [int(v) for v in split_sizes.detach().cpu().tolist()]
        group = get_magi2_ulysses_group()
        if group.world_size > 1:  # heads split, full sequence: the window needs every position
            query, key, value = scatter_heads_gather_seqlen((query, key, value), split_sizes, group)
            if sink is not None:
                sink = torch.chunk(sink, group.world_size, dim=-1)[group.rank].contiguous()
        output = block_window_attention(query, key, value, self.slot.layout, sink)
        if group.world_size > 1:
            output = scatter_seqlen_gather_heads(output.contiguous(), split_sizes, group)
        return output


def make_refiner_transformer(config, window: BlockWindow, local_layers: tuple[int, ...]) -> nn.Module:
    """Upstream's ``Magi2PreviewTransformer`` at a dense config, with windowed local layers."""

    from vllm_omni.diffusion.attention.layer import Attention
    from vllm_omni.diffusion.models.magi2.modeling_magi2 import Magi2PreviewTransformer

    class Magi2RefinerTransformer(Magi2PreviewTransformer):
        """Builds the window layout from the full (pre-dispatch) packing, then runs upstream's forward."""

        def forward(self, x, coords_mapping, modality_mapping, varlen_handler, time_token_sequence=None):
            layout = WindowLayout.build(coords_mapping, modality_mapping, varlen_handler.cu_seqlens_q, window)
            self._window_slot.layout = layout.to(x.device)
            try:
                return super().forward(x, coords_mapping, modality_mapping, varlen_handler, time_token_sequence)
            finally:
                self._window_slot.layout = None

    model = Magi2RefinerTransformer(config)
    model._window_slot = _LayoutSlot()
    model.window = window
    for index in local_layers:
        attention = model.block.layers[index].attention
        attention.packed_attention = Attention(
            num_heads=attention.num_heads_q, num_kv_heads=attention.num_heads_kv, head_size=attention.head_dim,
            causal=False, softmax_scale=attention.head_dim ** -0.5, qkv_layout="THD", skip_sequence_parallel=True,
            disable_kv_quant=True, custom_attention=BlockWindowAttentionKernel(model._window_slot))
    return model
