#!/usr/bin/env python3
"""The live preview's cost per step, against preview off. One JSON object on stdout.

    .venv/bin/python scripts/bench_preview.py --device cpu  --steps 20 --repeats 3
    python scripts/bench_preview.py --device cuda --steps 50 --out bench-preview.json

``--device cpu``: the embedded engine (trained tiny weights, 272p, sp1-cfg1, one spawned rank)
runs the same request with the preview off, every ``steps // 10`` steps (the default) and every
step, alternating ``--repeats`` times so that drift on a shared machine hits all three alike.
Per run: the sampling stage's wall time per step (the driver's ``stage_ms["preview"]``: the hooks
and the preview included); per setting the median over repeats; ``ratio`` = preview / off. Not the
step records' gate: the preview runs between one step's end mark and the next one's start mark.

``--device cuda`` (no vLLM-Omni needed; the device machine cannot import it): the real hooks
(``timing.install_step_hooks``) on a loop with upstream's per-step method names and order whose
step is ``--matmuls`` bf16 4096² matmuls, and whose ``step`` leaves the x0 estimate where
upstream's scheduler does (``model_outputs[-1]``) at the real 272p latent's shape
(``[1, 48, 32, 17, 30]``, bf16) under the committed 48-channel map. Step time: the sample's wall
time (synchronized before and after) over its steps. The host syncs inside the loop are counted with ``torch.profiler``
(``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def machine(device: str) -> dict:
    import torch

    info = {"device": device, "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "load_average": round(os.getloadavg()[0], 2), "torch": torch.__version__}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def bench_cpu(steps: int, repeats: int) -> dict:
    from magi2studio.engines.embedded.engine import EmbeddedEngine
    from magi2studio.engines.live_preview import default_every
    from magi2studio.vocabulary.layouts import parse_layout
    from magi2studio.vocabulary.request import build_request

    layout = parse_layout("sp1-cfg1")
    engine = EmbeddedEngine(weights="trained")
    engine.start(layout)
    settings = {"off": 0, "default": default_every(steps), "every_step": 1}
    gates: dict[str, list[float]] = {name: [] for name in settings}
    previews: dict[str, int] = {}
    try:
        for _ in range(repeats):
            for name, every in settings.items():
                request = build_request(prompt="a red ball bounces left to right on a blue floor", seed=7,
                                        steps=steps, preview_every=every)
                count = [0]
                generation = engine.generate(engine.plan(request, layout),
                                             on_progress=lambda e: count.__setitem__(0, count[0] + bool(e.preview)))
                # The sampling stage's wall time a step: the preview runs between a step's end mark and
                # the next one's start mark, so the step records (the gate) would not see it.
                gates[name].append(generation.stage_ms["preview"] / steps)
                previews[name] = count[0]
    finally:
        engine.close()
    if not previews["default"] or previews["off"]:
        raise SystemExit(f"the preview was not on and off as asked ({previews} pictures a run): nothing measured")
    off = statistics.median(gates["off"])
    return {
        "inputs": {"engine": "embedded, trained tiny weights", "tier": "272p", "layout": "sp1-cfg1", "steps": steps,
                   "repeats": repeats, "prompt": "a red ball bounces left to right on a blue floor", "seed": 7},
        "settings": settings,
        "sampling_ms_per_step": {name: [round(v, 2) for v in values] for name, values in gates.items()},
        "median_ms_per_step": {name: round(statistics.median(values), 2) for name, values in gates.items()},
        "ratio": {name: round(statistics.median(values) / off, 4) for name, values in gates.items() if name != "off"},
        "previews_per_run": previews,
    }


class _Scheduler:
    predict_x0 = True

    def __init__(self, estimate):
        self.model_outputs = [None, estimate]


class StandInLoop:
    """Upstream's loop order (``Magi2PreviewSampler.sample``): prepare_model_input -> forward -> step."""

    def __init__(self, weight, matmuls: int, estimate):
        self.weight, self.matmuls, self.scheduler = weight, matmuls, _Scheduler(estimate)

    def sample(self, sampler_input):
        latent = sampler_input.latent
        for t in sampler_input.video_t_list:
            x = self.prepare_model_input(latent, t)
            for _ in range(self.matmuls):
                x = x @ self.weight
            latent = self.step(x, latent, None, 1.0, 1.0, self.scheduler, None, t)
        return latent

    def prepare_model_input(self, latent, t):
        return (latent * t).tanh()

    def step(self, prediction, latent, audio_latent, video_cfg, audio_cfg, video_scheduler, audio_scheduler, t):
        video_scheduler.model_outputs[-1] = video_scheduler.model_outputs[-1] * 0.999  # the new x0 estimate
        return latent - 0.01 * prediction

    @staticmethod
    def _step_guided(prediction, latent, audio_latent, video_scheduler, audio_scheduler, t):
        return latent - 0.01 * prediction


def bench_cuda(steps: int, repeats: int, matmuls: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from magi2studio.engines import timing
    from magi2studio.engines.live_preview import PREVIEW_MAPS, LinearPreviewMap, LivePreview, default_every

    timing.install_step_hooks(StandInLoop)
    latent_shape = (1, 48, 32, 17, 30)
    estimate = torch.randn(latent_shape, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64
    loop = StandInLoop(weight, matmuls, estimate)
    preview_map = LinearPreviewMap.read(PREVIEW_MAPS / "tiny-trained.json")

    class Input:
        latent = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        video_t_list = [torch.tensor(1.0 - i / steps, device="cuda", dtype=torch.bfloat16) for i in range(steps)]

    class MarkedTimer(timing.StepTimer):
        """The step timer, with its after-the-loop part (its one sync, the preview's flush) marked."""

        def end_sample(self):
            with torch.profiler.record_function("magi2studio.end_sample"):
                return super().end_sample()

    def run(every: int, folder: str, profiled: bool = False) -> tuple[float, dict, int]:
        timer = MarkedTimer()
        timer.preview = LivePreview(folder, every, preview_map) if every else None
        torch.cuda.synchronize()
        began = time.perf_counter()
        with timing.active(timer):
            if profiled:
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    loop.sample(Input)
            else:
                loop.sample(Input)
        torch.cuda.synchronize()
        # Wall time a step, the sample's end included: the preview runs between a step's end mark
        # and the next one's start mark, so the timer's events (the gate) would not see it.
        gate = (time.perf_counter() - began) * 1e3 / steps
        syncs: dict = {}
        if profiled:
            names = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
            events = prof.events()
            after = next(e for e in events if e.name == "magi2studio.end_sample")
            found = [e for e in events if e.name in names]
            syncs = {"in_loop": [e.name for e in found if e.time_range.start < after.time_range.start],
                     "in_end_sample": [e.name for e in found
                                       if after.time_range.start <= e.time_range.start <= after.time_range.end]}
        written = len(timer.preview.written) if timer.preview else 0
        return gate, syncs, written

    settings = {"off": 0, "default": default_every(steps), "every_step": 1}
    gates: dict[str, list[float]] = {name: [] for name in settings}
    written: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as folder:
        run(1, folder)  # warm-up: cuBLAS handles, allocator, pinned memory
        torch.cuda.synchronize()
        for _ in range(repeats):
            for name, every in settings.items():
                gate, _, written[name] = run(every, folder)
                gates[name].append(gate)
        # Syncs over the loop, end_sample included: the timer's one and the preview's flush.
        _, syncs_off, _ = run(0, folder, profiled=True)
        _, syncs_every_step, _ = run(1, folder, profiled=True)
    off = statistics.median(gates["off"])
    return {
        "inputs": {"loop": f"stand-in sampler loop, {matmuls} bf16 4096x4096 matmuls a step", "steps": steps,
                   "repeats": repeats, "x0_shape": list(latent_shape), "x0_dtype": "bfloat16",
                   "map": f"{preview_map.name} (48 channels, patch {preview_map.patch})"},
        "settings": settings,
        "wall_ms_per_step": {name: [round(v, 3) for v in values] for name, values in gates.items()},
        "median_ms_per_step": {name: round(statistics.median(values), 3) for name, values in gates.items()},
        "ratio": {name: round(statistics.median(values) / off, 4) for name, values in gates.items() if name != "off"},
        "previews_written": written,
        "syncs_preview_off": syncs_off,
        "syncs_preview_every_step": syncs_every_step,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--matmuls", type=int, default=8, help="cuda: bf16 4096² matmuls per stand-in step")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    began = time.monotonic()
    result = {"bench": "live preview cost per step", "machine": machine(args.device),
              **(bench_cpu(args.steps, args.repeats) if args.device == "cpu"
                 else bench_cuda(args.steps, args.repeats, args.matmuls))}
    result["wall_s"] = round(time.monotonic() - began, 1)
    text = json.dumps(result)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
