"""The GPU training path's two pieces, checked on the CPU (the GPU run is in docs/performance.md)."""

import torch

from magi2studio.training.on_device import (batch_to, dense_mh_moe, differentiable_upstream_paths,
                                            padded_attention_with_sink)


def test_the_patched_cuda_paths_are_upstreams_torch_paths_with_gradients():
    """On CUDA upstream calls ``triton_mh_moe_forward`` and ``packed_attention_with_sink``'s FlashAttention
    branch (no backward); inside the context both names give upstream's CPU results and gradients."""

    from vllm_omni.diffusion.models.magi2 import attention, mh_moe

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(7, 4, 16, generator=generator) for _ in range(3))
    sink = torch.randn(1, 4, generator=generator, requires_grad=True)
    varlen = attention.VarlenHandler(torch.tensor([0, 3, 7], dtype=torch.int32),
                                     torch.tensor([0, 3, 7], dtype=torch.int32))
    expected = attention.torch_varlen_attention_with_sink(q, k, v, cu_seqlens_q=varlen.cu_seqlens_q,
                                                          cu_seqlens_k=varlen.cu_seqlens_k, sink=sink)
    original_moe = mh_moe.triton_mh_moe_forward
    with differentiable_upstream_paths():
        got = attention.packed_attention_with_sink(q, k, v, varlen, sink=sink)
        assert mh_moe.triton_mh_moe_forward is not original_moe
    assert mh_moe.triton_mh_moe_forward is original_moe  # restored
    assert torch.equal(got, expected)
    got.sum().backward()
    assert sink.grad is not None and sink.grad.abs().sum() > 0

    heads, tokens, experts, top_k, d_head, d_expert = 2, 5, 4, 2, 8, 6
    x = torch.randn(tokens, heads, d_head, generator=generator)
    logits = torch.randn(heads, tokens, experts, generator=generator)
    probs, indices = torch.softmax(logits, -1).topk(top_k, dim=-1)
    gather_ids, sorted_probs, offsets = mh_moe.global_sort_routes(probs, indices, experts)
    weights = [torch.randn(heads * experts, *shape, generator=generator) * 0.1
               for shape in ((d_head, d_expert), (d_head, d_expert), (d_expert, d_head))]
    reference = mh_moe.torch_mh_moe_forward(x, gather_ids, sorted_probs, offsets, *weights)  # upstream's W layout
    with differentiable_upstream_paths():
        routed = mh_moe.triton_mh_moe_forward(x, gather_ids, sorted_probs, offsets, *weights, deterministic=True)
    assert torch.equal(routed, reference)


def _grads(function, inputs):
    inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    output = function(*inputs)
    (output * torch.linspace(-1, 1, output.numel()).view_as(output)).sum().backward()
    return output.detach(), [t.grad for t in inputs]


def test_the_gpus_batched_moe_and_attention_are_upstreams_loops_values_and_gradients():
    """The GPU's sync-free forms (every expert dense, sequences padded) give upstream's loops' outputs and
    gradients to float rounding: unequal sequences, GQA, softcap and the sink; routes with idle experts.
    A wrong routing index (the probabilities of the next expert) or a missing key mask would not."""

    from vllm_omni.diffusion.models.magi2 import attention, mh_moe

    generator = torch.Generator().manual_seed(1)
    cu = torch.tensor([0, 5, 6, 13, 21], dtype=torch.int32)  # lengths 5, 1, 7, 8
    q = torch.randn(21, 4, 8, generator=generator)
    k, v = (torch.randn(21, 2, 8, generator=generator) for _ in range(2))
    sink = torch.randn(1, 4, generator=generator)
    for softcap in (-1.0, 3.0):
        def loop(q, k, v, sink):
            return attention.torch_varlen_attention_with_sink(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                              softcap=softcap, sink=sink)

        def padded(q, k, v, sink):
            return padded_attention_with_sink(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, softcap=softcap, sink=sink)

        want, want_grads = _grads(loop, [q, k, v, sink])
        got, got_grads = _grads(padded, [q, k, v, sink])
        assert torch.allclose(got, want, atol=1e-5)
        for g, w in zip(got_grads, want_grads, strict=True):
            assert torch.allclose(g, w, atol=1e-5)

    heads, tokens, experts, top_k, d_head, d_expert = 3, 11, 4, 2, 8, 6
    x = torch.randn(tokens, heads, d_head, generator=generator)
    logits = torch.randn(heads, tokens, experts, generator=generator)
    logits[1, :, 3] = -9.0  # head 1's expert 3 gets no token
    probs, indices = torch.softmax(logits, -1).topk(top_k, dim=-1)
    gather_ids, sorted_probs, offsets = mh_moe.global_sort_routes(probs, indices, experts)
    weights = [torch.randn(heads * experts, *shape, generator=generator) * 0.5
               for shape in ((d_head, d_expert), (d_head, d_expert), (d_expert, d_head))]

    def routed(forward, offsets):
        return lambda x, p, *w: forward(x, gather_ids, p, offsets, *w)

    want, want_grads = _grads(routed(mh_moe.torch_mh_moe_forward, offsets), [x, sorted_probs, *weights])
    got, got_grads = _grads(routed(dense_mh_moe, offsets), [x, sorted_probs, *weights])
    assert torch.allclose(got, want, atol=1e-5)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert torch.allclose(g, w, atol=1e-5)
    shifted = offsets.clone()
    shifted[1:-1] += 1  # every slot read as the wrong expert's at a boundary
    assert not torch.allclose(dense_mh_moe(x, gather_ids, sorted_probs, shifted, *weights), want, atol=1e-3)


def test_every_tensor_of_a_batch_moves_and_the_cpus_batch_stays_as_it_is():
    from vllm_omni.diffusion.models.magi2.preview_data_proxy import ModelInput

    model_input = ModelInput(x_t=torch.zeros(1, 2), audio_x_t=torch.zeros(1, 2), audio_feat_len=[2],
                             txt_feat=torch.zeros(1, 3, 4), txt_feat_len=torch.tensor([3]), t=torch.zeros(1),
                             ref_image_feat=torch.zeros(1, 1, 2, 1, 2, 2))
    batch = (model_input, torch.zeros(2), torch.ones(2))
    assert batch_to(batch, torch.device("cpu")) is batch
    moved, *rest = batch_to(batch, torch.device("meta"))
    tensors = [getattr(moved, name) for name in vars(moved) if isinstance(getattr(moved, name), torch.Tensor)]
    assert len(tensors) == 6 and all(t.device.type == "meta" for t in [*tensors, *rest])
    assert moved.audio_feat_len == [2] and model_input.x_t.device.type == "cpu"


def test_a_device_it_cannot_train_on_is_one_line_and_writes_nothing(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "train_tiny.py"
    for device, words in (("foo", "is not a device this trains on"), ("cuda:7", "cuda")):
        if device.startswith("cuda") and torch.cuda.device_count() > 7:
            continue
        done = subprocess.run([sys.executable, str(script), "--work", str(tmp_path / "work"), "--phase", "dit",
                               "--device", device], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("train_tiny.py: error: --device:") and words in last and "Traceback" not in done.stderr
        assert not (tmp_path / "work").exists()


def test_resume_without_a_saved_state_a_bad_stop_after_or_noise_shift_are_one_line_each_and_write_nothing(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "train_tiny.py"
    for extra, words in ((["--resume"], "--resume:"), (["--stop-after", "0"], "--stop-after:"),
                         (["--noise-shift", "0"], "--noise-shift:"), (["--noise-shift", "nan"], "--noise-shift:")):
        done = subprocess.run([sys.executable, str(script), "--work", str(tmp_path / "work"), "--phase", "dit",
                               *extra], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(f"train_tiny.py: error: {words}") and "Traceback" not in done.stderr, done.stderr
        assert not (tmp_path / "work").exists()
