#!/usr/bin/env python3
"""Count the bad-input fuzz's outcomes (issue 19): inputs tried, accepted, refused cleanly, tracebacks, leftovers.

Draws the strategies of tests/requests_and_runs/fuzzing.py (seeded: the same inputs every time) through
the same entry points as tests/requests_and_runs/test_fuzz_inputs.py and prints JSON. Exits 1 if any
input gave a traceback or a leftover.

    .venv/bin/python scripts/fuzz_counts.py --examples 300
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300, help="inputs per family (manifests: a third)")
    parser.add_argument("--families", default="requests,request_yaml,sample_sets,cli_flags,manifests",
                        help="comma-separated families to draw (default all)")
    args = parser.parse_args()
    chosen = set(args.families.split(","))

    from magi2studio import determinism

    determinism.apply_defaults()
    work = Path(tempfile.mkdtemp(prefix="magi2studio-fuzz-"))
    try:
        counts, examples = draw(chosen, args.examples, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the drawn files and the tiny run folder: nothing stays in TMPDIR
    return report_and_exit(counts, examples)


def draw(chosen: set[str], n_examples: int, work: Path):
    """Draw every chosen family in ``work``; (outcome counts, up to three bad examples) per family."""

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from magi2studio.run_folder import runs
    from magi2studio.cli import main as cli
    from tests.requests_and_runs import fuzzing as F

    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    examples: dict[str, list] = collections.defaultdict(list)

    def family(name, strategy, attempt, n):
        if name not in chosen:
            return
        @settings(max_examples=n, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def run(value):
            outcome = attempt(value)
            counts[name][outcome] += 1
            if outcome in ("traceback", "leftover") and len(examples[name]) < 3:
                examples[name].append(repr(value)[:200])
        run()

    family("requests", F.request_fields, F.attempt_request, n_examples)
    family("request_yaml", st.text(max_size=80), lambda t: F.attempt_request_yaml(t, work), n_examples)
    set_folder = F.make_set_folder(F.fresh(work / "sets"))
    family("sample_sets", F.sample_sets, lambda d: F.attempt_sample_set(d, set_folder), n_examples)
    family("cli_flags", F.cli_argv, lambda a: F.attempt_cli(a, work / "cli-out"), n_examples)
    if "manifests" in chosen:
        out = F.fresh(work / "runs")
        assert cli(["generate", "--prompt", "a red kite over a windy beach", "--steps", "2", "--out", str(out)]) == 0
        (current,) = [p for p in out.iterdir() if runs.is_complete(p)]
        folder = F.made_before_run_ids(current, F.fresh(work / "older"))  # checked field by field, not by its run id
        pristine = (folder / "manifest.json").read_bytes()
        family("manifests", F.manifest_edits, lambda e: F.attempt_manifest(folder, pristine, e),
               max(n_examples // 3, 10))
    return counts, examples


def report_and_exit(counts, examples) -> int:
    total = collections.Counter()
    for counter in counts.values():
        total.update(counter)
    report = {"families": {k: dict(v) for k, v in counts.items()}, "total": dict(total),
              "tried": sum(total.values()), "bad_examples": dict(examples)}
    print(json.dumps(report, indent=2))
    return 1 if total["traceback"] or total["leftover"] else 0


if __name__ == "__main__":
    sys.exit(main())
