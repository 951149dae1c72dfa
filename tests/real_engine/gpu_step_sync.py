"""GPU check of the plugin's step timing: events per step, no host sync inside the loop.

Run on a CUDA machine: ``python tests/real_engine/gpu_step_sync.py OUT_DIR``. The device
machine cannot import vLLM-Omni (vLLM's dependency closure does not fit the carry limit), so
the hooks are installed with ``install_step_hooks(SamplerShapedLoop)``: a loop with
upstream's per-step method names and call order (prepare_model_input -> forward -> step)
doing real GPU work. It measures our hooks, not upstream's sampler. Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


class SamplerShapedLoop:
    """Upstream's loop structure (Magi2PreviewSampler.sample) over a few bf16 matmuls."""

    def __init__(self, weight):
        self.weight = weight

    def sample(self, sampler_input):
        latent = sampler_input.latent
        for t in sampler_input.video_t_list:
            x = self.prepare_model_input(latent, t)
            latent = self.step(x @ self.weight, latent, t)
        return latent

    def prepare_model_input(self, latent, t):
        return (latent * t).tanh()

    def step(self, prediction, latent, t):
        return latent - 0.01 * prediction

    @staticmethod
    def _step_guided(prediction, latent, t):
        return latent - 0.01 * prediction


def main(out_dir: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from magi2studio import plugin
    from magi2studio.engines import timing

    class MarkedTimer(plugin.WorkerStepTimer):
        """The plugin's timer, with its after-the-loop read marked in the profile."""

        def end_sample(self):
            with torch.profiler.record_function("magi2studio.end_sample"):
                return super().end_sample()

    timing.install_step_hooks(SamplerShapedLoop)
    timing.set_process_timer(MarkedTimer(Path(out_dir), "preview", None))
    steps = 12
    weight = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64

    class Input:
        latent = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        video_t_list = [torch.tensor(1.0 - i / steps, device="cuda", dtype=torch.bfloat16) for i in range(steps)]

    loop = SamplerShapedLoop(weight)
    loop.sample(Input)  # warm-up: cuBLAS handles, allocator
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        loop.sample(Input)
    events = prof.events()
    (after_loop,) = [e for e in events if e.name == "magi2studio.end_sample"]
    sync_names = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
    syncs = [e for e in events if e.name in sync_names]

    def in_end_sample(event) -> bool:
        return after_loop.time_range.start <= event.time_range.start <= after_loop.time_range.end

    runtime_names = sorted({e.name for e in events if e.name.startswith("cuda")})
    rows = timing.read_jsonl(Path(out_dir) / "steps-rank0.jsonl")
    print(json.dumps({
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "steps": steps,
        "event_records": sum(1 for e in events if "EventRecord" in e.name),
        "syncs_in_loop": [e.name for e in syncs if e.time_range.start < after_loop.time_range.start],
        "syncs_in_end_sample": [e.name for e in syncs if in_end_sample(e)],
        "syncs_after_sample": [e.name for e in syncs if e.time_range.start > after_loop.time_range.end],
        "cuda_runtime_calls_seen": runtime_names,
        "steps_jsonl_rows_per_sample": len(rows) // 2,
        "ms_per_step_last_sample": [round(r["ms"], 3) for r in rows[steps:]],
    }))


if __name__ == "__main__":
    main(sys.argv[1])
