"""``magi2studio`` command line. Exit 0 ok, 2 bad input, 1 engine failure."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from .errors import Cancelled, EngineError, InputError

# Each module in magi2studio.commands exposes register(subparsers) and sets args.func.
COMMANDS = ("generate", "replay", "env", "doctor", "weights", "reproduce", "ab", "studio", "score")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="magi2studio", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log details to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"magi2studio.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from . import determinism

    determinism.apply_defaults()  # before any command starts torch; a value already set wins
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Cancelled as err:
        print(f"cancelled: {err}", file=sys.stderr)
        return 1
    except EngineError as err:
        print(f"engine failure: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
