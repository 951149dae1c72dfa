"""``magi2studio doctor``: platform, devices, versions, build-info, env, mux, weights, tiers."""

from __future__ import annotations

import json

from ..vocabulary.tiers import TIERS


def register(subparsers) -> None:
    parser = subparsers.add_parser("doctor", help="report what this machine can run, and why not")
    parser.add_argument("--root", help="also check this checkpoint folder (default: $MAGI2_CKPT_ROOT if set)")
    parser.add_argument("--tier", default="272p", choices=tuple(TIERS), help="tier for the weights check")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..doctor import collect, render

    report = collect(args.root, args.tier)
    print(json.dumps(report, indent=2, default=str) if args.json else "\n".join(render(report)))
    return 0
