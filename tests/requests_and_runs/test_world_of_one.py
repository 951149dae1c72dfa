"""The process's one torch.distributed world is shared by in-process engines and the trainer.

CI's stop 21 run: the studio tests' session engine held the world, so the trainer's own
init_parallel raised "trying to initialize the default process group twice".
"""

import torch.distributed as dist

from magi2studio.engines.embedded import EmbeddedEngine, upstream_patches
from magi2studio.layouts import parse_layout


def test_the_world_outlives_every_holder_but_the_last():
    engine, other = EmbeddedEngine(), EmbeddedEngine()
    try:
        engine.start(parse_layout("sp1-cfg1"))
        upstream_patches.hold_world_of_one()  # the trainer, while an engine holds the world
        other.start(parse_layout("sp1-cfg1"))
        engine.close()
        assert dist.is_initialized(), "closing one engine released the world the others still use"
        other.close()
        assert dist.is_initialized()
        upstream_patches.let_go_of_world_of_one()
        assert not dist.is_initialized(), "the last holder leaves no world behind"
    finally:
        engine.close()
        other.close()
