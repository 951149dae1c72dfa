"""``magi2studio weights check``: is the mounted checkpoint complete and intact?"""

from __future__ import annotations

import json
import sys

from ..vocabulary.tiers import TIERS


def register(subparsers) -> None:
    parser = subparsers.add_parser("weights", help="check the MAGI-2 Preview checkpoint tree")
    actions = parser.add_subparsers(dest="weights_action", required=True)
    check = actions.add_parser("check", help="name every missing, truncated or corrupt file; exit 1 if any")
    check.add_argument("--root", help="checkpoint folder (default: $MAGI2_CKPT_ROOT, else ./models/MAGI-2-preview)")
    check.add_argument("--tier", default="272p", choices=tuple(TIERS), help="the tier whose files must be there")
    check.add_argument("--hash", action="store_true", help="also hash every file against the recorded sha256")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(func=run_check)


def run_check(args) -> int:
    from ..weights import check_weights

    report = check_weights(args.root, args.tier, hash_files=args.hash, progress=args.hash and not args.json)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print("\n".join(report.lines()))
    if not report.ok:
        print(f"weights check failed: {len(report.problems)} file(s) to fix (see above)", file=sys.stderr)
    return 0 if report.ok else 1
