"""The Reproduce and A/B views' words: the gate column's reason, report links, the A/B verdict block."""

from __future__ import annotations

from pathlib import Path

from magi2studio.studio.context import report_links
from magi2studio.studio.tab_ab import verdict_text
from magi2studio.studio.tab_reproduce import gate_cell


def timing(pairs: int) -> dict:
    return {"median_ratio": 1.0, "min_ratio": 1.0, "max_ratio": 1.0, "spread_pct": 0.0, "compared_pairs": pairs,
            "excluded": []}


def test_the_gate_column_says_why_it_is_empty():
    assert gate_cell(123.456, 4, "ran") == 123.5
    assert gate_cell(None, 2, "ran") == "n/a: 2 steps (the metric needs a step after steps 0 and 1)"
    assert gate_cell(None, None, "failed") == "n/a (failed)"


def test_reports_are_links_the_app_serves_not_server_paths():
    links = report_links(Path("/srv/out/reproduce/20261204 run"), ("report.html", "report.md"))
    assert links == ("[report.html](gradio_api/file=/srv/out/reproduce/20261204%20run/report.html), "
                     "[report.md](gradio_api/file=/srv/out/reproduce/20261204%20run/report.md)")


def test_a_single_pair_warns_that_its_spread_says_nothing():
    one = verdict_text({"identity": {"verdict": "bit-identical"}, "timing": timing(1)})
    assert "| 1.0000 | 1.0000 to 1.0000 | 0.00% | 1 |" in one and "⚠ One pair only" in one
    assert "⚠" not in verdict_text({"identity": {"verdict": "bit-identical"}, "timing": timing(3)})
