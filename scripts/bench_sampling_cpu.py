"""CPU seconds and wall seconds per preview step of the embedded engine, one process (sp1-cfg1).

CPU seconds (this process's user + system time) hold up on a shared machine better than wall
time. Run it on two checkouts (PYTHONPATH) to compare code, or with --deterministic off:
    PYTHONPATH=$PWD:$PWD/kernels .venv/bin/python scripts/bench_sampling_cpu.py --steps 4
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from magi2studio.engines.embedded.engine import EmbeddedEngine
from magi2studio.vocabulary.layouts import parse_layout
from magi2studio.vocabulary.request import build_request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--deterministic", choices=("on", "off"), default="on")
    args = parser.parse_args()

    from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler

    engine = EmbeddedEngine()
    engine.start(parse_layout("sp1-cfg1"))
    request = build_request(prompt="a lighthouse at dusk, waves and a foghorn", steps=1, seed=11)
    request = request.model_copy(update={"deterministic": args.deterministic == "on"})
    engine.generate(engine.plan(request, engine.layout))  # warm-up; installs the deterministic wrapper
    measured = {}
    sample = Magi2PreviewSampler.sample

    def timed(self, *a, **k):
        cpu, wall = time.process_time(), time.perf_counter()
        out = sample(self, *a, **k)
        measured["cpu_s"], measured["wall_s"] = time.process_time() - cpu, time.perf_counter() - wall
        return out

    timed._magi2studio_layout_invariant = True  # already wrapped: do not wrap twice
    Magi2PreviewSampler.sample = timed
    try:
        engine.generate(engine.plan(request.model_copy(update={"steps": args.steps}), engine.layout))
    finally:
        Magi2PreviewSampler.sample = sample
        engine.close()
    print(json.dumps({"steps": args.steps, "deterministic": args.deterministic,
                      "cpu_s_per_step": round(measured["cpu_s"] / args.steps, 3),
                      "wall_s_per_step": round(measured["wall_s"] / args.steps, 3),
                      "threads": torch.get_num_threads(), "load_average_1min": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
