#!/usr/bin/env python
"""Benchmark: one embedded T2VA run at the engine's default steps, end to end.

Times engine start (tiny checkpoint load), generation, and the run folder write, for
``--repeat`` runs in one process, and reports the ratio of the median run to the tier's
budget (272p: issue 2's 20 s; 1080p: 90 s for the 100 preview + 5 refiner steps, the chunked
1920x1088x249 decode and the mp4, stated in docs/performance.md). JSON goes to
docs/perf/embedded-<date>.json (1080p: embedded-1080p-<date>.json) or --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

BUDGETS_S = {"272p": 20.0, "1080p": 90.0}  # quiet 2-core machine, the run only (not engine start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=None, help="runs (default 2; 1 for 1080p)")
    parser.add_argument("--tier", default="272p", choices=("272p", "540p", "1080p"))
    parser.add_argument("--no-deterministic", action="store_true",
                        help="request deterministic=false "
                        "(deterministic mode costs about 2x on CPU: docs/performance.md)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from magi2studio.run_folder import runs
    from magi2studio.engines import timing
    from magi2studio.engines import get_engine
    from magi2studio.vocabulary.layouts import parse_layout
    from magi2studio.vocabulary.request import build_request, read_prompt_file

    prompt = read_prompt_file(Path(__file__).resolve().parents[1] / "magi2studio/data/sandai/assets/sample_000.txt")
    request = build_request(prompt=prompt, tier=args.tier, deterministic=not args.no_deterministic)
    repeat = args.repeat or (1 if args.tier == "1080p" else 2)
    budget_s = BUDGETS_S.get(args.tier)
    load_at_start = os.getloadavg()
    layout = parse_layout("sp1-cfg1")
    t0 = time.perf_counter()
    engine = get_engine("embedded")
    engine.start(layout)
    start_s = time.perf_counter() - t0
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(repeat):
            t1 = time.perf_counter()
            folder = runs.execute(engine, request, layout, Path(scratch))
            stages = folder.manifest["timing"]["stages"]
            preview = stages["preview"]
            row = {"run_s": time.perf_counter() - t1, "gate_ms": preview["gate_ms"],
                   "median_step_ms": preview["median_ms"], "steps": preview["steps"],
                   "stage_ms": folder.manifest["timing"]["stage_ms"], "output": folder.manifest["output"],
                   "frames_sha256": folder.manifest["hashes"]["frames_sha256"]}
            if "refiner" in stages:
                row["refiner"] = {"steps": stages["refiner"]["steps"], "total_ms": stages["refiner"]["total_ms"],
                                  "step_ms": [r["ms"] for r in timing.read_jsonl(folder.steps)
                                              if r["stage"] == "refiner"]}
            rows.append(row)
    median_run = statistics.median(r["run_s"] for r in rows)
    result = {
        "benchmark": "embedded_generate", "tier": args.tier, "layout": layout.name,
        "deterministic": request.deterministic,
        "engine_start_s": start_s, "runs": rows, "median_run_s": median_run,
        "budget_s": budget_s, "ratio_to_budget": median_run / budget_s if budget_s else None,
        "identical_outputs": len({r["frames_sha256"] for r in rows}) == 1,
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "loadavg_at_start": load_at_start, "loadavg_at_end": os.getloadavg()},
        "date": time.strftime("%Y-%m-%d"),
    }
    name = "embedded" if args.tier == "272p" else f"embedded-{args.tier}"
    name += "-nondet" if args.no_deterministic else ""
    out = Path(args.out or Path(__file__).resolve().parents[1] / f"docs/perf/{name}-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(out)
    print(f"engine start {start_s:.1f} s; runs {[round(r['run_s'], 1) for r in rows]} s; "
          f"median {median_run:.1f} s"
          + (f" = {result['ratio_to_budget']:.2f}x the {budget_s:.0f} s budget; " if budget_s else " (no budget); ")
          + f"gate {rows[-1]['gate_ms']:.0f} ms/step; load avg {result['machine']['loadavg_at_end'][0]:.1f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
