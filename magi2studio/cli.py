"""``magi2studio`` command line. Exit 0 ok, 2 bad input, 1 engine or system failure, 130 interrupted."""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import threading

from .errors import Cancelled, EngineError, InputError, Terminated, describe_os_error

# Each module in magi2studio.commands exposes register(subparsers) and sets args.func.
COMMANDS = ("generate", "replay", "verify", "env", "doctor", "weights", "reproduce", "ab", "studio", "score", "queue")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="magi2studio", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log details to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"magi2studio.commands.{name}").register(sub)
    return parser


def _terminate(signum, frame) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    """Run one command; every failure ends as one line on stderr and an exit status, never a traceback."""

    from . import determinism

    determinism.apply_defaults()  # before any command starts torch; a value already set wins
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main else None  # unwind on SIGTERM, cleaning up
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
    except OSError as err:  # the disk or the OS refused: full, read-only, too large, no permission
        print(f"error: {describe_os_error(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("terminated (SIGTERM); nothing half-written was kept", file=sys.stderr)
        return 143
    except Exception as err:  # a bug: still one line (the traceback with -v)
        logging.getLogger("magi2studio").info("internal error", exc_info=True)
        print(f"internal error: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}. "
              "Fix: this is a magi2studio bug; run again with -v for the traceback and report it", file=sys.stderr)
        return 1
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
