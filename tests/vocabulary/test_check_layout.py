"""What the embedded engine refuses or warns about, before any rank starts."""

import os

import pytest

from magi2studio.engines.embedded.engine import EmbeddedEngine
from magi2studio.errors import InputError
from magi2studio.vocabulary.layouts import parse_layout
from magi2studio.vocabulary.tiers import get_tier


def test_check_layout_limits():
    engine = EmbeddedEngine()
    tier = get_tier("272p")
    assert engine.capabilities().max_world_size == 4
    with pytest.raises(InputError, match="needs 8 ranks"):
        engine.check_layout(parse_layout("sp4-cfg2"), tier)
    with pytest.raises(InputError, match="#8511"):
        engine.check_layout(parse_layout("sp2-cfg1-ep1"), tier)
    explicit = engine.check_layout(parse_layout("sp2-cfg1-ep2"), tier)
    assert explicit == engine.check_layout(parse_layout("sp2-cfg1"), tier)
    with pytest.raises(InputError, match="do not divide by sp3"):
        engine.check_layout(parse_layout("sp3-cfg1"), tier)
    warnings = engine.check_layout(parse_layout("sp2-cfg2"), tier)
    assert (os.cpu_count() or 1) >= 4 or any("oversubscribes" in w for w in warnings)
