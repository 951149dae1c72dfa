"""The Reproduce and A/B views' words: the gate column's reason, report links, the A/B verdict block."""

from __future__ import annotations

from pathlib import Path

import pytest

from magi2studio.errors import InputError
from magi2studio.reproduction.ab import Side
from magi2studio.studio.context import report_links
from magi2studio.studio.tab_ab import env_settings, side_from_fields, verdict_text
from magi2studio.vocabulary.request import build_request
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


def test_an_ab_side_is_its_fields_what_differs_from_the_request_an_override():
    base = build_request(prompt="p")
    side = side_from_fields("candidate", base, "MAGI2_KERNELS=on\n\nTORCHINDUCTOR_FREEZING=1", "sp2-cfg1", "eager",
                            False)
    assert side == Side("candidate", {"MAGI2_KERNELS": "on", "TORCHINDUCTOR_FREEZING": "1"}, {},
                        {"compile": "eager", "deterministic": False}, "sp2-cfg1")
    plain = side_from_fields("control", base, "", "sp1-cfg1", "engine default", True)
    assert plain == Side("control", {}, {}, {}, "sp1-cfg1")


def test_an_older_ab_call_s_side_settings_still_work():
    """/ab before the sides' fields took the command line's settings in the side's box."""
    assert env_settings("control", "env.A=1\nlayout=sp2-cfg1\nrequest.deterministic=false\nB=2") == [
        "env.A=1", "layout=sp2-cfg1", "request.deterministic=false", "env.B=2"]
    side = side_from_fields("control", build_request(prompt="p"), "layout=sp2-cfg1\nrequest.compile=eager",
                            "sp1-cfg1", "engine default", True)
    assert side.layout == "sp2-cfg1" and side.request_overrides == {"compile": "eager"}


@pytest.mark.parametrize("line, field", [("MAGI2_KERNELS", "candidate.environment"),
                                         ("1X=2", "candidate.environment"),
                                         ("request.steps=0", "candidate.request.steps")])
def test_a_bad_ab_side_is_one_line_naming_its_field(line, field):
    with pytest.raises(InputError) as caught:
        side_from_fields("candidate", build_request(prompt="p"), line, "sp1-cfg1", "engine default", True)
    assert caught.value.field == field and "Fix:" in str(caught.value)
