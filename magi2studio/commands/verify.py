"""``magi2studio verify RUN_DIR``: check a run folder without re-running it."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub) -> None:
    parser = sub.add_parser("verify", help="check a run folder's manifest and every file's sha256, without re-running")
    parser.add_argument("run_dir")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..run_folder.runs import HASHED_FILES, verify_run

    folder = verify_run(Path(args.run_dir))
    print(f"verified: {folder.path}: {len(HASHED_FILES)} files match their sha256, the manifest's request is "
          f"request.yaml's ({folder.manifest['request']['mode']} {folder.manifest['request']['tier']} "
          f"seed {folder.manifest['request']['seed']}, layout {folder.manifest['layout']['name']}, "
          f"engine {folder.manifest['engine']['name']})")
    return 0
