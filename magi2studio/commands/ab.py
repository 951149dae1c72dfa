"""``magi2studio ab``: the paired A/B method, control and candidate alternating, one request."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..vocabulary.request import whole_number
from .generate import add_request_arguments, request_from_args

DEFAULT_OUT = Path("outputs/ab")


def register(sub) -> None:
    parser = sub.add_parser("ab", help="paired A/B: control and candidate alternate, outputs and ms/step compared")
    add_request_arguments(parser)
    parser.add_argument("--pairs", default="3", help="how many control/candidate pairs (default 3)")
    parser.add_argument("--control", action="append", default=[], metavar="SETTING",
                        help="env.KEY=VALUE, engine.KEY=VALUE, request.FIELD=VALUE or layout=NAME (repeatable)")
    parser.add_argument("--candidate", action="append", default=[], metavar="SETTING", help="as --control")
    parser.add_argument("--layout", default="sp1-cfg1", help="the layout of both sides unless one sets layout=")
    parser.add_argument("--engine", default="embedded", help="embedded or vllm-omni")
    parser.add_argument("--isolation", choices=("process", "restart"), default="process",
                        help="process: a fresh interpreter per run (env read at import reaches the engine); "
                             "restart: this process with a new engine per run (faster; env read at engine start only)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help=f"report and runs folder (default {DEFAULT_OUT})")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..reproduction.ab import BIT_IDENTICAL, check_pairs, parse_side, run_ab

    pairs = check_pairs(whole_number(args.pairs, "pairs"))
    request = request_from_args(args)
    sides = (parse_side("control", args.control, args.layout), parse_side("candidate", args.candidate, args.layout))
    out = Path(args.out)

    def show(kind, run, payload) -> None:
        if kind == "done":
            gate = f"{run.gate_ms:.1f} ms/step" if run.gate_ms is not None else "no gate metric"
            detail = f"frames {run.frames_sha256[:16]} pcm {run.pcm_sha256[:16]} {gate}" if run.status == "ok" \
                else run.error
            print(f"[{run.order + 1}/{2 * pairs}] {run.side} #{run.pair + 1}: {run.status}  {detail}", flush=True)

    report = run_ab(request, sides, pairs, engine_name=args.engine, out=out, isolation=args.isolation, on_event=show)
    timing = report["timing"]
    print(f"outputs: {report['identity']['verdict']}")
    if "median_ratio" in timing:
        print(f"candidate/control: median {timing['median_ratio']:.4f} (range {timing['min_ratio']:.4f}-"
              f"{timing['max_ratio']:.4f}, spread {timing['spread_pct']:.2f}%) over {timing['compared_pairs']} pairs")
    else:
        print(timing["note"])
    print(f"report: {out / 'ab.md'} ({out / 'ab.json'})")
    failed = sum(1 for r in report["runs"] if r["status"] != "ok")
    return 0 if report["identity"]["verdict"] == BIT_IDENTICAL else (1 if failed else 3)
