"""``magi2studio score RUN_DIR``: per-attribute verdicts of a run against its caption (its prompt)."""

from __future__ import annotations

import argparse
import json


def register(sub) -> None:
    parser = sub.add_parser("score", help="judge a run folder against its caption: 0 all match, 1 a mismatch, "
                                          "2 a caption or folder it cannot read")
    parser.add_argument("run_dir")
    parser.add_argument("--json", action="store_true", help="print the verdicts as one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..semantic.score import score_run

    result = score_run(args.run_dir)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        print(f"caption: {result.caption}")
        for verdict in result.verdicts:
            print(verdict.line())
        print("all stated attributes match" if result.all_match else "some attributes do not match")
    return 0 if result.all_match else 1
