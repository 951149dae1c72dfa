#!/usr/bin/env python3
"""The tiny DiT's training step on a GPU: upstream's torch loops against the batched paths, per batch size.

    python3 scripts/bench_train_step.py --device cuda --batches 8,32,64 --out bench-train.json

What a step is: ``trainer.train_dit``'s own loop (a batch drawn on the CPU from the seed, moved, upstream's
forward and backward, AdamW) on the trained config (16-pixel code, 272p: about 580 tokens a sample),
``--scenes`` training scenes. Two paths for the two kernels that have no backward on CUDA
(``training.on_device``): ``loops`` is upstream's ``torch_mh_moe_forward`` / ``torch_varlen_attention_with_sink``
(one expert or one sample at a time; what a GPU run used before 2026-12-07, the baseline), ``batched`` is
``dense_mh_moe`` / ``padded_attention_with_sink``. Each (path, batch) starts from the same seeded weights,
runs ``--warmup`` steps, then times ``--steps`` steps (synchronized); ``samples_per_s`` = batch / step time,
and ``ratio`` is each row's samples per second over the loops' at batch 8. One JSON object on stdout (and
``--out``). There is no off-the-shelf trainer for upstream's MAGI-2 classes to compare against.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", default="8,32,64", help="comma-separated batch sizes")
    parser.add_argument("--paths", default="loops,batched", help="comma-separated: loops, batched")
    parser.add_argument("--scenes", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-train"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches: {args.batches!r} is not a comma-separated list of integers; e.g. 8,32,64")
    paths = args.paths.split(",")
    if not set(paths) <= {"loops", "batched"}:
        parser.error(f"--paths: {args.paths!r}; use loops, batched or both")
    if args.device != "cpu":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    if args.device != "cpu":
        torch.use_deterministic_algorithms(True)
    from magi2studio.engines.embedded import upstream_patches
    from magi2studio.engines.embedded.checkpoint import ensure_checkpoint
    from magi2studio.engines.embedded.components import load_components
    from magi2studio.training import latents as codes
    from magi2studio.training import on_device, trainer

    config = trainer.trained_config(0)
    base = ensure_checkpoint(config, args.work / "base")
    upstream_patches.init_world_of_one()
    components = load_components(base)
    components.image_encoder.load_state_dict(codes.image_encoder_state(config.spatial_stride))
    examples = trainer.make_examples(config, trainer.TrainSettings(scenes=args.scenes))
    initial = {k: v.clone() for k, v in components.transformer.state_dict().items()}
    batched = on_device.dense_mh_moe, on_device.padded_attention_with_sink

    def synchronize() -> None:
        if args.device != "cpu":
            torch.cuda.synchronize()

    rows = []
    for path in paths:
        if path == "loops":  # on_device's CUDA branch looks these names up at call time
            from vllm_omni.diffusion.models.magi2 import attention, mh_moe

            on_device.dense_mh_moe = mh_moe.torch_mh_moe_forward
            on_device.padded_attention_with_sink = attention.torch_varlen_attention_with_sink
        else:
            on_device.dense_mh_moe, on_device.padded_attention_with_sink = batched
        for batch in batches:
            components.transformer.load_state_dict(initial)
            settings = trainer.TrainSettings(scenes=args.scenes, batch=batch, dit_steps=args.warmup + args.steps,
                                             log_every=10**6)
            marks: list[float] = []

            def on_step(step: int, loss: float, snapshot) -> bool:
                synchronize()
                marks.append(time.perf_counter())
                return False

            synchronize()
            start = time.perf_counter()
            trainer.train_dit(components, examples, settings, trainer.TrainLog(settings.as_dict(), config.digest),
                              torch.Generator().manual_seed(2), on_step=on_step, device=args.device)
            timed = marks[args.warmup:]
            first = marks[args.warmup - 1] if args.warmup else start
            step_s = (timed[-1] - first) / len(timed)
            peak = round(torch.cuda.max_memory_allocated() / 2**30, 2) if args.device != "cpu" else None
            rows.append({"path": path, "batch": batch, "step_s": round(step_s, 4),
                         "samples_per_s": round(batch / step_s, 2), "peak_gib": peak})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            if args.device != "cpu":
                torch.cuda.reset_peak_memory_stats()
    on_device.dense_mh_moe, on_device.padded_attention_with_sink = batched
    baseline = next((r for r in rows if r["path"] == "loops" and r["batch"] == 8), None)
    for row in rows:
        row["ratio"] = round(row["samples_per_s"] / baseline["samples_per_s"], 2) if baseline else None
    result = {"bench": "train_step", "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
              "machine": {"device": args.device, "gpu": torch.cuda.get_device_name() if args.device != "cpu" else None,
                          "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
              "settings": {"scenes": args.scenes, "warmup": args.warmup, "steps": args.steps,
                           "tokens_per_sample": "about 580 (448 video, 50 audio, up to 80 text)"},
              "rows": rows}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
