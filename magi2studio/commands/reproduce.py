"""``magi2studio reproduce SAMPLES``: run a sample set, resumably, and judge it against a reference."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import InputError
from ..vocabulary.request import whole_number

DEFAULT_OUT = Path("outputs/reproduce")
MAX_EXIT = 100  # exit statuses above this are reserved by shells


def register(sub) -> None:
    parser = sub.add_parser("reproduce", help="run a sample set (Sand AI's demo_samples.json format) and report")
    parser.add_argument("samples", help="a sample set JSON file, or 'sandai' for the bundled Sand AI set")
    parser.add_argument("--tier", default=None, help="default tier for entries without one (default 272p)")
    parser.add_argument("--layout", default="sp1-cfg1", help="spN-cfgM[-epK] or a preset (the blog: sp8-cfg1-ep4)")
    parser.add_argument("--seed", default="42", help="the base seed (default 42)")
    parser.add_argument("--seed-policy", default="fixed", help="fixed: every entry the seed (the blog); "
                        "offset: seed + entry index (Sand AI's entry.py)")
    parser.add_argument("--steps", default=None, help="denoising steps for entries without their own")
    parser.add_argument("--compile", choices=("static", "dynamic", "eager"), default=None)
    parser.add_argument("--engine", default="embedded", help="embedded or vllm-omni")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help=f"report and runs folder (default {DEFAULT_OUT})")
    parser.add_argument("--expect", default=None, help="a reference file, or 'blog' for the bundled blog reference")
    parser.add_argument("--root", default=None, metavar="DIR",
                        help="the folder the set's paths are written against and must stay inside "
                             "(default: the set's own folder; Sand AI's layout: their repository's top)")
    parser.add_argument("--yes", action="store_true",
                        help="run a set of more than 100 entries without refusing it")
    parser.add_argument("--skip-missing", action="store_true",
                        help="leave out entries whose prompt file or image is missing (listed in the report)")
    parser.add_argument("--write-reference", default=None, metavar="PATH",
                        help="record this run's hashes and gate ms as a reference file for later runs")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..vocabulary.layouts import parse_layout
    from ..run_folder.atomic import write_atomic
    from ..reproduction.references import load_reference, reference_from_report
    from ..reproduction.reproduce import reproduce
    from ..reproduction.samples import load_sample_set
    from ..vocabulary.tiers import get_tier

    if args.tier is not None:
        get_tier(args.tier)  # the flag is named in the refusal, not the first entry it reaches
    defaults = {key: value for key, value in (("tier", args.tier), ("steps", whole_number(args.steps, "steps")),
                                              ("compile", args.compile)) if value is not None}
    seed = whole_number(args.seed, "seed")
    sample_set = load_sample_set(args.samples, seed=seed, seed_policy=args.seed_policy, defaults=defaults,
                                 skip_missing=args.skip_missing, root=args.root, confirm_large=args.yes)
    layout = parse_layout(args.layout)
    reference = load_reference(args.expect) if args.expect else None
    write_to = Path(args.write_reference) if args.write_reference else None
    if write_to is not None and not write_to.parent.is_dir():
        raise InputError("write_reference", f"{write_to.parent} is not a folder", "create it or pick another path")
    out = Path(args.out)

    def show(kind, result, payload) -> None:
        if kind == "start":
            print(f"[{result.index + 1}] {result.name}: {result.mode} {result.tier} seed {result.seed} ...", flush=True)
        elif kind == "done":
            line = f"    {result.status}"
            if result.manifest:
                gate = f"{result.gate_ms:.1f} ms/step" if result.gate_ms is not None else "no gate metric"
                line += f"  frames {result.manifest['hashes']['frames_sha256'][:16]}  " \
                        f"pcm {result.manifest['hashes']['pcm_sha256'][:16]}  {gate}"
            if result.verdict:
                line += f"  -> {result.verdict}"
            if result.error:
                line += f"  {result.error}"
            print(line, flush=True)

    report = reproduce(sample_set, engine_name=args.engine, layout=layout, out=out, reference=reference,
                       reference_path=args.expect, on_event=show)
    for skipped in sample_set.skipped:
        print(f"skipped {skipped.name}: {skipped.reason}", file=sys.stderr)
    summary = report["summary"]
    print("summary: " + ", ".join(f"{k} {v}" for k, v in summary.items() if v))
    print(f"report: {out / 'report.md'} ({out / 'report.html'}, {out / 'report.json'})")
    if write_to is not None:
        recorded = reference_from_report(report, title=f"baseline recorded from {sample_set.path}")
        write_atomic(write_to, json.dumps(recorded, indent=2) + "\n")
        print(f"reference written: {write_to}")
    return min(summary["failed"], MAX_EXIT)
