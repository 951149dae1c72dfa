import pytest

from magi2studio.vocabulary.request import build_request

from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[2] / "magi2studio" / "data" / "sandai" / "assets"


@pytest.fixture(scope="package")
def engine():
    """One started engine (a pool of one rank) for this folder's tests, closed after them."""
    from magi2studio.engines import get_engine
    from magi2studio.vocabulary.layouts import parse_layout

    eng = get_engine("embedded")
    eng.start(parse_layout("sp1-cfg1"))
    yield eng
    eng.close()


@pytest.fixture
def request_t2va():
    return build_request(prompt="a red kite over a windy beach, waves and gulls", steps=3, seed=7)
