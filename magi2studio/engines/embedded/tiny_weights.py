"""Which tiny weights the embedded engine runs: the seeded random tree, or a trained folder.

``random`` (the default) generates the seeded tree of :mod:`.checkpoint`, which the wiring
tests pin. Any other value is a checkpoint folder in the released layout, such as one written
by ``scripts/train_tiny.py``; its own ``magi2studio-tiny.json`` gives its config. The choice
comes from the engine's ``weights`` argument, else ``$MAGI2_EMBEDDED_WEIGHTS``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ...errors import InputError
from .tiny import TINY_CONFIG_FILE

WEIGHTS_ENV = "MAGI2_EMBEDDED_WEIGHTS"
RANDOM = "random"


def requested_weights(weights: str | None = None) -> str:
    return str(weights or os.environ.get(WEIGHTS_ENV) or RANDOM)


def checkpoint_folder(weights: str) -> Path | None:
    """The folder a weights choice names; None for ``random`` (generated on first use)."""

    if weights == RANDOM:
        return None
    folder = Path(weights).expanduser()
    if not (folder / TINY_CONFIG_FILE).is_file():
        raise InputError("weights", f"{folder} is not a tiny checkpoint folder (it has no {TINY_CONFIG_FILE})",
                         f"use {RANDOM}, or a folder written by scripts/train_tiny.py (set ${WEIGHTS_ENV} or "
                         "--weights)")
    return folder.resolve()


def tree_sha256(root: Path) -> str:
    """One digest over every file's relative path and bytes, in sorted order."""

    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()
