"""``magi2studio replay RUN_DIR``: verify a run folder, re-run its request and compare the output hashes."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ..errors import InputError


def register(sub) -> None:
    parser = sub.add_parser("replay", help="re-run a run folder's request; non-zero if the hashes differ")
    parser.add_argument("run_dir")
    parser.add_argument("--out", default=None, help="keep the new run folder here (default: a temp folder)")
    parser.set_defaults(func=run)


def replay(run_dir: Path, out: Path | None = None):
    """Returns (original manifest, new RunFolder, {hash name: matched})."""

    from ..run_folder import runs
    from ..engines import get_engine
    from ..vocabulary.layouts import parse_layout
    from .progress import ConsoleProgress
    from ..vocabulary.request import build_request

    verified = runs.verify_run(run_dir)  # a tampered or malformed folder, an edited manifest, is refused here
    if not verified.manifest_covered:
        print(f"note: {run_dir}: manifest.json is not covered (made before run ids were its sha256): "
              "a hash that DIFFERS may also be an edited manifest", file=sys.stderr)
    original = verified.manifest
    request = runs.manifest_request(original)
    fill = {key: original["resolved"].get(key) for key in ("steps", "compile") if getattr(request, key) is None}
    if fill:
        try:
            request = build_request(**{**request.model_dump(), **fill})
        except InputError as err:
            raise InputError(f"manifest.resolved.{err.field}", err.problem,
                             "use a manifest written by magi2studio") from None
    layout = parse_layout(original["layout"]["name"])
    engine = get_engine(original["engine"]["name"], **engine_options_of_run(original["engine"]))
    with ConsoleProgress() as progress:
        folder = runs.execute(engine, request, layout, out, on_progress=progress)
    verdict = {key: folder.manifest["hashes"][key] == original["hashes"][key]
               for key in ("frames_sha256", "pcm_sha256")}
    return original, folder, verdict


def engine_options_of_run(engine_block: dict) -> dict:
    """The engine options that ran: the embedded engine's weights (not today's default)."""

    if not engine_block.get("embedded"):
        return {}
    from ..engines.embedded.tiny_weights import weights_of_run

    return {"weights": weights_of_run(engine_block)}


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise InputError("run_dir", f"{run_dir} is not a folder", "give a run folder under outputs/")
    with tempfile.TemporaryDirectory(prefix="magi2-replay-") as scratch:
        _, folder, verdict = replay(run_dir, Path(args.out) if args.out else Path(scratch))
        for key, same in verdict.items():
            print(f"{key}: {'match' if same else 'DIFFERS'}")
        if args.out:
            print(f"new run folder: {folder.path}")
    return 0 if all(verdict.values()) else 1
