"""``magi2studio env``: the deterministic environment as shell exports."""

from __future__ import annotations

from .. import determinism


def register(sub) -> None:
    parser = sub.add_parser("env", help="print the deterministic environment as exports")
    parser.set_defaults(func=run)


def run(args) -> int:
    print(determinism.as_exports())
    print(f"# {determinism.WHAT_HASHES_PROVE}")
    return 0
