"""Which tiny weights the embedded engine runs: the shipped trained one, the seeded random tree, or a folder.

``trained`` (the default: what a person trying the product should see) is the checkpoint
shipped in ``magi2studio/data/tiny-trained`` (made by ``scripts/train_tiny.py``,
docs/training.md), checked against its pinned tree sha256. ``random`` generates the seeded tree
of :mod:`.checkpoint`, which the wiring tests pin and ask for by name (tests/conftest.py). Any
other value is a checkpoint folder in the released layout; its own ``magi2studio-tiny.json``
gives its config. The choice comes from the engine's ``weights`` argument, else
``$MAGI2_EMBEDDED_WEIGHTS``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ...errors import InputError
from .tiny import TINY_CONFIG_FILE

WEIGHTS_ENV = "MAGI2_EMBEDDED_WEIGHTS"
RANDOM = "random"
TRAINED = "trained"
TRAINED_FOLDER = Path(__file__).resolve().parents[2] / "data" / "tiny-trained"
TRAINED_SHA256 = "dd619332c21e24ef2c72bdeec80ee202eea19f66fd8eb52ef03401660e1302fa"


def requested_weights(weights: str | None = None) -> str:
    return str(weights or os.environ.get(WEIGHTS_ENV) or TRAINED)


def checkpoint_folder(weights: str) -> Path | None:
    """The folder a weights choice names; None for ``random`` (generated on first use)."""

    if weights == RANDOM:
        return None
    if weights == TRAINED:
        found = tree_sha256(TRAINED_FOLDER) if (TRAINED_FOLDER / TINY_CONFIG_FILE).is_file() else "missing"
        if found != TRAINED_SHA256:
            raise InputError("weights", f"the shipped trained checkpoint {TRAINED_FOLDER} has tree sha256 {found}, "
                             f"not the pinned {TRAINED_SHA256}",
                             "restore it (git checkout -- magi2studio/data/tiny-trained, or reinstall magi2studio)")
        return TRAINED_FOLDER
    folder = Path(weights).expanduser()
    if not (folder / TINY_CONFIG_FILE).is_file():
        raise InputError("weights", f"{folder} is not a tiny checkpoint folder (it has no {TINY_CONFIG_FILE})",
                         f"use {RANDOM}, {TRAINED}, or a folder written by scripts/train_tiny.py "
                         f"(set ${WEIGHTS_ENV} or --weights)")
    return folder.resolve()


def weights_of_run(engine_block: dict) -> str:
    """The weights a run's manifest (its ``engine`` block) says ran, as a ``weights`` choice, so a
    replay runs them whatever the default or ``$MAGI2_EMBEDDED_WEIGHTS`` is now.

    The shipped checkpoint is named by its pinned digest (its folder's path differs between
    installs); another folder must still hold the tree the run recorded."""

    recorded = engine_block.get("weights")
    if recorded in (None, RANDOM):
        return RANDOM
    digest = engine_block.get("weights_sha256")
    if digest == TRAINED_SHA256:
        return TRAINED
    folder = Path(str(recorded))
    found = tree_sha256(folder) if (folder / TINY_CONFIG_FILE).is_file() else "missing"
    if found != digest:
        raise InputError("weights", f"the run's checkpoint folder {folder} now has tree sha256 {found}, "
                         f"not the run's {digest}", "restore that folder as it was when the run was made")
    return str(folder)


def tree_sha256(root: Path) -> str:
    """One digest over every file's relative path and bytes, in sorted order."""

    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()
