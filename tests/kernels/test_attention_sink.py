"""Attention sink + gate (Triton, interpreter) and the CPU reference attention.

Bounds (||out - ref|| / ||ref||): fp32 <= 1e-6; the reference attention + sink vs vLLM-Omni's
torch attention-with-sink <= 1e-6.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import rel_err

from magi2_kernels import attention_sink


def qkv(gen, tokens, heads, kv_heads, dim):
    return (torch.randn(tokens, heads, dim, generator=gen), torch.randn(tokens, kv_heads, dim, generator=gen),
            torch.randn(tokens, kv_heads, dim, generator=gen))


@pytest.mark.parametrize("softcap", [-1.0, 20.0])
def test_reference_attention_plus_sink_matches_vllm_omni(gen, softcap):
    attention = pytest.importorskip("vllm_omni.diffusion.models.magi2.attention")
    q, k, v = qkv(gen, 29, 4, 2, 16)
    cu = torch.tensor([0, 11, 29], dtype=torch.int32)
    sink = torch.randn(2, 4, generator=gen)
    expected = attention.torch_varlen_attention_with_sink(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                          softcap=softcap, sink=sink)
    out, lse = attention_sink.reference_varlen_attention(q, k, v, cu, cu, softcap=softcap)
    assert rel_err(attention_sink.sink_gate(out, lse, sink, None), expected) <= 1e-6
    corrected, _ = attention.correct_out_lse_with_sink(out, lse, sink)
    assert rel_err(attention_sink.sink_gate(out, lse, sink, None), corrected) <= 1e-6


@pytest.mark.parametrize("dim", [16, 200])  # 200: two channel blocks, the second partial
def test_sink_gate_one_pass_matches_fp64(gen, poison, dim):
    tokens, heads = 37, 3
    out = torch.randn(tokens, heads, dim, generator=gen)
    lse = torch.randn(heads, tokens, generator=gen) * 2
    lse[1, 4] = float("-inf")  # a row that attended to nothing
    sink = torch.randn(5, heads, generator=gen)
    gates = torch.randn(tokens, heads, 1, generator=gen)
    rows = torch.randperm(tokens, generator=gen)
    got = attention_sink.sink_gate(out, lse.t().contiguous().t(), sink, gates, rows, out_dtype=torch.float16)
    ref = attention_sink.reference_sink_gate(out.double(), lse.double(), sink.double(), gates.double(), rows)
    assert got.dtype == torch.float16 and rel_err(got, ref) <= 1e-3
    got32 = attention_sink.sink_gate(out, lse, sink, gates, rows)
    assert rel_err(got32, ref) <= 1e-6
    assert torch.equal(got32[(rows == 4).nonzero()[0, 0], 1], torch.zeros(dim))


def test_gate_only_and_sink_only(gen, poison):
    out = torch.randn(21, 2, 32, generator=gen)
    gates = torch.randn(21, 2, generator=gen)
    ref = out.double() * torch.sigmoid(gates.double())[..., None]
    assert rel_err(attention_sink.sink_gate(out, None, None, gates), ref) <= 1e-6
    lse = torch.randn(2, 21, generator=gen)
    sink = torch.randn(1, 2, generator=gen)
    ref = attention_sink.reference_sink_gate(out.double(), lse.double(), sink.double(), None)
    assert rel_err(attention_sink.sink_gate(out, lse, sink, None), ref) <= 1e-6
