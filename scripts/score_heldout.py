#!/usr/bin/env python3
"""Generate the held-out captions on the embedded engine and score each run (``magi2studio score``).

    .venv/bin/python scripts/score_heldout.py --weights /tmp/tiny-trained --out /tmp/heldout-trained.json
    .venv/bin/python scripts/score_heldout.py --weights random --out /tmp/heldout-random.json

Each held-out combination (magi2studio.scenes.HELD_OUT, never trained on) is captioned with
its grammar phrasing ``index % PHRASINGS``, generated at the tier with the default steps into a
run folder under ``--runs``, and judged by :func:`magi2studio.score.score_run`, the function
behind ``magi2studio score RUN``. The JSON holds every verdict and the share of runs matching
per attribute; the table printed last is that share.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ATTRIBUTES = ("background", "colour", "shape", "motion", "pitch", "beeps", "first_frame")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", default="random", help="random or a tiny checkpoint folder")
    parser.add_argument("--tier", default="272p")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the engine's)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N held-out combinations")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--runs", type=Path, default=None, help="run folders go here (default: a temp folder)")
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    args = parser.parse_args(argv)

    from magi2studio.determinism import apply_defaults

    apply_defaults()
    from magi2studio import runs
    from magi2studio.engines.embedded import EmbeddedEngine
    from magi2studio.layouts import parse_layout
    from magi2studio.request import Request
    from magi2studio.scenes import HELD_OUT, PHRASINGS, caption_for
    from magi2studio.score import score_run

    runs_root = args.runs or Path(tempfile.mkdtemp(prefix="heldout-"))
    engine = EmbeddedEngine(weights=args.weights)
    layout = parse_layout("sp1-cfg1")
    results = []
    for index, facts in enumerate(HELD_OUT[: args.limit]):
        caption = caption_for(facts, index % PHRASINGS)
        request = Request(prompt=caption, seed=args.seed + index, tier=args.tier, steps=args.steps)
        started = time.perf_counter()
        folder = runs.execute(engine, request, layout, runs_root)
        seconds = time.perf_counter() - started
        score = score_run(folder.path)
        verdicts = {v.attribute: v.match for v in score.verdicts}
        results.append({"run": str(folder.path), "seconds": round(seconds, 2), **score.as_dict()})
        print(f"{index:2d} {seconds:5.1f} s  " + " ".join(f"{a}={'Y' if m else 'n' if m is False else '-'}"
                                                      for a, m in verdicts.items()) + f"  | {caption}", flush=True)
    info = engine.info()
    engine.close()
    rates = {}
    for attribute in ATTRIBUTES:
        judged = [v["match"] for r in results for v in r["verdicts"] if v["attribute"] == attribute
                  and v["match"] is not None]
        if judged:
            rates[attribute] = round(sum(judged) / len(judged), 3)
    summary = {"weights": args.weights, "tier": args.tier, "steps": args.steps, "runs": len(results),
               "match_rate": rates, "engine": info, "results": results}
    temp = args.out.with_name(f".{args.out.name}.tmp")
    temp.write_text(json.dumps(summary, indent=1, default=str), encoding="utf-8")
    temp.replace(args.out)
    print(json.dumps({"weights": args.weights, "runs": len(results), "match_rate": rates}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
