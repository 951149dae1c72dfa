"""Per-layout step times of the embedded engine on this machine (JSON to docs/perf/).

Communication-bound toy figures on a tiny config over gloo: not GPU predictions. Each mode
(deterministic on / off) runs every layout; the first layout is the reference the others'
outputs are compared with (identical hashes, or how far the frames and audio are).
    .venv/bin/python scripts/bench_layouts.py --steps 4 --modes on off
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from magi2studio import determinism
from magi2studio import media
from magi2studio.engines.embedded.engine import EmbeddedEngine
from magi2studio.vocabulary.layouts import parse_layout
from magi2studio.vocabulary.request import build_request
from magi2studio.engines.timing import gate_summary

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "perf" / "embedded_layouts_cpu.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", nargs="+", default=["sp1-cfg1", "sp2-cfg1", "sp1-cfg2", "sp2-cfg2"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--modes", nargs="+", choices=("on", "off"), default=["on", "off"],
                        help="deterministic mode(s) to run every layout in")
    args = parser.parse_args()

    determinism.apply_defaults()  # the CLI's environment, before the first engine starts torch
    engine = EmbeddedEngine()
    rows = []
    try:
        for mode in args.modes:
            request = build_request(prompt="a red kite over a windy beach, waves and gulls", steps=args.steps,
                                    seed=args.seed, deterministic=mode == "on")
            reference = None
            for name in args.layouts:
                layout = parse_layout(name)
                started = time.perf_counter()
                engine.start(layout)
                start_s = time.perf_counter() - started
                generation = engine.generate(engine.plan(request, layout))
                hashes = media.frames_sha256(generation.frames), media.pcm_sha256(generation.audio)
                reference = reference or (generation, hashes)
                summary = gate_summary(generation.step_records)
                frames = np.abs(generation.frames.astype(np.int16) - reference[0].frames.astype(np.int16))
                rows.append({"deterministic": mode, "layout": name, "world_size": layout.world_size,
                             "start_s": round(start_s, 2), "preview_ms": round(generation.stage_ms["preview"], 1),
                             "gate_ms_per_step": summary["gate_ms"], "median_ms": summary["median_ms"],
                             "frames_sha256": hashes[0], "pcm_sha256": hashes[1],
                             f"identical_to_{args.layouts[0]}": hashes == reference[1],
                             "frame_bytes_differing": float((frames > 0).mean()),
                             "frame_max_levels": int(frames.max()),
                             "audio_max_abs": float(np.abs(generation.audio - reference[0].audio).max()),
                             "audio_peak": float(np.abs(reference[0].audio).max())})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        engine.close()
    report = {
        "what": f"embedded engine (tiny config, {engine.weights_note}) per-layout step times on CPU over gloo: "
                "communication-bound toy figures, not GPU predictions",
        "metric": "per step the slowest rank; steps 0 and 1 dropped; mean of the rest",
        "steps": args.steps, "cpu_capability": determinism.cpu_capability(), "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "machine": platform.platform(), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "layouts": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
