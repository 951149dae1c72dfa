"""The timing plot as Chromium draws it (issue 29's audit): with two ranks of equal times rank 0's line no
longer hides under rank 1's (nor both under the slowest rank's), and the excluded steps 0-1 look hollow, as
the legend says. Counted in the rendered pixels: the SVG's order and fills decide what shows."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from magi2studio.studio.results import timing_frame
from magi2studio.studio.timing_plot import EXCLUDED_COLOR, RANK_COLORS, timing_html

from studio_support import CHROMIUM, NO_CHROMIUM

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)


def rgb(color: str) -> tuple[int, int, int]:
    return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))


def pixels_near(image: Image.Image, color: str, tolerance: int = 40) -> int:
    want = rgb(color)
    return sum(1 for pixel in image.getdata() if all(abs(a - b) <= tolerance for a, b in zip(pixel[:3], want)))


@pytest.fixture
def two_equal_ranks(page):
    """A 12-step panel of two CFG ranks with the same time at every step (they wait for each other); flat over
    steps 0-2, so the line crosses the excluded points level."""
    records = [{"rank": rank, "stage": "preview", "step": step, "ms": 900.0 if step < 3 else 400.0 + 10 * step}
               for step in range(12) for rank in (0, 1)]
    page.set_viewport_size({"width": 800, "height": 400})
    page.set_content(f'<body style="margin:0;background:#fff;color:#111">{timing_html(timing_frame(records))}</body>')
    return page


def test_with_equal_ranks_each_rank_s_colour_shows_along_the_line(two_equal_ranks):
    shot = Image.open(io.BytesIO(two_equal_ranks.locator("svg.m2s-plot-svg").screenshot())).convert("RGB")
    rank0, rank1 = pixels_near(shot, RANK_COLORS[0]), pixels_near(shot, RANK_COLORS[1])
    assert rank0 > 150 and rank1 > 150, f"rank 0: {rank0} px, rank 1: {rank1} px of their colours"


def test_the_excluded_steps_are_hollow(two_equal_ranks):
    page = two_equal_ranks
    shot = Image.open(io.BytesIO(page.screenshot())).convert("RGB")
    rings = page.locator(f'svg.m2s-plot-svg circle[stroke="{EXCLUDED_COLOR}"]')
    assert rings.count() == 2
    for index in range(2):
        box = rings.nth(index).bounding_box()
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        # Inside the ring, above and below the line through it: a filled point has its rank's colour there.
        inside = [shot.getpixel((round(x), round(y + dy))) for dy in (-2, 2)]
        assert all(min(pixel) > 150 for pixel in inside), f"step {index}'s point is filled: {inside} inside its ring"
