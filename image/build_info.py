"""Writes /etc/magi2studio/build-info.json at image build time (run by image/Dockerfile).

Records what ``magi2studio.run_folder.provenance.build_info()`` hands to the run manifest and
``doctor``: git revision, the lock's sha256, the resolved base image, ``pip freeze`` and the
build date. Values the build was not given stay null with the reason, never guessed.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

NOT_GIVEN = "not passed to docker build (scripts/build-image passes it)"


def build_info(args: argparse.Namespace) -> dict:
    lock_sha256 = hashlib.sha256(Path(args.lock).read_bytes()).hexdigest()
    if args.lock_sha256 and args.lock_sha256 != lock_sha256:
        sys.exit(f"build_info: LOCK_SHA256 {args.lock_sha256} does not match the copied "
                 f"{args.lock} ({lock_sha256}): rebuild with scripts/build-image from a clean tree")
    freeze = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all"], check=True,
                            capture_output=True, text=True).stdout.splitlines()
    return {
        "platform": args.platform,
        "git_revision": args.revision or None,
        "git_revision_note": None if args.revision else NOT_GIVEN,
        "lock_sha256": lock_sha256,
        "base_image": args.base,
        "base_image_digest": args.base_digest or None,
        "base_image_digest_note": None if args.base_digest else NOT_GIVEN,
        # cuda/musa: the vLLM-Omni source commit the build was pinned to (the Dockerfile refuses
        # those builds without it); cpu installs the PyPI release named in the lock.
        "vllm_omni_commit": args.vllm_omni_commit or None,
        "build_date": args.date or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "pip_freeze": freeze,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lock", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--platform", required=True, choices=("cpu", "cuda", "musa"))
    parser.add_argument("--base", required=True, help="the base image tag the build started from")
    for name in ("base-digest", "vllm-omni-commit", "revision", "lock-sha256", "date"):
        parser.add_argument(f"--{name}", default="")
    args = parser.parse_args(argv)
    if args.vllm_omni_commit and not re.fullmatch(r"[0-9a-f]{40}", args.vllm_omni_commit):
        sys.exit(f"build_info: VLLM_OMNI_COMMIT {args.vllm_omni_commit!r} is not a 40-hex commit (a branch, tag or "
                 "PR head moves): pass the commit hash itself")
    info = build_info(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".build-info-")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(info, handle, indent=2)
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)
    print(f"build_info: wrote {out} (lock {info['lock_sha256'][:12]}, revision {info['git_revision']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
