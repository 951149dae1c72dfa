"""The timing plot's drawing: a legend naming every series, whole-number step ticks, a panel per stage,
tooltips rounded to 0.1 ms, readable at 3, 10 and 100 steps."""

from __future__ import annotations

import re

import pytest

from magi2studio.studio.results import timing_frame
from magi2studio.studio.timing_plot import EMPTY, ms_ticks, step_ticks, timing_html


def records(stage: str, ranks: int, steps: int, base: float = 535.654503) -> list[dict]:
    return [{"rank": r, "stage": stage, "step": s, "ms": base + 7.25 * s + r} for s in range(steps)
            for r in range(ranks)]


def panels(text: str) -> dict[str, str]:
    return dict(re.findall(r'<figure class="m2s-plot-panel" data-stage="([^"]+)">(.*?)</figure>', text))


@pytest.mark.parametrize("steps", [3, 10, 100])
def test_the_step_axis_has_whole_number_ticks_and_at_most_eleven(steps):
    ticks = step_ticks(steps - 1)
    assert ticks[0] == 0 and ticks[-1] <= steps - 1 and len(ticks) <= 11
    assert all(isinstance(t, int) for t in ticks) and len(set(ticks)) == len(ticks)
    panel = panels(timing_html(timing_frame(records("preview", 2, steps))))["preview"]
    labels = re.findall(r'text-anchor="middle">(\d+)</text>', panel)
    assert [int(label) for label in labels] == ticks


def test_the_legend_names_every_series_and_the_tooltips_are_rounded():
    text = timing_html(timing_frame(records("preview", 2, 4)))
    legend = re.findall(r"<li>.*?<span>(.*?)</span></li>", text)
    assert set(legend) == {"preview slowest rank", "preview rank 0", "preview rank 1", "preview steps 0-1 (excluded)"}
    assert "preview slowest rank, step 2: 551.2 ms" in text
    assert "535.654503" not in text and not re.search(r"\d\.\d{2,} ms", text)


def test_the_refiner_is_its_own_panel_and_does_not_stretch_the_preview_axis():
    text = timing_html(timing_frame(records("preview", 1, 6) + records("refiner", 1, 1, base=9000.0)))
    found = panels(text)
    assert list(found) == ["preview", "refiner"]
    preview_ticks = re.findall(r'text-anchor="end">([\d,.]+)</text>', found["preview"])
    assert int(preview_ticks[-1]) < 1000, preview_ticks  # the preview's own scale, not the refiner's 9 s
    assert "refiner steps 0-1 (excluded), step 0: 9,000.0 ms" in found["refiner"]


def test_a_slow_warm_up_step_is_written_at_the_top_instead_of_flattening_the_rest():
    slow_first = records("preview", 1, 10)
    slow_first[0]["ms"] = 20_000.0
    text = timing_html(timing_frame(slow_first))
    assert "▲ 20,000 ms" in text
    assert re.findall(r'text-anchor="end">([\d,.]+)</text>', text)[-1] in {"700", "800"}


def test_ms_ticks_are_round_and_cover_the_top():
    assert ms_ticks(535.6) == [0, 200, 400, 600]
    assert ms_ticks(0.8)[-1] >= 0.8
    assert ms_ticks(0) == [0.0, 1.0]


def test_no_run_yet_says_so():
    assert timing_html(timing_frame([])) == EMPTY
