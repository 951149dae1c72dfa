"""The process's one torch.distributed world is shared by in-process engines and the trainer.

CI's stop 21 run: the studio tests' session engine held the world, so the trainer's own
init_parallel raised "trying to initialize the default process group twice". Run in a fresh
interpreter: in the suite's process, other tests' engines hold the world already.
"""

import subprocess
import sys

SHARED_WORLD = r"""
import torch.distributed as dist
from magi2studio.engines.embedded import EmbeddedEngine, upstream_patches
from magi2studio.vocabulary.layouts import parse_layout

engine, other = EmbeddedEngine(), EmbeddedEngine()
engine.start(parse_layout("sp1-cfg1"))
upstream_patches.hold_world_of_one()  # the trainer, while an engine holds the world
other.start(parse_layout("sp1-cfg1"))
engine.close()
assert dist.is_initialized(), "closing one engine released the world the others still use"
other.close()
assert dist.is_initialized(), "an engine released the world the trainer still holds"
upstream_patches.let_go_of_world_of_one()
assert not dist.is_initialized(), "the last holder left a world behind"
print("shared world ok")
"""


def test_the_world_outlives_every_holder_but_the_last():
    result = subprocess.run([sys.executable, "-c", SHARED_WORLD], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "shared world ok" in result.stdout, result.stderr[-3000:]
