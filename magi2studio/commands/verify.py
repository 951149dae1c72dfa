"""``magi2studio verify RUN_DIR``: check a run folder without re-running it."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub) -> None:
    parser = sub.add_parser("verify", help="check a run folder's manifest against its run id and every file's "
                            "sha256, without re-running")
    parser.add_argument("run_dir")
    parser.set_defaults(func=run)


def manifest_line(folder) -> str:
    """What the run id says of manifest.json: covered (not edited since written), or not covered (an old folder)."""

    if folder.manifest_covered:
        return (f"manifest.json: its sha256 starts with the run id in the folder's name ({folder.path.name[-16:]}): "
                "not edited since the run wrote it")
    return ("manifest.json: not covered (made before run ids were the manifest's sha256): an edit of it "
            "shows only as a replay that differs")


def run(args: argparse.Namespace) -> int:
    from ..run_folder.runs import HASHED_FILES, REPLAY_ONLY_HASHES, verify_run

    folder = verify_run(Path(args.run_dir))
    request = folder.manifest["request"]
    print(f"verified: {folder.path}")
    print(manifest_line(folder))
    print(f"{len(HASHED_FILES)} files match their sha256, recomputed: {', '.join(HASHED_FILES)}")
    print(f"the manifest's request is request.yaml's ({request['mode']} {request['tier']} seed {request['seed']}, "
          f"layout {folder.manifest['layout']['name']}, engine {folder.manifest['engine']['name']})")
    print(f"only replay can check {' and '.join(f'hashes.{key}' for key in REPLAY_ONLY_HASHES)}: they hash the "
          "frames and PCM before encoding (H.264 is lossy, audio.wav 16-bit), so no file here gives them back")
    return 0
