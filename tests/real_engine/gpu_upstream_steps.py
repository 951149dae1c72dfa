"""GPU check: upstream's MAGI-2 sampler with the plugin loaded the way vLLM-Omni loads it.

Run on a CUDA machine with vLLM-Omni importable: ``python tests/real_engine/gpu_upstream_steps.py OUT_DIR``.
``load_omni_general_plugins()`` (vLLM-Omni's own loader, as every diffusion worker calls it)
finds magi2studio's ``vllm.general_plugins`` entry point, which installs the step hooks on
upstream's ``Magi2PreviewSampler`` and the kernels ``MAGI2_KERNELS`` names. The embedded
engine's tiny MAGI-2 (upstream's transformer, data proxy and sampler) then samples on the GPU
under NCCL world 1, profiled twice: with the plugin's timer and with no timer. Host syncs
inside the loop that appear only with the timer would be ours; upstream's own (``.item()``
in its varlen attention) appear in both. Prints one JSON line.

Only vLLM's and vLLM-Omni's Python files travel to the device (their compiled extensions do
not), so upstream's CUDA branch of ``packed_attention_with_sink`` (vLLM's bundled
FlashAttention) cannot load; ``use_upstream_torch_attention`` routes it to upstream's own
``torch_varlen_attention_with_sink``, the path it takes for CPU tensors. The MoE runs
upstream's Triton kernels (kernels off) or ours (kernels on).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SYNC_NAMES = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def use_upstream_torch_attention() -> None:
    import torch
    from vllm_omni.diffusion.models.magi2 import attention

    def packed_attention_with_sink(q, k, v, varlen, *, softcap=-1.0, sink=None):
        cu_q, cu_k, _, _ = varlen.resolved(q.shape[0], k.shape[0])
        return attention.torch_varlen_attention_with_sink(
            q, k, v, cu_seqlens_q=cu_q.to("cpu", torch.int32),
            cu_seqlens_k=cu_k.to("cpu", torch.int32), softcap=softcap, sink=sink)

    attention.packed_attention_with_sink = packed_attention_with_sink


def main(out_dir: str) -> None:
    metrics = Path(out_dir) / f"metrics-kernels-{os.environ.get('MAGI2_KERNELS', 'off')}"
    os.environ["MAGI2STUDIO_METRICS_DIR"] = str(metrics)
    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm_omni.plugins import load_omni_general_plugins

    load_omni_general_plugins()
    from magi2studio import plugin
    from magi2studio.engines import timing
    from magi2studio.engines.embedded import upstream_patches
    from magi2studio.engines.embedded.checkpoint import ensure_checkpoint
    from magi2studio.engines.embedded.components import load_components
    from magi2studio.engines.embedded.driver import EmbeddedDriver
    from magi2studio.engines.embedded.tiny import TinyConfig
    from magi2studio.vocabulary.request import build_request
    from magi2studio.vocabulary.tiers import get_tier

    use_upstream_torch_attention()
    state = plugin.register()  # idempotent: returns what the entry point already installed
    assert state["timer"] is not None, "the entry point did not run: no process timer"
    torch.cuda.set_device(0)
    upstream_patches.init_parallel(world_size=1, rank=0, port=upstream_patches.free_port(), ulysses_degree=1,
                                   cfg_parallel_size=1, backend="nccl")
    device = torch.device("cuda", 0)
    driver = EmbeddedDriver(load_components(ensure_checkpoint(TinyConfig())), device=device)
    steps = 8
    request = build_request(prompt="a red kite over a windy beach, waves and gulls", steps=steps, seed=7)
    tier = get_tier(request.tier)
    upstream_patches.set_deterministic(False)  # fp32 products, as the real pipeline runs
    driver.run(request, tier, steps)  # warm-up
    torch.cuda.synchronize()

    timer = state["timer"]
    read_events = timer.end_sample

    def marked_end_sample():
        with torch.profiler.record_function("magi2studio.end_sample"):
            return read_events()

    timer.end_sample = marked_end_sample

    def profiled(timer) -> dict:
        timing.set_process_timer(timer)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with torch.profiler.record_function("magi2studio.sampling"):
                out = driver.run(request, tier, steps)
        events = prof.events()
        sampling = [e for e in events if e.name == "magi2studio.sampling"][0]
        syncs = [e for e in events if e.name in SYNC_NAMES]
        reads = [e for e in events if e.name == "magi2studio.end_sample"]

        def in_read(event) -> bool:
            return any(r.time_range.start <= event.time_range.start <= r.time_range.end for r in reads)

        return {"syncs": {name: sum(1 for e in syncs if e.name == name) for name in SYNC_NAMES},
                "syncs_in_timer_read_after_loop": sum(1 for e in syncs if in_read(e)),
                "event_records": sum(1 for e in events if e.name.startswith("cudaEventRecord")),
                "event_api_names": sorted({e.name for e in events if e.name.startswith("cudaEvent")}),
                "dtoh_copies": sum(1 for e in events if "Memcpy DtoH" in e.name),
                "frames_shape": list(out.frames.shape), "preview_ms": round(out.stage_ms.get("preview", 0.0), 2),
                "sampling_ms": round(sampling.cpu_time_total / 1000, 2)}

    with_timer = profiled(timer)
    without_timer = profiled(None)
    rows = timing.read_jsonl(plugin.steps_file(metrics, 0))
    print(json.dumps({
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "vllm_omni_sampler": state["sampler"], "kernels": state["kernels"],
        "steps": steps, "with_timer": with_timer, "without_timer": without_timer,
        "syncs_added_by_timer": {k: with_timer["syncs"][k] - without_timer["syncs"][k] for k in SYNC_NAMES},
        "syncs_added_inside_loop": sum(with_timer["syncs"].values()) - sum(without_timer["syncs"].values())
        - with_timer["syncs_in_timer_read_after_loop"],
        "event_records_added_by_timer": with_timer["event_records"] - without_timer["event_records"],
        "steps_jsonl_rows": len(rows), "ms_per_step_profiled_run": [round(r["ms"], 3) for r in rows[-steps:]],
    }))


if __name__ == "__main__":
    main(sys.argv[1])
